"""GP-ELLA engines (Clingerman & Eaton 2017, Sect. 4.3-4.4, Algorithm 1) and linear ELLA
(Ruvolo & Eaton 2013).

* :func:`fit_single_task` — the single-task GP (type-II ML of eq. 4 by L-BFGS,
  :mod:`inference.type2ml`) returning ``theta_t`` and the Hessian ``H_t`` of eq. 6, by autodiff
  (``jax.hessian``, forward over reverse through the Cholesky) or by the closed form of App. A
  (:func:`models.gp_ella.hessian_closed_form`, one Cholesky). Task data are padded to a
  multiple of ``pad_multiple`` rows (:func:`pad_rows`) so that every compiled function is
  reused by all tasks of the same padded size.
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
* :func:`line_search_signal_variance`, :func:`smoothed_prediction` — Sect. 4.4.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from inference.type2ml import fit_type2ml
from models.gp_ella import (TaskHyperparameters, hessian_closed_form,
                            negative_log_marginal_likelihood, nll_of_hyperparameters,
                            predict_task)
from models.linalg_jax import jitter_cholesky

__all__ = ["pad_rows", "SingleTaskFit", "fit_single_task", "hessian_autodiff",
           "fit_linear_task", "psd_part", "hessian_sqrt", "sparse_code", "ELLAState", "ELLAInfo",
           "ELLAEngine", "basis_from_sums", "line_search_signal_variance",
           "smoothed_prediction", "heldout_split"]


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
        converged: SciPy's success flag (False also when the iteration cap was hit).
        constant_targets: the targets were constant: no fit (theta = 0, H = 0).
    """

    theta: np.ndarray
    signal_variance: float
    noise_variance: float
    hessian: np.ndarray
    nll: float
    iterations: int
    converged: bool
    constant_targets: bool = False


def _nll_theta(theta, signal_variance, noise_variance, X, y, mask):
    return negative_log_marginal_likelihood(
        TaskHyperparameters(theta, signal_variance, noise_variance), X, y, mask)


_hessian_autodiff_jit = jax.jit(jax.hessian(_nll_theta))
_hessian_closed_jit = jax.jit(lambda th, sf2, s2, X, y, m: hessian_closed_form(
    TaskHyperparameters(th, sf2, s2), X, y, m))


def hessian_autodiff(hyp: TaskHyperparameters, X, y, mask) -> np.ndarray:
    """``grad^2_theta NLL`` ``(d, d)`` by ``jax.hessian`` (compiled once per padded size)."""
    H = _hessian_autodiff_jit(hyp.theta, hyp.signal_variance, hyp.noise_variance, X, y, mask)
    H = np.asarray(H)
    return 0.5 * (H + H.T)


