"""The four baselines of GP-ELLA (Clingerman & Eaton 2017, Sect. 5) on the learner protocol.

* :class:`IndividualGPs` — one exact GP per task ("Indiv. GPs"): the very fit GP-ELLA runs per
  task (:func:`inference.gp_ella.fit_single_task`, ARD SE + sigma_f^2 + noise, L-BFGS to
  convergence), predicting with its own hyperparameters (the predictive of
  :mod:`models.exact_gp`; a test checks equality with :class:`~ppl_cl.learners.exact_gp.ExactGP`);
  ``predict(..., smoothing=True)`` (or ``config.smoothing``) applies GP-ELLA's Sect. 4.4
  smoothing over all known tasks' fitted kernels instead (the ablation: smoothing without a
  basis).
* :class:`SharedGP` — one GP over the pooled data of all tasks ("Shared GP").
* :class:`MultiTaskGP` — batch ICM multi-task GP (Bonilla et al. 2008), ``B = W W^T +
  diag(kappa)`` of rank 1 or 2 (:mod:`models.multitask_gp`).
* :class:`LinearELLA` — ELLA with linear base learners (Ruvolo & Eaton 2013).

The batch learners (shared GP, MTGP) store what ``update`` gives them and fit all
hyperparameters on the first ``predict`` after new data, over everything seen (the paper
gives them all tasks at once). Targets are centred per task by every learner.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_cl.batch import Batch
from ppl_cl.configs.gp_ella import (IndividualGPConfig, LinearELLAConfig, MultiTaskGPConfig,
                                    SharedGPConfig)
from ppl_cl.learners.gp_ella import (ConfigLearner, NotFittedError, Smoother, TaskStore,
                                     ella_engine, ella_state_from_tree, ella_state_tree,
                                     fit_options)
from ppl_cl.predictive import GaussianPredictive

__all__ = ["IndividualGPs", "SharedGP", "MultiTaskGP", "LinearELLA"]


def _gp_fit_options(c) -> dict[str, Any]:
    return fit_options(c, with_hessian=False)


def _hyp_state(hyps: list) -> dict[str, Any]:
    if not hyps:
        return {"theta": np.zeros((0, 0)), "signal_variance": np.zeros(0),
                "noise_variance": np.zeros(0)}
    return {"theta": np.stack([h[0] for h in hyps]),
            "signal_variance": np.asarray([h[1] for h in hyps]),
            "noise_variance": np.asarray([h[2] for h in hyps])}


def _point_estimate(values: dict[str, Any], note: str):
    """InferenceData of point estimates: one chain, one draw in ``posterior`` (so that the
    protocol's ``posterior`` group exists, as for the online-SGD baseline) and the same
    arrays in ``constant_data``."""
    from ppl_cl.inference_data import POINT_ESTIMATE, from_nested_dict

    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}
    return from_nested_dict({"posterior": {k: v[None, None] for k, v in arrays.items()},
                             "constant_data": arrays}, attrs={**POINT_ESTIMATE, "note": note})


def _gp_predict(theta, sf2, s2, X, y, xs, pad_multiple):
    import jax.numpy as jnp

    from inference.gp_ella import pad_rows
    from models.gp_ella import TaskHyperparameters, predict_task

    Xp, yp, mp = pad_rows(X, y, pad_multiple)
    Xs = pad_rows(xs, None, 4 * pad_multiple)[0]
    mean, var = predict_task(TaskHyperparameters(jnp.asarray(theta), sf2, s2), jnp.asarray(Xp),
                             jnp.asarray(yp), jnp.asarray(mp), jnp.asarray(Xs))
    m = xs.shape[0]
    return np.asarray(mean)[:m], np.asarray(var)[:m]


class IndividualGPs(ConfigLearner):
    """One exact GP per task, fitted by type-II ML on that task's data only."""

    learner_name = "gp-ella-individual-gps"
    config_cls = IndividualGPConfig

    def __init__(self, config: IndividualGPConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self._store = TaskStore()
        self._hyp: list[tuple[np.ndarray, float, float]] = []
        self._converged: list[bool] = []
        self._constant: list[bool] = []
        self._smoother: Smoother | None = None

    def hyperparameters(self, task_id: int) -> dict[str, Any]:
        slot = self._store.slot(task_id)
        if slot is None:
            raise ValueError(f"task_id: unknown task {task_id!r}")
        th, sf2, s2 = self._hyp[slot]
        return {"theta": th.copy(), "signal_variance": sf2, "noise_variance": s2}

    def update(self, batch: Batch) -> dict[str, Any]:
        from inference.gp_ella import fit_single_task

        batch = self._check_batch(batch)
        task_id, x, y = self._store.validate(batch)
        slot, new, X_all, yc, mean = self._store.merged(task_id, x, y)
        fit = fit_single_task(X_all, yc, **_gp_fit_options(self.config))
        self._store.commit(task_id, slot, X_all, yc, mean)
        hyp = (fit.theta, fit.signal_variance, fit.noise_variance)
        if new:
            self._hyp.append(hyp)
            self._converged.append(fit.converged)
            self._constant.append(fit.constant_targets)
        else:
            self._hyp[slot] = hyp
            self._converged[slot] = fit.converged
            self._constant[slot] = fit.constant_targets
        self._smoother = None
        return {"task_id": task_id, "new_task": new, "num_data": int(X_all.shape[0]),
                "nll": fit.nll, "iterations": fit.iterations, "converged": fit.converged}

    def converged_fraction(self) -> float:
        """Fraction of the (non-constant) tasks' fits that ended by SciPy's convergence test."""
        v = [c for c, k in zip(self._converged, self._constant) if not k]
        return float(np.mean(v)) if v else float("nan")

    def smoother(self) -> Smoother:
        """GP-ELLA's Sect. 4.4 smoothing over the fitted kernels (:class:`Smoother`), the
        distances taken between the fitted ``log theta`` or ``theta``
        (``config.smoothing_parametrization``), each task with its own fitted ``sigma_f^2``."""
        from inference.gp_ella import SingleTaskFit, expansion

        if not len(self._store):
            raise NotFittedError("IndividualGPs.smoother before any update()")
        if self._smoother is None:
            d = self._hyp[0][0].shape[0]
            points = np.stack([expansion(SingleTaskFit(th, sf2, s2, np.zeros((d, d)), 0.0, 0,
                                                       True, const, np.zeros(d)),
                                         self.config.smoothing_parametrization)[0]
                               for (th, sf2, s2), const in zip(self._hyp, self._constant)])
            kernels = np.stack([h[0] for h in self._hyp])
            self._smoother = Smoother(self.config, self._store, points, kernels,
                                      lambda slot: float(self._hyp[slot][1]),
                                      np.asarray([h[2] for h in self._hyp]))
        return self._smoother

    def predict(self, x: Any, task_id: int | None = None, *,
                smoothing: bool | None = None) -> GaussianPredictive:
        """Predictive of task ``task_id`` at ``x`` with the task's own GP, or with the
        smoothing over all tasks' kernels (``smoothing``, default ``config.smoothing``)."""
        slot, xs = self._store.check_predict(x, task_id, "IndividualGPs")
        if xs.shape[0] == 0:
            return GaussianPredictive(np.zeros(0), np.zeros(0))
        if self.config.smoothing if smoothing is None else smoothing:
            mean, var = self.smoother().predict(slot, xs)
            return GaussianPredictive(mean + self._store.y_mean[slot], var)
        th, sf2, s2 = self._hyp[slot]
        mean, var = _gp_predict(th, sf2, s2, self._store.X[slot], self._store.y[slot], xs,
                                self.config.pad_multiple)
        return GaussianPredictive(mean + self._store.y_mean[slot], var)

    def state_dict(self) -> dict[str, Any]:
        return {"tasks": self._store.state(), "hyperparameters": _hyp_state(self._hyp),
                "converged": np.asarray(self._converged, bool),
                "constant_targets": np.asarray(self._constant, bool)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._store = TaskStore.from_state(state["tasks"])
        h = state["hyperparameters"]
        self._hyp = [(np.asarray(h["theta"][i], np.float64), float(h["signal_variance"][i]),
                      float(h["noise_variance"][i])) for i in range(len(self._store))]
        self._converged = [bool(v) for v in np.asarray(state["converged"]).reshape(-1)]
        self._constant = [bool(v) for v in np.asarray(state["constant_targets"]).reshape(-1)]
        self._smoother = None

    def to_inference_data(self, *args: Any, **kwargs: Any):
        """Per-task hyperparameter point estimates (type-II ML): one draw in ``posterior``,
        and ``constant_data``."""
        if not len(self._store):
            raise NotFittedError("IndividualGPs.to_inference_data before any update()")
        return _point_estimate(_hyp_state(self._hyp), "type-II ML point estimates, one draw")


class _PooledGP(ConfigLearner):
    """Shared machinery of the batch learners: pooled (subsampled) training rows."""

    def __init__(self, config: Any = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self._store = TaskStore()
        self._fitted: dict[str, Any] | None = None

    def update(self, batch: Batch) -> dict[str, Any]:
        batch = self._check_batch(batch)
        task_id, x, y = self._store.validate(batch)
        slot, new, X_all, yc, mean = self._store.merged(task_id, x, y)
        self._store.commit(task_id, slot, X_all, yc, mean)
        self._fitted = None
        return {"task_id": task_id, "new_task": new, "num_data": int(X_all.shape[0]),
                "deferred_fit": True}

    def _pooled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        X = np.concatenate(self._store.X)
        y = np.concatenate(self._store.y)
        slots = np.concatenate([np.full(len(v), i) for i, v in enumerate(self._store.y)])
        if X.shape[0] > self.config.max_train:
            idx = np.sort(np.random.default_rng(self.config.seed).choice(
                X.shape[0], self.config.max_train, replace=False))
            X, y, slots = X[idx], y[idx], slots[idx]
        return X, y, slots

    def fit(self) -> dict[str, Any]:
        """Fit the hyperparameters on the pooled data (done by ``predict`` when needed)."""
        if not len(self._store):
            raise NotFittedError(f"{type(self).__name__}.fit before any update()")
        if self._fitted is None:
            self._fitted = self._fit()
        return {k: v for k, v in self._fitted.items() if k != "data" and np.ndim(v) == 0}

    def state_dict(self) -> dict[str, Any]:
        return {"tasks": self._store.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._store = TaskStore.from_state(state["tasks"])
        self._fitted = None  # refit deterministically on the next predict

    def to_inference_data(self, *args: Any, **kwargs: Any):
        """Fitted hyperparameters (point estimates): one draw in ``posterior``, and
        ``constant_data``."""
        self.fit()
        return _point_estimate({k: v for k, v in self._fitted.items() if k != "data"},
                               "type-II ML point estimates, one draw")


class SharedGP(_PooledGP):
    """One GP over all tasks' pooled data (task ids ignored)."""

    learner_name = "gp-ella-shared-gp"
    config_cls = SharedGPConfig

    def _fit(self) -> dict[str, Any]:
        from inference.gp_ella import fit_single_task

        X, y, _ = self._pooled()
        fit = fit_single_task(X, y, **_gp_fit_options(self.config))
        return {"theta": fit.theta, "signal_variance": fit.signal_variance,
                "noise_variance": fit.noise_variance, "nll": fit.nll,
                "iterations": fit.iterations, "data": (X, y)}

    def predict(self, x: Any, task_id: int | None = None) -> GaussianPredictive:
        slot, xs = self._store.check_predict(x, task_id, "SharedGP")
        if xs.shape[0] == 0:
            return GaussianPredictive(np.zeros(0), np.zeros(0))
        self.fit()
        f = self._fitted
        X, y = f["data"]
        mean, var = _gp_predict(f["theta"], f["signal_variance"], f["noise_variance"], X, y, xs,
                                self.config.pad_multiple)
        return GaussianPredictive(mean + self._store.y_mean[slot], var)


def _icm_objective(params, X, y, onehot, mask):
    from models.multitask_gp import icm_negative_log_marginal_likelihood

    return icm_negative_log_marginal_likelihood(params, X, y, onehot, mask)


class MultiTaskGP(_PooledGP):
    """Batch ICM multi-task GP (Bonilla et al. 2008) with ``B = W W^T + diag(kappa)``,
    ``W`` of rank ``config.rank``; lengthscales shared, noise per task."""

    learner_name = "gp-ella-mtgp"
    config_cls = MultiTaskGPConfig

    def _fit(self) -> dict[str, Any]:
        import jax.numpy as jnp

        from inference.gp_ella import pad_rows
        from inference.type2ml import fit_type2ml
        from models.multitask_gp import ICMParams

        c = self.config
        X, y, slots = self._pooled()
        T, d = len(self._store), X.shape[1]
        Xp, yp, mask = pad_rows(X, y, 64)
        onehot = np.zeros((Xp.shape[0], T))
        onehot[np.arange(len(slots)), slots] = 1.0
        var_y = float(np.var(y)) if np.var(y) > 0 else 1.0
        # W starts at equal correlations plus a seeded perturbation: equal columns would
        # get equal gradients and a rank-2 W would stay a rank-1 one
        W0 = np.sqrt(0.5 * var_y / c.rank) * (
            1.0 + 0.3 * np.random.default_rng(c.seed).standard_normal((T, c.rank)))
        init = ICMParams(jnp.full((d,), 1.0 / d), jnp.asarray(W0),
                         jnp.full((T,), 0.5 * var_y),
                         jnp.full((T,), max(c.init_noise_ratio * var_y, 10 * c.min_noise_variance)))
        lo = ICMParams(c.theta_lower, 0.0, 1e-10 * var_y, c.min_noise_variance)
        hi = ICMParams(c.theta_upper, 0.0, 0.0, 0.0)
        res = fit_type2ml(_icm_objective, init, data=tuple(jnp.asarray(a) for a in
                                                           (Xp, yp, onehot, mask)),
                          lower_bounds=lo, upper_bounds=hi,
                          unconstrained=ICMParams(False, True, False, False),
                          max_iterations=c.max_iterations, tolerance=c.fit_tolerance)
        p = res.params
        return {"theta": np.asarray(p.theta), "W": np.asarray(p.W), "kappa": np.asarray(p.kappa),
                "noise_variance": np.asarray(p.noise_variance), "nll": res.value,
                "iterations": res.num_iterations, "data": (Xp, yp, onehot, mask)}

    def params(self):
        """The fitted :class:`models.multitask_gp.ICMParams`."""
        import jax.numpy as jnp

        from models.multitask_gp import ICMParams

        self.fit()
        f = self._fitted
        return ICMParams(*(jnp.asarray(f[k]) for k in ("theta", "W", "kappa", "noise_variance")))

    def predict(self, x: Any, task_id: int | None = None) -> GaussianPredictive:
        import jax.numpy as jnp

        from inference.gp_ella import pad_rows
        from models.multitask_gp import icm_predict

        slot, xs = self._store.check_predict(x, task_id, "MultiTaskGP")
        if xs.shape[0] == 0:
            return GaussianPredictive(np.zeros(0), np.zeros(0))
        params = self.params()
        Xp, yp, onehot, mask = (jnp.asarray(a) for a in self._fitted["data"])
        Xs = pad_rows(xs, None, 16)[0]
        mean, var = icm_predict(params, Xp, yp, onehot, mask, jnp.asarray(Xs), slot)
        m = xs.shape[0]
        return GaussianPredictive(np.asarray(mean)[:m] + self._store.y_mean[slot],
                                  np.asarray(var)[:m])


class LinearELLA(ConfigLearner):
    """ELLA with linear-regression base learners (Ruvolo & Eaton 2013): ``theta_t`` by ridge
    regression, ``H_t = X^T X / (2 n) + ridge/2 I``, then the same engine as GP-ELLA;
    predicts ``x^T L s_t`` plus the task mean, with the task's training residual variance as
    the predictive variance (ELLA itself gives none)."""

    learner_name = "gp-ella-linear-ella"
    config_cls = LinearELLAConfig

    def __init__(self, config: LinearELLAConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        c = self.config
        self.engine = ella_engine(c)
        self._store = TaskStore()
        self._state = None
        self._num_updates = 0

    def update(self, batch: Batch) -> dict[str, Any]:
        import jax

        from inference.gp_ella import fit_linear_task

        batch = self._check_batch(batch)
        task_id, x, y = self._store.validate(batch)
        slot, new, X_all, yc, mean = self._store.merged(task_id, x, y)
        theta, H = fit_linear_task(X_all, yc, self.config.ridge)
        state = self._state if self._state is not None else \
            self.engine.init(jax.random.PRNGKey(self.config.seed), X_all.shape[1])
        key = jax.random.fold_in(jax.random.PRNGKey(self.config.seed), self._num_updates)
        state, info = self.engine.step(key, state, (theta, H, slot))
        self._store.commit(task_id, slot, X_all, yc, mean)
        self._state = state
        self._num_updates += 1
        return {"task_id": task_id, "new_task": new, "num_data": int(X_all.shape[0]),
                "ella_loss": info.loss, "inner_iterations": info.inner_iterations,
                "basis_change": info.basis_change}

    def predict(self, x: Any, task_id: int | None = None) -> GaussianPredictive:
        slot, xs = self._store.check_predict(x, task_id, "LinearELLA")
        if xs.shape[0] == 0:
            return GaussianPredictive(np.zeros(0), np.zeros(0))
        w = self._state.L @ self._state.codes[slot]
        X, y = self._store.X[slot], self._store.y[slot]
        resid = float(np.mean((y - X @ w) ** 2)) if len(y) else 1.0
        mean = xs @ w + self._store.y_mean[slot]
        return GaussianPredictive(mean, np.full(xs.shape[0], max(resid, 1e-12)))

    def state_dict(self) -> dict[str, Any]:
        if self._state is None:
            return {"tasks": None}
        s = self._state
        return {"tasks": self._store.state(), "num_updates": self._num_updates,
                "ella": ella_state_tree(s)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("tasks") is None:
            self._store, self._state, self._num_updates = TaskStore(), None, 0
            return
        self._store = TaskStore.from_state(state["tasks"])
        self._state = ella_state_from_tree(state["ella"])
        self._num_updates = int(state["num_updates"])

    def to_inference_data(self, *args: Any, **kwargs: Any):
        """The basis and codes (point estimates): one draw in ``posterior``, and
        ``constant_data``."""
        if self._state is None:
            raise NotFittedError("LinearELLA.to_inference_data before any update()")
        return _point_estimate({"L": self._state.L, "codes": self._state.codes},
                               "ELLA point estimates, one draw")
