"""GP-Tree experiments at tiny sizes: registration, summary keys of the issue, the CUB FSCIL
protocol on a generated miniature of the xlsa17 file and the official session lists."""

import json

import numpy as np
import pytest
import scipy.io

from ppl_cl.configs.gp_tree import GPTreeConfig
from ppl_cl.experiments import get, run_experiment

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY_LEARNER = GPTreeConfig(inference="vi", backbone="mlp", hidden=(16,), embedding_dim=8,
                            epochs=3, pretrain_epochs=1, milestones=(2,), batch_size=128,
                            num_chains=4, num_steps=3, kmeans_n_init=3, dtype="float32")


def test_registered_with_quick_and_paper_numbers():
    for name in ("gptree-classes", "gptree-dkl-mnist", "gptree-fscil"):
        spec = get(name)
        assert spec.quick and spec.paper
    assert "acc_gptree_10" in get("gptree-classes").paper
    assert "final_session_acc" in get("gptree-fscil").paper


@pytest.mark.data("letter")
def test_gptree_classes_tiny(tmp_path):
    m = run_experiment("gptree-classes", out=tmp_path, overrides={
        "class_counts": [3, 4], "seeds": "2", "train_per_class": "8", "test_per_class": "10",
        "vi": "false", "chain_counts": "[2]", "methods": "gptree,gptree_rnd,sbm,lsm,ove"})
    s = m["summary"]
    for key in ("acc_gptree_4", "acc_sbm_4", "acc_lsm_4", "acc_ove_4", "acc_gptree_rnd_3",
                "acc_gptree_chains2_4", "sem_gptree_4"):
        assert key in s and 0.0 <= s[key] <= 100.0
    assert s["acc_gptree_4"] > 50.0                      # chance is 25 %
    assert (tmp_path / "accuracy_vs_classes.png").exists()
    assert json.loads((tmp_path / "partial.json").read_text())["seeds_done"] == 2
    # every Gibbs method's chains in a file of its own: real chains with sample_stats, and the
    # same training points in every log_likelihood, so az.compare works across the methods
    import arviz as az

    assert m["posterior_files"] == [f"posterior_{k}.nc" for k in
                                    ("gptree", "gptree_rnd", "sbm", "lsm", "ove")]
    files = {k: az.from_netcdf(str(tmp_path / f"posterior_{k}.nc")) for k in ("gptree", "lsm")}
    for idata in files.values():
        assert idata.attrs["sampling"] == "markov chains" and "sample_stats" in idata.groups()
        assert idata.log_likelihood["y"].shape == (4, 50, 24)        # 4 chains x 50 sweeps
    np.testing.assert_array_equal(files["gptree"].observed_data["y"].values,
                                  files["lsm"].observed_data["y"].values)
    summary = az.summary(files["gptree"], var_names=list(files["gptree"].posterior)[:1],
                         kind="diagnostics")
    assert np.isfinite(summary["r_hat"]).all()


@pytest.mark.data("letter")
def test_gptree_fscil_tiny(tmp_path):
    m = run_experiment("gptree-fscil", out=tmp_path, overrides={
        "runs": "1", "n_base_classes": "4", "n_sessions": "2", "learner": TINY_LEARNER})
    s = m["summary"]
    assert isinstance(s["session_acc"], list) and len(s["session_acc"]) == 3
    assert s["final_session_acc"] == s["session_acc"][-1]
    for key in ("acc_session_tree_final", "acc_rebuild_final", "acc_ncm_final",
                "forgetting_gptree", "forgetting_ncm"):
        assert key in s
    # session 1 (the base session) is the same learner for every tree variant
    assert s["acc_gptree_session1"] == s["acc_session_tree_session1"] == s["acc_rebuild_session1"]
    assert (tmp_path / "sessions.png").exists()


@pytest.mark.data("mnist")
def test_gptree_dkl_mnist_tiny(tmp_path):
    m = run_experiment("gptree-dkl-mnist", out=tmp_path, overrides={
        "train_size": "600", "test_size": "300",
        "learner": GPTreeConfig(inference="vi", backbone="mlp", hidden=(32,), embedding_dim=8,
                                epochs=2, pretrain_epochs=1, milestones=(2,), batch_size=128,
                                inducing_per_class=3, kmeans_n_init=3, dtype="float32")})
    s = m["summary"]
    assert set(("acc_gptree", "acc_softmax")) <= set(s)
    assert s["acc_gptree"] > 20.0                         # chance is 10 %


