"""PG-VI: the bound against the log marginal likelihood, monotone natural-gradient ascent, the
inducing = data limit against Gibbs, and the minibatch fixed point."""

import math

import numpy as np
import pytest
import torch

from inference.pg_gibbs import PGGibbs, pad_problems
from inference.pg_vi import PGVI, VIBatch
from models.gp_tree import (NaturalParams, NodeKernelParams, gibbs_predictive, natural_to_moments,
                            node_gram, node_kernel, sigmoid_expectation, vi_predictive)
from models.linalg_torch import jitter_cholesky

pytestmark = pytest.mark.usefixtures("one_torch_thread")
D = torch.float64


def _node(n=8, seed=0, s=4.0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 2, dtype=D, generator=g)
    y = (X[:, 0] + 0.5 * torch.randn(n, dtype=D, generator=g) > 0).long()
    params = NodeKernelParams(torch.tensor(s, dtype=D), torch.tensor(1.0, dtype=D), 1e-2)
    return X, y, params


def _full_batch(X, y, params, Z=None):
    Z = X if Z is None else Z
    k = node_kernel(params)
    K_mm = node_gram(params, Z)
    return VIBatch(K_mm, k(Z, X), k.diag(X), y.to(D) - 0.5, torch.arange(X.shape[0]), X.shape[0])


def _log_marginal_importance(X, y, params, q_mean, q_cov, num=400000, seed=0):
    """log p(y | X) = log E_r[p(y | f) N(f | 0, K) / r(f)], r = N(q_mean, 1.5^2 q_cov) (an
    over-dispersed proposal); returns the estimate and its standard error (delta method)."""
    g = torch.Generator().manual_seed(seed)
    K = node_gram(params, X)
    r = torch.distributions.MultivariateNormal(q_mean, 2.25 * q_cov)
    f = r.mean + (torch.randn(num, X.shape[0], dtype=D, generator=g) @ r.scale_tril.T)
    prior = torch.distributions.MultivariateNormal(torch.zeros(X.shape[0], dtype=D), K)
    yy = y.to(D)
    loglik = (yy * f - torch.nn.functional.softplus(f)).sum(-1)
    logw = loglik + prior.log_prob(f) - r.log_prob(f)
    m = logw.max()
    w = torch.exp(logw - m)
    est = float(m + torch.log(w.mean()))
    se = float(w.std() / (w.mean() * math.sqrt(num)))
    return est, se


def test_elbo_increases_and_stays_below_log_marginal():
    X, y, params = _node()
    batch = _full_batch(X, y, params)
    for lr in (1.0, 0.3):
        engine = PGVI(learning_rate=lr)
        state = engine.init(None, X.shape[0], X.shape[0])
        elbos = [float(PGVI.elbo(state, batch))]
        for _ in range(60):
            state, info = engine.step(None, state, batch)
            elbos.append(float(info.elbo))
        assert np.all(np.diff(elbos) > -1e-9), (lr, np.diff(elbos).min())
        assert elbos[-1] > elbos[0] + 1.0
    q = natural_to_moments(NaturalParams(state.eta, state.H))
    # with inducing = data, q(fbar) is q(f)
    cov = torch.cholesky_inverse(q.Lp)
    logp, se = _log_marginal_importance(X, y, params, q.mean, cov)
    gap = logp - elbos[-1]
    assert gap > -4 * se, (logp, elbos[-1], se)
    assert gap < 1.0                         # a tight bound on a small, easy node


def test_wrong_sign_in_the_bound_would_break_the_ordering():
    """Power check: the bound with the opposite labels is far below the true log marginal."""
    X, y, params = _node()
    engine = PGVI(learning_rate=1.0)
    state = engine.init(None, 8, 8)
    for _ in range(30):
        state, _ = engine.step(None, state, _full_batch(X, y, params))
    wrong = float(PGVI.elbo(state, _full_batch(X, 1 - y, params)))
    right = float(PGVI.elbo(state, _full_batch(X, y, params)))
    assert wrong < right - 2.0


