"""The notebooks' provenance: which of our source files a notebook exercises, a digest of them
stored in the notebook's metadata when it is executed, and the execution itself.

    python -m ppl_cl.notebooks run [NAME ...]     # execute notebooks/NAME.ipynb in place
    python -m ppl_cl.notebooks check              # exit 1 when a notebook is stale

A notebook exercises the modules of ``ppl_cl``, ``models`` and ``inference`` that its code
cells import, and every module those import, at any depth and from inside functions too (the
experiments' registry imports the experiments when it is first called). Its stored outputs are
current when ``metadata["ppl_cl"]["sources_sha256"]`` equals the digest of those files today;
``tests/test_notebooks.py`` fails otherwise, so a change to the code a notebook runs requires
executing it again.
"""

from __future__ import annotations

import ast
import hashlib
import sys
from pathlib import Path
from typing import Iterable

from ppl_cl.provenance import REPO_ROOT

__all__ = ["PACKAGES", "NOTEBOOK_DIR", "KERNEL_WARNINGS", "exercised_files", "sources_digest",
           "is_current", "execute"]

PACKAGES = ("ppl_cl", "models", "inference")
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
KERNEL_WARNINGS = "ignore::FutureWarning:arviz"
"""``PYTHONWARNINGS`` of the notebook kernels: ArviZ 0.23 warns on import once a day (a notice
of its coming refactor, with the path of its package), which would otherwise land in the
outputs of whichever notebook imports ArviZ first that day."""


def _module_file(name: str, root: Path) -> Path | None:
    parts = name.split(".")
    if parts[0] not in PACKAGES:
        return None
    base = root.joinpath(*parts)
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _imports(tree: ast.AST, package: str | None) -> set[str]:
    """Every module an AST imports (absolute names; relative imports resolved in
    ``package``), including ``from A import B`` as both ``A`` and ``A.B``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level and package:
                up = package.split(".")
                up = up[:len(up) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base:
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names)
    return out


def _code_of_cells(sources: Iterable[str]) -> str:
    lines = []
    for src in sources:
        for line in src.splitlines():
            stripped = line.lstrip()
            lines.append("" if stripped.startswith(("%", "!")) else line)
        lines.append("")
    return "\n".join(lines)


def exercised_files(nb, root: Path = REPO_ROOT) -> list[Path]:
    """Our source files that notebook ``nb`` (an nbformat node) exercises, sorted."""
    code = _code_of_cells(c.source for c in nb.cells if c.cell_type == "code")
    todo = {m for m in _imports(ast.parse(code), None) if m.split(".")[0] in PACKAGES}
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        # a module's parents are imported with it
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in seen:
                todo.add(parent)
        path = _module_file(name, root)
        if path is None or name in seen:
            continue
        seen[name] = path
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        text = path.read_text(encoding="utf-8")
        deps = _imports(ast.parse(text), package)
        if path.name == "__init__.py" and "import_module" in text:
            # a registry that imports its package's modules by name (the experiments, the
            # learners): all of them are exercised
            deps |= {f"{name}.{p.stem}" for p in path.parent.glob("*.py")
                     if p.name != "__init__.py"}
        for dep in deps:
            if dep.split(".")[0] in PACKAGES and dep not in seen:
                todo.add(dep)
    return sorted(set(seen.values()))


def sources_digest(files: Iterable[Path], root: Path = REPO_ROOT) -> str:
    """sha256 over the files' repository paths and contents, in order."""
    h = hashlib.sha256()
    for f in files:
        h.update(Path(f).relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(Path(f).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def is_current(path: Path) -> tuple[bool, str]:
    """Whether the notebook's stored outputs come from today's sources, and why not."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    stored = nb.metadata.get("ppl_cl", {}).get("sources_sha256")
    if stored is None:
        return False, f"{path.name}: no sources digest in its metadata (never executed by " \
                      "`python -m ppl_cl.notebooks run`)"
    today = sources_digest(exercised_files(nb))
    if stored != today:
        return False, f"{path.name}: executed on other sources than today's (run `python -m " \
                      f"ppl_cl.notebooks run {path.stem}`)"
    return True, ""


def execute(path: Path, timeout: int = 3600) -> None:
    """Execute the notebook in place (full mode: ``PPL_CL_SMOKE`` unset), from the notebooks
    folder, and store the digest of the sources it exercised."""
    import os

    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    files = exercised_files(nb)
    digest = sources_digest(files)
    saved = {k: os.environ.get(k) for k in ("PPL_CL_SMOKE", "PYTHONWARNINGS")}
    os.environ.pop("PPL_CL_SMOKE", None)
    # the kernel inherits the environment
    os.environ["PYTHONWARNINGS"] = ",".join(
        w for w in (saved["PYTHONWARNINGS"], KERNEL_WARNINGS) if w)
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    nb.metadata["ppl_cl"] = {"sources_sha256": digest, "source_files": len(files)}
    nbformat.write(nb, path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("run", "check"):
        print(__doc__.split("\n\n")[1])
        return 2
    names = argv[1:] or sorted(p.stem for p in NOTEBOOK_DIR.glob("*.ipynb"))
    paths = [NOTEBOOK_DIR / f"{n}.ipynb" for n in names]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        print(f"no such notebook: {', '.join(p.name for p in missing)}")
        return 2
    if argv[0] == "run":
        for p in paths:
            execute(p)
            print(f"executed {p.relative_to(REPO_ROOT)}")
        return 0
    stale = [why for ok, why in map(is_current, paths) if not ok]
    for why in stale:
        print(why)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
