"""Parameter-drift state-space model of Titsias et al. (2024), "Kalman filter for online
classification of non-stationary data" (papers/kalman_ocl.txt), as NumPyro programs.

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

The module also holds the representation phi(x; theta) of Sect. 2 (small JAX networks whose
parameters the learner fine-tunes): :func:`feature_network` returns ``(init, apply)``.
"""

from __future__ import annotations

import math
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
    "FeatureNetwork", "feature_network", "FEATURE_NETWORKS",
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


# ---------------------------------------------------------------------------------------------
# representation phi(x; theta)
# ---------------------------------------------------------------------------------------------
class FeatureNetwork(NamedTuple):
    """A representation ``phi(x; theta)`` (Sect. 2): ``init(rng_key) -> theta`` (a pytree of
    arrays) and ``apply(theta, x) -> phi`` mapping inputs ``(n, d)`` to features
    ``(n, feature_dim)``. ``feature_dim`` is the output size before the optional bias."""

    init: Callable[[Array], Any]
    apply: Callable[[Any, Array], Array]
    feature_dim: int


def _normal(key, shape: tuple[int, ...], dtype) -> Array:
    # drawn flat and reshaped: XLA compiles a 1-D threefry + normal transform much faster
    return jax.random.normal(key, (math.prod(shape),), dtype).reshape(shape)


def _dense_init(key, fan_in: int, fan_out: int, dtype) -> dict:
    # He initialization (ReLU networks): W ~ N(0, 2 / fan_in)
    w = _normal(key, (fan_in, fan_out), dtype) * math.sqrt(2.0 / fan_in)
    return {"w": w, "b": jnp.zeros((fan_out,), dtype)}


def _mlp(input_dim: int, hidden: tuple[int, ...], feature_dim: int, dtype) -> FeatureNetwork:
    sizes = (input_dim,) + tuple(hidden) + (feature_dim,)

    def init(key):
        keys = jax.random.split(key, len(sizes) - 1)
        return [_dense_init(k, a, b, dtype) for k, a, b in zip(keys, sizes[:-1], sizes[1:])]

    def apply(theta, x):
        h = x
        for layer in theta:
            h = jax.nn.relu(h @ layer["w"] + layer["b"])
        return h

    return FeatureNetwork(init, apply, feature_dim)


def _conv_init(key, kh: int, kw: int, cin: int, cout: int, dtype) -> dict:
    fan_in = kh * kw * cin
    w = _normal(key, (kh, kw, cin, cout), dtype) * math.sqrt(2.0 / fan_in)
    return {"w": w, "b": jnp.zeros((cout,), dtype)}


