"""The number tables of README.md and docs/*.md, written from ``results/*.json``
(:mod:`ppl_cl.results`) by ``ppl-cl tables``.

A table sits in a page between two markers that name it::

    <!-- table: vargp-table1 -->
    | ... the generated Markdown ... |
    <!-- /table -->

and :data:`TABLES` maps the name to the function that writes it from the results. A cell that
quotes a result names its experiment, entry and summary key (:class:`Val`); a missing entry
or key prints as ``—`` (not run), so a table never shows a number that no committed result
holds. ``ppl-cl tables`` rewrites every block; ``ppl-cl tables --check`` (and the test
``tests/ppl_cl/test_tables.py``) fails when a committed block differs from what the results
give, and when a Markdown table of numbers stands outside a block.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ppl_cl.provenance import REPO_ROOT
from ppl_cl.results import RESULTS_DIR, load_results

__all__ = ["TABLES", "Val", "PaperVal", "table", "render_text", "write_tables", "pages",
           "format_value", "BLOCK", "unmarked_number_tables"]

#: one generated block: ``<!-- table: NAME -->`` ... ``<!-- /table -->``
BLOCK = re.compile(r"(<!-- table: (?P<name>[a-z0-9_.-]+) -->\n)(?P<body>.*?)(<!-- /table -->)",
                   re.S)

Results = dict[str, dict[str, Any]]
#: the speed benchmarks' JSON files (``benchmarks/*.py``)
BENCH_DIR = REPO_ROOT / "benchmarks" / "results"


def _digits(x: float, decimals: int) -> str:
    return f"{x:.{decimals}f}"


def format_value(v: Any, decimals: int = 2, scale: float = 1.0, spread: bool = True) -> str:
    """A summary value as a cell: a number with ``decimals`` decimals; an aggregate
    ``{"mean", "std", "n"}`` as ``mean ± std`` when ``n > 1`` (std with ddof = 1, the spread
    over seeds) and ``spread``, else the mean; ``—`` for None or NaN."""
    if isinstance(v, dict) and "mean" in v:
        mean, std, n = v["mean"], v.get("std", 0.0), v.get("n", 1)
        if mean is None or (isinstance(mean, float) and math.isnan(mean)):
            return "—"
        text = _digits(scale * mean, decimals)
        if spread and n and n > 1:
            text += f" ± {_digits(scale * std, decimals)}"
        return text
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return "—" if v is None else str(v)
    if isinstance(v, float) and math.isnan(v):
        return "—"
    if isinstance(v, int) and decimals == 0:
        return str(int(scale * v))
    return _digits(scale * v, decimals)


@dataclass(frozen=True)
class Val:
    """A cell quoting ``results/<experiment>.json``, entry ``entry``, summary key ``key``."""

    experiment: str
    entry: str
    key: str
    decimals: int = 2
    scale: float = 1.0
    spread: bool = True

    def render(self, results: Results) -> str:
        e = results.get(self.experiment, {}).get(self.entry)
        if e is None:
            return "—"
        return format_value(e["summary"].get(self.key), self.decimals, self.scale, self.spread)


@dataclass(frozen=True)
class PaperVal:
    """A cell with the paper's number of ``key`` as the experiment registers it
    (``PaperNumber``, printed with its own digits)."""

    experiment: str
    key: str

    def render(self, results: Results) -> str:
        from ppl_cl.experiments import registry

        ref = registry()[self.experiment].paper.get(self.key)
        return "—" if ref is None else ref.format()


@dataclass(frozen=True)
class Seeds:
    """A cell with the seeds of an entry (``0, 1, 2``), ``—`` when the entry is missing."""

    experiment: str
    entry: str

    def render(self, results: Results) -> str:
        e = results.get(self.experiment, {}).get(self.entry)
        return "—" if e is None else ", ".join(map(str, e["seeds"]))


@dataclass(frozen=True)
class Bench:
    """A cell quoting ``benchmarks/results/<benchmark>.json`` at the key path ``path`` (a
    dotted path of dict keys; ``—`` when absent): speed figures, written whole by their
    scripts."""

    benchmark: str
    path: str
    decimals: int = 2
    scale: float = 1.0

    def render(self, results: Results) -> str:
        import json

        f = BENCH_DIR / f"{self.benchmark}.json"
        if not f.exists():
            return "—"
        node: Any = json.loads(f.read_text())
        for part in self.path.split("."):
            if not isinstance(node, dict) or part not in node:
                return "—"
            node = node[part]
        return format_value(node, self.decimals, self.scale)


Cell = str | Val | PaperVal | Seeds | Bench


def table(header: Sequence[str], rows: Sequence[Sequence[Cell]], results: Results) -> str:
    """A Markdown table (one header row) with the cells rendered from ``results``."""
    def cell(c: Cell) -> str:
        return c if isinstance(c, str) else c.render(results)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the tables
# ---------------------------------------------------------------------------------------------
_VARGP_ROWS = (("var_gp", "VAR-GP"), ("block_diag", "+ Block Diag."),
               ("mle_hypers", "+ MLE Hypers"), ("global", "+ Global"))


def _vargp_key(row: str, name: str = "final_avg_accuracy") -> str:
    return name + ("" if row == "var_gp" else f"_{row}")


def vargp_table1(results: Results, experiment: str = "vargp-split-mnist") -> str:
    """Table 1 (one stream): final average accuracy (%) per row at the paper's protocol
    (entry = the row, one run per seed), the quick preset (entry ``quick``) and the paper."""
    rows = []
    for row, label in _VARGP_ROWS:
        rows.append([label, Val(experiment, row, _vargp_key(row)), Seeds(experiment, row),
                     Val(experiment, "quick", _vargp_key(row), spread=False),
                     PaperVal(experiment, _vargp_key(row))])
    return table(["row", "ours, paper's protocol", "seeds", "ours, --quick", "paper"], rows,
                 results)


def vargp_tasks(results: Results, experiment: str = "vargp-split-mnist") -> str:
    """Average test accuracy (%) after each task, per row, at the paper's protocol (seed
    mean), with the epochs each row trained in all."""
    rows = []
    for row, label in _VARGP_ROWS:
        e = results.get(experiment, {}).get(row)
        curve = None if e is None else e["summary"].get(_vargp_key(row, "average_accuracy"))
        if isinstance(curve, dict):
            curve = curve.get("mean")
        cells: list[Cell] = [label]
        for t in range(5):
            cells.append("—" if not curve or t >= len(curve) else f"{curve[t]:.2f}")
        cells.append(Val(experiment, row, "epochs_total" if row == "var_gp"
                         else f"epochs_total_{row}", decimals=0, spread=False))
        rows.append(cells)
    return table(["row", "t = 1", "2", "3", "4", "5", "epochs"], rows, results)


def vargp_small(results: Results) -> str:
    """The settings that are not the paper's protocol (the data-scaled start of q(theta)):
    final average accuracy (%) per row on the 8x8 digits and at the quick presets."""
    runs = (("vargp-split-digits", "default", "split digits (1797 images)"),
            ("vargp-split-digits", "quick", "split digits, --quick"),
            ("vargp-split-mnist", "quick", "Split MNIST, --quick (200 images per task)"),
            ("vargp-permuted-mnist", "quick", "Permuted MNIST, --quick (3 tasks)"))
    rows = [[label] + [Val(exp, entry, _vargp_key(row), spread=False)
                       for row, _ in _VARGP_ROWS] for exp, entry, label in runs]
    return table(["stream", *(label for _, label in _VARGP_ROWS)], rows, results)


def vargp_toy(results: Results) -> str:
    """The 2-D toy (Fig. 1 / 7): accuracy (%) on task 0's and task 1's test points after
    task 1, per row, at the authors' setting and the quick preset."""
    rows = []
    for row, label in _VARGP_ROWS:
        suffix = "" if row == "var_gp" else f"_{row}"
        rows.append([label] + [Val("vargp-toy", entry, f"task{j}_acc_after_task1{suffix}",
                                   spread=False)
                               for entry in ("default", "quick") for j in (0, 1)])
    return table(["row", "task 0 (5000 epochs)", "task 1 (5000 epochs)", "task 0 (--quick)",
                  "task 1 (--quick)"], rows, results)


