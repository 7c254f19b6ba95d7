"""GP-ELLA engines (Clingerman & Eaton 2017, Sect. 4.3-4.4, Algorithm 1) and linear ELLA
(Ruvolo & Eaton 2013).

* :func:`fit_single_task` — the single-task GP (type-II ML of eq. 4 by L-BFGS in log space,
  :mod:`inference.type2ml`, run to convergence by default) returning ``theta_t``, the gradient
  and the Hessian ``H_t`` of eq. 6, by autodiff (``jax.hessian``, forward over reverse through
  the Cholesky) or by the closed form of App. A
  (:func:`models.gp_ella.gradient_and_hessian_closed_form`, one Cholesky). Task data are padded
  to a multiple of ``pad_multiple`` rows (:func:`pad_rows`) so that every compiled function is
  reused by all tasks of the same padded size. :func:`expansion` gives the point and Hessian
  of eq. 5 in the coded parametrization (``theta`` or ``log theta``,
  :func:`models.gp_ella.log_theta_hessian`); :func:`has_negative_curvature` says whether a
  Hessian is indefinite beyond round-off (the fit did not end at a minimum).
* :func:`sparse_code` — eq. 7: ``s = argmin |theta - L s|_H^2 + mu |s|_1``, a LASSO on
  ``(H^1/2 L, H^1/2 theta)`` solved by scikit-learn's ``LassoLars`` (the Lasso objective
  ``1/(2 n) |y - X w|^2 + alpha |w|_1``, ``n = d`` rows here, so ``alpha = mu / (2 d)``,
  solved exactly by the LARS homotopy: the ``H^1/2 L`` of GP tasks are so ill-conditioned
  that ``Lasso``'s coordinate descent stopped at 10,000 sweeps short of the minimum on 37 of
  200 problems of the synthetic tasks, up to 49 % above it).
  (ELLA's Python code passes ``mu / (2 n_t)`` with ``n_t`` the task's number of instances;
  that is the same objective with ``mu`` rescaled by ``d / n_t``. We follow eq. 10.)
* :class:`ELLAEngine` — eqs. 8-9 with running sums (ELLA, ``paulruvolo/ELLA``):
  ``A += kron(s s^T, H)``, ``b += kron(s, H theta)``, ``vec(L) = (A/T + lambda I)^-1 b / T``
  (the exact minimizer of eq. 9 for the stored codes, column-major ``vec``), so a task costs
  ``O((dk)^3)`` whatever ``T``; alternated with the sparse coding of the current task until
  ``L`` stops changing (Algorithm 1's inner loop); ``H_t`` enters as its positive
  semi-definite part (:func:`psd_part`); new data for a known task first removes that
  task's old contribution from ``A`` and ``b`` (Algorithm 1's "else" branch). Columns of ``L``
  that are zero afterwards (used by no task) are drawn again from N(0, 1) (ELLA's
  ``revive_dead_components``; ELLA tests ``|sum of column| < 1e-8``, we test the norm).
* :func:`line_search_signal_variance`, :func:`kernel_predictions`, :func:`smoothing_weights`,
  :func:`choose_smoothing_variance`, :func:`smoothed_prediction` — Sect. 4.4.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from inference.type2ml import fit_type2ml
from models.gp_ella import (PARAMETRIZATIONS, TaskHyperparameters,
                            gradient_and_hessian_closed_form, log_theta_hessian,
                            negative_log_marginal_likelihood, nll_of_hyperparameters,
                            predict_task)
from models.linalg_jax import jitter_cholesky

__all__ = ["pad_rows", "SingleTaskFit", "fit_single_task", "hessian_autodiff", "expansion",
           "has_negative_curvature", "fit_linear_task", "psd_part", "hessian_sqrt",
           "sparse_code", "ELLAState", "ELLAInfo", "ELLAEngine", "basis_from_sums",
           "line_search_signal_variance", "kernel_predictions", "smoothing_weights",
           "effective_number_of_tasks", "median_squared_distance", "choose_smoothing_variance",
           "smoothed_prediction", "heldout_split", "PREDICT_CHUNK"]


# ---------------------------------------------------------------------------------------------
# single-task GP fit
# ---------------------------------------------------------------------------------------------
def pad_rows(X: np.ndarray, y: np.ndarray | None = None, multiple: int = 16
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pad ``X (n, d)`` and ``y (n,)`` with zero rows to a multiple of ``multiple`` rows.

    Returns ``(X_pad (N, d), y_pad (N,), mask (N,))``; ``mask`` is 1 on the real rows.
    """
    n, d = X.shape
    N = max(multiple, int(math.ceil(n / multiple)) * multiple)
    Xp = np.zeros((N, d))
    Xp[:n] = X
    yp = np.zeros(N)
    if y is not None:
        yp[:n] = y
    mask = np.zeros(N)
    mask[:n] = 1.0
    return Xp, yp, mask


