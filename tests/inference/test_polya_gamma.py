"""The torch Polya-Gamma sampler against the ``polyagamma`` package and the closed forms."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from inference.polya_gamma import (polyagamma_mean, polyagamma_variance, random_polyagamma,
                                   random_polyagamma_reference)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Z_VALUES = (0.0, 0.1, 1.0, 5.0, 20.0, 50.0)
B_VALUES = (1, 2, 5)
N = 4000


def _series_mean_var(b: float, z: float, terms: int = 200000) -> tuple[float, float]:
    """Mean and variance from the definition omega = sum g_k / (2 pi^2 d_k), g_k ~ Gamma(b, 1),
    d_k = (k - 1/2)^2 + z^2 / (4 pi^2) (PSW eq. 1): independent of the closed forms."""
    k = np.arange(1, terms + 1, dtype=np.float64)
    d = (k - 0.5) ** 2 + z ** 2 / (4 * math.pi ** 2)
    # the mean's tail beyond k = terms, sum_{k > K} 1 / (k - 1/2)^2 ~ 1 / K, added in closed form
    mean_tail = b / (2 * math.pi ** 2 * terms)
    return float(b * np.sum(1.0 / (2 * math.pi ** 2 * d))) + mean_tail, \
        float(b * np.sum(1.0 / (2 * math.pi ** 2 * d) ** 2))


@pytest.mark.parametrize("z", [0.0, 1e-3, 0.05, 1.0, 7.5, 50.0])
def test_closed_form_moments_match_the_series_definition(z):
    m, v = _series_mean_var(3.0, z)
    zt = torch.tensor(z, dtype=torch.float64)
    assert float(polyagamma_mean(3, zt)) == pytest.approx(m, rel=1e-5)
    assert float(polyagamma_variance(3, zt)) == pytest.approx(v, rel=1e-5)


def test_two_sample_ks_against_polyagamma_package():
    """Bonferroni over the 18 (b, z) cells: every p-value above 1e-3 / 18."""
    g = torch.Generator().manual_seed(123)
    pvalues = {}
    for b in B_VALUES:
        for z in Z_VALUES:
            zt = torch.full((N,), z, dtype=torch.float64)
            ours = random_polyagamma(b, zt, g).numpy()
            ref = random_polyagamma_reference(b, zt, seed=int(1000 * z) + b).numpy()
            pvalues[(b, z)] = stats.ks_2samp(ours, ref).pvalue
    worst = min(pvalues, key=pvalues.get)
    assert pvalues[worst] > 1e-3 / len(pvalues), (worst, pvalues[worst])


def test_ks_detects_a_wrong_tilt():
    """Power check of the test above: PG(1, z) against PG(1, 1.15 z) is rejected."""
    g = torch.Generator().manual_seed(5)
    ours = random_polyagamma(1, torch.full((N,), 4.0, dtype=torch.float64), g).numpy()
    ref = random_polyagamma_reference(1, torch.full((N,), 4.6, dtype=torch.float64), 0).numpy()
    assert stats.ks_2samp(ours, ref).pvalue < 1e-6


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_moments_within_monte_carlo_error(dtype):
    """Sample mean within 4 standard errors of tanh(z/2)/(2z) b, sample variance within 4
    standard errors (from the sample's 4th central moment) of the closed-form variance."""
    g = torch.Generator().manual_seed(7)
    n = 40000
    for b in B_VALUES:
        for z in Z_VALUES:
            x = random_polyagamma(b, torch.full((n,), z, dtype=dtype), g).double()
            assert x.dtype == torch.float64
            m = float(polyagamma_mean(b, torch.tensor(z, dtype=torch.float64)))
            v = float(polyagamma_variance(b, torch.tensor(z, dtype=torch.float64)))
            assert abs(float(x.mean()) - m) < 4 * math.sqrt(v / n), (b, z)
            m4 = float(((x - x.mean()) ** 4).mean())
            se_var = math.sqrt(max(m4 - float(x.var()) ** 2, 0.0) / n)
            assert abs(float(x.var()) - v) < 4 * se_var, (b, z)


def test_shapes_dtype_broadcast_and_tensor_b():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 4, 5, dtype=torch.float32)
    x = random_polyagamma(1, z, g)
    assert x.shape == z.shape and x.dtype == torch.float32 and bool((x > 0).all())
    b = torch.tensor([1, 2, 3])
    xb = random_polyagamma(b, torch.zeros(20000, 1, dtype=torch.float64), g)
    assert xb.shape == (20000, 3)
    # E[PG(b, 0)] = b / 4 with sd sqrt(b / 24 / n)
    np.testing.assert_allclose(xb.mean(0).numpy(), [0.25, 0.5, 0.75],
                               atol=4 * math.sqrt(3 / 24 / 20000))
    assert random_polyagamma(2, torch.tensor(1.5, dtype=torch.float64), g).shape == ()


def test_same_generator_state_same_draws():
    z = torch.linspace(-20, 20, 1000, dtype=torch.float64)
    a = random_polyagamma(2, z, torch.Generator().manual_seed(11))
    b = random_polyagamma(2, z, torch.Generator().manual_seed(11))
    c = random_polyagamma(2, z, torch.Generator().manual_seed(12))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_no_host_copy_of_elements(monkeypatch):
    """The sampler never converts its arrays to NumPy or moves them to the CPU."""
    def forbid(*args, **kwargs):
        raise AssertionError("host copy inside random_polyagamma")

    monkeypatch.setattr(torch.Tensor, "numpy", forbid)
    monkeypatch.setattr(torch.Tensor, "cpu", forbid)
    monkeypatch.setattr(torch.Tensor, "tolist", forbid)
    x = random_polyagamma(torch.tensor([1, 3]), torch.randn(100, 2, dtype=torch.float64),
                          torch.Generator().manual_seed(0))
    assert x.shape == (100, 2)


@pytest.mark.parametrize("b", [0, -1, 1.5, float("nan"), torch.tensor([1, 0]),
                               torch.tensor([1.0, 2.5])])
def test_bad_shape_parameter_raises(b):
    with pytest.raises(ValueError, match="b: expected"):
        random_polyagamma(b, torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_tilt_raises(bad):
    with pytest.raises(ValueError, match="z: expected finite"):
        random_polyagamma(1, torch.tensor([0.0, bad], dtype=torch.float64))


def test_reference_path_keeps_device_and_dtype():
    z = torch.randn(50, dtype=torch.float32)
    x = random_polyagamma_reference(1, z, seed=0)
    assert x.dtype == torch.float32 and x.shape == (50,)
    assert torch.equal(x, random_polyagamma_reference(1, z, seed=0))


@pytest.mark.gpu
def test_sampler_on_cuda_stays_on_device_and_matches_moments():
    z = torch.full((200000,), 3.0, dtype=torch.float32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = random_polyagamma(1, z, g)
    assert x.device.type == "cuda" and x.dtype == torch.float32
    m = float(polyagamma_mean(1, torch.tensor(3.0, dtype=torch.float64)))
    v = float(polyagamma_variance(1, torch.tensor(3.0, dtype=torch.float64)))
    assert abs(float(x.double().mean()) - m) < 4 * math.sqrt(v / z.numel())
