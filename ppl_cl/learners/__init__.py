"""One learner per method, on the protocol of :mod:`ppl_cl.learner`.

:data:`LEARNERS` names every learner (the ``learner_name`` its checkpoints record) and where it
lives; nothing is imported until it is needed, so ``import ppl_cl.learners`` is cheap and
:func:`load_learner` imports only the module of the learner a file holds.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from ppl_cl.persist import CheckpointError, load_tree

__all__ = ["LEARNERS", "learner_class", "load_learner"]

#: learner_name -> (module, class)
LEARNERS: dict[str, tuple[str, str]] = {
    "exact-gp": ("ppl_cl.learners.exact_gp", "ExactGP"),
    "vargp": ("ppl_cl.learners.vargp", "VARGP"),
    "kalman-classifier": ("ppl_cl.learners.kalman", "KalmanClassifier"),
    "kalman-regressor": ("ppl_cl.learners.kalman", "KalmanRegressor"),
    "online-sgd-classifier": ("ppl_cl.learners.online_sgd", "OnlineSGDClassifier"),
    "online-sgpr": ("ppl_cl.learners.vips", "OnlineSGPR"),
    "gp-tree": ("ppl_cl.learners.gp_tree", "GPTree"),
    "sbm-gp": ("ppl_cl.learners.gp_tree", "SBMGP"),
    "lsm-gibbs": ("ppl_cl.learners.pg_baselines", "LSMGibbsClassifier"),
    "ove-gibbs": ("ppl_cl.learners.pg_baselines", "OVEGibbsClassifier"),
    "gp-ella": ("ppl_cl.learners.gp_ella", "GPELLA"),
    "gp-ella-individual-gps": ("ppl_cl.learners.gp_ella_baselines", "IndividualGPs"),
    "gp-ella-shared-gp": ("ppl_cl.learners.gp_ella_baselines", "SharedGP"),
    "gp-ella-mtgp": ("ppl_cl.learners.gp_ella_baselines", "MultiTaskGP"),
    "gp-ella-linear-ella": ("ppl_cl.learners.gp_ella_baselines", "LinearELLA"),
}


def learner_class(name: str) -> type:
    """The learner class registered as ``name``."""
    if name not in LEARNERS:
        raise KeyError(f"unknown learner {name!r}; known: {sorted(LEARNERS)}")
    module, attr = LEARNERS[name]
    return getattr(importlib.import_module(module), attr)


def load_learner(path: str | os.PathLike, device: Any = None, **overrides: Any):
    """Load a checkpoint written by any learner's ``save`` (the class is read from the file)."""
    state, meta = load_tree(path, device=device)
    name = meta.get("learner")
    if name not in LEARNERS:
        raise CheckpointError(f"{path}: unknown learner {name!r}; known: {sorted(LEARNERS)}")
    return learner_class(name)._from_saved(path, state, meta, overrides)
