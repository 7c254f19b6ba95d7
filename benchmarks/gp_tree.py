"""GP-Tree speed: Polya-Gamma draws and Gibbs sweeps, ours against the reference scheme, one run.

1. PG(1, z) draws per second, ``inference.polya_gamma.random_polyagamma`` (torch, one thread,
   float64 and float32) against the ``polyagamma`` package (single-threaded C) on the same z:
   ``z ~ N(0, 9)`` and a GP-Tree-like z (the latent f of the chains of a fitted root node of
   GP-Tree on 10 letter classes, 30 per class).
2. Gibbs sweeps per second for one 200-point node (and one 800-point node) with 30 chains:

   * ours: ``PGGibbs`` (the Gaussian step by Matheron's rule with one Cholesky factor of
     ``I + S K S`` per chain, PG draws on the device of the state);
   * the reference PG scheme: the same engine with ``pg_sampler="polyagamma"`` (f copied to the
     host, PG draws by the polyagamma package, copied back, as the reference code does with
     pypolyagamma every step): the two differ in the PG draws only;
   * the reference code's sweep: its Gaussian step as GP_Tree/gp_model_gibbs.py computes it
     (``Sigma = inverse(inverse(K) + Omega)`` per chain, ``chol(Sigma)``, ``mu = Sigma kappa``,
     ``f = mu + chol(Sigma) eps``; explicit inverses here only, never in the library) with the
     same host PG draws;

   and the parts of a sweep timed apart (our Gaussian step, our PG draws, the host PG draws).
   Every time is the best of ``--repeats``, both in wall-clock seconds and in the thread's CPU
   seconds (``time.thread_time``: robust to other processes taking the core, which the
   wall-clock best-of is not on a shared machine).

Writes ``benchmarks/results/gp_tree.json`` (machine, load average, times; paths relative to
the repository).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/gp_tree.py [--draws 1000000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
from _timing import best_of

REPO = Path(__file__).resolve().parents[1]


def _both(fn, repeats: int) -> tuple[float, float]:
    """(wall, cpu) seconds of ``repeats`` calls of ``fn()``, each clock's best: wall-clock and
    this thread's CPU time (``time.thread_time``, which the other processes of a shared machine
    do not inflate by taking the core)."""
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    return min(wall), min(cpu)


def _relative(path) -> str:
    """``path`` relative to the repository when inside it (the JSON names no absolute path)."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(REPO))
    except ValueError:
        return str(path)


def reference_code_sweep(K, Kinv, kappa, omega, gen, seed_gen):
    """One sweep as the reference code computes it (GP_Tree/gp_model_gibbs.py,
    ``gaussian_conditional`` then ``sample_omega``): ``Sigma = (K^-1 + Omega)^-1`` by an explicit
    inverse per chain, ``mu = Sigma kappa`` (zero prior mean), ``f = mu + chol(Sigma) eps``, then
    omega by polyagamma on a host copy of f. Benchmark only (the library has no inverse)."""
    import torch

    from inference.polya_gamma import random_polyagamma_reference

    Sigma = torch.inverse(Kinv + torch.diag_embed(omega))
    mu = (Sigma @ kappa.unsqueeze(-1)).squeeze(-1)
    L = torch.linalg.cholesky(Sigma)
    eps = torch.randn(mu.shape, dtype=mu.dtype, generator=gen)
    f = mu + (L @ eps.unsqueeze(-1)).squeeze(-1)
    return f, random_polyagamma_reference(1, f, seed=seed_gen)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _letter_node_z(num: int) -> np.ndarray:
    """z of a real node: the chains' f at the root of GP-Tree on 10 letter classes."""
    from ppl_cl import Batch
    from ppl_cl.experiments.gp_tree import class_subset, letter_split
    from ppl_cl.learners.gp_tree import GPTree

    xtr, ytr, xte, yte = letter_split()
    rng = np.random.default_rng(0)
    classes = np.sort(rng.choice(26, 10, replace=False))
    xs, ys, _, _ = class_subset(xtr, ytr, xte, yte, classes, 30, 10, rng)
    gp = GPTree(num_chains=30, num_steps=10)
    gp.update(Batch(xs, ys))
    f = gp.nodes[gp.tree.root]["f_trace"].reshape(-1).numpy()
    return np.resize(f, num)


