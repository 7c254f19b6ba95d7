"""Cholesky with bounded jitter escalation for torch (the one jitter helper of this backend).

No explicit inverses anywhere in the project: factor with :func:`jitter_cholesky`, then use
``torch.cholesky_solve`` / ``torch.linalg.solve_triangular``.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

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
    L, info = torch.linalg.cholesky_ex(A)
    if not bool((info > 0).any()):
        return L
    base = default_jitter(A.dtype) if jitter is None else jitter
    scale = A.diagonal(dim1=-2, dim2=-1).abs().mean().clamp_min(torch.finfo(A.dtype).tiny)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    j = base
    for k in range(max_tries):
        j = base * factor**k
        L, info = torch.linalg.cholesky_ex(A + (j * scale) * eye)
        if not bool((info > 0).any()):
            if warn:
                warnings.warn(f"cholesky of {name} {tuple(A.shape)} needed jitter {j:.1e} x mean "
                              f"diagonal ({float(scale):.3g})", JitterWarning, stacklevel=2)
            return L
    raise CholeskyError(f"cholesky of {name} {tuple(A.shape)} failed: not positive definite even "
                        f"with jitter {j:.1e} x mean diagonal ({float(scale):.3g}) after "
                        f"{max_tries} tries")
