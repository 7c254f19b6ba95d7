"""GP-ELLA learner and baselines on the protocol: update / predict, exact resume, ArviZ
export, bad input with unchanged state, the individual-GP baseline against ExactGP."""

import math

import numpy as np
import pytest

from ppl_cl import Batch
from ppl_cl.configs.gp_ella import GPELLAConfig
from ppl_cl.learners.gp_ella import GPELLA, NotFittedError
from ppl_cl.learners.gp_ella_baselines import IndividualGPs, LinearELLA, MultiTaskGP, SharedGP

D = 3


def _tasks(n_tasks=4, n=20, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for t in range(n_tasks):
        x = rng.normal(size=(n, D))
        w = rng.normal(size=D)
        out.append((x, np.sin(x @ w) + 0.1 * rng.normal(size=n) + t))
    return out


def _small(**kw):
    return GPELLA(GPELLAConfig(num_components=2, max_iterations=20, **kw))


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}/{k}"))
        return out
    if isinstance(tree, (list, tuple)):
        out = {}
        for i, v in enumerate(tree):
            out.update(_flat(v, f"{prefix}/{i}"))
        return out
    return {prefix: np.asarray(tree)}


def _assert_same_state(a, b):
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


def test_update_predict_and_exact_resume(tmp_path):
    tasks = _tasks(5)
    a = _small()
    with pytest.raises(NotFittedError):
        a.predict(tasks[0][0], 0)
    for t in range(3):
        rec = a.update(Batch(*tasks[t], task_id=t))
        assert rec["new_task"] and rec["num_data"] == 20 and math.isfinite(rec["ella_loss"])
    a.save(tmp_path / "ckpt.npz")
    b = GPELLA.load(tmp_path / "ckpt.npz")
    assert isinstance(b, GPELLA) and b.config == a.config
    for learner in (a, b):
        for t in (3, 4):
            learner.update(Batch(*tasks[t], task_id=t))
        learner.update(Batch(tasks[1][0][:5], tasks[1][1][:5], task_id=1))  # known task
    _assert_same_state(a.state_dict(), b.state_dict())
    for t in range(5):
        pa, pb = a.predict(tasks[t][0], t), b.predict(tasks[t][0], t)
        np.testing.assert_array_equal(pa.mean, pb.mean)
        np.testing.assert_array_equal(pa.variance, pb.variance)
        assert pa.mean.shape == (20,) and np.all(pa.variance > 0)
    assert a.num_tasks == 5 and a.state.num_tasks == 5
    assert len(a.predict(np.zeros((0, D)), 2)) == 0


def test_known_task_update_keeps_the_task_count_and_appends_data():
    tasks = _tasks(2)
    g = _small()
    g.update(Batch(*tasks[0], task_id=7))
    g.update(Batch(*tasks[1], task_id=3))
    rec = g.update(Batch(tasks[0][0][:4], tasks[0][1][:4], task_id=7))
    assert not rec["new_task"] and rec["num_data"] == 24
    assert g.state.num_tasks == 2 and g.task_ids == [7, 3]


def test_bad_input_raises_and_leaves_the_state_unchanged():
    tasks = _tasks(2)
    g = _small()
    g.update(Batch(*tasks[0], task_id=0))
    before = g.state_dict()
    x, y = tasks[1]
    bad_y = y.copy()
    bad_y[3] = np.nan
    cases = [(Batch(x, y), ValueError, "task_id"),
             (Batch(x, bad_y, task_id=1), ValueError, "finite"),
             (Batch(x[:, :2], y, task_id=1), ValueError, "feature dimension"),
             (Batch(np.zeros((0, D)), np.zeros(0), task_id=1), ValueError, "empty")]
    for batch, err, text in cases:
        with pytest.raises(err, match=text):
            g.update(batch)
    with pytest.raises(TypeError, match="batch"):
        g.update((x, y))
    with pytest.raises(ValueError, match="unknown task"):
        g.predict(x, 99)
    with pytest.raises(ValueError, match="task_id"):
        g.predict(x)
    with pytest.raises(ValueError, match="x: expected shape"):
        g.predict(x[:, :2], 0)
    _assert_same_state(before, g.state_dict())


