"""Closed forms of exact GP regression against independent references."""

import jax.numpy as jnp
import numpy as np
from numpyro.infer.util import log_density

from models.exact_gp import (GPRegressionParams, condition, gp_regression_model,
                             log_marginal_likelihood, posterior_predictive)
from models.kernels_jax import SquaredExponential

rng = np.random.default_rng(0)
X = rng.uniform(-3, 3, size=(25, 2))
y = np.sin(X[:, 0]) * np.cos(X[:, 1]) + 0.1 * rng.normal(size=25)
Xs = rng.uniform(-3, 3, size=(9, 2))
PARAMS = GPRegressionParams(SquaredExponential(1.3, jnp.array([0.8, 1.7])), jnp.asarray(0.05))


def _dense_gram(A, B):
    d2 = (((A[:, None, :] - B[None, :, :]) / np.array([0.8, 1.7])) ** 2).sum(-1)
    return 1.3 * np.exp(-0.5 * d2)


def test_log_marginal_likelihood_equals_numpyro_program_and_scipy():
    from scipy.stats import multivariate_normal

    lml = float(log_marginal_likelihood(PARAMS, jnp.asarray(X), jnp.asarray(y)))
    ref = multivariate_normal(np.zeros(25), _dense_gram(X, X) + 0.05 * np.eye(25)).logpdf(y)
    np.testing.assert_allclose(lml, ref, rtol=1e-10)
    numpyro_lp, _ = log_density(gp_regression_model, (jnp.asarray(X), jnp.asarray(y)),
                                {"params": PARAMS}, {})
    np.testing.assert_allclose(float(numpyro_lp), ref, rtol=1e-10)


def test_predictive_equals_dense_gaussian_conditional():
    """Condition the joint Gaussian of (f(X*), y) by brute force (numpy.linalg.solve)."""
    K = _dense_gram(X, X) + 0.05 * np.eye(25)
    Ks = _dense_gram(X, Xs)
    Kss = _dense_gram(Xs, Xs)
    mean_ref = Ks.T @ np.linalg.solve(K, y)
    cov_ref = Kss - Ks.T @ np.linalg.solve(K, Ks)
    post = condition(PARAMS, jnp.asarray(X), jnp.asarray(y))
    mean, cov = posterior_predictive(PARAMS, post, jnp.asarray(Xs), include_noise=False, full_cov=True)
    np.testing.assert_allclose(np.asarray(mean), mean_ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.asarray(cov), cov_ref, rtol=1e-8, atol=1e-12)
    _, var_y = posterior_predictive(PARAMS, post, jnp.asarray(Xs), include_noise=True)
    np.testing.assert_allclose(np.asarray(var_y), np.diag(cov_ref) + 0.05, rtol=1e-8)


def test_noiseless_limit_interpolates_training_targets():
    """STYLE 9: with (almost) zero noise the predictive mean at training inputs is y."""
    p = GPRegressionParams(PARAMS.kernel, jnp.asarray(1e-10))
    post = condition(p, jnp.asarray(X), jnp.asarray(y))
    mean, var = posterior_predictive(p, post, jnp.asarray(X), include_noise=False)
    np.testing.assert_allclose(np.asarray(mean), y, atol=1e-6)
    assert np.all(np.asarray(var) < 1e-6)
