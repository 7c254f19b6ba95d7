"""Cholesky with bounded jitter escalation for JAX (the one jitter helper of this backend).

Two regimes, one function:

* **concrete** arrays (eager code, learners' entry points): tries ``A``, then escalating jitter,
  warns with :class:`JitterWarning` when jitter was needed and raises :class:`CholeskyError`
  naming the matrix and the last jitter when all tries fail — exactly like the torch helper;
* **traced** arrays (inside ``jit`` / ``grad``): the same escalation as one ``lax.while_loop``
  over the schedule (one factorization in the program; it stops at the first success). A
  trace cannot raise, so when every try fails the factor is NaN and
  the caller's finite-loss guard reports it. Differentiation uses the Cholesky tangent rule
  ``dL = L Phi(L^-1 dA L^-T)`` (Phi: lower triangle, halved diagonal; Murray 2016) at the
  factor actually returned, with the jitter held constant — so a failed first attempt never
  leaks NaN into gradients.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import Array

from models.jitter import escalate, schedule

__all__ = ["CholeskyError", "JitterWarning", "jitter_cholesky", "default_jitter", "symmetrize"]


class CholeskyError(RuntimeError):
    """A matrix stayed non positive definite after the largest jitter tried."""


class JitterWarning(UserWarning):
    """Jitter beyond the first attempt was needed to factor a matrix."""


def default_jitter(dtype) -> float:
    """First jitter tried, relative to the mean diagonal: 1e-10 (float64) / 1e-6 (float32)."""
    return 1e-10 if jnp.dtype(dtype) == jnp.float64 else 1e-6


def symmetrize(A: Array) -> Array:
    """``(A + A^T) / 2`` over the last two axes."""
    return 0.5 * (A + jnp.swapaxes(A, -1, -2))


def _ok(L: Array) -> Array:
    return jnp.all(jnp.isfinite(L))


@partial(jax.custom_jvp, nondiff_argnums=(1,))
def _escalating_cholesky(A: Array, jitters: tuple[float, ...]) -> Array:
    """Traced regime: ``chol(A)``, else ``chol(A + j_k mean(diag A) I)`` for the first j_k that
    works: one ``lax.while_loop`` whose body holds the one factorization (attempt 0 adds 0, so
    it factors ``A`` itself), so the compiled program has a single Cholesky however long the
    schedule."""
    scale = jnp.maximum(jnp.mean(jnp.abs(jnp.diagonal(A, axis1=-2, axis2=-1))),
                        jnp.finfo(A.dtype).tiny)
    eye = jnp.eye(A.shape[-1], dtype=A.dtype)
    shifts = jnp.asarray((0.0,) + tuple(jitters), A.dtype)

    def cond(carry):
        k, L = carry
        return (k < shifts.shape[0]) & ~_ok(L)

    def body(carry):
        k, _ = carry
        return k + 1, jnp.linalg.cholesky(A + (shifts[k] * scale) * eye)

    start = jnp.full(A.shape, jnp.nan, A.dtype)
    return jax.lax.while_loop(cond, body, (jnp.asarray(0, jnp.int32), start))[1]


@_escalating_cholesky.defjvp
def _escalating_cholesky_jvp(jitters, primals, tangents):
    (A,), (dA,) = primals, tangents
    L = _escalating_cholesky(A, jitters)
    dA = symmetrize(dA)
    # X = L^-1 dA L^-T, then dL = L Phi(X)
    tmp = jax.lax.linalg.triangular_solve(L, dA, left_side=True, lower=True)
    X = jax.lax.linalg.triangular_solve(L, tmp, left_side=False, lower=True, transpose_a=True)
    phi = jnp.tril(X) - 0.5 * jnp.eye(A.shape[-1], dtype=A.dtype) * X
    return L, L @ phi


def jitter_cholesky(A: Array, *, name: str = "matrix", jitter: float | None = None,
                    max_tries: int = 5, factor: float = 10.0, warn: bool = True) -> Array:
    """Lower Cholesky factor of a (batch of) symmetric PSD matrix ``A: (..., n, n)``.

    Tries ``A``; on failure ``A + j * mean(diag A) * I`` with ``j = jitter * factor**k``,
    ``k = 0 .. max_tries-1``. See the module docstring for the traced regime.
    """
    base = default_jitter(A.dtype) if jitter is None else jitter
    scale = jnp.maximum(jnp.mean(jnp.abs(jnp.diagonal(A, axis1=-2, axis2=-1))),
                        jnp.finfo(A.dtype).tiny)
    eye = jnp.eye(A.shape[-1], dtype=A.dtype)
    jitters = schedule(base, factor, max_tries)

    if isinstance(A, jax.core.Tracer):
        return _escalating_cholesky(A, tuple(jitters))

    def factorize(M: Array) -> tuple[Array, bool]:
        L = jnp.linalg.cholesky(M)
        return L, bool(_ok(L))

    return escalate(A, factorize=factorize, shifted=lambda j: A + (j * scale) * eye, base=base,
                    factor=factor, max_tries=max_tries, name=f"{name} {tuple(A.shape)}",
                    scale=float(scale), warning=JitterWarning if warn else None,
                    error=CholeskyError)
