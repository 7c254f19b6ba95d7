"""Kalman learners (ppl_cl/learners/kalman.py) and experiments (ppl_cl/experiments/kalman.py):
bad input leaves the state unchanged (issue 4, item 8), save/load mid-stream resumes exactly,
ArviZ export, learned forgetting adapts to a shift, the float64 switch, and the experiments on
small sizes (CIFAR-100 on a generated miniature pickle)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

from ppl_cl import Batch
from ppl_cl.data.streams import online_chunks, prequential
from ppl_cl.learner import Learner
from ppl_cl.learners.kalman import KalmanClassifier, KalmanRegressor, OnlineSGDClassifier


def _blobs(n=200, d=6, K=4, seed=0, flip=False):
    """K Gaussian blobs; ``flip`` permutes the labels (a concept shift)."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).normal(scale=2.0, size=(K, d))
    y = rng.integers(0, K, size=n)
    x = centres[y] + rng.normal(size=(n, d))
    if flip:
        y = (y + 1) % K
    return x.astype(np.float32), y.astype(np.int64)


def _state_equal(a: dict, b: dict) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _state_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _state_equal(u, v)
    elif a is None:
        assert b is None
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


_SMALL = dict(feature_network="mlp", feature_dim=8, hidden=[8], fine_tune=True,
              replay_capacity=20, replay_size=5, optimizer="adamw", learn_forgetting=True,
              forgetting_learning_rate=0.1, initial_calibration=3.0, learning_rate=0.05,
              feature_bias=True, feature_normalization=True, num_samples=8)


# ---------------------------------------------------------------------------------------------
# bad input (item 8)
# ---------------------------------------------------------------------------------------------
def test_bad_inputs_raise_and_leave_the_state_unchanged():
    x, y = _blobs(40)
    learner = KalmanClassifier(4, 6, **_SMALL)
    learner.update(Batch(x[:10], y[:10]))
    before = learner.state_dict()
    bad_x = x[10:20].copy()
    bad_x[3, 2] = np.nan
    with pytest.raises(ValueError, match="finite"):
        learner.update(Batch(bad_x, y[10:20]))
    with pytest.raises(ValueError, match="labels in 0..3"):
        learner.update(Batch(x[10:20], np.full(10, 4)))
    with pytest.raises(ValueError, match=r"labels in 0..3"):
        learner.update(Batch(x[10:20], np.full(10, -1)))
    with pytest.raises(ValueError, match=r"expected shape \(n, 6\)"):
        learner.update(Batch(x[10:20, :5], y[10:20]))
    with pytest.raises(ValueError, match=r"expected shape \(n, 6\)"):
        learner.predict(x[:3, :5])
    with pytest.raises(TypeError, match="integer class labels"):
        learner.update(Batch(x[10:20], y[10:20].astype(np.float64)))
    # finite inputs that overflow float32 in the network: the guard refuses the update
    with pytest.raises(ValueError, match="non-finite"):
        learner.update(Batch(np.full((10, 6), 1e38, np.float32), y[10:20]))
    _state_equal(learner.state_dict(), before)
    learner.update(Batch(x[10:20], y[10:20]))          # still usable


@pytest.mark.parametrize("gamma", [0.0, -0.5, 1.01, float("nan"), True])
def test_initial_forgetting_outside_zero_one_is_refused(gamma):
    with pytest.raises(ValueError, match="initial_forgetting"):
        KalmanClassifier(3, 2, initial_forgetting=gamma)
    with pytest.raises(ValueError, match="initial_forgetting"):
        KalmanRegressor(2, initial_forgetting=gamma)


def test_other_bad_configurations():
    with pytest.raises(ValueError, match="transition"):
        KalmanClassifier(3, 2, transition="sometimes")
    with pytest.raises(ValueError, match="feature_dim"):
        KalmanClassifier(3, 2, feature_network="mlp")
    with pytest.raises(ValueError, match="num_classes"):
        KalmanClassifier(1, 2)
    with pytest.raises(ValueError, match="noise_variance"):
        KalmanRegressor(2, noise_variance=-1.0)
    with pytest.raises(ValueError, match="calibration"):
        KalmanRegressor(2, learn_calibration=True)


def test_regressor_rejects_non_finite_targets():
    learner = KalmanRegressor(2)
    learner.update(Batch(np.ones((3, 2)), np.ones(3)))
    before = learner.state_dict()
    with pytest.raises(ValueError, match="finite targets"):
        learner.update(Batch(np.ones((3, 2)), np.array([1.0, np.inf, 0.0])))
    _state_equal(learner.state_dict(), before)


