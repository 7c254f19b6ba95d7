"""Configs of GP-ELLA (Clingerman & Eaton 2017) and of its four baselines (Sect. 5).

Light module: standard library only. Every default is the validated setting; its comment names
the paper section or the authors' file it follows ("ours" where the paper is silent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ppl_cl.configs.validate import check_ints, check_positive

__all__ = ["GPELLAConfig", "LinearELLAConfig", "IndividualGPConfig", "SharedGPConfig",
           "MultiTaskGPConfig", "PAPER_GRID_EXPONENTS", "SMOOTHING_SCALES"]

PAPER_GRID_EXPONENTS: tuple[float, ...] = (-12.0, -8.0, -4.0, 0.0)
"""mu and lambda are tuned over exp(e) for these e (Sect. 5.2)."""






@dataclass(frozen=True)
class _SingleTaskGPFields:
    """Fields of the single-task GP fit shared by GP-ELLA and the GP baselines."""

    max_iterations: int = 1000
    """Cap on the L-BFGS iterations of each type-II ML fit. Sect. 5.2 stops every fit after 50;
    at 50 about half of the per-task fits have not converged and eq. 5 would be expanded where
    the fit stopped, so the fits run to convergence (``fit_tolerance``; 50-250 iterations on
    the paper's data sets) and the cap only guards against a fit that does not (ours)."""
    fit_tolerance: float = 1e-10
    """Relative reduction of the NLL at which L-BFGS stops (SciPy ``ftol``; ours: at 1e-9 a
    few fits end with negative curvature beyond round-off, at 1e-10 none on 30-task subsets
    of the five data sets)."""
    min_noise_variance: float = 1e-6
    """Floor on the noise variance (Sect. 5.2's "self-noise" 1e-6, read as a floor of the
    learned noise: fixing 1e-6 would interpolate noisy targets)."""
    init_noise_ratio: float = 0.1
    """Initial noise variance as a fraction of the task's target variance (ours)."""
    theta_lower: float = 1e-8
    """Lower box bound on each inverse squared lengthscale during the fit (ours)."""
    theta_upper: float = 1e6
    """Upper box bound on each inverse squared lengthscale during the fit (ours)."""
    pad_multiple: int = 16
    """Task data are padded to a multiple of this many rows (compiled-shape reuse; exact)."""

    def _check_gp(self) -> None:
        check_ints(self, "max_iterations", "pad_multiple")
        check_positive(self, "min_noise_variance", "init_noise_ratio", "theta_lower", "theta_upper",
                  "fit_tolerance")
        if self.theta_upper <= self.theta_lower:
            raise ValueError(f"theta_upper: expected > theta_lower ({self.theta_lower}), "
                             f"received {self.theta_upper}")


SMOOTHING_SCALES = ("heldout", "median", "fixed")
"""How the variance of Sect. 4.4's smoothing weights is chosen (see ``_SmoothingFields``)."""


@dataclass(frozen=True)
class _SmoothingFields:
    """Sect. 4.4's prediction smoothing: a task's prediction is the average of the
    predictions made on its data with every known task's kernel, weighted by
    ``exp(-|z_t - z_t'|^2 / (2 v))`` where ``z`` are the kernels' parameters in the coded
    parametrization."""

    smoothing_scale: Literal["median", "heldout", "fixed"] = "median"
    """How ``v`` is chosen. ``"median"`` (default): ``v = smoothing_ratio * m / 2`` with ``m``
    the median of ``|z_t - z_t'|^2`` over pairs of known tasks (ratio 1: a task at the median
    distance weighs ``1/e`` of the task itself; 0: no smoothing; inf: uniform weights); the
    experiments tune the ratio with k, mu and lambda on the first five tasks' validation
    data, which no fit saw. ``"heldout"``: ``v`` from ``{0} u {r m / 2 : r in smoothing_grid}
    u {inf}`` minimizing the squared error of the smoothed mean on the held-out parts of all
    known tasks (the line search's split; the fits saw those points, which favours each
    task's own kernel). ``"fixed"``: ``smoothing_variance`` (Sect. 5.2: 100, a value for the
    paper's parametrization; for inverse squared lengthscales of standardized features
    ``|dz|^2`` is far below 200 and the weights are uniform) (ours)."""
    smoothing_ratio: float = 1.0
    """``r`` of ``smoothing_scale="median"`` (>= 0, ``inf`` allowed)."""
    smoothing_variance: float = 100.0
    """``v`` of ``smoothing_scale="fixed"`` (Sect. 5.2: 100)."""
    smoothing_grid: tuple[float, ...] = (1 / 16, 1 / 4, 1.0, 4.0, 16.0)
    """Ratios ``r`` tried by ``"heldout"`` and by the experiments' tuning, besides 0 and inf
    (ours)."""
    holdout_fraction: float = 0.2
    """Fraction of a task's training data held out for the line search and the ``"heldout"``
    scale (ours; the paper gives none)."""

    def _check_smoothing(self) -> None:
        check_positive(self, "smoothing_variance")
        r = self.smoothing_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or math.isnan(r) or r < 0:
            raise ValueError(f"smoothing_ratio: expected a number >= 0 (inf allowed), received "
                             f"{r!r}")
        if self.smoothing_scale not in SMOOTHING_SCALES:
            raise ValueError(f"smoothing_scale: expected one of {SMOOTHING_SCALES}, received "
                             f"{self.smoothing_scale!r}")
        grid = tuple(float(v) for v in self.smoothing_grid)
        if not grid or not all(math.isfinite(v) and v > 0 for v in grid):
            raise ValueError(f"smoothing_grid: expected positive finite multiples, received "
                             f"{self.smoothing_grid!r}")
        object.__setattr__(self, "smoothing_grid", grid)
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction: expected a number in (0, 1), received "
                             f"{self.holdout_fraction!r}")


