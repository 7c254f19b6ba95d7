"""Kalman learners (ppl_cl/learners/kalman.py) on their configs (ppl_cl/configs/kalman.py): bad
input and bad settings are refused with the state unchanged, save/load mid-stream resumes
exactly, ArviZ export, learned forgetting adapts to a shift, the float64 switch, the prior
predictive before the first update and the empty predictive. The online-SGD baseline:
test_online_sgd.py; the experiments: tests/ppl_cl/experiments/test_kalman.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ppl_cl import Batch
from ppl_cl.configs import ConfigError
from ppl_cl.configs.kalman import KalmanConfig, NetworkConfig
from ppl_cl.data.streams import online_chunks
from ppl_cl.learners import load_learner
from ppl_cl.learners.kalman import KalmanClassifier, KalmanRegressor
from ppl_cl.protocols import prequential


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


_SMALL = dict(network=NetworkConfig("mlp", 8, (8,)), fine_tune=True,
              replay_capacity=20, replay_size=5, optimizer="adamw", learn_forgetting=True,
              forgetting_learning_rate=0.1, initial_calibration=3.0, learning_rate=0.05,
              feature_bias=True, feature_normalization=True, num_samples=8)


# ---------------------------------------------------------------------------------------------
# bad input (item 8)
# ---------------------------------------------------------------------------------------------
def test_bad_inputs_raise_and_leave_the_state_unchanged():
    x, y = _blobs(40)
    learner = KalmanClassifier(num_classes=4, input_dim=6, **_SMALL)
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
    with pytest.raises(ValueError, match=r"non-finite values \(NaN/inf\) in [a-z, ]*loss"):
        learner.update(Batch(np.full((10, 6), 1e38, np.float32), y[10:20]))
    _state_equal(learner.state_dict(), before)
    learner.update(Batch(x[10:20], y[10:20]))          # still usable


@pytest.mark.parametrize("transition", ["last", "first", "always"])
def test_identity_features_with_replay_learn_in_every_transition_mode(transition):
    """Issue 65 item 1: KalmanClassifier(10, 20, transition="last", replay_capacity=100) with
    identity features failed every update (NaN gradient of delta at the empty replay slots);
    now every mode learns and the memory fills."""
    rng = np.random.default_rng(9)
    clf = KalmanClassifier(num_classes=10, input_dim=20, transition=transition,
                           replay_capacity=100, forgetting_learning_rate=0.5)
    for _ in range(4):
        x = rng.normal(size=(10, 20)).astype(np.float32)
        x[3] = 0.0                                   # a real point with zero features
        record = clf.update(Batch(x, rng.integers(0, 10, 10)))
    assert int(clf._state.memory.size) == 40
    assert np.isfinite(record["loss"]) and np.isfinite(record["prequential_log_predictive"])
    assert 0.0 < clf.forgetting_coefficient <= 1.0


@pytest.mark.parametrize("gamma", [0.0, -0.5, 1.01, float("nan"), True])
def test_initial_forgetting_outside_zero_one_is_refused(gamma):
    with pytest.raises(ValueError, match="initial_forgetting"):
        KalmanClassifier(num_classes=3, input_dim=2, initial_forgetting=gamma)
    with pytest.raises(ValueError, match="initial_forgetting"):
        KalmanRegressor(input_dim=2, initial_forgetting=gamma)


def test_other_bad_configurations():
    with pytest.raises(ValueError, match="transition"):
        KalmanClassifier(num_classes=3, input_dim=2, transition="sometimes")
    with pytest.raises(ValueError, match="network.feature_dim"):
        KalmanClassifier(num_classes=3, input_dim=2, network=NetworkConfig("mlp"))
    with pytest.raises(ValueError, match="num_classes"):
        KalmanClassifier(num_classes=1, input_dim=2)
    with pytest.raises(ValueError, match="noise_variance"):
        KalmanRegressor(input_dim=2, noise_variance=-1.0)
    with pytest.raises(TypeError, match="learn_calibration"):      # no alpha in regression
        KalmanRegressor(input_dim=2, learn_calibration=True)
    with pytest.raises(TypeError, match="config: expected a KalmanConfig"):
        KalmanClassifier({"num_classes": 3})
    # the config itself: --set strings are parsed and checked by type
    from ppl_cl.configs import apply_overrides
    cfg = apply_overrides(KalmanConfig(), {"network.name": "mlp", "network.feature_dim": "16",
                                           "transition": "last"})
    assert cfg.network == NetworkConfig("mlp", 16) and cfg.transition == "last"
    with pytest.raises(ConfigError, match="transition"):
        apply_overrides(KalmanConfig(), {"transition": "sometimes"})


def test_regressor_rejects_non_finite_targets():
    learner = KalmanRegressor(input_dim=2)
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
    a = KalmanClassifier(num_classes=4, input_dim=6, transition=transition, seed=3, **_SMALL)
    for c in chunks[:5]:
        a.update(c)
    a.save(tmp_path / "ckpt.npz")
    b = load_learner(tmp_path / "ckpt.npz")
    assert isinstance(b, KalmanClassifier) and b.config == a.config
    ra, rb = prequential(a, chunks[5:]), prequential(b, chunks[5:])
    np.testing.assert_array_equal(ra.log_prob, rb.log_prob)
    _state_equal(a.state_dict(), b.state_dict())
    assert len(a.trajectories()["gamma"]) == len(chunks)


def test_regressor_save_load_and_lazy_input_dim(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(60, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=60)
    chunks = online_chunks(x, y, 6)
    a = KalmanRegressor(noise_variance=0.05, forgetting_learning_rate=0.1)   # input_dim later
    prior = a.predict(x[:2])          # the prior predictive, built from x's width: N(0, s_w2 |x|^2 + s2)
    np.testing.assert_allclose(prior.mean, 0.0, atol=1e-12)
    for c in chunks[:4]:
        a.update(c)
    a.save(tmp_path / "r.npz")
    b = KalmanRegressor.load(tmp_path / "r.npz")
    assert b.config.input_dim is None and b.feature_dim == 3
    # the same stream with input_dim given up front: the same numbers
    c = KalmanRegressor(input_dim=3, noise_variance=0.05, forgetting_learning_rate=0.1)
    for ch in chunks[:4]:
        c.update(ch)
    ra = prequential(a, chunks[4:]).log_prob
    np.testing.assert_array_equal(ra, prequential(b, chunks[4:]).log_prob)
    np.testing.assert_array_equal(ra, prequential(c, chunks[4:]).log_prob)


def test_prior_predictive_before_the_first_update_and_empty_predictive():
    """The filter's prior (M_0 = 0, A_0 = s_w2 I) is a state: before any update the classifier
    predicts the prior predictive (the prequential protocol scores chunk 1 with it), which for
    M_0 = 0 is uniform over the K classes in expectation (here within 5 Monte Carlo standard
    errors of S = 4000 draws); x with no rows gives an empty predictive."""
    S = 4000
    clf = KalmanClassifier(num_classes=4, input_dim=6, num_samples=S)
    p = clf.predict(np.random.default_rng(0).normal(size=(3, 6))).probs
    # a softmax probability lies in [0, 1]: its standard deviation is at most 1/2
    assert np.all(np.abs(p - 0.25) < 5 * 0.5 / np.sqrt(S))
    assert np.abs(p - 0.25).max() > 0         # the draws are there (not a point prediction)
    assert clf.predict(np.zeros((0, 6))).probs.shape == (0, 4)
    reg = KalmanRegressor(input_dim=2, noise_variance=0.5)
    g = reg.predict(np.array([[1.0, 2.0]]))
    # prior: mean 0, variance s_w2 |phi|^2 + s2 with s_w2 = 1/m = 0.5
    np.testing.assert_allclose(g.mean, [0.0], atol=0)
    np.testing.assert_allclose(g.variance, [0.5 * 5.0 + 0.5], rtol=1e-12)
    assert len(reg.predict(np.zeros((0, 2)))) == 0


# ---------------------------------------------------------------------------------------------
# behaviour
# ---------------------------------------------------------------------------------------------
def test_learned_forgetting_adapts_to_a_concept_shift():
    """Labels are permuted halfway: gamma = 1 keeps voting for the old concept, the learned
    gamma drops at the shift and recovers the online accuracy."""
    x1, y1 = _blobs(300, seed=5)
    x2, y2 = _blobs(300, seed=6, flip=True)
    chunks = online_chunks(np.concatenate([x1, x2]), np.concatenate([y1, y2]), 10)
    common = dict(num_classes=4, input_dim=6, prior_variance=1.0, initial_calibration=5.0,
                  learning_rate=0.05, feature_normalization=True, feature_bias=True)
    fixed = prequential(KalmanClassifier(learn_forgetting=False, **common), chunks)
    # delta learned on the calibrated eq. 13 (alpha ~ 5 scales its gradient): a small rho
    learner = KalmanClassifier(learn_forgetting=True, forgetting_learning_rate=0.005, **common)
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
        learner = KalmanRegressor(input_dim=1, prior_variance=0.01, noise_variance=0.05,
                                  mean_preserving=True, learn_forgetting=learn,
                                  forgetting_learning_rate=1.0)
        out[name] = prequential(learner, chunks)
    assert out["learned"].log_prob.mean() > out["fixed"].log_prob.mean() + 0.5
    assert np.mean(out["learned"].sq_error[-50:]) < 0.05


def test_to_inference_data_exports_readout_posterior_and_trajectories(tmp_path):
    import arviz as az

    x, y = _blobs(50, seed=8)
    learner = KalmanClassifier(num_classes=4, input_dim=6, learn_forgetting=True,
                               forgetting_learning_rate=0.1, dtype="float64")
    for c in online_chunks(x, y, 10):
        learner.update(c)
    idata = learner.to_inference_data(x[:7], y[:7], num_draws=4000, seed=1)
    assert idata.posterior["readout"].shape == (4, 1000, 4, 6)    # independent draws, 4 chains
    assert idata.attrs["sampling"] == "independent draws"
    draws = idata.posterior["readout"].values.reshape(1, 4000, 4, 6)
    M = np.asarray(learner.kalman_state.mean).T
    A = np.asarray(learner.kalman_state.covariance)
    se = np.sqrt(np.diag(A) / 4000)
    assert np.all(np.abs(draws[0].mean(0) - M) < 4.5 * se[None, :])
    np.testing.assert_allclose(np.cov(draws[0, :, 2, :].T), A, atol=6 * A.max() / np.sqrt(4000))
    assert idata.log_likelihood["y"].shape == (4, 1000, 7)
    np.testing.assert_array_equal(idata.observed_data["y"].values, y[:7])
    traj = idata["filtering"]
    np.testing.assert_array_equal(traj["time"].values, [10, 20, 30, 40, 50])
    np.testing.assert_allclose(traj["gamma"].values, learner.trajectories()["gamma"])
    assert idata.constant_data["forgetting_coefficient"].values.reshape(-1)[0] == \
        learner.forgetting_coefficient
    assert np.isfinite(az.loo(idata).elpd_loo)
    idata.to_netcdf(str(tmp_path / "post.nc"))
    reg = KalmanRegressor(input_dim=2)
    reg.update(Batch(np.ones((4, 2)), np.arange(4.0)))
    assert reg.to_inference_data(num_draws=10).posterior["weights"].shape == (2, 5, 2)
    assert reg.to_inference_data(num_draws=10, num_chains=1).posterior["weights"].shape == \
        (1, 10, 2)
    with pytest.raises(ValueError, match="multiple of num_chains"):
        reg.to_inference_data(num_draws=10, num_chains=4)


def test_float64_learners_switch_x64_on_by_themselves():
    code = ("import jax; from ppl_cl.learners.kalman import KalmanRegressor;"
            "assert not jax.config.read('jax_enable_x64');"
            "r = KalmanRegressor(input_dim=2); print(r.kalman_state.covariance.dtype)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "float64"
