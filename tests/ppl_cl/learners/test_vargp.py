"""The VARGP learner: the learner protocol, exact resumption after save/load and mid-task,
bad input, the ArviZ export."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ppl_cl.batch import Task
from ppl_cl.configs import from_dict, to_dict
from ppl_cl.data.synthetic import four_blobs
from ppl_cl.learners import learner_class, load_learner
from models.vargp import PointHyperparameters
from ppl_cl.learners.vargp import VARGP, VARGPConfig
from ppl_cl.predictive import CategoricalPredictive

SMALL = dict(num_classes=4, inducing_per_task=5, batch_size=40, max_epochs=12, patience=4,
             num_theta_samples=2, num_f_samples=4, num_predict_samples=4, learning_rate=3e-2,
             beta=1.0, validate_every=1, dtype="float64")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


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
    assert learner_class("vargp") is VARGP
    learner = VARGP(**SMALL)
    # the config is a frozen dataclass that round-trips through JSON (save / load rebuild it)
    assert from_dict(VARGPConfig, json.loads(json.dumps(to_dict(learner.config)))) == \
        learner.config
    assert VARGP().config == VARGPConfig()    # no argument: the validated Split MNIST setting
    prior = learner.predict(blobs["xt"])           # the prior predictive: 1/K for each class
    np.testing.assert_array_equal(prior.probs, np.full((len(blobs["xt"]), 4), 0.25))
    assert learner.tasks == [] and learner.num_updates == 0
    rec = learner.update(blobs["train"][0], validation=blobs["valid"][0])
    for key in ("task", "epochs", "steps", "best_epoch", "best_validation", "stopped_early",
                "final_loss", "wall_time_s", "seconds_per_epoch"):
        assert key in rec
    assert rec["task"] == 1 and rec["epochs"] <= SMALL["max_epochs"]
    # the kept epoch's entry of the validation curve (validated every epoch), an accuracy over
    # the 40 validation points of task 1: a whole number of them
    assert rec["best_validation"] == rec["validation"][rec["best_epoch"] - 1]
    n_valid = len(blobs["valid"][0].y)
    assert rec["best_validation"] * n_valid == pytest.approx(round(rec["best_validation"] * n_valid),
                                                             abs=1e-9)
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
    # the kernel's log variance: 2 log gamma (amplitude gamma^2, the authors' kernel)
    assert last["theta_log_variance"] == pytest.approx(2 * float(learner.hyper.loc[0, 0]))
    assert last["theta_log_lengthscale_min"] == pytest.approx(float(log_l.min()))
    assert last["theta_log_lengthscale_max"] == pytest.approx(float(log_l.max()))
    assert last["theta_scale_median"] == pytest.approx(float(learner.hyper.scale.median()))


def test_learns_the_toy_tasks(blobs):
    """A sanity check of the whole loop (not a paper number): after task {0, 1} the four-blob
    learner separates classes 0 and 1 on fresh test points."""
    learner = VARGP(**{**SMALL, "max_epochs": 100, "inducing_per_task": 8})
    learner.update(blobs["train"][0])
    m = np.isin(blobs["yt"], (0, 1))
    assert learner.predict(blobs["xt"][m]).accuracy(blobs["yt"][m]) > 0.8


def test_old_tasks_are_frozen(blobs):
    learner = VARGP(**SMALL)
    learner.update(blobs["train"][0])
    first = [t.clone() for t in learner.tasks[0]]
    learner.update(blobs["train"][1])
    assert all(torch.equal(a, b) for a, b in zip(first, learner.tasks[0]))
    assert not torch.equal(learner.tasks[1].mean, torch.zeros_like(learner.tasks[1].mean))


@pytest.mark.parametrize("options", [dict(guide="block_diagonal"), dict(guide="global"),
                                     dict(hyperparameters="point")])
def test_ablation_options_run(blobs, options):
    learner = VARGP(**{**SMALL, "max_epochs": 3}, **options)
    learner.update(blobs["train"][0])
    learner.update(blobs["train"][1])
    if options.get("guide") == "global":
        assert len(learner.tasks) == 1  # one inducing set at a time
    else:
        assert len(learner.tasks) == 2
    if options.get("hyperparameters") == "point":
        assert isinstance(learner.hyper, PointHyperparameters)
        last = learner.history[-1]
        assert last["theta_scale_median"] == 0.0
        assert last["theta_log_lengthscale_median"] == pytest.approx(
            float(learner.hyper.theta[0, 1:].median()))
    np.testing.assert_allclose(learner.predict(blobs["xt"]).probs.sum(1), 1.0, atol=1e-12)


def test_global_row_starts_each_task_from_all_previous_inducing_inputs(blobs):
    """The Global row as the authors' code builds it (uber-research/vargp
    ``var_gp/train_utils_global.py``, ``create_class_gp``): Z_t starts as all of Z_{t-1}, with
    a fresh q(u_t) (m_t ~ N(0, 0.5^2), L_t the lower triangle of ones with softplus(1) on the
    diagonal) and a fresh q_t(theta); one inducing set is kept."""
    opts = {**SMALL, "max_epochs": 2, "guide": "global"}
    learner = VARGP(**opts)
    learner.update(blobs["train"][0])
    Z1 = learner.tasks[0].inducing_inputs.clone()
    x2 = torch.as_tensor(np.asarray(blobs["train"][1].x))
    program = learner.program(x2)
    assert torch.equal(program.init.inducing_inputs, Z1)
    L = program.init.scale_tril[0]
    assert torch.allclose(torch.diagonal(L), torch.full((5,), math.log1p(math.e), dtype=L.dtype))
    assert torch.equal(L.tril(-1), torch.ones(5, 5, dtype=L.dtype).tril(-1))
    assert torch.equal(program.hyper_prior.loc, learner.hyper.loc)     # q_1 is only the prior
    assert not torch.equal(program.hyper_init.loc, learner.hyper.loc)  # q_2 starts afresh
    learner.update(blobs["train"][1])
    assert len(learner.tasks) == 1
    np.testing.assert_allclose(learner.predict(blobs["xt"]).probs.sum(1), 1.0, atol=1e-12)


def _near(z, rows, tol=1e-6) -> bool:
    rows = torch.as_tensor(np.asarray(rows if not isinstance(rows, set) else sorted(rows)),
                           dtype=z.dtype)
    return bool((rows - z).abs().max(-1).values.min() < tol)


# ---------------------------------------------------------------------------------------------
# save after task t + load + continue == uninterrupted
# ---------------------------------------------------------------------------------------------
def test_resume_after_save_load_matches_uninterrupted_run(blobs, tmp_path):
    cfg = dict(SMALL, seed=5)
    straight = VARGP(**cfg)
    for i in range(3):
        straight.update(blobs["train"][i], validation=blobs["valid"][i])
    expected = straight.predict(blobs["xt"]).probs

    resumed = VARGP(**cfg)
    for i in range(3):
        resumed.update(blobs["train"][i], validation=blobs["valid"][i])
        path = tmp_path / f"after_task{i}.npz"
        resumed.save(path)
        resumed = load_learner(path)
        assert isinstance(resumed, VARGP) and resumed.num_updates == i + 1
    got = resumed.predict(blobs["xt"]).probs
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    a, b = resumed.state_dict(), straight.state_dict()
    for state in (a, b):
        state["history"] = _untimed(state["history"])
    assert _state_equal(a, b)  # bitwise: parameters, q(theta), losses and validation curves


def test_load_state_dict_rejects_mismatched_hyperparameters(blobs):
    a = VARGP(**{**SMALL, "max_epochs": 2})
    a.update(blobs["train"][0])
    b = VARGP(**{**SMALL, "max_epochs": 2, "hyperparameters": "point"})
    with pytest.raises(ValueError, match="hyperparameters"):
        b.load_state_dict(a.state_dict())


def test_isotropic_kernel_learns_saves_and_exports(blobs, tmp_path):
    """``ard=False`` (eq. 20 as printed): theta is [log gamma, log l] per set, q_1(theta) starts
    at the same median heuristic as the ARD kernel, the learner still learns the toy tasks,
    resumes bitwise from a file, exports one lengthscale, and a state of the other width is
    refused."""
    cfg = dict(SMALL, seed=3, ard=False, max_epochs=40, inducing_per_task=8)
    learner = VARGP(**cfg)
    learner.update(blobs["train"][0])
    m = np.isin(blobs["yt"], (0, 1))
    assert learner.predict(blobs["xt"][m]).accuracy(blobs["yt"][m]) > 0.8  # as the ARD test
    ard = VARGP(**{**cfg, "ard": True, "max_epochs": 1})
    ard.update(blobs["train"][0])
    assert learner.hyper.mean.shape == (1, 2) and ard.hyper.mean.shape == (1, 3)
    assert learner.history[0]["theta_log_lengthscale_min"] == pytest.approx(
        learner.history[0]["theta_log_lengthscale_max"])
    path = tmp_path / "iso.npz"
    learner.save(path)
    loaded = load_learner(path)
    assert loaded.config.ard is False
    for lrn in (learner, loaded):
        lrn.update(blobs["train"][1], validation=blobs["valid"][1])
    np.testing.assert_array_equal(loaded.predict(blobs["xt"]).probs,
                                  learner.predict(blobs["xt"]).probs)
    idata = learner.to_inference_data(num_draws=20)
    assert idata.posterior["log_lengthscale"].dims == ("chain", "draw", "hyper_set")
    with pytest.raises(ValueError, match="ard"):
        ard.load_state_dict(learner.state_dict())


def test_a_task_keeps_its_last_epoch_under_the_authors_protocol(blobs):
    """stopping="code" (uber-research/vargp ``var_gp/train_utils.py``, ``EarlyStopper``, whose
    stored tensors alias the live ones): validation every ``validate_every`` epochs decides when
    to stop, and the task ends with the LAST epoch's parameters: the same state as a run of
    that many epochs without validation data."""
    cfg = {**SMALL, "max_epochs": 12, "validate_every": 2, "patience": 2, "tolerance": 0.5}
    stopped = VARGP(**cfg)
    rec = stopped.update(blobs["train"][0], validation=blobs["valid"][0])
    # no check beats the first by 0.5: stop after 2 more checks (epochs 2, 4, 6)
    assert rec["epochs"] == rec["best_epoch"] == 6 and rec["stopped_early"]
    assert len(rec["validation"]) == 3 and rec["best_validation"] == rec["validation"][-1]
    blind = VARGP(**{**cfg, "max_epochs": 6})
    blind.update(blobs["train"][0])

    def trained(learner):  # the state without the task records (validation numbers differ)
        return {k: v for k, v in learner.state_dict().items() if k != "history"}

    assert _state_equal(trained(stopped), trained(blind))
    # Algorithm 1's plateau rule, as printed, keeps the last epoch too
    plateau = VARGP(**{**cfg, "stopping": "algorithm1", "patience": 3, "tolerance": 1.0})
    rec = plateau.update(blobs["train"][0], validation=blobs["valid"][0])
    assert rec["epochs"] == 4 and rec["best_epoch"] == 4 and len(rec["validation"]) == 4


# ---------------------------------------------------------------------------------------------
# bad input: clear errors, state unchanged
# ---------------------------------------------------------------------------------------------
def test_bad_input_raises_before_any_state_change(blobs):
    learner = VARGP(**{**SMALL, "max_epochs": 2})
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
    with pytest.raises(TypeError, match="Batch"):          # a tuple is no Batch either
        learner.update((x, y))


def test_diverging_training_leaves_state_unchanged(blobs, monkeypatch):
    from inference import svi

    learner = VARGP(**{**SMALL, "max_epochs": 2})
    learner.update(blobs["train"][0])
    before = learner.state_dict()

    def boom(self, *args, **kwargs):
        raise svi.NonFiniteLossError("SVI loss became nan at optimizer step 1")

    monkeypatch.setattr(svi.SVI, "step", boom)
    with pytest.raises(svi.NonFiniteLossError, match="step 1"):
        learner.update(blobs["train"][1])
    assert _state_equal(learner.state_dict(), before)

    fresh = VARGP(**SMALL)
    with pytest.raises(svi.NonFiniteLossError):
        fresh.update(blobs["train"][0])
    assert fresh.input_dim is None and fresh.tasks == [] and fresh.num_updates == 0


def test_bad_config_raises():
    for kw, msg in ((dict(num_classes=1), "num_classes"), (dict(guide="x"), "guide"),
                    (dict(hyperparameters="mle"), "hyperparameters"),
                    (dict(dtype="float16"), "dtype"), (dict(inducing_per_task=0), "inducing"),
                    (dict(stopping="x"), "stopping"), (dict(amplitude="x"), "amplitude"),
                    (dict(batch_size=0), "batch_size"), (dict(beta=0.0), "beta"),
                    (dict(device="tpu"), "device")):
        args = {"num_classes": 3, **kw}
        with pytest.raises(ValueError, match=msg):
            VARGP(**args)
    with pytest.raises(TypeError, match="unknown setting"):
        VARGP(optimizer="sgd")


# ---------------------------------------------------------------------------------------------
# ArviZ
# ---------------------------------------------------------------------------------------------
def test_to_inference_data_has_theta_and_inducing_values(blobs, tmp_path):
    import arviz as az

    learner = VARGP(**{**SMALL, "max_epochs": 3})
    learner.update(blobs["train"][0])
    learner.update(blobs["train"][1])
    with pytest.raises(ValueError, match="labels"):
        learner.to_inference_data(num_draws=5, x=blobs["xt"], y=np.full(len(blobs["yt"]), 9))
    idata = learner.to_inference_data(num_draws=50, x=blobs["xt"], y=blobs["yt"],
                                      max_elements=2000)                  # forces chunking
    post = idata.posterior
    assert idata.attrs["sampling"] == "independent draws"      # 50 draws in 2 chains of 25
    assert post["log_variance"].shape == (2, 25, 1)
    assert post["log_lengthscale"].shape == (2, 25, 1, 2)
    assert post["u_task1"].shape == (2, 25, 4, 5) and post["u_task2"].shape == (2, 25, 4, 5)
    assert post["u_task1"].dims == ("chain", "draw", "class", "inducing_1")
    assert idata.constant_data["inducing_inputs_task2"].shape == (4, 5, 2)
    assert idata.log_likelihood["y"].shape == (2, 25, len(blobs["yt"]))
    assert np.isfinite(idata.log_likelihood["y"].values).all()
    # draws of theta follow q(theta): means within 5 standard errors
    q = learner.hyper
    draws = post["log_lengthscale"].values.reshape(50, 1, 2)[:, 0]
    se = q.scale[0, 1:].numpy() / np.sqrt(50)
    assert (np.abs(draws.mean(0) - q.loc[0, 1:].numpy()) < 5 * se).all()
    summary = az.summary(idata, var_names=["log_variance"], kind="stats")
    assert summary.shape[0] == 1
    idata.to_netcdf(str(tmp_path / "posterior.nc"))


def test_inducing_draws_match_the_closed_form_joint(blobs):
    """u draws of to_inference_data (whitened form) vs mean/covariance of eq. 22 at fixed theta
    (point hyperparameters), within Monte Carlo error."""
    from models.vargp_math import autoregressive_joint

    learner = VARGP(**{**SMALL, "max_epochs": 3, "hyperparameters": "point"})
    learner.update(blobs["train"][0])
    learner.update(blobs["train"][1])
    n = 4000
    idata = learner.to_inference_data(num_draws=n, seed=3)
    u = np.concatenate([idata.posterior["u_task1"].values.reshape(n, 4, -1),
                        idata.posterior["u_task2"].values.reshape(n, 4, -1)], axis=-1)  # (n, K, M)
    from models.vargp_math import kernel_theta

    theta = kernel_theta(learner.hyper.draws(1))
    mu, Sigma = autoregressive_joint(theta, learner.tasks, learner.jitter)
    mu, Sigma = mu[0, 0].numpy(), Sigma[0, 0].numpy()
    se = u.std(0) / np.sqrt(n)
    assert (np.abs(u.mean(0) - mu) <= 5 * se + 1e-9).all()
    c = u - u.mean(0)
    prods = c[..., :, None] * c[..., None, :]
    se_cov = prods.std(0) / np.sqrt(n)
    assert (np.abs(prods.mean(0) - Sigma) <= 5 * se_cov + 1e-9).all()




def test_a_task_resumed_mid_way_ends_like_the_uninterrupted_update(blobs, tmp_path):
    """Snapshots of the run loop within a task (``snapshot_every_s=0``: every epoch): a fresh
    learner resumed from the snapshot of epoch 2 (through the file format) ends the task with
    the same parameters, records and predictions as the learner that was never stopped."""
    from ppl_cl.persist import load_tree, save_tree

    cfg = {**SMALL, "max_epochs": 5, "patience": 50, "seed": 3}
    snaps = []
    straight = VARGP(**cfg)
    straight.update(blobs["train"][0], validation=blobs["valid"][0], snapshot=snaps.append,
                    snapshot_every_s=0.0)
    assert [s["loop"]["epoch"] for s in snaps] == [1, 2, 3, 4]
    save_tree(tmp_path / "snap.npz", snaps[1])
    loaded, _ = load_tree(tmp_path / "snap.npz")
    resumed = VARGP(**cfg)
    resumed.update(blobs["train"][0], validation=blobs["valid"][0], resume=loaded)
    np.testing.assert_array_equal(resumed.predict(blobs["xt"]).probs,
                                  straight.predict(blobs["xt"]).probs)
    a, b = resumed.state_dict(), straight.state_dict()
    for state in (a, b):
        state["history"] = _untimed(state["history"])
    assert _state_equal(a, b)
    with pytest.raises(ValueError, match="task 1"):
        resumed.update(blobs["train"][1], resume=loaded)   # a snapshot of another task


@pytest.mark.gpu
def test_learner_runs_on_cuda(blobs, tmp_path):
    learner = VARGP(**{**SMALL, "max_epochs": 3, "dtype": "float32", "device": "cuda"})
    learner.update(blobs["train"][0], validation=blobs["valid"][0])
    assert learner.tasks[0].mean.device.type == "cuda"
    probs = learner.predict(blobs["xt"]).probs
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-6)
    learner.save(tmp_path / "gpu.npz")
    again = load_learner(tmp_path / "gpu.npz")
    np.testing.assert_array_equal(again.predict(blobs["xt"]).probs, probs)


@pytest.mark.gpu
def test_learner_on_cuda_resumes_mid_task_like_the_uninterrupted_update(blobs, tmp_path):
    from ppl_cl.persist import load_tree, save_tree

    cfg = {**SMALL, "max_epochs": 5, "patience": 50, "dtype": "float32", "seed": 3,
           "device": "cuda"}
    snaps = []
    straight = VARGP(**cfg)
    straight.update(blobs["train"][0], validation=blobs["valid"][0], snapshot=snaps.append,
                    snapshot_every_s=0.0)
    save_tree(tmp_path / "snap.npz", snaps[1])
    loaded, _ = load_tree(tmp_path / "snap.npz")
    resumed = VARGP(**cfg)
    resumed.update(blobs["train"][0], validation=blobs["valid"][0], resume=loaded)
    assert resumed.tasks[0].mean.device.type == "cuda"
    np.testing.assert_array_equal(resumed.predict(blobs["xt"]).probs,
                                  straight.predict(blobs["xt"]).probs)


def test_a_cuda_device_is_checked_at_construction():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="CUDA"):
        VARGP(device="cuda")
