"""Where a VAR-GP stream run's errors go: the confusion matrix of its learner after its last task.

Forgetting in a single-head class-incremental stream (Split MNIST, paper Sect. 5) can mean two
different things: the old classes' GPs lose their hold on the old images (errors go to the
old task's other class), or later classes' GPs claim the old images (errors go to classes of
later tasks). The accuracy matrix cannot tell them apart. This script rebuilds a run's task
stream (``ppl_cl.experiments.vargp.STREAMS`` from the run's ``config.json``), loads the learner
the run keeps (a finished run's final ``vargp.npz``, or ``vargp_<row>.npz`` with ``--row``; a
stopped run's row checkpoint),
predicts every seen task's test set, checks the accuracies against the run's own accuracy
matrix, and reports

* the confusion matrix over the seen tasks' test sets (``sklearn.metrics.confusion_matrix``;
  rows: true class, columns: predicted) and every class's accuracy;
* each class's two most frequent wrong predictions;
* where the streams give every task its own classes (``TaskSplit.classes``), for each task's
  test images the share of its errors predicted as a class of each task (its own = confused
  within the task).

Usage::

    python benchmarks/vargp_confusion.py runs/len40lr3/var_gp-s0 \\
        --out benchmarks/results/vargp_split_mnist_lr3e-3_len40_confusion_s0.json

Writes JSON (and a Markdown table beside it, same stem). Nothing is trained.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from sklearn.metrics import confusion_matrix

from ppl_cl.experiments.vargp import ROW_LABELS, STREAMS, load_stream_run


def confusion_of_run(run_dir: Path, row: str | None = None, data_dir: str | None = None,
                     num_classes: int = 10) -> dict:
    """The report of the module docstring, as a JSON-able dict."""
    run = load_stream_run(run_dir)
    config = run.config()
    row, learner = run.kept_learner(config, row, num_classes)
    experiment, seed = run.recorded["experiment"], int(run.recorded["seed"])
    tasks, _ = STREAMS[experiment](config, seed, data_dir)
    k = learner.num_updates
    ys, preds, check = run.predict_seen_tasks(row, learner, tasks)
    acc = [float(np.mean(p == y)) for y, p in zip(ys, preds)]
    y_all, p_all = np.concatenate(ys), np.concatenate(preds)
    C = confusion_matrix(y_all, p_all, labels=np.arange(num_classes))
    seen = [c for c in range(num_classes) if C[c].sum() > 0]
    per_class = {c: float(C[c, c] / C[c].sum()) for c in seen}
    top = {}
    for c in seen:
        off = C[c].copy()
        off[c] = 0
        order = [int(o) for o in np.argsort(-off, kind="stable")[:2] if off[o] > 0]
        top[c] = [[o, int(off[o])] for o in order]
    res = {"experiment": experiment, "seed": seed, "run": str(run_dir), "row": row,
           "label": ROW_LABELS.get(row, row), "tasks_done": k,
           "task_accuracy": acc, "max_abs_diff_from_run_R": check,
           "confusion": C.tolist(), "class_accuracy": {str(c): v for c, v in per_class.items()},
           "top_confusions": {str(c): v for c, v in top.items()}}
    groups = [tasks[j].classes for j in range(k)]
    if all(g is not None for g in groups):
        task_of = {c: t for t, g in enumerate(groups) for c in g}
        dest = []
        for j in range(k):
            wrong = preds[j] != ys[j]
            n = int(wrong.sum())
            dest.append({"errors": n, "to_task": [
                float(np.mean([task_of.get(int(c), -1) == t for c in preds[j][wrong]]))
                if n else 0.0 for t in range(k)]})
        res["error_destination"] = dest
        res["task_classes"] = [list(g) for g in groups]
    return res


def _markdown(res: dict) -> str:
    pct = lambda v: f"{100 * v:.1f}"  # noqa: E731
    k = res["tasks_done"]
    lines = [f"# Where the errors of {res['label']} go, after task {k}", "",
             f"{res['experiment']}, seed {res['seed']}, run `{res['run']}` ({res['row']}). "
             f"Accuracies recomputed from the learner; largest difference from the run's own "
             f"accuracy matrix: {res['max_abs_diff_from_run_R']:.2g}.", ""]
    if "error_destination" in res:
        head = " | ".join(f"to task {t + 1} {tuple(res['task_classes'][t])}" for t in range(k))
        lines += [f"Test images of each task, after task {k}: accuracy, and the share of the "
                  "errors predicted as a class of each task (%).", "",
                  f"| test images of | accuracy (%) | errors | {head} |",
                  "|---|---|---|" + "---|" * k]
        for j, d in enumerate(res["error_destination"]):
            shares = " | ".join(pct(s) for s in d["to_task"])
            lines.append(f"| task {j + 1} {tuple(res['task_classes'][j])} | "
                         f"{pct(res['task_accuracy'][j])} | {d['errors']} | {shares} |")
        lines.append("")
    lines += ["| class | accuracy (%) | most frequent wrong predictions (class: count) |",
              "|---|---|---|"]
    for c, a in res["class_accuracy"].items():
        tops = ", ".join(f"{o}: {n}" for o, n in res["top_confusions"][c])
        lines.append(f"| {c} | {pct(a)} | {tops} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--row", default=None, help="row of the run (default: its first kept)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", type=Path, default=None,
                    help="report path: writes PATH.json and PATH.md (a suffix given is replaced)")
    args = ap.parse_args(argv)
    res = confusion_of_run(args.run, args.row, args.data_dir)
    md = _markdown(res)
    print(md)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
