"""Type-II ML engine against scikit-learn's GaussianProcessRegressor (an independent code)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process import kernels as sk

from inference.type2ml import NonFiniteObjectiveError, fit_type2ml
from models.exact_gp import GPRegressionParams, log_marginal_likelihood
from models.kernels_jax import SquaredExponential

rng = np.random.default_rng(1)
X = rng.uniform(0, 5, size=(60, 2))
y = np.sin(2 * X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=60)


def _params(v, ls, noise):
    return GPRegressionParams(SquaredExponential(v, jnp.asarray(ls)), jnp.asarray(noise))


def _sk_kernel(v, ls, noise):
    return (sk.ConstantKernel(v, "fixed") * sk.RBF(ls, "fixed") + sk.WhiteKernel(noise, "fixed"))


def test_gradient_matches_sklearn_analytic_gradient():
    """sklearn differentiates the log marginal likelihood analytically (R&W eq. 5.9) w.r.t.
    log-hyperparameters; we use autodiff through the Cholesky."""
    v, ls, noise = 1.4, np.array([0.6, 2.0]), 0.07
    kernel = (sk.ConstantKernel(v) * sk.RBF(ls) + sk.WhiteKernel(noise))
    gpr = GaussianProcessRegressor(kernel, alpha=0.0, optimizer=None).fit(X, y)
    lml_ref, grad_ref = gpr.log_marginal_likelihood(gpr.kernel_.theta, eval_gradient=True)

    def lml_of_log(raw):
        p = _params(jnp.exp(raw[0]), jnp.exp(raw[1:3]), jnp.exp(raw[3]))
        return log_marginal_likelihood(p, jnp.asarray(X), jnp.asarray(y))

    raw = jnp.log(jnp.array([v, *ls, noise]))
    lml, grad = jax.value_and_grad(lml_of_log)(raw)
    np.testing.assert_allclose(float(lml), lml_ref, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(grad), grad_ref, rtol=1e-7)


def test_optimum_at_least_as_good_as_sklearn():
    kernel = sk.ConstantKernel(1.0) * sk.RBF([1.0, 1.0]) + sk.WhiteKernel(0.1, (1e-6, 1e5))
    gpr = GaussianProcessRegressor(kernel, alpha=0.0, n_restarts_optimizer=0).fit(X, y)
    best_ref = gpr.log_marginal_likelihood_value_
    Xj, yj = jnp.asarray(X), jnp.asarray(y)
    res = fit_type2ml(lambda p: -log_marginal_likelihood(p, Xj, yj), _params(1.0, [1.0, 1.0], 0.1))
    assert res.converged, res.message
    assert -res.value >= best_ref - 1e-6
    # and the optimum is a stationary point (sklearn's gradient there ~ 0)
    k = res.params.kernel
    theta = np.log([float(k.variance), *np.asarray(k.lengthscale), float(res.params.noise_variance)])
    _, g = gpr.log_marginal_likelihood(theta, eval_gradient=True)
    assert np.abs(g).max() < 1e-3


def test_lower_bound_is_respected():
    Xj, yj = jnp.asarray(X), jnp.asarray(2.0 * X[:, 0])  # noiseless: optimum wants noise -> 0
    init = _params(1.0, [1.0, 1.0], 0.1)
    floor = GPRegressionParams(jax.tree_util.tree_map(lambda _: 0.0, init.kernel), 1e-3)
    res = fit_type2ml(lambda p: -log_marginal_likelihood(p, Xj, yj), init, lower_bounds=floor)
    assert float(res.params.noise_variance) >= 1e-3 * (1 - 1e-12)
    np.testing.assert_allclose(float(res.params.noise_variance), 1e-3, rtol=1e-6)


def test_non_finite_start_raises():
    with pytest.raises(NonFiniteObjectiveError, match="initial hyperparameters"):
        fit_type2ml(lambda p: jnp.log(-p["a"]), {"a": jnp.asarray(1.0)})


# -- parametrizations ------------------------------------------------------------------------
def test_bijectors_are_gpflows_transforms():
    """Softplus (+ shift) and the sigmoid box are GPflow's / TensorFlow Probability's maps
    (``positive(lower)``, ``Sigmoid(low, high)``); inverse and derivative are consistent."""
    from inference.type2ml import Exp, SigmoidBox, Softplus, gpflow_parametrization

    raw = np.array([-40.0, -3.0, -0.2, 0.0, 0.7, 5.0, 40.0])
    sp = Softplus(1e-6)
    np.testing.assert_allclose(sp.forward(raw), np.log1p(np.exp(raw)) + 1e-6, rtol=1e-12)
    box = SigmoidBox(1e-6, 2e3)
    np.testing.assert_allclose(box.forward(raw), 1e-6 + (2e3 - 1e-6) / (1 + np.exp(-raw)),
                               rtol=1e-12)
    assert np.all(box.forward(raw) >= 1e-6) and np.all(box.forward(raw) <= 2e3)
    for t, x in ((sp, raw[1:-1]), (box, raw[1:-1]), (Exp(), raw[1:-1])):
        np.testing.assert_allclose(t.inverse(t.forward(x)), x, rtol=1e-9, atol=1e-9)
        h = 1e-6
        fd = (t.forward(x + h) - t.forward(x - h)) / (2 * h)
        np.testing.assert_allclose(t.derivative(x), fd, rtol=1e-6)
    tr = gpflow_parametrization(_params(1.0, [1.0], 0.1), variance_bounds=(1e-6, 2e3))
    assert tr.kernel.variance == SigmoidBox(1e-6, 2e3)
    assert tr.kernel.lengthscale == Softplus() and tr.noise_variance == Softplus(1e-6)
    assert gpflow_parametrization(_params(1.0, [1.0], 0.1)).kernel.variance == Softplus()


def test_inverses_are_finite_at_the_floor_and_the_box_ends():
    """A fit that leaves the noise at its floor (raw below -50: softplus underflows next to the
    shift) hands the next batch a value equal to the shift; its raw start must be finite (an
    infinite start made L-BFGS-B's steps NaN on naval) and map back to the same value."""
    from inference.type2ml import SigmoidBox, Softplus

    sp, box = Softplus(1e-6), SigmoidBox(1e-6, 2e3)
    for t, ends in ((sp, [1e-6]), (box, [1e-6, 2e3])):
        raw = t.inverse(np.asarray(ends))
        assert np.all(np.isfinite(raw)), (t, raw)
        np.testing.assert_allclose(t.forward(raw), ends, rtol=1e-12)
    assert sp.inverse(sp.forward(-80.0)) < -700          # underflowed: at the floor, finite


def test_both_parametrizations_reach_the_one_optimum_of_a_unimodal_likelihood():
    from inference.type2ml import gpflow_parametrization

    data = (jnp.asarray(X), jnp.asarray(y))
    p0 = _params(1.0, np.array([1.0, 1.0]), 0.1)
    from models.exact_gp import negative_log_marginal_likelihood as nlml

    a = fit_type2ml(nlml, p0, data=data)
    b = fit_type2ml(nlml, p0, data=data, transforms=gpflow_parametrization(p0))
    np.testing.assert_allclose(a.value, b.value, rtol=1e-7)
    np.testing.assert_allclose(np.asarray(a.params.kernel.lengthscale),
                               np.asarray(b.params.kernel.lengthscale), rtol=1e-3)
    with pytest.raises(ValueError, match="transforms"):
        fit_type2ml(nlml, p0, data=data, transforms=gpflow_parametrization(p0),
                    lower_bounds=p0)


def test_each_point_is_evaluated_once_the_start_included(monkeypatch):
    """The finiteness check at the start and L-BFGS-B's first call share one evaluation: no
    two consecutive evaluations are at the same hyperparameters, and there are exactly as many
    as SciPy counts."""
    import scipy.optimize

    import inference.type2ml as t2

    seen, nfev = [], []
    vg = t2._jitted_value_and_grad

    def counting(objective):
        f = vg(objective)

        def g(params, *data):
            seen.append(np.concatenate([np.ravel(np.asarray(x))
                                        for x in jax.tree_util.tree_leaves(params)]))
            return f(params, *data)
        return g

    minimize = scipy.optimize.minimize

    def spy(*args, **kwargs):
        res = minimize(*args, **kwargs)
        nfev.append(res.nfev)
        return res

    monkeypatch.setattr(t2, "_jitted_value_and_grad", counting)
    monkeypatch.setattr(scipy.optimize, "minimize", spy)
    Xj, yj = jnp.asarray(X), jnp.asarray(y)
    fit_type2ml(lambda p: -log_marginal_likelihood(p, Xj, yj), _params(1.0, [1.0, 1.0], 0.1))
    assert len(seen) == nfev[0] >= 2
    assert all(not np.array_equal(a, b) for a, b in zip(seen, seen[1:]))
