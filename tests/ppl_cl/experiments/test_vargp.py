"""The registered VAR-GP experiments: registration, outputs, validation sets, resumption after
a task and mid-task, ablation rows alone (on sklearn's digits: always available)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ppl_cl.batch import Task
from ppl_cl.data.streams import TaskSplit
from ppl_cl.data.synthetic import four_blobs
from ppl_cl.experiments import registry, run_experiment
from ppl_cl.learners.vargp import VARGP, VARGPConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = VARGPConfig(num_classes=4, inducing_per_task=5, batch_size=40, max_epochs=2,
                    patience=4, num_theta_samples=2, num_f_samples=4, num_predict_samples=4,
                    learning_rate=3e-2, beta=1.0, validate_every=1, dtype="float64")
QUICK = dict(quick=True, show_progress=False)


def _untimed(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("wall_time_s", "seconds_per_epoch")}
            for r in records]


def test_experiments_are_registered_with_paper_numbers():
    reg = registry()
    for name in ("vargp-toy", "vargp-split-digits", "vargp-split-mnist", "vargp-permuted-mnist"):
        assert name in reg
    split = reg["vargp-split-mnist"]
    assert split.headline and reg["vargp-toy"].headline
    # Table 1's four rows have paper numbers, in the order the registered claim states (the
    # claim from the text, the numbers from the table: tests/ppl_cl/test_registry.py checks
    # every such pair); the printed digits are checked in test_cli.py
    for spec in (split, reg["vargp-permuted-mnist"]):
        (claim,) = spec.claims
        values = {k: spec.paper[k].value for k in claim.keys}
        assert claim.check(values) is True and values["final_avg_accuracy"] > 90
        assert set(claim.keys) == set(spec.table_keys)
    # the experiments' learner defaults: Split MNIST is VARGP()'s, the others replace fields
    assert split.config_cls().learner == VARGPConfig()
    perm = reg["vargp-permuted-mnist"].config_cls().learner
    assert (perm.inducing_per_task, perm.learning_rate, perm.beta) == (100, 3.7e-3, 1.64)


def test_split_digits_learns_with_the_data_scaled_start(tmp_path):
    """VAR-GP on the split digits at the quick preset (the data-scaled start of q(theta) and
    the other small-budget settings) learns: measured on this code at seed 0, 98.2 % on task 1
    after task 1 and 78.5 % final average accuracy over the five tasks (single head: chance
    is 10 %, a learner that keeps only its last task 20 %). The bounds leave room for other
    platforms' rounding, not for a learner at chance."""
    metrics = run_experiment("vargp-split-digits", out=tmp_path, **QUICK,
                             overrides={"ablations": "[]"})
    R = np.asarray(metrics["variants"]["var_gp"]["accuracy_matrix"])
    records = metrics["variants"]["var_gp"]["records"]
    assert [r["theta_start"] for r in records] == ["median_distance"] * 5
    assert len({r["start_lengthscale"] for r in records}) == 1     # fixed at the first task
    assert 100 * R[0, 0] > 90
    assert metrics["summary"]["final_avg_accuracy"] > 60
    # pinned: seed 0 gives 109 / 111 on task 1 and 78.4637 % final average, the same digits in
    # two runs (float32, seeded Monte Carlo: deterministic on one platform). Seeds 1, 2, 3 give
    # 79.17, 79.03 and 82.30 % (seed-to-seed sd 1.7). The tolerance, 0.3 points, is about one
    # and a half test images (each moves the five-task average by ~0.19) for another platform's
    # float32 rounding: a fraction of the seed spread, so a changed learner is seen
    assert R[0, 0] == pytest.approx(109 / 111, abs=1.5 / 111)
    assert metrics["summary"]["final_avg_accuracy"] == pytest.approx(78.46371258135963, abs=0.3)


