"""Exact Gaussian-process regression: the NumPyro program and its closed forms (JAX).

Generative model (Rasmussen & Williams 2006, eq. 2.30, zero mean after centring):

    f ~ GP(0, k_theta),    y_i | f ~ N(f(x_i), sigma^2)
    =>  y ~ N(0, K + sigma^2 I),   K = k_theta(X, X).

Log marginal likelihood (R&W Algorithm 2.1, eq. 2.30), with ``L = chol(K + sigma^2 I)`` and
``alpha = L^-T L^-1 y``:

    log p(y | X, theta) = -1/2 y^T alpha - sum_i log L_ii - n/2 log 2 pi.

Predictive at ``X*`` (R&W eqs. 2.25-2.26, Algorithm 2.1 lines 4-6), ``K* = k(X, X*)``,
``v = L^-1 K*``:

    mean* = K*^T alpha,     var*(f) = diag k(X*, X*) - sum_rows v^2,
    var*(y) = var*(f) + sigma^2.

This is the exact GP baseline of VIPS (Pescador-Barrios et al. 2024, Table 1) and the
single-task GP of GP-ELLA (Clingerman & Eaton 2017, eq. 4). It needs float64.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax import Array
from jax.scipy.linalg import solve_triangular

from models.kernels_jax import Kernel
from models.linalg_jax import jitter_cholesky

__all__ = ["GPRegressionParams", "gp_regression_model", "log_marginal_likelihood",
           "negative_log_marginal_likelihood", "posterior_predictive", "GPPosterior", "condition",
           "leave_one_out"]

_LOG_2PI = math.log(2.0 * math.pi)


class GPRegressionParams(NamedTuple):
    """Hyperparameters of ``y ~ N(0, k_theta(X, X) + noise_variance * I)``.

    Attributes:
        kernel: the covariance function k_theta (a pytree of positive hyperparameters).
        noise_variance: sigma^2 > 0, the Gaussian observation-noise variance.
    """

    kernel: Kernel
    noise_variance: Array


def gp_regression_model(X: Array, y: Array | None = None, *, params: GPRegressionParams) -> None:
    """NumPyro program of exact GP regression with the latent f marginalized out.

    Args:
        X: inputs ``(n, d)``.
        y: observed targets ``(n,)`` (``None`` to sample from the prior predictive).
        params: kernel and noise variance.
    """
    n = X.shape[0]
    cov = params.kernel(X) + params.noise_variance * jnp.eye(n, dtype=X.dtype)
    numpyro.sample("y", dist.MultivariateNormal(jnp.zeros(n, X.dtype), covariance_matrix=cov), obs=y)


class GPPosterior(NamedTuple):
    """What prediction needs after conditioning on ``(X, y)``: ``L = chol(K + s2 I)``, ``alpha``."""

    X: Array
    L: Array
    alpha: Array


def condition(params: GPRegressionParams, X: Array, y: Array) -> GPPosterior:
    """Factor ``K + sigma^2 I`` once (R&W Alg. 2.1 lines 2-3)."""
    n = X.shape[0]
    K_y = params.kernel(X) + params.noise_variance * jnp.eye(n, dtype=X.dtype)
    L = jitter_cholesky(K_y, name="K + noise I")
    alpha = solve_triangular(L.T, solve_triangular(L, y, lower=True), lower=False)
    return GPPosterior(X, L, alpha)


def leave_one_out(posterior: GPPosterior) -> Array:
    """Pointwise leave-one-out log predictive ``log p(y_i | X, y_-i, theta)``, ``(n,)``
    (Rasmussen & Williams 2006, eqs. 5.10-5.12): with ``K_y = K + sigma^2 I``,

        mu_i = y_i - [K_y^-1 y]_i / [K_y^-1]_ii,    s_i^2 = 1 / [K_y^-1]_ii,
        log p = -log(2 pi s_i^2) / 2 - (y_i - mu_i)^2 / (2 s_i^2)
              = -log(2 pi) / 2 + log [K_y^-1]_ii / 2 - alpha_i^2 / (2 [K_y^-1]_ii),

    ``alpha = K_y^-1 y``; ``[K_y^-1]_ii`` is the squared norm of column i of ``L^-1``."""
    n = posterior.L.shape[0]
    L_inv = solve_triangular(posterior.L, jnp.eye(n, dtype=posterior.L.dtype), lower=True)
    k_ii = jnp.sum(L_inv**2, axis=0)
    return -0.5 * jnp.log(2 * jnp.pi) + 0.5 * jnp.log(k_ii) - 0.5 * posterior.alpha**2 / k_ii


def log_marginal_likelihood(params: GPRegressionParams, X: Array, y: Array) -> Array:
    """``log N(y | 0, K + sigma^2 I)`` (R&W eq. 2.30) for ``X (n, d)``, ``y (n,)``."""
    post = condition(params, X, y)
    n = X.shape[0]
    return (-0.5 * jnp.dot(y, post.alpha) - jnp.sum(jnp.log(jnp.diagonal(post.L)))
            - 0.5 * n * _LOG_2PI)


def negative_log_marginal_likelihood(params: GPRegressionParams, X: Array, y: Array) -> Array:
    """``-log p(y | X, params)``: the type-II ML objective (R&W eq. 5.8)."""
    return -log_marginal_likelihood(params, X, y)


def posterior_predictive(params: GPRegressionParams, post: GPPosterior, X_star: Array, *,
                         include_noise: bool = True, full_cov: bool = False) -> tuple[Array, Array]:
    """Predictive mean ``(m,)`` and variance ``(m,)`` (or covariance ``(m, m)``) at ``X_star``.

    R&W eqs. 2.25-2.26; ``include_noise`` adds sigma^2 (predictive of y rather than f).
    """
    K_s = params.kernel(post.X, X_star)
    mean = K_s.T @ post.alpha
    v = solve_triangular(post.L, K_s, lower=True)
    noise = params.noise_variance if include_noise else 0.0
    if full_cov:
        cov = params.kernel(X_star) - v.T @ v
        return mean, cov + noise * jnp.eye(X_star.shape[0], dtype=X_star.dtype)
    var = params.kernel.diag(X_star) - jnp.sum(v * v, axis=0)
    return mean, jnp.maximum(var, 0.0) + noise
