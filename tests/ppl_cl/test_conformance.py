"""The same protocol conformance test for every learner of ``ppl_cl.learners.LEARNERS`` (the
protocol of ``ppl_cl.learner``), on a tiny synthetic stream of the learner's kind:

* two ``update`` calls on consecutive batches, each returning a dict;
* ``predict`` gives a finite ``CategoricalPredictive`` / ``GaussianPredictive`` of the probe's
  length, whose ``log_prob`` of the probe's targets is finite with shape ``(n,)`` (class
  probabilities summing to 1); ``x`` with no rows gives an empty predictive;
* a refused batch (NaN in ``x``) raises ``ValueError`` and leaves the predictive unchanged;
* ``save`` then ``type(learner).load`` and ``ppl_cl.learners.load_learner`` give learners that
  predict what the original predicts and, after the same third batch, still predict what the
  uninterrupted original predicts (exact resume);
* ``to_inference_data`` returns ``arviz.InferenceData`` with a ``posterior`` group, a
  ``sampling`` attribute, and (unless it is a point estimate) draws that ``az.summary``
  diagnoses without a shape warning.

A learner added to ``LEARNERS`` without a case in :data:`CASES` fails
:func:`test_every_learner_has_a_conformance_case`. Synthetic NumPy data only; settings tiny
(few iterations / epochs / chains, small networks): all learners together take about 70 s of
CPU on one thread, most of it XLA compilation in the JAX learners.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from ppl_cl import Batch
from ppl_cl.configs.kalman import NetworkConfig
from ppl_cl.learners import LEARNERS, learner_class, load_learner
from ppl_cl.predictive import CategoricalPredictive, GaussianPredictive

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: predictions of a loaded learner equal the original's to this relative tolerance (they are
#: in fact bit-identical): every Monte Carlo predictive is seeded from the config and the state
#: (VAR-GP: ``_seed(4)`` of ``config.seed``; LSM / OVE: ``config.seed + 104729``; the Kalman
#: classifier: ``fold_in(PRNGKey(seed), chunk_index)``), the others are closed forms or
#: quadrature, and a checkpoint restores the state bit for bit
RTOL = 1e-12


@dataclasses.dataclass(frozen=True)
class Case:
    """How to run one learner: the overrides of a tiny instance, the kind of its stream (a key
    of :data:`STREAMS`), the keyword arguments of its ``to_inference_data`` and whether to pass
    it the probe's ``x`` and ``y`` too (then a ``log_likelihood`` group is expected)."""

    settings: dict[str, Any]
    kind: str
    idata: dict[str, Any] = dataclasses.field(default_factory=dict)
    probe_idata: bool = False


#: the small representation of tests/ppl_cl/learners/test_kalman.py and test_online_sgd.py
_TINY_NET = NetworkConfig("mlp", 8, (8,))

#: learner_name -> its conformance case. The settings are the tiny ones of the learners' own
#: tests (tests/ppl_cl/learners/test_*.py, test_protocol.py) where they have them. Stream kinds:
#: GP-Tree and SBM-GP refuse classes of an earlier session (class-incremental, new classes
#: only); LSM / OVE accept new classes as well as old ones (they refit on all data seen) and
#: get the same sessions; the GP-ELLA family predicts per task and needs ``task_id``. What the
#: JAX learners cost here is mostly XLA compilation, one per array shape, so the settings keep
#: the number of shapes small rather than the data
CASES: dict[str, Case] = {
    "exact-gp": Case(dict(kernel="se", max_iterations=20), "regression", dict(num_draws=8),
                     probe_idata=True),
    "vargp": Case(dict(num_classes=4, inducing_per_task=4, batch_size=12, max_epochs=2,
                       num_theta_samples=1, num_f_samples=2, num_predict_samples=2,
                       num_predict_f_samples=4, beta=1.0, dtype="float64"),
                  "classification", dict(num_draws=8), probe_idata=True),
    # identity features (the default) with learned forgetting and calibration: fine-tuning a
    # network adds seconds of compilation; its resume is checked in test_kalman.py, and the
    # tiny MLP with replay runs in the online-SGD case below
    "kalman-classifier": Case(dict(num_classes=4, num_samples=4), "classification",
                              dict(num_draws=8), probe_idata=True),
    "kalman-regressor": Case(dict(), "regression", dict(num_draws=8), probe_idata=True),
    "online-sgd-classifier": Case(dict(num_classes=4, network=_TINY_NET, replay_capacity=20,
                                       replay_size=5), "classification"),
    # the fixed-M policy (random subset, seeded per batch) with the hyperparameter fit: the
    # VIPS policy compiles about twice as much (its own resume test is in test_vips.py)
    "online-sgpr": Case(dict(policy="fixed", fixed_m=6, max_iterations=20), "regression",
                        dict(num_draws=8), probe_idata=True),
    # more draws than chains (ArviZ warns otherwise, and warnings are errors here)
    "gp-tree": Case(dict(num_chains=3, num_steps=4, kmeans_n_init=2, inducing_per_class=2,
                         inducing_kmeans_n_init=1), "sessions"),
    "sbm-gp": Case(dict(num_chains=3, num_steps=4, inducing_per_class=2,
                        inducing_kmeans_n_init=1), "sessions"),
    "lsm-gibbs": Case(dict(num_chains=3, num_steps=4, num_predict_samples=4), "sessions"),
    "ove-gibbs": Case(dict(num_chains=3, num_steps=4, num_predict_samples=4), "sessions"),
    "gp-ella": Case(dict(num_components=2, max_iterations=20, line_search_points=5), "tasks",
                    dict(num_draws=8)),
    "gp-ella-individual-gps": Case(dict(max_iterations=10), "tasks"),
    "gp-ella-shared-gp": Case(dict(max_iterations=10), "tasks"),
    "gp-ella-mtgp": Case(dict(max_iterations=10), "tasks"),
    "gp-ella-linear-ella": Case(dict(num_components=2), "tasks"),
}

