"""Covariance functions for PyTorch models (VAR-GP, GP-Tree).

A kernel object *holds* its hyperparameters as tensors and computes Gram matrices; it owns no
``nn.Parameter``. A Pyro model samples or looks up the hyperparameters and builds the kernel
inside the model, so the same kernel serves a hyperprior (VAR-GP's q(theta)), a point estimate
(GP-Tree's SGD) or fixed values.

Shapes (batch dimensions ``...`` broadcast, e.g. one GP per class or per theta sample):

* inputs ``X1: (..., n, d)``, ``X2: (..., m, d)``  ->  ``K: (..., n, m)``, ``diag: (..., n)``;
* ``variance``: ``(...)`` (a scalar per kernel in the batch);
* ``lengthscale``: ``(..., d)`` for ARD or ``(..., 1)`` / scalar for an isotropic kernel — the
  last axis is always the feature axis.

Kernels combine with ``k1 + k2`` (:class:`Sum`), ``k1 * k2`` (:class:`Product`) and
``c * k`` (:class:`Scale`). The JAX twin is :mod:`models.kernels_jax`, with the same classes.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from models.kernel_algebra import KernelAlgebra

__all__ = ["Kernel", "SquaredExponential", "Matern52", "Linear", "Cosine", "Constant",
           "Normalized", "Sum", "Product", "Scale", "squared_distance", "cat_rows"]

_SQRT5 = math.sqrt(5.0)

def _negligible_r2(log_profile) -> dict:
    """Per dtype, the ``r^2`` beyond which a decreasing stationary profile ``g(r^2)`` falls below
    ``sqrt(tiny)`` of the dtype (``log_profile(r2) = log g(r2)``, solved by bisection in float64).

    Entries past it are set to exactly 0 (value and gradient): ``sqrt(tiny)`` (1.1e-19 in
    float32, 1.5e-154 in float64) is many orders of magnitude below the rounding error of any sum
    with an O(variance) term and far below the jitter added to every K_ZZ. Without the cut, a
    short lengthscale (VAR-GP's point-estimated hyperparameters on MNIST reached l = 0.01 on one
    edge pixel) fills the Gram matrices and the products built from them with subnormal floats,
    which x86 CPUs process many times slower than normal ones; ``torch.set_flush_denormal`` acts
    on the calling thread only (measured: half of a 2-thread product stayed subnormal), so a
    library cannot rely on it. Effect on VAR-GP's ELBO step:
    ``benchmarks/vargp_short_lengthscales.py``. float16 is left alone (its ``sqrt(tiny)`` is
    8e-3, not negligible). The JAX twin (:mod:`models.kernels_jax`) needs no cut: XLA on CPU
    flushes subnormal results to zero (measured: ``jnp.exp(-90.0)`` in float32 is 0, NumPy's is
    8.2e-40)."""
    cuts = {}
    for dt in (torch.float32, torch.float64, torch.bfloat16):
        target = 0.5 * math.log(torch.finfo(dt).tiny)
        lo, hi = 0.0, 1.0
        while log_profile(hi) > target:
            hi *= 2.0
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if log_profile(mid) > target else (lo, mid)
        cuts[dt] = hi
    return cuts


def _as_tensor(v, like: Tensor | None = None) -> Tensor:
    if isinstance(v, Tensor):
        return v
    if like is not None:
        return torch.as_tensor(v, dtype=like.dtype, device=like.device)
    return torch.as_tensor(v, dtype=torch.get_default_dtype())


def _per_kernel(v: Tensor) -> Tensor:
    """A per-kernel scalar ``(...)`` made to broadcast against a Gram matrix ``(..., n, m)``."""
    return v if v.dim() == 0 else v[..., None, None]


def _per_row(v: Tensor) -> Tensor:
    """A per-kernel scalar ``(...)`` made to broadcast against a diagonal ``(..., n)``."""
    return v if v.dim() == 0 else v[..., None]


def _ones_rows(X: Tensor) -> Tensor:
    return torch.ones(X.shape[:-1], dtype=X.dtype, device=X.device)


def _per_feature(ls: Tensor) -> Tensor:
    """A per-feature vector ``(..., d)`` made to broadcast against inputs ``(..., n, d)``."""
    return ls if ls.dim() == 0 else ls.unsqueeze(-2)


def squared_distance(X1: Tensor, X2: Tensor) -> Tensor:
    """``||x1_i - x2_j||^2`` as ``(..., n, m)``, via ``|x|^2 + |y|^2 - 2 x.y`` clamped at 0."""
    n1 = (X1 * X1).sum(-1)[..., :, None]
    n2 = (X2 * X2).sum(-1)[..., None, :]
    return (n1 + n2 - 2.0 * X1 @ X2.transpose(-1, -2)).clamp_min(0.0)


class _SymmetricGram(torch.autograd.Function):
    """``G = Z Z^T`` with the backward ``(g + g^T) Z``: one batched product where autograd,
    seeing ``Z`` twice, would make two."""

    @staticmethod
    def forward(ctx, Z: Tensor) -> Tensor:
        ctx.save_for_backward(Z)
        return Z @ Z.transpose(-1, -2)

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        (Z,) = ctx.saved_tensors
        return (g + g.transpose(-1, -2)) @ Z


def _gram_sq_dist(Z: Tensor) -> Tensor:
    """``||z_i - z_j||^2`` of one set ``(..., n, d)``, from its Gram matrix ``G = Z Z^T``:
    ``G_ii + G_jj - 2 G_ij``, exactly 0 on the diagonal, clamped at 0 elsewhere."""
    G = _SymmetricGram.apply(Z) if torch.is_grad_enabled() and Z.requires_grad else \
        Z @ Z.transpose(-1, -2)
    g = G.diagonal(dim1=-2, dim2=-1)
    return (g[..., :, None] + g[..., None, :] - 2.0 * G).clamp_min(0.0)


def _weighted_sq_norm(X: Tensor, w: Tensor) -> Tensor:
    """``sum_d w_d x_d^2`` as ``(..., n)`` for ``X (..., n, d)`` and weights ``w (..., d)``;
    a 2-D ``X`` meets the weights' batch in one matrix product, never copied per batch."""
    if X.dim() == 2:
        return w @ (X * X).transpose(-1, -2)
    return (X * X * w.unsqueeze(-2)).sum(-1)


