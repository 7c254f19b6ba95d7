"""Cholesky with bounded jitter escalation for NumPy (the one jitter helper of this backend),
for host-side work such as drawing from a Gaussian posterior for an ArviZ export.

The same policy as :func:`models.linalg_torch.jitter_cholesky` in float64: try ``A`` as
given; on failure add ``j * mean(diag A) * I`` with ``j = 1e-10 * 10**k``, ``k = 0..4``,
warning with :class:`JitterWarning`; raise :class:`CholeskyError` (a ``ValueError``) naming
the matrix and its smallest eigenvalue when every try fails.
"""

from __future__ import annotations

import numpy as np

from models.jitter import escalate

__all__ = ["CholeskyError", "JitterWarning", "jitter_cholesky"]


class CholeskyError(ValueError):
    """A matrix stayed non positive definite after the largest jitter tried."""


class JitterWarning(UserWarning):
    """Jitter was needed to factor a matrix."""


def jitter_cholesky(A: np.ndarray, *, name: str = "matrix", jitter: float = 1e-10,
                    max_tries: int = 5, factor: float = 10.0, warn: bool = True) -> np.ndarray:
    """Lower Cholesky factor of a (batch of) symmetric PSD matrix ``A: (..., n, n)``;
    ``warn=False`` for matrices singular to rounding by construction (the posterior covariance
    of a GP at many inputs), whose jitter is expected."""
    diag = np.abs(np.diagonal(A, axis1=-2, axis2=-1))
    scale = np.maximum(diag.mean(axis=-1), np.finfo(np.float64).tiny)[..., None, None]
    eye = np.eye(A.shape[-1])

    def factorize(M: np.ndarray) -> tuple[np.ndarray | None, bool]:
        try:
            return np.linalg.cholesky(M), True
        except np.linalg.LinAlgError:
            return None, False

    return escalate(A, factorize=factorize, shifted=lambda j: A + j * scale * eye, base=jitter,
                    factor=factor, max_tries=max_tries, name=f"{name} {A.shape}",
                    scale=float(np.mean(scale)), warning=JitterWarning if warn else None,
                    error=CholeskyError,
                    detail=lambda: f"; smallest eigenvalue {float(np.linalg.eigvalsh(A).min()):.3g}"
                                   " (expected a positive semi-definite matrix)")
