"""Online (streaming) sparse GP regression of Bui et al. (2017), the model VIPS sizes.

Notation (Pescador-Barrios et al. 2024, Sect. 3.3; docs/vips.md, "Model"): a batch ``(X, y)`` of
``N`` points; the old inducing inputs ``a`` (``M_a`` rows) with the old posterior summary
``q_old(u_a) = N(m_a, S_a)`` and its previous-hyperparameter prior covariance ``K'_aa``; the new
inducing inputs ``b`` (``M_b`` rows; VIPS keeps ``a`` inside ``b``); the current kernel ``k`` and
noise variance ``s2``. ``Q_ff = K_fb K_bb^-1 K_bf``, ``Q_aa = K_ab K_bb^-1 K_ba``.

Generative program (:func:`online_sgpr_model`): the joint that the online ELBO (paper eq. 7)
is the evidence lower bound of,

    u_b ~ N(0, K_bb),   f_i | u_b ~ N(K_ib K_bb^-1 u_b, k_ii - Q_ii),   y_i | f_i ~ N(f_i, s2),
    u_a | u_b ~ N(K_ab K_bb^-1 u_b, K_aa - Q_aa),   factor log q_old(u_a) - log N(u_a | 0, K'_aa),

i.e. the sparse GP prior, the Gaussian likelihood, and the old posterior divided by its old
prior as an approximate likelihood of everything seen before (eq. 6: the "pseudo-data"
summary). The ``f_i`` conditionals are per point because the likelihood factorizes over points
and the ELBO only needs their marginals.

Collapsed online bound (Bui et al. 2017, eq. 8 of the VIPS paper, in the whitened form of the
authors' ``osgpr.py``), with ``L_b = chol(K_bb)``, ``A = S_a^-1 - K'_aa^-1``, ``w = S_a^-1 m_a``:

    c~ = L_b^-1 c = L_b^-1 (K_bf y / s2 + K_ba w)
    D = I + L_b^-1 [K_bf K_fb / s2 + K_ba A K_ab] L_b^-T,     L_D = chol(D),   v = L_D^-1 c~
    F = -N/2 log 2 pi s2 - y'y/(2 s2) - 1/2 m_a' S_a^-1 m_a + 1/2 |v|^2 - log|L_D|
        - (tr K_ff - tr Q_ff)/(2 s2) + log|chol K'_aa| - log|chol S_a| - 1/2 tr[A (K_aa - Q_aa)].

Without ``a`` it is Titsias' (2009) SGPR bound. Predictive (paper eq. 16):
``mu* = K_*b L_b^-T L_D^-T v``, ``var* = k** - |L_b^-1 K_b*|^2 + |L_D^-1 L_b^-1 K_b*|^2``.

Online upper bound (Sect. 4.1, App. H; Titsias 2014 for the first batch): with the residual
trace ``t = tr(K_ff - Q_ff) + tr(K_aa - Q_aa)``, the log determinant of ``F`` is kept and the
quadratic form is taken with the noise inflated by ``t`` (``s2 -> s2 + t`` on the data,
``A -> A (I + t A)^-1`` on the pseudo-data), giving ``U >= F(b = [X; a]) >= F(b)``:

    U = F_(no trace terms) + y'y/(2 s2) - y'y/(2 (s2 + t)) - 1/2 |v|^2 + 1/2 |v_t|^2
        + t/2 w' (I + t A)^-1 w,
    v_t = L_Dt^-1 L_b^-1 (K_bf y/(s2 + t) + K_ba (I + t A)^-1 w),
    D_t = I + L_b^-1 [K_bf K_fb/(s2 + t) + K_ba A (I + t A)^-1 K_ab] L_b^-T.

Jitter: ``jitter`` is added to ``K_bb``, to the current ``K_aa`` and to ``D`` (as GPflow and the
authors' code do: 1e-6 online, 1e-4 in the first-batch selection); it is part of the model. The
factorizations go through :func:`models.linalg_jax.jitter_cholesky`, which adds more only when a
factorization fails. All arrays float64 (the caller enables x64).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax import Array
from jax.scipy.linalg import cho_solve, solve_triangular

from models.exact_gp import GPRegressionParams
from models.linalg_jax import jitter_cholesky, symmetrize

__all__ = ["OldPosterior", "OldTerms", "old_terms", "BoundPieces", "bound_pieces",
           "bound_constant", "online_elbo", "online_elbo_and_residual",
           "online_upper_bound", "optimal_inducing_posterior", "predictive",
           "elbo_and_inducing_posterior", "elbo_from_pieces", "predictive_from_pieces",
           "predict_from_inducing", "online_sgpr_model", "optimal_guide", "uncollapsed_elbo",
           "GPRegressionParams", "ONLINE_JITTER", "FIRST_BATCH_SELECTION_JITTER"]

_LOG_2PI = math.log(2.0 * math.pi)

ONLINE_JITTER = 1e-6
"""Jitter on ``K_bb``, ``K_aa`` and ``D`` (GPflow default; authors' ``osgpr.py`` / ``VIPS.py``)."""

FIRST_BATCH_SELECTION_JITTER = 1e-4
"""Jitter of the first-batch (offline) VIPS selection (authors' ``Offline_VIPS.py``)."""


class OldPosterior(NamedTuple):
    """The summary of all past batches that the online model carries forward.

    ``q_old(u_a) = N(mean, covariance)`` at ``inducing_inputs``; ``prior_covariance`` is
    ``K'_aa = k_theta'(a, a)`` at the previous hyperparameters theta'.

    Attributes:
        inducing_inputs: ``a``, ``(M_a, d)``.
        mean: ``m_a``, ``(M_a,)``.
        covariance: ``S_a``, ``(M_a, M_a)`` (positive definite).
        prior_covariance: ``K'_aa``, ``(M_a, M_a)``.
    """

    inducing_inputs: Array
    mean: Array
    covariance: Array
    prior_covariance: Array


class OldTerms(NamedTuple):
    """Hyperparameter-independent pieces of the old summary, computed once per batch.

    Attributes:
        a: old inducing inputs ``(M_a, d)``.
        w: ``S_a^-1 m_a`` ``(M_a,)``.
        A: ``S_a^-1 - (K'_aa + jitter I)^-1`` ``(M_a, M_a)``, symmetric.
        const: ``-1/2 m_a' S_a^-1 m_a + log|chol(K'_aa + jitter I)| - log|chol S_a|``.
        mask: ``(M_a,)`` bool, which rows of ``a`` are real (``None``: all), see :func:`old_terms`.
    """

    a: Array
    w: Array
    A: Array
    const: Array
    mask: Array | None = None


def _gram(kern, Z: Array, mask: Array | None, jitter) -> Array:
    """``k(Z, Z) + jitter I``; padded rows (``mask`` False) become rows of the identity."""
    K = kern(Z)
    if mask is None:
        return K + jitter * jnp.eye(Z.shape[0], dtype=Z.dtype)
    return (jnp.where(mask[:, None] & mask[None, :], K, 0.0)
            + jnp.diag(jnp.where(mask, jitter, 1.0)).astype(Z.dtype))


def _cross(kern, Z1: Array, Z2: Array, m1: Array | None, m2: Array | None) -> Array:
    """``k(Z1, Z2)`` with padded rows / columns zeroed."""
    K = kern(Z1, Z2)
    if m1 is not None:
        K = jnp.where(m1[:, None], K, 0.0)
    if m2 is not None:
        K = jnp.where(m2[None, :], K, 0.0)
    return K


def old_terms(old: OldPosterior, *, jitter: float = ONLINE_JITTER,
              mask: Array | None = None) -> OldTerms:
    """Factor ``S_a`` and ``K'_aa + jitter I`` once (they do not depend on the new theta).

    Padding (fixed buffer shapes, so that jitted code compiles once per size bucket): rows with
    ``mask`` False must hold zero mean and identity rows / columns of ``S_a`` and ``K'_aa``;
    they then contribute nothing (``w = 0``, ``A = 0`` there, log-determinants 0).
    """
    a, m, S, Kp = old
    Ma = a.shape[0]
    eye = jnp.eye(Ma, dtype=a.dtype)
    jit_diag = jitter * eye if mask is None else jnp.diag(jnp.where(mask, jitter, 0.0))
    L_S = jitter_cholesky(symmetrize(S), name="S_a (old posterior covariance)")
    L_K = jitter_cholesky(symmetrize(Kp) + jit_diag, name="K'_aa (old prior covariance)")
    w = cho_solve((L_S, True), m)
    A = symmetrize(cho_solve((L_S, True), eye) - cho_solve((L_K, True), eye))
    const = (-0.5 * jnp.dot(m, w) + jnp.sum(jnp.log(jnp.diagonal(L_K)))
             - jnp.sum(jnp.log(jnp.diagonal(L_S))))
    return OldTerms(a, w, A, const, mask)


class BoundPieces(NamedTuple):
    """The factors of the bound at one inducing set ``b`` (built by :func:`bound_pieces`); the
    incremental selection of :mod:`inference.vips` grows exactly these by rank-one updates."""

    L_b: Array      # chol(K_bb + jitter I)            (M_b, M_b)
    P_f: Array      # L_b^-1 K_bf                      (M_b, N)
    P_a: Array      # L_b^-1 K_ba                      (M_b, M_a)
    L_D: Array      # chol(D)                          (M_b, M_b)
    ct: Array       # L_b^-1 c                         (M_b,)
    v: Array        # L_D^-1 L_b^-1 c                  (M_b,)
    resid: Array    # diag(K_ff - Q_ff)                (N,)
    trace_a: Array  # tr[A (K_aa + jitter I - Q_aa)]   ()


def bound_pieces(params: GPRegressionParams, X: Array, y: Array, Z: Array, old: OldTerms | None,
                 jitter: float, z_mask: Array | None = None,
                 x_mask: Array | None = None, d_jitter: float | None = None) -> BoundPieces:
    """:class:`BoundPieces` of ``F`` at inducing inputs ``Z`` (``jitter`` on K_bb, K_aa, and on
    D unless ``d_jitter`` is given: GPflow's ``SGPR``, the reference's first-batch model, puts
    none on ``D``; its ``OSGPR_VFE`` and the selection code put ``jitter`` there).

    ``z_mask`` / ``x_mask`` mark the real rows of padded ``Z`` / ``X`` (padded ``y`` must be 0);
    padded rows contribute nothing, so a padded call equals the unpadded one.
    """
    kern, s2 = params.kernel, params.noise_variance
    Mb = Z.shape[0]
    eye = jnp.eye(Mb, dtype=X.dtype)
    L_b = jitter_cholesky(_gram(kern, Z, z_mask, jitter), name="K_bb")
    P_f = solve_triangular(L_b, _cross(kern, Z, X, z_mask, x_mask), lower=True)
    ct = P_f @ y / s2
    D = eye + (P_f @ P_f.T) / s2
    kdiag = kern.diag(X) if x_mask is None else jnp.where(x_mask, kern.diag(X), 0.0)
    resid = kdiag - jnp.sum(P_f * P_f, axis=0)
    if old is None:
        P_a = jnp.zeros((Mb, 0), X.dtype)
        trace_a = jnp.zeros((), X.dtype)
    else:
        P_a = solve_triangular(L_b, _cross(kern, Z, old.a, z_mask, old.mask), lower=True)
        ct = ct + P_a @ old.w
        PA = P_a @ old.A
        D = D + PA @ P_a.T
        K_aa = _gram(kern, old.a, old.mask, jitter)
        trace_a = jnp.sum(old.A * K_aa) - jnp.sum(PA * P_a)
    dj = jitter if d_jitter is None else d_jitter
    d_jit = dj * eye if z_mask is None else jnp.diag(jnp.where(z_mask, dj, 0.0))
    L_D = jitter_cholesky(symmetrize(D) + d_jit, name="D")
    v = solve_triangular(L_D, ct, lower=True)
    return BoundPieces(L_b, P_f, P_a, L_D, ct, v, resid, trace_a)


def bound_constant(params: GPRegressionParams, X: Array, y: Array, old: OldTerms | None, *,
                   jitter: float = ONLINE_JITTER, x_mask: Array | None = None) -> Array:
    """The part of ``F`` that does not depend on ``b``:
    ``-N/2 log 2 pi s2 - y'y/(2 s2) - tr K_ff/(2 s2)`` (+ ``const - 1/2 tr[A (K_aa + jitter I)]``).

    ``F = bound_constant + 1/2 |v|^2 - log|L_D| + tr Q_ff/(2 s2) + 1/2 tr(A Q_aa)``.
    """
    N = X.shape[0] if x_mask is None else jnp.sum(x_mask)
    s2 = params.noise_variance
    kdiag = params.kernel.diag(X) if x_mask is None else jnp.where(x_mask, params.kernel.diag(X), 0.0)
    c = (-0.5 * N * (_LOG_2PI + jnp.log(s2)) - 0.5 * jnp.dot(y, y) / s2
         - 0.5 * jnp.sum(kdiag) / s2)
    if old is not None:
        K_aa = _gram(params.kernel, old.a, old.mask, jitter)
        c = c + old.const - 0.5 * jnp.sum(old.A * K_aa)
    return c


def elbo_from_pieces(params: GPRegressionParams, X: Array, y: Array, p: BoundPieces,
                      old: OldTerms | None, x_mask: Array | None) -> Array:
    """``F`` (module docstring) from the factors of :func:`bound_pieces`."""
    N = X.shape[0] if x_mask is None else jnp.sum(x_mask)
    s2 = params.noise_variance
    F = (-0.5 * N * (_LOG_2PI + jnp.log(s2)) - 0.5 * jnp.dot(y, y) / s2
         + 0.5 * jnp.dot(p.v, p.v) - jnp.sum(jnp.log(jnp.diagonal(p.L_D)))
         - 0.5 * jnp.sum(p.resid) / s2)
    if old is not None:
        F = F + old.const - 0.5 * p.trace_a
    return F


def online_elbo_and_residual(params: GPRegressionParams, X: Array, y: Array, Z: Array,
                             old: OldTerms | None = None, *, jitter: float = ONLINE_JITTER,
                             z_mask: Array | None = None, x_mask: Array | None = None,
                             d_jitter: float | None = None) -> tuple[Array, Array]:
    """The collapsed online bound ``F`` (module docstring) and ``diag(K_ff - Q_ff)``.

    Args:
        params: current kernel and noise variance.
        X: batch inputs ``(N, d)``; y: targets ``(N,)``.
        Z: inducing inputs ``b`` ``(M_b, d)``.
        old: :func:`old_terms` of the old summary, ``None`` for the first batch (SGPR bound).
        jitter: added to ``K_bb``, ``K_aa`` and ``D``.
        z_mask, x_mask: real rows of padded ``Z`` / ``X`` (:func:`bound_pieces`).
        d_jitter: the jitter on ``D`` if not ``jitter`` (:func:`bound_pieces`).

    Returns:
        ``(F, residual (N,))``.
    """
    p = bound_pieces(params, X, y, Z, old, jitter, z_mask, x_mask, d_jitter)
    return elbo_from_pieces(params, X, y, p, old, x_mask), p.resid


def online_elbo(params: GPRegressionParams, X: Array, y: Array, Z: Array,
                old: OldTerms | None = None, *, jitter: float = ONLINE_JITTER,
                z_mask: Array | None = None, x_mask: Array | None = None,
                d_jitter: float | None = None) -> Array:
    """The collapsed online bound ``F`` (first batch: the SGPR bound); see the module docstring."""
    return online_elbo_and_residual(params, X, y, Z, old, jitter=jitter, z_mask=z_mask,
                                    x_mask=x_mask, d_jitter=d_jitter)[0]


def online_upper_bound(params: GPRegressionParams, X: Array, y: Array, Z: Array,
                       old: OldTerms | None = None, *, jitter: float = 1e-12) -> Array:
    """Online upper bound ``U`` on ``F(b = [X; a])`` (paper Sect. 4.1, App. H; module docstring).

    ``U >= F(b = [X; a])`` needs ``A = S_a^-1 - K'_aa^-1`` positive semi-definite (the old
    posterior no wider than its prior), which holds for a summary made by conditioning. The
    jitter is kept tiny (``1e-12``, as the authors' ``online_upper_bound.py``), since jitter on
    ``D`` lowers ``U``.
    """
    N = X.shape[0]
    s2 = params.noise_variance
    p = bound_pieces(params, X, y, Z, old, jitter)
    t = jnp.sum(p.resid) + p.trace_a
    s2t = s2 + t
    Mb = Z.shape[0]
    eye = jnp.eye(Mb, dtype=X.dtype)
    ct = p.P_f @ y / s2t
    Dt = eye + (p.P_f @ p.P_f.T) / s2t
    extra = jnp.zeros((), X.dtype)
    if old is not None:
        Ma = old.a.shape[0]
        eye_a = jnp.eye(Ma, dtype=X.dtype)
        # I + t A is SPD for A >= 0
        L_t = jitter_cholesky(symmetrize(eye_a + t * old.A), name="I + t A")
        u = cho_solve((L_t, True), old.w)                    # (I + t A)^-1 w
        G = solve_triangular(L_t, old.A, lower=True)         # L_t^-1 A
        A_t = symmetrize(old.A - t * (G.T @ G))              # A (I + t A)^-1
        ct = ct + p.P_a @ u
        Dt = Dt + p.P_a @ A_t @ p.P_a.T
        extra = 0.5 * t * jnp.dot(old.w, u)
    L_Dt = jitter_cholesky(symmetrize(Dt) + jitter * eye, name="D_t")
    vt = solve_triangular(L_Dt, ct, lower=True)
    U = (-0.5 * N * (_LOG_2PI + jnp.log(s2)) - 0.5 * jnp.dot(y, y) / s2t
         + 0.5 * jnp.dot(vt, vt) - jnp.sum(jnp.log(jnp.diagonal(p.L_D))) + extra)
    if old is not None:
        U = U + old.const
    return U


def predictive_from_pieces(params: GPRegressionParams, Z: Array, p: BoundPieces,
                            X_star: Array, full_cov: bool, z_mask: Array | None,
                            star_mask: Array | None = None) -> tuple[Array, Array]:
    """Predictive at ``X_star`` from the factors; ``star_mask`` marks its real rows (the
    others get zero mean and zero rows / columns of the covariance)."""
    kern = params.kernel
    B = solve_triangular(p.L_b, _cross(kern, Z, X_star, z_mask, star_mask), lower=True)
    C = solve_triangular(p.L_D, B, lower=True)                    # L_D^-1 L_b^-1 K_b*
    mean = C.T @ p.v
    if full_cov:
        K = kern(X_star) if star_mask is None else \
            jnp.where(star_mask[:, None] & star_mask[None, :], kern(X_star), 0.0)
        return mean, symmetrize(K - B.T @ B + C.T @ C)
    kd = kern.diag(X_star) if star_mask is None else jnp.where(star_mask, kern.diag(X_star), 0.0)
    return mean, kd - jnp.sum(B * B, axis=0) + jnp.sum(C * C, axis=0)


def predictive(params: GPRegressionParams, X: Array, y: Array, Z: Array, old: OldTerms | None,
               X_star: Array, *, jitter: float = ONLINE_JITTER, full_cov: bool = False,
               z_mask: Array | None = None, x_mask: Array | None = None
               ) -> tuple[Array, Array]:
    """Latent predictive ``q(f*)`` at ``X_star (n, d)`` of the optimal ``q(u_b)`` (paper eq. 16).

    Returns ``mean (n,)`` and ``variance (n,)`` (or covariance ``(n, n)``), noise excluded.
    """
    p = bound_pieces(params, X, y, Z, old, jitter, z_mask, x_mask)
    return predictive_from_pieces(params, Z, p, X_star, full_cov, z_mask)


def optimal_inducing_posterior(params: GPRegressionParams, X: Array, y: Array, Z: Array,
                               old: OldTerms | None = None, *, jitter: float = ONLINE_JITTER,
                               z_mask: Array | None = None, x_mask: Array | None = None
                               ) -> tuple[Array, Array]:
    """The optimal ``q(u_b) = N(m_b, S_b)``: the predictive (eq. 16) at ``Z`` with full covariance.

    This is what the authors' ``update_parameter`` passes on as the next ``q_old`` (they add
    ``1e-6 I`` to ``S_b`` then; the learner does the same when it builds :class:`OldPosterior`).
    With ``z_mask`` the padded rows / columns of the result are zero (slice them off).
    """
    p = bound_pieces(params, X, y, Z, old, jitter, z_mask, x_mask)
    return predictive_from_pieces(params, Z, p, Z, True, z_mask, z_mask)


def elbo_and_inducing_posterior(params: GPRegressionParams, X: Array, y: Array, Z: Array,
                                old: OldTerms | None = None, *, jitter: float = ONLINE_JITTER,
                                z_mask: Array | None = None, x_mask: Array | None = None,
                                d_jitter: float | None = None) -> tuple[Array, Array, Array]:
    """``(F, m_b, S_b)``: :func:`online_elbo` and :func:`optimal_inducing_posterior` from one
    factorization of the bound (``d_jitter`` as :func:`bound_pieces`)."""
    p = bound_pieces(params, X, y, Z, old, jitter, z_mask, x_mask, d_jitter)
    m, S = predictive_from_pieces(params, Z, p, Z, True, z_mask, z_mask)
    return elbo_from_pieces(params, X, y, p, old, x_mask), m, S


def predict_from_inducing(params: GPRegressionParams, Z: Array, mean: Array, covariance: Array,
                          X_star: Array, *, jitter: float = ONLINE_JITTER,
                          z_mask: Array | None = None) -> tuple[Array, Array]:
    """``q(f*) = int p(f* | u_b) q(u_b) du_b`` for ``q(u_b) = N(mean, covariance)`` at ``Z``.

    ``mean* = K_*b K_bb^-1 m``, ``var* = k** - K_*b K_bb^-1 K_b* + K_*b K_bb^-1 S K_bb^-1 K_b*``
    (``K_bb`` with ``jitter``). Returns ``mean (n,)`` and latent ``variance (n,)``. Padded rows
    of ``Z`` (``z_mask`` False) need zero ``mean`` entries and zero rows / columns of
    ``covariance``.
    """
    kern = params.kernel
    L_b = jitter_cholesky(_gram(kern, Z, z_mask, jitter), name="K_bb")
    K_bs = _cross(kern, Z, X_star, z_mask, None)
    B = solve_triangular(L_b, K_bs, lower=True)                        # L_b^-1 K_b*
    W = solve_triangular(L_b.T, B, lower=False)                        # K_bb^-1 K_b*
    mu = W.T @ mean
    var = kern.diag(X_star) - jnp.sum(B * B, axis=0) + jnp.sum(W * (covariance @ W), axis=0)
    return mu, var


# ------------------------------------------------------------------------------------------
# The NumPyro program and the uncollapsed ELBO it defines
# ------------------------------------------------------------------------------------------
def _conditionals(params: GPRegressionParams, X: Array, Z: Array, a: Array | None,
                  jitter: float):
    """``L_b``, ``K_fb K_bb^-1`` with the conditional variances of ``f`` and (if ``a``) of ``u_a``."""
    kern = params.kernel
    Mb = Z.shape[0]
    L_b = jitter_cholesky(kern(Z) + jitter * jnp.eye(Mb, dtype=X.dtype), name="K_bb")
    P_f = solve_triangular(L_b, kern(Z, X), lower=True)
    W_f = solve_triangular(L_b.T, P_f, lower=False).T                  # K_fb K_bb^-1 (N, M_b)
    var_f = jnp.maximum(kern.diag(X) - jnp.sum(P_f * P_f, axis=0), 1e-12)
    if a is None:
        return L_b, W_f, var_f, None, None
    P_a = solve_triangular(L_b, kern(Z, a), lower=True)
    W_a = solve_triangular(L_b.T, P_a, lower=False).T                  # K_ab K_bb^-1 (M_a, M_b)
    cov_a = symmetrize(kern(a) + jitter * jnp.eye(a.shape[0], dtype=X.dtype) - P_a.T @ P_a)
    return L_b, W_f, var_f, W_a, cov_a


def online_sgpr_model(X: Array, y: Array | None = None, *, params: GPRegressionParams,
                      inducing_inputs: Array, old: OldPosterior | None = None,
                      jitter: float = ONLINE_JITTER) -> None:
    """NumPyro program of the online sparse GP (module docstring); sites ``u_b``, ``f``, ``y``,
    and with an old summary ``u_a`` and the factor ``old_posterior``.

    Args:
        X: batch inputs ``(N, d)``; y: targets ``(N,)`` or ``None``.
        params: kernel and noise variance (new theta).
        inducing_inputs: ``b`` ``(M_b, d)``.
        old: the old summary (``None`` for the first batch).
        jitter: added to ``K_bb`` and to the conditional covariance of ``u_a``.
    """
    a = None if old is None else old.inducing_inputs
    L_b, W_f, var_f, W_a, cov_a = _conditionals(params, X, inducing_inputs, a, jitter)
    Mb = inducing_inputs.shape[0]
    u_b = numpyro.sample("u_b", dist.MultivariateNormal(jnp.zeros(Mb, X.dtype), scale_tril=L_b))
    f = numpyro.sample("f", dist.Normal(W_f @ u_b, jnp.sqrt(var_f)).to_event(1))
    numpyro.sample("y", dist.Normal(f, jnp.sqrt(params.noise_variance)).to_event(1), obs=y)
    if old is not None:
        u_a = numpyro.sample("u_a", dist.MultivariateNormal(W_a @ u_b, covariance_matrix=cov_a))
        Kp = symmetrize(old.prior_covariance) + jitter * jnp.eye(a.shape[0], dtype=X.dtype)
        numpyro.factor("old_posterior",
                       dist.MultivariateNormal(old.mean, covariance_matrix=old.covariance)
                       .log_prob(u_a)
                       - dist.MultivariateNormal(jnp.zeros_like(old.mean), covariance_matrix=Kp)
                       .log_prob(u_a))


def optimal_guide(X: Array, y: Array | None = None, *, params: GPRegressionParams,
                  inducing_inputs: Array, old: OldPosterior | None = None,
                  jitter: float = ONLINE_JITTER, q_mean: Array | None = None,
                  q_cov: Array | None = None) -> None:
    """Guide ``q(u_b) p(f | u_b) p(u_a | u_b)``: with ``q(u_b)`` optimal (default, from
    :func:`optimal_inducing_posterior`) its ELBO against :func:`online_sgpr_model` is ``F``."""
    a = None if old is None else old.inducing_inputs
    if q_mean is None:
        terms = None if old is None else old_terms(old, jitter=jitter)
        q_mean, q_cov = optimal_inducing_posterior(params, X, y, inducing_inputs, terms,
                                                   jitter=jitter)
    _, W_f, var_f, W_a, cov_a = _conditionals(params, X, inducing_inputs, a, jitter)
    u_b = numpyro.sample("u_b", dist.MultivariateNormal(q_mean, covariance_matrix=symmetrize(q_cov)))
    numpyro.sample("f", dist.Normal(W_f @ u_b, jnp.sqrt(var_f)).to_event(1))
    if old is not None:
        numpyro.sample("u_a", dist.MultivariateNormal(W_a @ u_b, covariance_matrix=cov_a))


def _gauss_expect_logpdf(mu_q: Array, cov_q: Array, mean: Array, cov: Array) -> Array:
    """``E_{N(mu_q, cov_q)}[log N(x | mean, cov)]``."""
    L = jitter_cholesky(symmetrize(cov), name="covariance")
    d = mu_q - mean
    r = solve_triangular(L, d, lower=True)
    T = solve_triangular(L, cov_q, lower=True)
    T = solve_triangular(L, T.T, lower=True)
    n = mean.shape[0]
    return (-0.5 * n * _LOG_2PI - jnp.sum(jnp.log(jnp.diagonal(L))) - 0.5 * jnp.dot(r, r)
            - 0.5 * jnp.trace(T))


def uncollapsed_elbo(params: GPRegressionParams, X: Array, y: Array, Z: Array,
                     old: OldPosterior | None, q_mean: Array, q_cov: Array, *,
                     jitter: float = ONLINE_JITTER) -> dict[str, Array]:
    """The ELBO of :func:`online_sgpr_model` for ``q(u_b) = N(q_mean, q_cov)``, in closed form.

    Returns ``{"expected_log_likelihood", "kl", "old_term", "elbo"}``; ``elbo`` = first - kl +
    old_term; at the optimal ``q`` it equals the collapsed ``F`` (D's jitter aside).
    """
    a = None if old is None else old.inducing_inputs
    L_b, W_f, var_f, W_a, cov_a = _conditionals(params, X, Z, a, jitter)
    s2 = params.noise_variance
    mu_f = W_f @ q_mean
    var_q = var_f + jnp.sum(W_f * (W_f @ q_cov), axis=1)
    ell = jnp.sum(-0.5 * (_LOG_2PI + jnp.log(s2)) - 0.5 * ((y - mu_f) ** 2 + var_q) / s2)
    Mb = Z.shape[0]
    K_bb = L_b @ L_b.T
    kl = -(_gauss_expect_logpdf(q_mean, q_cov, jnp.zeros(Mb, X.dtype), K_bb)
           - _gauss_expect_logpdf(q_mean, q_cov, q_mean, q_cov))
    old_term = jnp.zeros((), X.dtype)
    if old is not None:
        mu_a = W_a @ q_mean
        cov_qa = cov_a + W_a @ q_cov @ W_a.T
        Kp = symmetrize(old.prior_covariance) + jitter * jnp.eye(a.shape[0], dtype=X.dtype)
        old_term = (_gauss_expect_logpdf(mu_a, cov_qa, old.mean, old.covariance)
                    - _gauss_expect_logpdf(mu_a, cov_qa, jnp.zeros_like(old.mean), Kp))
    return {"expected_log_likelihood": ell, "kl": kl, "old_term": old_term,
            "elbo": ell - kl + old_term}
