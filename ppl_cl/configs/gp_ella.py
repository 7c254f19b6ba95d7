"""Configs of GP-ELLA (Clingerman & Eaton 2017) and of its four baselines (Sect. 5).

Light module: standard library only. Every default is the validated setting; its comment names
the paper section or the authors' file it follows ("ours" where the paper is silent).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["GPELLAConfig", "LinearELLAConfig", "IndividualGPConfig", "SharedGPConfig",
           "MultiTaskGPConfig", "PAPER_GRID_EXPONENTS"]

PAPER_GRID_EXPONENTS: tuple[float, ...] = (-12.0, -8.0, -4.0, 0.0)
"""mu and lambda are tuned over exp(e) for these e (Sect. 5.2)."""


def _positive(obj, *names: str) -> None:
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{name}: expected a positive number, received {v!r}")


def _positive_int(obj, *names: str) -> None:
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an int >= 1, received {v!r}")


@dataclass(frozen=True)
class _SingleTaskGPFields:
    """Fields of the single-task GP fit shared by GP-ELLA and the GP baselines."""

    max_iterations: int = 50
    """L-BFGS iterations of each type-II ML fit (Sect. 5.2: 50 for all algorithms)."""
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
        _positive_int(self, "max_iterations", "pad_multiple")
        _positive(self, "min_noise_variance", "init_noise_ratio", "theta_lower", "theta_upper")
        if self.theta_upper <= self.theta_lower:
            raise ValueError(f"theta_upper: expected > theta_lower ({self.theta_lower}), "
                             f"received {self.theta_upper}")


@dataclass(frozen=True)
class GPELLAConfig(_SingleTaskGPFields):
    """GP-ELLA (Algorithm 1 with the prediction of Sect. 4.4)."""

    num_components: int = 6
    """k, columns of the basis L (Sect. 5.2 tunes k over 2, 4, ..., 2d on the first five
    tasks; the experiments do; 6 is the synthetic set's number of latent bases)."""
    mu: float = math.exp(-4.0)
    """L1 weight of eq. 3 (tuned over exp{-12, -8, -4, 0}, Sect. 5.2; the experiments do)."""
    lam: float = math.exp(-4.0)
    """Frobenius weight of eq. 3 (tuned over exp{-12, -8, -4, 0}, Sect. 5.2)."""
    max_inner_iterations: int = 5
    """Alternations of sparse coding (eq. 7) and basis update (eq. 8) per task (Algorithm 1,
    "until converged"; ELLA's code does one)."""
    inner_tolerance: float = 1e-6
    """Relative Frobenius change of L that ends the alternation (ours)."""
    hessian: Literal["autodiff", "closed_form"] = "closed_form"
    """How H_t (eq. 6) is computed: App. A eqs. 12-14 from one Cholesky (the paper's route,
    the faster one), or ``jax.hessian`` of the NLL (the check; equal to round-off, tested)."""
    line_search: bool = True
    """Choose sigma_f^2 by line search on held-out training data (Sect. 4.4)."""
    holdout_fraction: float = 0.2
    """Fraction of a task's training data held out for the line search (ours; the paper
    gives none)."""
    line_search_log10_range: tuple[float, float] = (-2.0, 2.0)
    """Grid of sigma_f^2 = fitted value x 10^u over this range of u (ours)."""
    line_search_points: int = 17
    """Points of that grid (ours)."""
    smoothing: bool = True
    """Average the predictions made with every known task's theta (Sect. 4.4)."""
    smoothing_variance: float = 100.0
    """Variance of the weight exp(-|theta_t - theta_t'|^2 / (2 v)) (Sect. 5.2: 100)."""
    seed: int = 0
    """Seed of the basis initialization L ~ N(0, 1) and of column re-initialization."""

    def __post_init__(self) -> None:
        self._check_gp()
        _positive_int(self, "num_components", "max_inner_iterations", "line_search_points")
        _positive(self, "mu", "lam", "inner_tolerance", "smoothing_variance")
        if self.hessian not in ("autodiff", "closed_form"):
            raise ValueError(f"hessian: expected 'autodiff' or 'closed_form', received "
                             f"{self.hessian!r}")
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction: expected a number in (0, 1), received "
                             f"{self.holdout_fraction!r}")
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
        _positive_int(self, "num_components", "max_inner_iterations")
        _positive(self, "mu", "lam", "ridge", "inner_tolerance")


@dataclass(frozen=True)
class IndividualGPConfig(_SingleTaskGPFields):
    """One exact GP per task (Sect. 5, "Indiv. GPs"): the same fit as GP-ELLA's, no transfer."""

    def __post_init__(self) -> None:
        self._check_gp()


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
        _positive_int(self, "max_train")


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
        _positive_int(self, "rank", "max_train")


def replace(config, **overrides):
    """``dataclasses.replace`` that names the config class in the error for unknown fields."""
    names = {f.name for f in dataclasses.fields(config)}
    bad = sorted(set(overrides) - names)
    if bad:
        raise TypeError(f"{type(config).__name__}: unknown field(s) {bad}; fields: {sorted(names)}")
    return dataclasses.replace(config, **overrides)