def cat_rows(blocks: Sequence[Tensor]) -> Tensor:
    """Row blocks ``(..., n_b, k)`` stacked along the rows, batch dimensions broadcast
    (a single block is returned as it is, not copied)."""
    if len(blocks) == 1:
        return blocks[0]
    lead = torch.broadcast_shapes(*(b.shape[:-2] for b in blocks))
    return torch.cat([b.expand(*lead, *b.shape[-2:]) for b in blocks], dim=-2)


def _isotropic_scale(ls: Tensor) -> Tensor | None:
    """The one lengthscale ``(...)`` of an isotropic kernel (``ls`` scalar or ``(..., 1)``),
    or ``None`` for ARD lengthscales ``(..., d > 1)``."""
    if ls.dim() == 0:
        return ls
    return ls[..., 0] if ls.shape[-1] == 1 else None


def _weighted_sq_dist(X1: Tensor | Sequence[Tensor], X2: Tensor, w: Tensor) -> Tensor:
    """``sum_d w_d (x1_id - x2_jd)^2`` as ``(..., n, m)`` (the ARD distance with
    ``w = l^-2``) by ``|x1|_w^2 + |x2|_w^2 - 2 x1 diag(w) x2^T``, clamped at 0.

    Only the smaller of the two sets is multiplied by ``w`` (one copy per batch of weights,
    e.g. per theta draw); the larger one enters through matrix products, so that many
    inducing inputs against a minibatch cost no per-draw copy of the inducing inputs.
    ``X1`` may be a sequence of row blocks (the rows of the result, in order): each block
    meets ``X2`` in a product of its own, so a block that needs no gradient costs none."""
    blocks = [X1] if isinstance(X1, Tensor) else list(X1)
    if len(blocks) == 1 and blocks[0].shape[-2] < X2.shape[-2]:
        return _weighted_sq_dist(X2, blocks[0], w).transpose(-1, -2)
    Xw2 = X2 * w.unsqueeze(-2)                                   # (..., m, d), the small set
    n2 = (Xw2 * X2).sum(-1)[..., None, :]
    parts = []
    for B in blocks:
        cross = (Xw2 @ B.transpose(-1, -2)).transpose(-1, -2)    # (..., n_b, m)
        parts.append(_weighted_sq_norm(B, w)[..., :, None] - 2.0 * cross)
    return (cat_rows(parts) + n2).clamp_min(0.0)