def test_constant_targets_and_tiny_tasks_are_handled():
    tasks = _tasks(2)
    g = _small()
    g.update(Batch(*tasks[0], task_id=0))
    A_before, L_before, T_before = g.state.A.copy(), g.basis, g.state.num_tasks
    rec = g.update(Batch(tasks[1][0], np.full(20, 4.0), task_id=1))
    assert rec["constant_targets"] and not rec["negative_curvature"]
    np.testing.assert_array_equal(g.codes[1], 0.0)
    # no information about the kernel: the basis, the sums and T are exactly unchanged
    np.testing.assert_array_equal(g.state.A, A_before)
    np.testing.assert_array_equal(g.basis, L_before)
    assert g.state.num_tasks == T_before == 1 and g.num_tasks == 2
    np.testing.assert_allclose(g.predict(tasks[0][0][:5], 1).mean, 4.0, atol=1e-9)
    rec = g.update(Batch(tasks[0][0][:3], tasks[0][1][:3], task_id=2))  # 3 points: no held-out
    assert not rec["line_search_possible"]
    assert np.all(np.isfinite(g.predict(tasks[0][0][:5], 2).mean))
    assert g.diagnostics()["num_fitted_tasks"] == 2


def test_to_inference_data_draws_the_basis_posterior_of_the_program():
    """The draws of vec(L) have the mean and precision of the NumPyro program's posterior given
    the codes (Laplace likelihood): mean = the minimizer of its potential, precision = the
    autodiff Hessian of its potential in vec(L); checked by whitening the draws with that
    Hessian (mean 0 and unit covariance within Monte Carlo error)."""
    import jax
    import jax.numpy as jnp
    from numpyro.infer.util import potential_energy

    from models.gp_ella import gp_ella_model

    tasks = _tasks(3)
    g = _small()
    for t in range(3):
        g.update(Batch(*tasks[t], task_id=t))
    n = 4000
    idata = g.to_inference_data(num_draws=n, seed=1)
    assert idata.posterior["L"].shape == (4, n // 4, D, 2)       # independent draws, 4 chains
    assert idata.attrs["sampling"] == "independent draws"
    L_draws = np.asarray(idata.posterior["L"]).reshape(1, n, D, 2)
    theta = np.asarray(idata.posterior["theta"]).reshape(1, n, 3, D)
    np.testing.assert_allclose(theta[0, 0], np.exp(g.codes @ L_draws[0, 0].T), rtol=1e-12)
    s = g.state
    T, k = s.num_tasks, 2
    kw = dict(num_components=k, mu=g.config.mu, lam=g.config.lam, signal_variances=None,
              noise_variances=None, likelihood="laplace", theta_hat=jnp.asarray(s.thetas),
              hessians=jnp.asarray(s.hessians), parametrization="log_theta")
    program_tasks = [(jnp.zeros((1, D)), None, jnp.ones(1))] * T

    def pot(vec):
        L = vec.reshape(k, D).T  # column-major vec
        return potential_energy(gp_ella_model, (program_tasks,), kw,
                                {"L": L, "s": jnp.asarray(s.codes)})

    vec0 = jnp.asarray(g.basis.reshape(-1, order="F"))
    P = np.asarray(jax.hessian(pot)(vec0))
    grad = np.asarray(jax.grad(pot)(vec0))
    assert np.abs(grad).max() < 1e-8 * np.abs(P).max()  # L is the posterior mode
    C = np.linalg.cholesky(P)
    z = (L_draws[0].transpose(0, 2, 1).reshape(n, -1) - np.asarray(vec0)) @ C
    se = 1.0 / math.sqrt(n)
    assert np.all(np.abs(z.mean(axis=0)) < 5 * se)
    cov = np.cov(z.T)
    # a sample covariance of unit normals: s.e. 1/sqrt(n) off, sqrt(2/n) on the diagonal
    assert np.all(np.abs(np.diag(cov) - 1) < 5 * math.sqrt(2) * se)
    assert np.all(np.abs(cov - np.diag(np.diag(cov))) < 5 * se)
    assert np.asarray(idata.constant_data["hessian"]).shape == (3, D, D)


def _relevant_feature_tasks(n_tasks=7, n=30, seed=0):
    """Tasks in which every feature matters (no flat direction of the likelihood)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_tasks):
        x = rng.normal(size=(n, D))
        a = rng.uniform(0.5, 2.0, D)
        y = np.sin(a[0] * x[:, 0]) + np.cos(a[1] * x[:, 1]) * x[:, 2] * a[2]
        out.append((x, y + 0.05 * rng.normal(size=n)))
    return out


# at mu = lambda = 1e-10 the basis solve's matrix A/T + lambda I is near singular in the
# directions no task constrains: the jitter helper's first step (1e-10 x its mean diagonal) is
# expected, and far below the tolerances asserted
@pytest.mark.filterwarnings("ignore::models.linalg_jax.JitterWarning")
def test_k_equal_d_limit_predicts_as_individual_gps():
    """k = d, mu = lambda = 1e-10, no smoothing, no line search: L s_t reconstructs every
    task's log theta_hat (more tasks than k, so the online basis must keep all of them), and
    GP-ELLA predicts as individual GPs do: to 1e-5 relative with the default alternations
    per task (measured: up to 1.5e-7 on theta and on the predictions), to 1e-7 with five and
    no early stop (measured: 5e-8 on theta, 4.5e-8 on the predictive variance; twenty
    alternations give 2e-8: the alternations converge slowly at mu = lambda = 1e-10). The
    expansions are at minima (converged fits, no negative curvature)."""
    tasks = _relevant_feature_tasks()
    ind = IndividualGPs()
    for t, (x, y) in enumerate(tasks):
        ind.update(Batch(x, y, task_id=t))
    xs = np.random.default_rng(5).normal(size=(11, D))
    for extra, tol in (({}, 1e-5), ({"max_inner_iterations": 5, "inner_tolerance": 1e-12}, 1e-7)):
        g = GPELLA(num_components=D, mu=1e-10, lam=1e-10, smoothing=False, line_search=False,
                   **extra)
        for t, (x, y) in enumerate(tasks):
            g.update(Batch(x, y, task_id=t))
        diag = g.diagnostics()
        assert diag["fit_converged_fraction"] == 1.0 and diag["hessian_negative_fraction"] == 0
        assert diag["theta_clipped_fraction"] == 0.0
        np.testing.assert_allclose(g.reconstructed_thetas(), g.fitted_thetas(), rtol=tol)
        for t in range(len(tasks)):
            a, b = g.predict(xs, t), ind.predict(xs, t)
            np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=tol * np.std(b.mean))
            np.testing.assert_allclose(a.variance, b.variance, rtol=tol)


def test_line_search_conditions_on_the_fit_part_and_scores_the_held_out_part():
    """Sect. 4.4's line search: the learner's sigma_f^2 is the grid point with the least
    squared error on the held-out 20 % of the task's training data, predicted by the GP with
    kernel L s_t conditioned on the other 80 % (the fit itself saw all training data, as in
    the paper: the held-out part is held out at prediction)."""
    from inference.gp_ella import line_search_signal_variance
    from ppl_cl.learners.gp_ella import heldout_split_of

    tasks = _tasks(3, n=25)
    g = _small()
    for t, (x, y) in enumerate(tasks):
        g.update(Batch(x, y, task_id=t))
    c = g.config
    for slot in range(3):
        fit_idx, val_idx = heldout_split_of(g._store, slot, c)
        assert len(val_idx) == 5 and not set(fit_idx) & set(val_idx)
        assert len(fit_idx) + len(val_idx) == 25
        X, y = g._store.X[slot], g._store.y[slot]
        ratios = 10.0 ** np.linspace(*c.line_search_log10_range, c.line_search_points)
        base = g._fits[slot]["signal_variance"]
        best, sse = line_search_signal_variance(
            g.reconstructed_thetas()[slot], g._fits[slot]["noise_variance"], base,
            X[fit_idx], y[fit_idx], X[val_idx], y[val_idx], ratios)
        assert g.signal_variance(slot) == best
        assert np.isclose(best / base, ratios[np.argmin(sse)])


def test_smoothing_ablations_share_the_learned_model():
    """predict(smoothing=False) is GP-ELLA with the task's own kernel; individual GPs with
    smoothing and a uniform scale average the predictions of every task's fitted kernel on
    the task's own data (each with the task's sigma_f^2); the held-out scale is a grid value."""
    from inference.gp_ella import effective_number_of_tasks
    from ppl_cl.learners.gp_ella_baselines import _gp_predict

    tasks = _tasks(4)
    g = _small(smoothing_scale="fixed", smoothing_variance=1e300)
    ind = IndividualGPs(max_iterations=20, smoothing_scale="fixed", smoothing_variance=1e300)
    for t, (x, y) in enumerate(tasks):
        g.update(Batch(x, y, task_id=t))
        ind.update(Batch(x, y, task_id=t))
    xs = tasks[1][0][:6]
    assert not np.allclose(g.predict(xs, 1, smoothing=False).mean, g.predict(xs, 1).mean)
    np.testing.assert_allclose(g.smoother().weights(1), 0.25, rtol=1e-12)
    X, y = ind._store.X[1], ind._store.y[1]
    _, sf2, s2 = ind._hyp[1]
    means = [_gp_predict(th, sf2, s2, X, y, xs, 16)[0] for th, _, _ in ind._hyp]
    np.testing.assert_allclose(ind.predict(xs, 1, smoothing=True).mean,
                               np.mean(means, axis=0) + ind._store.y_mean[1], rtol=1e-10)
    np.testing.assert_allclose(ind.predict(xs, 1).mean, means[1] + ind._store.y_mean[1],
                               rtol=1e-10)
    h = _small(smoothing_scale="heldout")
    for t, (x, y) in enumerate(tasks):
        h.update(Batch(x, y, task_id=t))
    sm = h.smoother()
    assert sm.variance in set(sm.grid) and len(sm.heldout_sse) == len(sm.grid)
    assert 1.0 <= effective_number_of_tasks(sm.weights(0)) <= 4.0
    # the median rule (default): v = ratio * median / 2, ratio 0 and inf are its limits
    from inference.gp_ella import median_squared_distance

    for ratio in (0.0, 2.0, np.inf):
        m = _small(smoothing_ratio=ratio)
        for t, (x, y) in enumerate(tasks):
            m.update(Batch(x, y, task_id=t))
        half = 0.5 * median_squared_distance(m.reconstructions())
        assert m.smoother().variance == (np.inf if ratio == np.inf else ratio * half)
    np.testing.assert_allclose(m.smoother().weights(2), 0.25)


def test_individual_gps_predict_like_exact_gp_with_the_same_hyperparameters():
    from ppl_cl.learners.exact_gp import ExactGP

    x, y = _tasks(1)[0]
    ind = IndividualGPs(max_iterations=20)
    ind.update(Batch(x, y, task_id=0))
    h = ind.hyperparameters(0)
    gp = ExactGP(kernel="se-ard")
    gp.load_state_dict({"X": x, "y": y - y.mean(), "hyperparameters": {
        "variance": np.asarray(h["signal_variance"]), "lengthscale": h["theta"] ** -0.5,
        "noise_variance": np.asarray(h["noise_variance"])}})
    xs = np.random.default_rng(3).normal(size=(6, D))
    a, b = ind.predict(xs, 0), gp.predict(xs)
    np.testing.assert_allclose(a.mean, b.mean + y.mean(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(a.variance, b.variance, rtol=1e-8)


@pytest.mark.parametrize("cls,kw", [(SharedGP, {"max_train": 50}),
                                    (MultiTaskGP, {"rank": 2, "max_train": 50}),
                                    (LinearELLA, {"num_components": 2}),
                                    (IndividualGPs, {})])
def test_baselines_follow_the_protocol(cls, kw, tmp_path):
    tasks = _tasks(3, n=15)
    learner = cls(max_iterations=10, **kw) if cls is not LinearELLA else cls(**kw)
    with pytest.raises(NotFittedError):
        learner.predict(tasks[0][0], 0)
    for t in range(3):
        learner.update(Batch(*tasks[t], task_id=t))
    p = learner.predict(tasks[2][0], 2)
    assert p.mean.shape == (15,) and np.all(p.variance > 0) and np.all(np.isfinite(p.mean))
    learner.save(tmp_path / "b.npz")
    again = cls.load(tmp_path / "b.npz")
    np.testing.assert_allclose(again.predict(tasks[2][0], 2).mean, p.mean, rtol=1e-10)
    with pytest.raises(ValueError, match="unknown task"):
        learner.predict(tasks[0][0], 5)
    assert learner.to_inference_data() is not None


def test_linear_ella_recovers_linear_tasks():
    """Linear factorized tasks (the synthetic set's model): ELLA with the right k beats a
    constant predictor by far."""
    from ppl_cl.data.synthetic import ella_linear_tasks

    data = ella_linear_tasks(n_tasks=15, n_per_task=40, dim=5, n_latent=2, noise_std=0.1,
                             bias_feature=False, seed=0)
    e = LinearELLA(num_components=2, mu=math.exp(-12), lam=math.exp(-12))
    for t, (x, y) in enumerate(data.tasks):
        e.update(Batch(x, y, task_id=t))
    err = np.mean([np.mean((e.predict(x, t).mean - y) ** 2) for t, (x, y) in enumerate(data.tasks)])
    var = np.mean([np.var(y) for _, y in data.tasks])
    assert err < 0.05 * var


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="num_components"):
        GPELLAConfig(num_components=0)
    with pytest.raises(ValueError, match="holdout_fraction"):
        GPELLAConfig(holdout_fraction=1.5)
    with pytest.raises(ValueError, match="hessian"):
        GPELLAConfig(hessian="numeric")
    with pytest.raises(TypeError, match="config"):
        GPELLA(config=object())
    g = GPELLA(GPELLAConfig(mu=0.5), lam=0.25)
    assert g.config.mu == 0.5 and g.config.lam == 0.25
