"""Polya-Gamma draws in torch, exact in distribution, on the device of the tilting parameter.

``omega ~ PG(b, z)`` (Polson, Scott & Windle 2013, "Bayesian inference for logistic models using
Polya-Gamma latent variables", JASA; PSW below) is the infinite convolution

    omega = 1 / (2 pi^2) sum_{k>=1} g_k / ((k - 1/2)^2 + z^2 / (4 pi^2)),   g_k ~ Gamma(b, 1),

with ``E[omega] = b tanh(z/2) / (2 z)`` and
``Var[omega] = b (sinh z - z) / (4 z^3 cosh^2(z/2))`` (``b/4`` and ``b/24`` at ``z = 0``).

Method for ``b = 1`` (PSW Sect. 4 / Algorithm 1, Devroye's alternating-series method): draw
``X ~ J*(1, c)``, ``c = |z|/2``, and return ``X / 4``. ``J*(1, c)`` has density
``cosh(c) exp(-c^2 x / 2) f(x)`` with ``f(x) = sum_n (-1)^n a_n(x)``, where

    a_n(x) = pi (n + 1/2) (2 / (pi x))^{3/2} exp(-2 (n + 1/2)^2 / x)     x <= t,
    a_n(x) = pi (n + 1/2) exp(-(n + 1/2)^2 pi^2 x / 2)                    x >  t,

``t = 0.64``. The partial sums bracket ``f`` from above and below (odd / even n), so a proposal
from ``g(x) ~ exp(-c^2 x / 2) a_0(x)`` is accepted when ``U a_0(X)`` falls below a lower partial
sum and rejected when above an upper one. The proposal is a mixture:

* ``x > t``: ``t + Exp(1) / K``, ``K = pi^2 / 8 + c^2 / 2`` (truncated exponential);
* ``x <= t``: inverse Gaussian ``IG(mu = 1/c, 1)`` truncated to ``(0, t]``: for ``mu > t`` by
  the Levy law ``x^{-3/2} exp(-1/(2x))`` truncated to ``(0, t]`` (exact inversion of its CDF
  ``2 Phi(-1/sqrt(x))``) accepted with probability ``exp(-c^2 X / 2)`` (PSW's Sect. 4.2 draws
  the same truncated Levy law by Devroye's ``t / (1 + t E)^2`` with a rejection step of its
  own); for ``mu <= t`` by the Michael-Schucany-Haas transform of a chi-square(1) draw,
  repeated until ``X <= t``;

with the exponential piece taken when a uniform falls below ``p / (p + q)``,
``p = pi / (2K) exp(-K t)``, ``q = 2 exp(-c) Phi_IG(t | 1/c, 1)`` (PSW Sect. 4.2; the odds
``q / p`` in a closed form that overflows to ``inf``, never NaN, and ``p / (p + q) = 0`` then).

Vectorization: every element runs the same program under masks. A Python ``while`` loops over
*rejection rounds* of the still-unaccepted elements only (each round is a handful of tensor
operations on the pending elements; PSW show the acceptance rate exceeds 0.9992, so almost every
element is done after one round); small pending sets draw several proposals per element in one
round, laid out ``(k, n)`` against the ``n`` parameters, and keep the first accepted (the same
sampler, fewer rounds). The values read on the host are the sizes of index sets (pending
elements, branch subsets) and one maximum in the branch odds (whether ``erfcx`` is needed); no
element is ever copied to the host.

Integer ``b > 1``: a sum of ``b`` independent ``PG(1, z)`` draws (PSW Sect. 2, the PG family is
closed under convolution in b).

The reference path :func:`random_polyagamma_reference` calls the ``polyagamma`` package (Zhou's
C implementation of the same and other methods) on host copies; tests validate this module
against it (two-sample Kolmogorov-Smirnov) and against the closed-form moments.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

__all__ = ["random_polyagamma", "random_pg_counts", "random_polyagamma_reference", "polyagamma_mean",
           "polyagamma_variance", "TRUNCATION", "REFERENCE_METHOD_SWITCH"]

TRUNCATION = 0.64
"""The switch point ``t`` of the two series representations (PSW Sect. 4.1: 0.64 maximises
the acceptance rate)."""

_HALF_PI = 0.5 * math.pi
_PI2_8 = math.pi ** 2 / 8.0


# -- closed-form moments -------------------------------------------------------------------
def polyagamma_mean(b, z: Tensor) -> Tensor:
    """``E[PG(b, z)] = b tanh(z / 2) / (2 z)`` (``b / 4`` at ``z = 0``), elementwise."""
    z = torch.as_tensor(z)
    az = z.abs()
    small = az < 1e-4
    safe = torch.where(small, torch.ones_like(az), az)
    z2 = az * az
    out = torch.where(small, 0.25 - z2 / 48.0 + z2 * z2 / 480.0,
                      torch.tanh(safe / 2.0) / (2.0 * safe))
    return b * out


def polyagamma_variance(b, z: Tensor) -> Tensor:
    """``Var[PG(b, z)] = b (sinh z - z) / (4 z^3 cosh^2(z/2))`` (``b / 24`` at ``z = 0``),
    elementwise, in the form ``b (2 tanh(z/2) - z sech^2(z/2)) / (4 z^3)`` (the same function:
    ``sinh z = 2 sinh(z/2) cosh(z/2)``), which stays finite where ``sinh z`` overflows
    (``|z| > 710`` in float64, ``> 89`` in float32: ``sech^2`` underflows to 0 instead).
    Near 0 both lose digits to cancellation (``~ z^3 / 6`` from terms ``~ z``): the Taylor
    series ``1/24 - z^2/120 + 17 z^4/13440 - 31 z^6/181440 + 691 z^8/31933440`` there (below
    0.1 in float64, 0.6 in lower precision; relative error below 1e-12 / 2e-6)."""
    z = torch.as_tensor(z)
    az = z.abs()
    small = az < (0.1 if az.dtype == torch.float64 else 0.6)
    safe = torch.where(small, torch.ones_like(az), az)
    half = 0.5 * safe
    big = (2.0 * torch.tanh(half) - safe / torch.cosh(half) ** 2) / (4.0 * safe ** 3)
    z2 = az * az
    series = 1.0 / 24.0 + z2 * (-1.0 / 120.0 + z2 * (17.0 / 13440.0 + z2 * (-31.0 / 181440.0
                                                                   + z2 * 691.0 / 31933440.0)))
    return b * torch.where(small, series, big)


# -- the b = 1 sampler -----------------------------------------------------------------------
def _series_log_rate(x: Tensor, t: float) -> Tensor:
    """``g(x)`` with ``a_n(x) / a_0(x) = (2n + 1) exp(-n (n + 1) g(x))``: ``g = 2 / x`` for
    ``x <= t`` and ``g = pi^2 x / 2`` for ``x > t`` (the ratio of two terms of PSW eq. (15))."""
    return torch.where(x <= t, 2.0 / x, (0.5 * math.pi ** 2) * x)


_LOG_CONST = TRUNCATION * math.pi ** 2 / 8.0 - 0.5 / TRUNCATION


def _exp_rate(c: Tensor) -> Tensor:
    """``K = pi^2 / 8 + c^2 / 2``, the rate of the truncated exponential proposal (PSW Sect. 4.2)."""
    return (c * c).mul_(0.5).add_(_PI2_8)


def _q_over_p(c: Tensor, t: float) -> Tensor:
    """``q / p``, the odds of the inverse-Gaussian branch against the truncated exponential
    (PSW Sect. 4.2): ``p = pi / (2K) exp(-K t)``, ``q = 2 exp(-c) Phi_IG(t | 1/c, 1)`` with

        Phi_IG(t | 1/c, 1) = Phi((t c - 1)/sqrt(t)) + exp(2c) Phi(-(t c + 1)/sqrt(t)),

    so ``q / p = 4/pi K [exp(K t - c) Phi(b) + exp(t pi^2/8 - 1/(2t)) erfcx(w) / 2]`` with
    ``b = (t c - 1)/sqrt(t)`` and ``w = (t c + 1)/sqrt(2t)``: the second term's exponentials
    cancel exactly (``K t + c - w^2 = t pi^2/8 - 1/(2t)``), and ``Phi(b) >= Phi(-1/sqrt(t))``
    never vanishes, so an overflow of the first exponential gives ``q/p = inf`` (the exponential
    branch then has probability 0, as it has to within the uniform's resolution), never NaN.
    In-place arithmetic on fresh temporaries (this runs on every element of every call)."""
    rt = math.sqrt(t)
    K = _exp_rate(c)
    first = (K * t).sub_(c).exp_().mul_(torch.special.ndtr((c * t).sub_(1.0).div_(rt)))
    w = (c * t).add_(1.0).div_(rt * math.sqrt(2.0))
    # erfcx(w) = exp(w^2) erfc(w); the product form is ~10x cheaper than torch's erfcx on CPU
    # but erfc underflows for large w (at w ~ 9 in float32, ~ 26 in float64): erfcx there
    ex = (w * w).exp_().mul_(torch.special.erfc(w))
    limit = 8.0 if c.dtype in (torch.float32, torch.float16, torch.bfloat16) else 25.0
    if w.numel() and float(w.max()) > limit:
        far = torch.nonzero(w > limit).squeeze(-1)
        ex[far] = torch.special.erfcx(w[far])
    return first.add_(ex, alpha=0.5 * math.exp(_LOG_CONST)).mul_(K).mul_(4.0 / math.pi)


def _uniforms(rows: int, n: int, like: Tensor, generator, k: int = 1) -> Tensor:
    """``(rows, k, n)`` independent ``U[0, 1)`` draws in one call (compared against
    probabilities; :func:`_to_exponential` guards the log)."""
    return torch.rand(rows, k, n, dtype=like.dtype, device=like.device, generator=generator)


def _to_exponential(u: Tensor) -> Tensor:
    """``-log(U)`` in place: Exp(1) draws from uniforms (on CPU about twice as fast as
    ``Tensor.exponential_``, measured on 1e6 draws)."""
    return u.clamp_min_(torch.finfo(u.dtype).tiny).log_().neg_()


def _candidates(n: int) -> int:
    """Proposals drawn per pending element in a rejection round after the first (the first
    draws one per element: most elements accept there): up to 16 for the few left, where a
    round costs a fixed number of tensor operations whatever its size; taking the first
    accepted of ``k`` independent proposals is the same rejection sampler, so the draw stays
    exact."""
    return max(1, min(16, 4096 // max(n, 1)))


def _rejection(round_fn, params: tuple[Tensor, ...], generator) -> Tensor:
    """Runs a vectorized rejection sampler to completion: ``round_fn(*params, k, generator)``
    returns ``k`` proposals per element and whether each was accepted, both ``(k, n)`` (the
    ``n`` parameters broadcast along the first axis). The first round proposes once for every
    element; later rounds work on the still-pending elements only (``_candidates`` proposals
    each) and keep the first accepted proposal."""
    X, ok = round_fn(*params, 1, generator)
    out, done = X[0], ok[0]
    rest = torch.nonzero(~done).squeeze(-1)
    while rest.numel():
        X, ok = round_fn(*(p[rest] for p in params), _candidates(rest.numel()), generator)
        if X.shape[0] > 1:
            # an accepted proposal picked by the acceptance pattern alone (its first): the
            # accepted proposals are i.i.d. from the target given the pattern, so any such
            # rule is exact; max over uint8 is ~5x faster than argmax on CPU (measured)
            any_ok, first = ok.to(torch.uint8).max(0, keepdim=True)
            ok, X = any_ok.squeeze(0).bool(), X.gather(0, first).squeeze(0)
        else:
            ok, X = ok[0], X[0]
        out[rest[ok]] = X[ok]
        rest = rest[~ok]
    return out


#: ``Phi(-1 / sqrt(t))``: half the mass of the Levy law ``x^{-3/2} exp(-1/(2x)) / sqrt(2 pi)``
#: on ``(0, t]`` (its CDF is ``2 Phi(-1 / sqrt(x))``)
_LEVY_HALF_MASS = 0.5 * math.erfc(1.0 / math.sqrt(2.0 * TRUNCATION))


def _ig_large_round(c2h: Tensor, k: int, generator) -> tuple[Tensor, Tensor]:
    """``k`` proposals for ``IG(1/c, 1)`` truncated to ``(0, t]`` when ``1/c > t``, for
    ``c2h = c^2 / 2``. On ``(0, t]`` the IG density is ``x^{-3/2} exp(-1/(2x))`` (the Levy law)
    times ``exp(-c^2 x / 2)``: the Levy law truncated to ``(0, t]`` by inversion,
    ``X = 1 / Phi^-1((1 - U) Phi(-1/sqrt(t)))^2``, accepted with probability
    ``exp(-c^2 X / 2)`` (at least ``exp(-1/(2t)) = 0.46`` for ``c < 1/t``, 0.9 and more for the
    ``|z| < 1.5`` typical of GP-Tree nodes). The same law as PSW's Sect. 4.2 scheme (Devroye's
    ``t / (1 + t E)^2`` with its own rejection step), with one rejection step instead of two."""
    u = _uniforms(2, c2h.numel(), c2h, generator, k)
    X = torch.special.ndtri(u[0].neg_().add_(1.0).mul_(_LEVY_HALF_MASS)).square_().reciprocal_()
    return X, u[1] <= (X * c2h).neg_().exp_()


def _ig_small_round(mu: Tensor, k: int, generator) -> tuple[Tensor, Tensor]:
    """``k`` proposals for ``IG(mu, 1)`` truncated to ``(0, t]`` when ``mu <= t``: the
    Michael-Schucany-Haas transform of a chi-square(1) draw, accepted when ``X <= t``."""
    n = mu.numel()
    Y = torch.randn(k, n, dtype=mu.dtype, device=mu.device, generator=generator).square_()
    muY = Y.mul_(mu)
    X = (muY * muY).add_(muY, alpha=4.0).sqrt_().mul_(-0.5).add_(muY, alpha=0.5).add_(1.0).mul_(mu)
    U = _uniforms(1, n, mu, generator, k)[0]
    X = torch.where(U > mu / (mu + X), mu * mu / X, X)
    return X, X <= TRUNCATION


def _truncated_inverse_gaussian(c: Tensor, generator) -> Tensor:
    """``IG(1/c, 1)`` truncated to ``(0, t]`` for every element of a 1-D ``c >= 0``."""
    big_mu = c * TRUNCATION < 1.0                                       # mu = 1/c > t
    i_small = torch.nonzero(~big_mu).squeeze(-1)
    if not i_small.numel():
        return _rejection(_ig_large_round, ((c * c).mul_(0.5),), generator)
    out = torch.empty_like(c)
    i_big = torch.nonzero(big_mu).squeeze(-1)
    if i_big.numel():
        cb = c[i_big]
        out[i_big] = _rejection(_ig_large_round, (cb.mul_(cb).mul_(0.5),), generator)
    out[i_small] = _rejection(_ig_small_round, (c[i_small].reciprocal_(),), generator)
    return out


def _pg1_round(c: Tensor, K: Tensor, p_exp: Tensor, k: int, generator) -> tuple[Tensor, Tensor]:
    """``k`` proposals of ``J*(1, c)`` per element (PSW Algorithm 1) and their acceptance by the
    alternating series (the first partial sum decides nearly all; later terms are evaluated
    only on the proposals it has not decided). ``K = pi^2/8 + c^2/2``, ``p_exp = p / (p + q)``."""
    t = TRUNCATION
    n = c.numel()
    u = _uniforms(3, n, c, generator, k)
    X = _to_exponential(u[0]).div_(K).add_(t)
    # exponential branch when U < p / (p + q): where q/p overflows (|z| > ~36 in float32,
    # ~97 in float64) p_exp is 0 and U = 0 still takes the inverse-Gaussian branch (a product
    # U (1 + q/p) would be 0 * inf = NaN there and pick the wrong branch)
    i_ig = torch.nonzero((u[1] >= p_exp).view(-1)).squeeze(-1)
    if i_ig.numel():
        X.view(-1)[i_ig] = _truncated_inverse_gaussian(c[i_ig if k == 1 else i_ig % n],
                                                        generator)
    # alternating series in units of a_0(X): S_n = sum_{k<=n} (-1)^k (2k+1) r^{k(k+1)},
    # r = exp(-g(X)); accept when U <= S_n (n odd), reject when U > S_n (n even)
    r = _series_log_rate(X, t).neg_().exp_()
    U = u[2]
    S1 = (r * r).mul_(-3.0).add_(1.0)
    accepted = U <= S1
    i_rest = torch.nonzero((~accepted).view(-1)).squeeze(-1)
    if i_rest.numel():
        Ur, rr, S1r = U.view(-1)[i_rest], r.view(-1)[i_rest], S1.view(-1)[i_rest]
        S2 = rr.pow(6).mul_(5.0).add_(S1r)
        i_open = torch.nonzero(Ur <= S2).squeeze(-1)
        if i_open.numel():
            accepted.view(-1)[i_rest[i_open]] = _series_tail(Ur[i_open], rr[i_open], S2[i_open])
    return X, accepted


def _pg1(c: Tensor, generator) -> Tensor:
    """``J*(1, c) / 4`` for every element of ``c = |z| / 2`` (one draw each)."""
    shape = c.shape
    c = c.reshape(-1)
    p_exp = _q_over_p(c, TRUNCATION).add_(1.0).reciprocal_()          # p / (p + q)
    return _rejection(_pg1_round, (c, _exp_rate(c), p_exp), generator).mul_(0.25).reshape(shape)


def _series_tail(U: Tensor, r: Tensor, S: Tensor, max_terms: int = 200) -> Tensor:
    """Continue the alternating series from ``S = S_2`` for the undecided elements: returns
    whether each is accepted. Terms fall like ``r^{n(n+1)}``; an element still undecided after
    ``max_terms`` is rejected (and proposed again), which keeps the draw exact."""
    accepted = torch.zeros_like(U, dtype=torch.bool)
    deciding = torch.ones_like(accepted)
    for n in range(3, max_terms + 1):
        term = (2 * n + 1) * r ** (n * (n + 1))
        if n % 2 == 1:
            S = S - term
            hit = deciding & (U <= S)
            accepted |= hit
            deciding &= ~hit
        else:
            S = S + term
            deciding &= ~(U > S)
        if not bool(deciding.any()):
            break
    return accepted


def _check_b(b) -> tuple[int | None, Tensor | None]:
    """``b`` as a Python int or an integer-valued tensor; raises for non-integer or b <= 0."""
    if isinstance(b, bool):
        raise TypeError("b: expected a positive integer (or tensor of them), received a bool")
    if isinstance(b, (int, np.integer)):
        if b <= 0:
            raise ValueError(f"b: expected a positive integer, received {int(b)}")
        return int(b), None
    if isinstance(b, float):
        if not (math.isfinite(b) and b > 0 and b == int(b)):
            raise ValueError(f"b: expected a positive integer, received {b!r} (only integer b is "
                             "supported: a sum of b PG(1, z) draws)")
        return int(b), None
    bt = torch.as_tensor(b)
    if bt.is_floating_point():
        if not bool(torch.isfinite(bt).all()) or not bool((bt == torch.round(bt)).all()):
            raise ValueError("b: expected positive integers, received non-integer or non-finite "
                             "values (only integer b is supported)")
    if bt.numel() and bool((bt <= 0).any()):
        raise ValueError(f"b: expected positive integers, received values down to "
                         f"{bt.min().item()}")
    return None, bt


def random_polyagamma(b, z: Tensor, generator: torch.Generator | None = None, *,
                      validate: bool = True) -> Tensor:
    """Draws ``omega ~ PG(b, z)``, one per element of ``broadcast(b, z)``.

    Args:
        b: positive integer shape: a Python int, or an integer-valued tensor broadcastable
            with ``z`` (a sum of ``b`` exact ``PG(1, z)`` draws).
        z: tilting parameters, any shape, any floating dtype, any device; the draws have its
            dtype and device.
        generator: a ``torch.Generator`` on ``z.device`` (None: torch's default generator).
        validate: check ``b`` and that ``z`` is finite (each check reads one scalar on the
            host); engines that already know their inputs pass ``False``.

    Returns:
        Tensor of shape ``broadcast(b, z).shape``, dtype and device of ``z``.

    Raises:
        ValueError: ``b <= 0``, non-integer ``b``, or NaN / inf in ``z``.
    """
    if not isinstance(z, Tensor):
        z = torch.as_tensor(z, dtype=torch.get_default_dtype())
    if not z.is_floating_point():
        z = z.to(torch.get_default_dtype())
    if validate:
        b_int, b_t = _check_b(b)
        if z.numel() and not bool(torch.isfinite(z).all()):
            raise ValueError("z: expected finite tilting parameters, received NaN or inf")
    else:
        b_int, b_t = (int(b), None) if isinstance(b, (int, np.integer)) else (None, torch.as_tensor(b))
    return random_pg_counts(b_int if b_t is None else b_t, z, generator)


def random_pg_counts(b, z: Tensor, generator) -> Tensor:
    """``PG(b, z)`` for integer ``b >= 0`` (``PG(0, z) = 0``), no checks. Used by samplers whose
    shape parameters are counts that may be zero (the logistic-softmax baseline)."""
    c = 0.5 * z.abs()
    if isinstance(b, int):
        if b == 0:
            return torch.zeros_like(z)
        if b == 1:
            return _pg1(c, generator)
        return _pg1(c.expand(b, *c.shape).contiguous(), generator).sum(0)
    b = b.to(device=z.device)
    shape = torch.broadcast_shapes(b.shape, z.shape)
    c = c.expand(shape)
    b = b.expand(shape)
    b_max = int(b.max().item()) if b.numel() else 0
    if b_max == 0:
        return torch.zeros(shape, dtype=z.dtype, device=z.device)
    if b_max == 1:
        return torch.where(b > 0, _pg1(c.contiguous(), generator), torch.zeros_like(c))
    draws = _pg1(c.expand(b_max, *shape).contiguous(), generator)       # (b_max, ...)
    k = torch.arange(b_max, device=z.device).reshape(b_max, *([1] * len(shape)))
    return torch.where(k < b.unsqueeze(0), draws, torch.zeros_like(draws)).sum(0)


#: Above this ``|z|`` the reference draws with ``polyagamma``'s ``method="alternate"``, below
#: it with ``method="devroye"``. polyagamma 2.0.2 measured on 2e5 draws per cell, b in {1, 2, 5,
#: 30}: ``devroye`` (and the default method, which takes it for b = 1) returns ~0.16 for every
#: draw from ``|z| ~ 176`` on (the mean is ``b tanh(z/2) / (2z)``, 0.0028 at 180); the default
#: method's saddle approximation is off for b = 30 from ``|z| = 50``; ``alternate`` is right at
#: every ``|z| >= 3`` but biased for b >= 2 near 0 (mean 7 standard errors high at b = 2,
#: z = 0). 150 leaves a margin on both sides; ``tests/inference/test_polya_gamma.py`` checks
#: the reference's moments at |z| up to 1e4.
REFERENCE_METHOD_SWITCH = 150.0


def random_polyagamma_reference(b, z: Tensor, seed: int | np.random.Generator | None = None
                                ) -> Tensor:
    """The reference path: the ``polyagamma`` package on a host copy of ``z`` (the scheme of the
    GP-Tree reference code, which draws with pypolyagamma on the CPU and copies back every
    Gibbs step), ``method="devroye"`` for ``|z| < REFERENCE_METHOD_SWITCH`` and
    ``method="alternate"`` above (each is wrong on the other side; see the constant). Returns a
    tensor with the dtype and device of ``z``."""
    from polyagamma import random_polyagamma as pg_host

    zt = z if isinstance(z, Tensor) else torch.as_tensor(z, dtype=torch.get_default_dtype())
    b_int, b_t = _check_b(b)
    z_np = zt.detach().cpu().double().numpy()
    h = float(b_int) if b_t is None else b_t.detach().cpu().double().numpy()
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    shape = np.broadcast_shapes(np.shape(h), z_np.shape)
    far = np.abs(z_np) >= REFERENCE_METHOD_SWITCH
    if not far.any():
        out = pg_host(h, z_np, size=shape if shape else None, random_state=rng, method="devroye")
    else:
        z_b = np.broadcast_to(z_np, shape)
        h_b = np.broadcast_to(np.asarray(h, dtype=np.float64), shape)
        far = np.broadcast_to(far, shape)
        out = np.empty(shape, dtype=np.float64)
        near = ~far
        if near.any():
            out[near] = pg_host(h_b[near], z_b[near], random_state=rng, method="devroye")
        out[far] = pg_host(h_b[far], z_b[far], random_state=rng, method="alternate")
    return torch.as_tensor(np.asarray(out, dtype=np.float64), device=zt.device).to(zt.dtype)
