"""The experiment registry against what is independent of it: the CLI's listing, the configs
as ``config.json`` records them and as ``--set`` strings spell them, the keys that the paper
numbers, claims and headline tables name, and the summary a tiny run writes to metrics.json."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from ppl_cl.cli import main
from ppl_cl.configs import from_dict
from ppl_cl.experiments import MODULES, build_config, registry, run_experiment
from ppl_cl.experiments.base import _jsonable, config_differences

SPECS = registry()


def _leaves(config, prefix=""):
    """Every leaf field of a (nested) config dataclass as ``(dotted key, value)``."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def _as_set_string(value) -> str:
    """How a person writes ``value`` on the command line (``--set key=...``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return json.dumps(_jsonable(value))
    if value is None:
        return "none"
    return str(value)


def test_cli_lists_exactly_the_registered_experiments(capsys):
    """``ppl-cl list`` prints one line per experiment, starred when ``reproduce`` runs it."""
    assert main(["list"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line[:2] in ("* ", "  ") and line[2:].strip() and not line.startswith("* = ")]
    listed = {line[2:].split()[0]: line.startswith("*") for line in lines}
    assert listed == {name: spec.headline for name, spec in SPECS.items()}
    # every experiment module registers at least one experiment
    modules = {spec.run.__module__.rsplit(".", 1)[-1] for spec in SPECS.values()}
    assert set(MODULES) <= modules


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("quick", [False, True])
def test_config_round_trips_through_config_json_and_set_strings(name, quick):
    """The config a run records (``config.json``: JSON of the dataclass) rebuilds the same
    config, and so does spelling every one of its fields as a ``--set`` string on top of the
    full defaults: nothing a run records is lost or unreachable from the command line."""
    spec = SPECS[name]
    config = build_config(spec, quick=quick)
    assert type(config) is spec.config_cls
    recorded = json.loads(json.dumps(_jsonable(config)))
    assert from_dict(spec.config_cls, recorded) == config
    overrides = {key: _as_set_string(value) for key, value in _leaves(config)}
    again = build_config(spec, quick=False, overrides=overrides)
    assert again == config, config_differences(_jsonable(config), _jsonable(again))
    if quick and spec.quick:
        # the quick overrides change the full setting (or they would not make it quick)
        assert config_differences(_jsonable(spec.config_cls()), recorded)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_declared_keys_are_consistent(name):
    """Paper numbers are finite and cited and shown in the headline table; every claim names
    keys and reads "not checkable" (None) on an empty summary; a headline experiment has a
    table or a claim for ``reproduce`` to report."""
    spec = SPECS[name]
    table = set(spec.table_keys)
    assert set(spec.paper) <= table or not spec.headline_keys
    for key, number in spec.paper.items():
        assert math.isfinite(number.value) and number.source, key
        assert number.std is None or number.std >= 0, key
    for claim in spec.claims:
        assert claim.check({}) is None
        assert claim.text and claim.all_keys
    if spec.headline:
        assert table or spec.claims, f"{name}: a headline experiment with nothing to report"


def test_tiny_run_writes_the_declared_metrics(tmp_path):
    """A tiny run of a headline experiment writes metrics.json whose summary holds the keys
    its paper numbers name (those of the batches it ran), as numbers, and whose config.json
    records the config the run was built from."""
    spec = SPECS["kalman-timeseries"]
    out = tmp_path / "run"
    returned = run_experiment("kalman-timeseries", out=out, overrides={"length": "50"})
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["summary"] == json.loads(json.dumps(returned["summary"]))
    for claim in spec.claims:
        assert claim.check(metrics["summary"]) is not None, claim.text
    for key in ("avg_log_pred_learned", "avg_log_pred_fixed", "n_points"):
        assert isinstance(metrics["summary"][key], (int, float))
    assert metrics["summary"]["n_points"] == 50
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["experiment"] == "kalman-timeseries"
    assert from_dict(spec.config_cls, cfg["config"]) == build_config(
        spec, overrides={"length": "50"})


#: claims that the paper's own table contradicts in a row (VIPS Table 1: on concrete and bike
#: VIPS keeps more inducing points than Conditional Variance)
_PAPER_EXCEPTIONS = {("vips-uci", "VIPS keeps fewer"), ("vips-table1", "concrete: VIPS keeps fewer"),
                     ("vips-table1", "bike: VIPS keeps fewer")}


def test_claims_hold_on_the_papers_own_numbers():
    """The claims (entered from the papers' text) and the paper numbers (entered from their
    tables) are two records of one paper: every claim whose keys all have a paper number holds
    on those numbers, except where the paper's table itself contradicts the text."""
    checked = 0
    for name, spec in SPECS.items():
        values = {k: p.value for k, p in spec.paper.items()}
        for claim in spec.claims:
            if not all(k in values for k in claim.all_keys):
                continue
            expected = not any(name == n and claim.text.startswith(t)
                               for n, t in _PAPER_EXCEPTIONS)
            assert claim.check(values) is expected, (name, claim.text)
            checked += 1
    assert checked >= 15