@dataclass(frozen=True)
class GPELLAConfig(_SmoothingFields, _SingleTaskGPFields):
    """GP-ELLA (Algorithm 1 with the prediction of Sect. 4.4)."""

    parametrization: Literal["log_theta", "theta"] = "log_theta"
    """What the basis codes: ``"log_theta"`` (default), ``log theta_t = L s_t`` with eq. 5
    expanded in ``log theta``, where the fit (L-BFGS on log hyperparameters) ends at a
    stationary point and the Hessian is positive semi-definite at a minimum; ``"theta"``,
    the paper's ``theta_t = L s_t`` with the theta-Hessian, indefinite wherever a feature's
    ``theta_a`` goes to 0 (ours; App. A and Sect. 4.2 use ``theta``)."""

    num_components: int = 6
    """k, columns of the basis L (Sect. 5.2 tunes k over 2, 4, ..., 2d on the first five
    tasks; the experiments do; 6 is the synthetic set's number of latent bases)."""
    mu: float = math.exp(-4.0)
    """L1 weight of eq. 3 (tuned over exp{-12, -8, -4, 0}, Sect. 5.2; the experiments do)."""
    lam: float = math.exp(-4.0)
    """Frobenius weight of eq. 3 (tuned over exp{-12, -8, -4, 0}, Sect. 5.2)."""
    max_inner_iterations: int = 2
    """Alternations of sparse coding (eq. 7) and basis update (eq. 8) per task (Algorithm 1,
    "until converged"; ELLA's code does one). The alternation converges linearly and slowly:
    the first two carry the new task into L, each later one changes L by about 1e-3 to 2e-2
    of its norm (20-task runs on robot arm and schools), so more alternations cost a LASSO and
    a basis solve each for little change (ours)."""
    inner_tolerance: float = 1e-2
    """Relative Frobenius change of L that ends the alternation: a task that moves L by less
    than 1 % is not coded again (ours)."""
    hessian: Literal["autodiff", "closed_form"] = "closed_form"
    """How H_t (eq. 6) is computed: App. A eqs. 12-14 from one Cholesky (the paper's route,
    the faster one), or ``jax.hessian`` of the NLL (the check; equal to round-off, tested)."""
    line_search: bool = True
    """Choose sigma_f^2 by line search on held-out training data (Sect. 4.4: "in the label
    prediction step, we hold out a portion of the training data as a verification test set":
    the fit, the Hessian and the code saw all training data; the held-out part is held out
    from the GP that predicts it)."""
    line_search_log10_range: tuple[float, float] = (-2.0, 2.0)
    """Grid of sigma_f^2 = fitted value x 10^u over this range of u (ours)."""
    line_search_points: int = 17
    """Points of that grid (ours)."""
    smoothing: bool = True
    """Average the predictions made with every known task's theta (Sect. 4.4)."""
    seed: int = 0
    """Seed of the basis initialization L ~ N(0, 1) and of column re-initialization."""

    def __post_init__(self) -> None:
        self._check_gp()
        check_ints(self, "num_components", "max_inner_iterations", "line_search_points")
        check_positive(self, "mu", "lam", "inner_tolerance")
        self._check_smoothing()
        if self.hessian not in ("autodiff", "closed_form"):
            raise ValueError(f"hessian: expected 'autodiff' or 'closed_form', received "
                             f"{self.hessian!r}")
        if self.parametrization not in ("log_theta", "theta"):
            raise ValueError(f"parametrization: expected 'log_theta' or 'theta', received "
                             f"{self.parametrization!r}")
        r = tuple(float(v) for v in self.line_search_log10_range)
        if len(r) != 2 or not r[0] <= 0.0 <= r[1]:
            raise ValueError(f"line_search_log10_range: expected (low, high) with low <= 0 <= "
                             f"high, received {self.line_search_log10_range!r}")
        object.__setattr__(self, "line_search_log10_range", r)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed: expected an int, received {self.seed!r}")


