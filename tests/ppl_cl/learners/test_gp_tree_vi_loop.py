"""GP-Tree's VI / DKL base session on the one run loop (inference/gp_tree_vi.py +
inference/loop.py): the functional SGD matches torch.optim.SGD + MultiStepLR bit for bit, a fit
stopped at a snapshot and resumed ends bit-identical to the uninterrupted fit, and early stopping
on a validation batch stops and keeps the best epoch."""

import numpy as np
import pytest
import torch

from inference.gp_tree_vi import SGDEngine, multistep_lr
from ppl_cl import Batch
from ppl_cl.learners.gp_tree import GPTree
from ppl_cl.persist import load_tree, save_tree

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _blobs(n_per=20, seed=0, centres=(0.0, 0.5, np.pi, np.pi + 0.5), spread=0.2):
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c, a in enumerate(centres):
        xs.append(np.c_[np.cos(a), np.sin(a)] + spread * rng.normal(size=(n_per, 2)))
        ys.append(np.full(n_per, c))
    return np.concatenate(xs), np.concatenate(ys).astype(np.int64)


def _dkl(**kw):
    base = dict(inference="vi", backbone="mlp", hidden=(8,), embedding_dim=4, epochs=6,
                pretrain_epochs=2, milestones=(1, 4), batch_size=16, learning_rate=0.05,
                kmeans_n_init=3, inducing_per_class=3, seed=4)
    base.update(kw)
    return GPTree(**base)


def _assert_same(a: GPTree, b: GPTree, x):
    sa, sb = a.state_dict(), b.state_dict()
    for k in ("inducing", "exemplars"):
        assert torch.equal(sa[k], sb[k]), k
    for name, v in (sa["backbone"] or {}).items():
        assert torch.equal(v, sb["backbone"][name]), name
    for i, node in sa["nodes"].items():
        for k, v in node.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, sb["nodes"][i][k]), (i, k)
    np.testing.assert_array_equal(a.predict(x).probs, b.predict(x).probs)


def test_sgd_engine_matches_torch_sgd_and_multisteplr_bit_for_bit():
    torch.manual_seed(0)
    w0, X = torch.randn(5, dtype=torch.float64), torch.randn(40, 5, dtype=torch.float64)
    y = X @ torch.randn(5, dtype=torch.float64)
    w = w0.clone().requires_grad_(True)
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=1e-3)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 3, 3], gamma=0.1)
    loss = lambda p, nodes, b: (((b[0] @ p["w"] - b[1]) ** 2).mean(), nodes)
    engine = SGDEngine(loss, ["w"], 0.1, 0.9, 1e-3, (2, 3, 3))
    state = engine.init(None, {"w": w0})
    for _ in range(5):
        for s in range(0, 40, 16):
            opt.zero_grad()
            ((X[s:s + 16] @ w - y[s:s + 16]) ** 2).mean().backward()
            opt.step()
            state, _ = engine.step(None, state, (X[s:s + 16], y[s:s + 16]))
        sched.step()
        state = engine.end_epoch(state)
        assert engine.lr(state.epoch) == sched.get_last_lr()[0]
        assert torch.equal(state.params["w"], w.detach())
    assert multistep_lr(0.1, (2, 3, 3), 0.1, 5) == sched.get_last_lr()[0]


@pytest.mark.parametrize("which", [0, 2])   # in the pre-training, in the tree loss
def test_dkl_fit_resumed_from_a_snapshot_is_bit_identical(tmp_path, which):
    x, y = _blobs()
    full = _dkl()
    snaps = []
    rec_full = full.update(Batch(x, y), snapshot=snaps.append, snapshot_every_s=0.0)
    # after pre-training epoch 1 and tree-loss epochs 1-3 (none after a phase's last epoch)
    assert [s["phase"] for s in snaps] == ["pretrain", "gp", "gp", "gp"]
    snap = snaps[which]
    save_tree(tmp_path / "snap.npz", snap)      # through the file, as a stopped run would
    tree, _ = load_tree(tmp_path / "snap.npz")
    resumed = _dkl()
    rec = resumed.update(Batch(x, y), resume=tree)
    assert rec["pretrain_losses"] == rec_full["pretrain_losses"]
    assert rec["gp_losses"] == rec_full["gp_losses"]
    _assert_same(full, resumed, x)


def test_vi_fit_without_backbone_resumes_bit_identically():
    x, y = _blobs(seed=3)
    full = GPTree(inference="vi", epochs=5, pretrain_epochs=0, milestones=(2,), batch_size=16,
                  natural_lr=0.3, kmeans_n_init=3, seed=2)
    snaps = []
    full.update(Batch(x, y), snapshot=snaps.append, snapshot_every_s=0.0)
    resumed = GPTree(full.config)
    resumed.update(Batch(x, y), resume=snaps[1])
    _assert_same(full, resumed, x)


def test_early_stopping_stops_and_keeps_the_best_epoch():
    x, y = _blobs(seed=1)
    xv, yv = _blobs(seed=2)
    gp = GPTree(inference="vi", epochs=40, pretrain_epochs=0, batch_size=32, natural_lr=0.3,
                kmeans_n_init=3, patience=2)
    vals = []
    orig = gp._vi_accuracy
    gp._vi_accuracy = lambda *a: vals.append(orig(*a)) or vals[-1]
    rec = gp.update(Batch(x, y), validation=Batch(xv, yv))
    assert rec["stopped_early"] and rec["gp_epochs"] < 40
    assert len(rec["gp_losses"]) == rec["gp_epochs"] == len(vals)
    best = int(np.argmax(vals))                  # the first best (NoImprovement, min_delta 0:
    assert vals[best] == max(vals)               # ties count as new bests)
    assert rec["gp_epochs"] - rec["kept_epoch"] == 2
    assert gp.predict(xv).accuracy(yv) == pytest.approx(vals[rec["kept_epoch"] - 1])
    # without a validation batch nothing stops
    rec2 = GPTree(gp.config.replace(epochs=6)).update(Batch(x, y))
    assert not rec2["stopped_early"] and rec2["gp_epochs"] == 6


def test_loop_arguments_are_refused_where_no_epoch_loop_runs():
    x, y = _blobs(n_per=8)
    gibbs = GPTree(num_chains=2, num_steps=1, kmeans_n_init=2)
    with pytest.raises(ValueError, match="only a VI base session"):
        gibbs.update(Batch(x, y), validation=Batch(x, y))
    assert gibbs.tree is None
    vi = GPTree(inference="vi", epochs=2, pretrain_epochs=0, kmeans_n_init=2)
    with pytest.raises(ValueError, match="labels \\[7\\]"):
        vi.update(Batch(x, y), validation=Batch(x[:2], np.array([0, 7])))
    with pytest.raises(ValueError, match="resume: expected a snapshot"):
        vi.update(Batch(x, y), resume={"phase": "other"})
    assert vi.tree is None
