"""GP-ELLA learner (Clingerman & Eaton 2017): lifelong GP regression over tasks that arrive one
at a time (Algorithm 1), with the prediction of Sect. 4.4.

``update(Batch(x, y, task_id))`` — a new task or more data for a known one:

1. the task's targets are centred on their mean (kept for prediction; Sect. 5.2 centres);
2. single-task GP: type-II ML over ``theta_t`` (inverse squared lengthscales), ``sigma_f^2``
   and ``sigma^2``, run to convergence, then the gradient and ``H_t`` (eq. 6) —
   :func:`inference.gp_ella.fit_single_task`; eq. 5's expansion point and Hessian in the coded
   parametrization (``log theta`` by default, :func:`inference.gp_ella.expansion`);
3. the ELLA step: sparse code ``s_t`` (LASSO), basis ``L`` from the running sums, zero columns
   re-drawn — :class:`inference.gp_ella.ELLAEngine`.

``predict(x, task_id)`` uses the kernel ``theta_t = exp(L s_t)`` (``max(L s_t, 0)`` in the
paper's parametrization); ``sigma_f^2`` is chosen by a line search on a held-out part of the
task's training data (skipped when the task is too small: ``holdout_fraction * n < 1`` or
fewer than 2 points left, then the fitted ``sigma_f^2`` is used; the update record says
``line_search_possible``); predictions made with every known task's kernel on this task's data
are averaged with weights ``exp(-|z_t - z_t'|^2 / (2 v))`` over the coded parameters
``z = L s`` (Sect. 4.4, :class:`Smoother`; ``v`` by ``config.smoothing_scale``). The
predictive is the mixture's mean and variance. ``predict(..., smoothing=False)`` predicts with
the task's own kernel (the ablation). :meth:`GPELLA.diagnostics` says whether the expansions
were taken at minima.

Handled inputs: a task with constant targets is stored with a zero expansion (no GP fit; its
code is 0 and it leaves ``T``, the running sums and ``L`` exactly unchanged; it predicts its
mean). Errors (state unchanged): no ``task_id``, NaN / inf, an empty batch, a changed feature
dimension, ``predict`` for a task id never seen.
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

__all__ = ["GPELLA", "NotFittedError", "ConfigLearner", "TaskStore", "synchronous_cpu_dispatch"]


def synchronous_cpu_dispatch() -> None:
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
        synchronous_cpu_dispatch()

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
                     np.asarray(e["codes"], np.float64), np.asarray(e["seen"], bool),
                     np.asarray(e["counted"], bool))


def fit_options(config: Any, *, with_hessian: bool) -> dict[str, Any]:
    """Keyword arguments of :func:`inference.gp_ella.fit_single_task` from a config's single-task
    GP fields."""
    opts = dict(max_iterations=config.max_iterations, tolerance=config.fit_tolerance,
                min_noise_variance=config.min_noise_variance,
                theta_bounds=(config.theta_lower, config.theta_upper),
                init_noise_ratio=config.init_noise_ratio, pad_multiple=config.pad_multiple,
                with_hessian=with_hessian)
    if with_hessian:
        opts["hessian"] = config.hessian
    return opts


class Smoother:
    """Sect. 4.4's prediction smoothing over the known tasks' kernels, shared by GP-ELLA and
    the individual-GP ablation.

    A task's prediction is the mixture of the predictions made on its own data with every known
    task's kernel ``theta_t'``, weights :func:`inference.gp_ella.smoothing_weights` of the
    squared distances between the tasks' parameters ``points`` (their coded parametrization)
    with a variance chosen by ``config.smoothing_scale`` (:class:`ppl_cl.configs.gp_ella.
    _SmoothingFields`): ``"median"`` scales the median squared distance between the known
    tasks by ``config.smoothing_ratio``; ``"heldout"`` predicts every task's held-out points
    (the split of the line search, conditioned on the rest) under every kernel and keeps the
    grid value with the least pooled squared error.

    Args:
        config: the learner's config (smoothing fields, ``pad_multiple``, ``seed``).
        store: the learner's :class:`TaskStore`.
        points: ``(T, d)`` parameters whose distances weigh the tasks.
        kernels: ``(T, d)`` ``theta`` of each task's kernel.
        signal_variance: ``slot -> sigma_f^2`` used with every kernel on that task's data.
        noise_variances: ``(T,)`` per-task ``sigma^2``.
    """

    def __init__(self, config: Any, store: "TaskStore", points: np.ndarray, kernels: np.ndarray,
                 signal_variance, noise_variances: np.ndarray) -> None:
        self.config, self.store = config, store
        self.points, self.kernels = np.asarray(points, np.float64), np.asarray(kernels, np.float64)
        self.signal_variance = signal_variance
        self.noise_variances = np.asarray(noise_variances, np.float64)
        self._variance: float | None = None
        self.heldout_sse: np.ndarray | None = None
        self.grid: np.ndarray | None = None

    def squared_distances(self, slot: int) -> np.ndarray:
        return np.sum((self.points - self.points[slot][None]) ** 2, axis=1)

    @property
    def variance(self) -> float:
        """The smoothing variance ``v`` (computed once per learner state)."""
        if self._variance is None:
            self._variance = self._choose()
        return self._variance

    def _choose(self) -> float:
        import math

        from inference.gp_ella import choose_smoothing_variance, median_squared_distance

        c = self.config
        if c.smoothing_scale == "fixed":
            return float(c.smoothing_variance)
        half_median = 0.5 * median_squared_distance(self.points)
        if c.smoothing_scale == "median":
            r = float(c.smoothing_ratio)
            return math.inf if math.isinf(r) else r * half_median
        if half_median <= 0.0:
            return 0.0
        grid = np.asarray([0.0] + [r * half_median for r in c.smoothing_grid] + [np.inf])
        d2s, selves, means, targets = [], [], [], []
        for slot in range(len(self.store)):
            split = heldout_split_of(self.store, slot, c)
            if split is None:
                continue
            fit_idx, val_idx = split
            X, y = self.store.X[slot], self.store.y[slot]
            m, _ = _kernel_predictions(self.kernels, self.signal_variance(slot),
                                       float(self.noise_variances[slot]), X[fit_idx],
                                       y[fit_idx], X[val_idx], c.pad_multiple)
            d2s.append(self.squared_distances(slot))
            selves.append(slot)
            means.append(m)
            targets.append(y[val_idx])
        if not d2s:
            return 0.0
        self.grid = grid
        best, self.heldout_sse = choose_smoothing_variance(d2s, selves, means, targets, grid)
        return best

    def weights(self, slot: int) -> np.ndarray:
        from inference.gp_ella import smoothing_weights

        return smoothing_weights(self.squared_distances(slot), slot, self.variance)

    def predict(self, slot: int, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mixture mean and variance of task ``slot`` at ``xs`` (centred targets)."""
        w = self.weights(slot)
        used = np.flatnonzero(w > 0)
        means, variances = _kernel_predictions(
            self.kernels[used], self.signal_variance(slot), float(self.noise_variances[slot]),
            self.store.X[slot], self.store.y[slot], xs, self.config.pad_multiple)
        wu = w[used]
        mean = wu @ means
        var = wu @ (variances + means ** 2) - mean ** 2
        return mean, np.maximum(var, 1e-300)