def test_vi_with_inducing_equal_data_matches_gibbs_predictive():
    X, y, params = _node(n=10, seed=3)
    Xs = torch.randn(30, 2, dtype=D, generator=torch.Generator().manual_seed(4))
    engine = PGVI(learning_rate=1.0)
    state = engine.init(None, 10, 10)
    batch = _full_batch(X, y, params)
    for _ in range(100):
        state, _ = engine.step(None, state, batch)
    k = node_kernel(params)
    L = jitter_cholesky(node_gram(params, X))
    q = natural_to_moments(NaturalParams(state.eta, state.H))
    m, v = vi_predictive(L, q, k(X, Xs), k.diag(Xs))
    p_vi = sigmoid_expectation(m, v)
    gibbs = PGGibbs(num_chains=50)
    problem = pad_problems([node_gram(params, X)], [y.to(D) - 0.5])
    st, _, draws = gibbs.run(problem, 120, seed=0, keep=True)
    om = draws["omega"][20:, 0].reshape(-1, 10)
    mg, vg = gibbs_predictive(node_gram(params, X), om, (y.to(D) - 0.5).expand_as(om), k(X, Xs), k.diag(Xs))
    p_gibbs = sigmoid_expectation(mg, vg).mean(0)
    # the mean-field bound is an approximation: the predictive probabilities agree to 0.05
    np.testing.assert_allclose(p_vi.numpy(), p_gibbs.numpy(), atol=0.05)
    assert float((p_vi - p_gibbs).abs().mean()) < 0.02


def test_minibatch_steps_reach_the_full_batch_fixed_point():
    """With rho = 1 on the full batch the update is the optimum for the current c; minibatch
    natural-gradient steps with a small rho average to the same q(fbar)."""
    X, y, params = _node(n=40, seed=5)
    Z = X[::4]
    full = _full_batch(X, y, params, Z)
    exact = PGVI(1.0)
    s = exact.init(None, 40, Z.shape[0])
    for _ in range(100):
        s, _ = exact.step(None, s, full)
    k = node_kernel(params)
    sgd = PGVI(0.05)
    t = sgd.init(None, 40, Z.shape[0])
    g = torch.Generator().manual_seed(0)
    K_mm = node_gram(params, Z)
    for _ in range(1500):
        idx = torch.randperm(40, generator=g)[:10]
        b = VIBatch(K_mm, k(Z, X[idx]), k.diag(X[idx]), y[idx].to(D) - 0.5, idx, 40)
        t, _ = sgd.step(None, t, b)
    e_full = float(PGVI.elbo(s, full))
    e_sgd = float(PGVI.elbo(t, full))
    assert e_sgd == pytest.approx(e_full, abs=0.05 * abs(e_full))
    assert e_sgd <= e_full + 1e-6


def _central_difference(f, x, h=1e-6):
    """``df/dx`` by central differences, entry by entry (float64)."""
    x = x.detach().clone()
    grad = torch.zeros_like(x)
    flat, gflat = x.view(-1), grad.view(-1)
    for i in range(flat.numel()):
        old = float(flat[i])
        flat[i] = old + h
        up = float(f(x))
        flat[i] = old - h
        down = float(f(x))
        flat[i] = old
        gflat[i] = (up - down) / (2 * h)
    return grad


def _sparse_problem():
    """A node of 12 points, 5 inducing inputs off the data, a minibatch of 7, and a state a few
    minibatch steps away from the initial one (so that nothing is at a symmetric start)."""
    X, y, params = _node(n=12, seed=7)
    g = torch.Generator().manual_seed(8)
    Z = torch.randn(5, 2, dtype=D, generator=g)
    index = torch.tensor([0, 2, 3, 5, 8, 9, 11])
    engine = PGVI(0.4)
    state = engine.init(None, 12, 5)
    for _ in range(3):
        state, _ = engine.step(None, state, _batch(X, y, params, Z, index))
    return X, y, params, Z, index, state


def _batch(X, y, params, Z, index):
    k = node_kernel(params)
    return VIBatch(node_gram(params, Z), k(Z, X[index]), k.diag(X[index]),
                   y[index].to(D) - 0.5, index, X.shape[0])


