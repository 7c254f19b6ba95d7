"""GP-ELLA: lifelong GP regression with a factorized kernel prior (Clingerman & Eaton 2017).

Generative model (Sect. 4.2, eq. 3), tasks ``t = 1..T`` with data ``(X_t (n_t, d), y_t (n_t,))``:

    L_ij   ~ N(0, 1 / (T lambda))                  shared basis, (d, k)     (Frobenius term)
    s_tj   ~ Laplace(0, 2 / mu)                    sparse code of task t    (L1 term)
    theta_t = L s_t   or   log theta_t = L s_t    kernel parameters, (d,)
    y_t    ~ N(0, sigma_f,t^2 K_theta_t(X_t) + sigma_t^2 I)                 (eq. 4)

with the ARD squared-exponential kernel of App. A parametrized by the inverse squared
lengthscales, ``M = diag(theta)``::

    k_theta(x, x') = exp(-1/2 sum_a theta_a (x_a - x'_a)^2),   theta_a = l_a^-2 >= 0.

Its negative log joint is ``T/2`` times eq. 3 (eq. 4's loss is ``-2 log p(y_t)``, eq. 3
averages over tasks): ``-log p = sum_t NLL_t(L s_t) + mu/2 sum_t |s_t|_1 + T lambda/2 |L|_F^2 +
const``, so its MAP is the MTL objective. In the paper's parametrization a reconstructed
``theta_a < 0`` (``L s_t`` is linear, nothing keeps it positive) is read as 0: feature ``a``
is ignored by the kernel; in the log parametrization (below) ``theta_t = exp(L s_t) > 0``.

ELLA's Laplace approximation (Sect. 4.3, eqs. 5-6): around the single-task optimum
``theta_hat_t``, ``NLL_t(theta) ~ NLL_t(theta_hat_t) + 1/2 (theta - theta_hat_t)^T H_t
(theta - theta_hat_t)`` with ``H_t = 1/2 grad^2 (eq. 4) = grad^2 NLL_t`` (eq. 6). With that
likelihood the program's negative log joint is ``T/2`` times eq. 9 (``g_hat``).

Closed-form Hessian (App. A, eqs. 12-14) for this parametrization. With ``K = K_sigma``,
``W = K^-1``, ``alpha = W y``, ``E = exp(-1/2 sum_a theta_a D_a)``, ``D_a = [(x_ia - x_ja)^2]``:

    dK/dtheta_a            = -1/2 sigma_f^2 D_a o E
    d2K/dtheta_a dtheta_b  =  1/4 sigma_f^2 D_a o D_b o E
    H_ab = 1/2 tr(W d2K_ab) - 1/2 tr(W dK_b W dK_a)                              (eq. 14)
           + alpha^T dK_b W dK_a alpha - 1/2 alpha^T d2K_ab alpha                  (eqs. 12-13)

(App. A prints ``dK/dtheta_a = k (x_a - x'_a)^2 theta_a^-3``, which is the derivative for
``theta_a`` = the lengthscale ``l_a``, not for ``theta_a = l_a^-2`` as its text says; the
formulas above are derived for the parametrization used here.) The gradient from the same
factor is ``g_a = dNLL/dtheta_a = 1/2 tr(W dK_a) - 1/2 alpha^T dK_a alpha`` (R&W eq. 5.9).

Log parametrization. The single-task fit runs in ``u = log theta`` (L-BFGS on log
hyperparameters), where a feature the task ignores goes to ``theta_a -> 0`` without a bound
being active in ``theta`` space: there ``dNLL/dtheta_a > 0`` and the theta-Hessian is
indefinite, so eq. 5's expansion in ``theta`` is not taken at a minimum. In ``u`` the fitted
point is a stationary point and, by the chain rule (``dtheta_a/du_a = theta_a``),

    H^u = diag(theta) H diag(theta) + diag(theta o g),     g^u = theta o g,

which is positive semi-definite at a minimum. With ``parametrization="log_theta"`` the
factorization is ``log theta_t = L s_t`` (``theta_t = exp(L s_t) > 0``, nothing is clipped
at 0); ``"theta"`` is the paper's ``theta_t = L s_t``.

Task data come padded to a few sizes so that compiled functions are reused: rows with
``mask = 0`` get ``K_ii = 1``, no covariance with other rows, and ``y_i = 0``, which adds
exactly 0 to the log determinant and the quadratic form (their ``log 2 pi`` is not counted).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax import Array
from jax.scipy.linalg import cho_solve, solve_triangular

from models.linalg_jax import jitter_cholesky

__all__ = ["TaskHyperparameters", "se_ard_gram", "masked_gram", "task_factor",
           "negative_log_marginal_likelihood", "nll_of_hyperparameters", "predict_task",
           "hessian_closed_form", "gradient_and_hessian_closed_form", "log_theta_hessian",
           "PARAMETRIZATIONS", "theta_from_code", "ella_task_loss", "ella_surrogate_objective",
           "mtl_objective", "gp_ella_model", "laplace_prior_scale", "basis_prior_scale"]

_LOG_2PI = math.log(2.0 * math.pi)

PARAMETRIZATIONS = ("log_theta", "theta")
"""What ``L s_t`` reconstructs: ``log theta_t`` (default) or ``theta_t`` (the paper's)."""


class TaskHyperparameters(NamedTuple):
    """Hyperparameters of one task's GP, ``y ~ N(0, signal_variance K_theta + noise_variance I)``.

    Attributes:
        theta: ``(d,)`` inverse squared lengthscales ``l_a^-2 >= 0`` (App. A).
        signal_variance: ``sigma_f^2 > 0`` (not part of ``theta``; Sect. 4.4).
        noise_variance: ``sigma^2 > 0``.
    """

    theta: Array
    signal_variance: Array
    noise_variance: Array


def se_ard_gram(theta: Array, X1: Array, X2: Array | None = None) -> Array:
    """``exp(-1/2 sum_a theta_a (x1_a - x2_a)^2)`` as ``(n, m)`` for ``X1 (n, d)``, ``X2 (m, d)``.

    Linear in ``theta`` inside the exponential, hence smooth at ``theta_a = 0`` (an ignored
    feature); equals ``kernels_jax.SquaredExponential(1, theta ** -0.5)`` for ``theta > 0``.
    Negative entries of ``theta`` are read as 0.
    """
    theta = jnp.maximum(theta, 0.0)
    X2 = X1 if X2 is None else X2
    r2 = ((X1 * X1) @ theta)[:, None] + ((X2 * X2) @ theta)[None, :] - 2.0 * (X1 * theta) @ X2.T
    return jnp.exp(-0.5 * jnp.maximum(r2, 0.0))


def masked_gram(hyp: TaskHyperparameters, X: Array, mask: Array) -> Array:
    """``K_sigma = sigma_f^2 K_theta(X) + sigma^2 I`` on real rows, identity on padded rows."""
    m = mask.astype(X.dtype)
    K = hyp.signal_variance * se_ard_gram(hyp.theta, X) * (m[:, None] * m[None, :])
    return K + jnp.diag(hyp.noise_variance * m + (1.0 - m))


def task_factor(hyp: TaskHyperparameters, X: Array, y: Array, mask: Array) -> tuple[Array, Array]:
    """``(chol(K_sigma) (n, n), alpha = K_sigma^-1 y (n,))`` with the one jitter helper."""
    Lc = jitter_cholesky(masked_gram(hyp, X, mask), name="K_sigma")
    return Lc, cho_solve((Lc, True), y * mask)


def negative_log_marginal_likelihood(hyp: TaskHyperparameters, X: Array, y: Array,
                                     mask: Array) -> Array:
    """``NLL = 1/2 y^T K^-1 y + 1/2 log|K| + n/2 log 2 pi`` = half of eq. 4 (R&W eq. 2.30)."""
    Lc, alpha = task_factor(hyp, X, y, mask)
    n = jnp.sum(mask)
    return (0.5 * jnp.dot(y * mask, alpha) + jnp.sum(jnp.log(jnp.diagonal(Lc)))
            + 0.5 * n * _LOG_2PI)


def nll_of_hyperparameters(hyp: TaskHyperparameters, X: Array, y: Array, mask: Array) -> Array:
    """The objective of the single-task type-II ML fit (module-level, so that its compiled
    form is reused by :func:`inference.type2ml.fit_type2ml` across tasks)."""
    return negative_log_marginal_likelihood(hyp, X, y, mask)


def predict_task(hyp: TaskHyperparameters, X: Array, y: Array, mask: Array,
                 X_star: Array) -> tuple[Array, Array]:
    """GP predictive mean and variance of ``y*`` at ``X_star (m, d)`` (R&W eqs. 2.25-2.26)."""
    Lc, alpha = task_factor(hyp, X, y, mask)
    K_s = hyp.signal_variance * se_ard_gram(hyp.theta, X, X_star) * mask[:, None]
    mean = K_s.T @ alpha
    v = solve_triangular(Lc, K_s, lower=True)
    var = hyp.signal_variance - jnp.sum(v * v, axis=0)
    return mean, jnp.maximum(var, 0.0) + hyp.noise_variance


def _squared_differences(X: Array) -> Array:
    """``D[a] = [(x_ia - x_ja)^2]`` as ``(d, n, n)``."""
    diff = X[:, None, :] - X[None, :, :]
    return jnp.moveaxis(diff * diff, -1, 0)


def gradient_and_hessian_closed_form(hyp: TaskHyperparameters, X: Array, y: Array,
                                     mask: Array) -> tuple[Array, Array]:
    """``(g (d,), H (d, d))``: ``grad_theta NLL`` and ``grad^2_theta NLL`` by App. A eqs. 12-14
    (module docstring), for ``theta`` = inverse squared lengthscales, from one Cholesky of
    ``K_sigma``."""
    Lc, alpha = task_factor(hyp, X, y, mask)
    m = mask.astype(X.dtype)
    n = X.shape[0]
    W = cho_solve((Lc, True), jnp.eye(n, dtype=X.dtype))  # K^-1 for the traces of eq. 14
    D = _squared_differences(X) * (m[:, None] * m[None, :])[None]
    Kf = hyp.signal_variance * se_ard_gram(hyp.theta, X) * (m[:, None] * m[None, :])
    dK = -0.5 * D * Kf[None]                       # (d, n, n)
    WdK = jnp.einsum("ij,ajk->aik", W, dK)         # W dK_a
    dKalpha = jnp.einsum("aij,j->ai", dK, alpha)   # dK_a alpha
    # g_a = 1/2 tr(W dK_a) - 1/2 alpha^T dK_a alpha
    g = 0.5 * jnp.einsum("aii->a", WdK) - 0.5 * dKalpha @ alpha
    # 1/2 tr(W d2K_ab) - 1/2 alpha^T d2K_ab alpha, d2K_ab = 1/4 D_a o D_b o Kf
    G = (W - jnp.outer(alpha, alpha)) * Kf
    second = 0.125 * jnp.einsum("aij,bij,ij->ab", D, D, G)
    trace = -0.5 * jnp.einsum("aij,bji->ab", WdK, WdK)          # -1/2 tr(W dK_a W dK_b)
    quad = jnp.einsum("ai,ij,bj->ab", dKalpha, W, dKalpha)      # alpha^T dK_a W dK_b alpha
    H = second + trace + quad
    return g, 0.5 * (H + H.T)


def hessian_closed_form(hyp: TaskHyperparameters, X: Array, y: Array, mask: Array) -> Array:
    """``H = grad^2_theta NLL`` ``(d, d)`` by App. A eqs. 12-14 (module docstring), for
    ``theta`` = inverse squared lengthscales; reuses one Cholesky of ``K_sigma``."""
    return gradient_and_hessian_closed_form(hyp, X, y, mask)[1]


def log_theta_hessian(theta, gradient, hessian):
    """``H^u = diag(theta) H diag(theta) + diag(theta o g)`` ``(d, d)``: the Hessian of the NLL
    in ``u = log theta`` from its ``theta``-gradient ``g (d,)`` and ``theta``-Hessian
    ``H (d, d)`` (chain rule, module docstring). NumPy or JAX arrays."""
    xp = jnp if isinstance(hessian, jax.Array) else np
    Hu = theta[:, None] * hessian * theta[None, :] + xp.diag(theta * gradient)
    return 0.5 * (Hu + Hu.T)


def theta_from_code(z, parametrization: str, lower: float | None = None,
                    upper: float | None = None):
    """The kernel's ``theta`` from the reconstruction ``z = L s``: ``exp(z)`` for
    ``"log_theta"`` (``z`` clipped to ``[log lower, log upper]`` when given, the box of the
    single-task fit), ``max(z, 0)`` for ``"theta"`` (a negative entry ignores the feature).
    Works on NumPy and JAX arrays."""
    xp = jnp if isinstance(z, jax.Array) else np
    if parametrization == "log_theta":
        if lower is not None or upper is not None:
            z = xp.clip(z, None if lower is None else math.log(lower),
                        None if upper is None else math.log(upper))
        return xp.exp(z)
    if parametrization == "theta":
        return xp.maximum(z, 0.0)
    raise ValueError(f"parametrization: expected one of {PARAMETRIZATIONS}, received "
                     f"{parametrization!r}")


# ---------------------------------------------------------------------------------------------
# the ELLA objectives
# ---------------------------------------------------------------------------------------------
def ella_task_loss(L: Array, s: Array, theta: Array, H: Array, mu: float) -> Array:
    """``l(L, s, theta, H) = mu |s|_1 + |theta - L s|_H^2`` (eq. 10)."""
    r = theta - L @ s
    return mu * jnp.sum(jnp.abs(s)) + r @ H @ r


def ella_surrogate_objective(L: Array, S: Array, thetas: Array, hessians: Array, mu: float,
                             lam: float) -> Array:
    """``g_hat(L) = lambda |L|_F^2 + 1/T sum_t l(L, s_t, theta_t, H_t)`` (eq. 9).

    Args:
        L: ``(d, k)``; S: ``(T, k)`` codes as rows; thetas: ``(T, d)``; hessians: ``(T, d, d)``.
    """
    losses = jax.vmap(lambda s, th, H: ella_task_loss(L, s, th, H, mu))(S, thetas, hessians)
    return lam * jnp.sum(L * L) + jnp.mean(losses)


def mtl_objective(L: Array, S: Array, tasks: list[tuple[Array, Array, Array]],
                  signal_variances: Array, noise_variances: Array, mu: float,
                  lam: float, parametrization: str = "theta") -> Array:
    """Eq. 3 with eq. 4's loss (``2 NLL_t``): ``1/T sum_t [2 NLL_t(theta(L s_t)) + mu |s_t|_1]
    + lambda |L|_F^2``; ``tasks`` holds ``(X, y, mask)`` per task; ``theta(z)`` is
    :func:`theta_from_code` (``z`` itself for the paper's ``"theta"``)."""
    total = 0.0
    for t, (X, y, mask) in enumerate(tasks):
        hyp = TaskHyperparameters(theta_from_code(L @ S[t], parametrization),
                                  signal_variances[t], noise_variances[t])
        total = total + 2.0 * negative_log_marginal_likelihood(hyp, X, y, mask) \
            + mu * jnp.sum(jnp.abs(S[t]))
    return total / len(tasks) + lam * jnp.sum(L * L)


# ---------------------------------------------------------------------------------------------
# the probabilistic program
# ---------------------------------------------------------------------------------------------
def laplace_prior_scale(mu: float) -> float:
    """Scale ``b = 2 / mu`` of the Laplace prior on each ``s_tj``: ``-log p = mu/2 |s| + c``."""
    return 2.0 / mu


def basis_prior_scale(num_tasks: int, lam: float) -> float:
    """Standard deviation ``1 / sqrt(T lambda)`` of the Gaussian prior on each ``L_ij``."""
    return 1.0 / math.sqrt(num_tasks * lam)


def gp_ella_model(tasks: list[tuple[Array, Array | None, Array]], *, num_components: int,
                  mu: float, lam: float, signal_variances: Array, noise_variances: Array,
                  likelihood: str = "exact", theta_hat: Array | None = None,
                  hessians: Array | None = None, parametrization: str = "theta") -> None:
    """NumPyro program of GP-ELLA (module docstring); its MAP is eq. 3 (``"exact"``) or
    eq. 9 (``"laplace"``).

    Args:
        tasks: ``(X (n_t, d), y (n_t,) or None, mask (n_t,))`` per task (padded rows: mask 0).
        num_components: ``k``, columns of the basis ``L``.
        mu, lam: the L1 and Frobenius weights of eq. 3.
        signal_variances, noise_variances: ``(T,)`` per-task ``sigma_f^2``, ``sigma^2``
            (plug-in values from the single-task fits; not part of ``theta``, Sect. 4.4).
        likelihood: ``"exact"`` — the GP marginal likelihood of eq. 4 on ``theta_t = L s_t``;
            ``"laplace"`` — its second-order expansion around ``theta_hat_t`` with Hessian
            ``H_t`` (eqs. 5-6), a factor ``-1/2 |theta_hat_t - L s_t|^2_{H_t}``.
        theta_hat: ``(T, d)`` single-task optima in the coded parametrization (``"laplace"``
            only): ``theta_hat_t`` for ``"theta"``, ``log theta_hat_t`` for ``"log_theta"``.
        hessians: ``(T, d, d)`` Hessians of the NLL in that parametrization (``"laplace"``
            only): ``H_t``, or ``H^u_t`` (:func:`log_theta_hessian`).
        parametrization: ``"theta"`` (the paper's ``theta_t = L s_t``) or ``"log_theta"``
            (``theta_t = exp(L s_t)``).
    """
    T = len(tasks)
    d = tasks[0][0].shape[1]
    k = num_components
    L = numpyro.sample("L", dist.Normal(0.0, basis_prior_scale(T, lam)).expand([d, k]).to_event(2))
    with numpyro.plate("tasks", T):
        S = numpyro.sample("s", dist.Laplace(0.0, laplace_prior_scale(mu)).expand([T, k]).to_event(1))
    for t, (X, y, mask) in enumerate(tasks):
        z = L @ S[t]
        if likelihood == "exact":
            hyp = TaskHyperparameters(theta_from_code(z, parametrization), signal_variances[t],
                                      noise_variances[t])
            K = masked_gram(hyp, X, mask)
            numpyro.sample(f"y_{t}", dist.MultivariateNormal(
                jnp.zeros(X.shape[0], X.dtype), scale_tril=jitter_cholesky(K, name="K_sigma")),
                obs=None if y is None else y * mask)
            if y is not None:  # padded rows: N(0, 1) at 0 adds -1/2 log 2 pi each; remove it
                numpyro.factor(f"pad_{t}", 0.5 * jnp.sum(1.0 - mask) * _LOG_2PI)
        elif likelihood == "laplace":
            r = theta_hat[t] - z
            numpyro.factor(f"laplace_{t}", -0.5 * r @ hessians[t] @ r)
        else:
            raise ValueError(f"likelihood: expected 'exact' or 'laplace', received {likelihood!r}")
