"""The number tables of README.md and docs/*.md, written from ``results/*.json``
(:mod:`ppl_cl.results`) by ``ppl-cl tables``.

A table sits in a page between two markers that name it::

    <!-- table: vargp-table1 -->
    | ... the generated Markdown ... |
    <!-- /table -->

and :data:`TABLES` maps the name to the function that writes it from the results. A cell that
quotes a result names its experiment, entry and summary key (:class:`Val`); a missing entry
or key prints as ``—`` (not run), so a table never shows a number that no committed result
holds. ``ppl-cl tables`` rewrites every block; ``ppl-cl tables --check`` (and the test
``tests/ppl_cl/test_tables.py``) fails when a committed block differs from what the results
give, and when a Markdown table of numbers stands outside a block.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ppl_cl.provenance import REPO_ROOT
from ppl_cl.results import RESULTS_DIR, load_results

__all__ = ["TABLES", "Val", "PaperVal", "table", "render_text", "write_tables", "pages",
           "format_value", "BLOCK", "unmarked_number_tables"]

#: one generated block: ``<!-- table: NAME -->`` ... ``<!-- /table -->``
BLOCK = re.compile(r"(<!-- table: (?P<name>[a-z0-9_.-]+) -->\n)(?P<body>.*?)(<!-- /table -->)",
                   re.S)

Results = dict[str, dict[str, Any]]
#: the speed benchmarks' JSON files (``benchmarks/*.py``)
BENCH_DIR = REPO_ROOT / "benchmarks" / "results"


def _digits(x: float, decimals: int) -> str:
    return f"{x:.{decimals}f}"


def format_value(v: Any, decimals: int = 2, scale: float = 1.0, spread: bool = True) -> str:
    """A summary value as a cell: a number with ``decimals`` decimals; an aggregate
    ``{"mean", "std", "n"}`` as ``mean ± std`` when ``n > 1`` (std with ddof = 1, the spread
    over seeds) and ``spread``, else the mean; ``—`` for None or NaN."""
    if isinstance(v, dict) and "mean" in v:
        mean, std, n = v["mean"], v.get("std", 0.0), v.get("n", 1)
        if mean is None or (isinstance(mean, float) and math.isnan(mean)):
            return "—"
        text = _digits(scale * mean, decimals)
        if spread and n and n > 1:
            text += f" ± {_digits(scale * std, decimals)}"
        return text
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return "—" if v is None else str(v)
    if isinstance(v, float) and math.isnan(v):
        return "—"
    if isinstance(v, int) and decimals == 0:
        return str(int(scale * v))
    return _digits(scale * v, decimals)


@dataclass(frozen=True)
class Val:
    """A cell quoting ``results/<experiment>.json``, entry ``entry``, summary key ``key``."""

    experiment: str
    entry: str
    key: str
    decimals: int = 2
    scale: float = 1.0
    spread: bool = True

    def render(self, results: Results) -> str:
        e = results.get(self.experiment, {}).get(self.entry)
        if e is None:
            return "—"
        return format_value(e["summary"].get(self.key), self.decimals, self.scale, self.spread)


@dataclass(frozen=True)
class PaperVal:
    """A cell with the paper's number of ``key`` as the experiment registers it
    (``PaperNumber``, printed with its own digits)."""

    experiment: str
    key: str

    def render(self, results: Results) -> str:
        from ppl_cl.experiments import registry

        ref = registry()[self.experiment].paper.get(self.key)
        return "—" if ref is None else ref.format()


@dataclass(frozen=True)
class Seeds:
    """A cell with the seeds of an entry (``0, 1, 2``), ``—`` when the entry is missing."""

    experiment: str
    entry: str

    def render(self, results: Results) -> str:
        e = results.get(self.experiment, {}).get(self.entry)
        return "—" if e is None else ", ".join(map(str, e["seeds"]))


@dataclass(frozen=True)
class Bench:
    """A cell quoting ``benchmarks/results/<benchmark>.json`` at the key path ``path`` (a
    dotted path of dict keys; ``—`` when absent): speed figures, written whole by their
    scripts."""

    benchmark: str
    path: str
    decimals: int = 2
    scale: float = 1.0

    def render(self, results: Results) -> str:
        import json

        f = BENCH_DIR / f"{self.benchmark}.json"
        if not f.exists():
            return "—"
        node: Any = json.loads(f.read_text())
        for part in self.path.split("."):
            if not isinstance(node, dict) or part not in node:
                return "—"
            node = node[part]
        return format_value(node, self.decimals, self.scale)


@dataclass(frozen=True)
class PM:
    """``value ± error`` from two summary keys (e.g. a mean over seeds a run computed itself
    and its standard error); ``—`` when the entry or the value is missing."""

    experiment: str
    entry: str
    key: str
    error_key: str
    decimals: int = 2

    def render(self, results: Results) -> str:
        e = results.get(self.experiment, {}).get(self.entry)
        if e is None or self.key not in e["summary"]:
            return "—"
        text = format_value(e["summary"][self.key], self.decimals, spread=False)
        err = e["summary"].get(self.error_key)
        if err is not None and text != "—":
            text += " ± " + format_value(err, self.decimals, spread=False)
        return text


@dataclass(frozen=True)
class Join:
    """Several cells in one, joined by ``sep`` (``ours / quick / paper``)."""

    parts: tuple
    sep: str = " / "

    def render(self, results: Results) -> str:
        return self.sep.join(p if isinstance(p, str) else p.render(results) for p in self.parts)


Cell = str | Val | PaperVal | Seeds | Bench | PM | Join


def table(header: Sequence[str], rows: Sequence[Sequence[Cell]], results: Results) -> str:
    """A Markdown table (one header row) with the cells rendered from ``results``."""
    def cell(c: Cell) -> str:
        return c if isinstance(c, str) else c.render(results)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the tables
# ---------------------------------------------------------------------------------------------
_VARGP_ROWS = (("var_gp", "VAR-GP"), ("block_diag", "+ Block Diag."),
               ("mle_hypers", "+ MLE Hypers"), ("global", "+ Global"))


def _vargp_key(row: str, name: str = "final_avg_accuracy") -> str:
    return name + ("" if row == "var_gp" else f"_{row}")


def vargp_table1(results: Results, experiment: str = "vargp-split-mnist") -> str:
    """Table 1 (one stream): final average accuracy (%) per row at the paper's protocol
    (entry = the row, one run per seed), the quick preset (entry ``quick``) and the paper."""
    rows = []
    for row, label in _VARGP_ROWS:
        rows.append([label, Val(experiment, row, _vargp_key(row)), Seeds(experiment, row),
                     Val(experiment, "quick", _vargp_key(row), spread=False),
                     PaperVal(experiment, _vargp_key(row))])
    return table(["row", "ours, paper's protocol", "seeds", "ours, --quick", "paper"], rows,
                 results)


def vargp_tasks(results: Results, experiment: str = "vargp-split-mnist") -> str:
    """Average test accuracy (%) after each task, per row, at the paper's protocol (seed
    mean), with the epochs each row trained in all."""
    rows = []
    for row, label in _VARGP_ROWS:
        e = results.get(experiment, {}).get(row)
        curve = None if e is None else e["summary"].get(_vargp_key(row, "average_accuracy"))
        if isinstance(curve, dict):
            curve = curve.get("mean")
        cells: list[Cell] = [label]
        for t in range(5):
            cells.append("—" if not curve or t >= len(curve) else f"{curve[t]:.2f}")
        cells.append(Val(experiment, row, "epochs_total" if row == "var_gp"
                         else f"epochs_total_{row}", decimals=0, spread=False))
        rows.append(cells)
    return table(["row", "t = 1", "2", "3", "4", "5", "epochs"], rows, results)


def vargp_small(results: Results) -> str:
    """The settings that are not the paper's protocol (the data-scaled start of q(theta)):
    final average accuracy (%) per row on the 8x8 digits and at the quick presets."""
    runs = (("vargp-split-digits", "default", "split digits (1797 images)"),
            ("vargp-split-digits", "quick", "split digits, --quick"),
            ("vargp-split-mnist", "quick", "Split MNIST, --quick (200 images per task)"),
            ("vargp-permuted-mnist", "quick", "Permuted MNIST, --quick (3 tasks)"))
    rows = [[label] + [Val(exp, entry, _vargp_key(row), spread=False)
                       for row, _ in _VARGP_ROWS] for exp, entry, label in runs]
    return table(["stream", *(label for _, label in _VARGP_ROWS)], rows, results)


def vargp_toy(results: Results) -> str:
    """The 2-D toy (Fig. 1 / 7): accuracy (%) on task 0's and task 1's test points after
    task 1, per row, at the authors' setting and the quick preset."""
    rows = []
    for row, label in _VARGP_ROWS:
        suffix = "" if row == "var_gp" else f"_{row}"
        rows.append([label] + [Val("vargp-toy", entry, f"task{j}_acc_after_task1{suffix}",
                                   spread=False)
                               for entry in ("default", "quick") for j in (0, 1)])
    return table(["row", "task 0 (5000 epochs)", "task 1 (5000 epochs)", "task 0 (--quick)",
                  "task 1 (--quick)"], rows, results)


