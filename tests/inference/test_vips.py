"""Selection policies of VIPS (Pescador-Barrios et al. 2024): the incremental greedy selection
against the from-scratch one and against dense linear algebra, the stopping rule's statistics,
Conditional Variance against a dense pivoted-Cholesky reference, OIPS' acceptance rule, and the
bounded type-II fit. Problems are kept at <= 32 points so that every jitted function compiles
once for the whole module (one size bucket)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference import vips
from inference.type2ml import fit_type2ml
from models.exact_gp import GPRegressionParams
from models.kernels_jax import SquaredExponential
from models.online_sgpr import OldPosterior, old_terms, online_elbo, optimal_inducing_posterior


def _params(ls=0.6, noise=0.05):
    return GPRegressionParams(SquaredExponential(jnp.asarray(1.0), jnp.asarray([ls])),
                              jnp.asarray(noise))


def _stream(seed=0, n=32):
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(0, 10, n))[:, None]
    y = np.sin(2 * X[:, 0]) + np.cos(5 * X[:, 0]) + 0.2 * rng.standard_normal(n)
    return jnp.asarray(X), jnp.asarray(y)


def _old(p, X, y, idx):
    a = X[idx]
    m, S = optimal_inducing_posterior(p, X, y, a, None)
    return OldPosterior(a, m, S + 1e-6 * jnp.eye(a.shape[0]), p.kernel(a))


def test_incremental_and_from_scratch_select_the_same_points_first_batch():
    X, y = _stream(0)
    p = _params()
    inc = vips.greedy_variance_selection(p, X, y, None, 1e9, jitter=1e-4, max_new=20)
    ref = vips.greedy_variance_from_scratch(p, X, y, None, 1e9, jitter=1e-4, max_new=20)
    np.testing.assert_array_equal(inc.indices, ref.indices)
    np.testing.assert_allclose(inc.bounds, ref.bounds, rtol=0, atol=1e-8)
    np.testing.assert_allclose(inc.residual, ref.residual, atol=1e-10)
    # the incremental bound is the bound of models.online_sgpr at the chosen set
    F = online_elbo(p, X, y, X[inc.indices], None, jitter=1e-4)
    np.testing.assert_allclose(inc.bounds[-1], float(F), atol=1e-8)


def test_incremental_and_from_scratch_select_the_same_points_online_with_threshold():
    X, y = _stream(1, 32)
    X2, y2 = _stream(2, 32)
    p = _params()
    old = _old(p, X, y, np.arange(0, 32, 4))
    terms = vips.prepare_old(old, 1e-6)
    F_all = vips.padded_elbo(p, X2, y2, jnp.concatenate([X2, old.inducing_inputs]), terms, 1e-6)[0]
    F_a = vips.padded_elbo(p, X2, y2, old.inducing_inputs, terms, 1e-6)[0]
    gamma = F_a + 0.9 * (F_all - F_a)      # stops part-way
    inc = vips.greedy_variance_selection(p, X2, y2, terms, gamma)
    ref = vips.greedy_variance_from_scratch(p, X2, y2, terms, gamma)
    assert 0 < len(inc.indices) < 32
    np.testing.assert_array_equal(inc.indices, ref.indices)
    np.testing.assert_allclose(inc.bounds, ref.bounds, atol=1e-8)
    assert inc.bounds[-1] >= gamma > inc.bounds[-2]
    Z = jnp.concatenate([old.inducing_inputs, X2[inc.indices]])
    F = online_elbo(p, X2, y2, Z, old_terms(old), jitter=1e-6)
    np.testing.assert_allclose(inc.bounds[-1], float(F), atol=1e-8)


def test_greedy_residuals_equal_dense_diag_kff_minus_qff():
    X, y = _stream(3)
    p = _params()
    old = _old(p, X, y, np.arange(0, 32, 5))
    X2, y2 = _stream(4)
    res = vips.greedy_variance_selection(p, X2, y2, vips.prepare_old(old, 1e-6), 1e9, max_new=9)
    Z = np.concatenate([np.asarray(old.inducing_inputs), np.asarray(X2)[res.indices]])
    K = np.asarray(p.kernel(X2))
    Kfb = np.asarray(p.kernel(X2, jnp.asarray(Z)))
    Kbb = np.asarray(p.kernel(jnp.asarray(Z))) + 1e-6 * np.eye(Z.shape[0])
    dense = np.diag(K - Kfb @ np.linalg.solve(Kbb, Kfb.T))
    np.testing.assert_allclose(res.residual, dense, atol=1e-9)
    # greedy variance: each pick had the largest residual among the unpicked points
    assert np.all(res.residual[res.indices] < 1e-5)


def test_padded_bound_equals_unpadded():
    X, y = _stream(5, 27)
    p = _params()
    old = _old(p, X, y, np.arange(0, 27, 3))
    X2, y2 = _stream(6, 19)
    Z = jnp.concatenate([old.inducing_inputs, X2[:5]])
    F_pad, r_pad = vips.padded_elbo(p, X2, y2, Z, vips.prepare_old(old, 1e-6), 1e-6)
    F = online_elbo(p, X2, y2, Z, old_terms(old), jitter=1e-6)
    np.testing.assert_allclose(F_pad, float(F), atol=1e-9)
    assert r_pad.shape == (19,)


def test_target_stats_match_numpy_over_all_batches():
    rng = np.random.default_rng(0)
    ys = [rng.standard_normal(n) * 2 + 1 for n in (7, 1, 12)]
    st = vips.TargetStats(jnp.zeros(()), jnp.zeros(()), jnp.zeros(()))
    for yb in ys:
        st = vips.update_target_stats(st, jnp.asarray(yb))
    allv = np.concatenate(ys)
    assert float(st.count) == allv.size
    np.testing.assert_allclose(float(st.mean), allv.mean(), atol=1e-12)
    np.testing.assert_allclose(float(st.M2) / (allv.size - 1), allv.var(ddof=1), atol=1e-12)
    # the noise code is the Gaussian log-likelihood with those moments
    from scipy.stats import norm

    ref = norm(allv.mean(), allv.std(ddof=1)).logpdf(ys[-1]).sum()
    np.testing.assert_allclose(float(vips.noise_code(st, jnp.asarray(ys[-1]))), ref, atol=1e-10)


def test_vips_repeated_batch_adds_almost_no_points():
    X, y = _stream(7)
    p = _params()
    policy = vips.VIPS()
    sel1 = policy.select(jax.random.PRNGKey(0), policy.init(), X, y, None, p)
    Z = sel1.inducing_inputs
    m, S = optimal_inducing_posterior(p, X, y, Z, None)
    old = OldPosterior(Z, m, S + 1e-6 * jnp.eye(Z.shape[0]), p.kernel(Z))
    sel2 = policy.select(jax.random.PRNGKey(1), sel1.stats, X, y, old, p)
    assert sel2.record["added"] <= 1, sel2.record
    assert sel1.record["bound_selected"] >= sel1.record["threshold"]
    assert sel1.record["threshold"] <= sel1.record["l_max"]


def test_vips_stops_at_the_smallest_prefix_reaching_gamma():
    X, y = _stream(8)
    p = _params()
    sel = vips.VIPS().select(jax.random.PRNGKey(0), vips.VIPS().init(), X, y, None, p)
    gamma = sel.record["threshold"]
    full = vips.greedy_variance_selection(p, X, y, None, 1e9, jitter=1e-4, max_new=32)
    k = sel.record["added"]
    np.testing.assert_array_equal(np.asarray(sel.inducing_inputs), np.asarray(X[full.indices[:k]]))
    assert full.bounds[k] >= gamma and (k == 1 or full.bounds[k - 1] < gamma)


def test_first_delta_sets_the_first_batch_threshold_only():
    """``first_delta`` (the authors' Fig. 2a script: 0.04 offline, 0.05 online) replaces delta in
    the first batch's gamma and nowhere else."""
    X, y = _stream(8)
    p = _params()
    a, b = vips.VIPS(), vips.VIPS(first_delta=0.01)
    sa = a.select(jax.random.PRNGKey(0), a.init(), X, y, None, p)
    sb = b.select(jax.random.PRNGKey(0), b.init(), X, y, None, p)
    gap = abs(sa.record["l_max"] - sa.record["l_noise"])
    assert sa.record["threshold"] == pytest.approx(sa.record["l_max"] - 0.05 * gap)
    assert sb.record["threshold"] == pytest.approx(sb.record["l_max"] - 0.01 * gap)
    assert sb.record["added"] >= sa.record["added"]
    old = _old(p, X, y, np.arange(0, 32, 4))
    oa = a.select(jax.random.PRNGKey(1), sa.stats, X, y, old, p)
    ob = b.select(jax.random.PRNGKey(1), sa.stats, X, y, old, p)
    assert oa.record["threshold"] == ob.record["threshold"]
    with pytest.raises(ValueError, match="first_delta"):
        vips.VIPS(first_delta=1.5)


def _dense_pivoted_cholesky(K, eta, cap):
    """Textbook partial pivoted Cholesky of K + 1e-6 I (MDPP.py's stopping rule)."""
    n = K.shape[0]
    d = np.diag(K).copy() + 1e-6
    rows = np.zeros((cap, n))
    piv = [int(np.argmax(d))]
    for m in range(cap - 1):
        j = piv[m]
        col = K[:, j].copy()
        col[j] += 1e-6
        e = (col - rows[:m, j] @ rows[:m]) / np.sqrt(d[j])
        rows[m] = e
        d = np.maximum(d - e ** 2, 0)
        piv.append(int(np.argmax(d)))
        if d.sum() < eta:
            return piv[:m]
    return piv[:cap]


@pytest.mark.parametrize("eta", [1e-1, 1e-3])
def test_conditional_variance_matches_dense_pivoted_cholesky(eta):
    X, _ = _stream(9)
    p = _params(ls=1.0)
    key = jax.random.PRNGKey(3)
    idx = vips.pivoted_cholesky(p.kernel, X, eta, 32, key)
    perm = np.asarray(jax.random.permutation(key, 32))
    K = np.asarray(p.kernel(X[perm]))
    ref = perm[_dense_pivoted_cholesky(K, eta, 32)]
    np.testing.assert_array_equal(idx, ref)
    # the residual trace after all but the last kept pivot... stays above eta before stopping
    Z = np.asarray(X)[idx]
    Kz = np.asarray(p.kernel(jnp.asarray(Z))) + 1e-6 * np.eye(len(idx))
    Kxz = np.asarray(p.kernel(X, jnp.asarray(Z)))
    resid = np.trace(np.asarray(p.kernel(X))) - np.trace(Kxz @ np.linalg.solve(Kz, Kxz.T))
    assert resid > 0


def test_oips_accepts_exactly_the_points_below_rho():
    X, y = _stream(10)
    p = _params(ls=0.4)
    pol = vips.OIPS(rho=0.8, kmin=3)
    sel = pol.select(jax.random.PRNGKey(0), pol.init(), X, y, None, p)
    Z = np.asarray(sel.inducing_inputs)
    start = np.asarray(X)[np.asarray(jax.random.permutation(jax.random.PRNGKey(0), 32))[:3]]
    # replay the rule in NumPy
    cur = list(start)
    for x in np.asarray(X):
        k = np.asarray(p.kernel(jnp.asarray(x[None]), jnp.asarray(np.array(cur))))[0]
        if k.max() < 0.8 * 1.0:
            cur.append(x)
    np.testing.assert_allclose(Z, np.array(cur))


def test_fixed_m_and_policies_follow_the_protocol():
    X, y = _stream(11)
    p = _params()
    for pol in (vips.VIPS(), vips.ConditionalVariance(), vips.OIPS(), vips.FixedM(5),
                vips.FixedM(5, "greedy")):
        assert isinstance(pol, vips.SelectionPolicy)
        sel = pol.select(jax.random.PRNGKey(0), pol.init(), X, y, None, p)
        assert sel.inducing_inputs.shape[1] == 1 and sel.record["m"] == sel.inducing_inputs.shape[0]
    assert vips.FixedM(5).select(jax.random.PRNGKey(0), vips.FixedM(5).init(), X, y, None,
                                 p).record["m"] == 5


def test_type2ml_respects_upper_bounds():
    target = jnp.asarray(10.0)
    res = fit_type2ml(lambda q: (jnp.log(q["v"]) - jnp.log(target)) ** 2, {"v": jnp.asarray(1.0)},
                      upper_bounds={"v": 3.0})
    np.testing.assert_allclose(float(res.params["v"]), 3.0, rtol=1e-6)
    res = fit_type2ml(lambda q, t: (jnp.log(q["v"]) - jnp.log(t)) ** 2, {"v": jnp.asarray(1.0)},
                      data=(target,))
    np.testing.assert_allclose(float(res.params["v"]), 10.0, rtol=1e-4)


def test_fit_keeps_kernel_variance_inside_the_reference_box():
    X, y = _stream(12)
    p = _params()
    res = vips.fit_hyperparameters(p, X, 100 * y, X[:8], None, variance_bounds=(1e-6, 2.0))
    assert float(res.params.kernel.variance) <= 2.0 + 1e-9
    assert float(res.params.noise_variance) >= 1e-6


# -- the fit's parametrization (GPflow's, as the reference) ----------------------------------
def _two_basin_batch():
    """41 points in 8-D with three zero-inflated inputs and one of five levels (concrete-like:
    the kind of small first batch on which the bound has two basins)."""
    rng = np.random.default_rng(5)
    n, d = 41, 8
    X = rng.standard_normal((n, d))
    X[:, 1] = np.where(rng.random(n) < 0.5, 0.0, rng.gamma(2, 1, n))
    X[:, 2] = np.where(rng.random(n) < 0.6, 0.0, rng.gamma(2, 1, n))
    X[:, 4] = np.where(rng.random(n) < 0.4, 0.0, rng.gamma(2, 1, n))
    X[:, 7] = rng.choice([3, 7, 28, 56, 90], n)
    X = 3.0 * (X - X.mean(0)) / (X.std(0) + 1e-6)
    y = (np.log(X[:, 7] + 10) + 0.5 * X[:, 0] - 0.3 * X[:, 1] + 0.2 * np.sin(X[:, 3])
         + 0.05 * rng.standard_normal(n))
    return X, 0.5 * (y - y.mean()) / y.std()


def test_fit_in_gpflows_parametrization_reaches_the_basin_gpflow_reaches():
    """From the protocol's start (1, 1, 0.1) with Z = X (what VIPS' first batch selects here),
    the SGPR bound has two basins: L-BFGS-B in log space ends in a short-lengthscale one
    (bound -25.16), in GPflow's parametrization in the long-lengthscale one (bound +38.22).
    GPflow 2.9.2 (``SGPR``, the reference's ``Sigmoid(1e-6, 2e3)`` on the variance,
    ``gpflow.optimizers.Scipy``) fitted on the same arrays ends at variance 102.789, lengthscale
    182.057, noise 1.65222e-3 with bound 38.2203 (run beside this repository)."""
    X, y = _two_basin_batch()
    p = GPRegressionParams(SquaredExponential(jnp.asarray(1.0), jnp.asarray([1.0])),
                           jnp.asarray(0.1))
    log = vips.fit_hyperparameters(p, X, y, X, None, parametrization="log")
    gpf = vips.fit_hyperparameters(p, X, y, X, None, parametrization="gpflow")
    np.testing.assert_allclose(-gpf.value, 38.2203, atol=2e-3)
    np.testing.assert_allclose([float(gpf.params.kernel.variance),
                                float(gpf.params.kernel.lengthscale[0]),
                                float(gpf.params.noise_variance)],
                               [102.789, 182.057, 1.65222e-3], rtol=2e-3)
    assert -log.value < -gpf.value - 50       # the other basin, far below
    assert float(log.params.kernel.lengthscale[0]) < 10


# -- buffers, first batch, old terms ----------------------------------------------------------
def test_first_batch_bound_is_the_online_bound_with_no_old_point():
    X, y = _stream(13, 20)
    p = _params()
    Z = X[:7]
    F = online_elbo(p, X, y, Z, None, jitter=1e-6)
    F_empty = online_elbo(p, X, y, Z, vips.empty_old_terms(1, 32), jitter=1e-6)
    np.testing.assert_allclose(float(F_empty), float(F), rtol=0, atol=1e-12)
    assert vips.d_jitter_of(None, 1e-6) == 0.0 and vips.d_jitter_of(object(), 1e-6) == 1e-6


def test_padded_old_terms_give_the_same_bound_at_every_size():
    X, y = _stream(14, 32)
    p = _params()
    old = _old(p, X, y, np.arange(0, 32, 3))
    X2, y2 = _stream(15, 24)
    Z = np.concatenate([np.asarray(old.inducing_inputs), np.asarray(X2[:4])])
    terms = vips.prepare_old(old, 1e-6)
    F0 = vips.padded_elbo(p, X2, y2, Z, terms, 1e-6)[0]
    F1 = vips.padded_elbo(p, X2, y2, Z, vips.pad_terms(terms, 64), 1e-6)[0]
    F2 = vips.bound_value(p, X2, y2, Z, vips.pad_terms(terms, 64), 1e-6)
    ref = float(online_elbo(p, X2, y2, jnp.asarray(Z), old_terms(old), jitter=1e-6))
    np.testing.assert_allclose([F0, F1, F2], ref, rtol=0, atol=1e-9)


def test_incremental_selection_moves_to_larger_buffers_and_still_matches_from_scratch():
    """M_a = 11 old points: the buffers start at 32 rows and must grow to 64 to take all 32
    batch points; the points and bounds are the from-scratch ones."""
    X, y = _stream(16, 32)
    p = _params()
    old = _old(p, X, y, np.arange(0, 32, 3))
    terms = vips.prepare_old(old, 1e-6)
    X2, y2 = _stream(17, 32)
    inc = vips.greedy_variance_selection(p, X2, y2, terms, 1e9)
    ref = vips.greedy_variance_from_scratch(p, X2, y2, terms, 1e9)
    assert len(inc.indices) == 32
    np.testing.assert_array_equal(inc.indices, ref.indices)
    np.testing.assert_allclose(inc.bounds, ref.bounds, rtol=0, atol=1e-7)


def test_incremental_selection_raises_on_a_non_positive_pivot():
    """A kernel that is not positive definite (negative variance) gives a negative pivot at the
    first addition: the loop must say so, not stop silently (NaN compares false)."""
    X, y = _stream(18, 20)
    bad = GPRegressionParams(SquaredExponential(jnp.asarray(-1.0), jnp.asarray([0.6])),
                             jnp.asarray(0.05))
    with pytest.raises(vips.SelectionPivotError, match="not positive"):
        vips.greedy_variance_selection(bad, X, y, None, 1e9, jitter=1e-4)


def test_engine_summary_holds_the_next_batchs_old_terms():
    """The summary factorizes the next batch's old terms with the fit (once per batch): they
    equal ``prepare_old`` of the old summary the engine passes on."""
    X, y = _stream(19, 32)
    eng = vips.OnlineSGPREngine(vips.VIPS())
    st, _ = eng.step(jax.random.PRNGKey(0), eng.init(None, _params(), 1), (X[::2], y[::2]))
    st, _ = eng.step(jax.random.PRNGKey(1), st, (X[1::2], y[1::2]))
    ref = vips.prepare_old(eng.old_posterior(st), eng.jitter, size=st.terms.a.shape[0])
    for a, b in zip(st.terms[:4], ref[:4]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-8, atol=1e-8)
    np.testing.assert_array_equal(np.asarray(st.terms.mask), np.asarray(ref.mask))


# -- Conditional Variance's growing buffer, OIPS under a sum kernel, the fixed-memory baseline --
def test_conditional_variance_buffer_grows_and_matches_dense_pivoted_cholesky():
    rng = np.random.default_rng(20)
    X = jnp.asarray(rng.uniform(0, 30, (150, 1)))
    p = _params(ls=0.2)
    key = jax.random.PRNGKey(4)
    idx = vips.pivoted_cholesky(p.kernel, X, 1e-6, 150, key)
    assert len(idx) > 128                   # past the first buffer of 128 rows
    perm = np.asarray(jax.random.permutation(key, 150))
    K = np.asarray(p.kernel(X[perm]))
    np.testing.assert_array_equal(idx, perm[_dense_pivoted_cholesky(K, 1e-6, 150)])


def test_oips_judges_a_sum_kernel_by_its_stationary_part():
    """With constant(500) + Matern 5/2 every k(x, z) >= 500 > rho k(x, x): judged by the sum no
    point is ever accepted; the reference (``OIPS.py``) uses the Matern part, as here."""
    from models.kernels_jax import Constant, Matern52, Sum

    X, y = _stream(21)
    kern = Sum(Constant(jnp.asarray(500.0)), Matern52(jnp.asarray(1.0), jnp.asarray([0.4])))
    p = GPRegressionParams(kern, jnp.asarray(0.1))
    assert vips.oips_kernel(kern) is kern.k2
    pol = vips.OIPS(rho=0.8, kmin=3)
    sel = pol.select(jax.random.PRNGKey(0), pol.init(), X, y, None, p)
    start = np.asarray(X)[np.asarray(jax.random.permutation(jax.random.PRNGKey(0), 32))[:3]]
    cur = list(start)
    for x in np.asarray(X):
        k = np.asarray(kern.k2(jnp.asarray(x[None]), jnp.asarray(np.array(cur))))[0]
        if k.max() < 0.8 * 1.0:
            cur.append(x)
    assert sel.record["added"] > 0
    np.testing.assert_allclose(np.asarray(sel.inducing_inputs), np.array(cur))


def test_fixed_memory_old_new_baseline_keeps_70_percent_old_points():
    X, y = _stream(22)
    p = _params()
    pol = vips.FixedM(10, "old-new")
    first = pol.select(jax.random.PRNGKey(0), pol.init(), X, y, None, p)
    Z1 = np.asarray(first.inducing_inputs)
    assert Z1.shape == (10, 1) and np.isin(Z1[:, 0], np.asarray(X)[:, 0]).all()
    old = _old(p, X, y, np.arange(10))
    old = old._replace(inducing_inputs=jnp.asarray(Z1))
    X2, y2 = _stream(23)
    Z2 = np.asarray(pol.select(jax.random.PRNGKey(1), first.stats, X2, y2, old, p).inducing_inputs)
    assert Z2.shape == (10, 1)
    assert np.isin(Z2[:7, 0], Z1[:, 0]).all() and np.isin(Z2[7:, 0], np.asarray(X2)[:, 0]).all()
    with pytest.raises(ValueError, match="method"):
        vips.FixedM(10, "bui")