# -- the streams --------------------------------------------------------------------------------
def _classification():
    """4 classes (quadrants of the first two inputs) in 3 dimensions, batches of 12."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 3))
    y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0).astype(np.int64)
    batches = [Batch(x[i:i + 12], y[i:i + 12]) for i in (0, 12, 24)]
    return batches, Batch(x[36:], y[36:])


def _sessions():
    """6 classes as blobs around directions on the circle (the PG-GP kernels see unit
    inputs, tests/ppl_cl/learners/test_gp_tree.py); sessions of new classes (0, 1), (2, 3),
    (4, 5), 6 points per class; the probe holds 3 new points of each class of the first two."""
    rng = np.random.default_rng(1)
    angles = np.arange(6) * (np.pi / 3)

    def blobs(classes, n_per):
        x = np.concatenate([np.c_[np.cos(angles[c]), np.sin(angles[c])]
                            + 0.15 * rng.normal(size=(n_per, 2)) for c in classes])
        return x, np.repeat(np.asarray(classes, np.int64), n_per)

    batches = [Batch(*blobs(cs, 6)) for cs in ((0, 1), (2, 3), (4, 5))]
    return batches, Batch(*blobs((0, 1, 2, 3), 3))


def _regression():
    """One smooth function of 3 inputs, batches of 12."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(46, 3))
    y = np.sin(x[:, 0]) + 0.5 * x[:, 1] + 0.1 * rng.normal(size=46)
    batches = [Batch(x[i:i + 12], y[i:i + 12]) for i in (0, 12, 24)]
    return batches, Batch(x[36:], y[36:])


def _tasks():
    """Regression tasks (tests/ppl_cl/learners/test_gp_ella.py): task 0 and task 1 (12 points
    each), then 4 more points of task 1 (a known task); the probe holds 10 new points of task
    1. (12 + 4 rows pad to the 16 rows of one task, so the third update compiles nothing new.)"""
    rng = np.random.default_rng(3)
    ws = rng.normal(size=(2, 3))

    def task(t, n):
        x = rng.normal(size=(n, 3))
        return Batch(x, np.sin(x @ ws[t]) + t + 0.1 * rng.normal(size=n), t)

    return [task(0, 12), task(1, 12), task(1, 4)], task(1, 10)


STREAMS = {"classification": _classification, "sessions": _sessions,
           "regression": _regression, "tasks": _tasks}
FAMILY = {"classification": CategoricalPredictive, "sessions": CategoricalPredictive,
          "regression": GaussianPredictive, "tasks": GaussianPredictive}


# -- checks ---------------------------------------------------------------------------------
def _predict(learner, probe: Batch):
    return learner.predict(probe.x, task_id=probe.task_id)


def _arrays(pred) -> dict[str, np.ndarray]:
    if isinstance(pred, CategoricalPredictive):
        return {"probs": pred.probs}
    return {"mean": pred.mean, "variance": pred.variance}


def _assert_same_predictive(got, expected, what: str) -> None:
    assert type(got) is type(expected), what
    a, b = _arrays(got), _arrays(expected)
    for key in b:
        assert a[key].shape == b[key].shape, f"{what}: {key} shape"
        np.testing.assert_allclose(a[key], b[key], rtol=RTOL, atol=0, err_msg=f"{what}: {key}")