@pytest.mark.parametrize("update_c", [True, False])
def test_elbo_gradient_matches_central_differences(update_c):
    """d ELBO / d (lengthscale, outputscale, inducing inputs) by autograd against central
    differences of PGVI.elbo (float64). With ``update_c`` the bound re-optimizes ``c`` (eq. 16)
    at every perturbed point but autograd holds it fixed: the two agree because ``c`` is the
    bound's maximizer (envelope theorem), so this also checks eq. 16's optimality."""
    X, y, params, Z, index, state = _sparse_problem()

    def elbo(ls, s, Zv):
        p = params._replace(lengthscale=ls, outputscale=s)
        return PGVI.elbo(state, _batch(X, y, p, Zv, index), update_c=update_c)

    ls = params.lengthscale.clone().requires_grad_(True)
    s = params.outputscale.clone().requires_grad_(True)
    Zg = Z.clone().requires_grad_(True)
    g_ls, g_s, g_Z = torch.autograd.grad(elbo(ls, s, Zg), (ls, s, Zg))
    with torch.no_grad():
        fd_ls = _central_difference(lambda v: elbo(v, params.outputscale, Z), params.lengthscale)
        fd_s = _central_difference(lambda v: elbo(params.lengthscale, v, Z), params.outputscale)
        fd_Z = _central_difference(lambda v: elbo(params.lengthscale, params.outputscale, v), Z)
    assert float(g_ls.abs()) > 1e-2 and float(g_s.abs()) > 1e-2   # not a vanishing gradient
    np.testing.assert_allclose(g_ls.numpy(), fd_ls.numpy(), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(g_s.numpy(), fd_s.numpy(), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(g_Z.numpy(), fd_Z.numpy(), rtol=1e-5, atol=1e-8)


def test_step_loss_gradient_is_the_bound_at_the_new_state():
    """A step's ``loss`` is ``-ELBO / n`` at the stepped ``q(fbar)`` and the ``c`` of the step,
    both held fixed: its autograd gradient in the lengthscale equals central differences of
    ``-PGVI.elbo(new state, update_c=False) / n``."""
    X, y, params, Z, index, state = _sparse_problem()
    ls = params.lengthscale.clone().requires_grad_(True)
    new, info = PGVI(0.4).step(None, state, _batch(X, y, params._replace(lengthscale=ls), Z,
                                                   index))
    (g,) = torch.autograd.grad(info.loss, ls)
    with torch.no_grad():
        np.testing.assert_allclose(float(info.loss), -float(PGVI.elbo(
            new, _batch(X, y, params, Z, index), update_c=False)) / 12, rtol=1e-12)
        fd = _central_difference(lambda v: -PGVI.elbo(
            new, _batch(X, y, params._replace(lengthscale=v), Z, index), update_c=False) / 12,
            params.lengthscale)
    assert float(g.abs()) > 1e-4
    np.testing.assert_allclose(g.numpy(), fd.numpy(), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("rho", [1.0, 0.3])
def test_natural_gradient_step_is_the_gradient_in_the_mean_parameters(rho):
    """For a Gaussian q the natural gradient in ``(eta, H)`` is the ordinary gradient in the
    mean parameters ``(mu, Sigma + mu mu^T)``. Autograd of the bound (at the step's ``c``, i.e.
    eq. 16 at the current q) in the mean parameters gives it independently of eq. 17's closed
    form; one step must be ``(eta, H) + rho * gradient``."""
    from models.gp_tree import VIMoments, optimal_c, pg_vi_elbo, vi_marginals

    X, y, params, Z, index, state = _sparse_problem()
    batch = _batch(X, y, params, Z, index)
    L_mm = jitter_cholesky(batch.K_mm)
    q = natural_to_moments(NaturalParams(state.eta, state.H))
    c = optimal_c(vi_marginals(L_mm, batch.K_mb, batch.k_bb, q))
    cov = torch.cholesky_inverse(q.Lp)
    m1 = q.mean.clone().requires_grad_(True)
    m2 = (cov + torch.outer(q.mean, q.mean)).clone().requires_grad_(True)
    S = m2 - torch.outer(m1, m1)
    S = 0.5 * (S + S.T)
    moments = VIMoments(m1, torch.linalg.cholesky(torch.linalg.inv(S)))
    g1, g2 = torch.autograd.grad(pg_vi_elbo(L_mm, batch.K_mb, batch.k_bb, batch.kappa, c,
                                            moments, batch.num_data), (m1, m2))
    g2 = 0.5 * (g2 + g2.T)                  # the gradient along symmetric directions
    new, _ = PGVI(rho).step(None, state, batch)
    assert float(g1.abs().max()) > 1e-2     # the state is not already the fixed point
    np.testing.assert_allclose(new.eta.numpy(), (state.eta + rho * g1).numpy(),
                               rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(new.H.numpy(), (state.H + rho * g2).numpy(), rtol=1e-8,
                               atol=1e-9)
    np.testing.assert_array_equal(new.c[index].numpy(), c.numpy())


def test_bad_learning_rate():
    with pytest.raises(ValueError, match="learning_rate"):
        PGVI(0.0)


def test_vi_engine_follows_the_engine_contract():
    from inference.base import Engine, is_state

    engine = PGVI(0.5)
    assert isinstance(engine, Engine)
    X, y, params = _node()
    state = engine.init(None, 8, 8)
    new, info = engine.step(None, state, _full_batch(X, y, params))
    assert is_state(state) and is_state(new)
