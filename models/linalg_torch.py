"""Cholesky with bounded jitter escalation for torch (the one jitter helper of this backend).

No explicit inverses anywhere in the project: factor with :func:`jitter_cholesky`, then use
``torch.cholesky_solve`` / ``torch.linalg.solve_triangular``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.jitter import escalate

__all__ = ["CholeskyError", "JitterWarning", "jitter_cholesky", "default_jitter", "symmetrize"]


class CholeskyError(RuntimeError):
    """A matrix stayed non positive definite after the largest jitter tried."""


class JitterWarning(UserWarning):
    """Jitter beyond the first attempt was needed to factor a matrix."""


def default_jitter(dtype: torch.dtype) -> float:
    """First jitter tried, relative to the mean diagonal: 1e-10 (float64) / 1e-6 (float32)."""
    return 1e-10 if dtype == torch.float64 else 1e-6


def symmetrize(A: Tensor) -> Tensor:
    """``(A + A^T) / 2`` over the last two axes (after covariance updates)."""
    return 0.5 * (A + A.transpose(-1, -2))


def jitter_cholesky(A: Tensor, *, name: str = "matrix", jitter: float | None = None,
                    max_tries: int = 5, factor: float = 10.0, warn: bool = True) -> Tensor:
    """Lower Cholesky factor of a (batch of) symmetric PSD matrix ``A: (..., n, n)``.

    Tries ``A`` as given; on failure adds ``j * mean(diag A) * I`` with
    ``j = jitter * factor**k`` for ``k = 0 .. max_tries-1`` (the same jitter for every matrix of
    the batch), warning with :class:`JitterWarning` which jitter it took.

    Raises:
        CholeskyError: naming ``name``, its shape and the last jitter tried.
    """
    base = default_jitter(A.dtype) if jitter is None else jitter
    scale = A.diagonal(dim1=-2, dim2=-1).abs().mean().clamp_min(torch.finfo(A.dtype).tiny)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)

    def factorize(M: Tensor) -> tuple[Tensor, bool]:
        L, info = torch.linalg.cholesky_ex(M)
        return L, not bool((info > 0).any())

    return escalate(A, factorize=factorize, shifted=lambda j: A + (j * scale) * eye, base=base,
                    factor=factor, max_tries=max_tries, name=f"{name} {tuple(A.shape)}",
                    scale=float(scale.detach()), warning=JitterWarning if warn else None,
                    error=CholeskyError)
