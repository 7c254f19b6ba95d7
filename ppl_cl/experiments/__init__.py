"""The experiment registry.

Each module named in :data:`MODULES` registers its experiments (``@register`` of
:mod:`ppl_cl.experiments.base`) when imported; :func:`registry` imports them. Experiment modules
keep heavy imports (torch, JAX) inside their ``run`` functions, so ``ppl-cl list`` loads
neither.
"""

from __future__ import annotations

import importlib
from typing import Any

from ppl_cl.errors import ConfigError
from ppl_cl.experiments.base import (ExperimentSpec, PaperNumber, RunContext, build_config,
                                     register, registered_specs, run_spec)

__all__ = ["MODULES", "PaperNumber", "RunContext", "ExperimentSpec", "build_config", "get",
           "register", "registry", "run_experiment"]

#: the modules that register experiments, in the order ``ppl-cl list`` shows them
MODULES = ("exact_gp", "vargp", "kalman", "vips", "gp_tree", "gp_ella")


def registry() -> dict[str, ExperimentSpec]:
    """Every registered experiment by name."""
    for module in MODULES:
        importlib.import_module(f"{__name__}.{module}")
    return registered_specs()


def get(name: str) -> ExperimentSpec:
    """The experiment registered as ``name`` (:class:`ConfigError` naming the known ones)."""
    reg = registry()
    if name not in reg:
        raise ConfigError(f"unknown experiment {name!r}; `ppl-cl list` shows: "
                          f"{', '.join(sorted(reg))}")
    return reg[name]


def run_experiment(name: str, **kwargs: Any) -> dict:
    """Run experiment ``name`` (:func:`ppl_cl.experiments.base.run_spec`)."""
    return run_spec(get(name), **kwargs)
