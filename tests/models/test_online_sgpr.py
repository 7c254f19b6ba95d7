"""The online sparse GP bound, its upper bound, the predictive and the NumPyro program, against
exact GP regression (the limit cases where the approximation must be exact) and against the
closed-form pieces the program is built from (VIPS, Pescador-Barrios et al. 2024, Sect. 3.3 / 4.1;
Bui et al. 2017)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.exact_gp import GPRegressionParams, log_marginal_likelihood, posterior_predictive, condition
from models.kernels_jax import Constant, Matern52, SquaredExponential, Sum
from models import online_sgpr as osg
from models.online_sgpr import OldPosterior, online_sgpr_model, optimal_guide

# jitted once per shape: eager dispatch of the many small ops is slower than compiling
_static = ("jitter",)
online_elbo = jax.jit(osg.online_elbo, static_argnames=_static)
online_elbo_and_residual = jax.jit(osg.online_elbo_and_residual, static_argnames=_static)
online_upper_bound = jax.jit(osg.online_upper_bound, static_argnames=_static)
optimal_inducing_posterior = jax.jit(osg.optimal_inducing_posterior, static_argnames=_static)
predict_from_inducing = jax.jit(osg.predict_from_inducing, static_argnames=_static)
predictive = jax.jit(osg.predictive, static_argnames=("jitter", "full_cov"))
uncollapsed_elbo = jax.jit(osg.uncollapsed_elbo, static_argnames=_static)
old_terms = jax.jit(osg.old_terms, static_argnames=_static)
log_marginal_likelihood = jax.jit(log_marginal_likelihood)

TINY = 1e-10  # jitter for the limit cases (exact in exact arithmetic)


def _params(variance=1.3, lengthscale=0.7, noise=0.15, kernel="se"):
    if kernel == "se":
        k = SquaredExponential(jnp.asarray(variance), jnp.asarray([lengthscale]))
    else:
        k = Sum(Constant(jnp.asarray(2.0)), Matern52(jnp.asarray(variance), jnp.asarray([lengthscale])))
    return GPRegressionParams(k, jnp.asarray(noise))


def _data(rng, n, d=2):
    X = rng.uniform(-2, 2, size=(n, d))
    y = np.sin(2 * X[:, 0]) + 0.5 * np.cos(X[:, 1]) + 0.3 * rng.standard_normal(n)
    return jnp.asarray(X), jnp.asarray(y)


@jax.jit
def _exact_old(params, X_old, y_old):
    """Exact posterior of f at the old inputs: q_old = p(f_old | y_old), K'_aa = K(X_old)."""
    mean, cov = posterior_predictive(params, condition(params, X_old, y_old), X_old,
                                     include_noise=False, full_cov=True)
    return OldPosterior(X_old, mean, 0.5 * (cov + cov.T), params.kernel(X_old))


@pytest.mark.parametrize("kernel", ["se", "const+matern"])
def test_first_batch_with_all_inputs_is_exact_lml(kernel):
    rng = np.random.default_rng(1)
    X, y = _data(rng, 40)
    p = _params(kernel=kernel)
    F = online_elbo(p, X, y, X, None, jitter=TINY)
    np.testing.assert_allclose(float(F), float(log_marginal_likelihood(p, X, y)), rtol=0, atol=1e-5)


def test_online_bound_with_exact_old_posterior_is_exact_lml_of_all_data():
    rng = np.random.default_rng(2)
    X_old, y_old = _data(rng, 30)
    X, y = _data(rng, 25)
    p = _params()
    terms = old_terms(_exact_old(p, X_old, y_old), jitter=TINY)
    F = online_elbo(p, X, y, jnp.concatenate([X_old, X]), terms, jitter=TINY)
    lml_all = log_marginal_likelihood(p, jnp.concatenate([X_old, X]), jnp.concatenate([y_old, y]))
    lml_old = log_marginal_likelihood(p, X_old, y_old)
    # F is log p(y | y_old); adding log p(y_old) gives the marginal likelihood of all data
    np.testing.assert_allclose(float(F + lml_old), float(lml_all), rtol=0, atol=1e-5)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow),
                                  pytest.param(2, marks=pytest.mark.slow)])
