"""Imports flow ppl_cl -> inference -> models only (docs/design.md, Layers), and inside ppl_cl
from the user-facing floors down: core < data < learners < protocols < experiments < results
< tables < sweep < cli (results and tables read the experiments' registry). No
module imports from a higher layer or floor (so there is no cycle between them), and the light
entry points load neither torch nor Pyro."""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALLOWED = {"models": {"models"}, "inference": {"inference", "models"},
           "ppl_cl": {"ppl_cl", "inference", "models"}}
OURS = set(ALLOWED)
#: the floors of ppl_cl, lowest first; a module not named here is core
FLOORS = ("core", "data", "learners", "protocols", "experiments", "results", "tables", "sweep",
          "cli")


def _package_of(path: Path) -> str:
    try:
        return path.relative_to(REPO).parts[0]
    except ValueError:
        return "<outside>"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in ``path`` (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1]) \
        if path.is_relative_to(REPO) else _package_of(path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                out.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
            elif node.module:
                out.append((node.lineno, node.module))
    return out


def _imported_top_levels(path: Path) -> list[tuple[int, str]]:
    return [(line, mod.split(".")[0]) for line, mod in _imports(path)]


def floor_of(module: str) -> int:
    """The floor of a ``ppl_cl`` module (``ppl_cl.learners.vargp`` -> learners)."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else ""
    return FLOORS.index(name) if name in FLOORS else 0


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


def test_floors_inside_ppl_cl_import_only_downward():
    violations = []
    for path in sorted((REPO / "ppl_cl").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if module.endswith(".__init__"):
            module = module[:-len(".__init__")]
        mine = floor_of(module)
        for lineno, imported in _imports(path):
            if imported.startswith("ppl_cl.") and floor_of(imported) > mine:
                violations.append(f"{path.relative_to(REPO)}:{lineno} ({FLOORS[mine]}) imports "
                                  f"{imported} ({FLOORS[floor_of(imported)]})")
    assert not violations, "floor violations:\n" + "\n".join(violations)


def test_checker_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom ppl_cl.batch import Batch\nif True:\n    import inference.x\n")
    assert [t for _, t in _imported_top_levels(bad)] == ["os", "ppl_cl", "inference"]
    assert floor_of("ppl_cl.experiments.vargp") > floor_of("ppl_cl.protocols") > \
        floor_of("ppl_cl.learners.vargp") > floor_of("ppl_cl.data.streams") == 1 > \
        floor_of("ppl_cl.batch")


def test_light_entry_points_load_neither_torch_nor_pyro():
    """Importing ExactGP and running `ppl-cl list` (which imports every experiment module)
    load neither torch nor Pyro: experiment modules keep heavy imports inside their runs."""
    code = ("import sys\n"
            "from ppl_cl.learners.exact_gp import ExactGP\n"
            "import ppl_cl.learners, ppl_cl.configs.vargp\n"
            "loaded = sorted(m for m in ('torch', 'pyro') if m in sys.modules)\n"
            "from ppl_cl.cli import main\n"
            "assert main(['list']) == 0\n"
            "after = sorted(m for m in ('torch', 'pyro', 'jax') if m in sys.modules)\n"
            "print('LOADED', loaded, after)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "LOADED [] []" in out.stdout, out.stdout
