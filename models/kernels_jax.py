"""Covariance functions for JAX / NumPyro models (exact GP, VIPS, GP-ELLA).

Same classes and conventions as :mod:`models.kernels_torch`, written the JAX way: every kernel
is a **pytree** whose leaves are its (positive) hyperparameters, so

* ``jax.grad`` / ``jax.jit`` / ``jax.vmap`` see through it;
* ``jax.tree_util.tree_map(jnp.log, kernel)`` is the unconstrained parametrization that type-II
  maximum likelihood optimizes, and ``tree_map(jnp.exp, raw)`` maps back.

Shapes: ``X1: (..., n, d)``, ``X2: (..., m, d)`` -> ``(..., n, m)``; ``variance`` a scalar per
kernel ``(...)``; ``lengthscale`` ``(..., d)`` (ARD) or ``(..., 1)`` / scalar (isotropic), the
last axis being the feature axis.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import Array
from jax.tree_util import register_pytree_node_class

from models.kernel_algebra import KernelAlgebra

__all__ = ["Kernel", "SquaredExponential", "Matern52", "Linear", "Cosine", "Constant",
           "Normalized", "Sum", "Product", "Scale", "squared_distance"]

_SQRT5 = math.sqrt(5.0)


def squared_distance(X1: Array, X2: Array) -> Array:
    """``||x1_i - x2_j||^2`` as ``(..., n, m)``, via ``|x|^2 + |y|^2 - 2 x.y`` clamped at 0."""
    n1 = jnp.sum(X1 * X1, axis=-1)[..., :, None]
    n2 = jnp.sum(X2 * X2, axis=-1)[..., None, :]
    return jnp.maximum(n1 + n2 - 2.0 * X1 @ jnp.swapaxes(X2, -1, -2), 0.0)


def _gram_scalar(v: Array) -> Array:
    """A per-kernel scalar ``(...)`` broadcast against a Gram matrix ``(..., n, m)``."""
    v = jnp.asarray(v)
    return v[..., None, None]


def _row_scalar(v: Array) -> Array:
    """A per-kernel scalar ``(...)`` broadcast against a diagonal ``(..., n)``."""
    return jnp.asarray(v)[..., None]


def _unit(X: Array) -> Array:
    return X / jnp.maximum(jnp.linalg.norm(X, axis=-1, keepdims=True), 1e-12)


class Kernel(KernelAlgebra):
    """Base class (a pytree). Subclasses list their hyperparameters / sub-kernels in
    ``_fields``."""

    _fields: tuple[str, ...] = ()

    def tree_flatten(self):
        return tuple(getattr(self, f) for f in self._fields), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        for f, c in zip(cls._fields, children):
            setattr(obj, f, c)
        return obj

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({args})"



class _Stationary(Kernel):
    """``k(x, y) = variance * g(||x - y|| / lengthscale)``."""

    _fields = ("variance", "lengthscale")

    def __init__(self, variance=1.0, lengthscale=1.0):
        self.variance = jnp.asarray(variance)
        self.lengthscale = jnp.asarray(lengthscale)

    def _profile(self, r2: Array) -> Array:
        raise NotImplementedError

    def __call__(self, X1: Array, X2: Array | None = None) -> Array:
        ls = self.lengthscale if self.lengthscale.ndim == 0 else self.lengthscale[..., None, :]
        Z1 = X1 / ls
        r2 = squared_distance(Z1, Z1 if X2 is None else X2 / ls)
        return _gram_scalar(self.variance) * self._profile(r2)

    def diag(self, X: Array) -> Array:
        return _row_scalar(self.variance) * jnp.ones(X.shape[:-1], X.dtype)


@register_pytree_node_class
class SquaredExponential(_Stationary):
    """ARD squared exponential ``k(x, y) = s^2 exp(-1/2 sum_i (x_i - y_i)^2 / l_i^2)``.

    GP-ELLA parametrizes it by ``theta_i = 1 / l_i^2`` with ``s^2 = 1`` (App. A of Clingerman &
    Eaton 2017); build it with ``lengthscale = theta ** -0.5`` there."""

    def _profile(self, r2: Array) -> Array:
        return jnp.exp(-0.5 * r2)


@register_pytree_node_class
class Matern52(_Stationary):
    """Matern 5/2: ``s^2 (1 + sqrt5 r + 5/3 r^2) exp(-sqrt5 r)`` (VIPS magnetic-field kernel)."""

    def _profile(self, r2: Array) -> Array:
        r = jnp.sqrt(jnp.maximum(r2, 1e-36))  # keeps the gradient finite at r = 0
        return (1.0 + _SQRT5 * r + (5.0 / 3.0) * r2) * jnp.exp(-_SQRT5 * r)


@register_pytree_node_class
class Linear(Kernel):
    """Dot product ``k(x, y) = variance * x.y``."""

    _fields = ("variance",)

    def __init__(self, variance=1.0):
        self.variance = jnp.asarray(variance)

    def __call__(self, X1: Array, X2: Array | None = None) -> Array:
        X2 = X1 if X2 is None else X2
        return _gram_scalar(self.variance) * (X1 @ jnp.swapaxes(X2, -1, -2))

    def diag(self, X: Array) -> Array:
        return _row_scalar(self.variance) * jnp.sum(X * X, axis=-1)


@register_pytree_node_class
class Cosine(Kernel):
    """Cosine similarity ``k(x, y) = variance * x.y / (|x| |y|)`` (normalized linear)."""

    _fields = ("variance",)

    def __init__(self, variance=1.0):
        self.variance = jnp.asarray(variance)

    def __call__(self, X1: Array, X2: Array | None = None) -> Array:
        U1 = _unit(X1)
        U2 = U1 if X2 is None else _unit(X2)
        return _gram_scalar(self.variance) * (U1 @ jnp.swapaxes(U2, -1, -2))

    def diag(self, X: Array) -> Array:
        return _row_scalar(self.variance) * jnp.ones(X.shape[:-1], X.dtype)


@register_pytree_node_class
class Constant(Kernel):
    """``k(x, y) = value`` (VIPS magnetic kernel: constant(500) + Matern 5/2)."""

    _fields = ("value",)

    def __init__(self, value=1.0):
        self.value = jnp.asarray(value)

    def __call__(self, X1: Array, X2: Array | None = None) -> Array:
        X2 = X1 if X2 is None else X2
        batch = jnp.broadcast_shapes(X1.shape[:-2], X2.shape[:-2])
        ones = jnp.ones(batch + (X1.shape[-2], X2.shape[-2]), X1.dtype)
        return _gram_scalar(self.value) * ones

    def diag(self, X: Array) -> Array:
        return _row_scalar(self.value) * jnp.ones(X.shape[:-1], X.dtype)


@register_pytree_node_class
class Normalized(Kernel):
    """``base`` applied to L2-normalized inputs ``x / |x|``."""

    _fields = ("base",)

    def __init__(self, base: Kernel):
        self.base = base

    def __call__(self, X1: Array, X2: Array | None = None) -> Array:
        return self.base(_unit(X1), None if X2 is None else _unit(X2))

    def diag(self, X: Array) -> Array:
        return self.base.diag(_unit(X))


@register_pytree_node_class
class Sum(Kernel):
    _fields = ("k1", "k2")

    def __init__(self, k1: Kernel, k2: Kernel):
        self.k1, self.k2 = k1, k2

    def __call__(self, X1: Array, X2: Array | None = None) -> Array:
        return self.k1(X1, X2) + self.k2(X1, X2)

    def diag(self, X: Array) -> Array:
        return self.k1.diag(X) + self.k2.diag(X)


@register_pytree_node_class
class Product(Kernel):
    _fields = ("k1", "k2")

    def __init__(self, k1: Kernel, k2: Kernel):
        self.k1, self.k2 = k1, k2

    def __call__(self, X1: Array, X2: Array | None = None) -> Array:
        return self.k1(X1, X2) * self.k2(X1, X2)

    def diag(self, X: Array) -> Array:
        return self.k1.diag(X) * self.k2.diag(X)


@register_pytree_node_class
class Scale(Kernel):
    """``scale * base`` with a positive scale."""

    _fields = ("base", "scale")

    def __init__(self, base: Kernel, scale):
        self.base, self.scale = base, jnp.asarray(scale)

    def __call__(self, X1: Array, X2: Array | None = None) -> Array:
        return _gram_scalar(self.scale) * self.base(X1, X2)

    def diag(self, X: Array) -> Array:
        return _row_scalar(self.scale) * self.base.diag(X)


Kernel.bind(Sum, Product, Scale)
