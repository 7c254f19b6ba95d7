"""GPU checks (marker `gpu`: skipped on machines without CUDA)."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_torch_kernels_and_cholesky_on_cuda_match_cpu():
    import torch

    from models.kernels_torch import SquaredExponential
    from models.linalg_torch import jitter_cholesky

    X = torch.randn(200, 5, dtype=torch.float64)
    k = SquaredExponential(torch.tensor(1.3, dtype=torch.float64), torch.full((5,), 0.8, dtype=torch.float64))
    K_cpu = k(X) + 1e-3 * torch.eye(200, dtype=torch.float64)
    kc = SquaredExponential(k.variance.cuda(), k.lengthscale.cuda())
    K_gpu = kc(X.cuda()) + 1e-3 * torch.eye(200, dtype=torch.float64, device="cuda")
    assert K_gpu.device.type == "cuda"
    np.testing.assert_allclose(K_gpu.cpu().numpy(), K_cpu.numpy(), rtol=1e-10)
    L = jitter_cholesky(K_gpu)
    assert L.device.type == "cuda"
    np.testing.assert_allclose(L.cpu().numpy(), jitter_cholesky(K_cpu).numpy(), rtol=1e-8, atol=1e-10)


def test_exact_gp_on_jax_gpu_matches_cpu():
    import jax

    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX sees no GPU (CPU-only jaxlib)")
    from ppl_cl import Batch
    from ppl_cl.learners.exact_gp import ExactGP

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, size=(300, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=300)
    preds = []
    for device in (jax.devices("cpu")[0], gpu):
        with jax.default_device(device):
            gp = ExactGP(kernel="se", optimize=False)
            gp.update(Batch(X, y))
            preds.append(gp.predict(X[:20]).mean)
    np.testing.assert_allclose(preds[1], preds[0], rtol=1e-8)