def _kernel_predictions(kernels, sf2, s2, X, y, xs, pad_multiple):
    from inference.gp_ella import kernel_predictions

    return kernel_predictions(kernels, sf2, s2, X, y, xs, pad_multiple=pad_multiple)


def heldout_split_of(store: "TaskStore", slot: int, config: Any):
    """The (fit, held-out) split of a task's training data used by the line search and the
    held-out smoothing scale (the same split for both; seeded by ``config.seed`` and the
    slot), or ``None`` for a task too small to split."""
    from inference.gp_ella import heldout_split

    return heldout_split(store.X[slot].shape[0], config.holdout_fraction,
                         seed=config.seed * 1_000_003 + slot)


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
        self._signal_variances: dict[int, float] = {}
        self._smoother: Smoother | None = None

    # -- helpers -------------------------------------------------------------------------
    def _key(self, purpose: int):
        import jax

        return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(self.config.seed),
                                                     purpose), self._num_updates)

    def _fit_options(self) -> dict[str, Any]:
        return fit_options(self.config, with_hessian=True)

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

    def reconstructions(self) -> np.ndarray:
        """``L s_t`` as rows ``(T, d)``: ``log theta_t`` or ``theta_t`` (``parametrization``)."""
        self._require_fitted("reconstructions")
        return self._state.codes @ self._state.L.T

    def reconstructed_thetas(self) -> np.ndarray:
        """The kernels used to predict, ``(T, d)``: ``exp(L s_t)`` (``log_theta``, clipped to the
        fit's box ``[theta_lower, theta_upper]``) or ``max(L s_t, 0)`` (``theta``)."""
        from models.gp_ella import theta_from_code

        c = self.config
        z = self.reconstructions()
        if c.parametrization == "log_theta":
            return theta_from_code(z, "log_theta", c.theta_lower, c.theta_upper)
        return theta_from_code(z, "theta")

    def fitted_thetas(self) -> np.ndarray:
        """Single-task optima ``theta_hat_t`` ``(T, d)``."""
        self._require_fitted("fitted_thetas")
        return np.stack([f["theta"] for f in self._fits])

    def diagnostics(self) -> dict[str, Any]:
        """Whether eq. 5 was expanded at minima and how the reconstructions were used, over the
        tasks with a GP fit (constant-target tasks have none):

        * ``fit_converged_fraction``: fits that ended by SciPy's convergence test (not at the
          iteration cap);
        * ``hessian_negative_fraction``: Hessians (in the coded parametrization) with negative
          curvature beyond round-off (:func:`inference.gp_ella.has_negative_curvature`);
        * ``theta_clipped_fraction``: entries of ``L s_t`` outside the kernel's domain, clipped
          before predicting (``theta``: below 0; ``log_theta``: outside the fit's box);
        * ``fitted_theta_at_bound_fraction``: fitted ``theta_a`` at the fit's box.
        """
        self._require_fitted("diagnostics")
        c = self.config
        fitted = [i for i, f in enumerate(self._fits) if not f["constant_targets"]]
        z = self.reconstructions()[fitted]
        if c.parametrization == "theta":
            clipped = z < 0.0
        else:
            clipped = (z < np.log(c.theta_lower)) | (z > np.log(c.theta_upper))
        th = self.fitted_thetas()[fitted]
        at_bound = (th <= c.theta_lower * (1 + 1e-6)) | (th >= c.theta_upper * (1 - 1e-6))

        def frac(v):
            v = np.asarray(v, bool)
            return float(v.mean()) if v.size else float("nan")

        return {"num_fitted_tasks": len(fitted),
                "fit_converged_fraction": frac([self._fits[i]["converged"] for i in fitted]),
                "hessian_negative_fraction": frac([self._fits[i]["negative_curvature"]
                                                   for i in fitted]),
                "theta_clipped_fraction": frac(clipped),
                "fitted_theta_at_bound_fraction": frac(at_bound),
                "fit_iterations_median": float(np.median([self._fits[i]["iterations"]
                                                          for i in fitted])) if fitted else
                float("nan")}

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

        from inference.gp_ella import expansion, fit_single_task, has_negative_curvature

        batch = self._check_batch(batch)
        task_id, x, y = self._store.validate(batch)
        slot, new, X_all, yc, mean = self._store.merged(task_id, x, y)
        t0 = time.perf_counter()
        fit = single_task_fit if single_task_fit is not None else \
            fit_single_task(X_all, yc, **self._fit_options())
        point, H = expansion(fit, self.config.parametrization)
        t1 = time.perf_counter()
        state = self._state if self._state is not None else \
            self.engine.init(jax.random.PRNGKey(self.config.seed), X_all.shape[1])
        state, info = self.engine.step(self._key(1), state, (point, H, slot))
        t2 = time.perf_counter()
        # commit only after everything above succeeded
        self._store.commit(task_id, slot, X_all, yc, mean)
        record_fit = {"signal_variance": fit.signal_variance, "noise_variance": fit.noise_variance,
                      "nll": fit.nll, "iterations": fit.iterations, "converged": fit.converged,
                      "constant_targets": fit.constant_targets,
                      "negative_curvature": (not fit.constant_targets)
                      and has_negative_curvature(H)}
        if new:
            self._fits.append({**record_fit, "theta": np.asarray(fit.theta, np.float64)})
        else:
            self._fits[slot] = {**record_fit, "theta": np.asarray(fit.theta, np.float64)}
        self._state = state
        self._num_updates += 1
        self._signal_variances.clear()
        self._smoother = None
        return {"task_id": task_id, "new_task": new, "num_data": int(X_all.shape[0]),
                **record_fit, "ella_loss": info.loss, "inner_iterations": info.inner_iterations,
                "basis_change": info.basis_change, "lasso_converged": info.lasso_converged,
                "reinitialized_columns": info.reinitialized,
                "line_search_possible": heldout_split_of(self._store, slot,
                                                         self.config) is not None,
                "seconds_fit": t1 - t0, "seconds_ella": t2 - t1}

    def signal_variance(self, slot: int) -> float:
        """``sigma_f^2`` of task ``slot`` for prediction: Sect. 4.4's line search for the kernel
        ``theta_t = L s_t`` on the task's held-out training data (the fitted value when the
        search is off or the task too small). Cached until the next update."""
        if slot not in self._signal_variances:
            self._signal_variances[slot] = self._line_search(slot)
        return self._signal_variances[slot]

    def _line_search(self, slot: int) -> float:
        from inference.gp_ella import line_search_signal_variance

        c = self.config
        fit = self._fits[slot]
        base = float(fit["signal_variance"])
        if not c.line_search:
            return base
        split = heldout_split_of(self._store, slot, c)
        if split is None:
            return base
        fit_idx, val_idx = split
        X, y = self._store.X[slot], self._store.y[slot]
        lo, hi = c.line_search_log10_range
        ratios = 10.0 ** np.linspace(lo, hi, c.line_search_points)
        if not np.any(np.isclose(ratios, 1.0)):
            ratios = np.sort(np.append(ratios, 1.0))
        theta = self.reconstructed_thetas()[slot]
        best, _ = line_search_signal_variance(theta, float(fit["noise_variance"]), base,
                                              X[fit_idx], y[fit_idx], X[val_idx], y[val_idx],
                                              ratios, c.pad_multiple)
        return best

    def smoother(self) -> Smoother:
        """Sect. 4.4's smoothing for the current state (:class:`Smoother`): distances between
        the reconstructions ``L s_t``, kernels ``theta_t``, the line-searched ``sigma_f^2``."""
        self._require_fitted("smoother")
        if self._smoother is None:
            self._smoother = Smoother(self.config, self._store, self.reconstructions(),
                                      self.reconstructed_thetas(), self.signal_variance,
                                      np.asarray([f["noise_variance"] for f in self._fits]))
        return self._smoother

    def predict(self, x: Any, task_id: int | None = None, *,
                smoothing: bool | None = None) -> GaussianPredictive:
        """Predictive of task ``task_id`` at ``x (n, d)`` (Sect. 4.4; module docstring).
        ``smoothing`` overrides ``config.smoothing`` (an ablation without retraining)."""
        from inference.gp_ella import kernel_predictions

        slot, xs = self._store.check_predict(x, task_id, "GPELLA")
        if xs.shape[0] == 0:
            return GaussianPredictive(np.zeros(0), np.zeros(0))
        c = self.config
        smooth = c.smoothing if smoothing is None else bool(smoothing)
        if smooth:
            mean, var = self.smoother().predict(slot, xs)
        else:
            m, v = kernel_predictions(self.reconstructed_thetas()[slot][None],
                                      self.signal_variance(slot),
                                      float(self._fits[slot]["noise_variance"]),
                                      self._store.X[slot], self._store.y[slot], xs,
                                      pad_multiple=c.pad_multiple)
            mean, var = m[0], v[0]
        return GaussianPredictive(mean + self._store.y_mean[slot], var)

    _FIT_KEYS = ("signal_variance", "noise_variance", "nll", "iterations", "converged",
                 "constant_targets", "negative_curvature", "theta")

    def state_dict(self) -> dict[str, Any]:
        if self._state is None:
            return {"tasks": None}
        s = self._state
        return {"tasks": self._store.state(), "num_updates": self._num_updates,
                "ella": ella_state_tree(s),
                "fits": {k: np.asarray([f[k] for f in self._fits]) for k in self._FIT_KEYS}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._signal_variances.clear()
        self._smoother = None
        if state.get("tasks") is None:
            self._store, self._state, self._fits, self._num_updates = TaskStore(), None, [], 0
            return
        e = state["ella"]
        k = int(np.asarray(e["L"]).shape[1])
        if k != self.config.num_components:
            raise ValueError(f"num_components: the state has k = {k}, the config "
                             f"{self.config.num_components}")
        new_state = ella_state_from_tree(e)
        f = state["fits"]
        kinds = {"signal_variance": float, "noise_variance": float, "nll": float,
                 "iterations": int, "converged": bool, "constant_targets": bool,
                 "negative_curvature": bool}
        fits = [{**{key: kind(f[key][i]) for key, kind in kinds.items()},
                 "theta": np.asarray(f["theta"][i], np.float64)}
                for i in range(len(state["tasks"]["ids"]))]
        self._store = TaskStore.from_state(state["tasks"])
        self._state, self._fits = new_state, fits
        self._num_updates = int(state["num_updates"])

    def to_inference_data(self, *, num_draws: int = 500, num_chains: int | None = None,
                          seed: int = 0):
        """ArviZ InferenceData of the Laplace posterior of the basis and the task kernels.

        Given the codes, eq. 9 is quadratic in ``L``: the program's Laplace-likelihood
        posterior of ``vec(L)`` (column-major) is ``N(P^-1 b, P^-1)`` with precision
        ``P = A + T lambda I`` (the Hessian of the negative log joint in ``vec L``: ``T lambda``
        from the Frobenius prior, ``sum_t kron(s_t s_t^T, H_t)`` from the expansions), exact for
        that likelihood; its mean is the basis the running sums give (``L`` itself unless a
        column was re-drawn). Independent draws ``L^(i)`` go to ``posterior["L"] (chain, draw, d, k)``
        (``num_chains`` chains, default up to 4 of at least 4 draws) and the kernels
        ``theta_t^(i)`` of ``L^(i) s_t`` (``exp`` for ``log_theta``) to
        ``posterior["theta"] (chain, draw, T, d)``; the fitted ``theta_hat``, the expansion points
        and Hessians (coded parametrization), codes ``s`` and per-task variances go to
        ``constant_data``.
        """
        import jax.numpy as jnp
        from scipy.linalg import cho_solve, solve_triangular

        from models.gp_ella import theta_from_code
        from models.linalg_jax import jitter_cholesky
        from ppl_cl.inference_data import iid_attrs, samples_to_inference_data, split_chains
        from ppl_cl.seeding import as_generator

        self._require_fitted("to_inference_data")
        s = self._state
        c = self.config
        d, k = s.L.shape
        P = s.A + s.num_tasks * c.lam * np.eye(d * k)
        Lp = np.asarray(jitter_cholesky(jnp.asarray(0.5 * (P + P.T)), name="posterior precision"))
        mean = cho_solve((Lp, True), s.b)
        eps = as_generator(seed).standard_normal((num_draws, d * k))
        vec = mean[None] + solve_triangular(Lp.T, eps.T, lower=False).T
        L_draws = vec.reshape(num_draws, k, d).transpose(0, 2, 1)  # unvec column-major
        z_draws = np.einsum("sdk,tk->std", L_draws, s.codes)
        if c.parametrization == "log_theta":
            theta_draws = theta_from_code(z_draws, "log_theta", c.theta_lower, c.theta_upper)
        else:
            theta_draws = theta_from_code(z_draws, "theta")
        ids = np.asarray(self._store.ids)
        return samples_to_inference_data(
            split_chains({"L": L_draws[None], "theta": theta_draws[None]}, num_chains),
            dims={"L": ["input_dim", "component"], "theta": ["task", "input_dim"],
                  "theta_hat": ["task", "input_dim"], "expansion_point": ["task", "input_dim"],
                  "codes": ["task", "component"],
                  "hessian": ["task", "input_dim", "input_dim_"],
                  "signal_variance": ["task"], "noise_variance": ["task"]},
            coords={"task": ids, "input_dim": np.arange(d), "component": np.arange(k),
                    "input_dim_": np.arange(d)},
            constant_data={"theta_hat": self.fitted_thetas(), "expansion_point": s.thetas,
                           "codes": s.codes, "hessian": s.hessians,
                           "signal_variance": np.asarray([f["signal_variance"] for f in self._fits]),
                           "noise_variance": np.asarray([f["noise_variance"] for f in self._fits])},
            attrs=iid_attrs("Gaussian (Laplace) posterior of the basis L given the codes "
                            "(eq. 9)"))
