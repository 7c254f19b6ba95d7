"""``ppl-cl reproduce``: run the headline experiments and set our numbers beside the papers'.

The paper numbers live with each experiment's registration (``paper={summary_key:
PaperNumber(...)}``), each with its citation. A headline experiment whose data is missing is
reported as *not run* with the missing file named (it is not an error: the quick reproduction
must work on a machine with no datasets); any other exception is reported and makes the command
exit non-zero.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path

from ppl_cl.data.root import MissingDataError
from ppl_cl.experiments.base import registry, run_experiment
from ppl_cl.persist import atomic_write_text

__all__ = ["reproduce"]


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def reproduce(out: str | Path = "runs/reproduce", *, quick: bool = False, seed: int = 0,
              device: str = "cpu", only: list[str] | None = None, data_dir: str | None = None,
              show_progress: bool | None = None) -> dict:
    """Run every headline experiment (or ``only`` those) into ``out/<name>/``; write
    ``out/report.md`` and ``out/reproduce.json``. Returns ``{"results": ..., "failed": [...]}``."""
    out = Path(out)
    specs = [s for s in registry().values() if s.headline and (not only or s.name in only)]
    results, failed = {}, []
    for spec in sorted(specs, key=lambda s: s.name):
        try:
            metrics = run_experiment(spec.name, quick=quick, seed=seed, device=device,
                                     out=out / spec.name, data_dir=data_dir,
                                     show_progress=show_progress)
            results[spec.name] = {"status": "ok", "summary": metrics["summary"],
                                  "wall_time_s": metrics["wall_time_s"]}
        except MissingDataError as err:
            results[spec.name] = {"status": "missing data", "error": str(err)}
        except Exception as err:  # report, keep going, fail at the end
            failed.append(spec.name)
            results[spec.name] = {"status": "error", "error": f"{type(err).__name__}: {err}",
                                  "traceback": traceback.format_exc()}

    lines = [f"# ppl_cl reproduction report ({'quick' if quick else 'full'} sizes, seed {seed})",
             "", "Numbers measured by this run, beside the papers' (source cited per row). Quick",
             "sizes are smaller than the papers' settings: compare orders, not digits.", "",
             "| experiment | metric | ours | paper | source |", "|---|---|---|---|---|"]
    for spec in sorted(specs, key=lambda s: s.name):
        res = results[spec.name]
        if res["status"] != "ok":
            lines.append(f"| {spec.name} | — | not run ({res['status']}) | — | "
                         f"{res['error'].splitlines()[0][:200]} |")
            continue
        keys = list(spec.paper) + [k for k in res["summary"] if k not in spec.paper]
        for key in keys:
            ours = res["summary"].get(key, "—")
            paper = spec.paper.get(key)
            src = (paper.source + (f"; {paper.note}" if paper.note else "")) if paper else ""
            lines.append(f"| {spec.name} | {key} | {_fmt(ours)} | "
                         f"{paper.format() if paper else '—'} | {src} |")
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
    atomic_write_text(out / "reproduce.json", json.dumps(results, indent=2, default=str))
    return {"results": results, "failed": failed}
