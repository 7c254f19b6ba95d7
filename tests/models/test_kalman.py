"""The NumPyro programs of the drift model (models/kalman.py): densities written out by hand,
the prior's variance preservation and covariance (Monte Carlo within k standard errors), the
gamma = 1 limit and the App. C variant (the representation networks:
tests/models/test_feature_networks.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats
from numpyro import handlers
from numpyro.infer import Predictive
from numpyro.infer.util import log_density

from models.kalman import (DriftPrior, GaussianLikelihood, SoftmaxLikelihood,
                           SurrogateLikelihood, delta_from_forgetting,
                           drift_classification_model, drift_regression_model,
                           drift_surrogate_model, forgetting_from_delta)


def _trace(model, *args, seed=0, **kwargs):
    return handlers.trace(handlers.seed(model, jax.random.PRNGKey(seed))).get_trace(*args, **kwargs)


def test_regression_program_sites_and_shapes():
    X = np.random.default_rng(0).normal(size=(7, 3))
    tr = _trace(drift_regression_model, jnp.asarray(X), None, forgetting=0.9)
    assert tr["w_0"]["value"].shape == (3, 1)
    assert tr["eps"]["value"].shape == (7, 3, 1)
    assert tr["w"]["value"].shape == (7, 3, 1)
    assert tr["y"]["value"].shape == (7,)
    assert not tr["y"]["is_observed"]


def test_regression_log_density_matches_hand_written_joint():
    """Non-centred program: log p(w_0) + sum log N(eps) + sum log N(y | phi^T w_n, s2), with
    w_n = gamma_n w_{n-1} + sqrt(1 - gamma_n^2) s_w eps_n (eq. 3)."""
    rng = np.random.default_rng(1)
    n, m = 6, 2
    X, y = rng.normal(size=(n, m)), rng.normal(size=n)
    gammas = rng.uniform(0.3, 1.0, size=n)
    s_w2, s2 = 0.7, 0.2
    w0, eps = rng.normal(size=(m, 1)), rng.normal(size=(n, m, 1))
    lp, _ = log_density(drift_regression_model, (jnp.asarray(X), jnp.asarray(y)),
                        {"forgetting": jnp.asarray(gammas), "prior": DriftPrior(s_w2),
                         "likelihood": GaussianLikelihood(s2)},
                        {"w_0": jnp.asarray(w0), "eps": jnp.asarray(eps)})
    ref = scipy.stats.norm(0, math.sqrt(s_w2)).logpdf(w0).sum() + scipy.stats.norm().logpdf(eps).sum()
    w = w0[:, 0]
    for i in range(n):
        w = gammas[i] * w + math.sqrt(1 - gammas[i] ** 2) * math.sqrt(s_w2) * eps[i, :, 0]
        ref += scipy.stats.norm(X[i] @ w, math.sqrt(s2)).logpdf(y[i])
    np.testing.assert_allclose(float(lp), ref, rtol=1e-12)


def test_classification_and_surrogate_likelihoods():
    rng = np.random.default_rng(2)
    n, m, K = 5, 3, 4
    X, labels = rng.normal(size=(n, m)), rng.integers(0, K, size=n)
    w0, eps = rng.normal(size=(m, K)), rng.normal(size=(n, m, K))
    gamma, s_w2, alpha, s2 = 0.8, 0.5, 1.7, 0.25
    W, w = [], w0
    for i in range(n):
        w = gamma * w + math.sqrt(1 - gamma**2) * math.sqrt(s_w2) * eps[i]
        W.append(w)
    prior_lp = scipy.stats.norm(0, math.sqrt(s_w2)).logpdf(w0).sum() + \
        scipy.stats.norm().logpdf(eps).sum()
    params = {"w_0": jnp.asarray(w0), "eps": jnp.asarray(eps)}
    # softmax(alpha W_n^T phi_n)
    lp, _ = log_density(drift_classification_model, (jnp.asarray(X), jnp.asarray(labels)),
                        {"num_classes": K, "forgetting": gamma, "prior": DriftPrior(s_w2),
                         "likelihood": SoftmaxLikelihood(alpha)}, params)
    ref = prior_lp
    for i in range(n):
        logits = alpha * X[i] @ W[i]
        ref += logits[labels[i]] - scipy.special.logsumexp(logits)
    np.testing.assert_allclose(float(lp), ref, rtol=1e-12)
    # Gaussian surrogate on the one-hot vector, one s2 for all K outputs
    lp, _ = log_density(drift_surrogate_model, (jnp.asarray(X), jnp.asarray(labels)),
                        {"num_classes": K, "forgetting": gamma, "prior": DriftPrior(s_w2),
                         "likelihood": SurrogateLikelihood(s2)}, params)
    ref = prior_lp + sum(scipy.stats.norm(X[i] @ W[i], math.sqrt(s2)).logpdf(np.eye(K)[labels[i]]).sum()
                         for i in range(n))
    np.testing.assert_allclose(float(lp), ref, rtol=1e-12)


def test_gamma_one_keeps_the_weights_constant():
    X = np.ones((5, 2))
    tr = _trace(drift_classification_model, jnp.asarray(X), None, num_classes=3, forgetting=1.0)
    w = np.asarray(tr["w"]["value"])
    np.testing.assert_array_equal(w, np.broadcast_to(np.asarray(tr["w_0"]["value"]), w.shape))


def test_prior_is_variance_preserving_with_the_drift_covariance():
    """Every w_n ~ N(0, s_w2 I) and Cov(w_i, w_j) = s_w2 prod_{k=i+1}^{j} gamma_k (eqs. 2-3),
    checked on 4000 prior draws within 4 standard errors."""
    n, S = 4, 4000
    gammas = np.array([0.5, 0.9, 0.7, 0.95])
    s_w2 = 2.0
    draws = Predictive(drift_regression_model, num_samples=S)(
        jax.random.PRNGKey(3), jnp.ones((n, 1)), forgetting=jnp.asarray(gammas),
        prior=DriftPrior(s_w2))["w"]
    w = np.asarray(draws)[:, :, 0, 0]                                 # (S, n)
    k = 4.0
    for i in range(n):
        for j in range(i, n):
            target = s_w2 * np.prod(gammas[i + 1: j + 1])
            prod = w[:, i] * w[:, j]
            assert abs(prod.mean() - target) < k * prod.std() / math.sqrt(S), (i, j)


def test_mean_preserving_transition_mean():
    """App. C: with the innovations at zero, w_n = (1 - gamma) mu_{n-1} + gamma w_{n-1}."""
    n, m = 4, 2
    mu = np.arange(n * m, dtype=float).reshape(n, m) + 1.0
    gamma = 0.6
    model = handlers.condition(drift_regression_model,
                               {"w_0": jnp.zeros((m, 1)), "eps": jnp.zeros((n, m, 1))})
    tr = _trace(model, jnp.ones((n, m)), None, forgetting=gamma, drift_means=jnp.asarray(mu))
    w, ref = np.asarray(tr["w"]["value"])[:, :, 0], np.zeros(m)
    for i in range(n):
        ref = (1 - gamma) * mu[i] + gamma * ref
        np.testing.assert_allclose(w[i], ref, rtol=1e-12)


def test_delta_parametrization():
    """gamma = exp(-delta / 2) (Sect. 2.1.1) and its inverse, at values computed by hand."""
    gamma = jnp.asarray([1.0, 0.999, 0.5])
    np.testing.assert_allclose(np.asarray(delta_from_forgetting(gamma)),
                               [0.0, -2 * math.log(0.999), 2 * math.log(2.0)], rtol=1e-12)
    np.testing.assert_allclose(np.asarray(forgetting_from_delta(jnp.asarray([0.0, 1.0, 4.0]))),
                               [1.0, math.exp(-0.5), math.exp(-2.0)], rtol=1e-12)
