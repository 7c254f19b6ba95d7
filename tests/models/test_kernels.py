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
    g = jax.grad(lambda z: kj.Matern52(1.0, jnp.ones(3))(z).sum())(jnp.zeros((2, 3)))
    assert np.isfinite(np.asarray(g)).all()


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
