"""Compare VAR-GP stream runs task by task, including runs stopped before their last task.

A ``vargp-split-mnist`` / ``vargp-permuted-mnist`` run checkpoints its accuracy matrix ``R``
after every task (``<run>/checkpoints/<row>.npz``, see ``ppl_cl.experiments.vargp.run_stream``),
so a run that was stopped (a session's time limit) still holds the rows it finished; a finished
run has them in its ``metrics.json``. This script reads either and reports, for every row of
every run and every task ``k`` it reached, the average accuracy over the tasks seen so far
(Chaudhry et al. 2018; the curve of VAR-GP Fig. 5) and the mean forgetting so far — and, where
all rows reached task ``k``, their order.

Nothing is extrapolated: a row stopped after task 6 has numbers for k = 1..6 only. Where the
run left a snapshot within its next task (``<row>-partial.npz``), the epoch it reached and its
best validation accuracy so far are listed beside ("in progress"), outside every average.

Usage::

    python benchmarks/vargp_stream_progress.py runs/perm100_vargp_s0 runs/perm100_block_s0 \\
        --out benchmarks/results/some_name.json

Writes JSON (and a Markdown table beside it, same stem).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ppl_cl.experiments.reproduce import checked_notes, notes_section
from ppl_cl.experiments.vargp import (ROW_LABELS, current_partial, load_stream_run,
                                      stream_checkpoints)
from ppl_cl.metrics import average_accuracy, forgetting
from ppl_cl.persist import load_tree


def _forgetting_so_far(R: np.ndarray, k: int) -> float | None:
    """Forgetting (Chaudhry et al. 2018) of the stream cut after task ``k`` (0-based; None at
    k = 0, where no earlier task exists)."""
    return None if k == 0 else float(forgetting(R[:k + 1, :k + 1]))


def _in_progress(run_dir: Path, tasks_done: dict[str, int]) -> dict[str, dict]:
    """Row name -> where its unfinished task stood at the last within-task snapshot
    (``<row>-partial.npz``) of the task after its ``tasks_done`` finished ones: task (1-based),
    epochs done, best epoch and its validation accuracy. Only reported, never used in the
    averages; a finished task's leftover snapshot is skipped (``current_partial``)."""
    out = {}
    for name, path in stream_checkpoints(run_dir, partial=True).items():
        tree = current_partial(load_tree(path)[0], tasks_done.get(name, 0))
        if tree is None:
            continue
        fit = tree["fit"]
        out[name] = {"task": int(tree["task"]), "epoch": int(fit["epoch"]),
                     "best_epoch": int(fit["best_epoch"]),
                     "best_validation": fit["best_value"]}
    return out


def rows_of_run(run_dir: Path) -> dict[str, dict]:
    """Every row of one run folder, finished or stopped: tasks done, average accuracy and
    forgetting after each, in %."""
    out = {}
    matrices = dict(sorted(load_stream_run(run_dir, learners=False).accuracy.items()))
    done_of = {name: int(np.sum(~np.isnan(R[:, 0]))) for name, R in matrices.items()}
    running = _in_progress(run_dir, done_of)  # empty for a finished run: no checkpoints left
    for name, R in matrices.items():
        done = done_of[name]
        if done == 0:
            continue
        Rk = R[:done, :done]
        out[name] = {
            "tasks_done": done,
            "num_tasks": int(R.shape[0]),
            # unrounded, so that the table's two decimals are rounded once (43.40499 is
            # 43.40, not 43.405 and then 43.41)
            "average_accuracy": [100 * float(a) for a in average_accuracy(Rk)],
            "forgetting": [None if f is None else 100 * f
                           for f in (_forgetting_so_far(Rk, k) for k in range(done))],
            "accuracy_matrix": [[round(100 * v, 2) for v in row[:i + 1]]
                                for i, row in enumerate(Rk)],
        }
        if name in running:
            out[name]["in_progress"] = running[name]
    return out