@dataclass(frozen=True)
class LinearELLAConfig:
    """ELLA with linear-regression base learners (Ruvolo & Eaton 2013; paulruvolo/ELLA)."""

    num_components: int = 6
    """k (tuned like GP-ELLA's, Sect. 5.2)."""
    mu: float = math.exp(-4.0)
    """L1 weight (tuned, Sect. 5.2)."""
    lam: float = math.exp(-4.0)
    """Frobenius weight (tuned, Sect. 5.2)."""
    ridge: float = 1e-3
    """Ridge on the single-task linear fit, needed when a task has fewer points than features
    (ELLA's code offers Ridge as a base learner; the value is ours)."""
    max_inner_iterations: int = 1
    """Sparse-code / basis alternations per task (ELLA's code: 1)."""
    inner_tolerance: float = 1e-6
    """As in GP-ELLA."""
    seed: int = 0
    """Seed of L ~ N(0, 1) (ELLA.py: np.random.randn(d, k))."""

    def __post_init__(self) -> None:
        check_ints(self, "num_components", "max_inner_iterations")
        check_positive(self, "mu", "lam", "ridge", "inner_tolerance")


@dataclass(frozen=True)
class IndividualGPConfig(_SmoothingFields, _SingleTaskGPFields):
    """One exact GP per task (Sect. 5, "Indiv. GPs"): the same fit as GP-ELLA's, no transfer.

    With ``smoothing=True`` it predicts with GP-ELLA's Sect. 4.4 smoothing over the known
    tasks' fitted kernels (an ablation: what the smoothing gives without the basis), the
    distances taken in ``smoothing_parametrization``."""

    smoothing: bool = False
    """Average the predictions made with every known task's fitted theta (Sect. 4.4's
    smoothing, as GP-ELLA's; off for the baseline)."""
    smoothing_parametrization: Literal["log_theta", "theta"] = "log_theta"
    """Where the distances between fitted kernels are taken (GP-ELLA's ``parametrization``)."""
    seed: int = 0
    """Seed of the held-out split of the smoothing's ``"heldout"`` scale (as GP-ELLA's)."""

    def __post_init__(self) -> None:
        self._check_gp()
        self._check_smoothing()
        if self.smoothing_parametrization not in ("log_theta", "theta"):
            raise ValueError(f"smoothing_parametrization: expected 'log_theta' or 'theta', "
                             f"received {self.smoothing_parametrization!r}")


@dataclass(frozen=True)
class SharedGPConfig(_SingleTaskGPFields):
    """One GP over the pooled data of all tasks (Sect. 5, "Shared GP")."""

    max_train: int = 1000
    """At most this many pooled training points (a random subset) are fit and conditioned on:
    an exact GP on all pooled data (7,681 points on schools) costs minutes per L-BFGS
    iteration on one core (ours; the paper used all)."""
    seed: int = 0
    """Seed of that subset."""

    def __post_init__(self) -> None:
        self._check_gp()
        check_ints(self, "max_train")


@dataclass(frozen=True)
class MultiTaskGPConfig(_SingleTaskGPFields):
    """Batch multi-task GP, ICM (Bonilla et al. 2008): k((x,t),(x',t')) = B_tt' k_x(x, x')."""

    rank: int = 1
    """Rank of W in B = W W^T + diag(kappa) (Sect. 5.2 uses the rank-1 approximation)."""
    max_train: int = 1000
    """At most this many pooled training points (see SharedGPConfig.max_train)."""
    seed: int = 0
    """Seed of that subset."""

    def __post_init__(self) -> None:
        self._check_gp()
        check_ints(self, "rank", "max_train")
