"""GP-ELLA experiments (Clingerman & Eaton 2017, Sect. 5): Fig. 2 (rMSE) and Table 1 (time)
for GP-ELLA and its four baselines on the paper's data sets.

* ``gpella-synthetic`` — 100 linear factorized tasks, d = 13, 6 latent bases (Sect. 5.1);
* ``gpella-robot-arm`` — 113 simulated 8-DOF arms (distance of the end effector to a point);
* ``gpella-schools`` — London schools, 139 tasks, d = 27;
* ``gpella-parkinsons`` — Parkinson's telemonitoring, 42 patients, 16 voice features;
  ``--set target=total`` for total UPDRS (default motor UPDRS).

Protocol (Sect. 5.2), per run: every task split at random 50/50 into train / test; features
standardized with the pooled training statistics, then features and targets centred with
each task's training means; tasks presented in a random order to the lifelong learners (and
all at once to the batch ones); k, mu, lambda of GP-ELLA and of ELLA tuned on the first five
tasks (their training data split 50/50 into sub-train / validation, grid k in 2, 4, ..., 2d
and mu, lambda in exp{-12, -8, -4, 0}, best validation MSE), then all tasks learned with the
tuned values; rMSE over all test points of all tasks after the last task. Times are the
seconds of learning all tasks plus predicting all test sets (tuning excluded, as in Table 1).

Besides the paper's five methods every run reports two ablations that separate what the basis
buys from what Sect. 4.4's smoothing buys (they reuse the learned models, only the prediction
differs): GP-ELLA without smoothing (``gp_ella_no_smoothing``) and individual GPs with GP-ELLA's
smoothing over their fitted kernels (``individual_smoothed``), with the effective number of
tasks the smoothing averages (``n_eff_*``, ``1 / sum w^2`` per task, mean over tasks); the runs
GP-ELLA wins against each baseline; and whether eq. 5 was expanded at minima
(``fit_converged_fraction``, ``hessian_negative_fraction``, ``theta_clipped_fraction``).

Where we differ from the paper (each is a field): features are standardized (theta is an
inverse squared lengthscale, in units of 1 / feature^2; Parkinson's feature scales span five orders
of magnitude); every type-II ML fit runs to convergence (``learner.max_iterations``,
``learner.fit_tolerance``; the paper stops at 50 iterations); the basis codes ``log theta``
(``learner.parametrization``); the smoothing's variance is chosen on held-out training data
(``learner.smoothing_scale``; the paper's 100 is ``smoothing_scale=fixed``); the batch baselines
fit and condition on at most ``batch_max_train`` pooled points; ``k_max`` can cap the k grid.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ppl_cl.configs.gp_ella import GPELLAConfig
from ppl_cl.data.standardize import split_and_center
from ppl_cl.experiments.base import Claim, PaperNumber, RunContext, register

METHODS = ("gp_ella", "individual", "shared", "mtgp", "mtgp_rank2", "ella")
ABLATIONS = {"gp_ella": "gp_ella_no_smoothing", "individual": "individual_smoothed"}
"""The ablation row each method's run also predicts (same learned model, other prediction)."""
LABELS = {"gp_ella": "GP-ELLA", "gp_ella_no_smoothing": "GP-ELLA, no smoothing",
          "individual": "Indiv. GPs", "individual_smoothed": "Indiv. GPs + smoothing",
          "shared": "Shared GP", "mtgp": "MTGP (rank 1)", "mtgp_rank2": "MTGP (rank 2)",
          "ella": "ELLA"}
BASELINES = ("gp_ella_no_smoothing", "individual", "individual_smoothed", "shared", "mtgp",
             "mtgp_rank2", "ella")
"""Rows GP-ELLA's wins are counted against (``gp_ella_beats_<row>_runs``)."""
DIAGNOSTICS = ("fit_converged_fraction", "hessian_negative_fraction", "theta_clipped_fraction",
               "fitted_theta_at_bound_fraction", "fit_iterations_median")
"""GP-ELLA's per-run fit diagnostics (:meth:`ppl_cl.learners.gp_ella.GPELLA.diagnostics`)."""

_TABLE1 = "Clingerman & Eaton 2017, Table 1 (GP-ELLA / Indiv. GPs seconds)"


