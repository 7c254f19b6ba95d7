"""Speed of VAR-GP: seconds per ELBO step and per epoch at Split MNIST
settings, beside a plain sparse variational GP of the same total number of inducing points
written with Pyro's ``pyro.contrib.gp.models.VariationalSparseGP``, measured in the same run.

Settings (Kapoor et al. 2021, Sect. 5): K = 10 classes, D = 784, minibatch B = 512,
M = 60 inducing points per task and class, t = 1..5 tasks (M_total = 60 t), S = 3 theta draws
and S_f = 10 f draws per ELBO, Yogi. An "ELBO step" is loss + backward + optimizer step on one
minibatch (the unit of Algorithm 1); an epoch is ``ceil(N_t / B)`` steps with N_t = 10000 (a
Split MNIST task after the validation split), measured by running one epoch.

Comparisons written to the JSON (``ratios``):

* ``ar_vs_own_svgp``: VAR-GP with t tasks of M inducing points vs the same code with ONE task of
  t * M inducing points (a plain SVGP: same likelihood, same S, same per-class inputs) — the
  cost of the auto-regressive structure itself (target <= 2);
* ``matched_vs_pyro_svgp``: VAR-GP with the settings of Pyro's model (one theta draw, one f
  draw, inducing inputs shared by the classes) vs Pyro's ``VariationalSparseGP`` with
  M_total shared inducing inputs, ``MultiClass`` likelihood and ARD RBF kernel (target <= 2);
* ``paper_settings_vs_pyro_svgp``: VAR-GP at the paper's settings (S = 3, S_f = 10, inducing
  inputs per class as the reference code) vs the same Pyro model — this mostly measures
  S * K more kernel matrices, not the auto-regressive structure.

``--overhead`` times the same four engines at tiny sizes (D = 8, B = 16, M = 4 per task), where a
step is Python and kernel dispatch only: on a CPU, a proxy for the GPU's launch-bound regime.

``--smoke``: ``--quick --overhead`` on the CPU (tasks 1 and 2 at the tiny sizes, 2 steps, no
epoch): seconds, a check that the script runs and writes its JSON (its numbers mean nothing).

Run: ``python benchmarks/vargp.py [--device cuda] [--steps 5] [--quick] [--overhead] [--smoke]
[--validate-args always] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from ppl_cl.provenance import (code_version, machine_info, relative_to_repo,  # noqa: E402
                                write_json)
K, D, B, M_PER_TASK, N_TASK = 10, 784, 512, 60, 10_000
VALIDATE_ARGS = "first"   # SVI(validate_args=...) of the timed engines (--validate-args)
OVERHEAD = False          # --overhead: tiny sizes (no FLOP count)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _data(device: torch.device, dtype: torch.dtype, n: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Real MNIST training images when available (else uniform noise of the same shape); uniform
    noise of D columns under ``--overhead``."""
    x = None
    if D == 784:
        try:
            from ppl_cl.data.loaders import load_mnist

            x, y = load_mnist("train")
            source = "mnist"
        except Exception:  # MissingDataError and friends: timings do not depend on the values
            source = "random (MNIST not found)"
    else:
        source = "random (--overhead sizes)"
    if x is None:
        rng = np.random.default_rng(0)
        x = rng.random((n, D), dtype=np.float32)
        y = rng.integers(0, K, n)
    x = torch.as_tensor(x[:n], dtype=dtype, device=device)
    y = torch.as_tensor(y[:n], dtype=torch.int64, device=device)
    return x, y, source


def flops_per_step(num_tasks: int, m_per_task: int = M_PER_TASK, S: int = 3) -> dict:
    """Floating-point operations of one ELBO step at task t (multiply-add = 2), counted from
    the shapes of the dominant products (lower-order terms, the softmax and the KL left out):

    * ``K_xZ`` (``models.vargp_math.cross_covariance``): ``2 S K B M D`` forward; backward the
      product for the lengthscales (``2 S K B M D``) and for the current task's inputs
      (``2 S K B M_t D``);
    * ``K_ZZ`` (``models.vargp_math.prior_cholesky``): ``2 S K M^2 D`` forward and one product
      backward (``_SymmetricGram``); its Cholesky ``S K M^3 / 3`` forward, about ``S K M^3``
      backward;
    * ``W = L^-1 K_Zx`` (``f_marginals``): ``S K M^2 B`` forward, ``3 S K M^2 B`` backward
      (the solve with ``L^T`` and the product for ``L``)."""
    M, Mt = num_tasks * m_per_task, m_per_task
    cross = 2 * S * K * B * M * D * 2 + 2 * S * K * B * Mt * D
    gram = 2 * S * K * M * M * D * 2 + S * K * M ** 3 * (1 / 3 + 1)
    solve = S * K * M * M * B * 4
    return {"cross_covariance": cross, "gram_and_cholesky": gram, "triangular_solve": solve,
            "total": cross + gram + solve}


