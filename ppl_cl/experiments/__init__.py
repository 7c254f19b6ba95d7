"""The experiment registry: every module in this package registers its experiments on import.

Experiment modules keep heavy imports (torch, JAX) inside their ``run`` functions so that
``ppl-cl list`` stays fast.
"""

import importlib
import pkgutil

from ppl_cl.experiments.base import (PaperNumber, RunContext, get, register, registry,
                                     run_experiment)

for _mod in pkgutil.iter_modules(__path__):
    if _mod.name not in ("base", "reproduce"):
        importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = ["PaperNumber", "RunContext", "get", "register", "registry", "run_experiment"]