@dataclass
class GPELLAProtocolConfig:
    """Fields of the Sect. 5.2 protocol shared by the four experiments."""

    n_runs: int = 10
    """Runs (random splits and task orders); Sect. 5.2: 10."""
    n_tasks: int = 0
    """Use the first n tasks of the data set (0: all)."""
    tune: bool = True
    """Tune k, mu, lambda on the first five tasks (Sect. 5.2); False uses the learner fields."""
    tune_tasks: int = 5
    """Tasks used for tuning (Sect. 5.2: the first five)."""
    k_max: int = 0
    """Largest k of the tuning grid 2, 4, ..., (0: 2d as in Sect. 5.2)."""
    grid_exponents: tuple[float, ...] = (-12.0, -8.0, -4.0, 0.0)
    """mu and lambda are tuned over exp(e) for these e (Sect. 5.2)."""
    ablations: bool = True
    """Also predict the ablation rows (GP-ELLA without smoothing, individual GPs with it)."""
    methods: tuple[str, ...] = METHODS
    """Methods to run (subset of gp_ella, individual, shared, mtgp, mtgp_rank2, ella)."""
    batch_max_train: int = 1000
    """Pooled training points the shared GP and the MTGPs fit and condition on (ours)."""
    batch_max_iterations: int = 0
    """L-BFGS iteration cap of the shared GP's and the MTGPs' fits (0: ``learner.max_iterations``,
    i.e. to convergence as every GP fit here; Sect. 5.2's 50 makes the MTGPs about 10x cheaper
    and worse)."""
    warmup: bool = True
    """Compile the GP-ELLA and individual-GP functions on the first run's data before timing."""
    learner: GPELLAConfig = field(default_factory=GPELLAConfig)
    """GP-ELLA's config; its single-task GP fields are used by the GP baselines too."""


@dataclass
class SyntheticConfig(GPELLAProtocolConfig):
    """``gpella-synthetic``: :func:`ppl_cl.data.synthetic.ella_linear_tasks`."""

    tasks_total: int = 100
    """Tasks generated (Sect. 5.1: 100)."""
    n_per_task: int = 100
    """Instances per task (Sect. 5.1: 100)."""
    dim: int = 13
    """Features (Sect. 5.1: 13)."""
    n_latent: int = 6
    """Latent basis vectors (Sect. 5.1: 6)."""
    noise_std: float = 1.0
    """Label noise (not given by the paper; ours)."""


@dataclass
class RobotArmConfig(GPELLAProtocolConfig):
    """``gpella-robot-arm``: :func:`ppl_cl.data.synthetic.robot_arm_tasks`."""

    tasks_total: int = 113
    """Arms (Sect. 5.1: 113)."""
    min_configs: int = 50
    """Configurations per arm, at least (Sect. 5.1: >= 50)."""
    max_configs: int = 100
    """Configurations per arm, at most (ours)."""


@dataclass
class SchoolsConfig(GPELLAProtocolConfig):
    """``gpella-schools``: :func:`ppl_cl.data.loaders.load_schools` (139 schools, d = 27)."""


@dataclass
class ParkinsonsConfig(GPELLAProtocolConfig):
    """``gpella-parkinsons``: :func:`ppl_cl.data.loaders.load_parkinsons` (42 patients)."""

    target: str = "motor"
    """``motor`` (motor UPDRS) or ``total`` (total UPDRS); the paper runs both."""


# ---------------------------------------------------------------------------------------------
# protocol
# ---------------------------------------------------------------------------------------------
def _k_grid(d: int, k_max: int) -> list[int]:
    top = 2 * d if k_max <= 0 else min(k_max, 2 * d)
    return list(range(2, top + 1, 2))


def _pooled_rmse(preds: list[np.ndarray], ys: list[np.ndarray]) -> float:
    err = np.concatenate([p - y for p, y in zip(preds, ys)])
    return float(np.sqrt(np.mean(err ** 2)))


def smoothing_ratios(config) -> tuple[float, ...]:
    """The ratios ``r`` of the median rule the tuning tries: 0 (no smoothing), the config's
    ``smoothing_grid`` and inf (uniform weights)."""
    return (0.0,) + tuple(config.smoothing_grid) + (math.inf,)


