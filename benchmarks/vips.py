"""VIPS speed, per batch, on the UCI protocol (naval, kin8nm), in one run with the same M:

* ours: the learner's whole ``update`` (VIPS selection with the bound grown by rank-one updates,
  ``inference.vips``; the L-BFGS fit of kernel + noise on the online bound; the summary), timed
  as the stream meets it (``ours_total_s``: compilation at a new buffer size included, the
  persistent compilation cache empty unless ``--cache-dir`` names a filled one), and again on
  the same state and batch once compiled (``ours_warm_s``);
* (a) GPflow 2.9.2 ``SGPR`` fitted (``gpflow.optimizers.Scipy``, L-BFGS-B) on the same batch with
  the same inducing inputs held fixed, from the same starting hyperparameters -- in its own
  process (``benchmarks/vips_gpflow.py``, a separate environment with the ``bench`` extra);
  every fit builds a new model, so its time includes GPflow's tracing of that model;
* (b) optionally the same selection from scratch (one full bound, with fresh Cholesky factors,
  per added point, as the authors' ``VIPS.py``), on the same batch from the same state, checked
  to choose the same points.

Writes ``benchmarks/results/vips.json``. Example::

    python benchmarks/vips.py --dataset naval --batches 20 \\
        --gpflow-python /path/to/gpflow-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _stream(dataset: str, data_dir: str | None):
    from ppl_cl.data.streams import uci_stream
    from ppl_cl.experiments.vips import DEFAULT_BATCHES, DEFAULT_FOLDS, VIPSUCIConfig, uci_data

    x, y, order = uci_data(VIPSUCIConfig(dataset=dataset), data_dir)
    B = DEFAULT_BATCHES.get(dataset, 20)
    folds = uci_stream(x, y, B, DEFAULT_FOLDS.get(dataset, 5), seed=0, order=order)
    return folds[0][0]


def run_ours(dataset: str, batches: int, scratch_min_m: int, data_dir: str | None,
             fit: bool = True, on_row=None) -> dict:
    import jax

    from inference.vips import VIPS
    from ppl_cl import Batch
    from ppl_cl.configs.vips import OnlineSGPRConfig
    from ppl_cl.learners.vips import OnlineSGPR

    train = _stream(dataset, data_dir)[:batches]
    gp = OnlineSGPR(OnlineSGPRConfig(fit=fit))
    rows, gpflow_inputs = [], []
    for i, (bx, by) in enumerate(train):
        prev = gp._state
        params0 = None if prev is None else prev.params
        rng = jax.random.fold_in(jax.random.PRNGKey(gp.config.seed), i)
        t = time.perf_counter()
        rec = gp.update(Batch(bx, by))
        total = time.perf_counter() - t
        row = {"batch": i + 1, "n": int(bx.shape[0]), "m": rec["m"], "added": rec["added"],
               "ours_select_s": rec["select_seconds"], "ours_fit_s": rec["fit_seconds"],
               "ours_total_s": total, "lbfgs_iterations": rec["iterations"]}
        # the same update again, compiled: the warm cost of the batch
        if prev is None:
            from ppl_cl.learners.vips import initial_params

            state0 = gp.engine.init(None, initial_params(gp.config, bx.shape[1]), bx.shape[1])
        else:
            state0 = prev
        t = time.perf_counter()
        gp.engine.step(rng, state0, (bx, by))
        row["ours_warm_s"] = time.perf_counter() - t
        m_prev = 0 if prev is None else int(np.shape(prev.inducing_inputs)[0])
        if prev is not None and m_prev >= scratch_min_m >= 0:
            # (b): the same selection from the same state, incremental (warm) and from scratch
            old = gp.engine.old_posterior(prev)
            sel = {}
            for incremental in (True, False):
                pol = VIPS(incremental=incremental)
                t = time.perf_counter()
                sel[incremental] = np.asarray(pol.select(rng, prev.stats, bx, by, old, params0,
                                                         terms=(prev.terms, gp.config.jitter)
                                                         ).inducing_inputs)
                row["ours_select_warm_s" if incremental else "scratch_select_s"] = \
                    time.perf_counter() - t
            row["same_points"] = bool(np.array_equal(sel[True], sel[False]))
            row["select_speedup"] = row["scratch_select_s"] / row["ours_select_warm_s"]
        hp0 = (gp.config.variance, gp.config.lengthscale, gp.config.noise_variance) \
            if params0 is None else (float(params0.kernel.variance),
                                     float(np.ravel(params0.kernel.lengthscale)[0]),
                                     float(params0.noise_variance))
        gpflow_inputs.append((bx, by, np.asarray(gp.inducing_inputs), np.asarray(hp0)))
        rows.append(row)
        print(json.dumps(row), flush=True)
        if on_row is not None:
            on_row(rows)
    return {"rows": rows, "gpflow_inputs": gpflow_inputs}


def run_gpflow(python: str, inputs) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batches.npz"
        arrays = {}
        for i, (x, y, Z, hp) in enumerate(inputs):
            arrays.update({f"x{i}": x, f"y{i}": y, f"Z{i}": Z, f"hp{i}": hp})
        np.savez(path, n=len(inputs), **arrays)
        out = Path(tmp) / "gpflow.json"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        subprocess.run([python, str(ROOT / "benchmarks" / "vips_gpflow.py"), str(path), str(out)],
                       check=True, env=env)
        return json.loads(out.read_text())


def totals(rows: list[dict], gpflow: dict | None) -> dict:
    """Stream totals and the two ratios of the speed targets."""
    out = {"ours_stream_s": sum(r["ours_total_s"] for r in rows),
           "ours_warm_s": sum(r["ours_warm_s"] for r in rows)}
    if gpflow is not None:
        g = [r["fit_s"] for r in gpflow["rows"]]
        out.update(gpflow_fits_s=sum(g), gpflow_first_call_s=gpflow["first_call_s"],
                   gpflow_stream_s=sum(g) + gpflow["first_call_s"] - g[0])
        out["stream_ratio_ours_over_gpflow"] = out["ours_stream_s"] / out["gpflow_stream_s"]
        ratios = [r["ours_warm_s"] / gr for r, gr in zip(rows, g)]
        out["warm_ratio_ours_over_gpflow_median"] = float(np.median(ratios))
        out["warm_ratio_ours_over_gpflow_max"] = float(np.max(ratios))
        out["batches_warm_no_slower"] = int(sum(x <= 1.0 for x in ratios))
    return out


def _arguments(argv) -> argparse.Namespace:
    """The command line (``--smoke``: concrete, 2 batches; GPflow only where installed)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", nargs="+", default=["naval"])
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--scratch-min-m", type=int, default=-1,
                   help="run the from-scratch reference on batches whose old M is at least this "
                        "(-1: never)")
    p.add_argument("--gpflow-python", default=None, help="interpreter with gpflow 2.9.2")
    p.add_argument("--no-fit", action="store_true",
                   help="keep the initial hyperparameters (selection-only timing: reaches large "
                        "M without the cubic fits; no GPflow comparison)")
    p.add_argument("--cache-dir", default=None,
                   help="persistent compilation cache (default: a new empty folder, so that "
                        "compilation is timed)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vips.json"))
    p.add_argument("--append", action="store_true", help="add this run to an existing JSON")
    p.add_argument("--smoke", action="store_true", help="concrete, 2 batches: seconds, numbers "
                   "meaningless; GPflow only if --gpflow-python has it")
    args = p.parse_args(argv)
    if args.smoke:
        args.dataset, args.batches = ["concrete"], 2
        try:   # the peer only where it is installed
            found = subprocess.run([args.gpflow_python, "-c", "import gpflow"],
                                   capture_output=True).returncode == 0
        except (OSError, TypeError):   # no such interpreter, or no --gpflow-python
            found = False
        args.gpflow_python = args.gpflow_python if found else None
    return args


