"""The chunked Kalman online learner of Titsias et al. (2024), App. D.2:
fine-tuning of the representation and the calibration, then the Kalman recursion, as one engine
of :mod:`inference.base` of kind ``"jax"`` (``init(rng, *, input_dim)``; ``step`` is pure JAX).

For a chunk ``S_n = {(x_i, y_i)}`` (plus ``replay_size`` points drawn from the memory of the
most recent points, App. D.4):

1. the chunk's predictive log-loss under the pre-chunk statistics ``q(W_n | S_{1:n-1})``
   (eq. 13, Monte Carlo with S draws per point; every point predicted independently),

       L(theta, alpha) = -(1/b) sum_i log (1/S) sum_s softmax(alpha (mu_i + s_i eps_is))_{y_i},
       mu_i = (M^-)^T phi(x_i; theta),  s_i^2 = phi(x_i; theta)^T A^- phi(x_i; theta),

   takes one optimizer step on ``(theta, log alpha)`` (Sect. 2.1.2), step size ``eta`` for
   alpha and ``beta * eta`` for theta (App. D.1, relative gradient scale beta);
2. the features are recomputed with the new theta and the recursion runs through the chunk
   (:class:`inference.kalman.KalmanFilter`: "always" or "last" Markov transitions and the
   delta steps of Sect. 2.1.1);
3. the fresh chunk (not the replayed points) is written to the memory.

Regression (``likelihood="gaussian"``) uses the Gaussian log predictive of eq. 6 as the loss
and has no alpha.

:class:`KalmanFinetune` follows :mod:`inference.base`: ``init(rng, ...) -> FinetuneState``,
``step(rng, state, (x, y)) -> (FinetuneState, FinetuneInfo)``, and ``predict(rng, state, x)``
for the chunk's prediction. The optimizer state is optax's (a tree of arrays).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import Array

from inference import kalman as kf
from inference.replay import ReplayMemory, replay_add, replay_init, with_replay
from models.kalman import SoftmaxLikelihood

__all__ = ["FinetuneOptions", "FinetuneState", "FinetuneInfo", "KalmanFinetune"]


class FinetuneOptions(NamedTuple):
    """Static (hashable) choices of the fine-tuning step.

    Attributes:
        fine_tune: train theta (Sect. 2.1.2); ``False`` keeps the features fixed.
        learn_calibration: train alpha (eq. 13; classification only).
        optimizer: ``"sgd"`` or ``"adamw"`` (App. D.3, Table 3).
        learning_rate: eta, the step size of log alpha.
        backbone_scale: beta; theta's step size is ``beta * eta`` (App. D.1).
        backbone_learning_rate: theta's step size when given (``None``: ``beta * eta``); the
            step sizes may be traced arrays (a search over them compiles once).
        weight_decay: AdamW's lambda.
        replay_capacity: points in the memory (0: no replay, App. D.4: 100).
        replay_size: points replayed per chunk (App. D.4: 10).
        transition: ``"always"`` or ``"last"`` (App. D.2).
        block_size: of the blocked recursion (``None``: :func:`inference.kalman.default_block_size`).
    """

    fine_tune: bool = False
    learn_calibration: bool = True
    optimizer: str = "sgd"
    learning_rate: float = 0.01
    backbone_scale: float = 1.0
    backbone_learning_rate: Any = None
    weight_decay: float = 1e-4
    replay_capacity: int = 0
    replay_size: int = 10
    transition: str = "always"
    block_size: int | None = None


class FinetuneState(NamedTuple):
    """Everything the learner carries from chunk to chunk.

    Attributes:
        filter: :class:`inference.kalman.KalmanState` (``M (m, K)``, ``A (m, m)``, delta).
        theta: the representation's parameters (a tree of arrays).
        log_alpha: ``log alpha``, shape ``()``.
        opt_state: optax state of the trainable parameters (``()`` when nothing is trained).
        memory: :class:`inference.replay.ReplayMemory` or ``None`` (no replay).
    """

    filter: kf.KalmanState
    theta: Any
    log_alpha: Array
    opt_state: Any
    memory: ReplayMemory | None


class FinetuneInfo(NamedTuple):
    """What one chunk's step saw.

    Attributes:
        loss: the chunk's mean negative log predictive under the pre-chunk statistics, before
            the (theta, alpha) step (step 1 of the module docstring; replayed points included).
        prequential_log_predictive: the mean log predictive of the chunk's own points (no
            replay) under the pre-chunk statistics and (theta, alpha): the prequential
            log-loss of the chunk, with the loss's Monte Carlo draws.
        chunk: the recursion's :class:`inference.kalman.ChunkInfo`.
        mask: ``(b + replay_size,)`` booleans: the points the recursion used.
        finite: ``{quantity: finite}`` for the loss and every new parameter and statistic
            (``loss``, ``mean``, ``covariance``, ``delta``, ``alpha``, ``theta``).
    """

    loss: Array
    prequential_log_predictive: Array
    chunk: kf.ChunkInfo
    mask: Array
    finite: Array


def _finite(named: dict[str, Any]) -> dict[str, Array]:
    """``{name: all leaves finite}`` for a dict of arrays / trees."""
    return {k: jnp.all(jnp.stack([jnp.all(jnp.isfinite(v))
                                  for v in jax.tree_util.tree_leaves(x)] or [jnp.asarray(True)]))
            for k, x in named.items()}


class KalmanFinetune:
    """The engine of the module docstring.

    Args:
        init_theta / features: the representation ``phi(x; theta)``: ``init_theta(rng) ->
            theta`` and ``features(theta, x) -> (n, m)`` (:mod:`models.feature_networks`).
        num_features: m (the width of ``features``' output).
        num_outputs: K (1 for regression).
        params: :class:`inference.kalman.KalmanParams` (its ``readout.calibration`` is replaced
            by ``exp(state.log_alpha)``).
        filter_options: :class:`inference.kalman.FilterOptions` (``likelihood`` chooses the
            softmax or the Gaussian objective).
        options: :class:`FinetuneOptions`.
    """

    kind = "jax"

    def __init__(self, init_theta: Callable[[Array], Any], features: Callable[[Any, Array], Array],
                 num_features: int, num_outputs: int, params: kf.KalmanParams,
                 filter_options: kf.FilterOptions, options: FinetuneOptions) -> None:
        self.init_theta, self.features = init_theta, features
        self.num_features, self.num_outputs = int(num_features), int(num_outputs)
        self.params, self.filter_options, self.options = params, filter_options, options
        self.softmax = filter_options.likelihood == "softmax"

    # -- pieces -------------------------------------------------------------------------------
    def _params(self, log_alpha: Array) -> kf.KalmanParams:
        return self.params._replace(readout=SoftmaxLikelihood(jnp.exp(log_alpha)))

    def _filter(self, log_alpha: Array) -> kf.KalmanFilter:
        return kf.KalmanFilter(self._params(log_alpha), self.filter_options,
                               transition=self.options.transition,
                               block_size=self.options.block_size)

    def _trainable(self, theta: Any, log_alpha: Array) -> dict:
        out = {}
        if self.options.fine_tune:
            out["theta"] = theta
        if self.options.learn_calibration and self.softmax:
            out["log_alpha"] = log_alpha
        return out

    def _optimizer(self, trainable: dict) -> optax.GradientTransformation:
        o = self.options

        def make(lr):
            return optax.sgd(lr) if o.optimizer == "sgd" else \
                optax.adamw(lr, weight_decay=o.weight_decay)

        labels = {k: jax.tree_util.tree_map(lambda _, k=k: k, v) for k, v in trainable.items()}
        theta_rate = o.learning_rate * o.backbone_scale if o.backbone_learning_rate is None \
            else o.backbone_learning_rate
        return optax.multi_transform({"log_alpha": make(o.learning_rate),
                                      "theta": make(theta_rate)}, labels)

    # -- the engine -----------------------------------------------------------------------------
    def init(self, rng: Array, *, input_dim: int, initial_forgetting: float = 1.0,
             initial_calibration: float = 1.0, dtype: Any = jnp.float32) -> FinetuneState:
        """``theta = init_theta(rng)``, the prior statistics (eq. 2), ``log alpha_0``, the
        optimizer state and an empty memory of ``replay_capacity`` inputs of size
        ``input_dim``."""
        dtype = jnp.dtype(dtype)
        theta = self.init_theta(rng)
        kstate = kf.init(self.num_features, self.num_outputs, prior=self.params.prior,
                         initial_forgetting=initial_forgetting, dtype=dtype)
        log_alpha = jnp.asarray(math.log(initial_calibration), dtype)
        trainable = self._trainable(theta, log_alpha)
        opt_state = self._optimizer(trainable).init(trainable) if trainable else ()
        memory = None
        if self.options.replay_capacity:
            memory = replay_init(self.options.replay_capacity, int(input_dim), dtype,
                                 jnp.int32 if self.softmax else dtype)
        return FinetuneState(kstate, theta, log_alpha, opt_state, memory)

    def predict(self, rng: Array, state: FinetuneState, x: Array):
        """The chunk's prediction under the current statistics (one transition ahead):
        class probabilities of eq. 13 ``(n, K)``, or the Gaussian ``(mean (n,), variance (n,))``
        of eq. 6 (latent variance + s2)."""
        dtype = state.filter.covariance.dtype
        phi = self.features(state.theta, x.astype(dtype))
        params = self._params(state.log_alpha)
        mean, var = kf.predictive_moments(state.filter, phi, params, self.filter_options)
        if self.softmax:
            return kf.class_probabilities(rng, mean, var, params.readout.calibration,
                                          self.filter_options.num_samples)
        return mean[:, 0], var + params.observation.noise_variance

    def step(self, rng: Array, state: FinetuneState, batch: tuple[Array, Array]
             ) -> tuple[FinetuneState, FinetuneInfo]:
        """One chunk ``batch = (x (b, d), y (b,))``: replay, (theta, alpha) step, recursion."""
        kstate, theta, log_alpha, opt_state, memory = state
        x, y = batch
        dtype = kstate.covariance.dtype
        k_replay, k_loss, k_rec = jax.random.split(rng, 3)
        x = x.astype(dtype)
        xa, ya, mask = with_replay(k_replay, memory, x, y, self.options.replay_size)

        def loss_fn(trainable):
            th = trainable.get("theta", theta)
            la = trainable.get("log_alpha", log_alpha)
            lp = kf.log_predictive(k_loss, kstate, self.features(th, xa), ya, self._params(la),
                                   self.filter_options)
            return -kf.masked_mean(lp, mask), lp

        trainable = self._trainable(theta, log_alpha)
        if trainable:
            (loss, lp), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
            updates, opt_state = self._optimizer(trainable).update(grads, opt_state, trainable)
            trainable = optax.apply_updates(trainable, updates)
            theta = trainable.get("theta", theta)
            log_alpha = trainable.get("log_alpha", log_alpha)
        else:
            loss, lp = loss_fn({})
        # App. D.2: recompute the features with the new theta, then the recursion
        kstate, chunk = self._filter(log_alpha).step(k_rec, kstate,
                                                     (self.features(theta, xa), ya, mask))
        if memory is not None:
            memory = replay_add(memory, x, y)
        finite = _finite({"loss": loss, "mean": kstate.mean, "covariance": kstate.covariance,
                          "delta": kstate.delta, "alpha": log_alpha, "theta": theta})
        return (FinetuneState(kstate, theta, log_alpha, opt_state, memory),
                FinetuneInfo(loss, jnp.mean(lp[: x.shape[0]]), chunk, mask, finite))