def vargp_speed(results: Results) -> str:
    """``benchmarks/vargp.py``: seconds per ELBO step at task t beside one task of the same
    total M (a plain SVGP of the same code), seconds per epoch, the step's FLOPs and the share
    of the machine's matrix-product rate it reaches."""
    rows = []
    for t in range(1, 6):
        base = f"runs.cpu.per_task.{t}"
        rows.append([f"{t} ({60 * t})", Bench("vargp", f"{base}.vargp_step_s", 3),
                     Bench("vargp", f"{base}.own_svgp_step_s", 3),
                     Bench("vargp", f"{base}.ratio_ar_vs_own_svgp", 2),
                     Bench("vargp", f"{base}.vargp_epoch_s", 2),
                     Bench("vargp", f"{base}.flops_per_step.total", 1, 1e-9),
                     Bench("vargp", f"{base}.fraction_of_matmul_rate", 0, 100.0)])
    return table(["t (M total)", "VAR-GP s / step", "plain SVGP s / step", "ratio",
                  "VAR-GP s / epoch", "GFLOP / step", "% of matmul rate"], rows, results)


def vargp_experiment_epoch(results: Results) -> str:
    """``benchmarks/vargp.py``: task 1 of the Split MNIST experiment (its stream, validation
    and loop) per epoch against its training steps alone (target at most 1.2)."""
    base = "runs.cpu.experiment_task1"
    return table(["epochs timed", "experiment s / epoch", "its steps alone s / epoch", "ratio",
                  "matmul GFLOP/s"],
                 [[Bench("vargp", f"{base}.epochs", 0), Bench("vargp", f"{base}.seconds_per_epoch", 2),
                   Bench("vargp", f"{base}.steps_alone_per_epoch_s", 2),
                   Bench("vargp", f"{base}.ratio_to_steps_alone", 2),
                   Bench("vargp", "runs.cpu.matmul_flops_per_s", 1, 1e-9)]], results)


_GPTREE_METHODS = (("gptree", "GP-Tree"), ("sbm", "SBM-GP"), ("lsm", "LSM"), ("ove", "OVE"),
                   ("gptree_rnd", "GP-Tree Rnd."))


def readme_gptree(results: Results) -> str:
    """``gptree-classes``: accuracy (%) ± SEM over seeds per method and number of classes,
    App. C.1's grid (entry ``grid``) / one fixed RBF kernel (``default``) / the paper (letter)."""
    exp = "gptree-classes"
    rows = []
    for m, label in _GPTREE_METHODS:
        rows.append([label] + [Join((PM(exp, "grid", f"acc_{m}_{C}", f"sem_{m}_{C}"),
                                     PM(exp, "default", f"acc_{m}_{C}", f"sem_{m}_{C}"),
                                     PaperVal(exp, f"acc_{m}_{C}"))) for C in (4, 10, 20)])
    return table(["method", "4 classes: grid / fixed kernel / paper", "10 classes", "20 classes"],
                 rows, results)


