"""The algebra of kernels shared by both backends (:mod:`models.kernels_torch`,
:mod:`models.kernels_jax`): ``k1 + k2`` is a ``Sum``, ``k1 * k2`` a ``Product`` and
``c * k`` a ``Scale`` of the kernel's own backend (each backend binds its three classes)."""

from __future__ import annotations

from typing import Any

__all__ = ["KernelAlgebra"]


class KernelAlgebra:
    """Base of every kernel: ``k(X1, X2=None)`` gives the Gram matrix (``X2=None`` means
    ``X1``), ``k.diag(X)`` its diagonal; ``+`` and ``*`` build sums, products and scalings."""

    _sum: Any = None
    _product: Any = None
    _scale: Any = None

    @classmethod
    def bind(cls, sum_cls: type, product_cls: type, scale_cls: type) -> None:
        """Set the backend's ``Sum``, ``Product`` and ``Scale`` classes."""
        cls._sum, cls._product, cls._scale = sum_cls, product_cls, scale_cls

    def __call__(self, X1: Any, X2: Any = None) -> Any:
        raise NotImplementedError

    def diag(self, X: Any) -> Any:
        """``k(x_i, x_i)`` as ``(..., n)`` without forming the Gram matrix."""
        raise NotImplementedError

    def __add__(self, other: "KernelAlgebra") -> "KernelAlgebra":
        return self._sum(self, other)

    def __mul__(self, other: Any) -> "KernelAlgebra":
        return self._product(self, other) if isinstance(other, KernelAlgebra) else \
            self._scale(self, other)

    __rmul__ = __mul__
