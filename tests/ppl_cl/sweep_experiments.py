"""Tiny experiments for the sweep tests, loaded through ``PPL_CL_EXPERIMENTS`` (by the test
process and by every run's process the sweep starts). Pure NumPy, so a run's process costs its
start-up only; results are deterministic functions of seed and config."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ppl_cl.experiments import PaperNumber, register


@dataclass(frozen=True)
class SweepToyConfig:
    """A random walk of ``steps`` steps of size ``scale``, one checkpoint per step."""

    scale: float = 1.0
    steps: int = 6
    #: ``raise``: a Python error at step 1; ``kill``: the process kills itself (SIGKILL) there
    mode: Literal["ok", "raise", "kill"] = "ok"
    #: seconds slept per step (to interrupt a sweep mid-run)
    sleep_s: float = 0.0


@register("sweep-toy", SweepToyConfig, quick={"steps": 3},
          paper={"total": PaperNumber(0.0, "none: a test experiment")})
def run_sweep_toy(config: SweepToyConfig, ctx) -> dict:
    state = ctx.load_checkpoint("walk") or {"step": 0, "total": 0.0, "path": []}
    start = int(state["step"])
    total, path = float(state["total"]), [float(v) for v in state["path"]]
    for i in range(start, config.steps):
        if i == 1 and config.mode == "raise":
            raise ZeroDivisionError("sweep-toy: asked to fail at step 1")
        if i == 1 and config.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        # one generator per (seed, step): a resumed run draws what an uninterrupted one draws
        total += config.scale * float(np.random.default_rng([ctx.seed, i]).normal())
        path.append(total)
        ctx.save_checkpoint("walk", {"step": i + 1, "total": total, "path": path})
        ctx.log(f"step {i + 1}/{config.steps}")
        time.sleep(config.sleep_s)
    return {"summary": {"total": total, "max": max(path), "steps": config.steps},
            "resumed_from": start,
            "threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                       "XLA_FLAGS")}}
