"""``ppl-cl compare``: one stream through several learners (ppl_cl/experiments/compare.py).

End to end on the streams that need no data files (scikit-learn's digits, generated
regression sets), the protocol checked against the generic loops of :mod:`ppl_cl.protocols`,
the not-applicable rules, the seeds' aggregate and the CLI's one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ppl_cl import Batch
from ppl_cl.cli import main
from ppl_cl.experiments import compare as C


def _run(tmp_path, argv, capsys=None):
    rc = main(["compare", *argv, "--out", str(tmp_path), "--no-progress"])
    return rc


def test_classification_end_to_end(tmp_path, capsys):
    """split-digits quick with GP-Tree and online SGD: the run folder holds config.json,
    metrics.json (flat summary keyed <metric>_<learner>), report.md, curves.json and the
    figure; the accuracy matrix gives the summary's final average accuracy and forgetting."""
    out = tmp_path / "digits"
    rc = main(["compare", "split-digits", "--quick", "--learners", "gp-tree,online-sgd,vargp",
               "--set", "n_train=20", "--set", "n_test=20", "--set", "n_units=3",
               "--set", "vargp_max_epochs=2", "--out", str(out), "--no-progress"])
    assert rc == 0
    for f in ("config.json", "metrics.json", "report.md", "curves.json", "compare.png"):
        assert (out / f).is_file(), f
    m = json.loads((out / "metrics.json").read_text())
    s = m["summary"]
    assert s["units"] == 3
    curves = json.loads((out / "curves.json").read_text())
    for name in ("gp_tree", "online_sgd", "vargp"):
        for metric in ("final_avg_accuracy", "forgetting", "online_accuracy", "cum_logloss",
                       "ece", "wall_time_s"):
            assert np.isfinite(s[f"{metric}_{name}"]), (metric, name)
        R = np.asarray(curves[name.replace("_", "-")]["accuracy_matrix"])
        assert np.isnan(R[np.triu_indices(3, 1)]).all()          # tasks not seen yet
        assert s[f"final_avg_accuracy_{name}"] == pytest.approx(R[-1].mean())
        assert s[f"forgetting_{name}"] == pytest.approx(       # Chaudhry et al. 2018
            np.mean([R[j:2, j].max() - R[-1, j] for j in range(2)]))
        assert 0.0 <= s[f"ece_{name}"] <= 1.0
    # a class-incremental learner predicts a new task's classes with ~0 probability before
    # it sees them: its online accuracy on whole tasks is below the chunk learner's
    assert s["online_accuracy_gp_tree"] < s["online_accuracy_online_sgd"]
    report = (out / "report.md").read_text()
    assert "| GP-Tree (Gibbs) (`gp-tree`) |" in report and "`kalman`" not in report
    assert "report.md" in capsys.readouterr().err


class _LastLabel:
    """A tiny deterministic learner: before any data it is not fitted (the comparison scores
    the uniform); after an update it gives probability 0.9 to the last label it was fed."""

    def __init__(self):
        self.last = None

    def update(self, batch):
        self.last = int(np.asarray(batch.y)[-1])
        return {}

    def predict(self, x, task_id=None):
        from ppl_cl.errors import NotFittedError
        from ppl_cl.predictive import CategoricalPredictive

        if self.last is None:
            raise NotFittedError("no data yet")
        p = np.full((len(x), 2), 0.1)
        p[:, self.last] = 0.9
        return CategoricalPredictive(p)


