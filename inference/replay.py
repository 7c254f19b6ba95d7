"""Replay memory of the online-classification protocol (App. D.4 of Titsias et al. 2024,
after Ghunaim et al. 2023): a ring buffer of the most recent points; each
learning step appends a chunk drawn from it (without replacement) to the current chunk.

Pure functions on a :class:`ReplayMemory` (a NamedTuple of arrays, fixed shapes, jit-able):
:func:`replay_init`, :func:`replay_add`, :func:`replay_sample`, and :func:`with_replay`, which
appends the replayed points to a chunk with a validity mask (empty slots are masked out).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

__all__ = ["ReplayMemory", "replay_init", "replay_add", "replay_sample", "with_replay"]


class ReplayMemory(NamedTuple):
    """Ring buffer of the most recent points (App. D.4 keeps 100).

    Attributes:
        inputs: ``(R, d)`` raw inputs (features change when theta is fine-tuned).
        targets: ``(R,)`` labels or regression targets.
        size: number of filled slots, ``()``.
        position: next slot to write, ``()``.
    """

    inputs: Array
    targets: Array
    size: Array
    position: Array


def replay_init(capacity: int, input_dim: int, input_dtype: Any = jnp.float32,
                target_dtype: Any = jnp.int32) -> ReplayMemory:
    """An empty ring buffer of ``capacity`` points of dimension ``input_dim``."""
    if int(capacity) < 1:
        raise ValueError(f"capacity: expected a positive int, received {capacity}")
    return ReplayMemory(jnp.zeros((capacity, input_dim), input_dtype),
                        jnp.zeros((capacity,), target_dtype),
                        jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int32))


def replay_add(memory: ReplayMemory, inputs: Array, targets: Array) -> ReplayMemory:
    """Write a chunk ``(b, d)`` / ``(b,)``; the buffer keeps the ``R`` most recent points."""
    R = memory.inputs.shape[0]
    inputs = jnp.asarray(inputs, memory.inputs.dtype)
    targets = jnp.asarray(targets, memory.targets.dtype)
    if inputs.shape[0] > R:                      # only the last R of a long chunk survive
        inputs, targets = inputs[-R:], targets[-R:]
    b = inputs.shape[0]
    idx = (memory.position + jnp.arange(b)) % R
    return ReplayMemory(memory.inputs.at[idx].set(inputs), memory.targets.at[idx].set(targets),
                        jnp.minimum(memory.size + b, R).astype(jnp.int32),
                        ((memory.position + b) % R).astype(jnp.int32))


def replay_sample(rng_key: Array, memory: ReplayMemory, num: int) -> tuple[Array, Array, Array]:
    """``num`` distinct stored points drawn uniformly without replacement.

    Returns ``(inputs (num, d), targets (num,), valid (num,))``; when fewer than ``num`` points
    are stored the remaining slots are marked invalid (``valid`` False) so shapes stay fixed.
    """
    R = memory.inputs.shape[0]
    num = int(num)
    # float32 whatever jax_enable_x64 says, so that a float64 learner elsewhere in the process
    # does not change which points are replayed
    scores = jax.random.uniform(rng_key, (R,), jnp.float32)
    scores = jnp.where(jnp.arange(R) < memory.size, scores, 2.0)   # empty slots last
    order = jnp.argsort(scores)
    take = order[:num] if num <= R else order[jnp.arange(num) % R]   # num > R: slots repeat
    valid = jnp.arange(num) < jnp.minimum(memory.size, R)
    return memory.inputs[take], memory.targets[take], valid


def with_replay(rng_key: Array, memory: ReplayMemory | None, inputs: Array, targets: Array,
                num: int) -> tuple[Array, Array, Array]:
    """The chunk ``(inputs (b, d), targets (b,))`` with ``num`` replayed points appended
    (App. D.4: a chunk of 10 from the memory of 100 makes a chunk of 20).

    Returns ``(inputs (b + num, d), targets (b + num,), mask (b + num,))``; ``mask`` is False on
    empty memory slots. With ``memory`` None the chunk is returned as it is, all points valid.
    """
    mask = jnp.ones((inputs.shape[0],), bool)
    if memory is None:
        return inputs, targets, mask
    xr, yr, valid = replay_sample(rng_key, memory, num)
    return (jnp.concatenate([inputs, xr.astype(inputs.dtype)]),
            jnp.concatenate([targets, yr.astype(targets.dtype)]),
            jnp.concatenate([mask, valid]))
