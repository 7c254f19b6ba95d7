"""``ppl-cl reproduce``: run the headline experiments and set our numbers beside the papers'.

The paper numbers live with each experiment's registration (``paper={summary_key:
PaperNumber(...)}``), each with its citation. With several ``seeds`` every experiment runs once
per seed (``out/<name>/seed<s>/``) and the report gives ``mean ± std (n = seeds)`` of each
numeric summary value (std with ddof = 1), as the papers report theirs. A headline experiment
whose data is missing is reported as *not run* with the missing file named (it is not an error:
the quick reproduction must work on a machine with no datasets); any other exception is
reported and makes the command exit non-zero.

``ppl-cl report RUN_DIR ...`` (:func:`collect`) builds the same table from run folders that
already exist (``ppl-cl run`` on several machines, one seed per job): runs of the same
experiment, size and ``--set`` overrides are aggregated over their seeds. An earlier report's
``reproduce.json`` may be given in place of folders, to pool seeds run in different sessions.
"""

from __future__ import annotations

import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

from ppl_cl.configs import CHECKPOINT_EVERY_S
from ppl_cl.data.root import MissingDataError
from ppl_cl.errors import ConfigError, DeviceError
from ppl_cl.experiments import registry, run_experiment
from ppl_cl.persist import atomic_write_text, make_folder
from ppl_cl.seeding import check_seed

__all__ = ["reproduce", "aggregate_summaries", "collect", "format_value"]


def _digits(x: float, n: int) -> str:
    """``n`` significant digits, trailing zeros kept (85.10, not 85.1; 6.0, not 6); whole
    numbers without a decimal point (5, 1517, 0); never an exponent for numbers with ``n`` or
    more integer digits (a std of 431.0 at 2 digits prints 430, not 4.3e+02)."""
    if float(x).is_integer() and abs(x) < 10 ** n:
        return str(int(x))
    if abs(x) >= 10 ** (n - 1):
        return f"{float(f'{x:.{n}g}'):.0f}"
    return f"{x:#.{n}g}".rstrip(".")


def format_value(v) -> str:
    if isinstance(v, float):
        return _digits(v, 4)
    if isinstance(v, dict) and "mean" in v:
        if isinstance(v["mean"], list):
            return "[" + ", ".join(format_value(float(m)) for m in v["mean"]) + "]" + (
                f" (mean, n = {v['n']})" if v["n"] > 1 else "")
        if v["n"] < 2:
            return format_value(v["mean"])
        if v["std"] == 0:
            # the same number from every run: not a replication (a seed that picks nothing,
            # or a count), so no "± 0"
            return f"{_digits(v['mean'], 4)} (the same in all {v['n']} runs)"
        return f"{_digits(v['mean'], 4)} ± {_digits(v['std'], 2)} (n = {v['n']})"
    return str(v)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    return mean, (math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0)


