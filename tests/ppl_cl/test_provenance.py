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