def validation_mse_by_ratio(learner, sub: list, ratios: tuple[float, ...]) -> np.ndarray:
    """Validation MSE of ``learner`` (fitted on ``sub``'s sub-train sets) for each smoothing
    ratio of the median rule (:class:`ppl_cl.learners.gp_ella.Smoother`): every validation set
    is predicted under every task's kernel once, and the predictions are reweighted."""
    from inference.gp_ella import kernel_predictions, median_squared_distance, smoothing_weights

    sm = learner.smoother()
    half_median = 0.5 * median_squared_distance(sm.points)
    sse, n = np.zeros(len(ratios)), 0
    for t, (_, _, xv, yv) in enumerate(sub):
        slot = learner._store.slot(t)
        means, _ = kernel_predictions(sm.kernels, sm.signal_variance(slot),
                                      float(sm.noise_variances[slot]), learner._store.X[slot],
                                      learner._store.y[slot], xv,
                                      pad_multiple=learner.config.pad_multiple)
        means = means + learner._store.y_mean[slot]
        d2 = sm.squared_distances(slot)
        for i, r in enumerate(ratios):
            v = math.inf if math.isinf(r) else r * half_median
            sse[i] += float(np.sum((smoothing_weights(d2, slot, v) @ means - yv) ** 2))
        n += len(yv)
    return sse / max(n, 1)


def _grid_search(sub: list, ks: list[int], exps: tuple, learn,
                 ratios: tuple[float, ...] | None = None) -> dict[str, Any]:
    """The validation MSE of ``learn(k, mu, lam)`` (a learner fitted on ``sub``'s sub-train
    sets) over the grid k in ``ks``, log mu and log lambda in ``exps`` and, with ``ratios``,
    the smoothing ratio of the median rule (which changes the prediction only); the best
    setting."""
    best = (math.inf, None)
    for k in ks:
        for em in exps:
            for el in exps:
                learner = learn(k, math.exp(em), math.exp(el))
                if ratios:
                    mses = validation_mse_by_ratio(learner, sub, ratios)
                    i = int(np.argmin(mses))
                    mse, r = float(mses[i]), ratios[i]
                else:
                    mse = np.mean(np.concatenate([(learner.predict(xv, t).mean - yv) ** 2
                                                  for t, (_, _, xv, yv) in enumerate(sub)]))
                    r = None
                if mse < best[0]:
                    best = (float(mse), (k, em, el, r))
    k, em, el, r = best[1]
    out = {"num_components": k, "mu": math.exp(em), "lam": math.exp(el), "val_mse": best[0]}
    if r is not None:
        out["smoothing_ratio"] = float(r)
    return out


def _tunes_ratio(config) -> bool:
    return bool(getattr(config, "smoothing", True)) and config.smoothing_scale == "median"


def tune_gp_ella(sub: list, base: GPELLAConfig, ks: list[int], exps: tuple) -> dict[str, Any]:
    """Grid search of k, mu, lambda (and, for the median smoothing rule, its ratio) on
    ``sub`` = [(x_subtrain, y_subtrain, x_val, y_val)]; the single-task fits do not depend on
    them and are computed once."""
    from inference.gp_ella import fit_single_task
    from ppl_cl import Batch
    from ppl_cl.learners.gp_ella import GPELLA, fit_options

    opts = fit_options(base, with_hessian=True)
    fits = [fit_single_task(xt, yt - yt.mean(), **opts) for xt, yt, _, _ in sub]

    def learn(k, mu, lam):
        g = GPELLA(replace(base, num_components=k, mu=mu, lam=lam))
        for t, ((xt, yt, _, _), fit) in enumerate(zip(sub, fits)):
            g.update(Batch(xt, yt, task_id=t), single_task_fit=fit)
        return g

    return _grid_search(sub, ks, exps, learn,
                        smoothing_ratios(base) if _tunes_ratio(base) else None)


def tune_individual_smoothing(sub: list, config) -> dict[str, Any]:
    """The median rule's ratio for the individual-GP ablation, tuned like GP-ELLA's on the
    first five tasks' validation data."""
    from ppl_cl import Batch
    from ppl_cl.learners.gp_ella_baselines import IndividualGPs

    learner = IndividualGPs(config)
    for t, (xt, yt, _, _) in enumerate(sub):
        learner.update(Batch(xt, yt, task_id=t))
    ratios = smoothing_ratios(config)
    mses = validation_mse_by_ratio(learner, sub, ratios)
    i = int(np.argmin(mses))
    return {"smoothing_ratio": float(ratios[i]), "val_mse": float(mses[i])}