def fit_single_task(X: np.ndarray, y: np.ndarray, *, max_iterations: int = 50,
                    min_noise_variance: float = 1e-6, theta_bounds: tuple[float, float] = (1e-8, 1e6),
                    init_theta: float | None = None, init_noise_ratio: float = 0.1,
                    hessian: str = "autodiff", pad_multiple: int = 16,
                    with_hessian: bool = True) -> SingleTaskFit:
    """Type-II ML of one task's GP (eq. 4, over ``theta``, ``sigma_f^2`` and ``sigma^2``) and
    the Hessian of eq. 6 at the optimum.

    Args:
        X: ``(n, d)`` inputs; y: ``(n,)`` targets (centred by the caller).
        max_iterations: L-BFGS iterations (Sect. 5.2: 50 for every algorithm).
        min_noise_variance: floor on ``sigma^2`` (Sect. 5.2's "self-noise" 1e-6).
        theta_bounds: box on each ``theta_a`` during the fit.
        init_theta: starting ``theta_a`` (default ``1 / d``: lengthscale ``sqrt(d)``).
        init_noise_ratio: starting ``sigma^2 = ratio * var(y)``; ``sigma_f^2`` starts at
            ``var(y)``.
        hessian: ``"autodiff"`` or ``"closed_form"`` (App. A).
        pad_multiple: rows are padded to a multiple of this (compiled-shape reuse).
        with_hessian: False skips ``H`` (individual-GP baseline).
    """
    X = np.asarray(X, np.float64)
    y = np.asarray(y, np.float64)
    n, d = X.shape
    var_y = float(np.var(y)) if n else 0.0
    if n == 0 or var_y <= 1e-12 * max(1.0, float(np.mean(y * y))):
        return SingleTaskFit(np.zeros(d), float(max(min_noise_variance, 1e-12)),
                             float(min_noise_variance), np.zeros((d, d)), float("nan"), 0, True,
                             True)
    Xp, yp, mask = pad_rows(X, y, pad_multiple)
    data = (jnp.asarray(Xp), jnp.asarray(yp), jnp.asarray(mask))
    th0 = (1.0 / d) if init_theta is None else float(init_theta)
    init = TaskHyperparameters(jnp.full((d,), th0), jnp.asarray(var_y),
                               jnp.asarray(max(init_noise_ratio * var_y, 10 * min_noise_variance)))
    lo = TaskHyperparameters(theta_bounds[0], 1e-10 * var_y, min_noise_variance)
    hi = TaskHyperparameters(theta_bounds[1], 0.0, 0.0)
    res = fit_type2ml(nll_of_hyperparameters, init, data=data, lower_bounds=lo, upper_bounds=hi,
                      max_iterations=max_iterations)
    hyp = res.params
    H = np.zeros((d, d))
    if with_hessian:
        if hessian == "autodiff":
            H = hessian_autodiff(hyp, *data)
        elif hessian == "closed_form":
            H = np.asarray(_hessian_closed_jit(hyp.theta, hyp.signal_variance,
                                               hyp.noise_variance, *data))
        else:
            raise ValueError(f"hessian: expected 'autodiff' or 'closed_form', received {hessian!r}")
    return SingleTaskFit(np.asarray(hyp.theta), float(hyp.signal_variance),
                         float(hyp.noise_variance), H, float(res.value), res.num_iterations,
                         res.converged, False)


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
                max_iter: int = 10000, H_sqrt: np.ndarray | None = None
                ) -> tuple[np.ndarray, bool]:
    """``argmin_s |theta - L s|_H^2 + mu |s|_1`` (eq. 7/10) by scikit-learn's ``LassoLars``.

    ``LassoLars`` minimizes the Lasso objective ``1/(2 n) |y - X w|^2 + alpha |w|_1`` exactly
    (LARS homotopy, no tolerance: the answer does not depend on the conditioning of ``X``);
    with ``X = H^1/2 L`` (``n = d`` rows) and ``y = H^1/2 theta`` this is ``1/(2d)`` times
    eq. 10 when ``alpha = mu / (2 d)``. ``max_iter`` caps the LARS steps.
    ``H_sqrt`` (:func:`hessian_sqrt` of ``H``) may be passed by a caller that codes the same
    task against several bases (the alternations of Algorithm 1).

    Returns ``(s (k,), converged)``.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LassoLars

    d, k = L.shape
    Hh = hessian_sqrt(H) if H_sqrt is None else H_sqrt
    Xd = Hh @ np.asarray(L, np.float64)
    yd = Hh @ np.asarray(theta, np.float64)
    if not np.any(Xd) or not np.any(yd):
        return np.zeros(k), True
    model = LassoLars(alpha=mu / (2.0 * d), fit_intercept=False, max_iter=max_iter)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(Xd, yd)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    for w in caught:  # anything else is re-raised as a warning
        if not issubclass(w.category, ConvergenceWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return np.asarray(model.coef_, np.float64).reshape(k), converged


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
        num_tasks: ``T``, tasks seen.
        thetas: ``(S, d)`` ``theta_hat`` per task slot; hessians: ``(S, d, d)``;
        codes: ``(S, k)`` ``s_t``; seen: ``(S,)`` whether the slot holds a task.
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


def basis_from_sums(A: np.ndarray, b: np.ndarray, num_tasks: int, lam: float, d: int,
                    k: int) -> np.ndarray:
    """``vec(L) = (A/T + lambda I)^-1 b / T`` (Cholesky solve), unvec column-major -> ``(d, k)``."""
    from scipy.linalg import LinAlgError, cho_factor, cho_solve

    T = max(int(num_tasks), 1)
    M = A / T + lam * np.eye(d * k)
    M = 0.5 * (M + M.T)
    try:  # positive definite by construction (A is PSD, lambda > 0): plain LAPACK first
        factor = cho_factor(M, lower=True, check_finite=False)
    except LinAlgError:  # round-off: the one jitter helper
        factor = (np.asarray(jitter_cholesky(jnp.asarray(M), name="A/T + lambda I")), True)
    vecL = cho_solve(factor, b / T, check_finite=False)
    return vecL.reshape((d, k), order="F")


def _contribution(s: np.ndarray, theta: np.ndarray, H: np.ndarray):
    return np.kron(np.outer(s, s), H), np.kron(s, H @ theta), float(theta @ H @ theta)


class ELLAEngine:
    """(GP-)ELLA's online update on ``(theta_hat_t, H_t)`` (module docstring).

    ``init(input_dim, rng) -> ELLAState`` draws ``L ~ N(0, 1)`` (Algorithm 1, first line);
    ``step(rng, state, (theta, H, slot)) -> (ELLAState, ELLAInfo)`` codes the task, updates
    the basis and re-draws zero columns with ``rng`` (a JAX PRNG key). Pure: the input state is
    not modified.

    Args:
        num_components: ``k``.
        mu: L1 weight of eq. 10; lam: Frobenius weight of eq. 9.
        max_inner_iterations: alternations of eq. 7 and eq. 8 per step.
        inner_tolerance: stop when ``|L_new - L| <= tol * max(|L|, 1)`` (Frobenius).
    """

    def __init__(self, num_components: int, mu: float, lam: float, *,
                 max_inner_iterations: int = 5, inner_tolerance: float = 1e-6) -> None:
        self.k = int(num_components)
        self.mu = float(mu)
        self.lam = float(lam)
        self.max_inner_iterations = int(max_inner_iterations)
        self.inner_tolerance = float(inner_tolerance)

    def init(self, input_dim: int, rng: Any) -> ELLAState:
        d, k = int(input_dim), self.k
        L = np.asarray(jax.random.normal(rng, (d, k), dtype=jnp.float64))
        return ELLAState(L, np.zeros((d * k, d * k)), np.zeros(d * k), 0.0, 0.0, 0,
                         np.zeros((0, d)), np.zeros((0, d, d)), np.zeros((0, k)),
                         np.zeros(0, bool))

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
        thetas, hessians, codes, seen = state.thetas, state.hessians, state.codes, state.seen
        if slot >= seen.shape[0]:  # grow the per-task arrays to hold the slot
            extra = slot + 1 - seen.shape[0]
            thetas = np.concatenate([thetas, np.zeros((extra, d))])
            hessians = np.concatenate([hessians, np.zeros((extra, d, d))])
            codes = np.concatenate([codes, np.zeros((extra, k))])
            seen = np.concatenate([seen, np.zeros(extra, bool)])
        A0, b0, sq0, l10, T = state.A, state.b, state.sq, state.l1, state.num_tasks
        new_task = not bool(seen[slot])
        if new_task:
            T += 1
        else:  # Algorithm 1, known task: remove its previous contribution
            dA, db, dsq = _contribution(codes[slot], thetas[slot], hessians[slot])
            A0, b0, sq0 = A0 - dA, b0 - db, sq0 - dsq
            l10 = l10 - float(np.sum(np.abs(codes[slot])))
        L = state.L
        L_start = L
        _, _, sq_t = _contribution(np.zeros(k), theta, H)
        iterations, converged = 0, True
        H_sqrt = hessian_sqrt(H)
        for iterations in range(1, self.max_inner_iterations + 1):
            s, converged = sparse_code(L, theta, H, self.mu, H_sqrt=H_sqrt)
            dA, db, _ = _contribution(s, theta, H)
            A1, b1 = A0 + dA, b0 + db
            L_new = basis_from_sums(A1, b1, T, self.lam, d, k)
            change = float(np.linalg.norm(L_new - L))
            L = L_new
            if change <= self.inner_tolerance * max(float(np.linalg.norm(L)), 1.0):
                break
        # re-draw columns that no task uses (they are exactly zero for lambda > 0)
        dead = np.linalg.norm(L, axis=0) < 1e-8
        if np.any(dead):
            L = L.copy()
            L[:, dead] = np.asarray(jax.random.normal(rng, (d, int(dead.sum())), dtype=jnp.float64))
        thetas = thetas.copy()
        hessians = hessians.copy()
        codes = codes.copy()
        seen = seen.copy()
        thetas[slot], hessians[slot], codes[slot], seen[slot] = theta, H, s, True
        new_state = ELLAState(L, A1, b1, sq0 + sq_t, l10 + float(np.sum(np.abs(s))), T,
                              thetas, hessians, codes, seen)
        info = ELLAInfo(self.surrogate_loss(new_state), iterations,
                        float(np.linalg.norm(L - L_start)), converged, int(dead.sum()), new_task)
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


@jax.jit
def _predict_many(thetas, signal_variance, noise_variance, X, y, mask, X_star):
    def one(theta):
        return predict_task(TaskHyperparameters(theta, signal_variance, noise_variance),
                            X, y, mask, X_star)
    # lax.map, not vmap: a vmapped jitter_cholesky (batched Cholesky under select) hung
    # XLA:CPU here, all its threads idle (a lost wake-up on an overloaded machine)
    return jax.lax.map(one, thetas)


def smoothed_prediction(theta_task: np.ndarray, thetas: np.ndarray, signal_variance: float,
                        noise_variance: float, X: np.ndarray, y: np.ndarray,
                        X_star: np.ndarray, *, smoothing_variance: float | None = 100.0,
                        pad_multiple: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Predictive of one task at ``X_star``, smoothed over the kernels of all known tasks
    (Sect. 4.4): with every ``theta_t'`` (rows of ``thetas``, the current task's included) a GP
    on the task's own data predicts; the predictions are averaged with weights
    ``w_t' ~ exp(-|theta_task - theta_t'|^2 / (2 v))`` (``v = smoothing_variance``; ``None``
    uses ``theta_task`` alone). The mixture's mean and variance are returned with the weights.
    """
    Xp, yp, mp = pad_rows(X, y, pad_multiple)
    m = X_star.shape[0]
    Xs = pad_rows(X_star, None, 4 * pad_multiple)[0]  # few test-size shapes
    if smoothing_variance is None:
        thetas = theta_task[None]
    means, variances = _predict_many(jnp.asarray(thetas), signal_variance, noise_variance,
                                     Xp, yp, mp, Xs)
    means, variances = np.asarray(means)[:, :m], np.asarray(variances)[:, :m]
    if smoothing_variance is None:
        return means[0], variances[0], np.ones(1)
    d2 = np.sum((thetas - theta_task[None]) ** 2, axis=1)
    logw = -d2 / (2.0 * smoothing_variance)
    w = np.exp(logw - logw.max())
    w = w / w.sum()
    mean = w @ means
    var = w @ (variances + means ** 2) - mean ** 2
    return mean, np.maximum(var, 1e-300), w
