"""GP-ELLA engines: LASSO scaling against the objective, running-sum basis against eq. 9 from
scratch, exact reconstruction for k = d and mu -> 0, the NumPyro MAP for a fixed basis, column
re-initialization, known-task updates, the engine contract."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer.util import potential_energy
from scipy.optimize import minimize

from inference.gp_ella import (PREDICT_CHUNK, ELLAEngine, basis_from_sums,
                               choose_smoothing_variance, effective_number_of_tasks, expansion,
                               fit_single_task, has_negative_curvature, kernel_predictions,
                               median_squared_distance, psd_part, smoothing_weights, sparse_code)
from models.gp_ella import ella_surrogate_objective, ella_task_loss, gp_ella_model


def _random_psd(rng, d, rank=None):
    B = rng.normal(size=(d, rank or d))
    return B @ B.T + (0.0 if rank else 0.1) * np.eye(d)


def _lasso_reference(L, theta, H, mu):
    """argmin |theta - L s|_H^2 + mu |s|_1 by L-BFGS-B on s = p - q, p, q >= 0 (smooth on the
    orthant): an independent solver of eq. 10."""
    k = L.shape[1]

    def f(z):
        p, q = z[:k], z[k:]
        r = theta - L @ (p - q)
        g = -2 * L.T @ H @ r
        return r @ H @ r + mu * np.sum(p + q), np.concatenate([g + mu, -g + mu])

    res = minimize(f, np.zeros(2 * k), jac=True, method="L-BFGS-B",
                   bounds=[(0, None)] * (2 * k), options={"ftol": 1e-15, "gtol": 1e-12,
                                                          "maxiter": 10000})
    return res.x[:k] - res.x[k:]


@pytest.mark.parametrize("mu", [0.05, 0.5, 3.0])
def test_lasso_scaling_alpha_mu_over_2d_solves_eq10(mu):
    rng = np.random.default_rng(0)
    d, k = 6, 4
    L, theta, H = rng.normal(size=(d, k)), rng.normal(size=d), _random_psd(rng, d)
    s, ok = sparse_code(L, theta, H, mu)
    assert ok
    ref = _lasso_reference(L, theta, H, mu)
    obj = lambda v: float(ella_task_loss(jnp.asarray(L), jnp.asarray(v), jnp.asarray(theta),
                                         jnp.asarray(H), mu))
    np.testing.assert_allclose(s, ref, atol=1e-6)
    assert obj(s) <= obj(ref) + 1e-9
    # ELLA.py's alpha = mu / (2 n_t) (here n_t = 50 != d) solves another problem
    from sklearn.linear_model import Lasso

    from inference.gp_ella import hessian_sqrt

    Hh = hessian_sqrt(H)
    s_ella = Lasso(alpha=mu / (2 * 50), fit_intercept=False, tol=1e-12, max_iter=100000).fit(
        Hh @ L, Hh @ theta).coef_
    assert obj(s_ella) > obj(s) + 1e-6


def _lasso_kkt_violation(L, theta, H, mu, s):
    """Largest violation of eq. 10's optimality conditions: ``g = 2 L^T H (L s - theta)``,
    ``g_j = -mu sign(s_j)`` where ``s_j != 0`` and ``|g_j| <= mu`` where ``s_j = 0``."""
    g = 2.0 * L.T @ H @ (L @ s - theta)
    active = s != 0
    v_active = np.abs(g[active] + mu * np.sign(s[active]))
    v_zero = np.clip(np.abs(g[~active]) - mu, 0.0, None)
    return float(np.max(np.concatenate([v_active, v_zero, [0.0]])))


@pytest.mark.parametrize("seed", range(5))
def test_sparse_code_optimal_on_ill_conditioned_hessians(seed):
    """GP tasks' H_t span many decades (eigenvalues 1e-6 .. 1e5 here): the code still meets
    the optimality conditions of eq. 10 (where coordinate descent stops at its sweep cap
    short of the minimum)."""
    rng = np.random.default_rng(seed)
    d, k, mu = 13, 6, float(np.exp(-4))
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    H = (Q * np.logspace(-6, 5, d)) @ Q.T
    H = 0.5 * (H + H.T)
    L, theta = rng.normal(size=(d, k)), rng.normal(size=d) * 3
    s, ok = sparse_code(L, theta, H, mu)
    assert ok
    scale = float(np.abs(2.0 * L.T @ H @ theta).max())
    assert _lasso_kkt_violation(L, theta, H, mu, s) <= 1e-7 * max(scale, 1.0)


def test_sparse_code_is_exact_for_k_equal_d_and_mu_to_zero():
    """k = d, invertible L, mu -> 0: s = L^-1 theta and L s = theta."""
    rng = np.random.default_rng(1)
    d = 5
    L, theta, H = rng.normal(size=(d, d)) + 3 * np.eye(d), rng.normal(size=d), _random_psd(rng, d)
    s, _ = sparse_code(L, theta, H, 1e-10)
    np.testing.assert_allclose(L @ s, theta, rtol=1e-6, atol=1e-7)


def test_engine_reconstruction_exact_for_k_equal_d_mu_lambda_to_zero():
    rng = np.random.default_rng(2)
    d = 4
    eng = ELLAEngine(d, 1e-10, 1e-10, max_inner_iterations=20, inner_tolerance=1e-12)
    state = eng.init(jax.random.PRNGKey(0), d)
    thetas = rng.uniform(0.1, 1.0, (3, d))
    for t in range(3):
        state, _ = eng.step(jax.random.PRNGKey(t), state, (thetas[t], _random_psd(rng, d), t))
    np.testing.assert_allclose(state.codes @ state.L.T, thetas, rtol=1e-5, atol=1e-6)


def _run_engine(rng, eng, d, n_tasks, revisit=None):
    state = eng.init(jax.random.PRNGKey(0), d)
    infos = []
    order = list(range(n_tasks)) + ([revisit] if revisit is not None else [])
    for i, t in enumerate(order):
        theta, H = rng.uniform(0, 1, d), _random_psd(rng, d, rank=d - 1)
        state, info = eng.step(jax.random.PRNGKey(100 + i), state, (theta, H, t))
        infos.append(info)
    return state, infos


def test_incremental_basis_equals_resolving_eq9_from_scratch():
    """After a stream with one known-task revisit, L from the running sums equals the minimizer
    of eq. 9 over the stored (theta, H, s): the normal equations rebuilt from scratch, and a
    zero autodiff gradient of eq. 9; g_hat from the sums equals eq. 9 from the stored tasks."""
    rng = np.random.default_rng(3)
    d, k, mu, lam = 4, 3, 0.05, 0.1
    eng = ELLAEngine(k, mu, lam, max_inner_iterations=3)
    state, infos = _run_engine(rng, eng, d, 6, revisit=2)
    assert state.num_tasks == 6 and not infos[-1].new_task
    assert infos[-1].reinitialized == 0
    A = sum(np.kron(np.outer(s, s), H) for s, H in zip(state.codes, state.hessians))
    b = sum(np.kron(s, H @ th) for s, H, th in zip(state.codes, state.hessians, state.thetas))
    np.testing.assert_allclose(state.A, A, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state.b, b, rtol=1e-10, atol=1e-12)
    M = A / 6 + lam * np.eye(d * k)
    L_scratch = np.linalg.solve(M, b / 6).reshape((d, k), order="F")
    np.testing.assert_allclose(state.L, L_scratch, rtol=1e-9, atol=1e-12)
    args = (jnp.asarray(state.codes), jnp.asarray(state.thetas), jnp.asarray(state.hessians), mu, lam)
    grad = jax.grad(ella_surrogate_objective)(jnp.asarray(state.L), *args)
    assert float(jnp.abs(grad).max()) < 1e-9
    np.testing.assert_allclose(eng.surrogate_loss(state),
                               float(ella_surrogate_objective(jnp.asarray(state.L), *args)),
                               rtol=1e-10)


def test_basis_from_sums_is_column_major_vec():
    rng = np.random.default_rng(4)
    d, k = 3, 2
    s, theta, H = rng.normal(size=k), rng.normal(size=d), _random_psd(rng, d)
    A, b = np.kron(np.outer(s, s), H), np.kron(s, H @ theta)
    L = basis_from_sums(A, b, 1, 0.3, d, k)
    # stationarity of 0.3 |L|^2 + |theta - L s|_H^2: 0.3 L = H (theta - L s) s^T
    np.testing.assert_allclose(0.3 * L, H @ np.outer(theta - L @ s, s), atol=1e-12)


def test_unused_columns_are_reinitialized():
    """A basis column no code uses is exactly zero after the update and is drawn again."""
    rng = np.random.default_rng(5)
    d, k = 3, 3
    eng = ELLAEngine(k, 50.0, 0.5, max_inner_iterations=1)  # large mu: sparse codes
    state = eng.init(jax.random.PRNGKey(1), d)
    theta, H = rng.uniform(0, 1, d), _random_psd(rng, d)
    new_state, info = eng.step(jax.random.PRNGKey(2), state, (theta, H, 0))
    unused = np.flatnonzero(new_state.codes[0] == 0)
    assert info.reinitialized == len(unused) >= 1
    assert np.all(np.linalg.norm(new_state.L[:, unused], axis=0) > 0.1)
    # the input state is not modified (pure step)
    assert state.num_tasks == 0 and not state.A.any()


def test_numpyro_map_equals_engine_codes_for_a_fixed_basis():
    """With L fixed, L-BFGS-B on the NumPyro program's potential (Laplace likelihood, s split
    into positive parts) gives the engine's LASSO codes."""
    rng = np.random.default_rng(6)
    T, d, k, mu, lam = 3, 4, 3, 0.3, 0.2
    L = rng.normal(size=(d, k))
    thetas = rng.uniform(0, 1, (T, d))
    Hs = np.stack([_random_psd(rng, d) for _ in range(T)])
    tasks = [(jnp.zeros((1, d)), None, jnp.ones(1))] * T
    kw = dict(num_components=k, mu=mu, lam=lam, signal_variances=None, noise_variances=None,
              likelihood="laplace", theta_hat=jnp.asarray(thetas), hessians=jnp.asarray(Hs))

    @jax.jit
    def pot(z):
        S = (z[: T * k] - z[T * k:]).reshape(T, k)
        return potential_energy(gp_ella_model, (tasks,), kw, {"L": jnp.asarray(L), "s": S})

    vg = jax.jit(jax.value_and_grad(pot))
    z0 = np.zeros(2 * T * k)
    f0 = float(pot(jnp.asarray(z0)))  # shift out the normalizers: L-BFGS-B's stop is relative

    def fun(z):
        v, g = vg(jnp.asarray(z))
        return float(v) - f0, np.asarray(g, np.float64)

    res = minimize(fun, z0, jac=True, method="L-BFGS-B", bounds=[(0, None)] * (2 * T * k),
                   options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 10000, "maxcor": 50})
    S_map = (res.x[: T * k] - res.x[T * k:]).reshape(T, k)
    S_engine = np.stack([sparse_code(L, thetas[t], Hs[t], mu)[0] for t in range(T)])
    # L-BFGS-B on the split variables stops within ~1e-4 of the minimizer (its projected
    # gradient test on the orthant); the engine's codes meet eq. 10's optimality conditions
    # exactly and are at least as good on the program's potential
    np.testing.assert_allclose(S_engine, S_map, atol=1e-4)
    for t in range(T):
        assert _lasso_kkt_violation(L, thetas[t], Hs[t], mu, S_engine[t]) <= 1e-10
    z_engine = np.concatenate([np.maximum(S_engine, 0).ravel(), np.maximum(-S_engine, 0).ravel()])
    assert float(pot(jnp.asarray(z_engine))) <= res.fun + f0 + 1e-9


