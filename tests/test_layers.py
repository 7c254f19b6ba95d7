"""Imports flow ppl_cl -> inference -> models only (DESIGN.md, "Layers")."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALLOWED = {"models": {"models"}, "inference": {"inference", "models"},
           "ppl_cl": {"ppl_cl", "inference", "models"}}
OURS = set(ALLOWED)


def _package_of(path: Path) -> str:
    try:
        return path.relative_to(REPO).parts[0]
    except ValueError:
        return "<outside>"


def _imported_top_levels(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: stays inside its own package
                out.append((node.lineno, _package_of(path)))
            elif node.module:
                out.append((node.lineno, node.module.split(".")[0]))
    return out


def test_every_module_imports_only_downward():
    violations = []
    n_files = 0
    for package, allowed in ALLOWED.items():
        for path in sorted((REPO / package).rglob("*.py")):
            n_files += 1
            for lineno, top in _imported_top_levels(path):
                if top in OURS and top not in allowed:
                    violations.append(f"{path.relative_to(REPO)}:{lineno} imports {top}")
    assert n_files >= 10, "the packages should not be empty"
    assert not violations, "layer violations:\n" + "\n".join(violations)


def test_checker_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom ppl_cl.batch import Batch\nif True:\n    import inference.x\n")
    assert [t for _, t in _imported_top_levels(bad)] == ["os", "ppl_cl", "inference"]