def test_chunk_learner_scores_equal_hand_computed_values(monkeypatch):
    """Two units of 4 points, chunks of 2, fed to _LastLabel: the accuracy matrix, the online
    accuracy, the cumulative log-loss and the ECE equal the values worked out by hand."""
    table = dict(C.COMPARE_LEARNERS)
    table["last-label"] = C.CompareLearner("exact-gp", "classification", "chunks",
                                           lambda s, c, seed, dev: _LastLabel(), "last label")
    monkeypatch.setattr(C, "COMPARE_LEARNERS", table)
    x = np.zeros((4, 1), np.float32)
    units = [C.Unit(Batch(x, np.array([0, 0, 0, 0])), Batch(x, np.array([0, 0, 0, 1]))),
             C.Unit(Batch(x, np.array([1, 1, 1, 1])), Batch(x, np.array([1, 1, 0, 0])))]
    stream = C.Stream("toy", "classification", units, 2)
    res = C.run_learner("last-label", stream, C.CompareConfig(chunk_size=2))
    # after unit 0 it says 0: 3 of task 0's 4 test labels; after unit 1 it says 1: 1 of task
    # 0's, 2 of task 1's
    np.testing.assert_array_equal(res["accuracy_matrix"], [[0.75, np.nan], [0.25, 0.5]])
    assert res["final_avg_accuracy"] == 0.375 and res["forgetting"] == 0.5
    # prequential: chunk 1 uniform (argmax 0: right), chunk 2 says 0 (right), chunk 3 still
    # says 0 (wrong), chunk 4 says 1 (right): 6 of 8, log-loss 2 (log 2 + 2 log 1/0.9 + log 10)
    assert res["online_accuracy"] == 0.75 and res["online_curve"] == [1.0, 0.75]
    assert res["cum_logloss"] == pytest.approx(2 * (np.log(2) + 2 * np.log(1 / 0.9)
                                                    + np.log(10)))
    # the final predictions say 1 at 0.9 on all 8 test points, 3 of them right: one bin
    assert res["ece"] == pytest.approx(0.9 - 3 / 8)


def test_regression_and_multitask(tmp_path):
    """Regression: test RMSE / NLPD after each batch on the pooled test points of the batches
    seen (recomputed here from the learner's predictive), M for the online sparse GP; the
    multi-task stream passes task ids to GP-ELLA-family learners and not to the others."""
    cfg = C.CompareConfig(n_units=2, fixed_m=15)
    stream = C.build_stream("synthetic-regression", cfg, seed=0)
    assert len(stream.units) == 2 and stream.kind == "regression"
    res = C.run_learner("fixed-m", stream, cfg, seed=0)
    assert res["m"] == 15 and res["m_curve"] == [15.0, 15.0]
    assert res["rmse_curve"][-1] == res["rmse"] and len(res["nlpd_curve"]) == 2
    assert np.isfinite(res["online_nlpd"])
    exact = C.run_learner("exact-gp", stream, cfg, seed=0)
    assert exact["rmse"] < 0.3                   # D1's noise std is 0.2, f's std about 1
    rff = C.run_learner("kalman-rff", stream, cfg, seed=0)
    y = np.concatenate([np.asarray(u.test.y) for u in stream.units])
    assert rff["rmse"] < np.sqrt(np.mean(y ** 2)) and len(rff["online_curve"]) == 2

    mt = C.build_stream("synthetic-multitask", C.CompareConfig(n_units=3), seed=0)
    assert mt.multitask and all(u.task_id is not None for u in mt.units)
    for name in ("gp-ella", "individual-gps"):
        r = C.run_learner(name, mt, C.CompareConfig(n_units=3), seed=0)
        assert np.isfinite([r["rmse"], r["nlpd"]]).all()
        assert "m" not in r and "online_nlpd" not in r      # no predictive for a new task


def test_not_applicable_rules():
    """Each learner is run where the protocol fits and listed with its reason elsewhere."""
    b = Batch(np.zeros((4, 3), np.float32), np.array([0, 1, 0, 1]))
    unit = C.Unit(b, b)
    online = C.Stream("kalman-mnist-stationary", "classification", [unit], 10, online=True)
    permuted = C.Stream("permuted-mnist", "classification", [unit, unit], 10)
    split = C.Stream("split-digits", "classification", [unit], 10, new_classes=True)
    regression = C.Stream("uci-concrete", "regression", [unit])
    assert "chunks of 10" in C.not_applicable("vargp", online)
    assert "classes" in C.not_applicable("gp-tree", online)
    assert "new classes" in C.not_applicable("gp-tree", permuted)
    assert C.not_applicable("vargp", permuted) is None
    assert C.not_applicable("kalman", online) is None
    assert C.not_applicable("gp-tree", split) is None
    assert "regression" in C.not_applicable("exact-gp", split)
    assert "multi-task" in C.not_applicable("gp-ella", regression)
    assert C.not_applicable("kalman-rff", regression) is None