def test_engine_follows_the_contract():
    from inference import base
    eng = ELLAEngine(2, 0.1, 0.1)
    assert isinstance(eng, base.Engine)
    state = eng.init(jax.random.PRNGKey(0), 3)
    assert base.is_state(state)
    state, info = eng.step(jax.random.PRNGKey(1), state, (np.ones(3), np.eye(3), 0))
    assert base.is_state(state) and base.is_state(info)


def test_psd_part_drops_negative_directions():
    H = np.diag([2.0, -1.0, 0.5])
    np.testing.assert_allclose(psd_part(H), np.diag([2.0, 0.0, 0.5]), atol=1e-15)


def test_single_task_fit_hessians_agree_and_constant_targets_skip_the_fit():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(20, 3))
    y = np.sin(X[:, 0]) + 0.2 * rng.normal(size=20)
    a = fit_single_task(X, y - y.mean(), max_iterations=30)
    b = fit_single_task(X, y - y.mean(), max_iterations=30, hessian="closed_form")
    np.testing.assert_allclose(a.theta, b.theta)
    np.testing.assert_allclose(a.hessian, b.hessian, rtol=1e-8, atol=1e-8 * np.abs(a.hessian).max())
    # at an interior optimum the gradient vanishes: feature 0 (the signal) is interior
    assert a.theta[0] > 1e-4 and a.iterations > 0
    c = fit_single_task(X, np.full(20, 3.0))
    assert c.constant_targets and not c.theta.any() and not c.hessian.any()