def _cub_miniature(root, n_classes=6, per_class_train=8, per_class_test=4, dim=12, spread=1.0):
    """xlsa17-layout res101.mat / att_splits.mat with image_files, plus FSCIL lists: classes
    1-2 base (session 1), 3-4 session 2, 5-6 session 3 (2-way 3-shot); ``spread``: the
    features' standard deviation about their class centre (the centres' is 3)."""
    rng = np.random.default_rng(0)
    files, labels, feats = [], [], []
    names = [f"{c:03d}.Bird_{c}" for c in range(1, n_classes + 1)]
    for c in range(1, n_classes + 1):
        centre = rng.normal(size=dim) * 3
        for k in range(per_class_train + per_class_test):
            files.append(f"/BS/xlsa17/CUB_200_2011/images/{names[c - 1]}/img_{c}_{k}.jpg")
            labels.append(c)
            feats.append(np.abs(centre + spread * rng.normal(size=dim)))
    n = len(files)
    (root / "cub" / "index_list").mkdir(parents=True)
    fcell = np.empty((n, 1), dtype=object)
    fcell[:, 0] = files
    ncell = np.empty((n_classes, 1), dtype=object)
    ncell[:, 0] = names
    scipy.io.savemat(root / "cub/res101.mat", {"features": np.asarray(feats).T,
                                               "labels": np.asarray(labels)[:, None],
                                               "image_files": fcell})
    per = per_class_train + per_class_test
    rows = np.arange(n)
    is_test = (rows % per) >= per_class_train
    one_based = lambda m: (rows[m] + 1)[:, None].astype(np.uint16)
    scipy.io.savemat(root / "cub/att_splits.mat", {
        "allclasses_names": ncell, "trainval_loc": one_based(~is_test),
        "test_seen_loc": one_based(is_test), "test_unseen_loc": one_based(is_test)[:0],
        "train_loc": one_based(~is_test), "val_loc": one_based(is_test)[:1]})

    def rel(i):
        return "CUB_200_2011/images/" + "/".join(files[i].split("/")[-2:])

    groups = [(1, 2), (3, 4), (5, 6)]
    for s, g in enumerate(groups, start=1):
        shots = per_class_train if s == 1 else 3
        tr = [rel((c - 1) * per + k) for c in g for k in range(shots)]
        te = [rel((c - 1) * per + per_class_train + k) for c in g for k in range(per_class_test)]
        (root / "cub/index_list" / f"session_{s}.txt").write_text("\n".join(tr) + "\n")
        (root / "cub/index_list" / f"test_{s}.txt").write_text("\n".join(te) + "\n")


def test_cub_session_lists_protocol_on_a_miniature(tmp_data_root):
    from ppl_cl.data.fscil import cub_session_lists_splits

    _cub_miniature(tmp_data_root)
    sessions = cub_session_lists_splits()
    assert [s.classes for s in sessions] == [(0, 1), (2, 3), (4, 5)]
    assert [len(s.train) for s in sessions] == [16, 6, 6]
    assert [len(s.test) for s in sessions] == [8, 16, 24]
    assert sessions[0].train.x.shape[1] == 12
    m = run_experiment("gptree-fscil", out=tmp_data_root / "run", overrides={
        "dataset": "cub", "runs": "1", "n_sessions": "2", "learner": TINY_LEARNER})
    assert len(m["summary"]["session_acc"]) == 3
    # pinned from this run (seed 0, float32 VI; the same digits in a second run): 8 / 8, 15 / 16
    # and 17 / 24 of the sessions' test images. The tolerance is one test image per session
    # (another platform's float32 rounding may move a borderline one); seeds 1 and 2 end at
    # 12 / 24 and 13 / 24, four and five images below
    acc, sizes = m["summary"]["session_acc"], (8, 16, 24)
    pinned = [100.0, 100.0 * 15 / 16, 100.0 * 17 / 24]
    assert all(abs(a - p) <= 100.0 / n + 1e-9 for a, p, n in zip(acc, pinned, sizes)), acc
    assert all(abs(a * n / 100 - round(a * n / 100)) < 1e-9 for a, n in zip(acc, sizes))
    # a listed image without a feature row is named
    (tmp_data_root / "cub/index_list/test_3.txt").write_text(
        "CUB_200_2011/images/999.None/none.jpg\n")
    with pytest.raises(ValueError, match="no feature row"):
        cub_session_lists_splits()


