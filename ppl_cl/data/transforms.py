"""Feature / target transforms fitted on training data.

z-scoring (``z = (x - mean) / scale`` per column, statistics of the training split only) is what
the UCI experiments of VIPS (Pescador-Barrios et al. 2024, Table 1; protocol in
"z-score X and y") and the exact-GP baselines use; predictions are
mapped back with :meth:`Standardizer.inverse_transform` (means) and
:meth:`Standardizer.inverse_transform_variance` (predictive variances).
"""

from __future__ import annotations

import numpy as np

from ppl_cl.data.loaders import UCISplit

__all__ = ["Standardizer", "standardize_split"]


class Standardizer:
    """Column-wise z-scoring: ``z = (x - mean) / scale``.

    ``mean`` is the column mean and ``scale`` the population standard deviation (``ddof=0``, as
    ``np.std``) of the data given to :meth:`fit`. A constant column (max == min, e.g. two columns
    of the naval propulsion set) gets ``mean`` = its value and ``scale = 1``: it maps to exactly
    0 and :meth:`inverse_transform` restores it exactly. Everything is computed and returned in float64.

    Fitted on ``x (n, d)`` the statistics have shape ``(d,)`` and :meth:`transform` accepts
    ``(..., d)``; fitted on ``y (n,)`` they are 0-d and :meth:`transform` accepts any shape.

    Attributes:
        mean: column means (``None`` before :meth:`fit`).
        scale: column standard deviations, 1 for constant columns (``None`` before :meth:`fit`).
    """

    def __init__(self) -> None:
        self.mean: np.ndarray | None = None
        self.scale: np.ndarray | None = None

    def fit(self, x) -> "Standardizer":
        """Estimate ``mean`` and ``scale`` from ``x`` of shape ``(n,)`` or ``(n, d)``, n >= 1."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim not in (1, 2):
            raise ValueError(f"fit expects an array of shape (n,) or (n, d), got {x.shape}")
        if x.shape[0] == 0:
            raise ValueError("cannot fit a Standardizer on 0 rows")
        if not np.all(np.isfinite(x)):
            raise ValueError("cannot fit a Standardizer on non-finite values (NaN or inf)")
        # a constant column: its value exactly (x.mean() can be off by an ulp), and scale 1
        constant = np.ptp(x, axis=0) == 0
        self.mean = np.where(constant, x[0], x.mean(axis=0))
        self.scale = np.where(constant, 1.0, x.std(axis=0))
        return self

    def _checked(self, x) -> np.ndarray:
        if self.mean is None:
            raise RuntimeError("Standardizer is not fitted; call fit(x_train) first")
        x = np.asarray(x, dtype=np.float64)
        if self.mean.ndim == 1 and (x.ndim == 0 or x.shape[-1] != self.mean.shape[0]):
            raise ValueError(f"expected trailing dimension {self.mean.shape[0]}, "
                             f"got shape {x.shape}")
        return x

    def transform(self, x) -> np.ndarray:
        """``(x - mean) / scale``, same shape as ``x``, float64."""
        x = self._checked(x)
        return (x - self.mean) / self.scale

    def fit_transform(self, x) -> np.ndarray:
        """``fit(x)`` then ``transform(x)``."""
        return self.fit(x).transform(x)

    def inverse_transform(self, z) -> np.ndarray:
        """``z * scale + mean``: back to the original units (e.g. a predictive mean)."""
        z = self._checked(z)
        return z * self.scale + self.mean

    def inverse_transform_variance(self, variance) -> np.ndarray:
        """``variance * scale**2``: a variance in standardized units back to original units.

        If ``z = (y - mean) / scale`` then ``Var[y] = scale**2 Var[z]`` (a predictive variance of
        a GP fitted on z-scored targets, for RMSE / NLPD in the units of the paper tables).
        """
        variance = self._checked(variance)
        if np.any(variance < 0):
            raise ValueError("variances must be non-negative")
        return variance * self.scale**2

    def state_dict(self) -> dict:
        """``{"mean": ..., "scale": ...}`` (arrays; for a learner's ``state_dict``)."""
        if self.mean is None:
            raise RuntimeError("Standardizer is not fitted; nothing to save")
        return {"mean": self.mean.copy(), "scale": self.scale.copy()}

    @classmethod
    def from_state_dict(cls, state: dict) -> "Standardizer":
        """Rebuild a fitted Standardizer from :meth:`state_dict`."""
        mean = np.asarray(state["mean"], dtype=np.float64)
        scale = np.asarray(state["scale"], dtype=np.float64)
        if mean.shape != scale.shape or mean.ndim > 1:
            raise ValueError(f"mean and scale must share a shape () or (d,), "
                             f"got {mean.shape} and {scale.shape}")
        if not np.all(scale > 0):
            raise ValueError("scale must be positive")
        out = cls()
        out.mean, out.scale = mean, scale
        return out


def standardize_split(split: UCISplit) -> tuple[UCISplit, Standardizer, Standardizer]:
    """z-score a :class:`~ppl_cl.data.loaders.UCISplit` with statistics of its training part.

    Returns:
        ``(standardized split, x_standardizer, y_standardizer)``; the test part is transformed
        with the training statistics (no test information leaks into the transform).
    """
    x_standardizer = Standardizer().fit(split.x_train)
    y_standardizer = Standardizer().fit(split.y_train)
    standardized = UCISplit(
        x_train=x_standardizer.transform(split.x_train),
        y_train=y_standardizer.transform(split.y_train),
        x_test=x_standardizer.transform(split.x_test),
        y_test=y_standardizer.transform(split.y_test),
    )
    return standardized, x_standardizer, y_standardizer