def test_uninformative_task_leaves_the_basis_and_task_count_unchanged():
    """A task with H = 0 (constant targets: no information about the kernel) gets code 0 and
    changes neither T, the running sums nor L (T counting it would grow the ridge T lambda and
    shrink L); a later revisit with information counts it."""
    rng = np.random.default_rng(8)
    d, k = 4, 2
    eng = ELLAEngine(k, 0.05, 0.5)
    state, _ = _run_engine(rng, eng, d, 3)
    new_state, info = eng.step(jax.random.PRNGKey(9), state, (np.zeros(d), np.zeros((d, d)), 3))
    assert info.new_task and new_state.num_tasks == 3 and not new_state.counted[3]
    np.testing.assert_array_equal(new_state.L, state.L)
    np.testing.assert_array_equal(new_state.A, state.A)
    np.testing.assert_array_equal(new_state.codes[3], 0.0)
    later, _ = eng.step(jax.random.PRNGKey(10), new_state,
                        (rng.uniform(0, 1, d), _random_psd(rng, d), 3))
    assert later.num_tasks == 4 and later.counted[3]
    # and back: an informative task whose new data carry no information leaves the sums
    back, _ = eng.step(jax.random.PRNGKey(11), later, (np.zeros(d), np.zeros((d, d)), 3))
    assert back.num_tasks == 3
    np.testing.assert_allclose(back.A, state.A, atol=1e-12)
    np.testing.assert_allclose(back.b, state.b, atol=1e-12)