def test_split_digits_quick_run_writes_its_outputs(tmp_path):
    metrics = run_experiment("vargp-split-digits", out=tmp_path, **QUICK,
                             overrides={"ablations": "[]", "learner.max_epochs": "6"})
    s = metrics["summary"]
    R = np.array(metrics["variants"]["var_gp"]["accuracy_matrix"], dtype=float)
    assert R.shape == (5, 5) and np.isfinite(R).all() and s["num_tasks"] == 5
    # the summary is the matrix's last row averaged, and forgetting the drop of each earlier
    # task from its best accuracy (Chaudhry et al. 2018)
    assert s["final_avg_accuracy"] == pytest.approx(100 * R[-1].mean(), rel=1e-12)
    drops = [R[j:4, j].max() - R[4, j] for j in range(4)]
    assert s["final_forgetting"] == pytest.approx(100 * np.mean(drops), rel=1e-12)
    assert s["epochs_total"] == 5 * 6
    for name in ("metrics.json", "config.json", "vargp.npz", "posterior.nc",
                 "entropy_matrix.png", "inducing_points.png", "ablations.png",
                 "hyperparameters.png"):
        assert (tmp_path / name).exists(), name
    restored = VARGP.load(tmp_path / "vargp.npz")
    assert restored.num_updates == 5 and restored.config.max_epochs == 6
    from ppl_cl.experiments.vargp import SplitDigitsConfig, split_digits_stream
    tasks, _ = split_digits_stream(SplitDigitsConfig(), seed=0)
    # the saved learner scores the run's own test sets exactly as the run did
    acc = [restored.predict(t.test.x).accuracy(t.test.y) for t in tasks]
    np.testing.assert_allclose(acc, R[-1], rtol=0, atol=0)


class _Ctx:
    checkpoint_every_s = 600.0
    show_progress = False
    seed = 0
    device = "cpu"

    def load_checkpoint(self, key):
        return None

    def save_checkpoint(self, key, state):
        pass

    def log(self, line):
        pass


def test_run_stream_scores_the_final_learner_on_every_validation_set():
    """final_avg_validation_accuracy is the final learner's mean accuracy over the per-task
    validation batches: given the test sets as validation data it equals final_avg_accuracy."""
    from ppl_cl.experiments.vargp import run_stream

    x, y = four_blobs(30, seed=0)
    xt, yt = four_blobs(20, seed=1)
    splits = [TaskSplit(Task(x[np.isin(y, g)], y[np.isin(y, g)], i),
                        Task(xt[np.isin(yt, g)], yt[np.isin(yt, g)], i), i, g)
              for i, g in enumerate([(0, 1), (2, 3)])]
    out = run_stream(splits, None, SMALL, _Ctx(), task_valids=[s.test for s in splits])
    assert out["final_avg_validation_accuracy"] == pytest.approx(out["final_avg_accuracy"],
                                                                 abs=1e-9)
    assert run_stream(splits, None, SMALL, _Ctx())["final_avg_validation_accuracy"] is None


def test_early_stopping_scores_every_class_seen_so_far(tmp_path, monkeypatch):
    """The batch given to task t's early stopping is the union of the validation images of
    tasks 1..t (uber-research/vargp ``experiments/vargp.py``:
    ``mnist_val.filter_by_class(range(2 * t + 2))``)."""
    seen = []
    real_update = VARGP.update

    def spy(self, batch, validation=None, **kwargs):
        seen.append(sorted(set(np.asarray(validation.y).tolist())))
        return real_update(self, batch, validation=validation, **kwargs)

    monkeypatch.setattr(VARGP, "update", spy)
    run_experiment("vargp-split-digits", out=tmp_path / "r", **QUICK,
                   overrides={"ablations": "[]", "learner.max_epochs": "1"})
    assert seen == [list(range(2 * (t + 1))) for t in range(5)]


