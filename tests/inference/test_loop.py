"""The one run loop (inference/loop.py) on a tiny deterministic engine: minibatch order,
early stopping rules, best-or-last state, snapshots and exact resume, progress bar."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from inference.base import Engine, is_state
from inference.loop import (LoopConfig, NoImprovement, Plateau, plateau_reached, run_loop,
                            state_from_tree, state_to_tree)


class MeanState(NamedTuple):
    mean: np.ndarray
    count: int


class MeanInfo(NamedTuple):
    loss: float


class RunningMean:
    """Step: move the estimate a fraction towards the minibatch mean (a deterministic engine
    whose state depends on the minibatch order)."""

    def init(self) -> MeanState:
        return MeanState(np.zeros(()), 0)

    def step(self, rng, state, batch):
        (x,) = batch
        new = state.mean + 0.3 * (x.mean() - state.mean)
        return MeanState(new, state.count + 1), MeanInfo(float(((x - new) ** 2).mean()))


X = np.random.default_rng(0).normal(size=37)


def test_the_engine_and_its_state_follow_the_contract():
    e = RunningMean()
    assert isinstance(e, Engine) and is_state(e.init())
    assert not is_state((1, 2)) and not is_state(MeanState(object(), 0))


def test_epochs_use_every_row_once_and_are_reproducible():
    e = RunningMean()
    cfg = LoopConfig(batch_size=10, max_epochs=3, seed=5)
    a = run_loop(e, e.init(), (X,), cfg)
    b = run_loop(e, e.init(), (X,), cfg)
    assert a.steps == 3 * 4 and a.epochs == 3 and b.final.engine.mean == a.final.engine.mean
    c = run_loop(e, e.init(), (X,), LoopConfig(batch_size=10, max_epochs=3, seed=6))
    assert c.final.engine.mean != a.final.engine.mean
    with pytest.raises(ValueError, match="rows"):
        run_loop(e, e.init(), (X, X[:3]), cfg)
    with pytest.raises(ValueError, match="at least one row"):
        run_loop(e, e.init(), (X[:0],), cfg)
    with pytest.raises(ValueError, match="batch_size"):
        LoopConfig(batch_size=0, max_epochs=1)


def test_plateau_rule_of_algorithm_1():
    assert not plateau_reached([0.5, 0.6], 2, 1e-4)
    assert not plateau_reached([0.5, 0.6, 0.7], 2, 1e-4)
    assert plateau_reached([0.5, 0.6, 0.7, 0.7, 0.7], 2, 1e-4)
    assert plateau_reached([0.5, 0.7, 0.6, 0.7], 2, 1e-4)  # A_4 == A_2: the paper stops
    assert not plateau_reached([0.5, 0.7, 0.6, 0.8], 2, 1e-4)
    assert plateau_reached([0.7, 0.5, 0.70005], 1, 1e-4) is False
    assert plateau_reached([0.7, 0.5, 0.70005], 2, 1e-4)


def test_plateau_stops_and_the_best_state_is_kept():
    e = RunningMean()
    scripted = iter([0.5, 0.6, 0.7, 0.7, 0.7, 0.9, 0.9])
    seen = []

    def validate(s):
        seen.append(float(s.mean))
        return next(scripted)

    cfg = LoopConfig(batch_size=10, max_epochs=20, stopping=Plateau(2, 1e-4), keep="best")
    res = run_loop(e, e.init(), (X,), cfg, validate=validate)
    # |A_5 - A_3| = 0 < tol after epoch 5 > patience: stop; best = epoch 3 (first 0.7)
    assert res.epochs == 5 and res.stopped_early
    assert res.kept_epoch == 3 and res.kept_validation == 0.7
    assert [v for _, v in res.validation] == [0.5, 0.6, 0.7, 0.7, 0.7]
    assert float(res.state.mean) == seen[2] and seen[2] != seen[4]
    assert float(res.final.engine.mean) == seen[4]


def test_keep_last_and_the_no_improvement_rule_of_the_authors_stopper():
    e = RunningMean()
    values = iter([0.5, 0.7, 0.6, 0.6, 0.6, 0.6])
    cfg = LoopConfig(batch_size=10, max_epochs=30, validate_every=2,
                     stopping=NoImprovement(3), keep="last")
    res = run_loop(e, e.init(), (X,), cfg, validate=lambda s: next(values))
    # validations at epochs 2, 4, ...; best 0.7 at epoch 4; 3 checks without a new best: 10
    assert [ep for ep, _ in res.validation] == [2, 4, 6, 8, 10]
    assert res.epochs == 10 and res.stopped_early
    assert res.kept_epoch == 10 and res.kept_validation == 0.6
    assert res.state is res.final.engine


def test_a_resumed_loop_ends_exactly_like_the_uninterrupted_one(tmp_path):
    import torch

    from ppl_cl.persist import load_tree, save_tree

    class TorchMean(RunningMean):
        def init(self):
            return MeanState(torch.zeros((), dtype=torch.float64), 0)

    e = TorchMean()
    x = torch.as_tensor(X)
    cfg = LoopConfig(batch_size=8, max_epochs=9, stopping=Plateau(50, 0.0), keep="best",
                     seed=3)

    def validate(s):
        return -round(abs(float(s.mean) - 0.05), 3)

    snaps = []
    full = run_loop(e, e.init(), (x,), cfg, validate=validate, snapshot=snaps.append,
                    snapshot_every_s=0.0)
    assert [s.epoch for s in snaps] == list(range(1, 9))  # not after the last epoch
    for snap in (snaps[0], snaps[4], snaps[7]):
        path = tmp_path / f"snap{snap.epoch}.npz"
        save_tree(path, state_to_tree(snap))   # through the checkpoint format (no pickle)
        tree, _ = load_tree(path)
        res = run_loop(e, e.init(), (x,), cfg, validate=validate,
                       resume=state_from_tree(tree, e.init()))
        assert torch.equal(res.state.mean, full.state.mean)
        assert res.epoch_losses == full.epoch_losses and res.validation == full.validation
        assert (res.kept_epoch, res.epochs, res.steps) == (full.kept_epoch, full.epochs,
                                                           full.steps)
        assert res.wall_time_s >= tree["wall_time_s"] > 0
    with pytest.raises(ValueError, match="runs 3 epochs"):
        run_loop(e, e.init(), (x,), LoopConfig(batch_size=8, max_epochs=3), resume=snaps[4])
    with pytest.raises(ValueError, match="format"):
        state_from_tree({"format": 1}, e.init())
    # no snapshot before snapshot_every_s has passed
    few = []
    run_loop(e, e.init(), (x,), cfg, snapshot=few.append, snapshot_every_s=3600.0)
    assert few == []


def test_jax_engines_get_one_key_per_step():
    import jax
    import jax.numpy as jnp

    class Noisy:
        def init(self):
            return MeanState(jnp.zeros(()), 0)

        def step(self, rng, state, batch):
            return MeanState(state.mean + jax.random.normal(rng), state.count + 1), \
                MeanInfo(0.0)

    cfg = LoopConfig(batch_size=10, max_epochs=2)
    a = run_loop(Noisy(), Noisy().init(), (X,), cfg, rng=jax.random.PRNGKey(0))
    b = run_loop(Noisy(), Noisy().init(), (X,), cfg, rng=jax.random.PRNGKey(0))
    keys = jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(0), i)))(
        jnp.arange(8))
    assert float(a.state.mean) == float(b.state.mean)
    np.testing.assert_allclose(float(a.state.mean), float(keys.sum()), rtol=1e-12)


def test_progress_bar(capsys):
    e = RunningMean()
    run_loop(e, e.init(), (X,), LoopConfig(batch_size=8, max_epochs=2, progress=True,
                                           desc="task 1"))
    assert "task 1" in capsys.readouterr().err
