"""Kalman-filter online learners (Titsias et al. 2024).

* :class:`KalmanClassifier` (``learner_name="kalman-classifier"``, :class:`KalmanConfig`):
  K-way classification with the shared-covariance recursion (eqs. 7-8), softmax predictive
  with calibration (eq. 13), online SGD on the forgetting coefficient (eqs. 9, 12), optional
  fine-tuning of the representation phi(x; theta) together with alpha (Sect. 2.1.2) and
  optional replay (App. D.4).
* :class:`KalmanRegressor` (``learner_name="kalman-regressor"``, :class:`KalmanRegressorConfig`):
  the regression filter (eqs. 4-6) with online SGD on delta (App. B) and the App. C
  mean-preserving variant.

The online-SGD baseline is :mod:`ppl_cl.learners.online_sgd`.

Protocol (docs/design.md): a stream of chunks; ``predict(x)`` uses the statistics before the chunk
(one transition ahead, App. D.2), ``update(chunk)`` runs one step of the engine
:class:`inference.kalman_finetune.KalmanFinetune` (replay, the (theta, alpha) step, the
recursion; the representation is :mod:`models.feature_networks`). The filter's prior
``(M_0, A_0)`` is a state like any other, so ``predict`` before the first ``update`` gives the
prior predictive (the prequential protocol scores the first chunk with it), built from the
config and the width of ``x``.

Randomness: every chunk's keys are ``fold_in(PRNGKey(seed), chunk_index)`` so a run resumed from
a checkpoint draws exactly what the uninterrupted run draws. ``predict`` does not advance it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import numpy as np

from ppl_cl.batch import Batch, as_numpy
from ppl_cl.configs.kalman import KalmanConfig, KalmanRegressorConfig, NetworkConfig
from ppl_cl.learner import Learner, check_batch
from ppl_cl.predictive import CategoricalPredictive, GaussianPredictive

__all__ = ["KalmanClassifier", "KalmanRegressor", "KalmanConfig", "KalmanRegressorConfig",
           "ChunkLearner", "representation", "check_finite", "tree_state", "restore_tree"]

#: the seed offset of the representation's initial parameters (kept apart from the chunk keys)
THETA_STREAM = 2**31 - 1


# ---------------------------------------------------------------------------------------------
# shared helpers (also used by ppl_cl.learners.online_sgd)
# ---------------------------------------------------------------------------------------------
def representation(network: NetworkConfig, input_dim: int, *, bias: bool, normalization: bool,
                   dtype: str):
    """:class:`models.feature_networks.FeatureNetwork` of ``network`` with App. D.3's
    normalization and bias."""
    import jax.numpy as jnp

    from models.feature_networks import feature_network, with_postprocessing

    net = feature_network(network.name, input_dim=int(input_dim),
                          feature_dim=network.feature_dim, hidden=tuple(network.hidden),
                          input_shape=network.input_shape, channels=tuple(network.channels),
                          width=network.resnet_width, lengthscale=network.lengthscale,
                          dtype=jnp.dtype(dtype))
    return with_postprocessing(net, normalization=normalization, bias=bias)


def check_finite(finite: dict[str, Any], rates: str) -> None:
    """Raise ``ValueError`` naming every quantity an update made non-finite (``finite``:
    ``{name: bool}`` from the engine); the learner keeps its state."""
    bad = [name for name, ok in finite.items() if not bool(ok)]
    if bad:
        raise ValueError(f"update produced non-finite values (NaN/inf) in {', '.join(bad)}; "
                         f"the state is unchanged (too large {rates}?)")


def tree_state(tree: Any) -> list[np.ndarray]:
    """The leaves of a JAX tree as NumPy arrays (for ``state_dict``)."""
    import jax

    return [np.asarray(v) for v in jax.tree_util.tree_leaves(tree)]


def restore_tree(arrays: Any, like: Any, name: str) -> Any:
    """``like``'s tree with its leaves replaced by ``arrays`` (shapes and count checked; the
    dtypes of ``like`` kept)."""
    import jax
    import jax.numpy as jnp

    leaves, treedef = jax.tree_util.tree_flatten(like)
    arrays = list(arrays)
    if len(arrays) != len(leaves):
        raise ValueError(f"state[{name!r}]: expected {len(leaves)} arrays, received {len(arrays)}")
    out = []
    for a, b in zip(arrays, leaves):
        a = np.asarray(as_numpy(a))
        if a.shape != tuple(b.shape):
            raise ValueError(f"state[{name!r}]: expected an array of shape {tuple(b.shape)}, "
                             f"received {a.shape} (a checkpoint of another configuration?)")
        out.append(jnp.asarray(a, dtype=b.dtype))
    return jax.tree_util.tree_unflatten(treedef, out)


# ---------------------------------------------------------------------------------------------
# the compiled engine of one configuration
# ---------------------------------------------------------------------------------------------
#: the config fields that enter only the state or the step-size arguments, not the compiled code
_STATE_FIELDS = ("seed", "initial_forgetting", "learning_rate", "backbone_scale",
                 "forgetting_learning_rate", "initial_calibration")


def _compile_key(config: Any) -> Any:
    """The fields that shape the compiled functions: the seed and the initial values of gamma
    and alpha only enter the state, and the step sizes are arguments (:func:`_rates`), so a
    search over step sizes compiles once."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    return dataclasses.replace(config, **{name: defaults[name] for name in _STATE_FIELDS
                                          if name in defaults})