def tune_ella(sub: list, base, ks: list[int], exps: tuple) -> dict[str, Any]:
    from ppl_cl import Batch
    from ppl_cl.learners.gp_ella_baselines import LinearELLA

    def learn(k, mu, lam):
        e = LinearELLA(replace(base, num_components=k, mu=mu, lam=lam))
        for t, (xt, yt, _, _) in enumerate(sub):
            e.update(Batch(xt, yt, task_id=t))
        return e

    return _grid_search(sub, ks, exps, learn)


def _build(method: str, config: GPELLAProtocolConfig, tuned: dict, seed: int):
    from ppl_cl.configs.gp_ella import (LinearELLAConfig, MultiTaskGPConfig,
                                        SharedGPConfig)
    from ppl_cl.learners.gp_ella import GPELLA
    from ppl_cl.learners.gp_ella_baselines import IndividualGPs, LinearELLA, MultiTaskGP, SharedGP

    c = config.learner
    gp = dict(max_iterations=c.max_iterations, fit_tolerance=c.fit_tolerance,
              min_noise_variance=c.min_noise_variance, init_noise_ratio=c.init_noise_ratio,
              theta_lower=c.theta_lower, theta_upper=c.theta_upper, pad_multiple=c.pad_multiple)
    if method == "gp_ella":
        return GPELLA(replace(c, seed=seed, **tuned.get("gp_ella", {})))
    if method == "individual":  # GP-ELLA's smoothing fields, for the smoothed ablation row
        return IndividualGPs(replace(_individual_config(c, seed), **tuned.get("individual", {})))
    batch = {**gp, "max_iterations": config.batch_max_iterations or c.max_iterations}
    if method == "shared":
        return SharedGP(SharedGPConfig(**batch, max_train=config.batch_max_train, seed=seed))
    if method in ("mtgp", "mtgp_rank2"):
        return MultiTaskGP(MultiTaskGPConfig(**batch, rank=1 if method == "mtgp" else 2,
                                             max_train=config.batch_max_train, seed=seed))
    if method == "ella":
        return LinearELLA(LinearELLAConfig(seed=seed, **tuned.get("ella", {})))
    raise ValueError(f"methods: unknown method {method!r}; expected some of {METHODS}")


def _individual_config(c: GPELLAConfig, seed: int):
    """Individual GPs with GP-ELLA's single-task fit and smoothing fields (the smoothed
    ablation predicts with them)."""
    from ppl_cl.configs.gp_ella import IndividualGPConfig

    return IndividualGPConfig(
        max_iterations=c.max_iterations, fit_tolerance=c.fit_tolerance,
        min_noise_variance=c.min_noise_variance, init_noise_ratio=c.init_noise_ratio,
        theta_lower=c.theta_lower, theta_upper=c.theta_upper, pad_multiple=c.pad_multiple,
        smoothing_scale=c.smoothing_scale, smoothing_ratio=c.smoothing_ratio,
        smoothing_variance=c.smoothing_variance, smoothing_grid=c.smoothing_grid,
        holdout_fraction=c.holdout_fraction, smoothing_parametrization=c.parametrization,
        seed=seed)


def _predict_all(learner, data: list, **kw) -> tuple[float, float]:
    t0 = time.perf_counter()
    preds = [learner.predict(data[t][2], int(t), **kw).mean for t in range(len(data))]
    return _pooled_rmse(preds, [d[3] for d in data]), time.perf_counter() - t0


