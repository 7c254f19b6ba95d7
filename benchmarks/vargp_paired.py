"""Two VAR-GP stream runs compared image by image: a paired standard error for a Table 1 gap.

Two rows of Table 1 run at the same seed and data settings (say VAR-GP and + Block Diag. on
Permuted MNIST) are scored on the *same* test images, so the noise of their final average
accuracies is largely shared: an image both get right (or both wrong) says nothing about which
is better. The unpaired binomial standard error of one average overstates the uncertainty of
their difference. This script rebuilds the runs' task stream
(``ppl_cl.experiments.vargp.STREAMS``, from each run's ``config.json``), loads each run's learner
after the same number of tasks (a finished run's final ``vargp.npz`` for its first row,
``vargp_<row>.npz`` for a later one, or the row's checkpoint ``checkpoints/<row>.npz`` of a
stopped run), predicts every seen task's test set,
checks that the accuracies equal the run's own accuracy matrix, and reports
:func:`ppl_cl.metrics.paired_accuracy_difference`: the difference A - B of the average accuracy
over the tasks seen, its paired standard error (on Permuted MNIST every task scores the same
test images under its own permutation, so an image is one cluster), ``z``, the unpaired
binomial standard error for comparison, and the counts of images only A / only B classifies
correctly. The same per-task comparison is listed for each task.

Usage::

    python benchmarks/vargp_paired.py runs/perm100_vargp_s1 runs/perm100_block_s1 \\
        --out benchmarks/results/vargp_permuted_mnist_len100_seed1_paired.json
    # two rows of one run (it trained both)
    python benchmarks/vargp_paired.py RUN RUN --row-a global --row-b mle_hypers
    # runs trained on a GPU: predict there too (the same generator as the run's own scores)
    python benchmarks/vargp_paired.py RUN_A RUN_B --device cuda

Writes JSON (and a Markdown table beside it, same stem). Nothing is trained.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ppl_cl.experiments.vargp import ROW_LABELS, STREAMS, load_stream_run
from ppl_cl.metrics import paired_accuracy_difference

#: the stream's test images are the same under every task (a cluster per image)
SHARED_TEST_IMAGES = {"vargp-permuted-mnist"}
#: config fields that decide the task stream (they must agree between the two runs)
DATA_FIELDS = ("n_tasks", "n_valid", "n_test", "train_per_task", "test_per_task")


def compare(run_a: Path, run_b: Path, row_a: str | None = None, row_b: str | None = None,
            data_dir: str | None = None, device: str = "cpu") -> dict:
    """The paired comparison of the module docstring, as a JSON-able dict."""
    run_a, run_b = Path(run_a), Path(run_b)
    stream_a, stream_b = load_stream_run(run_a), load_stream_run(run_b)
    config_a, config_b = stream_a.config(), stream_b.config()
    cfg_a, cfg_b = stream_a.recorded, stream_b.recorded
    for key in ("experiment", "seed", "quick"):
        if cfg_a[key] != cfg_b[key]:
            raise ValueError(f"{key}: {run_a} has {cfg_a[key]!r}, {run_b} has {cfg_b[key]!r}")
    experiment, seed = cfg_a["experiment"], int(cfg_a["seed"])
    for key in DATA_FIELDS:
        if cfg_a["config"].get(key) != cfg_b["config"].get(key):
            raise ValueError(f"config.{key}: {run_a} has {cfg_a['config'].get(key)!r}, "
                             f"{run_b} has {cfg_b['config'].get(key)!r} (different test sets)")
    tasks, _ = STREAMS[experiment](config_a, seed, data_dir)

    row_a, learner_a = stream_a.kept_learner(config_a, row_a, device=device)
    row_b, learner_b = stream_b.kept_learner(config_b, row_b, device=device)
    k = learner_a.num_updates
    if learner_b.num_updates != k:
        raise ValueError(f"{run_a} ({row_a}) has {k} tasks done, {run_b} ({row_b}) "
                         f"{learner_b.num_updates}: compare learners after the same task")
    correct = {}
    check = {}
    for name, stream, row, learner in (("a", stream_a, row_a, learner_a),
                                       ("b", stream_b, row_b, learner_b)):
        ys, preds, check[name] = stream.predict_seen_tasks(row, learner, tasks)
        correct[name] = [p == y for y, p in zip(ys, preds)]
    shared = experiment in SHARED_TEST_IMAGES
    clusters = [np.arange(len(c)) for c in correct["a"]] if shared else None
    overall = paired_accuracy_difference(correct["a"], correct["b"], clusters)
    per_task = [paired_accuracy_difference([correct["a"][j]], [correct["b"][j]])
                for j in range(k)]
    return {"experiment": experiment, "seed": seed, "tasks_done": k,
            "a": {"run": str(run_a), "row": row_a, "label": ROW_LABELS.get(row_a, row_a),
                  "max_abs_diff_from_run_R": check["a"]},
            "b": {"run": str(run_b), "row": row_b, "label": ROW_LABELS.get(row_b, row_b),
                  "max_abs_diff_from_run_R": check["b"]},
            "clusters": "test image (shared by every task)" if shared else "test point",
            "average": overall, "per_task": per_task}


def _markdown(res: dict) -> str:
    # Table 1 writes the ablations as "+ Block Diag." (VAR-GP plus a change); a title names rows
    a, b = (res[k]["label"].removeprefix("+ ") for k in "ab")
    o = res["average"]
    pct = lambda v: f"{round(100 * v, 2) + 0.0:.2f}"  # noqa: E731  (+ 0.0: no "-0.00")
    num = lambda v: f"{round(v, 2) + 0.0:.2f}"  # noqa: E731
    lines = [
        f"# {a} against {b}, paired on the same test images",
        "",
        f"{res['experiment']}, seed {res['seed']}, after task {res['tasks_done']}: runs "
        f"`{res['a']['run']}` ({res['a']['row']}) and `{res['b']['run']}` ({res['b']['row']}). "
        f"Accuracies recomputed from the learners; largest difference from the runs' own "
        f"accuracy matrices: {res['a']['max_abs_diff_from_run_R']:.2g} (A), "
        f"{res['b']['max_abs_diff_from_run_R']:.2g} (B). Clusters: {res['clusters']}.",
        "",
        "| | A (%) | B (%) | A - B (points) | paired SE | z | unpaired SE | only A right |"
        " only B right |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| average over tasks 1..{res['tasks_done']} | {pct(o['accuracy_a'])} | "
        f"{pct(o['accuracy_b'])} | {pct(o['difference'])} | {pct(o['se'])} | {num(o['z'])} | "
        f"{pct(o['unpaired_se'])} | {o['a_only']} | {o['b_only']} |",
    ]
    for j, t in enumerate(res["per_task"]):
        lines.append(f"| task {j + 1} | {pct(t['accuracy_a'])} | {pct(t['accuracy_b'])} | "
                     f"{pct(t['difference'])} | {pct(t['se'])} | {num(t['z'])} | "
                     f"{pct(t['unpaired_se'])} | {t['a_only']} | {t['b_only']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--row-a", default=None, help="row of run A (default: its first)")
    ap.add_argument("--row-b", default=None, help="row of run B (default: its first)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--device", default="cpu",
                    help="where the learners predict (cuda for runs trained there: their "
                         "predictive samples come from that device's generator)")
    ap.add_argument("--out", type=Path, default=None,
                    help="report path: writes PATH.json and PATH.md (a suffix given is replaced)")
    args = ap.parse_args(argv)
    res = compare(args.run_a, args.run_b, args.row_a, args.row_b, args.data_dir, args.device)
    md = _markdown(res)
    print(md)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