def _rates(config: Any, dtype: Any):
    """``[eta, beta * eta, rho]``: the step sizes of alpha, theta and delta (App. D.1), the
    product taken in Python like a constant would be."""
    import jax.numpy as jnp

    c = config
    return jnp.asarray([c.learning_rate, c.learning_rate * c.backbone_scale,
                        c.forgetting_learning_rate], dtype)


@functools.lru_cache(maxsize=64)
def _compiled(config: Any, likelihood: str, input_dim: int):
    """``(engine, predict, update, features)`` for one configuration (shared by equal
    configurations): the engine and the jitted prediction, update and ``phi(x; theta)``."""
    import jax
    import jax.numpy as jnp

    from inference import kalman as kf
    from inference.kalman_finetune import FinetuneOptions, KalmanFinetune
    from models.kalman import DriftPrior, GaussianLikelihood, SurrogateLikelihood

    c = config
    softmax = likelihood == "softmax"
    K = c.num_classes if softmax else 1
    net = representation(c.network, input_dim, bias=c.feature_bias,
                         normalization=c.feature_normalization, dtype=c.dtype)
    m = net.feature_dim
    s_w2 = float(c.prior_variance) if c.prior_variance is not None else 1.0 / m
    s2 = float(c.noise_variance) if c.noise_variance is not None else (1.0 / K if softmax else 1.0)
    params = kf.KalmanParams(DriftPrior(s_w2),
                             (SurrogateLikelihood if softmax else GaussianLikelihood)(s2))
    filter_options = kf.FilterOptions(
        likelihood=likelihood, learn_forgetting=c.learn_forgetting,
        learning_rate=float(c.forgetting_learning_rate),
        max_delta=math.inf if c.max_delta is None else float(c.max_delta),
        num_samples=int(c.num_samples), mean_preserving=bool(c.mean_preserving),
        calibrated_forgetting=bool(c.calibrated_forgetting))
    options = FinetuneOptions(
        fine_tune=c.fine_tune, learn_calibration=bool(c.learn_calibration),
        optimizer=c.optimizer, learning_rate=float(c.learning_rate),
        backbone_scale=float(c.backbone_scale), weight_decay=float(c.weight_decay),
        replay_capacity=c.replay_capacity, replay_size=c.replay_size,
        transition=c.transition, block_size=c.block_size)
    engine = KalmanFinetune(net.init, net.apply, m, K, params, filter_options, options)

    def chunk_key(base_key, index, stream):
        return jax.random.fold_in(jax.random.fold_in(base_key, index), stream)

    def predict(state, x, base_key, index):
        return engine.predict(chunk_key(base_key, index, 0), state, x)

    def update(state, x, y, base_key, index, rates):
        # the engine with the step sizes of this learner (traced: one compilation for all)
        stepper = KalmanFinetune(
            net.init, net.apply, m, K, params,
            filter_options._replace(learning_rate=rates[2]),
            options._replace(learning_rate=rates[0], backbone_learning_rate=rates[1]))
        state, info = stepper.step(chunk_key(base_key, index, 1), state, (x, y))
        mask = info.mask
        record = {"loss": info.loss, "gamma": kf.forgetting(state.filter),
                  "alpha": jnp.exp(state.log_alpha), "finite": info.finite,
                  "prequential_log_predictive": info.prequential_log_predictive,
                  "recursion_log_predictive": jnp.sum(info.chunk.steps.log_predictive * mask)
                  / jnp.sum(mask)}
        return state, record

    return engine, jax.jit(predict), jax.jit(update), jax.jit(net.apply)


