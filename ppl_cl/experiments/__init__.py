"""The experiment registry.

Each module named in :data:`MODULES` registers its experiments (``@register`` of
:mod:`ppl_cl.experiments.base`) when imported; :func:`registry` imports them. Experiment modules
keep heavy imports (torch, JAX) inside their ``run`` functions, so ``ppl-cl list`` loads
neither.

Experiments of one's own: the environment variable ``PPL_CL_EXPERIMENTS`` lists further modules
(``os.pathsep``-separated; a module name, or the path of a ``.py`` file) that :func:`registry`
imports after these, so that ``ppl-cl run`` / ``ppl-cl sweep`` (whose runs are processes of
their own, which inherit the variable) find the experiments they register.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from ppl_cl.errors import ConfigError
from ppl_cl.experiments.base import (ExperimentSpec, PaperNumber, RunContext, build_config,
                                     register, registered_specs, run_spec)

__all__ = ["MODULES", "EXTRA_ENV", "PaperNumber", "RunContext", "ExperimentSpec", "build_config", "get",
           "register", "registry", "run_experiment"]

#: the modules that register experiments, in the order ``ppl-cl list`` shows them
MODULES = ("exact_gp", "vargp", "kalman", "vips", "gp_tree", "gp_ella", "compare")

#: the environment variable naming further experiment modules (module names or ``.py`` paths)
EXTRA_ENV = "PPL_CL_EXPERIMENTS"


def _import_extra(entry: str) -> None:
    if not (entry.endswith(".py") or os.sep in entry):
        try:
            importlib.import_module(entry)
        except ImportError as err:
            raise ConfigError(f"{EXTRA_ENV}: cannot import {entry!r}: {err}") from err
        return
    path = Path(entry).expanduser().resolve()
    name = "ppl_cl_user_experiments_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return
    if not path.is_file():
        raise ConfigError(f"{EXTRA_ENV}: no file {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def registry() -> dict[str, ExperimentSpec]:
    """Every registered experiment by name (those of :data:`MODULES`, then of the modules
    that ``PPL_CL_EXPERIMENTS`` names)."""
    for module in MODULES:
        importlib.import_module(f"{__name__}.{module}")
    for entry in filter(None, os.environ.get(EXTRA_ENV, "").split(os.pathsep)):
        _import_extra(entry)
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