def test_gptree_classes_on_cub_features_miniature(tmp_data_root):
    _cub_miniature(tmp_data_root)
    m = run_experiment("gptree-classes", out=tmp_data_root / "run", overrides={
        "dataset": "cub", "class_counts": "[3]", "seeds": "1", "train_per_class": "6",
        "vi": "false", "chain_counts": "[]", "methods": "gptree,sbm"})
    assert m["summary"]["dataset"] == "cub" and m["summary"]["acc_gptree_3"] > 60.0


def test_gptree_classes_headline_accuracy_on_a_harder_miniature(tmp_data_root):
    """On the miniature above the classes are far apart (every method scores 100 %); with a
    spread of 4 about centres of scale 3 they overlap. 3 classes x 20 test points: the
    accuracies are k / 60. Pinned from this run (seed 0: 34 / 60 for GP-Tree and for SBM-GP;
    a second run gave the same). The tolerance is one test point: the seeded Gibbs chains are
    deterministic here, but another platform's rounding may move one borderline point; seeds
    1 and 2 give 60.0 / 63.3 (GP-Tree) and 63.3 / 63.3 (SBM-GP), two to four points away.
    Chance is 33.3 %."""
    _cub_miniature(tmp_data_root, per_class_test=20, spread=4.0)
    m = run_experiment("gptree-classes", out=tmp_data_root / "run", overrides={
        "dataset": "cub", "class_counts": "[3]", "seeds": "1", "train_per_class": "6",
        "vi": "false", "chain_counts": "[]", "methods": "gptree,sbm"})
    s = m["summary"]
    one_point = 100.0 / 60
    assert s["acc_gptree_3"] == pytest.approx(100.0 * 34 / 60, abs=one_point + 1e-9)
    assert s["acc_sbm_3"] == pytest.approx(100.0 * 34 / 60, abs=one_point + 1e-9)
    for key in ("acc_gptree_3", "acc_sbm_3"):   # a whole number of the 60 test points
        assert s[key] * 60 / 100 == pytest.approx(round(s[key] * 60 / 100), abs=1e-9)


def test_table1_claims_are_registered_and_check_orderings():
    spec = get("gptree-classes")
    texts = [c.text for c in spec.claims]
    assert any("GP-Tree > SBM-GP at 26" in t for t in texts)
    assert any("GP-Tree > GP-Tree Rnd. at 4" in t for t in texts)
    order = [c for c in spec.claims if c.keys == ("acc_gptree_26", "acc_lsm_26", "acc_sbm_26")]
    assert len(order) == 1
    assert order[0].check({"acc_gptree_26": 71.5, "acc_lsm_26": 68.0, "acc_sbm_26": 67.9})
    assert not order[0].check({"acc_gptree_26": 71.5, "acc_lsm_26": 61.7, "acc_sbm_26": 68.0})
    assert order[0].check({"acc_gptree_26": 71.5}) is None


def test_validation_split_is_stratified_and_disjoint():
    from ppl_cl.experiments.gp_tree import _validation_split

    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], [10, 7, 4])
    x = np.arange(y.size, dtype=float)[:, None]
    xt, yt, xv, yv = _validation_split(x, y, 0.5, rng)
    assert sorted(np.concatenate([xt, xv])[:, 0].tolist()) == list(range(y.size))
    assert [int((yv == c).sum()) for c in range(3)] == [5, 4, 2]       # round(0.5 n) per class
    with pytest.raises(ValueError, match="val_fraction"):
        _validation_split(x[:1], y[:1], 0.5, rng)


