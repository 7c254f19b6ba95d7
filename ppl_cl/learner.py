"""The one learner protocol shared by all methods (DESIGN.md, "One learner protocol").

Every learner

* is built from JSON-serializable keyword arguments, kept in ``self.config``;
* ``update(batch)`` consumes the next task / session / batch / chunk and returns a small record
  (a dict) of what happened — validation of the batch happens *before* any state changes;
* ``predict(x, task_id=None)`` returns a :class:`~ppl_cl.predictive.GaussianPredictive` or
  :class:`~ppl_cl.predictive.CategoricalPredictive`;
* ``state_dict()`` / ``load_state_dict(state)`` carry the continual state (a tree of arrays and
  scalars), and ``save(path)`` / ``Learner.load(path)`` persist it with
  :mod:`ppl_cl.persist` (atomic, versioned, no pickle). A run resumed after task t predicts
  exactly like an uninterrupted one;
* ``to_inference_data(...)`` exports the current posterior as ArviZ ``InferenceData``.

Subclasses register themselves under ``learner_name`` so that ``Learner.load`` can rebuild the
right class from a checkpoint without importing anything the checkpoint names.
"""

from __future__ import annotations

import abc
import os
from typing import Any, ClassVar

from ppl_cl.batch import Batch
from ppl_cl.persist import CheckpointError, load_tree, save_tree

__all__ = ["Learner", "registered_learners"]

_REGISTRY: dict[str, type["Learner"]] = {}


def registered_learners() -> dict[str, type["Learner"]]:
    """Learner classes by ``learner_name`` (those whose modules have been imported)."""
    import ppl_cl.learners  # noqa: F401  (imports every learner module)

    return dict(_REGISTRY)


class Learner(abc.ABC):
    """Base class of every method's learner. See the module docstring for the protocol."""

    learner_name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.learner_name:
            if cls.learner_name in _REGISTRY and _REGISTRY[cls.learner_name] is not cls:
                raise RuntimeError(f"learner name {cls.learner_name!r} registered twice")
            _REGISTRY[cls.learner_name] = cls

    def __init__(self, **config: Any) -> None:
        self.config: dict[str, Any] = dict(config)

    # -- the protocol --------------------------------------------------------------------
    @abc.abstractmethod
    def update(self, batch: Batch) -> dict[str, Any]:
        """Consume the next batch; return a record of what happened."""

    @abc.abstractmethod
    def predict(self, x: Any, task_id: int | None = None):
        """Predictive distribution at inputs ``x`` of shape ``(n, d)``."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The continual state (arrays and scalars), enough to resume exactly."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict` of a learner with the same config."""

    @abc.abstractmethod
    def to_inference_data(self, *args: Any, **kwargs: Any):
        """ArviZ ``InferenceData`` of the current posterior."""

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write config + state to ``path`` (atomic; format version checked on load)."""
        if not self.learner_name:
            raise TypeError(f"{type(self).__name__} has no learner_name and cannot be saved")
        save_tree(path, self.state_dict(),
                  meta={"learner": self.learner_name, "config": self.config})

    @classmethod
    def load(cls, path: str | os.PathLike, device: Any = None, **config_overrides: Any) -> "Learner":
        """Rebuild a learner saved by :meth:`save`.

        Called on the base class it returns whichever learner the file holds; called on a
        subclass it checks that the file holds that subclass. ``config_overrides`` replace
        config entries that do not change the state's meaning (e.g. ``device``).
        """
        state, meta = load_tree(path, device=device)
        name = meta.get("learner")
        registry = registered_learners()
        if name not in registry:
            raise CheckpointError(f"{path}: unknown learner {name!r}; known: {sorted(registry)}")
        klass = registry[name]
        if cls is not Learner and not issubclass(klass, cls):
            raise CheckpointError(f"{path} holds a {klass.__name__}, not a {cls.__name__}")
        learner = klass(**{**meta.get("config", {}), **config_overrides})
        learner.load_state_dict(state)
        return learner