class SingleTaskFit(NamedTuple):
    """Outcome of :func:`fit_single_task`.

    Attributes:
        theta: ``(d,)`` fitted inverse squared lengthscales (``theta_hat_t``).
        signal_variance: fitted ``sigma_f^2``.
        noise_variance: fitted ``sigma^2``.
        hessian: ``(d, d)`` ``H_t = grad^2_theta NLL`` at the optimum (eq. 6).
        nll: negative log marginal likelihood at the optimum.
        iterations: L-BFGS iterations.
        converged: SciPy's success flag (False when the iteration cap was hit).
        constant_targets: the targets were constant: no fit (theta = 0, H = 0).
        gradient: ``(d,)`` ``grad_theta NLL`` at the optimum (zeros where not computed).
    """

    theta: np.ndarray
    signal_variance: float
    noise_variance: float
    hessian: np.ndarray
    nll: float
    iterations: int
    converged: bool
    constant_targets: bool = False
    gradient: np.ndarray | None = None


def _nll_theta(theta, signal_variance, noise_variance, X, y, mask):
    return negative_log_marginal_likelihood(
        TaskHyperparameters(theta, signal_variance, noise_variance), X, y, mask)


_gradient_hessian_autodiff_jit = jax.jit(
    lambda *a: (jax.grad(_nll_theta)(*a), jax.hessian(_nll_theta)(*a)))
_gradient_hessian_closed_jit = jax.jit(lambda th, sf2, s2, X, y, m: gradient_and_hessian_closed_form(
    TaskHyperparameters(th, sf2, s2), X, y, m))


def hessian_autodiff(hyp: TaskHyperparameters, X, y, mask) -> np.ndarray:
    """``grad^2_theta NLL`` ``(d, d)`` by ``jax.hessian`` (compiled once per padded size)."""
    _, H = _gradient_hessian_autodiff_jit(hyp.theta, hyp.signal_variance, hyp.noise_variance,
                                          X, y, mask)
    H = np.asarray(H)
    return 0.5 * (H + H.T)


def _require_x64() -> None:
    """The GP fits need float64 (a float32 Cholesky of ``K_sigma`` fails or loses the
    Hessian); JAX's flag is process-wide and set by the caller (``ppl_cl.numerics.enable_x64``,
    which the learners call), never here."""
    if not jax.config.read("jax_enable_x64"):
        raise RuntimeError("fit_single_task needs float64 JAX: call "
                           "jax.config.update('jax_enable_x64', True) (the GP-ELLA learners do, "
                           "through ppl_cl.numerics.enable_x64) before fitting")


def fit_single_task(X: np.ndarray, y: np.ndarray, *, max_iterations: int = 1000,
                    tolerance: float = 1e-10, min_noise_variance: float = 1e-6,
                    theta_bounds: tuple[float, float] = (1e-8, 1e6),
                    init_theta: float | None = None, init_noise_ratio: float = 0.1,
                    hessian: str = "autodiff", pad_multiple: int = 16,
                    with_hessian: bool = True) -> SingleTaskFit:
    """Type-II ML of one task's GP (eq. 4, over ``theta``, ``sigma_f^2`` and ``sigma^2``) and
    the gradient and Hessian of eq. 6 at the optimum.

    Args:
        X: ``(n, d)`` inputs; y: ``(n,)`` targets (centred by the caller).
        max_iterations: L-BFGS iteration cap (Sect. 5.2 uses 50; the default runs the fit to
            convergence so that eq. 5 is expanded at a minimum).
        tolerance: relative reduction of the NLL at which L-BFGS stops (SciPy ``ftol``).
        min_noise_variance: floor on ``sigma^2`` (Sect. 5.2's "self-noise" 1e-6).
        theta_bounds: box on each ``theta_a`` during the fit.
        init_theta: starting ``theta_a`` (default ``1 / d``: lengthscale ``sqrt(d)``).
        init_noise_ratio: starting ``sigma^2 = ratio * var(y)``; ``sigma_f^2`` starts at
            ``var(y)``.
        hessian: ``"autodiff"`` or ``"closed_form"`` (App. A).
        pad_multiple: rows are padded to a multiple of this (compiled-shape reuse).
        with_hessian: False skips ``H`` and the gradient (individual-GP baseline).

    Raises:
        RuntimeError: if JAX float64 is not enabled.
    """
    _require_x64()
    X = np.asarray(X, np.float64)
    y = np.asarray(y, np.float64)
    n, d = X.shape
    var_y = float(np.var(y)) if n else 0.0
    if n == 0 or var_y <= 1e-12 * max(1.0, float(np.mean(y * y))):
        return SingleTaskFit(np.zeros(d), float(max(min_noise_variance, 1e-12)),
                             float(min_noise_variance), np.zeros((d, d)), float("nan"), 0, True,
                             True, np.zeros(d))
    Xp, yp, mask = pad_rows(X, y, pad_multiple)
    data = (jnp.asarray(Xp), jnp.asarray(yp), jnp.asarray(mask))
    th0 = (1.0 / d) if init_theta is None else float(init_theta)
    init = TaskHyperparameters(jnp.full((d,), th0), jnp.asarray(var_y),
                               jnp.asarray(max(init_noise_ratio * var_y, 10 * min_noise_variance)))
    lo = TaskHyperparameters(theta_bounds[0], 1e-10 * var_y, min_noise_variance)
    hi = TaskHyperparameters(theta_bounds[1], 0.0, 0.0)
    res = fit_type2ml(nll_of_hyperparameters, init, data=data, lower_bounds=lo, upper_bounds=hi,
                      max_iterations=max_iterations, tolerance=tolerance)
    hyp = res.params
    H, g = np.zeros((d, d)), np.zeros(d)
    if with_hessian:
        args = (hyp.theta, hyp.signal_variance, hyp.noise_variance, *data)
        if hessian == "autodiff":
            g, H = _gradient_hessian_autodiff_jit(*args)
        elif hessian == "closed_form":
            g, H = _gradient_hessian_closed_jit(*args)
        else:
            raise ValueError(f"hessian: expected 'autodiff' or 'closed_form', received {hessian!r}")
        g, H = np.asarray(g), np.asarray(H)
        H = 0.5 * (H + H.T)
    return SingleTaskFit(np.asarray(hyp.theta), float(hyp.signal_variance),
                         float(hyp.noise_variance), H, float(res.value), res.num_iterations,
                         res.converged, False, g)


