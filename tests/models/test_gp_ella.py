"""GP-ELLA model: kernel, masked likelihood, App. A Hessian, the NumPyro program's potential
against eqs. 3 and 9, and the ICM multi-task GP's diagonal limit."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer.util import potential_energy

from models.exact_gp import GPRegressionParams, log_marginal_likelihood, posterior_predictive
from models.exact_gp import condition as exact_condition
from models.gp_ella import (TaskHyperparameters, ella_surrogate_objective, gp_ella_model,
                            gradient_and_hessian_closed_form, hessian_closed_form,
                            log_theta_hessian, mtl_objective, negative_log_marginal_likelihood,
                            predict_task, se_ard_gram, theta_from_code)
from models.kernels_jax import SquaredExponential
from models.multitask_gp import ICMParams, icm_negative_log_marginal_likelihood, icm_predict


def _pad(X, y, N):
    n, d = X.shape
    Xp, yp, m = np.zeros((N, d)), np.zeros(N), np.zeros(N)
    Xp[:n], yp[:n], m[:n] = X, y, 1.0
    return jnp.asarray(Xp), jnp.asarray(yp), jnp.asarray(m)


def _problem(seed, n=23, d=4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] ** 2 + 0.1 * rng.normal(size=n)
    hyp = TaskHyperparameters(jnp.asarray(rng.uniform(0.05, 1.5, d)),
                              jnp.asarray(rng.uniform(0.5, 2.0)), jnp.asarray(rng.uniform(0.01, 0.3)))
    return X, y, hyp


def test_kernel_is_the_ard_se_with_inverse_squared_lengthscales():
    X, _, hyp = _problem(0)
    ref = SquaredExponential(1.0, hyp.theta ** -0.5)(jnp.asarray(X))
    np.testing.assert_allclose(se_ard_gram(hyp.theta, jnp.asarray(X)), ref, rtol=1e-12, atol=1e-14)
    # theta_a = 0 ignores feature a; negative theta is read as 0
    th = hyp.theta.at[1].set(-3.0)
    np.testing.assert_allclose(se_ard_gram(th, jnp.asarray(X)),
                               se_ard_gram(th.at[1].set(0.0), jnp.asarray(X)))


@pytest.mark.parametrize("seed", [0, 1])
def test_padded_likelihood_and_predictive_equal_the_exact_gp(seed):
    X, y, hyp = _problem(seed)
    params = GPRegressionParams(SquaredExponential(hyp.signal_variance, hyp.theta ** -0.5),
                                hyp.noise_variance)
    Xp, yp, m = _pad(X, y, 32)
    Xs = jnp.asarray(np.random.default_rng(9).normal(size=(7, X.shape[1])))
    nll, (mean, var) = jax.jit(lambda h: (negative_log_marginal_likelihood(h, Xp, yp, m),
                                          predict_task(h, Xp, yp, m, Xs)))(hyp)

    @jax.jit
    def reference(params):
        Xj, yj = jnp.asarray(X), jnp.asarray(y)
        return (-log_marginal_likelihood(params, Xj, yj),
                posterior_predictive(params, exact_condition(params, Xj, yj), Xs))

    ref, (rm, rv) = reference(params)
    np.testing.assert_allclose(float(nll), float(ref), rtol=1e-12)
    np.testing.assert_allclose(mean, rm, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(var, rv, rtol=1e-9, atol=1e-12)


@jax.jit
def _hessians(hyp, Xp, yp, m):
    def nll(theta):
        return negative_log_marginal_likelihood(hyp._replace(theta=theta), Xp, yp, m)

    return jax.hessian(nll)(hyp.theta), hessian_closed_form(hyp, Xp, yp, m)


def _printed_appendix_a_hessian(hyp, X, y):
    """Eqs. 12-14 with App. A's printed derivatives, dK/dtheta_a = k D_a theta_a^-3 (those
    of theta_a = lengthscale), plugged in at theta = l^-2 as the text says."""
    K = float(hyp.signal_variance) * np.asarray(se_ard_gram(hyp.theta, jnp.asarray(X)))
    Ks = K + float(hyp.noise_variance) * np.eye(len(y))
    W = np.linalg.solve(Ks, np.eye(len(y)))
    a = W @ y
    th = np.asarray(hyp.theta)
    D = (X[:, None, :] - X[None, :, :]) ** 2
    dK = [K * D[..., i] * th[i] ** -3 for i in range(len(th))]
    H = np.zeros((len(th), len(th)))
    for i in range(len(th)):
        for j in range(len(th)):
            d2 = K * D[..., i] * th[i] ** -3 * D[..., j] * th[j] ** -3
            if i == j:
                d2 = K * (-3 * D[..., i] * th[i] ** -4 + D[..., i] ** 2 * th[i] ** -6)
            H[i, j] = (a @ dK[i] @ W @ dK[j] @ a - 0.5 * a @ d2 @ a
                       + 0.5 * np.trace(W @ d2) - 0.5 * np.trace(W @ dK[j] @ W @ dK[i]))
    return H


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_autodiff_hessian_equals_appendix_a_closed_form(seed):
    """Eqs. 12-14, derived for theta = inverse squared lengthscale, against jax.hessian of the
    padded NLL, at random (non-optimal) hyperparameters: the formula holds everywhere."""
    X, y, hyp = _problem(seed, n=19 + seed, d=3)
    Xp, yp, m = _pad(X, y, 32)
    H_auto, H_closed = (np.asarray(h) for h in _hessians(hyp, Xp, yp, m))
    np.testing.assert_allclose(H_closed, H_auto, rtol=1e-9, atol=1e-9 * np.abs(H_auto).max())
    # the derivatives printed in App. A (theta = lengthscale) give another matrix here
    printed = _printed_appendix_a_hessian(hyp, X, y)
    assert np.abs(printed - H_auto).max() > 0.1 * np.abs(H_auto).max()


@jax.jit
def _log_theta_derivatives(hyp, Xp, yp, m):
    def nll_u(u):
        return negative_log_marginal_likelihood(hyp._replace(theta=jnp.exp(u)), Xp, yp, m)

    u = jnp.log(hyp.theta)
    g, H = gradient_and_hessian_closed_form(hyp, Xp, yp, m)
    return (jax.grad(nll_u)(u), jax.hessian(nll_u)(u), g, H,
            jax.grad(lambda th: negative_log_marginal_likelihood(hyp._replace(theta=th), Xp, yp,
                                                                 m))(hyp.theta))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_log_theta_hessian_from_closed_form_equals_autodiff(seed):
    """H^u = diag(theta) H diag(theta) + diag(theta o g) (chain rule for u = log theta), with g
    and H from App. A's closed form, against jax.hessian of the NLL as a function of u; the
    closed-form gradient against jax.grad."""
    X, y, hyp = _problem(seed, n=19 + seed, d=4)
    Xp, yp, m = _pad(X, y, 32)
    gu_auto, Hu_auto, g, H, g_auto = (np.asarray(a) for a in _log_theta_derivatives(hyp, Xp, yp, m))
    np.testing.assert_allclose(g, g_auto, rtol=1e-9, atol=1e-10 * np.abs(g_auto).max())
    np.testing.assert_allclose(np.asarray(hyp.theta) * g, gu_auto, rtol=1e-9,
                               atol=1e-10 * np.abs(gu_auto).max())
    Hu = log_theta_hessian(np.asarray(hyp.theta), g, H)
    np.testing.assert_allclose(Hu, Hu_auto, rtol=1e-9, atol=1e-9 * np.abs(Hu_auto).max())
    # the JAX path gives the same matrix
    np.testing.assert_allclose(np.asarray(log_theta_hessian(hyp.theta, jnp.asarray(g),
                                                            jnp.asarray(H))), Hu, rtol=1e-12)


def test_theta_from_code_reads_the_parametrization():
    z = np.array([-30.0, -1.0, 0.0, 2.0, 20.0])
    np.testing.assert_allclose(theta_from_code(z, "theta"), [0, 0, 0, 2, 20])
    np.testing.assert_allclose(theta_from_code(z, "log_theta"), np.exp(z))
    np.testing.assert_allclose(theta_from_code(z, "log_theta", 1e-8, 1e6),
                               [1e-8, np.exp(-1), 1, np.exp(2), 1e6], rtol=1e-12)
    with pytest.raises(ValueError, match="parametrization"):
        theta_from_code(z, "lengthscale")


def _program_tasks(T=3, d=3, seed=0):
    rng = np.random.default_rng(seed)
    tasks = []
    for t in range(T):
        n = 10 + 3 * t
        X = rng.normal(size=(n, d))
        y = np.cos(X @ rng.normal(size=d)) + 0.1 * rng.normal(size=n)
        tasks.append(_pad(X, y, 16 * math.ceil(n / 16)))
    return tasks


def test_program_potential_is_T_over_2_times_eq3():
    """-log p(L, S, y) of the NumPyro program differs from T/2 x eq. 3 by a constant."""
    T, d, k, mu, lam = 3, 3, 2, 0.7, 0.3
    tasks = _program_tasks(T, d)
    sv, nv = jnp.asarray([1.0, 1.5, 0.8]), jnp.asarray([0.05, 0.1, 0.2])
    kw = dict(num_components=k, mu=mu, lam=lam, signal_variances=sv, noise_variances=nv)
    rng = np.random.default_rng(3)

    @jax.jit
    def gap(L, S):
        pe = potential_energy(gp_ella_model, (tasks,), kw, {"L": L, "s": S})
        return pe - 0.5 * T * mtl_objective(L, S, tasks, sv, nv, mu, lam)

    gaps = [float(gap(jnp.asarray(np.abs(rng.normal(size=(d, k)))),
                      jnp.asarray(rng.normal(size=(T, k))))) for _ in range(3)]
    np.testing.assert_allclose(gaps, gaps[0], rtol=0, atol=1e-9 * abs(gaps[0]) + 1e-9)


def test_program_potential_in_log_theta_is_T_over_2_times_eq3():
    """With log theta_t = L s_t the program's -log p differs from T/2 x eq. 3 (kernels
    exp(L s_t)) by a constant, and it is not the theta-parametrized program."""
    T, d, k, mu, lam = 3, 3, 2, 0.7, 0.3
    tasks = _program_tasks(T, d, seed=1)
    sv, nv = jnp.asarray([1.0, 1.5, 0.8]), jnp.asarray([0.05, 0.1, 0.2])
    kw = dict(num_components=k, mu=mu, lam=lam, signal_variances=sv, noise_variances=nv)
    rng = np.random.default_rng(4)

    @jax.jit
    def gaps(L, S):
        pe = potential_energy(gp_ella_model, (tasks,), {**kw, "parametrization": "log_theta"},
                              {"L": L, "s": S})
        return (pe - 0.5 * T * mtl_objective(L, S, tasks, sv, nv, mu, lam, "log_theta"),
                pe - 0.5 * T * mtl_objective(L, S, tasks, sv, nv, mu, lam, "theta"))

    out = np.asarray([gaps(jnp.asarray(rng.normal(size=(d, k))),
                           jnp.asarray(rng.normal(size=(T, k)))) for _ in range(3)])
    np.testing.assert_allclose(out[:, 0], out[0, 0], rtol=0, atol=1e-9 * abs(out[0, 0]) + 1e-9)
    assert np.ptp(out[:, 1]) > 1e-3


def test_program_with_laplace_likelihood_is_T_over_2_times_eq9():
    T, d, k, mu, lam = 4, 3, 2, 0.4, 0.2
    rng = np.random.default_rng(5)
    thetas = jnp.asarray(rng.uniform(0, 1, (T, d)))
    B = rng.normal(size=(T, d, d))
    Hs = jnp.asarray(np.einsum("tij,tkj->tik", B, B))
    tasks = [(jnp.zeros((1, d)), None, jnp.ones(1))] * T
    kw = dict(num_components=k, mu=mu, lam=lam, signal_variances=None, noise_variances=None,
              likelihood="laplace", theta_hat=thetas, hessians=Hs)

    @jax.jit
    def gap(L, S):
        pe = potential_energy(gp_ella_model, (tasks,), kw, {"L": L, "s": S})
        return pe - 0.5 * T * ella_surrogate_objective(L, S, thetas, Hs, mu, lam)

    gaps = [float(gap(jnp.asarray(rng.normal(size=(d, k))), jnp.asarray(rng.normal(size=(T, k)))))
            for _ in range(3)]
    np.testing.assert_allclose(gaps, gaps[0], rtol=0, atol=1e-9 * abs(gaps[0]) + 1e-9)


def test_icm_with_diagonal_task_covariance_equals_independent_gps():
    """B = diag(kappa) (W = 0): the multi-task GP is one GP per task with shared lengthscales,
    amplitude kappa_t and noise sigma_t^2 — likelihood and predictions."""
    rng = np.random.default_rng(2)
    d, sizes = 3, [9, 14, 6]
    theta = jnp.asarray(rng.uniform(0.2, 1.0, d))
    kappa, noise = np.array([0.7, 1.3, 2.0]), np.array([0.05, 0.2, 0.1])
    Xs, ys = [rng.normal(size=(n, d)) for n in sizes], [rng.normal(size=n) for n in sizes]
    X, y = np.concatenate(Xs), np.concatenate(ys)
    tid = np.concatenate([np.full(n, t) for t, n in enumerate(sizes)])
    Xp, yp, m = _pad(X, y, 32)
    onehot = np.zeros((32, 3))
    onehot[np.arange(len(tid)), tid] = 1.0
    params = ICMParams(theta, jnp.zeros((3, 2)), jnp.asarray(kappa), jnp.asarray(noise))
    Z = jnp.asarray(onehot)
    nll = float(jax.jit(icm_negative_log_marginal_likelihood)(params, Xp, yp, Z, m))
    ref, X_star = 0.0, jnp.asarray(rng.normal(size=(5, d)))
    single = jax.jit(lambda h, Xt, yt, mt: (negative_log_marginal_likelihood(h, Xt, yt, mt),
                                            predict_task(h, Xt, yt, mt, X_star)))
    multi = jax.jit(icm_predict)
    for t in range(3):
        hyp = TaskHyperparameters(theta, jnp.asarray(kappa[t]), jnp.asarray(noise[t]))
        Xt, yt, mt = _pad(Xs[t], ys[t], 16)
        nll_t, (rmean, rvar) = single(hyp, Xt, yt, mt)
        ref += float(nll_t)
        mean, var = multi(params, Xp, yp, Z, m, X_star, t)
        np.testing.assert_allclose(mean, rmean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(var, rvar, rtol=1e-9)
    np.testing.assert_allclose(nll, ref, rtol=1e-12)