def test_grid_row_keeps_the_best_validation_cell_and_reports_its_test_accuracy():
    """App. C.1's selection on a toy: every cell fitted, the first cell with the highest
    validation accuracy kept, its test accuracy reported (recomputed here cell by cell)."""
    from ppl_cl import Batch
    from ppl_cl.experiments.gp_tree import (GPTreeClassesConfig, _classes_learner, _grid_row)

    rng = np.random.default_rng(1)
    centres = np.array([[1.0, 0.2, 0.0], [0.2, 1.0, 0.1], [0.0, 0.3, 1.0]])

    def draw(n):
        y = np.repeat(np.arange(3), n)
        return np.abs(centres[y] + 0.45 * rng.normal(size=(y.size, 3))), y

    xs, ys = draw(8)
    xt, yt = draw(6)
    xv, yv = draw(6)
    config = GPTreeClassesConfig(grid=True, grid_outputscales=(1.0, 9.0), num_steps=1,
                                 chains_small=4, learner=GPTreeConfig(
                                     num_steps=1, predict="mean", num_chains=4, kmeans_n_init=3))
    data = (xs, ys, xt, yt, xv, yv)
    for method in ("gptree", "lsm"):
        acc, cell, acc_val = _grid_row(method, 3, config, 0, data)
        val, test = [], []
        for c in config.grid_cells():
            learner = _classes_learner(method, 3, config, 0, c)
            learner.update(Batch(xs, ys))
            val.append(100.0 * learner.predict(xv).accuracy(yv))
            test.append(100.0 * learner.predict(xt).accuracy(yt))
        best = int(np.argmax(val))
        assert cell == config.grid_cells()[best] and acc_val == val[best] and acc == test[best]


def test_gptree_classes_grid_on_cub_features_miniature(tmp_data_root):
    """``grid=true`` end to end (no real data needed): each Table 1 method's selected cell,
    the linear-kernel share and the test accuracies of the selected cells."""
    _cub_miniature(tmp_data_root)
    m = run_experiment("gptree-classes", out=tmp_data_root / "run", overrides={
        "dataset": "cub", "class_counts": "[3]", "seeds": "2", "train_per_class": "6",
        "vi": "false", "chain_counts": "[2]", "methods": "gptree,sbm,lsm,ove", "grid": "true",
        "grid_outputscales": "[1, 9]"})
    s, sel = m["summary"], m["selected"]
    assert s["grid"] is True
    for method in ("gptree", "sbm", "lsm", "ove"):
        assert 0.0 <= s[f"acc_{method}_3"] <= 100.0
        assert 0.0 <= s[f"linear_share_{method}_3"] <= 1.0
        assert len(sel[method]["3"]) == 2                            # one choice per seed
        for kernel, scale, acc_val in sel[method]["3"]:
            assert kernel in ("linear", "rbf") and scale in (1.0, 9.0) and 0 <= acc_val <= 100
    assert 0.0 <= s["acc_gptree_chains2_3"] <= 100.0
    assert "kernel" in (tmp_data_root / "run" / "progress.log").read_text()


def test_gptree_classes_resumes_after_a_stop(tmp_data_root, monkeypatch):
    """A run stopped in its second seed and resumed (``--resume``) gives the metrics of an
    uninterrupted run: each finished seed is checkpointed (a full grid run takes hours)."""
    import ppl_cl.experiments.gp_tree as exp

    _cub_miniature(tmp_data_root)
    over = {"dataset": "cub", "class_counts": "[3]", "seeds": "2", "train_per_class": "6",
            "vi": "false", "chain_counts": "[]", "methods": "gptree,lsm", "grid": "true",
            "grid_outputscales": "[1, 9]"}
    whole = run_experiment("gptree-classes", out=tmp_data_root / "whole", overrides=over)
    real = exp._grid_row

    def stop_in_second_seed(*args, **kwargs):
        if args[3] == 1:                                  # the seed argument
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(exp, "_grid_row", stop_in_second_seed)
    with pytest.raises(KeyboardInterrupt):
        run_experiment("gptree-classes", out=tmp_data_root / "cut", overrides=over)
    seeds_fitted = []

    def record(*args, **kwargs):
        seeds_fitted.append(args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(exp, "_grid_row", record)
    resumed = run_experiment("gptree-classes", out=tmp_data_root / "cut", overrides=over,
                             resume=True)
    assert set(seeds_fitted) == {1}                       # seed 0 came from its checkpoint
    assert resumed["summary"] == whole["summary"] and resumed["selected"] == whole["selected"]
    assert "resume" in (tmp_data_root / "cut" / "progress.log").read_text()