def test_seeds_aggregate(tmp_path, capsys):
    """--seeds 0 1: a run folder per seed and report.md with mean ± std over them."""
    rc = main(["compare", "synthetic-multitask", "--learners", "individual-gps",
               "--set", "n_units=2", "--seeds", "0", "1", "--out", str(tmp_path),
               "--no-progress"])
    assert rc == 0
    ms = [json.loads((tmp_path / f"seed-{s}" / "metrics.json").read_text()) for s in (0, 1)]
    report = (tmp_path / "report.md").read_text()
    vals = [m["summary"]["rmse_individual_gps"] for m in ms]
    assert f"{np.mean(vals):.4f} ± {np.std(vals, ddof=1):.4f}" in report
    assert "seeds 0, 1" in report
    assert "multi-task" not in report            # every learner asked for could run


@pytest.mark.parametrize("argv, message", [
    (["no-such-stream"], "unknown stream"),
    (["split-digits", "--learners", "vargp,nope"], "unknown ['nope']"),
    (["synthetic-regression", "--learners", "vargp"], "none of ['vargp'] can take"),
    ([], "name a stream"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, argv, message):
    rc = main(["compare", *argv, "--out", str(tmp_path / "x"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc in (1, 2) and len(err) == 1 and message in err[0], err


def test_list(capsys):
    assert main(["compare", "--list"]) == 0
    out = capsys.readouterr().out
    for name in list(C.STREAMS) + list(C.COMPARE_LEARNERS):
        assert name in out


def test_kalman_takes_table3_settings_of_the_streams_kind():
    """Table 3's non-stationary settings (Always Markov, bias) where a unit holds only some
    classes, the stationary ones (Last Step Markov, no bias) where every unit holds every
    class: with the bias a learned drift explains balanced classes by the intercepts and
    stays at chance (docs/compare.md)."""
    shifted = C.build_stream("split-digits", C.CompareConfig(n_units=2, n_train=5, n_test=5))
    assert C.label_shift(shifted)
    c = C._kalman_config(shifted, 0)
    assert (c.transition, c.feature_bias, c.learn_forgetting) == ("always", True, True)
    x = np.concatenate([np.asarray(u.train.x) for u in shifted.units])
    y = np.arange(len(x)) % 10
    balanced = C.Stream("all-classes", "classification",
                        [C.Unit(Batch(x, y), Batch(x, y))] * 2, 10)
    assert not C.label_shift(balanced)
    c = C._kalman_config(balanced, 0)
    assert (c.transition, c.feature_bias, c.learn_forgetting) == ("last", False, True)


@pytest.mark.data("mnist")
def test_kalman_learns_on_permuted_mnist():
    """On the first task of permuted-mnist (600 points, all 10 classes) the Kalman row learns
    with the stream's settings (the full stream: docs/compare.md)
    where the non-stationary settings stay near chance."""
    import dataclasses

    from ppl_cl.data.streams import online_chunks
    from ppl_cl.learners.kalman import KalmanClassifier
    from ppl_cl.protocols import prequential

    stream = C.build_stream("permuted-mnist", C.CompareConfig(n_units=1, n_train=600,
                                                              n_test=10))
    unit = stream.units[0]
    chunks = online_chunks(np.asarray(unit.train.x), np.asarray(unit.train.y), 10)
    chosen = C._kalman_config(stream, 0)
    accuracy = prequential(KalmanClassifier(chosen), chunks).correct.mean()
    assert accuracy > 0.5
    biased = dataclasses.replace(chosen, transition="always", feature_bias=True)
    assert prequential(KalmanClassifier(biased), chunks).correct.mean() < 0.2
