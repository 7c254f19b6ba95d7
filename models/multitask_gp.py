"""Batch multi-task GP with the intrinsic coregionalization model (Bonilla, Chai & Williams
2008), the "Batch MTGP" baseline of GP-ELLA (Clingerman & Eaton 2017, Sect. 5).

    f ~ GP(0, k),  k((x, t), (x', t')) = B_tt' k_theta(x, x'),   y_ti = f(x_ti, t) + eps,
    eps ~ N(0, sigma_t^2),   B = W W^T + diag(kappa),   W: (T, r)

with ``k_theta`` the ARD SE kernel of :func:`models.gp_ella.se_ard_gram` (shared by all
tasks; its amplitude is in ``B``). Bonilla et al. use a low-rank ``B = W W^T``; the diagonal
``kappa > 0`` keeps ``B`` positive definite and makes ``W = 0`` the limit of independent GPs
with shared lengthscales, task amplitudes ``kappa_t`` and noises ``sigma_t^2``.

Padded rows (``mask = 0``) are decoupled with unit variance, as in :mod:`models.gp_ella`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
from jax import Array
from jax.scipy.linalg import cho_solve, solve_triangular

from models.gp_ella import se_ard_gram
from models.linalg_jax import jitter_cholesky

__all__ = ["ICMParams", "task_covariance", "icm_gram", "icm_negative_log_marginal_likelihood",
           "icm_predict"]

_LOG_2PI = math.log(2.0 * math.pi)


class ICMParams(NamedTuple):
    """Hyperparameters of the ICM multi-task GP.

    Attributes:
        theta: ``(d,)`` inverse squared lengthscales of the input kernel.
        W: ``(T, r)`` low-rank factor of the task covariance (real-valued).
        kappa: ``(T,)`` positive diagonal of the task covariance.
        noise_variance: ``(T,)`` per-task noise variances.
    """

    theta: Array
    W: Array
    kappa: Array
    noise_variance: Array


def task_covariance(params: ICMParams) -> Array:
    """``B = W W^T + diag(kappa)``, ``(T, T)``."""
    return params.W @ params.W.T + jnp.diag(params.kappa)


def icm_gram(params: ICMParams, X: Array, task_onehot: Array, mask: Array) -> Array:
    """``K_y = (Z B Z^T) o K_theta(X) + diag(sigma_{t_i}^2)`` on real rows; ``Z`` one-hot ``(n, T)``."""
    m = mask.astype(X.dtype)
    B = task_covariance(params)
    Bfull = task_onehot @ B @ task_onehot.T
    K = Bfull * se_ard_gram(params.theta, X) * (m[:, None] * m[None, :])
    noise = task_onehot @ params.noise_variance
    return K + jnp.diag(noise * m + (1.0 - m))


def icm_negative_log_marginal_likelihood(params: ICMParams, X: Array, y: Array,
                                         task_onehot: Array, mask: Array) -> Array:
    """``-log N(y | 0, K_y)`` over all tasks' (real) rows."""
    Lc = jitter_cholesky(icm_gram(params, X, task_onehot, mask), name="ICM K_y")
    alpha = cho_solve((Lc, True), y * mask)
    return (0.5 * jnp.dot(y * mask, alpha) + jnp.sum(jnp.log(jnp.diagonal(Lc)))
            + 0.5 * jnp.sum(mask) * _LOG_2PI)


def icm_predict(params: ICMParams, X: Array, y: Array, task_onehot: Array, mask: Array,
                X_star: Array, task: int | Array) -> tuple[Array, Array]:
    """Predictive mean and variance of ``y*`` for task ``task`` at ``X_star (m, d)``."""
    Lc = jitter_cholesky(icm_gram(params, X, task_onehot, mask), name="ICM K_y")
    alpha = cho_solve((Lc, True), y * mask)
    B = task_covariance(params)
    b_row = task_onehot @ B[:, task]  # B[t_i, task] per training row
    K_s = (b_row * mask)[:, None] * se_ard_gram(params.theta, X, X_star)
    mean = K_s.T @ alpha
    v = solve_triangular(Lc, K_s, lower=True)
    var = B[task, task] - jnp.sum(v * v, axis=0)
    return mean, jnp.maximum(var, 0.0) + params.noise_variance[task]
