"""Every notebook executes end to end in smoke mode (examples run), and the run is
checked, not only its absence of exceptions: every code cell ran, at least one figure came out,
and no output shows a traceback or a path of the machine that ran it. The committed notebooks
(executed with the outputs of a full run) are held to the same checks."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from ppl_cl.notebooks import KERNEL_WARNINGS

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))

#: absolute paths of a machine (the repository, temporary folders, home directories)
MACHINE_PATH = re.compile(r"/(?:work|tmp|home|root)/")
IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml")


def _output_texts(output) -> list[str]:
    """The text of one output: a stream, the textual MIME types of a result / display, or an
    error's name, value and traceback (images are skipped)."""
    kind = output.get("output_type")
    if kind == "stream":
        return [output.get("text", "")]
    if kind == "error":
        return [output.get("ename", ""), output.get("evalue", ""),
                "\n".join(output.get("traceback", []))]
    texts = []
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/") or mime.endswith("json"):
            texts.append("".join(value) if isinstance(value, list) else str(value))
    return texts


def notebook_problems(nb) -> list[str]:
    """What is wrong with an executed notebook (empty: nothing)."""
    problems = []
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    if not code:
        problems.append("no code cells")
    images = 0
    for i, cell in code:
        if cell.source.strip() and cell.get("execution_count") is None:
            problems.append(f"cell {i} was not executed")
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                problems.append(f"cell {i}: error output {output.get('ename')}")
            if any(mime in output.get("data", {}) for mime in IMAGE_TYPES):
                images += 1
            for text in _output_texts(output):
                if "Traceback" in text:
                    problems.append(f"cell {i}: an output shows a traceback")
                match = MACHINE_PATH.search(text)
                if match:
                    start = max(0, match.start() - 40)
                    problems.append(f"cell {i}: machine path in an output: "
                                    f"{text[start:match.end() + 40]!r}")
    if images == 0:
        problems.append("no image output")
    return problems


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert {"tour.ipynb", "vargp.ipynb"} <= names, names


def test_the_checks_catch_a_wrong_run():
    """The checks above fail on each kind of wrong run they are meant to catch."""
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    def nb(*outputs, count=1):
        cell = new_code_cell("print(1)", execution_count=count, outputs=list(outputs))
        return new_notebook(cells=[cell])

    image = new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})
    assert notebook_problems(nb(image)) == []
    assert any("not executed" in p for p in notebook_problems(nb(image, count=None)))
    assert notebook_problems(nb(new_output("stream", name="stdout", text="1\n"))) == \
        ["no image output"]
    tb = new_output("stream", name="stderr", text="Traceback (most recent call last):\n")
    assert any("traceback" in p for p in notebook_problems(nb(image, tb)))
    for path in ("/work/main/x.py", "/tmp/abc/gp.npz", "/home/me/a", "/root/.cache/b"):
        out = new_output("execute_result", data={"text/plain": f"'{path}'"}, execution_count=1)
        assert any("machine path" in p for p in notebook_problems(nb(image, out))), path
    err = new_output("error", ename="ValueError", evalue="bad", traceback=[])
    assert any("error output" in p for p in notebook_problems(nb(image, err)))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_is_executed_and_clean(path):
    """The committed outputs (a full run) are complete and carry no machine paths."""
    assert notebook_problems(nbformat.read(path, as_version=4)) == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_smoke_mode(path, tmp_path, monkeypatch):
    monkeypatch.setenv("PPL_CL_SMOKE", "1")
    monkeypatch.setenv("PPL_CL_PROGRESS", "0")
    # a compilation cache of this run's own: another process evicting entries of a shared one
    # makes JAX warn (with a path) in the middle of a cell
    monkeypatch.setenv("PPL_CL_JAX_CACHE", str(tmp_path / "jax-cache"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONWARNINGS", KERNEL_WARNINGS)   # as `python -m ppl_cl.notebooks run`
    monkeypatch.chdir(tmp_path)
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:       # the committed outputs must not count as this run's
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert notebook_problems(nb) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_outputs_come_from_todays_sources(path):
    """The stored outputs were made by the code the notebook exercises today (the digest of
    those sources, stored at execution by ``python -m ppl_cl.notebooks run``)."""
    from ppl_cl.notebooks import is_current

    ok, why = is_current(path)
    assert ok, why


def test_the_sources_digest_sees_a_change(tmp_path):
    """A notebook's exercised files follow its imports at any depth, and editing one of them
    changes the digest."""
    import shutil

    from nbformat.v4 import new_code_cell, new_notebook

    from ppl_cl.notebooks import exercised_files, sources_digest
    from ppl_cl.provenance import REPO_ROOT

    for pkg in ("ppl_cl", "models", "inference"):
        shutil.copytree(REPO_ROOT / pkg, tmp_path / pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))
    nb = new_notebook(cells=[new_code_cell("%matplotlib inline\nfrom ppl_cl.learners.vargp "
                                           "import VARGP")])
    files = exercised_files(nb, root=tmp_path)
    names = {f.relative_to(tmp_path).as_posix() for f in files}
    # the learner, its model (imported by the learner) and that model's algebra
    assert {"ppl_cl/learners/vargp.py", "models/vargp.py", "models/vargp_math.py"} <= names
    assert all(n.split("/")[0] in ("ppl_cl", "models", "inference") for n in names)
    before = sources_digest(files, root=tmp_path)
    target = tmp_path / "models" / "vargp_math.py"
    target.write_text(target.read_text() + "\n# edited\n")
    assert sources_digest(files, root=tmp_path) != before
