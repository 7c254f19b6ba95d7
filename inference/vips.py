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
* :class:`OIPS` -- add ``x`` when ``max_z k(x, z) < rho k(x, x)`` (Galy-Fajou & Opper 2021),
  ``k`` the kernel's stationary part.
* :class:`FixedM` -- ``M`` points: a uniform subset of ``[a; X]``, greedy variance over ``[a; X]``
  (the fixed-M rows of Fig. 2a), or 70 % old / 30 % new points at random (the reference's
  fixed-memory baseline after Bui et al. 2017).

Greedy selection never refactorizes: :func:`greedy_variance_selection` grows ``chol(K_bb)``,
``L_b^-1 K_bf``, ``L_b^-1 K_ba``, ``chol(D)`` and ``L_D^-1 L_b^-1 c`` by one bordered row per
added point, so adding ``m`` points to a batch of ``N`` costs ``O((N + M)(M_a + m) m)`` after one
``O(N M_a^2 + M_a^3)`` factorization at ``b = a`` -- instead of ``m`` full bound evaluations
(:func:`greedy_variance_from_scratch`, what the authors' code does; kept as the reference the
incremental one is tested against). The loop is one ``lax.while_loop`` over buffers whose sizes
come from one ladder of buckets (old and new inducing points share one size), so that a stream
of batches compiles each function once per bucket its ``M`` passes through.

:class:`OnlineSGPREngine` (``init`` / ``step``) is the one-pass engine of a stream: select with
the previous hyperparameters, freeze ``b``, fit kernel and noise by L-BFGS-B on ``F`` (the
authors' protocol, in GPflow's parametrization: kernel variance through a sigmoid onto
[1e-6, 2e3], noise through softplus + 1e-6), then pass on ``q(u_b)`` (+1e-6 I) and ``K_bb`` at
the fitted hyperparameters as the next old summary, with its old terms already factorized.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.scipy.linalg import solve_triangular

from inference.type2ml import fit_type2ml
from models.exact_gp import GPRegressionParams
from models.kernels_jax import Kernel
from models.online_sgpr import (FIRST_BATCH_SELECTION_JITTER, ONLINE_JITTER, OldPosterior,
                                OldTerms, bound_constant, bound_pieces, elbo_from_pieces,
                                old_terms, online_elbo, online_elbo_and_residual,
                                predictive_from_pieces)

