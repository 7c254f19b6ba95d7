"""GP-ELLA learner (Clingerman & Eaton 2017): lifelong GP regression over tasks that arrive one
at a time (Algorithm 1), with the prediction of Sect. 4.4.

``update(Batch(x, y, task_id))`` — a new task or more data for a known one:

1. the task's targets are centred on their mean (kept for prediction; Sect. 5.2 centres);
2. single-task GP: type-II ML over ``theta_t`` (inverse squared lengthscales), ``sigma_f^2``
   and ``sigma^2``, then ``H_t`` (eq. 6) — :func:`inference.gp_ella.fit_single_task`;
3. the ELLA step: sparse code ``s_t`` (LASSO), basis ``L`` from the running sums, zero columns
   re-drawn — :class:`inference.gp_ella.ELLAEngine`.

``predict(x, task_id)`` uses ``theta_t = max(L s_t, 0)``; ``sigma_f^2`` is chosen by a line
search on a held-out part of the task's training data (skipped when the task is too small:
``holdout_fraction * n < 1`` or fewer than 2 points left, then the fitted ``sigma_f^2`` is
used; the update record says ``line_search_possible``); predictions made with every known
task's ``theta_t'`` on this task's data are averaged with weights
``exp(-|theta_t - theta_t'|^2 / (2 * 100))`` (Sect. 4.4). The predictive is the mixture's mean
and variance.

Handled inputs: a task with constant targets is stored with ``theta_hat = 0`` and ``H = 0``
(no GP fit; its code is 0 and it leaves the basis unchanged; it predicts its mean). Errors
(state unchanged): no ``task_id``, NaN / inf, an empty batch, a changed feature dimension,
``predict`` for a task id never seen.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ppl_cl.batch import Batch, as_numpy
from ppl_cl.configs.gp_ella import GPELLAConfig
from ppl_cl.learner import Learner, check_batch
from ppl_cl.numerics import enable_x64
from ppl_cl.predictive import GaussianPredictive

from ppl_cl.errors import NotFittedError

__all__ = ["GPELLA", "NotFittedError", "ConfigLearner", "TaskStore"]


def _synchronous_cpu_dispatch() -> None:
    """Run JAX CPU computations synchronously (process-wide, like ``enable_x64``).

    With asynchronous CPU dispatch, many small computations interleaved with host reads (the
    per-task GP fits: one L-BFGS step = one dispatch + one read) hung here for good, the main
    thread waiting in ``BlockUntilReady`` on a computation no XLA thread ran (seen twice on a
    loaded 2-core machine; jax-ml/jax#25861 reports the same hang and this workaround). The
    small computations gain nothing from asynchrony.
    """
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)


class ConfigLearner(Learner):
    """The GP-ELLA learners' shared start: the config of :class:`ppl_cl.learner.Learner`,
    float64 JAX and synchronous CPU dispatch."""

    def __init__(self, config: Any = None, /, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        enable_x64()
        _synchronous_cpu_dispatch()

    _check_batch = staticmethod(check_batch)


class TaskStore:
    """Training data per task slot (GP learners keep them: predictions condition on them).

    ``ids`` lists task ids in order of first appearance; slot ``i`` holds ``X[i] (n_i, d)``,
    centred targets ``y[i]`` and the mean ``y_mean[i]`` removed from them.
    """

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.X: list[np.ndarray] = []
        self.y: list[np.ndarray] = []
        self.y_mean: list[float] = []

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def input_dim(self) -> int | None:
        return None if not self.X else int(self.X[0].shape[1])

    def slot(self, task_id: int) -> int | None:
        try:
            return self.ids.index(int(task_id))
        except ValueError:
            return None

    def merged(self, task_id: int, x: np.ndarray, y: np.ndarray
               ) -> tuple[int, bool, np.ndarray, np.ndarray, float]:
        """``(slot, new, X_all, y_centred, y_mean)`` after appending ``(x, y)`` to the task,
        without storing anything (see :meth:`commit`)."""
        slot = self.slot(task_id)
        if slot is None:
            X_all, y_all, new, slot = x, y, True, len(self.ids)
        else:
            X_all = np.concatenate([self.X[slot], x])
            y_all = np.concatenate([self.y[slot] + self.y_mean[slot], y])
            new = False
        mean = float(np.mean(y_all))
        return slot, new, X_all, y_all - mean, mean

    def commit(self, task_id: int, slot: int, X: np.ndarray, yc: np.ndarray, mean: float) -> None:
        if slot == len(self.ids):
            self.ids.append(int(task_id))
            self.X.append(X)
            self.y.append(yc)
            self.y_mean.append(mean)
        else:
            self.X[slot], self.y[slot], self.y_mean[slot] = X, yc, mean

    def validate(self, batch: Batch) -> tuple[int, np.ndarray, np.ndarray]:
        """Checks a training batch (task id, shapes, finiteness, dimension) before any change."""
        if batch.task_id is None:
            raise ValueError("task_id: expected the batch's task id (an int), received None")
        batch.validate(input_dim=self.input_dim, regression=True)
        return (int(batch.task_id), as_numpy(batch.x).astype(np.float64),
                as_numpy(batch.y).astype(np.float64))

    def check_predict(self, x: Any, task_id: Any, name: str) -> tuple[int, np.ndarray]:
        if not self.ids:
            raise NotFittedError(f"{name}.predict before any update(): no task seen yet")
        if task_id is None:
            raise ValueError(f"task_id: {name} predicts per task; expected one of the known ids "
                             f"{self.ids[:10]}{'...' if len(self.ids) > 10 else ''}, received None")
        slot = self.slot(task_id)
        if slot is None:
            raise ValueError(f"task_id: unknown task {task_id!r}; known ids: "
                             f"{self.ids[:10]}{'...' if len(self.ids) > 10 else ''}")
        xb = Batch(x).validate(input_dim=self.input_dim, require_targets=False, allow_empty=True)
        return slot, as_numpy(xb.x).astype(np.float64)

    def state(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "X": list(self.X), "y": list(self.y),
                "y_mean": np.asarray(self.y_mean, np.float64)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "TaskStore":
        store = cls()
        store.ids = [int(i) for i in state["ids"]]
        store.X = [np.asarray(a, np.float64) for a in state["X"]]
        store.y = [np.asarray(a, np.float64) for a in state["y"]]
        store.y_mean = [float(v) for v in np.asarray(state["y_mean"]).reshape(-1)]
        return store


def ella_engine(config: Any):
    """The ELLA engine (sparse coding and basis update, eqs. 10-11) of a GP-ELLA or linear-ELLA
    config."""
    from inference.gp_ella import ELLAEngine

    return ELLAEngine(config.num_components, config.mu, config.lam,
                      max_inner_iterations=config.max_inner_iterations,
                      inner_tolerance=config.inner_tolerance)


def ella_state_tree(state) -> dict[str, Any]:
    """An :class:`inference.gp_ella.ELLAState` as a checkpoint tree (its fields by name)."""
    return dict(state._asdict())


def ella_state_from_tree(e: dict[str, Any]):
    """The :class:`inference.gp_ella.ELLAState` of :func:`ella_state_tree`'s tree."""
    from inference.gp_ella import ELLAState

    return ELLAState(np.asarray(e["L"], np.float64), np.asarray(e["A"], np.float64),
                     np.asarray(e["b"], np.float64), float(e["sq"]), float(e["l1"]),
                     int(e["num_tasks"]), np.asarray(e["thetas"], np.float64),
                     np.asarray(e["hessians"], np.float64),
                     np.asarray(e["codes"], np.float64), np.asarray(e["seen"], bool))


class GPELLA(ConfigLearner):
    """GP-ELLA on the learner protocol (module docstring). Build as
    ``GPELLA(GPELLAConfig(...))`` or ``GPELLA(num_components=4, mu=...)``."""

    learner_name = "gp-ella"
    config_cls = GPELLAConfig

    def __init__(self, config: GPELLAConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        c = self.config
        self.engine = ella_engine(c)
        self._store = TaskStore()
        self._state = None  # inference.gp_ella.ELLAState
        self._fits: list[dict[str, Any]] = []  # per slot: signal/noise variance, nll, ...
        self._num_updates = 0
        self._cache: dict[int, tuple[float, np.ndarray]] = {}

    # -- helpers -------------------------------------------------------------------------
    def _key(self, purpose: int):
        import jax

        return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(self.config.seed),
                                                     purpose), self._num_updates)

    def _fit_options(self) -> dict[str, Any]:
        c = self.config
        return dict(max_iterations=c.max_iterations, min_noise_variance=c.min_noise_variance,
                    theta_bounds=(c.theta_lower, c.theta_upper),
                    init_noise_ratio=c.init_noise_ratio, hessian=c.hessian,
                    pad_multiple=c.pad_multiple)

    @property
    def task_ids(self) -> list[int]:
        return list(self._store.ids)

    @property
    def num_tasks(self) -> int:
        return len(self._store)

    @property
    def basis(self) -> np.ndarray:
        """``L`` ``(d, k)``."""
        self._require_fitted("basis")
        return self._state.L.copy()

    @property
    def codes(self) -> np.ndarray:
        """``s_t`` as rows ``(T, k)``, tasks in order of first appearance."""
        self._require_fitted("codes")
        return self._state.codes.copy()

    @property
    def state(self):
        """The engine's :class:`inference.gp_ella.ELLAState`."""
        return self._state

    def reconstructed_thetas(self) -> np.ndarray:
        """``max(L s_t, 0)`` as rows ``(T, d)`` (the kernels used to predict)."""
        self._require_fitted("reconstructed_thetas")
        return np.maximum(self._state.codes @ self._state.L.T, 0.0)

    def fitted_thetas(self) -> np.ndarray:
        """Single-task optima ``theta_hat_t`` ``(T, d)``."""
        self._require_fitted("fitted_thetas")
        return self._state.thetas.copy()

    def _require_fitted(self, what: str) -> None:
        if self._state is None or not len(self._store):
            raise NotFittedError(f"GPELLA.{what} before any update(): no task seen yet")

    # -- protocol ------------------------------------------------------------------------
    def update(self, batch: Batch, *, single_task_fit: Any = None) -> dict[str, Any]:
        """Learn from a task's batch (Algorithm 1, one pass of the outer loop).

        Args:
            batch: ``Batch(x (n, d), y (n,), task_id)``.
            single_task_fit: optional :class:`inference.gp_ella.SingleTaskFit` of exactly the
                task's data after this batch (centred targets), to skip the GP fit (a
                hyperparameter sweep over k, mu, lambda reuses the fits of its tasks).
        """
        import jax

        from inference.gp_ella import fit_single_task

        batch = self._check_batch(batch)
        task_id, x, y = self._store.validate(batch)
        slot, new, X_all, yc, mean = self._store.merged(task_id, x, y)
        t0 = time.perf_counter()
        fit = single_task_fit if single_task_fit is not None else \
            fit_single_task(X_all, yc, **self._fit_options())
        t1 = time.perf_counter()
        state = self._state if self._state is not None else \
            self.engine.init(X_all.shape[1], jax.random.PRNGKey(self.config.seed))
        state, info = self.engine.step(self._key(1), state, (fit.theta, fit.hessian, slot))
        t2 = time.perf_counter()
        # commit only after everything above succeeded
        self._store.commit(task_id, slot, X_all, yc, mean)
        record_fit = {"signal_variance": fit.signal_variance, "noise_variance": fit.noise_variance,
                      "nll": fit.nll, "iterations": fit.iterations, "converged": fit.converged,
                      "constant_targets": fit.constant_targets}
        if new:
            self._fits.append(record_fit)
        else:
            self._fits[slot] = record_fit
        self._state = state
        self._num_updates += 1
        self._cache.clear()
        from inference.gp_ella import heldout_split

        return {"task_id": task_id, "new_task": new, "num_data": int(X_all.shape[0]),
                **record_fit, "ella_loss": info.loss, "inner_iterations": info.inner_iterations,
                "basis_change": info.basis_change, "lasso_converged": info.lasso_converged,
                "reinitialized_columns": info.reinitialized,
                "line_search_possible": heldout_split(X_all.shape[0],
                                                      self.config.holdout_fraction, 0) is not None,
                "seconds_fit": t1 - t0, "seconds_ella": t2 - t1}

    def _signal_variance(self, slot: int, thetas: np.ndarray) -> float:
        from inference.gp_ella import heldout_split, line_search_signal_variance

        c = self.config
        fit = self._fits[slot]
        base = float(fit["signal_variance"])
        if not c.line_search:
            return base
        X, y = self._store.X[slot], self._store.y[slot]
        split = heldout_split(X.shape[0], c.holdout_fraction, seed=c.seed * 1_000_003 + slot)
        if split is None:
            return base
        fit_idx, val_idx = split
        lo, hi = c.line_search_log10_range
        ratios = 10.0 ** np.linspace(lo, hi, c.line_search_points)
        if not np.any(np.isclose(ratios, 1.0)):
            ratios = np.sort(np.append(ratios, 1.0))
        best, _ = line_search_signal_variance(thetas[slot], float(fit["noise_variance"]), base,
                                              X[fit_idx], y[fit_idx], X[val_idx], y[val_idx],
                                              ratios, c.pad_multiple)
        return best

    def predict(self, x: Any, task_id: int | None = None) -> GaussianPredictive:
        """Predictive of task ``task_id`` at ``x (n, d)`` (Sect. 4.4; module docstring)."""
        from inference.gp_ella import smoothed_prediction

        slot, xs = self._store.check_predict(x, task_id, "GPELLA")
        if xs.shape[0] == 0:
            return GaussianPredictive(np.zeros(0), np.zeros(0))
        c = self.config
        thetas = self.reconstructed_thetas()
        if slot not in self._cache:
            self._cache[slot] = (self._signal_variance(slot, thetas), thetas)
        sf2, thetas = self._cache[slot]
        mean, var, _ = smoothed_prediction(
            thetas[slot], thetas, sf2, float(self._fits[slot]["noise_variance"]),
            self._store.X[slot], self._store.y[slot], xs,
            smoothing_variance=c.smoothing_variance if c.smoothing else None,
            pad_multiple=c.pad_multiple)
        return GaussianPredictive(mean + self._store.y_mean[slot], var)

    def state_dict(self) -> dict[str, Any]:
        if self._state is None:
            return {"tasks": None}
        s = self._state
        return {"tasks": self._store.state(), "num_updates": self._num_updates,
                "ella": ella_state_tree(s),
                "fits": {k: np.asarray([f[k] for f in self._fits])
                         for k in ("signal_variance", "noise_variance", "nll", "iterations",
                                   "converged", "constant_targets")}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("tasks") is None:
            self._store, self._state, self._fits, self._num_updates = TaskStore(), None, [], 0
            self._cache.clear()
            return
        e = state["ella"]
        k = int(np.asarray(e["L"]).shape[1])
        if k != self.config.num_components:
            raise ValueError(f"num_components: the state has k = {k}, the config "
                             f"{self.config.num_components}")
        new_state = ella_state_from_tree(e)
        f = state["fits"]
        fits = [{"signal_variance": float(f["signal_variance"][i]),
                 "noise_variance": float(f["noise_variance"][i]), "nll": float(f["nll"][i]),
                 "iterations": int(f["iterations"][i]), "converged": bool(f["converged"][i]),
                 "constant_targets": bool(f["constant_targets"][i])}
                for i in range(len(state["tasks"]["ids"]))]
        self._store = TaskStore.from_state(state["tasks"])
        self._state, self._fits = new_state, fits
        self._num_updates = int(state["num_updates"])
        self._cache.clear()

    def to_inference_data(self, *, num_draws: int = 500, num_chains: int | None = None,
                          seed: int = 0):
        """ArviZ InferenceData of the Laplace posterior of the basis and the task kernels.

        Given the codes, eq. 9 is quadratic in ``L``: the program's Laplace-likelihood
        posterior of ``vec(L)`` (column-major) is ``N(vec L, (A + T lambda I)^-1)``, exact for
        that likelihood. Independent draws ``L^(i)`` go to ``posterior["L"] (chain, draw, d, k)``
        (``num_chains`` chains, default up to 4 of at least 4 draws) and
        ``theta_t^(i) = L^(i) s_t`` to ``posterior["theta"] (chain, draw, T, d)``; the single-task
        optima ``theta_hat``, Hessians ``H``, codes ``s`` and per-task variances go to
        ``constant_data``.
        """
        from scipy.linalg import solve_triangular

        from ppl_cl.inference_data import iid_attrs, samples_to_inference_data, split_chains
        from ppl_cl.seeding import as_generator

        self._require_fitted("to_inference_data")
        s = self._state
        d, k = s.L.shape
        T = s.num_tasks
        P = s.A + T * self.config.lam * np.eye(d * k)
        import jax.numpy as jnp

        from models.linalg_jax import jitter_cholesky

        Lp = np.asarray(jitter_cholesky(jnp.asarray(0.5 * (P + P.T)), name="posterior precision"))
        eps = as_generator(seed).standard_normal((num_draws, d * k))
        vec = s.L.reshape(-1, order="F")[None] + solve_triangular(Lp.T, eps.T, lower=False).T
        L_draws = vec.reshape(num_draws, k, d).transpose(0, 2, 1)  # unvec column-major
        theta_draws = np.einsum("sdk,tk->std", L_draws, s.codes)
        ids = np.asarray(self._store.ids)
        return samples_to_inference_data(
            split_chains({"L": L_draws[None], "theta": theta_draws[None]}, num_chains),
            dims={"L": ["input_dim", "component"], "theta": ["task", "input_dim"],
                  "theta_hat": ["task", "input_dim"], "codes": ["task", "component"],
                  "hessian": ["task", "input_dim", "input_dim_"],
                  "signal_variance": ["task"], "noise_variance": ["task"]},
            coords={"task": ids, "input_dim": np.arange(d), "component": np.arange(k),
                    "input_dim_": np.arange(d)},
            constant_data={"theta_hat": s.thetas, "codes": s.codes, "hessian": s.hessians,
                           "signal_variance": np.asarray([f["signal_variance"] for f in self._fits]),
                           "noise_variance": np.asarray([f["noise_variance"] for f in self._fits])},
            attrs=iid_attrs("Gaussian (Laplace) posterior of the basis L given the codes "
                            "(eq. 9)"))
