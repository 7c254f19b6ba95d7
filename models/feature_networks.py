"""The representation ``phi(x; theta)`` of Titsias et al. (2024), Sect. 2:
small JAX networks whose parameters ``theta`` the Kalman learner fine-tunes (Sect. 2.1.2) or
keeps fixed (the paper's fixed-backbone rows).

:func:`feature_network` returns a :class:`FeatureNetwork` ``(init, apply, feature_dim)``:
``"identity"`` (pre-extracted features, phi(x) = x), ``"mlp"`` (ReLU MLP), ``"cnn"``
(conv3x3-ReLU-avgpool blocks + dense ReLU), ``"resnet18"`` (the CIFAR ResNet-18 of App. D.4
with GroupNorm) and ``"rff"`` (random Fourier features). :func:`with_postprocessing` adds App.
D.3's feature normalization (divide by the square root of the dimension) and bias (a constant 1
appended).

Random Fourier features (Rahimi & Recht 2007, "Random Features for Large-Scale Kernel
Machines"): ``phi(x) = sqrt(2) cos(x W / l + b)`` with ``W ~ N(0, I)`` of shape ``(d, m)`` and
``b ~ U(0, 2 pi)`` (theta = ``{"w": W, "b": b}``, drawn in ``init``; ``l`` the lengthscale).
Since ``E[2 cos(w.x/l + b) cos(w.x'/l + b)] = E[cos(w.(x - x')/l)] = exp(-|x - x'|^2 / (2 l^2))``,
the kernel ``(1/m) phi(x)^T phi(x')`` tends to the squared-exponential kernel of variance 1 as
``m -> inf``. Bayesian linear regression on phi with the prior ``w ~ N(0, I/m)`` (the Kalman
learners' default prior variance ``s_w2 = 1/m``, Algorithm 1) therefore has the prior covariance
``(1/m) phi^T phi`` and is, in the limit, the GP with that SE kernel; without fine-tuning
and with gamma = 1 the regression filter gives that (approximate) GP posterior.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

__all__ = ["FeatureNetwork", "feature_network", "with_postprocessing", "FEATURE_NETWORKS"]


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


def _rff(input_dim: int, feature_dim: int, lengthscale: float, dtype) -> FeatureNetwork:
    """Random Fourier features of the SE kernel (Rahimi & Recht 2007; module docstring)."""
    scale = 1.0 / float(lengthscale)

    def init(key):
        kw, kb = jax.random.split(key)
        return {"w": _normal(kw, (input_dim, feature_dim), dtype),
                "b": jax.random.uniform(kb, (feature_dim,), dtype, 0.0, 2.0 * math.pi)}

    def apply(theta, x):
        return math.sqrt(2.0) * jnp.cos((x @ theta["w"]) * scale + theta["b"])

    return FeatureNetwork(init, apply, feature_dim)


def _identity(input_dim: int) -> FeatureNetwork:
    return FeatureNetwork(lambda key: [], lambda theta, x: x, input_dim)


FEATURE_NETWORKS = ("identity", "mlp", "cnn", "resnet18", "rff")


def feature_network(name: str, *, input_dim: int, feature_dim: int | None = None,
                    hidden: tuple[int, ...] = (256,), input_shape: tuple[int, ...] | None = None,
                    channels: tuple[int, ...] = (32, 64), width: int = 64,
                    lengthscale: float = 1.0, dtype: Any = jnp.float32) -> FeatureNetwork:
    """Build the representation ``phi(x; theta)`` named ``name``.

    Args:
        name: ``"identity"`` (phi(x) = x: pre-extracted features), ``"mlp"`` (ReLU MLP with
            ``hidden`` layers), ``"cnn"`` (conv3x3-ReLU-avgpool per entry of ``channels``, then
            dense ReLU), ``"resnet18"`` (CIFAR ResNet-18 of base ``width``, GroupNorm),
            ``"rff"`` (random Fourier features, Rahimi & Recht 2007:
            ``phi(x) = sqrt(2) cos(x W / lengthscale + b)``, ``W ~ N(0, I)`` of shape
            ``(input_dim, feature_dim)``, ``b ~ U(0, 2 pi)``, theta = ``{"w": W, "b": b}``).
            ``(1/m) phi(x)^T phi(x')`` tends to ``exp(-|x - x'|^2 / (2 lengthscale^2))``, so
            Bayesian linear regression on the rff features with prior variance ``1/m`` (the
            Kalman learners' default) is, as ``m -> inf``, the GP with that SE kernel.
        input_dim: d, the flattened input size.
        feature_dim: m (ignored by ``"identity"``).
        input_shape: ``(H, W, C)`` for the image networks (``prod == input_dim``).
        lengthscale: the SE kernel's lengthscale of ``"rff"`` (> 0; ignored by the others).
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
    if name == "rff":
        if isinstance(lengthscale, bool) or not isinstance(lengthscale, (int, float)) \
                or not (math.isfinite(lengthscale) and lengthscale > 0):
            raise ValueError(f"lengthscale: expected a finite number > 0 for network 'rff', "
                             f"received {lengthscale!r}")
        return _rff(input_dim, feature_dim, float(lengthscale), dtype)
    raise ValueError(f"feature network: expected one of {FEATURE_NETWORKS}, received {name!r}")


def with_postprocessing(net: FeatureNetwork, *, normalization: bool = False,
                        bias: bool = False) -> FeatureNetwork:
    """``net`` followed by App. D.3's options: ``phi / sqrt(dim)`` (normalization, applied to
    the network's output) and ``[phi, 1]`` (bias); ``feature_dim`` grows by one with the bias."""
    if not normalization and not bias:
        return net

    def apply(theta, x):
        f = net.apply(theta, x)
        if normalization:
            f = f / math.sqrt(f.shape[-1])
        if bias:
            f = jnp.concatenate([f, jnp.ones(f.shape[:-1] + (1,), f.dtype)], axis=-1)
        return f

    return FeatureNetwork(net.init, apply, net.feature_dim + (1 if bias else 0))
