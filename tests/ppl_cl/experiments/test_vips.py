"""The VIPS experiments are registered under their stable names with the paper's numbers, and
(slow) each runs at its quick size with the stable summary keys."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ppl_cl.experiments import registry
from ppl_cl.experiments.base import build_config


def test_registered_with_stable_names_and_paper_numbers():
    reg = registry()
    for name in ("vips-uci", "vips-table1", "vips-synthetic", "vips-speed-accuracy",
                 "vips-magnetic"):
        assert name in reg, name
    t1 = reg["vips-table1"]
    assert t1.headline
    assert t1.paper["kin8nm_m_vips"].value == 2967 and t1.paper["concrete_rmse_vips"].value == 0.36
    assert reg["vips-speed-accuracy"].paper["m_vips_batch4"].value == 29
    cfg = build_config(reg["vips-uci"], quick=False, overrides={"dataset": "kin8nm"})
    assert cfg.learner.oips_rho == 0.96 and cfg.learner.delta == 0.05


def test_listing_does_not_import_jax():
    code = ("import sys, ppl_cl.experiments.vips as m; "
            "print('jax' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.slow
def test_synthetic_and_speed_accuracy_quick(tmp_path):
    from ppl_cl.experiments import run_experiment

    s = run_experiment("vips-synthetic", quick=True, out=tmp_path / "s",
                       overrides={"n_batches": "2"})["summary"]
    assert {"final_m_d1", "final_m_d2", "final_m_d3"} <= set(s)
    s = run_experiment("vips-speed-accuracy", quick=True, out=tmp_path / "a",
                       overrides={"n_batches": "2"})["summary"]
    assert {"final_m_vips", "final_rmse_vips", "final_rmse_exact"} <= set(s)


@pytest.mark.slow
@pytest.mark.data("uci-gal/concrete")
def test_uci_quick_keys(tmp_path):
    from ppl_cl.experiments import run_experiment

    s = run_experiment("vips-uci", quick=True, out=tmp_path / "u",
                       overrides={"max_batches": "2"})["summary"]
    for m in ("vips", "cv", "oips"):
        assert {f"m_{m}", f"rmse_{m}", f"nlpd_{m}"} <= set(s)
    assert "rmse_exact" in s
