"""Inducing-point selection for online sparse GP regression: VIPS and the rules it is compared to.

One interface (:class:`SelectionPolicy`): ``init() -> TargetStats`` and
``select(rng, stats, X, y, old, params) -> Selection`` take a batch, the old summary (its
inducing inputs ``a`` first) and the *previous* hyperparameters, and return the new inducing
inputs ``b`` with a record. Policies (Pescador-Barrios et al. 2024, App. E, Table 2):

* :class:`VIPS` -- greedy variance (Burt et al. 2020) on the batch, old points kept, stopped by
  the VIPS rule (Sect. 4.3, eqs. 20-21; Algorithm 1): with the running mean / variance of all
  targets so far (Welford / Chan), the noise code
  ``L_noise = -N/2 log(2 pi s_y^2) - sum (y - ybar)^2 / (2 s_y^2)``, the reference value
  ``L_max = F(b = [X; a])`` (``X`` subsampled to ``5000 - M_a`` rows when ``N >= 5000``) and
  ``gamma = L_max - delta |L_max - L_noise|``, add the point of largest residual variance
  ``diag(K_ff - Q_ff)`` until ``F >= gamma``. The first batch uses the SGPR bound (the
  authors' ``Offline_VIPS.py``, jitter 1e-4, at least one point).
* :class:`ConditionalVariance` -- pivoted Cholesky over ``[a; X]`` (old points may be dropped),
  stopped when the residual trace falls below ``eta`` (Burt et al. 2020; authors' ``MDPP.py``).
* :class:`OIPS` -- add ``x`` when ``max_z k(x, z) < rho k(x, x)`` (Galy-Fajou & Opper 2021).
* :class:`FixedM` -- ``M`` points from ``[a; X]``: at random (Bui et al. 2017) or by greedy
  variance (the fixed-M rows of Fig. 2a).

Greedy selection never refactorizes: :func:`greedy_variance_selection` grows ``chol(K_bb)``,
``L_b^-1 K_bf``, ``L_b^-1 K_ba``, ``chol(D)`` and ``L_D^-1 L_b^-1 c`` by one bordered row per
added point, so adding ``m`` points to a batch of ``N`` costs ``O((N + M)(M_a + m) m)`` after one
``O(N M_a^2 + M_a^3)`` factorization at ``b = a`` -- instead of ``m`` full bound evaluations
(:func:`greedy_variance_from_scratch`, what the authors' code does; kept as the reference the
incremental one is tested against). The loop is one ``lax.while_loop`` over buffers whose sizes
are rounded up to a few buckets, so that a stream of batches compiles only a handful of times.

:class:`OnlineSGPREngine` (``init`` / ``step``) is the one-pass engine of a stream: select with
the previous hyperparameters, freeze ``b``, fit kernel and noise by L-BFGS on ``F`` (the
authors' protocol; kernel variance bounded to [1e-6, 2e3], noise >= 1e-6), then pass on
``q(u_b)`` (+1e-6 I) and ``K_bb`` at the fitted hyperparameters as the next old summary.
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.scipy.linalg import solve_triangular

from inference.type2ml import fit_type2ml
from models.exact_gp import GPRegressionParams
from models.kernels_jax import Kernel
from models.online_sgpr import (FIRST_BATCH_SELECTION_JITTER, ONLINE_JITTER, OldPosterior,
                                OldTerms, bound_constant, bound_pieces, old_terms,
                                online_elbo, online_elbo_and_residual,
                                optimal_inducing_posterior)

__all__ = ["TargetStats", "update_target_stats", "noise_code", "prepare_old", "padded_elbo",
           "GreedyResult",
           "greedy_variance_selection", "greedy_variance_from_scratch", "pivoted_cholesky",
           "Selection", "SelectionPolicy", "VIPS", "ConditionalVariance", "OIPS", "FixedM",
           "OnlineSGPRState", "OnlineSGPRInfo", "OnlineSGPREngine", "kernel_bounds",
           "fit_hyperparameters"]

_LOG_2PI = math.log(2.0 * math.pi)


# ------------------------------------------------------------------------------------------
# running statistics of the targets (Welford 1962; Chan, Golub & LeVeque 1979)
# ------------------------------------------------------------------------------------------
class TargetStats(NamedTuple):
    """Running count, mean and sum of squared deviations ``M2`` of every target seen so far."""

    count: Array
    mean: Array
    M2: Array


def update_target_stats(stats: TargetStats, y: Array) -> TargetStats:
    """Merge batch ``y (N,)`` into ``stats`` (Chan et al.'s parallel update, as ``VIPS.py``)."""
    y = jnp.asarray(y)
    n_new = y.shape[0]
    mu_new = jnp.mean(y)
    count = stats.count + n_new
    delta = mu_new - stats.mean
    mean = stats.mean + delta * n_new / count
    M2 = stats.M2 + jnp.sum((y - mu_new) ** 2) + stats.count * n_new * delta ** 2 / count
    return TargetStats(count, mean, M2)


def noise_code(stats: TargetStats, y: Array) -> Array:
    """``L_noise`` of eq. 21: ``log prod_i N(y_i | ybar, s_y^2)`` with the running mean and the
    running sample variance (``M2 / (count - 1)``) of all targets so far, batch included."""
    var = stats.M2 / (stats.count - 1)
    N = y.shape[0]
    return -0.5 * N * jnp.log(2.0 * jnp.pi * var) - 0.5 * jnp.sum((y - stats.mean) ** 2) / var


# ------------------------------------------------------------------------------------------
# incremental greedy-variance selection with the bound grown by rank-one updates
# ------------------------------------------------------------------------------------------
def _bucket(n: int, minimum: int = 32) -> int:
    """Buffer size for ``n`` rows: the next power of two up to 256, then the smallest
    ``2^k * {1, 1.25, 1.5, 1.75}`` >= ``n`` (few distinct shapes, so few compilations; at most
    25 % padding where the cubic cost matters)."""
    n = max(int(n), minimum)
    k = max(int(math.floor(math.log2(n))), 0)
    if n <= 256:
        return n if n == 2 ** k else 2 ** (k + 1)
    for f in (1.0, 1.25, 1.5, 1.75, 2.0):
        size = int(math.ceil(f * 2 ** k))
        if size >= n:
            return size
    return 2 ** (k + 1)  # pragma: no cover


def _pad_rows(A: Array, n: int) -> Array:
    """Zero-pad the leading axis of ``A`` to ``n`` rows."""
    A = jnp.asarray(A)
    return jnp.zeros((n,) + A.shape[1:], A.dtype).at[: A.shape[0]].set(A)


def _pad_data(X: Array, y: Array):
    """``(X, y)`` zero-padded to a size bucket, with the mask of real rows."""
    N = X.shape[0]
    n = _bucket(N)
    return _pad_rows(X, n), _pad_rows(y, n), jnp.arange(n) < N


def _pad_inducing(Z: Array):
    M = Z.shape[0]
    n = _bucket(M)
    return _pad_rows(Z, n), jnp.arange(n) < M


def _pad_old(old: OldPosterior) -> tuple[OldPosterior, Array]:
    """The old summary padded to a size bucket: zero mean, identity blocks of S_a and K'_aa."""
    a, m, S, Kp = old
    Ma = a.shape[0]
    n = _bucket(Ma)
    eye = jnp.eye(n, dtype=a.dtype)
    pad_cov = lambda C: eye.at[:Ma, :Ma].set(C)  # noqa: E731
    return OldPosterior(_pad_rows(a, n), _pad_rows(m, n), pad_cov(S), pad_cov(Kp)), \
        jnp.arange(n) < Ma


_old_terms_jit = jax.jit(old_terms, static_argnames=())


def prepare_old(old: OldPosterior | None, jitter: float) -> OldTerms | None:
    """:func:`models.online_sgpr.old_terms` of the padded old summary (``None`` stays ``None``)."""
    if old is None:
        return None
    padded, mask = _pad_old(old)
    return _old_terms_jit(padded, jitter=jnp.asarray(jitter), mask=mask)


def _old_size(terms: OldTerms | None) -> int:
    return 0 if terms is None else int(jnp.sum(terms.mask))


@jax.jit
def _elbo_resid_padded(params, Xp, yp, xm, Zp, zm, terms, jitter):
    return online_elbo_and_residual(params, Xp, yp, Zp, terms, jitter=jitter, z_mask=zm,
                                    x_mask=xm)


def padded_elbo(params: GPRegressionParams, X: Array, y: Array, Z: Array,
                terms: OldTerms | None, jitter: float) -> tuple[float, np.ndarray]:
    """``(F, residual)`` of :func:`models.online_sgpr.online_elbo_and_residual`, evaluated on
    arrays padded to size buckets (one compilation per bucket, not per shape); ``terms`` from
    :func:`prepare_old`."""
    Xp, yp, xm = _pad_data(jnp.asarray(X), jnp.asarray(y))
    Zp, zm = _pad_inducing(jnp.asarray(Z))
    F, r = _elbo_resid_padded(params, Xp, yp, xm, Zp, zm, terms, jnp.asarray(jitter))
    return float(F), np.asarray(r)[: X.shape[0]]


class GreedyResult(NamedTuple):
    """Outcome of a greedy-variance selection.

    Attributes:
        indices: rows of ``X`` added, in the order chosen, ``(m,)`` int.
        bounds: ``F`` after 0, 1, ..., m additions, ``(m + 1,)`` (``bounds[0] = F(a)``; with no
            old points it is the bound with no inducing point at all).
        residual: ``diag(K_ff - Q_ff)`` at the final inducing set, ``(N,)``.
    """

    indices: np.ndarray
    bounds: np.ndarray
    residual: np.ndarray


class _GreedyState(NamedTuple):
    L: Array        # chol(K_bb + jI) in the leading m x m block, identity elsewhere (C, C)
    LD: Array       # chol(D), same layout (C, C)
    Pf: Array       # L^-1 K_bf, rows >= m zero (C, Np)
    Pa: Array       # L^-1 K_ba, rows >= m zero (C, Map)
    v: Array        # L_D^-1 L^-1 c (C,)
    B: Array        # inducing inputs (C, d)
    resid: Array    # diag(K_ff - Q_ff) (Np,)
    chosen: Array   # (Np,) bool
    order: Array    # (Np,) int: chosen indices in order
    hist: Array     # (Np + 1,) bound after each addition
    m: Array        # current number of inducing points
    k: Array        # number added from the batch
    F: Array        # current bound
    sum_v2: Array
    logdet: Array
    trQ: Array
    sA: Array


@jax.jit
def _greedy_loop(state: _GreedyState, kernel: Kernel, s2: Array, Xp: Array, yp: Array,
                 fmask: Array, ap: Array, amask: Array, A: Array, w: Array, base: Array,
                 threshold: Array, min_new: Array, max_new: Array, jitter: Array):
    """Append argmax-residual points while ``F < threshold`` (or ``k < min_new``), ``k < max_new``."""
    C = state.L.shape[0]
    idx_C = jnp.arange(C)

    def cond(st: _GreedyState):
        return (((st.F < threshold) | (st.k < min_new)) & (st.k < max_new))

    def body(st: _GreedyState) -> _GreedyState:
        score = jnp.where(st.chosen | ~fmask, -jnp.inf, st.resid)
        i = jnp.argmax(score)
        x = Xp[i][None, :]
        bmask = idx_C < st.m
        kb = jnp.where(bmask, kernel(st.B, x)[:, 0], 0.0)
        l = solve_triangular(st.L, kb, lower=True)
        dL = jnp.sqrt(kernel.diag(x)[0] + jitter - jnp.dot(l, l))
        kf = jnp.where(fmask, kernel(x, Xp)[0], 0.0)
        pf = (kf - l @ st.Pf) / dL
        ka = jnp.where(amask, kernel(x, ap)[0], 0.0)
        pa = (ka - l @ st.Pa) / dL
        paA = pa @ A
        Dcol = st.Pf @ pf / s2 + st.Pa @ paA
        Dnn = 1.0 + jnp.dot(pf, pf) / s2 + jnp.dot(paA, pa) + jitter
        lD = solve_triangular(st.LD, jnp.where(bmask, Dcol, 0.0), lower=True)
        dD = jnp.sqrt(Dnn - jnp.dot(lD, lD))
        ctn = jnp.dot(pf, yp) / s2 + jnp.dot(pa, w)
        vn = (ctn - jnp.dot(lD, st.v)) / dD
        m = st.m
        sum_v2 = st.sum_v2 + vn * vn
        logdet = st.logdet + jnp.log(dD)
        trQ = st.trQ + jnp.dot(pf, pf)
        sA = st.sA + jnp.dot(paA, pa)
        F = base + 0.5 * sum_v2 - logdet + 0.5 * trQ / s2 + 0.5 * sA
        return _GreedyState(
            L=st.L.at[m].set(l.at[m].set(dL)), LD=st.LD.at[m].set(lD.at[m].set(dD)),
            Pf=st.Pf.at[m].set(pf), Pa=st.Pa.at[m].set(pa), v=st.v.at[m].set(vn),
            B=st.B.at[m].set(x[0]), resid=st.resid - pf * pf, chosen=st.chosen.at[i].set(True),
            order=st.order.at[st.k].set(i.astype(st.order.dtype)), hist=st.hist.at[st.k + 1].set(F), m=m + 1,
            k=st.k + 1, F=F, sum_v2=sum_v2, logdet=logdet, trQ=trQ, sA=sA)

    return jax.lax.while_loop(cond, body, state)


@jax.jit
def _start(params: GPRegressionParams, Xp: Array, yp: Array, xm: Array, old: OldTerms | None,
           jitter: Array):
    """Factors of the bound at ``b = a`` (or at the empty set), on padded arrays."""
    base = bound_constant(params, Xp, yp, old, jitter=jitter, x_mask=xm)
    if old is None:
        return base, None
    p = bound_pieces(params, Xp, yp, old.a, old, jitter, old.mask, xm)
    sA = jnp.sum((p.P_a @ old.A) * p.P_a)
    return base, (p, sA)


def greedy_variance_selection(params: GPRegressionParams, X: Array, y: Array,
                              old: OldTerms | None, threshold: float, *,
                              jitter: float = ONLINE_JITTER, min_new: int = 0,
                              max_new: int | None = None) -> GreedyResult:
    """Greedy variance with the online bound grown by rank-one (bordered Cholesky) updates.

    Starting from ``b = a`` (the old inducing inputs, kept), repeatedly append the batch point
    of largest residual variance ``diag(K_ff - Q_ff)`` (Burt et al. 2020; ties: lowest index)
    while ``F(b) < threshold`` (VIPS: ``gamma``) or fewer than ``min_new`` were added, and fewer
    than ``max_new`` (default ``N``). Each addition borders ``L_b``, ``L_b^-1 K_bf``,
    ``L_b^-1 K_ba``, ``L_D`` and ``v`` by one row: ``O((N + M_a + m) M)`` work, no refactorization.

    Args:
        params: kernel and noise variance (VIPS: the previous batch's).
        X: batch ``(N, d)``; y: ``(N,)``.
        old: the padded old terms of :func:`prepare_old`, ``None`` for the first batch.
        threshold: stop once ``F >= threshold``.
        jitter: on ``K_bb``, ``K_aa`` and ``D``, as in :func:`models.online_sgpr.online_elbo`
            (must be > 0 so that a duplicate input never zeroes a pivot).

    Returns:
        :class:`GreedyResult`; ``bounds[-1]`` equals ``online_elbo`` at ``[a; X[indices]]``.
    """
    if not jitter > 0:
        raise ValueError(f"jitter: expected > 0 (duplicate inputs would give a zero pivot), "
                         f"received {jitter}")
    X = jnp.asarray(X)
    y = jnp.asarray(y)
    N, d = X.shape
    max_new = N if max_new is None else min(int(max_new), N)
    Ma = _old_size(old)
    dtype = X.dtype
    Xp, yp, fmask = _pad_data(X, y)
    Np = Xp.shape[0]
    Map = _bucket(Ma) if old is None else old.a.shape[0]
    C = max(_bucket(Ma + max_new), Map)
    base, start = _start(params, Xp, yp, fmask, old, jnp.asarray(jitter))
    L = jnp.eye(C, dtype=dtype)
    LD = jnp.eye(C, dtype=dtype)
    Pf = jnp.zeros((C, Np), dtype)
    Pa = jnp.zeros((C, Map), dtype)
    v = jnp.zeros(C, dtype)
    B = jnp.zeros((C, d), dtype)
    ap = jnp.zeros((Map, d), dtype)
    A = jnp.zeros((Map, Map), dtype)
    w = jnp.zeros(Map, dtype)
    resid = jnp.where(fmask, params.kernel.diag(Xp), 0.0)
    zero = jnp.zeros((), dtype)
    sum_v2 = logdet = trQ = sA = zero
    amask = jnp.zeros(Map, bool)
    if start is not None:
        p, sA = start
        L = L.at[:Map, :Map].set(p.L_b)
        LD = LD.at[:Map, :Map].set(p.L_D)
        Pf = Pf.at[:Map].set(p.P_f)
        Pa = Pa.at[:Map].set(p.P_a)
        v = v.at[:Map].set(p.v)
        B = B.at[:Map].set(old.a)
        ap, A, w, amask = old.a, old.A, old.w, old.mask
        resid = p.resid
        sum_v2 = jnp.dot(p.v, p.v)
        logdet = jnp.sum(jnp.log(jnp.diagonal(p.L_D)))
        trQ = jnp.sum(p.P_f * p.P_f)
    s2 = params.noise_variance
    F0 = base + 0.5 * sum_v2 - logdet + 0.5 * trQ / s2 + 0.5 * sA
    state = _GreedyState(L, LD, Pf, Pa, v, B, resid, jnp.zeros(Np, bool),
                         jnp.zeros(Np, jnp.int32), jnp.zeros(Np + 1, dtype).at[0].set(F0),
                         jnp.asarray(Ma, jnp.int32), jnp.asarray(0, jnp.int32), F0, sum_v2,
                         logdet, trQ, sA)
    out = _greedy_loop(state, params.kernel, s2, Xp, yp, fmask, ap, amask, A, w, base,
                       jnp.asarray(threshold, dtype), jnp.asarray(min_new, jnp.int32),
                       jnp.asarray(max_new, jnp.int32), jnp.asarray(jitter, dtype))
    k = int(out.k)
    return GreedyResult(np.asarray(out.order[:k]), np.asarray(out.hist[:k + 1]),
                        np.asarray(out.resid[:N]))


def greedy_variance_from_scratch(params: GPRegressionParams, X: Array, y: Array,
                                 old: OldTerms | None, threshold: float, *,
                                 jitter: float = ONLINE_JITTER, min_new: int = 0,
                                 max_new: int | None = None) -> GreedyResult:
    """The same selection as :func:`greedy_variance_selection`, evaluating the whole bound (a
    fresh Cholesky of ``K_bb`` and ``D``) after every added point, as the authors' ``VIPS.py``
    does. Kept as the reference the incremental version must agree with, and for the benchmark.
    """
    X = jnp.asarray(X)
    y = jnp.asarray(y)
    N = X.shape[0]
    max_new = N if max_new is None else min(int(max_new), N)
    a = None if old is None else old.a[: _old_size(old)]
    chosen: list[int] = []
    if a is None:
        Xp, yp, xm = _pad_data(X, y)
        F = float(_start(params, Xp, yp, xm, None, jnp.asarray(jitter))[0])
        resid = np.asarray(params.kernel.diag(X))
    else:
        F, resid = padded_elbo(params, X, y, a, old, jitter)
    hist = [F]
    while (F < threshold or len(chosen) < min_new) and len(chosen) < max_new:
        score = resid.copy()
        score[chosen] = -np.inf
        chosen.append(int(np.argmax(score)))
        Z = X[np.asarray(chosen)] if a is None else jnp.concatenate([a, X[np.asarray(chosen)]])
        F, resid = padded_elbo(params, X, y, Z, old, jitter)
        hist.append(F)
    return GreedyResult(np.asarray(chosen, np.int64), np.asarray(hist), resid)


# ------------------------------------------------------------------------------------------
# pivoted Cholesky (Conditional Variance, fixed-M greedy) and OIPS
# ------------------------------------------------------------------------------------------
@partial(jax.jit, static_argnames=("cap",))
def _pivoted_cholesky(kernel: Kernel, Pp: Array, pmask: Array, eta: Array, *, cap: int):
    """Greedy pivots of ``k(Pp, Pp)`` (+1e-6 on the diagonal) as the authors' ``MDPP.py``."""
    n = Pp.shape[0]
    di = jnp.where(pmask, kernel.diag(Pp) + 1e-6, -jnp.inf)
    rows = jnp.zeros((cap, n), Pp.dtype)
    piv = jnp.zeros(cap + 1, jnp.int32).at[0].set(jnp.argmax(di).astype(jnp.int32))

    def cond(c):
        m, _, _, _, done = c
        return (~done) & (m < cap - 1)

    def body(c):
        m, di, rows, piv, _ = c
        j = piv[m]
        dj = jnp.sqrt(di[j])
        col = jnp.where(pmask, kernel(Pp, Pp[j][None, :])[:, 0], 0.0)
        col = col.at[j].add(1e-6)
        e = (col - rows[:, j] @ rows) / dj
        rows = rows.at[m].set(jnp.where(pmask, e, 0.0))
        di = jnp.where(pmask, jnp.maximum(di - e * e, 0.0), -jnp.inf)
        piv = piv.at[m + 1].set(jnp.argmax(di).astype(jnp.int32))
        trace = jnp.sum(jnp.where(pmask, di, 0.0))
        return m + 1, di, rows, piv, trace < eta

    m, _, _, piv, done = jax.lax.while_loop(
        cond, body, (jnp.asarray(0, jnp.int32), di, rows, piv, jnp.asarray(False)))
    # stopped at pivot m - 1 (0-based): keep the pivots before it, as MDPP.py (indices[:m])
    count = jnp.where(done, m - 1, cap)
    return piv[:cap], count


def pivoted_cholesky(kernel: Kernel, pool: Array, eta: float, cap: int, rng: Array
                     ) -> np.ndarray:
    """Indices into ``pool (P, d)`` chosen by greedy variance (partial pivoted Cholesky of
    ``k(pool, pool) + 1e-6 I``), stopped when the residual trace ``< eta`` (keeping the pivots
    before the one after which it fell), at most ``cap``. Ties are broken by a random
    permutation of the pool drawn from ``rng`` (as ``MDPP.py``)."""
    pool = jnp.asarray(pool)
    P = pool.shape[0]
    cap = int(min(cap, P))
    if cap <= 0:
        return np.zeros(0, np.int64)
    perm = np.asarray(jax.random.permutation(rng, P))
    Pn = _bucket(P)
    Pp = jnp.zeros((Pn, pool.shape[1]), pool.dtype).at[:P].set(pool[perm])
    pmask = jnp.arange(Pn) < P
    piv, count = _pivoted_cholesky(kernel, Pp, pmask, jnp.asarray(eta, pool.dtype),
                                   cap=_bucket(cap + 1, minimum=2))
    piv = np.asarray(piv)[: min(int(count), cap)]
    return perm[piv]


@jax.jit
def _oips_scan(kernel: Kernel, Zbuf: Array, count: Array, X: Array, xmask: Array, rho: Array):
    C = Zbuf.shape[0]

    def step(carry, inp):
        Zb, n = carry
        x, real = inp
        kx = jnp.where(jnp.arange(C) < n, kernel(x[None, :], Zb)[0], -jnp.inf)
        accept = real & (jnp.max(kx) < rho * kernel.diag(x[None, :])[0])
        Zb = jnp.where(accept, Zb.at[n].set(x), Zb)
        return (Zb, n + accept.astype(n.dtype)), accept

    (Zb, n), accepted = jax.lax.scan(step, (Zbuf, count), (X, xmask))
    return Zb, n, accepted


# ------------------------------------------------------------------------------------------
# the policies
# ------------------------------------------------------------------------------------------
class Selection(NamedTuple):
    """What a policy returns: the new inducing inputs, its running target statistics and a
    record of scalars (``m``, ``added``; VIPS also ``bound_old``, ``bound_selected``, ``l_max``,
    ``l_noise``, ``threshold``)."""

    inducing_inputs: Array
    stats: TargetStats
    record: dict


@runtime_checkable
class SelectionPolicy(Protocol):
    """``select(rng, stats, X, y, old, params) -> Selection``; ``init() -> TargetStats``."""

    name: str

    def init(self) -> TargetStats: ...

    def select(self, rng: Array, stats: TargetStats, X: Array, y: Array,
               old: OldPosterior | None, params: GPRegressionParams) -> Selection: ...


def _empty_stats() -> TargetStats:
    z = jnp.zeros((), jnp.float64)
    return TargetStats(z, z, z)


class _Base:
    name = "base"

    def init(self) -> TargetStats:
        return _empty_stats()

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class VIPS(_Base):
    """Vegas Inducing Point Selection (Pescador-Barrios et al. 2024, Sect. 4.3, Algorithm 1).

    Args:
        delta: the fraction of the gap between ``L_max`` and the noise code left (paper's eta;
            0.05 in every experiment).
        first_delta: ``delta`` of the first batch (the offline variant); ``None``: ``delta``.
        lmax_points: ``L_max`` uses ``b = [X; a]`` when ``N < lmax_points``, else
            ``lmax_points - M_a`` random rows of ``X`` (``VIPS.py``: 5000).
        jitter: online selection jitter (``VIPS.py``: 1e-6).
        first_jitter: first-batch (SGPR) selection jitter (``Offline_VIPS.py``: 1e-4).
        incremental: rank-one growth (default) or the from-scratch reference.
    """

    name = "vips"

    def __init__(self, delta: float = 0.05, lmax_points: int = 5000,
                 jitter: float = ONLINE_JITTER, first_jitter: float = FIRST_BATCH_SELECTION_JITTER,
                 incremental: bool = True, first_delta: float | None = None) -> None:
        first_delta = delta if first_delta is None else first_delta
        for name, v in (("delta", delta), ("first_delta", first_delta)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name}: expected a number in [0, 1], received {v}")
        self.delta, self.first_delta = float(delta), float(first_delta)
        self.lmax_points = int(lmax_points)
        self.jitter, self.first_jitter = float(jitter), float(first_jitter)
        self.incremental = bool(incremental)

    def select(self, rng, stats, X, y, old, params) -> Selection:
        X, y = jnp.asarray(X), jnp.asarray(y)
        N = X.shape[0]
        stats = update_target_stats(stats, y)
        if float(stats.count) < 2:
            raise ValueError("y: VIPS needs at least 2 targets in the first batch (the noise code "
                             "uses their sample variance); received 1")
        if not float(stats.M2) > 0:
            raise ValueError("y: every target seen so far is the same value: the VIPS noise "
                             "code (sample variance of the targets) is undefined")
        first = old is None
        jitter = self.first_jitter if first else self.jitter
        terms = prepare_old(old, jitter)
        Ma = 0 if first else int(old.inducing_inputs.shape[0])
        if N < self.lmax_points:
            X_max = X
        else:
            keep = max(self.lmax_points - (0 if first else Ma), 0)
            X_max = X[np.asarray(jax.random.choice(rng, N, (keep,), replace=False))]
        Z_max = X_max if first else jnp.concatenate([X_max, old.inducing_inputs])
        l_max = padded_elbo(params, X, y, Z_max, terms, jitter)[0]
        l_noise = float(noise_code(stats, y))
        delta = self.first_delta if first else self.delta
        gamma = l_max - delta * abs(l_max - l_noise)
        run = greedy_variance_selection if self.incremental else greedy_variance_from_scratch
        res = run(params, X, y, terms, gamma, jitter=jitter, min_new=1 if first else 0)
        new = X[jnp.asarray(res.indices)]
        Z = new if first else jnp.concatenate([old.inducing_inputs, new])
        record = {"m": int(Z.shape[0]), "added": int(res.indices.shape[0]),
                  "bound_old": float(res.bounds[0]) if not first else float("nan"),
                  "bound_selected": float(res.bounds[-1]), "l_max": l_max, "l_noise": l_noise,
                  "threshold": gamma}
        return Selection(Z, stats, record)


class ConditionalVariance(_Base):
    """Greedy variance over ``[a; X]`` stopped by the residual trace (Burt et al. 2020).

    Args:
        eta: stop when ``tr(K - Q) < eta`` (absolute; ``MDPP.py``; UCI configs 0.01).
        max_points: cap on ``M`` (UCI configs: 8000).
    """

    name = "cv"

    def __init__(self, eta: float = 0.01, max_points: int = 8000) -> None:
        if not eta >= 0:
            raise ValueError(f"eta: expected >= 0, received {eta}")
        if int(max_points) < 1:
            raise ValueError(f"max_points: expected >= 1, received {max_points}")
        self.eta, self.max_points = float(eta), int(max_points)

    def select(self, rng, stats, X, y, old, params) -> Selection:
        X = jnp.asarray(X)
        stats = update_target_stats(stats, jnp.asarray(y))
        pool = X if old is None else jnp.concatenate([old.inducing_inputs, X])
        idx = pivoted_cholesky(params.kernel, pool, self.eta, self.max_points, rng)
        Z = pool[jnp.asarray(idx)]
        Ma = 0 if old is None else int(old.inducing_inputs.shape[0])
        return Selection(Z, stats, {"m": int(Z.shape[0]), "added": int(np.sum(idx >= Ma)),
                                    "kept_old": int(np.sum(idx < Ma))})


class OIPS(_Base):
    """Online Inducing Point Selection (Galy-Fajou & Opper 2021; authors' ``OIPS.py``).

    Args:
        rho: accept ``x`` when ``max_z k(x, z) < rho k(x, x)`` (0.8 default; UCI configs 0.96).
        kmin: the first batch starts from ``kmin`` random points of the batch.
    """

    name = "oips"

    def __init__(self, rho: float = 0.8, kmin: int = 10) -> None:
        if not 0.0 < rho < 1.0:
            raise ValueError(f"rho: expected a number in (0, 1), received {rho}")
        self.rho, self.kmin = float(rho), int(kmin)

    def select(self, rng, stats, X, y, old, params) -> Selection:
        X = jnp.asarray(X)
        N, d = X.shape
        stats = update_target_stats(stats, jnp.asarray(y))
        if old is None:
            start = X[np.asarray(jax.random.permutation(rng, N))[: min(self.kmin, N)]]
        else:
            start = old.inducing_inputs
        M0 = int(start.shape[0])
        C = _bucket(M0 + N)
        Zbuf = jnp.zeros((C, d), X.dtype).at[:M0].set(start)
        Xp, _, xm = _pad_data(X, jnp.zeros(N, X.dtype))
        Zb, n, _ = _oips_scan(params.kernel, Zbuf, jnp.asarray(M0, jnp.int32), Xp, xm,
                              jnp.asarray(self.rho, X.dtype))
        Z = Zb[: int(n)]
        return Selection(Z, stats, {"m": int(Z.shape[0]), "added": int(n) - M0})


class FixedM(_Base):
    """``M`` inducing points chosen from ``[a; X]`` afresh each batch.

    Args:
        num_inducing: ``M``.
        method: ``"random"`` (a uniform subset, Bui et al. 2017) or ``"greedy"`` (greedy
            variance with a fixed count, the fixed-M rows of VIPS' Fig. 2a).
    """

    name = "fixed"

    def __init__(self, num_inducing: int = 100, method: str = "random") -> None:
        if int(num_inducing) < 1:
            raise ValueError(f"num_inducing: expected >= 1, received {num_inducing}")
        if method not in ("random", "greedy"):
            raise ValueError(f"method: expected 'random' or 'greedy', received {method!r}")
        self.num_inducing, self.method = int(num_inducing), method

    def select(self, rng, stats, X, y, old, params) -> Selection:
        X = jnp.asarray(X)
        stats = update_target_stats(stats, jnp.asarray(y))
        pool = X if old is None else jnp.concatenate([old.inducing_inputs, X])
        P = pool.shape[0]
        M = min(self.num_inducing, P)
        if self.method == "random":
            idx = np.asarray(jax.random.choice(rng, P, (M,), replace=False))
        else:
            idx = pivoted_cholesky(params.kernel, pool, -1.0, M, rng)
        Z = pool[jnp.asarray(idx)]
        return Selection(Z, stats, {"m": int(Z.shape[0])})


# ------------------------------------------------------------------------------------------
# hyperparameter fit and the one-pass engine
# ------------------------------------------------------------------------------------------
def kernel_bounds(kernel: Kernel, variance_bounds: tuple[float, float] = (1e-6, 2e3)
                  ) -> tuple[Kernel, Kernel]:
    """Lower / upper bound pytrees for a kernel: every leaf named ``variance`` in
    ``variance_bounds`` (the authors' sigmoid transform on the SE variance), others free."""

    def walk(k, which):
        children, aux = k.tree_flatten()
        out = []
        for name, c in zip(k._fields, children):
            if isinstance(c, Kernel):
                out.append(walk(c, which))
            elif name == "variance":
                out.append(variance_bounds[which])
            else:
                out.append(0.0 if which == 0 else float("inf"))
        return type(k).tree_unflatten(aux, out)

    return walk(kernel, 0), walk(kernel, 1)


def _negative_elbo(params, Xp, yp, xm, Zp, zm, terms, jitter):
    return -online_elbo(params, Xp, yp, Zp, terms, jitter=jitter, z_mask=zm, x_mask=xm)


def fit_hyperparameters(params: GPRegressionParams, X: Array, y: Array, Z: Array,
                        old: OldTerms | None, *, jitter: float = ONLINE_JITTER,
                        variance_bounds: tuple[float, float] = (1e-6, 2e3),
                        min_noise_variance: float = 1e-6, max_iterations: int = 1000,
                        tolerance: float = 2.220446049250313e-09,
                        gradient_tolerance: float = 1e-5):
    """Maximize ``F`` over kernel + noise with ``Z`` fixed: L-BFGS-B in log space
    (:func:`inference.type2ml.fit_type2ml`; SciPy's default tolerances, as GPflow's ``Scipy``).
    ``old`` from :func:`prepare_old`; arrays are padded to size buckets, so a stream of batches
    compiles the objective once per bucket.
    """
    lo_k, hi_k = kernel_bounds(params.kernel, variance_bounds)
    lower = GPRegressionParams(lo_k, min_noise_variance)
    upper = GPRegressionParams(hi_k, float("inf"))
    Xp, yp, xm = _pad_data(jnp.asarray(X), jnp.asarray(y))
    Zp, zm = _pad_inducing(jnp.asarray(Z))
    return fit_type2ml(_negative_elbo, params, lower_bounds=lower, upper_bounds=upper,
                       max_iterations=max_iterations, tolerance=tolerance,
                       gradient_tolerance=gradient_tolerance,
                       data=(Xp, yp, xm, Zp, zm, old, jnp.asarray(jitter)))


@jax.jit
def _summary(params, Xp, yp, xm, Zp, zm, terms, jitter):
    """F, q(u_b) and K_bb at the fitted hyperparameters, padded."""
    F = online_elbo(params, Xp, yp, Zp, terms, jitter=jitter, z_mask=zm, x_mask=xm)
    m, S = optimal_inducing_posterior(params, Xp, yp, Zp, terms, jitter=jitter, z_mask=zm,
                                      x_mask=xm)
    return F, m, S, params.kernel(Zp)


class OnlineSGPRState(NamedTuple):
    """The continual state: ``q(u_b) = N(q_mean, q_cov)`` at ``inducing_inputs``, ``K_bb`` at the
    fitted hyperparameters (the next batch's ``K'_aa``), the hyperparameters, the policy's
    running target statistics and the number of batches seen. ``M = 0`` before any batch."""

    inducing_inputs: Array
    q_mean: Array
    q_cov: Array
    prior_cov: Array
    params: GPRegressionParams
    stats: TargetStats
    num_batches: Array


class OnlineSGPRInfo(NamedTuple):
    """Per batch: ``m``; ``bound`` (F after the fit); ``bound_selected`` (F at selection, with the
    previous hyperparameters); ``l_max``, ``l_noise``, ``threshold`` (VIPS, NaN otherwise);
    ``iterations`` of L-BFGS; ``select_seconds``, ``fit_seconds``."""

    m: Array
    added: Array
    bound: Array
    bound_selected: Array
    l_max: Array
    l_noise: Array
    threshold: Array
    iterations: Array
    select_seconds: Array
    fit_seconds: Array


class OnlineSGPREngine:
    """One-pass engine of the streaming sparse GP: ``init(params, input_dim)``,
    ``step(rng, state, (X, y)) -> (state, info)`` (see the module docstring).

    Args:
        policy: a :class:`SelectionPolicy`.
        jitter: of the online bound (fit and summaries; GPflow 1e-6).
        summary_jitter: added to ``S_b`` when it becomes the next ``q_old`` (``utils_uci.py``).
        fit: fit kernel + noise after selection (``False`` keeps them fixed).
        variance_bounds, min_noise_variance, max_iterations: of the L-BFGS fit.
    """

    def __init__(self, policy: SelectionPolicy, *, jitter: float = ONLINE_JITTER,
                 summary_jitter: float = 1e-6, fit: bool = True,
                 variance_bounds: tuple[float, float] = (1e-6, 2e3),
                 min_noise_variance: float = 1e-6, max_iterations: int = 1000) -> None:
        if not isinstance(policy, SelectionPolicy):
            raise TypeError(f"policy: expected a SelectionPolicy, received {type(policy).__name__}")
        self.policy = policy
        self.jitter, self.summary_jitter = float(jitter), float(summary_jitter)
        self.fit = bool(fit)
        self.variance_bounds = tuple(float(v) for v in variance_bounds)
        self.min_noise_variance, self.max_iterations = float(min_noise_variance), int(max_iterations)

    def init(self, params: GPRegressionParams, input_dim: int) -> OnlineSGPRState:
        e = jnp.zeros((0,), jnp.float64)
        return OnlineSGPRState(jnp.zeros((0, input_dim), jnp.float64), e,
                               jnp.zeros((0, 0), jnp.float64), jnp.zeros((0, 0), jnp.float64),
                               params, self.policy.init(), jnp.asarray(0, jnp.int32))

    @staticmethod
    def old_posterior(state: OnlineSGPRState) -> OldPosterior | None:
        if int(state.num_batches) == 0:
            return None
        return OldPosterior(state.inducing_inputs, state.q_mean, state.q_cov, state.prior_cov)

    def step(self, rng: Array, state: OnlineSGPRState, batch: tuple[Array, Array]
             ) -> tuple[OnlineSGPRState, OnlineSGPRInfo]:
        X, y = (jnp.asarray(batch[0], jnp.float64), jnp.asarray(batch[1], jnp.float64))
        old = self.old_posterior(state)
        if old is not None:
            old = old._replace(covariance=old.covariance
                               + self.summary_jitter * jnp.eye(old.mean.shape[0]))
        t0 = time.perf_counter()
        sel = self.policy.select(rng, state.stats, X, y, old, state.params)
        Z = sel.inducing_inputs
        t1 = time.perf_counter()
        terms = prepare_old(old, self.jitter)
        params, iters = state.params, 0
        if self.fit:
            res = fit_hyperparameters(state.params, X, y, Z, terms, jitter=self.jitter,
                                      variance_bounds=self.variance_bounds,
                                      min_noise_variance=self.min_noise_variance,
                                      max_iterations=self.max_iterations)
            params, iters = res.params, res.num_iterations
        Xp, yp, xm = _pad_data(X, y)
        Zp, zm = _pad_inducing(Z)
        M = Z.shape[0]
        bound, q_mean, q_cov, prior_cov = _summary(params, Xp, yp, xm, Zp, zm, terms,
                                                   jnp.asarray(self.jitter))
        bound = float(bound)
        if not np.isfinite(bound):
            raise FloatingPointError(f"online bound is {bound} after the fit (M = {M})")
        q_mean, q_cov, prior_cov = q_mean[:M], q_cov[:M, :M], prior_cov[:M, :M]
        t2 = time.perf_counter()
        rec = sel.record
        nan = float("nan")
        info = OnlineSGPRInfo(
            m=jnp.asarray(Z.shape[0]), added=jnp.asarray(rec.get("added", -1)),
            bound=jnp.asarray(bound), bound_selected=jnp.asarray(rec.get("bound_selected", nan)),
            l_max=jnp.asarray(rec.get("l_max", nan)), l_noise=jnp.asarray(rec.get("l_noise", nan)),
            threshold=jnp.asarray(rec.get("threshold", nan)), iterations=jnp.asarray(iters),
            select_seconds=jnp.asarray(t1 - t0), fit_seconds=jnp.asarray(t2 - t1))
        new = OnlineSGPRState(Z, q_mean, q_cov, prior_cov, params, sel.stats,
                              state.num_batches + 1)
        return new, info