_VIPS_DATASETS = ("concrete", "skillcraft", "kin8nm", "elevators", "bike")
def _t1_entry(results: Results, dataset: str, method: str = "vips") -> str:
    """The protocol entry of ``vips-table1`` that holds ``method`` on ``dataset``: ``default``
    when it does, else the first other full (not ``--quick``) entry whose summary has the row
    (``ppl-cl report`` keeps one override set per entry, so the datasets and methods of the
    protocol may be saved as several runs, each under its own label); ``default`` when none
    has."""
    entries = results.get("vips-table1", {})
    key = f"{dataset}_rmse_{method}"
    for label, entry in sorted(entries.items(), key=lambda kv: kv[0] != "default"):
        if not (entry or {}).get("quick") and key in (entry or {}).get("summary", {}):
            return label
    return "default"


def vips_fig2a(results: Results) -> str:
    """``vips-speed-accuracy`` (Fig. 2a): VIPS's M and RMSE after each batch, and
    ``exact-gp-synthetic``'s exact GP refitted on the batches seen: ours (full) / ours (quick)
    / the paper (read off the figure)."""
    fig, ex = "vips-speed-accuracy", "exact-gp-synthetic"
    rows = [[name] + [Join((Val(fig, "default", f"{q}_vips_batch{i}", dec, spread=False),
                            Val(fig, "quick", f"{q}_vips_batch{i}", dec, spread=False),
                            PaperVal(fig, f"{q}_vips_batch{i}"))) for i in range(1, 5)]
            for q, name, dec in (("m", "M", 0), ("rmse", "RMSE", 2))]
    rows.append(["RMSE, exact GP (`exact-gp-synthetic`)"]
                + [Join((Val(ex, "default", f"rmse_batch{i}", 2, spread=False),
                         Val(ex, "quick", f"rmse_batch{i}", 2, spread=False),
                         PaperVal(ex, f"rmse_batch{i}"))) for i in range(1, 5)])
    return table(["Fig. 2a: ours / quick / paper", *(f"batch {i}" for i in range(1, 5))], rows,
                 results)


def readme_vips(results: Results) -> str:
    """``vips-table1``: VIPS's final M, RMSE and NLPD per dataset (mean ± std over folds):
    ours (full) / ours (quick) / paper."""
    t1 = "vips-table1"
    rows = [[d] + [Join((PM(t1, _t1_entry(results, d), f"{d}_{k}_vips", f"{d}_{k}_vips_std", dec),
                         Val(t1, "quick", f"{d}_{k}_vips", dec, spread=False),
                         PaperVal(t1, f"{d}_{k}_vips")))
                   for k, dec in (("m", 0), ("rmse", 3), ("nlpd", 3))] for d in _VIPS_DATASETS]
    return table(["Table 1, VIPS", "M: ours / quick / paper", "RMSE", "NLPD"], rows, results)


_GPELLA_SETS = (("gpella-synthetic", "default", "synthetic"),
                ("gpella-robot-arm", "default", "robot arm"),
                ("gpella-schools", "default", "schools"),
                ("gpella-parkinsons", "default", "Parkinson's motor"),
                ("gpella-parkinsons", "total", "Parkinson's total"))
_GPELLA_METHODS = (("gp_ella", "GP-ELLA"), ("gp_ella_no_smoothing", "GP-ELLA, no smoothing"),
                   ("individual", "individual GPs"), ("ella", "ELLA"), ("shared", "shared GP"),
                   ("mtgp", "MTGP (rank 1)"))
_GPELLA_WINS = ("individual", "shared", "mtgp", "ella")


def readme_gpella(results: Results) -> str:
    """``gpella-*`` at the paper's protocol: rMSE ± s.e. over runs per method and dataset, the
    runs in which GP-ELLA beats each baseline (individual GPs / shared GP / MTGP rank 1 /
    ELLA, of the runs) and the time ratio to individual GPs beside the paper's."""
    rows = [[label] + [PM(exp, entry, f"rmse_{m}", f"rmse_{m}_se", 3)
                       for exp, entry, _ in _GPELLA_SETS] for m, label in _GPELLA_METHODS]
    rows.append(["GP-ELLA wins: indiv. / shared / MTGP / ELLA, of runs"] + [
        Join((Join(tuple(Val(exp, entry, f"gp_ella_beats_{b}_runs", 0, spread=False)
                         for b in _GPELLA_WINS)), " of ",
              Val(exp, entry, "n_runs", 0, spread=False)), "")
        for exp, entry, _ in _GPELLA_SETS])
    rows.append(["time ratio GP-ELLA / individual (paper)"] + [
        Join((Val(exp, entry, "time_ratio_vs_individual", spread=False), " (",
              PaperVal(exp, "time_ratio_vs_individual" + ("" if entry == "default"
                                                          else f"_{entry}")), ")"), "")
        for exp, entry, _ in _GPELLA_SETS])
    return table(["rMSE", *(name for _, _, name in _GPELLA_SETS)], rows, results)


def readme_kalman_exact(results: Results) -> str:
    """``kalman-timeseries``: accumulated average log predictive, learned against fixed gamma;
    ``exact-gp-uci`` (concrete): RMSE / NLPD, quick and full, beside VIPS Table 1's exact GP."""
    ts, ex = "kalman-timeseries", "exact-gp-uci"
    rows = [["Kalman OCL, time series: avg. log predictive, learned / fixed gamma = 1",
             Join((Val(ts, "default", "avg_log_pred_learned", 3, spread=False),
                   Val(ts, "default", "avg_log_pred_fixed", 3, spread=False))),
             "learned above fixed (Fig. 1, no number)"],
            *[[f"exact GP, concrete split 0: RMSE / NLPD ({label})",
               Join((Val(ex, entry, "rmse", 3, spread=False),
                     Val(ex, entry, "nlpd", 3, spread=False))),
               Join((PaperVal(ex, "rmse"), "—"))]
              for entry, label in (("default", "full"), ("quick", "--quick"))]]
    return table(["quantity", "ours", "paper"], rows, results)