# ---------------------------------------------------------------------------------------------
# save / load
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("transition", ["always", "last"])
def test_save_load_mid_stream_resumes_exactly(tmp_path, transition):
    x, y = _blobs(120, seed=1)
    chunks = online_chunks(x, y, 10)
    a = KalmanClassifier(4, 6, transition=transition, seed=3, **_SMALL)
    for c in chunks[:5]:
        a.update(c)
    a.save(tmp_path / "ckpt.npz")
    b = Learner.load(tmp_path / "ckpt.npz")
    assert isinstance(b, KalmanClassifier)
    ra, rb = prequential(a, chunks[5:]), prequential(b, chunks[5:])
    np.testing.assert_array_equal(ra.log_prob, rb.log_prob)
    _state_equal(a.state_dict(), b.state_dict())
    assert len(a.trajectories()["gamma"]) == len(chunks)


def test_regressor_and_sgd_baseline_save_load(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(60, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=60)
    chunks = online_chunks(x, y, 6)
    a = KalmanRegressor(3, noise_variance=0.05, forgetting_learning_rate=0.1)
    for c in chunks[:4]:
        a.update(c)
    a.save(tmp_path / "r.npz")
    b = KalmanRegressor.load(tmp_path / "r.npz")
    np.testing.assert_array_equal(prequential(a, chunks[4:]).log_prob,
                                  prequential(b, chunks[4:]).log_prob)
    xc, yc = _blobs(60, seed=4)
    cc = online_chunks(xc, yc, 10)
    s = OnlineSGDClassifier(4, 6, feature_dim=8, hidden=[8], replay_capacity=20, replay_size=5)
    for c in cc[:3]:
        s.update(c)
    s.save(tmp_path / "s.npz")
    t = Learner.load(tmp_path / "s.npz")
    np.testing.assert_array_equal(prequential(s, cc[3:]).log_prob, prequential(t, cc[3:]).log_prob)


# ---------------------------------------------------------------------------------------------
# behaviour
# ---------------------------------------------------------------------------------------------
def test_learned_forgetting_adapts_to_a_concept_shift():
    """Labels are permuted halfway: gamma = 1 keeps voting for the old concept, the learned
    gamma drops at the shift and recovers the online accuracy."""
    x1, y1 = _blobs(300, seed=5)
    x2, y2 = _blobs(300, seed=6, flip=True)
    chunks = online_chunks(np.concatenate([x1, x2]), np.concatenate([y1, y2]), 10)
    common = dict(prior_variance=1.0, initial_calibration=5.0, learning_rate=0.05,
                  feature_normalization=True, feature_bias=True)
    fixed = prequential(KalmanClassifier(4, 6, learn_forgetting=False, **common), chunks)
    learner = KalmanClassifier(4, 6, learn_forgetting=True, forgetting_learning_rate=0.05,
                               **common)
    learned = prequential(learner, chunks)
    second = slice(300, None)
    assert learned.correct[second].mean() > fixed.correct[second].mean() + 0.2
    assert learned.log_prob.sum() > fixed.log_prob.sum()
    assert learner.trajectories()["gamma"].min() < 0.99


def test_regressor_tracks_a_level_shift_with_the_mean_preserving_variant():
    y = np.concatenate([np.full(150, 1.0), np.full(150, -0.5)])
    y = y + 0.1 * np.random.default_rng(7).normal(size=300)
    chunks = online_chunks(np.ones((300, 1)), y, 1)
    out = {}
    for name, learn in (("learned", True), ("fixed", False)):
        learner = KalmanRegressor(1, prior_variance=0.01, noise_variance=0.05,
                                  mean_preserving=True, learn_forgetting=learn,
                                  forgetting_learning_rate=1.0)
        out[name] = prequential(learner, chunks)
    assert out["learned"].log_prob.mean() > out["fixed"].log_prob.mean() + 0.5
    assert np.mean(out["learned"].sq_error[-50:]) < 0.05


def test_to_inference_data_exports_readout_posterior_and_trajectories(tmp_path):
    import arviz as az

    x, y = _blobs(50, seed=8)
    learner = KalmanClassifier(4, 6, learn_forgetting=True, forgetting_learning_rate=0.1,
                               dtype="float64")
    for c in online_chunks(x, y, 10):
        learner.update(c)
    idata = learner.to_inference_data(x[:7], y[:7], num_draws=4000, seed=1)
    draws = idata.posterior["readout"].values
    assert draws.shape == (1, 4000, 4, 6)
    M = np.asarray(learner.kalman_state.mean).T
    A = np.asarray(learner.kalman_state.covariance)
    se = np.sqrt(np.diag(A) / 4000)
    assert np.all(np.abs(draws[0].mean(0) - M) < 4.5 * se[None, :])
    np.testing.assert_allclose(np.cov(draws[0, :, 2, :].T), A, atol=6 * A.max() / np.sqrt(4000))
    assert idata.log_likelihood["y"].shape == (1, 4000, 7)
    np.testing.assert_array_equal(idata.observed_data["y"].values, y[:7])
    traj = idata["filtering"]
    np.testing.assert_array_equal(traj["time"].values, [10, 20, 30, 40, 50])
    np.testing.assert_allclose(traj["gamma"].values, learner.trajectories()["gamma"])
    assert idata.constant_data["forgetting_coefficient"].values.reshape(-1)[0] == \
        learner.forgetting_coefficient
    assert np.isfinite(az.loo(idata).elpd_loo)
    idata.to_netcdf(str(tmp_path / "post.nc"))
    reg = KalmanRegressor(2)
    reg.update(Batch(np.ones((4, 2)), np.arange(4.0)))
    assert reg.to_inference_data(num_draws=10).posterior["weights"].shape == (1, 10, 2)


def test_float64_learners_switch_x64_on_by_themselves():
    code = ("import jax; from ppl_cl.learners.kalman import KalmanRegressor;"
            "assert not jax.config.read('jax_enable_x64');"
            "r = KalmanRegressor(2); print(r.kalman_state.covariance.dtype)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "float64"


# ---------------------------------------------------------------------------------------------
# experiments (small sizes)
# ---------------------------------------------------------------------------------------------
def test_kalman_timeseries_experiment(tmp_path):
    from ppl_cl.experiments import run_experiment

    m = run_experiment("kalman-timeseries", out=tmp_path, overrides={"length": "700"})
    s = m["summary"]
    assert s["n_points"] == 700
    assert s["avg_log_pred_learned"] > s["avg_log_pred_fixed"]   # change points at 451 and 709
    assert (tmp_path / "fig1_timeseries.png").exists() and (tmp_path / "posterior.nc").exists()


@pytest.mark.data("mnist")
def test_kalman_online_mnist_small(tmp_path):
    from ppl_cl.experiments import run_experiment

    m = run_experiment("kalman-online-mnist", out=tmp_path, overrides={
        "n_points": "200", "variants": "learned", "regimes": "linear,finetune",
        "baselines": "false", "feature_dim": "32", "hidden": "32",
        "forgetting_rate_grid": "0.01,0.001"})
    s = m["summary"]
    for stream in ("stationary", "nonstationary"):
        for regime in ("linear", "finetune"):
            assert 0.0 <= s[f"online_acc_{stream}_learned_{regime}"] <= 1.0
            assert s[f"cum_logloss_{stream}_learned_{regime}"] > 0
            assert s[f"forgetting_rate_{stream}_learned_{regime}"] in (0.01, 0.001)
        assert s[f"n_points_{stream}"] == 200
    assert (tmp_path / "fig2_nonstationary.png").exists()


@pytest.mark.slow
@pytest.mark.data("mnist")
def test_kalman_online_mnist_quick(tmp_path):
    from ppl_cl.experiments import run_experiment

    s = run_experiment("kalman-online-mnist", quick=True, out=tmp_path)["summary"]
    assert s["online_acc_nonstationary_learned_linear"] > s["online_acc_nonstationary_gamma1_linear"]


def _write_cifar100(root, n_train=400, seed=0):
    """A miniature ``cifar-100-python`` folder in the real format (pickled dicts, bytes keys,
    ``data`` uint8 (n, 3072) as R, G, B planes)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for split, n in (("train", n_train), ("test", 20)):
        images = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
        fine = rng.integers(0, 100, size=n)
        batch = {b"filenames": [b"f.png"] * n, b"batch_label": b"miniature",
                 b"fine_labels": [int(v) for v in fine],
                 b"coarse_labels": [int(v) // 5 for v in fine],
                 b"data": np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(n, 3072))}
        (folder / split).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {b"fine_label_names": [b"c%d" % i for i in range(100)],
            b"coarse_label_names": [b"s%d" % i for i in range(20)]}
    (folder / "meta").write_bytes(pickle.dumps(meta, protocol=2))


@pytest.mark.filterwarnings("ignore::ppl_cl.data.loaders.ChecksumWarning")
def test_kalman_online_cifar100_on_a_miniature_pickle(tmp_data_root, tmp_path):
    from ppl_cl.experiments import get, run_experiment

    _write_cifar100(tmp_data_root)
    out = tmp_path / "run"
    m = run_experiment("kalman-online-cifar100", quick=True, out=out, overrides={
        "n_points": "100", "variants": "learned", "regimes": "linear", "feature_dim": "16",
        "channels": "4,4"})
    s = m["summary"]
    assert 0.0 <= s["online_acc_stationary_learned_linear"] <= 1.0
    assert 0.0 <= s["online_acc_nonstationary_learned_linear"] <= 1.0
    assert s["n_points_stationary"] == 100 and s["n_points_nonstationary"] == 100
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config"]["network"] == "cnn" and cfg["config"]["n_tasks"] == 10
    paper = get("kalman-online-cifar100").paper
    assert paper["online_acc_nonstationary_learned_linear"].value == pytest.approx(0.327)
    assert "Table 1" in paper["online_acc_stationary_gamma1_linear"].source
