"""Settings of :class:`ppl_cl.learners.vips.OnlineSGPR` (stdlib imports only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ppl_cl.configs.validate import int_at_least, positive

__all__ = ["OnlineSGPRConfig", "POLICIES", "KERNELS", "UCI_OIPS_RHO"]

POLICIES = ("vips", "cv", "oips", "fixed")
KERNELS = ("se", "se-ard", "matern52", "constant+matern52")
#: OIPS' acceptance threshold in the authors' UCI configs (their ``OIPS.py`` default is 0.8)
UCI_OIPS_RHO = 0.96






@dataclass(frozen=True)
class OnlineSGPRConfig:
    """Online sparse GP regression (Bui et al. 2017) with an inducing-point policy.

    Attributes:
        policy: ``"vips"`` (Pescador-Barrios et al. 2024, Algorithm 1), ``"cv"`` (Conditional
            Variance, Burt et al. 2020), ``"oips"`` (Galy-Fajou & Opper 2021) or ``"fixed"``
            (a fixed number of points, Bui et al. 2017).
        delta: VIPS' tolerance (the paper's eta, Sect. 4.3; 0.05 in every experiment).
        first_delta: the tolerance of the first batch's (offline) selection; ``None``: ``delta``
            (the paper). The authors' Fig. 2a script uses 0.04 there
            (``experiments/toy/utils_regression.py``, ``init_Z``) and 0.05 after.
        lmax_points: L_max uses ``b = [X; a]`` below this batch size, else ``lmax_points - M_a``
            random rows of X (guiomarpescador/vips ``src/init_methods/VIPS.py``: 5000).
        cv_eta: Conditional Variance's residual-trace threshold (UCI configs
            ``experiments/uci/configs/*.yaml``: 0.01).
        cv_max_points: Conditional Variance's cap on M (same configs: 8000).
        oips_rho: OIPS acceptance threshold (``OIPS.py`` default 0.8; the UCI configs use 0.96).
        oips_kmin: OIPS' random start in the first batch (``OIPS.py``: 10).
        fixed_m: M of the fixed policy; fixed_method: ``"random"`` (a uniform subset of the old
            points and the batch), ``"greedy"`` (greedy variance, the fixed-M rows of VIPS Fig.
            2a) or ``"old-new"`` (70 % of M from the old points and 30 % from the batch, at
            random: the reference's fixed-memory baseline after Bui et al. 2017, whose inputs
            the reference also optimizes; see :class:`inference.vips.FixedM`).
        kernel: ``"se"`` (isotropic SE, the UCI and synthetic kernel, App. F), ``"se-ard"``,
            ``"matern52"``, or ``"constant+matern52"`` (the magnetic-field kernel, App. F.4).
        variance, lengthscale, noise_variance: initial hyperparameters (App. F.3: 1, 1, 0.1).
        constant: initial constant-kernel value of ``"constant+matern52"`` (App. F.4: 500).
        jitter: of the online bound (GPflow / ``osgpr.py``: 1e-6).
        first_selection_jitter: of the first-batch VIPS selection (``Offline_VIPS.py``: 1e-4).
        summary_jitter: added to S_b when it becomes the next q_old (``utils_uci.py``: 1e-6).
        fit: fit kernel + noise by L-BFGS after selection (App. F: "L-BFGS for all").
        variance_bounds: box on every kernel variance during the fit (``utils_uci.py``:
            a sigmoid onto [1e-6, 2e3]); ``None``: no box (softplus, as GPflow's default and the
            reference's synthetic scripts).
        min_noise_variance: noise floor (GPflow's Gaussian likelihood: 1e-6).
        max_iterations: L-BFGS iterations per batch (GPflow's ``Scipy`` passes none, so
            SciPy's L-BFGS-B default, 15000, applies).
        parametrization: what L-BFGS-B optimizes (:func:`inference.vips.fit_hyperparameters`):
            ``"gpflow"`` (the reference's GPflow transforms: sigmoid onto ``variance_bounds`` for
            the kernel variance, softplus for the lengthscale, softplus + ``min_noise_variance``
            for the noise) or ``"log"`` (log-hyperparameters with those limits as box bounds).
            On a small batch the bound can have several basins and the two may end in
            different ones; ``"gpflow"`` ends where the reference does.
        incremental: rank-one growth of the bound in greedy selection (``False``: the
            from-scratch reference, one full bound per added point, as the authors' code).
        seed: seeds the policy's randomness (L_max subsample, CV tie-break, OIPS start, fixed).
    """

    policy: Literal["vips", "cv", "oips", "fixed"] = "vips"
    delta: float = 0.05
    first_delta: float | None = None
    lmax_points: int = 5000
    cv_eta: float = 0.01
    cv_max_points: int = 8000
    oips_rho: float = 0.8
    oips_kmin: int = 10
    fixed_m: int = 100
    fixed_method: Literal["random", "greedy", "old-new"] = "random"
    kernel: Literal["se", "se-ard", "matern52", "constant+matern52"] = "se"
    variance: float = 1.0
    lengthscale: float = 1.0
    noise_variance: float = 0.1
    constant: float = 500.0
    jitter: float = 1e-6
    first_selection_jitter: float = 1e-4
    summary_jitter: float = 1e-6
    fit: bool = True
    variance_bounds: tuple[float, float] | None = (1e-6, 2e3)
    min_noise_variance: float = 1e-6
    max_iterations: int = 15000
    parametrization: Literal["gpflow", "log"] = "gpflow"
    incremental: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, received "
                             f"{self.policy!r}")
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel: expected one of {', '.join(KERNELS)}, received "
                             f"{self.kernel!r}")
        if self.parametrization not in ("gpflow", "log"):
            raise ValueError(f"parametrization: expected 'gpflow' or 'log', received "
                             f"{self.parametrization!r}")
        if self.fixed_method not in ("random", "greedy", "old-new"):
            raise ValueError(f"fixed_method: expected 'random', 'greedy' or 'old-new', "
                             f"received {self.fixed_method!r}")
        for name in ("delta", "first_delta"):
            v = getattr(self, name)
            if name == "first_delta" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ValueError(f"{name}: expected a number in [0, 1], received {v!r}")
        if isinstance(self.oips_rho, bool) or not isinstance(self.oips_rho, (int, float)) \
                or not 0.0 < self.oips_rho < 1.0:
            raise ValueError(f"oips_rho: expected a number in (0, 1), received {self.oips_rho!r}")
        if isinstance(self.cv_eta, bool) or not isinstance(self.cv_eta, (int, float)) \
                or not self.cv_eta >= 0:
            raise ValueError(f"cv_eta: expected a number >= 0, received {self.cv_eta!r}")
        for name in ("variance", "lengthscale", "noise_variance", "constant", "jitter",
                     "first_selection_jitter"):
            positive(name, getattr(self, name))
        if not self.summary_jitter >= 0:
            raise ValueError(f"summary_jitter: expected >= 0, received {self.summary_jitter!r}")
        if not self.min_noise_variance >= 0:
            raise ValueError(f"min_noise_variance: expected >= 0, received "
                             f"{self.min_noise_variance!r}")
        if self.variance_bounds is not None:
            # a config read back from JSON holds a list
            object.__setattr__(self, "variance_bounds", tuple(self.variance_bounds))
            lo, hi = self.variance_bounds
            if not (0 < lo < hi):
                raise ValueError(f"variance_bounds: expected 0 < low < high (or None), "
                                 f"received {self.variance_bounds!r}")
        int_at_least("lmax_points", self.lmax_points, 1)
        int_at_least("cv_max_points", self.cv_max_points, 1)
        int_at_least("oips_kmin", self.oips_kmin, 1)
        int_at_least("fixed_m", self.fixed_m, 1)
        int_at_least("max_iterations", self.max_iterations, 1)
        int_at_least("seed", self.seed, 0)
