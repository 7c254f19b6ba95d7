"""The jitter-escalation policy shared by the Cholesky helpers of every backend
(:mod:`models.linalg_torch`, :mod:`models.linalg_jax`, :mod:`models.linalg_numpy`).

``A`` is tried as given; on failure ``A + j * mean(diag A) * I`` for
``j = base * factor**k``, ``k = 0 .. max_tries-1``; the first factor that succeeds is returned,
with a warning naming the jitter it took; when every try fails an error names the matrix, its
shape and the last jitter. :func:`escalate` runs that schedule on concrete arrays for any
backend's factorization; the traced JAX regime (``lax.while_loop``) uses :func:`schedule` only.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

__all__ = ["schedule", "escalate"]


def schedule(base: float, factor: float, max_tries: int) -> list[float]:
    """The jitters tried after the plain factorization fails, relative to the mean diagonal."""
    return [base * factor**k for k in range(max_tries)]


def escalate(A: Any, *, factorize: Callable[[Any], tuple[Any, bool]],
             shifted: Callable[[float], Any], base: float, factor: float, max_tries: int,
             name: str, scale: float, warning: type[Warning] | None,
             error: type[Exception], detail: Callable[[], str] = lambda: "") -> Any:
    """Factor ``A`` by the escalation policy of the module docstring.

    Args:
        A: the matrix (any backend); only passed to ``factorize``.
        factorize: ``M -> (L, succeeded)`` for the backend.
        shifted: ``j -> A + j * scale * I``.
        base, factor, max_tries: the schedule; scale: ``mean(diag A)`` (for the messages).
        warning: the backend's warning class (None: no warning).
        error: the backend's error class; detail: extra text for its message.
    """
    L, ok = factorize(A)
    if ok:
        return L
    jitters = schedule(base, factor, max_tries)
    for j in jitters:
        L, ok = factorize(shifted(j))
        if ok:
            if warning is not None:
                warnings.warn(f"cholesky of {name} needed jitter {j:.1e} x mean diagonal "
                              f"({scale:.3g})", warning, stacklevel=3)
            return L
    raise error(f"cholesky of {name} failed: not positive definite even with jitter "
                f"{jitters[-1]:.1e} x mean diagonal ({scale:.3g}) after {max_tries} tries"
                f"{detail()}")
