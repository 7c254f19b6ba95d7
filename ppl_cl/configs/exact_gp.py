"""Settings of :class:`ppl_cl.learners.exact_gp.ExactGP`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["ExactGPConfig"]


@dataclass(frozen=True)
class ExactGPConfig:
    """Exact GP regression with type-II ML hyperparameters.

    Attributes:
        kernel: ``"se"`` (isotropic squared exponential; the VIPS reference's UCI kernel),
            ``"se-ard"``, ``"matern52"`` or ``"matern52-ard"``.
        variance, lengthscale, noise_variance: the starting hyperparameters (VIPS UCI protocol,
            guiomarpescador/vips ``experiments/uci/utils_uci.py``: 1, 1, 0.1); an ARD kernel
            copies the lengthscale to every input dimension.
        optimize: fit the hyperparameters on every ``update`` (``False`` keeps them fixed).
        min_noise_variance: floor on the noise variance during the fit (GPflow's 1e-6).
        max_iterations: L-BFGS iterations per ``update``.
    """

    kernel: Literal["se", "se-ard", "matern52", "matern52-ard"] = "se-ard"
    variance: float = 1.0
    lengthscale: float = 1.0
    noise_variance: float = 0.1
    optimize: bool = True
    min_noise_variance: float = 1e-6
    max_iterations: int = 1000

    def __post_init__(self) -> None:
        if self.kernel not in ("se", "se-ard", "matern52", "matern52-ard"):
            raise ValueError(f"kernel: expected one of se, se-ard, matern52, matern52-ard, "
                             f"received {self.kernel!r}")
        for name in ("variance", "lengthscale", "noise_variance"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, (int, float)) \
                    or not (math.isfinite(val) and val > 0):
                raise ValueError(f"{name}: expected a positive number, received {val!r}")
        if not self.min_noise_variance >= 0:
            raise ValueError(f"min_noise_variance: expected >= 0, received "
                             f"{self.min_noise_variance!r}")
        if isinstance(self.max_iterations, bool) or not isinstance(self.max_iterations, int) \
                or self.max_iterations < 1:
            raise ValueError(f"max_iterations: expected an int >= 1, received "
                             f"{self.max_iterations!r}")
