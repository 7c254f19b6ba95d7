"""Settings of :class:`ppl_cl.learners.exact_gp.ExactGP`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ppl_cl.configs.validate import check_choices, check_ints, check_positive

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
        min_noise_variance: floor on the noise variance during the fit (GPflow's 1e-6): a box
            bound under ``"log"``, the shift of the noise's softplus under ``"gpflow"``.
        max_iterations: L-BFGS iterations per ``update``.
        parametrization: what L-BFGS-B optimizes (:mod:`inference.type2ml`): ``"log"`` (log
            hyperparameters, a box bound on the noise) or ``"gpflow"`` (GPflow's ``GPR``:
            softplus of every kernel hyperparameter, softplus + ``min_noise_variance`` for the
            noise). Both reach the same optimum of a unimodal likelihood; on one with several
            basins the path, and so the basin, may differ.
        tolerance, gradient_tolerance: SciPy's ``ftol`` / ``gtol`` of the fit (GPflow's
            ``Scipy`` optimizer keeps SciPy's defaults, 2.22e-9 / 1e-5).
        reset_noise: start every refit's noise variance from ``noise_variance`` (the kernel
            hyperparameters still carry over), as the VIPS reference's exact GP (``Full_GP`` of
            ``experiments/uci/utils_uci.py`` builds each fit with ``noise_variance=0.1`` on the
            kernel of the previous fit); ``False`` warm-starts the noise too.
    """

    kernel: Literal["se", "se-ard", "matern52", "matern52-ard"] = "se-ard"
    variance: float = 1.0
    lengthscale: float = 1.0
    noise_variance: float = 0.1
    optimize: bool = True
    min_noise_variance: float = 1e-6
    max_iterations: int = 1000
    parametrization: Literal["log", "gpflow"] = "log"
    tolerance: float = 1e-9
    gradient_tolerance: float = 1e-8
    reset_noise: bool = False

    def __post_init__(self) -> None:
        check_choices(self)
        check_positive(self, "tolerance", "gradient_tolerance")
        check_positive(self, "variance", "lengthscale", "noise_variance")
        check_positive(self, "min_noise_variance", allow_zero=True)
        check_ints(self, "max_iterations")
