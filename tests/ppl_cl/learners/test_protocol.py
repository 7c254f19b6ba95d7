"""Every learner of ppl_cl.learners.LEARNERS behaves the same at the edges of the protocol
(the docstring of ppl_cl.learner): ``update`` takes a Batch only, ``predict`` before any update
is the prior predictive (NotFittedError only where the outputs need data), an empty predict
gives an empty predictive, a refused batch leaves the state unchanged, and save / load between
batches resumes exactly. A learner added to LEARNERS without a case here fails the first
test."""

from __future__ import annotations

import numpy as np
import pytest

from ppl_cl import Batch
from ppl_cl.errors import NotFittedError
from ppl_cl.learners import LEARNERS, learner_class, load_learner
from ppl_cl.predictive import CategoricalPredictive, GaussianPredictive

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RNG = np.random.default_rng(0)
XC = RNG.normal(size=(24, 3))
YC = (XC[:, 0] > 0).astype(np.int64) + 2 * (XC[:, 1] > 0).astype(np.int64)   # 4 classes
XR = RNG.normal(size=(24, 3))
YR = np.sin(XR[:, 0]) + 0.1 * RNG.normal(size=24)

#: learner_name -> (kwargs of a tiny learner, "classification" | "sessions" (class-incremental:
#: each batch brings new classes) | "regression"); a learner
#: without a prior predictive is listed in NO_PRIOR
CASES = {
    "exact-gp": (dict(kernel="se", max_iterations=20), "regression"),
    "vargp": (dict(num_classes=4, inducing_per_task=4, batch_size=12, max_epochs=2,
                   num_theta_samples=1, num_f_samples=2, num_predict_samples=2, beta=1.0,
                   dtype="float64"), "classification"),
    "kalman-classifier": (dict(num_classes=4), "classification"),
    "kalman-regressor": (dict(), "regression"),
    "online-sgd-classifier": (dict(num_classes=4), "classification"),
    "gp-tree": (dict(num_chains=4, num_steps=3, kmeans_n_init=2), "sessions"),
    "sbm-gp": (dict(num_chains=4, num_steps=3), "sessions"),
    "lsm-gibbs": (dict(num_chains=4, num_steps=3), "sessions"),
    "ove-gibbs": (dict(num_chains=4, num_steps=3), "sessions"),
    "online-sgpr": (dict(), "regression"),
    "gp-ella": (dict(), "regression"),
    "gp-ella-individual-gps": (dict(), "regression"),
    "gp-ella-shared-gp": (dict(), "regression"),
    "gp-ella-mtgp": (dict(), "regression"),
    "gp-ella-linear-ella": (dict(), "regression"),
}


#: the classes of these learners come with the data (a tree, or one GP per class seen), and a
#: GP-ELLA task's predictive needs that task's fit (its theta_t = L s_t)
NO_PRIOR = {"gp-tree", "sbm-gp", "lsm-gibbs", "ove-gibbs", "gp-ella", "gp-ella-individual-gps",
            "gp-ella-shared-gp", "gp-ella-mtgp", "gp-ella-linear-ella"}


def _batches(kind):
    if kind == "sessions":
        old, new = YC < 2, YC >= 2
        return Batch(XC[old], YC[old], 0), Batch(XC[new], YC[new], 1)
    x, y = (XC, YC) if kind == "classification" else (XR, YR)
    return Batch(x[:12], y[:12], 0), Batch(x[12:], y[12:], 0)


def _state_equal(a, b) -> bool:
    import torch

    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(
            _state_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            _state_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if hasattr(a, "shape"):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    return a == b or (isinstance(a, float) and np.isnan(a) and np.isnan(b))


def _untimed(state):
    if isinstance(state, dict):
        return {k: _untimed(v) for k, v in state.items()
                if not (k in ("wall_time_s", "seconds_per_epoch") or k.endswith("_seconds"))}
    if isinstance(state, list):
        return [_untimed(v) for v in state]
    return state


def test_every_learner_has_a_case():
    assert set(CASES) == set(LEARNERS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_edges_of_the_protocol(name, tmp_path):
    kwargs, kind = CASES[name]
    cls = learner_class(name)
    learner = cls(**kwargs)
    first, second = _batches(kind)
    expected = GaussianPredictive if kind == "regression" else CategoricalPredictive
    if name in NO_PRIOR:
        with pytest.raises(NotFittedError):
            learner.predict(first.x, task_id=first.task_id)
    else:
        prior = learner.predict(first.x, task_id=first.task_id)              # the prior predictive
        assert isinstance(prior, expected) and len(prior) == len(first)
        assert np.isfinite(prior.log_prob(first.y)).all()
        # predicting did not train: the first update gives what a fresh learner's gives
        twin = cls(**kwargs)
        learner.update(first)
        twin.update(first)
        assert _state_equal(_untimed(learner.state_dict()), _untimed(twin.state_dict()))
        learner = cls(**kwargs)
    with pytest.raises(TypeError, match="Batch"):
        learner.update((first.x, first.y))                 # a tuple is no Batch
    learner.update(first)
    probe = first if kind == "sessions" else second      # classes the learner has seen
    pred = learner.predict(probe.x, task_id=probe.task_id)
    assert isinstance(pred, expected) and len(pred) == len(probe)
    assert np.isfinite(pred.log_prob(probe.y)).all()
    empty = learner.predict(second.x[:0], task_id=second.task_id)
    assert isinstance(empty, expected) and len(empty) == 0
    # a refused batch leaves the state as it was
    before = learner.state_dict()
    bad = np.array(second.x, dtype=float)
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite|NaN"):
        learner.update(Batch(bad, second.y, 0))
    with pytest.raises(ValueError):
        learner.update(Batch(second.x[:, :2], second.y, 0))   # another input dimension
    assert _state_equal(learner.state_dict(), before)
    # save between batches, load, continue == uninterrupted
    learner.save(tmp_path / "l.npz")
    loaded = load_learner(tmp_path / "l.npz")
    assert type(loaded) is cls and loaded.config == learner.config
    learner.update(second)
    loaded.update(second)
    assert _state_equal(_untimed(loaded.state_dict()), _untimed(learner.state_dict()))
    np.testing.assert_array_equal(np.asarray(getattr(loaded.predict(first.x, task_id=first.task_id), "probs", None)
                                             if kind != "regression"
                                             else loaded.predict(first.x, task_id=first.task_id).mean),
                                  np.asarray(getattr(learner.predict(first.x, task_id=first.task_id), "probs", None)
                                             if kind != "regression"
                                             else learner.predict(first.x, task_id=first.task_id).mean))
