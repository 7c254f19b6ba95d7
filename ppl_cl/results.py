"""``results/<experiment>.json``: the committed summaries of exactly the runs that README.md,
docs/ and the notebooks quote, written by ``ppl-cl report RUN... --save results/<exp>.json
--label LABEL`` (never by hand) and read by :mod:`ppl_cl.tables`, which writes every number
table of README.md and docs/ from them.

A file holds one experiment and any number of *entries* (a setting of it: a row of Table 1,
the quick preset, one dataset...), each the aggregate of one group of finished run folders of
that experiment with the same size and ``--set`` overrides, one run per seed::

    {"format": 1, "experiment": "vargp-split-mnist",
     "entries": {"var_gp": {"quick": false, "overrides": {...}, "seeds": [0, 1, 2],
                            "summary": {key: {"mean", "std", "n", "values"} | value},
                            "per_seed": [summary, ...], "config": {...},
                            "runs": [{"seed", "folder", "wall_time_s", "code", "machine",
                                      "versions"}, ...],
                            "claims": [{"text", "holds"}, ...]}}}

Kilobytes: summaries (flat numbers and short lists), the config and the provenance; no run
folders, figures or checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ppl_cl.provenance import REPO_ROOT, write_json

__all__ = ["FORMAT", "RESULTS_DIR", "entry_from_runs", "save_entry", "load_results",
           "load_result", "ResultsError"]

FORMAT = 1
#: where the committed results live
RESULTS_DIR = REPO_ROOT / "results"


class ResultsError(ValueError):
    """A results file or a group of run folders that cannot be saved or read as asked."""


def _read_run(folder: Path) -> tuple[dict, dict]:
    metrics, config = folder / "metrics.json", folder / "config.json"
    if not metrics.is_file() or not config.is_file():
        raise ResultsError(f"{folder}: no metrics.json / config.json (not a finished run)")
    return json.loads(metrics.read_text()), json.loads(config.read_text())


def entry_from_runs(run_dirs: Sequence[str | Path]) -> dict[str, Any]:
    """The entry of one group of finished run folders: the same experiment, size and
    overrides, distinct seeds (``ResultsError`` otherwise). The summary is aggregated over the
    seeds (:func:`ppl_cl.experiments.reproduce.aggregate_summaries`: mean, std with ddof = 1,
    n, values) and the registered claims of the experiment are checked on it."""
    from ppl_cl.experiments import registry
    from ppl_cl.experiments.reproduce import aggregate_summaries

    if not run_dirs:
        raise ResultsError("no run folders given")
    runs = []
    for d in map(Path, run_dirs):
        metrics, config = _read_run(d)
        runs.append((d, metrics, config))
    keys = {(m["experiment"], bool(m["quick"]), json.dumps(c.get("overrides") or {},
                                                           sort_keys=True))
            for _, m, c in runs}
    if len(keys) != 1:
        raise ResultsError("one entry holds runs of one experiment with one size and one set "
                           f"of overrides; these folders form {len(keys)} groups: "
                           f"{sorted(keys)}")
    (name, quick, overrides), = keys
    runs.sort(key=lambda r: r[1]["seed"])
    seeds = [m["seed"] for _, m, _ in runs]
    if len(set(seeds)) != len(seeds):
        raise ResultsError(f"{name}: a seed appears twice among {[str(d) for d, _, _ in runs]}")
    per_seed = [m["summary"] for _, m, _ in runs]
    summary = aggregate_summaries(per_seed)
    spec = registry().get(name)
    claims = []
    for claim in (spec.claims if spec is not None else ()):
        claims.append({"text": claim.text, "holds": claim.check(summary)})
    return {"quick": quick, "overrides": json.loads(overrides), "seeds": seeds,
            "summary": summary, "per_seed": per_seed, "config": runs[0][2].get("config"),
            "runs": [{"seed": m["seed"], "folder": d.name,
                      "wall_time_s": m.get("wall_time_s"), "code": c.get("code"),
                      "machine": c.get("machine"), "versions": c.get("versions")}
                     for d, m, c in runs],
            "claims": claims, "_experiment": name}


def save_entry(path: str | Path, label: str, run_dirs: Sequence[str | Path]) -> dict:
    """Write (or replace) entry ``label`` of the results file ``path`` from ``run_dirs``; the
    file's other entries stay. The file must be named after the experiment
    (``results/<experiment>.json``). Returns the entry."""
    path = Path(path)
    if not label or not all(ch.isalnum() or ch in "-_." for ch in label):
        raise ResultsError(f"--label: letters, digits, '-', '_' or '.', received {label!r}")
    entry = entry_from_runs(run_dirs)
    name = entry.pop("_experiment")
    if path.stem != name:
        raise ResultsError(f"--save {path}: the runs are of {name!r}; save them to "
                           f"{path.with_name(name + '.json')}")
    data = {"format": FORMAT, "experiment": name, "entries": {}}
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("format") != FORMAT or old.get("experiment") != name:
            raise ResultsError(f"{path}: not a results file of {name!r} (format {FORMAT})")
        data["entries"] = dict(old.get("entries", {}))
    data["entries"][label] = entry
    data["entries"] = dict(sorted(data["entries"].items()))
    write_json(path, data)
    return entry


def load_result(path: str | Path) -> dict[str, Any]:
    """One results file, checked for its format."""
    path = Path(path)
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT or "entries" not in data or "experiment" not in data:
        raise ResultsError(f"{path}: not a results file (format {FORMAT})")
    if path.stem != data["experiment"]:
        raise ResultsError(f"{path}: holds {data['experiment']!r}, not {path.stem!r}")
    return data


def load_results(root: str | Path = RESULTS_DIR) -> dict[str, dict[str, Any]]:
    """Every ``<root>/*.json`` as ``{experiment: {label: entry}}``."""
    out = {}
    for p in sorted(Path(root).glob("*.json")):
        data = load_result(p)
        out[data["experiment"]] = data["entries"]
    return out