def _check_predictive(pred, family: type, probe: Batch) -> None:
    """A finite predictive of ``family`` with one row per probe point, finite ``log_prob``."""
    n = len(probe)
    assert isinstance(pred, family), f"expected a {family.__name__}, received {type(pred)}"
    assert len(pred) == n
    for key, value in _arrays(pred).items():
        assert value.shape[0] == n and np.isfinite(value).all(), key
    if family is CategoricalPredictive:
        assert pred.probs.shape[1] > int(probe.y.max())       # every probe label is a class
        np.testing.assert_allclose(pred.probs.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        assert (pred.probs >= 0).all()
    else:
        assert (pred.variance > 0).all()
    log_prob = pred.log_prob(probe.y)
    assert log_prob.shape == (n,) and np.isfinite(log_prob).all()


def _nan_batch(batch: Batch) -> Batch:
    x = np.array(batch.x, dtype=np.float64)
    x[0, 0] = np.nan
    return Batch(x, batch.y, batch.task_id)


# -- the tests ------------------------------------------------------------------------------
def test_every_learner_has_a_conformance_case():
    """Every name in LEARNERS has a case here (a new learner without one fails), and no case
    names a learner that is not registered."""
    missing, unknown = sorted(set(LEARNERS) - set(CASES)), sorted(set(CASES) - set(LEARNERS))
    assert not missing and not unknown, f"without a case: {missing}; not registered: {unknown}"
    assert {case.kind for case in CASES.values()} <= set(STREAMS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_learner_conforms_to_the_protocol(name, tmp_path):
    """Two updates (dict records), a finite predictive of the right family and length with a
    finite log_prob (probabilities summing to 1), an empty predictive for no rows, a NaN batch
    refused with the predictive unchanged, save / load by class and by load_learner predicting
    the same before and after the same third update (exact resume), and ArviZ InferenceData
    with a posterior group."""
    import arviz as az

    case = CASES[name]
    cls = learner_class(name)
    (first, second, third), probe = STREAMS[case.kind]()
    family = FAMILY[case.kind]
    learner = cls(**case.settings)
    assert type(learner).learner_name == name

    for batch in (first, second):
        assert isinstance(learner.update(batch), dict)
    pred = _predict(learner, probe)
    _check_predictive(pred, family, probe)
    empty = learner.predict(probe.x[:0], task_id=probe.task_id)
    assert isinstance(empty, family) and len(empty) == 0
    assert empty.log_prob(probe.y[:0]).shape == (0,)
    if family is CategoricalPredictive:
        assert empty.probs.shape == (0, pred.num_classes)

    # saved before the refused batch: the resumed learners below then also check that the
    # refusal changed nothing a later update depends on
    path = tmp_path / f"{name}.npz"
    learner.save(path)
    with pytest.raises(ValueError, match="finite"):
        learner.update(_nan_batch(third))
    _assert_same_predictive(_predict(learner, probe), pred, "after the refused batch")

    resumed = {"cls.load": cls.load(path), "load_learner": load_learner(path)}
    for how, other in resumed.items():
        assert type(other) is cls and other.config == learner.config, how
        _assert_same_predictive(_predict(other, probe), pred, f"{how} before the third update")

    assert isinstance(learner.update(third), dict)
    after = _predict(learner, probe)
    _check_predictive(after, family, probe)
    for how, other in resumed.items():
        assert isinstance(other.update(third), dict)
        _assert_same_predictive(_predict(other, probe), after, f"{how} after the third update")

    kwargs = dict(case.idata)
    if case.probe_idata:
        kwargs.update(x=probe.x, y=probe.y)
    idata = learner.to_inference_data(**kwargs)
    assert isinstance(idata, az.InferenceData)
    if case.probe_idata:
        assert "log_likelihood" in idata.groups() and "observed_data" in idata.groups()
    assert "posterior" in idata.groups()
    assert len(idata.posterior.data_vars) > 0
    for var in idata.posterior.data_vars.values():
        assert var.dims[:2] == ("chain", "draw") and np.isfinite(var.values).all()
    # every file says how its draws were made; draws (not a point estimate) pass ArviZ's
    # shape checks (at least 2 chains of 4 draws: az.summary warns otherwise, and warnings are
    # errors here), so r_hat and ESS are numbers
    sampling = idata.attrs["sampling"]
    assert sampling in ("independent draws", "markov chains", "point estimate"), sampling
    if sampling != "point estimate":
        summary = az.summary(idata, kind="diagnostics")
        assert np.isfinite(summary["r_hat"]).all() and np.isfinite(summary["ess_bulk"]).all()