def expansion(fit: SingleTaskFit, parametrization: str = "log_theta"
              ) -> tuple[np.ndarray, np.ndarray]:
    """The point and Hessian of eq. 5's expansion in the coded parametrization:
    ``(theta_hat, H)`` for ``"theta"`` (the paper's), ``(log theta_hat, H^u)`` for
    ``"log_theta"`` (:func:`models.gp_ella.log_theta_hessian`), where the fit (L-BFGS on log
    hyperparameters) ends at a stationary point. A constant-target task (no fit) gives a zero
    point and a zero Hessian: it carries no information about the kernel."""
    if parametrization not in PARAMETRIZATIONS:
        raise ValueError(f"parametrization: expected one of {PARAMETRIZATIONS}, received "
                         f"{parametrization!r}")
    d = fit.theta.shape[0]
    if fit.constant_targets:
        return np.zeros(d), np.zeros((d, d))
    if parametrization == "theta":
        return np.asarray(fit.theta, np.float64), np.asarray(fit.hessian, np.float64)
    g = np.zeros(d) if fit.gradient is None else np.asarray(fit.gradient, np.float64)
    theta = np.asarray(fit.theta, np.float64)
    return np.log(theta), log_theta_hessian(theta, g, np.asarray(fit.hessian, np.float64))


def has_negative_curvature(H: np.ndarray, rtol: float = 1e-4, atol: float = 1e-4) -> bool:
    """Whether ``H`` has an eigenvalue below ``-(rtol * lambda_max + atol)``: negative
    curvature beyond what a converged fit leaves (its residual gradient puts eigenvalues of
    about +-1e-5 in the directions the data do not determine; a fit stopped early or at a
    bound in ``theta`` leaves far larger ones). ``atol`` is in NLL units per squared unit of
    the parametrization."""
    w = np.linalg.eigvalsh(0.5 * (H + H.T))
    return bool(w[0] < -(rtol * max(float(w[-1]), 0.0) + atol))


