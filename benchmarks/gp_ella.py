"""GP-ELLA speed against individual GPs, measured in the same run on the same tasks.

On the five settings of Sect. 5 (synthetic, robot arm, London schools, Parkinson's motor and
total UPDRS), the first ``--max-tasks`` tasks, half of every task as training data (the
Sect. 5.2 split; k, mu, lambda fixed: no tuning), it times

* ``update`` over all tasks (the per-task learning cost): individual GPs (type-II ML to
  convergence) against GP-ELLA (the same fit + the gradient and Hessian + the log-theta
  expansion + sparse coding + the basis update), GP-ELLA with App. A's closed-form Hessian
  (the default) and with ``jax.hessian``;
* ``predict`` on every task's test half (GP-ELLA: line search + Sect. 4.4 smoothing over all
  known tasks, its scale chosen on held-out data; individual GPs: their own GP).

After a warm-up pass that compiles every padded shape, the passes of the variants are
interleaved (individual, GP-ELLA, GP-ELLA autodiff, individual, ...) so that a change of the
machine's load hits every variant alike, and the fastest of ``--repeats`` passes is kept.
Writes ``benchmarks/results/gp_ella.json`` with seconds per task and the ratios GP-ELLA /
individual GPs (target: <= 1.3 for learning on every setting).

    python benchmarks/gp_ella.py [--repeats 5] [--max-tasks 40]
        [--datasets synthetic robot_arm schools parkinsons_motor parkinsons_total]

``--max-tasks 0`` uses all tasks; the learning cost per task does not grow with the number
of tasks (running sums), GP-ELLA's prediction cost does (smoothing over all known tasks).
Schools and Parkinson's need their files (``PPL_CL_DATA``); a setting whose data are missing
is reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

DATASETS = ("synthetic", "robot_arm", "schools", "parkinsons_motor", "parkinsons_total")


def _tasks(name: str, seed: int = 0):
    from ppl_cl.data.standardize import split_and_center

    if name == "schools":
        from ppl_cl.data.loaders import load_schools

        tasks = load_schools()
    elif name in ("parkinsons_motor", "parkinsons_total"):
        from ppl_cl.data.loaders import load_parkinsons

        tasks = load_parkinsons(name.split("_")[1])
    elif name == "synthetic":
        from ppl_cl.data.synthetic import ella_linear_tasks

        tasks = ella_linear_tasks(seed=seed).tasks
    elif name == "robot_arm":
        from ppl_cl.data.synthetic import robot_arm_tasks

        tasks = robot_arm_tasks(seed=seed)
    else:
        raise ValueError(f"--datasets: unknown {name!r}; expected some of {DATASETS}")
    return split_and_center(list(tasks), np.random.default_rng(seed))


def _time_pass(make, data) -> tuple[float, float, list]:
    from ppl_cl import Batch

    learner = make()
    t0 = time.perf_counter()
    records = [learner.update(Batch(xt, yt, task_id=t)) for t, (xt, yt, _, _) in enumerate(data)]
    t1 = time.perf_counter()
    for t, (_, _, xs, _) in enumerate(data):
        learner.predict(xs, t)
    return t1 - t0, time.perf_counter() - t1, records


def _arguments(argv) -> argparse.Namespace:
    """The command line (``--smoke``: the smoke test's tiny sizes)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--k", type=int, default=6)
    p.add_argument("--max-tasks", type=int, default=40)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "gp_ella.json"))
    p.add_argument("--smoke", action="store_true", help="tiny sizes: seconds, numbers meaningless")
    args = p.parse_args(argv)
    if args.smoke:
        args.datasets, args.repeats, args.max_tasks, args.k = ["synthetic"], 1, 3, 2
    return args


def main(argv=None) -> dict:
    args = _arguments(argv)

    from ppl_cl.data.root import MissingDataError
    from ppl_cl.learners.gp_ella import GPELLA
    from ppl_cl.learners.gp_ella_baselines import IndividualGPs

    variants = {
        "individual": lambda: IndividualGPs(),
        "gp_ella_closed_form": lambda: GPELLA(num_components=args.k, hessian="closed_form"),
        "gp_ella_autodiff": lambda: GPELLA(num_components=args.k, hessian="autodiff"),
    }
    rows, skipped = [], {}
    for name in args.datasets:
        try:
            data = _tasks(name)
        except MissingDataError as err:
            skipped[name] = str(err)
            print(f"{name}: skipped ({err})")
            continue
        if args.max_tasks:
            data = data[: args.max_tasks]
        T = len(data)
        for make in variants.values():  # warm-up: compile every padded shape
            _time_pass(make, data)
        fits = {v: [] for v in variants}
        preds = {v: [] for v in variants}
        ella = {v: [] for v in variants}
        for _ in range(args.repeats):  # interleaved passes
            for v, make in variants.items():
                f, pr, rec = _time_pass(make, data)
                fits[v].append(f)
                preds[v].append(pr)
                if v != "individual":
                    ella[v].append(sum(r["seconds_ella"] for r in rec))
        best = {}
        for v in variants:
            best[v] = {"update_s_per_task": min(fits[v]) / T,
                       "predict_s_per_task": min(preds[v]) / T,
                       "update_s_per_task_median": float(np.median(fits[v])) / T}
            if ella[v]:
                best[v]["ella_step_s_per_task"] = min(ella[v]) / T
        ind = best["individual"]
        row = {"dataset": name, "tasks": T, "input_dim": int(data[0][0].shape[1]),
               "mean_train_points_per_task": float(np.mean([len(d[1]) for d in data])),
               "k": args.k, "seconds": best}
        for v in ("gp_ella_closed_form", "gp_ella_autodiff"):
            b = best[v]
            row[f"ratio_update_{v}"] = b["update_s_per_task"] / ind["update_s_per_task"]
            row[f"ratio_update_median_{v}"] = (b["update_s_per_task_median"]
                                               / ind["update_s_per_task_median"])
            row[f"ratio_update_predict_{v}"] = (
                (b["update_s_per_task"] + b["predict_s_per_task"])
                / (ind["update_s_per_task"] + ind["predict_s_per_task"]))
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)

    import jax

    result = {"benchmark": "gp_ella", "rows": rows, "skipped": skipped, "repeats": args.repeats,
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "python": platform.python_version(), "jax": jax.__version__,
                          "cpu_count": os.cpu_count(),
                          "threads": {k: os.environ.get(k) for k in
                                      ("OMP_NUM_THREADS", "XLA_FLAGS")},
                          "load_average_at_end": os.getloadavg()},
              "note": "best of `repeats` interleaved passes after one warm-up pass (and the "
                      "median pass, `_median`); ratios GP-ELLA / individual GPs in the same "
                      "process on the same tasks"}
    from ppl_cl.provenance import code_version, machine_info, write_json

    result.update(machine={**result["machine"], **machine_info()}, code=code_version(),
                  settings={k: v for k, v in vars(args).items() if k != "out"})
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