def vargp_speed(results: Results) -> str:
    """``benchmarks/vargp.py``: seconds per ELBO step at task t beside one task of the same
    total M (a plain SVGP of the same code), and seconds per epoch."""
    rows = []
    for t in range(1, 6):
        base = f"runs.cpu.per_task.{t}"
        rows.append([f"{t} ({60 * t})", Bench("vargp", f"{base}.vargp_step_s", 3),
                     Bench("vargp", f"{base}.own_svgp_step_s", 3),
                     Bench("vargp", f"{base}.ratio_ar_vs_own_svgp", 2),
                     Bench("vargp", f"{base}.vargp_epoch_s", 2)])
    return table(["t (M total)", "VAR-GP s / step", "plain SVGP s / step", "ratio",
                  "VAR-GP s / epoch"], rows, results)


TABLES: dict[str, Callable[[Results], str]] = {
    "vargp-table1": vargp_table1,
    "vargp-tasks": vargp_tasks,
    "vargp-small": vargp_small,
    "vargp-toy": vargp_toy,
    "vargp-speed": vargp_speed,
}


# ---------------------------------------------------------------------------------------------
# pages
# ---------------------------------------------------------------------------------------------
def pages(root: Path = REPO_ROOT) -> list[Path]:
    """The pages whose tables are generated: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render_text(text: str, results: Results, where: str = "page") -> str:
    """``text`` with every table block rewritten from ``results`` (``KeyError`` naming the
    page for a block whose name :data:`TABLES` does not know)."""
    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise KeyError(f"{where}: unknown table {name!r}; known: {sorted(TABLES)}")
        return m.group(1) + TABLES[name](results).rstrip("\n") + "\n" + m.group(4)

    return BLOCK.sub(sub, text)


_NUMBER_CELL = re.compile(r"^[~<>≈]?\s*[-+−]?\d[\d,]*(\.\d+)?\s*(%|x|s)?(\s*±\s*\d[\d.]*\s*%?)?$")


def unmarked_number_tables(text: str) -> list[int]:
    """Line numbers (1-based) of Markdown tables outside the generated blocks that have a
    cell holding only a number (a measured value written by hand)."""
    inside = set()
    for m in BLOCK.finditer(text):
        first = text.count("\n", 0, m.start()) + 1
        inside.update(range(first, first + m.group(0).count("\n") + 1))
    found = []
    for i, line in enumerate(text.splitlines(), start=1):
        if i in inside or not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if any(_NUMBER_CELL.match(c) for c in cells):
            found.append(i)
    return found


def write_tables(check: bool = False, root: Path = REPO_ROOT,
                 results_dir: Path = RESULTS_DIR) -> list[Path]:
    """Rewrite the table blocks of every page (:func:`pages`) from ``results_dir``; returns
    the pages that changed (with ``check``: that would change; nothing is written)."""
    results = load_results(results_dir)
    changed = []
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        new = render_text(text, results, where=str(page.relative_to(root)))
        if new != text:
            changed.append(page)
            if not check:
                page.write_text(new, encoding="utf-8")
    return changed
