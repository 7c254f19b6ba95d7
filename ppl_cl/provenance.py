"""Where a number comes from: the code version and the machine, recorded in every run folder's
``config.json`` (``ppl-cl run``), in every ``results/<experiment>.json`` entry
(``ppl-cl report --save``) and in every benchmark JSON (``benchmarks/*.py``), so that a number
quoted in README.md or docs/ can be traced to the commit and the machine that made it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["REPO_ROOT", "code_version", "command_line", "machine_info", "portable_path",
           "relative_to_repo", "write_json"]

#: the checkout this package was imported from (the folder holding ``ppl_cl/``)
REPO_ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


OUTPUT_PATHS = ("benchmarks/results", "results")
"""Folders of measurements, not code: a change there (a benchmark rewriting its own JSON while
it runs) does not make the checkout dirty."""


def code_version() -> dict[str, Any]:
    """``{"commit": <HEAD's hash or None>, "dirty": <tracked files differ from HEAD>}`` of the
    checkout the package was imported from (``commit`` None outside a git checkout, e.g. an
    installed wheel). Untracked files and the output folders (:data:`OUTPUT_PATHS`) do not
    count as dirty."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".",
                  *(f":(exclude){p}" for p in OUTPUT_PATHS))
    return {"commit": commit, "dirty": bool(status)}


def machine_info() -> dict[str, Any]:
    """What a measurement records about the machine: platform, processor, CPU count, the
    thread settings (``OMP_NUM_THREADS``, torch's intra-op threads when torch is imported)
    and the 1-minute load average (other jobs running beside it)."""
    import sys

    info: dict[str, Any] = {"platform": platform.platform(),
                            "processor": platform.processor() or platform.machine(),
                            "python": platform.python_version(), "cpu_count": os.cpu_count(),
                            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    try:
        info["load_average_1min"] = round(os.getloadavg()[0], 2)
    except OSError:
        info["load_average_1min"] = None
    return info


def relative_to_repo(path: str | os.PathLike) -> str:
    """``path`` relative to the repository root when it lies inside it (POSIX separators),
    else as given: what a committed JSON may record without naming a developer's folders."""
    p = Path(path).resolve()
    try:
        return p.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


#: what :func:`portable_path` puts in place of the folders of a path outside the repository
OUTSIDE_REPO = "<outside the repository>"


def portable_path(path: str | os.PathLike) -> str:
    """``path`` relative to the repository root when it lies inside it, else its file name under
    :data:`OUTSIDE_REPO` (``<outside the repository>/vips.json``): what a committed JSON may
    record, naming no folder of the machine that wrote it."""
    try:
        return Path(path).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return f"{OUTSIDE_REPO}/{Path(path).name}"   # the name given (a link's, not its target's)


def command_line(argv: list[str] | None = None) -> str:
    """The command ``argv`` (default ``sys.argv``) as one string, every argument that is an
    absolute path or an existing relative one (also the value of ``--option=PATH``) written
    by :func:`portable_path`; other arguments as given."""
    import sys

    def one(arg: str) -> str:
        if arg.startswith("-") and "=" in arg:
            option, value = arg.split("=", 1)
            return f"{option}={one(value)}"
        is_path = os.path.isabs(arg) or (os.sep in arg and os.path.exists(arg))
        return portable_path(arg) if is_path else arg

    return " ".join(one(a) for a in (sys.argv if argv is None else argv))


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON, atomically (parent folders created); returns the path."""
    from ppl_cl.persist import atomic_write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")
    return path
