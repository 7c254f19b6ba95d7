"""Kalman recursions for the parameter-drift model (Titsias et al. 2024).

Pure functions in the engine contract of ``inference/base.py`` (BlackJAX-style): :func:`init` builds a
:class:`KalmanState` (a NamedTuple), :func:`step` advances it by one point and returns
``(KalmanState, StepInfo)``, :func:`filter` is a ``lax.scan`` of :func:`step` over a sequence,
and :func:`chunk_update` runs the chunked protocol of App. D.2. Nothing here is jitted: callers
``jax.jit`` with ``static_argnames=("options", ...)`` (:class:`FilterOptions` is hashable).

Model and notation (:mod:`models.kalman`): readout ``W_n in R^{m x K}`` (regression: K = 1)
with drift prior eqs. 2-3, ``gamma_n = exp(-delta_n / 2)``, prior variance ``s_w2``, Gaussian
(surrogate) noise ``s2``, features ``phi_n``.

Recursions (eqs. 4-5 regression, 7-8 classification; one m x m covariance A for all K columns):

    prediction   M^- = gamma M,        A^- = gamma^2 A + (1 - gamma^2) s_w2 I          (eq. 4 / 7)
                 (App. C mean-preserving variant: M^- = M)
    update       k = A^- phi,  S = s2 + phi^T k,  r = y - (M^-)^T phi                  (eq. 5 / 8)
                 M = M^- + k r^T / S,   A = A^- - k k^T / S

    cost O(K m + m^2) per point: one mat-vec ``A phi`` and one rank-1 update of A; since
    ``A^- phi = gamma^2 (A phi) + (1 - gamma^2) s_w2 phi``, the transition is folded into the
    update and A is read twice and written once per point.

Learning the forgetting coefficient (Algorithm 1, Sect. 2.1.1, App. B): before the transition
of point n, one SGD step on ``delta`` of the log predictive of y_n under the prior
``q(W_n | y_{1:n-1})``, with ``(M_{n-1}, A_{n-1})`` held constant, then ``delta >= 0`` by clipping:

    delta <- clip(delta + rho d/d delta log p(y_n | y_{1:n-1}), 0, delta_max)        (eq. 9 / 16)

Only three projections of the old posterior enter, ``mu0 = M^T phi``, ``q = phi^T A phi`` and
``|phi|^2``, because projected onto phi the prediction step (eq. 4) reads

    mu = gamma mu0,       s^2 = phi^T A^- phi = gamma^2 q + (1 - gamma^2) s_w2 |phi|^2,

and the log predictive is

    regression (eq. 6 / 16):  log N(y | mu, s^2 + s2)
    softmax    (eq. 12):      log (1/S) sum_s softmax(mu + s eps_s)_y,  eps_s ~ N(0, I_K)

(reparameterized: the gradient flows through mu and s into delta). Sect. 2.1.2 replaces the
softmax of eq. 11 by the calibrated ``softmax(alpha (mu + s eps_s))`` (eq. 13), so with alpha
introduced eq. 13 is the predictive, the fine-tuning objective and (the default,
``FilterOptions.calibrated_forgetting``) delta's objective; ``calibrated_forgetting=False``
learns delta on the plain eq. 12 (alpha = 1) instead.

Chunked protocol (App. D.2) in :func:`chunk_update`: the learner first predicts the whole chunk
from the current statistics (:func:`predictive_moments`, :func:`class_probabilities`), takes its
gradient step on (theta, alpha), then the recursion runs through the chunk point by point with

* ``transition="always"`` ("Always Markov"): a transition and a delta step before every point;
* ``transition="last"`` ("Last Step Markov", App. D.2: "we only do Markov transition on the
  last point in the chunk"): the points before the chunk's last (valid) point are assimilated
  with gamma = 1; the last point takes the delta step of Algorithm 1 on its own log predictive,
  the transition, then its update;
* ``transition="first"`` (an alternative reading, an option): the chunk is one time step: one
  delta step on the mean log predictive of the chunk's points under the pre-chunk statistics,
  one transition before the first point, then gamma = 1 between the points, so that the
  chunk's prediction and its update share the prior ``q(W_n | S_{1:n-1})``.

In every mode the chunk is predicted one transition ahead at the current gamma (eq. 13 with
``M^- = gamma M``, ``A^- = gamma^2 A + (1 - gamma^2) s_w2 I``).

Blocked recursion (:func:`filter_blocked`, the default inside :func:`chunk_update`): a block of
B points is processed with two matrix-matrix products instead of 2B passes over A. With
``P = Phi A_0`` (rows ``A_0 phi_i``) and the basis ``V = [P^T, Phi^T]`` (m x 2B), every
intermediate covariance and mean of the block has the form

    A_i = a_i A_0 + b_i I - V C_i V^T,     M_i = c_i M_0 + V R_i,    C_i = U diag(w) U^T,

so the per-point recursion runs on the small coefficients (a, b, c, U, w, R) using only the Gram
matrices ``Phi A_0 Phi^T``, ``Phi Phi^T`` and ``Phi M_0``, and the block ends with
``A = a A_0 + b I - Z Z^T`` (``Z = V U diag(sqrt w)``, a rank-B update) and ``M = c M_0 + V R``.
It is the same recursion (equal to :func:`filter` up to rounding, tested), costs
``O(B m^2)`` flops as BLAS-3 per block and reads A twice per *block* rather than per point,
which is what makes it fast on a GPU (few, large kernels per block) and on CPU for large m.

Monte Carlo draws: in :func:`filter` / :func:`filter_blocked` the ``(S, K)`` draws of point i
come from ``fold_in(rng_key, i)`` inside the scan (memory independent of the stream length; the
same draws in both recursions); :func:`chunk_update` draws a chunk's ``(b, S, K)`` at once.

The replay memory of App. D.4 is :mod:`inference.replay`; the fine-tuning step on (theta,
alpha) that precedes a chunk's recursion is :mod:`inference.kalman_finetune`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from models.kalman import DriftPrior, GaussianLikelihood, SoftmaxLikelihood, SurrogateLikelihood
from models.linalg_jax import symmetrize

__all__ = [
    "KalmanParams", "FilterOptions", "KalmanState", "StepInfo", "ChunkInfo", "KalmanFilter",
    "init", "forgetting", "step", "filter", "filter_blocked", "chunk_update",
    "default_block_size", "FLOAT32_BLOCK_SIZE",
    "predictive_moments", "class_probabilities", "log_predictive", "mean_log_predictive",
    "masked_mean", "TRANSITIONS",
    "projected_prior",
]

_LOG_2PI = math.log(2.0 * math.pi)


# ---------------------------------------------------------------------------------------------
# containers
# ---------------------------------------------------------------------------------------------
class KalmanParams(NamedTuple):
    """Hyperparameters used by the recursions (all leaves may be traced).

    Attributes:
        prior: :class:`models.kalman.DriftPrior` (``s_w2``; eqs. 2-3).
        observation: :class:`models.kalman.GaussianLikelihood` (regression, eq. 1) or
            :class:`models.kalman.SurrogateLikelihood` (classification, Sect. 2.1 (i)): ``s2``.
        readout: :class:`models.kalman.SoftmaxLikelihood` (``alpha``, eq. 13); unused for
            regression.
    """

    prior: DriftPrior
    observation: GaussianLikelihood | SurrogateLikelihood
    readout: SoftmaxLikelihood = SoftmaxLikelihood(1.0)


class FilterOptions(NamedTuple):
    """Static (hashable) choices of the filter.

    Attributes:
        learning_rate: rho, the SGD step size for delta; required (no default here: the tuned
            value is ``forgetting_learning_rate`` of ``ppl_cl/configs/kalman.py``, the one place
            of that default), and unused when ``learn_forgetting`` is ``False``.
        likelihood: ``"gaussian"`` (regression: the predictive of eq. 6 / App. B) or
            ``"softmax"`` (classification: Monte Carlo eq. 12-13 over the logits).
        learn_forgetting: online SGD on delta (eq. 9 / 16); ``False`` keeps gamma fixed.
        max_delta: upper clip of delta (``inf``: only ``delta >= 0`` as in the paper).
        num_samples: S, Monte Carlo samples of the logits (softmax only).
        mean_preserving: App. C variant ``M^- = M`` (no shrinkage of the mean).
        calibrated_forgetting: delta's objective is the calibrated eq. 13 (Sect. 2.1.2: "the
            softmax in (11) is replaced by" the calibrated one; the default); ``False``: the
            plain eq. 12 (alpha = 1).
    """

    learning_rate: float
    likelihood: str = "gaussian"
    learn_forgetting: bool = True
    max_delta: float = math.inf
    num_samples: int = 16
    mean_preserving: bool = False
    calibrated_forgetting: bool = True


class KalmanState(NamedTuple):
    """Filtered posterior ``q(W_n | y_{1:n}) = prod_k N(w_{n,k} | M[:, k], A)`` and delta.

    Attributes:
        mean: ``M_n``, shape ``(m, K)`` (regression: K = 1).
        covariance: ``A_n``, shape ``(m, m)``, shared by the K columns (eqs. 7-8).
        delta: ``delta_n >= 0``, shape ``()``; ``gamma_n = exp(-delta_n / 2)``.
        num_points: number of points assimilated, shape ``()``.
    """

    mean: Array
    covariance: Array
    delta: Array
    num_points: Array


class StepInfo(NamedTuple):
    """What one point's step saw (stacked along the leading axis by the scans).

    Attributes:
        log_predictive: ``log p(y_n | y_{1:n-1})`` at the pre-update delta (the quantity whose
            delta-gradient is the SGD direction; the one-step-ahead online log-loss).
        predictive_mean: ``mu_n = (M_n^-)^T phi_n``, shape ``(K,)``.
        predictive_variance: ``s_n^2 = phi_n^T A_n^- phi_n`` (latent / logit variance; the
            regression predictive variance is ``s_n^2 + s2``).
        forgetting: ``gamma_n`` used in this point's transition (1 where none was taken).
        delta_gradient: ``d log p(y_n | y_{1:n-1}) / d delta`` (0 where delta was not learned).
    """

    log_predictive: Array
    predictive_mean: Array
    predictive_variance: Array
    forgetting: Array
    delta_gradient: Array


class ChunkInfo(NamedTuple):
    """Record of :func:`chunk_update`.

    Attributes:
        steps: per-point :class:`StepInfo`, leading axis = chunk points.
        chunk_log_predictive: mean log predictive of the chunk under the pre-chunk statistics
            (the ``"first"`` transition's delta objective; NaN for ``"always"`` / ``"last"``).
        chunk_delta_gradient: its delta-gradient (0 for ``"always"`` / ``"last"``).
    """

    steps: StepInfo
    chunk_log_predictive: Array
    chunk_delta_gradient: Array


# ---------------------------------------------------------------------------------------------
# init / small helpers
# ---------------------------------------------------------------------------------------------
def init(num_features: int, num_outputs: int = 1, *, prior: DriftPrior,
         initial_forgetting: float = 1.0, dtype: Any = jnp.float64) -> KalmanState:
    """``M_0 = 0``, ``A_0 = s_w2 I`` (eq. 2), ``delta_0 = -2 log gamma_0``.

    Args:
        num_features: m; num_outputs: K (1 for regression);
        prior: :class:`DriftPrior`; initial_forgetting: gamma_0 in (0, 1];
        dtype: float32 or float64 (float64 needs ``jax_enable_x64``).
    """
    if int(num_features) < 1 or int(num_outputs) < 1:
        raise ValueError(f"num_features, num_outputs: expected positive ints, received "
                         f"{num_features}, {num_outputs}")
    g0 = float(initial_forgetting)
    if not (0.0 < g0 <= 1.0):
        raise ValueError(f"initial_forgetting: expected gamma_0 in (0, 1], received {g0}")
    s_w2 = float(prior.prior_variance)
    if not (s_w2 > 0.0 and math.isfinite(s_w2)):
        raise ValueError(f"prior.prior_variance: expected a finite value > 0, received {s_w2}")
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float64 and not jax.config.read("jax_enable_x64"):
        raise ValueError("dtype float64 requested but jax_enable_x64 is off (call "
                         "ppl_cl.numerics.enable_x64() first)")
    return KalmanState(
        mean=jnp.zeros((num_features, num_outputs), dtype),
        covariance=s_w2 * jnp.eye(num_features, dtype=dtype),
        delta=jnp.asarray(-2.0 * math.log(g0), dtype),
        num_points=jnp.asarray(0, jnp.int32),
    )


def forgetting(state: KalmanState) -> Array:
    """Current ``gamma = exp(-delta / 2)``."""
    return jnp.exp(-0.5 * state.delta)


def _as(x: Any, dtype) -> Array:
    return jnp.asarray(x, dtype=dtype)


def projected_prior(delta: Array, mean_projection: Array, variance_projection: Array,
                    feature_sqnorm: Array, prior_variance: Array,
                    mean_preserving: bool = False) -> tuple[Array, Array]:
    """The prediction step (eq. 4 / 7) projected on phi.

    ``mu = gamma mu0`` (App. C: ``mu0``) and ``s^2 = gamma^2 q + (1 - gamma^2) s_w2 |phi|^2``
    with ``mu0 = M^T phi`` ``(..., K)``, ``q = phi^T A phi`` ``(...)``, ``|phi|^2`` ``(...)``.
    ``1 - gamma^2 = -expm1(-delta)`` keeps small deltas accurate.
    """
    gamma = jnp.exp(-0.5 * delta)
    gamma2 = jnp.exp(-delta)
    one_minus = -jnp.expm1(-delta)
    mu = mean_projection if mean_preserving else gamma[..., None] * mean_projection
    s2 = gamma2 * variance_projection + one_minus * prior_variance * feature_sqnorm
    return mu, s2


def _safe_sqrt(x: Array) -> Array:
    """``sqrt(x)`` whose gradient at ``x = 0`` is 0 instead of inf.

    A point with zero features (an empty replay slot, a masked point, or a real point whose
    features vanish) has ``s^2 = 0``; its log predictive does not depend on delta or alpha
    through ``s`` there, but ``d sqrt / dx = inf`` times a zero cotangent is NaN, which would
    poison the gradient of a whole chunk."""
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def _point_log_predictive(mu: Array, s2: Array, target_vec: Array, label: Array, eps: Any,
                          params: KalmanParams, options: FilterOptions) -> Array:
    """log p(y | y_{1:n-1}) of one point from its projected prior (mu (K,), s2 ())."""
    if options.likelihood == "gaussian":
        var = s2 + params.observation.noise_variance
        return jnp.sum(-0.5 * (_LOG_2PI + jnp.log(var) + (target_vec - mu) ** 2 / var))
    if options.likelihood == "softmax":
        alpha = params.readout.calibration
        logits = alpha * (mu[None, :] + _safe_sqrt(s2) * eps)        # (S, K), eq. 13
        logp = jax.nn.log_softmax(logits, axis=-1)[:, label]
        return jax.scipy.special.logsumexp(logp) - jnp.log(eps.shape[0])
    raise ValueError(f"options.likelihood: expected 'gaussian' or 'softmax', received "
                     f"{options.likelihood!r}")


def _targets(targets: Array, num_outputs: int, options: FilterOptions, dtype) -> tuple[Array, Array]:
    """``(target vectors (n, K), labels (n,))``: one-hot of labels for the softmax case."""
    targets = jnp.asarray(targets)
    n = targets.shape[0]
    if options.likelihood == "softmax":
        labels = targets.astype(jnp.int32)
        return jax.nn.one_hot(labels, num_outputs, dtype=dtype), labels
    return targets.reshape(n, num_outputs).astype(dtype), jnp.zeros((n,), jnp.int32)


def _standard_normal(rng_key: Array, shape: tuple[int, ...], dtype) -> Array:
    """``N(0, I)`` draws of ``shape``, generated flat and reshaped (XLA compiles the flat
    threefry + normal transform several times faster than a multi-dimensional one)."""
    return jax.random.normal(rng_key, (math.prod(shape),), dtype).reshape(shape)


def _noise(rng_key: Array, n: int, num_outputs: int, options: FilterOptions, dtype) -> Any:
    """Standard normals ``(n, S, K)`` for eq. 12-13 on a batch, or an empty array (regression)."""
    if options.likelihood != "softmax":
        return jnp.zeros((n, 0), dtype)
    return _standard_normal(rng_key, (n, options.num_samples, num_outputs), dtype)


def _point_noise(rng_key: Array, index: Array, num_outputs: int, options: FilterOptions,
                 dtype) -> Any:
    """The ``(S, K)`` draws of eq. 12 for the point at ``index`` of a sequence, from
    ``fold_in(rng_key, index)``: generated inside the scans (memory O(S K), not O(N S K)) and
    identical in the dense and the blocked recursions."""
    if options.likelihood != "softmax":
        return jnp.zeros((0,), dtype)
    return _standard_normal(jax.random.fold_in(rng_key, index),
                            (options.num_samples, num_outputs), dtype)


def _delta_step(delta: Array, mu0: Array, q: Array, n2: Array, target_vec: Array, label: Array,
                eps: Any, transition: Array, learn: Array, params: KalmanParams,
                options: FilterOptions) -> tuple[Array, Array, Array, Array, Array]:
    """One SGD step of eq. 9 / 16 on delta, shared by the dense and the blocked recursions.

    Returns ``(new delta, log p at the old delta, mu, s2, gradient)``. Where this point takes no
    transition the predictive uses gamma = 1 and delta is left alone.
    """
    dtype = q.dtype
    s_w2 = _as(params.prior.prior_variance, dtype)
    zero = jnp.zeros((), dtype)
    params = _forgetting_params(params, options)

    def logp(d):
        mu, s2 = projected_prior(d, mu0, q, n2, s_w2, options.mean_preserving)
        return _point_log_predictive(mu, s2, target_vec, label, eps, params, options), (mu, s2)

    d_prior = jnp.where(transition, delta, zero)
    if options.learn_forgetting:
        (value, (mu, s2)), grad = jax.value_and_grad(logp, has_aux=True)(d_prior)
        take = jnp.logical_and(transition, learn)
        grad = jnp.where(take, grad, zero)
        stepped = jnp.clip(delta + options.learning_rate * grad, 0.0, options.max_delta)
        new_delta = jnp.where(take, stepped, delta)
    else:
        value, (mu, s2) = logp(d_prior)
        grad, new_delta = zero, delta
    return new_delta, value, mu, s2, grad


def _forgetting_params(params: KalmanParams, options: FilterOptions) -> KalmanParams:
    """The parameters of delta's objective: eq. 12 (alpha = 1) unless calibrated_forgetting."""
    if options.calibrated_forgetting:
        return params
    return params._replace(readout=SoftmaxLikelihood(1.0))


def _override(delta: Array, delta_fixed: Array) -> Array:
    """A fixed delta (forgetting sequence given by the caller) where not NaN."""
    return jnp.where(jnp.isnan(delta_fixed), delta, delta_fixed)


# ---------------------------------------------------------------------------------------------
# dense per-point recursion
# ---------------------------------------------------------------------------------------------
def _dense_point(state: KalmanState, phi: Array, target_vec: Array, label: Array, eps: Any,
                 transition: Array, learn: Array, valid: Array, delta_fixed: Array,
                 params: KalmanParams, options: FilterOptions) -> tuple[KalmanState, StepInfo]:
    M, A = state.mean, state.covariance
    dtype = A.dtype
    s_w2 = _as(params.prior.prior_variance, dtype)
    s2_noise = _as(params.observation.noise_variance, dtype)
    phi = jnp.where(valid, phi, 0.0)
    learn = jnp.logical_and(learn, valid)
    delta = _override(state.delta, delta_fixed)

    # projections of the old posterior: A phi (one pass over A), q = phi^T A phi, mu0 = M^T phi
    A_phi = A @ phi
    q = phi @ A_phi
    n2 = phi @ phi
    mu0 = phi @ M

    # eq. 9 / 16: SGD step on delta at the pre-update value
    delta, logp, mu_pred, s2_pred, grad = _delta_step(
        delta, mu0, q, n2, target_vec, label, eps, transition, learn, params, options)

    # eq. 4 / 7 with the new gamma (gamma = 1 where no transition), folded into eq. 5 / 8:
    #   k = A^- phi = gamma^2 A phi + (1 - gamma^2) s_w2 phi,   S = s2 + phi^T A^- phi
    d_t = jnp.where(transition, delta, 0.0)
    gamma = jnp.exp(-0.5 * d_t)
    gamma2 = jnp.exp(-d_t)
    c = -jnp.expm1(-d_t) * s_w2
    k = gamma2 * A_phi + c * phi
    mu_prior = mu0 if options.mean_preserving else gamma * mu0
    # S from phi^T k (= gamma^2 q + (1 - gamma^2) s_w2 |phi|^2): written this way XLA keeps the
    # reduction out of the m x m update loop below (from q it fused the reduction into that loop
    # and recomputed it per entry: 6x slower at m = 256)
    S = phi @ k + s2_noise
    r = (target_vec - mu_prior) * valid
    M_prior = M if options.mean_preserving else gamma * M
    M_new = M_prior + jnp.outer(k, r / S)
    # A = A^- - k k^T / S written as A^- - v v^T with v = k / sqrt(S): (v v^T)_ij = v_i v_j is
    # symmetric in IEEE arithmetic, so A stays exactly symmetric without an extra pass.
    v = k * jax.lax.rsqrt(S)
    A_new = gamma2 * A + c * jnp.eye(A.shape[0], dtype=dtype) - jnp.outer(v, v)

    new_state = KalmanState(M_new, A_new, delta.astype(dtype),
                            state.num_points + valid.astype(jnp.int32))
    return new_state, StepInfo(logp, mu_pred, s2_pred, gamma, grad)


def step(rng_key: Array, state: KalmanState, feature: Array, target: Array,
         params: KalmanParams, options: FilterOptions, *,
         forgetting_coefficient: Array | None = None) -> tuple[KalmanState, StepInfo]:
    """One point of Algorithm 1: predictive and delta step (eq. 9 / 16), transition (eq. 4 / 7),
    update (eq. 5 / 8).

    Args:
        rng_key: PRNG key (the Monte Carlo noise of eq. 12; unused for regression).
        state: :class:`KalmanState` with mean ``(m, K)``.
        feature: ``phi_n``, shape ``(m,)``.
        target: regression value(s) ``()`` / ``(K,)``, or an integer label (softmax).
        params: :class:`KalmanParams`; options: :class:`FilterOptions` (static).
        forgetting_coefficient: a fixed gamma_n for this step (no learning), or ``None``.
    """
    dtype = state.covariance.dtype
    K = state.mean.shape[1]
    target = jnp.asarray(target)
    target = target.reshape(1) if options.likelihood == "softmax" else target.reshape(1, K)
    t_vec, labels = _targets(target, K, options, dtype)
    eps = _point_noise(rng_key, 0, K, options, dtype)
    fixed = (jnp.asarray(jnp.nan, dtype) if forgetting_coefficient is None
             else -2.0 * jnp.log(_as(forgetting_coefficient, dtype)))
    learn = jnp.asarray(forgetting_coefficient is None)
    return _dense_point(state, _as(feature, dtype), t_vec[0], labels[0], eps, jnp.asarray(True),
                        learn, jnp.asarray(True), fixed, params, options)


def _per_point_inputs(state, features, targets, options, forgetting_coefficients, mask):
    dtype = state.covariance.dtype
    features = _as(features, dtype)
    n = features.shape[0]
    K = state.mean.shape[1]
    t_vec, labels = _targets(targets, K, options, dtype)
    index = jnp.arange(n, dtype=jnp.int32)
    valid = jnp.ones((n,), bool) if mask is None else jnp.asarray(mask, bool)
    if forgetting_coefficients is None:
        fixed = jnp.full((n,), jnp.nan, dtype)
        learn = valid
    else:
        fixed = -2.0 * jnp.log(jnp.broadcast_to(_as(forgetting_coefficients, dtype), (n,)))
        learn = jnp.zeros((n,), bool)
    return features, t_vec, labels, index, valid, learn, fixed


def filter(rng_key: Array, state: KalmanState, features: Array, targets: Array,
           params: KalmanParams, options: FilterOptions, *,
           forgetting_coefficients: Array | None = None,
           mask: Array | None = None) -> tuple[KalmanState, StepInfo]:
    """:func:`step` over a sequence with ``lax.scan`` (a transition before every point).

    Args:
        rng_key: PRNG key (the Monte Carlo draws of all points).
        state: initial :class:`KalmanState`.
        features: ``(N, m)``; targets: ``(N,)`` / ``(N, K)`` values or ``(N,)`` labels.
        params, options: as in :func:`step`.
        forgetting_coefficients: fixed ``gamma_{1:N}`` (scalar or ``(N,)``), disabling learning.
        mask: ``(N,)`` booleans; masked points leave the state unchanged.

    Returns:
        ``(final state, StepInfo with leading axis N)``.
    """
    features, t_vec, labels, index, valid, learn, fixed = _per_point_inputs(
        state, features, targets, options, forgetting_coefficients, mask)
    K = state.mean.shape[1]
    dtype = state.covariance.dtype

    def body(s, xs):
        phi, t, lab, i, val, lrn, fx = xs
        e = _point_noise(rng_key, i, K, options, dtype)
        return _dense_point(s, phi, t, lab, e, val, lrn, val, fx, params, options)

    return jax.lax.scan(body, state, (features, t_vec, labels, index, valid, learn, fixed))


# ---------------------------------------------------------------------------------------------
# blocked recursion (same algebra, BLAS-3)
# ---------------------------------------------------------------------------------------------
def _block(state: KalmanState, Phi: Array, T: Array, labels: Array, index: Array,
           transition: Array, learn: Array, valid: Array, fixed: Array, noise: Array | None,
           params: KalmanParams, options: FilterOptions,
           rng_key: Array) -> tuple[KalmanState, StepInfo]:
    """B points of the recursion in the coefficient space of ``V = [P^T, Phi^T]`` (module doc)."""
    dtype = state.covariance.dtype
    A0, M0 = state.covariance, state.mean
    B, m = Phi.shape
    s_w2 = _as(params.prior.prior_variance, dtype)
    s2_noise = _as(params.observation.noise_variance, dtype)
    Phi = Phi * valid[:, None]

    # the only passes over A_0 before the block's end: P = Phi A_0 and the Gram matrices
    P = Phi @ A0                       # (B, m), row i = A_0 phi_i
    G1 = P @ Phi.T                     # (B, B), phi_i^T A_0 phi_j
    G0 = Phi @ Phi.T                   # (B, B), phi_i^T phi_j
    H = Phi @ M0                       # (B, K), M_0^T phi_i
    Gcat = jnp.concatenate([G1, G0], axis=0)   # column i: g_i = V^T phi_i, (2B,)
    one, zero = jnp.ones((), dtype), jnp.zeros((), dtype)

    def body(carry, xs):
        a, b, c, U, w, R, delta = carry
        i, t, lab, point, trans, lrn, val, fx, e = xs
        if e is None:
            e = _point_noise(rng_key, point, M0.shape[1], options, dtype)
        delta = _override(delta, fx)
        g = Gcat[:, i]
        Ug = U.T @ g                                   # u_j^T g
        # projections of the old posterior A_{i-1} = a A_0 + b I - U diag(w) U^T (in V)
        q = a * G1[i, i] + b * G0[i, i] - jnp.sum(w * Ug * Ug)
        n2 = G0[i, i]
        mu0 = c * H[i] + R.T @ g
        delta, logp, mu_pred, s2_pred, grad = _delta_step(
            delta, mu0, q, n2, t, lab, e, trans, lrn, params, options)
        # transition (eq. 4 / 7) on the coefficients
        d_t = jnp.where(trans, delta, zero)
        gamma2 = jnp.exp(-d_t)
        gamma = jnp.exp(-0.5 * d_t)
        a = gamma2 * a
        b = gamma2 * b - jnp.expm1(-d_t) * s_w2
        w = gamma2 * w
        if not options.mean_preserving:
            c = gamma * c
            R = gamma * R
        # k = A^- phi_i = V u,  u = a e_i + b e_{B+i} - C g_i   (eq. 5 / 8)
        u = -(U @ (w * Ug))
        u = u.at[i].add(a).at[B + i].add(b)
        u = jnp.where(val, u, zero)
        mu_prior, s2 = projected_prior(d_t, mu0, q, n2, s_w2, options.mean_preserving)
        S = s2 + s2_noise
        r = t - mu_prior
        U = U.at[:, i].set(u)
        w = w.at[i].set(jnp.where(val, 1.0 / S, zero))
        R = R + jnp.outer(u, r / S)
        return (a, b, c, U, w, R, delta), StepInfo(logp, mu_pred, s2_pred, gamma, grad)

    K = M0.shape[1]
    carry0 = (one, zero, one, jnp.zeros((2 * B, B), dtype), jnp.zeros((B,), dtype),
              jnp.zeros((2 * B, K), dtype), state.delta)
    (a, b, c, U, w, R, delta), info = jax.lax.scan(
        body, carry0, (jnp.arange(B), T, labels, index, transition, learn, valid, fixed, noise))

    # block end: A = a A_0 + b I - Z Z^T (rank B), M = c M_0 + V R
    Z = (P.T @ U[:B] + Phi.T @ U[B:]) * jnp.sqrt(w)[None, :]
    A = symmetrize(a * A0 + b * jnp.eye(m, dtype=dtype) - Z @ Z.T)
    M = c * M0 + P.T @ R[:B] + Phi.T @ R[B:]
    new_state = KalmanState(M, A, delta.astype(dtype),
                            state.num_points + jnp.sum(valid).astype(jnp.int32))
    return new_state, info


FLOAT32_BLOCK_SIZE = 8


def default_block_size(num_features: int, dtype: Any = None) -> int:
    """Points per block when none is given.

    float64: ``m / 8`` clipped to [16, 128] (a power of two). The block's end costs O(B m^2)
    flops as two matrix products (about 4 m^2 per point whatever B) and one read + write of A
    per block; the per-point recursion inside the block costs O(B^2) (coefficients in the
    2B-dimensional basis). Measured on CPU: B = 32 is fastest at m = 256 and B = 128 at
    m = 1024, i.e. B ~ m / 8.

    float32: :data:`FLOAT32_BLOCK_SIZE` = 8. The block's coefficients accumulate rounding
    that grows with B; on an ill-conditioned stream (gamma = 1, s2 = 0.01, correlated ReLU
    features) B = 8 keeps the float32 error against float64 within twice the per-point scan's,
    where B = 64 does not (tests/inference/test_kalman.py)."""
    if dtype is not None and jnp.dtype(dtype) == jnp.float32:
        return FLOAT32_BLOCK_SIZE
    target = max(16, min(128, int(num_features) // 8))
    return 1 << (target.bit_length() - 1)


def _blocked_scan(state, features, t_vec, labels, index, transition, learn, valid, fixed,
                  params, options, block_size: int | None, rng_key,
                  noise: Array | None = None) -> tuple[KalmanState, StepInfo]:
    n = features.shape[0]
    if block_size is None:
        block_size = default_block_size(features.shape[1], features.dtype)
    B = max(1, min(int(block_size), n))
    nb = -(-n // B)
    pad = nb * B - n

    def padded(x, value):
        if pad == 0:
            return x
        widths = [(0, pad)] + [(0, 0)] * (x.ndim - 1)
        return jnp.pad(x, widths, constant_values=value)

    xs = (padded(features, 0), padded(t_vec, 0), padded(labels, 0), padded(index, 0),
          padded(transition, False), padded(learn, False), padded(valid, False),
          padded(fixed, jnp.nan), None if noise is None else padded(noise, 0))
    xs = jax.tree_util.tree_map(lambda x: x.reshape((nb, B) + x.shape[1:]), xs)

    def body(s, blk):
        return _block(s, *blk, params, options, rng_key)

    state, info = jax.lax.scan(body, state, xs)
    info = jax.tree_util.tree_map(lambda x: x.reshape((nb * B,) + x.shape[2:])[:n], info)
    return state, info


def filter_blocked(rng_key: Array, state: KalmanState, features: Array, targets: Array,
                   params: KalmanParams, options: FilterOptions, *,
                   block_size: int | None = None,
                   forgetting_coefficients: Array | None = None,
                   mask: Array | None = None) -> tuple[KalmanState, StepInfo]:
    """Same result as :func:`filter` (same keys, same per-point noise), computed by blocks of
    ``block_size`` points (module docstring; ``None``: :func:`default_block_size`). Other
    arguments as in :func:`filter`."""
    features, t_vec, labels, index, valid, learn, fixed = _per_point_inputs(
        state, features, targets, options, forgetting_coefficients, mask)
    return _blocked_scan(state, features, t_vec, labels, index, valid, learn, valid, fixed,
                         params, options, block_size, rng_key)


# ---------------------------------------------------------------------------------------------
# prediction (eq. 6, eq. 13) on a batch
# ---------------------------------------------------------------------------------------------
def _batch_prior(state: KalmanState, Phi: Array, params: KalmanParams, options: FilterOptions,
                 delta: Array | None = None) -> tuple[Array, Array]:
    """:func:`projected_prior` of every row of ``Phi`` ``(n, m)`` from the projections of the
    old posterior, ``P = Phi A`` (rows ``A phi_i``), ``q = phi_i^T A phi_i``, ``|phi_i|^2`` and
    ``mu0 = M^T phi_i``, at ``delta`` (default: the state's). Returns ``(mu (n, K), s2 (n,))``."""
    P = Phi @ state.covariance
    q = jnp.sum(P * Phi, axis=1)
    n2 = jnp.sum(Phi * Phi, axis=1)
    mu0 = Phi @ state.mean
    d = state.delta if delta is None else delta
    return projected_prior(jnp.broadcast_to(d, q.shape), mu0, q, n2,
                           _as(params.prior.prior_variance, Phi.dtype), options.mean_preserving)


def predictive_moments(state: KalmanState, features: Array, params: KalmanParams,
                       options: FilterOptions) -> tuple[Array, Array]:
    """Moments of the latent ``f = W_n^T phi`` under ``q(W_n | y_{1:n-1})`` (one transition at
    the current gamma), for every row of ``features`` ``(n, m)`` independently (App. D.2).

    Returns ``(mean (n, K), variance (n,))``; the regression predictive of y adds ``s2``.
    """
    return _batch_prior(state, _as(features, state.covariance.dtype), params, options)


def class_probabilities(rng_key: Array, mean: Array, variance: Array, calibration: Any = 1.0,
                        num_samples: int = 16) -> Array:
    """Eq. 13 without the log: ``(1/S) sum_s softmax(alpha (mu + s eps_s))``, shape ``(n, K)``."""
    n, K = mean.shape
    eps = _standard_normal(rng_key, (n, num_samples, K), mean.dtype)
    logits = calibration * (mean[:, None, :] + jnp.sqrt(variance)[:, None, None] * eps)
    return jnp.mean(jax.nn.softmax(logits, axis=-1), axis=1)


def log_predictive(rng_key: Array, state: KalmanState, features: Array, targets: Array,
                   params: KalmanParams, options: FilterOptions,
                   delta: Array | None = None) -> Array:
    """Per-point ``log p(y_i | y_{1:n-1})`` of a chunk under the pre-chunk statistics and one
    transition (eq. 6 regression; eq. 13 Monte Carlo with S draws per point, for softmax).

    Differentiable in ``features`` (fine-tuning theta), ``params.readout.calibration`` (alpha)
    and ``delta`` (default: the state's). Returns shape ``(n,)``.
    """
    dtype = state.covariance.dtype
    Phi = _as(features, dtype)
    n = Phi.shape[0]
    K = state.mean.shape[1]
    t_vec, labels = _targets(targets, K, options, dtype)
    eps = _noise(rng_key, n, K, options, dtype)
    mu, s2 = _batch_prior(state, Phi, params, options, delta)
    return jax.vmap(lambda mu_i, s2_i, t_i, l_i, e_i: _point_log_predictive(
        mu_i, s2_i, t_i, l_i, e_i, params, options))(mu, s2, t_vec, labels, eps)


def mean_log_predictive(rng_key: Array, state: KalmanState, features: Array, targets: Array,
                        params: KalmanParams, options: FilterOptions, mask: Array | None = None,
                        delta: Array | None = None) -> Array:
    """Masked mean of :func:`log_predictive`: the chunk objective of Sect. 2.1.2 (fine-tuning
    theta and alpha) and of the ``"first"`` transition's delta step."""
    return masked_mean(log_predictive(rng_key, state, features, targets, params, options, delta),
                       mask)


def masked_mean(values: Array, mask: Array | None = None) -> Array:
    """Mean of ``values`` ``(n,)`` over ``mask`` (all when None; 0 points: 0)."""
    if mask is None:
        return jnp.mean(values)
    w = jnp.asarray(mask, values.dtype)
    return jnp.sum(values * w) / jnp.maximum(jnp.sum(w), 1.0)


# ---------------------------------------------------------------------------------------------
# chunked protocol (App. D.2)
# ---------------------------------------------------------------------------------------------
TRANSITIONS = ("always", "last", "first")


def _check_transition(transition: str, method: str = "blocked") -> None:
    if transition not in TRANSITIONS:
        raise ValueError(f"transition: expected one of {', '.join(TRANSITIONS)}, received "
                         f"{transition!r}")
    if method not in ("blocked", "sequential"):
        raise ValueError(f"method: expected 'blocked' or 'sequential', received {method!r}")


def chunk_update(rng_key: Array, state: KalmanState, features: Array, targets: Array,
                 params: KalmanParams, options: FilterOptions, *, transition: str = "always",
                 mask: Array | None = None, block_size: int | None = None,
                 method: str = "blocked") -> tuple[KalmanState, ChunkInfo]:
    """The recursion over one chunk after its prediction (App. D.2).

    Args:
        rng_key: PRNG key.
        state: :class:`KalmanState`.
        features: ``(b, m)`` (recomputed with the fine-tuned theta); targets as in :func:`filter`.
        params, options: :class:`KalmanParams`, :class:`FilterOptions` (static).
        transition: ``"always"`` (Always Markov), ``"last"`` (Last Step Markov: the transition
            on the chunk's last point) or ``"first"`` (the chunk as one time step, transition
            before its first point; module docstring).
        mask: ``(b,)`` booleans (e.g. empty replay slots); masked points are skipped.
        block_size: points per block of the blocked recursion (``None``:
            :func:`default_block_size`).
        method: ``"blocked"`` or ``"sequential"`` (the dense per-point scan).

    Returns:
        ``(state, ChunkInfo)``.
    """
    _check_transition(transition, method)
    dtype = state.covariance.dtype
    key_chunk, key_points = jax.random.split(rng_key)
    features, t_vec, labels, index, valid, learn, fixed = _per_point_inputs(
        state, features, targets, options, None, mask)
    K = state.mean.shape[1]
    # a chunk is short: its (b, S, K) Monte Carlo draws are made at once (one flat draw)
    noise = _noise(key_points, features.shape[0], K, options, dtype) \
        if options.likelihood == "softmax" else None
    n = features.shape[0]
    nan, zero = jnp.asarray(jnp.nan, dtype), jnp.zeros((), dtype)

    if transition == "always":
        trans = valid
        chunk_lp, chunk_grad = nan, zero
    elif transition == "last":
        # the transition and the delta step of Algorithm 1 on the last valid point only
        last = jnp.max(jnp.where(valid, jnp.arange(n), -1))
        trans = jnp.arange(n) == last
        learn = jnp.logical_and(learn, trans)
        chunk_lp, chunk_grad = nan, zero
    else:
        # one delta step on the chunk's mean log predictive, then one transition (first point)
        delta_params = _forgetting_params(params, options)

        def objective(d):
            return mean_log_predictive(key_chunk, state, features, targets, delta_params,
                                       options, valid, d)

        if options.learn_forgetting:
            chunk_lp, chunk_grad = jax.value_and_grad(objective)(state.delta)
            new_delta = jnp.clip(state.delta + options.learning_rate * chunk_grad, 0.0,
                                 options.max_delta)
            state = state._replace(delta=new_delta.astype(dtype))
        else:
            chunk_lp, chunk_grad = objective(state.delta), zero
        trans = jnp.zeros((n,), bool).at[0].set(True)
        learn = jnp.zeros((n,), bool)

    if method == "blocked":
        state, steps = _blocked_scan(state, features, t_vec, labels, index, trans, learn, valid,
                                     fixed, params, options, block_size, key_points, noise)
    else:
        def body(s, xs):
            phi, t, lab, e, tr, lrn, val, fx = xs
            if e is None:
                e = jnp.zeros((0,), dtype)
            return _dense_point(s, phi, t, lab, e, tr, lrn, val, fx, params, options)

        state, steps = jax.lax.scan(body, state, (features, t_vec, labels, noise, trans, learn,
                                                  valid, fixed))
    return state, ChunkInfo(steps, jnp.asarray(chunk_lp, dtype), jnp.asarray(chunk_grad, dtype))


# ---------------------------------------------------------------------------------------------
# the engine (inference/base.py contract)
# ---------------------------------------------------------------------------------------------
class KalmanFilter:
    """The Kalman filter of the drift model as an engine of :mod:`inference.base` (kind
    ``"jax"``): ``init(rng, num_features, ...) -> KalmanState`` (deterministic: ``rng`` is
    ignored) and ``step(rng, state, batch) -> (KalmanState, ChunkInfo)``.

    One ``step`` is one chunk of the App. D.2 recursion (:func:`chunk_update`): ``batch`` is
    ``(features (b, m), targets)`` or ``(features, targets, mask)``; a chunk of one point with
    ``transition="always"`` is one iteration of Algorithm 1 (delta step, transition, update).
    The engine holds only static choices; ``step`` is pure and can be ``jax.jit``-ed or
    scanned.

    Args:
        params: :class:`KalmanParams`.
        options: :class:`FilterOptions`.
        transition: ``"always"``, ``"last"`` (App. D.2) or ``"first"`` (:func:`chunk_update`).
        block_size: points per block of the blocked recursion (``None``:
            :func:`default_block_size`).
        method: ``"blocked"`` or ``"sequential"``.
    """

    kind = "jax"

    def __init__(self, params: KalmanParams, options: FilterOptions, *,
                 transition: str = "always", block_size: int | None = None,
                 method: str = "blocked") -> None:
        _check_transition(transition, method)
        self.params, self.options = params, options
        self.transition, self.block_size, self.method = transition, block_size, method

    def init(self, rng: Any, num_features: int, num_outputs: int = 1, *,
             initial_forgetting: float = 1.0, dtype: Any = jnp.float64) -> KalmanState:
        """:func:`init` with this engine's prior (``rng`` is unused: the prior is fixed)."""
        del rng
        return init(num_features, num_outputs, prior=self.params.prior,
                    initial_forgetting=initial_forgetting, dtype=dtype)

    def step(self, rng: Array, state: KalmanState, batch: tuple) -> tuple[KalmanState, ChunkInfo]:
        """The recursion over one chunk ``batch = (features, targets[, mask])``."""
        features, targets, *rest = batch
        mask = rest[0] if rest else None
        return chunk_update(rng, state, features, targets, self.params, self.options,
                            transition=self.transition, mask=mask, block_size=self.block_size,
                            method=self.method)
