"""The VARGP learner: the learner protocol, exact resumption after save/load, bad input
(issue 3, items 3 and 9), the ArviZ export, and the registered experiments."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from ppl_cl.batch import Batch, Task
from ppl_cl.data.synthetic import four_blobs
from ppl_cl.learner import Learner, registered_learners
from ppl_cl.learners.vargp import VARGP
from ppl_cl.predictive import CategoricalPredictive

SMALL = dict(inducing_per_task=5, batch_size=40, max_epochs=12, patience=4,
             num_theta_samples=2, num_f_samples=4, num_predict_samples=4, learning_rate=3e-2,
             dtype="float64")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _benchmark(name: str):
    """The module ``benchmarks/<name>.py`` (the benchmarks are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def blobs():
    x, y = four_blobs(30, seed=0)
    xt, yt = four_blobs(20, seed=1)
    groups = [(0, 1), (2, 3), (0, 3)]

    def task(i, xs=x, ys=y):
        m = np.isin(ys, groups[i])
        return Task(xs[m], ys[m], task_id=i)

    return {"train": [task(i) for i in range(3)],
            "valid": [task(i, xt, yt) for i in range(3)], "x": x, "y": y, "xt": xt, "yt": yt}


def _state_equal(a: dict, b: dict) -> bool:
    def flat(node, out, prefix=""):
        if isinstance(node, dict):
            for k, v in node.items():
                flat(v, out, f"{prefix}/{k}")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                flat(v, out, f"{prefix}/{i}")
        else:
            out[prefix] = node
        return out

    fa, fb = flat(a, {}), flat(b, {})
    if fa.keys() != fb.keys():
        return False
    for k in fa:
        va, vb = fa[k], fb[k]
        if isinstance(va, torch.Tensor):
            if not torch.equal(va, vb):
                return False
        elif va != vb:
            return False
    return True


def _untimed(records: list[dict]) -> list[dict]:
    """Task records without their wall-clock fields (which differ between any two runs)."""
    return [{k: v for k, v in r.items() if k not in ("wall_time_s", "seconds_per_epoch")}
            for r in records]


# ---------------------------------------------------------------------------------------------
# protocol
# ---------------------------------------------------------------------------------------------
def test_protocol_update_predict_and_registry(blobs):
    assert registered_learners()["vargp"] is VARGP
    learner = VARGP(4, **SMALL)
    json.dumps(learner.config)  # JSON-serializable config (Learner.load rebuilds from it)
    with pytest.raises(RuntimeError, match="update"):
        learner.predict(blobs["xt"])
    rec = learner.update(blobs["train"][0], validation=blobs["valid"][0])
    for key in ("task", "epochs", "steps", "best_epoch", "best_validation", "stopped_early",
                "final_loss", "wall_time_s", "seconds_per_epoch"):
        assert key in rec
    assert rec["task"] == 1 and rec["epochs"] <= SMALL["max_epochs"]
    assert 0.0 <= rec["best_validation"] <= 1.0
    pred = learner.predict(blobs["xt"])
    assert isinstance(pred, CategoricalPredictive)
    assert pred.probs.shape == (len(blobs["xt"]), 4)
    np.testing.assert_allclose(pred.probs.sum(1), 1.0, atol=1e-12)
    # the same state predicts the same probabilities (seeded Monte Carlo)
    np.testing.assert_array_equal(pred.probs, learner.predict(blobs["xt"]).probs)
    assert learner.predict(torch.as_tensor(blobs["xt"][:3])).probs.shape == (3, 4)
    assert learner.predict(blobs["xt"][:0]).probs.shape == (0, 4)

    learner.update(blobs["train"][1])  # no validation: runs max_epochs, keeps the last state
    assert len(learner.tasks) == 2 and learner.num_updates == 2
    assert learner.history[-1]["epochs"] == SMALL["max_epochs"]
    # old tasks were frozen: task 1's inducing set is bitwise the one trained on task 1
    assert learner.history[0]["task"] == 1
    # each record says where theta (the mean of q_t(theta)) ended after the task
    log_l = learner.hyper.loc[0, 1:]
    last = learner.history[-1]
    assert last["theta_log_variance"] == pytest.approx(float(learner.hyper.loc[0, 0]))
    assert last["theta_log_lengthscale_min"] == pytest.approx(float(log_l.min()))
    assert last["theta_log_lengthscale_max"] == pytest.approx(float(log_l.max()))
    assert last["theta_scale_median"] == pytest.approx(float(learner.hyper.scale.median()))


def test_learns_the_toy_tasks(blobs):
    """A sanity check of the whole loop (not a paper number): after task {0, 1} the four-blob
    learner separates classes 0 and 1 on fresh test points."""
    learner = VARGP(4, **{**SMALL, "max_epochs": 40, "inducing_per_task": 8})
    learner.update(blobs["train"][0])
    m = np.isin(blobs["yt"], (0, 1))
    assert learner.predict(blobs["xt"][m]).accuracy(blobs["yt"][m]) > 0.8


def test_old_tasks_are_frozen(blobs):
    learner = VARGP(4, **SMALL)
    learner.update(blobs["train"][0])
    first = [t.clone() for t in learner.tasks[0]]
    learner.update(blobs["train"][1])
    assert all(torch.equal(a, b) for a, b in zip(first, learner.tasks[0]))
    assert not torch.equal(learner.tasks[1].mean, torch.zeros_like(learner.tasks[1].mean))


@pytest.mark.parametrize("options", [dict(guide="block_diagonal"), dict(guide="global"),
                                     dict(hyperparameters="point"),
                                     dict(per_class_inducing_inputs=False,
                                          per_class_hyperparameters=True)])
def test_ablation_options_run(blobs, options):
    learner = VARGP(4, **{**SMALL, "max_epochs": 3}, **options)
    learner.update(blobs["train"][0])
    learner.update(blobs["train"][1])
    if options.get("guide") == "global":
        assert len(learner.tasks) == 1  # one inducing set at a time
    else:
        assert len(learner.tasks) == 2
    if options.get("hyperparameters") == "point":
        assert isinstance(learner.hyper, torch.Tensor)
        last = learner.history[-1]
        assert last["theta_scale_median"] == 0.0
        assert last["theta_log_lengthscale_median"] == pytest.approx(
            float(learner.hyper[0, 1:].median()))
    if options.get("per_class_hyperparameters"):
        assert learner.hyper.loc.shape == (4, 3)
        assert learner.tasks[0].inducing_inputs.shape == (1, 5, 2)
    np.testing.assert_allclose(learner.predict(blobs["xt"]).probs.sum(1), 1.0, atol=1e-12)


def test_global_previous_init_keeps_old_inducing_inputs(blobs):
    """global_init="previous": task 2 starts from round(M / 2) rows of Z_1 per class GP plus
    task-2 inputs, and q(u_2) from q(u_1) carried to them; "task" draws task-2 inputs only."""
    opts = {**SMALL, "max_epochs": 2, "learn_inducing_inputs": False}
    carried = VARGP(4, guide="global", global_init="previous", **opts)
    fresh = VARGP(4, guide="global", **opts)
    for learner in (carried, fresh):
        learner.update(blobs["train"][0])
    Z1 = carried.tasks[0].inducing_inputs.clone()
    assert torch.equal(Z1, fresh.tasks[0].inducing_inputs)  # task 1 is the same for both
    for learner in (carried, fresh):
        learner.update(blobs["train"][1])
    task2 = {tuple(r) for r in np.asarray(blobs["train"][1].x).tolist()}
    keep = round(5 / 2)
    for k in range(4):
        old = {tuple(r) for r in Z1[k].tolist()}
        Zc = carried.tasks[0].inducing_inputs[k].tolist()
        assert all(tuple(z) in old for z in Zc[:keep])
        assert all(tuple(z) in task2 for z in Zc[keep:])
        assert all(tuple(z) in task2 for z in fresh.tasks[0].inducing_inputs[k].tolist())
    assert carried.config["global_init"] == "previous"
    np.testing.assert_allclose(carried.predict(blobs["xt"]).probs.sum(1), 1.0, atol=1e-12)
    with pytest.raises(ValueError, match="global_init"):
        VARGP(4, guide="global", global_init="old")


# ---------------------------------------------------------------------------------------------
# save after task t + load + continue == uninterrupted
# ---------------------------------------------------------------------------------------------
def test_resume_after_save_load_matches_uninterrupted_run(blobs, tmp_path):
    cfg = dict(SMALL, seed=5)
    straight = VARGP(4, **cfg)
    for i in range(3):
        straight.update(blobs["train"][i], validation=blobs["valid"][i])
    expected = straight.predict(blobs["xt"]).probs

    resumed = VARGP(4, **cfg)
    for i in range(3):
        resumed.update(blobs["train"][i], validation=blobs["valid"][i])
        path = tmp_path / f"after_task{i}.npz"
        resumed.save(path)
        resumed = Learner.load(path)
        assert isinstance(resumed, VARGP) and resumed.num_updates == i + 1
    got = resumed.predict(blobs["xt"]).probs
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    a, b = resumed.state_dict(), straight.state_dict()
    for state in (a, b):
        state["history"] = _untimed(state["history"])
    assert _state_equal(a, b)  # bitwise: parameters, q(theta), losses and validation curves


def test_load_state_dict_rejects_mismatched_hyperparameters(blobs):
    a = VARGP(4, **{**SMALL, "max_epochs": 2})
    a.update(blobs["train"][0])
    b = VARGP(4, **{**SMALL, "max_epochs": 2}, hyperparameters="point")
    with pytest.raises(ValueError, match="hyperparameters"):
        b.load_state_dict(a.state_dict())


def test_isotropic_kernel_learns_saves_and_exports(blobs, tmp_path):
    """``ard=False`` (eq. 20 as printed): theta is [log gamma, log l] per set, q_1(theta) starts
    at the same median heuristic as the ARD kernel, the learner still learns the toy tasks,
    resumes bitwise from a file, exports one lengthscale, and a state of the other width is
    refused."""
    cfg = dict(SMALL, seed=3, ard=False, max_epochs=40, inducing_per_task=8)
    learner = VARGP(4, **cfg)
    learner.update(blobs["train"][0])
    m = np.isin(blobs["yt"], (0, 1))
    assert learner.predict(blobs["xt"][m]).accuracy(blobs["yt"][m]) > 0.8  # as the ARD test
    ard = VARGP(4, **{**cfg, "ard": True, "max_epochs": 1})
    ard.update(blobs["train"][0])
    assert learner.hyper.loc.shape == (1, 2) and ard.hyper.loc.shape == (1, 3)
    assert learner.history[0]["theta_log_lengthscale_min"] == pytest.approx(
        learner.history[0]["theta_log_lengthscale_max"])
    path = tmp_path / "iso.npz"
    learner.save(path)
    loaded = Learner.load(path)
    assert loaded.config["ard"] is False
    for lrn in (learner, loaded):
        lrn.update(blobs["train"][1], validation=blobs["valid"][1])
    np.testing.assert_array_equal(loaded.predict(blobs["xt"]).probs,
                                  learner.predict(blobs["xt"]).probs)
    idata = learner.to_inference_data(num_draws=20)
    assert idata.posterior["log_lengthscale"].dims == ("chain", "draw", "hyper_set")
    with pytest.raises(ValueError, match="ard"):
        ard.load_state_dict(learner.state_dict())


def test_without_restore_a_task_ends_at_its_last_epoch(blobs):
    """restore_best=False (Algorithm 1 has no restore step): validation still runs, but the task
    keeps its last epoch's parameters, the same state as training without a validation set;
    the default restores the best epoch, which here is not the last one."""
    cfg = {**SMALL, "patience": 50}  # no early stop: every run trains max_epochs
    last = VARGP(4, **cfg, restore_best=False)
    rec = last.update(blobs["train"][0], validation=blobs["valid"][0])
    assert rec["epochs"] == rec["best_epoch"] == cfg["max_epochs"]
    assert rec["best_validation"] == rec["validation"][-1]  # the kept epoch's, not the best
    blind = VARGP(4, **cfg)
    blind.update(blobs["train"][0])

    def trained(learner):  # the state without the task records (validation numbers differ)
        return {k: v for k, v in learner.state_dict().items() if k != "history"}

    assert _state_equal(trained(last), trained(blind))
    best = VARGP(4, **cfg)
    rec_best = best.update(blobs["train"][0], validation=blobs["valid"][0])
    assert rec_best["best_epoch"] < cfg["max_epochs"]
    assert not _state_equal(trained(best), trained(blind))
    # the choice is part of the saved config and survives a reload
    assert VARGP(**json.loads(json.dumps(last.config))).config["restore_best"] is False


def test_fixed_hyperparameters_stay_at_their_start(blobs):
    """hyperparameters="fixed" (diagnostic): theta is the median-heuristic start on every task
    (no theta site, no theta param), saved and loaded like a point theta."""
    learner = VARGP(4, **{**SMALL, "max_epochs": 3}, hyperparameters="fixed")
    learner.update(blobs["train"][0])
    theta1 = learner.hyper.clone()
    assert theta1.shape == (1, 3) and float(theta1[0, 0]) == 0.0       # log gamma = 0
    assert float(theta1[0, 1]) != 0.0                                   # median heuristic
    learner.update(blobs["train"][1])
    torch.testing.assert_close(learner.hyper, theta1, rtol=0, atol=0)
    other = VARGP(4, **{**SMALL, "max_epochs": 3}, hyperparameters="fixed")
    other.load_state_dict(learner.state_dict())
    np.testing.assert_array_equal(other.predict(blobs["xt"]).probs,
                                  learner.predict(blobs["xt"]).probs)
    idata = learner.to_inference_data(num_draws=4, seed=0)
    assert idata.posterior["log_lengthscale"].shape[1] == 4


def test_fixed_hyperparameters_program_has_no_theta_site_or_param():
    import pyro
    from pyro import poutine

    from models.vargp import InducingSet, VARGPModel

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 2, generator=gen)
    y = torch.randint(3, (8,), generator=gen)
    init = InducingSet(torch.randn(3, 4, 2, generator=gen), torch.zeros(3, 4),
                       torch.eye(4).expand(3, 4, 4).clone())
    theta = torch.tensor([[0.0, 0.3, -0.2]])
    m = VARGPModel(num_classes=3, past=[], init=init, hyper_init=theta,
                   hyperparameters="fixed")
    pyro.clear_param_store()
    tr = poutine.trace(m.guide).get_trace(x, y)
    assert "theta" not in tr.nodes
    assert not [n for n in pyro.get_param_store().keys() if n.startswith("theta")]
    torch.testing.assert_close(m.current_hyper(), theta)
    assert m.num_theta_samples == 1