def claims(results: Results) -> str:
    """Every registered claim checked on every committed entry (``holds`` / ``does not hold``
    / ``not measured`` when an entry lacks a key of the claim)."""
    verdict = {True: "holds", False: "does not hold", None: "not measured"}
    rows = []
    for exp in sorted(results):
        for label, e in sorted(results[exp].items()):
            for c in e.get("claims", []):
                rows.append([f"`{exp}` ({label})", c["text"], verdict[c["holds"]]])
    if not rows:
        rows = [["—", "no committed result carries a claim", "—"]]
    return table(["experiment (entry)", "claim", "here"], rows, results)


def readme_losses(results: Results) -> str:
    """One row per committed entry with a claim that does not hold; an experiment with a
    checked entry beyond ``--quick`` shows only those (every entry: the ``claims`` table)."""
    rows = []
    for exp in sorted(results):
        entries = sorted(results[exp].items())
        full = [(label, e) for label, e in entries if not e.get("quick") and e.get("claims")]
        for label, e in full or entries:
            lost = [c["text"] for c in e.get("claims", []) if c["holds"] is False]
            if lost:
                rows.append([f"`{exp}` ({label})", "; ".join(lost)])
    if not rows:
        rows = [["—", "every checked claim holds"]]
    return table(["experiment (entry)", "claims that do not hold here"], rows, results)


def _summary(results: Results, experiment: str, entry: str) -> dict[str, Any] | None:
    """An entry's summary with every aggregate replaced by its mean (None if absent)."""
    e = results.get(experiment, {}).get(entry)
    if e is None:
        return None
    return {k: (v["mean"] if isinstance(v, dict) and "mean" in v else v)
            for k, v in e["summary"].items()}


_KALMAN_ROWS = (("fixed random features", "linear"), ("fine-tuned", "finetune"),
                ("fine-tuned + replay", "replay"))
_KALMAN_GAMMAS = (("1", "gamma1"), ("0.999", "fixed"), ("learned", "learned"))


def _kalman_cell(s: dict | None, stream: str, row: str) -> str:
    if s is None or f"online_acc_{stream}_{row}" not in s:
        return "—"
    return f"{s[f'online_acc_{stream}_{row}']:.3f} / {s[f'cum_logloss_{stream}_{row}']:.0f}"


def _kalman_steps(s: dict | None, stream: str, row: str) -> str:
    """The searched step sizes of a row (beta only where fine-tuned, rho where learned)."""
    if s is None:
        return "—"
    keys = [("learning_rate", "eta")]
    if not row.endswith("linear") and not row.startswith("sgd"):
        keys.append(("backbone_scale", "beta"))
    if row.startswith("learned"):
        keys.append(("forgetting_learning_rate", "rho"))
    got = [f"{name} {s[f'{k}_{stream}_{row}']:g}" for k, name in keys
           if f"{k}_{stream}_{row}" in s]
    return ", ".join(got) or "—"


def _kalman_online(results: Results, entry: str, experiment: str = "kalman-online-mnist"
                   ) -> str:
    """Table 1's rows on the two MNIST streams: average online accuracy / cumulative log-loss
    and the step sizes the held-out search chose."""
    s = _summary(results, experiment, entry)
    n = {st: (None if s is None else s.get(f"n_points_{st}"))
         for st in ("stationary", "nonstationary")}

    def pts(st: str) -> str:
        return "—" if n[st] is None else f"{int(n[st])} points"

    rows = []
    for label, regime in _KALMAN_ROWS:
        for i, (g, variant) in enumerate(_KALMAN_GAMMAS):
            row = f"{variant}_{regime}"
            rows.append([label if i == 0 else "", g,
                         _kalman_cell(s, "stationary", row), _kalman_steps(s, "stationary", row),
                         _kalman_cell(s, "nonstationary", row),
                         _kalman_steps(s, "nonstationary", row)])
    for label, row in (("online SGD", "sgd"), ("online SGD + replay", "sgd_replay")):
        rows.append([label, "—", _kalman_cell(s, "stationary", row),
                     _kalman_steps(s, "stationary", row), _kalman_cell(s, "nonstationary", row),
                     _kalman_steps(s, "nonstationary", row)])
    return table(["representation", "gamma", f"stationary ({pts('stationary')})",
                  "chosen steps", f"non-stationary ({pts('nonstationary')})", "chosen steps"],
                 rows, results)


def kalman_online(results: Results) -> str:
    return _kalman_online(results, "default")


def kalman_online_quick(results: Results) -> str:
    return _kalman_online(results, "quick")


def kalman_calibration(results: Results) -> str:
    """App. E: alpha learned against alpha = 1, per stream (full / quick entries)."""
    rows = []
    for entry in ("default", "quick"):
        s = _summary(results, "kalman-calibration", entry)
        for st in ("stationary", "nonstationary"):
            if s is None or f"online_acc_{st}_calibrated" not in s:
                rows.append([entry, st, "—", "—", "—"])
                continue
            rows.append([entry, st, f"{_kalman_cell(s, st, 'calibrated')} "
                         f"({s[f'final_alpha_{st}_calibrated']:.2f})",
                         _kalman_cell(s, st, "uncalibrated"), f"{s[f'logloss_gain_{st}']:.0f}"])
    return table(["entry", "stream", "alpha learned: accuracy / log-loss (final alpha)",
                  "alpha = 1", "log-loss gain"], rows, results)