def run_method(method: str, config, tuned: dict, seed: int, data: list, order: np.ndarray,
               ablations: bool = True) -> dict[str, Any]:
    """Learn all tasks (in ``order``) and predict every test set.

    Returns ``{row: {"rmse", "seconds"}}`` for the method's row and, with ``ablations``, its
    ablation row (:data:`ABLATIONS`: the same learned model, predicted the other way; its
    seconds are the learning plus its own predictions), plus ``"extra"``: the smoothing's
    effective number of tasks and variance, GP-ELLA's fit diagnostics, the learner.
    """
    from ppl_cl import Batch

    learner = _build(method, config, tuned, seed)
    t0 = time.perf_counter()
    for t in order:
        xt, yt, _, _ = data[t]
        learner.update(Batch(xt, yt, task_id=int(t)))
    learn_s = time.perf_counter() - t0
    rmse, pred_s = _predict_all(learner, data)
    out: dict[str, Any] = {method: {"rmse": rmse, "seconds": learn_s + pred_s,
                                    "learn_seconds": learn_s}}
    extra: dict[str, Any] = {"learner": learner}
    slots = [learner._store.slot(t) for t in range(len(data))]
    if method == "gp_ella":
        extra.update(learner.diagnostics())
        if learner.config.smoothing:
            sm = learner.smoother()
            extra["n_eff"] = float(np.mean([_n_eff(sm, s) for s in slots]))
            extra["smoothing_variance"] = sm.variance
    if method == "individual":
        extra["fit_converged_fraction"] = learner.converged_fraction()
    if ablations and method in ABLATIONS:
        row = ABLATIONS[method]
        kw = {"smoothing": method == "individual"}
        rmse_a, pred_a = _predict_all(learner, data, **kw)
        out[row] = {"rmse": rmse_a, "seconds": learn_s + pred_a, "learn_seconds": learn_s}
        if method == "individual":
            sm = learner.smoother()
            extra["n_eff"] = float(np.mean([_n_eff(sm, s) for s in slots]))
            extra["smoothing_variance"] = sm.variance
    out["extra"] = extra
    return out


def _n_eff(smoother, slot: int) -> float:
    from inference.gp_ella import effective_number_of_tasks

    return effective_number_of_tasks(smoother.weights(slot))


_EXTRA_KEYS = {"gp_ella": ("n_eff", "smoothing_variance") + DIAGNOSTICS,
               "individual": ("n_eff", "smoothing_variance", "fit_converged_fraction")}


def _restore_run(saved: dict, results: dict, extras: dict, tuned_log: list) -> None:
    """Append a run finished before a stop (its checkpoint ``saved``) to the results."""
    for r in results:
        results[r]["rmse"].append(float(saved["results"][r]["rmse"]))
        results[r]["seconds"].append(float(saved["results"][r]["seconds"]))
    for m, ex in extras.items():
        for k in ex:
            ex[k].append(float(saved["extras"][m][k]))
    if saved.get("tuned"):
        tuned_log.append(saved["tuned"])