# ---------------------------------------------------------------------------------------------
# bad input: clear errors, state unchanged
# ---------------------------------------------------------------------------------------------
def test_bad_input_raises_before_any_state_change(blobs):
    learner = VARGP(4, **{**SMALL, "max_epochs": 2})
    learner.update(blobs["train"][0])
    before = learner.state_dict()
    x, y = blobs["train"][1].x, blobs["train"][1].y
    cases = [
        (Task(x, np.full(len(y), 4)), ValueError, r"labels in 0\.\.3"),            # class 4
        (Task(x, -np.ones(len(y), dtype=np.int64)), ValueError, r"labels in 0\.\.3"),
        (Task(np.hstack([x, x]), y), ValueError, r"\(n, 2\)"),                    # new dim
        (Task(x[:0], y[:0]), ValueError, "empty"),                                   # empty
        (Task(np.where(np.arange(len(x))[:, None] == 3, np.nan, x), y), ValueError, "NaN"),
        (Task(x, y.astype(np.float64)), TypeError, "integer"),
        (Task(x), ValueError, "targets"),
    ]
    for task, err, msg in cases:
        with pytest.raises(err, match=msg):
            learner.update(task)
        assert _state_equal(learner.state_dict(), before)
    with pytest.raises(ValueError, match=r"labels in 0\.\.3"):
        learner.update(blobs["train"][1], validation=Task(x, np.full(len(y), 7)))
    assert _state_equal(learner.state_dict(), before)
    with pytest.raises(ValueError, match=r"\(n, 2\)"):
        learner.predict(np.zeros((3, 5)))
    with pytest.raises(ValueError, match="NaN"):
        learner.predict(np.full((2, 2), np.nan))
    with pytest.raises(TypeError, match="Batch"):
        learner.update([1, 2, 3])


