"""run_loop's backward-compatible hooks (inference/loop.py): an engine's ``end_epoch`` (an
epoch-indexed schedule) after every epoch, ``on_epoch(epoch, loss)``, and ``order=`` to continue
one stream of torch minibatch permutations across two loops."""

from __future__ import annotations

from typing import NamedTuple

import torch

from inference.loop import LoopConfig, run_loop, state_from_tree, state_to_tree


class SumState(NamedTuple):
    total: torch.Tensor
    epoch: int


class SumInfo(NamedTuple):
    loss: torch.Tensor


class ScheduledSum:
    """Adds ``(epoch + 1) * first row of the batch``: its state depends on the order and on
    the epoch counter that ``end_epoch`` advances."""

    def init(self) -> SumState:
        return SumState(torch.zeros((), dtype=torch.float64), 0)

    def step(self, rng, state, batch):
        (x,) = batch
        total = state.total * 0.5 + (state.epoch + 1) * x[0]
        return SumState(total, state.epoch), SumInfo(x.mean())

    def end_epoch(self, state):
        return state._replace(epoch=state.epoch + 1)


X = torch.randn(23, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def test_end_epoch_and_on_epoch_are_called_after_every_epoch():
    e, seen = ScheduledSum(), []
    res = run_loop(e, e.init(), (X,), LoopConfig(batch_size=5, max_epochs=4, seed=1),
                   on_epoch=lambda ep, loss: seen.append((ep, loss)))
    assert res.state.epoch == 4
    assert [ep for ep, _ in seen] == [1, 2, 3, 4]
    assert [v for _, v in seen] == res.epoch_losses


def test_two_loops_continuing_the_order_equal_one_loop():
    e = ScheduledSum()
    whole = run_loop(e, e.init(), (X,), LoopConfig(batch_size=4, max_epochs=5, seed=3))
    first = run_loop(e, e.init(), (X,), LoopConfig(batch_size=4, max_epochs=2, seed=3))
    second = run_loop(e, first.state, (X,), LoopConfig(batch_size=4, max_epochs=3, seed=3),
                      order=first.final.order)
    assert torch.equal(second.state.total, whole.state.total)
    assert first.epoch_losses + second.epoch_losses == whole.epoch_losses
    # a fresh order (seeded again) gives other permutations
    other = run_loop(e, first.state, (X,), LoopConfig(batch_size=4, max_epochs=3, seed=3))
    assert not torch.equal(other.state.total, second.state.total)


def test_resume_restores_the_schedule_position():
    e, snaps = ScheduledSum(), []
    cfg = LoopConfig(batch_size=6, max_epochs=4, seed=2)
    whole = run_loop(e, e.init(), (X,), cfg, snapshot=snaps.append, snapshot_every_s=0.0)
    resumed = run_loop(e, e.init(), (X,), cfg,
                       resume=state_from_tree(state_to_tree(snaps[1]), e.init()))
    assert snaps[1].engine.epoch == 2 and resumed.state.epoch == 4
    assert torch.equal(resumed.state.total, whole.state.total)