def _tuning_split(data: list, tasks, rng: np.random.Generator) -> list:
    """Half of each tuning task's training points to fit, half to validate (Sect. 5.2)."""
    sub = []
    for t in tasks:
        xt, yt, _, _ = data[t]
        p = rng.permutation(len(yt))
        h = max(1, len(yt) // 2)
        sub.append((xt[p[:h]], yt[p[:h]], xt[p[h:]], yt[p[h:]]))
    return sub


def _tune(sub: list, config: "GPELLAProtocolConfig", ks: list[int], seed: int) -> dict:
    """The settings of each tuned method chosen on ``sub`` (:func:`_tuning_split`)."""
    tuned: dict[str, dict] = {}
    if "gp_ella" in config.methods:
        tuned["gp_ella"] = tune_gp_ella(sub, config.learner, ks, config.grid_exponents)
    if "individual" in config.methods and config.ablations and _tunes_ratio(config.learner):
        tuned["individual"] = tune_individual_smoothing(
            sub, _individual_config(config.learner, seed))
    if "ella" in config.methods:
        from ppl_cl.configs.gp_ella import LinearELLAConfig

        tuned["ella"] = tune_ella(sub, LinearELLAConfig(), ks, config.grid_exponents)
    return tuned


def run_protocol(tasks: list, config: GPELLAProtocolConfig, ctx: RunContext, name: str) -> dict:
    import jax

    from ppl_cl.learners.gp_ella import synchronous_cpu_dispatch
    from ppl_cl.numerics import enable_x64

    enable_x64()
    synchronous_cpu_dispatch()
    bad = set(config.methods) - set(METHODS)
    if bad:
        raise ValueError(f"methods: unknown {sorted(bad)}; expected some of {METHODS}")
    if config.n_tasks:
        tasks = tasks[: config.n_tasks]
    d = tasks[0][0].shape[1]
    ks = _k_grid(d, config.k_max)
    rows = [r for m in config.methods
            for r in ((m, ABLATIONS[m]) if config.ablations and m in ABLATIONS else (m,))]
    results: dict[str, dict[str, list]] = {r: {"rmse": [], "seconds": []} for r in rows}
    extras: dict[str, dict[str, list]] = {m: {k: [] for k in _EXTRA_KEYS[m]}
                                         for m in config.methods if m in _EXTRA_KEYS}
    tuned_log: list[dict] = []
    with jax.default_device(ctx.jax_device()):
        for run in ctx.progress(range(config.n_runs), desc=name):
            saved = ctx.load_checkpoint(f"run{run}")
            if saved is not None:  # --resume: this run finished before the stop
                _restore_run(saved, results, extras, tuned_log)
                continue
            rng = np.random.default_rng([ctx.seed, run])
            data = split_and_center(tasks, rng)
            order = rng.permutation(len(data))
            tuned: dict[str, dict] = {}
            if config.tune:
                sub = _tuning_split(data, order[: config.tune_tasks], rng)
                t0 = time.perf_counter()
                tuned = _tune(sub, config, ks, ctx.seed)
                tuned_log.append({m: {k: v for k, v in p.items()} for m, p in tuned.items()})
                ctx.log(f"run {run}: tuned {tuned_log[-1]} in {time.perf_counter() - t0:.1f} s")
            tuned = {m: {k: v for k, v in p.items() if k != "val_mse"} for m, p in tuned.items()}
            if run == 0 and config.warmup:
                for m in ("gp_ella", "individual"):
                    if m in config.methods:
                        run_method(m, config, tuned, ctx.seed, data, order, config.ablations)
            for m in config.methods:
                out = run_method(m, config, tuned, ctx.seed + run, data, order, config.ablations)
                for r, v in out.items():
                    if r == "extra":
                        continue
                    results[r]["rmse"].append(v["rmse"])
                    results[r]["seconds"].append(v["seconds"])
                    ctx.log(f"run {run}: {r} rmse {v['rmse']:.4f} in {v['seconds']:.2f} s")
                if m in extras:
                    for k in extras[m]:
                        extras[m][k].append(float(out["extra"].get(k, float("nan"))))
                    ctx.log(f"run {run}: {m} " + ", ".join(
                        f"{k} {extras[m][k][-1]:.4g}" for k in extras[m]))
            ctx.save_checkpoint(f"run{run}", {
                "results": {r: {"rmse": results[r]["rmse"][-1],
                                "seconds": results[r]["seconds"][-1]} for r in rows},
                "extras": {m: {k: ex[k][-1] for k in ex} for m, ex in extras.items()},
                "tuned": tuned_log[-1] if config.tune else {}})
    return summarize(results, tuned_log, config, ctx, extras, num_tasks=len(tasks))


def _mean_se(v: list[float]) -> tuple[float, float]:
    a = np.asarray(v, np.float64)
    return float(a.mean()), float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else 0.0


def summarize(results: dict, tuned_log: list, config, ctx: RunContext,
              extras: dict | None = None, num_tasks: int | None = None) -> dict:
    """The flat summary: rMSE and seconds (mean and standard error over runs) per row, the
    time ratio to individual GPs, the runs GP-ELLA wins against each other row, the
    smoothing's effective number of tasks and variance, GP-ELLA's fit diagnostics (mean over
    runs), the tuned k; and ``table1.md`` / ``fig2_rmse.png``."""
    extras = extras or {}
    summary: dict[str, Any] = {"n_runs": config.n_runs}
    if num_tasks is not None:
        summary["n_tasks"] = int(num_tasks)
    for r, v in results.items():
        mean, se = _mean_se(v["rmse"])
        summary[f"rmse_{r}"] = mean
        summary[f"rmse_{r}_se"] = se
        tm, tse = _mean_se(v["seconds"])
        summary[f"time_{r}_s"] = tm
        summary[f"time_{r}_se"] = tse
    if "gp_ella" in results and "individual" in results:
        ratio = np.asarray(results["gp_ella"]["seconds"]) / np.asarray(results["individual"]["seconds"])
        summary["time_ratio_vs_individual"] = float(ratio.mean())
        summary["time_ratio_vs_individual_se"] = _mean_se(list(ratio))[1]
    for lead in ("gp_ella", "gp_ella_no_smoothing"):
        if lead not in results:
            continue
        ours = np.asarray(results[lead]["rmse"])
        for b in BASELINES:
            if b in results and b != lead:
                summary[f"{lead}_beats_{b}_runs"] = int(np.sum(ours < np.asarray(results[b]["rmse"])))
    for m, name in (("gp_ella", "gp_ella"), ("individual", "individual_smoothed")):
        ex = extras.get(m, {})
        if ex.get("n_eff"):
            summary[f"n_eff_{name}"] = float(np.mean(ex["n_eff"]))
            summary[f"smoothing_variance_{name}"] = float(np.median(ex["smoothing_variance"]))
    for k in DIAGNOSTICS:
        if extras.get("gp_ella", {}).get(k):
            summary[k] = float(np.mean(extras["gp_ella"][k]))
    if extras.get("individual", {}).get("fit_converged_fraction"):
        summary["fit_converged_fraction_individual"] = float(
            np.mean(extras["individual"]["fit_converged_fraction"]))
    if tuned_log and "gp_ella" in tuned_log[0]:
        summary["tuned_k_median"] = float(np.median([t["gp_ella"]["num_components"] for t in tuned_log]))
    for m, name in (("gp_ella", "gp_ella"), ("individual", "individual_smoothed")):
        ratios = [t[m]["smoothing_ratio"] for t in tuned_log if "smoothing_ratio" in t.get(m, {})]
        if ratios:
            summary[f"tuned_smoothing_ratio_{name}"] = float(np.median(ratios))
    table = table1_markdown(results)
    (ctx.out_dir / "table1.md").write_text(table)
    ctx.savefig(fig2_rmse(results), "fig2_rmse")
    return {"summary": summary, "per_run": results, "per_run_extras": extras,
            "tuned": tuned_log, "table1": table,
            "units": "rMSE over all test points of all tasks in target units (after per-task "
                     "centring); times in seconds of learning all tasks and predicting all test "
                     "sets, tuning excluded (an ablation row: the learning of its method plus "
                     "its own predictions); n_eff: effective number of tasks the smoothing "
                     "averages, 1 / sum w^2, mean over tasks; _se: standard error over runs"}


def table1_markdown(results: dict) -> str:
    """Table 1: seconds (mean ± standard error over runs) and the ratio to individual GPs."""
    base = np.asarray(results["individual"]["seconds"]) if "individual" in results else None
    ours = np.asarray(results["gp_ella"]["rmse"]) if "gp_ella" in results else None
    lines = ["| method | rMSE | seconds | / Indiv. GPs | GP-ELLA better (runs) |",
             "|---|---|---|---|---|"]
    for m, r in results.items():
        rm, rse = _mean_se(r["rmse"])
        tm, tse = _mean_se(r["seconds"])
        ratio = "" if base is None else f"{np.mean(np.asarray(r['seconds']) / base):.2f}"
        wins = "" if ours is None or m == "gp_ella" else \
            f"{int(np.sum(ours < np.asarray(r['rmse'])))} / {len(ours)}"
        lines.append(f"| {LABELS[m]} | {rm:.4f} ± {rse:.4f} | {tm:.2f} ± {tse:.2f} | {ratio} "
                     f"| {wins} |")
    return "\n".join(lines) + "\n"


def fig2_rmse(results: dict, title: str = ""):
    """Fig. 2: rMSE per method with standard-error whiskers."""
    import matplotlib.pyplot as plt

    names = list(results)
    means = [_mean_se(results[m]["rmse"])[0] for m in names]
    ses = [_mean_se(results[m]["rmse"])[1] for m in names]
    fig, ax = plt.subplots(figsize=(1.1 * len(names) + 1.5, 3.2))
    ax.bar(range(len(names)), means, yerr=ses, capsize=4, color="0.7", edgecolor="k")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([LABELS[m] for m in names], rotation=30, ha="right")
    ax.set_ylabel("rMSE")
    lo = min(m - s for m, s in zip(means, ses))
    ax.set_ylim(max(0.0, lo - 0.15 * (max(means) - lo + 1e-12)), None)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# the four experiments
# ---------------------------------------------------------------------------------------------
_QUICK = {"n_runs": 1, "n_tasks": 12, "k_max": 4, "grid_exponents": (-8.0, -4.0),
          "batch_max_train": 200, "methods": METHODS}


def _claims(ella_better: bool = False) -> tuple[Claim, ...]:
    """Sect. 5.3 / Fig. 2, one claim per baseline: GP-ELLA's rMSE below each (on the synthetic
    linear tasks the paper has ELLA below GP-ELLA)."""
    out = [Claim(f"Fig. 2: GP-ELLA's rMSE below {label}'s", ("rmse_gp_ella", f"rmse_{key}"),
                 increasing=True)
           for key, label in (("individual", "individual GPs"), ("shared", "the shared GP"),
                              ("mtgp", "the batch MTGP (rank 1)"))]
    if ella_better:
        out.append(Claim("Fig. 2: ELLA's rMSE below GP-ELLA's (synthetic linear tasks)",
                         ("rmse_ella", "rmse_gp_ella"), increasing=True))
    else:
        out.append(Claim("Fig. 2: GP-ELLA's rMSE below ELLA's", ("rmse_gp_ella", "rmse_ella"),
                         increasing=True))
    return tuple(out)


@register("gpella-synthetic", SyntheticConfig, quick=_QUICK,
          paper={"time_ratio_vs_individual": PaperNumber(round(63.8 / 25.4, 2), _TABLE1,
                                                         note="63.8 s / 25.4 s")},
          headline=True, claims=_claims(ella_better=True),
          description="GP-ELLA vs baselines on 100 synthetic linear factorized tasks (Fig. 2, Table 1)")
def run_synthetic(config: SyntheticConfig, ctx: RunContext) -> dict:
    from ppl_cl.data.synthetic import ella_linear_tasks

    data = ella_linear_tasks(n_tasks=config.tasks_total, n_per_task=config.n_per_task,
                             dim=config.dim, n_latent=config.n_latent,
                             noise_std=config.noise_std, seed=ctx.seed)
    return run_protocol(list(data.tasks), config, ctx, "gpella-synthetic")


@register("gpella-robot-arm", RobotArmConfig, quick=_QUICK,
          paper={"time_ratio_vs_individual": PaperNumber(round(38.3 / 10.5, 2), _TABLE1,
                                                         note="38.3 s / 10.5 s")},
          claims=_claims(),
          description="GP-ELLA vs baselines on 113 simulated 8-DOF robot arms (Fig. 2, Table 1)")
def run_robot_arm(config: RobotArmConfig, ctx: RunContext) -> dict:
    from ppl_cl.data.synthetic import robot_arm_tasks

    tasks = robot_arm_tasks(n_tasks=config.tasks_total, min_configs=config.min_configs,
                            max_configs=config.max_configs, seed=ctx.seed)
    return run_protocol(tasks, config, ctx, "gpella-robot-arm")


@register("gpella-schools", SchoolsConfig, quick=_QUICK,
          paper={"time_ratio_vs_individual": PaperNumber(round(489.8 / 56.9, 2), _TABLE1,
                                                         note="489.8 s / 56.9 s")},
          claims=_claims(),
          description="GP-ELLA vs baselines on the London schools (139 tasks) (Fig. 2, Table 1)")
def run_schools(config: SchoolsConfig, ctx: RunContext) -> dict:
    from ppl_cl.data.loaders import load_schools

    return run_protocol(load_schools(data_dir=ctx.data_dir), config, ctx, "gpella-schools")


@register("gpella-parkinsons", ParkinsonsConfig, quick=_QUICK,
          paper={"time_ratio_vs_individual": PaperNumber(round(113.6 / 12.7, 2), _TABLE1,
                                                         note="motor: 113.6 s / 12.7 s "
                                                              "(total UPDRS: 109.4 / 13.1 = 8.35)")},
          claims=_claims(),
          description="GP-ELLA vs baselines on Parkinson's telemonitoring, 42 patients (Fig. 2, Table 1)")
def run_parkinsons(config: ParkinsonsConfig, ctx: RunContext) -> dict:
    from ppl_cl.data.loaders import load_parkinsons

    if config.target not in ("motor", "total"):
        raise ValueError(f"target: expected 'motor' or 'total', received {config.target!r}")
    return run_protocol(load_parkinsons(config.target, data_dir=ctx.data_dir), config, ctx,
                        f"gpella-parkinsons-{config.target}")