def test_diverging_training_leaves_state_unchanged(blobs, monkeypatch):
    from inference import svi

    learner = VARGP(4, **{**SMALL, "max_epochs": 2})
    learner.update(blobs["train"][0])
    before = learner.state_dict()

    def boom(self, *args, **kwargs):
        raise svi.NonFiniteLossError("SVI loss became nan at epoch 1, minibatch 1")

    monkeypatch.setattr(svi.ContinualSVI, "fit", boom)
    with pytest.raises(svi.NonFiniteLossError, match="epoch 1"):
        learner.update(blobs["train"][1])
    assert _state_equal(learner.state_dict(), before)

    fresh = VARGP(4, **SMALL)
    with pytest.raises(svi.NonFiniteLossError):
        fresh.update(blobs["train"][0])
    assert fresh.input_dim is None and fresh.tasks == [] and fresh.num_updates == 0


def test_bad_config_raises():
    for kw, msg in ((dict(num_classes=1), "num_classes"), (dict(guide="x"), "guide"),
                    (dict(hyperparameters="mle"), "hyperparameters"),
                    (dict(dtype="float16"), "dtype"), (dict(inducing_per_task=0), "inducing"),
                    (dict(theta_init="x"), "theta_init"),
                    (dict(scale_tril_init="x"), "scale_tril_init"),
                    (dict(batch_size=0), "batch_size"), (dict(optimizer="sgd"), "optimizer")):
        args = {"num_classes": 3, **kw}
        with pytest.raises(ValueError, match=msg):
            VARGP(**args)