def kalman_chunk_size(results: Results) -> str:
    """App. F: average online accuracy per chunk size b (full / quick entries)."""
    rows, sizes = [], set()
    entries = {e: _summary(results, "kalman-chunk-size", e) for e in ("default", "quick")}
    for s in entries.values():
        if s is not None:
            sizes |= {int(k.rsplit("_b", 1)[1]) for k in s if k.startswith("online_acc_")}
    sizes = sorted(sizes) or [5, 10, 20, 50, 100]
    for entry, s in entries.items():
        for st in ("stationary", "nonstationary"):
            for reg, label in (("linear", "fixed"), ("finetune", "fine-tuned")):
                cells = [None if s is None else s.get(f"online_acc_{st}_{reg}_b{b}")
                         for b in sizes]
                if s is not None and all(c is None for c in cells):
                    continue
                rows.append([entry, st, label] + ["—" if c is None else f"{c:.3f}"
                                                  for c in cells])
    return table(["entry", "stream", "backbone", *(f"b = {b}" for b in sizes)], rows, results)


def kalman_timeseries(results: Results) -> str:
    """App. C / Fig. 1: accumulated average log predictive at the end of the series."""
    exp = "kalman-timeseries"
    rows = [["accumulated average log predictive",
             Val(exp, "default", "avg_log_pred_learned", 3, spread=False),
             Val(exp, "default", "avg_log_pred_fixed", 3, spread=False)],
            ["minimum of the learned gamma",
             Val(exp, "default", "min_gamma_learned", 3, spread=False), "—"],
            ["points", Val(exp, "default", "n_points", 0, spread=False), ""]]
    return table(["", "learned gamma", "fixed gamma = 1"], rows, results)


def _bench(name: str) -> dict | None:
    import json

    f = BENCH_DIR / f"{name}.json"
    return json.loads(f.read_text()) if f.exists() else None


def kalman_speed(results: Results) -> str:
    """``benchmarks/kalman.py``: points per second per task, state size m and method."""
    data = _bench("kalman")
    if data is None:
        return table(["task", "m", "method", "points / s"], [["—", "—", "—", "—"]], results)
    methods = list(dict.fromkeys(r["method"] for r in data["rows"]))
    keys = list(dict.fromkeys((r["task"], r["m"]) for r in data["rows"]))
    by = {(r["task"], r["m"], r["method"]): r for r in data["rows"]}
    rows = []
    for task, m in keys:
        rows.append([task, str(m)] + [
            f"{by[(task, m, meth)]['points_per_s']:,.0f}" if (task, m, meth) in by else "—"
            for meth in methods])
    return table(["task", "m", *methods], rows, results)


def _compare_table(stream: str, entry: str) -> Callable[[Results], str]:
    """``compare-<stream>``: one row per learner that ran, one column per metric of the
    stream's kind (``ppl_cl.experiments.compare.METRICS``), mean ± std over seeds."""
    def render(results: Results) -> str:
        from ppl_cl.experiments.compare import COMPARE_LEARNERS, METRICS

        def _key(metric: str, learner: str) -> str:      # compare's summary keys
            return f"{metric}_{learner.replace('-', '_')}"

        exp = f"compare-{stream}"
        e = results.get(exp, {}).get(entry)
        kind = "regression" if any(k.startswith("rmse_") for k in (e or {}).get("summary", {})) \
            else "classification"
        cols = METRICS[kind]
        names = [n for n in COMPARE_LEARNERS if e is not None and any(
            _key(m, n) in e["summary"] for m, _, _ in cols)]
        rows = []
        for n in names:
            rows.append([f"{COMPARE_LEARNERS[n].label} (`{n}`)"] + [
                Val(exp, entry, _key(m, n), _decimals(fmt)) for m, _, fmt in cols])
        if not rows:
            rows = [["—"] + ["—"] * len(cols)]
        return table(["learner", *(title for _, title, _ in cols)], rows, results)

    render.__doc__ = f"``compare-{stream}``, entry ``{entry}``: one row per learner."
    return render


def _decimals(fmt: str) -> int:
    m = re.search(r"\.(\d)f", fmt)
    return int(m.group(1)) if m else 2


def _gptree_classes(entry: str) -> Callable[[Results], str]:
    def render(results: Results) -> str:
        from ppl_cl.experiments.gp_tree import METHOD_LABELS

        exp = "gptree-classes"
        e = results.get(exp, {}).get(entry)
        keys = [] if e is None else [k for k in e["summary"] if k.startswith("acc_")]
        counts = sorted({int(k.rsplit("_", 1)[1]) for k in keys}) or [4, 10, 20]
        methods = list(dict.fromkeys(k[4:].rsplit("_", 1)[0] for k in keys)) or ["gptree"]
        labels = dict(METHOD_LABELS, **{f"gptree_chains{k}": f"GP-Tree, {k} chains"
                                        for k in range(1, 64)})
        rows = [[labels.get(m, m)] + [PM(exp, entry, f"acc_{m}_{C}", f"sem_{m}_{C}")
                                      for C in counts] for m in methods]
        return table(["method", *(f"{C} classes" for C in counts)], rows, results)

    render.__doc__ = (f"``gptree-classes`` ({entry}): test accuracy (%) ± SEM over seeds per "
                      "method and class count.")
    return render


def _gptree_fscil(entry: str) -> Callable[[Results], str]:
    def render(results: Results) -> str:
        from ppl_cl.experiments.gp_tree import FSCIL_LABELS, FSCIL_TAGS

        labels = {FSCIL_TAGS[v]: name for v, name in FSCIL_LABELS.items()}
        exp = "gptree-fscil"
        e = results.get(exp, {}).get(entry)
        keys = [] if e is None else list(e["summary"])
        tags = [m.group(1) for k in keys if (m := re.fullmatch(r"acc_(.+)_final", k))]
        sessions = sorted({int(m.group(1)) for k in keys
                           if (m := re.fullmatch(r"acc_.+_session(\d+)", k))})
        rows = [[labels.get(t, t)] + [Val(exp, entry, f"acc_{t}_session{s}", spread=False)
                                      for s in sessions]
                + [PM(exp, entry, f"acc_{t}_final", f"sem_{t}_final"),
                   Val(exp, entry, f"forgetting_{t}", spread=False)] for t in tags]
        if not rows:
            rows = [["—", "—", "—"]]
        return table(["method", *(f"session {s}" for s in sessions), "last ± SEM",
                      "forgetting"], rows, results)

    render.__doc__ = f"``gptree-fscil`` ({entry}): accuracy (%) on all classes seen per session."
    return render