class Kernel(KernelAlgebra):
    """Base class: ``k(X1, X2=None)`` gives the Gram matrix (``X2=None`` means ``X1``)."""


class _Stationary(Kernel):
    """``k(x, y) = variance * g(||x - y|| / lengthscale)``."""

    def __init__(self, variance, lengthscale):
        self.variance = _as_tensor(variance)
        self.lengthscale = _as_tensor(lengthscale, self.variance)

    def _scaled_sq_dist(self, X1: Tensor, X2: Tensor | None) -> Tensor:
        ls = self.lengthscale
        scale = _isotropic_scale(ls)
        if scale is not None:
            # isotropic: the unscaled distances do not depend on l; scale the (n, m) result
            r2 = _gram_sq_dist(X1) if X2 is None else squared_distance(X1, X2)
            return r2 / _per_kernel(scale * scale)
        if X2 is None:
            return _gram_sq_dist(X1 * _per_feature(ls.reciprocal()))
        return _weighted_sq_dist(X1, X2, ls.pow(-2))

    def _profile(self, r2: Tensor) -> Tensor:
        raise NotImplementedError

    def __call__(self, X1: Tensor, X2: Tensor | None = None) -> Tensor:
        return _per_kernel(self.variance) * self._profile(self._scaled_sq_dist(X1, X2))

    def stacked(self, blocks: Sequence[Tensor], X2: Tensor) -> Tensor:
        """``k(cat(blocks, -2), X2)``, each row block ``(..., n_b, d)`` against ``X2`` on its
        own: with ARD lengthscales a block that needs no gradient (a frozen earlier task's
        inducing inputs) then takes no part in the backward product for the inputs."""
        ls = self.lengthscale
        if _isotropic_scale(ls) is not None:
            return self(cat_rows(blocks), X2)
        r2 = _weighted_sq_dist(blocks, X2, ls.pow(-2))
        return _per_kernel(self.variance) * self._profile(r2)

    def diag(self, X: Tensor) -> Tensor:
        return _per_row(self.variance) * _ones_rows(X)


class SquaredExponential(_Stationary):
    """ARD exponentiated quadratic ``k(x, y) = s^2 exp(-1/2 sum_i (x_i - y_i)^2 / l_i^2)``
    (VAR-GP paper, Sect. 2; GP-Tree uses it on L2-normalized features).

    Entries with ``exp(-r^2 / 2) < sqrt(tiny)`` of the dtype (``r^2 > -log(tiny)``: 87.3 in
    float32, 708 in float64) are exactly 0, value and gradient (see ``_negligible_r2``), so that
    short lengthscales produce no subnormal floats."""

    _NEGLIGIBLE_R2 = _negligible_r2(lambda r2: -0.5 * r2)

    def _profile(self, r2: Tensor) -> Tensor:
        cut = self._NEGLIGIBLE_R2.get(r2.dtype)
        if cut is not None:
            r2 = r2.masked_fill(r2 > cut, math.inf)     # exp(-inf) = 0, and its gradient is 0
        return torch.exp(-0.5 * r2)


class Matern52(_Stationary):
    """Matern 5/2: ``s^2 (1 + sqrt5 r + 5/3 r^2) exp(-sqrt5 r)``, ``r`` the scaled distance
    (VIPS magnetic-field kernel).

    Entries whose profile is below ``sqrt(tiny)`` of the dtype (``r^2 > 509`` in float32,
    ``r^2 > 2.66e4`` in float64) are exactly 0, value and gradient (see ``_negligible_r2``)."""

    _NEGLIGIBLE_R2 = _negligible_r2(
        lambda r2: math.log1p(_SQRT5 * math.sqrt(r2) + (5.0 / 3.0) * r2) - _SQRT5 * math.sqrt(r2))

    def _profile(self, r2: Tensor) -> Tensor:
        cut = self._NEGLIGIBLE_R2.get(r2.dtype)
        far = None if cut is None else r2 > cut
        if far is not None:
            # an infinite r2 would give inf * 0 = NaN here: compute the far entries at r2 = 0
            # instead and zero them afterwards, so their value and gradient are exactly 0
            r2 = r2.masked_fill(far, 0.0)
        r = r2.clamp_min(1e-36).sqrt()  # clamp keeps the gradient finite at r = 0
        out = (1.0 + _SQRT5 * r + (5.0 / 3.0) * r2) * torch.exp(-_SQRT5 * r)
        return out if far is None else out.masked_fill(far, 0.0)