# ---------------------------------------------------------------------------------------------
# ArviZ
# ---------------------------------------------------------------------------------------------
def test_to_inference_data_has_theta_and_inducing_values(blobs, tmp_path):
    import arviz as az

    learner = VARGP(4, **{**SMALL, "max_epochs": 3})
    learner.update(blobs["train"][0])
    learner.update(blobs["train"][1])
    with pytest.raises(ValueError, match="labels"):
        learner.to_inference_data(num_draws=5, x=blobs["xt"], y=np.full(len(blobs["yt"]), 9))
    idata = learner.to_inference_data(num_draws=50, x=blobs["xt"], y=blobs["yt"],
                                      max_elements=2000)                  # forces chunking
    post = idata.posterior
    assert post["log_variance"].shape == (1, 50, 1)
    assert post["log_lengthscale"].shape == (1, 50, 1, 2)
    assert post["u_task1"].shape == (1, 50, 4, 5) and post["u_task2"].shape == (1, 50, 4, 5)
    assert post["u_task1"].dims == ("chain", "draw", "class", "inducing_1")
    assert idata.constant_data["inducing_inputs_task2"].shape == (4, 5, 2)
    assert idata.log_likelihood["y"].shape == (1, 50, len(blobs["yt"]))
    assert np.isfinite(idata.log_likelihood["y"].values).all()
    # draws of theta follow q(theta): means within 5 standard errors
    q = learner.hyper
    draws = post["log_lengthscale"].values[0, :, 0]
    se = q.scale[0, 1:].numpy() / np.sqrt(50)
    assert (np.abs(draws.mean(0) - q.loc[0, 1:].numpy()) < 5 * se).all()
    summary = az.summary(idata, var_names=["log_variance"], kind="stats")
    assert summary.shape[0] == 1
    idata.to_netcdf(str(tmp_path / "posterior.nc"))


def test_inducing_draws_match_the_closed_form_joint(blobs):
    """u draws of to_inference_data (whitened form) vs mean/covariance of eq. 22 at fixed theta
    (point hyperparameters), within Monte Carlo error."""
    from models.vargp_math import autoregressive_joint

    learner = VARGP(4, **{**SMALL, "max_epochs": 3}, hyperparameters="point")
    learner.update(blobs["train"][0])
    learner.update(blobs["train"][1])
    n = 4000
    idata = learner.to_inference_data(num_draws=n, seed=3)
    u = np.concatenate([idata.posterior["u_task1"].values[0],
                        idata.posterior["u_task2"].values[0]], axis=-1)   # (n, K, M)
    theta = learner.hyper.expand(1, 1, *learner.hyper.shape)
    mu, Sigma = autoregressive_joint(theta, learner.tasks, learner.jitter)
    mu, Sigma = mu[0, 0].numpy(), Sigma[0, 0].numpy()
    se = u.std(0) / np.sqrt(n)
    assert (np.abs(u.mean(0) - mu) <= 5 * se + 1e-9).all()
    c = u - u.mean(0)
    prods = c[..., :, None] * c[..., None, :]
    se_cov = prods.std(0) / np.sqrt(n)
    assert (np.abs(prods.mean(0) - Sigma) <= 5 * se_cov + 1e-9).all()


# ---------------------------------------------------------------------------------------------
# experiments
# ---------------------------------------------------------------------------------------------
def test_experiments_are_registered_with_paper_numbers():
    from ppl_cl.experiments.base import registry

    reg = registry()
    for name in ("vargp-toy", "vargp-split-digits", "vargp-split-mnist", "vargp-permuted-mnist"):
        assert name in reg
    split = reg["vargp-split-mnist"]
    assert split.headline and reg["vargp-toy"].headline
    assert split.paper["final_avg_accuracy"].value == 90.57
    assert split.paper["final_avg_accuracy"].std == 1.06
    assert {k: split.paper[k].value for k in ("final_avg_accuracy_block_diag",
                                              "final_avg_accuracy_mle_hypers",
                                              "final_avg_accuracy_global")} == {
        "final_avg_accuracy_block_diag": 78.64, "final_avg_accuracy_mle_hypers": 10.09,
        "final_avg_accuracy_global": 39.31}
    assert reg["vargp-permuted-mnist"].paper["final_avg_accuracy"].value == 97.20


def test_split_digits_quick_run_writes_its_outputs(tmp_path):
    from ppl_cl.experiments.base import run_experiment

    metrics = run_experiment("vargp-split-digits", quick=True, out=tmp_path,
                             overrides={"ablations": "[]", "max_epochs": "6"},
                             show_progress=False)
    s = metrics["summary"]
    assert 0 <= s["final_avg_accuracy"] <= 100 and s["num_tasks"] == 5
    assert 0 <= s["final_avg_validation_accuracy"] <= 100
    R = np.array(metrics["variants"]["var_gp"]["accuracy_matrix"], dtype=float)
    assert R.shape == (5, 5) and np.isfinite(R).all()
    for name in ("metrics.json", "config.json", "vargp.npz", "posterior.nc",
                 "entropy_matrix.png", "inducing_points.png", "ablations.png",
                 "hyperparameters.png"):
        assert (tmp_path / name).exists(), name
    restored = Learner.load(tmp_path / "vargp.npz")
    assert restored.num_updates == 5