def gptree_dkl(results: Results) -> str:
    """``gptree-dkl-mnist``: test accuracy (%) of GP-Tree with DKL and the softmax network on
    the same backbone (full / quick), beside the paper's CIFAR-10 numbers."""
    exp = "gptree-dkl-mnist"
    rows = [[label, Val(exp, "default", key, spread=False), Val(exp, "quick", key, spread=False),
             PaperVal(exp, key)] for key, label in (("acc_gptree", "GP-Tree (DKL)"),
                                                    ("acc_softmax", "softmax network"))]
    return table(["method", "ours, MNIST", "ours, --quick", "paper (CIFAR-10)"], rows, results)


def gptree_speed(results: Results) -> str:
    """``benchmarks/gp_tree.py``: PG(1, z) draws per second (ours float64 / float32 against
    ``polyagamma``) and Gibbs sweeps per second of a 30-chain node (ours, the reference PG
    scheme, the reference code's own sweep), wall clock and CPU time."""
    data = _bench("gp_tree") or {}

    def num(v, d=2):
        return "—" if v is None else f"{v:,.{d}f}"

    rows = []
    for r in data.get("pg_draws", []):
        rows.append([f"PG draws / s, z: {r.get('z')}",
                     f"{num(r.get('ours_float64_draws_per_s'), 0)} / "
                     f"{num(r.get('ours_float32_draws_per_s'), 0)}",
                     num(r.get("polyagamma_draws_per_s"), 0),
                     f"{num(r.get('ours_float64_over_polyagamma'))} / "
                     f"{num(r.get('ours_float32_over_polyagamma'))}"])
    for r in data.get("gibbs_sweeps", []):
        for clock, suffix in (("wall", ""), ("CPU", "_cpu")):
            ours = r.get(f"ours_sweeps_per_s{suffix}")
            ref = r.get(f"reference_pg_scheme_sweeps_per_s{suffix}")
            code = r.get(f"reference_code_sweeps_per_s{suffix}")
            rows.append([f"Gibbs sweeps / s, {r.get('node_size')} points, {r.get('chains')} "
                         f"chains ({clock})", num(ours), f"{num(ref)} / {num(code)}",
                         f"{num(None if not (ours and ref) else ours / ref)} / "
                         f"{num(None if not (ours and code) else ours / code)}"])
    if not rows:
        rows = [["—", "—", "—", "—"]]
    return table(["what", "ours (f64 / f32 for draws)",
                  "peer: polyagamma, or reference PG scheme / reference code",
                  "ratio ours / peer"], rows, results)


_GPELLA_ORDER = ("gp_ella", "gp_ella_no_smoothing", "individual", "individual_smoothed",
                 "shared", "mtgp", "mtgp_rank2", "ella")


def _gpella_table(entry_kind: str) -> Callable[[Results], str]:
    def render(results: Results) -> str:
        sets = [(exp, (entry if entry_kind == "default" else
                       ("quick" if entry == "default" else f"{entry}-quick")), name)
                for exp, entry, name in _GPELLA_SETS]
        methods: list[str] = []
        for exp, entry, _ in sets:
            e = results.get(exp, {}).get(entry)
            for k in (e or {}).get("summary", {}):
                if k.startswith("rmse_") and not k.endswith("_se") and k[5:] not in methods:
                    methods.append(k[5:])
        methods = sorted(methods, key=lambda m: (_GPELLA_ORDER.index(m) if m in _GPELLA_ORDER
                                                 else len(_GPELLA_ORDER), m)) or ["gp_ella"]
        rows = []
        for exp, entry, name in sets:
            summary = (results.get(exp, {}).get(entry) or {}).get("summary", {})
            n_runs = summary.get("n_runs", {})
            n_runs = n_runs.get("mean") if isinstance(n_runs, dict) else n_runs
            one_run = n_runs == 1                             # no standard error to show
            rows.append([name] + [Val(exp, entry, f"rmse_{m}", 3, spread=False) if one_run
                                  else PM(exp, entry, f"rmse_{m}", f"rmse_{m}_se", 3)
                                  for m in methods]
                        + [Join((Val(exp, entry, "gp_ella_beats_individual_runs", 0,
                                     spread=False),
                                 Val(exp, entry, "gp_ella_beats_ella_runs", 0, spread=False))),
                           Val(exp, entry, "time_ratio_vs_individual", spread=False)])
        return table(["data", *methods, "wins vs individual / ELLA", "time ratio"], rows,
                     results)

    render.__doc__ = (f"``gpella-*`` ({entry_kind}): rMSE ± s.e. over runs of every method in "
                      "the summaries, the wins counts and the time ratio to individual GPs.")
    return render


def gpella_diagnostics(results: Results) -> str:
    """``gpella-*`` at the protocol: how many tasks the prediction smoothing averages (the
    effective number ``1 / sum w^2``, mean over target tasks and runs) for GP-ELLA and for
    individual GPs given the same smoothing, and the fit diagnostics of the runs: fractions of
    per-task fits that converged, of Hessians with negative curvature, of reconstructed theta
    entries clipped, of fitted theta entries at the fit's box."""
    keys = (("n_eff_gp_ella", 1), ("n_eff_individual_smoothed", 1),
            ("fit_converged_fraction", 3), ("hessian_negative_fraction", 3),
            ("theta_clipped_fraction", 3), ("fitted_theta_at_bound_fraction", 3))
    rows = [[name, Val(exp, entry, "n_tasks", 0, spread=False)]
            + [Val(exp, entry, k, dec, spread=False) for k, dec in keys]
            for exp, entry, name in _GPELLA_SETS]
    return table(["data", "tasks", "effective tasks, GP-ELLA",
                  "effective tasks, indiv. + smoothing", "fits converged", "H negative",
                  "theta clipped", "theta at bound"], rows, results)


