"""GP-ELLA speed against individual GPs, measured in the same run on the same tasks.

For London schools (139 tasks, d = 27) and the synthetic tasks (100 tasks, d = 13), half of
every task as training data (Sect. 5.2 protocol, k, mu, lambda fixed: no tuning), it times

* ``update`` over all tasks (the per-task learning cost): individual GPs (type-II ML, 50
  L-BFGS iterations) against GP-ELLA (the same fit + the Hessian + sparse coding + the basis
  update), GP-ELLA with the autodiff Hessian and with the App. A closed form;
* ``predict`` on every task's test half (GP-ELLA: line search + smoothing over all tasks).

Every pass is repeated and the fastest kept, after a warm-up pass that compiles every padded
shape. Writes ``benchmarks/results/gp_ella.json`` with seconds per task and the ratios
GP-ELLA / individual GPs (target: <= 1.5 for learning).

    python benchmarks/gp_ella.py [--repeats 3] [--datasets schools synthetic] [--max-tasks 0]

``--max-tasks N`` uses the first N tasks (0: all); the learning cost per task does not grow
with the number of tasks (running sums), GP-ELLA's prediction cost does (smoothing over all
known tasks).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np


def _tasks(name: str, seed: int = 0):
    from ppl_cl.experiments.gp_ella import split_and_center

    if name == "schools":
        from ppl_cl.data.loaders import load_schools

        tasks = load_schools()
    elif name == "synthetic":
        from ppl_cl.data.synthetic import ella_linear_tasks

        tasks = ella_linear_tasks(seed=seed).tasks
    else:
        raise ValueError(name)
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


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=["schools", "synthetic"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--k", type=int, default=6)
    p.add_argument("--max-tasks", type=int, default=0)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "gp_ella.json"))
    p.add_argument("--smoke", action="store_true", help="tiny sizes: seconds, numbers meaningless")
    args = p.parse_args(argv)
    if args.smoke:
        args.datasets, args.repeats, args.max_tasks, args.k = ["synthetic"], 1, 3, 2

    from ppl_cl.learners.gp_ella import GPELLA
    from ppl_cl.learners.gp_ella_baselines import IndividualGPs

    variants = {
        "individual": lambda: IndividualGPs(),
        "gp_ella_autodiff": lambda: GPELLA(num_components=args.k),
        "gp_ella_closed_form": lambda: GPELLA(num_components=args.k, hessian="closed_form"),
    }
    rows = []
    for name in args.datasets:
        data = _tasks(name)
        if args.max_tasks:
            data = data[: args.max_tasks]
        T = len(data)
        for make in variants.values():  # warm-up: compile every padded shape
            _time_pass(make, data)
        best = {}
        for v, make in variants.items():
            fits, preds, ella = [], [], []
            for _ in range(args.repeats):
                f, pr, rec = _time_pass(make, data)
                fits.append(f)
                preds.append(pr)
                if v != "individual":
                    ella.append(sum(r["seconds_ella"] for r in rec))
            best[v] = {"update_s_per_task": min(fits) / T, "predict_s_per_task": min(preds) / T}
            if ella:
                best[v]["ella_step_s_per_task"] = min(ella) / T
        ind = best["individual"]
        row = {"dataset": name, "tasks": T, "input_dim": int(data[0][0].shape[1]),
               "mean_train_points_per_task": float(np.mean([len(d[1]) for d in data])),
               "k": args.k, "seconds": best}
        for v in ("gp_ella_autodiff", "gp_ella_closed_form"):
            b = best[v]
            row[f"ratio_update_{v}"] = b["update_s_per_task"] / ind["update_s_per_task"]
            row[f"ratio_update_predict_{v}"] = (
                (b["update_s_per_task"] + b["predict_s_per_task"])
                / (ind["update_s_per_task"] + ind["predict_s_per_task"]))
        rows.append(row)
        print(json.dumps(row, indent=1))

    import jax

    result = {"benchmark": "gp_ella", "rows": rows, "repeats": args.repeats,
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "python": platform.python_version(), "jax": jax.__version__,
                          "cpu_count": os.cpu_count(),
                          "threads": {k: os.environ.get(k) for k in
                                      ("OMP_NUM_THREADS", "XLA_FLAGS")},
                          "load_average_at_end": os.getloadavg()},
             "note": "best of `repeats` passes after one warm-up pass; ratios GP-ELLA / "
                     "individual GPs in the same process on the same tasks"}
    from ppl_cl.provenance import code_version, machine_info, write_json

    result.update(machine={**result["machine"], **machine_info()}, code=code_version(),
                  settings={k: v for k, v in vars(args).items() if k != "out"})
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