def _irrelevant_feature_task(seed=1, n=40):
    """Feature 0 carries the signal, features 1 and 2 are pure noise (their theta go to the
    fit's lower bound with this seed)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=n)
    return X, y - y.mean()


def test_converged_fit_is_a_minimum_in_log_theta_not_in_theta():
    """At a converged fit whose irrelevant features' theta went to the lower bound, the
    log-theta Hessian (eq. 5 in u = log theta) is positive semi-definite while the theta
    Hessian is indefinite: the fit is a stationary point in u, not in theta (there the
    likelihood would like theta_a < 0: a large positive gradient)."""
    X, y = _irrelevant_feature_task()
    fit = fit_single_task(X, y, hessian="closed_form")
    assert fit.converged and fit.iterations < 1000
    assert fit.theta[0] > 0.1 and np.all(fit.theta[1:] <= 1.0001e-8)
    u, Hu = expansion(fit, "log_theta")
    theta, H = expansion(fit, "theta")
    np.testing.assert_allclose(u, np.log(fit.theta))
    np.testing.assert_array_equal(theta, fit.theta)
    assert not has_negative_curvature(Hu) and np.linalg.eigvalsh(Hu)[0] > 0
    assert has_negative_curvature(H)
    assert np.all(fit.gradient[1:] > 1e3 * abs(fit.gradient[0]))
    assert np.abs(fit.theta * fit.gradient).max() < 1e-4  # stationary in u
    # a fit stopped early is not stationary in u
    early = fit_single_task(X, y, max_iterations=5, hessian="closed_form")
    assert not early.converged
    assert np.abs(early.theta * early.gradient).max() > 1e-2


def test_fit_single_task_refuses_float32():
    """Without JAX float64 the fit raises (instead of silently fitting in float32)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import numpy as np\n"
            "from inference.gp_ella import fit_single_task\n"
            "try:\n"
            "    fit_single_task(np.zeros((4, 2)) + np.arange(4)[:, None], np.arange(4.0) - 1.5)\n"
            "except RuntimeError as e:\n"
            "    print('refused:', 'jax_enable_x64' in str(e))\n")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu",
                              "PYTHONPATH": str(root)}, timeout=300)
    assert "refused: True" in out.stdout, out.stdout + out.stderr


