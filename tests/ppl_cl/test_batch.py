"""Batch validation: clear messages naming argument, expected and received shape."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ppl_cl import Batch, Task


def test_shapes_and_backends_kept():
    b = Batch(np.zeros((4, 3)), np.arange(4), task_id=2)
    assert len(b) == 4 and b.input_dim == 3 and b.task_id == 2
    assert Task is Batch
    t = Batch(torch.zeros(4, 3), torch.arange(4))
    assert isinstance(t.x, torch.Tensor)
    j = Batch(jnp.zeros((4, 3)), jnp.arange(4))
    assert type(j.x).__module__.startswith("jax")
    assert Batch(np.arange(5.0)).x.shape == (5, 1)  # 1-D x is one feature


def test_structural_errors_name_argument_and_shapes():
    with pytest.raises(ValueError, match=r"y: expected shape \(3,\).*received \(4,\)"):
        Batch(np.zeros((3, 2)), np.zeros(4))
    with pytest.raises(ValueError, match=r"x: expected shape \(n, d\), received \(2, 3, 4\)"):
        Batch(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"y: expected shape \(3,\).*received \(3, 2\)"):
        Batch(np.zeros((3, 2)), np.zeros((3, 2)))
    with pytest.raises(TypeError, match="task_id"):
        Batch(np.zeros((3, 2)), task_id="a")


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
def test_validate(lib):
    conv = {"numpy": np.asarray, "torch": torch.as_tensor, "jax": jnp.asarray}[lib]
    x = np.zeros((3, 2))
    Batch(conv(x), conv(np.array([0, 1, 2]))).validate(input_dim=2, num_classes=3)
    with pytest.raises(ValueError, match=r"x: expected shape \(n, 5\).*received \(3, 2\)"):
        Batch(conv(x), conv(np.array([0, 1, 2]))).validate(input_dim=5)
    with pytest.raises(ValueError, match=r"y: expected labels in 0\.\.1, received labels in 0\.\.2"):
        Batch(conv(x), conv(np.array([0, 1, 2]))).validate(num_classes=2)
    bad = x.copy()
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match="x: expected finite values"):
        Batch(conv(bad), conv(np.array([0, 1, 2]))).validate()
    with pytest.raises(ValueError, match="y: expected finite targets"):
        Batch(conv(x), conv(np.array([0.0, np.inf, 1.0]))).validate(regression=True)
    with pytest.raises(TypeError, match="y: expected integer class labels"):
        Batch(conv(x), conv(np.array([0.0, 1.0, 1.0]))).validate(num_classes=2)
    with pytest.raises(ValueError, match="x: expected at least one row"):
        Batch(conv(np.zeros((0, 2))), conv(np.zeros(0, dtype=np.int64))).validate()
    with pytest.raises(ValueError, match=r"y: expected targets of shape \(3,\), received None"):
        Batch(conv(x)).validate()
    Batch(conv(x)).validate(require_targets=False)


def test_conversions():
    b = Batch(np.ones((2, 2), np.float32), np.array([1, 0]))
    x, y = b.torch(dtype=torch.float64)
    assert x.dtype == torch.float64 and y.dtype == torch.int64
    xj, yj = b.jax()
    assert xj.shape == (2, 2) and yj.shape == (2,)
    assert isinstance(Batch(torch.ones(2, 2)).numpy().x, np.ndarray)
