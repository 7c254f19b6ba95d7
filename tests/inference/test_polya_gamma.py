"""The torch Polya-Gamma sampler against the ``polyagamma`` package and the closed forms."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from inference.polya_gamma import (TRUNCATION, _series_tail, polyagamma_mean, polyagamma_variance,
                                   random_polyagamma, random_polyagamma_reference)

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


@pytest.mark.parametrize("z", [0.0, 1e-3, 0.05, 1.0, 7.5, 50.0, 500.0, 1e3, 1e4])
def test_closed_form_moments_match_the_series_definition(z):
    m, v = _series_mean_var(3.0, z)
    zt = torch.tensor(z, dtype=torch.float64)
    assert float(polyagamma_mean(3, zt)) == pytest.approx(m, rel=1e-5)
    assert float(polyagamma_variance(3, zt)) == pytest.approx(v, rel=1e-5)


@pytest.mark.parametrize("dtype, rel", [(torch.float64, 1e-12), (torch.float32, 5e-6)])
def test_closed_form_moments_against_high_precision(dtype, rel):
    """The stable variance form b (2 tanh(z/2) - z sech^2(z/2)) / (4 z^3) and the mean against
    the printed forms evaluated with 50 digits (mpmath), from the Taylor region to |z| = 1e4,
    where sinh z overflows (the printed form gives NaN there in floating point)."""
    import mpmath as mp             # a dependency of sympy, which torch requires: always there

    mp.mp.dps = 50
    for z in (0.0, 1e-6, 1e-3, 0.05, 0.099, 0.101, 0.59, 0.61, 1.0, 10.0, 50.0, 100.0, 500.0,
              1e3, 1e4, -1e4):
        zm = mp.mpf(z)
        m = mp.mpf(1) / 4 if z == 0 else mp.tanh(zm / 2) / (2 * zm)
        v = mp.mpf(1) / 24 if z == 0 else (mp.sinh(zm) - zm) / (4 * zm ** 3 * mp.cosh(zm / 2) ** 2)
        zt = torch.tensor(z, dtype=dtype)
        assert float(polyagamma_mean(1, zt)) == pytest.approx(float(m), rel=rel), z
        assert float(polyagamma_variance(1, zt)) == pytest.approx(float(v), rel=rel), z
    assert bool(torch.isfinite(polyagamma_variance(2, torch.tensor([1e3, 1e4], dtype=dtype))).all())


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


# -- moments and branch masses: checks that return their failing cells (so that the power
# check below can run the same checks on a deliberately broken sampler) ------------------------
MOMENT_Z = (0.0, 1e-3, 1.0, 10.0, 50.0, 100.0, 500.0, 1e3, 1e4)
MOMENT_B = (1, 2, 5, 30)
MOMENT_N = 40000


def _moment_failures(draw, b: int, dtype, z_values=MOMENT_Z, n: int = MOMENT_N, seed: int = 7
                     ) -> list[tuple]:
    """Cells ``(b, z, what, deviation)`` where the sample mean of ``n`` draws is more than 4
    standard errors (sqrt(Var / n), closed form) from ``b tanh(z/2) / (2z)``, or the sample
    variance more than 4 standard errors (sqrt((m4 - s^4) / n), from the sample's 4th central
    moment) from the closed-form variance. ``draw(b, z_tensor, seed) -> draws``."""
    failures = []
    for z in z_values:
        x = draw(b, torch.full((n,), z, dtype=dtype), seed + int(z)).double()
        assert bool(torch.isfinite(x).all()) and bool((x > 0).all()), (b, z)
        m = float(polyagamma_mean(b, torch.tensor(z, dtype=torch.float64)))
        v = float(polyagamma_variance(b, torch.tensor(z, dtype=torch.float64)))
        dev_m = (float(x.mean()) - m) / math.sqrt(v / n)
        m4 = float(((x - x.mean()) ** 4).mean())
        dev_v = (float(x.var()) - v) / math.sqrt(max(m4 - float(x.var()) ** 2, 0.0) / n)
        failures += [(b, z, what, d) for what, d in (("mean", dev_m), ("variance", dev_v))
                     if not abs(d) < 4.0]
    return failures


def _ours(b, z, seed):
    return random_polyagamma(b, z, torch.Generator().manual_seed(seed))


def _reference(b, z, seed):
    return random_polyagamma_reference(b, z, seed=seed)


@pytest.mark.parametrize("b", MOMENT_B)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_moments_within_monte_carlo_error(dtype, b):
    """z from 0 to 1e4 (the float64 erfcx path of the branch odds from |z| ~ 85, float32's from
    ~25; the odds overflow from ~36 in float32, ~97 in float64)."""
    assert _moment_failures(_ours, b, dtype) == []


@pytest.mark.parametrize("b", MOMENT_B)
def test_reference_moments_within_monte_carlo_error(b):
    """The reference path is right at every z too (polyagamma's default method is not beyond
    |z| ~ 176, see ``REFERENCE_METHOD_SWITCH``)."""
    assert _moment_failures(_reference, b, torch.float64) == []


BRANCH_Z = (0.0, 1.0, 2.0, 3.0, 5.0)
BRANCH_N = 400000


def _branch_mass_failures(dtype, seed: int = 3) -> list[tuple]:
    """Cells ``(z, deviation)`` where the fraction of ``PG(1, z)`` draws below ``t / 4`` (the
    inverse-Gaussian piece of the proposal, ``J* <= t``) is more than 4 binomial standard
    errors ``sqrt(P (1 - P) / n)`` from ``P = polyagamma_cdf(t / 4)``. The fraction is what a
    wrong mixture weight ``q / p`` moves: by ``(s - 1) P (1 - P)`` to first order when the odds
    are scaled by ``s``, i.e. 11-17 standard errors for ``s = 0.95`` or ``1.05`` here."""
    from polyagamma import polyagamma_cdf

    g = torch.Generator().manual_seed(seed)
    failures = []
    for z in BRANCH_Z:
        x = random_polyagamma(1, torch.full((BRANCH_N,), z, dtype=dtype), g)
        frac = float((x <= TRUNCATION / 4).double().mean())
        P = float(polyagamma_cdf(TRUNCATION / 4, h=1, z=z))
        dev = (frac - P) / math.sqrt(P * (1 - P) / BRANCH_N)
        if not abs(dev) < 4.0:
            failures.append((z, dev))
    return failures


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_mass_of_the_inverse_gaussian_piece(dtype):
    assert _branch_mass_failures(dtype) == []


def test_polyagamma_cdf_is_the_integral_of_the_density():
    """The branch test's reference P: polyagamma's CDF against quadrature of the PG(1, z)
    density of :class:`models.gp_tree.PolyaGamma` (Devroye's series)."""
    from polyagamma import polyagamma_cdf
    from scipy import integrate

    from models.gp_tree import PolyaGamma

    for z in BRANCH_Z:
        d = PolyaGamma(torch.tensor(z, dtype=torch.float64))
        dens = lambda w, d=d: math.exp(float(d.log_prob(torch.tensor(w, dtype=torch.float64))))
        quad = integrate.quad(dens, 1e-12, TRUNCATION / 4, limit=200)[0]
        assert float(polyagamma_cdf(TRUNCATION / 4, h=1, z=z)) == pytest.approx(quad, abs=1e-10)


@pytest.mark.parametrize("scale", [0.95, 1.05])
def test_power_a_wrong_mixture_weight_fails_the_suite(monkeypatch, scale):
    """Power check: with the branch odds ``q / p`` scaled by 0.95 or 1.05 (the draws stay
    positive and plausible, and the two-sample KS test at n = 4000 above passes), the branch
    mass test fails in both dtypes and the b = 30 moments fail too."""
    import inference.polya_gamma as pg

    exact = pg._q_over_p
    monkeypatch.setattr(pg, "_q_over_p", lambda c, t: exact(c, t) * scale)
    for dtype in (torch.float64, torch.float32):
        failures = _branch_mass_failures(dtype)
        assert len(failures) >= 3, (dtype, failures)
        assert all(abs(d) > 8 for _, d in failures), failures
    assert _moment_failures(_ours, 30, torch.float64, z_values=(0.0, 1.0)) != []


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_truncated_inverse_gaussian_against_its_cdf(dtype):
    """The inverse-Gaussian piece of the proposal, ``IG(1/c, 1)`` truncated to ``(0, t]``, by
    one-sample KS against scipy's CDF ``F(x) / F(t)`` (the Levy law at c = 0), on both of its
    branches (``c < 1/t``: truncated Levy tilted by ``exp(-c^2 x / 2)``; ``c >= 1/t``: the
    Michael-Schucany-Haas transform), Bonferroni over the cells."""
    import inference.polya_gamma as pg

    g = torch.Generator().manual_seed(11)
    cells = (0.0, 0.3, 1.0, 1.5, 1.6, 3.0, 10.0)
    pvalues = {}
    for c in cells:
        x = pg._truncated_inverse_gaussian(torch.full((20000,), c, dtype=dtype), g).double().numpy()
        law = stats.levy() if c == 0 else stats.invgauss(1.0 / c)
        Ft = law.cdf(TRUNCATION)
        assert x.max() <= TRUNCATION and x.min() > 0
        pvalues[c] = stats.kstest(x, lambda v, law=law, Ft=Ft: law.cdf(v) / Ft).pvalue
    assert min(pvalues.values()) > 1e-3 / len(cells), pvalues


def test_series_tail_decides_like_the_full_alternating_series():
    """``_series_tail`` (terms n >= 3 of S_n = sum_k (-1)^k (2k+1) r^{k(k+1)}) against the limit
    of the series summed to 60 terms: for U in (S_1, S_2] (where the sampler calls it) it accepts
    exactly when U <= S_inf. U = S_inf (1 +- 10^-e), e in [2, 12], so that deciding takes from
    one to several more terms; r up to 0.6 (the sampler's r is below 0.05, where the term n = 3
    always decides: why the sampler's own draws never reach a fourth)."""
    g = torch.Generator().manual_seed(0)
    m = 20000
    r = torch.rand(m, dtype=torch.float64, generator=g) * 0.55 + 0.05
    k = torch.arange(60, dtype=torch.float64)
    S = ((-1.0) ** k * (2 * k + 1) * r[:, None] ** (k * (k + 1))).cumsum(-1)   # S_0, S_1, ...
    S_inf, S1, S2, S3 = S[:, -1], S[:, 1], S[:, 2], S[:, 3]
    sign = torch.where(torch.rand(m, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    e = 2.0 + 10.0 * torch.rand(m, dtype=torch.float64, generator=g)
    U = S_inf * (1.0 + sign * 10.0 ** (-e))
    keep = (U > S1) & (U <= S2)
    U, r, S2, S3, S_inf = U[keep], r[keep], S2[keep], S3[keep], S_inf[keep]
    accepted = _series_tail(U, r, S2)
    assert torch.equal(accepted, U <= S_inf)
    assert int(accepted.sum()) > 1000 and int((~accepted).sum()) > 1000
    deep = U > S3                                               # undecided by the term n = 3
    assert int(deep.sum()) > 1000
    # undecided after max_terms: rejected (the proposal is drawn again), never accepted early
    assert torch.equal(_series_tail(U, r, S2, max_terms=3), U <= S3)


def test_float32_odds_overflow_with_a_zero_uniform_takes_the_inverse_gaussian_branch(monkeypatch):
    """In float32 ``q / p`` overflows from |z| ~ 36; a branch uniform of exactly 0 (probability
    2^-24 per proposal) must still choose the inverse-Gaussian piece (the exponential piece has
    probability p / (p + q) = 0 there). Forced here: every branch uniform is 0."""
    import inference.polya_gamma as pg

    c = torch.tensor([18.0, 50.0, 500.0], dtype=torch.float32)
    assert bool(torch.isinf(pg._q_over_p(c, TRUNCATION)).all())
    real = pg._uniforms

    def zero_branch_uniform(rows, n, like, generator, k=1):
        u = real(rows, n, like, generator, k)
        if rows == 3:                                # the J* round: row 1 picks the branch
            u[1] = 0.0
        return u

    monkeypatch.setattr(pg, "_uniforms", zero_branch_uniform)
    n = 4000
    x = random_polyagamma(1, torch.full((n,), 100.0, dtype=torch.float32),
                          torch.Generator().manual_seed(0)).double()
    assert float(x.max()) < TRUNCATION / 4                             # the exponential piece is > t / 4
    m = float(polyagamma_mean(1, torch.tensor(100.0, dtype=torch.float64)))
    v = float(polyagamma_variance(1, torch.tensor(100.0, dtype=torch.float64)))
    assert abs(float(x.mean()) - m) < 4 * math.sqrt(v / n)


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