def gpella_speed(results: Results) -> str:
    """``benchmarks/gp_ella.py``: seconds per task, GP-ELLA against individual GPs in the same
    process on the same tasks."""
    data = _bench("gp_ella") or {}
    rows = []
    for r in data.get("rows", []):
        sec = r.get("seconds", {})
        ind = sec.get("individual", {}).get("update_s_per_task")
        for variant, label in (("gp_ella_closed_form", "App. A Hessian"),
                               ("gp_ella_autodiff", "autodiff Hessian")):
            g = sec.get(variant)
            if g is None:
                continue
            rows.append([f"{r.get('dataset')} ({r.get('tasks')} tasks, d = "
                         f"{r.get('input_dim')})", label, format_value(ind, 4),
                         format_value(g.get("update_s_per_task"), 4),
                         format_value(r.get(f"ratio_update_{variant}"), 2),
                         format_value(r.get(f"ratio_update_predict_{variant}"), 2)])
    if not rows:
        rows = [["—"] * 6]
    return table(["data", "GP-ELLA's Hessian", "individual GPs learn (s / task)",
                  "GP-ELLA learn (s / task)", "ratio learn", "ratio learn + predict"], rows,
                 results)


_VIPS_METHODS = (("exact", "exact GP"), ("cv", "Conditional Variance"), ("oips", "OIPS"),
                 ("vips", "VIPS"))


def vips_table1(results: Results) -> str:
    """``vips-table1``: final M, RMSE and NLPD per dataset and method, mean ± std over the
    folds run (the entry that holds each row: ``_t1_entry``), beside the paper's
    Table 1 (which gives M and RMSE)."""
    t1 = "vips-table1"
    rows = []
    for d in _VIPS_DATASETS:
        for m, label in _VIPS_METHODS:
            e = _t1_entry(results, d, m)
            rows.append([d, label] + [
                Join((PM(t1, e, f"{d}_{k}_{m}", f"{d}_{k}_{m}_std", dec),
                      PaperVal(t1, f"{d}_{k}_{m}")), " (") if k != "nlpd"
                else PM(t1, e, f"{d}_{k}_{m}", f"{d}_{k}_{m}_std", dec)
                for k, dec in (("m", 0), ("rmse", 3), ("nlpd", 3))]
                + [Val(t1, e, f"{d}_folds_run", 0, spread=False)])
    md = table(["dataset", "method", "M (paper)", "RMSE (paper)", "NLPD", "folds"], rows,
               results)
    return "\n".join(_close_parens(line) for line in md.splitlines())


def _close_parens(line: str) -> str:
    if not line.startswith("|") or "(" not in line:
        return line
    cells = line.strip("|").split("|")
    return "|" + "|".join(c.rstrip() + ") " if c.count("(") > c.count(")") else c
                          for c in cells) + "|"


def vips_synthetic(results: Results) -> str:
    """``vips-synthetic`` (Fig. 1): the final M of VIPS on D1 (growing input space), D2
    (stationary) and D3 (late outliers), full size and quick."""
    exp = "vips-synthetic"
    rows = [[name, Val(exp, "default", f"final_m_{name.lower()}", 0, spread=False),
             Val(exp, "quick", f"final_m_{name.lower()}", 0, spread=False), paper]
            for name, paper in (("D1", "grows linearly"), ("D2", "levels off"),
                                ("D3", "flat, jumps at the outliers"))]
    return table(["set", "final M", "final M (--quick)", "paper (Fig. 1)"], rows, results)


def vips_uci_authors(results: Results) -> str:
    """``vips-uci`` (entry ``reference-order``: concrete, VIPS, 5 folds in the authors' stream
    order) beside the authors' code on the same stream and machine
    (``AUTHORS_CODE_CONCRETE``): M and RMSE (mean ± std over folds) and the whole run's seconds
    from a cold compilation cache."""
    import numpy as np

    from ppl_cl.experiments.vips import AUTHORS_CODE_CONCRETE as ref

    exp, entry = "vips-uci", "reference-order"
    e = results.get(exp, {}).get(entry)
    seconds = sum(r["wall_time_s"] for r in e["runs"]) if e else None
    ours = [PM(exp, entry, "m_vips", "m_vips_std", 1), PM(exp, entry, "rmse_vips", "rmse_vips_std", 4),
            "—" if seconds is None else f"{seconds:.1f}"]
    theirs = [f"{np.mean(ref['m']):.1f} ± {np.std(ref['m']):.1f}",
              f"{np.mean(ref['rmse']):.4f} ± {np.std(ref['rmse']):.4f}", f"{ref['seconds']:.1f}"]
    ratio = "—" if seconds is None else f"{ref['seconds'] / seconds:.2f}"
    return table(["concrete, VIPS, 5 folds x 20 batches", "M", "RMSE", "seconds (cold)"],
                 [["ours (`--set sort=numpy`)", *ours], ["the authors' code", *theirs],
                  ["authors' seconds / ours", "", "", ratio]], results)


