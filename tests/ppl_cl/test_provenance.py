"""ppl_cl/provenance.py: the paths a committed JSON records name no folder of the machine."""

from __future__ import annotations

from ppl_cl.provenance import OUTSIDE_REPO, REPO_ROOT, command_line, portable_path


def test_portable_path_inside_and_outside_the_repository(tmp_path):
    assert portable_path(REPO_ROOT / "benchmarks" / "results" / "kalman.json") == \
        "benchmarks/results/kalman.json"
    assert portable_path(tmp_path / "out" / "vips.json") == f"{OUTSIDE_REPO}/vips.json"
    target = tmp_path / "python3.11"
    target.write_text("")
    (tmp_path / "python").symlink_to(target)
    assert portable_path(tmp_path / "python") == f"{OUTSIDE_REPO}/python"   # the link's name


def test_command_line_rewrites_path_arguments_only(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    argv = [str(REPO_ROOT / "benchmarks" / "vips.py"), "--dataset", "kin8nm", "--batches", "8",
            "--out", str(tmp_path / "vips.json"), f"--data-dir={tmp_path}", "benchmarks/README.md",
            "a/b/not-a-file"]
    assert command_line(argv) == (
        "benchmarks/vips.py --dataset kin8nm --batches 8 "
        f"--out {OUTSIDE_REPO}/vips.json --data-dir={OUTSIDE_REPO}/{tmp_path.name} "
        "benchmarks/README.md a/b/not-a-file")


def test_code_version_counts_code_not_measurements(tmp_path, monkeypatch):
    """A benchmark rewriting its JSON under benchmarks/results/ (or a results/ file) leaves the
    checkout clean; a changed source file makes it dirty."""
    import subprocess

    from ppl_cl import provenance

    def git(*a):
        subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)

    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "results").mkdir()
    for f in ("code.py", "benchmarks/results/b.json", "results/r.json"):
        (tmp_path / f).write_text("0\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.setattr(provenance, "REPO_ROOT", tmp_path)
    assert provenance.code_version()["dirty"] is False
    (tmp_path / "benchmarks/results/b.json").write_text("1\n")
    (tmp_path / "results/r.json").write_text("1\n")
    assert provenance.code_version()["dirty"] is False
    (tmp_path / "code.py").write_text("1\n")
    assert provenance.code_version()["dirty"] is True
