"""Online SGD on a softmax classifier: the baseline of Titsias et al. (2024), Sect. 4.2 (the
"Online SGD" of Bornschein et al. 2022), as an engine of
:mod:`inference.base` of kind ``"jax"`` (``init(rng, *, input_dim)``; ``step`` is pure JAX and
scans).

The model is ``p(y = k | x) = softmax(phi(x; theta)^T W + b)_k``; each chunk (plus
``replay_size`` points from the memory of the most recent points, App. D.4) takes one SGD step
on the chunk's mean cross-entropy, all parameters with one step size. The head starts at zero
(the first prediction is uniform).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import Array

from inference.replay import ReplayMemory, replay_add, replay_init, with_replay

__all__ = ["SGDState", "SGDInfo", "OnlineSGD"]


class SGDState(NamedTuple):
    """Attributes: params ``{"theta": tree, "head": {"w": (m, K), "b": (K,)}}``; opt_state
    (optax's, arrays); memory (:class:`inference.replay.ReplayMemory` or ``None``)."""

    params: Any
    opt_state: Any
    memory: ReplayMemory | None


class SGDInfo(NamedTuple):
    """Attributes: loss (the chunk's mean cross-entropy before the step, replay included);
    finite (``{"loss", "head", "theta"}``: whether each is finite after the step)."""

    loss: Array
    finite: Array


class OnlineSGD:
    """The engine of the module docstring.

    Args:
        init_theta / features: the representation (:mod:`models.feature_networks`).
        num_features: m; num_classes: K.
        learning_rate: the SGD step size.
        replay_capacity / replay_size: memory size (0: no replay) and points replayed per chunk.
    """

    kind = "jax"

    def __init__(self, init_theta: Callable[[Array], Any], features: Callable[[Any, Array], Array],
                 num_features: int, num_classes: int, learning_rate: float,
                 replay_capacity: int = 0, replay_size: int = 10) -> None:
        self.init_theta, self.features = init_theta, features
        self.num_features, self.num_classes = int(num_features), int(num_classes)
        self.replay_capacity, self.replay_size = int(replay_capacity), int(replay_size)
        self.optimizer = optax.sgd(learning_rate)

    def init(self, rng: Array, *, input_dim: int, dtype: Any = jnp.float32) -> SGDState:
        """``theta = init_theta(rng)``, a zero head, optimizer state, empty memory."""
        dtype = jnp.dtype(dtype)
        params = {"theta": self.init_theta(rng),
                  "head": {"w": jnp.zeros((self.num_features, self.num_classes), dtype),
                           "b": jnp.zeros((self.num_classes,), dtype)}}
        memory = (replay_init(self.replay_capacity, int(input_dim), dtype, jnp.int32)
                  if self.replay_capacity else None)
        return SGDState(params, self.optimizer.init(params), memory)

    def logits(self, params: Any, x: Array) -> Array:
        return self.features(params["theta"], x) @ params["head"]["w"] + params["head"]["b"]

    def predict(self, state: SGDState, x: Array) -> Array:
        """Class probabilities ``(n, K)``."""
        dtype = state.params["head"]["w"].dtype
        return jax.nn.softmax(self.logits(state.params, x.astype(dtype)), axis=-1)

    def step(self, rng: Array, state: SGDState, batch: tuple[Array, Array]
             ) -> tuple[SGDState, SGDInfo]:
        """One SGD step on chunk ``batch = (x (b, d), labels (b,))`` (with replay)."""
        params, opt_state, memory = state
        x, y = batch
        dtype = params["head"]["w"].dtype
        x = x.astype(dtype)
        xa, ya, mask = with_replay(rng, memory, x, y, self.replay_size)
        weight = mask.astype(dtype)

        def loss_fn(p):
            logp = jax.nn.log_softmax(self.logits(p, xa), axis=-1)
            nll = -jnp.take_along_axis(logp, ya[:, None], axis=-1)[:, 0]
            return jnp.sum(nll * weight) / jnp.sum(weight)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if memory is not None:
            memory = replay_add(memory, x, y)
        finite = {"loss": jnp.isfinite(loss),
                  "head": jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in
                                             jax.tree_util.tree_leaves(params["head"])])),
                  "theta": jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in
                                              jax.tree_util.tree_leaves(params["theta"])]
                                             or [jnp.asarray(True)]))}
        return SGDState(params, opt_state, memory), SGDInfo(loss, finite)
