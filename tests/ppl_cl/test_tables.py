"""The committed number tables of README.md and docs/*.md equal what ``ppl-cl tables`` writes
from ``results/*.json``, no hand-written number table stands outside a generated block, and
``ppl-cl report --save`` writes results entries that trace each number to its runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppl_cl.provenance import REPO_ROOT
from ppl_cl.results import RESULTS_DIR, ResultsError, entry_from_runs, load_results, save_entry
from ppl_cl.tables import (BLOCK, TABLES, Val, format_value, pages, render_text,
                           unmarked_number_tables)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_committed_tables_are_generated(page: Path):
    text = page.read_text(encoding="utf-8")
    rendered = render_text(text, load_results(), where=page.name)
    assert rendered == text, (f"{page.name}: a table differs from what results/ gives; run "
                              "`ppl-cl tables` and commit")
    loose = unmarked_number_tables(text)
    assert not loose, (f"{page.name}: number table(s) outside a generated block at lines "
                       f"{loose}: quote results/ through ppl_cl/tables.py")


def test_every_block_names_a_known_table_and_every_table_is_used():
    used = set()
    for page in pages():
        used.update(m.group("name") for m in BLOCK.finditer(page.read_text(encoding="utf-8")))
    assert used <= set(TABLES)
    assert set(TABLES) <= used, f"tables no page shows: {sorted(set(TABLES) - used)}"


def test_every_committed_entry_is_quoted_by_a_table():
    """A result nobody reads is a table bug (a key spelled differently, a renderer that never
    parsed real keys): removing any one committed entry must change some table."""
    results = load_results()
    full = {name: fn(results) for name, fn in TABLES.items()}
    unquoted = []
    for exp, entries in results.items():
        for entry in entries:
            reduced = {**results, exp: {k: v for k, v in entries.items() if k != entry}}
            if all(fn(reduced) == full[name] for name, fn in TABLES.items()):
                unquoted.append(f"{exp} ({entry})")
    assert not unquoted, f"entries of results/ that no table shows: {unquoted}"


def test_results_files_are_small_and_traceable():
    files = sorted(RESULTS_DIR.glob("*.json"))
    for f in files:
        assert f.stat().st_size < 256_000, f"{f.name}: results are summaries, not run folders"
        data = json.loads(f.read_text())
        for label, entry in data["entries"].items():
            assert entry["runs"], (f.name, label)
            for run in entry["runs"]:
                assert run["code"] is not None and run["machine"] is not None, (f.name, label)
                assert "/" not in run["folder"], "a folder name, not a path"


def _fake_run(folder: Path, seed: int, value: float, curve: list[float], quick=False,
              overrides=None, experiment="vargp-split-mnist") -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({
        "experiment": experiment, "quick": quick, "seed": seed, "wall_time_s": 1.5,
        "summary": {"final_avg_accuracy": value, "average_accuracy": curve}}))
    (folder / "config.json").write_text(json.dumps({
        "experiment": experiment, "seed": seed, "quick": quick, "config": {"n_valid": 1},
        "overrides": overrides or {}, "versions": {}, "code": {"commit": "abc", "dirty": False},
        "machine": {"cpu_count": 2}}))
    return folder


def test_save_entry_aggregates_seeds_and_merges_entries(tmp_path):
    a = _fake_run(tmp_path / "s0", 0, 90.0, [99.0, 90.0])
    b = _fake_run(tmp_path / "s1", 1, 92.0, [98.0, 94.0])
    out = tmp_path / "results" / "vargp-split-mnist.json"
    entry = save_entry(out, "var_gp", [b, a])
    assert entry["seeds"] == [0, 1]
    s = entry["summary"]["final_avg_accuracy"]
    assert s["mean"] == pytest.approx(91.0) and s["std"] == pytest.approx(2 ** 0.5)
    assert entry["summary"]["average_accuracy"]["mean"] == pytest.approx([98.5, 92.0])
    assert [r["folder"] for r in entry["runs"]] == ["s0", "s1"]
    # the registered claim (Table 1's order) is checked, here without the other rows' keys
    assert entry["claims"] and entry["claims"][0]["holds"] is None
    c = _fake_run(tmp_path / "q", 0, 60.0, [61.0, 62.0], quick=True)
    save_entry(out, "quick", [c])
    data = load_results(out.parent)["vargp-split-mnist"]
    assert set(data) == {"quick", "var_gp"}
    cell = Val("vargp-split-mnist", "var_gp", "final_avg_accuracy").render(
        {"vargp-split-mnist": data})
    assert cell == "91.00 ± 1.41"
    assert Val("vargp-split-mnist", "nosuch", "final_avg_accuracy").render(
        {"vargp-split-mnist": data}) == "—"


def test_save_entry_refuses_mixed_groups_wrong_file_and_duplicates(tmp_path):
    a = _fake_run(tmp_path / "a", 0, 1.0, [1.0])
    b = _fake_run(tmp_path / "b", 1, 1.0, [1.0], overrides={"n_valid": "5"})
    with pytest.raises(ResultsError, match="groups"):
        entry_from_runs([a, b])
    c = _fake_run(tmp_path / "c", 0, 1.0, [1.0])
    with pytest.raises(ResultsError, match="twice"):
        entry_from_runs([a, c])
    with pytest.raises(ResultsError, match="vargp-split-mnist.json"):
        save_entry(tmp_path / "other.json", "x", [a])
    with pytest.raises(ResultsError, match="label"):
        save_entry(tmp_path / "vargp-split-mnist.json", "a b", [a])
    with pytest.raises(ResultsError, match="not a finished run"):
        entry_from_runs([tmp_path])


def test_render_rewrites_blocks_and_rejects_unknown_names():
    text = "x\n<!-- table: vargp-table1 -->\nstale\n<!-- /table -->\ny\n"
    out = render_text(text, {})
    assert "stale" not in out and out.startswith("x\n<!-- table: vargp-table1 -->\n| row |")
    assert out.endswith("<!-- /table -->\ny\n")
    assert render_text(out, {}) == out
    with pytest.raises(KeyError, match="nosuch"):
        render_text("<!-- table: nosuch -->\n<!-- /table -->\n", {})


def test_unmarked_number_tables_finds_hand_written_numbers():
    text = ("| what | test |\n|---|---|\n| a bound | tests/x.py |\n\n"
            "| row | acc |\n|---|---|\n| ours | 91.3 ± 0.2 |\n")
    assert unmarked_number_tables(text) == [7]
    assert format_value({"mean": 0.5, "std": 0.1, "n": 3}, 3) == "0.500 ± 0.100"
    assert format_value({"mean": 0.5, "std": 0.0, "n": 1}, 1) == "0.5"
    assert format_value(None) == "—" and format_value(float("nan")) == "—"


def test_readme_losses_show_the_protocol_entry_over_quick_ones():
    """README's losses table lists an experiment's ``--quick`` entries only while no checked
    entry beyond ``--quick`` exists (the ``claims`` table keeps every entry)."""
    from ppl_cl.tables import claims, readme_losses

    lost = [{"text": "A below B", "holds": False}]
    quick_only = {"exp": {"quick": {"quick": True, "claims": lost, "summary": {}}}}
    assert "`exp` (quick)" in readme_losses(quick_only)
    both = {"exp": {**quick_only["exp"], "default": {"quick": False, "summary": {},
                                                     "claims": [{"text": "A below B",
                                                                 "holds": True}]}}}
    assert "`exp`" not in readme_losses(both)
    assert "every checked claim holds" in readme_losses(both)
    assert "`exp` (quick)" in claims(both) and "`exp` (default)" in claims(both)


def test_vips_table1_reads_each_row_from_the_entry_that_holds_it():
    """Table 1's datasets and methods may be saved as several full entries (one override set
    each): every row comes from the entry holding it, ``default`` first, never from ``--quick``."""
    from ppl_cl.tables import vips_table1

    def entry(quick, **summary):
        return {"quick": quick, "summary": summary, "claims": []}

    results = {"vips-table1": {
        "default": entry(False, concrete_rmse_vips=0.111, concrete_folds_run=5),
        "elevators-vips": entry(False, elevators_rmse_vips=0.222, elevators_folds_run=5,
                                concrete_rmse_vips=0.999),
        "elevators-cv": entry(False, elevators_rmse_cv=0.333, elevators_folds_run=2),
        "quick": entry(True, elevators_rmse_oips=0.444, elevators_folds_run=1)}}
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line
            for line in vips_table1(results).splitlines()[2:]}
    assert "0.111" in rows["concrete", "VIPS"] and "0.999" not in rows["concrete", "VIPS"]
    assert "0.222" in rows["elevators", "VIPS"] and rows["elevators", "VIPS"].endswith("| 5 |")
    assert "0.333" in rows["elevators", "Conditional Variance"]
    assert rows["elevators", "Conditional Variance"].endswith("| 2 |")
    assert "0.444" not in rows["elevators", "OIPS"]