def test_lower_le_exact_le_upper_on_random_problems(seed):
    rng = np.random.default_rng(10 + seed)
    X_old, y_old = _data(rng, 20)
    X, y = _data(rng, 35)
    p = _params(variance=rng.uniform(0.5, 2), lengthscale=rng.uniform(0.3, 1.5),
                noise=rng.uniform(0.05, 0.5))
    lml_old = log_marginal_likelihood(p, X_old, y_old)
    exact = float(log_marginal_likelihood(p, jnp.concatenate([X_old, X]),
                                          jnp.concatenate([y_old, y])) - lml_old)
    # first batch (Titsias 2009 / 2014), b a random subset of X
    for m in (1, 15):
        Z = X[rng.choice(X.shape[0], m, replace=False)]
        lo = float(online_elbo(p, X, y, Z, None, jitter=TINY))
        up = float(online_upper_bound(p, X, y, Z, None))
        ex1 = float(log_marginal_likelihood(p, X, y))
        assert lo <= ex1 + 1e-8 <= up + 2e-8, (m, lo, ex1, up)
    # online, exact old posterior at a = X_old, b = [a; random subset of X]
    terms = old_terms(_exact_old(p, X_old, y_old), jitter=TINY)
    prev_lo = -np.inf
    for m in (0, 10, 35):
        Z = jnp.concatenate([X_old, X[:m]])
        lo = float(online_elbo(p, X, y, Z, terms, jitter=TINY))
        up = float(online_upper_bound(p, X, y, Z, terms))
        # 1e-4: the exact old posterior of 20 close inputs is ill-conditioned (S_a^-1 - K^-1)
        assert lo <= exact + 1e-4 and exact <= up + 1e-4, (m, lo, exact, up)
        assert lo >= prev_lo - 1e-8  # nested inducing sets: the bound grows
        prev_lo = lo
    np.testing.assert_allclose(lo, exact, atol=1e-4)   # b = all inputs: exact
    np.testing.assert_allclose(up, exact, atol=1e-4)   # and so is the upper bound


def _second_batch(seed, *, n_new, z_new=0, n_old=20, n_a=5):
    """An old posterior on ``n_a`` of ``n_old`` first-batch points (the optimal q(u_a)), a new
    batch of ``n_new`` points, and inducing inputs: the old ones and the first ``z_new`` new
    inputs."""
    rng = np.random.default_rng(seed)
    X_old, y_old = _data(rng, n_old)
    X, y = _data(rng, n_new)
    p = _params()
    a = X_old[:n_a]
    m, S = optimal_inducing_posterior(p, X_old, y_old, a, None)
    old = OldPosterior(a, m, S + 1e-6 * jnp.eye(n_a), p.kernel(a))
    return rng, p, X, y, a, m, old, jnp.concatenate([a, X[:z_new]])


def test_upper_bound_above_lmax_with_an_approximate_old_posterior():
    """A sparse (inexact) old summary and new hyperparameters: U(b) >= F([X; a]) >= F(b)."""
    _, _, X, y, a, _, old, _ = _second_batch(5, n_new=20, n_old=30, n_a=12)
    terms = old_terms(old)
    p = _params(variance=1.1, lengthscale=0.8, noise=0.2)
    lmax = float(online_elbo(p, X, y, jnp.concatenate([X, a]), terms, jitter=1e-10))
    for k in (0, 12):
        Z = jnp.concatenate([a, X[:k]])
        assert float(online_elbo(p, X, y, Z, terms)) <= lmax + 1e-6
        assert float(online_upper_bound(p, X, y, Z, terms)) >= lmax - 1e-6


def test_residual_equals_dense_diag_kff_minus_qff():
    rng = np.random.default_rng(3)
    X, y = _data(rng, 30)
    p = _params()
    Z = X[:7]
    _, resid = online_elbo_and_residual(p, X, y, Z, None, jitter=1e-6)
    K = np.asarray(p.kernel(X))
    Kfb = np.asarray(p.kernel(X, Z))
    Kbb = np.asarray(p.kernel(Z)) + 1e-6 * np.eye(7)
    Qff = Kfb @ np.linalg.solve(Kbb, Kfb.T)
    np.testing.assert_allclose(np.asarray(resid), np.diag(K - Qff), atol=1e-10)


def test_predictions_with_all_points_inducing_equal_exact_gp():
    rng = np.random.default_rng(4)
    X_old, y_old = _data(rng, 25)
    X, y = _data(rng, 20)
    Xs, _ = _data(rng, 15)
    p = _params()
    X_all, y_all = jnp.concatenate([X_old, X]), jnp.concatenate([y_old, y])
    mu_ex, var_ex = posterior_predictive(p, condition(p, X_all, y_all), Xs, include_noise=False)
    # first batch, all inputs inducing
    mu1, var1 = predictive(p, X_all, y_all, X_all, None, Xs, jitter=TINY)
    np.testing.assert_allclose(np.asarray(mu1), np.asarray(mu_ex), atol=1e-6)
    np.testing.assert_allclose(np.asarray(var1), np.asarray(var_ex), atol=1e-6)
    # online with the exact old posterior, then through q(u_b)
    terms = old_terms(_exact_old(p, X_old, y_old), jitter=TINY)
    mu2, var2 = predictive(p, X, y, X_all, terms, Xs, jitter=TINY)
    np.testing.assert_allclose(np.asarray(mu2), np.asarray(mu_ex), atol=1e-5)
    np.testing.assert_allclose(np.asarray(var2), np.asarray(var_ex), atol=1e-5)
    m, S = optimal_inducing_posterior(p, X, y, X_all, terms, jitter=TINY)
    mu3, var3 = predict_from_inducing(p, X_all, m, S, Xs, jitter=TINY)
    np.testing.assert_allclose(np.asarray(mu3), np.asarray(mu_ex), atol=1e-5)
    np.testing.assert_allclose(np.asarray(var3), np.asarray(var_ex), atol=1e-5)


