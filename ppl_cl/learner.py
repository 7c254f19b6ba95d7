"""The one learner protocol shared by all methods (docs/design.md, the learner protocol).

Every learner

* is built from one frozen config dataclass (:attr:`Learner.config_cls`, in
  :mod:`ppl_cl.configs`), ``MyLearner(config=None, **overrides)``: no argument gives the
  validated settings; the config is kept as ``self.config`` and saved with the state;
* ``update(batch)`` consumes the next task / session / batch / chunk, a :class:`ppl_cl.Batch`
  (anything else raises ``TypeError``), and returns a small record (a dict) of what happened.
  The batch is validated *before* any state changes; a refused batch leaves the learner as it
  was;
* ``predict(x, task_id=None)`` returns a :class:`~ppl_cl.predictive.GaussianPredictive` or
  :class:`~ppl_cl.predictive.CategoricalPredictive`; before the first ``update`` it is the
  prior predictive (what the prequential protocol scores the first chunk with), or, for a
  learner whose outputs are not defined before data (a tree of classes built from them),
  :class:`ppl_cl.errors.NotFittedError`; ``x`` with no rows gives an empty predictive;
* ``state_dict()`` / ``load_state_dict(state)`` carry the continual state (a tree of arrays and
  scalars), and ``save(path)`` / ``MyLearner.load(path)`` persist it with
  :mod:`ppl_cl.persist` (atomic, versioned, no pickle). A run resumed after task t predicts
  exactly like an uninterrupted one. :func:`ppl_cl.learners.load_learner` loads a file of any
  learner;
* ``to_inference_data(...)`` exports the current posterior as ArviZ ``InferenceData``.
"""

from __future__ import annotations

import abc
import os
from typing import Any, ClassVar

from ppl_cl.batch import Batch
from ppl_cl.configs import from_dict, make_config, to_dict
from ppl_cl.errors import NotFittedError
from ppl_cl.persist import CheckpointError, load_tree, save_tree

__all__ = ["Learner", "check_batch"]


def check_batch(batch: Any, name: str = "batch") -> Batch:
    """``batch`` if it is a :class:`Batch`, else a ``TypeError`` naming the argument."""
    if not isinstance(batch, Batch):
        raise TypeError(f"{name}: expected a ppl_cl.Batch (Batch(x, y, task_id)), received "
                        f"{type(batch).__name__}")
    return batch


class Learner(abc.ABC):
    """Base class of every method's learner. See the module docstring for the protocol."""

    #: the name a checkpoint records (``ppl_cl.learners.LEARNERS`` maps it to the class)
    learner_name: ClassVar[str] = ""
    #: the frozen config dataclass of this learner
    config_cls: ClassVar[type | None] = None

    def __init__(self, config: Any = None, /, **overrides: Any) -> None:
        if self.config_cls is None:
            raise TypeError(f"{type(self).__name__} defines no config_cls")
        self.config = make_config(self.config_cls, config, overrides)

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

    def _not_fitted(self, what: str = "predict") -> NotFittedError:
        return NotFittedError(f"{type(self).__name__}: call update() with data before {what}")

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write config + state to ``path`` (atomic; format version checked on load)."""
        if not self.learner_name:
            raise TypeError(f"{type(self).__name__} has no learner_name and cannot be saved")
        save_tree(path, self.state_dict(),
                  meta={"learner": self.learner_name, "config": to_dict(self.config)})

    @classmethod
    def load(cls, path: str | os.PathLike, device: Any = None, **overrides: Any) -> "Learner":
        """Rebuild a learner of this class saved by :meth:`save`. ``overrides`` replace config
        fields that do not change the state's meaning (e.g. ``device``, ``progress``)."""
        if cls is Learner or not cls.learner_name:
            raise TypeError("call load on a learner class, or use "
                            "ppl_cl.learners.load_learner(path) for a file of any learner")
        state, meta = load_tree(path, device=device)
        return cls._from_saved(path, state, meta, overrides)

    @classmethod
    def _from_saved(cls, path: Any, state: Any, meta: dict[str, Any],
                    overrides: dict[str, Any]) -> "Learner":
        name = meta.get("learner")
        if name != cls.learner_name:
            raise CheckpointError(f"{path} holds a {name!r} learner, not a {cls.learner_name!r} "
                                  f"({cls.__name__})")
        try:
            config = from_dict(cls.config_cls, meta.get("config", {}))
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{path}: its config does not fit {cls.__name__} ({err})") \
                from err
        learner = cls(config, **overrides)
        learner.load_state_dict(state)
        return learner
