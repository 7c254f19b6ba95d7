"""Parameter-drift state-space model of Titsias et al. (2024), "Kalman filter for online
classification of non-stationary data", as NumPyro programs.

The model (WHAT; the Kalman recursions that infer it live in :mod:`inference.kalman`)::

    phi_n = phi(x_n; theta) in R^m                                   representation
    w_0 ~ N(0, s_w2 I)                                               eq. 2
    w_n | w_{n-1} ~ N(gamma_n w_{n-1}, (1 - gamma_n^2) s_w2 I)       eq. 3 (parameter drift)
    y_n | w_n ~ N(w_n^T phi_n, s2)                                   eq. 1 (regression)

For K classes the readout is a matrix W_n = (w_{n,1} .. w_{n,K}) in R^{m x K} whose K columns
follow eqs. 2-3 independently, and

    p(y_n = k | W_n) = softmax(alpha W_n^T phi_n)_k                  softmax likelihood
                                                                     (alpha: calibration, eq. 13)
    q(y_n | W_n) = prod_j N(y_{n,j} | w_{n,j}^T phi_n, s2)           Gaussian surrogate on the
                                                                     one-hot vector (Sect. 2.1 (i))

The surrogate keeps the recursions Gaussian (eqs. 7-8, one m x m covariance shared by the K
columns because s2 is shared); the softmax is used for prediction and for learning.

App. C ("mean-preserving") variant: the transition mean is not shrunk towards zero,

    w_n | w_{n-1} ~ N((1 - gamma_n) mu_{n-1} + gamma_n w_{n-1}, (1 - gamma_n^2) s_w2 I),

with mu_{n-1} chosen by empirical Bayes (mu_{n-1} = m_{n-1}, the filtered mean), so that the
filter's prediction step reads m_n^- = m_{n-1}. The programs below take the sequence
``drift_means`` = (mu_0, ..., mu_{n-1}) as data, which makes the variant a proper linear-Gaussian
model for a given sequence (the filter supplies its own means).

The programs are non-centred: ``w_0`` and the innovations ``eps_n ~ N(0, I)`` are the sampled
sites and ``w_n = gamma_n w_{n-1} + (1 - gamma_n) mu_{n-1} + sqrt(1 - gamma_n^2) s_w eps_n`` is a
deterministic site. This is exact for gamma_n = 1 (a point-mass transition) and keeps NUTS
geometry benign when gamma_n is close to one.

The representation phi(x; theta) of Sect. 2 (the networks the learner fine-tunes) is in
:mod:`models.feature_networks`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax import Array
from numpyro.contrib.control_flow import scan

__all__ = [
    "DriftPrior", "GaussianLikelihood", "SurrogateLikelihood", "SoftmaxLikelihood",
    "forgetting_from_delta", "delta_from_forgetting",
    "drift_regression_model", "drift_classification_model", "drift_surrogate_model",
]


# ---------------------------------------------------------------------------------------------
# typed parameter containers
# ---------------------------------------------------------------------------------------------
class DriftPrior(NamedTuple):
    """Parameter-drift prior over readout weights (eqs. 2-3 of Titsias et al. 2024).

    ``w_0 ~ N(0, s_w2 I)`` and ``w_n | w_{n-1} ~ N(gamma_n w_{n-1}, (1 - gamma_n^2) s_w2 I)``,
    a variance-preserving diffusion: every ``w_n`` has marginal ``N(0, s_w2 I)``. The forgetting
    coefficients gamma_n in [0, 1] are not part of this container (they are data of the
    programs and a learned state of the filter).

    Attributes:
        prior_variance: ``s_w2 > 0`` (Algorithm 1 default ``1 / m``).
    """

    prior_variance: Any


class GaussianLikelihood(NamedTuple):
    """Gaussian regression likelihood ``y_n | w_n ~ N(w_n^T phi_n, s2)`` (eq. 1).

    Attributes:
        noise_variance: ``s2 > 0``.
    """

    noise_variance: Any


class SurrogateLikelihood(NamedTuple):
    """Gaussian surrogate of the softmax on the one-hot label (Sect. 2.1 (i)):
    ``q(y_n | W_n) = prod_{j=1}^K N(y_{n,j} | w_{n,j}^T phi_n, s2)``.

    One ``s2`` for all K outputs is what lets the K columns share one covariance (eqs. 7-8).

    Attributes:
        noise_variance: ``s2 > 0`` (Algorithm 1 default ``1 / K``).
    """

    noise_variance: Any


class SoftmaxLikelihood(NamedTuple):
    """Calibrated softmax likelihood ``p(y_n = k | W_n) = softmax(alpha W_n^T phi_n)_k`` (eq. 13;
    ``alpha = 1`` is the plain softmax of Sect. 2.1).

    Attributes:
        calibration: ``alpha > 0``.
    """

    calibration: Any = 1.0


def forgetting_from_delta(delta: Array) -> Array:
    """``gamma = exp(-delta / 2)`` (Sect. 2.1.1); ``delta >= 0`` gives ``gamma in (0, 1]``."""
    return jnp.exp(-0.5 * jnp.asarray(delta))


def delta_from_forgetting(gamma: Array) -> Array:
    """Inverse of :func:`forgetting_from_delta`: ``delta = -2 log gamma``."""
    return -2.0 * jnp.log(jnp.asarray(gamma))


# ---------------------------------------------------------------------------------------------
# NumPyro programs
# ---------------------------------------------------------------------------------------------
def _forgetting_sequence(forgetting: Any, n: int, dtype) -> Array:
    g = jnp.broadcast_to(jnp.asarray(forgetting, dtype=dtype), (n,))
    return g


def _drift_scan(features: Array, targets: Any, forgetting: Any, prior: DriftPrior,
                num_outputs: int, drift_means: Array | None,
                emit: Callable[[Array, Array, Any], None]) -> None:
    """Shared body: sample w_0 (eq. 2), then for n = 1..N the drift (eq. 3 or App. C) and
    the observation site written by ``emit(w_n, phi_n, target_n)``; the weights are recorded
    as the deterministic site ``w`` of shape ``(N, m, num_outputs)``."""
    features = jnp.asarray(features)
    n, m = features.shape
    dtype = features.dtype
    gamma = _forgetting_sequence(forgetting, n, dtype)
    s_w = jnp.sqrt(jnp.asarray(prior.prior_variance, dtype=dtype))
    shape = (m, num_outputs)
    if drift_means is None:
        mu = jnp.zeros((n,) + shape, dtype=dtype)
    else:
        mu = jnp.broadcast_to(jnp.asarray(drift_means, dtype=dtype).reshape(n, m, -1), (n,) + shape)

    w0 = numpyro.sample("w_0", dist.Normal(jnp.zeros(shape, dtype), s_w).to_event(2))

    def body(w_prev, xs):
        phi_n, gamma_n, mu_prev, target_n = xs
        eps = numpyro.sample("eps", dist.Normal(jnp.zeros(shape, dtype), 1.0).to_event(2))
        # eq. 3 (App. C when mu_prev != 0): w_n = gamma w_{n-1} + (1 - gamma) mu + sqrt(1-gamma^2) s_w eps
        w = gamma_n * w_prev + (1.0 - gamma_n) * mu_prev \
            + jnp.sqrt(jnp.clip(1.0 - gamma_n**2, 0.0)) * s_w * eps
        numpyro.deterministic("w", w)
        emit(w, phi_n, target_n)
        return w, None

    scan(body, w0, (features, gamma, mu, targets))


def drift_regression_model(features: Array, targets: Array | None = None, *,
                           forgetting: Any = 1.0, prior: DriftPrior = DriftPrior(1.0),
                           likelihood: GaussianLikelihood = GaussianLikelihood(1.0),
                           drift_means: Array | None = None) -> None:
    """Drift prior (eqs. 2-3) with the Gaussian regression likelihood (eq. 1).

    Args:
        features: ``phi_{1:N}``, shape ``(N, m)``.
        targets: ``y_{1:N}``, shape ``(N,)``; ``None`` samples them (prior predictive).
        forgetting: ``gamma_{1:N}``, a scalar or shape ``(N,)``, values in [0, 1].
        prior: :class:`DriftPrior` (``s_w2``).
        likelihood: :class:`GaussianLikelihood` (``s2``).
        drift_means: App. C variant, ``mu_{0:N-1}`` of shape ``(N, m)``; ``None`` is eq. 3.

    Sites: ``w_0`` ``(m, 1)``, ``eps`` ``(N, m, 1)``, deterministic ``w`` ``(N, m, 1)``,
    observed ``y`` ``(N,)``.
    """
    noise_sd = jnp.sqrt(jnp.asarray(likelihood.noise_variance))

    def emit(w, phi_n, y_n):
        numpyro.sample("y", dist.Normal(phi_n @ w[:, 0], noise_sd), obs=y_n)

    _drift_scan(features, targets, forgetting, prior, 1, drift_means, emit)


def drift_classification_model(features: Array, labels: Array | None = None, *,
                               num_classes: int, forgetting: Any = 1.0,
                               prior: DriftPrior = DriftPrior(1.0),
                               likelihood: SoftmaxLikelihood = SoftmaxLikelihood(1.0),
                               drift_means: Array | None = None) -> None:
    """Drift prior over the ``m x K`` readout with the (calibrated) softmax likelihood.

    Args:
        features: ``(N, m)``; labels: ``(N,)`` integers in ``0..K-1`` or ``None``;
        num_classes: K; forgetting: scalar or ``(N,)``; prior: :class:`DriftPrior`;
        likelihood: :class:`SoftmaxLikelihood` (``alpha``); drift_means: ``(N, m, K)`` or None.

    Sites: ``w_0`` ``(m, K)``, ``eps`` ``(N, m, K)``, ``w`` ``(N, m, K)``, observed ``y``.
    """
    alpha = jnp.asarray(likelihood.calibration)

    def emit(w, phi_n, y_n):
        numpyro.sample("y", dist.Categorical(logits=alpha * (phi_n @ w)), obs=y_n)

    _drift_scan(features, labels, forgetting, prior, num_classes, drift_means, emit)


def drift_surrogate_model(features: Array, labels: Array | None = None, *, num_classes: int,
                          forgetting: Any = 1.0, prior: DriftPrior = DriftPrior(1.0),
                          likelihood: SurrogateLikelihood = SurrogateLikelihood(1.0),
                          drift_means: Array | None = None) -> None:
    """Drift prior with the Gaussian surrogate likelihood on the one-hot label (Sect. 2.1 (i)).

    This is the linear-Gaussian model whose exact filter is eqs. 7-8. The observed site ``y``
    is the one-hot vector ``(N, K)`` (``labels=None`` samples real-valued surrogate targets).
    """
    noise_sd = jnp.sqrt(jnp.asarray(likelihood.noise_variance))
    onehot = None if labels is None else jax.nn.one_hot(jnp.asarray(labels), num_classes,
                                                        dtype=jnp.asarray(features).dtype)

    def emit(w, phi_n, y_n):
        numpyro.sample("y", dist.Normal(phi_n @ w, noise_sd).to_event(1), obs=y_n)

    _drift_scan(features, onehot, forgetting, prior, num_classes, drift_means, emit)