def main(argv=None) -> dict:
    args = _arguments(argv)
    cache = args.cache_dir or tempfile.mkdtemp(prefix="vips-bench-jax-cache-")
    os.environ["PPL_CL_JAX_CACHE"] = cache
    from ppl_cl.experiments.vips import enable_compilation_cache
    from ppl_cl.numerics import enable_x64

    enable_x64()
    enable_compilation_cache()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    result = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "cpus": os.cpu_count(), "python": sys.version.split()[0],
                          "threads": "OMP/MKL/OPENBLAS 1, XLA single-threaded eigen",
                          "load_average_at_start": load,
                          "note": "shared machine, other jobs running: absolute seconds are "
                                  "inflated, the ratios are measured in the same run and batch"},
              "command": " ".join(sys.argv),
              "compilation_cache": "given (--cache-dir)" if args.cache_dir else "new, empty",
              "datasets": {}}
    partial = Path(tempfile.gettempdir()) / "ppl_cl-vips-benchmark.partial.json"

    def on_row(rows):   # a run stopped by a time limit keeps the batches it finished
        partial.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=2))

    for d in args.dataset:
        ours = run_ours(d, args.batches, args.scratch_min_m, args.data_dir, fit=not args.no_fit,
                        on_row=on_row)
        rows = ours["rows"]
        g = None
        if args.gpflow_python and not args.no_fit:
            g = run_gpflow(args.gpflow_python, ours["gpflow_inputs"])
            for r, gr in zip(rows, g["rows"]):
                r["gpflow_sgpr_fit_s"] = gr["fit_s"]
                r["gpflow_iterations"] = gr["iterations"]
                r["ours_warm_over_gpflow"] = r["ours_warm_s"] / gr["fit_s"]
        key = d + (" (selection only, hyperparameters fixed at 1, 1, 0.1)" if args.no_fit else "")
        result["datasets"][key] = {"rows": rows, "totals": totals(rows, g)}
        print(json.dumps({d: result["datasets"][key]["totals"]}, indent=2), flush=True)
        if Path(args.out).exists() and args.append:
            old = json.loads(Path(args.out).read_text())
            old.setdefault("runs", []).append({"command": result["command"],
                                               "datasets": {key: result["datasets"][key]}})
            Path(args.out).write_text(json.dumps(old, indent=2))
        else:
            Path(args.out).write_text(json.dumps(result, indent=2))
    from ppl_cl.provenance import code_version, command_line, machine_info, write_json

    stamp = {"machine": {**result["machine"], **machine_info()}, "code": code_version(),
             "command": command_line(), "gpflow_sgpr": bool(args.gpflow_python and not args.no_fit),
             "smoke": args.smoke}
    saved = json.loads(Path(args.out).read_text()) if args.append else result
    for entry in [saved, *saved.get("runs", [])]:   # what this run wrote (--append: its runs)
        if any(entry.get("datasets", {}).get(k) == v for k, v in result["datasets"].items()):
            entry.update(stamp)
    write_json(args.out, {"benchmark": "vips", **saved})
    return result


if __name__ == "__main__":
    main()
