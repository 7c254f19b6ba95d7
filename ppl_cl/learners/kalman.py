"""Kalman-filter online learners (Titsias et al. 2024, papers/kalman_ocl.txt).

* :class:`KalmanClassifier` (``learner_name="kalman-classifier"``): K-way classification with
  the shared-covariance recursion (eqs. 7-8), softmax predictive with calibration (eq. 13),
  online SGD on the forgetting coefficient (eq. 9, 12), optional fine-tuning of the
  representation phi(x; theta) together with alpha (Sect. 2.1.2) and optional replay (App. D.4).
* :class:`KalmanRegressor` (``learner_name="kalman-regressor"``): the regression filter
  (eqs. 4-6) with online SGD on delta (App. B) and the App. C mean-preserving variant.
* :class:`OnlineSGDClassifier` (``learner_name="online-sgd-classifier"``): the online-SGD
  baseline with the same representation and a linear softmax head (Sect. 4.2 baselines).

Protocol (DESIGN.md): a stream of chunks; ``predict(x)`` uses the statistics before the chunk
(one transition ahead, App. D.2), ``update(chunk)`` then

1. (replay) appends ``replay_size`` points drawn from the memory of the most recent
   ``replay_capacity`` points to the chunk (App. D.4; the predictions and metrics only see the
   fresh chunk);
2. (fine-tuning) takes one optimizer step on ``(theta, alpha)`` of the chunk's mean negative log
   predictive under the pre-chunk statistics (eq. 13), learning rate ``eta`` for alpha and
   ``beta * eta`` for theta (App. D.1, relative gradient scale beta);
3. recomputes the features with the new theta and runs the recursion over the chunk with
   "always" or "last" Markov transitions and the delta SGD steps (App. D.2), by the blocked
   recursion of :mod:`inference.kalman`.

Randomness: every chunk's keys are ``fold_in(PRNGKey(seed), chunk_index)`` so a run resumed from
a checkpoint draws exactly what the uninterrupted run draws. ``predict`` does not advance it.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any, NamedTuple

import numpy as np

from ppl_cl.batch import Batch, as_numpy
from ppl_cl.learner import Learner
from ppl_cl.predictive import CategoricalPredictive, GaussianPredictive

__all__ = ["KalmanClassifier", "KalmanRegressor", "OnlineSGDClassifier"]

_TRANSITIONS = ("always", "last")
_OPTIMIZERS = ("sgd", "adamw")


# ---------------------------------------------------------------------------------------------
# configuration checks (all raised before any state exists)
# ---------------------------------------------------------------------------------------------
def _check_positive(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise ValueError(f"{name}: expected a finite number > 0, received {value!r}")


def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, received {value!r}")


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, received {value!r}")


def _check_forgetting(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 < value <= 1.0):
        raise ValueError(f"initial_forgetting: expected gamma_0 in (0, 1], received {value!r}")


class _Static(NamedTuple):
    """Everything that shapes the compiled functions (hashable)."""

    likelihood: str
    num_outputs: int
    input_dim: int
    network: str
    feature_dim: int | None
    hidden: tuple
    input_shape: tuple | None
    channels: tuple
    resnet_width: int
    feature_bias: bool
    feature_normalization: bool
    dtype: str
    prior_variance: float
    noise_variance: float
    options: Any                 # inference.kalman.FilterOptions
    transition: str
    block_size: int | None
    fine_tune: bool
    learn_calibration: bool
    optimizer: str
    learning_rate: float
    backbone_scale: float
    weight_decay: float
    replay_capacity: int
    replay_size: int


def _network(static: _Static):
    import jax.numpy as jnp

    from models.kalman import feature_network

    return feature_network(static.network, input_dim=static.input_dim,
                           feature_dim=static.feature_dim, hidden=static.hidden,
                           input_shape=static.input_shape, channels=static.channels,
                           width=static.resnet_width, dtype=jnp.dtype(static.dtype))


def _features_fn(static: _Static):
    """``phi(x; theta)``: the network, optional normalization by sqrt(dim), optional bias."""
    import jax.numpy as jnp

    net = _network(static)

    def features(theta, x):
        f = net.apply(theta, x)
        if static.feature_normalization:
            f = f / math.sqrt(f.shape[-1])
        if static.feature_bias:
            f = jnp.concatenate([f, jnp.ones(f.shape[:-1] + (1,), f.dtype)], axis=-1)
        return f

    return net, features


def _optimizer(static: _Static, trainable: dict):
    import jax
    import optax

    def make(lr):
        if static.optimizer == "sgd":
            return optax.sgd(lr)
        return optax.adamw(lr, weight_decay=static.weight_decay)

    labels = {k: jax.tree_util.tree_map(lambda _, k=k: k, v) for k, v in trainable.items()}
    return optax.multi_transform(
        {"log_alpha": make(static.learning_rate),
         "theta": make(static.learning_rate * static.backbone_scale)}, labels)


def _trainable(static: _Static, theta: Any, log_alpha: Any) -> dict:
    out = {}
    if static.fine_tune:
        out["theta"] = theta
    if static.learn_calibration and static.likelihood == "softmax":
        out["log_alpha"] = log_alpha
    return out


@functools.lru_cache(maxsize=64)
def _compiled(static: _Static):
    """Jitted predict / update functions for one configuration (shared by equal configs)."""
    import jax
    import jax.numpy as jnp
    import optax

    from inference import kalman as kf
    from models.kalman import DriftPrior, GaussianLikelihood, SoftmaxLikelihood, SurrogateLikelihood

    dtype = jnp.dtype(static.dtype)
    _, features = _features_fn(static)
    options = static.options
    obs = (SurrogateLikelihood if static.likelihood == "softmax" else GaussianLikelihood)(
        static.noise_variance)

    def params_of(log_alpha):
        return kf.KalmanParams(DriftPrior(static.prior_variance), obs,
                               SoftmaxLikelihood(jnp.exp(log_alpha)))

    def chunk_key(base_key, index, stream):
        return jax.random.fold_in(jax.random.fold_in(base_key, index), stream)

    def predict(kstate, theta, log_alpha, x, base_key, index):
        key = chunk_key(base_key, index, 0)
        phi = features(theta, x.astype(dtype))
        params = params_of(log_alpha)
        mean, var = kf.predictive_moments(kstate, phi, params, options)
        if static.likelihood == "softmax":
            return kf.class_probabilities(key, mean, var, params.readout.calibration,
                                          options.num_samples)
        return mean[:, 0], var + static.noise_variance

    def update(carry, x, y, base_key, index):
        kstate, theta, log_alpha, opt_state, memory = carry
        key = chunk_key(base_key, index, 1)
        k_replay, k_loss, k_rec = jax.random.split(key, 3)
        x = x.astype(dtype)
        b = x.shape[0]
        mask = jnp.ones((b,), bool)
        xa, ya = x, y
        if static.replay_capacity:
            xr, yr, valid = kf.replay_sample(k_replay, memory, static.replay_size)
            xa = jnp.concatenate([x, xr.astype(dtype)])
            ya = jnp.concatenate([y, yr.astype(y.dtype)])
            mask = jnp.concatenate([mask, valid])

        def loss_fn(trainable):
            th = trainable.get("theta", theta)
            la = trainable.get("log_alpha", log_alpha)
            return -kf.mean_log_predictive(k_loss, kstate, features(th, xa), ya, params_of(la),
                                           options, mask)

        trainable = _trainable(static, theta, log_alpha)
        if trainable:
            loss, grads = jax.value_and_grad(loss_fn)(trainable)
            updates, opt_state = _optimizer(static, trainable).update(grads, opt_state, trainable)
            trainable = optax.apply_updates(trainable, updates)
            theta = trainable.get("theta", theta)
            log_alpha = trainable.get("log_alpha", log_alpha)
        else:
            loss = loss_fn({})
        # App. D.2: recompute the features with the new theta, then the recursion
        phi = features(theta, xa)
        kstate, info = kf.chunk_update(k_rec, kstate, phi, ya, params_of(log_alpha), options,
                                       transition=static.transition, mask=mask,
                                       block_size=static.block_size)
        if static.replay_capacity:
            memory = kf.replay_add(memory, x, y)
        leaves = [kstate.mean, kstate.covariance, kstate.delta, log_alpha] + \
            jax.tree_util.tree_leaves(theta)
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in leaves]))
        record = {"loss": loss, "gamma": kf.forgetting(kstate), "alpha": jnp.exp(log_alpha),
                  "finite": finite, "num_points_seen": kstate.num_points,
                  "online_log_predictive": jnp.sum(info.steps.log_predictive * mask)
                  / jnp.sum(mask)}
        return (kstate, theta, log_alpha, opt_state, memory), record

    return jax.jit(predict), jax.jit(update)


# ---------------------------------------------------------------------------------------------
# the shared learner
# ---------------------------------------------------------------------------------------------
class _KalmanLearner(Learner):
    """Shared machinery of :class:`KalmanClassifier` and :class:`KalmanRegressor`."""

    _likelihood = ""

    def __init__(self, *, input_dim: int, num_outputs: int, feature_network: str = "identity",
                 feature_dim: int | None = None, hidden: list[int] | tuple = (256,),
                 input_shape: list[int] | tuple | None = None,
                 channels: list[int] | tuple = (32, 64), resnet_width: int = 64,
                 feature_bias: bool = False, feature_normalization: bool = False,
                 fine_tune: bool = False, learn_calibration: bool = False,
                 initial_calibration: float = 1.0, learning_rate: float = 0.01,
                 backbone_scale: float = 1.0, optimizer: str = "sgd", weight_decay: float = 1e-4,
                 learn_forgetting: bool = True, initial_forgetting: float = 1.0,
                 forgetting_learning_rate: float = 0.01, max_delta: float | None = None,
                 calibrated_forgetting: bool = False,
                 transition: str = "always", prior_variance: float | None = None,
                 noise_variance: float | None = None, mean_preserving: bool = False,
                 num_samples: int = 16, replay_capacity: int = 0, replay_size: int = 10,
                 block_size: int | None = None, dtype: str = "float32", seed: int = 0,
                 **config: Any) -> None:
        from models.kalman import FEATURE_NETWORKS

        # -- validation, before any state --------------------------------------------------
        _check_int("input_dim", input_dim, 1)
        _check_choice("feature_network", feature_network, FEATURE_NETWORKS)
        if feature_network != "identity":
            _check_int("feature_dim", feature_dim, 1)
        _check_forgetting(initial_forgetting)
        _check_choice("transition", transition, _TRANSITIONS)
        _check_choice("optimizer", optimizer, _OPTIMIZERS)
        _check_choice("dtype", dtype, ("float32", "float64"))
        for name, value in (("learning_rate", learning_rate), ("backbone_scale", backbone_scale),
                            ("forgetting_learning_rate", forgetting_learning_rate),
                            ("initial_calibration", initial_calibration)):
            _check_positive(name, value)
        _check_positive("prior_variance", prior_variance, allow_none=True)
        _check_positive("noise_variance", noise_variance, allow_none=True)
        _check_positive("max_delta", max_delta, allow_none=True)
        if weight_decay < 0:
            raise ValueError(f"weight_decay: expected >= 0, received {weight_decay!r}")
        _check_int("num_samples", num_samples, 1)
        _check_int("replay_capacity", replay_capacity, 0)
        _check_int("replay_size", replay_size, 1)
        _check_int("block_size", block_size, 1, allow_none=True)
        _check_int("seed", seed, 0)
        super().__init__(
            input_dim=int(input_dim), feature_network=feature_network, feature_dim=feature_dim,
            hidden=list(hidden), input_shape=None if input_shape is None else list(input_shape),
            channels=list(channels), resnet_width=int(resnet_width), feature_bias=bool(feature_bias),
            feature_normalization=bool(feature_normalization), fine_tune=bool(fine_tune),
            learn_calibration=bool(learn_calibration),
            initial_calibration=float(initial_calibration), learning_rate=float(learning_rate),
            backbone_scale=float(backbone_scale), optimizer=optimizer,
            weight_decay=float(weight_decay), learn_forgetting=bool(learn_forgetting),
            initial_forgetting=float(initial_forgetting),
            forgetting_learning_rate=float(forgetting_learning_rate),
            max_delta=None if max_delta is None else float(max_delta),
            calibrated_forgetting=bool(calibrated_forgetting), transition=transition,
            prior_variance=None if prior_variance is None else float(prior_variance),
            noise_variance=None if noise_variance is None else float(noise_variance),
            mean_preserving=bool(mean_preserving), num_samples=int(num_samples),
            replay_capacity=int(replay_capacity), replay_size=int(replay_size),
            block_size=None if block_size is None else int(block_size), dtype=dtype,
            seed=int(seed), **config)

        import jax
        import jax.numpy as jnp

        from inference import kalman as kf
        from ppl_cl.numerics import enable_x64

        if dtype == "float64":
            enable_x64()
        self._dtype = jnp.dtype(dtype)
        self.num_outputs = int(num_outputs)
        base_dim = int(input_dim) if feature_network == "identity" else int(feature_dim)
        self.feature_dim = base_dim + (1 if feature_bias else 0)
        m = self.feature_dim
        s_w2 = float(prior_variance) if prior_variance is not None else 1.0 / m
        s2 = float(noise_variance) if noise_variance is not None else self._default_noise()
        options = kf.FilterOptions(
            likelihood=self._likelihood, learn_forgetting=bool(learn_forgetting),
            learning_rate=float(forgetting_learning_rate),
            max_delta=math.inf if max_delta is None else float(max_delta),
            num_samples=int(num_samples), mean_preserving=bool(mean_preserving),
            calibrated_forgetting=bool(calibrated_forgetting))
        self._static = _Static(
            likelihood=self._likelihood, num_outputs=self.num_outputs, input_dim=int(input_dim),
            network=feature_network, feature_dim=None if feature_dim is None else int(feature_dim),
            hidden=tuple(int(h) for h in hidden),
            input_shape=None if input_shape is None else tuple(int(v) for v in input_shape),
            channels=tuple(int(c) for c in channels), resnet_width=int(resnet_width),
            feature_bias=bool(feature_bias), feature_normalization=bool(feature_normalization),
            dtype=dtype, prior_variance=s_w2, noise_variance=s2, options=options,
            transition=transition, block_size=None if block_size is None else int(block_size),
            fine_tune=bool(fine_tune),
            learn_calibration=bool(learn_calibration), optimizer=optimizer,
            learning_rate=float(learning_rate), backbone_scale=float(backbone_scale),
            weight_decay=float(weight_decay), replay_capacity=int(replay_capacity),
            replay_size=int(replay_size))
        self.prior_variance, self.noise_variance = s_w2, s2
        net, _ = _features_fn(self._static)      # raises on a bad network configuration

        # -- state ------------------------------------------------------------------------
        from models.kalman import DriftPrior

        self._key = jax.random.PRNGKey(int(seed))
        self._kstate = kf.init(m, self.num_outputs, prior=DriftPrior(s_w2),
                               initial_forgetting=float(initial_forgetting), dtype=self._dtype)
        self._theta = net.init(jax.random.fold_in(self._key, 2**31 - 1))
        self._theta_def = jax.tree_util.tree_structure(self._theta)
        self._log_alpha = jnp.asarray(math.log(initial_calibration), self._dtype)
        trainable = _trainable(self._static, self._theta, self._log_alpha)
        self._opt_state = _optimizer(self._static, trainable).init(trainable) if trainable else ()
        self._opt_def = jax.tree_util.tree_structure(self._opt_state)
        self._memory = (kf.replay_init(replay_capacity, int(input_dim), self._dtype,
                                       jnp.int32 if self._likelihood == "softmax" else self._dtype)
                        if replay_capacity else None)
        self._chunk_index = 0
        self._history: dict[str, list] = {"points": [], "gamma": [], "alpha": [], "loss": []}

    # -- hooks -----------------------------------------------------------------------------
    def _default_noise(self) -> float:
        raise NotImplementedError

    def _validate(self, batch: Batch, require_targets: bool) -> Batch:
        raise NotImplementedError

    def _target_array(self, y: Any):
        raise NotImplementedError

    # -- protocol ----------------------------------------------------------------------------
    def _as_batch(self, x: Any, y: Any = None) -> Batch:
        return x if isinstance(x, Batch) else Batch(x, y)

    def _predict_raw(self, x: Any):
        batch = Batch(x)
        self._validate(batch, require_targets=False)
        predict, _ = _compiled(self._static)
        xj, _ = batch.jax(self._dtype)
        return predict(self._kstate, self._theta, self._log_alpha, xj, self._key,
                       np.int32(self._chunk_index))

    def update(self, batch: Batch) -> dict[str, Any]:
        """Learn from one chunk (module docstring: replay, fine-tuning, recursion).

        Raises ValueError (state unchanged) on non-finite inputs, bad labels, a changed feature
        dimension, or when the update itself produced non-finite numbers.
        """
        import jax

        if not isinstance(batch, Batch):
            raise TypeError(f"batch: expected a ppl_cl.Batch, received {type(batch).__name__}")
        self._validate(batch, require_targets=True)
        _, update = _compiled(self._static)
        xj, _ = batch.jax(self._dtype)
        yj = self._target_array(batch.y)
        carry = (self._kstate, self._theta, self._log_alpha, self._opt_state, self._memory)
        new_carry, record = update(carry, xj, yj, self._key, np.int32(self._chunk_index))
        record = {k: float(v) for k, v in jax.device_get(record).items()}
        if not record.pop("finite"):
            raise ValueError("update produced non-finite values (NaN/inf) in the filter state or "
                             "the representation; the state is unchanged (lower learning_rate / "
                             "forgetting_learning_rate?)")
        self._kstate, self._theta, self._log_alpha, self._opt_state, self._memory = new_carry
        self._chunk_index += 1
        record.pop("num_points_seen")
        # stream points seen (replayed points are not counted)
        n_seen = (self._history["points"][-1] if self._history["points"] else 0) + len(batch)
        for key, value in (("points", n_seen), ("gamma", record["gamma"]),
                           ("alpha", record["alpha"]), ("loss", record["loss"])):
            self._history[key].append(value)
        record.update(num_points=len(batch), chunk=self._chunk_index)
        return record

    # -- accessors ---------------------------------------------------------------------------
    @property
    def forgetting_coefficient(self) -> float:
        """Current ``gamma = exp(-delta / 2)``."""
        return float(np.exp(-0.5 * float(self._kstate.delta)))

    @property
    def calibration(self) -> float:
        """Current ``alpha``."""
        return float(np.exp(float(self._log_alpha)))

    @property
    def kalman_state(self):
        """The :class:`inference.kalman.KalmanState` (mean ``(m, K)``, covariance ``(m, m)``)."""
        return self._kstate

    def features(self, x: Any) -> np.ndarray:
        """``phi(x; theta)`` with the current theta, ``(n, m)``."""
        batch = Batch(x)
        self._validate(batch, require_targets=False)
        _, feats = _features_fn(self._static)
        xj, _ = batch.jax(self._dtype)
        return np.asarray(feats(self._theta, xj))

    def trajectories(self) -> dict[str, np.ndarray]:
        """Per-chunk ``points`` of the stream seen (replay not counted), ``gamma`` and ``alpha``
        after the chunk, and the chunk's
        fine-tuning ``loss`` (mean negative log predictive before the update)."""
        return {k: np.asarray(v, dtype=np.int64 if k == "points" else np.float64)
                for k, v in self._history.items()}

    # -- persistence ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        import jax

        s = self._kstate
        mem = None
        if self._memory is not None:
            mem = {f: np.asarray(getattr(self._memory, f)) for f in self._memory._fields}
        return {
            "kalman": {"mean": np.asarray(s.mean), "covariance": np.asarray(s.covariance),
                       "delta": np.asarray(s.delta), "num_points": np.asarray(s.num_points)},
            "theta": [np.asarray(v) for v in jax.tree_util.tree_leaves(self._theta)],
            "log_alpha": np.asarray(self._log_alpha),
            "opt_state": [np.asarray(v) for v in jax.tree_util.tree_leaves(self._opt_state)],
            "memory": mem,
            "chunk_index": int(self._chunk_index),
            "history": {k: np.asarray(v, dtype=np.int64 if k == "points" else np.float64)
                        for k, v in self._history.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import jax
        import jax.numpy as jnp

        from inference import kalman as kf

        def arr(a, like):
            a = np.asarray(as_numpy(a))
            if a.shape != tuple(like.shape):
                raise ValueError(f"state: expected an array of shape {tuple(like.shape)}, "
                                 f"received {a.shape} (a checkpoint of another configuration?)")
            return jnp.asarray(a, dtype=like.dtype)

        ks = state["kalman"]
        kstate = kf.KalmanState(arr(ks["mean"], self._kstate.mean),
                                arr(ks["covariance"], self._kstate.covariance),
                                arr(ks["delta"], self._kstate.delta),
                                arr(ks["num_points"], self._kstate.num_points))
        old_theta = jax.tree_util.tree_leaves(self._theta)
        if len(state["theta"]) != len(old_theta):
            raise ValueError(f"state['theta']: expected {len(old_theta)} arrays, received "
                             f"{len(state['theta'])}")
        theta = jax.tree_util.tree_unflatten(
            self._theta_def, [arr(a, b) for a, b in zip(state["theta"], old_theta)])
        old_opt = jax.tree_util.tree_leaves(self._opt_state)
        if len(state["opt_state"]) != len(old_opt):
            raise ValueError(f"state['opt_state']: expected {len(old_opt)} arrays, received "
                             f"{len(state['opt_state'])}")
        opt_state = jax.tree_util.tree_unflatten(
            self._opt_def, [arr(a, b) for a, b in zip(state["opt_state"], old_opt)])
        memory = self._memory
        if memory is not None:
            m = state["memory"]
            memory = kf.ReplayMemory(*(arr(m[f], getattr(memory, f)) for f in memory._fields))
        self._kstate, self._theta, self._opt_state, self._memory = kstate, theta, opt_state, memory
        self._log_alpha = arr(state["log_alpha"], self._log_alpha)
        self._chunk_index = int(state["chunk_index"])
        self._history = {k: np.asarray(as_numpy(v)).tolist() for k, v in state["history"].items()}

    # -- ArviZ -------------------------------------------------------------------------------
    def _trajectories_and_time(self, coords: dict) -> dict | None:
        """Per-chunk trajectories for the ``filtering`` group; their ``time`` labels (points
        seen after each chunk) go into ``coords``. (Passed as a dict: ``xarray.Dataset`` is a
        ``Mapping``, so ``samples_to_inference_data`` would rebuild a given Dataset and drop its
        time labels.)"""
        h = self.trajectories()
        if h["points"].size == 0:
            return None
        coords["time"] = h["points"]
        return {"gamma": h["gamma"], "alpha": h["alpha"], "loss": h["loss"]}


class KalmanClassifier(_KalmanLearner):
    """Online K-way classifier with the Kalman filter of Titsias et al. (2024).

    Readout ``W_n`` (``m x K``) under the drift prior (eqs. 2-3), Gaussian surrogate likelihood
    for the recursion (eqs. 7-8; one ``m x m`` covariance for all K classes), softmax with
    calibration for prediction (eq. 13), online SGD on delta (eq. 9, 12). Defaults of
    Algorithm 1: ``s2 = 1/K``, ``s_w2 = 1/m``.

    Args:
        num_classes: K.
        input_dim: d (inputs are ``(n, d)``; images flattened, with ``input_shape``).
        feature_network: ``"identity"`` (phi(x) = x), ``"mlp"``, ``"cnn"`` or ``"resnet18"``
            (:func:`models.kalman.feature_network`), with ``feature_dim``, ``hidden``,
            ``input_shape``, ``channels``, ``resnet_width``.
        feature_bias / feature_normalization: append a constant 1 / divide the network features
            by sqrt(their dimension) (App. D.3).
        fine_tune: train theta (Sect. 2.1.2); ``False`` keeps the random (or given) features.
        learn_calibration: train alpha (eq. 13); initial_calibration: alpha_0.
        learning_rate: eta for alpha; backbone_scale: beta (theta's rate is beta * eta).
        optimizer: ``"sgd"`` or ``"adamw"`` (with ``weight_decay``).
        learn_forgetting / initial_forgetting / forgetting_learning_rate / max_delta: gamma's
            online SGD (gamma_0 in (0, 1], rho, upper clip of delta).
        calibrated_forgetting: learn delta on the calibrated eq. 13 instead of eq. 12 (the
            paper uses alpha for prediction and fine-tuning only: default False).
        transition: ``"always"`` or ``"last"`` Markov (App. D.2).
        prior_variance / noise_variance: s_w2 (default 1/m) / s2 (default 1/K).
        num_samples: S, Monte Carlo samples of eq. 12-13.
        replay_capacity / replay_size: memory of the most recent points (0 = no replay) and
            points replayed per chunk (App. D.4: 100 and 10).
        block_size: points per block of the blocked recursion (None: ``m / 8`` clipped to
            [16, 128], :func:`inference.kalman.default_block_size`).
        dtype: ``"float32"`` or ``"float64"`` (switches JAX x64 on).
        seed: PRNG seed (network init, Monte Carlo, replay draws).
    """

    learner_name = "kalman-classifier"
    _likelihood = "softmax"

    def __init__(self, num_classes: int, input_dim: int, **config: Any) -> None:
        _check_int("num_classes", num_classes, 2)
        config.setdefault("learn_calibration", True)
        super().__init__(input_dim=input_dim, num_outputs=int(num_classes),
                         num_classes=int(num_classes), **config)
        self.num_classes = int(num_classes)

    def _default_noise(self) -> float:
        return 1.0 / self.num_outputs

    def _validate(self, batch: Batch, require_targets: bool) -> Batch:
        return batch.validate(input_dim=self._static.input_dim,
                              num_classes=self.num_outputs if require_targets else None,
                              require_targets=require_targets)

    def _target_array(self, y: Any):
        import jax.numpy as jnp

        return jnp.asarray(as_numpy(y).astype(np.int32))

    def predict(self, x: Any, task_id: int | None = None) -> CategoricalPredictive:
        """Class probabilities of eq. 13 under the pre-chunk statistics, ``(n, K)``."""
        return CategoricalPredictive(np.asarray(self._predict_raw(x), dtype=np.float64))

    def to_inference_data(self, x: Any = None, y: Any = None, *, num_draws: int = 500,
                          seed: int = 0):
        """ArviZ data of the filtered readout posterior ``q(W_n | y_{1:n})``.

        ``posterior.readout`` ``(chain, draw, class, feature)``: K independent rows
        ``N(M[:, k], A)`` sharing the covariance A (eqs. 7-8); ``filtering`` group: the per-chunk
        trajectories of ``gamma``, ``alpha`` and ``loss`` (time = points seen);
        ``constant_data``: s_w2, s2 and the current gamma and alpha. With ``x, y`` also
        ``log_likelihood.y`` = ``log softmax(alpha W^T phi(x))_y`` per draw and
        ``observed_data.y``.
        """
        from ppl_cl.inference_data import gaussian_to_inference_data

        M = np.asarray(self._kstate.mean, dtype=np.float64).T          # (K, m)
        A = np.asarray(self._kstate.covariance, dtype=np.float64)
        log_lik = observed = None
        coords = {"class": np.arange(self.num_classes), "feature": np.arange(self.feature_dim)}
        dims = {"readout": ["class", "feature"]}
        if x is not None:
            if y is None:
                raise ValueError("y: expected labels with x (for the log_likelihood group)")
            batch = Batch(x, y)
            self._validate(batch, require_targets=True)
            phi = self.features(batch.x).astype(np.float64)
            labels = as_numpy(batch.y).astype(np.int64)
            alpha = self.calibration

            def log_lik(draws):
                logits = alpha * np.einsum("csKm,nm->csnK", draws["readout"], phi)
                logits = logits - logits.max(-1, keepdims=True)
                logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
                return {"y": np.take_along_axis(logp, labels[None, None, :, None], -1)[..., 0]}

            observed = {"y": labels}
            dims["y"] = ["obs"]
            coords["obs"] = np.arange(labels.shape[0])
        return gaussian_to_inference_data(
            {"readout": M}, {"readout": A}, num_draws=num_draws, seed=seed, dims=dims,
            coords=coords, log_likelihood=log_lik, observed_data=observed,
            constant_data={"prior_variance": np.asarray(self.prior_variance),
                           "noise_variance": np.asarray(self.noise_variance),
                           "forgetting_coefficient": np.asarray(self.forgetting_coefficient),
                           "calibration": np.asarray(self.calibration)},
            trajectories=self._trajectories_and_time(coords))


class KalmanRegressor(_KalmanLearner):
    """Online regression with the drift prior and the Kalman filter (eqs. 1-6, App. B).

    ``predict`` returns ``N(gamma m^T phi, phi^T A^- phi + s2)`` (eq. 6, one transition ahead;
    App. C variant with ``mean_preserving=True``: ``m^T phi``). ``learn_forgetting`` runs the
    SGD of App. B on delta at every point ("always") or once per chunk ("last").

    Args:
        input_dim: d; noise_variance: s2 (default 1); prior_variance: s_w2 (default 1/m);
        mean_preserving: App. C; dtype default ``"float64"``; the other arguments as in
        :class:`KalmanClassifier` (``fine_tune`` trains theta on the Gaussian log predictive;
        there is no calibration for regression).
    """

    learner_name = "kalman-regressor"
    _likelihood = "gaussian"

    def __init__(self, input_dim: int, **config: Any) -> None:
        config.setdefault("dtype", "float64")
        if config.get("learn_calibration"):
            raise ValueError("learn_calibration: the regressor has no calibration parameter "
                             "(eq. 13 is for the softmax)")
        super().__init__(input_dim=input_dim, num_outputs=1, **config)

    def _default_noise(self) -> float:
        return 1.0

    def _validate(self, batch: Batch, require_targets: bool) -> Batch:
        return batch.validate(input_dim=self._static.input_dim, regression=require_targets,
                              require_targets=require_targets)

    def _target_array(self, y: Any):
        import jax.numpy as jnp

        return jnp.asarray(as_numpy(y), dtype=self._dtype)

    def predict(self, x: Any, task_id: int | None = None) -> GaussianPredictive:
        """Gaussian predictive of eq. 6 per row of ``x``."""
        mean, var = self._predict_raw(x)
        return GaussianPredictive(np.asarray(mean), np.asarray(var))

    def to_inference_data(self, x: Any = None, y: Any = None, *, num_draws: int = 500,
                          seed: int = 0):
        """``posterior.weights`` ``(chain, draw, feature)`` from ``N(m_n, A_n)``; the
        ``filtering`` trajectories; with ``x, y`` the pointwise ``log N(y | w^T phi, s2)``."""
        from ppl_cl.inference_data import gaussian_log_likelihood, gaussian_to_inference_data

        m = np.asarray(self._kstate.mean, dtype=np.float64)[:, 0]
        A = np.asarray(self._kstate.covariance, dtype=np.float64)
        dims = {"weights": ["feature"]}
        coords = {"feature": np.arange(self.feature_dim)}
        log_lik = observed = None
        if x is not None:
            if y is None:
                raise ValueError("y: expected targets with x (for the log_likelihood group)")
            batch = Batch(x, y)
            self._validate(batch, require_targets=True)
            phi = self.features(batch.x).astype(np.float64)
            yv = as_numpy(batch.y).astype(np.float64)
            s2 = self.noise_variance

            def log_lik(draws):
                f = np.einsum("csm,nm->csn", draws["weights"], phi)
                return {"y": gaussian_log_likelihood(f, yv, s2)}

            observed = {"y": yv}
            dims["y"] = ["obs"]
            coords["obs"] = np.arange(yv.shape[0])
        return gaussian_to_inference_data(
            {"weights": m}, {"weights": A}, num_draws=num_draws, seed=seed, dims=dims,
            coords=coords, log_likelihood=log_lik, observed_data=observed,
            constant_data={"prior_variance": np.asarray(self.prior_variance),
                           "noise_variance": np.asarray(self.noise_variance),
                           "forgetting_coefficient": np.asarray(self.forgetting_coefficient)},
            trajectories=self._trajectories_and_time(coords))


# ---------------------------------------------------------------------------------------------
# online SGD baseline
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def _sgd_compiled(static_json: str):
    import jax
    import jax.numpy as jnp
    import optax

    from inference import kalman as kf

    cfg = json.loads(static_json)
    static = _Static(**{**cfg, "hidden": tuple(cfg["hidden"]), "channels": tuple(cfg["channels"]),
                        "input_shape": None if cfg["input_shape"] is None
                        else tuple(cfg["input_shape"]), "options": None})
    dtype = jnp.dtype(static.dtype)
    _, features = _features_fn(static)
    opt = optax.sgd(static.learning_rate)

    def logits_fn(params, x):
        return features(params["theta"], x) @ params["head"]["w"] + params["head"]["b"]

    def predict(params, x):
        return jax.nn.softmax(logits_fn(params, x.astype(dtype)), axis=-1)

    def update(carry, x, y, key):
        params, opt_state, memory = carry
        x = x.astype(dtype)
        mask = jnp.ones((x.shape[0],), dtype)
        xa, ya = x, y
        if static.replay_capacity:
            xr, yr, valid = kf.replay_sample(key, memory, static.replay_size)
            xa, ya = jnp.concatenate([x, xr.astype(dtype)]), jnp.concatenate([y, yr])
            mask = jnp.concatenate([mask, valid.astype(dtype)])

        def loss_fn(p):
            logp = jax.nn.log_softmax(logits_fn(p, xa), axis=-1)
            nll = -jnp.take_along_axis(logp, ya[:, None], axis=-1)[:, 0]
            return jnp.sum(nll * mask) / jnp.sum(mask)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if static.replay_capacity:
            memory = kf.replay_add(memory, x, y)
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(v))
                                    for v in jax.tree_util.tree_leaves(params)]))
        return (params, opt_state, memory), {"loss": loss, "finite": finite}

    return jax.jit(predict), jax.jit(update), opt


class OnlineSGDClassifier(Learner):
    """Online SGD baseline: the same representation phi(x; theta) as :class:`KalmanClassifier`
    with a linear softmax head, one SGD step per chunk on its cross-entropy (predict, then
    learn), optional replay (App. D.4). The "Online SGD" baseline of Sect. 4.2 (Bornschein et
    al. 2022) with one learning rate for all parameters.

    Args:
        num_classes, input_dim, feature_network, feature_dim, hidden, input_shape, channels,
        resnet_width, feature_bias, feature_normalization, replay_capacity, replay_size, dtype,
        seed: as in :class:`KalmanClassifier`; learning_rate: the SGD step size.
    """

    learner_name = "online-sgd-classifier"

    def __init__(self, num_classes: int, input_dim: int, *, feature_network: str = "mlp",
                 feature_dim: int | None = 256, hidden: list[int] | tuple = (256,),
                 input_shape: list[int] | tuple | None = None,
                 channels: list[int] | tuple = (32, 64), resnet_width: int = 64,
                 feature_bias: bool = False, feature_normalization: bool = False,
                 learning_rate: float = 0.05, replay_capacity: int = 0, replay_size: int = 10,
                 dtype: str = "float32", seed: int = 0) -> None:
        from models.kalman import FEATURE_NETWORKS

        _check_int("num_classes", num_classes, 2)
        _check_int("input_dim", input_dim, 1)
        _check_choice("feature_network", feature_network, FEATURE_NETWORKS)
        _check_positive("learning_rate", learning_rate)
        _check_int("replay_capacity", replay_capacity, 0)
        _check_int("replay_size", replay_size, 1)
        _check_choice("dtype", dtype, ("float32", "float64"))
        super().__init__(num_classes=int(num_classes), input_dim=int(input_dim),
                         feature_network=feature_network, feature_dim=feature_dim,
                         hidden=list(hidden),
                         input_shape=None if input_shape is None else list(input_shape),
                         channels=list(channels), resnet_width=int(resnet_width),
                         feature_bias=bool(feature_bias),
                         feature_normalization=bool(feature_normalization),
                         learning_rate=float(learning_rate), replay_capacity=int(replay_capacity),
                         replay_size=int(replay_size), dtype=dtype, seed=int(seed))
        import jax
        import jax.numpy as jnp

        from inference import kalman as kf
        from ppl_cl.numerics import enable_x64

        if dtype == "float64":
            enable_x64()
        self.num_classes = int(num_classes)
        self._dtype = jnp.dtype(dtype)
        static = dict(
            likelihood="softmax", num_outputs=int(num_classes), input_dim=int(input_dim),
            network=feature_network, feature_dim=feature_dim, hidden=[int(h) for h in hidden],
            input_shape=None if input_shape is None else [int(v) for v in input_shape],
            channels=[int(c) for c in channels], resnet_width=int(resnet_width),
            feature_bias=bool(feature_bias), feature_normalization=bool(feature_normalization),
            dtype=dtype, prior_variance=1.0, noise_variance=1.0, transition="always",
            block_size=1, fine_tune=True, learn_calibration=False, optimizer="sgd",
            learning_rate=float(learning_rate), backbone_scale=1.0, weight_decay=0.0,
            replay_capacity=int(replay_capacity), replay_size=int(replay_size))
        self._static_json = json.dumps(static, sort_keys=True)
        predict, update, opt = _sgd_compiled(self._static_json)
        net, _ = _features_fn(_Static(**{**static, "hidden": tuple(static["hidden"]),
                                         "channels": tuple(static["channels"]),
                                         "input_shape": None if input_shape is None
                                         else tuple(static["input_shape"]), "options": None}))
        self._key = jax.random.PRNGKey(int(seed))
        theta = net.init(jax.random.fold_in(self._key, 2**31 - 1))
        m = (int(input_dim) if feature_network == "identity" else int(feature_dim)) \
            + (1 if feature_bias else 0)
        # zero-initialized head: the first prediction is uniform
        self._params = {"theta": theta, "head": {"w": jnp.zeros((m, num_classes), self._dtype),
                                                 "b": jnp.zeros((num_classes,), self._dtype)}}
        self._def = jax.tree_util.tree_structure(self._params)
        self._opt_state = opt.init(self._params)
        self._opt_def = jax.tree_util.tree_structure(self._opt_state)
        self._memory = (kf.replay_init(replay_capacity, int(input_dim), self._dtype, jnp.int32)
                        if replay_capacity else None)
        self._chunk_index = 0

    def _validate(self, batch: Batch, require_targets: bool) -> Batch:
        return batch.validate(input_dim=self.config["input_dim"],
                              num_classes=self.num_classes if require_targets else None,
                              require_targets=require_targets)

    def predict(self, x: Any, task_id: int | None = None) -> CategoricalPredictive:
        batch = Batch(x)
        self._validate(batch, require_targets=False)
        predict, _, _ = _sgd_compiled(self._static_json)
        xj, _ = batch.jax(self._dtype)
        return CategoricalPredictive(np.asarray(predict(self._params, xj), dtype=np.float64))

    def update(self, batch: Batch) -> dict[str, Any]:
        import jax
        import jax.numpy as jnp

        if not isinstance(batch, Batch):
            raise TypeError(f"batch: expected a ppl_cl.Batch, received {type(batch).__name__}")
        self._validate(batch, require_targets=True)
        _, update, _ = _sgd_compiled(self._static_json)
        xj, _ = batch.jax(self._dtype)
        yj = jnp.asarray(as_numpy(batch.y).astype(np.int32))
        key = jax.random.fold_in(self._key, self._chunk_index)
        carry, record = update((self._params, self._opt_state, self._memory), xj, yj, key)
        record = {k: float(v) for k, v in jax.device_get(record).items()}
        if not record.pop("finite"):
            raise ValueError("update produced non-finite parameters; the state is unchanged "
                             "(lower learning_rate?)")
        self._params, self._opt_state, self._memory = carry
        self._chunk_index += 1
        record.update(num_points=len(batch), chunk=self._chunk_index)
        return record

    def state_dict(self) -> dict[str, Any]:
        import jax

        mem = None
        if self._memory is not None:
            mem = {f: np.asarray(getattr(self._memory, f)) for f in self._memory._fields}
        return {"params": [np.asarray(v) for v in jax.tree_util.tree_leaves(self._params)],
                "opt_state": [np.asarray(v) for v in jax.tree_util.tree_leaves(self._opt_state)],
                "memory": mem, "chunk_index": int(self._chunk_index)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import jax
        import jax.numpy as jnp

        from inference import kalman as kf

        def restore(arrays, like_tree, treedef, name):
            like = jax.tree_util.tree_leaves(like_tree)
            if len(arrays) != len(like):
                raise ValueError(f"state[{name!r}]: expected {len(like)} arrays, received "
                                 f"{len(arrays)}")
            return jax.tree_util.tree_unflatten(
                treedef, [jnp.asarray(np.asarray(as_numpy(a)), dtype=b.dtype)
                          for a, b in zip(arrays, like)])

        params = restore(state["params"], self._params, self._def, "params")
        opt_state = restore(state["opt_state"], self._opt_state, self._opt_def, "opt_state")
        memory = self._memory
        if memory is not None:
            memory = kf.ReplayMemory(*(jnp.asarray(np.asarray(as_numpy(state["memory"][f])),
                                                   dtype=getattr(memory, f).dtype)
                                       for f in memory._fields))
        self._params, self._opt_state, self._memory = params, opt_state, memory
        self._chunk_index = int(state["chunk_index"])

    def to_inference_data(self, *args: Any, **kwargs: Any):
        """A point estimate (one draw) of the head weights; SGD has no posterior."""
        from ppl_cl.inference_data import samples_to_inference_data

        w = np.asarray(self._params["head"]["w"], dtype=np.float64).T
        return samples_to_inference_data({"head": w[None, None]},
                                         dims={"head": ["class", "feature"]},
                                         attrs={"note": "online SGD point estimate, one draw"})