# ---------------------------------------------------------------------------------------------
# the shared learners
# ---------------------------------------------------------------------------------------------
class ChunkLearner(Learner):
    """What the online learners of this paper share (also :mod:`ppl_cl.learners.online_sgd`):
    JAX x64 for ``dtype="float64"``, the PRNG key of ``config.seed``, a chunk counter, and a
    state built for ``config.input_dim`` at construction or from the first batch's width.
    Subclasses define :meth:`_init_state` and :meth:`_validate`."""

    def __init__(self, config: Any = None, /, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        import jax

        from ppl_cl.numerics import enable_x64

        if self.config.dtype == "float64":
            enable_x64()
        self._key = jax.random.PRNGKey(int(self.config.seed))
        self._state = None
        self._input_dim: int | None = None
        self._chunk_index = 0
        if self.config.input_dim is not None:
            self._build(int(self.config.input_dim))

    @property
    def _dtype(self):
        import jax.numpy as jnp

        return jnp.dtype(self.config.dtype)

    def _init_state(self, rng: Any, input_dim: int) -> Any:
        raise NotImplementedError

    def _build(self, input_dim: int) -> None:
        """The initial state for inputs of dimension ``input_dim`` (raises on a bad network);
        the network's parameters come from ``fold_in(key, THETA_STREAM)``."""
        import jax

        self._input_dim = int(input_dim)
        self._state = self._init_state(jax.random.fold_in(self._key, THETA_STREAM),
                                       self._input_dim)

    def _ready(self, batch: Batch) -> Batch:
        """``batch`` checked; the state built from its width if not yet (before any change)."""
        check_batch(batch)
        if self._state is None:
            self._validate(batch, require_targets=True)
            self._build(int(batch.x.shape[1]))
        return self._validate(batch, require_targets=True)

    def _validate(self, batch: Batch, require_targets: bool) -> Batch:
        raise NotImplementedError

    def _require_state(self, what: str):
        if self._state is None:
            raise self._not_fitted(what)
        return self._state

    # -- persistence helpers ---------------------------------------------------------------------
    def _state_to_load(self, state: dict[str, Any]) -> Any:
        """The current state to restore ``state`` into (built for its ``input_dim`` if none)."""
        if self._state is None:
            self._build(int(state["input_dim"]))
        elif int(state["input_dim"]) != self._input_dim:
            raise ValueError(f"state['input_dim']: expected {self._input_dim}, received "
                             f"{state['input_dim']}")
        return self._state

    @staticmethod
    def _memory_arrays(memory: Any) -> dict[str, np.ndarray] | None:
        if memory is None:
            return None
        return {f: np.asarray(getattr(memory, f)) for f in memory._fields}

    @staticmethod
    def _restore_memory(arrays: dict[str, Any] | None, memory: Any) -> Any:
        """``memory`` (an :class:`inference.replay.ReplayMemory` or None) with ``arrays``."""
        if memory is None:
            return None
        return type(memory)(*restore_tree([arrays[f] for f in memory._fields], list(memory),
                                          "memory"))


class _KalmanLearner(ChunkLearner):
    """Shared machinery of :class:`KalmanClassifier` and :class:`KalmanRegressor`."""

    _likelihood: ClassVar[str] = ""

    def __init__(self, config: Any = None, /, **overrides: Any) -> None:
        self._history: dict[str, list] = {"points": [], "gamma": [], "alpha": [], "loss": []}
        super().__init__(config, **overrides)

    @property
    def num_outputs(self) -> int:
        return 1

    def _functions(self):
        return _compiled(_compile_key(self.config), self._likelihood, self._input_dim)

    def _init_state(self, rng: Any, input_dim: int) -> Any:
        c = self.config
        return self._functions()[0].init(
            rng, input_dim=input_dim, initial_forgetting=float(c.initial_forgetting),
            initial_calibration=float(getattr(c, "initial_calibration", 1.0)), dtype=self._dtype)

    # -- hooks ---------------------------------------------------------------------------------
    def _target_array(self, y: Any):
        raise NotImplementedError

    # -- protocol ------------------------------------------------------------------------------
    def _predict_raw(self, x: Any):
        """The engine's prediction for ``x``, or ``None`` when ``x`` has no rows."""
        batch = self._validate(Batch(x), require_targets=False)
        if self._state is None:
            # the prior state follows from the config and x's width alone (the state the first
            # update would build): predict gives the prior predictive
            self._build(int(batch.x.shape[1]))
        if len(batch) == 0:
            return None
        _, predict, _, _ = self._functions()
        xj, _ = batch.jax(self._dtype)
        return predict(self._state, xj, self._key, np.int32(self._chunk_index))

    def update(self, batch: Batch) -> dict[str, Any]:
        """Learn from one chunk (module docstring: replay, fine-tuning, recursion).

        The record: ``loss`` (the fine-tuning objective before the step, replay included),
        ``prequential_log_predictive`` (mean log predictive of the chunk's own points before
        the update: the prequential log-loss of this chunk, per point),
        ``recursion_log_predictive`` (mean one-step log predictive the recursion saw, after
        the (theta, alpha) step, replayed points included), ``gamma`` and ``alpha`` after the
        chunk, ``num_points``, ``chunk``.

        Raises ValueError (state unchanged) on non-finite inputs, bad labels, a changed feature
        dimension, or when the update itself produced non-finite numbers.
        """
        import jax

        self._ready(batch)
        _, _, update, _ = self._functions()
        xj, _ = batch.jax(self._dtype)
        yj = self._target_array(batch.y)
        new_state, record = update(self._state, xj, yj, self._key, np.int32(self._chunk_index),
                                   _rates(self.config, self._dtype))
        record = jax.device_get(record)
        check_finite(record.pop("finite"), "learning_rate / forgetting_learning_rate")
        record = {k: float(v) for k, v in record.items()}
        self._state = new_state
        self._chunk_index += 1
        # stream points seen (replayed points are not counted)
        n_seen = (self._history["points"][-1] if self._history["points"] else 0) + len(batch)
        for key, value in (("points", n_seen), ("gamma", record["gamma"]),
                           ("alpha", record["alpha"]), ("loss", record["loss"])):
            self._history[key].append(value)
        record.update(num_points=len(batch), chunk=self._chunk_index)
        return record

    # -- accessors -----------------------------------------------------------------------------
    @property
    def feature_dim(self) -> int:
        """m, the width of ``phi(x; theta)`` (bias included)."""
        return int(self._require_state("feature_dim").filter.covariance.shape[0])

    @property
    def prior_variance(self) -> float:
        return float(self._functions()[0].params.prior.prior_variance)

    @property
    def noise_variance(self) -> float:
        return float(self._functions()[0].params.observation.noise_variance)

    @property
    def forgetting_coefficient(self) -> float:
        """Current ``gamma = exp(-delta / 2)``."""
        return float(np.exp(-0.5 * float(self._require_state("gamma").filter.delta)))

    @property
    def calibration(self) -> float:
        """Current ``alpha``."""
        return float(np.exp(float(self._require_state("alpha").log_alpha)))

    @property
    def kalman_state(self):
        """The :class:`inference.kalman.KalmanState` (mean ``(m, K)``, covariance ``(m, m)``)."""
        return self._require_state("kalman_state").filter

    def features(self, x: Any) -> np.ndarray:
        """``phi(x; theta)`` with the current theta, ``(n, m)``."""
        batch = self._validate(Batch(x), require_targets=False)
        state = self._require_state("features")
        xj, _ = batch.jax(self._dtype)
        return np.asarray(self._functions()[3](state.theta, xj))

    def trajectories(self) -> dict[str, np.ndarray]:
        """Per-chunk ``points`` of the stream seen (replay not counted), ``gamma`` and ``alpha``
        after the chunk, and the chunk's fine-tuning ``loss`` (mean negative log predictive
        before the update)."""
        return {k: np.asarray(v, dtype=np.int64 if k == "points" else np.float64)
                for k, v in self._history.items()}

    # -- persistence ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        s = self._require_state("state_dict")
        k = s.filter
        return {
            "input_dim": int(self._input_dim),
            "kalman": {"mean": np.asarray(k.mean), "covariance": np.asarray(k.covariance),
                       "delta": np.asarray(k.delta), "num_points": np.asarray(k.num_points)},
            "theta": tree_state(s.theta),
            "log_alpha": np.asarray(s.log_alpha),
            "opt_state": tree_state(s.opt_state),
            "memory": self._memory_arrays(s.memory),
            "chunk_index": int(self._chunk_index),
            "history": {key: np.asarray(v, dtype=np.int64 if key == "points" else np.float64)
                        for key, v in self._history.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from inference.kalman import KalmanState

        s = self._state_to_load(state)
        ks = state["kalman"]
        kstate = KalmanState(*restore_tree([ks[f] for f in KalmanState._fields], list(s.filter),
                                           "kalman"))
        theta = restore_tree(state["theta"], s.theta, "theta")
        opt_state = restore_tree(state["opt_state"], s.opt_state, "opt_state")
        memory = self._restore_memory(state["memory"], s.memory)
        log_alpha = restore_tree([state["log_alpha"]], [s.log_alpha], "log_alpha")[0]
        self._state = s._replace(filter=kstate, theta=theta, log_alpha=log_alpha,
                                 opt_state=opt_state, memory=memory)
        self._chunk_index = int(state["chunk_index"])
        self._history = {k: np.asarray(as_numpy(v)).tolist() for k, v in state["history"].items()}

    # -- ArviZ ---------------------------------------------------------------------------------
    def _export(self, name: str, mean: np.ndarray, dims: list[str], coords: dict,
                x: Any, y: Any, num_draws: int, seed: int, log_lik_fn, observed_fn,
                num_chains: int | None = None) -> Any:
        """``gaussian_to_inference_data`` of ``N(mean, A)`` with the constants, the per-chunk
        trajectories and, with ``x, y``, the pointwise log likelihood. The draws are
        independent (split into ``num_chains`` chains, default
        :func:`ppl_cl.inference_data.default_chains`), from the filtered posterior of the
        current weights ``w_n`` (eqs. 5 / 8): under the drift prior earlier points were
        explained by earlier weights, so a log likelihood of the stream's past under ``w_n``
        is not a leave-one-out of the model."""
        from ppl_cl.inference_data import gaussian_to_inference_data

        A = np.asarray(self.kalman_state.covariance, dtype=np.float64)
        dims = {name: dims}
        log_lik = observed = None
        if x is not None:
            if y is None:
                raise ValueError("y: expected targets with x (for the log_likelihood group)")
            batch = self._validate(Batch(x, y), require_targets=True)
            phi = self.features(batch.x).astype(np.float64)
            observed_y = observed_fn(as_numpy(batch.y))

            def log_lik(draws):
                return {"y": log_lik_fn(draws[name], phi, observed_y)}

            observed = {"y": observed_y}
            dims["y"] = ["obs"]
            coords["obs"] = np.arange(observed_y.shape[0])
        constants = {"prior_variance": np.asarray(self.prior_variance),
                     "noise_variance": np.asarray(self.noise_variance),
                     "forgetting_coefficient": np.asarray(self.forgetting_coefficient)}
        if self._likelihood == "softmax":
            constants["calibration"] = np.asarray(self.calibration)
        h = self.trajectories()
        trajectories = None
        if h["points"].size:
            # passed as a dict: xarray.Dataset is a Mapping, and samples_to_inference_data would
            # rebuild a given Dataset and drop its time labels
            coords["time"] = h["points"]
            trajectories = {"gamma": h["gamma"], "alpha": h["alpha"], "loss": h["loss"]}
        return gaussian_to_inference_data(
            {name: mean}, {name: A}, num_draws=num_draws, num_chains=num_chains, seed=seed,
            dims=dims, coords=coords, log_likelihood=log_lik, observed_data=observed,
            constant_data=constants, trajectories=trajectories,
            posterior="Gaussian filtered posterior of the current readout (Kalman recursions)")


class KalmanClassifier(_KalmanLearner):
    """Online K-way classifier with the Kalman filter of Titsias et al. (2024)
    (:class:`ppl_cl.configs.kalman.KalmanConfig`).

    Readout ``W_n`` (``m x K``) under the drift prior (eqs. 2-3), Gaussian surrogate likelihood
    for the recursion (eqs. 7-8; one ``m x m`` covariance for all K classes), softmax with
    calibration for prediction (eq. 13), online SGD on delta (eqs. 9, 12). Defaults of
    Algorithm 1: ``s2 = 1/K``, ``s_w2 = 1/m``.

    ``KalmanClassifier(num_classes=10, input_dim=784, network=NetworkConfig("mlp", 256))`` or
    ``KalmanClassifier(KalmanConfig(...))``.
    """

    learner_name = "kalman-classifier"
    config_cls = KalmanConfig
    _likelihood = "softmax"

    def __init__(self, config: KalmanConfig | None = None, /, **overrides: Any) -> None:
        super().__init__(config, **overrides)

    @property
    def num_classes(self) -> int:
        return int(self.config.num_classes)

    @property
    def num_outputs(self) -> int:
        return self.num_classes

    def _validate(self, batch: Batch, require_targets: bool) -> Batch:
        return batch.validate(input_dim=self._input_dim,
                              num_classes=self.num_classes if require_targets else None,
                              require_targets=require_targets, allow_empty=not require_targets)

    def _target_array(self, y: Any):
        import jax.numpy as jnp

        return jnp.asarray(as_numpy(y).astype(np.int32))

    def predict(self, x: Any, task_id: int | None = None) -> CategoricalPredictive:
        """Class probabilities of eq. 13 under the pre-chunk statistics, ``(n, K)``."""
        probs = self._predict_raw(x)
        if probs is None:
            return CategoricalPredictive(np.zeros((0, self.num_classes)))
        return CategoricalPredictive(np.asarray(probs, dtype=np.float64))

    def to_inference_data(self, x: Any = None, y: Any = None, *, num_draws: int = 500,
                          num_chains: int | None = None, seed: int = 0):
        """ArviZ data of the filtered readout posterior ``q(W_n | y_{1:n})``: ``num_draws``
        independent draws in ``num_chains`` chains (default: up to 4 of at least 4 draws).

        ``posterior.readout`` ``(chain, draw, class, feature)``: K independent rows
        ``N(M[:, k], A)`` sharing the covariance A (eqs. 7-8); ``filtering`` group: the per-chunk
        trajectories of ``gamma``, ``alpha`` and ``loss`` (time = points seen);
        ``constant_data``: s_w2, s2 and the current gamma and alpha. With ``x, y`` also
        ``log_likelihood.y`` = ``log softmax(alpha W^T phi(x))_y`` per draw and
        ``observed_data.y``.
        """
        alpha = self.calibration

        def log_lik(readout, phi, labels):
            logits = alpha * np.einsum("csKm,nm->csnK", readout, phi)
            logits = logits - logits.max(-1, keepdims=True)
            logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            return np.take_along_axis(logp, labels[None, None, :, None], -1)[..., 0]

        M = np.asarray(self.kalman_state.mean, dtype=np.float64).T          # (K, m)
        coords = {"class": np.arange(self.num_classes), "feature": np.arange(self.feature_dim)}
        return self._export("readout", M, ["class", "feature"], coords, x, y, num_draws, seed,
                            log_lik, lambda v: v.astype(np.int64), num_chains)


class KalmanRegressor(_KalmanLearner):
    """Online regression with the drift prior and the Kalman filter (eqs. 1-6, App. B)
    (:class:`ppl_cl.configs.kalman.KalmanRegressorConfig`).

    ``predict`` returns ``N(gamma m^T phi, phi^T A^- phi + s2)`` (eq. 6, one transition ahead;
    App. C variant with ``mean_preserving=True``: ``m^T phi``). ``learn_forgetting`` runs the
    SGD of App. B on delta at every point ("always") or once per chunk ("last").
    """

    learner_name = "kalman-regressor"
    config_cls = KalmanRegressorConfig
    _likelihood = "gaussian"

    def __init__(self, config: KalmanRegressorConfig | None = None, /, **overrides: Any) -> None:
        super().__init__(config, **overrides)

    def _validate(self, batch: Batch, require_targets: bool) -> Batch:
        return batch.validate(input_dim=self._input_dim, regression=require_targets,
                              require_targets=require_targets, allow_empty=not require_targets)

    def _target_array(self, y: Any):
        import jax.numpy as jnp

        return jnp.asarray(as_numpy(y), dtype=self._dtype)

    def predict(self, x: Any, task_id: int | None = None) -> GaussianPredictive:
        """Gaussian predictive of eq. 6 per row of ``x``."""
        out = self._predict_raw(x)
        if out is None:
            return GaussianPredictive(np.zeros(0), np.zeros(0))
        mean, var = out
        return GaussianPredictive(np.asarray(mean), np.asarray(var))

    def to_inference_data(self, x: Any = None, y: Any = None, *, num_draws: int = 500,
                          num_chains: int | None = None, seed: int = 0):
        """``posterior.weights`` ``(chain, draw, feature)``: independent draws from
        ``N(m_n, A_n)`` in ``num_chains`` chains; the ``filtering`` trajectories; with ``x, y``
        the pointwise ``log N(y | w^T phi, s2)``."""
        from ppl_cl.inference_data import gaussian_log_likelihood

        s2 = self.noise_variance

        def log_lik(weights, phi, yv):
            return gaussian_log_likelihood(np.einsum("csm,nm->csn", weights, phi), yv, s2)

        m = np.asarray(self.kalman_state.mean, dtype=np.float64)[:, 0]
        return self._export("weights", m, ["feature"], {"feature": np.arange(self.feature_dim)},
                            x, y, num_draws, seed, log_lik, lambda v: v.astype(np.float64),
                            num_chains)