def test_stopped_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    """A run killed mid-stream (here: in the ablation's third task) and continued with
    ``resume=True`` gives the same accuracy matrices and training records as a run that was
    never stopped; a resume with other settings is refused; checkpoints go once done."""
    from ppl_cl.errors import ConfigError

    kw = dict(**QUICK, overrides={"ablations": "[block_diag]", "learner.max_epochs": "3"})
    whole = run_experiment("vargp-split-digits", out=tmp_path / "whole", **kw)
    assert not (tmp_path / "whole" / "checkpoints").exists()

    real_update, calls = VARGP.update, []

    def dying_update(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 8:  # 5 VAR-GP tasks, then block-diag tasks 1, 2, then killed
            raise KeyboardInterrupt
        return real_update(self, *args, **kwargs)

    monkeypatch.setattr(VARGP, "update", dying_update)
    with pytest.raises(KeyboardInterrupt):
        run_experiment("vargp-split-digits", out=tmp_path / "cut", **kw)
    monkeypatch.setattr(VARGP, "update", real_update)
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()) == [
        "block_diag.npz", "var_gp.npz"]
    # other settings: refused before anything is touched, naming the changed field only
    config = (tmp_path / "cut" / "config.json").read_bytes()
    with pytest.raises(ConfigError, match=r"other settings \(config\.learner\.max_epochs: 3 -> 4\)"):
        run_experiment("vargp-split-digits", out=tmp_path / "cut", resume=True,
                       **{**kw, "overrides": {**kw["overrides"], "learner.max_epochs": "4"}})
    assert (tmp_path / "cut" / "config.json").read_bytes() == config
    # without config.json the checkpoints' own record refuses it, before anything is written
    (tmp_path / "cut" / "config.json").unlink()
    with pytest.raises(ConfigError, match="max_epochs: 3 -> 4"):
        run_experiment("vargp-split-digits", out=tmp_path / "cut", resume=True,
                       **{**kw, "overrides": {**kw["overrides"], "learner.max_epochs": "4"}})
    assert not (tmp_path / "cut" / "config.json").exists()
    resumed = run_experiment("vargp-split-digits", out=tmp_path / "cut", resume=True, **kw)
    log = (tmp_path / "cut" / "progress.log").read_text()
    assert "var_gp: resumed after task 5/5" in log
    assert "block_diag: resumed after task 2/5" in log and "block_diag: task 5/5" in log
    assert not (tmp_path / "cut" / "checkpoints").exists()
    for row in ("var_gp", "block_diag"):
        a, b = whole["variants"][row], resumed["variants"][row]
        np.testing.assert_array_equal(a["accuracy_matrix"], b["accuracy_matrix"])
        np.testing.assert_array_equal(a["entropy_matrix"], b["entropy_matrix"])
        assert _untimed(a["records"]) == _untimed(b["records"])
    assert resumed["summary"]["final_avg_accuracy"] == whole["summary"]["final_avg_accuracy"]


def test_a_run_stopped_mid_task_resumes_from_its_snapshot(tmp_path, monkeypatch):
    """Snapshots within a task (``checkpoint_every_s``; 0 = every epoch). A run is killed
    right after task 2's checkpoint, when it still holds task 2's last snapshot: resuming
    must start task 3 afresh. Killed again in task 3 after epoch 2, it continues from there;
    the result equals a run that was never stopped (which took no snapshots)."""
    from ppl_cl.experiments.base import RunContext

    kw = dict(**QUICK, overrides={"ablations": "[]", "learner.max_epochs": "4",
                                 "learner.validate_every": "1"})
    whole = run_experiment("vargp-split-digits", out=tmp_path / "whole", **kw)

    real_save = RunContext.save_checkpoint
    saved = []

    def dying_save(self, key, tree):
        real_save(self, key, tree)
        saved.append((key, tree.get("task"), tree.get("loop", {}).get("epoch")))
        entry, times = stop
        if saved[-1] == entry and saved.count(entry) == times:
            raise KeyboardInterrupt

    cut = tmp_path / "cut"
    monkeypatch.setattr(RunContext, "save_checkpoint", dying_save)
    stop = ("var_gp", None, None), 2  # the second task's end
    with pytest.raises(KeyboardInterrupt):
        run_experiment("vargp-split-digits", out=cut, checkpoint_every_s=0, **kw)
    # epochs 1-3 of each task (none after the last), the task's end under the row's key
    assert saved == [("var_gp-partial", 1, 1), ("var_gp-partial", 1, 2),
                     ("var_gp-partial", 1, 3), ("var_gp", None, None),
                     ("var_gp-partial", 2, 1), ("var_gp-partial", 2, 2),
                     ("var_gp-partial", 2, 3), ("var_gp", None, None)]
    saved.clear()
    stop = ("var_gp-partial", 3, 2), 1
    with pytest.raises(KeyboardInterrupt):
        run_experiment("vargp-split-digits", out=cut, resume=True, checkpoint_every_s=0, **kw)
    assert saved == [("var_gp-partial", 3, 1), ("var_gp-partial", 3, 2)]  # task 3 afresh
    monkeypatch.setattr(RunContext, "save_checkpoint", real_save)

    resumed = run_experiment("vargp-split-digits", out=cut, resume=True,
                             checkpoint_every_s=0, **kw)
    log = (cut / "progress.log").read_text()
    assert log.count("var_gp: resumed after task 2/5") == 2
    assert log.count("resumes after epoch") == 1
    assert "var_gp: task 3/5 resumes after epoch 2" in log
    snaps = re.findall(r"var_gp: task (\d)/5: epoch (\d+), snapshot saved, validation "
                       r"(\d\.\d{4}) \(best (\d\.\d{4}) at epoch (\d+)\), [\d.]+ s", log)
    assert [(int(t), int(e)) for t, e, *_ in snaps] == [
        (1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3), (3, 1), (3, 3), (4, 1), (4, 2), (4, 3),
        (5, 1), (5, 2), (5, 3)]
    assert all(float(v) <= float(b) and 1 <= int(be) <= int(e) for _, e, v, b, be in snaps)
    assert not (cut / "checkpoints").exists()
    a, b = whole["variants"]["var_gp"], resumed["variants"]["var_gp"]
    np.testing.assert_array_equal(a["accuracy_matrix"], b["accuracy_matrix"])
    np.testing.assert_array_equal(a["entropy_matrix"], b["entropy_matrix"])
    assert _untimed(a["records"]) == _untimed(b["records"])


