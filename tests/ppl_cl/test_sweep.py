"""`ppl-cl sweep`: the grid, the local process pool, faults, restarts, Ray (where installed).

The runs are the tiny pure-NumPy ``sweep-toy`` experiment of ``sweep_experiments.py`` (loaded in
every run's process through ``PPL_CL_EXPERIMENTS``), so that each costs its process start-up
only; a slow test checks a real experiment the same way.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ppl_cl import sweep as sw
from ppl_cl.cli import main
from ppl_cl.errors import ConfigError
from ppl_cl.experiments import run_experiment

TOY = Path(__file__).with_name("sweep_experiments.py")
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="ray is not installed (pip install -e \".[ray]\"); the "
                                      "local pool is tested without it")


@pytest.fixture(autouse=True)
def _toy_experiments(monkeypatch):
    monkeypatch.setenv("PPL_CL_EXPERIMENTS", str(TOY))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _metrics(d: Path) -> dict:
    return json.loads((d / "metrics.json").read_text())


def _sequential(tmp_path: Path, seed: int, overrides: dict, quick: bool = False) -> dict:
    """What `ppl-cl run sweep-toy --seed S --set ...` alone writes (in this process)."""
    out = tmp_path / "alone" / f"{'_'.join(f'{k}{v}' for k, v in overrides.items())}-{seed}"
    run_experiment("sweep-toy", seed=seed, overrides=dict(overrides), out=out, quick=quick)
    return _metrics(out)


def test_grid_expands_as_documented(tmp_path):
    grid = sw.parse_grid(["scale=1,2.5", "mode=ok,raise"])
    assert grid == {"scale": ["1", "2.5"], "mode": ["ok", "raise"]}
    # commas inside brackets and quotes stay in the value
    assert sw.parse_grid(["k=[64,64],[128],'a,b'"]) == {"k": ["[64,64]", "[128]", "'a,b'"]}
    runs = sw.expand(["sweep-toy", "exact-gp-synthetic"], [0, 3], out=tmp_path)
    assert [(r.experiment, r.seed) for r in runs] == [
        ("sweep-toy", 0), ("sweep-toy", 3), ("exact-gp-synthetic", 0), ("exact-gp-synthetic", 3)]
    assert runs[1].out_dir == tmp_path / "sweep-toy" / "seed3"
    runs = sw.expand(["sweep-toy"], [1, 0], grid, sets={"steps": "2"}, quick=True, out=tmp_path)
    # experiment, then grid points (last key fastest), then seeds; --set first in overrides
    assert [(r.grid["scale"], r.grid["mode"], r.seed) for r in runs] == [
        ("1", "ok", 1), ("1", "ok", 0), ("1", "raise", 1), ("1", "raise", 0),
        ("2.5", "ok", 1), ("2.5", "ok", 0), ("2.5", "raise", 1), ("2.5", "raise", 0)]
    assert list(runs[0].overrides.items()) == [("steps", "2"), ("scale", "1"), ("mode", "ok")]
    assert runs[2].out_dir == tmp_path / "sweep-toy" / "scale=1,mode=raise" / "seed1"
    assert runs[2].label == "sweep-toy scale=1 mode=raise seed=1" and runs[2].quick
    assert runs[2].rel == Path("sweep-toy/scale=1,mode=raise/seed1")
    # a value a folder name cannot hold is replaced, and the exact values hashed
    a = sw.run_folder(tmp_path, "x", {"k": "a/b"}, 0)
    b = sw.run_folder(tmp_path, "x", {"k": "a b"}, 0)
    assert a.parent.name.startswith("k=a_b-") and a != b and "/" not in a.parent.name
    # every config is built before any run: unknown keys and bad values name the experiment
    with pytest.raises(ConfigError, match="sweep-toy: unknown config key 'nope'"):
        sw.expand(["sweep-toy"], [0], {"nope": ["1"]}, out=tmp_path)
    with pytest.raises(ConfigError, match="exact-gp-synthetic: unknown config key 'steps'"):
        sw.expand(["sweep-toy", "exact-gp-synthetic"], [0], {"steps": ["1"]}, out=tmp_path)
    with pytest.raises(ConfigError, match="mode=bad"):
        sw.expand(["sweep-toy"], [0], {"mode": ["ok", "bad"]}, out=tmp_path)
    with pytest.raises(ConfigError, match="seed given twice"):
        sw.expand(["sweep-toy"], [0, 0], out=tmp_path)
    with pytest.raises(ConfigError, match="both give scale"):
        sw.expand(["sweep-toy"], [0], {"scale": ["1"]}, sets={"scale": "2"}, out=tmp_path)
    for bad, msg in (("scale", "expected key=v1"), ("scale=1,,2", "empty value"),
                     ("scale=1,1", "given twice")):
        with pytest.raises(ConfigError, match=msg):
            sw.parse_grid([bad])
    with pytest.raises(ConfigError, match="key 'scale' given twice"):
        sw.parse_grid(["scale=1", "scale=2"])
    assert not any(tmp_path.iterdir())


def test_parallel_local_runs_equal_sequential_runs(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "sweep-toy", "--seeds", "0", "1", "--grid", "scale=1,3",
                 "--local-processes", "2", "--out", str(out)]) == 0
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.startswith("[")]
    assert len(lines) == 4 and all(" done sweep-toy scale=" in ln for ln in lines)
    assert sorted(ln.split("]")[0] for ln in lines) == ["[1/4", "[2/4", "[3/4", "[4/4"]
    for scale in ("1", "3"):
        for seed in (0, 1):
            d = out / "sweep-toy" / f"scale={scale}" / f"seed{seed}"
            alone_dir = tmp_path / "alone" / f"scale{scale}-{seed}"
            alone = _sequential(tmp_path, seed, {"scale": scale})
            mine = _metrics(d)
            assert mine["summary"] == alone["summary"]
            # the run folder is what `ppl-cl run` writes: same files, same recorded settings
            assert sorted(p.name for p in d.iterdir()) == sorted(
                p.name for p in alone_dir.iterdir()) == ["config.json", "metrics.json",
                                                        "progress.log"]
            cfg, cfg_alone = (json.loads((x / "config.json").read_text()) for x in (d, alone_dir))
            for k in ("experiment", "seed", "quick", "config", "overrides", "device"):
                assert cfg[k] == cfg_alone[k], k
            # one thread per run: its CPU share
            assert mine["threads"]["OMP_NUM_THREADS"] == "1"
            assert "intra_op_parallelism_threads=1" in mine["threads"]["XLA_FLAGS"]
    # different seeds and scales really are different runs
    totals = {_metrics(p)["summary"]["total"] for p in out.glob("sweep-toy/*/seed*")}
    assert len(totals) == 4
    # the pooled report: one group per grid value, mean over the two seeds
    report = json.loads((out / "reproduce.json").read_text())
    assert sorted(g["overrides"]["scale"] for g in report.values()) == ["1", "3"]
    for g in report.values():
        assert g["seeds"] == [0, 1]
        totals = [_metrics(Path(r))["summary"]["total"] for r in g["runs"]]
        assert g["summary"]["total"]["mean"] == pytest.approx(sum(totals) / 2)
    assert "sweep-toy [1] | total" in cap.out         # the report printed at the end
    status = json.loads((out / "sweep.json").read_text())
    assert status["executor"] == "local" and {e["status"] for e in status["runs"]} == {"done"}


def test_a_failing_run_is_reported_and_the_others_finish(tmp_path, capsys):
    out = tmp_path / "sweep"
    # a Python error, a process killed outright (as by the OOM killer), and a run that is fine;
    # one process with 2 threads
    rc = main(["sweep", "sweep-toy", "--grid", "mode=raise,kill,ok", "--set", "steps=3",
               "--local-processes", "1", "--cpus-per-run", "2", "--out", str(out)])
    assert rc == 1
    err = capsys.readouterr().err
    assert "FAILED sweep-toy mode=raise seed=0: ZeroDivisionError: sweep-toy: asked to fail" \
        in err
    assert "FAILED sweep-toy mode=kill seed=0: killed by SIGKILL" in err
    assert "[3/3] done sweep-toy mode=ok seed=0" in err
    status = {e["grid"]["mode"]: e for e in json.loads((out / "sweep.json").read_text())["runs"]}
    assert status["raise"]["status"] == status["kill"]["status"] == "failed"
    assert "ZeroDivisionError" in status["raise"]["error"]
    log = Path(status["raise"]["log"]).read_text()
    assert "Traceback" in log and "run_sweep_toy" in log       # the full traceback is kept
    ok = out / "sweep-toy" / "mode=ok" / "seed0"
    assert status["ok"]["status"] == "done"
    assert _metrics(ok)["summary"] == _sequential(tmp_path, 0, {"steps": "3", "mode": "ok"}
                                                  )["summary"]
    assert _metrics(ok)["threads"]["OMP_NUM_THREADS"] == "2"
    assert not (out / "sweep-toy" / "mode=raise" / "seed0" / "metrics.json").exists()
    assert "failed: ZeroDivisionError" in (out / "sweep-toy" / "mode=raise" / "seed0" /
                                           "progress.log").read_text()
    # the report holds the run that finished only
    report = json.loads((out / "reproduce.json").read_text())
    assert [g["overrides"]["mode"] for g in report.values()] == ["ok"]


def test_a_stopped_sweep_restarts_skipping_finished_runs_and_resuming_the_others(tmp_path,
                                                                                  capsys):
    out = tmp_path / "sweep"
    args = ["sweep", "sweep-toy", "--grid", "steps=1,5", "--set", "sleep_s=2",
            "--local-processes", "2", "--out", str(out)]
    short = out / "sweep-toy" / "steps=1" / "seed0"
    long = out / "sweep-toy" / "steps=5" / "seed0"
    proc = subprocess.Popen([sys.executable, "-m", "ppl_cl.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def ready() -> bool:      # the short run recorded as done, the long one at work
            try:
                runs = json.loads((out / "sweep.json").read_text())["runs"]
                return runs[0]["status"] == "done" and \
                    "step 1/5" in (long / "progress.log").read_text()
            except (FileNotFoundError, json.JSONDecodeError):
                return False

        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not ready():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)          # as a batch system's time limit would
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM)" in err
    # the run that was working was stopped in turn: its log says so, its checkpoint stays
    assert not (long / "metrics.json").exists()
    assert "terminated (SIGTERM)" in (long / "progress.log").read_text().splitlines()[-1]
    assert (long / "checkpoints" / "walk.npz").is_file()
    status = {e["grid"]["steps"]: e["status"] for e in
              json.loads((out / "sweep.json").read_text())["runs"]}
    assert status == {"1": "done", "5": "unfinished"}
    finished_at = (short / "metrics.json").stat().st_mtime_ns

    # the same command again: the finished run is skipped, the other resumed
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "skipped sweep-toy steps=1 seed=0: finished earlier" in err
    assert "1 finished earlier, 1 to resume, 0 to start" in err
    assert (short / "metrics.json").stat().st_mtime_ns == finished_at
    resumed = _metrics(long)
    assert resumed["resumed_from"] >= 1                 # it did not start over
    assert "resume sweep-toy seed=0" in (long / "progress.log").read_text()
    # and it ends where an uninterrupted run ends
    alone = _sequential(tmp_path, 0, {"sleep_s": "0", "steps": "5"})
    assert resumed["summary"] == alone["summary"]
    report = json.loads((out / "reproduce.json").read_text())
    assert sorted(g["overrides"]["steps"] for g in report.values()) == ["1", "5"]


def test_sweep_errors_are_one_line_and_nothing_runs(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sweep"
    n = sw.usable_cpus()
    cases = [
        (["nope"], "unknown experiment 'nope'"),
        (["sweep-toy", "--grid", "nope=1,2"], "unknown config key 'nope'"),
        (["sweep-toy", "--grid", "scale"], "--grid: expected key=v1,v2"),
        (["sweep-toy", "--local-processes", "2", "--address", "auto"], "choose the local pool"),
        (["sweep-toy", "--local-processes", str(n + 1)], "oversubscribes"),
        (["sweep-toy", "--local-processes", "1", "--cpus-per-run", str(n + 1)],
         "oversubscribes"),
        (["sweep-toy", "--cpus-per-run", "0"], "--cpus-per-run: expected an int >= 1"),
        (["sweep-toy", "--gpus-per-run", "2"], "fraction of one GPU"),
        (["sweep-toy", "--gpus-per-run", "0.5", "--device", "cpu"], "GPUs no run uses"),
        (["sweep-toy", "--device", "tpu"], "--device: expected cpu, cuda"),
    ]
    for argv, msg in cases:
        assert main(["sweep", *argv, "--out", str(out)]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ppl-cl: ") and msg in err[0], (argv, err)
    assert not out.exists()
    # Ray asked for but not installed
    monkeypatch.setattr(sw, "ray_available", lambda: False)
    assert main(["sweep", "sweep-toy", "--address", "auto", "--out", str(out)]) == 2
    assert "Ray is not installed" in capsys.readouterr().err
    # a folder that holds a run of other settings is refused before anything runs
    d = out / "sweep-toy" / "seed0"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"experiment": "sweep-toy", "seed": 0,
                                               "quick": False, "overrides": {"scale": "9"}}))
    assert main(["sweep", "sweep-toy", "--local-processes", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds a run of other settings (overrides {'scale': '9'} there, {} here)" in err
    assert not (out / "sweep.json").exists()
    assert sw.plan(sw.expand(["sweep-toy"], [0], out=out), force=True) == ["replace"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_run_whose_sweep_is_already_gone_stops_at_once():
    """A run's process started by a sweep (PPL_CL_SWEEP_PARENT) asks for SIGTERM at its
    parent's death; when the pid named is not its parent (the sweep died before the call) it
    stops at once with 143; started by its parent, it goes on."""
    code = "from ppl_cl.sweep import die_with_parent; die_with_parent(); print('alive')"
    for parent, rc, out in [("1", 128 + signal.SIGTERM, ""), (str(os.getpid()), 0, "alive\n")]:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, sw.PARENT_ENV: parent}, timeout=60)
        assert (res.returncode, res.stdout) == (rc, out), res.stderr


def test_without_ray_the_local_pool_is_the_default(tmp_path, monkeypatch):
    """No Ray and no --local-processes: a pool of CPUs / --cpus-per-run processes."""
    seen = {}

    def fake_local(tasks, processes_n, on_done):
        seen["n"], seen["argv"] = processes_n, tasks[0]["argv"]

    monkeypatch.setattr(sw, "ray_available", lambda: False)
    monkeypatch.setattr(sw, "_run_local", fake_local)
    lines = []
    res = sw.sweep(["sweep-toy"], out=tmp_path, seeds=[4], sets={"scale": "2"},
                   checkpoint_every_s=5, echo=lines.append)
    assert res["executor"] == "local" and seen["n"] == sw.usable_cpus()
    assert "Ray is not installed: a local pool" in lines[0]
    argv = seen["argv"]
    assert argv[:2] == ["run", "sweep-toy"] and argv[argv.index("--seed") + 1] == "4"
    assert argv[argv.index("--threads") + 1] == "1"
    assert argv[argv.index("--checkpoint-every") + 1] == "5.0"
    assert argv[argv.index("--set") + 1] == "scale=2" and "--resume" not in argv
    assert res["runs"][0]["status"] == "unfinished" and res["report"] is None


def test_gpu_fractions_are_declared_to_ray_and_cap_jax_memory(tmp_path, monkeypatch):
    """--gpus-per-run 0.5: each Ray task declares half a GPU, each run gets --device cuda and
    90% of its half of the GPU's memory for JAX (no GPU needed: what is asked is checked)."""
    seen = {}

    def fake_ray(tasks, *, address, cpus, gpus, on_done):
        seen.update(tasks=tasks, address=address, cpus=cpus, gpus=gpus)

    monkeypatch.setattr(sw, "ray_available", lambda: True)
    monkeypatch.setattr(sw, "_run_ray", fake_ray)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    res = sw.sweep(["sweep-toy"], out=tmp_path, seeds=[0, 1], gpus_per_run=0.5,
                   cpus_per_run=2, address="auto", echo=lambda line: None)
    assert res["executor"] == "ray"
    assert (seen["address"], seen["cpus"], seen["gpus"]) == ("auto", 2, 0.5)
    assert len(seen["tasks"]) == 2
    for task in seen["tasks"]:
        argv = task["argv"]
        assert argv[argv.index("--device") + 1] == "cuda"
        assert argv[argv.index("--threads") + 1] == "2"
        assert task["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.450"
        assert task["env"]["PPL_CL_EXPERIMENTS"] == str(TOY)   # forwarded to other nodes
    # a whole GPU per run: JAX's own default; a GPU device on Ray without declaring GPUs: error
    sw.sweep(["sweep-toy"], out=tmp_path / "b", gpus_per_run=1, echo=lambda line: None)
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in seen["tasks"][0]["env"]
    with pytest.raises(ConfigError, match="needs --gpus-per-run"):
        sw.sweep(["sweep-toy"], out=tmp_path / "c", device="cuda", echo=lambda line: None)


@needs_ray
def test_ray_runs_equal_sequential_runs_and_isolate_a_failure(tmp_path):
    lines = []
    res = sw.sweep(["sweep-toy"], out=tmp_path / "sweep", seeds=[0, 1],
                   grid={"mode": ["ok", "raise"]}, sets={"steps": "3"}, echo=lines.append)
    assert res["executor"] == "ray"
    by = {(e["grid"]["mode"], e["seed"]): e for e in res["runs"]}
    for seed in (0, 1):
        assert by[("raise", seed)]["status"] == "failed"
        assert "ZeroDivisionError" in by[("raise", seed)]["error"]
        ok = _metrics(Path(by[("ok", seed)]["dir"]))
        assert by[("ok", seed)]["status"] == "done"
        assert ok["summary"] == _sequential(tmp_path, seed, {"steps": "3", "mode": "ok"}
                                            )["summary"]
        assert ok["threads"]["OMP_NUM_THREADS"] == "1"
    assert sum(" done " in ln for ln in lines) == 2 and sum("FAILED" in ln for ln in lines) == 2
    assert "on Ray (a local instance), 1 CPU(s) per run" in "\n".join(lines)


@pytest.mark.slow
def test_a_real_experiment_in_parallel_equals_its_sequential_runs(tmp_path, monkeypatch):
    """exact-gp-synthetic (JAX, L-BFGS), 2 seeds side by side vs `ppl-cl run` one by one."""
    monkeypatch.delenv("PPL_CL_EXPERIMENTS")
    sets = {"learner.max_iterations": "20", "n_batches": "2"}
    res = sw.sweep(["exact-gp-synthetic"], out=tmp_path / "sweep", seeds=[0, 1], sets=sets,
                   quick=True, local_processes=2, echo=lambda line: None)
    assert not res["failed"]
    for e in res["runs"]:
        alone = tmp_path / f"alone{e['seed']}"
        run_experiment("exact-gp-synthetic", quick=True, seed=e["seed"], overrides=sets,
                       out=alone)
        assert _metrics(Path(e["dir"]))["summary"] == _metrics(alone)["summary"]
