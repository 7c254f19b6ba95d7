"""Kernels (torch and JAX) against scikit-learn's implementations and against each other."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from sklearn.gaussian_process import kernels as sk

from models import kernels_jax as kj
from models import kernels_torch as kt

rng = np.random.default_rng(0)
X1 = rng.normal(size=(7, 3))


def T(v):
    """float64 tensor (hyperparameters must not be rounded to float32 here)."""
    return torch.tensor(v, dtype=torch.float64)


X2 = rng.normal(size=(5, 3))
LS = np.array([0.7, 1.3, 2.1])
VAR = 1.7


def _cases():
    """(name, torch kernel, jax kernel, sklearn reference kernel)."""
    return [
        ("se-ard", kt.SquaredExponential(T(VAR), T(LS)),
         kj.SquaredExponential(VAR, LS), sk.ConstantKernel(VAR) * sk.RBF(LS)),
        ("se-iso", kt.SquaredExponential(T(VAR), T([0.9])),
         kj.SquaredExponential(VAR, 0.9), sk.ConstantKernel(VAR) * sk.RBF(0.9)),
        ("matern52", kt.Matern52(T(VAR), T(LS)),
         kj.Matern52(VAR, LS), sk.ConstantKernel(VAR) * sk.Matern(LS, nu=2.5)),
        ("linear", kt.Linear(T(VAR)), kj.Linear(VAR),
         sk.ConstantKernel(VAR) * sk.DotProduct(sigma_0=0.0)),
        ("constant", kt.Constant(T(VAR)), kj.Constant(VAR), sk.ConstantKernel(VAR)),
        ("sum", kt.SquaredExponential(T(VAR), T(LS)) + kt.Constant(T(0.5)),
         kj.SquaredExponential(VAR, LS) + kj.Constant(0.5),
         sk.ConstantKernel(VAR) * sk.RBF(LS) + sk.ConstantKernel(0.5)),
        ("product", kt.SquaredExponential(T(1.0), T(LS)) * kt.Linear(T(VAR)),
         kj.SquaredExponential(1.0, LS) * kj.Linear(VAR),
         sk.RBF(LS) * (sk.ConstantKernel(VAR) * sk.DotProduct(sigma_0=0.0))),
        ("scale", 3.0 * kt.Matern52(T(1.0), T(LS)),
         3.0 * kj.Matern52(1.0, LS), sk.ConstantKernel(3.0) * sk.Matern(LS, nu=2.5)),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_against_sklearn(case):
    _, k_torch, k_jax, k_ref = case
    ref12, ref11 = k_ref(X1, X2), k_ref(X1)
    t1, t2 = torch.tensor(X1), torch.tensor(X2)
    np.testing.assert_allclose(k_torch(t1, t2).numpy(), ref12, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(k_torch(t1).numpy(), ref11, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(k_torch.diag(t1).numpy(), np.diag(ref11), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(k_jax(jnp.asarray(X1), jnp.asarray(X2))), ref12,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(k_jax(jnp.asarray(X1))), ref11, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(k_jax.diag(jnp.asarray(X1))), np.diag(ref11), rtol=1e-12)


def test_cosine_and_normalized():
    U1 = X1 / np.linalg.norm(X1, axis=1, keepdims=True)
    U2 = X2 / np.linalg.norm(X2, axis=1, keepdims=True)
    ref_cos = 2.0 * U1 @ U2.T
    np.testing.assert_allclose(kt.Cosine(T(2.0))(torch.tensor(X1), torch.tensor(X2)).numpy(),
                               ref_cos, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(kj.Cosine(2.0)(jnp.asarray(X1), jnp.asarray(X2))), ref_cos,
                               rtol=1e-12)
    ref_norm = (sk.ConstantKernel(4.0) * sk.RBF(1.0))(U1, U2)
    kn_t = kt.Normalized(kt.SquaredExponential(T(4.0), T(1.0)))
    kn_j = kj.Normalized(kj.SquaredExponential(4.0, 1.0))
    np.testing.assert_allclose(kn_t(torch.tensor(X1), torch.tensor(X2)).numpy(), ref_norm, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(kn_j(jnp.asarray(X1), jnp.asarray(X2))), ref_norm, rtol=1e-12)
    np.testing.assert_allclose(kt.Cosine(T(2.0)).diag(torch.tensor(X1)).numpy(), 2.0)


def test_torch_batched_hyperparameters():
    """One GP per class: variance (C,), lengthscale (C, d) broadcast against X (n, d)."""
    C = 4
    var = torch.rand(C, dtype=torch.float64) + 0.5
    ls = torch.rand(C, 3, dtype=torch.float64) + 0.5
    K = kt.SquaredExponential(var, ls)(torch.tensor(X1), torch.tensor(X2))
    assert K.shape == (C, 7, 5)
    for c in range(C):
        ref = (sk.ConstantKernel(float(var[c])) * sk.RBF(ls[c].numpy()))(X1, X2)
        np.testing.assert_allclose(K[c].numpy(), ref, rtol=1e-12)
    # a (S, C) batch of theta samples with inputs batched over classes (C, n, d)
    var2 = var.expand(2, C)
    ls2 = ls.expand(2, C, 3)
    Xb = torch.tensor(X1).expand(C, 7, 3)
    assert kt.SquaredExponential(var2, ls2)(Xb).shape == (2, C, 7, 7)
    assert kt.SquaredExponential(var2, ls2).diag(Xb).shape == (2, C, 7)


def test_jax_vmap_and_pytree():
    k = kj.SquaredExponential(1.5, jnp.array(LS))
    leaves = jax.tree_util.tree_leaves(k)
    assert len(leaves) == 2
    raw = jax.tree_util.tree_map(jnp.log, k)
    back = jax.tree_util.tree_map(jnp.exp, raw)
    np.testing.assert_allclose(np.asarray(back(jnp.asarray(X1))), np.asarray(k(jnp.asarray(X1))),
                               rtol=1e-14)
    batched = jax.vmap(lambda v: kj.SquaredExponential(v, jnp.array(LS))(jnp.asarray(X1)))(jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(np.asarray(batched[1]), 2.0 * np.asarray(batched[0]), rtol=1e-14)


def test_matern_gradient_finite_at_zero_distance():
    x = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    ls = torch.ones(3, dtype=torch.float64, requires_grad=True)
    kt.Matern52(T(1.0), ls)(x).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(ls.grad).all()
    # k(r) = s (1 + sqrt5 r / l + 5 r^2 / (3 l^2)) exp(-sqrt5 r / l) has dk/dr = 0 at r = 0 and
    # k(0) = s for every l: every pair is at r = 0, so both gradients are exactly 0
    np.testing.assert_allclose(x.grad.numpy(), 0.0, atol=1e-12)
    np.testing.assert_allclose(ls.grad.numpy(), 0.0, atol=1e-12)
    g = jax.grad(lambda z: kj.Matern52(1.0, jnp.ones(3))(z).sum())(jnp.zeros((2, 3)))
    assert np.isfinite(np.asarray(g)).all()
    np.testing.assert_allclose(np.asarray(g), 0.0, atol=1e-6)


def test_gradient_of_se_matches_finite_differences():
    """d k / d lengthscale by autodiff (torch and JAX) against central differences."""
    def k_np(ls):
        return (sk.ConstantKernel(VAR) * sk.RBF(ls))(X1, X2).sum()

    eps = 1e-6
    fd = np.array([(k_np(LS + eps * e) - k_np(LS - eps * e)) / (2 * eps) for e in np.eye(3)])
    ls_t = T(LS).requires_grad_(True)
    kt.SquaredExponential(T(VAR), ls_t)(torch.tensor(X1), torch.tensor(X2)).sum().backward()
    np.testing.assert_allclose(ls_t.grad.numpy(), fd, rtol=1e-6)
    g = jax.grad(lambda ls: kj.SquaredExponential(VAR, ls)(jnp.asarray(X1), jnp.asarray(X2)).sum())(jnp.asarray(LS))
    np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-6)


def _se_reference(var, ls, A, B=None):
    """``var * exp(-1/2 sum_d ((a_d - b_d) / l_d)^2)`` by explicit broadcast differences."""
    B = A if B is None else B
    diff = (A.unsqueeze(-2) - B.unsqueeze(-3)) / ls.unsqueeze(-2).unsqueeze(-2)
    return var[..., None, None] * torch.exp(-0.5 * (diff * diff).sum(-1))


@pytest.mark.parametrize("shapes", [((11, 3), (5, 3)), ((4, 3), (9, 3)), ((2, 6, 3), (5, 3))],
                         ids=["more-rows-left", "more-rows-right", "batched-left"])
def test_se_ard_values_and_gradients_against_broadcast_differences(shapes):
    """The ARD kernel (weighted cross form, and the Gram form with its own backward) against
    the difference form, values and gradients in float64, with theta-like batched
    hyperparameters (S, 1, d); gradcheck and gradgradcheck on the fast forms."""
    g = torch.Generator().manual_seed(1)
    A = torch.randn(*shapes[0], generator=g, dtype=torch.float64, requires_grad=True)
    B = torch.randn(*shapes[1], generator=g, dtype=torch.float64, requires_grad=True)
    var = (torch.rand(2, 1, generator=g, dtype=torch.float64) + 0.5).requires_grad_(True)
    ls = (torch.rand(2, 1, 3, generator=g, dtype=torch.float64) + 0.5).requires_grad_(True)
    for args in ((A, B), (A,)):
        fast = kt.SquaredExponential(var, ls)(*args)
        ref = _se_reference(var, ls, *args)
        assert fast.shape == ref.shape
        W = torch.randn(ref.shape, generator=g, dtype=torch.float64)
        ins = (A, B, var, ls) if len(args) == 2 else (A, var, ls)
        g_fast = torch.autograd.grad((fast * W).sum(), ins)
        g_ref = torch.autograd.grad((ref * W).sum(), ins)
        np.testing.assert_allclose(fast.detach().numpy(), ref.detach().numpy(), rtol=1e-12,
                                   atol=1e-13)
        for a, b in zip(g_fast, g_ref):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)
        fn = lambda *z: kt.SquaredExponential(z[-2], z[-1])(*z[:-2])  # noqa: E731
        assert torch.autograd.gradcheck(fn, ins)
        assert torch.autograd.gradgradcheck(fn, ins)


def test_se_gram_diagonal_is_exactly_the_variance():
    X = torch.randn(50, 784) * 3.0
    K = kt.SquaredExponential(torch.tensor(2.0), torch.rand(784) + 0.2)(X)
    assert torch.equal(K.diagonal(), torch.full((50,), 2.0))


@pytest.mark.parametrize("ls", [[[0.7, 1.3, 2.1]], [[0.9]]], ids=["ard", "isotropic"])
def test_stacked_blocks_equal_the_concatenation_and_skip_frozen_gradients(ls):
    """``k.stacked([B1, B2], X)`` is ``k(cat([B1, B2]), X)``, value and gradients, and a
    block that needs no gradient gets none."""
    g = torch.Generator().manual_seed(2)
    B1 = torch.randn(6, 3, generator=g, dtype=torch.float64)           # frozen
    B2 = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    X = torch.randn(5, 3, generator=g, dtype=torch.float64)
    ls_t = T(ls).expand(2, len(ls[0])).clone().requires_grad_(True)
    var = T([1.5, 0.5])
    k = kt.SquaredExponential(var, ls_t)
    K_blocks = k.stacked([B1, B2], X)
    K_cat = k(torch.cat([B1, B2]), X)
    np.testing.assert_allclose(K_blocks.detach().numpy(), K_cat.detach().numpy(), rtol=1e-12,
                               atol=1e-14)
    W = torch.randn(K_cat.shape, generator=g, dtype=torch.float64)
    ga = torch.autograd.grad((K_blocks * W).sum(), (B2, ls_t))
    gb = torch.autograd.grad((K_cat * W).sum(), (B2, ls_t))
    for a, b in zip(ga, gb):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)
    assert not B1.requires_grad and B1.grad is None


def _se_uncut(var, r2):
    return var * torch.exp(-0.5 * r2)


def _matern52_uncut(var, r2):
    r = r2.clamp_min(1e-36).sqrt()
    return var * ((1.0 + 5 ** 0.5 * r + (5.0 / 3.0) * r2) * torch.exp(-(5 ** 0.5) * r))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kernel, uncut", [(kt.SquaredExponential, _se_uncut),
                                           (kt.Matern52, _matern52_uncut)],
                         ids=["se", "matern52"])
def test_stationary_entries_below_sqrt_tiny_are_exactly_zero_and_no_subnormals_appear(
        kernel, uncut, dtype):
    """Short lengthscales (VAR-GP's point-estimated hyperparameters on MNIST reach l = 0.01):
    the entries whose profile is below ``sqrt(tiny)`` are exactly 0, so neither the Gram matrix
    nor its gradients hold a subnormal float (slow on x86 CPUs); every other entry is bit for
    bit the untruncated formula on the same distances, and the gradients agree with the
    untruncated ones."""
    g = torch.Generator().manual_seed(3)
    tiny = torch.finfo(dtype).tiny
    threshold = kernel._NEGLIGIBLE_R2[dtype]
    if kernel is kt.SquaredExponential:
        assert threshold == pytest.approx(-np.log(tiny), rel=1e-14)   # exp(-r2/2) = sqrt(tiny)
    A = (torch.rand(40, 3, generator=g, dtype=torch.float64) * 6.0).to(dtype).requires_grad_(True)
    B = (torch.rand(30, 3, generator=g, dtype=torch.float64) * 6.0).to(dtype)
    shrink = float(np.sqrt(87.3 / threshold))          # puts the cut inside the distances' range
    ls = (shrink * torch.tensor([0.15, 0.3, 2.0], dtype=dtype)).requires_grad_(True)
    var = torch.tensor(1.3, dtype=dtype)
    K = kernel(var, ls)(A, B)
    r2 = kt._weighted_sq_dist(A, B, ls.pow(-2))
    K_full = uncut(var, r2)                            # the same distances, no cut
    cut = r2 > threshold
    assert 0.2 < cut.double().mean() < 0.95             # both sides of the cut are exercised
    assert torch.all(K[cut] == 0)
    assert torch.equal(K[~cut], K_full[~cut])
    assert torch.all(K_full[cut] < var * tiny ** 0.5)
    assert torch.all(K_full[~cut] >= var * tiny ** 0.5 * (1 - 1e-6))
    assert ((K_full != 0) & (K_full.abs() < tiny)).any()  # what the cut removes
    W = torch.randn(K.shape, generator=g, dtype=dtype)
    grads = torch.autograd.grad((K * W).sum(), (A, ls))
    grads_full = torch.autograd.grad((K_full * W).sum(), (A, ls))
    for out in (K.detach(), *grads):
        assert torch.isfinite(out).all()
        assert not ((out != 0) & (out.abs() < tiny)).any(), "subnormal float in the output"
    for a, b in zip(grads, grads_full):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-15)