def _conv(x, p, stride: int = 1):
    y = jax.lax.conv_general_dilated(x, p["w"], (stride, stride), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + p["b"]


def _avg_pool2(x):
    n, h, w, c = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


def _image_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ValueError(f"input_shape: expected (height, width, channels), received "
                         f"{tuple(input_shape)}")
    return tuple(int(v) for v in input_shape)  # type: ignore[return-value]


def _cnn(input_shape: tuple[int, ...], channels: tuple[int, ...], feature_dim: int,
         dtype) -> FeatureNetwork:
    """conv3x3-relu-avgpool blocks, then a dense ReLU layer to ``feature_dim``."""
    h, w, c = _image_shape(input_shape)
    for _ in channels:
        h, w = h // 2, w // 2
    flat = h * w * channels[-1]

    def init(key):
        keys = jax.random.split(key, len(channels) + 1)
        convs, cin = [], c
        for k, cout in zip(keys[:-1], channels):
            convs.append(_conv_init(k, 3, 3, cin, cout, dtype))
            cin = cout
        return {"convs": convs, "dense": _dense_init(keys[-1], flat, feature_dim, dtype)}

    def apply(theta, x):
        z = x.reshape((x.shape[0],) + tuple(input_shape))
        for p in theta["convs"]:
            z = _avg_pool2(jax.nn.relu(_conv(z, p)))
        z = z.reshape(z.shape[0], -1)
        return jax.nn.relu(z @ theta["dense"]["w"] + theta["dense"]["b"])

    return FeatureNetwork(init, apply, feature_dim)


def _group_norm(x, p, groups: int = 8, eps: float = 1e-5):
    n, h, w, c = x.shape
    g = min(groups, c)
    z = x.reshape(n, h, w, g, c // g)
    mean = z.mean(axis=(1, 2, 4), keepdims=True)
    var = z.var(axis=(1, 2, 4), keepdims=True)
    z = ((z - mean) / jnp.sqrt(var + eps)).reshape(n, h, w, c)
    return z * p["scale"] + p["shift"]


def _norm_init(c: int, dtype) -> dict:
    return {"scale": jnp.ones((c,), dtype), "shift": jnp.zeros((c,), dtype)}


def _resnet18(input_shape: tuple[int, ...], feature_dim: int, width: int, dtype) -> FeatureNetwork:
    """CIFAR ResNet-18 (3x3 stem, 4 stages of 2 BasicBlocks, widths w, 2w, 4w, 8w), with
    GroupNorm in place of BatchNorm so that a chunk's prediction does not depend on the chunk's
    own batch statistics (an online-protocol requirement; the paper does not say which
    normalization it used). The pooled 8w features go through a dense ReLU layer to
    ``feature_dim`` unless ``feature_dim == 8 * width``."""
    _, _, c = _image_shape(input_shape)
    widths = (width, 2 * width, 4 * width, 8 * width)
    head = feature_dim != widths[-1]

    def init(key):
        keys = iter(jax.random.split(key, 64))
        theta = {"stem": _conv_init(next(keys), 3, 3, c, width, dtype),
                 "stem_norm": _norm_init(width, dtype), "blocks": []}
        cin = width
        for stage, cout in enumerate(widths):
            for b in range(2):
                stride = 2 if (stage > 0 and b == 0) else 1
                blk = {"conv1": _conv_init(next(keys), 3, 3, cin, cout, dtype),
                       "norm1": _norm_init(cout, dtype),
                       "conv2": _conv_init(next(keys), 3, 3, cout, cout, dtype),
                       "norm2": _norm_init(cout, dtype)}
                if stride != 1 or cin != cout:
                    blk["proj"] = _conv_init(next(keys), 1, 1, cin, cout, dtype)
                    blk["proj_norm"] = _norm_init(cout, dtype)
                theta["blocks"].append(blk)
                cin = cout
        if head:
            theta["dense"] = _dense_init(next(keys), widths[-1], feature_dim, dtype)
        return theta

    strides = [2 if (s > 0 and b == 0) else 1 for s in range(4) for b in range(2)]

    def apply(theta, x):
        z = x.reshape((x.shape[0],) + tuple(input_shape))
        z = jax.nn.relu(_group_norm(_conv(z, theta["stem"]), theta["stem_norm"]))
        for blk, stride in zip(theta["blocks"], strides):
            y = jax.nn.relu(_group_norm(_conv(z, blk["conv1"], stride), blk["norm1"]))
            y = _group_norm(_conv(y, blk["conv2"]), blk["norm2"])
            sc = z if "proj" not in blk else _group_norm(_conv(z, blk["proj"], stride),
                                                         blk["proj_norm"])
            z = jax.nn.relu(y + sc)
        z = z.mean(axis=(1, 2))
        if head:
            z = jax.nn.relu(z @ theta["dense"]["w"] + theta["dense"]["b"])
        return z

    return FeatureNetwork(init, apply, feature_dim if head else widths[-1])


def _identity(input_dim: int) -> FeatureNetwork:
    return FeatureNetwork(lambda key: [], lambda theta, x: x, input_dim)


FEATURE_NETWORKS = ("identity", "mlp", "cnn", "resnet18")


def feature_network(name: str, *, input_dim: int, feature_dim: int | None = None,
                    hidden: tuple[int, ...] = (256,), input_shape: tuple[int, ...] | None = None,
                    channels: tuple[int, ...] = (32, 64), width: int = 64,
                    dtype: Any = jnp.float32) -> FeatureNetwork:
    """Build the representation ``phi(x; theta)`` named ``name``.

    Args:
        name: ``"identity"`` (phi(x) = x: pre-extracted features), ``"mlp"`` (ReLU MLP with
            ``hidden`` layers), ``"cnn"`` (conv3x3-ReLU-avgpool per entry of ``channels``, then
            dense ReLU), ``"resnet18"`` (CIFAR ResNet-18 of base ``width``, GroupNorm).
        input_dim: d, the flattened input size.
        feature_dim: m (ignored by ``"identity"``).
        input_shape: ``(H, W, C)`` for the image networks (``prod == input_dim``).
        dtype: parameter dtype.
    """
    if name == "identity":
        return _identity(input_dim)
    if feature_dim is None or feature_dim < 1:
        raise ValueError(f"feature_dim: expected a positive int for network {name!r}, received "
                         f"{feature_dim}")
    if name == "mlp":
        return _mlp(input_dim, tuple(hidden), feature_dim, dtype)
    if name in ("cnn", "resnet18"):
        if input_shape is None or math.prod(input_shape) != input_dim:
            raise ValueError(f"input_shape: expected (H, W, C) with H*W*C = {input_dim} for network "
                             f"{name!r}, received {input_shape}")
        if name == "cnn":
            return _cnn(tuple(input_shape), tuple(channels), feature_dim, dtype)
        return _resnet18(tuple(input_shape), feature_dim, width, dtype)
    raise ValueError(f"feature network: expected one of {FEATURE_NETWORKS}, received {name!r}")