class Linear(Kernel):
    """Dot product ``k(x, y) = variance * x.y``."""

    def __init__(self, variance):
        self.variance = _as_tensor(variance)

    def __call__(self, X1: Tensor, X2: Tensor | None = None) -> Tensor:
        X2 = X1 if X2 is None else X2
        return _per_kernel(self.variance) * (X1 @ X2.transpose(-1, -2))

    def diag(self, X: Tensor) -> Tensor:
        return _per_row(self.variance) * (X * X).sum(-1)


def _unit(X: Tensor) -> Tensor:
    return X / X.norm(dim=-1, keepdim=True).clamp_min(1e-12)


class Cosine(Kernel):
    """Cosine similarity ``k(x, y) = variance * x.y / (|x| |y|)`` (a normalized linear kernel)."""

    def __init__(self, variance):
        self.variance = _as_tensor(variance)

    def __call__(self, X1: Tensor, X2: Tensor | None = None) -> Tensor:
        U1 = _unit(X1)
        U2 = U1 if X2 is None else _unit(X2)
        return _per_kernel(self.variance) * (U1 @ U2.transpose(-1, -2))

    def diag(self, X: Tensor) -> Tensor:
        return _per_row(self.variance) * _ones_rows(X)


class Constant(Kernel):
    """``k(x, y) = value`` (a constant offset; VIPS magnetic kernel uses constant(500))."""

    def __init__(self, value):
        self.value = _as_tensor(value)

    def __call__(self, X1: Tensor, X2: Tensor | None = None) -> Tensor:
        m = X1.shape[-2] if X2 is None else X2.shape[-2]
        shape = torch.broadcast_shapes(X1.shape[:-2], (X1 if X2 is None else X2).shape[:-2])
        ones = torch.ones(*shape, X1.shape[-2], m, dtype=X1.dtype, device=X1.device)
        return _per_kernel(self.value) * ones

    def diag(self, X: Tensor) -> Tensor:
        return _per_row(self.value) * _ones_rows(X)


class Normalized(Kernel):
    """``base`` applied to L2-normalized inputs ``x / |x|`` (GP-Tree: RBF on unit features)."""

    def __init__(self, base: Kernel):
        self.base = base

    def __call__(self, X1: Tensor, X2: Tensor | None = None) -> Tensor:
        return self.base(_unit(X1), None if X2 is None else _unit(X2))

    def diag(self, X: Tensor) -> Tensor:
        return self.base.diag(_unit(X))


class Sum(Kernel):
    def __init__(self, k1: Kernel, k2: Kernel):
        self.k1, self.k2 = k1, k2

    def __call__(self, X1: Tensor, X2: Tensor | None = None) -> Tensor:
        return self.k1(X1, X2) + self.k2(X1, X2)

    def diag(self, X: Tensor) -> Tensor:
        return self.k1.diag(X) + self.k2.diag(X)


class Product(Kernel):
    def __init__(self, k1: Kernel, k2: Kernel):
        self.k1, self.k2 = k1, k2

    def __call__(self, X1: Tensor, X2: Tensor | None = None) -> Tensor:
        return self.k1(X1, X2) * self.k2(X1, X2)

    def diag(self, X: Tensor) -> Tensor:
        return self.k1.diag(X) * self.k2.diag(X)


class Scale(Kernel):
    """``scale * base`` with a positive scale (a per-kernel scalar ``(...)``)."""

    def __init__(self, base: Kernel, scale):
        self.base, self.scale = base, _as_tensor(scale)

    def __call__(self, X1: Tensor, X2: Tensor | None = None) -> Tensor:
        return _per_kernel(self.scale) * self.base(X1, X2)

    def diag(self, X: Tensor) -> Tensor:
        return _per_row(self.scale) * self.base.diag(X)


Kernel.bind(Sum, Product, Scale)