def test_run_stream_scores_the_final_learner_on_every_validation_set(blobs):
    """final_avg_validation_accuracy is the final learner's mean accuracy over the per-task
    validation batches: given the test sets as validation data it equals final_avg_accuracy."""
    from ppl_cl.experiments.vargp import run_stream

    class Ctx:
        checkpoint_every_s = 600.0

        def load_checkpoint(self, key):
            return None

        def save_checkpoint(self, key, state):
            pass

        def log(self, line):
            pass

        def progress(self, it, **kw):
            return it

    tasks = [Task(t.x, t.y, task_id=i) for i, t in enumerate(blobs["train"][:2])]
    splits = [type("S", (), {"train": t, "test": v, "task_id": i})()
              for i, (t, v) in enumerate(zip(tasks, blobs["valid"][:2]))]
    out = run_stream(splits, None, 4, {**SMALL, "max_epochs": 2}, Ctx(),
                     task_valids=[s.test for s in splits])
    assert out["final_avg_validation_accuracy"] == pytest.approx(out["final_avg_accuracy"],
                                                                 abs=1e-9)
    assert run_stream(splits, None, 4, {**SMALL, "max_epochs": 1}, Ctx()
                      )["final_avg_validation_accuracy"] is None


def test_seen_validation_scores_every_task_so_far(tmp_path, monkeypatch):
    """validation="seen": the batch given to task t's early stopping is the union of the
    validation images of tasks 1..t; "task" gives task t's alone; other values are refused."""
    from ppl_cl.experiments.base import ConfigError, run_experiment

    seen = {}
    real_update = VARGP.update

    def spy(self, batch, validation=None, **kwargs):
        seen.setdefault(mode, []).append(sorted(set(np.asarray(validation.y).tolist())))
        return real_update(self, batch, validation=validation, **kwargs)

    monkeypatch.setattr(VARGP, "update", spy)
    for mode in ("task", "seen"):
        run_experiment("vargp-split-digits", quick=True, out=tmp_path / mode, show_progress=False,
                       overrides={"ablations": "[]", "max_epochs": "1", "validation": mode})
    assert seen["task"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert seen["seen"] == [list(range(2 * (t + 1))) for t in range(5)]
    with pytest.raises((ValueError, ConfigError), match="validation"):
        run_experiment("vargp-split-digits", quick=True, out=tmp_path / "bad",
                       show_progress=False, overrides={"ablations": "[]", "validation": "all"})


def test_stopped_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    """A run killed mid-stream (here: in the ablation's third task) and continued with
    ``resume=True`` gives the same accuracy matrices and training records as a run that was
    never stopped; a resume with other settings is refused; checkpoints go once done."""
    from ppl_cl.experiments.base import run_experiment
    from ppl_cl.persist import CheckpointError, load_tree, save_tree

    kw = dict(quick=True, show_progress=False,
              overrides={"ablations": "[block_diag]", "max_epochs": "3"})
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
    with pytest.raises(CheckpointError, match="max_epochs"):
        run_experiment("vargp-split-digits", out=tmp_path / "cut", resume=True,
                       **{**kw, "overrides": {**kw["overrides"], "max_epochs": "4"}})
    # checkpoints written before a config field existed (here: run_var_gp) still resume when
    # the field is at its default, and are refused when it is not
    for path in (tmp_path / "cut" / "checkpoints").iterdir():
        tree, meta = load_tree(path)
        del meta["run"]["config"]["run_var_gp"]
        save_tree(path, tree, meta)
    with pytest.raises(CheckpointError, match="run_var_gp"):
        run_experiment("vargp-split-digits", out=tmp_path / "cut", resume=True,
                       **{**kw, "overrides": {**kw["overrides"], "run_var_gp": "false"}})

    resumed = run_experiment("vargp-split-digits", out=tmp_path / "cut", resume=True, **kw)
    log = (tmp_path / "cut" / "progress.log").read_text()
    assert "var_gp: resumed after task 5/5" in log
    assert "block_diag: resumed after task 2/5" in log and "block_diag: task 5/5" in log
    assert not (tmp_path / "cut" / "checkpoints").exists()
    for variant in ("var_gp", "block_diag"):
        a, b = whole["variants"][variant], resumed["variants"][variant]
        np.testing.assert_array_equal(a["accuracy_matrix"], b["accuracy_matrix"])
        np.testing.assert_array_equal(a["entropy_matrix"], b["entropy_matrix"])
        assert _untimed(a["records"]) == _untimed(b["records"])
    assert resumed["summary"]["final_avg_accuracy"] == whole["summary"]["final_avg_accuracy"]


def test_a_run_stopped_mid_task_resumes_from_its_snapshot(tmp_path, monkeypatch):
    """Snapshots within a task (``checkpoint_every_s``; 0 = every epoch). A run is killed
    right after task 2's checkpoint, when it still holds task 2's last snapshot: resuming
    must start task 3 afresh. Killed again in task 3 after epoch 2, it continues from there;
    the result equals a run that was never stopped (which took no snapshots). The progress
    reader (benchmarks/vargp_stream_progress.py) reports the task in progress only when there
    is one."""
    from ppl_cl.experiments.base import RunContext, run_experiment
    from ppl_cl.experiments.vargp import stream_checkpoints

    progress = _benchmark("vargp_stream_progress")

    kw = dict(quick=True, show_progress=False, overrides={"ablations": "[]", "max_epochs": "4"})
    whole = run_experiment("vargp-split-digits", out=tmp_path / "whole", **kw)

    real_save = RunContext.save_checkpoint
    saved = []

    def dying_save(self, key, tree):
        real_save(self, key, tree)
        saved.append((key, tree.get("task"), tree.get("fit", {}).get("epoch")))
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
    # readers of a stopped run (benchmarks/vargp_stream_progress.py, vargp_ar_coupling.py)
    # tell the row checkpoints from the within-task snapshots ...
    assert {k: p.name for k, p in stream_checkpoints(cut).items()} == {"var_gp": "var_gp.npz"}
    assert {k: p.name for k, p in stream_checkpoints(cut, partial=True).items()} == {
        "var_gp": "var_gp-partial.npz"}
    # ... and a finished task's leftover snapshot is not a task in progress
    rows = progress.rows_of_run(cut)
    assert rows["var_gp"]["tasks_done"] == 2 and "in_progress" not in rows["var_gp"]

    saved.clear()
    stop = ("var_gp-partial", 3, 2), 1
    with pytest.raises(KeyboardInterrupt):
        run_experiment("vargp-split-digits", out=cut, resume=True, checkpoint_every_s=0, **kw)
    assert saved == [("var_gp-partial", 3, 1), ("var_gp-partial", 3, 2)]  # task 3 afresh
    rows = progress.rows_of_run(cut)
    assert rows["var_gp"]["tasks_done"] == 2
    assert {k: rows["var_gp"]["in_progress"][k] for k in ("task", "epoch")} == {
        "task": 3, "epoch": 2}
    monkeypatch.setattr(RunContext, "save_checkpoint", real_save)

    resumed = run_experiment("vargp-split-digits", out=cut, resume=True,
                             checkpoint_every_s=0, **kw)
    assert stream_checkpoints(cut) == {} == stream_checkpoints(cut, partial=True)
    log = (cut / "progress.log").read_text()
    assert log.count("var_gp: resumed after task 2/5") == 2
    assert log.count("resumes after epoch") == 1
    assert "var_gp: task 3/5 resumes after epoch 2" in log
    # each saved snapshot gets a line in the log (epochs 1-3 of every task; in task 3, epoch 2's
    # save was the one killed before its line, and the resumed fit saved epoch 3)
    snaps = re.findall(r"var_gp: task (\d)/5: epoch (\d+), snapshot saved, validation "
                       r"(\d\.\d{4}) \(best (\d\.\d{4}) at epoch (\d+)\), [\d.]+ s", log)
    assert [(int(t), int(e)) for t, e, *_ in snaps] == [
        (1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3), (3, 1), (3, 3), (4, 1), (4, 2), (4, 3),
        (5, 1), (5, 2), (5, 3)]
    assert all(float(v) <= float(b) and 1 <= int(be) <= int(e)
               for _, e, v, b, be in snaps)
    # the task-by-task report tells two runs of one row and seed apart by their --set values
    # and orders no rows for that seed (two runs of one row have no order of row names)
    (tmp_path / "notes.md").write_text("Two runs of one row, one of them resumed.\n")
    report = progress.main([str(tmp_path / "whole"), str(cut), "--out", str(tmp_path / "rep"),
                            "--notes", str(tmp_path / "notes.md")])
    md = (tmp_path / "rep.md").read_text()
    assert md.count("| VAR-GP | 0 | `max_epochs=4` | 5/5 |") == 2
    assert report["order_by_seed"] == {}
    # the notes end the markdown and are the JSON's notes string
    assert md.endswith("\n## Notes\n\nTwo runs of one row, one of them resumed.\n")
    assert json.loads((tmp_path / "rep.json").read_text())["notes"] == (
        "Two runs of one row, one of them resumed.")
    assert not (cut / "checkpoints").exists()
    a, b = whole["variants"]["var_gp"], resumed["variants"]["var_gp"]
    # the JSON keeps the averages and forgetting unrounded (the table rounds them once)
    rep_rows = [r["rows"]["var_gp"] for r in report["runs"].values()]
    for row in rep_rows:
        assert row["average_accuracy"][-1] == pytest.approx(a["final_avg_accuracy"], rel=1e-12)
        assert row["forgetting"][-1] == pytest.approx(a["forgetting"], rel=1e-12)
    assert md.count(f"| {a['final_avg_accuracy']:.2f} | {a['forgetting']:.2f} | — |") == 2
    np.testing.assert_array_equal(a["accuracy_matrix"], b["accuracy_matrix"])
    np.testing.assert_array_equal(a["entropy_matrix"], b["entropy_matrix"])
    assert _untimed(a["records"]) == _untimed(b["records"])


def test_current_partial_skips_a_finished_tasks_snapshot():
    from ppl_cl.experiments.vargp import current_partial

    snap = {"task": 3, "fit": {"epoch": 2}}
    assert current_partial(snap, 2) is snap  # saved within task 3, after 2 finished tasks
    assert current_partial(snap, 3) is None  # task 3 has finished since
    assert current_partial(None, 0) is None


def test_paired_comparison_of_two_runs(tmp_path, monkeypatch):
    """benchmarks/vargp_paired.py rebuilds a run's task stream from its config.json, loads the
    learner of a finished run (``vargp.npz``) or of a stopped one (its row checkpoint), and
    reproduces the run's own accuracies exactly; the paired difference of two rows is the
    difference of their final average accuracies; runs after different tasks are refused.
    The run reader behind it (``load_stream_run``) keeps every row of a stopped run and of a
    finished one (``vargp.npz``, ``vargp_<row>.npz``): two rows of one run compare exactly as
    the same rows run apart (rows share no random stream). It refuses a run whose config a
    changed default would no longer rebuild."""
    import shutil

    from ppl_cl.data.loaders import load_digits
    from ppl_cl.experiments.base import run_experiment
    from ppl_cl.experiments.vargp import load_stream_run

    paired = _benchmark("vargp_paired")

    kw = dict(quick=True, show_progress=False, seed=3)
    a = run_experiment("vargp-split-digits", out=tmp_path / "a",
                       overrides={"ablations": "[]", "max_epochs": "2"}, **kw)
    b = run_experiment("vargp-split-digits", out=tmp_path / "b",
                       overrides={"ablations": "[block_diag]", "run_var_gp": "false",
                                  "max_epochs": "2"}, **kw)
    res = res_ab = paired.compare(tmp_path / "a", tmp_path / "b")
    assert (res["a"]["row"], res["b"]["row"], res["tasks_done"]) == ("var_gp", "block_diag", 5)
    assert res["a"]["max_abs_diff_from_run_R"] == 0 == res["b"]["max_abs_diff_from_run_R"]
    avg = res["average"]
    assert 100 * avg["accuracy_a"] == pytest.approx(a["summary"]["final_avg_accuracy"])
    assert 100 * avg["accuracy_b"] == pytest.approx(
        b["summary"]["final_avg_accuracy_block_diag"])
    assert 100 * avg["difference"] == pytest.approx(
        a["summary"]["final_avg_accuracy"] - b["summary"]["final_avg_accuracy_block_diag"])
    assert avg["se"] > 0 and res["clusters"] == "test point" and len(res["per_task"]) == 5
    assert "# VAR-GP against Block Diag., paired" in paired._markdown(res)

    real_update, calls = VARGP.update, []

    def dying_update(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_update(self, *args, **kwargs)

    monkeypatch.setattr(VARGP, "update", dying_update)
    with pytest.raises(KeyboardInterrupt):
        run_experiment("vargp-split-digits", out=tmp_path / "c",
                       overrides={"ablations": "[]", "max_epochs": "2"}, **kw)
    monkeypatch.setattr(VARGP, "update", real_update)
    res = paired.compare(tmp_path / "c", tmp_path / "c")
    assert res["tasks_done"] == 2 and res["a"]["max_abs_diff_from_run_R"] == 0
    assert res["average"]["difference"] == 0 and res["average"]["se"] == 0
    # the stopped run's first two tasks are the finished run's (same seed and settings)
    assert res["average"]["accuracy_a"] == pytest.approx(
        np.mean(a["variants"]["var_gp"]["accuracy_matrix"][1, :2]))
    with pytest.raises(ValueError, match="same task"):
        paired.compare(tmp_path / "a", tmp_path / "c")

    # the one reader of run folders behind the three scripts (load_stream_run)
    fin, stopped = load_stream_run(tmp_path / "a"), load_stream_run(tmp_path / "c")
    assert fin.finished and not stopped.finished
    assert list(fin.accuracy) == list(fin.states) == ["var_gp"] == list(stopped.states)
    assert load_stream_run(tmp_path / "a", learners=False).states == {}
    np.testing.assert_array_equal(fin.accuracy["var_gp"],
                                  a["variants"]["var_gp"]["accuracy_matrix"])
    assert np.isnan(stopped.accuracy["var_gp"][2:]).all()
    assert not np.isnan(stopped.accuracy["var_gp"][:2, :2]).any()
    # the finished run's learner, rebuilt from config.json, is the saved vargp.npz learner
    rebuilt, saved_learner = fin.learner("var_gp"), VARGP.load(tmp_path / "a" / "vargp.npz")
    x = load_digits()[0][:50]
    np.testing.assert_array_equal(rebuilt.predict(x).probs, saved_learner.predict(x).probs)
    assert stopped.learner("var_gp").num_updates == 2
    with pytest.raises(ValueError, match="has not trained it"):
        load_stream_run(tmp_path / "b").learner("var_gp")
    # one run with both rows keeps both learners; compared with itself row by row it gives
    # exactly the comparison of the two separate runs
    run_experiment("vargp-split-digits", out=tmp_path / "d",
                   overrides={"ablations": "[block_diag]", "max_epochs": "2"}, **kw)
    assert (tmp_path / "d" / "vargp.npz").is_file()
    assert (tmp_path / "d" / "vargp_block_diag.npz").is_file()
    both = load_stream_run(tmp_path / "d")
    assert list(both.states) == ["var_gp", "block_diag"]
    one_run = paired.compare(tmp_path / "d", tmp_path / "d", "var_gp", "block_diag")
    assert one_run["average"] == res_ab["average"] and one_run["per_task"] == res_ab["per_task"]
    assert one_run["b"]["max_abs_diff_from_run_R"] == 0
    # a finished run written before the later rows' files existed: a clear refusal
    old = tmp_path / "d_old"
    shutil.copytree(tmp_path / "d", old)
    (old / "vargp_block_diag.npz").unlink()
    assert list(load_stream_run(old).states) == ["var_gp"]
    with pytest.raises(ValueError, match="no vargp_block_diag.npz.*first row only"):
        load_stream_run(old).learner("block_diag")
    with pytest.raises(FileNotFoundError, match="neither metrics.json nor row checkpoints"):
        load_stream_run(tmp_path / "empty")
    # runs of other seeds or test sets are refused (config.json of a copy of run b, edited)
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    for key, value, match in (("seed", 4, "seed"), ("n_test", 100, "n_test")):
        other = tmp_path / f"b_{key}"
        shutil.copytree(tmp_path / "b", other)
        edited = {**cfg, "seed": value} if key == "seed" else {
            **cfg, "config": {**cfg["config"], key: value}}
        (other / "config.json").write_text(json.dumps(edited))
        with pytest.raises(ValueError, match=match):
            paired.compare(tmp_path / "a", other)
    # a run whose recorded config the overrides no longer rebuild (a default changed since)
    changed = tmp_path / "b_default"
    shutil.copytree(tmp_path / "b", changed)
    cfg["config"]["learning_rate"] = 0.123
    (changed / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="a default changed since"):
        load_stream_run(changed).config()


def test_confusion_of_a_run(tmp_path):
    """benchmarks/vargp_confusion.py reloads a finished run's learner, reproduces the run's
    accuracy matrix, and its confusion matrix, class accuracies and error destinations agree
    with each other and with the accuracies."""
    from ppl_cl.experiments.base import run_experiment

    conf = _benchmark("vargp_confusion")
    a = run_experiment("vargp-split-digits", out=tmp_path / "a", quick=True,
                       show_progress=False, seed=3,
                       overrides={"ablations": "[]", "max_epochs": "2"})
    res = conf.confusion_of_run(tmp_path / "a")
    assert (res["row"], res["tasks_done"], res["max_abs_diff_from_run_R"]) == ("var_gp", 5, 0)
    C = np.array(res["confusion"])
    groups = res["task_classes"]
    assert sorted(c for g in groups for c in g) == list(range(10))
    for j, g in enumerate(groups):
        n = C[list(g)].sum()
        assert C[list(g), list(g)].sum() / n == pytest.approx(res["task_accuracy"][j])
        d = res["error_destination"][j]
        assert d["errors"] == n - C[list(g), list(g)].sum()
        if d["errors"]:
            assert sum(d["to_task"]) == pytest.approx(1.0)
            own = C[np.ix_(list(g), list(g))].sum() - C[list(g), list(g)].sum()
            assert d["to_task"][j] == pytest.approx(own / d["errors"])
    assert 100 * np.mean(res["task_accuracy"]) == pytest.approx(
        a["summary"]["final_avg_accuracy"])
    for c, acc in res["class_accuracy"].items():
        assert acc == pytest.approx(C[int(c), int(c)] / C[int(c)].sum())
        for other, count in res["top_confusions"][c]:
            assert other != int(c) and C[int(c), other] == count
    assert "# Where the errors of VAR-GP go, after task 5" in conf._markdown(res)


def test_ablation_rows_can_run_without_the_var_gp_row(tmp_path, monkeypatch):
    """``run_var_gp=False`` trains only the ablations (no throwaway VAR-GP stage): one learner
    per ablation, their Table 1 keys and the first ablation's suffixed forgetting/time keys."""
    from ppl_cl.experiments.base import run_experiment

    calls = []
    real_update = VARGP.update

    def counting_update(self, *args, **kwargs):
        calls.append(self.config["guide"])
        return real_update(self, *args, **kwargs)

    monkeypatch.setattr(VARGP, "update", counting_update)
    metrics = run_experiment("vargp-split-digits", quick=True, out=tmp_path / "a",
                             show_progress=False,
                             overrides={"ablations": "[global]", "run_var_gp": "false",
                                        "max_epochs": "2"})
    assert calls == ["global"] * 5
    s = metrics["summary"]
    assert "final_avg_accuracy" not in s and "final_forgetting" not in s
    assert 0 <= s["final_avg_accuracy_global"] <= 100
    assert {"final_forgetting_global", "epochs_total_global", "train_time_s_global"} <= set(s)
    assert list(metrics["variants"]) == ["global"]
    assert (tmp_path / "a" / "vargp.npz").exists()
    with pytest.raises(ValueError, match="nothing to train"):
        run_experiment("vargp-split-digits", quick=True, out=tmp_path / "b", show_progress=False,
                       overrides={"ablations": "[]", "run_var_gp": "false"})


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vargp-toy", "vargp-split-digits"])
def test_quick_experiments_run(name, tmp_path):
    from ppl_cl.experiments.base import run_experiment

    metrics = run_experiment(name, quick=True, out=tmp_path, show_progress=False)
    assert metrics["summary"]


@pytest.mark.slow
@pytest.mark.data("mnist")
@pytest.mark.parametrize("name", ["vargp-split-mnist", "vargp-permuted-mnist"])
def test_quick_mnist_experiments_run(name, tmp_path):
    from ppl_cl.experiments.base import run_experiment

    metrics = run_experiment(name, quick=True, out=tmp_path, show_progress=False)
    assert 0 <= metrics["summary"]["final_avg_accuracy"] <= 100


@pytest.mark.gpu
def test_learner_runs_on_cuda(blobs, tmp_path):
    learner = VARGP(4, **{**SMALL, "max_epochs": 3, "dtype": "float32"}, device="cuda")
    learner.update(blobs["train"][0], validation=blobs["valid"][0])
    assert learner.tasks[0].mean.device.type == "cuda"
    probs = learner.predict(blobs["xt"]).probs
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-6)
    learner.save(tmp_path / "gpu.npz")
    again = Learner.load(tmp_path / "gpu.npz")
    np.testing.assert_array_equal(again.predict(blobs["xt"]).probs, probs)


@pytest.mark.gpu
def test_learner_on_cuda_resumes_mid_task_like_the_uninterrupted_update(blobs, tmp_path):
    """A VAR-GP task on the GPU, snapshot after every epoch (``checkpoint_every_s=0``): a
    fresh learner resumed from the snapshot of epoch 2 (through the file format) ends the
    task with the same parameters and predictions as the learner that was never stopped."""
    from ppl_cl.persist import load_tree, save_tree

    cfg = {**SMALL, "max_epochs": 5, "patience": 50, "dtype": "float32", "seed": 3}
    snaps = []
    straight = VARGP(4, **cfg, device="cuda")
    straight.update(blobs["train"][0], validation=blobs["valid"][0],
                    checkpoint=snaps.append, checkpoint_every_s=0.0)
    assert [s["fit"]["epoch"] for s in snaps] == [1, 2, 3, 4]
    save_tree(tmp_path / "snap.npz", snaps[1])
    loaded, _ = load_tree(tmp_path / "snap.npz")
    resumed = VARGP(4, **cfg, device="cuda")
    resumed.update(blobs["train"][0], validation=blobs["valid"][0], resume=loaded)
    assert resumed.tasks[0].mean.device.type == "cuda"
    np.testing.assert_array_equal(resumed.predict(blobs["xt"]).probs,
                                  straight.predict(blobs["xt"]).probs)
    a, b = resumed.state_dict(), straight.state_dict()
    for state in (a, b):
        state["history"] = _untimed(state["history"])
    assert _state_equal(a, b)


@pytest.mark.gpu
def test_paired_comparison_of_runs_trained_on_cuda(tmp_path):
    """Runs trained with ``--device cuda`` read back on CUDA (``vargp_paired.py --device cuda``)
    reproduce their own accuracy matrices exactly: their predictive samples come from the CUDA
    generator, as during the run."""
    from ppl_cl.experiments.base import run_experiment

    paired = _benchmark("vargp_paired")
    kw = dict(quick=True, show_progress=False, seed=1, device="cuda")
    run_experiment("vargp-split-digits", out=tmp_path / "a",
                   overrides={"ablations": "[]", "max_epochs": "2"}, **kw)
    run_experiment("vargp-split-digits", out=tmp_path / "b",
                   overrides={"ablations": "[block_diag]", "run_var_gp": "false",
                              "max_epochs": "2"}, **kw)
    res = paired.compare(tmp_path / "a", tmp_path / "b", device="cuda")
    assert res["tasks_done"] == 5
    assert res["a"]["max_abs_diff_from_run_R"] == 0 == res["b"]["max_abs_diff_from_run_R"]