def aggregate_summaries(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per key: ``{"mean", "std", "n", "values"}`` over the runs for numbers (std with
    ddof = 1, 0 for one run); for lists of numbers of one length (a curve per task), the same
    element by element (``mean`` and ``std`` lists); the common value otherwise (the first
    run's when they differ)."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for s in summaries for k in s):
        values = [s[key] for s in summaries if key in s]
        if values and all(_is_number(v) for v in values):
            mean, std = _mean_std(values)
            out[key] = {"mean": mean, "std": std, "n": len(values), "values": values}
        elif values and all(isinstance(v, list) and v and all(_is_number(x) for x in v)
                            for v in values) and len({len(v) for v in values}) == 1:
            stats = [_mean_std(col) for col in zip(*values)]
            out[key] = {"mean": [m for m, _ in stats], "std": [s for _, s in stats],
                        "n": len(values), "values": values}
        else:
            out[key] = values[0]
    return out


_HEADER = "| experiment | metric | ours | paper | source |"
_RULE = "|---|---|---|---|---|"
_DIAG_HEADER = "| experiment | quantity | value |"
_DIAG_RULE = "|---|---|---|"


def _overrides_text(overrides: dict[str, Any]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in overrides.items())


class _Sections:
    """The three parts of a report: the headline table (each experiment's declared headline
    keys beside the paper's numbers), the papers' claims checked on the numbers, and the
    diagnostics (every other summary value: sizes, iterations, times...)."""

    def __init__(self) -> None:
        self.headline = [_HEADER, _RULE]
        self.claims: list[str] = []
        self.diagnostics = [_DIAG_HEADER, _DIAG_RULE]
        self.unmeasured: list[str] = []

    def add(self, spec: Any, name: str, summary: dict[str, Any], label: str | None = None
            ) -> None:
        label = label or name
        paper = spec.paper if spec is not None else {}
        keys = list(spec.table_keys) if spec is not None else []
        absent = [k for k in keys if k not in summary]
        if absent:      # e.g. the datasets a quick run leaves out: one line, not a row each
            shown = ", ".join(absent[:6]) + (f" and {len(absent) - 6} more" if len(absent) > 6
                                             else "")
            self.unmeasured.append(f"- {label}: {shown}")
        for key in [k for k in keys if k in summary]:
            ref = paper.get(key)
            src = (ref.source + (f"; {ref.note}" if ref.note else "")) if ref else ""
            self.headline.append(f"| {label} | {key} | {format_value(summary.get(key, '—'))} | "
                                 f"{ref.format() if ref else '—'} | {src} |")
        for claim in (spec.claims if spec is not None else ()):
            ok = claim.check(summary)
            values = ", ".join(format_value(summary.get(k, "—")) for k in claim.all_keys)
            verdict = {True: "holds", False: "does not hold", None: "not measured"}[ok]
            self.claims.append(f"- {label}: {claim.text} — {verdict} here ({values}).")
        for key in [k for k in summary if k not in keys]:
            self.diagnostics.append(f"| {label} | {key} | {format_value(summary[key])} |")

    def missing(self, name: str, status: str, error: str) -> None:
        self.headline.append(f"| {name} | — | not run ({status}) | — | {error[:200]} |")

    def lines(self) -> list[str]:
        out = ["## Headline numbers", "", *self.headline, ""]
        if self.unmeasured:
            out += ["Headline keys these runs did not measure (their settings leave them "
                    "out):", "", *self.unmeasured, ""]
        if self.claims:
            out += ["## The papers' claims, checked on these numbers", "", *self.claims, ""]
        out += ["## Diagnostics", "", *self.diagnostics]
        return out


def _selected(only: list[str] | None) -> list:
    """The headline experiments' specs, or ``only`` those (a :class:`ConfigError` for a name
    that is not registered)."""
    reg = registry()
    unknown = sorted(set(only or ()) - set(reg))
    if unknown:
        raise ConfigError(f"--only: unknown experiment(s) {', '.join(unknown)}; `ppl-cl list` "
                          f"shows: {', '.join(sorted(reg))}")
    specs = [s for s in reg.values() if s.headline or (only and s.name in only)]
    return [s for s in specs if not only or s.name in only]


def _ok_result(runs: list[dict], seeds: list[int]) -> dict:
    """An experiment's entry of ``reproduce.json`` from its runs' metrics (one per seed)."""
    if len(runs) == 1:
        return {"status": "ok", "summary": runs[0]["summary"],
                "wall_time_s": runs[0]["wall_time_s"]}
    return {"status": "ok", "seeds": seeds,
            "summary": aggregate_summaries([r["summary"] for r in runs]),
            "per_seed": [r["summary"] for r in runs],
            "wall_time_s": sum(r["wall_time_s"] for r in runs)}


def _report_head(quick: bool, seeds: list[int], overrides: dict[str, str] | None) -> list[str]:
    """The title and opening lines of ``report.md``."""
    size = "quick" if quick else "full"
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    lines = [f"# ppl_cl reproduction report ({size} sizes, {seed_text})", "",
             "Numbers measured by this run, beside the papers' (source cited per row)."]
    if quick:
        lines.append("Quick sizes are far smaller than the papers' settings; the claims section "
                     "says which of the papers' statements hold at these sizes.")
    if overrides:
        lines.append(f"Config overrides: {_overrides_text(overrides)}.")
    lines.append("")
    return lines


def reproduce(out: str | Path = "runs/reproduce", *, quick: bool = False, seed: int = 0,
              seeds: Sequence[int] | None = None, device: str = "cpu",
              only: list[str] | None = None, overrides: dict[str, str] | None = None,
              data_dir: str | None = None, show_progress: bool | None = None,
              resume: bool = False, checkpoint_every_s: float = CHECKPOINT_EVERY_S,
              force: bool = False, echo: Callable[[str], None] | None = None) -> dict:
    """Run every headline experiment (or ``only`` those) into ``out/<name>/`` (one folder per
    seed when ``seeds`` has several); write ``out/report.md`` and ``out/reproduce.json``.
    One line per experiment as it ends goes to ``echo`` (default: stderr), e.g.
    ``[2/7] exact-gp-uci: ok in 12.3 s``.

    Args:
        seeds: the seeds to run (default ``[seed]``).
        overrides: ``--set`` config overrides applied to every experiment run.
        resume: continue stopped runs from their checkpoints (see ``run_experiment``).
        checkpoint_every_s: seconds between snapshots within a unit of work (see
            ``run_experiment``).
        force: replace finished runs in ``out`` (otherwise they are refused).
        echo: where the progress lines go.

    Raises:
        ConfigError: ``only`` names an experiment that is not registered.

    Returns:
        ``{"results": ..., "failed": [...]}``; with several seeds each ok result carries
        ``summary`` (the aggregate of :func:`aggregate_summaries`) and ``per_seed``.
    """
    out = Path(out)
    echo = echo or (lambda line: print(line, file=sys.stderr, flush=True))
    seeds = list(seeds) if seeds else [seed]
    for s in seeds:
        check_seed(s, "--seeds" if len(seeds) > 1 else "--seed")
    specs = _selected(only)
    make_folder(out)
    results, failed = {}, []
    ordered = sorted(specs, key=lambda s: s.name)
    for k, spec in enumerate(ordered, start=1):
        t0 = time.perf_counter()
        try:
            runs = [run_experiment(spec.name, quick=quick, seed=s, device=device,
                                   out=out / spec.name if len(seeds) == 1
                                   else out / spec.name / f"seed{s}",
                                   overrides=overrides, data_dir=data_dir,
                                   show_progress=show_progress, resume=resume,
                                   checkpoint_every_s=checkpoint_every_s, force=force)
                    for s in seeds]
            results[spec.name] = _ok_result(runs, seeds)
        except MissingDataError as err:
            results[spec.name] = {"status": "missing data", "error": str(err)}
        except (ConfigError, DeviceError):
            raise                      # the command's arguments are wrong: stop at once
        except Exception as err:  # report, keep going, fail at the end
            failed.append(spec.name)
            results[spec.name] = {"status": "error", "error": f"{type(err).__name__}: {err}",
                                  "traceback": traceback.format_exc()}
        status = results[spec.name]["status"]
        echo(f"[{k}/{len(ordered)}] {spec.name}: {status} in {time.perf_counter() - t0:.1f} s"
             + ("" if status == "ok" else
                f" ({results[spec.name]['error'].splitlines()[0][:160]})"))

    lines = _report_head(quick, seeds, overrides)
    sections = _Sections()
    for spec in sorted(specs, key=lambda s: s.name):
        res = results[spec.name]
        if res["status"] != "ok":
            sections.missing(spec.name, res["status"], res["error"].splitlines()[0])
            continue
        sections.add(spec, spec.name, res["summary"])
    atomic_write_text(out / "report.md", "\n".join(lines + sections.lines()) + "\n")
    atomic_write_text(out / "reproduce.json", json.dumps(results, indent=2, default=str))
    return {"results": results, "failed": failed}


def _groups_from_report(path: Path) -> list[tuple[tuple, dict]]:
    """The runs recorded in a ``reproduce.json`` that :func:`collect` wrote: one
    ``(group key, {"dir", "seed", "summary"})`` per seed, so that runs done in an earlier session
    (whose folders are gone) can be pooled with new ones. Other top-level keys that are not
    groups (a ``"notes"`` string, say) are skipped."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a report written by `ppl-cl report`")
    out = []
    for label, g in data.items():
        if not isinstance(g, dict):
            continue
        if any(k not in g for k in ("experiment", "quick", "overrides", "seeds", "per_seed")):
            raise ValueError(
                f"{path}: entry {label!r} lacks experiment / quick / overrides / seeds / "
                "per_seed; only reports written by `ppl-cl report` can be pooled (for "
                "`ppl-cl reproduce` output pass its run folders)")
        if len(g["per_seed"]) != len(g["seeds"]):
            raise ValueError(f"{path}: entry {label!r} has {len(g['seeds'])} seeds but "
                             f"{len(g['per_seed'])} per-seed summaries")
        key = (g["experiment"], bool(g["quick"]), json.dumps(g["overrides"] or {}, sort_keys=True))
        dirs = g.get("runs") or [f"{path}#{label}"] * len(g["seeds"])
        for seed, summary, d in zip(g["seeds"], g["per_seed"], dirs):
            d = d if "(via " in d else f"{d} (via {path})"      # provenance, not nested
            out.append((key, {"dir": d, "seed": seed, "summary": summary}))
    return out


def checked_notes(notes: str | None) -> str | None:
    """A report's notes as they are stored: stripped, ``None`` for none; an empty text is a
    ``ValueError`` (a notes file left blank by mistake)."""
    if notes is None:
        return None
    text = notes.strip()
    if not text:
        raise ValueError("notes: empty text")
    return text


def notes_section(notes: str | None) -> str:
    """The Markdown that ends a report (after its last line): nothing without notes, else a
    "## Notes" section. Used by :func:`collect` and ``benchmarks/vargp_stream_progress.py``."""
    return "" if notes is None else f"\n## Notes\n\n{notes}\n"


def collect(run_dirs: Sequence[str | Path], out: str | Path, notes: str | None = None) -> dict:
    """Aggregate existing run folders (each with ``metrics.json`` and ``config.json``, as
    ``ppl-cl run`` writes them) into ``out/report.md`` and ``out/reproduce.json``.

    ``notes`` (how the runs were made, what to read them with) goes under a "## Notes" heading
    at the end of ``report.md`` and into ``reproduce.json`` as a ``"notes"`` string, which
    pooling that JSON later skips.

    Runs are grouped by (experiment, quick, overrides); each group reports mean ± std over its
    seeds beside the paper numbers. An entry of ``run_dirs`` may also be a ``reproduce.json``
    that this function wrote earlier (or a copy of it): its per-seed summaries join their
    groups, so seeds run in different sessions pool into one table even when the earlier run
    folders are gone. Raises ``FileNotFoundError`` for a folder without ``metrics.json`` (an
    unfinished run) and ``ValueError`` for a seed given twice in a group or a JSON that is not
    such a report.
    """
    notes = checked_notes(notes)
    out = make_folder(out)
    reg = registry()
    groups: dict[tuple, list[dict]] = {}
    for d in map(Path, run_dirs):
        if d.is_file() and d.suffix == ".json":
            for key, run in _groups_from_report(d):
                groups.setdefault(key, []).append(run)
            continue
        if not (d / "metrics.json").is_file() or not (d / "config.json").is_file():
            raise FileNotFoundError(f"{d}: no metrics.json / config.json (not a finished run)")
        metrics = json.loads((d / "metrics.json").read_text())
        config = json.loads((d / "config.json").read_text())
        key = (metrics["experiment"], bool(metrics["quick"]),
               json.dumps(config.get("overrides") or {}, sort_keys=True))
        groups.setdefault(key, []).append({"dir": str(d), "seed": metrics["seed"],
                                           "summary": metrics["summary"]})
    results: dict[str, Any] = {}
    lines = ["# ppl_cl reproduction report (collected runs)", "",
             "Numbers measured by the listed runs (mean ± std over seeds, std with ddof = 1),",
             "beside the papers' (source cited per row). Settings per group below; runs with",
             "overrides differ from the papers' settings as stated.", ""]
    sections = _Sections()
    for i, ((name, quick, overrides), runs) in enumerate(sorted(groups.items()), start=1):
        runs.sort(key=lambda r: r["seed"])
        seeds = [r["seed"] for r in runs]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"{name}: seed given twice in {[r['dir'] for r in runs]}")
        summary = aggregate_summaries([r["summary"] for r in runs])
        label = f"{name} [{i}]"
        ov = json.loads(overrides)
        lines.append(f"[{i}] {name}: {'quick' if quick else 'full'} sizes, seeds "
                     f"{', '.join(map(str, seeds))}, "
                     + (f"overrides {_overrides_text(ov)}" if ov else "no overrides") + ".")
        sections.add(reg.get(name), name, summary, label=label)
        results[label] = {"experiment": name, "quick": quick, "overrides": ov, "seeds": seeds,
                          "runs": [r["dir"] for r in runs], "summary": summary,
                          "per_seed": [r["summary"] for r in runs]}
    atomic_write_text(out / "report.md",
                      "\n".join(lines + [""] + sections.lines()) + "\n" + notes_section(notes))
    saved = results if notes is None else {**results, "notes": notes}
    atomic_write_text(out / "reproduce.json", json.dumps(saved, indent=2, default=str))
    return results
