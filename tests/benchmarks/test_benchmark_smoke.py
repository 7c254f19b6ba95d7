"""Every benchmark script (``benchmarks/*.py``, see ``benchmarks/README.md``) runs at its smoke
size in a subprocess, from the repository root, one thread, and writes the JSON it promises:

* ``benchmark`` (its name), ``machine`` (``platform``, ``cpu_count``, the load average) and
  ``code`` (``commit``: HEAD's hash in a git checkout), as :mod:`ppl_cl.provenance` writes them;
* its own result keys, positive numbers (timings, rates, ratios);
* no absolute path of the machine anywhere in it (the repository, the output folder, the home
  folder, ``/work/``, ``/tmp/``, ``/root/``, ``/home/``): a committed JSON names no developer's
  folders.

The timings themselves are never asserted (the machine may be loaded). ``vips`` runs its GPflow
peer only when ``PPL_CL_GPFLOW_PYTHON`` names an interpreter that has it (the ``bench`` extra,
``pyproject.toml``); the script skips it otherwise.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
MACHINE_PREFIXES = ("/work/", "/tmp/", "/root/", "/home/", "/Users/")


def run_smoke(script: str, tmp_path: Path, *extra: str) -> tuple[dict, str]:
    """Run ``benchmarks/<script>.py --smoke --out tmp_path/<script>.json``; the JSON and its
    text."""
    out = tmp_path / f"{script}.json"
    env = dict(os.environ, **ONE_THREAD, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, f"benchmarks/{script}.py", "--smoke", "--out",
                           str(out), *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{script} --smoke failed:\n{done.stderr[-4000:]}"
    text = out.read_text()
    return json.loads(text), text


def at(obj, path: str) -> list:
    """The values at a dotted key path; ``*`` stands for every item of a list or dict."""
    nodes = [obj]
    for part in path.split("."):
        nxt = []
        for node in nodes:
            if part == "*":
                nxt.extend(node.values() if isinstance(node, dict) else node)
            else:
                assert isinstance(node, dict) and part in node, f"no key {path!r} ({part!r})"
                nxt.append(node[part])
        nodes = nxt
    assert nodes, f"nothing at {path!r}"
    return nodes


def assert_positive(obj, *paths: str) -> None:
    for path in paths:
        for v in at(obj, path):
            assert isinstance(v, (int, float)) and not isinstance(v, bool), (path, v)
            assert math.isfinite(v) and v > 0, (path, v)


def assert_common(result: dict, text: str, name: str, tmp_path: Path) -> None:
    assert result["benchmark"] == name
    machine = result["machine"]
    assert isinstance(machine["platform"], str) and machine["platform"]
    assert isinstance(machine["cpu_count"], int) and machine["cpu_count"] > 0
    assert "load_average_1min" in machine
    commit = result["code"]["commit"]
    if (REPO / ".git").exists():   # a checkout (a worktree's .git is a file)
        assert isinstance(commit, str) and len(commit) == 40, commit
        int(commit, 16)
    needles = {*MACHINE_PREFIXES, str(REPO), str(tmp_path), os.path.expanduser("~") + "/"}
    found = sorted(n for n in needles if n in text)
    assert not found, f"{name}: absolute paths in the JSON: {found}"


def test_exact_gp(tmp_path):
    result, text = run_smoke("exact_gp", tmp_path)
    assert_common(result, text, "exact_gp", tmp_path)
    assert result["settings"]["smoke"] is True
    assert_positive(result, "rows.*.n", "rows.*.value_and_grad_s.*", "rows.*.fit_s.*",
                    "rows.*.fit_iterations_ppl_cl")
    for row in result["rows"]:   # both fits reach a finite log marginal likelihood
        assert all(math.isfinite(v) for v in row["fit_log_marginal_likelihood"].values())


def test_vargp(tmp_path):
    result, text = run_smoke("vargp", tmp_path)
    assert_common(result, text, "vargp", tmp_path)
    assert result["settings"]["smoke"] is True and result["settings"]["overhead_proxy"] is True
    assert list(result["runs"]) == ["cpu"]
    assert_positive(result, "runs.cpu.matmul_flops_per_s", "runs.cpu.per_task.*.vargp_step_s",
                    "runs.cpu.per_task.*.own_svgp_step_s",
                    "runs.cpu.per_task.*.vargp_matched_step_s",
                    "runs.cpu.per_task.*.pyro_svgp_step_s",
                    "runs.cpu.per_task.*.ratio_ar_vs_own_svgp",
                    "runs.cpu.per_task.*.ratio_matched_vs_pyro_svgp",
                    "runs.cpu.ratios.ar_vs_own_svgp", "runs.cpu.ratios.matched_vs_pyro_svgp")


def test_kalman(tmp_path):
    result, text = run_smoke("kalman", tmp_path)
    assert_common(result, text, "kalman", tmp_path)
    assert result["settings"]["smoke"] is True
    assert "load_average_before" in result["machine"] and "load_average_after" in result["machine"]
    assert isinstance(result["bandwidth_definition"], str) and result["bandwidth_definition"]
    assert_positive(result, "rows.*.points_per_s", "rows.*.seconds", "rows.*.n_points",
                    "peak_copy_bandwidth.bytes_per_s", "peak_copy_bandwidth.before.array_bytes",
                    "ratios.*")
    methods = {r["method"].split(" ")[0] for r in result["rows"]}
    assert {"ours-scan", "ours-blocked", "numpy-inplace", "dynamax-lgssm_filter,"} <= methods
    itemsize = 8 if result["dtype"] == "float64" else 4
    per_point = [r for r in result["rows"] if r["method"] in ("ours-scan", "numpy-inplace")]
    assert per_point and all("bytes_per_point" in r for r in per_point)
    assert not any("bytes_per_point" in r for r in result["rows"] if r not in per_point)
    for r in per_point:
        m, K = r["m"], r["K"]
        assert r["bytes_per_point"] == (3 * m * m + 3 * m * K + m) * itemsize
        assert_positive(r, "achieved_bytes_per_s", "achieved_over_peak_copy_bandwidth")
        # a fraction of the peak only where it is one: working set beyond the caches, <= 1
        frac = r["fraction_of_peak_copy_bandwidth"]
        if r["working_set_fits_in"] is not None or r["achieved_over_peak_copy_bandwidth"] > 1:
            assert frac is None, r
        if frac is not None:
            assert 0 < frac <= 1 and frac == r["achieved_over_peak_copy_bandwidth"]
        assert r["bandwidth_note"]


@pytest.mark.data("letter")
def test_gp_tree(tmp_path):
    result, text = run_smoke("gp_tree", tmp_path)
    assert_common(result, text, "gp_tree", tmp_path)
    assert result["settings"]["smoke"] is True
    assert_positive(result, "pg_draws.*.polyagamma_draws_per_s",
                    "pg_draws.*.ours_float64_draws_per_s", "pg_draws.*.ours_float32_draws_per_s",
                    "pg_draws.*.ours_float64_over_polyagamma", "gibbs_sweeps.*.ours_sweeps_per_s",
                    "gibbs_sweeps.*.reference_pg_scheme_sweeps_per_s",
                    "gibbs_sweeps.*.reference_code_sweeps_per_s",
                    "gibbs_sweeps.*.ours_over_reference_pg_scheme")


@pytest.mark.data("uci-gal/concrete")
def test_vips(tmp_path):
    gpflow = os.environ.get("PPL_CL_GPFLOW_PYTHON")
    result, text = run_smoke("vips", tmp_path, *(["--gpflow-python", gpflow] if gpflow else []))
    assert_common(result, text, "vips", tmp_path)
    assert result["smoke"] is True and result["command"].startswith("benchmarks/vips.py")
    rows = result["datasets"]["concrete"]["rows"]
    assert len(rows) == 2
    assert_positive(result, "datasets.concrete.rows.*.ours_total_s",
                    "datasets.concrete.rows.*.ours_fit_s", "datasets.concrete.rows.*.ours_select_s",
                    "datasets.concrete.rows.*.ours_warm_s", "datasets.concrete.rows.*.m",
                    "datasets.concrete.totals.ours_stream_s")
    if "scratch_select_s" in rows[1]:   # --scratch-min-m: the from-scratch reference
        assert_positive(rows[1], "scratch_select_s", "select_speedup")
        assert rows[1]["same_points"] is True
    if result["gpflow_sgpr"]:
        assert_positive(result, "datasets.concrete.rows.*.gpflow_sgpr_fit_s")
    else:
        assert not any("gpflow_sgpr_fit_s" in r for r in rows)


def test_gp_ella(tmp_path):
    result, text = run_smoke("gp_ella", tmp_path)
    assert_common(result, text, "gp_ella", tmp_path)
    assert result["settings"]["smoke"] is True
    assert [r["dataset"] for r in result["rows"]] == ["synthetic"]
    assert_positive(result, "rows.*.tasks", "rows.*.seconds.*.update_s_per_task",
                    "rows.*.seconds.*.predict_s_per_task",
                    "rows.*.ratio_update_gp_ella_autodiff",
                    "rows.*.ratio_update_gp_ella_closed_form",
                    "rows.*.ratio_update_predict_gp_ella_autodiff")
