"""The representation networks phi(x; theta) (models/feature_networks.py): the MLP against a
NumPy forward pass, the identity, App. D.3's normalization and bias, per-example independence
of the image networks (GroupNorm: a chunk's prediction does not depend on the other points of
the chunk), determinism, and the configuration errors. Random Fourier features (``"rff"``,
Rahimi & Recht 2007): the kernel (1/m) phi phi^T against the SE kernel within Monte Carlo
error, the Kalman regressor on rff features against the exact SE-kernel GP posterior mean,
and ``NetworkConfig.lengthscale`` through config dicts and checkpoints (the last two use
``ppl_cl``: the learner is what the rff features are for)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.feature_networks import FEATURE_NETWORKS, feature_network, with_postprocessing

_ARGS = {
    "identity": ({}, 12),
    "mlp": ({"feature_dim": 5, "hidden": (7,)}, 12),
    "cnn": ({"feature_dim": 6, "input_shape": (8, 8, 1), "channels": (4, 4)}, 64),
    "resnet18": ({"feature_dim": 6, "input_shape": (8, 8, 3), "width": 4}, 192),
    "rff": ({"feature_dim": 7, "lengthscale": 0.5}, 12),
}


def test_every_named_network_is_tested():
    assert set(_ARGS) == set(FEATURE_NETWORKS)


@pytest.mark.parametrize("name", FEATURE_NETWORKS)
def test_networks_shapes_determinism_and_per_example_independence(name):
    kwargs, d = _ARGS[name]
    net = feature_network(name, input_dim=d, dtype=jnp.float64, **kwargs)
    theta = net.init(jax.random.PRNGKey(0))
    x = jnp.asarray(np.random.default_rng(4).uniform(size=(3, d)))
    phi = np.asarray(net.apply(theta, x))
    assert phi.shape == (3, net.feature_dim)
    assert np.all(np.isfinite(phi))
    # same key, same parameters
    np.testing.assert_array_equal(phi, np.asarray(net.apply(net.init(jax.random.PRNGKey(0)), x)))
    # each row depends on its own input only (no batch statistics): change the other rows
    x2 = x.at[0].set(x[0] * 3.0).at[2].set(0.0)
    np.testing.assert_allclose(np.asarray(net.apply(theta, x2))[1], phi[1], rtol=1e-12,
                               atol=1e-14)
    if name == "identity":
        np.testing.assert_array_equal(phi, np.asarray(x))
    else:
        # different keys give different features
        other = np.asarray(net.apply(net.init(jax.random.PRNGKey(1)), x))
        assert np.abs(other - phi).max() > 1e-6


def test_mlp_equals_a_numpy_forward_pass_with_he_initialization():
    d, hidden, m = 30, (40,), 20
    net = feature_network("mlp", input_dim=d, feature_dim=m, hidden=hidden, dtype=jnp.float64)
    theta = net.init(jax.random.PRNGKey(2))
    x = np.random.default_rng(3).normal(size=(5, d))
    h = x
    for layer in theta:
        h = np.maximum(h @ np.asarray(layer["w"]) + np.asarray(layer["b"]), 0.0)
    np.testing.assert_allclose(np.asarray(net.apply(theta, jnp.asarray(x))), h, rtol=1e-12)
    # He initialization: weights N(0, 2 / fan_in), zero biases
    w0 = np.asarray(theta[0]["w"])
    assert w0.shape == (d, 40) and np.all(np.asarray(theta[0]["b"]) == 0)
    assert abs(w0.var() / (2.0 / d) - 1.0) < 4 * math.sqrt(2.0 / w0.size)


def test_postprocessing_normalizes_then_appends_the_bias():
    net = feature_network("mlp", input_dim=4, feature_dim=9, hidden=(6,), dtype=jnp.float64)
    theta = net.init(jax.random.PRNGKey(5))
    x = jnp.asarray(np.random.default_rng(6).normal(size=(3, 4)))
    raw = np.asarray(net.apply(theta, x))
    both = with_postprocessing(net, normalization=True, bias=True)
    assert both.feature_dim == 10
    np.testing.assert_allclose(np.asarray(both.apply(theta, x)),
                               np.concatenate([raw / 3.0, np.ones((3, 1))], axis=1), rtol=1e-12)
    assert with_postprocessing(net) is net


def test_feature_network_rejects_bad_configurations():
    with pytest.raises(ValueError, match="feature network"):
        feature_network("transformer", input_dim=4, feature_dim=2)
    with pytest.raises(ValueError, match="feature_dim"):
        feature_network("mlp", input_dim=4)
    with pytest.raises(ValueError, match="input_shape"):
        feature_network("cnn", input_dim=10, feature_dim=2, input_shape=(3, 3, 1))
    for bad in (0.0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="lengthscale"):
            feature_network("rff", input_dim=2, feature_dim=3, lengthscale=bad)


# ---------------------------------------------------------------------------------------------
# random Fourier features
# ---------------------------------------------------------------------------------------------
def _se(a, b, lengthscale):
    d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    return np.exp(-0.5 * d2 / lengthscale**2)


def test_rff_is_sqrt2_cos_of_standard_normal_projections_and_uniform_phases():
    d, m, ls = 3, 5000, 0.4
    net = feature_network("rff", input_dim=d, feature_dim=m, lengthscale=ls, dtype=jnp.float64)
    theta = net.init(jax.random.PRNGKey(7))
    w, b = np.asarray(theta["w"]), np.asarray(theta["b"])
    assert set(theta) == {"w", "b"} and w.shape == (d, m) and b.shape == (m,)
    x = np.random.default_rng(8).normal(size=(4, d))
    np.testing.assert_allclose(np.asarray(net.apply(theta, jnp.asarray(x))),
                               math.sqrt(2.0) * np.cos(x @ w / ls + b), rtol=1e-12, atol=1e-12)
    # W ~ N(0, 1): mean and variance within 5 standard errors (var of s^2: 2 / n)
    assert abs(w.mean()) < 5 / math.sqrt(w.size)
    assert abs(w.var() - 1.0) < 5 * math.sqrt(2.0 / w.size)
    # b ~ U(0, 2 pi): in range, mean pi (sd of the mean: 2 pi / sqrt(12 m))
    assert b.min() >= 0.0 and b.max() < 2 * math.pi
    assert abs(b.mean() - math.pi) < 5 * 2 * math.pi / math.sqrt(12 * m)


def test_rff_kernel_matches_the_squared_exponential_kernel_within_monte_carlo_error():
    """(1/m) phi(x)^T phi(x') = mean_j z_j with z_j = 2 cos(u_j + b_j) cos(u'_j + b_j)
    = cos(w_j.(x - x')/l) + cos(w_j.(x + x')/l + 2 b_j). The second term's phase is uniform and
    independent of w_j, so E z = k(x, x') = exp(-|x - x'|^2 / (2 l^2)) and
    var z = E cos^2(w.(x - x')/l) + 1/2 - k^2 = 1 + k^4 / 2 - k^2 (<= 1; E cos(2 w.delta/l) =
    k(2 delta) = k^4). Every entry is checked within 5 of its standard errors
    sqrt(var z / m) (at m = 20000: at most 0.035); 78 entries (correlated), each two-sided
    5-sigma: a false alarm below 1e-4."""
    d, m, ls = 3, 20000, 1.3
    net = feature_network("rff", input_dim=d, feature_dim=m, lengthscale=ls, dtype=jnp.float64)
    x = np.random.default_rng(11).normal(scale=1.0, size=(12, d))
    phi = np.asarray(net.apply(net.init(jax.random.PRNGKey(3)), jnp.asarray(x)))
    k_rff = phi @ phi.T / m
    k = _se(x, x, ls)
    assert k.min() < 0.1 and np.sort(k, axis=None)[-13] > 0.8    # far and near pairs
    se = np.sqrt((1.0 + k**4 / 2 - k**2) / m)
    iu = np.triu_indices(len(x))
    z = ((k_rff - k) / se)[iu]
    assert np.abs(z).max() < 5.0, np.abs(z).max()
    # the standardized errors look like N(0, 1) draws (not a loose bound met by luck)
    assert 0.3 < np.sqrt(np.mean(z**2)) < 2.0


def test_kalman_regressor_on_rff_features_approximates_the_exact_se_gp():
    """``KalmanRegressor`` with gamma = 1 (no forgetting, no fine-tuning, prior variance 1/m by
    default) on rff features, fed as three chunks, is Bayesian linear regression on phi: its
    predictive equals the finite-m RFF GP (kernel (1/m) phi phi^T) to rounding, and its mean and
    variance are the exact SE-GP posterior's (kernel variance 1, lengthscale l, noise s2) up to
    the rff Monte Carlo error.

    Tolerance: the RFF posterior moments are smooth functions of the feature average, so to
    first order mu_rff - mu ~ (1/m) sum_j g(w_j, b_j) with g = (z^T alpha)(z_* - z^T beta), and
    v_rff - v ~ (1/m) sum_j (z_* - z^T beta)^2 (z = sqrt(2) cos(x w / l + b) at the training
    inputs, z_* at the test input, alpha = (K + s2 I)^-1 y, beta = (K + s2 I)^-1 k_*). Their
    sds, sd(g) / sqrt(m), are estimated here from 100000 fresh numpy draws (~0.3 % error); at
    m = 2000 they are 0.005-0.02 for the mean inside the data and 0.04-0.05 at x = +-4 beyond
    it, 3e-4-0.018 for the variance. Each of the 17 test points must be within 5 of them (the
    O(1/m) second-order terms are ~1e-3). The variance check is the sensitive one: features
    without the sqrt(2) fail it by 20 sds, a lengthscale off by 10 % by 5; the mean alone
    hardly sees either (the kernel test above catches the lengthscale by 11 sds)."""
    from ppl_cl import Batch
    from ppl_cl.configs.kalman import NetworkConfig
    from ppl_cl.learners.kalman import KalmanRegressor

    n, m, ls, s2 = 30, 2000, 0.7, 0.1
    rng = np.random.default_rng(0)
    x = rng.uniform(-3.0, 3.0, size=(n, 1))
    y = np.sin(2.0 * x[:, 0]) + math.sqrt(s2) * rng.normal(size=n)
    xs = np.linspace(-4.0, 4.0, 17)[:, None]

    learner = KalmanRegressor(network=NetworkConfig("rff", feature_dim=m, lengthscale=ls),
                              learn_forgetting=False, initial_forgetting=1.0, noise_variance=s2,
                              fine_tune=False)
    for i in range(3):
        learner.update(Batch(x[10 * i:10 * i + 10], y[10 * i:10 * i + 10]))
    assert learner.prior_variance == 1.0 / m and learner.forgetting_coefficient == 1.0
    pred = learner.predict(xs)

    # 1. the learner is exact Bayesian linear regression on its own features
    phi, phis = learner.features(x), learner.features(xs)
    kt, kst = phi @ phi.T / m, phis @ phi.T / m
    sol = np.linalg.solve(kt + s2 * np.eye(n), np.column_stack([y, kst.T]))
    np.testing.assert_allclose(pred.mean, kst @ sol[:, 0], rtol=0, atol=1e-9)
    var_rff = np.sum(phis**2, axis=1) / m - np.sum(kst * sol[:, 1:].T, axis=1) + s2
    np.testing.assert_allclose(pred.variance, var_rff, rtol=1e-8)

    # 2. ... and approximates the exact SE-kernel GP within the rff Monte Carlo error
    a = np.linalg.solve(_se(x, x, ls) + s2 * np.eye(n), np.column_stack([y, _se(x, xs, ls)]))
    alpha, beta = a[:, 0], a[:, 1:]
    mu = _se(xs, x, ls) @ alpha
    draws = np.random.default_rng(1)
    w, b = draws.normal(size=100_000), draws.uniform(0.0, 2 * math.pi, size=100_000)
    z = math.sqrt(2.0) * np.cos(np.outer(w, x[:, 0]) / ls + b[:, None])
    zs = math.sqrt(2.0) * np.cos(np.outer(w, xs[:, 0]) / ls + b[:, None])
    r = zs - z @ beta
    se_mean = ((z @ alpha)[:, None] * r).std(axis=0) / math.sqrt(m)
    se_var = (r**2).std(axis=0) / math.sqrt(m)
    assert se_mean.max() < 0.06 and se_var.max() < 0.03
    var = 1.0 - np.sum(_se(x, xs, ls) * beta, axis=0)          # latent posterior variance
    z_mean = (pred.mean - mu) / se_mean
    z_var = (pred.variance - s2 - var) / se_var
    assert np.abs(z_mean).max() < 5.0, z_mean
    assert np.abs(z_var).max() < 5.0, z_var
    assert np.abs(mu).max() > 0.7          # the posterior mean is far from the prior's 0


def test_network_lengthscale_survives_config_dicts_and_checkpoints(tmp_path):
    """``NetworkConfig.lengthscale`` through ``to_dict`` / JSON / ``from_dict``; a config saved
    before the field existed loads with lengthscale 1; bad values are refused; a saved rff
    learner reloads with its lengthscale (it is not in theta: a lost one would change the
    predictions)."""
    import json

    from ppl_cl import Batch
    from ppl_cl.configs import from_dict, to_dict
    from ppl_cl.configs.kalman import KalmanConfig, KalmanRegressorConfig, NetworkConfig
    from ppl_cl.learners.kalman import KalmanRegressor

    for cls in (KalmanRegressorConfig, KalmanConfig):
        config = cls(network=NetworkConfig("rff", feature_dim=64, lengthscale=0.25))
        values = json.loads(json.dumps(to_dict(config)))
        assert values["network"]["lengthscale"] == 0.25
        assert from_dict(cls, values) == config
        del values["network"]["lengthscale"]                   # an old checkpoint's config
        assert from_dict(cls, values).network == NetworkConfig("rff", feature_dim=64)
        assert from_dict(cls, values).network.lengthscale == 1.0
    assert from_dict(NetworkConfig, {"name": "rff", "feature_dim": 3, "lengthscale": 2}) \
        .lengthscale == 2.0                                     # JSON int -> float
    for bad in (0.0, -0.5, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="lengthscale"):
            NetworkConfig("rff", feature_dim=4, lengthscale=bad)

    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(10, 2)), rng.normal(size=10)
    learner = KalmanRegressor(network=NetworkConfig("rff", feature_dim=16, lengthscale=0.3),
                              learn_forgetting=False, noise_variance=0.1)
    learner.update(Batch(x, y))
    learner.save(tmp_path / "rff.ckpt")
    loaded = KalmanRegressor.load(tmp_path / "rff.ckpt")
    assert loaded.config == learner.config and loaded.config.network.lengthscale == 0.3
    np.testing.assert_array_equal(loaded.predict(x).mean, learner.predict(x).mean)
    np.testing.assert_array_equal(loaded.features(x), learner.features(x))
