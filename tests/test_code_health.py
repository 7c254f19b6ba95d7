"""Readable sizes and boundaries: no function over 80 lines and no private name imported across
modules, counted by ``tools/code_report.py`` over models/, inference/, ppl_cl/, benchmarks/
and tools/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _report():
    spec = importlib.util.spec_from_file_location("code_report", ROOT / "tools" / "code_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_function_over_80_lines():
    mod = _report()
    assert mod.long_functions(mod.source_files(), 80) == []


def test_no_private_name_imported_across_modules():
    mod = _report()
    assert mod.private_imports(mod.source_files()) == []


def test_the_counts_see_a_long_function_and_a_private_import(tmp_path):
    """The counters are not vacuous: a planted 81-line function and a planted private import
    are found."""
    mod = _report()
    pkg = tmp_path / "ppl_cl"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    (pkg / "a.py").write_text(f"def long():\n{body}\n")
    (pkg / "b.py").write_text("from ppl_cl.a import _hidden\n")
    mod.ROOT = tmp_path
    files = [pkg / "a.py", pkg / "b.py"]
    assert [(name, n) for _, name, n in mod.long_functions(files, 80)] == [("long", 81)]
    assert mod.private_imports(files) == [("ppl_cl/b.py", "ppl_cl.a._hidden")]
