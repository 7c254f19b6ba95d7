"""GP-Tree node model: the Pyro programs, the PG density and the closed forms of eqs. 10-14."""

import math

import numpy as np
import pyro
import pytest
import torch
from pyro import poutine

from inference.polya_gamma import random_polyagamma
from models.gp_tree import (NaturalParams, NodeKernelParams, PolyaGamma, augmented_log_marginal,
                            augmented_node_model, bernoulli_node_model, gaussian_kl,
                            gibbs_predictive, natural_to_moments, node_gram, node_kernel,
                            sample_f_given_omega, sigmoid_expectation, vi_predictive)
from models.linalg_torch import jitter_cholesky

pytestmark = pytest.mark.usefixtures("one_torch_thread")
D = torch.float64


def _params(kind="rbf", s=4.0, jitter=1e-3):
    return NodeKernelParams(torch.tensor(s, dtype=D), torch.tensor(1.0, dtype=D), jitter, kind)


def _toy(n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, dtype=D, generator=g)
    y = (X[:, 0] > 0).long()
    return X, y


def test_kernel_acts_on_normalized_inputs():
    X, _ = _toy()
    k = node_kernel(_params())
    np.testing.assert_allclose(k(X).numpy(), k(3.0 * X).numpy(), atol=1e-12)
    U = X / X.norm(dim=1, keepdim=True)
    expected = 4.0 * torch.exp(-0.5 * torch.cdist(U, U) ** 2)
    np.testing.assert_allclose(k(X).numpy(), expected.numpy(), atol=1e-12)
    lin = node_kernel(_params("linear", s=2.0))(X)
    np.testing.assert_allclose(lin.numpy(), (2.0 * U @ U.T).numpy(), atol=1e-12)
    K = node_gram(_params(jitter=0.1), X)
    np.testing.assert_allclose(torch.diagonal(K).numpy(), 4.1, atol=1e-12)


def test_polya_gamma_density_matches_package_and_integrates_to_one():
    from polyagamma import polyagamma_pdf

    for c in (0.0, 1.0, 6.0):
        w = torch.linspace(0.005, 3.0, 300, dtype=D)
        ours = PolyaGamma(torch.tensor(c, dtype=D)).log_prob(w).exp().numpy()
        ref = polyagamma_pdf(w.numpy(), h=1.0, z=c)
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-10)
        grid = torch.linspace(1e-4, 8.0, 80001, dtype=D)
        dens = PolyaGamma(torch.tensor(c, dtype=D)).log_prob(grid).exp()
        assert float(torch.trapezoid(dens, grid)) == pytest.approx(1.0, abs=1e-4)


def test_polya_gamma_distribution_samples_through_the_given_sampler():
    d = PolyaGamma(torch.full((3,), 2.0, dtype=D), sampler=random_polyagamma)
    x = d.sample((4000,))
    assert x.shape == (4000, 3)
    np.testing.assert_allclose(x.mean(0).numpy(), d.mean.numpy(), atol=4 * math.sqrt(0.05 / 4000))
    with pytest.raises(RuntimeError, match="no sampler"):
        PolyaGamma(torch.zeros(2, dtype=D)).sample()


def test_augmented_program_marginalizes_to_the_bernoulli_program():
    """Integrating omega out of the augmented joint (numerically, with the PG(1, 0) density)
    gives the Bernoulli-logit joint of eq. 3 at any f (eq. 2)."""
    X, y = _toy(n=3)
    params = _params()
    f = torch.tensor([0.7, -1.3, 2.1], dtype=D)
    bern = poutine.trace(poutine.condition(bernoulli_node_model, {"f": f})).get_trace(X, y, params)
    lp_bern = bern.log_prob_sum()
    grid = torch.linspace(1e-4, 12.0, 120001, dtype=D)
    log_pg0 = PolyaGamma(torch.zeros((), dtype=D)).log_prob(grid)
    # sum over points of log int exp(kappa f - omega f^2 / 2 - log 2) PG(omega | 1, 0) d omega
    kappa = y.to(D) - 0.5
    per_point = [torch.log(torch.trapezoid(torch.exp(kappa[j] * f[j] - 0.5 * grid * f[j] ** 2
                                                     - math.log(2) + log_pg0), grid))
                 for j in range(3)]
    prior = poutine.trace(poutine.condition(augmented_node_model, {"f": f, "omega": grid[:3]})
                          ).get_trace(X, y, params).nodes["f"]["fn"].log_prob(f)
    assert float(prior + sum(per_point)) == pytest.approx(float(lp_bern), abs=1e-6)


def test_gibbs_conditional_is_the_one_the_program_implies():
    """log p(f, omega, y) of the Pyro program differs between two f by exactly the log ratio of
    the Gaussian N(Sigma kappa, Sigma) of eq. 4."""
    X, y = _toy(n=6)
    params = _params()
    omega = torch.rand(6, dtype=D) + 0.1
    K = node_gram(params, X)
    Sigma = torch.linalg.solve(torch.linalg.solve(K, torch.eye(6, dtype=D)) + torch.diag(omega),
                               torch.eye(6, dtype=D))   # test-only dense reference
    mean = Sigma @ (y.to(D) - 0.5)
    gauss = torch.distributions.MultivariateNormal(mean, Sigma)

    def log_joint(f):
        tr = poutine.trace(poutine.condition(augmented_node_model, {"f": f, "omega": omega})
                           ).get_trace(X, y, params)
        return tr.log_prob_sum()

    f1, f2 = torch.randn(6, dtype=D), torch.randn(6, dtype=D)
    assert float(log_joint(f1) - log_joint(f2)) == pytest.approx(
        float(gauss.log_prob(f1) - gauss.log_prob(f2)), abs=1e-9)
    # and the Cholesky-form draw has that mean and covariance
    L = jitter_cholesky(K)
    eps0, eps1 = torch.randn(200000, 6, dtype=D), torch.randn(200000, 6, dtype=D)
    draws, lm = sample_f_given_omega(K, L, omega.expand(200000, 6),
                                     (y.to(D) - 0.5).expand(200000, 6), eps0, eps1)
    assert float(lm[0]) == pytest.approx(float(augmented_log_marginal(K, omega, y.to(D) - 0.5)))
    np.testing.assert_allclose(draws.mean(0).numpy(), mean.numpy(), atol=4 * Sigma.diagonal().max().sqrt().item() / 447)
    np.testing.assert_allclose(torch.cov(draws.T).numpy(), Sigma.numpy(), atol=0.03 * Sigma.abs().max().item())


