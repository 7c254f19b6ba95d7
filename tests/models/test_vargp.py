"""Validation of the VAR-GP model and guide (issue 3, item 4) against independent references:
the exact GP marginal likelihood (limit case), ancestral sampling of the auto-regressive guide,
Monte Carlo estimates of the KL terms, Pyro's own sparse-GP conditional, and the reductions of
the ablations. Monte Carlo tolerances are k standard errors of the estimate."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import TraceMeanField_ELBO

from models.vargp import (GaussianLikelihood, HyperPosterior, InducingSet, PointHyperparameters,
                          SoftmaxLikelihood,
                          VARGPModel, f_marginals_of_state,
                          init_inducing_set, predictive_probabilities)
from models.vargp_math import (autoregressive_joint, autoregressive_kl,
                               block_diagonal_expected_kl, concat_inducing_inputs,
                               cross_covariance, gaussian_kl,
                               kernel_from_theta, kernel_theta, previous_posterior_term,
                               prior_cholesky,
                               task_slices)

DT = torch.float64
K_SE = 5.0  # standard errors allowed for Monte Carlo comparisons


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _random_set(K, M, D, *, shift=0.0, gen=None, Kz=None) -> InducingSet:
    """An inducing set with a random mean and a random (well-conditioned) lower factor."""
    Kz = K if Kz is None else Kz
    Z = torch.randn(Kz, M, D, generator=gen, dtype=DT) + shift
    m = torch.randn(K, M, generator=gen, dtype=DT)
    A = 0.3 * torch.randn(K, M, M, generator=gen, dtype=DT)
    L = torch.tril(A, -1) + torch.diag_embed(0.5 + torch.rand(K, M, generator=gen, dtype=DT))
    return InducingSet(Z, m, L)


def _theta(H, D, S=1, gen=None):
    return 0.3 * torch.randn(S, 1, H, D + 1, generator=gen, dtype=DT)


def _kernel_dense(theta, X1, X2):
    """Independent ARD SE kernel: gamma exp(-1/2 sum_d (x_d - y_d)^2 / l_d^2)."""
    gamma = theta[..., 0].exp()
    ell = theta[..., 1:].exp()
    diff = (X1[..., :, None, :] - X2[..., None, :, :]) / ell[..., None, None, :]
    return gamma[..., None, None] * torch.exp(-0.5 * (diff ** 2).sum(-1))


def _set_params(sets_values: dict):
    """Write constrained values into the param store (creating the params)."""
    store = pyro.get_param_store()
    for name, value in sets_values.items():
        store[name] = value  # ParamStoreDict stores the unconstrained value via the constraint


def _elbo(model: VARGPModel, *args, particles=1, grad=False, **kwargs) -> torch.Tensor:
    value = -TraceMeanField_ELBO(num_particles=particles, max_plate_nesting=3).differentiable_loss(
        model.model, model.guide, *args, **kwargs)
    return value if grad else value.detach()


# ---------------------------------------------------------------------------------------------
# limit case: Gaussian likelihood, Z = X, exact q(u) -> ELBO = log p(y)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("guide", ["autoregressive", "block_diagonal", "global"])
def test_elbo_equals_exact_log_marginal_likelihood_in_the_limit(guide):
    gen = torch.Generator().manual_seed(1)
    N, D, noise = 12, 2, 0.3
    X = torch.rand(N, D, generator=gen, dtype=DT) * 4
    y = torch.sin(X.sum(-1)) + 0.2 * torch.randn(N, generator=gen, dtype=DT)
    theta = torch.tensor([[0.4, 0.1, -0.2]], dtype=DT)                     # (H=1, D+1)
    Kxx = _kernel_dense(kernel_theta(theta)[0], X, X)   # the model's amplitude: gamma^2
    # exact posterior of u = f(X): mean K (K + s2 I)^-1 y, cov K - K (K + s2 I)^-1 K
    C = torch.linalg.cholesky(Kxx + noise * torch.eye(N, dtype=DT))
    mean = Kxx @ torch.cholesky_solve(y[:, None], C)[:, 0]
    cov = Kxx - Kxx @ torch.cholesky_solve(Kxx, C)
    cov = 0.5 * (cov + cov.T)
    exact = dist.MultivariateNormal(torch.zeros(N, dtype=DT), scale_tril=C).log_prob(y)

    init = InducingSet(X[None].clone(), mean[None].clone(),
                       torch.linalg.cholesky(cov)[None].clone())
    model = VARGPModel(num_classes=1, past=[], init=init,
                       hyper_init=PointHyperparameters(theta), guide=guide,
                       likelihood=GaussianLikelihood(noise), jitter=0.0)
    elbo = _elbo(model, X, y)
    # a single particle: the bound has no Monte Carlo error here (analytic KL, exact expectation)
    assert torch.allclose(elbo, exact, rtol=0, atol=1e-8), (float(elbo), float(exact))

    # and any other q(u) gives a strictly smaller bound
    pyro.get_param_store()["inducing_mean"] = mean[None] + 0.1
    assert float(_elbo(model, X, y)) < float(exact) - 1e-4


# ---------------------------------------------------------------------------------------------
# eq. 22: closed-form joint vs ancestral sampling
# ---------------------------------------------------------------------------------------------
def test_closed_form_joint_matches_ancestral_samples():
    gen = torch.Generator().manual_seed(2)
    K, D, Ms = 2, 3, (3, 2, 3)
    sets = [_random_set(K, M, D, shift=0.3 * i, gen=gen) for i, M in enumerate(Ms)]
    theta = _theta(1, D, gen=gen)
    jitter = 1e-6
    mu, Sigma = autoregressive_joint(theta, sets, jitter)
    mu, Sigma = mu[0, 0], Sigma[0, 0]                                     # (K, M), (K, M, M)

    # ancestral sampling with A_j = K_{j,<j} K_{<j,<j}^{-1} computed independently (dense solve)
    Zall = concat_inducing_inputs(sets)
    Kzz = _kernel_dense(theta[0, 0], Zall, Zall)                          # (K, M, M)
    Kzz = Kzz + jitter * torch.ones_like(theta[0, 0, :, 0])[:, None, None] * torch.eye(Kzz.shape[-1],
                                                                               dtype=DT)
    n = 200_000
    blocks = task_slices(sets)
    samples = []
    for s, b in zip(sets, blocks):
        eps = torch.randn(n, K, s.num_inducing, 1, generator=gen, dtype=DT)
        noise = (s.scale_tril @ eps)[..., 0]
        if b.start == 0:
            samples.append(s.mean + noise)
            continue
        past = torch.cat(samples, -1)                                     # (n, K, M_<j)
        A = torch.linalg.solve(Kzz[:, :b.start, :b.start], Kzz[:, :b.start, b]).transpose(-1, -2)
        samples.append((A @ past[..., None])[..., 0] + s.mean + noise)
    u = torch.cat(samples, -1)                                            # (n, K, M)

    emp_mean = u.mean(0)
    se_mean = u.std(0) / math.sqrt(n)
    assert ((emp_mean - mu).abs() <= K_SE * se_mean).all()
    centred = u - emp_mean
    prods = centred[..., :, None] * centred[..., None, :]                 # (n, K, M, M)
    emp_cov = prods.mean(0)
    se_cov = prods.std(0) / math.sqrt(n)
    assert ((emp_cov - Sigma).abs() <= K_SE * se_cov + 1e-12).all()


def test_whitened_marginal_of_f_equals_dense_eq22_computation():
    gen = torch.Generator().manual_seed(3)
    K, D = 3, 2
    sets = [_random_set(K, M, D, shift=0.5 * i, gen=gen) for i, M in enumerate((4, 3, 5))]
    theta = _theta(K, D, S=2, gen=gen)                                    # per-class hypers
    x = torch.randn(7, D, generator=gen, dtype=DT)
    jitter = 1e-8
    # the code's Block Diag. keeps the auto-regressive joint for f; the text's drops A_j
    assert all(torch.equal(a, b) for a, b in zip(
        f_marginals_of_state(x, sets, theta, guide="block_diagonal", jitter=jitter),
        f_marginals_of_state(x, sets, theta, guide="autoregressive", jitter=jitter)))
    for guide in ("autoregressive", "block_diagonal_joint"):
        f_loc, f_var = f_marginals_of_state(x, sets, theta, guide=guide, jitter=jitter)
        if guide == "autoregressive":
            mu, Sigma = autoregressive_joint(theta, sets, jitter)
        else:
            mu = torch.cat([s.mean for s in sets], -1).expand(2, 1, K, -1)
            Sigma = torch.block_diag(*[torch.zeros(s.num_inducing, s.num_inducing)
                                       for s in sets]).to(DT).repeat(K, 1, 1)
            for s, b in zip(sets, task_slices(sets)):
                Sigma[:, b, b] = s.scale_tril @ s.scale_tril.transpose(-1, -2)
        Z = concat_inducing_inputs(sets)
        for i in range(2):
            for k in range(K):
                th = theta[i, 0, k]
                Kzz = _kernel_dense(th, Z[k], Z[k]) + jitter * torch.eye(
                    Z.shape[1], dtype=DT)
                Kxz = _kernel_dense(th, x, Z[k])
                P = torch.linalg.solve(Kzz, Kxz.T).T                      # K_xz K_zz^-1
                mu_k = mu[i, 0, k]
                Sigma_k = Sigma[k] if Sigma.dim() == 3 else Sigma[i, 0, k]
                mean = P @ mu_k
                var = th[0].exp() - (P * Kxz).sum(-1) + ((P @ Sigma_k) * P).sum(-1)
                assert torch.allclose(f_loc[i, 0, k], mean, atol=1e-9)
                assert torch.allclose(f_var[i, 0, k], var, atol=1e-9)


@pytest.mark.parametrize("H", [1, 3], ids=["shared-theta", "per-class-theta"])
def test_cross_covariance_by_task_blocks_equals_the_concatenation(H):
    """``K_{Z,x}`` from the task blocks (what the model uses, so that frozen blocks take no
    gradient) equals ``K_{Z_<=t, x}`` from the concatenated inputs and the dense kernel, and
    has the same gradients with respect to the current block and theta."""
    gen = torch.Generator().manual_seed(11)
    K, D = 3, 4
    past = [_random_set(K, 5, D, gen=gen), _random_set(K, 3, D, gen=gen, Kz=1)]
    cur = _random_set(K, 4, D, gen=gen)
    Z_cur = cur.inducing_inputs.clone().requires_grad_(True)
    theta = _theta(H, D, S=2, gen=gen).requires_grad_(True)
    x = torch.randn(6, D, generator=gen, dtype=DT)
    sets = past + [cur._replace(inducing_inputs=Z_cur)]
    by_blocks = cross_covariance(kernel_from_theta(theta), [s.inducing_inputs for s in sets], x)
    Z = concat_inducing_inputs(sets)
    whole = cross_covariance(kernel_from_theta(theta), Z, x)
    assert by_blocks.shape == whole.shape == (2, 1, K, 12, 6)
    for i in range(2):
        for k in range(K):
            dense = _kernel_dense(theta[i, 0, min(k, H - 1)], Z[k], x)
            assert torch.allclose(by_blocks[i, 0, k], dense, rtol=1e-12, atol=1e-14)
    W = torch.randn(whole.shape, generator=gen, dtype=DT)
    g_blocks = torch.autograd.grad((by_blocks * W).sum(), (Z_cur, theta))
    g_whole = torch.autograd.grad((whole * W).sum(), (Z_cur, theta))
    for a, b in zip(g_blocks, g_whole):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_first_task_marginal_matches_pyro_sparse_gp_conditional():
    """At t = 1, q(f) is the plain SVGP marginal: compare with pyro.contrib.gp.util.conditional
    (another implementation: Pyro's RBF kernel and its conditional)."""
    from pyro.contrib.gp.kernels import RBF
    from pyro.contrib.gp.util import conditional

    gen = torch.Generator().manual_seed(4)
    K, D, M = 2, 3, 6
    s = _random_set(K, M, D, gen=gen, Kz=1)
    theta = _theta(1, D, gen=gen)
    x = torch.randn(9, D, generator=gen, dtype=DT)
    jitter = 1e-6
    f_loc, f_var = f_marginals_of_state(x, [s], theta, jitter=jitter)
    rbf = RBF(D, variance=theta[0, 0, 0, 0].exp().detach(),
              lengthscale=theta[0, 0, 0, 1:].exp().detach())
    Z = s.inducing_inputs[0]
    Kzz = rbf(Z).detach() + jitter * torch.eye(M, dtype=DT)
    loc, var = conditional(x, Z, rbf, s.mean, s.scale_tril, torch.linalg.cholesky(Kzz),
                           full_cov=False, whiten=False)
    assert torch.allclose(f_loc[0, 0], loc.detach(), atol=1e-10)
    assert torch.allclose(f_var[0, 0], var.detach(), atol=1e-10)


# ---------------------------------------------------------------------------------------------
# KL terms vs Monte Carlo
# ---------------------------------------------------------------------------------------------
def _two_task_model(guide, gen, K=2, D=2, hyperparameters="point"):
    past = [_random_set(K, 3, D, gen=gen)]
    cur = _random_set(K, 4, D, shift=0.4, gen=gen)
    theta = 0.2 * torch.randn(1, D + 1, generator=gen, dtype=DT)
    hyper = PointHyperparameters(theta) if hyperparameters == "point" else \
        HyperPosterior(theta, 0.1 + 0 * theta)
    model = VARGPModel(num_classes=K, past=past, init=cur, hyper_init=hyper, guide=guide,
                       likelihood=GaussianLikelihood(1.0) if K == 1 else SoftmaxLikelihood(2),
                       jitter=1e-6)
    return model, past, cur, theta


@pytest.mark.parametrize("guide", ["autoregressive", "block_diagonal"])
def test_inducing_kl_matches_monte_carlo(guide):
    """E_{q(u_<t|theta)} KL[q(u_t | u_<t) || p(u_t | u_<t)]: closed form vs the Monte Carlo mean of
    log q(u_t | u_<t) - log p(u_t | u_<t) over ancestral draws from the guide, and vs the analytic
    KL that TraceMeanField_ELBO uses in the program (one draw of u_<t)."""
    gen = torch.Generator().manual_seed(5)
    model, past, cur, theta = _two_task_model(guide, gen)
    th = kernel_theta(theta).expand(1, 1, *theta.shape)    # the model's kernel: gamma^2
    sets = [*past, cur]
    L = prior_cholesky(th, concat_inducing_inputs(sets), 1e-6)
    closed = (autoregressive_kl(L, cur, task_slices(sets)[-1]) if guide == "autoregressive"
              else block_diagonal_expected_kl(L, sets))[0, 0]             # (K,)

    # Monte Carlo over the program's own sites: guide draws u_1, u_2; score both densities
    n = 20_000
    x = torch.zeros(1, 2, dtype=DT)
    vals = []
    kl_sites = []
    for _ in range(n // 1000):
        with pyro.plate("mc", 1000, dim=-4):
            tr = pyro.poutine.trace(model.guide).get_trace(x)
            mt = pyro.poutine.trace(pyro.poutine.replay(model.model, trace=tr)).get_trace(x)
        q = tr.nodes["u_2"]["fn"].log_prob(tr.nodes["u_2"]["value"])
        p = mt.nodes["u_2"]["fn"].log_prob(tr.nodes["u_2"]["value"])
        vals.append((q - p).reshape(1000, -1))
        kl_sites.append(torch.distributions.kl_divergence(
            tr.nodes["u_2"]["fn"], mt.nodes["u_2"]["fn"]).reshape(1000, -1))
    vals = torch.cat(vals)                                                # (n, K)
    mc, se = vals.mean(0), vals.std(0) / math.sqrt(n)
    assert ((mc - closed).abs() <= K_SE * se).all(), (mc, closed, se)
    # the program's analytic site KL, averaged over u_<t draws, has the same expectation
    ks = torch.cat(kl_sites)
    if guide == "autoregressive":  # independent of u_<t: every draw gives the closed form
        assert torch.allclose(ks, closed.expand_as(ks), atol=1e-9)
    else:
        assert ((ks.mean(0) - closed).abs() <= K_SE * ks.std(0) / math.sqrt(n)).all()


def test_hyperparameter_kl_is_tempered_and_analytic():
    """The theta site contributes beta KL[q_t(theta) || q_{t-1}(theta)] (eq. 8 with tempering);
    check against the closed-form KL of two diagonal Gaussians."""
    gen = torch.Generator().manual_seed(6)
    K, D, beta = 2, 2, 3.5
    cur = _random_set(K, 3, D, gen=gen)
    prior = HyperPosterior(0.1 * torch.randn(1, D + 1, generator=gen, dtype=DT),
                           0.5 + torch.rand(1, D + 1, generator=gen, dtype=DT))
    q = HyperPosterior(0.1 * torch.randn(1, D + 1, generator=gen, dtype=DT),
                       0.2 + torch.rand(1, D + 1, generator=gen, dtype=DT))
    model = VARGPModel(num_classes=K, past=[], init=cur, hyper_prior=prior, hyper_init=q,
                       beta=beta, num_theta_samples=4, jitter=1e-6)
    x = torch.randn(3, D, dtype=DT)
    tr = pyro.poutine.trace(model.guide).get_trace(x)
    mt = pyro.poutine.trace(pyro.poutine.replay(model.model, trace=tr)).get_trace(x)
    site_q, site_p = tr.nodes["theta"], mt.nodes["theta"]
    kl = torch.distributions.kl_divergence(site_q["fn"], site_p["fn"]) * site_q["scale"]
    expected = (torch.log(prior.scale / q.scale) + (q.scale ** 2 + (q.loc - prior.loc) ** 2)
                / (2 * prior.scale ** 2) - 0.5).sum()
    # 4 draws in the theta_samples plate, each scaled beta / 4
    assert torch.allclose(kl.sum(), beta * expected, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# gradients and freezing
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hyperparameters", ["variational", "point"])
def test_gradients_flow_only_into_the_current_task(hyperparameters):
    gen = torch.Generator().manual_seed(7)
    K, D = 3, 2
    past = [_random_set(K, 3, D, gen=gen, shift=s) for s in (0.0, 1.0)]
    leaves = [InducingSet(*(t.clone().requires_grad_(True) for t in p)) for p in past]
    cur = _random_set(K, 4, D, gen=gen, shift=2.0)
    hyper = None if hyperparameters == "variational" else PointHyperparameters(
        torch.zeros(1, D + 1, dtype=DT))
    model = VARGPModel(num_classes=K, past=leaves, init=cur, hyper_init=hyper,
                       jitter=1e-6, likelihood=SoftmaxLikelihood(3))
    x = torch.randn(10, D, generator=gen, dtype=DT)
    y = torch.randint(0, K, (10,), generator=gen)
    loss = -_elbo(model, x, y, num_data=50, grad=True)
    loss.backward()
    for p in leaves:
        for t in p:
            assert t.grad is None                                        # old tasks frozen
    store = pyro.get_param_store()
    names = set(store.keys())
    expected = {"inducing_inputs", "inducing_mean", "inducing_scale_tril"} | (
        {"theta_loc", "theta_log_variance"} if hyperparameters == "variational" else {"theta"})
    assert names == expected
    for name in names:
        g = store._params[name].grad
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, name


# ---------------------------------------------------------------------------------------------
# ablations reduce where they must
# ---------------------------------------------------------------------------------------------
def _deterministic_elbo(guide, past, cur, theta, x, y, likelihood=None):
    pyro.clear_param_store()
    model = VARGPModel(num_classes=cur.mean.shape[0], past=past, init=cur,
                       hyper_init=PointHyperparameters(theta), guide=guide,
                       likelihood=likelihood or GaussianLikelihood(0.5), jitter=1e-8)
    return _elbo(model, x, y, num_data=40)


def test_ablations_equal_var_gp_on_the_first_task():
    gen = torch.Generator().manual_seed(8)
    D = 2
    cur = _random_set(1, 5, D, gen=gen)
    theta = 0.2 * torch.randn(1, D + 1, generator=gen, dtype=DT)
    x = torch.randn(8, D, generator=gen, dtype=DT)
    y = torch.randn(8, generator=gen, dtype=DT)
    values = [_deterministic_elbo(g, [], cur, theta, x, y)
              for g in ("autoregressive", "block_diagonal", "block_diagonal_joint", "global")]
    for v in values[1:]:
        assert torch.allclose(values[0], v, atol=1e-10)
    # and equal the SVGP bound computed by hand: E log N(y | f, s2) - KL[q(u) || p(u)]
    th = kernel_theta(theta).expand(1, 1, 1, -1)
    f_loc, f_var = f_marginals_of_state(x, [cur], th, jitter=1e-8)
    ell = (dist.Normal(f_loc[0, 0, 0], math.sqrt(0.5)).log_prob(y) - f_var[0, 0, 0] / 1.0).sum()
    L = prior_cholesky(th, cur.inducing_inputs, 1e-8)
    kl = gaussian_kl(cur.mean, cur.scale_tril, L)[0, 0, 0]
    assert torch.allclose(values[0], 40 / 8 * ell - kl, atol=1e-9)


def test_block_diagonal_equals_var_gp_when_tasks_are_uncorrelated():
    """With K_{t,<t} = 0 (inducing sets far apart) A_t = 0: both guides coincide."""
    gen = torch.Generator().manual_seed(9)
    D = 2
    past = [_random_set(1, 3, D, gen=gen, shift=-40.0)]
    cur = _random_set(1, 4, D, gen=gen, shift=40.0)
    theta = torch.zeros(1, D + 1, dtype=DT)
    x = torch.randn(6, D, generator=gen, dtype=DT)
    y = torch.randn(6, generator=gen, dtype=DT)
    # the u_<t draws differ between calls but enter neither bound when A_t = 0
    a = _deterministic_elbo("autoregressive", past, cur, theta, x, y)
    b = _deterministic_elbo("block_diagonal", past, cur, theta, x, y)
    assert torch.allclose(a, b, atol=1e-9)
    # while correlated sets make them differ
    past_near = [InducingSet(cur.inducing_inputs[:, :3] + 0.1, *past[0][1:])]
    a = _deterministic_elbo("autoregressive", past_near, cur, theta, x, y)
    torch.manual_seed(0)
    b = _deterministic_elbo("block_diagonal", past_near, cur, theta, x, y)
    assert abs(float(a - b)) > 1e-3


def test_global_with_unchanged_inputs_is_streaming_svgp():
    """App. B.1 with Z_t = Z_{t-1}: p(u_{t-1} | u_t) is a point mass, so the u-terms of eq. 16
    reduce to -KL[q(u_t) || q(u_{t-1})] — Bui et al.'s streaming bound with the old posterior as
    prior. Checked on the previous_posterior factor (expectation over q(u_t) by MC) and in closed
    form."""
    gen = torch.Generator().manual_seed(10)
    K, D, M = 2, 2, 4
    old = _random_set(K, M, D, gen=gen)
    new = InducingSet(old.inducing_inputs.clone(), *_random_set(K, M, D, gen=gen)[1:])
    theta = (0.2 * torch.randn(1, D + 1, generator=gen, dtype=DT)).expand(1, 1, 1, -1)
    L = prior_cholesky(theta, new.inducing_inputs, 1e-8)
    kl_prior = gaussian_kl(new.mean, new.scale_tril, L)[0, 0]              # KL[q(u_t) || p(u_t)]
    n = 40_000
    eps = torch.randn(n, K, M, 1, generator=gen, dtype=DT)
    u = (new.mean[..., None] + new.scale_tril @ eps)[..., 0]              # (n, K, M)
    term = previous_posterior_term(theta, u[:, None], new.inducing_inputs, old, 1e-8)[:, 0]
    mc = term.mean(0) - kl_prior
    se = term.std(0) / math.sqrt(n)
    # closed form KL[N(m, S) || N(m_o, S_o)]
    q = dist.MultivariateNormal(new.mean, scale_tril=new.scale_tril)
    p = dist.MultivariateNormal(old.mean, scale_tril=old.scale_tril)
    target = -torch.distributions.kl_divergence(q, p)
    assert ((mc - target).abs() <= K_SE * se + 1e-6).all(), (mc, target, se)


# ---------------------------------------------------------------------------------------------
# the program is a readable Pyro program
# ---------------------------------------------------------------------------------------------
def test_trace_shows_the_factors_of_eq_7():
    gen = torch.Generator().manual_seed(11)
    K, D = 3, 2
    past = [_random_set(K, 3, D, gen=gen, shift=s) for s in (0.0, 1.0)]
    cur = _random_set(K, 4, D, gen=gen, shift=2.0)
    model = VARGPModel(num_classes=K, past=past, init=cur, num_theta_samples=3,
                       likelihood=SoftmaxLikelihood(5), jitter=1e-6)
    x = torch.randn(7, D, generator=gen, dtype=DT)
    y = torch.randint(0, K, (7,), generator=gen)
    tr = pyro.poutine.trace(model.model).get_trace(x, y, num_data=70)
    sites = [n for n, s in tr.nodes.items() if s["type"] == "sample"]
    assert [s for s in sites if not s.endswith(("plate", "samples")) and s not in
            ("classes", "data")] == ["theta", "u_1", "u_2", "u_3", "y"]
    assert tr.nodes["y"]["is_observed"]
    assert tr.nodes["y"]["fn"].batch_shape == (3, 5, 7)
    assert tr.nodes["u_3"]["fn"].batch_shape == (3, 1, K)
    assert tr.nodes["u_3"]["fn"].event_shape == (4,)
    text = tr.format_shapes()
    assert "theta" in text and "u_3" in text


def test_predictive_probabilities_are_normalized_and_seeded():
    gen = torch.Generator().manual_seed(12)
    K, D = 4, 2
    sets = [_random_set(K, 3, D, gen=gen), _random_set(K, 3, D, gen=gen, shift=1.0)]
    hyper = HyperPosterior(torch.zeros(1, D + 1, dtype=DT), 0.1 * torch.ones(1, D + 1, dtype=DT))
    x = torch.randn(11, D, generator=gen, dtype=DT)
    def run(seed, max_elements=2**24):
        return predictive_probabilities(x, sets, hyper, max_elements=max_elements,
                                        generator=torch.Generator().manual_seed(seed))

    p1 = run(0, max_elements=50)                                          # forces chunking
    assert p1.shape == (11, K)
    assert torch.allclose(p1.sum(-1), torch.ones(11, dtype=DT))
    assert torch.equal(p1, run(0, max_elements=50))                       # same seed, same draws
    assert not torch.equal(run(0), run(1))


def test_init_inducing_set_draws_task_inputs():
    x = torch.arange(40, dtype=DT).reshape(20, 2)
    s = init_inducing_set(x, 3, 5, generator=torch.Generator().manual_seed(0))
    assert s.inducing_inputs.shape == (3, 5, 2)
    rows = {tuple(r.tolist()) for r in x}
    assert all(tuple(z.tolist()) in rows for z in s.inducing_inputs.reshape(-1, 2))
    assert torch.equal(s.scale_tril, torch.eye(5, dtype=DT).expand(3, 5, 5))
    assert torch.equal(s.mean, torch.zeros(3, 5, dtype=DT))
    shared = init_inducing_set(x, 3, 5, per_class_inputs=False)
    assert shared.inducing_inputs.shape == (1, 5, 2)


def test_bad_options_raise():
    cur = _random_set(2, 3, 2)
    with pytest.raises(ValueError, match="guide"):
        VARGPModel(num_classes=2, past=[], init=cur, guide="diagonal")
    with pytest.raises(TypeError, match="hyper_init"):
        VARGPModel(num_classes=2, past=[], init=cur, hyper_init=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="beta"):
        VARGPModel(num_classes=2, past=[], init=cur, beta=0.0)
    with pytest.raises(ValueError, match="global"):
        VARGPModel(num_classes=2, past=[cur, cur], init=cur, guide="global")
    with pytest.raises(ValueError, match="output"):
        VARGPModel(num_classes=2, past=[], init=cur, likelihood=GaussianLikelihood(1.0))


def test_isotropic_theta_equals_ard_with_equal_lengthscales():
    """Eq. 20 as printed (one lengthscale, theta = [log gamma, log l]) is the ARD kernel with
    every l_d = l: the whole two-task bound (eq. 8, one Monte Carlo draw at a fixed seed)
    agrees, for each guide."""
    gen = torch.Generator().manual_seed(21)
    D = 3
    past = [_random_set(2, 4, D, gen=gen)]
    cur = _random_set(2, 3, D, gen=gen, shift=0.5)
    x = torch.randn(7, D, generator=gen, dtype=DT)
    y = torch.randint(2, (7,), generator=gen)
    iso = torch.tensor([[0.3, -0.2]], dtype=DT)
    ard = torch.cat([iso[:, :1], iso[:, 1:].expand(1, D)], -1)
    for guide in ("autoregressive", "block_diagonal"):
        # same seed: the u_<t and f draws have the same shapes, so they are the same numbers
        pyro.set_rng_seed(3)
        a = _deterministic_elbo(guide, past, cur, iso, x, y, likelihood=SoftmaxLikelihood(4))
        pyro.set_rng_seed(3)
        b = _deterministic_elbo(guide, past, cur, ard, x, y, likelihood=SoftmaxLikelihood(4))
        assert torch.isfinite(a) and torch.allclose(a, b, rtol=1e-12, atol=1e-9), guide
    kern_iso, kern_ard = kernel_from_theta(iso), kernel_from_theta(ard)
    assert torch.allclose(kern_iso(x, x), kern_ard(x, x), rtol=1e-12)


def test_hyperparameter_width_is_checked():
    cur = _random_set(2, 3, 4)
    for width in (3, 6):
        with pytest.raises(ValueError, match="log-hyperparameters"):
            VARGPModel(num_classes=2, past=[], init=cur,
                       hyper_init=PointHyperparameters(torch.zeros(1, width, dtype=DT)))
    with pytest.raises(ValueError, match="hyper_prior"):
        VARGPModel(num_classes=2, past=[], init=cur,
                   hyper_init=HyperPosterior(torch.zeros(1, 2, dtype=DT),
                                             torch.ones(1, 2, dtype=DT)),
                   hyper_prior=HyperPosterior(torch.zeros(1, 5, dtype=DT),
                                              torch.ones(1, 5, dtype=DT)))


def test_kernel_amplitude_is_gamma_squared_by_default_and_gamma_on_request():
    """``kernel_theta``: the authors' kernel variance is gamma^2 = exp(2 theta_0)
    (uber-research/vargp ``var_gp/kernels.py``); ``amplitude="linear"`` reads exp(theta_0) as
    the text's "log-scale factor"; the lengthscales are untouched."""
    theta = torch.tensor([[0.3, -0.2, 0.5]], dtype=DT)
    sq, lin = kernel_theta(theta), kernel_theta(theta, "linear")
    assert torch.equal(sq[..., 1:], theta[..., 1:]) and torch.equal(lin, theta)
    assert float(kernel_from_theta(sq).variance) == pytest.approx(math.exp(0.6))
    with pytest.raises(ValueError, match="amplitude"):
        kernel_theta(theta, "cubed")


def test_block_diagonal_row_of_the_code_changes_only_the_kl_of_u_t():
    """The authors' Block Diag. (uber-research/vargp ``var_gp/vargp.py``,
    ``ep_var_mean=False``): with the same parameters and draws, the likelihood term is the
    auto-regressive one and only the u_t site differs (its guide mean loses A_t u_<t); the
    text's reading changes the likelihood too."""
    gen = torch.Generator().manual_seed(12)
    K, D = 2, 2
    past = [_random_set(K, 3, D, gen=gen)]
    cur = _random_set(K, 4, D, shift=0.3, gen=gen)
    theta = 0.2 * torch.randn(1, D + 1, generator=gen, dtype=DT)
    x = torch.randn(6, D, generator=gen, dtype=DT)
    y = torch.randint(K, (6,), generator=gen)

    def traces(guide):
        pyro.clear_param_store()
        m = VARGPModel(num_classes=K, past=past, init=cur,
                       hyper_init=PointHyperparameters(theta), guide=guide,
                       likelihood=SoftmaxLikelihood(3), jitter=1e-6)
        pyro.set_rng_seed(4)
        g = pyro.poutine.trace(m.guide).get_trace(x, y)
        mt = pyro.poutine.trace(pyro.poutine.replay(m.model, trace=g)).get_trace(x, y)
        return g, mt

    ar_g, ar_m = traces("autoregressive")
    bd_g, bd_m = traces("block_diagonal")
    jt_g, jt_m = traces("block_diagonal_joint")
    like = {name: tr.nodes["y"]["fn"].log_prob(y).sum() for name, tr in
            (("ar", ar_m), ("bd", bd_m), ("joint", jt_m))}
    assert torch.equal(like["ar"], like["bd"])
    assert not torch.allclose(like["ar"], like["joint"])
    # u_1 (the earlier task) is the same factor; u_2's guide mean drops A_2 u_1
    assert torch.equal(ar_g.nodes["u_1"]["value"], bd_g.nodes["u_1"]["value"])
    assert torch.allclose(bd_g.nodes["u_2"]["fn"].loc, cur.mean.expand_as(
        bd_g.nodes["u_2"]["fn"].loc))
    assert not torch.allclose(ar_g.nodes["u_2"]["fn"].loc, bd_g.nodes["u_2"]["fn"].loc)
    # the prior conditional p(u_2 | u_1) of the model is the same in both
    assert torch.equal(ar_m.nodes["u_2"]["fn"].loc, bd_m.nodes["u_2"]["fn"].loc)


def test_median_distance_and_the_data_scaled_start_and_prior():
    """``median_distance`` is the median over distinct pairs (against scipy's pdist); with
    ``log_lengthscale_init`` the lengthscale entries of q(theta) start there with the code's
    noise draw and the first task's prior centres them there; later tasks keep
    q_{t-1}(theta) as their prior."""
    import numpy as np
    from scipy.spatial.distance import pdist

    from models.vargp import median_distance, task_program

    g = torch.Generator().manual_seed(0)
    x = torch.rand(50, 6, generator=g, dtype=torch.float64) * 7.0
    assert median_distance(x) == pytest.approx(float(np.median(pdist(x.numpy()))), rel=1e-12)
    with pytest.raises(ValueError, match="2 rows"):
        median_distance(x[:1])
    with pytest.raises(ValueError, match="identical"):
        median_distance(torch.ones(5, 3))
    kw = dict(num_classes=3, num_inducing=4, num_theta_samples=1, num_f_samples=1)
    code = task_program(x, [], None, theta_generator=torch.Generator().manual_seed(1), **kw)
    scaled = task_program(x, [], None, log_lengthscale_init=2.0,
                          theta_generator=torch.Generator().manual_seed(1), **kw)
    a, b = code.hyper_init.loc, scaled.hyper_init.loc
    assert torch.equal(a[..., 0], b[..., 0])
    assert torch.allclose(b[..., 1:] - a[..., 1:], torch.full_like(a[..., 1:], 2.0 - math.log(0.5)))
    assert torch.equal(code.hyper_prior.loc, torch.zeros_like(a))
    assert float(scaled.hyper_prior.loc[..., 0]) == 0.0
    assert torch.equal(scaled.hyper_prior.loc[..., 1:], torch.full_like(a[..., 1:], 2.0))
    assert torch.equal(scaled.hyper_prior.scale, torch.ones_like(a))
    later = task_program(x, [], HyperPosterior(b, torch.full_like(b, 0.3)),
                         log_lengthscale_init=2.0, **kw)
    assert torch.equal(later.hyper_prior.loc, b)