def matmul_rate(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of one large matrix product (the rate a step's products can reach here)."""
    a = torch.rand(S_PROBE * B, D, device=device, dtype=dtype)
    b = torch.rand(D, 3000, device=device, dtype=dtype)
    seconds = _time_steps(lambda: a @ b, device, 5)
    return 2 * a.shape[0] * D * b.shape[1] / seconds


S_PROBE = 3


def _time_steps(step, device, steps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def vargp_engine(x, y, num_tasks: int, m_per_task: int, *, num_theta_samples: int,
                 num_f_samples: int, per_class_inputs: bool, seed: int = 0,
                 hyperparameters: str = "variational"):
    """A VAR-GP program at task ``num_tasks`` (earlier tasks frozen at the authors' initial
    values: ``models.vargp.init_inducing_set`` and ``initial_hyperparameters``) and its SVI
    engine."""
    import math as _math

    from inference.svi import SVI
    from inference.yogi import YogiConfig
    from models.vargp import (MAX_PLATE_NESTING, SoftmaxLikelihood, VARGPModel,
                              init_inducing_set, initial_hyperparameters)

    g = torch.Generator().manual_seed(seed)
    scale = _math.log1p(_math.e)
    past = [init_inducing_set(x, K, m_per_task, per_class_inputs=per_class_inputs, generator=g,
                              mean_std=0.5, scale=scale) for _ in range(num_tasks - 1)]
    init = init_inducing_set(x, K, m_per_task, per_class_inputs=per_class_inputs, generator=g,
                             mean_std=0.5, scale=scale)
    point = hyperparameters == "point"
    hyper = initial_hyperparameters(x.shape[1] + 1, point=point, generator=g, dtype=x.dtype,
                                    device=x.device)
    program = VARGPModel(num_classes=K, past=past, init=init,
                         hyper_prior=None if point else hyper, hyper_init=hyper, beta=10.0,
                         num_theta_samples=num_theta_samples,
                         likelihood=SoftmaxLikelihood(num_f_samples), jitter=1e-4)
    return SVI(program.model, program.guide, YogiConfig(learning_rate=3e-3),
               model_kwargs={"num_data": N_TASK}, max_plate_nesting=MAX_PLATE_NESTING,
               validate_args=VALIDATE_ARGS, device=x.device)


def time_vargp(x, y, device, steps: int, **kwargs) -> float:
    engine = vargp_engine(x, y, **kwargs)
    xb, yb = x[:B], y[:B]
    state = [engine.init(0, xb, yb)]

    def step():   # carries the state: the step count decides Pyro's checks (validate_args)
        state[0] = engine.step(None, state[0], (xb, yb))[0]

    return _time_steps(step, device, steps)


def epoch_vargp(x, y, **kwargs) -> float:
    """Seconds for one real epoch over N_TASK rows (the run loop, max_epochs=1)."""
    from inference.loop import LoopConfig, run_loop

    engine = vargp_engine(x, y, **kwargs)
    state = engine.init(0, x[:B], y[:B])
    res = run_loop(engine, state, (x[:N_TASK], y[:N_TASK]), LoopConfig(batch_size=B,
                                                                       max_epochs=1))
    return res.seconds_per_epoch


def time_pyro_svgp(x, y, device, steps: int, num_inducing: int) -> float:
    """Pyro's VariationalSparseGP: M shared inducing inputs, K latent GPs, ARD RBF kernel,
    MultiClass likelihood, TraceMeanField_ELBO, one particle."""
    import pyro
    import pyro.contrib.gp as gp
    from pyro.infer import TraceMeanField_ELBO

    xb, yb = x[:B], y[:B]
    g = torch.Generator().manual_seed(0)
    Xu = x[torch.randperm(x.shape[0], generator=g)[:num_inducing].to(device)].clone()
    with pyro.get_param_store().scope():
        kernel = gp.kernels.RBF(input_dim=D, lengthscale=torch.full((D,), 9.0, dtype=x.dtype,
                                                                   device=device))
        likelihood = gp.likelihoods.MultiClass(num_classes=K)
        model = gp.models.VariationalSparseGP(xb, yb, kernel, Xu=Xu, likelihood=likelihood,
                                              latent_shape=torch.Size([K]), num_data=N_TASK,
                                              whiten=False, jitter=1e-5).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)   # elementwise, as Yogi
        elbo = TraceMeanField_ELBO()

        def step():
            # as the SVI engine after its first step: distribution-argument checks only under
            # --validate-args always (each reads a flag back from the device)
            with pyro.validation_enabled(VALIDATE_ARGS == "always"):
                opt.zero_grad()
                loss = elbo.differentiable_loss(model.model, model.guide)
                loss.backward()
                opt.step()

        return _time_steps(step, device, steps)


def experiment_epoch(device_name: str, epochs: int) -> dict | None:
    """Seconds per epoch of task 1 of ``vargp-split-mnist`` as the experiment trains it (its
    stream, the learner's ``update`` with the validation images of the classes seen, one
    validation in ``epochs`` epochs, at the paper's settings), beside the cost of its training
    steps alone (the median ELBO step of :func:`time_vargp` times the steps of an epoch).
    None without MNIST."""
    import dataclasses

    from ppl_cl.data.root import MissingDataError
    from ppl_cl.experiments.vargp import SplitMNISTConfig, seen_validation, split_mnist_stream
    from ppl_cl.learners.vargp import VARGP

    cfg = SplitMNISTConfig()
    try:
        tasks, valids = split_mnist_stream(cfg, 0)
    except MissingDataError:
        return None
    learner = VARGP(dataclasses.replace(cfg.learner, max_epochs=epochs, validate_every=epochs,
                                        device=device_name, progress=False))
    t0 = time.perf_counter()
    record = learner.update(tasks[0].train, validation=seen_validation(valids)[0])
    wall = time.perf_counter() - t0
    device = torch.device(device_name)
    x = torch.as_tensor(tasks[0].train.x, dtype=torch.float32, device=device)
    y = torch.as_tensor(tasks[0].train.y, dtype=torch.int64, device=device)
    step = time_vargp(x, y, device, 5, num_tasks=1, m_per_task=M_PER_TASK, num_theta_samples=3,
                      num_f_samples=10, per_class_inputs=True)
    steps_per_epoch = math.ceil(len(tasks[0].train) / B)
    return {"epochs": epochs, "num_data": len(tasks[0].train), "wall_s": wall,
            "seconds_per_epoch": wall / epochs, "steps_per_epoch": steps_per_epoch,
            "steps_alone_per_epoch_s": step * steps_per_epoch,
            "ratio_to_steps_alone": wall / epochs / (step * steps_per_epoch), "target": 1.2,
            "loop_step_time_per_epoch_s": record["seconds_per_epoch"]}


def run(device_name: str, steps: int, tasks: list[int], epoch_tasks: list[int],
        experiment_epochs: int = 0) -> dict:
    device = torch.device(device_name)
    dtype = torch.float32
    x, y, source = _data(device, dtype, 12_000)
    out: dict = {"device": device_name, "data": source, "per_task": {},
                 "matmul_flops_per_s": matmul_rate(device, dtype)}
    paper = dict(num_theta_samples=3, num_f_samples=10, per_class_inputs=True)
    matched = dict(num_theta_samples=1, num_f_samples=1, per_class_inputs=False)
    for t in tasks:
        m_total = t * M_PER_TASK
        row = {"num_inducing_total": m_total}
        row["vargp_step_s"] = time_vargp(x, y, device, steps, num_tasks=t,
                                         m_per_task=M_PER_TASK, **paper)
        row["own_svgp_step_s"] = time_vargp(x, y, device, steps, num_tasks=1,
                                            m_per_task=m_total, **paper)
        row["vargp_matched_step_s"] = time_vargp(x, y, device, steps, num_tasks=t,
                                                 m_per_task=M_PER_TASK, **matched)
        row["pyro_svgp_step_s"] = time_pyro_svgp(x, y, device, steps, m_total)
        row["ratio_ar_vs_own_svgp"] = row["vargp_step_s"] / row["own_svgp_step_s"]
        row["ratio_matched_vs_pyro_svgp"] = row["vargp_matched_step_s"] / row["pyro_svgp_step_s"]
        row["ratio_paper_settings_vs_pyro_svgp"] = row["vargp_step_s"] / row["pyro_svgp_step_s"]
        row["steps_per_epoch"] = math.ceil(N_TASK / B)
        if not OVERHEAD:
            flops = flops_per_step(t)
            row["flops_per_step"] = flops
            row["flops_per_s"] = flops["total"] / row["vargp_step_s"]
            row["fraction_of_matmul_rate"] = row["flops_per_s"] / out["matmul_flops_per_s"]
        if t in epoch_tasks:
            row["vargp_epoch_s"] = epoch_vargp(x, y, num_tasks=t, m_per_task=M_PER_TASK, **paper)
        print(json.dumps({device_name: row}), flush=True)
        out["per_task"][str(t)] = row
    if experiment_epochs and source == "mnist":
        out["experiment_task1"] = experiment_epoch(device_name, experiment_epochs)
    last = out["per_task"][str(tasks[-1])]
    out["ratios"] = {"ar_vs_own_svgp": last["ratio_ar_vs_own_svgp"],
                     "matched_vs_pyro_svgp": last["ratio_matched_vs_pyro_svgp"],
                     "paper_settings_vs_pyro_svgp": last["ratio_paper_settings_vs_pyro_svgp"],
                     "at_num_tasks": tasks[-1], "target": 2.0}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", action="append", help="cpu / cuda (repeatable; default: cpu and "
                    "cuda when available)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per measurement (median)")
    ap.add_argument("--quick", action="store_true", help="tasks 1 and 2 only, 2 steps, no epoch")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "vargp.json"))
    ap.add_argument("--overhead", action="store_true",
                    help="tiny sizes (D 8, B 16, M 4 per task, 200 rows): the step is then all "
                         "Python and dispatch, as it is on a GPU, where kernels are short; a CPU "
                         "proxy for the launch-bound regime (no epoch timing)")
    ap.add_argument("--experiment-epochs", type=int, default=10,
                    help="epochs of the experiment's own task-1 training to time against its "
                         "steps alone (0: skip)")
    ap.add_argument("--validate-args", choices=("first", "always"), default="first",
                    help="Pyro's distribution checks: on the first step only (the engine's "
                         "default) or on every step, for both VAR-GP and Pyro's SVGP")
    ap.add_argument("--smoke", action="store_true",
                    help="--quick --overhead on the CPU: seconds, the numbers mean nothing")
    args = ap.parse_args(argv)
    if args.smoke:
        args.quick, args.overhead, args.device = True, True, ["cpu"]
    global VALIDATE_ARGS, D, B, M_PER_TASK, N_TASK, OVERHEAD
    VALIDATE_ARGS = args.validate_args
    OVERHEAD = bool(args.overhead)
    if args.overhead:
        D, B, M_PER_TASK, N_TASK = 8, 16, 4, 200
    devices = args.device or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    tasks = [1, 2] if args.quick else [1, 2, 3, 4, 5]
    epoch_tasks = [] if args.quick or args.overhead else [1, 5]
    steps = 2 if args.quick else args.steps
    results = {"benchmark": "vargp", "settings": {
        "num_classes": K, "input_dim": D, "batch_size": B, "inducing_per_task": M_PER_TASK,
        "num_data_per_task": N_TASK, "paper": {"num_theta_samples": 3, "num_f_samples": 10,
                                               "per_class_inducing_inputs": True},
        "matched": {"num_theta_samples": 1, "num_f_samples": 1,
                    "per_class_inducing_inputs": False}, "dtype": "float32", "steps": steps,
        "validate_args": VALIDATE_ARGS, "overhead_proxy": bool(args.overhead),
        "smoke": bool(args.smoke)},
        "machine": machine_info(), "runs": {}}
    results["code"] = code_version()
    for dev in devices:
        results["runs"][dev] = run(dev, steps, tasks, epoch_tasks,
                                   0 if args.quick or args.overhead else args.experiment_epochs)
    print(f"wrote {relative_to_repo(write_json(args.out, results))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
