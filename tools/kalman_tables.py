"""Markdown tables of docs/kalman_ocl.md from the ``metrics.json`` files that ``ppl-cl run``
writes (not installed; no test imports it).

    python tools/kalman_tables.py RUN_DIR [RUN_DIR ...]

Each RUN_DIR is a folder of ``kalman-online-mnist`` / ``kalman-online-cifar100``,
``kalman-calibration``, ``kalman-chunk-size`` or ``kalman-timeseries``; the table printed
depends on the experiment recorded in it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROWS = [("fixed random features", "linear"), ("fine-tuned", "finetune"),
        ("fine-tuned + replay", "replay")]
GAMMAS = [("1", "gamma1"), ("0.999", "fixed"), ("learned", "learned")]


def _cell(s: dict, stream: str, row: str) -> str:
    acc, loss = s.get(f"online_acc_{stream}_{row}"), s.get(f"cum_logloss_{stream}_{row}")
    if acc is None:
        return "—"
    return f"{acc:.3f} / {loss:.0f}"


def _steps(s: dict, stream: str, row: str) -> str:
    """The searched step sizes of a row (beta only where fine-tuned, rho only where learned)."""
    keys = [("learning_rate", "eta")]
    if not row.endswith("linear") and not row.startswith("sgd"):
        keys.append(("backbone_scale", "beta"))
    if row.startswith("learned"):
        keys.append(("forgetting_learning_rate", "rho"))
    got = [f"{name} {s[f'{k}_{stream}_{row}']:g}" for k, name in keys
           if f"{k}_{stream}_{row}" in s]
    return ", ".join(got)


def online(s: dict) -> str:
    n = {st: s.get(f"n_points_{st}") for st in ("stationary", "nonstationary")}
    lines = [f"| representation | gamma | stationary ({n['stationary']} points) | chosen steps "
             f"| non-stationary ({n['nonstationary']} points) | chosen steps |",
             "|---|---|---|---|---|---|"]
    for label, regime in ROWS:
        for i, (g, variant) in enumerate(GAMMAS):
            row = f"{variant}_{regime}"
            lines.append(f"| {label if i == 0 else ''} | {g} | {_cell(s, 'stationary', row)} | "
                         f"{_steps(s, 'stationary', row)} | {_cell(s, 'nonstationary', row)} | "
                         f"{_steps(s, 'nonstationary', row)} |")
    for label, row in (("online SGD", "sgd"), ("online SGD + replay", "sgd_replay")):
        lines.append(f"| {label} | — | {_cell(s, 'stationary', row)} | "
                     f"{_steps(s, 'stationary', row)} | {_cell(s, 'nonstationary', row)} | "
                     f"{_steps(s, 'nonstationary', row)} |")
    return "\n".join(lines)


def calibration(s: dict) -> str:
    lines = ["| stream | alpha learned: accuracy / log-loss (final alpha) | alpha = 1 | "
             "log-loss gain |", "|---|---|---|---|"]
    for st in ("stationary", "nonstationary"):
        if f"online_acc_{st}_calibrated" not in s:
            continue
        lines.append(f"| {st} | {_cell(s, st, 'calibrated')} "
                     f"({s[f'final_alpha_{st}_calibrated']:.2f}) | {_cell(s, st, 'uncalibrated')} "
                     f"| {s[f'logloss_gain_{st}']:.0f} |")
    return "\n".join(lines)


def chunk_size(s: dict) -> str:
    sizes = sorted({int(k.rsplit("_b", 1)[1]) for k in s if k.startswith("online_acc_")})
    lines = ["| stream | backbone | " + " | ".join(f"b = {b}" for b in sizes) + " |",
             "|---|---|" + "---|" * len(sizes)]
    for st in ("stationary", "nonstationary"):
        for reg, label in (("linear", "fixed"), ("finetune", "fine-tuned")):
            cells = [s.get(f"online_acc_{st}_{reg}_b{b}") for b in sizes]
            if all(c is None for c in cells):
                continue
            lines.append(f"| {st} | {label} | " + " | ".join(
                "—" if c is None else f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines)


def timeseries(s: dict) -> str:
    return ("| | learned gamma | fixed gamma = 1 |\n|---|---|---|\n"
            f"| accumulated average log predictive at n = {s['n_points']} | "
            f"{s['avg_log_pred_learned']:.3f} | {s['avg_log_pred_fixed']:.3f} |\n"
            f"| minimum of the learned gamma | {s['min_gamma_learned']:.3f} | — |")


TABLES = {"kalman-online-mnist": online, "kalman-online-cifar100": online,
          "kalman-calibration": calibration, "kalman-chunk-size": chunk_size,
          "kalman-timeseries": timeseries}


def main(argv: list[str]) -> None:
    for run in argv:
        m = json.loads((Path(run) / "metrics.json").read_text())
        print(f"<!-- {m['experiment']}, seed {m['seed']}, quick={m['quick']}, "
              f"{m['wall_time_s']:.0f} s -->")
        print(TABLES[m["experiment"]](m["summary"]))
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