def _arguments(argv) -> argparse.Namespace:
    """The command line (``--smoke``: the smoke test's tiny sizes)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--node-size", type=int, default=200)
    p.add_argument("--chains", type=int, default=30)
    p.add_argument("--large-node-size", type=int, default=800,
                   help="a second node size (the root of 26 letter classes x 30 rows is 780)")
    p.add_argument("--sweeps", type=int, default=20)
    p.add_argument("--out", default="benchmarks/results/gp_tree.json",
                   help="JSON path (relative paths are taken from the repository root)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: seconds, numbers meaningless")
    args = p.parse_args(argv)
    if args.smoke:
        args.draws, args.repeats, args.node_size, args.chains = 2000, 1, 20, 4
        args.large_node_size, args.sweeps = 40, 5
    return args


def _pg_draws(args) -> list[dict]:
    """Polya-Gamma draws per second, ours (float64 and float32) against ``polyagamma``."""
    import torch
    from polyagamma import random_polyagamma as pg_ref

    from inference.polya_gamma import random_polyagamma

    rows = []
    zs = {"normal_sd3": np.random.default_rng(0).normal(0.0, 3.0, args.draws),
          "gptree_root_node": _letter_node_z(args.draws)}
    for name, z in zs.items():
        row: dict = {"z": name, "z_abs_mean": float(np.abs(z).mean())}
        rng = np.random.default_rng(1)
        pg_ref(1.0, z, random_state=rng)
        t_ref = best_of(lambda: pg_ref(1.0, z, random_state=rng), args.repeats)
        row["polyagamma_draws_per_s"] = args.draws / t_ref
        for dtype in (torch.float64, torch.float32):
            zt = torch.as_tensor(z, dtype=dtype)
            g = torch.Generator().manual_seed(0)
            random_polyagamma(1, zt, g)
            t = best_of(lambda: random_polyagamma(1, zt, g), args.repeats)
            key = str(dtype).split(".")[-1]
            row[f"ours_{key}_draws_per_s"] = args.draws / t
            row[f"ours_{key}_over_polyagamma"] = t_ref / t
        rows.append(row)
        print(json.dumps(row))
    return rows


def _gibbs_row(args, size: int, params) -> dict:
    """Gibbs sweeps per second for one node of ``size`` points: ours, the reference PG scheme
    and the reference code's sweep, and the parts of ours timed apart."""
    import torch

    from inference.pg_gibbs import PGGibbs, pad_problems
    from inference.polya_gamma import random_polyagamma, random_polyagamma_reference
    from models.gp_tree import node_gram, sample_f_given_omega

    rng = np.random.default_rng(2)
    X = torch.as_tensor(rng.normal(size=(size, 16)))
    y = torch.as_tensor((rng.normal(size=size) > 0).astype(np.int64))
    problem = pad_problems([node_gram(params, X)], [y.to(torch.float64) - 0.5])
    n_sweeps = args.sweeps if size == args.node_size else max(2, args.sweeps // 5)
    row: dict = {"node_size": size, "chains": args.chains, "sweeps_per_timing": n_sweeps}
    for scheme in ("torch", "polyagamma"):
        engine = PGGibbs(num_chains=args.chains, pg_sampler=scheme)
        state = engine.init(0, problem)

        def run():
            s = state
            for _ in range(n_sweeps):
                s, _ = engine.step(None, s, problem)

        run()
        wall, cpu = _both(run, args.repeats)
        key = "ours" if scheme == "torch" else "reference_pg_scheme"
        row[f"{key}_sweeps_per_s"] = n_sweeps / wall
        row[f"{key}_sweeps_per_s_cpu"] = n_sweeps / cpu
    # the reference code's sweep (explicit inverses), from the same state
    K, kappa = problem.K[0], problem.kappa[0]
    Kinv = torch.inverse(K)
    gen = torch.Generator().manual_seed(0)
    seed_gen = np.random.default_rng(0)

    def run_reference_code():
        om = state.omega[0]
        for _ in range(n_sweeps):
            _, om = reference_code_sweep(K, Kinv, kappa, om, gen, seed_gen)

    run_reference_code()
    wall, cpu = _both(run_reference_code, args.repeats)
    row["reference_code_sweeps_per_s"] = n_sweeps / wall
    row["reference_code_sweeps_per_s_cpu"] = n_sweeps / cpu
    # the parts of our sweep, timed apart (ms per sweep)
    engine = PGGibbs(num_chains=args.chains)
    f, om = state.f, state.omega
    eps = torch.randn((2,) + tuple(f.shape), dtype=f.dtype)
    ws = engine._workspace
    gauss = lambda: sample_f_given_omega(problem.K.unsqueeze(1), problem.L.unsqueeze(1), om,
                                         problem.kappa.unsqueeze(1), eps[0], eps[1],
                                         ws.get(tuple(f.shape) + (size,), problem.K))
    g = torch.Generator().manual_seed(1)
    pg_ours = lambda: random_polyagamma(1, f, g, validate=False)
    seeds = np.random.default_rng(1)
    pg_host = lambda: random_polyagamma_reference(1, f, seed=seeds)
    for name, fn in (("gaussian_step", gauss), ("pg_ours", pg_ours), ("pg_host", pg_host)):
        fn()
        wall, cpu = _both(fn, args.repeats)
        row[f"{name}_ms"], row[f"{name}_ms_cpu"] = 1e3 * wall, 1e3 * cpu
    for clock in ("", "_cpu"):
        ours = row[f"ours_sweeps_per_s{clock}"]
        row[f"ours_over_reference_pg_scheme{clock}"] = ours / row[f"reference_pg_scheme_sweeps_per_s{clock}"]
        row[f"ours_over_reference_code{clock}"] = ours / row[f"reference_code_sweeps_per_s{clock}"]
        # Amdahl: our sweep against the reference PG scheme if our PG draws took no time
        G, P = row[f"gaussian_step_ms{clock}"], row[f"pg_host_ms{clock}"]
        row[f"bound_with_free_pg_draws{clock}"] = (G + P) / G
    return row


def main(argv=None) -> dict:
    args = _arguments(argv)
    out_path = Path(args.out) if Path(args.out).is_absolute() else REPO / args.out

    import torch

    from models.gp_tree import NodeKernelParams

    torch.set_num_threads(1)
    result: dict = {
        "machine": {"cpu": _cpu_name(), "cores_visible": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
                    "torch": torch.__version__, "load_average_start": os.getloadavg()},
        "settings": {**vars(args), "out": _relative(out_path)},
        "pg_draws": [],
    }
    result["pg_draws"] = _pg_draws(args)

    # Gibbs sweeps for one node
    params = NodeKernelParams(torch.tensor(8.0, dtype=torch.float64),
                              torch.tensor(1.0, dtype=torch.float64), 1e-3)
    result["gibbs_sweeps"] = []
    for size in (args.node_size, args.large_node_size):
        row = _gibbs_row(args, size, params)
        result["gibbs_sweeps"].append(row)
        print(json.dumps(row))
    result["machine"]["load_average_end"] = os.getloadavg()
    from ppl_cl.provenance import code_version, machine_info, portable_path, write_json

    result = {"benchmark": "gp_tree", **result, "machine": {**result["machine"], **machine_info()},
              "code": code_version(), "settings": {**vars(args), "out": portable_path(out_path)}}
    write_json(out_path, result)
    return result


if __name__ == "__main__":
    main()
