"""Subnormal floats under short lengthscales: the cost of VAR-GP's ELBO step with and without
the squared-exponential cut of ``models.kernels_torch``
(``SquaredExponential._NEGLIGIBLE_R2``), in one run.

Why: the paper-length "MLE Hypers" run of Split MNIST (seed 0) slowed from 1.1 s per epoch in
task 3 to 6.4 s in task 4. Its point estimate had reached a log-lengthscale of -4.58
(l = 0.0102) on pixel 309 (row 11, column 1; inked in 0.07 % of the training images) while the
earlier tasks' inducing inputs sat at |z_309| ~ 0.003-0.23, so that many entries of
``K(Z, x) = s^2 exp(-r^2 / 2)`` and the products built from them fell into the subnormal range,
which x86 CPUs process far slower than normal floats. The kernel now sets entries with
``exp(-r^2 / 2) < sqrt(tiny)`` to exactly 0.

What runs: a VAR-GP model with point hyperparameters at task ``t`` (Split MNIST sizes: K 10,
D 784, B 512, M 60 per task), theta = the median heuristic with that one log-lengthscale set
to log(0.0102), the earlier tasks' inducing inputs moved at that pixel to U(0, 0.25). For each
``t``: the median ELBO-step time with the cut (the library) and without it (the cut disabled
in the same process), the fraction of subnormal entries in ``K(Z_<=t, x)`` without the cut,
the first step's loss with and without it (relative difference), and as a peer the step time
at the unmodified median-heuristic theta.

Run: ``python benchmarks/vargp_short_lengthscales.py [--tasks 2 4] [--steps 5]``; JSON to
``benchmarks/results/vargp_short_lengthscales.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import vargp as bench  # noqa: E402  (benchmarks/vargp.py: the same engine and timing helpers)
from models import kernels_torch  # noqa: E402

PIXEL, LOG_LENGTHSCALE, OFFSET_MAX = 309, math.log(0.0102), 0.25


@contextlib.contextmanager
def no_cut():
    """The squared-exponential profile without the cut (the code before it)."""
    saved = dict(kernels_torch.SquaredExponential._NEGLIGIBLE_R2)
    kernels_torch.SquaredExponential._NEGLIGIBLE_R2.clear()
    try:
        yield
    finally:
        kernels_torch.SquaredExponential._NEGLIGIBLE_R2.update(saved)


def short_theta(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from models.vargp import median_heuristic_theta

    base = median_heuristic_theta(x[:1000], 1, generator=torch.Generator().manual_seed(0))
    short = base.clone()
    short[0, 1 + PIXEL] = LOG_LENGTHSCALE
    return base, short


def moved_inputs(Z: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    Z = Z.clone()
    Z[..., PIXEL] = OFFSET_MAX * torch.rand(Z.shape[:-1], generator=g).to(Z)
    return Z


def first_loss(x, y, **kw) -> float:
    import pyro

    engine = bench.vargp_engine(x, y, **kw)
    xb, yb = x[:bench.B], y[:bench.B]
    with pyro.get_param_store().scope(), torch.random.fork_rng():
        torch.manual_seed(0)   # the same Monte Carlo draws with and without the cut
        state = engine.init(xb, yb, num_data=bench.N_TASK)
        return float(engine.step(state, xb, yb, num_data=bench.N_TASK)[1].loss)


def subnormal_fraction(x, y, theta, **kw) -> float:
    """Share of subnormal entries of ``K(Z_<=t, x)`` without the cut, for the inducing inputs
    of the very model that is timed (read from the engine's program)."""
    from models.vargp_math import kernel_from_theta

    program = bench.vargp_engine(x, y, theta=theta, **kw).model.__self__
    Z = torch.cat([s.inducing_inputs for s in [*program.past, program.init]], dim=-2)
    with no_cut(), torch.no_grad():
        Kzx = kernel_from_theta(theta)(Z, x[:bench.B])
    return float(bench.subnormal(Kzx).double().mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" /
                                         "vargp_short_lengthscales.json"))
    args = ap.parse_args(argv)
    device = torch.device("cpu")
    x, y, source = bench._data(device, torch.float32, 12_000)
    base, short = short_theta(x)
    point = dict(m_per_task=bench.M_PER_TASK, num_theta_samples=1, num_f_samples=10,
                 per_class_inputs=True, hyperparameters="point")
    rows = {}
    for t in args.tasks:
        kw = dict(point, num_tasks=t, theta=short, edit_past_inputs=moved_inputs)
        row = {"num_tasks": t,
               "subnormal_fraction_Kzx_without_cut": subnormal_fraction(
                   x, y, short, **dict(point, num_tasks=t, edit_past_inputs=moved_inputs)),
               "step_s_with_cut": bench.time_vargp(x, y, device, args.steps, **kw)}
        with no_cut():
            row["step_s_without_cut"] = bench.time_vargp(x, y, device, args.steps, **kw)
            loss_without = first_loss(x, y, **kw)
        loss_with = first_loss(x, y, **kw)
        row["first_loss_with_cut"], row["first_loss_without_cut"] = loss_with, loss_without
        row["first_loss_rel_diff"] = abs(loss_with - loss_without) / abs(loss_without)
        row["step_s_median_heuristic_theta"] = bench.time_vargp(
            x, y, device, args.steps, **dict(point, num_tasks=t, theta=base))
        row["ratio_without_vs_with_cut"] = row["step_s_without_cut"] / row["step_s_with_cut"]
        print(json.dumps(row), flush=True)
        rows[str(t)] = row
    out = {"benchmark": "vargp_short_lengthscales", "data": source,
           "settings": {"pixel": PIXEL, "log_lengthscale": LOG_LENGTHSCALE,
                        "past_offset_max": OFFSET_MAX, "batch_size": bench.B,
                        "inducing_per_task": bench.M_PER_TASK, "num_f_samples": 10,
                        "hyperparameters": "point", "dtype": "float32", "steps": args.steps},
           "machine": bench.machine_info(),
           "per_task": rows}
    bench.write_json(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
