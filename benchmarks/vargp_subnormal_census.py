"""Subnormal floats left after the kernel cut: a census of one ELBO step (forward and backward)
of a finished Split MNIST run's last task, at the state the run ended in, and that step's time
with and without flushing subnormals to zero.

Why: the squared-exponential cut of ``models.kernels_torch`` (commit ec00604;
``benchmarks/vargp_short_lengthscales.py``) removed the subnormal entries of the Gram matrices,
but the paper-length MLE Hypers run of seed 1, trained with the cut, still slowed within its
task 5 (about 3.1 s per epoch over the first 93 epochs, 5 s over epochs 165-278). Products of
entries above the cut (and the backward pass through them) can still underflow into the
subnormal range. This script counts them op by op and measures what they cost.

What runs, for each run folder: the last task's Pyro program, built by the run's own learner
(:meth:`ppl_cl.learners.vargp.VARGP.program`) from its final state (frozen earlier sets, the
last task's restored set as the starting point, the final hyperparameters; with a variational
q(theta) the final q_t(theta) also stands in for the prior q_{t-1}(theta), which the run folder
does not keep: the step has the run's shapes and values, not its exact objective), trained for
``--warmup`` steps then timed for ``--steps`` steps (median; minibatches of the task's training
data, batch size of the run), then one more step under a ``TorchDispatchMode`` that counts the
subnormal float32 elements of every aten op's outputs. Each run folder is measured in two fresh
processes: without flushing, and with ``torch.set_flush_denormal(True)`` called before any
torch operation (so every intra-op thread inherits it: measured, the census then counts 0).

Run: ``python benchmarks/vargp_subnormal_census.py runs/paper500/mle_s1 [...] --out
benchmarks/results/vargp_subnormal_census.json`` (needs MNIST: ``PPL_CL_DATA`` or
``--data-dir``; the run folders are outputs of ``ppl-cl run vargp-split-mnist``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

if __name__ == "__main__" and "--flush" in sys.argv:
    torch.set_flush_denormal(True)     # before any torch operation: every thread inherits it

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import vargp as bench  # noqa: E402  (benchmarks/vargp.py: the timing and output helpers)


def census_step(run_dir: str, data_dir: str | None, steps: int, warmup: int, top: int) -> dict:
    import collections

    import pyro
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from inference.svi import ContinualSVI
    from ppl_cl.experiments.vargp import load_stream_run, split_mnist_stream

    run = load_stream_run(run_dir)
    config = run.config()
    row, learner = run.kept_learner(config)
    t = learner.num_updates
    tasks, _ = split_mnist_stream(config, int(run._recorded()["seed"]), data_dir)
    x = torch.as_tensor(tasks[t - 1].train.x, dtype=torch.float32)
    y = torch.as_tensor(tasks[t - 1].train.y).long()
    c = learner.config
    if c["guide"] == "global":
        past, init = [], learner.tasks[0]
    else:
        past, init = learner.tasks[:t - 1], learner.tasks[t - 1]
    program = learner.program(past, init, learner.hyper)
    engine = ContinualSVI(program.model, program.guide, learner._svi_config(t))
    B, N = c["batch_size"], x.shape[0]
    g = torch.Generator().manual_seed(0)

    class Census(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sub, self.total = collections.Counter(), collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in tree_flatten(out)[0]:
                if isinstance(o, torch.Tensor) and o.dtype == torch.float32 and o.numel():
                    self.sub[str(func)] += int(bench.subnormal(o).sum())
                    self.total[str(func)] += o.numel()
            return out

    with pyro.get_param_store().scope():
        state = [engine.init(x[:B], y[:B], num_data=N)]

        def step():
            idx = torch.randperm(N, generator=g)[:B]
            state[0] = engine.step(state[0], x[idx], y[idx], num_data=N)[0]

        step_s = bench._time_steps(step, torch.device("cpu"), steps, warmup=warmup)
        census = Census()
        with census:
            step()
    sub, total = sum(census.sub.values()), sum(census.total.values())
    return {"run": str(run_dir), "row": row, "task": t, "num_data": N, "batch_size": B,
            # where theta ended, as the learner recorded it after the task
            "min_log_lengthscale": learner.history[-1]["theta_log_lengthscale_min"],
            "step_s_median": step_s, "steps": steps,
            "subnormal_elements": sub, "float32_elements": total,
            "subnormal_fraction": sub / total if total else 0.0,
            "top_ops": [{"op": f, "subnormal": n, "elements": census.total[f]}
                        for f, n in census.sub.most_common(top) if n]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="finished vargp-split-mnist run folders")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2,
                    help="fresh processes per run folder and setting (alternating)")
    ap.add_argument("--flush", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" /
                                         "vargp_subnormal_census.json"))
    args = ap.parse_args(argv)
    if args.child:
        res = census_step(args.runs[0], args.data_dir, args.steps, args.warmup, args.top)
        res["flush_denormal"] = args.flush
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    per_run = []
    for run_dir in args.runs:
        measured = {"without_flush": [], "with_flush": []}
        for _ in range(args.repeats):
            for flush in (False, True):
                cmd = [sys.executable, __file__, run_dir, "--child", "--steps", str(args.steps),
                       "--warmup", str(args.warmup), "--top", str(args.top)]
                cmd += ["--data-dir", args.data_dir] if args.data_dir else []
                cmd += ["--flush"] if flush else []
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                res = json.loads(next(line for line in out.splitlines()
                                      if line.startswith("RESULT "))[len("RESULT "):])
                measured["with_flush" if flush else "without_flush"].append(res)
                print(f"{run_dir} flush={flush}: step {res['step_s_median']:.3f} s, "
                      f"subnormal {res['subnormal_elements']} of {res['float32_elements']}",
                      flush=True)
        base = measured["without_flush"][0]
        without = min(r["step_s_median"] for r in measured["without_flush"])
        with_ = min(r["step_s_median"] for r in measured["with_flush"])
        per_run.append({"run": run_dir, "row": base["row"], "task": base["task"],
                        "min_log_lengthscale": base["min_log_lengthscale"],
                        "subnormal_fraction": base["subnormal_fraction"],
                        "subnormal_elements": base["subnormal_elements"],
                        "float32_elements": base["float32_elements"],
                        "subnormal_elements_with_flush": max(
                            r["subnormal_elements"] for r in measured["with_flush"]),
                        "step_s_without_flush": without, "step_s_with_flush": with_,
                        "ratio_without_vs_with_flush": without / with_,
                        "top_ops": base["top_ops"], "measurements": measured})
    out = {"benchmark": "vargp_subnormal_census",
           "settings": {"steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
                        "step_time": "min over repeats of the median over steps",
                        "dtype": "float32"},
           "machine": bench.machine_info(),
           "per_run": per_run}
    bench.write_json(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