def test_kernel_predictions_compile_once_for_any_number_of_tasks():
    """Kernels are predicted in padded chunks: 3, 17 and 40 known tasks reuse one compiled
    function (no recompilation as the task count grows), and the padding changes nothing."""
    from inference import gp_ella as eng

    rng = np.random.default_rng(10)
    X, y, Xs = rng.normal(size=(20, 3)), rng.normal(size=20), rng.normal(size=(7, 3))
    thetas = rng.uniform(0.1, 2.0, (40, 3))
    full = kernel_predictions(thetas, 1.3, 0.1, X, y, Xs)
    size = eng._predict_chunk._cache_size()
    for K in (3, 17, 40):
        means, variances = kernel_predictions(thetas[:K], 1.3, 0.1, X, y, Xs)
        assert means.shape == (K, 7)
        np.testing.assert_allclose(means, full[0][:K], rtol=1e-12)
        np.testing.assert_allclose(variances, full[1][:K], rtol=1e-12)
    assert eng._predict_chunk._cache_size() == size and PREDICT_CHUNK < 40


def test_smoothing_weights_limits_and_effective_number():
    d2 = np.array([0.0, 1.0, 4.0, 9.0])
    np.testing.assert_allclose(smoothing_weights(d2, 0, 0.0), [1, 0, 0, 0])
    np.testing.assert_allclose(smoothing_weights(d2, 0, np.inf), [0.25] * 4)
    w = smoothing_weights(d2, 0, 2.0)
    np.testing.assert_allclose(w, np.exp(-d2 / 4) / np.exp(-d2 / 4).sum())
    assert effective_number_of_tasks([1, 0, 0, 0]) == 1.0
    assert effective_number_of_tasks([0.25] * 4) == 4.0
    z = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])  # squared distances 1, 4, 5
    assert median_squared_distance(z) == 4.0 and median_squared_distance(z[:1]) == 0.0


def test_choose_smoothing_variance_finds_the_scale_the_data_prefer():
    """Held-out targets made by the task's own kernel pick no smoothing; targets equal to the
    uniform average pick uniform weights; targets from the 1-nearest-neighbour weights of
    variance 0.5 pick 0.5 from the grid."""
    rng = np.random.default_rng(11)
    K, n = 5, 8
    points = rng.normal(size=(K, 2))
    d2s = [np.sum((points - points[t]) ** 2, axis=1) for t in range(K)]
    means = [rng.normal(size=(K, n)) for _ in range(K)]
    grid = np.array([0.0, 0.05, 0.5, 5.0, np.inf])
    own = [m[t] for t, m in enumerate(means)]
    assert choose_smoothing_variance(d2s, list(range(K)), means, own, grid)[0] == 0.0
    uniform = [m.mean(axis=0) for m in means]
    assert choose_smoothing_variance(d2s, list(range(K)), means, uniform, grid)[0] == np.inf
    mid = [smoothing_weights(d2s[t], t, 0.5) @ means[t] for t in range(K)]
    best, sse = choose_smoothing_variance(d2s, list(range(K)), means, mid, grid)
    assert best == 0.5 and sse[2] < 1e-20


@pytest.mark.parametrize("lam", [math.exp(-12), 0.3])
def test_low_rank_basis_update_equals_the_direct_solve(lam):
    """The alternations' low-rank re-solve (Woodbury on one factorization per step, then one
    refinement step) gives the basis and codes of a fresh Cholesky per alternation, also for
    the grid's smallest lambda and rank-deficient H_t."""
    d, k = 5, 6
    states = []
    for low_rank_min_size in (10**9, 1):
        rng = np.random.default_rng(12)
        eng = ELLAEngine(k, math.exp(-8), lam, low_rank_min_size=low_rank_min_size)
        state, _ = _run_engine(rng, eng, d, 6, revisit=1)
        states.append(state)
    direct, low_rank = states
    np.testing.assert_allclose(low_rank.L, direct.L, rtol=1e-7, atol=1e-9 * np.abs(direct.L).max())
    np.testing.assert_allclose(low_rank.codes, direct.codes, rtol=1e-7,
                               atol=1e-9 * np.abs(direct.codes).max())
    np.testing.assert_allclose(low_rank.A, direct.A, rtol=1e-7, atol=1e-9 * np.abs(direct.A).max())
