"""How much does the auto-regressive guide of VAR-GP couple a task to the earlier ones?

VAR-GP's guide (Kapoor et al. 2021, Sect. 4.3) is ``q(u_j | u_<j, theta) = N(A_j u_<j + m_j,
S_j)`` with ``A_j = K_{j,<j} K_{<j,<j}^{-1}``; the block-diagonal ablation (Sect. 5.3) drops
``A_j u_<j``. The two guides differ only through ``A_j``, so its size says how far apart the
ablation *can* be from VAR-GP on a given stream. This script reads the learner state of VAR-GP
stream runs (``<run>/checkpoints/<row>.npz`` of a stopped or running run, or the final
``vargp.npz`` / ``vargp_<row>.npz`` of a finished one) and reports, at the posterior mean of
q(theta) (the point theta of MLE Hypers), per task ``j >= 2`` averaged over the K class GPs:

* ``prior_coupling`` = tr(A_j K_{<j,j}) / tr(K_jj) = ||L_{j,<j}||_F^2 / tr(K_jj): the share of
  u_j's prior variance that u_<j determines (0: independent, 1: determined). Identity (i) of
  :mod:`models.vargp_math`: ``A_j K_{<j,j} = L_{j,<j} L_{j,<j}^T``.
* ``max_correlation``: the largest prior correlation k(z, z') / gamma between an inducing input
  of task j and one of an earlier task.
* ``mean_share`` = ||A_j mu_<j|| / (||A_j mu_<j|| + ||m_j||): how much of the guide's mean of u_j
  comes from the earlier tasks' (eq. 22, ``mu`` the joint mean), for runs with the
  auto-regressive guide.

Usage::

    python benchmarks/vargp_ar_coupling.py runs/perm100_vargp_s1 runs/split_vargp_s0 \\
        --out benchmarks/results/vargp_ar_coupling.json

Writes JSON (and a Markdown table beside it, same stem). Nothing is trained.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from models.vargp_math import (InducingSet, concat_inducing_inputs, conditional_prior_mean,
                               prior_cholesky, task_slices)

#: float32 runs use relative jitter 1e-5 on K_ZZ (``VARGP(jitter=None)``); the diagnostic is
#: computed in float64 with the same relative jitter, so it is the model's own prior.
JITTER = 1e-5


def _learner_states(run_dir: Path) -> dict[str, tuple[dict, str]]:
    """Row name -> (learner state dict (``VARGP.state_dict()``), guide) of a VAR-GP stream run:
    every row of a stopped run (its checkpoints) and of a finished one (``vargp.npz``,
    ``vargp_<row>.npz``); ``ppl_cl.experiments.vargp.load_stream_run``."""
    from ppl_cl.experiments.vargp import VARIANTS, load_stream_run

    return {name: (state, VARIANTS[name]["guide"])
            for name, state in load_stream_run(run_dir).states.items()}


def coupling(state: dict, guide: str = "autoregressive") -> list[dict]:
    """Per task j >= 2 (1-based), the three numbers of the module docstring (``mean_share``
    is None unless ``guide == "autoregressive"``; the global guide has one set, so no rows)."""
    t64 = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float64)  # noqa: E731
    sets = [InducingSet(t64(s["inducing_inputs"]), t64(s["mean"]), t64(s["scale_tril"]))
            for s in state["tasks"]]
    hyper = state["hyper"]
    theta = t64(hyper["theta"] if "theta" in hyper else hyper["loc"])[None, None]  # (1,1,H,D+1)
    L = prior_cholesky(theta, concat_inducing_inputs(sets), JITTER)[0, 0]          # (Kk, M, M)
    gamma = theta[0, 0, :, 0].exp()[:, None, None]                                 # (H, 1, 1)
    mu = sets[0].mean                      # joint mean of u_<=j (eq. 22), grown task by task
    rows = []
    for j, (s, b) in enumerate(zip(sets, task_slices(sets))):
        if j == 0:
            continue
        p = b.start
        L_cross = L[..., b, :p]                                          # (Kk, M_j, p)
        trace_Kjj = (L[..., b, :b.stop] ** 2).sum(dim=(-1, -2))          # tr(K_jj) (+ jitter)
        prior_coupling = ((L_cross ** 2).sum(dim=(-1, -2)) / trace_Kjj).mean().item()
        K_cross = L_cross @ L[..., :p, :p].transpose(-1, -2)             # K_{j,<j}, identity (i)
        max_corr = (K_cross / gamma).amax(dim=(-1, -2)).mean().item()
        mean_share = None
        if guide == "autoregressive":
            ar_mean = conditional_prior_mean(L, b, mu)                   # A_j mu_<j
            mu = torch.cat([mu, ar_mean + s.mean], dim=-1)
            a, m = ar_mean.norm(dim=-1), s.mean.norm(dim=-1)
            mean_share = (a / (a + m)).mean().item()
        rows.append({"task": j + 1, "prior_coupling": prior_coupling,
                     "max_correlation": max_corr, "mean_share": mean_share})
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True,
                        help="report path: writes PATH.json and PATH.md "
                             "(a suffix given is replaced)")
    args = parser.parse_args(argv)
    result: dict = {"jitter": JITTER, "runs": {}}
    for run in args.runs:
        result["runs"][str(run)] = {row: coupling(st, guide) for row, (st, guide) in
                                    _learner_states(run).items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# VAR-GP: coupling of each task's inducing outputs to the earlier tasks'", "",
             "At the mean of q(theta) (MLE Hypers: its point theta), averaged over the class "
             "GPs. prior coupling = tr(K_{j,<j} K_{<j}^{-1} K_{<j,j}) / tr(K_jj); max corr = "
             "largest k(z, z')/gamma between task j's and earlier inducing inputs; mean share = "
             "||A_j mu_<j|| / (||A_j mu_<j|| + ||m_j||).", "",
             "| run | row | task | prior coupling | max corr | mean share |",
             "|---|---|---|---|---|---|"]
    for run, rows in result["runs"].items():
        for row, per_task in rows.items():
            for r in per_task:
                lines.append(f"| {run} | {row} | {r['task']} | {r['prior_coupling']:.4f} | "
                             f"{r['max_correlation']:.4f} | "
                             + ("—" if r["mean_share"] is None else f"{r['mean_share']:.4f}")
                             + " |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    main()
