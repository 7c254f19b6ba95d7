"""The jitter Cholesky helpers: exact when possible, escalation with a warning, clear failure."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from models import linalg_jax as lj
from models import linalg_torch as lt


def _low_rank(n=6, r=2, seed=0):
    A = np.random.default_rng(seed).normal(size=(n, r))
    return A @ A.T  # PSD, rank r: plain Cholesky fails


def test_torch_exact_when_pd():
    A = _low_rank() + np.eye(6)
    L = lt.jitter_cholesky(torch.tensor(A))
    np.testing.assert_allclose(L.numpy(), np.linalg.cholesky(A), rtol=1e-12)


def test_torch_escalates_with_warning():
    A = torch.tensor(_low_rank())
    with pytest.warns(lt.JitterWarning, match="K_uu"):
        L = lt.jitter_cholesky(A, name="K_uu")
    assert torch.isfinite(L).all()
    assert torch.allclose(L @ L.T, A, atol=1e-6)


def test_torch_batched():
    A = torch.tensor(np.stack([_low_rank(seed=s) + np.eye(6) for s in range(3)]))
    L = lt.jitter_cholesky(A)
    assert torch.allclose(L @ L.transpose(-1, -2), A, atol=1e-12)


def test_torch_gives_up_with_clear_error():
    A = torch.tensor(-np.eye(4))
    with pytest.raises(lt.CholeskyError, match=r"K_ff \(4, 4\).*jitter 1\.0e-06"):
        lt.jitter_cholesky(A, name="K_ff", max_tries=5)


def test_jax_concrete_regime():
    A = jnp.asarray(_low_rank())
    with pytest.warns(lj.JitterWarning, match="S_a"):
        L = lj.jitter_cholesky(A, name="S_a")
    np.testing.assert_allclose(np.asarray(L @ L.T), np.asarray(A), atol=1e-6)
    with pytest.raises(lj.CholeskyError, match="not positive definite"):
        lj.jitter_cholesky(-jnp.eye(3), name="bad")


def test_jax_traced_regime_is_differentiable_and_escalates():
    A = jnp.asarray(_low_rank())

    @jax.jit
    def logdet(scale):
        L = lj.jitter_cholesky(scale * A, name="A")
        return 2.0 * jnp.sum(jnp.log(jnp.diagonal(L)))

    val, grad = jax.value_and_grad(logdet)(2.0)
    assert np.isfinite(float(val)) and np.isfinite(float(grad))
    # PD input through jit: no jitter, exact
    B = jnp.asarray(_low_rank() + np.eye(6))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda M: lj.jitter_cholesky(M))(B)),
                               np.linalg.cholesky(np.asarray(B)), rtol=1e-12)
    # hopeless input through jit: NaN, for the caller's finite-loss guard
    assert not np.isfinite(np.asarray(jax.jit(lambda M: lj.jitter_cholesky(M))(-jnp.eye(3)))).all()


def test_symmetrize():
    A = np.random.default_rng(1).normal(size=(4, 4))
    np.testing.assert_allclose(lt.symmetrize(torch.tensor(A)).numpy(), (A + A.T) / 2)
    np.testing.assert_allclose(np.asarray(lj.symmetrize(jnp.asarray(A))), (A + A.T) / 2)


def test_jax_traced_gradient_matches_plain_cholesky_when_pd():
    """The custom tangent rule equals JAX's own Cholesky derivative on a PD matrix."""
    B = jnp.asarray(_low_rank() + np.eye(6))
    W = jnp.asarray(np.random.default_rng(2).normal(size=(6, 6)))

    def f_ours(M):
        return jnp.sum(W * lj.jitter_cholesky(lj.symmetrize(M)))

    def f_ref(M):
        return jnp.sum(W * jnp.linalg.cholesky(lj.symmetrize(M)))

    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(f_ours))(B)),
                               np.asarray(jax.grad(f_ref)(B)), rtol=1e-10, atol=1e-12)
