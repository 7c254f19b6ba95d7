"""Online sparse GP regression that decides how many inducing points it needs (VIPS).

``OnlineSGPR(policy="vips")`` is the streaming sparse GP of Bui et al. (2017) whose inducing
set is chosen per batch by a :mod:`inference.vips` policy (VIPS, Pescador-Barrios et al. 2024;
Conditional Variance; OIPS; fixed M). Each ``update(batch)``:

1. selects the new inducing inputs with the *previous* hyperparameters (old points first);
2. freezes them and fits kernel + noise by L-BFGS on the online bound;
3. keeps ``q(u_b)`` and ``K_bb`` as the summary the next batch conditions on. No data is kept.

The model is :mod:`models.online_sgpr`, the engine :class:`inference.vips.OnlineSGPREngine`.
Runs in float64 (``enable_x64`` in the constructor).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_cl.batch import Batch, as_numpy
from ppl_cl.configs.vips import OnlineSGPRConfig
from ppl_cl.learner import Learner
from ppl_cl.numerics import enable_x64
from ppl_cl.predictive import GaussianPredictive

__all__ = ["OnlineSGPR", "NotFittedError", "make_policy", "initial_params"]

from ppl_cl.errors import NotFittedError

_RECORD_KEYS = ("m", "added", "bound", "bound_selected", "l_max", "l_noise", "threshold",
                "iterations", "select_seconds", "fit_seconds")


def make_policy(config: OnlineSGPRConfig):
    """The :mod:`inference.vips` policy object a config names."""
    from inference import vips

    if config.policy == "vips":
        return vips.VIPS(delta=config.delta, first_delta=config.first_delta,
                         lmax_points=config.lmax_points, jitter=config.jitter,
                         first_jitter=config.first_selection_jitter,
                         incremental=config.incremental)
    if config.policy == "cv":
        return vips.ConditionalVariance(eta=config.cv_eta, max_points=config.cv_max_points)
    if config.policy == "oips":
        return vips.OIPS(rho=config.oips_rho, kmin=config.oips_kmin)
    return vips.FixedM(num_inducing=config.fixed_m, method=config.fixed_method)


def initial_params(config: OnlineSGPRConfig, input_dim: int):
    """The starting :class:`models.exact_gp.GPRegressionParams` of a config."""
    import jax.numpy as jnp

    from models import kernels_jax as kj
    from models.exact_gp import GPRegressionParams

    f = lambda v: jnp.asarray(v, jnp.float64)  # noqa: E731
    if config.kernel == "se":
        kern = kj.SquaredExponential(f(config.variance), f([config.lengthscale]))
    elif config.kernel == "se-ard":
        kern = kj.SquaredExponential(f(config.variance), f([config.lengthscale] * input_dim))
    elif config.kernel == "matern52":
        kern = kj.Matern52(f(config.variance), f([config.lengthscale]))
    else:
        kern = kj.Sum(kj.Constant(f(config.constant)),
                      kj.Matern52(f(config.variance), f([config.lengthscale])))
    return GPRegressionParams(kern, f(config.noise_variance))


class OnlineSGPR(Learner):
    """Streaming sparse GP regression with an inducing-point policy (see module docstring).

    Args:
        config: an :class:`~ppl_cl.configs.vips.OnlineSGPRConfig` (default: VIPS, delta 0.05).
        **overrides: fields of the config to replace (``OnlineSGPR(policy="cv", cv_eta=0.1)``).

    ``predict(x)`` includes the noise variance unless ``latent=True``.
    """

    learner_name = "online-sgpr"
    config_cls = OnlineSGPRConfig

    def __init__(self, config: OnlineSGPRConfig | None = None, /, **overrides: Any) -> None:
        if isinstance(overrides.get("variance_bounds"), list):
            overrides["variance_bounds"] = tuple(overrides["variance_bounds"])
        super().__init__(config, **overrides)
        config = self.config
        enable_x64()
        from inference.vips import OnlineSGPREngine

        self.policy = make_policy(config)
        self.engine = OnlineSGPREngine(self.policy, jitter=config.jitter,
                                       summary_jitter=config.summary_jitter, fit=config.fit,
                                       variance_bounds=config.variance_bounds,
                                       min_noise_variance=config.min_noise_variance,
                                       max_iterations=config.max_iterations,
                                       parametrization=config.parametrization)
        self._state = None
        self._history: dict[str, list] = {k: [] for k in _RECORD_KEYS}
        self._history["hyperparameters"] = []
        self._history["num_data"] = []

    # -- state --------------------------------------------------------------------------------
    @property
    def input_dim(self) -> int | None:
        return None if self._state is None else int(self._state.inducing_inputs.shape[1])

    @property
    def num_inducing(self) -> int:
        return 0 if self._state is None else int(self._state.inducing_inputs.shape[0])

    @property
    def num_batches(self) -> int:
        return 0 if self._state is None else int(self._state.num_batches)

    @property
    def inducing_inputs(self) -> np.ndarray:
        self._check_fitted("inducing_inputs")
        return np.asarray(self._state.inducing_inputs)

    @property
    def params(self):
        """Current :class:`models.exact_gp.GPRegressionParams` (``None`` before any batch)."""
        return None if self._state is None else self._state.params

    def hyperparameters(self) -> dict[str, np.ndarray]:
        """Kernel hyperparameters by dotted name (``variance``, ``k2.lengthscale``...) and
        ``noise_variance``, as NumPy arrays."""
        self._check_fitted("hyperparameters")
        return _named_leaves(self._state.params)

    def history(self) -> dict[str, list]:
        """Per-batch records (M, bounds, L_max, L_noise, threshold, seconds, hyperparameters)."""
        return {k: list(v) for k, v in self._history.items()}

    def _check_fitted(self, what: str) -> None:
        if self._state is None:
            raise NotFittedError(f"OnlineSGPR.{what} before any update(): no batch seen yet")

    # -- protocol -----------------------------------------------------------------------------
    def update(self, batch: Batch) -> dict[str, Any]:
        """Select inducing points for ``batch``, fit the hyperparameters, pass the summary on.

        Returns ``m`` (inducing points after the batch), ``added``, ``bound`` (F after the fit),
        ``bound_selected`` (F at selection), ``l_max``, ``l_noise``, ``threshold`` (VIPS; NaN
        for other policies), ``iterations``, ``select_seconds``, ``fit_seconds`` and the
        hyperparameters. The batch is checked first; a refused batch leaves the state as it was.
        """
        import jax

        if not isinstance(batch, Batch):
            raise TypeError(f"batch: expected a ppl_cl.Batch, received {type(batch).__name__}")
        batch.validate(input_dim=self.input_dim, regression=True)
        x = as_numpy(batch.x).astype(np.float64)
        y = as_numpy(batch.y).astype(np.float64)
        state = self._state
        if state is None:
            state = self.engine.init(None, initial_params(self.config, x.shape[1]), x.shape[1])
        rng = jax.random.fold_in(jax.random.PRNGKey(self.config.seed), int(state.num_batches))
        new_state, info = self.engine.step(rng, state, (x, y))   # raises before any commit
        self._state = new_state
        record = {k: _py(getattr(info, k)) for k in _RECORD_KEYS}
        hp = {k: v.tolist() for k, v in self.hyperparameters().items()}
        for k in _RECORD_KEYS:
            self._history[k].append(record[k])
        self._history["hyperparameters"].append(hp)
        self._history["num_data"].append(int(x.shape[0]))
        record.update(hp)
        return record

    def predict(self, x: Any, task_id: int | None = None, *, latent: bool = False,
                full_cov: bool = False):
        """Gaussian predictive at ``x (n, d)`` (noise included unless ``latent``); with
        ``full_cov=True`` NumPy ``(mean (n,), covariance (n, n))`` of the latent f."""
        xb = Batch(x).validate(input_dim=self.input_dim, require_targets=False, allow_empty=True)
        xs = as_numpy(xb.x).astype(np.float64)
        if self._state is None:      # the prior predictive at the starting hyperparameters
            import jax.numpy as jnp

            params = initial_params(self.config, xs.shape[1])
            K = np.asarray(params.kernel(jnp.asarray(xs)))
            if full_cov:
                return np.zeros(xs.shape[0]), K
            noise = 0.0 if latent else float(params.noise_variance)
            return GaussianPredictive(np.zeros(xs.shape[0]), np.diagonal(K) + noise)
        if full_cov:
            return _predict_full(self._state, xs, self.config.jitter)
        if xs.shape[0] == 0:
            return GaussianPredictive(np.zeros(0), np.zeros(0))
        mean, var = _predict_diag(self._state, xs, self.config.jitter)
        var = np.maximum(var, 0.0)
        if not latent:
            var = var + float(self._state.params.noise_variance)
        return GaussianPredictive(mean, var)

    def state_dict(self) -> dict[str, Any]:
        if self._state is None:
            return {"state": None, "history": self._history}
        s = self._state
        import jax

        return {"state": {"inducing_inputs": np.asarray(s.inducing_inputs),
                          "q_mean": np.asarray(s.q_mean), "q_cov": np.asarray(s.q_cov),
                          "prior_cov": np.asarray(s.prior_cov),
                          "params": [np.asarray(v) for v in jax.tree_util.tree_leaves(s.params)],
                          "stats": [np.asarray(v) for v in s.stats],
                          "num_batches": int(s.num_batches),
                          # the next batch's factorized old terms (so a resumed run computes
                          # exactly what an uninterrupted one does)
                          "terms": None if s.terms is None else
                          {k: np.asarray(getattr(s.terms, k))
                           for k in ("a", "w", "A", "const", "mask")}},
                "history": self._history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import jax
        import jax.numpy as jnp

        from inference.vips import OnlineSGPRState, TargetStats

        history = {k: list(v) for k, v in state["history"].items()}
        if state["state"] is None:
            self._state, self._history = None, history
            return
        st = state["state"]
        Z = np.asarray(st["inducing_inputs"], np.float64)
        template = initial_params(self.config, Z.shape[1])
        leaves, treedef = jax.tree_util.tree_flatten(template)
        got = [np.asarray(v, np.float64) for v in st["params"]]
        if len(got) != len(leaves) or any(g.shape != tuple(t.shape) for g, t in zip(got, leaves)):
            raise ValueError(f"params: the checkpoint's hyperparameters {[g.shape for g in got]} "
                             f"do not fit kernel {self.config.kernel!r}")
        params = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(g) for g in got])
        f = lambda a: jnp.asarray(np.asarray(a, np.float64))  # noqa: E731
        terms = None
        if st.get("terms") is not None:
            from models.online_sgpr import OldTerms

            t = st["terms"]
            terms = OldTerms(f(t["a"]), f(t["w"]), f(t["A"]), f(t["const"]),
                             jnp.asarray(np.asarray(t["mask"], bool)))
        self._state = OnlineSGPRState(np.asarray(Z), np.asarray(st["q_mean"], np.float64),
                                      np.asarray(st["q_cov"], np.float64),
                                      np.asarray(st["prior_cov"], np.float64),
                                      params, TargetStats(*[np.float64(v) for v in st["stats"]]),
                                      np.int32(int(st["num_batches"])), terms)
        self._history = history

    def to_inference_data(self, x: Any = None, y: Any = None, *, num_draws: int = 500,
                          num_chains: int | None = None, seed: int = 0):
        """ArviZ InferenceData: independent draws of the latent ``f`` at ``x`` (default: the
        inducing inputs) from ``q(f)``, in ``num_chains`` chains (default: up to 4 of at least 4
        draws), with ``observed_data`` and a pointwise ``log_likelihood`` when ``y`` is given;
        the per-batch trajectories of M, the bounds and the hyperparameters go to the
        filtering group, the current hyperparameters and inducing inputs to ``constant_data``.
        """
        from ppl_cl.inference_data import gaussian_log_likelihood, gaussian_to_inference_data

        self._check_fitted("to_inference_data")
        x = self.inducing_inputs if x is None else as_numpy(
            Batch(x).validate(input_dim=self.input_dim, require_targets=False).x)
        mean, cov = self.predict(x, full_cov=True)
        hp = self.hyperparameters()
        extra: dict[str, Any] = {}
        if y is not None:
            y = Batch(x, as_numpy(y)).validate(regression=True).y.astype(np.float64)
            s2 = float(hp["noise_variance"])
            extra = {"log_likelihood": lambda d: {"y": gaussian_log_likelihood(d["f"], y, s2)},
                     "observed_data": {"y": y}}
        traj: dict[str, Any] = {k: np.asarray(self._history[k], np.float64)
                                for k in ("m", "bound", "bound_selected", "l_max", "l_noise",
                                          "threshold", "iterations")}
        for name in hp:
            traj[f"hp_{name.replace('.', '_')}"] = np.asarray(
                [np.ravel(h[name])[0] for h in self._history["hyperparameters"]])
        constant = {k.replace(".", "_"): v for k, v in hp.items()}
        constant["inducing_inputs"] = self.inducing_inputs
        return gaussian_to_inference_data(
            {"f": mean}, {"f": cov}, num_draws=num_draws, num_chains=num_chains, seed=seed,
            dims={"f": ["obs"], "y": ["obs"]}, coords={"obs": np.arange(x.shape[0]),
                                                        "time": np.arange(1, len(traj["m"]) + 1)},
            constant_data=constant, trajectories=traj, warn_jitter=False,
            posterior="variational q(f) of the online sparse GP (Bui et al. 2017)", **extra)


# -- helpers ----------------------------------------------------------------------------------
def _py(v: Any) -> Any:
    a = np.asarray(v)
    return a.item() if a.ndim == 0 else a.tolist()


def _named_leaves(params) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}

    def walk(k, prefix: str) -> None:
        from models.kernels_jax import Kernel

        children, _ = k.tree_flatten()
        for name, c in zip(k._fields, children):
            if isinstance(c, Kernel):
                walk(c, f"{prefix}{name}.")
            else:
                out[f"{prefix}{name}"] = np.asarray(c)

    walk(params.kernel, "")
    out["noise_variance"] = np.asarray(params.noise_variance)
    return out


_PREDICT_ROWS = 256
"""Test points per prediction call: one compiled prediction per inducing-set bucket."""


def _padded_state(state):
    from inference.vips import bucket, pad_rows

    M = int(np.shape(state.inducing_inputs)[0])
    n = bucket(M)
    Sp = np.zeros((n, n))
    Sp[:M, :M] = np.asarray(state.q_cov)
    return (pad_rows(state.inducing_inputs, n), pad_rows(state.q_mean, n), Sp,
            np.arange(n) < M)


def _predict_diag(state, xs: np.ndarray, jitter: float) -> tuple[np.ndarray, np.ndarray]:
    import jax.numpy as jnp

    from inference.vips import pad_rows

    Zp, mp, Sp, zm = (jnp.asarray(a) for a in _padded_state(state))
    n = xs.shape[0]
    means, variances = [], []
    for lo in range(0, n, _PREDICT_ROWS):
        chunk = xs[lo:lo + _PREDICT_ROWS]
        Xs = jnp.asarray(pad_rows(chunk, _PREDICT_ROWS))
        mean, var = _predict_jit(state.params, Zp, mp, Sp, Xs, jnp.asarray(jitter), zm)
        means.append(np.asarray(mean)[: chunk.shape[0]])
        variances.append(np.asarray(var)[: chunk.shape[0]])
    return np.concatenate(means), np.concatenate(variances)


def _predict_full(state, xs: np.ndarray, jitter: float) -> tuple[np.ndarray, np.ndarray]:
    import jax.numpy as jnp
    from jax.scipy.linalg import solve_triangular

    from models.linalg_jax import jitter_cholesky, symmetrize

    kern = state.params.kernel
    Z = jnp.asarray(state.inducing_inputs)
    X = jnp.asarray(xs)
    L = jitter_cholesky(kern(Z) + jitter * jnp.eye(Z.shape[0]), name="K_bb")
    B = solve_triangular(L, kern(Z, X), lower=True)
    W = solve_triangular(L.T, B, lower=False)
    mean = W.T @ jnp.asarray(state.q_mean)
    cov = symmetrize(kern(X) - B.T @ B + W.T @ jnp.asarray(state.q_cov) @ W)
    return np.asarray(mean), np.asarray(cov)


def _make_predict_jit():
    import jax

    from models.online_sgpr import predict_from_inducing

    return jax.jit(lambda p, Z, m, S, X, j, zm: predict_from_inducing(p, Z, m, S, X, jitter=j,
                                                                      z_mask=zm))


class _Lazy:
    fn = None

    def __call__(self, *args):
        if _Lazy.fn is None:
            _Lazy.fn = _make_predict_jit()
        return _Lazy.fn(*args)


_predict_jit = _Lazy()
