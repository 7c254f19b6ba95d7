"""GP-ELLA learner and baselines on the protocol: update / predict, exact resume, ArviZ
export, bad input with unchanged state, the individual-GP baseline against ExactGP."""

import math

import numpy as np
import pytest

from ppl_cl import Batch
from ppl_cl.configs.gp_ella import GPELLAConfig
from ppl_cl.learners.gp_ella import GPELLA, NotFittedError
from ppl_cl.learners.gp_ella_baselines import IndividualGPs, LinearELLA, MultiTaskGP, SharedGP

D = 3


def _tasks(n_tasks=4, n=20, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for t in range(n_tasks):
        x = rng.normal(size=(n, D))
        w = rng.normal(size=D)
        out.append((x, np.sin(x @ w) + 0.1 * rng.normal(size=n) + t))
    return out


def _small(**kw):
    return GPELLA(GPELLAConfig(num_components=2, max_iterations=20, **kw))


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}/{k}"))
        return out
    if isinstance(tree, (list, tuple)):
        out = {}
        for i, v in enumerate(tree):
            out.update(_flat(v, f"{prefix}/{i}"))
        return out
    return {prefix: np.asarray(tree)}


def _assert_same_state(a, b):
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


def test_update_predict_and_exact_resume(tmp_path):
    tasks = _tasks(5)
    a = _small()
    with pytest.raises(NotFittedError):
        a.predict(tasks[0][0], 0)
    for t in range(3):
        rec = a.update(Batch(*tasks[t], task_id=t))
        assert rec["new_task"] and rec["num_data"] == 20 and math.isfinite(rec["ella_loss"])
    a.save(tmp_path / "ckpt.npz")
    b = GPELLA.load(tmp_path / "ckpt.npz")
    assert isinstance(b, GPELLA) and b.config == a.config
    for learner in (a, b):
        for t in (3, 4):
            learner.update(Batch(*tasks[t], task_id=t))
        learner.update(Batch(tasks[1][0][:5], tasks[1][1][:5], task_id=1))  # known task
    _assert_same_state(a.state_dict(), b.state_dict())
    for t in range(5):
        pa, pb = a.predict(tasks[t][0], t), b.predict(tasks[t][0], t)
        np.testing.assert_array_equal(pa.mean, pb.mean)
        np.testing.assert_array_equal(pa.variance, pb.variance)
        assert pa.mean.shape == (20,) and np.all(pa.variance > 0)
    assert a.num_tasks == 5 and a.state.num_tasks == 5
    assert len(a.predict(np.zeros((0, D)), 2)) == 0


def test_known_task_update_keeps_the_task_count_and_appends_data():
    tasks = _tasks(2)
    g = _small()
    g.update(Batch(*tasks[0], task_id=7))
    g.update(Batch(*tasks[1], task_id=3))
    rec = g.update(Batch(tasks[0][0][:4], tasks[0][1][:4], task_id=7))
    assert not rec["new_task"] and rec["num_data"] == 24
    assert g.state.num_tasks == 2 and g.task_ids == [7, 3]


def test_bad_input_raises_and_leaves_the_state_unchanged():
    tasks = _tasks(2)
    g = _small()
    g.update(Batch(*tasks[0], task_id=0))
    before = g.state_dict()
    x, y = tasks[1]
    bad_y = y.copy()
    bad_y[3] = np.nan
    cases = [(Batch(x, y), ValueError, "task_id"),
             (Batch(x, bad_y, task_id=1), ValueError, "finite"),
             (Batch(x[:, :2], y, task_id=1), ValueError, "feature dimension"),
             (Batch(np.zeros((0, D)), np.zeros(0), task_id=1), ValueError, "empty")]
    for batch, err, text in cases:
        with pytest.raises(err, match=text):
            g.update(batch)
    with pytest.raises(TypeError, match="batch"):
        g.update((x, y))
    with pytest.raises(ValueError, match="unknown task"):
        g.predict(x, 99)
    with pytest.raises(ValueError, match="task_id"):
        g.predict(x)
    with pytest.raises(ValueError, match="x: expected shape"):
        g.predict(x[:, :2], 0)
    _assert_same_state(before, g.state_dict())


def test_constant_targets_and_tiny_tasks_are_handled():
    tasks = _tasks(2)
    g = _small()
    g.update(Batch(*tasks[0], task_id=0))
    A_before = g.state.A.copy()
    rec = g.update(Batch(tasks[1][0], np.full(20, 4.0), task_id=1))
    assert rec["constant_targets"]
    np.testing.assert_array_equal(g.codes[1], 0.0)
    np.testing.assert_array_equal(g.state.A, A_before)  # a zero code adds nothing
    np.testing.assert_allclose(g.predict(tasks[0][0][:5], 1).mean, 4.0, atol=1e-9)
    rec = g.update(Batch(tasks[0][0][:3], tasks[0][1][:3], task_id=2))  # 3 points: no held-out
    assert not rec["line_search_possible"]
    assert np.all(np.isfinite(g.predict(tasks[0][0][:5], 2).mean))