def vips_magnetic(results: Results) -> str:
    """``vips-magnetic`` (Fig. 4): M and RMSE on path 3 after each learned path, and the
    20-batch stream of path 3 by VIPS and Conditional Variance (entry ``default``)."""
    exp = "vips-magnetic"
    e = results.get(exp, {}).get("default")
    keys = [] if e is None else list(e["summary"])
    paths = sorted({int(k.rsplit("path", 1)[1]) for k in keys if k.startswith("seq_m_after_path")})
    rows = [[f"after path {p}", Val(exp, "default", f"seq_m_after_path{p}", 0, spread=False),
             Val(exp, "default", next((k for k in keys if k.startswith("seq_rmse_path")
                                       and k.endswith(f"after_path{p}")), "—"), 2,
                 spread=False)] for p in paths]
    policies = [k[len("stream_m_"):] for k in keys if k.startswith("stream_m_")]
    rows += [[f"path 3 streamed, {p}", Val(exp, "default", f"stream_m_{p}", 0, spread=False),
              Join((Val(exp, "default", f"stream_rmse_{p}", 2, spread=False),
                    Val(exp, "default", f"stream_nlpd_{p}", 2, spread=False)))]
             for p in policies]
    if not rows:
        rows = [["—", "—", "—"]]
    return table(["", "M", "RMSE (/ NLPD)"], rows, results)


def vips_speed(results: Results) -> str:
    """``benchmarks/vips.py``: per dataset, the whole stream (compilation included) and the
    warm updates, ours against GPflow's SGPR on the same batches and inducing inputs."""
    data = _bench("vips") or {}
    keys = (("ours_stream_s", 1), ("gpflow_stream_s", 1), ("stream_ratio_ours_over_gpflow", 2),
            ("ours_warm_s", 1), ("gpflow_fits_s", 1), ("warm_ratio_ours_over_gpflow_median", 2),
            ("warm_ratio_ours_over_gpflow_max", 2), ("batches_warm_no_slower", 0))
    rows = [[name] + [Bench("vips", f"datasets.{name}.totals.{k}", dec) for k, dec in keys]
            for name in sorted(data.get("datasets") or {})] or [["—"] + ["—"] * len(keys)]
    return table(["dataset", "ours: stream s", "GPflow: stream s", "ratio", "ours: warm s",
                  "GPflow: fits s", "warm ratio (median)", "warm ratio (max)",
                  "warm batches no slower"], rows, results)


COMPARE_STREAMS = ("split-mnist", "split-digits", "permuted-mnist", "letter-sessions",
                   "kalman-mnist-stationary", "kalman-mnist-nonstationary", "uci-concrete",
                   "uci-kin8nm", "uci-skillcraft", "schools", "parkinsons",
                   "synthetic-regression", "synthetic-multitask")


TABLES: dict[str, Callable[[Results], str]] = {
    "vips-table1": vips_table1,
    "vips-synthetic": vips_synthetic,
    "vips-magnetic": vips_magnetic,
    "vips-uci-authors": vips_uci_authors,
    "vips-speed": vips_speed,
    "gpella-protocol": _gpella_table("default"),
    "gpella-quick": _gpella_table("quick"),
    "gpella-speed": gpella_speed,
    "gpella-diagnostics": gpella_diagnostics,
    "gptree-classes": _gptree_classes("default"),
    "gptree-classes-quick": _gptree_classes("quick"),
    "gptree-classes-grid": _gptree_classes("grid"),
    "gptree-fscil": _gptree_fscil("default"),
    "gptree-fscil-quick": _gptree_fscil("quick"),
    "gptree-dkl": gptree_dkl,
    "gptree-speed": gptree_speed,
    **{f"compare-{s}-quick": _compare_table(s, "quick") for s in COMPARE_STREAMS},
    "kalman-speed": kalman_speed,
    "kalman-online": kalman_online,
    "kalman-online-quick": kalman_online_quick,
    "kalman-calibration": kalman_calibration,
    "kalman-chunk-size": kalman_chunk_size,
    "kalman-timeseries": kalman_timeseries,
    "readme-losses": readme_losses,
    "readme-gptree": readme_gptree,
    "readme-vips": readme_vips,
    "vips-fig2a": vips_fig2a,
    "readme-gpella": readme_gpella,
    "readme-kalman-exact": readme_kalman_exact,
    "claims": claims,
    "vargp-table1": vargp_table1,
    "vargp-tasks": vargp_tasks,
    "vargp-small": vargp_small,
    "vargp-toy": vargp_toy,
    "vargp-speed": vargp_speed,
    "vargp-experiment-epoch": vargp_experiment_epoch,
}


# ---------------------------------------------------------------------------------------------
# pages
# ---------------------------------------------------------------------------------------------
def pages(root: Path = REPO_ROOT) -> list[Path]:
    """The pages whose tables are generated: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render_text(text: str, results: Results, where: str = "page") -> str:
    """``text`` with every table block rewritten from ``results`` (``KeyError`` naming the
    page for a block whose name :data:`TABLES` does not know)."""
    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise KeyError(f"{where}: unknown table {name!r}; known: {sorted(TABLES)}")
        return m.group(1) + TABLES[name](results).rstrip("\n") + "\n" + m.group(4)

    return BLOCK.sub(sub, text)


_NUMBER_CELL = re.compile(r"^[~<>≈]?\s*[-+−]?\d[\d,]*(\.\d+)?\s*(%|x|s)?(\s*±\s*\d[\d.]*\s*%?)?$")


def unmarked_number_tables(text: str) -> list[int]:
    """Line numbers (1-based) of Markdown tables outside the generated blocks that have a
    cell holding only a number (a measured value written by hand)."""
    inside = set()
    for m in BLOCK.finditer(text):
        first = text.count("\n", 0, m.start()) + 1
        inside.update(range(first, first + m.group(0).count("\n") + 1))
    found = []
    for i, line in enumerate(text.splitlines(), start=1):
        if i in inside or not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if any(_NUMBER_CELL.match(c) for c in cells):
            found.append(i)
    return found


def write_tables(check: bool = False, root: Path = REPO_ROOT,
                 results_dir: Path = RESULTS_DIR) -> list[Path]:
    """Rewrite the table blocks of every page (:func:`pages`) from ``results_dir``; returns
    the pages that changed (with ``check``: that would change; nothing is written)."""
    results = load_results(results_dir)
    changed = []
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        new = render_text(text, results, where=str(page.relative_to(root)))
        if new != text:
            changed.append(page)
            if not check:
                page.write_text(new, encoding="utf-8")
    return changed