def test_augmented_marginal_equals_eq10_gaussian_form():
    """Eq. 10 as printed, N(Omega^-1 kappa | 0, K + Omega^-1) times the omega-only factors of the
    reference code, equals the Cholesky form."""
    X, y = _toy(n=8)
    params = _params()
    K = node_gram(params, X)
    kappa = y.to(D) - 0.5
    omega = torch.rand(3, 8, dtype=D) * 2 + 0.05
    ours = augmented_log_marginal(K, omega, kappa.expand(3, 8))
    for c in range(3):
        w = omega[c]
        z = kappa / w
        mvn = torch.distributions.MultivariateNormal(torch.zeros(8, dtype=D), K + torch.diag(1 / w))
        ref = mvn.log_prob(z) + 0.5 * 8 * math.log(2 * math.pi) - 0.5 * torch.log(w).sum() \
            + 0.5 * (kappa ** 2 / w).sum() - 8 * math.log(2)
        assert float(ours[c]) == pytest.approx(float(ref), abs=1e-8)


def test_gibbs_predictive_equals_eq12_dense_form():
    X, y = _toy(n=8)
    Xs = torch.randn(5, 3, dtype=D)
    params = _params()
    K = node_gram(params, X)
    k = node_kernel(params)
    K_xs, k_ss = k(X, Xs), k.diag(Xs)
    omega = torch.rand(2, 8, dtype=D) + 0.05
    kappa = (y.to(D) - 0.5).expand(2, 8)
    mean, var = gibbs_predictive(K, omega, kappa, K_xs, k_ss)
    for c in range(2):
        A = torch.linalg.inv(torch.diag(1 / omega[c]) + K)   # test-only dense reference
        m_ref = K_xs.T @ A @ (kappa[c] / omega[c])
        v_ref = k_ss - torch.diagonal(K_xs.T @ A @ K_xs)
        np.testing.assert_allclose(mean[c].numpy(), m_ref.numpy(), atol=1e-9)
        np.testing.assert_allclose(var[c].numpy(), v_ref.numpy(), atol=1e-9)


def test_gauss_hermite_sigmoid_matches_monte_carlo():
    mean = torch.tensor([-2.0, 0.0, 0.5, 3.0], dtype=D)
    var = torch.tensor([0.1, 4.0, 1.0, 9.0], dtype=D)
    eps = torch.randn(400000, 1, dtype=D)
    mc = torch.sigmoid(mean + var.sqrt() * eps).mean(0)
    np.testing.assert_allclose(sigmoid_expectation(mean, var).numpy(), mc.numpy(), atol=2e-3)


def test_vi_predictive_and_kl_dense_forms():
    X, _ = _toy(n=6)
    Xs = torch.randn(4, 3, dtype=D)
    params = _params(jitter=1e-2)
    K_mm = node_gram(params, X)
    k = node_kernel(params)
    A = torch.randn(6, 6, dtype=D)
    P = A @ A.T + torch.eye(6, dtype=D)
    eta = torch.randn(6, dtype=D)
    q = natural_to_moments(NaturalParams(eta, -0.5 * P))
    S = torch.linalg.inv(P)                                    # test-only dense reference
    mu = S @ eta
    np.testing.assert_allclose(q.mean.numpy(), mu.numpy(), atol=1e-10)
    mean, var = vi_predictive(jitter_cholesky(K_mm), q, k(X, Xs), k.diag(Xs))
    Ki = torch.linalg.inv(K_mm)
    Kms = k(X, Xs)
    np.testing.assert_allclose(mean.numpy(), (Kms.T @ Ki @ mu).numpy(), atol=1e-9)
    v_ref = k.diag(Xs) - torch.diagonal(Kms.T @ (Ki - Ki @ S @ Ki) @ Kms)
    np.testing.assert_allclose(var.numpy(), v_ref.numpy(), atol=1e-9)
    kl_ref = torch.distributions.kl_divergence(
        torch.distributions.MultivariateNormal(mu, S),
        torch.distributions.MultivariateNormal(torch.zeros(6, dtype=D), K_mm))
    assert float(gaussian_kl(jitter_cholesky(K_mm), q)) == pytest.approx(float(kl_ref), abs=1e-9)


def test_programs_run_forward():
    X, y = _toy(n=5)
    pyro.set_rng_seed(0)
    f = bernoulli_node_model(X, None, _params())
    assert f.shape == (5,)
    tr = poutine.trace(augmented_node_model).get_trace(X, y, _params(), random_polyagamma)
    assert tr.nodes["omega"]["value"].shape == (5,) and bool((tr.nodes["omega"]["value"] > 0).all())