def test_ablation_rows_can_run_without_the_var_gp_row(tmp_path, monkeypatch):
    """``run_var_gp=False`` trains only the ablations (no throwaway VAR-GP stage): one learner
    per ablation, their Table 1 keys and the first ablation's suffixed forgetting/time keys;
    every later row keeps its learner too (``vargp_<row>.npz``)."""
    calls = []
    real_update = VARGP.update

    def counting_update(self, *args, **kwargs):
        calls.append(self.config.guide)
        return real_update(self, *args, **kwargs)

    monkeypatch.setattr(VARGP, "update", counting_update)
    metrics = run_experiment("vargp-split-digits", out=tmp_path / "a", **QUICK,
                             overrides={"ablations": "[global, block_diag]",
                                        "run_var_gp": "false", "learner.max_epochs": "2"})
    assert calls == ["global"] * 5 + ["block_diagonal"] * 5
    s = metrics["summary"]
    assert "final_avg_accuracy" not in s and "final_forgetting" not in s
    R = np.asarray(metrics["variants"]["global"]["accuracy_matrix"])
    assert s["final_avg_accuracy_global"] == pytest.approx(100 * R[-1].mean(), rel=1e-12)
    assert {"final_forgetting_global", "epochs_total_global", "train_time_s_global"} <= set(s)
    assert list(metrics["variants"]) == ["global", "block_diag"]
    assert VARGP.load(tmp_path / "a" / "vargp.npz").config.guide == "global"
    assert VARGP.load(tmp_path / "a" / "vargp_block_diag.npz").config.guide == "block_diagonal"
    with pytest.raises(ValueError, match="nothing to train"):
        run_experiment("vargp-split-digits", out=tmp_path / "b", **QUICK,
                       overrides={"ablations": "[]", "run_var_gp": "false"})


@pytest.mark.slow
def test_quick_toy_runs_and_keeps_the_first_task():
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        metrics = run_experiment("vargp-toy", out=out, **QUICK)
    s = metrics["summary"]
    for row in ("", "_block_diag", "_mle_hypers", "_global"):
        R = np.asarray(metrics["variants"][row[1:] or "var_gp"]["accuracy_matrix"])
        assert s[f"task0_acc_after_task1{row}"] == pytest.approx(100 * R[1, 0])
    # VAR-GP keeps task {0, 1} after learning {2, 3} (a chance-level learner scores 50 %)
    assert s["task0_acc_after_task1"] > 75 and s["task1_acc_after_task1"] > 60


@pytest.mark.slow
@pytest.mark.data("mnist")
@pytest.mark.parametrize("name", ["vargp-split-mnist", "vargp-permuted-mnist"])
def test_quick_mnist_experiments_learn(name, tmp_path):
    """The quick presets (the small-budget settings, ``configs.vargp.SMALL_BUDGET``) learn:
    measured on this code at seed 0, VAR-GP's final average accuracy is 67.8 % (Split) and
    57.3 % (Permuted, 3 tasks); the bound 40 % is far above the 10-way chance of 10 % and the
    20 % of a Split learner that keeps only its last task."""
    metrics = run_experiment(name, out=tmp_path, **QUICK)
    R = np.asarray(metrics["variants"]["var_gp"]["accuracy_matrix"])
    assert metrics["summary"]["final_avg_accuracy"] == pytest.approx(100 * R[-1].mean())
    assert metrics["summary"]["final_avg_accuracy"] > 40
    assert all(r["theta_start"] == "median_distance" for r in metrics["variants"]["var_gp"]["records"])
