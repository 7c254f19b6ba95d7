"""Predictive distributions returned by every learner's ``predict``.

Two families cover the five methods:

* :class:`GaussianPredictive` — regression (exact GP, VIPS, GP-ELLA, Kalman regressor):
  per-point ``mean`` and ``variance`` of ``p(y* | x*, data)``.
* :class:`CategoricalPredictive` — classification (VAR-GP, GP-Tree, Kalman classifier):
  per-point class probabilities ``probs``.

Both hold NumPy float64 arrays (learners convert once, at the end of ``predict``), so metrics,
plots and ArviZ export work the same whatever backend produced them. ``log_prob(y)`` gives the
per-point log predictive density used by NLPD, cumulative log-loss and ``log_likelihood`` groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ppl_cl.batch import as_numpy
from ppl_cl.seeding import as_generator

__all__ = ["GaussianPredictive", "CategoricalPredictive"]

_LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class GaussianPredictive:
    """Independent Gaussian predictive per point: ``y*_i ~ N(mean_i, variance_i)``.

    Attributes:
        mean: shape ``(n,)``.
        variance: shape ``(n,)``, strictly positive (includes observation noise unless the
            learner documents otherwise).
    """

    mean: np.ndarray
    variance: np.ndarray

    def __post_init__(self) -> None:
        mean = np.asarray(as_numpy(self.mean), dtype=np.float64).reshape(-1)
        var = np.asarray(as_numpy(self.variance), dtype=np.float64).reshape(-1)
        if mean.shape != var.shape:
            raise ValueError(f"variance: expected shape {mean.shape} (as mean), received {var.shape}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "variance", var)

    @property
    def stddev(self) -> np.ndarray:
        return np.sqrt(self.variance)

    def __len__(self) -> int:
        return self.mean.shape[0]

    def log_prob(self, y) -> np.ndarray:
        """Per-point ``log N(y_i | mean_i, variance_i)``, shape ``(n,)``."""
        y = np.asarray(as_numpy(y), dtype=np.float64).reshape(-1)
        if y.shape != self.mean.shape:
            raise ValueError(f"y: expected shape {self.mean.shape}, received {y.shape}")
        return -0.5 * (_LOG_2PI + np.log(self.variance) + (y - self.mean) ** 2 / self.variance)

    def sample(self, num_samples: int = 1, seed: int | np.random.Generator | None = None) -> np.ndarray:
        """Draws of shape ``(num_samples, n)``."""
        eps = as_generator(seed).standard_normal((num_samples, self.mean.shape[0]))
        return self.mean + self.stddev * eps

    def interval(self, mass: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Central interval holding ``mass`` of each marginal."""
        from scipy.stats import norm

        z = norm.ppf(0.5 + mass / 2.0)
        return self.mean - z * self.stddev, self.mean + z * self.stddev


@dataclass(frozen=True)
class CategoricalPredictive:
    """Categorical predictive per point: ``y*_i ~ Cat(probs_i)``.

    Attributes:
        probs: shape ``(n, K)``; rows are renormalized and clipped away from 0 so that
            ``log_prob`` is finite.
    """

    probs: np.ndarray

    def __post_init__(self) -> None:
        p = np.asarray(as_numpy(self.probs), dtype=np.float64)
        if p.ndim != 2:
            raise ValueError(f"probs: expected shape (n, K), received {p.shape}")
        if not np.isfinite(p).all():
            raise ValueError("probs: expected finite probabilities, received NaN or inf")
        p = np.clip(p, 1e-300, None)
        object.__setattr__(self, "probs", p / p.sum(axis=1, keepdims=True))

    @property
    def num_classes(self) -> int:
        return self.probs.shape[1]

    @property
    def mean(self) -> np.ndarray:
        """The class probabilities (the mean of the one-hot outcome)."""
        return self.probs

    def __len__(self) -> int:
        return self.probs.shape[0]

    def predicted_class(self) -> np.ndarray:
        return self.probs.argmax(axis=1)

    def log_prob(self, y) -> np.ndarray:
        """Per-point ``log p(y_i)``, shape ``(n,)``; labels must lie in ``0..K-1``."""
        y = np.asarray(as_numpy(y)).reshape(-1)
        if y.shape[0] != self.probs.shape[0]:
            raise ValueError(f"y: expected shape ({self.probs.shape[0]},), received {y.shape}")
        if y.size and (y.min() < 0 or y.max() >= self.num_classes):
            raise ValueError(f"y: expected labels in 0..{self.num_classes - 1}, received "
                             f"{int(y.min())}..{int(y.max())}")
        return np.log(self.probs[np.arange(y.shape[0]), y.astype(np.int64)])

    def entropy(self) -> np.ndarray:
        """Per-point entropy in nats, shape ``(n,)``."""
        return -(self.probs * np.log(self.probs)).sum(axis=1)

    def accuracy(self, y) -> float:
        y = np.asarray(as_numpy(y)).reshape(-1)
        return float((self.predicted_class() == y).mean())

    def sample(self, num_samples: int = 1, seed: int | np.random.Generator | None = None) -> np.ndarray:
        """Labels of shape ``(num_samples, n)``."""
        rng = as_generator(seed)
        cdf = np.cumsum(self.probs, axis=1)
        u = rng.random((num_samples, self.probs.shape[0], 1))
        return np.minimum((u > cdf[None]).sum(axis=2), self.num_classes - 1)
