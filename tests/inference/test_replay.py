"""The replay memory of App. D.4 (inference/replay.py): the most recent points are kept,
draws are without replacement and masked when the memory is not full, and a replayed chunk is
appended with its mask."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from inference import replay as rp


def test_replay_memory_keeps_most_recent_points_and_samples_without_replacement():
    mem = rp.replay_init(5, 2)
    x, y, valid = rp.replay_sample(jax.random.PRNGKey(0), mem, 3)
    assert x.shape == (3, 2) and not bool(valid.any())
    mem = rp.replay_add(mem, np.arange(6).reshape(3, 2), np.array([0, 1, 2]))
    x, y, valid = rp.replay_sample(jax.random.PRNGKey(1), mem, 4)
    assert valid.tolist() == [True, True, True, False]
    assert sorted(np.asarray(y)[:3].tolist()) == [0, 1, 2]
    for c in range(3):   # 3 + 9 points into 5 slots: the 5 most recent remain
        mem = rp.replay_add(mem, np.full((3, 2), 10.0 + c), np.arange(3) + 3 * c + 3)
    assert int(mem.size) == 5
    assert sorted(np.asarray(mem.targets).tolist()) == [7, 8, 9, 10, 11]
    x, y, valid = rp.replay_sample(jax.random.PRNGKey(2), mem, 5)
    assert bool(valid.all()) and sorted(np.asarray(y).tolist()) == [7, 8, 9, 10, 11]
    # a chunk longer than the memory keeps its own last points
    mem = rp.replay_add(mem, np.zeros((7, 2)), np.arange(100, 107))
    assert sorted(np.asarray(mem.targets).tolist()) == [102, 103, 104, 105, 106]




def test_with_replay_appends_the_drawn_points_with_their_mask():
    mem = rp.replay_add(rp.replay_init(4, 2), np.full((2, 2), 7.0), np.array([5, 6]))
    x, y = jnp.ones((3, 2)), jnp.array([0, 1, 2], jnp.int32)
    xa, ya, mask = rp.with_replay(jax.random.PRNGKey(0), mem, x, y, 3)
    assert xa.shape == (6, 2) and mask.tolist() == [True] * 5 + [False]
    assert sorted(np.asarray(ya)[3:5].tolist()) == [5, 6]
    np.testing.assert_array_equal(np.asarray(xa)[3:5], 7.0)
    xb, yb, mb = rp.with_replay(jax.random.PRNGKey(0), None, x, y, 3)
    assert xb is x and yb is y and bool(mb.all()) and mb.shape == (3,)
