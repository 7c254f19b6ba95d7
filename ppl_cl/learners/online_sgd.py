"""The online-SGD baseline of Titsias et al. (2024), Sect. 4.2 (Bornschein et al. 2022):
``OnlineSGDClassifier`` (``learner_name="online-sgd-classifier"``,
:class:`ppl_cl.configs.kalman.OnlineSGDConfig`): the representation of the Kalman learners with
a linear softmax head, one SGD step per chunk on its cross-entropy (predict, then learn),
optional replay (App. D.4). The engine is :class:`inference.online_sgd.OnlineSGD`.

Randomness as in :mod:`ppl_cl.learners.kalman`: the replay draws of chunk ``i`` come from
``fold_in(PRNGKey(seed), i)``; the network's initial parameters from the same stream as the
Kalman learners'.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from ppl_cl.batch import Batch, as_numpy
from ppl_cl.configs.kalman import OnlineSGDConfig
from ppl_cl.learners.kalman import (ChunkLearner, check_finite, representation, restore_tree,
                                    tree_state)
from ppl_cl.predictive import CategoricalPredictive

__all__ = ["OnlineSGDClassifier", "OnlineSGDConfig"]


@functools.lru_cache(maxsize=16)
def _compiled(config: OnlineSGDConfig, input_dim: int):
    """``(engine, predict, update)`` of one configuration; the seed does not enter them and
    the step size is an argument of ``update`` (a search over it compiles once)."""
    import jax

    from inference.online_sgd import OnlineSGD

    c = config
    net = representation(c.network, input_dim, bias=c.feature_bias,
                         normalization=c.feature_normalization, dtype=c.dtype)

    def engine(learning_rate):
        return OnlineSGD(net.init, net.apply, net.feature_dim, c.num_classes, learning_rate,
                         c.replay_capacity, c.replay_size)

    def update(rng, state, batch, learning_rate):
        return engine(learning_rate).step(rng, state, batch)

    static = engine(c.learning_rate)
    return static, jax.jit(static.predict), jax.jit(update)


class OnlineSGDClassifier(ChunkLearner):
    """Online SGD on a softmax head over ``phi(x; theta)`` (module docstring).

    ``OnlineSGDClassifier(num_classes=10, input_dim=784)`` or
    ``OnlineSGDClassifier(OnlineSGDConfig(...))``. ``predict`` before any update gives the
    uniform prediction of the zero head (an online learner scores its first chunk with it).
    """

    learner_name = "online-sgd-classifier"
    config_cls = OnlineSGDConfig

    def __init__(self, config: OnlineSGDConfig | None = None, /, **overrides: Any) -> None:
        super().__init__(config, **overrides)

    @property
    def num_classes(self) -> int:
        return int(self.config.num_classes)

    def _functions(self):
        return _compiled(dataclasses.replace(self.config, seed=0, learning_rate=0.2),
                         self._input_dim)

    def _init_state(self, rng: Any, input_dim: int) -> Any:
        return self._functions()[0].init(rng, input_dim=input_dim, dtype=self._dtype)

    def _validate(self, batch: Batch, require_targets: bool) -> Batch:
        return batch.validate(input_dim=self._input_dim,
                              num_classes=self.num_classes if require_targets else None,
                              require_targets=require_targets, allow_empty=not require_targets)

    def predict(self, x: Any, task_id: int | None = None) -> CategoricalPredictive:
        batch = self._validate(Batch(x), require_targets=False)
        if self._state is None:          # the network at its seeded start: the prior predictive
            self._build(int(batch.x.shape[1]))
        if len(batch) == 0:
            return CategoricalPredictive(np.zeros((0, self.num_classes)))
        xj, _ = batch.jax(self._dtype)
        probs = self._functions()[1](self._state, xj)
        return CategoricalPredictive(np.asarray(probs, dtype=np.float64))

    def update(self, batch: Batch) -> dict[str, Any]:
        import jax
        import jax.numpy as jnp

        self._ready(batch)
        xj, _ = batch.jax(self._dtype)
        yj = jnp.asarray(as_numpy(batch.y).astype(np.int32))
        key = jax.random.fold_in(self._key, self._chunk_index)
        state, info = self._functions()[2](key, self._state, (xj, yj),
                                           jnp.asarray(self.config.learning_rate, self._dtype))
        info = jax.device_get(info)
        check_finite(info.finite, "learning_rate")
        record = {"loss": float(info.loss)}
        self._state = state
        self._chunk_index += 1
        record.update(num_points=len(batch), chunk=self._chunk_index)
        return record

    def state_dict(self) -> dict[str, Any]:
        s = self._require_state("state_dict")
        return {"input_dim": int(self._input_dim), "params": tree_state(s.params),
                "opt_state": tree_state(s.opt_state), "memory": self._memory_arrays(s.memory),
                "chunk_index": int(self._chunk_index)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        s = self._state_to_load(state)
        self._state = s._replace(params=restore_tree(state["params"], s.params, "params"),
                                 opt_state=restore_tree(state["opt_state"], s.opt_state,
                                                        "opt_state"),
                                 memory=self._restore_memory(state["memory"], s.memory))
        self._chunk_index = int(state["chunk_index"])

    def to_inference_data(self, *args: Any, **kwargs: Any):
        """A point estimate (one draw) of the head weights; SGD has no posterior."""
        from ppl_cl.inference_data import POINT_ESTIMATE, samples_to_inference_data

        w = np.asarray(self._require_state("to_inference_data").params["head"]["w"], dtype=np.float64).T
        return samples_to_inference_data({"head": w[None, None]},
                                         dims={"head": ["class", "feature"]},
                                         attrs={**POINT_ESTIMATE,
                                                "note": "online SGD point estimate, one draw"})
