"""The `ppl-cl` command: list, run (stable names), --set parsing, data list, reproduce."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ppl_cl.cli import main
from ppl_cl.errors import ConfigError
from ppl_cl.experiments import build_config, get


def test_list_shows_registered_experiments(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "exact-gp-uci" in out and "exact-gp-synthetic" in out


def test_console_script_installed():
    exe = shutil.which("ppl-cl") or str(__import__("pathlib").Path(sys.executable).parent / "ppl-cl")
    out = subprocess.run([exe, "list"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "exact-gp-uci" in out.stdout, out.stderr


@pytest.mark.data("uci-gal/concrete")
def test_run_exact_gp_uci_quick_writes_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "exact-gp-uci", "--quick", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    summary = metrics["summary"]
    assert isinstance(summary["rmse"], float) and isinstance(summary["nlpd"], float)
    assert "standardized" in metrics["units"]
    # the exact GP on concrete is a well-known quantity: VIPS Table 1 reports .33 (.01)
    assert 0.2 < summary["rmse"] < 0.45 and summary["nlpd"] < 0.6
    config = json.loads((out / "config.json").read_text())
    assert config["experiment"] == "exact-gp-uci" and config["quick"] is True
    assert config["config"]["dataset"] == "concrete"
    for name in ("predictions.png", "checkpoint.npz", "posterior.nc"):
        assert (out / name).is_file()
    assert metrics["figures"] == ["predictions.png"]


def test_run_writes_a_progress_log_and_accepts_resume(tmp_path, capsys):
    from ppl_cl.experiments.base import RunContext

    out = tmp_path / "run"
    assert main(["run", "exact-gp-synthetic", "--quick", "--out", str(out)]) == 0
    lines = (out / "progress.log").read_text().splitlines()
    assert "start exact-gp-synthetic seed=0 quick=True" in lines[0] and "done in" in lines[-1]
    # one line per unit of work (the 4 batches), as the loop goes
    assert [line.split("  ", 1)[1].split(" (")[0] for line in lines[1:5]] == [
        f"batches: {i}/4" for i in range(1, 5)]
    # --resume on the finished run says so and trains nothing (the log is untouched)
    capsys.readouterr()
    assert main(["run", "exact-gp-synthetic", "--quick", "--out", str(out), "--resume"]) == 0
    assert "nothing to resume" in capsys.readouterr().err
    assert (out / "progress.log").read_text().splitlines() == lines
    # --resume with nothing to resume from is a plain run; the log is kept and appended to
    (out / "metrics.json").unlink()
    assert main(["run", "exact-gp-synthetic", "--quick", "--out", str(out), "--resume"]) == 0
    log = (out / "progress.log").read_text()
    assert log.count("start exact-gp-synthetic") == 1 and "resume exact-gp-synthetic" in log
    # a checkpoint from another run is refused with a one-line error naming what differs
    other = RunContext(out_dir=out, resume=True, fingerprint={"experiment": "x", "seed": 1})
    other.save_checkpoint("unit", {"a": 1})
    mine = RunContext(out_dir=out, resume=True, fingerprint={"experiment": "x", "seed": 2})
    with pytest.raises(Exception, match="different run \\(seed: 1 -> 2\\)"):
        mine.load_checkpoint("unit")
    assert RunContext(out_dir=out, fingerprint={"seed": 2}).load_checkpoint("unit") is None


def test_a_failed_run_says_why_in_its_progress_log(tmp_path, monkeypatch):
    """The reason a long run stopped stays in its folder (its stderr may be gone)."""
    out = tmp_path / "run"
    spec = get("exact-gp-synthetic")

    def boom(config, ctx):
        ctx.log("unit 1 done")
        raise FloatingPointError("loss is not finite at step 7\nsecond line")

    monkeypatch.setattr(spec, "run", boom)
    assert main(["run", "exact-gp-synthetic", "--quick", "--out", str(out)]) == 1
    assert not (out / "metrics.json").exists()
    lines = (out / "progress.log").read_text().splitlines()
    assert "unit 1 done" in lines[1]
    assert "failed: FloatingPointError: loss is not finite at step 7 after" in lines[-1]
    assert "second line" not in lines[-1]


def test_sigterm_ends_a_run_with_a_log_line_and_status_143(tmp_path, monkeypatch):
    """``kill`` (SIGTERM, a batch system's time limit) stops ``ppl-cl run`` like Ctrl-C: the log
    says so, the checkpoints stay, the status is 128 + 15, and the old handler comes back."""
    import os
    import signal
    import time

    out = tmp_path / "run"
    spec = get("exact-gp-synthetic")

    def slow(config, ctx):
        ctx.save_checkpoint("unit", {"done": 1})
        ctx.log("unit 1 done")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)                       # the handler raises here, in the main thread
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(spec, "run", slow)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["run", "exact-gp-synthetic", "--quick", "--out", str(out)]) == 143
    lines = (out / "progress.log").read_text().splitlines()
    assert "unit 1 done" in lines[1]
    assert "terminated (SIGTERM) after" in lines[-1]
    assert (out / "checkpoints" / "unit.npz").is_file()
    assert signal.getsignal(signal.SIGTERM) is before


def test_checkpoint_every_option(tmp_path, capsys):
    from ppl_cl.cli import build_parser

    args = build_parser().parse_args(["run", "vargp-toy", "--checkpoint-every", "30"])
    assert args.checkpoint_every == 30.0
    assert build_parser().parse_args(["reproduce"]).checkpoint_every == 600.0
    assert main(["run", "exact-gp-synthetic", "--quick", "--out", str(tmp_path),
                 "--checkpoint-every", "-1"]) == 2
    assert "checkpoint_every_s" in capsys.readouterr().err


def test_set_overrides_are_typed_and_checked():
    spec = get("exact-gp-uci")
    cfg = build_config(spec, quick=True, overrides={"dataset": "yacht", "split": "3",
                                                    "learner.noise_variance": "0.5"})
    assert (cfg.dataset, cfg.split, cfg.learner.noise_variance) == ("yacht", 3, 0.5)
    assert cfg.learner.max_iterations == spec.quick["learner.max_iterations"]
    with pytest.raises(ConfigError, match="unknown config key 'nope'"):
        build_config(spec, overrides={"nope": "1"})
    with pytest.raises(ConfigError, match="learner: unknown config key 'nope'"):
        build_config(spec, overrides={"learner.nope": "1"})
    with pytest.raises(ConfigError, match=r"split=abc: expected int, received 'abc'"):
        build_config(spec, overrides={"split": "abc"})
    with pytest.raises(ConfigError, match="kernel"):   # the learner config's own check
        build_config(spec, overrides={"learner.kernel": "rbf"})


def test_list_overrides_accept_shell_forms():
    """``--set ablations=...`` as JSON, bare comma list, or bracketed without quotes (the form
    that a shell leaves after ``'ablations=[block_diag,global]'``) all give the same tuple."""
    spec = get("vargp-split-digits")
    want = ("block_diag", "global")
    for text in ('["block_diag", "global"]', "block_diag,global", "[block_diag,global]",
                 "[block_diag, 'global']"):
        assert tuple(build_config(spec, overrides={"ablations": text}).ablations) == want
    assert tuple(build_config(spec, overrides={"ablations": "[]"}).ablations) == ()


def test_cli_errors_are_one_line(capsys, tmp_path):
    """Every argument, config, path and device error is one ``ppl-cl:`` line naming what was
    expected and what was received, status 2, no traceback, and no run folder left behind."""
    cases = [
        (["run", "no-such-experiment"], "unknown experiment 'no-such-experiment'"),
        (["run", "exact-gp-uci", "--set", "nope=1"], "unknown config key 'nope'"),
        (["run", "exact-gp-uci", "--set", "key"], "--set: expected key=value, received 'key'"),
        (["run", "vargp-toy", "--set", "learner.max_epochs=abc"],
         "learner.max_epochs=abc: expected int, received 'abc'"),
        (["run", "exact-gp-uci", "--set", "dataset=nosuchset"],
         "dataset=nosuchset: expected one of 'concrete'"),
        (["reproduce", "--only", "vargp-tooy"], "--only: unknown experiment(s) vargp-tooy"),
        (["run", "exact-gp-synthetic", "--threads", "0"], "--threads: expected an int >= 1"),
        (["run", "exact-gp-synthetic", "--seed", "-1"], "--seed: expected an int in 0..4294967295"),
        (["run", "exact-gp-synthetic", "--seed", str(2**32)], "--seed: expected an int in 0.."),
        (["reproduce", "--seeds", "0", "-2"], "--seeds: expected an int in 0.."),
        (["compare", "split-digits", "--seeds", "-1"], "--seeds: expected an int in 0.."),
        (["sweep", "exact-gp-synthetic", "--seeds", "-1"], "--seeds: expected an int in 0.."),
        (["run", "exact-gp-synthetic", "--data-dir", str(tmp_path / "nonexistent")],
         "--data-dir " + str(tmp_path / "nonexistent") + ": no such folder"),
    ]
    for argv, message in cases:
        out = tmp_path / f"run{len(message)}"
        assert main(argv + ["--out", str(out)]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("ppl-cl: ") and message in err, (argv, err)
        assert "Traceback" not in err and err.count("\n") == 1, err
        assert not out.exists(), argv          # refused before any folder is made
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["run", "exact-gp-synthetic", "--out", str(afile)]) == 2
    assert "expected a folder for the run, received the file" in capsys.readouterr().err
    # a folder that cannot be made: the error names the option and the folder, one line
    for argv in (["run", "exact-gp-synthetic", "--quick"], ["report", str(tmp_path)],
                 ["reproduce", "--quick", "--only", "exact-gp-synthetic"]):
        assert main(argv + ["--out", str(afile / "run")]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"ppl-cl: --out {afile / 'run'}: cannot create the folder") \
            and err.count("\n") == 1, (argv, err)
    assert main(["report", str(tmp_path), "--notes", str(tmp_path / "none.md")]) == 2
    assert capsys.readouterr().err.startswith(f"ppl-cl: --notes {tmp_path / 'none.md'}: ")
    # --data-dir that does not exist is an error even when PPL_CL_DATA names a real root
    assert main(["data", "list", "--data-dir", str(tmp_path / "nonexistent")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_a_failed_run_is_status_1_and_leaves_nothing_report_would_read(tmp_path, capsys,
                                                                        monkeypatch):
    from ppl_cl.experiments.reproduce import collect

    def broken(config, ctx):
        raise ArithmeticError("boom")

    spec = get("exact-gp-synthetic")
    monkeypatch.setattr(spec, "run", broken)
    out = tmp_path / "r"
    assert main(["run", "exact-gp-synthetic", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "ppl-cl: the run failed: ArithmeticError: boom" in err and "Traceback" not in err
    assert not (out / "metrics.json").exists()
    with pytest.raises(FileNotFoundError, match="not a finished run"):
        collect([out], tmp_path / "rep")
    with pytest.raises(ArithmeticError):
        main(["run", "exact-gp-synthetic", "--out", str(out), "--debug"])


def test_a_finished_run_folder_is_refused_unless_force(tmp_path, capsys, monkeypatch):
    spec = get("exact-gp-synthetic")
    calls = []

    def tiny(config, ctx):
        calls.append(1)
        return {"summary": {"rmse": float(len(calls))}}

    monkeypatch.setattr(spec, "run", tiny)
    out = tmp_path / "r"
    assert main(["run", "exact-gp-synthetic", "--out", str(out)]) == 0
    assert main(["run", "exact-gp-synthetic", "--out", str(out)]) == 2
    assert "holds a finished run" in capsys.readouterr().err and calls == [1]
    assert main(["run", "exact-gp-synthetic", "--out", str(out), "--force"]) == 0
    assert json.loads((out / "metrics.json").read_text())["summary"]["rmse"] == 2.0
    # a forced rerun that fails leaves no old numbers for `ppl-cl report` to read
    monkeypatch.setattr(spec, "run", lambda c, ctx: 1 / 0)
    assert main(["run", "exact-gp-synthetic", "--out", str(out), "--force"]) == 1
    assert not (out / "metrics.json").exists()
    # run files are world-readable, like the figures
    assert main(["run", "exact-gp-synthetic", "--out", str(tmp_path / "p")]) == 1
    monkeypatch.setattr(spec, "run", tiny)
    assert main(["run", "exact-gp-synthetic", "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "metrics.json").stat().st_mode & 0o044 == 0o044


def test_broken_checkpoints_raise_checkpoint_error_naming_the_path(tmp_path):
    import numpy as np

    from ppl_cl.persist import CheckpointError, load_tree, save_tree

    save_tree(tmp_path / "ok.npz", {"a": np.arange(200.0)}, meta={"x": 1})
    raw = (tmp_path / "ok.npz").read_bytes()
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0xFF
    files = {"truncated": raw[: len(raw) // 2], "flipped": bytes(flipped), "empty": b"",
             "text": b"hello world\n"}
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    for name, data in files.items():
        (tmp_path / f"{name}.npz").write_bytes(data)
    for name in (*files, "other"):
        path = tmp_path / f"{name}.npz"
        with pytest.raises(CheckpointError) as info:
            load_tree(path)
        assert str(path) in str(info.value) and "allow_pickle" not in str(info.value), name
    assert load_tree(tmp_path / "ok.npz")[1] == {"x": 1}


def test_data_list_reports_found_and_missing(tmp_data_root, capsys):
    assert main(["data", "list", "--no-checksum"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_data_root) in out
    assert "digits" in out and "(bundled)" in out
    assert "missing mnist/train-images-idx3-ubyte.gz" in out


def test_data_commands_do_not_import_the_experiments(tmp_path):
    # `ppl-cl data ...` must not pay for importing every experiment module (the registry);
    # the errors main() catches live in the import-free ppl_cl.errors.
    code = ("import sys; from ppl_cl.cli import main; "
            f"rc = main(['data', 'list', '--no-checksum', '--data-dir', {str(tmp_path)!r}]); "
            "print(rc, sorted(m for m in sys.modules if m.startswith('ppl_cl.experiments')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0 []"


@pytest.mark.data("mnist")
def test_data_list_checksums_on_shared_data(capsys):
    assert main(["data", "list"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("mnist "))
    assert "yes" in line and "ok" in line


def test_reproduce_quick_synthetic_and_missing_data(tmp_data_root, tmp_path, capsys):
    out = tmp_path / "rep"
    code = main(["reproduce", "--quick", "--out", str(out), "--only", "exact-gp-synthetic",
                 "exact-gp-uci"])
    assert code == 0
    # one line per experiment as it ends: its place, name, status and seconds
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("[1/2] exact-gp-synthetic: ok in ") and err[0].endswith(" s")
    assert err[1].startswith("[2/2] exact-gp-uci: missing data in ")
    report = (out / "report.md").read_text()
    assert "| exact-gp-synthetic | rmse_batch4 |" in report
    assert "0.2 | Pescador-Barrios" in report  # the paper column is filled
    assert "| exact-gp-uci | — | not run (missing data)" in report
    results = json.loads((out / "reproduce.json").read_text())
    assert results["exact-gp-synthetic"]["status"] == "ok"
    assert results["exact-gp-synthetic"]["summary"]["rmse_batch4"] < 0.35


def test_device_errors_are_clear(capsys, tmp_path):
    import torch

    assert main(["run", "exact-gp-synthetic", "--device", "tpu"]) == 2
    assert "expected cpu, cuda or cuda:N" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["run", "exact-gp-synthetic", "--quick", "--device", "cuda",
                     "--out", str(tmp_path)]) == 2
        assert "--device cuda" in capsys.readouterr().err


def test_aggregate_summaries_mean_and_sample_std():
    from ppl_cl.experiments.reproduce import aggregate_summaries

    agg = aggregate_summaries([{"acc": 90.0, "note": "x", "n": 5},
                               {"acc": 92.0, "note": "x", "n": 5},
                               {"acc": 94.0, "note": "y", "n": 5}])
    assert agg["acc"]["mean"] == pytest.approx(92.0)
    assert agg["acc"]["std"] == pytest.approx(2.0)       # ddof = 1: sqrt((4 + 0 + 4) / 2)
    assert agg["acc"]["n"] == 3 and agg["acc"]["values"] == [90.0, 92.0, 94.0]
    assert agg["n"]["std"] == 0.0
    assert agg["note"] == "x"


def test_report_cells_keep_their_significant_digits():
    from ppl_cl.experiments.reproduce import format_value

    assert format_value({"mean": 69.782, "std": 6.0293, "n": 3}) == "69.78 ± 6.0 (n = 3)"
    assert format_value({"mean": 44.66, "std": 7.063, "n": 3}) == "44.66 ± 7.1 (n = 3)"
    # the same number from every run is not replication: no "± 0"
    assert format_value({"mean": 5.0, "std": 0.0, "n": 2}) == "5 (the same in all 2 runs)"
    assert format_value({"mean": 1517.0, "std": 96.17, "n": 2}) == "1517 ± 96 (n = 2)"
    assert format_value({"mean": 1489.0, "std": 3.01, "n": 3}) == "1489 ± 3.0 (n = 3)"
    assert format_value({"mean": 85.1, "std": 0.32, "n": 2}) == "85.10 ± 0.32 (n = 2)"
    assert format_value(0.00123456) == "0.001235" and format_value(3.0) == "3"
    assert format_value({"mean": 2792.0, "std": 431.0, "n": 3}) == "2792 ± 430 (n = 3)"
    assert format_value({"mean": 12345.6, "std": 99.96, "n": 2}) == "12350 ± 100 (n = 2)"
    assert format_value(2792.4) == "2792" and format_value(99.996) == "100.0"
    assert format_value({"mean": 76.34, "std": 0.0, "n": 1}) == "76.34"


def test_headline_keys_a_run_did_not_measure_are_one_line_not_empty_rows():
    """A quick run measures one dataset of five: the headline table shows its rows only and
    one line names the keys left out."""
    from ppl_cl.experiments import registry
    from ppl_cl.experiments.reproduce import _Sections

    spec = registry()["vips-table1"]
    sec = _Sections()
    sec.add(spec, "vips-table1", {"concrete_m_vips": 74.0, "concrete_rmse_vips": 0.33})
    text = "\n".join(sec.lines())
    rows = [line for line in sec.headline[2:]]
    assert len(rows) == 2 and all("concrete" in r for r in rows) and "| — |" not in text
    missing = [k for k in spec.table_keys if k not in ("concrete_m_vips", "concrete_rmse_vips")]
    assert f"- vips-table1: {', '.join(missing[:6])} and {len(missing) - 6} more" in text


def test_paper_numbers_print_as_the_paper_gives_them():
    from ppl_cl.experiments import registry

    paper = registry()["vargp-split-mnist"].paper
    assert paper["final_avg_accuracy"].format() == "90.57 ± 1.06"
    assert paper["final_avg_accuracy_block_diag"].format() == "78.64 ± 1.41"
    assert paper["final_avg_accuracy_mle_hypers"].format() == "10.09 ± 0.40"   # not 0.4
    permuted = registry()["vargp-permuted-mnist"].paper
    assert permuted["final_avg_accuracy"].format() == "97.20 ± 0.08"          # not 97.2
    assert registry()["exact-gp-synthetic"].paper["rmse_batch1"].format() == "0.9"
    kalman = registry()["kalman-online-cifar100"].paper
    assert any(p.format() == "0.190" for p in kalman.values())                  # not 0.19


def test_reproduce_several_seeds_reports_mean_and_std(tmp_data_root, tmp_path):
    out = tmp_path / "rep"
    code = main(["reproduce", "--quick", "--out", str(out), "--only", "exact-gp-synthetic",
                 "--seeds", "0", "1", "--set", "n_batches=4"])
    assert code == 0
    results = json.loads((out / "reproduce.json").read_text())["exact-gp-synthetic"]
    assert results["seeds"] == [0, 1]
    per_seed = [s["rmse_batch4"] for s in results["per_seed"]]
    assert per_seed[0] != per_seed[1]                    # the seeds draw different data
    for s in (0, 1):
        metrics = json.loads((out / "exact-gp-synthetic" / f"seed{s}" / "metrics.json").read_text())
        assert metrics["summary"]["rmse_batch4"] == pytest.approx(per_seed[s])
    mean = sum(per_seed) / 2
    assert results["summary"]["rmse_batch4"]["mean"] == pytest.approx(mean)
    report = (out / "report.md").read_text()
    assert "seeds 0, 1" in report and "`n_batches=4`" in report
    assert f"| exact-gp-synthetic | rmse_batch4 | {mean:.4g} ± " in report and "(n = 2)" in report


def test_report_collects_finished_runs(tmp_data_root, tmp_path, capsys):
    """`ppl-cl report` aggregates folders written by `ppl-cl run` (one seed per job)."""
    dirs = []
    for s in (0, 1):
        d = tmp_path / f"s{s}"
        assert main(["run", "exact-gp-synthetic", "--quick", "--seed", str(s), "--out", str(d),
                     "--set", "n_batches=4"]) == 0
        dirs.append(str(d))
    capsys.readouterr()
    out = tmp_path / "rep"
    assert main(["report", *dirs, "--out", str(out)]) == 0
    per_seed = [json.loads((tmp_path / f"s{s}" / "metrics.json").read_text())["summary"]
                ["rmse_batch4"] for s in (0, 1)]
    results = json.loads((out / "reproduce.json").read_text())
    (group,) = results.values()
    assert group["seeds"] == [0, 1] and group["overrides"] == {"n_batches": "4"}
    assert group["summary"]["rmse_batch4"]["mean"] == pytest.approx(sum(per_seed) / 2)
    report = capsys.readouterr().out
    assert "seeds 0, 1" in report and "`n_batches=4`" in report and "(n = 2)" in report
    # the paper column comes from the registration
    assert "| exact-gp-synthetic [1] | rmse_batch1 |" in report and "Pescador-Barrios" in report
    # notes from a file end the markdown and ride in the JSON beside the groups
    (tmp_path / "notes.md").write_text("Two seeds, CPU.\n")
    assert main(["report", *dirs, "--out", str(out), "--notes", str(tmp_path / "notes.md")]) == 0
    assert (out / "report.md").read_text().endswith("\n## Notes\n\nTwo seeds, CPU.\n")
    noted = json.loads((out / "reproduce.json").read_text())
    assert noted.pop("notes") == "Two seeds, CPU." and noted == results
    (tmp_path / "blank.md").write_text("\n")
    assert main(["report", *dirs, "--out", str(out), "--notes", str(tmp_path / "blank.md")]) == 2
    assert "notes: empty text" in capsys.readouterr().err
    # an unfinished run and a seed given twice are clear errors
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(out)]) == 2
    assert "not a finished run" in capsys.readouterr().err
    assert main(["report", dirs[0], dirs[0], "--out", str(out)]) == 2
    assert "seed given twice" in capsys.readouterr().err


def test_report_pools_an_earlier_report_with_new_runs(tmp_data_root, tmp_path, capsys):
    """Seeds run in different sessions pool: an earlier report's reproduce.json (its run
    folders gone) plus a new run folder give the same table as the three folders together."""
    dirs = []
    for s in (0, 1, 2):
        d = tmp_path / f"s{s}"
        assert main(["run", "exact-gp-synthetic", "--quick", "--seed", str(s), "--out", str(d),
                     "--set", "n_batches=4"]) == 0
        dirs.append(str(d))
    assert main(["report", *dirs[:2], "--out", str(tmp_path / "early")]) == 0
    early = tmp_path / "early" / "reproduce.json"
    saved = json.loads(early.read_text())
    saved["notes"] = "a benchmarks/results copy carries a notes string"
    early.write_text(json.dumps(saved))
    assert main(["report", *dirs, "--out", str(tmp_path / "all")]) == 0
    assert main(["report", str(early), dirs[2], "--out", str(tmp_path / "pooled")]) == 0
    capsys.readouterr()
    (direct,) = json.loads((tmp_path / "all" / "reproduce.json").read_text()).values()
    (pooled,) = json.loads((tmp_path / "pooled" / "reproduce.json").read_text()).values()
    assert pooled["seeds"] == [0, 1, 2] and pooled["overrides"] == {"n_batches": "4"}
    assert pooled["per_seed"] == direct["per_seed"]
    for key in ("rmse_batch4", "rmse_batch1"):
        assert pooled["summary"][key]["mean"] == pytest.approx(direct["summary"][key]["mean"])
        assert pooled["summary"][key]["std"] == pytest.approx(direct["summary"][key]["std"])
        assert pooled["summary"][key]["n"] == 3
    assert pooled["runs"][0] == f"{dirs[0]} (via {early})" and pooled["runs"][2] == dirs[2]
    # the same seed from the report and from a folder is still a duplicate
    assert main(["report", str(early), dirs[1], "--out", str(tmp_path / "dup")]) == 2
    assert "seed given twice" in capsys.readouterr().err
    # a `ppl-cl reproduce` JSON (no per-run settings) is refused with a pointer to its folders
    bad = tmp_path / "repro.json"
    bad.write_text(json.dumps({"exact-gp-synthetic": {"status": "ok", "summary": {}}}))
    assert main(["report", str(bad), "--out", str(tmp_path / "bad")]) == 2
    assert "only reports written by `ppl-cl report`" in capsys.readouterr().err


def test_a_run_uses_one_thread_unless_asked(tmp_path):
    """Without --threads a run takes one thread for torch, BLAS and XLA (or OMP_NUM_THREADS
    when the user set it): the libraries' own defaults (a thread per core) collapse beside any
    other busy process. Checked in the run's own process (the variables are read when the
    libraries load), with the tiny sweep-toy experiment."""
    import os
    from pathlib import Path

    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                        "XLA_FLAGS")}
    env["PPL_CL_EXPERIMENTS"] = str(Path(__file__).with_name("sweep_experiments.py"))
    repo = Path(__file__).resolve().parents[2]
    for extra, user, want in (([], None, "1"), (["--threads", "2"], None, "2"),
                              ([], "3", "3")):
        out = tmp_path / f"t{want}"
        run_env = dict(env, **({"OMP_NUM_THREADS": user} if user else {}))
        r = subprocess.run([sys.executable, "-m", "ppl_cl.cli", "run", "sweep-toy", "--quick",
                            "--out", str(out), *extra], env=run_env, cwd=repo,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        threads = json.loads((out / "metrics.json").read_text())["threads"]
        assert threads["OMP_NUM_THREADS"] == want and threads["MKL_NUM_THREADS"] == want
        assert f"intra_op_parallelism_threads={want}" in threads["XLA_FLAGS"]
        assert ("--xla_cpu_multi_thread_eigen=false" in threads["XLA_FLAGS"]) == (want == "1")


def test_resume_refuses_other_settings_naming_them_and_keeps_config_json(tmp_path, capsys,
                                                                          monkeypatch):
    """A stopped run resumed with a changed --set: one line naming the changed fields only
    (dotted keys), config.json untouched; the unchanged settings resume; a finished run is
    not trained again unless --force."""
    spec = get("exact-gp-synthetic")
    calls = []

    def stops_once(config, ctx):
        calls.append(ctx.resume)
        if ctx.load_checkpoint("unit") is None:
            ctx.save_checkpoint("unit", {"done": 1})
            raise ArithmeticError("stopped")
        return {"summary": {"rmse": 1.0}}

    monkeypatch.setattr(spec, "run", stops_once)
    out = tmp_path / "r"
    assert main(["run", "exact-gp-synthetic", "--out", str(out)]) == 1
    config = (out / "config.json").read_bytes()
    capsys.readouterr()
    assert main(["run", "exact-gp-synthetic", "--out", str(out), "--resume",
                 "--set", "learner.noise_variance=0.3", "--set", "n_batches=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "other settings" in err
    assert "config.learner.noise_variance: 0.5 -> 0.3" in err and "config.n_batches: 4 -> 2" in err
    assert "config.learner.kernel" not in err and "max_iterations" not in err
    assert (out / "config.json").read_bytes() == config and len(calls) == 1
    assert main(["run", "exact-gp-synthetic", "--out", str(out), "--resume"]) == 0
    assert calls == [False, True] and (out / "metrics.json").is_file()
    capsys.readouterr()
    assert main(["run", "exact-gp-synthetic", "--out", str(out), "--resume"]) == 0
    assert "finished run of these settings: nothing to resume" in capsys.readouterr().err
    assert calls == [False, True]
    assert main(["run", "exact-gp-synthetic", "--out", str(out), "--resume", "--force"]) == 1
    assert calls == [False, True, False]          # --force: retrained from the start


@pytest.mark.data("uci-gal/concrete")
def test_exact_gp_uci_seed_picks_the_gal_split(tmp_path, capsys):
    """The seed picks the Gal split (unless --set split=K), so seeds replicate over splits;
    posterior.nc holds the training points in log_likelihood, the test points in
    predictions."""
    import arviz as az

    small = ["--set", "max_train=60", "--set", "learner.max_iterations=5",
             "--set", "posterior_draws=8"]
    got = {}
    for seed in (0, 1):
        out = tmp_path / f"s{seed}"
        assert main(["run", "exact-gp-uci", "--seed", str(seed), "--out", str(out), *small]) == 0
        got[seed] = json.loads((out / "metrics.json").read_text())
        assert got[seed]["split"] == seed
    assert got[0]["summary"]["rmse"] != got[1]["summary"]["rmse"]
    idata = az.from_netcdf(str(tmp_path / "s1" / "posterior.nc"))
    assert idata.attrs["sampling"] == "independent draws"
    assert idata.log_likelihood["y"].shape == (2, 4, 60)
    n_test = got[1]["summary"]["n_test"]
    assert idata.predictions["y"].shape == (2, 4, n_test)
    assert idata.predictions_constant_data["x"].shape[0] == n_test
    out = tmp_path / "fixed"
    assert main(["run", "exact-gp-uci", "--seed", "1", "--set", "split=0", "--out", str(out),
                 *small]) == 0
    assert json.loads((out / "metrics.json").read_text())["split"] == 0
    assert main(["run", "exact-gp-uci", "--seed", "25", "--out", str(tmp_path / "s25"),
                 *small]) == 2
    assert "--seed 25 picks split 25" in capsys.readouterr().err


def test_vargp_toy_logs_every_task_and_its_figure_has_a_colour_bar(tmp_path):
    import matplotlib

    from ppl_cl.experiments.vargp import densities_figure

    out = tmp_path / "toy"
    assert main(["run", "vargp-toy", "--quick", "--out", str(out), "--set", "variants=[var_gp]",
                 "--set", "learner.max_epochs=2", "--set", "grid_size=6",
                 "--set", "n_per_class=6", "--set", "n_test_per_class=6"]) == 0
    log = (out / "progress.log").read_text()
    assert "var_gp: task 1/2:" in log and "var_gp: task 2/2:" in log
    dens = [np.full((6, 6, 4), 0.25)] * 2
    x, y = np.zeros((4, 2)), np.arange(4)
    fig = densities_figure(dens, x, y, [(0, 1), (2, 3)], "toy")
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(panels) == 8 and len(bars) == 1 and bars[0].get_ylabel() == "p(y = class | x)"
    assert panels[-1].get_xlabel() == "$x_1$" and "$x_2$" in panels[0].get_ylabel()
    assert len(panels[0].get_xticks()) == 3
    matplotlib.pyplot.close(fig)


def test_readme_exports_the_data_root_once():
    """The README's set-up command exports PPL_CL_DATA (so every later example in that shell
    finds the data) and still ends with the quick reproduction; no later example sets it."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    setup = blocks[0].strip()
    assert setup.count("\n") == 0 and "export PPL_CL_DATA=" in setup
    assert setup.index("export PPL_CL_DATA=") < setup.index("ppl-cl reproduce --quick")
    assert blocks[1].strip() == ".venv/bin/python -m pytest"
    for block in blocks[2:]:
        assert "PPL_CL_DATA" not in block, block


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs sched_setaffinity and two CPUs")
def test_one_thread_sizes_xla_pool_and_leaves_every_cpu():
    """With --threads 1 XLA's CPU pool has one thread (its size follows the CPUs the process may
    run on when the client is created, whatever the flags say) and every thread of the process
    may still run on every CPU afterwards."""
    code = ("import json, os; from ppl_cl.cli import _set_threads; _set_threads(1); "
            "import jax.numpy as jnp; "
            "(jnp.ones((300, 300)) @ jnp.ones((300, 300))).block_until_ready(); "
            "tasks = os.listdir('/proc/self/task'); "
            "names = [open(f'/proc/self/task/{t}/comm').read().strip() for t in tasks]; "
            "print(json.dumps({'pool': sum(n.startswith('tf_XLAEigen') for n in names), "
            "'masks': sorted({len(os.sched_getaffinity(int(t))) for t in tasks})}))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "XLA_FLAGS")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["pool"] == 1
    assert out["masks"] == [len(os.sched_getaffinity(0))]