def test_to_inference_data_draws_the_basis_around_its_mean():
    tasks = _tasks(3)
    g = _small()
    for t in range(3):
        g.update(Batch(*tasks[t], task_id=t))
    idata = g.to_inference_data(num_draws=400, seed=1)
    assert idata.posterior["L"].shape == (4, 100, D, 2)          # independent draws, 4 chains
    assert idata.attrs["sampling"] == "independent draws"
    L_draws = np.asarray(idata.posterior["L"]).reshape(1, 400, D, 2)
    theta = np.asarray(idata.posterior["theta"]).reshape(1, 400, 3, D)
    np.testing.assert_allclose(theta[0, 0], g.codes @ L_draws[0, 0].T, rtol=1e-12)
    # mean of the draws within 5 Monte Carlo standard errors of L
    se = L_draws[0].std(axis=0) / math.sqrt(400)
    assert np.all(np.abs(L_draws[0].mean(axis=0) - g.basis) <= 5 * se + 1e-12)
    assert np.asarray(idata.constant_data["hessian"]).shape == (3, D, D)


def test_individual_gps_predict_like_exact_gp_with_the_same_hyperparameters():
    from ppl_cl.learners.exact_gp import ExactGP

    x, y = _tasks(1)[0]
    ind = IndividualGPs(max_iterations=20)
    ind.update(Batch(x, y, task_id=0))
    h = ind.hyperparameters(0)
    gp = ExactGP(kernel="se-ard")
    gp.load_state_dict({"X": x, "y": y - y.mean(), "hyperparameters": {
        "variance": np.asarray(h["signal_variance"]), "lengthscale": h["theta"] ** -0.5,
        "noise_variance": np.asarray(h["noise_variance"])}})
    xs = np.random.default_rng(3).normal(size=(6, D))
    a, b = ind.predict(xs, 0), gp.predict(xs)
    np.testing.assert_allclose(a.mean, b.mean + y.mean(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(a.variance, b.variance, rtol=1e-8)


@pytest.mark.parametrize("cls,kw", [(SharedGP, {"max_train": 50}),
                                    (MultiTaskGP, {"rank": 2, "max_train": 50}),
                                    (LinearELLA, {"num_components": 2}),
                                    (IndividualGPs, {})])
def test_baselines_follow_the_protocol(cls, kw, tmp_path):
    tasks = _tasks(3, n=15)
    learner = cls(max_iterations=10, **kw) if cls is not LinearELLA else cls(**kw)
    with pytest.raises(NotFittedError):
        learner.predict(tasks[0][0], 0)
    for t in range(3):
        learner.update(Batch(*tasks[t], task_id=t))
    p = learner.predict(tasks[2][0], 2)
    assert p.mean.shape == (15,) and np.all(p.variance > 0) and np.all(np.isfinite(p.mean))
    learner.save(tmp_path / "b.npz")
    again = cls.load(tmp_path / "b.npz")
    np.testing.assert_allclose(again.predict(tasks[2][0], 2).mean, p.mean, rtol=1e-10)
    with pytest.raises(ValueError, match="unknown task"):
        learner.predict(tasks[0][0], 5)
    assert learner.to_inference_data() is not None


def test_linear_ella_recovers_linear_tasks():
    """Linear factorized tasks (the synthetic set's model): ELLA with the right k beats a
    constant predictor by far."""
    from ppl_cl.data.synthetic import ella_linear_tasks

    data = ella_linear_tasks(n_tasks=15, n_per_task=40, dim=5, n_latent=2, noise_std=0.1,
                             bias_feature=False, seed=0)
    e = LinearELLA(num_components=2, mu=math.exp(-12), lam=math.exp(-12))
    for t, (x, y) in enumerate(data.tasks):
        e.update(Batch(x, y, task_id=t))
    err = np.mean([np.mean((e.predict(x, t).mean - y) ** 2) for t, (x, y) in enumerate(data.tasks)])
    var = np.mean([np.var(y) for _, y in data.tasks])
    assert err < 0.05 * var


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="num_components"):
        GPELLAConfig(num_components=0)
    with pytest.raises(ValueError, match="holdout_fraction"):
        GPELLAConfig(holdout_fraction=1.5)
    with pytest.raises(ValueError, match="hessian"):
        GPELLAConfig(hessian="numeric")
    with pytest.raises(TypeError, match="config"):
        GPELLA(config=object())
    g = GPELLA(GPELLAConfig(mu=0.5), lam=0.25)
    assert g.config.mu == 0.5 and g.config.lam == 0.25