__all__ = ["TargetStats", "update_target_stats", "noise_code", "prepare_old", "padded_elbo",
           "bound_value", "empty_old_terms", "pad_terms", "SelectionPivotError", "oips_kernel",
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
    """Running count, mean and sum of squared deviations ``M2`` of every target seen so far
    (float64 scalars, kept on the host)."""

    count: Array
    mean: Array
    M2: Array


def update_target_stats(stats: TargetStats, y: Array) -> TargetStats:
    """Merge batch ``y (N,)`` into ``stats`` (Chan et al.'s parallel update, as ``VIPS.py``)."""
    y = np.asarray(y, np.float64)
    count0, mean0, M20 = (np.float64(v) for v in stats)
    n_new = y.shape[0]
    mu_new = np.mean(y)
    count = count0 + n_new
    delta = mu_new - mean0
    mean = mean0 + delta * n_new / count
    M2 = M20 + np.sum((y - mu_new) ** 2) + count0 * n_new * delta ** 2 / count
    return TargetStats(count, mean, M2)


def noise_code(stats: TargetStats, y: Array) -> float:
    """``L_noise`` of eq. 21: ``log prod_i N(y_i | ybar, s_y^2)`` with the running mean and the
    running sample variance (``M2 / (count - 1)``) of all targets so far, batch included."""
    y = np.asarray(y, np.float64)
    var = np.float64(stats.M2) / (np.float64(stats.count) - 1)
    N = y.shape[0]
    return float(-0.5 * N * np.log(2.0 * np.pi * var)
                 - 0.5 * np.sum((y - np.float64(stats.mean)) ** 2) / var)


# ------------------------------------------------------------------------------------------
# buffers: one ladder of sizes, padded on the host
# ------------------------------------------------------------------------------------------
MIN_BUCKET = 64
"""The smallest buffer of the ladder. Every rung a stream passes through compiles the update's
functions once (seconds on one CPU core, against milliseconds for a warm update of a few dozen
points), so the ladder starts where padding begins to cost: a floor of 32 adds one compilation
to a stream for nothing measurable, while floors of 128 or 256 make the warm updates of small
sets slower (``benchmarks/vips.py`` on naval)."""


def bucket(n: int, minimum: int | None = None) -> int:
    """Buffer size for ``n`` rows (at least ``minimum``, default :data:`MIN_BUCKET`): the next
    power of two up to 256, then the smallest
    ``2^k * {1, 1.25, 1.5, 1.75}`` >= ``n`` (few distinct shapes, so few compilations; at most
    25 % padding where the cubic cost matters).

    Every buffer of the inducing set (the old points ``a``, the new set ``b``, the greedy
    selection's capacity, Conditional Variance's pivots) takes its size from this one ladder,
    and within one jitted call ``a`` and ``b`` share one size: a compiled function is keyed by
    the batch's bucket and one inducing-set bucket, so a stream compiles it once per rung of
    the ladder that its ``M`` passes through."""
    n = max(int(n), MIN_BUCKET if minimum is None else minimum)
    k = max(int(math.floor(math.log2(n))), 0)
    if n <= 256:
        return n if n == 2 ** k else 2 ** (k + 1)
    for f in (1.0, 1.25, 1.5, 1.75, 2.0):
        size = int(math.ceil(f * 2 ** k))
        if size >= n:
            return size
    return 2 ** (k + 1)  # pragma: no cover


def pad_rows(A, n: int) -> np.ndarray:
    """``A`` zero-padded along its leading axis to ``n`` rows (on the host: padding with JAX
    operations outside ``jit`` would compile a small program per shape)."""
    A = np.asarray(A)
    out = np.zeros((n,) + A.shape[1:], A.dtype)
    out[: A.shape[0]] = A
    return out


def _pad_data(X: Array, y: Array):
    """``(X, y)`` zero-padded to a size bucket, with the mask of real rows."""
    N = X.shape[0]
    n = bucket(N)
    return (jnp.asarray(pad_rows(X, n)), jnp.asarray(pad_rows(y, n)),
            jnp.asarray(np.arange(n) < N))


def _pad_inducing(Z: Array, size: int | None = None):
    """``Z`` padded to ``size`` rows (default: its bucket), with the mask of real rows."""
    M = Z.shape[0]
    n = bucket(M) if size is None else int(size)
    return jnp.asarray(pad_rows(Z, n)), jnp.asarray(np.arange(n) < M)


def _pad_old(old: OldPosterior, size: int) -> tuple[OldPosterior, np.ndarray]:
    """The old summary padded to ``size``: zero mean, identity blocks of S_a and K'_aa."""
    a, m, S, Kp = (np.asarray(v) for v in old)
    Ma = a.shape[0]

    def pad_cov(C):
        out = np.eye(size, dtype=C.dtype)
        out[:Ma, :Ma] = C
        return out

    return OldPosterior(pad_rows(a, size), pad_rows(m, size), pad_cov(S), pad_cov(Kp)), \
        np.arange(size) < Ma


def empty_old_terms(input_dim: int, size: int) -> OldTerms:
    """Old terms of no old point at all (every row padded): with them the online bound is the
    first batch's SGPR bound exactly (every old-point term is 0), so the first batch runs the
    same compiled functions as the later ones."""
    return OldTerms(jnp.zeros((size, input_dim)), jnp.zeros(size), jnp.zeros((size, size)),
                    jnp.zeros(()), jnp.zeros(size, bool))


def pad_terms(terms: OldTerms, size: int) -> OldTerms:
    """``terms`` padded to ``size`` rows (zero ``a``, ``w``, ``A`` rows and columns; masked)."""
    n = terms.a.shape[0]
    if n == size:
        return terms
    if n > size:
        raise ValueError(f"size: the old terms already hold {n} rows, more than {size}")
    A = np.zeros((size, size))
    A[:n, :n] = np.asarray(terms.A)
    mask = np.zeros(size, bool)
    mask[:n] = True if terms.mask is None else np.asarray(terms.mask)
    return OldTerms(jnp.asarray(pad_rows(terms.a, size)), jnp.asarray(pad_rows(terms.w, size)),
                    jnp.asarray(A), terms.const, jnp.asarray(mask))


def _terms_at(terms: OldTerms | None, input_dim: int, size: int) -> OldTerms:
    return empty_old_terms(input_dim, size) if terms is None else pad_terms(terms, size)


_old_terms_jit = jax.jit(old_terms)


def prepare_old(old: OldPosterior | None, jitter: float, size: int | None = None
                ) -> OldTerms | None:
    """:func:`models.online_sgpr.old_terms` of the old summary, padded to ``size`` rows
    (default: the bucket of ``M_a``); ``None`` stays ``None``. It factorizes ``S_a`` and
    ``K'_aa``: the engine does it once per batch (its summary of the previous batch already
    holds them) and passes the result on."""
    if old is None:
        return None
    Ma = old.inducing_inputs.shape[0]
    n = bucket(Ma) if size is None else max(int(size), bucket(Ma))
    padded, mask = _pad_old(old, n)
    return _old_terms_jit(OldPosterior(*(jnp.asarray(v) for v in padded)),
                          jitter=jnp.asarray(jitter), mask=jnp.asarray(mask))


def _old_size(terms: OldTerms | None) -> int:
    if terms is None:
        return 0
    return terms.a.shape[0] if terms.mask is None else int(np.sum(np.asarray(terms.mask)))


def _joint_size(M: int, terms: OldTerms | None) -> int:
    """One buffer size for ``b`` (``M`` rows) and the old terms."""
    return max(bucket(M), 0 if terms is None else terms.a.shape[0])


@jax.jit
def _elbo_resid_padded(params, Xp, yp, xm, Zp, zm, terms, jitter):
    return online_elbo_and_residual(params, Xp, yp, Zp, terms, jitter=jitter, z_mask=zm,
                                    x_mask=xm)


def padded_elbo(params: GPRegressionParams, X: Array, y: Array, Z: Array,
                terms: OldTerms | None, jitter: float) -> tuple[float, np.ndarray]:
    """``(F, residual)`` of :func:`models.online_sgpr.online_elbo_and_residual`, evaluated on
    arrays padded to size buckets (``Z`` and the old terms to one size; one compilation per
    bucket, not per shape); ``terms`` from :func:`prepare_old` (``None``: first batch)."""
    Xp, yp, xm = _pad_data(X, y)
    size = _joint_size(Z.shape[0], terms)
    Zp, zm = _pad_inducing(Z, size)
    F, r = _elbo_resid_padded(params, Xp, yp, xm, Zp, zm, _terms_at(terms, X.shape[1], size),
                              jnp.asarray(jitter))
    return float(F), np.asarray(r)[: X.shape[0]]


def bound_value(params: GPRegressionParams, X: Array, y: Array, Z: Array,
                terms: OldTerms | None, jitter: float) -> float:
    """``F`` at ``Z``, the negative bound of the hyperparameter fit on the same padded layout as
    :func:`fit_hyperparameters`, compiled without its gradient: ``L_max`` sits at ``Z = [X; a]``,
    a size the fits of ``M`` inducing points rarely reach, and the value alone compiles in
    about half the time (naval: 0.8 s against 1.5-2.1 s per size)."""
    Xp, yp, xm = _pad_data(X, y)
    size = _joint_size(Z.shape[0], terms)
    Zp, zm = _pad_inducing(Z, size)
    v = _negative_elbo_value(params, Xp, yp, xm, Zp, zm, _terms_at(terms, X.shape[1], size),
                             jnp.asarray(jitter), jnp.asarray(jitter))
    return -float(v)


# ------------------------------------------------------------------------------------------
# incremental greedy-variance selection with the bound grown by rank-one updates
# ------------------------------------------------------------------------------------------
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


class SelectionPivotError(FloatingPointError):
    """A bordered Cholesky pivot of the greedy selection was not positive (or not finite): the
    bound's factorization lost positive definiteness at that addition."""


class _GreedyState(NamedTuple):
    L: Array        # chol(K_bb + jI) in the leading m x m block, identity elsewhere (C, C)
    LD: Array       # chol(D), same layout (C, C)
    Pf: Array       # L^-1 K_bf, rows >= m zero (C, Np)
    Pa: Array       # L^-1 K_ba, rows >= m zero (C, C)
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
    bad: Array      # a pivot was not positive: stopped before that addition


@jax.jit
def _greedy_loop(state: _GreedyState, kernel: Kernel, s2: Array, Xp: Array, yp: Array,
                 fmask: Array, ap: Array, amask: Array, A: Array, w: Array, base: Array,
                 threshold: Array, min_new: Array, max_new: Array, jitter: Array):
    """Append argmax-residual points while ``F < threshold`` (or ``k < min_new``), ``k < max_new``
    and the buffer has room (``m < C``); stops, flagging ``bad``, before a non-positive pivot."""
    C = state.L.shape[0]
    idx_C = jnp.arange(C)

    def cond(st: _GreedyState):
        return (((st.F < threshold) | (st.k < min_new)) & (st.k < max_new) & (st.m < C)
                & ~st.bad)

    def body(st: _GreedyState) -> _GreedyState:
        score = jnp.where(st.chosen | ~fmask, -jnp.inf, st.resid)
        i = jnp.argmax(score)
        x = Xp[i][None, :]
        bmask = idx_C < st.m
        kb = jnp.where(bmask, kernel(st.B, x)[:, 0], 0.0)
        l = solve_triangular(st.L, kb, lower=True)
        dL2 = kernel.diag(x)[0] + jitter - jnp.dot(l, l)
        dL = jnp.sqrt(dL2)
        kf = jnp.where(fmask, kernel(x, Xp)[0], 0.0)
        pf = (kf - l @ st.Pf) / dL
        ka = jnp.where(amask, kernel(x, ap)[0], 0.0)
        pa = (ka - l @ st.Pa) / dL
        paA = pa @ A
        Dcol = st.Pf @ pf / s2 + st.Pa @ paA
        Dnn = 1.0 + jnp.dot(pf, pf) / s2 + jnp.dot(paA, pa) + jitter
        lD = solve_triangular(st.LD, jnp.where(bmask, Dcol, 0.0), lower=True)
        dD2 = Dnn - jnp.dot(lD, lD)
        dD = jnp.sqrt(dD2)
        ctn = jnp.dot(pf, yp) / s2 + jnp.dot(pa, w)
        vn = (ctn - jnp.dot(lD, st.v)) / dD
        bad = ~((dL2 > 0) & (dD2 > 0) & jnp.isfinite(vn))   # NaN-safe: NaN is not > 0
        m = st.m
        sum_v2 = st.sum_v2 + vn * vn
        logdet = st.logdet + jnp.log(dD)
        trQ = st.trQ + jnp.dot(pf, pf)
        sA = st.sA + jnp.dot(paA, pa)
        F = base + 0.5 * sum_v2 - logdet + 0.5 * trQ / s2 + 0.5 * sA
        keep = lambda new, old: jnp.where(bad, old, new)  # noqa: E731  (scalars only)
        # on a bad pivot the rows written at index m lie beyond the factor (m is not advanced)
        return _GreedyState(
            L=st.L.at[m].set(l.at[m].set(dL)), LD=st.LD.at[m].set(lD.at[m].set(dD)),
            Pf=st.Pf.at[m].set(pf), Pa=st.Pa.at[m].set(pa), v=st.v.at[m].set(vn),
            B=st.B.at[m].set(x[0]), resid=jnp.where(bad, st.resid, st.resid - pf * pf),
            chosen=st.chosen.at[i].set(~bad),
            order=st.order.at[st.k].set(jnp.where(bad, st.order[st.k], i).astype(st.order.dtype)),
            hist=st.hist.at[st.k + 1].set(keep(F, st.hist[st.k + 1])), m=keep(m + 1, m),
            k=keep(st.k + 1, st.k), F=keep(F, st.F), sum_v2=keep(sum_v2, st.sum_v2),
            logdet=keep(logdet, st.logdet), trQ=keep(trQ, st.trQ), sA=keep(sA, st.sA), bad=bad)

    return jax.lax.while_loop(cond, body, state)


@jax.jit
def _factor(params: GPRegressionParams, Xp: Array, yp: Array, xm: Array, Zp: Array, zm: Array,
            old: OldTerms, jitter: Array, d_jitter: Array, summary_jitter: Array):
    """One factorization of the bound at ``Z`` (padded; ``Z`` and the old terms of one size),
    and what the stream needs of it: the greedy loop's starting state (called with ``Z`` = the
    old points, or none) and a batch's summary (called with the selected set at the fitted
    hyperparameters): ``F``, ``q(u_b) = N(m, S)``, ``K_bb`` and the old terms of the summary the
    next batch conditions on (``S + summary_jitter I`` and ``K_bb``), so the next batch
    factorizes nothing of its old points again. One program serves both uses, so it compiles
    once per bucket."""
    p = bound_pieces(params, Xp, yp, Zp, old, jitter, zm, xm, d_jitter)
    base = bound_constant(params, Xp, yp, old, jitter=jitter, x_mask=xm)
    s2 = params.noise_variance
    sA = jnp.sum((p.P_a @ old.A) * p.P_a)
    sum_v2 = jnp.dot(p.v, p.v)
    logdet = jnp.sum(jnp.log(jnp.diagonal(p.L_D)))
    trQ = jnp.sum(p.P_f * p.P_f)
    F0 = base + 0.5 * sum_v2 - logdet + 0.5 * trQ / s2 + 0.5 * sA
    Np = Xp.shape[0]
    state = _GreedyState(p.L_b, p.L_D, p.P_f, p.P_a, p.v, Zp, p.resid, jnp.zeros(Np, bool),
                         jnp.zeros(Np, jnp.int32), jnp.zeros(Np + 1, Xp.dtype).at[0].set(F0),
                         jnp.sum(zm).astype(jnp.int32), jnp.asarray(0, jnp.int32), F0,
                         sum_v2, logdet, trQ, sA, jnp.asarray(False))
    F = elbo_from_pieces(params, Xp, yp, p, old, xm)
    m, S = predictive_from_pieces(params, Zp, p, Zp, True, zm, zm)
    both = zm[:, None] & zm[None, :]
    Kbb = jnp.where(both, params.kernel(Zp), 0.0)
    pad_eye = jnp.diag(jnp.where(zm, 0.0, 1.0))
    S_next = S + jnp.diag(jnp.where(zm, summary_jitter, 0.0)) + pad_eye
    nxt = old_terms(OldPosterior(Zp, m, S_next, Kbb + pad_eye), jitter=jitter, mask=zm)
    return base, state, (F, m, S, Kbb, nxt)


def _start(params: GPRegressionParams, Xp: Array, yp: Array, xm: Array, old: OldTerms,
           jitter: Array):
    """Factors of the bound at ``b = a`` (the old inducing inputs; none: every row masked) on
    padded arrays, ``b`` and the old terms of one size: the starting state of the loop."""
    base, state, _ = _factor(params, Xp, yp, xm, old.a, old.mask, old, jitter, jitter,
                             jnp.zeros_like(jitter))
    return base, state


def _grow(state: _GreedyState, size: int) -> _GreedyState:
    """The loop's buffers re-padded (on the host) from ``C`` to ``size`` rows."""
    C = state.L.shape[0]

    def square(M, diag):
        out = np.eye(size) * diag
        out[:C, :C] = np.asarray(M)
        return jnp.asarray(out)

    Pa = np.zeros((size, size))
    Pa[:C, :C] = np.asarray(state.Pa)
    return state._replace(L=square(state.L, 1.0), LD=square(state.LD, 1.0),
                          Pf=jnp.asarray(pad_rows(state.Pf, size)), Pa=jnp.asarray(Pa),
                          v=jnp.asarray(pad_rows(state.v, size)),
                          B=jnp.asarray(pad_rows(state.B, size)))


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
    The buffers start at the bucket of ``M_a + 1`` rows and move to the next bucket when full.

    Args:
        params: kernel and noise variance (VIPS: the previous batch's).
        X: batch ``(N, d)``; y: ``(N,)``.
        old: the padded old terms of :func:`prepare_old`, ``None`` for the first batch.
        threshold: stop once ``F >= threshold``.
        jitter: on ``K_bb``, ``K_aa`` and ``D``, as in :func:`models.online_sgpr.online_elbo`
            (must be > 0 so that a duplicate input never zeroes a pivot).

    Returns:
        :class:`GreedyResult`; ``bounds[-1]`` equals ``online_elbo`` at ``[a; X[indices]]``.

    Raises:
        SelectionPivotError: a pivot of the bordered factors was not positive (the kernel
            matrix or ``D`` is not numerically positive definite at that addition).
    """
    if not jitter > 0:
        raise ValueError(f"jitter: expected > 0 (duplicate inputs would give a zero pivot), "
                         f"received {jitter}")
    X = jnp.asarray(X)
    y = jnp.asarray(y)
    N, d = X.shape
    max_new = N if max_new is None else min(int(max_new), N)
    Ma = _old_size(old)
    C = max(bucket(Ma + 1), 0 if old is None else old.a.shape[0])
    terms = _terms_at(old, d, C)
    Xp, yp, fmask = _pad_data(X, y)
    jit = jnp.asarray(jitter)
    base, state = _start(params, Xp, yp, fmask, terms, jit)
    args = (jnp.asarray(threshold, X.dtype), jnp.asarray(min_new, jnp.int32),
            jnp.asarray(max_new, jnp.int32), jit)
    while True:
        state = _greedy_loop(state, params.kernel, params.noise_variance, Xp, yp, fmask,
                             terms.a, terms.mask, terms.A, terms.w, base, *args)
        k, m = int(state.k), int(state.m)
        if bool(state.bad):
            score = np.where(np.asarray(state.chosen) | ~np.asarray(fmask), -np.inf,
                             np.asarray(state.resid))
            raise SelectionPivotError(
                f"greedy selection: the pivot of addition {k + 1} (batch row "
                f"{int(np.argmax(score))}, M = {m}) is not positive: K_bb or D is not "
                f"numerically positive definite "
                f"(kernel {params.kernel}, noise {float(params.noise_variance)}, jitter "
                f"{jitter}); a larger jitter or other hyperparameters are needed")
        more = (float(state.F) < threshold or k < min_new) and k < max_new
        if not more:
            break
        C = bucket(C + 1)                      # the buffer is full: the next rung
        state = _grow(state, C)
        terms = pad_terms(terms, C)
    return GreedyResult(np.asarray(state.order)[:k], np.asarray(state.hist)[:k + 1],
                        np.asarray(state.resid)[:N])


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
    Ma = _old_size(old)
    a = None if old is None else np.asarray(old.a)[:Ma]
    chosen: list[int] = []
    if a is None:
        Xp, yp, xm = _pad_data(X, y)
        size = bucket(1)
        F = float(_start(params, Xp, yp, xm, empty_old_terms(X.shape[1], size),
                         jnp.asarray(jitter))[0])
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
class _PivotState(NamedTuple):
    m: Array        # pivots done
    di: Array       # residual diagonal (n,)
    rows: Array     # (R, n): row r of the partial factor, r < m
    piv: Array      # (R + 1,) pivots, piv[m] the next one
    done: Array     # the residual trace fell below eta


_kernel_diag = jax.jit(lambda kernel, X: kernel.diag(X))


@jax.jit
def _pivoted_cholesky(kernel: Kernel, Pp: Array, pmask: Array, eta: Array, cap: Array,
                      state: _PivotState) -> _PivotState:
    """Greedy pivots of ``k(Pp, Pp)`` (+1e-6 on the diagonal) as the authors' ``MDPP.py``, from
    ``state`` until the trace is below ``eta``, ``cap - 1`` rows are done (``MDPP.py``'s loop over
    ``range(M - 1)``: the ``cap``-th pivot is chosen, not factored), or the ``R`` rows are full."""
    R = state.rows.shape[0]

    def cond(c: _PivotState):
        return (~c.done) & (c.m < jnp.minimum(cap, R + 1) - 1)

    def body(c: _PivotState) -> _PivotState:
        j = c.piv[c.m]
        dj = jnp.sqrt(c.di[j])
        col = jnp.where(pmask, kernel(Pp, Pp[j][None, :])[:, 0], 0.0)
        col = col.at[j].add(1e-6)
        e = (col - c.rows[:, j] @ c.rows) / dj
        rows = c.rows.at[c.m].set(jnp.where(pmask, e, 0.0))
        di = jnp.where(pmask, jnp.maximum(c.di - e * e, 0.0), -jnp.inf)
        piv = c.piv.at[c.m + 1].set(jnp.argmax(di).astype(jnp.int32))
        trace = jnp.sum(jnp.where(pmask, di, 0.0))
        return _PivotState(c.m + 1, di, rows, piv, trace < eta)

    return jax.lax.while_loop(cond, body, state)


def pivoted_cholesky(kernel: Kernel, pool: Array, eta: float, cap: int, rng: Array
                     ) -> np.ndarray:
    """Indices into ``pool (P, d)`` chosen by greedy variance (partial pivoted Cholesky of
    ``k(pool, pool) + 1e-6 I``), stopped when the residual trace ``< eta`` (keeping the pivots
    before the one after which it fell), at most ``cap``. Ties are broken by a random
    permutation of the pool drawn from ``rng`` (as ``MDPP.py``).

    The factor's rows live in a buffer of a size bucket that moves to the next bucket when
    full (starting at the bucket of 65 rows), so each pivot costs ``O(P m)``, not
    ``O(P cap)``."""
    pool = np.asarray(pool)
    P = pool.shape[0]
    cap = int(min(cap, P))
    if cap <= 0:
        return np.zeros(0, np.int64)
    perm = np.asarray(jax.random.permutation(rng, P))
    Pn = bucket(P)
    Pp = jnp.asarray(pad_rows(pool[perm], Pn))
    pmask_np = np.arange(Pn) < P
    pmask = jnp.asarray(pmask_np)
    di0 = np.where(pmask_np, np.asarray(_kernel_diag(kernel, Pp)) + 1e-6, -np.inf)
    R = min(bucket(min(cap, 64) + 1, minimum=2), bucket(cap + 1, minimum=2))
    piv0 = np.zeros(R + 1, np.int32)
    piv0[0] = int(np.argmax(di0))
    state = _PivotState(jnp.asarray(0, jnp.int32), jnp.asarray(di0), jnp.zeros((R, Pn)),
                        jnp.asarray(piv0), jnp.asarray(False))
    eta_j, cap_j = jnp.asarray(eta, jnp.float64), jnp.asarray(cap, jnp.int32)
    while True:
        state = _pivoted_cholesky(kernel, Pp, pmask, eta_j, cap_j, state)
        m = int(state.m)
        if bool(state.done) or m >= cap - 1:
            break
        R2 = bucket(R + 1, minimum=2)        # the buffer is full: the next rung
        piv = np.zeros(R2 + 1, np.int32)
        piv[: R + 1] = np.asarray(state.piv)
        state = state._replace(rows=jnp.asarray(pad_rows(state.rows, R2)),
                               piv=jnp.asarray(piv))
        R = R2
    # stopped at pivot m - 1 (0-based): keep the pivots before it, as MDPP.py (indices[:m])
    count = m - 1 if bool(state.done) else cap
    piv = np.asarray(state.piv)[: min(count, cap)]
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


def oips_kernel(kernel: Kernel) -> Kernel:
    """The kernel OIPS' acceptance rule compares with: a sum with a constant part is judged by
    its other (stationary) part, as the authors' ``OIPS.py`` (``kernel.kernels[1]`` of the
    magnetic kernel constant + Matern 5/2): the constant adds the same amount to every
    ``k(x, z)`` and to ``k(x, x)``, so with it ``max_z k(x, z) < rho k(x, x)`` never holds for a
    large constant and no point would ever be accepted."""
    from models.kernels_jax import Constant, Sum

    if isinstance(kernel, Sum):
        parts = [k for k in (kernel.k1, kernel.k2) if not isinstance(k, Constant)]
        if len(parts) == 1:
            return oips_kernel(parts[0])
    return kernel


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
    """``select(rng, stats, X, y, old, params, terms=None) -> Selection``;
    ``init() -> TargetStats``. ``terms``: optionally the old summary's
    :func:`prepare_old` terms as ``(terms, jitter)``, already computed by the caller."""

    name: str

    def init(self) -> TargetStats: ...

    def select(self, rng: Array, stats: TargetStats, X: Array, y: Array,
               old: OldPosterior | None, params: GPRegressionParams,
               terms: tuple[OldTerms, float] | None = None) -> Selection: ...


def _empty_stats() -> TargetStats:
    z = np.float64(0.0)
    return TargetStats(z, z, z)


def _old_inputs(old: OldPosterior | None, d: int) -> np.ndarray:
    return np.zeros((0, d)) if old is None else np.asarray(old.inducing_inputs, np.float64)


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

    def select(self, rng, stats, X, y, old, params, terms=None) -> Selection:
        X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
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
        if first:
            old_t = None
        elif terms is not None and terms[1] == jitter:
            old_t = terms[0]                       # factorized once, by the caller
        else:
            old_t = prepare_old(old, jitter)
        a = _old_inputs(old, X.shape[1])
        Ma = a.shape[0]
        if N < self.lmax_points:
            X_max = X
        else:
            keep = max(self.lmax_points - Ma, 0)
            X_max = X[np.asarray(jax.random.choice(rng, N, (keep,), replace=False))]
        l_max = bound_value(params, X, y, np.concatenate([X_max, a]), old_t, jitter)
        l_noise = noise_code(stats, y)
        delta = self.first_delta if first else self.delta
        gamma = l_max - delta * abs(l_max - l_noise)
        run = greedy_variance_selection if self.incremental else greedy_variance_from_scratch
        res = run(params, X, y, old_t, gamma, jitter=jitter, min_new=1 if first else 0)
        Z = np.concatenate([a, X[res.indices]])
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

    def select(self, rng, stats, X, y, old, params, terms=None) -> Selection:
        X = np.asarray(X, np.float64)
        stats = update_target_stats(stats, y)
        a = _old_inputs(old, X.shape[1])
        pool = np.concatenate([a, X])
        idx = pivoted_cholesky(params.kernel, pool, self.eta, self.max_points, rng)
        Z = pool[idx]
        Ma = a.shape[0]
        return Selection(Z, stats, {"m": int(Z.shape[0]), "added": int(np.sum(idx >= Ma)),
                                    "kept_old": int(np.sum(idx < Ma))})


class OIPS(_Base):
    """Online Inducing Point Selection (Galy-Fajou & Opper 2021; authors' ``OIPS.py``).

    Args:
        rho: accept ``x`` when ``max_z k(x, z) < rho k(x, x)`` (0.8 default; UCI configs 0.96),
            with ``k`` the kernel's stationary part (:func:`oips_kernel`).
        kmin: the first batch starts from ``kmin`` random points of the batch.
    """

    name = "oips"

    def __init__(self, rho: float = 0.8, kmin: int = 10) -> None:
        if not 0.0 < rho < 1.0:
            raise ValueError(f"rho: expected a number in (0, 1), received {rho}")
        self.rho, self.kmin = float(rho), int(kmin)

    def select(self, rng, stats, X, y, old, params, terms=None) -> Selection:
        X = np.asarray(X, np.float64)
        N, d = X.shape
        stats = update_target_stats(stats, y)
        if old is None:
            start = X[np.asarray(jax.random.permutation(rng, N))[: min(self.kmin, N)]]
        else:
            start = np.asarray(old.inducing_inputs, np.float64)
        M0 = int(start.shape[0])
        C = bucket(M0 + N)
        Zbuf = jnp.asarray(pad_rows(start, C))
        Xp, _, xm = _pad_data(X, np.zeros(N))
        Zb, n, _ = _oips_scan(oips_kernel(params.kernel), Zbuf, jnp.asarray(M0, jnp.int32), Xp,
                              xm, jnp.asarray(self.rho, jnp.float64))
        Z = np.asarray(Zb)[: int(n)]
        return Selection(Z, stats, {"m": int(Z.shape[0]), "added": int(n) - M0})


FIXED_METHODS = ("random", "greedy", "old-new")


class FixedM(_Base):
    """``M`` inducing points chosen afresh each batch.

    Args:
        num_inducing: ``M``.
        method: ``"random"``: a uniform subset of ``[a; X]`` (a plain baseline of our own);
            ``"greedy"``: greedy variance over ``[a; X]`` with a fixed count (the fixed-M rows of
            VIPS' Fig. 2a, the reference's ``MDPP`` with ``M`` points); ``"old-new"``: the
            reference's fixed-memory baseline (``"Gradient"`` in
            ``experiments/toy/utils_regression.py``, after Bui et al. 2017): ``int(0.7 M)`` of
            the old points and ``M - int(0.7 M)`` points of the batch, each drawn at random
            (the first batch: ``M`` random points of the batch). The reference also optimizes
            these inputs by gradient with the hyperparameters; here they stay where drawn.
    """

    name = "fixed"

    def __init__(self, num_inducing: int = 100, method: str = "random") -> None:
        if int(num_inducing) < 1:
            raise ValueError(f"num_inducing: expected >= 1, received {num_inducing}")
        if method not in FIXED_METHODS:
            raise ValueError(f"method: expected one of {', '.join(FIXED_METHODS)}, received "
                             f"{method!r}")
        self.num_inducing, self.method = int(num_inducing), method

    def select(self, rng, stats, X, y, old, params, terms=None) -> Selection:
        X = np.asarray(X, np.float64)
        stats = update_target_stats(stats, y)
        a = _old_inputs(old, X.shape[1])
        M = self.num_inducing
        if self.method == "old-new":
            k_old, k_new = jax.random.split(rng)
            if a.shape[0] == 0:
                Z = X[np.asarray(jax.random.permutation(k_new, X.shape[0]))[:M]]
            else:
                M_old = min(int(0.7 * M), a.shape[0])
                M_new = min(M - M_old, X.shape[0])
                Z = np.concatenate([
                    a[np.asarray(jax.random.permutation(k_old, a.shape[0]))[:M_old]],
                    X[np.asarray(jax.random.permutation(k_new, X.shape[0]))[:M_new]]])
            return Selection(Z, stats, {"m": int(Z.shape[0])})
        pool = np.concatenate([a, X])
        P = pool.shape[0]
        M = min(M, P)
        if self.method == "random":
            idx = np.asarray(jax.random.choice(rng, P, (M,), replace=False))
        else:
            idx = pivoted_cholesky(params.kernel, pool, -1.0, M, rng)
        Z = pool[idx]
        return Selection(Z, stats, {"m": int(Z.shape[0])})


# ------------------------------------------------------------------------------------------
# hyperparameter fit and the one-pass engine
# ------------------------------------------------------------------------------------------
def kernel_bounds(kernel: Kernel, variance_bounds: tuple[float, float] | None = (1e-6, 2e3)
                  ) -> tuple[Kernel, Kernel]:
    """Lower / upper bound pytrees for a kernel: every leaf named ``variance`` in
    ``variance_bounds`` (the authors' sigmoid transform on the SE variance; ``None``: free),
    others free."""

    def walk(k, which):
        children, aux = k.tree_flatten()
        out = []
        for name, c in zip(k._fields, children):
            if isinstance(c, Kernel):
                out.append(walk(c, which))
            elif name == "variance" and variance_bounds is not None:
                out.append(variance_bounds[which])
            else:
                out.append(0.0 if which == 0 else float("inf"))
        return type(k).tree_unflatten(aux, out)

    return walk(kernel, 0), walk(kernel, 1)


def _negative_elbo(params, Xp, yp, xm, Zp, zm, terms, jitter, d_jitter):
    return -online_elbo(params, Xp, yp, Zp, terms, jitter=jitter, z_mask=zm, x_mask=xm,
                        d_jitter=d_jitter)


_negative_elbo_value = jax.jit(_negative_elbo)


def d_jitter_of(old: OldTerms | OldPosterior | None, jitter: float) -> float:
    """The jitter on ``D`` of the reference's models: none in the first batch (GPflow's
    ``SGPR`` builds ``B = I + A A^T``), ``jitter`` in the online ones (``OSGPR_VFE``)."""
    return 0.0 if old is None else float(jitter)


def fit_hyperparameters(params: GPRegressionParams, X: Array, y: Array, Z: Array,
                        old: OldTerms | None, *, jitter: float = ONLINE_JITTER,
                        variance_bounds: tuple[float, float] | None = (1e-6, 2e3),
                        min_noise_variance: float = 1e-6, max_iterations: int = 15000,
                        tolerance: float = 2.220446049250313e-09,
                        gradient_tolerance: float = 1e-5, parametrization: str = "gpflow"):
    """Maximize ``F`` over kernel + noise with ``Z`` fixed by L-BFGS-B
    (:func:`inference.type2ml.fit_type2ml`; SciPy's default tolerances, as GPflow's ``Scipy``).

    ``parametrization="gpflow"`` optimizes what the reference optimizes
    (``experiments/uci/utils_uci.py``): every kernel variance through TensorFlow Probability's
    ``Sigmoid(*variance_bounds)`` (softplus when ``variance_bounds`` is ``None``), the other
    kernel hyperparameters through softplus, the noise through softplus +
    ``min_noise_variance`` (GPflow's Gaussian likelihood); ``parametrization="log"`` optimizes
    log-hyperparameters with the same limits as box bounds. ``D`` takes ``jitter`` in the online
    batches and none in the first (:func:`d_jitter_of`, as the reference's GPflow models).
    ``old`` from :func:`prepare_old`; ``Z`` and the old terms are padded to one size bucket and
    the batch to another, so a stream of batches compiles the objective once per pair of
    buckets.
    """
    if parametrization == "gpflow":
        from inference.type2ml import gpflow_parametrization

        limits = dict(transforms=gpflow_parametrization(
            params, variance_bounds=variance_bounds, noise_shift=min_noise_variance))
    elif parametrization == "log":
        lo_k, hi_k = kernel_bounds(params.kernel, variance_bounds)
        limits = dict(lower_bounds=GPRegressionParams(lo_k, min_noise_variance),
                      upper_bounds=GPRegressionParams(hi_k, float("inf")))
    else:
        raise ValueError(f"parametrization: expected 'gpflow' or 'log', received "
                         f"{parametrization!r}")
    Xp, yp, xm = _pad_data(X, y)
    size = _joint_size(Z.shape[0], old)
    Zp, zm = _pad_inducing(Z, size)
    terms = _terms_at(old, X.shape[1], size)
    return fit_type2ml(_negative_elbo, params, max_iterations=max_iterations,
                       tolerance=tolerance, gradient_tolerance=gradient_tolerance,
                       data=(Xp, yp, xm, Zp, zm, terms, jnp.asarray(jitter),
                             jnp.asarray(d_jitter_of(old, jitter))), **limits)


class OnlineSGPRState(NamedTuple):
    """The continual state: ``q(u_b) = N(q_mean, q_cov)`` at ``inducing_inputs``, ``K_bb`` at the
    fitted hyperparameters (the next batch's ``K'_aa``), the hyperparameters, the policy's
    running target statistics and the number of batches seen. ``M = 0`` before any batch.
    ``terms``: the :func:`prepare_old` terms of that summary (with ``summary_jitter`` added to
    ``q_cov``), computed with the summary; ``None`` (e.g. after loading) recomputes them."""

    inducing_inputs: Array
    q_mean: Array
    q_cov: Array
    prior_cov: Array
    params: GPRegressionParams
    stats: TargetStats
    num_batches: Array
    terms: OldTerms | None = None


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
    """One-pass engine of the streaming sparse GP, of kind ``"host"`` (data-dependent numbers
    of inducing points, an L-BFGS-B fit): ``init(rng, params, input_dim)`` (deterministic:
    ``rng`` is unused), ``step(rng, state, (X, y)) -> (state, info)`` (see the module
    docstring).

    Args:
        policy: a :class:`SelectionPolicy`.
        jitter: of the online bound (fit and summaries; GPflow 1e-6).
        summary_jitter: added to ``S_b`` when it becomes the next ``q_old`` (``utils_uci.py``).
        fit: fit kernel + noise after selection (``False`` keeps them fixed).
        variance_bounds, min_noise_variance, max_iterations, parametrization: of the L-BFGS
            fit (:func:`fit_hyperparameters`).
    """

    kind = "host"

    def __init__(self, policy: SelectionPolicy, *, jitter: float = ONLINE_JITTER,
                 summary_jitter: float = 1e-6, fit: bool = True,
                 variance_bounds: tuple[float, float] | None = (1e-6, 2e3),
                 min_noise_variance: float = 1e-6, max_iterations: int = 15000,
                 parametrization: str = "gpflow") -> None:
        if not isinstance(policy, SelectionPolicy):
            raise TypeError(f"policy: expected a SelectionPolicy, received {type(policy).__name__}")
        if parametrization not in ("gpflow", "log"):
            raise ValueError(f"parametrization: expected 'gpflow' or 'log', received "
                             f"{parametrization!r}")
        self.policy = policy
        self.parametrization = parametrization
        self.jitter, self.summary_jitter = float(jitter), float(summary_jitter)
        self.fit = bool(fit)
        self.variance_bounds = None if variance_bounds is None else \
            tuple(float(v) for v in variance_bounds)
        self.min_noise_variance, self.max_iterations = float(min_noise_variance), int(max_iterations)

    def init(self, rng: Any, params: GPRegressionParams, input_dim: int) -> OnlineSGPRState:
        """No inducing points yet, the hyperparameters ``params`` and the policy's empty
        statistics (``rng`` is unused)."""
        del rng
        e = np.zeros((0,))
        return OnlineSGPRState(np.zeros((0, input_dim)), e, np.zeros((0, 0)), np.zeros((0, 0)),
                               params, self.policy.init(), np.int32(0))

    def old_posterior(self, state: OnlineSGPRState) -> OldPosterior | None:
        """The summary the next batch conditions on: ``q(u_b)`` with ``summary_jitter`` added to
        its covariance, and ``K_bb`` (``None`` before the first batch)."""
        if int(state.num_batches) == 0:
            return None
        M = np.shape(state.q_mean)[0]
        return OldPosterior(np.asarray(state.inducing_inputs), np.asarray(state.q_mean),
                            np.asarray(state.q_cov) + self.summary_jitter * np.eye(M),
                            np.asarray(state.prior_cov))

    def step(self, rng: Array, state: OnlineSGPRState, batch: tuple[Array, Array]
             ) -> tuple[OnlineSGPRState, OnlineSGPRInfo]:
        X, y = np.asarray(batch[0], np.float64), np.asarray(batch[1], np.float64)
        old = self.old_posterior(state)
        terms = state.terms
        if old is not None and terms is None:
            terms = prepare_old(old, self.jitter)
        t0 = time.perf_counter()
        sel = self.policy.select(rng, state.stats, X, y, old, state.params,
                                 terms=None if terms is None else (terms, self.jitter))
        Z = np.asarray(sel.inducing_inputs, np.float64)
        t1 = time.perf_counter()
        params, iters = state.params, 0
        if self.fit:
            res = fit_hyperparameters(state.params, X, y, Z, terms, jitter=self.jitter,
                                      variance_bounds=self.variance_bounds,
                                      min_noise_variance=self.min_noise_variance,
                                      max_iterations=self.max_iterations,
                                      parametrization=self.parametrization)
            params, iters = res.params, res.num_iterations
        Xp, yp, xm = _pad_data(X, y)
        M = Z.shape[0]
        size = _joint_size(M, terms)
        Zp, zm = _pad_inducing(Z, size)
        _, _, (bound, q_mean, q_cov, prior_cov, nxt) = _factor(
            params, Xp, yp, xm, Zp, zm, _terms_at(terms, X.shape[1], size),
            jnp.asarray(self.jitter), jnp.asarray(d_jitter_of(terms, self.jitter)),
            jnp.asarray(self.summary_jitter))
        bound = float(bound)
        if not np.isfinite(bound):
            raise FloatingPointError(f"online bound is {bound} after the fit (M = {M})")
        if not np.all(np.isfinite(np.asarray(nxt.A))):
            raise FloatingPointError(f"the summary q(u_b) of the batch (M = {M}) is not "
                                     "positive definite")
        q_mean = np.asarray(q_mean)[:M]
        q_cov, prior_cov = np.asarray(q_cov)[:M, :M], np.asarray(prior_cov)[:M, :M]
        t2 = time.perf_counter()
        rec = sel.record
        nan = float("nan")
        info = OnlineSGPRInfo(
            m=np.asarray(M), added=np.asarray(rec.get("added", -1)),
            bound=np.asarray(bound), bound_selected=np.asarray(rec.get("bound_selected", nan)),
            l_max=np.asarray(rec.get("l_max", nan)), l_noise=np.asarray(rec.get("l_noise", nan)),
            threshold=np.asarray(rec.get("threshold", nan)), iterations=np.asarray(iters),
            select_seconds=np.asarray(t1 - t0), fit_seconds=np.asarray(t2 - t1))
        new = OnlineSGPRState(Z, q_mean, q_cov, prior_cov, params, sel.stats,
                              np.int32(int(state.num_batches) + 1), nxt)
        return new, info
