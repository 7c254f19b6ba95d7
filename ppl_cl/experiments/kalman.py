"""Experiments of Titsias et al. (2024), "Kalman filter for online classification of
non-stationary data".

* ``kalman-timeseries`` (headline) — the 3058-point piecewise-constant series of App. C, phi = 1,
  App. C mean-preserving transition, s_w2 = 0.01, s2 = 0.05, delta_0 = 0, SGD rate 1.0 on
  delta; online next-step prediction with learned gamma vs fixed gamma = 1 (Fig. 1 and Fig. 4).
* ``kalman-online-mnist`` — the Table 1 protocol transposed to MNIST (CIFAR-100 is not in
  ../shared/data): a stationary (shuffled) stream and a non-stationary stream (5 tasks of 2
  classes, task boundaries not given), chunks of 10, one 10-way head, predict-then-learn.
  Rows: stationary KF (gamma = 1), fixed gamma = 0.999, learned gamma, each with fixed random
  features (purely linear), a fine-tuned network, and fine-tuning + replay; plus online SGD with
  the same network (with and without replay). Average online accuracy (eq. 14) and cumulative
  log-loss per row; Fig. 2 (gamma over time with task boundaries).
* ``kalman-online-cifar100`` — the paper's protocol on CIFAR-100 (needs the python pickles
  locally): stationary (shuffled, one pass) and non-stationary (10 tasks x 10 classes) streams,
  chunks of 10, 100-way, ResNet-18 backbone, replay memory of 100 (App. D.4), per-stream
  transition / bias / normalization of Table 3.

Row keys of the summaries: ``online_acc_<stream>_<variant>_<regime>`` and
``cum_logloss_<stream>_<variant>_<regime>`` with stream in {stationary, nonstationary}, variant
in {gamma1, fixed, learned}, regime in {linear, finetune, replay}; baselines
``online_acc_<stream>_sgd`` and ``online_acc_<stream>_sgd_replay``.

Configs: each experiment holds its data / protocol fields and the learner configs its rows are
built from (``learner``: :class:`~ppl_cl.configs.kalman.KalmanConfig`, ``sgd``:
:class:`~ppl_cl.configs.kalman.OnlineSGDConfig`); a row is ``dataclasses.replace`` of them with
the row's variant, regime and stream settings (``--set learner.learning_rate=0.01``).

Hyperparameters (App. D.1): the paper selects them per row by prequential MDL (the highest
cumulative log predictive) over the grid of its Table 2. Here every row, the online-SGD
baselines included, runs the same search on a held-out stream of ``tune_points`` points drawn
with the same protocol from the test split (disjoint from the reported training-split stream):
eta in ``eta_grid`` for every Kalman row, beta in ``beta_grid`` for the fine-tuned rows, rho in
``rho_grid`` for the learned-gamma rows, the SGD rate in ``sgd_grid`` (each a subset of Table 2's
values; gamma_init is not searched: 1 for learned gamma). The chosen values are reported as
``learning_rate_<row>``, ``backbone_scale_<row>``, ``forgetting_learning_rate_<row>`` and the
held-out log-loss as ``tune_logloss_<row>``. The other settings (s_w2 = 1 with normalized
features, alpha_0 = 10) are the learner config's, shared by all rows.

Ablations on the MNIST streams (the Kalman variant with learned gamma, at the learner config's
step sizes):

* ``kalman-calibration`` (App. E, Figs. 5-6): fine-tuned backbone with and without the
  calibration alpha (``alpha = 1`` fixed);
* ``kalman-chunk-size`` (App. F, Fig. 7): fixed and fine-tuned backbone at chunk sizes
  ``chunk_sizes``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ppl_cl.configs.kalman import KalmanConfig, KalmanRegressorConfig, NetworkConfig, OnlineSGDConfig
from ppl_cl.experiments.base import Claim, PaperNumber, RunContext, register

_PAPER = "Titsias et al. 2024 (Kalman filter for online classification), Table 1"
VARIANTS = ("gamma1", "fixed", "learned")
REGIMES = ("linear", "finetune", "replay")
STREAMS = ("stationary", "nonstationary")


# ---------------------------------------------------------------------------------------------
# kalman-timeseries
# ---------------------------------------------------------------------------------------------
def _timeseries_learner() -> KalmanRegressorConfig:
    # App. C: phi = 1, s_w2 = 0.01, s2 = 0.05, delta_0 = 0 (gamma_0 = 1), SGD rate 1.0 on delta,
    # the mean-preserving transition m_n^- = m_{n-1}; one point at a time
    return KalmanRegressorConfig(input_dim=1, prior_variance=0.01, noise_variance=0.05,
                                 forgetting_learning_rate=1.0, initial_forgetting=1.0,
                                 mean_preserving=True, transition="always", dtype="float64")


@dataclass(frozen=True)
class KalmanTimeseriesConfig:
    """App. C's series and settings.

    Attributes:
        series_seed: seed of the observation noise (< 0: the run's ``--seed``).
        length: points of the series used (3058: all).
        learner: the learned-gamma row; the fixed row is the same with ``gamma = 1`` fixed.
    """

    series_seed: int = -1
    length: int = 3058
    learner: KalmanRegressorConfig = field(default_factory=_timeseries_learner)


def timeseries_figure(y: np.ndarray, learned: dict, fixed: dict, change_points,
                      labels: tuple[str, str] = ("learned gamma", "fixed gamma = 1")):
    """Fig. 1 (data, predictive mean +- 2 sd and learned gamma^2; accumulated average log
    predictive of both rows) and Fig. 4 (the fixed row's predictions). ``learned`` / ``fixed``:
    ``{"mean", "var", "gamma", "avg"}`` arrays over the ``n`` points; ``labels``: the rows'
    legend labels."""
    import matplotlib.pyplot as plt

    n = y.shape[0]
    t = np.arange(1, n + 1)
    fig, axes = plt.subplots(2, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [2.2, 1],
                                                                   "height_ratios": [2, 1]})
    ax = axes[0, 0]
    sd = np.sqrt(learned["var"])
    ax.plot(t, y, ".", color="k", ms=1.5, label="data")
    ax.plot(t, learned["mean"], color="tab:orange", lw=1,
            label=f"predictive mean ({labels[0]})")
    ax.fill_between(t, learned["mean"] - 2 * sd, learned["mean"] + 2 * sd, color="tab:orange",
                    alpha=0.3, label="mean +- 2 sd")
    for c in change_points:
        if c < n:
            ax.axvline(c, color="grey", lw=0.5, ls=":")
    ax.set_ylabel("y_n")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("online next-step prediction (Fig. 1 left, top)")
    ax = axes[1, 0]
    ax.plot(t, learned["gamma"] ** 2, color="tab:blue", lw=1)
    ax.set_ylabel("learned gamma_n^2")
    ax.set_xlabel("n")
    ax = axes[0, 1]
    ax.plot(t, learned["avg"], label=labels[0])
    ax.plot(t, fixed["avg"], label=labels[1])
    ax.set_title("accumulated average log predictive (Fig. 1 right)")
    ax.set_xlabel("n")
    ax.legend(fontsize=8)
    ax = axes[1, 1]
    ax.plot(t, y, ".", color="k", ms=1)
    ax.plot(t, fixed["mean"], color="tab:orange", lw=1)
    fsd = np.sqrt(fixed["var"])
    ax.fill_between(t, fixed["mean"] - 2 * fsd, fixed["mean"] + 2 * fsd, color="tab:orange",
                    alpha=0.3)
    ax.set_title(f"{labels[1]} (Fig. 4)", fontsize=9)
    fig.tight_layout()
    return fig


#: Fig. 1 of Titsias et al. 2024: the learned forgetting coefficient predicts the
#: non-stationary series better than no forgetting (gamma = 1)
TIMESERIES_CLAIM = Claim("Fig. 1: learned gamma above gamma = 1 in accumulated average log "
                         "predictive", ("avg_log_pred_learned", "avg_log_pred_fixed"))


@register("kalman-timeseries", KalmanTimeseriesConfig, quick={}, headline=True,
          claims=(TIMESERIES_CLAIM,),
          description="Kalman filter, learned vs fixed gamma on the 3058-point series (Fig. 1)")
def run_kalman_timeseries(config: KalmanTimeseriesConfig, ctx: RunContext) -> dict:
    import jax

    from ppl_cl.data.streams import online_chunks
    from ppl_cl.data.synthetic import kalman_piecewise_series
    from ppl_cl.learners.kalman import KalmanRegressor
    from ppl_cl.metrics import average_log_predictive
    from ppl_cl.protocols import prequential

    series = kalman_piecewise_series(ctx.seed if config.series_seed < 0 else config.series_seed)
    if not 1 <= config.length <= series.y.shape[0]:
        raise ValueError(f"length: expected 1..{series.y.shape[0]}, received {config.length}")
    y = series.y[: config.length]
    n = y.shape[0]
    chunks = online_chunks(np.ones((n, 1)), y, chunk_size=1)   # phi_n = 1, purely online

    rows = {"learned": dataclasses.replace(config.learner, learn_forgetting=True, seed=ctx.seed),
            "fixed": dataclasses.replace(config.learner, learn_forgetting=False,
                                         initial_forgetting=1.0, seed=ctx.seed)}
    results, learners = {}, {}
    with jax.default_device(ctx.jax_device()):
        for name, row in rows.items():
            learners[name] = KalmanRegressor(row)
            res = prequential(learners[name], ctx.progress(chunks, desc=f"series ({name} gamma)"),
                              keep_predictives=True)
            results[name] = {"mean": np.array([p.mean[0] for p in res.predictives]),
                             "var": np.array([p.variance[0] for p in res.predictives]),
                             "gamma": np.array([r["gamma"] for r in res.records]),
                             "log_prob": res.log_prob,
                             "avg": average_log_predictive(res.log_prob)}

    ctx.savefig(timeseries_figure(y, results["learned"], results["fixed"], series.change_points),
                "fig1_timeseries")
    learned_final = float(results["learned"]["avg"][-1])
    fixed_final = float(results["fixed"]["avg"][-1])
    idata = learners["learned"].to_inference_data(num_draws=200, seed=ctx.seed)
    idata.to_netcdf(str(ctx.out_dir / "posterior.nc"))
    np.savez(ctx.out_dir / "curves.npz", y=y, **{f"{k}_{q}": v[q] for k, v in results.items()
                                                   for q in ("mean", "var", "gamma", "log_prob")})
    return {
        "summary": {
            "avg_log_pred_learned": learned_final,
            "avg_log_pred_fixed": fixed_final,
            "learned_minus_fixed": learned_final - fixed_final,
            "min_gamma_learned": float(results["learned"]["gamma"].min()),
            "n_points": int(n),
            "paper_note": "Fig. 1 of Titsias et al. 2024 shows learned gamma > fixed gamma = 1 "
                          "in accumulated average log predictive (no number is reported)",
        },
    }


# ---------------------------------------------------------------------------------------------
# online classification (MNIST / CIFAR-100)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamSettings:
    """Per-benchmark settings of App. D.3 / Table 3 (transition type, use bias, use
    normalization), applied to every Kalman row of one stream."""

    transition: Literal["always", "last", "first"]
    feature_bias: bool
    feature_normalization: bool


def _mnist_network() -> NetworkConfig:
    return NetworkConfig("mlp", 256, (256,))


def _mnist_learner() -> KalmanConfig:
    # s_w2 = 1 with normalized features, alpha_0 = 10, eta = 0.05, beta = 1: chosen once on the
    # sklearn digits stand-in and shared by all rows; replay memory of 100, 10 per chunk (D.4)
    return KalmanConfig(network=_mnist_network(), prior_variance=1.0, initial_calibration=10.0,
                        learning_rate=0.05, replay_capacity=100, replay_size=10)


def mnist_sgd_config() -> OnlineSGDConfig:
    return OnlineSGDConfig(network=_mnist_network(), learning_rate=0.2, replay_capacity=100,
                           replay_size=10)


@dataclass(frozen=True)
class _StreamsConfig:
    """The MNIST / CIFAR-100 streams and the learner config the rows are built from.

    Attributes:
        n_points: points per stream (0: the whole training set).
        chunk_size: b, points per chunk (Sect. 4.2: 10).
        streams: ``"stationary"`` (shuffled) and / or ``"nonstationary"`` (tasks in order).
        n_tasks: tasks of the non-stationary stream (classes split in order).
        stationary / nonstationary: Table 3's per-stream settings.
        learner: the Kalman rows' config (a row's variant, regime and stream settings replace
            fields; a row without replay sets ``replay_capacity = 0``).
    """

    n_points: int = 0
    chunk_size: int = 10
    streams: tuple[str, ...] = STREAMS
    n_tasks: int = 5
    # Table 3: stationary -> Last Step Markov, no bias; non-stationary -> Always Markov, bias;
    # features normalized in both
    stationary: StreamSettings = StreamSettings("last", False, True)
    nonstationary: StreamSettings = StreamSettings("always", True, True)
    learner: KalmanConfig = field(default_factory=_mnist_learner)

    def __post_init__(self) -> None:
        bad = [v for v in self.streams if v not in STREAMS]
        if bad:
            raise ValueError(f"streams: expected values in {STREAMS}, received {bad}")


@dataclass(frozen=True)
class _OnlineConfig(_StreamsConfig):
    """Table 1's rows, each with its step sizes chosen on a held-out stream.

    Attributes (besides :class:`_StreamsConfig`'s):
        variants / regimes: the rows to run (module docstring).
        baselines: also run online SGD with and without replay.
        fixed_forgetting: gamma of the "fixed" rows (Table 1: 0.999).
        tune_points: points of the held-out stream every row selects its step sizes on: the
            same protocol drawn from the *test* split (disjoint from the training images the
            reported stream uses); 0: no selection, the learner configs' values.
        eta_grid: eta (alpha's step size; theta's is beta * eta), App. D.1 / Table 2 subset.
        beta_grid: beta, the relative backbone scale (fine-tuned rows), Table 2 subset.
        rho_grid: rho, delta's SGD step size (learned-gamma rows), Table 2 subset.
        sgd_grid: the online-SGD baselines' step size (Table 2's eta values).
        sgd: the online-SGD baseline's config (``replay_capacity = 0`` in the row without
            replay); its network must equal ``learner.network`` (the same representation).
    """

    variants: tuple[str, ...] = VARIANTS
    regimes: tuple[str, ...] = REGIMES
    baselines: bool = True
    fixed_forgetting: float = 0.999
    tune_points: int = 2000
    eta_grid: tuple[float, ...] = (0.1, 0.01, 0.001)
    beta_grid: tuple[float, ...] = (0.1, 1.0, 10.0)
    rho_grid: tuple[float, ...] = (0.1, 0.01, 0.001)
    sgd_grid: tuple[float, ...] = (0.1, 0.01, 0.001)
    sgd: OnlineSGDConfig = field(default_factory=mnist_sgd_config)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, allowed in (("variants", VARIANTS), ("regimes", REGIMES)):
            bad = [v for v in getattr(self, name) if v not in allowed]
            if bad:
                raise ValueError(f"{name}: expected values in {allowed}, received {bad}")
        for name in ("eta_grid", "beta_grid", "rho_grid", "sgd_grid"):
            if not getattr(self, name) or any(not v > 0 for v in getattr(self, name)):
                raise ValueError(f"{name}: expected one or more positive values, received "
                                 f"{getattr(self, name)!r}")
        if self.baselines and self.sgd.network != self.learner.network:
            raise ValueError(f"sgd.network: expected the Kalman rows' network "
                             f"(learner.network = {self.learner.network}), received "
                             f"{self.sgd.network}; set both, or baselines=false")


@dataclass(frozen=True)
class KalmanOnlineMnistConfig(_OnlineConfig):
    """MNIST (60000 training images) streams; MLP 784-256-256 representation; the held-out
    streams come from the 10000 test images."""


def _cifar_network() -> NetworkConfig:
    return NetworkConfig("resnet18", 512, input_shape=(32, 32, 3))


@dataclass(frozen=True)
class KalmanOnlineCifar100Config(_OnlineConfig):
    """CIFAR-100 streams of the paper (50000 training images, 100 classes, 10 tasks), ResNet-18
    (GroupNorm) representation with 512 features; held-out streams from the 10000 test
    images."""

    n_tasks: int = 10
    learner: KalmanConfig = field(default_factory=lambda: dataclasses.replace(
        _mnist_learner(), network=_cifar_network(), learning_rate=0.01))
    sgd: OnlineSGDConfig = field(default_factory=lambda: dataclasses.replace(
        mnist_sgd_config(), network=_cifar_network()))


def _make_streams(config: _StreamsConfig, x: np.ndarray, y: np.ndarray, num_classes: int,
                  seed: int, n_points: int | None = None, chunk_size: int | None = None):
    """``{stream: (chunks, task_starts or None)}``; ``n_points`` (default the config's)
    subsamples each stream.

    Non-stationary: the classes 0..K-1 in order, split into ``n_tasks`` equal groups (MNIST:
    {0,1}, {2,3}, ...; CIFAR-100: {0..9}, {10..19}, ...), each task's points shuffled, tasks
    concatenated."""
    from ppl_cl.data.streams import online_chunks, task_stream

    n_points = config.n_points if n_points is None else n_points
    chunk_size = config.chunk_size if chunk_size is None else chunk_size
    rng = np.random.default_rng(seed)
    classes = np.arange(num_classes)
    out = {}
    n_total = x.shape[0] if n_points <= 0 else min(n_points, x.shape[0])
    if "stationary" in config.streams:
        idx = rng.permutation(x.shape[0])[:n_total]
        out["stationary"] = (online_chunks(x[idx], y[idx], chunk_size), None)
    if "nonstationary" in config.streams:
        if config.n_tasks < 1 or len(classes) % config.n_tasks:
            raise ValueError(f"n_tasks: {len(classes)} classes do not split into "
                             f"{config.n_tasks} equal tasks")
        groups = np.array_split(classes, config.n_tasks)
        per_task = None if n_points <= 0 else max(1, n_total // config.n_tasks)
        tasks = []
        for g in groups:
            idx = np.flatnonzero(np.isin(y, g))
            idx = rng.permutation(idx)[: per_task] if per_task else rng.permutation(idx)
            if idx.size == 0:
                raise ValueError(f"non-stationary stream: no training points of classes {g}")
            tasks.append((x[idx], y[idx]))
        ts = task_stream(tasks, chunk_size=chunk_size)
        out["nonstationary"] = (ts.chunks, ts.task_starts)
    return out


def _with_input_shape(network: NetworkConfig, input_shape) -> NetworkConfig:
    """The data's image shape for an image network that does not name one."""
    if network.name in ("cnn", "resnet18") and network.input_shape is None:
        return dataclasses.replace(network, input_shape=tuple(input_shape))
    return network


def kalman_row(config: _StreamsConfig, stream: str, variant: str, regime: str,
                fixed_forgetting: float = 0.999, **overrides) -> KalmanConfig:
    """The learner config of one Kalman row: ``config.learner`` with the stream's Table 3
    settings, the variant's gamma and the regime's fine-tuning / replay; ``overrides``: the
    data's fields (num_classes, input_dim, network, seed) and the row's step sizes."""
    base = config.learner
    s: StreamSettings = getattr(config, stream)
    gamma0 = {"gamma1": 1.0, "fixed": fixed_forgetting,
              "learned": base.initial_forgetting}[variant]
    return dataclasses.replace(
        base, transition=s.transition, feature_bias=s.feature_bias,
        feature_normalization=s.feature_normalization, fine_tune=regime in ("finetune", "replay"),
        replay_capacity=base.replay_capacity if regime == "replay" else 0,
        learn_forgetting=variant == "learned", initial_forgetting=gamma0, **overrides)


def _step_size_grid(config: _OnlineConfig, variant: str, regime: str) -> list[dict]:
    """The step sizes a row chooses from (App. D.1: every row tuned; Table 2 subsets): eta for
    every Kalman row, beta for the fine-tuned rows, rho for the learned-gamma rows, the SGD
    rate for the baselines. Without a held-out stream: the configs' own values."""
    if config.tune_points <= 0:
        return [{}]
    if variant == "sgd":
        return [{"learning_rate": lr} for lr in config.sgd_grid]
    betas = config.beta_grid if regime != "linear" else (config.learner.backbone_scale,)
    rhos = config.rho_grid if variant == "learned" else (config.learner.forgetting_learning_rate,)
    return [{"learning_rate": eta, "backbone_scale": beta, "forgetting_learning_rate": rho}
            for eta in config.eta_grid for beta in betas for rho in rhos]


def online_figure(title: str, stream: str, gamma_traj: dict, acc_curves: dict,
                  task_starts, labels: dict):
    """Fig. 2: the learned gamma over the stream (smoothed over chunks; task boundaries as red
    dashed lines) and the average online accuracy (eq. 14) of every row.

    Args:
        gamma_traj: ``{row: (points seen, gamma after each chunk)}`` of the learned-gamma rows.
        acc_curves: ``{row: acc_o (N,)}``.
        task_starts: first point of each task, or ``None`` (stationary stream).
        labels: ``{row: (legend label, variant, regime)}``.
    """
    import matplotlib.pyplot as plt

    colors = {"gamma1": "tab:blue", "fixed": "tab:orange", "learned": "tab:green",
              "sgd": "tab:grey"}
    styles = {"linear": ":", "finetune": "--", "replay": "-"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.2))
    for row, color in zip(gamma_traj, ("tab:green", "tab:purple", "tab:red")):
        pts, g = gamma_traj[row]
        w = max(1, min(50, g.size // 20))           # moving average over w chunks
        smooth = np.convolve(g, np.ones(w) / w, mode="valid")
        ax1.plot(pts, g, lw=0.4, alpha=0.25, color=color)
        ax1.plot(pts[w - 1:], smooth, lw=1.4, color=color,
                 label=f"{labels[row][0]} (mean of {w} chunks)")
    for row, acc in acc_curves.items():
        label, variant, regime = labels[row]
        ax2.plot(np.arange(1, acc.size + 1), acc, lw=1, color=colors[variant],
                 ls=styles[regime], label=label)
    if task_starts is not None:
        for s in task_starts[1:]:
            ax1.axvline(s, color="red", ls="--", lw=0.8)
            ax2.axvline(s, color="red", ls="--", lw=0.8)
    ax1.set_title(f"{title}, {stream}: learned gamma (Fig. 2 left)")
    ax1.set_xlabel("points seen")
    ax1.set_ylabel("gamma")
    ax2.set_title("average online accuracy (eq. 14; Fig. 2 right)")
    ax2.set_xlabel("points seen")
    lo = min(float(np.min(a[len(a) // 10:])) for a in acc_curves.values())
    ax2.set_ylim(max(0.0, lo - 0.05), 1.0)
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def _row_maker(config: _OnlineConfig, stream: str, variant: str, regime: str, fields: dict,
               network: Any, sgd_network: Any):
    """A row of Table 1 on ``stream``: its name and ``make(steps)``, a fresh learner of the
    row with the step sizes ``steps`` (online SGD for ``variant == "sgd"``)."""
    from ppl_cl.learners.kalman import KalmanClassifier
    from ppl_cl.learners.online_sgd import OnlineSGDClassifier

    if variant == "sgd":
        row = f"{stream}_sgd" + ("_replay" if regime == "replay" else "")

        def make(steps, regime=regime):
            return OnlineSGDClassifier(dataclasses.replace(
                config.sgd, network=sgd_network, replay_capacity=(
                    config.sgd.replay_capacity if regime == "replay" else 0),
                **fields, **steps))
    else:
        row = f"{stream}_{variant}_{regime}"

        def make(steps, variant=variant, regime=regime):
            return KalmanClassifier(kalman_row(
                config, stream, variant, regime, config.fixed_forgetting,
                network=network, **fields, **steps))
    return row, make


def _run_rows(config: _OnlineConfig, ctx: RunContext, data: tuple, held_out: tuple,
              num_classes: int, input_shape: tuple[int, ...] | None, title: str) -> dict:
    """Every row of Table 1 on both streams. ``data`` / ``held_out``: ``(x, y)`` of the
    reported streams (training split) and of the selection streams (test split)."""
    import jax

    from ppl_cl.metrics import average_online_accuracy, cumulative_log_predictive
    from ppl_cl.protocols import prequential, select_prequential

    x, y = data
    streams = _make_streams(config, x, y, num_classes, ctx.seed)
    tune = (_make_streams(config, *held_out, num_classes, ctx.seed + 1,
                          n_points=config.tune_points) if config.tune_points > 0 else {})
    fields = {"num_classes": num_classes, "input_dim": int(x.shape[1]), "seed": ctx.seed}
    network = _with_input_shape(config.learner.network, input_shape)
    sgd_network = _with_input_shape(config.sgd.network, input_shape)
    summary: dict = {}
    curves: dict[str, np.ndarray] = {}
    figures = {}
    with jax.default_device(ctx.jax_device()):
        for stream, (chunks, task_starts) in streams.items():
            rows = [(v, r) for r in config.regimes for v in config.variants]
            if config.baselines:
                rows += [("sgd", "linear"), ("sgd", "replay")]
            gamma_traj, acc_curves, labels = {}, {}, {}
            for variant, regime in rows:
                row, make = _row_maker(config, stream, variant, regime, fields, network,
                                       sgd_network)
                grid = _step_size_grid(config, variant, regime)
                best = 0
                if len(grid) > 1:
                    # App. D.1: the highest cumulative log predictive, here on the held-out
                    # stream (test images), never on the stream that is reported
                    best, scores = select_prequential(
                        make, grid, tune[stream][0], progress=ctx.show_progress,
                        desc=f"{row}: {len(grid)} step sizes")
                    summary[f"tune_logloss_{row}"] = float(-scores[best])
                    ctx.log(f"{row}: chose {grid[best]} on the held-out stream "
                            f"(cumulative log-loss {-scores[best]:.1f})")
                for key, value in grid[best].items():
                    summary[f"{key}_{row}"] = float(value)
                learner = make(grid[best])
                res = prequential(learner, ctx.progress(chunks, desc=row))
                acc = average_online_accuracy(res.correct)
                cum = cumulative_log_predictive(res.log_prob)
                summary[f"online_acc_{row}"] = float(acc[-1])
                summary[f"cum_logloss_{row}"] = float(-cum[-1])
                acc_curves[row] = acc
                labels[row] = (row.split("_", 1)[1], variant, regime)
                curves[f"acc_{row}"] = acc.astype(np.float32)
                curves[f"logp_{row}"] = res.log_prob.astype(np.float32)
                if variant != "sgd":
                    traj = learner.trajectories()
                    if variant == "learned":
                        gamma_traj[row] = (traj["points"], traj["gamma"])
                    curves[f"points_{row}"] = traj["points"]
                    curves[f"gamma_{row}"] = traj["gamma"]
                    curves[f"alpha_{row}"] = traj["alpha"]
                ctx.log(f"{row}: online accuracy {acc[-1]:.4f}, cumulative log-loss "
                        f"{-cum[-1]:.1f}")
            summary[f"n_points_{stream}"] = int(sum(len(c) for c in chunks))
            if task_starts is not None:
                curves[f"task_starts_{stream}"] = np.asarray(task_starts)
            figures[stream] = online_figure(title, stream, gamma_traj, acc_curves, task_starts,
                                            labels)
            if task_starts is not None and gamma_traj:
                figures[f"gamma_{stream}"] = gamma_figure(title, stream, gamma_traj,
                                                          task_starts)
    np.savez_compressed(ctx.out_dir / "curves.npz", **curves)
    for name, fig in figures.items():
        ctx.savefig(fig, f"fig2_{name}")
    return summary


def gamma_figure(title: str, stream: str, gamma_traj: dict, task_starts):
    """Fig. 2 (left) alone: gamma after every chunk of each learned-gamma row, unsmoothed,
    with the task boundaries as red dashed lines."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(gamma_traj), 1, figsize=(11, 2.2 * len(gamma_traj)),
                             sharex=True, squeeze=False)
    for ax, (row, (pts, g)) in zip(axes[:, 0], gamma_traj.items()):
        ax.plot(pts, g, lw=0.6, color="tab:green")
        for s in task_starts[1:]:
            ax.axvline(s, color="red", ls="--", lw=0.8)
        ax.set_ylabel("gamma")
        ax.set_title(f"{title}, {row}: min {g.min():.4f}", fontsize=9)
    axes[-1, 0].set_xlabel("points seen")
    fig.tight_layout()
    return fig


#: Table 1 of Titsias et al. 2024 on the non-stationary stream (fine-tuned backbone): the
#: learned gamma has a lower cumulative log-loss than no forgetting and than a fixed gamma
ONLINE_CLAIMS = tuple(
    Claim(f"Table 1, non-stationary, fine-tuned: learned gamma's log-loss below gamma = {g}",
          ("cum_logloss_nonstationary_learned_finetune", f"cum_logloss_nonstationary_{row}"),
          increasing=True)
    for g, row in (("1", "gamma1_finetune"), ("0.999", "fixed_finetune")))


@register("kalman-online-mnist", KalmanOnlineMnistConfig,
          quick={"n_points": 1000, "tune_points": 300, "eta_grid": (0.1, 0.01),
                 "beta_grid": (1.0,), "rho_grid": (0.01,), "sgd_grid": (0.1, 0.01)},
          claims=ONLINE_CLAIMS,
          description="Kalman OCL rows of Table 1 on MNIST streams (stationary / 5 tasks)")
def run_kalman_online_mnist(config: KalmanOnlineMnistConfig, ctx: RunContext) -> dict:
    from ppl_cl.data.loaders import load_mnist

    x, y = load_mnist("train", data_dir=ctx.data_dir)
    xt, yt = load_mnist("test", data_dir=ctx.data_dir)
    summary = _run_rows(config, ctx, (x.astype(np.float32), y), (xt.astype(np.float32), yt), 10,
                        (28, 28, 1), "MNIST")
    return {"summary": summary}


_CIFAR_MEAN = np.array([0.5071, 0.4865, 0.4409], dtype=np.float32)
_CIFAR_STD = np.array([0.2673, 0.2564, 0.2762], dtype=np.float32)

_TABLE1 = {
    "online_acc_stationary_gamma1_linear": (0.109, "stationary CIFAR-100, no backbone finetuning, gamma = 1"),
    "online_acc_stationary_fixed_linear": (0.092, "stationary, no finetuning, fixed gamma = 0.999"),
    "online_acc_stationary_learned_linear": (0.114, "stationary, no finetuning, learned gamma"),
    "online_acc_stationary_gamma1_finetune": (0.164, "stationary, backbone finetuning, gamma = 1"),
    "online_acc_stationary_fixed_finetune": (0.159, "stationary, finetuning, fixed gamma = 0.999"),
    "online_acc_stationary_learned_finetune": (0.169, "stationary, finetuning, learned gamma"),
    "online_acc_stationary_gamma1_replay": (0.185, "stationary, finetuning + replay, gamma = 1"),
    "online_acc_stationary_fixed_replay": (0.189, "stationary, finetuning + replay, gamma = 0.999"),
    "online_acc_stationary_learned_replay": (0.190, "stationary, finetuning + replay, learned"),
    "online_acc_nonstationary_gamma1_linear": (0.121, "non-stationary CIFAR-100, no finetuning, gamma = 1"),
    "online_acc_nonstationary_fixed_linear": (0.319, "non-stationary, no finetuning, gamma = 0.999"),
    "online_acc_nonstationary_learned_linear": (0.327, "non-stationary, no finetuning, learned"),
    "online_acc_nonstationary_gamma1_finetune": (0.445, "non-stationary, finetuning, gamma = 1"),
    "online_acc_nonstationary_fixed_finetune": (0.505, "non-stationary, finetuning, gamma = 0.999"),
    "online_acc_nonstationary_learned_finetune": (0.512, "non-stationary, finetuning, learned"),
    "online_acc_nonstationary_gamma1_replay": (0.516, "non-stationary, finetuning + replay, gamma = 1"),
    "online_acc_nonstationary_fixed_replay": (0.555, "non-stationary, replay, gamma = 0.999"),
    "online_acc_nonstationary_learned_replay": (0.555, "non-stationary, replay, learned gamma"),
}


@register("kalman-online-cifar100", KalmanOnlineCifar100Config,
          quick={"n_points": 2000, "learner.network.name": "cnn",
                 "learner.network.feature_dim": 128, "baselines": False,
                 "tune_points": 200, "eta_grid": (0.01,), "beta_grid": (1.0,),
                 "rho_grid": (0.01,)},
          paper={k: PaperNumber(v, _PAPER, decimals=3,
                                 note=f"{note}; ResNet-18, average online accuracy")
                 for k, (v, note) in _TABLE1.items()},
          description="Kalman OCL Table 1 on CIFAR-100 (needs cifar-100-python locally)")
def run_kalman_online_cifar100(config: KalmanOnlineCifar100Config, ctx: RunContext) -> dict:
    from ppl_cl.data.loaders import load_cifar100

    def load(split):
        x, y = load_cifar100(split, data_dir=ctx.data_dir)
        return ((x.astype(np.float32) / 255.0 - _CIFAR_MEAN) / _CIFAR_STD).reshape(
            x.shape[0], -1), y

    summary = _run_rows(config, ctx, load("train"), load("test"), 100, (32, 32, 3), "CIFAR-100")
    return {"summary": summary}


# ---------------------------------------------------------------------------------------------
# ablations (App. E, App. F) on the MNIST streams
# ---------------------------------------------------------------------------------------------
def _ablation_learner() -> KalmanConfig:
    # the Kalman variant of App. E / F: learned gamma; fine-tuning set per row; no replay
    return dataclasses.replace(_mnist_learner(), replay_capacity=0)


@dataclass(frozen=True)
class KalmanCalibrationConfig(_StreamsConfig):
    """App. E: the fine-tuned, learned-gamma Kalman filter with the calibration alpha learned
    (``learner.initial_calibration``, step ``learner.learning_rate``) and without it (alpha = 1
    fixed, the plain softmax of eq. 12)."""

    learner: KalmanConfig = field(default_factory=_ablation_learner)


@dataclass(frozen=True)
class KalmanChunkSizeConfig(_StreamsConfig):
    """App. F: average online accuracy of the learned-gamma Kalman filter with fixed and
    fine-tuned backbone at each chunk size.

    Attributes:
        chunk_sizes: the chunk sizes b (every row of one size sees the same points).
        regimes: ``"linear"`` (fixed random features) and / or ``"finetune"``.
    """

    chunk_sizes: tuple[int, ...] = (5, 10, 20, 50, 100)
    regimes: tuple[str, ...] = ("linear", "finetune")
    learner: KalmanConfig = field(default_factory=_ablation_learner)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.chunk_sizes or any(not isinstance(b, int) or b < 1
                                       for b in self.chunk_sizes):
            raise ValueError(f"chunk_sizes: expected positive ints, received "
                             f"{self.chunk_sizes!r}")
        bad = [r for r in self.regimes if r not in ("linear", "finetune")]
        if bad:
            raise ValueError(f"regimes: expected values in ('linear', 'finetune'), received {bad}")


def _ablation_rows(config: _StreamsConfig, ctx: RunContext, rows: dict, chunk_size: int,
                   x: np.ndarray, y: np.ndarray) -> dict:
    """``{stream: {row: PrequentialResult, learner}}`` of learned-gamma Kalman rows
    (``rows``: ``{row: (regime, config overrides)}``) on MNIST streams of chunk ``chunk_size``."""
    from ppl_cl.learners.kalman import KalmanClassifier
    from ppl_cl.protocols import prequential

    streams = _make_streams(config, x, y, 10, ctx.seed, chunk_size=chunk_size)
    fields = {"num_classes": 10, "input_dim": int(x.shape[1]), "seed": ctx.seed,
              "network": _with_input_shape(config.learner.network, (28, 28, 1))}
    out: dict = {}
    for stream, (chunks, task_starts) in streams.items():
        out[stream] = {"task_starts": task_starts, "n_points": sum(len(c) for c in chunks)}
        for row, (regime, overrides) in rows.items():
            learner = KalmanClassifier(kalman_row(config, stream, "learned", regime,
                                                   **fields, **overrides))
            res = prequential(learner, ctx.progress(chunks, desc=f"{stream} {row}"))
            out[stream][row] = (res, learner)
            ctx.log(f"{stream} {row}: online accuracy {res.correct.mean():.4f}, cumulative "
                    f"log-loss {-res.log_prob.sum():.1f}")
    return out


def _labelled(fig, ax, xlabel: str, ylabel: str, title: str):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def calibration_figure(curves: dict, labels: dict, task_starts=None, title: str = ""):
    """Figs. 5-6: the accumulated average log predictive (1/n) sum_i log p(y_i | ...) over the
    stream, one line per row; ``curves``: ``{row: (N,) log predictives}``; ``labels``:
    ``{row: legend label}``."""
    import matplotlib.pyplot as plt

    from ppl_cl.metrics import average_log_predictive

    fig, ax = plt.subplots(figsize=(8, 3.6))
    for row, logp in curves.items():
        ax.plot(np.arange(1, logp.size + 1), average_log_predictive(logp), lw=1.2,
                label=labels[row])
    if task_starts is not None:
        for s in task_starts[1:]:
            ax.axvline(s, color="red", ls="--", lw=0.8)
    return _labelled(fig, ax, "points seen", "average log predictive", title)


@register("kalman-calibration", KalmanCalibrationConfig, quick={"n_points": 1000},
          description="Kalman OCL App. E: fine-tuned, learned gamma, with vs without alpha "
                      "(MNIST streams)")
def run_kalman_calibration(config: KalmanCalibrationConfig, ctx: RunContext) -> dict:
    import jax

    from ppl_cl.data.loaders import load_mnist

    x, y = load_mnist("train", data_dir=ctx.data_dir)
    rows = {"calibrated": ("finetune", {"learn_calibration": True}),
            "uncalibrated": ("finetune", {"learn_calibration": False,
                                          "initial_calibration": 1.0})}
    labels = {"calibrated": "learned alpha (eq. 13)", "uncalibrated": "alpha = 1 (eq. 12)"}
    with jax.default_device(ctx.jax_device()):
        out = _ablation_rows(config, ctx, rows, config.chunk_size, x.astype(np.float32), y)
    summary: dict = {}
    curves: dict = {}
    for stream, res in out.items():
        for row in rows:
            r, learner = res[row]
            summary[f"online_acc_{stream}_{row}"] = float(r.correct.mean())
            summary[f"cum_logloss_{stream}_{row}"] = float(-r.log_prob.sum())
            summary[f"final_alpha_{stream}_{row}"] = learner.calibration
            curves[f"logp_{stream}_{row}"] = r.log_prob.astype(np.float32)
            curves[f"alpha_{stream}_{row}"] = learner.trajectories()["alpha"]
        summary[f"logloss_gain_{stream}"] = (summary[f"cum_logloss_{stream}_uncalibrated"]
                                            - summary[f"cum_logloss_{stream}_calibrated"])
        summary[f"n_points_{stream}"] = int(res["n_points"])
        ctx.savefig(calibration_figure({row: res[row][0].log_prob for row in rows}, labels,
                                       res["task_starts"],
                                       f"MNIST {stream}: calibration (App. E, Figs. 5-6)"),
                    f"calibration_{stream}")
    np.savez_compressed(ctx.out_dir / "curves.npz", **curves)
    return {"summary": summary}


def chunk_size_figure(sizes, accuracy: dict, labels: dict, title: str = ""):
    """Fig. 7: average online accuracy against the chunk size, one line per row;
    ``accuracy``: ``{row: [acc at each size]}``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for row, acc in accuracy.items():
        ax.plot(sizes, acc, marker="o", label=labels[row])
    ax.set_xscale("log")
    ax.set_xticks(list(sizes))
    ax.set_xticklabels([str(b) for b in sizes])
    return _labelled(fig, ax, "chunk size", "average online accuracy", title)


@register("kalman-chunk-size", KalmanChunkSizeConfig,
          quick={"n_points": 1000, "chunk_sizes": (5, 20, 100)},
          description="Kalman OCL App. F: learned gamma, fixed / fine-tuned backbone, by chunk "
                      "size (MNIST streams)")
def run_kalman_chunk_size(config: KalmanChunkSizeConfig, ctx: RunContext) -> dict:
    import jax

    from ppl_cl.data.loaders import load_mnist

    x, y = load_mnist("train", data_dir=ctx.data_dir)
    rows = {r: (r, {}) for r in config.regimes}
    labels = {"linear": "fixed backbone (linear)", "finetune": "fine-tuned backbone"}
    summary: dict = {}
    accuracy: dict = {s: {r: [] for r in rows} for s in config.streams}
    with jax.default_device(ctx.jax_device()):
        for b in config.chunk_sizes:
            out = _ablation_rows(config, ctx, rows, b, x.astype(np.float32), y)
            for stream, res in out.items():
                for row in rows:
                    r, _ = res[row]
                    summary[f"online_acc_{stream}_{row}_b{b}"] = float(r.correct.mean())
                    summary[f"cum_logloss_{stream}_{row}_b{b}"] = float(-r.log_prob.sum())
                    accuracy[stream][row].append(float(r.correct.mean()))
                summary[f"n_points_{stream}"] = int(res["n_points"])
    for stream, acc in accuracy.items():
        ctx.savefig(chunk_size_figure(config.chunk_sizes, acc, labels,
                                      f"MNIST {stream}: chunk size (App. F, Fig. 7)"),
                    f"chunk_size_{stream}")
    return {"summary": summary}