def test_uncollapsed_elbo_at_optimal_q_equals_collapsed_bound_and_is_maximal():
    _, _, X, y, a, _, old, Z = _second_batch(6, n_new=25, z_new=6, n_old=30, n_a=8)
    p_new = _params(variance=1.0, lengthscale=0.9, noise=0.2)
    j = 1e-9
    F = online_elbo(p_new, X, y, Z, old_terms(old, jitter=j), jitter=j)
    qm, qS = optimal_inducing_posterior(p_new, X, y, Z, old_terms(old, jitter=j), jitter=j)
    pieces = uncollapsed_elbo(p_new, X, y, Z, old, qm, qS, jitter=j)
    np.testing.assert_allclose(float(pieces["elbo"]), float(F), atol=1e-5)
    # any other q is worse
    other = uncollapsed_elbo(p_new, X, y, Z, old, qm + 0.1, 1.1 * qS, jitter=j)
    assert float(other["elbo"]) < float(F)


def test_numpyro_log_density_agrees_with_closed_form_pieces():
    import numpyro.distributions as dist
    from numpyro.infer.util import log_density

    rng, p, X, y, a, m, old, Z = _second_batch(7, n_new=10, z_new=3)
    u_b = jnp.asarray(rng.standard_normal(8))
    f = jnp.asarray(rng.standard_normal(10))
    u_a = jnp.asarray(rng.standard_normal(5))
    kw = dict(params=p, inducing_inputs=Z, old=old, jitter=1e-6)
    lp, _ = log_density(online_sgpr_model, (X, y), kw, {"u_b": u_b, "f": f, "u_a": u_a})
    # the same density from dense linear algebra (independent of the program's code path)
    K = np.asarray(p.kernel(Z)) + 1e-6 * np.eye(8)
    Kfb = np.asarray(p.kernel(X, Z))
    Kab = np.asarray(p.kernel(a, Z))
    Wf = Kfb @ np.linalg.inv(K)
    Wa = Kab @ np.linalg.inv(K)
    var_f = np.asarray(p.kernel.diag(X)) - np.sum(Wf * Kfb, axis=1)
    cov_a = np.asarray(p.kernel(a)) + 1e-6 * np.eye(5) - Wa @ Kab.T
    from scipy.stats import multivariate_normal, norm

    ref = (multivariate_normal(np.zeros(8), K).logpdf(u_b)
           + norm(Wf @ np.asarray(u_b), np.sqrt(var_f)).logpdf(f).sum()
           + norm(np.asarray(f), np.sqrt(0.15)).logpdf(y).sum()
           + multivariate_normal(Wa @ np.asarray(u_b), cov_a).logpdf(u_a)
           + multivariate_normal(np.asarray(m), np.asarray(old.covariance)).logpdf(u_a)
           - multivariate_normal(np.zeros(5), np.asarray(old.prior_covariance) + 1e-6 * np.eye(5)
                                 ).logpdf(u_a))
    np.testing.assert_allclose(float(lp), ref, rtol=1e-8)
    del dist


@pytest.mark.slow
def test_numpyro_elbo_with_optimal_guide_matches_bound_monte_carlo():
    """Monte Carlo ELBO of the program under the optimal guide = F within 4 standard errors."""
    from numpyro import handlers
    from numpyro.infer.util import log_density

    rng, p, X, y, a, m, old, Z = _second_batch(8, n_new=12, z_new=4)
    j = 1e-9
    kw = dict(params=p, inducing_inputs=Z, old=old, jitter=j)
    F = float(online_elbo(p, X, y, Z, old_terms(old, jitter=j), jitter=j))

    def one(key):
        tr = handlers.trace(handlers.seed(optimal_guide, key)).get_trace(X, y, **kw)
        vals = {k: s["value"] for k, s in tr.items() if s["type"] == "sample"}
        lq, _ = log_density(optimal_guide, (X, y), kw, vals)
        lp, _ = log_density(online_sgpr_model, (X, y), kw, vals)
        return lp - lq

    draws = np.asarray(jax.vmap(one)(jax.random.split(jax.random.PRNGKey(0), 1000)))
    se = draws.std(ddof=1) / np.sqrt(draws.size)
    assert abs(draws.mean() - F) < 4 * se + 1e-6, (draws.mean(), F, se)