def _progress_cell(row: dict) -> str:
    now = row.get("in_progress")
    if now is None:
        return "—"
    val = now["best_validation"]
    best = "" if val is None else f" (validation {100 * val:.2f} at epoch {now['best_epoch']})"
    return f"task {now['task']}: epoch {now['epoch']}{best}"


def _settings_cell(config: dict) -> str:
    """The run's ``--set`` values (``config.json``'s ``overrides``), which tell apart two runs
    of one row and seed; ``ablations`` is left out (the row column names the row)."""
    sets = {k: v for k, v in (config.get("overrides") or {}).items() if k != "ablations"}
    return ", ".join(f"`{k}={v}`" for k, v in sorted(sets.items())) or "defaults"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders of ppl-cl run")
    ap.add_argument("--out", type=Path, required=True,
                    help="report path: writes PATH.json and PATH.md (a suffix given is replaced)")
    ap.add_argument("--notes", type=Path, default=None, metavar="FILE",
                    help="text file (markdown) added under '## Notes' and as the JSON's notes")
    args = ap.parse_args(argv)
    try:
        notes = checked_notes(None if args.notes is None else args.notes.read_text())
    except ValueError as err:
        ap.error(f"--notes {args.notes}: {err}")

    result = {"benchmark": "vargp_stream_progress", "runs": {}}
    table = {}
    for run in args.runs:
        config = json.loads((run / "config.json").read_text())
        rows = rows_of_run(run)
        result["runs"][str(run)] = {"config": config, "rows": rows}
        seed = config.get("seed")
        for name, row in rows.items():
            table[(name, seed, str(run))] = row
    # order of the rows at every task k all of them reached, per seed (not for a seed with two
    # runs of one row, e.g. the same row at two settings: the order of row names is undefined)
    orders = {}
    for seed in sorted({s for _, s, _ in table}, key=str):
        names = [n for (n, s, _) in table if s == seed]
        if len(names) != len(set(names)):
            continue
        rows = {n: r for (n, s, _), r in table.items() if s == seed}
        common = min(r["tasks_done"] for r in rows.values())
        orders[str(seed)] = {
            f"after_task_{k}": sorted(rows, key=lambda n: -rows[n]["average_accuracy"][k - 1])
            for k in range(1, common + 1)}
    result["order_by_seed"] = orders
    if notes is not None:
        result["notes"] = notes

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    kmax = max(r["tasks_done"] for r in table.values())
    lines = ["| row | seed | settings (--set) | tasks done | "
             + " | ".join(f"A{k}" for k in range(1, kmax + 1))
             + " | forgetting at last task done | in progress |",
             "|---|---|---|---|" + "---|" * kmax + "---|---|"]
    rank = {name: i for i, name in enumerate(ROW_LABELS)}   # Table 1 order, unknown rows last
    for (name, seed, run), r in sorted(table.items(),
                                       key=lambda t: (str(t[0][1]), rank.get(t[0][0], len(rank)))):
        accs = [f"{a:.2f}" for a in r["average_accuracy"]] + ["—"] * (kmax - r["tasks_done"])
        f = r["forgetting"][-1]
        lines.append(f"| {ROW_LABELS.get(name, name)} | {seed} | "
                     f"{_settings_cell(result['runs'][run]['config'])} | {r['tasks_done']}/"
                     f"{r['num_tasks']} | " + " | ".join(accs)
                     + f" | {'—' if f is None else f'{f:.2f}'} | {_progress_cell(r)} |")
    md = args.out.with_suffix(".md")
    md.write_text("# VAR-GP streams, task by task (from run checkpoints or metrics.json)\n\n"
                  "A_k: average test accuracy (%) over tasks 1..k after training task k. "
                  "Forgetting (points): mean drop of tasks 1..k-1 from their best accuracy.\n\n"
                  + "\n".join(lines) + "\n" + notes_section(notes))
    print(md.read_text())
    return result


if __name__ == "__main__":
    main()