def fit_linear_task(X: np.ndarray, y: np.ndarray, ridge: float = 1e-3
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Linear base learner of ELLA: ``theta = argmin 1/(2n) |y - X theta|^2 + ridge/2 |theta|^2``
    and ``H = 1/2 grad^2 = X^T X / (2n) + ridge/2 I`` (ELLA's ``get_hessian`` for linear
    regression is ``X^T X / (2n)``, its ridge limit)."""
    X = np.asarray(X, np.float64)
    y = np.asarray(y, np.float64)
    n, d = X.shape
    G = X.T @ X / n + ridge * np.eye(d)
    Lc = np.asarray(jitter_cholesky(jnp.asarray(G), name="X^T X / n + ridge I"))
    from scipy.linalg import cho_solve

    theta = cho_solve((Lc, True), X.T @ y / n)
    return theta, 0.5 * G


# ---------------------------------------------------------------------------------------------
# sparse coding (eq. 7)
# ---------------------------------------------------------------------------------------------
def psd_part(H: np.ndarray) -> np.ndarray:
    """``H`` with its negative eigenvalues set to 0 (symmetrized first).

    ELLA's expansion (eq. 5) assumes a minimum, where ``H`` is positive semi-definite. A fit
    whose ``theta_a`` ends at its lower bound (an irrelevant feature: the likelihood would
    like ``theta_a < 0``) or stops at the iteration cap has an indefinite ``H``; its negative
    directions would reward moving away from ``theta_hat`` without limit, so they are dropped.
    """
    Hs = 0.5 * (H + H.T)
    w, V = np.linalg.eigh(Hs)
    Hp = (V * np.clip(w, 0.0, None)) @ V.T
    return 0.5 * (Hp + Hp.T)


def hessian_sqrt(H: np.ndarray) -> np.ndarray:
    """Symmetric square root of the PSD part of ``H`` (:func:`psd_part`)."""
    Hs = 0.5 * (H + H.T)
    w, V = np.linalg.eigh(Hs)
    return (V * np.sqrt(np.clip(w, 0.0, None))) @ V.T


def sparse_code(L: np.ndarray, theta: np.ndarray, H: np.ndarray, mu: float, *,
                max_iter: int = 10000, H_psd: np.ndarray | None = None
                ) -> tuple[np.ndarray, bool]:
    """``argmin_s |theta - L s|_H^2 + mu |s|_1`` (eq. 7/10) by scikit-learn's LARS-Lasso.

    The Lasso objective ``1/(2 n) |y - X w|^2 + alpha |w|_1`` is minimized exactly by the LARS
    homotopy (no tolerance: the answer does not depend on the conditioning of ``X``); with
    ``X = H^1/2 L`` (``n = d`` rows) and ``y = H^1/2 theta`` it is ``1/(2d)`` times eq. 10 when
    ``alpha = mu / (2 d)``. The path is computed from the sufficient statistics
    ``X^T X = L^T H L`` and ``X^T y = L^T H theta`` (``sklearn.linear_model.lars_path_gram``,
    the routine ``LassoLars`` runs, without the estimator's per-call overhead). ``H`` enters
    through its positive semi-definite part (:func:`psd_part`), which a caller coding the
    same task against several bases (Algorithm 1's alternations) may pass as ``H_psd``.
    ``max_iter`` caps the LARS steps.

    Returns ``(s (k,), converged)``.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import lars_path_gram

    d, k = L.shape
    Hp = psd_part(H) if H_psd is None else H_psd
    L = np.asarray(L, np.float64)
    HL = Hp @ L
    gram = 0.5 * (L.T @ HL + HL.T @ L)
    xy = HL.T @ np.asarray(theta, np.float64)
    if not np.any(gram) or not np.any(xy):
        return np.zeros(k), True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        _, _, coef = lars_path_gram(xy, gram, n_samples=d, alpha_min=mu / (2.0 * d),
                                    method="lasso", max_iter=max_iter, return_path=False)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    for w in caught:  # anything else is re-raised as a warning
        if not issubclass(w.category, ConvergenceWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return np.asarray(coef, np.float64).reshape(k), converged


# ---------------------------------------------------------------------------------------------
# the basis update (eqs. 8-9) with running sums
# ---------------------------------------------------------------------------------------------
class ELLAState(NamedTuple):
    """The continual state of (GP-)ELLA.

    Attributes:
        L: ``(d, k)`` shared basis.
        A: ``(dk, dk)`` running ``sum_t kron(s_t s_t^T, H_t)``.
        b: ``(dk,)`` running ``sum_t kron(s_t, H_t theta_t)``.
        sq: running ``sum_t theta_t^T H_t theta_t`` (for eq. 9's value from the sums).
        l1: running ``sum_t |s_t|_1``.
        num_tasks: ``T``, the tasks in the sums: seen tasks whose ``H_t`` is not zero (a task
            that carries no information about the kernel, e.g. constant targets, is stored
            with code 0 and leaves ``T``, the sums and ``L`` unchanged).
        thetas: ``(S, d)`` ``theta_hat`` per task slot; hessians: ``(S, d, d)``;
        codes: ``(S, k)`` ``s_t``; seen: ``(S,)`` whether the slot holds a task;
        counted: ``(S,)`` whether the slot's task is counted in ``T``.
    """

    L: np.ndarray
    A: np.ndarray
    b: np.ndarray
    sq: float
    l1: float
    num_tasks: int
    thetas: np.ndarray
    hessians: np.ndarray
    codes: np.ndarray
    seen: np.ndarray
    counted: np.ndarray


class ELLAInfo(NamedTuple):
    """What one :meth:`ELLAEngine.step` did.

    Attributes:
        loss: eq. 9 (``g_hat``) at the new basis, from the running sums.
        inner_iterations: sparse-code / basis alternations.
        basis_change: ``|L_new - L_old|_F`` over the whole step (Proposition 1: O(1/T)).
        lasso_converged: the last LASSO finished without a ConvergenceWarning.
        reinitialized: number of zero columns drawn again.
        new_task: the slot was new.
    """

    loss: float
    inner_iterations: int
    basis_change: float
    lasso_converged: bool
    reinitialized: int
    new_task: bool


def _ridge_factor(A: np.ndarray, num_tasks: int, lam: float):
    """Cholesky factor (lower) of ``A/T + lambda I``; ``A`` is symmetric by construction
    (sums of ``kron(s s^T, H)``) and only its lower triangle is read."""
    from scipy.linalg import LinAlgError, cho_factor

    T = max(int(num_tasks), 1)
    M = A / T
    M.flat[:: M.shape[0] + 1] += lam
    try:  # positive definite by construction (A is PSD, lambda > 0): plain LAPACK first
        return cho_factor(M, lower=True, overwrite_a=True, check_finite=False)
    except LinAlgError:  # round-off: the one jitter helper
        M = A / T + lam * np.eye(A.shape[0])
        return (np.asarray(jitter_cholesky(jnp.asarray(0.5 * (M + M.T)), name="A/T + lambda I")),
                True)


def basis_from_sums(A: np.ndarray, b: np.ndarray, num_tasks: int, lam: float, d: int,
                    k: int) -> np.ndarray:
    """``vec(L) = (A/T + lambda I)^-1 b / T`` (Cholesky solve), unvec column-major -> ``(d, k)``."""
    from scipy.linalg import cho_solve

    T = max(int(num_tasks), 1)
    vecL = cho_solve(_ridge_factor(A, T, lam), b / T, check_finite=False)
    return vecL.reshape((d, k), order="F")


class _TaskUpdatedBasis:
    """``vec(L) = (M0 + U U^T)^-1 b / T`` for the current task's changing code ``s``, with
    ``M0 = A0/T + lambda I`` (the other tasks, factorized once per step) and
    ``U U^T = kron(s s^T, H) / T``, ``U = kron(s, R) / sqrt(T)``, ``R R^T = H`` (rank ``r <= d``):
    the Woodbury identity with the ``r x r`` capacitance ``I + U^T M0^-1 U``, then one step of
    iterative refinement on the residual (which restores full accuracy when ``M0`` is
    ill-conditioned, e.g. ``lambda -> 0``). Per alternation ``O((dk)^2 r)`` instead of a new
    ``O((dk)^3)`` Cholesky (Algorithm 1's inner loop at the tuning's large k)."""

    def __init__(self, A0: np.ndarray, num_tasks: int, lam: float, R: np.ndarray) -> None:
        self.A0, self.T, self.lam, self.R = A0, max(int(num_tasks), 1), float(lam), R
        self.factor = _ridge_factor(A0, self.T, lam)

    def solve(self, s: np.ndarray, b: np.ndarray, d: int, k: int) -> np.ndarray:
        from scipy.linalg import cho_factor, cho_solve

        U = np.kron(s[:, None], self.R) / math.sqrt(self.T)        # (dk, r)
        Z = cho_solve(self.factor, U, check_finite=False)
        S = np.eye(U.shape[1]) + U.T @ Z
        cs = cho_factor(0.5 * (S + S.T), lower=True, check_finite=False)

        def apply_inverse(r):
            y = cho_solve(self.factor, r, check_finite=False)
            return y - Z @ cho_solve(cs, U.T @ y, check_finite=False)

        rhs = b / self.T
        x = apply_inverse(rhs)
        residual = rhs - (self.A0 @ x / self.T + self.lam * x + U @ (U.T @ x))
        x = x + apply_inverse(residual)
        return x.reshape((d, k), order="F")


def _standard_normal(rng: Any, shape: tuple[int, ...]) -> np.ndarray:
    """N(0, 1) draws of ``shape`` from a JAX PRNG key, by NumPy's generator seeded with the
    key's data (``jax.random.normal`` compiles once per shape, and the re-drawn column counts
    and the tuning's k vary: seconds of compilation per task)."""
    seed = np.asarray(jax.random.key_data(rng), np.uint32).ravel()
    return np.random.default_rng(seed).standard_normal(shape)


def _contribution(s: np.ndarray, theta: np.ndarray, H: np.ndarray):
    return np.kron(np.outer(s, s), H), np.kron(s, H @ theta), float(theta @ H @ theta)


class ELLAEngine:
    """(GP-)ELLA's online update on ``(theta_hat_t, H_t)`` (module docstring).

    Kind ``"host"`` (NumPy / SciPy). ``init(rng, input_dim) -> ELLAState`` draws
    ``L ~ N(0, 1)`` (Algorithm 1, first line);
    ``step(rng, state, (theta, H, slot)) -> (ELLAState, ELLAInfo)`` codes the task, updates
    the basis and re-draws zero columns with ``rng`` (a JAX PRNG key). Pure: the input state is
    not modified.

    Args:
        num_components: ``k``.
        mu: L1 weight of eq. 10; lam: Frobenius weight of eq. 9.
        max_inner_iterations: alternations of eq. 7 and eq. 8 per step.
        inner_tolerance: stop when ``|L_new - L| <= tol * max(|L|, 1)`` (Frobenius).
        low_rank_min_size: from this ``d k`` on, the alternations re-solve the basis by a
            low-rank update of one factorization per step (:class:`_TaskUpdatedBasis`; the
            same ``L`` to round-off, tested) instead of a Cholesky per alternation.
    """

    kind = "host"

    def __init__(self, num_components: int, mu: float, lam: float, *,
                 max_inner_iterations: int = 5, inner_tolerance: float = 1e-6,
                 low_rank_min_size: int = 300) -> None:
        self.k = int(num_components)
        self.mu = float(mu)
        self.lam = float(lam)
        self.max_inner_iterations = int(max_inner_iterations)
        self.inner_tolerance = float(inner_tolerance)
        self.low_rank_min_size = int(low_rank_min_size)

    def init(self, rng: Any, input_dim: int) -> ELLAState:
        """``L ~ N(0, 1)`` of shape ``(input_dim, k)`` drawn with the JAX key ``rng``, empty
        sums and no task slots."""
        d, k = int(input_dim), self.k
        L = _standard_normal(rng, (d, k))
        return ELLAState(L, np.zeros((d * k, d * k)), np.zeros(d * k), 0.0, 0.0, 0,
                         np.zeros((0, d)), np.zeros((0, d, d)), np.zeros((0, k)),
                         np.zeros(0, bool), np.zeros(0, bool))

    def surrogate_loss(self, state: ELLAState, L: np.ndarray | None = None) -> float:
        """Eq. 9 at ``L`` (default ``state.L``) from the running sums only:
        ``lambda |L|^2 + 1/T (mu sum|s|_1 + sum theta^T H theta - 2 b^T vec L + vec L^T A vec L)``."""
        L = state.L if L is None else L
        v = L.reshape(-1, order="F")
        T = max(state.num_tasks, 1)
        fit = state.sq - 2.0 * state.b @ v + v @ state.A @ v
        return float(self.lam * np.sum(L * L) + (self.mu * state.l1 + fit) / T)

    def step(self, rng: Any, state: ELLAState, batch: tuple) -> tuple[ELLAState, ELLAInfo]:
        theta, H, slot = batch
        theta = np.asarray(theta, np.float64)
        H = psd_part(np.asarray(H, np.float64))
        slot = int(slot)
        d, k = state.L.shape
        thetas, hessians, codes = state.thetas, state.hessians, state.codes
        seen, counted = state.seen, state.counted
        if slot >= seen.shape[0]:  # grow the per-task arrays to hold the slot
            extra = slot + 1 - seen.shape[0]
            thetas = np.concatenate([thetas, np.zeros((extra, d))])
            hessians = np.concatenate([hessians, np.zeros((extra, d, d))])
            codes = np.concatenate([codes, np.zeros((extra, k))])
            seen = np.concatenate([seen, np.zeros(extra, bool)])
            counted = np.concatenate([counted, np.zeros(extra, bool)])
        A0, b0, sq0, l10, T = state.A, state.b, state.sq, state.l1, state.num_tasks
        new_task = not bool(seen[slot])
        if counted[slot]:  # Algorithm 1, known task: remove its previous contribution
            dA, db, dsq = _contribution(codes[slot], thetas[slot], hessians[slot])
            A0, b0, sq0 = A0 - dA, b0 - db, sq0 - dsq
            l10 = l10 - float(np.sum(np.abs(codes[slot])))
            T -= 1
        informative = bool(np.any(H))
        L = L_start = state.L
        iterations, converged, s = 0, True, np.zeros(k)
        A1, b1, sq_t = A0, b0, 0.0
        if informative:
            T += 1
            sq_t = float(theta @ H @ theta)
            updated = None
            if d * k >= self.low_rank_min_size:
                w, V = np.linalg.eigh(H)
                keep = w > 0
                updated = _TaskUpdatedBasis(A0, T, self.lam, V[:, keep] * np.sqrt(w[keep]))
            Htheta = H @ theta
            for iterations in range(1, self.max_inner_iterations + 1):  # noqa: B007 (read after)
                s, converged = sparse_code(L, theta, H, self.mu, H_psd=H)
                b1 = b0 + np.kron(s, Htheta)
                if updated is None:
                    L_new = basis_from_sums(A0 + np.kron(np.outer(s, s), H), b1, T, self.lam,
                                            d, k)
                else:
                    L_new = updated.solve(s, b1, d, k)
                change = float(np.linalg.norm(L_new - L))
                L = L_new
                if change <= self.inner_tolerance * max(float(np.linalg.norm(L)), 1.0):
                    break
            A1 = A0 + np.kron(np.outer(s, s), H)
        elif counted[slot]:  # the task no longer informs the basis: re-solve without it
            L = basis_from_sums(A1, b1, T, self.lam, d, k) if T else L
        # (an uninformative new task leaves T, the sums and L exactly as they were)
        reinit = 0
        if informative or counted[slot]:
            # re-draw columns that no task uses (they are exactly zero for lambda > 0)
            dead = np.linalg.norm(L, axis=0) < 1e-8
            reinit = int(dead.sum())
            if reinit:
                L = L.copy()
                L[:, dead] = _standard_normal(rng, (d, reinit))
        thetas, hessians, codes = thetas.copy(), hessians.copy(), codes.copy()
        seen, counted = seen.copy(), counted.copy()
        thetas[slot], hessians[slot], codes[slot] = theta, H, s
        seen[slot], counted[slot] = True, informative
        new_state = ELLAState(L, A1, b1, sq0 + sq_t, l10 + float(np.sum(np.abs(s))), T,
                              thetas, hessians, codes, seen, counted)
        info = ELLAInfo(self.surrogate_loss(new_state), iterations,
                        float(np.linalg.norm(L - L_start)), converged, reinit, new_task)
        return new_state, info


# ---------------------------------------------------------------------------------------------
# prediction (Sect. 4.4)
# ---------------------------------------------------------------------------------------------
def heldout_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Random ``(fit_index, heldout_index)`` with ``floor(fraction n)`` held out, or ``None``
    when that leaves no held-out point or fewer than 2 points to condition on."""
    n_hold = int(math.floor(fraction * n))
    if n_hold < 1 or n - n_hold < 2:
        return None
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_hold:]), np.sort(perm[:n_hold])


@jax.jit
def _heldout_sse(theta, signal_variances, noise_variance, Xf, yf, mf, Xv, yv, mv):
    def one(sf2):
        mean, _ = predict_task(TaskHyperparameters(theta, sf2, noise_variance), Xf, yf, mf, Xv)
        return jnp.sum(mv * (mean - yv) ** 2)
    return jax.lax.map(one, signal_variances)


def line_search_signal_variance(theta: np.ndarray, noise_variance: float, base: float,
                                X_fit: np.ndarray, y_fit: np.ndarray, X_val: np.ndarray,
                                y_val: np.ndarray, ratios: np.ndarray,
                                pad_multiple: int = 16) -> tuple[float, np.ndarray]:
    """``sigma_f^2`` by a grid line search ``base * ratios`` minimizing the held-out squared
    error of the GP with kernel ``theta`` conditioned on ``(X_fit, y_fit)`` (Sect. 4.4).

    Returns ``(best sigma_f^2, squared errors per grid point)``; ties go to the ratio closest
    to 1 (the fitted value).
    """
    Xf, yf, mf = pad_rows(X_fit, y_fit, pad_multiple)
    Xv, yv, mv = pad_rows(X_val, y_val, pad_multiple)
    grid = base * np.asarray(ratios, np.float64)
    sse = np.asarray(_heldout_sse(jnp.asarray(theta), jnp.asarray(grid), noise_variance,
                                  Xf, yf, mf, Xv, yv, mv))
    sse = np.where(np.isfinite(sse), sse, np.inf)
    best = np.flatnonzero(sse <= sse.min() * (1 + 1e-12) + 1e-300)
    pick = best[np.argmin(np.abs(np.log(np.asarray(ratios)[best])))]
    return float(grid[pick]), sse


PREDICT_CHUNK = 16
"""Kernels per compiled prediction call: :func:`kernel_predictions` pads the list of kernels
to a multiple of this, so the number of known tasks never changes a compiled shape."""


@jax.jit
def _predict_chunk(thetas, signal_variance, noise_variance, X, y, mask, X_star):
    def one(theta):
        return predict_task(TaskHyperparameters(theta, signal_variance, noise_variance),
                            X, y, mask, X_star)
    # lax.map, not vmap: a vmapped jitter_cholesky (batched Cholesky under select) hung
    # XLA:CPU here, all its threads idle (a lost wake-up on an overloaded machine)
    return jax.lax.map(one, thetas)


def kernel_predictions(thetas: np.ndarray, signal_variance: float, noise_variance: float,
                       X: np.ndarray, y: np.ndarray, X_star: np.ndarray, *,
                       pad_multiple: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """GP predictive means and variances ``(K, m)`` at ``X_star (m, d)`` of one task's data
    ``(X (n, d), y (n,))`` under each of ``K`` kernels (rows of ``thetas``), with the same
    ``sigma_f^2`` and ``sigma^2``. Rows, test points and kernels are padded (the kernels in
    chunks of :data:`PREDICT_CHUNK`, the last one filled with copies of the first kernel), so
    the compiled function depends on the padded data sizes only."""
    thetas = np.atleast_2d(np.asarray(thetas, np.float64))
    K, m = thetas.shape[0], X_star.shape[0]
    Xp, yp, mp = (jnp.asarray(a) for a in pad_rows(X, y, pad_multiple))
    Xs = jnp.asarray(pad_rows(X_star, None, 4 * pad_multiple)[0])  # few test-size shapes
    n_chunks = int(math.ceil(K / PREDICT_CHUNK))
    padded = np.concatenate([thetas, np.repeat(thetas[:1], n_chunks * PREDICT_CHUNK - K, 0)])
    means, variances = [], []
    for c in range(n_chunks):
        mu, var = _predict_chunk(jnp.asarray(padded[c * PREDICT_CHUNK:(c + 1) * PREDICT_CHUNK]),
                                 signal_variance, noise_variance, Xp, yp, mp, Xs)
        means.append(np.asarray(mu))
        variances.append(np.asarray(var))
    return np.concatenate(means)[:K, :m], np.concatenate(variances)[:K, :m]


def smoothing_weights(squared_distances: np.ndarray, self_index: int,
                      variance: float) -> np.ndarray:
    """Sect. 4.4's weights ``w_t' ~ exp(-|z_t - z_t'|^2 / (2 v))`` over the known tasks from
    the squared distances ``(K,)`` of their parameter vectors to this task's (index
    ``self_index``); ``v = 0`` keeps the task's own kernel only, ``v = inf`` averages all
    kernels uniformly."""
    d2 = np.asarray(squared_distances, np.float64)
    if variance == 0.0:
        w = np.zeros_like(d2)
        w[self_index] = 1.0
        return w
    if math.isinf(variance):
        return np.full_like(d2, 1.0 / d2.shape[0])
    logw = -d2 / (2.0 * variance)
    w = np.exp(logw - logw.max())
    return w / w.sum()


def effective_number_of_tasks(weights: np.ndarray) -> float:
    """``1 / sum_t w_t^2`` (Kish): how many tasks a normalized weighting averages (1: one task,
    ``K``: uniform over ``K``)."""
    w = np.asarray(weights, np.float64)
    return float(1.0 / np.sum(w * w))


def median_squared_distance(points: np.ndarray) -> float:
    """Median of ``|z_t - z_t'|^2`` over the pairs ``t < t'`` of the rows of ``points (K, d)``
    (0 for fewer than two rows)."""
    z = np.asarray(points, np.float64)
    if z.shape[0] < 2:
        return 0.0
    sq = np.sum(z * z, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * z @ z.T, 0.0)
    return float(np.median(d2[np.triu_indices(z.shape[0], 1)]))


def choose_smoothing_variance(squared_distances: list[np.ndarray], self_indices: list[int],
                              heldout_means: list[np.ndarray], heldout_targets: list[np.ndarray],
                              grid: np.ndarray) -> tuple[float, np.ndarray]:
    """The smoothing variance of Sect. 4.4 chosen from ``grid`` by the squared error, pooled
    over tasks, of the smoothed mean on each task's held-out points.

    Args:
        squared_distances: per task, ``(K,)`` distances to every known task's parameters.
        self_indices: per task, its own index among the ``K``.
        heldout_means: per task, ``(K, n_v)`` held-out predictive means under each kernel.
        heldout_targets: per task, ``(n_v,)`` held-out targets.
        grid: candidate variances (``0``: no smoothing, ``inf``: uniform).

    Returns ``(best variance, pooled squared error per grid point)``; ties go to the smallest
    variance (the least smoothing).
    """
    grid = np.asarray(grid, np.float64)
    sse = np.zeros(grid.shape[0])
    for d2, i, means, yv in zip(squared_distances, self_indices, heldout_means, heldout_targets):
        for g, v in enumerate(grid):
            w = smoothing_weights(d2, i, float(v))
            sse[g] += float(np.sum((w @ means - yv) ** 2))
    best = int(np.flatnonzero(sse <= sse.min() * (1 + 1e-12) + 1e-300)[0])
    return float(grid[best]), sse


def smoothed_prediction(theta_task: np.ndarray, thetas: np.ndarray, signal_variance: float,
                        noise_variance: float, X: np.ndarray, y: np.ndarray,
                        X_star: np.ndarray, *, smoothing_variance: float | None = 100.0,
                        points: np.ndarray | None = None, self_index: int | None = None,
                        pad_multiple: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Predictive of one task at ``X_star``, smoothed over the kernels of all known tasks
    (Sect. 4.4): with every ``theta_t'`` (rows of ``thetas``, the current task's included) a GP
    on the task's own data predicts; the predictions are averaged with weights
    :func:`smoothing_weights` of the squared distances between the rows of ``points``
    (default ``thetas``; the coded parameters ``L s_t'``) and this task's row ``self_index``
    (default: the row of ``thetas`` equal to ``theta_task``) with variance
    ``smoothing_variance`` (``None`` uses ``theta_task`` alone). The mixture's mean and
    variance are returned with the weights."""
    if smoothing_variance is None:
        means, variances = kernel_predictions(theta_task[None], signal_variance, noise_variance,
                                              X, y, X_star, pad_multiple=pad_multiple)
        return means[0], variances[0], np.ones(1)
    thetas = np.asarray(thetas, np.float64)
    points = thetas if points is None else np.asarray(points, np.float64)
    if self_index is None:
        self_index = int(np.argmin(np.sum((thetas - theta_task[None]) ** 2, axis=1)))
    means, variances = kernel_predictions(thetas, signal_variance, noise_variance, X, y, X_star,
                                          pad_multiple=pad_multiple)
    d2 = np.sum((points - points[self_index][None]) ** 2, axis=1)
    w = smoothing_weights(d2, self_index, float(smoothing_variance))
    mean = w @ means
    var = w @ (variances + means ** 2) - mean ** 2
    return mean, np.maximum(var, 1e-300), w
