"""The data record every learner consumes: :class:`Batch` (alias :class:`Task`).

A batch carries inputs ``x`` of shape ``(n, d)``, optional targets ``y`` of shape ``(n,)``
(regression values or integer class labels) and an optional ``task_id``. It accepts NumPy
arrays, torch tensors (any device) and JAX arrays, and keeps them as given so that a GPU tensor
is never copied to the host just to be checked: the checks run in the array's own library.

``Batch.validate`` is the single place where input errors are raised. Its messages name the
argument, the expected and the received shape, so that a user knows what to fix::

    >>> Batch(np.zeros((3, 2)), np.zeros(4))
    ValueError: y: expected shape (3,) (one target per row of x), received (4,)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["Batch", "Task", "as_numpy", "array_backend"]


def array_backend(a: Any) -> str:
    """Return ``"torch"``, ``"jax"`` or ``"numpy"`` for an array-like (lists count as numpy)."""
    mod = type(a).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("jax") or mod.startswith("jaxlib"):
        return "jax"
    return "numpy"


def as_numpy(a: Any) -> np.ndarray:
    """A NumPy view/copy of ``a`` (torch tensors are detached and moved to the host)."""
    if array_backend(a) == "torch":
        return a.detach().cpu().numpy()
    return np.asarray(a)


def _all_finite(a: Any) -> bool:
    kind = array_backend(a)
    if kind == "torch":
        import torch

        return bool(torch.isfinite(a).all())
    if kind == "jax":
        import jax.numpy as jnp

        return bool(jnp.isfinite(a).all())
    return bool(np.isfinite(a).all())


def _is_floating(a: Any) -> bool:
    kind = array_backend(a)
    if kind == "torch":
        return a.is_floating_point()
    return np.issubdtype(np.dtype(a.dtype), np.floating)


def _is_integer(a: Any) -> bool:
    kind = array_backend(a)
    if kind == "torch":
        import torch

        return not a.is_floating_point() and not a.is_complex() and a.dtype != torch.bool
    return np.issubdtype(np.dtype(a.dtype), np.integer)


def _min_max(a: Any) -> tuple[float, float]:
    return float(a.min()), float(a.max())


def _to_array(a: Any, name: str) -> Any:
    if array_backend(a) in ("torch", "jax"):
        return a
    try:
        arr = np.asarray(a)
    except Exception as exc:  # pragma: no cover - odd inputs
        raise TypeError(f"{name}: expected an array, received {type(a).__name__}") from exc
    if arr.dtype == object:
        raise TypeError(f"{name}: expected a numeric array, received an object array")
    return arr


@dataclasses.dataclass(frozen=True)
class Batch:
    """One task / session / batch / chunk of a stream.

    Args:
        x: inputs, shape ``(n, d)``; a 1-D array of length n is read as ``(n, 1)``.
        y: targets, shape ``(n,)``: real values (regression) or integer labels
            (classification); ``None`` for prediction-only batches.
        task_id: optional task identity (an int) for task-aware learners.
    """

    x: Any
    y: Any = None
    task_id: int | None = None

    def __post_init__(self) -> None:
        x = _to_array(self.x, "x")
        if len(x.shape) == 1:
            x = x.reshape(-1, 1)
        object.__setattr__(self, "x", x)
        if self.y is not None:
            object.__setattr__(self, "y", _to_array(self.y, "y"))
        if self.task_id is not None and not isinstance(self.task_id, (int, np.integer)):
            raise TypeError(f"task_id: expected an int or None, received {type(self.task_id).__name__}")
        self._check_structure()

    # -- structural checks, always run ---------------------------------------------------
    def _check_structure(self) -> None:
        x, y = self.x, self.y
        if len(x.shape) != 2:
            raise ValueError(f"x: expected shape (n, d), received {tuple(x.shape)}")
        if not _is_floating(x) and not _is_integer(x):
            raise TypeError(f"x: expected a real-valued array, received dtype {x.dtype}")
        if y is not None:
            if len(y.shape) != 1 or y.shape[0] != x.shape[0]:
                raise ValueError(
                    f"y: expected shape ({x.shape[0]},) (one target per row of x), "
                    f"received {tuple(y.shape)}"
                )

    # -- semantic checks, run by learners -------------------------------------------------
    def validate(
        self,
        *,
        input_dim: int | None = None,
        num_classes: int | None = None,
        regression: bool = False,
        require_targets: bool = True,
        allow_empty: bool = False,
    ) -> "Batch":
        """Check the batch against what a learner expects; returns ``self`` for chaining.

        Args:
            input_dim: expected ``d`` (feature dimension) or ``None`` to accept any.
            num_classes: for classification, labels must be integers in ``0..num_classes-1``.
            regression: targets must be finite reals.
            require_targets: raise if ``y`` is missing.
            allow_empty: accept ``n == 0``.

        Raises:
            ValueError / TypeError naming the argument, what was expected and what was received.
        """
        x, y = self.x, self.y
        n, d = x.shape
        if n == 0 and not allow_empty:
            raise ValueError("x: expected at least one row, received an empty batch of shape "
                             f"{tuple(x.shape)}")
        if input_dim is not None and d != input_dim:
            raise ValueError(
                f"x: expected shape (n, {input_dim}) (feature dimension fixed by earlier data), "
                f"received {tuple(x.shape)}"
            )
        if n and not _all_finite(x):
            raise ValueError(f"x: expected finite values, received NaN or inf in array of shape "
                             f"{tuple(x.shape)}")
        if y is None:
            if require_targets:
                raise ValueError(f"y: expected targets of shape ({n},), received None")
            return self
        if num_classes is not None:
            if not _is_integer(y):
                raise TypeError(f"y: expected integer class labels in 0..{num_classes - 1}, "
                                f"received dtype {y.dtype}")
            if n:
                lo, hi = _min_max(y)
                if lo < 0 or hi >= num_classes:
                    raise ValueError(
                        f"y: expected labels in 0..{num_classes - 1}, received labels in "
                        f"{int(lo)}..{int(hi)}"
                    )
        if regression:
            if not (_is_floating(y) or _is_integer(y)):
                raise TypeError(f"y: expected real targets, received dtype {y.dtype}")
            if n and not _all_finite(y):
                raise ValueError(f"y: expected finite targets, received NaN or inf in array of "
                                 f"shape {tuple(y.shape)}")
        return self

    # -- conveniences -----------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.x.shape[0])

    @property
    def input_dim(self) -> int:
        return int(self.x.shape[1])

    def numpy(self) -> "Batch":
        """The same batch with NumPy arrays."""
        return Batch(as_numpy(self.x), None if self.y is None else as_numpy(self.y), self.task_id)

    def torch(self, device: Any = None, dtype: Any = None) -> tuple[Any, Any]:
        """``(x, y)`` as torch tensors on ``device``; x cast to ``dtype`` (labels keep int64)."""
        import torch

        def conv(a: Any, is_x: bool) -> Any:
            if a is None:
                return None
            t = a if array_backend(a) == "torch" else torch.as_tensor(as_numpy(a))
            if is_x or t.is_floating_point():
                t = t.to(dtype=dtype or torch.get_default_dtype())
            else:
                t = t.to(torch.int64)
            return t.to(device) if device is not None else t

        return conv(self.x, True), conv(self.y, False)

    def jax(self, dtype: Any = None) -> tuple[Any, Any]:
        """``(x, y)`` as JAX arrays on the default device."""
        import jax.numpy as jnp

        x = jnp.asarray(as_numpy(self.x), dtype=dtype)
        if self.y is None:
            return x, None
        y_np = as_numpy(self.y)
        y = jnp.asarray(y_np, dtype=dtype if np.issubdtype(y_np.dtype, np.floating) else None)
        return x, y


Task = Batch
"""A whole task is a batch with a ``task_id``; the alias reads better in continual loops."""
