"""OnlineSGPR on the learner protocol: exact limits against ExactGP, exact resume, bad input,
ArviZ export, and the UCI stream protocol of the VIPS reference code."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ppl_cl import Batch
from ppl_cl.configs.vips import OnlineSGPRConfig
from ppl_cl.learners.exact_gp import ExactGP
from ppl_cl.learners.vips import NotFittedError, OnlineSGPR


def _data(seed=0, n=24):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0, 10, n))[:, None]
    y = np.sin(2 * x[:, 0]) + np.cos(5 * x[:, 0]) + 0.2 * rng.standard_normal(n)
    return x, y


def test_all_points_inducing_predicts_like_exact_gp():
    """fixed M >= all points seen keeps every input: the online posterior is exact."""
    x1, y1 = _data(0, 10)   # few, well separated inputs: S_a^-1 - K^-1 stays well conditioned
    x2, y2 = _data(1, 10)
    xs = np.linspace(0, 10, 30)[:, None]
    gp = OnlineSGPR(policy="fixed", fixed_m=100, fit=False, lengthscale=0.7, noise_variance=0.1,
                    jitter=1e-12, summary_jitter=0.0)  # two inputs 0.02 apart: tiny jitter
    gp.update(Batch(x1, y1))
    gp.update(Batch(x2, y2))
    ex = ExactGP(kernel="se", lengthscale=0.7, noise_variance=0.1, optimize=False)
    ex.update(Batch(np.concatenate([x1, x2]), np.concatenate([y1, y2])))
    p, q = gp.predict(xs), ex.predict(xs)
    assert gp.num_inducing == 20
    np.testing.assert_allclose(p.mean, q.mean, atol=1e-5)
    np.testing.assert_allclose(p.variance, q.variance, atol=1e-5)


def test_update_record_and_vips_growth():
    x, y = _data(2, 32)
    gp = OnlineSGPR(lengthscale=0.5)
    rec = gp.update(Batch(x[:16], y[:16]))
    for key in ("m", "added", "bound", "bound_selected", "l_max", "l_noise", "threshold",
                "iterations", "select_seconds", "fit_seconds", "variance", "lengthscale",
                "noise_variance"):
        assert key in rec, key
    assert rec["bound_selected"] >= rec["threshold"]
    assert rec["l_max"] >= rec["threshold"]
    m1 = rec["m"]
    rec2 = gp.update(Batch(x[16:], y[16:]))   # new input range: it grows
    assert rec2["m"] > m1
    assert gp.history()["m"] == [m1, rec2["m"]]


def test_save_load_between_batches_resumes_exactly(tmp_path):
    x, y = _data(3, 32)
    b = [Batch(x[i::3], y[i::3]) for i in range(3)]
    a = OnlineSGPR(policy="vips", lengthscale=0.6)
    a.update(b[0])
    a.save(tmp_path / "ck.npz")
    a.update(b[1])
    a.update(b[2])
    c = OnlineSGPR.load(tmp_path / "ck.npz")
    assert isinstance(c, OnlineSGPR) and c.config == a.config
    c.update(b[1])
    c.update(b[2])
    xs = np.linspace(0, 10, 11)[:, None]
    np.testing.assert_array_equal(a.predict(xs).mean, c.predict(xs).mean)
    np.testing.assert_array_equal(a.predict(xs).variance, c.predict(xs).variance)
    np.testing.assert_array_equal(a.inducing_inputs, c.inducing_inputs)
    assert a.history()["m"] == c.history()["m"]


def _copy(v):
    if isinstance(v, dict):
        return {k: _copy(w) for k, w in v.items()}
    if isinstance(v, (list, tuple)):
        return [_copy(w) for w in v]
    return None if v is None else np.array(v)


def _state_copy(gp):
    return _copy(gp.state_dict()["state"])


def _same(s1, s2):
    assert type(s1) is type(s2) or (s1 is not None and s2 is not None)
    if isinstance(s1, dict):
        assert set(s1) == set(s2)
        for k in s1:
            _same(s1[k], s2[k])
    elif isinstance(s1, list):
        assert len(s1) == len(s2)
        for u, v in zip(s1, s2):
            _same(u, v)
    elif s1 is None:
        assert s2 is None
    else:
        np.testing.assert_array_equal(s1, s2)


def test_bad_input_is_refused_and_leaves_the_state_unchanged():
    x, y = _data(4, 20)
    gp = OnlineSGPR()
    prior = gp.predict(x)        # before any update: the GP prior (variance 1 + noise 0.1)
    np.testing.assert_allclose(prior.mean, 0.0)
    np.testing.assert_allclose(prior.variance, 1.1, rtol=1e-12)
    with pytest.raises(NotFittedError):
        gp.hyperparameters()
    with pytest.raises(TypeError, match="batch"):
        gp.update((x, y))
    with pytest.raises(ValueError, match="at least 2 targets"):
        gp.update(Batch(x[:1], y[:1]))     # VIPS' first batch needs a sample variance
    with pytest.raises(ValueError, match="same value"):
        gp.update(Batch(x[:5], np.ones(5)))
    assert gp.num_batches == 0
    gp.update(Batch(x[:10], y[:10]))
    before = _state_copy(gp)
    bad = [(Batch(x[10:], np.where(np.arange(10) == 3, np.nan, y[10:])), "finite"),
           (Batch(np.where(x[10:] > 5, np.inf, x[10:]), y[10:]), "finite"),
           (Batch(np.zeros((0, 1)), np.zeros(0)), "empty"),
           (Batch(np.ones((4, 2)), np.zeros(4)), "feature dimension")]
    for batch, msg in bad:
        with pytest.raises(ValueError, match=msg):
            gp.update(batch)
        _same(before, _state_copy(gp))
    # a batch of one point after the first is fine
    gp.update(Batch(x[10:11], y[10:11]))
    assert gp.num_batches == 2
    # predict on no rows
    assert len(gp.predict(np.zeros((0, 1)))) == 0


def test_duplicate_inputs_take_the_jitter_path_without_nan():
    x, y = _data(5, 8)
    xd = np.concatenate([x, x, x])          # 24 rows: the size bucket of the other tests
    yd = np.concatenate([y, y + 0.01, y - 0.01])
    for policy in ("vips", "cv", "oips"):
        gp = OnlineSGPR(policy=policy, lengthscale=0.5)
        gp.update(Batch(xd, yd))
        gp.update(Batch(xd, yd))
        p = gp.predict(x)
        assert np.isfinite(p.mean).all() and np.isfinite(p.variance).all()
        # greedy rules (almost) never choose a duplicate twice; OIPS' random start may hold some
        assert gp.num_inducing <= (8 + 2 if policy != "oips" else 10 + 8)


def test_zero_variance_batch_after_the_first_is_accepted():
    x, y = _data(6, 20)
    gp = OnlineSGPR()
    gp.update(Batch(x[:10], y[:10]))
    rec = gp.update(Batch(x[10:], np.full(10, 0.3)))   # running variance still > 0
    assert np.isfinite(rec["bound"])


def test_to_inference_data_has_f_draws_and_trajectories():
    x, y = _data(7, 24)
    gp = OnlineSGPR(lengthscale=0.6)
    gp.update(Batch(x[:12], y[:12]))
    gp.update(Batch(x[12:], y[12:]))
    idata = gp.to_inference_data(x, y, num_draws=50)
    assert idata.posterior["f"].shape == (2, 25, 24)     # 50 independent draws in 2 chains
    assert idata.log_likelihood["y"].shape == (2, 25, 24)
    groups = idata.groups()
    traj = idata[[g for g in groups if g not in ("posterior", "log_likelihood", "observed_data",
                                                 "constant_data")][0]]
    assert list(np.asarray(traj["m"])) == gp.history()["m"]
    assert "hp_lengthscale" in traj
    # draws centred on the predictive mean
    mean = gp.predict(x, latent=True).mean
    sd = np.sqrt(gp.predict(x, latent=True).variance)
    z = (idata.posterior["f"].values.reshape(50, 24).mean(0) - mean) / (sd / np.sqrt(50))
    assert np.all(np.abs(z) < 5)


def test_config_validation_and_overrides():
    with pytest.raises(ValueError, match="policy"):
        OnlineSGPRConfig(policy="nope")
    with pytest.raises(ValueError, match="delta"):
        OnlineSGPRConfig(delta=2.0)
    with pytest.raises(ValueError, match="first_delta"):
        OnlineSGPRConfig(first_delta=-0.1)
    with pytest.raises(TypeError, match="unknown"):
        OnlineSGPR(not_a_field=1)
    gp = OnlineSGPR(OnlineSGPRConfig(delta=0.1), policy="cv")
    assert gp.config.delta == 0.1 and gp.config.policy == "cv"
    assert dataclasses.is_dataclass(gp.config)


def test_uci_stream_follows_the_reference_protocol():
    """``divide_batches_kfolds`` / ``divide_batches`` of the reference: N // B rows per batch,
    the remainder to the last; each batch shuffled by one RandomState(0) in batch order; KFold
    parts (fold k tests on part k); kin8nm's rule: int((N // B) * 0.8) rows train in every
    batch, the last batch's extra rows go to its test part."""
    from sklearn.model_selection import KFold

    from ppl_cl.experiments.vips import cut_batches, stream_order, uci_stream

    rng = np.random.default_rng(0)
    x = rng.standard_normal((103, 3))
    x[:, 0] = np.round(x[:, 0], 1)          # ties in the first input
    y = rng.standard_normal(103)
    order = stream_order(x)                  # stable: ties in file order
    assert np.all(np.diff(x[order, 0]) >= 0)
    ties = [order[x[order, 0] == v] for v in np.unique(x[:, 0])]
    assert all(np.all(np.diff(t) > 0) for t in ties)
    rows = cut_batches(order, 4)
    assert [len(r) for r in rows] == [25, 25, 25, 28]
    folds = uci_stream(x, y, n_batches=4, n_folds=5)
    rs = np.random.RandomState(0)
    for b, r in enumerate(rows):
        shuffled = r[rs.permutation(len(r))]
        for k, (tr, te) in enumerate(KFold(5).split(shuffled)):
            np.testing.assert_array_equal(folds[k][0][b][0], x[shuffled[tr]])
            np.testing.assert_array_equal(folds[k][1][b][1], y[shuffled[te]])
    hold = uci_stream(x, y, n_batches=4, n_folds=1)
    assert len(hold) == 1
    assert [t[0].shape[0] for t in hold[0][0]] == [20, 20, 20, 20]
    assert [t[0].shape[0] for t in hold[0][1]] == [5, 5, 5, 8]
    # an explicit order (e.g. the reference's concrete order) replaces the sort
    perm = rng.permutation(103)
    first = uci_stream(x, y, 4, 1, order=perm)[0]
    assert set(map(tuple, np.concatenate([first[0][0][0], first[1][0][0]]))) == \
        set(map(tuple, x[perm[:25]]))
    with pytest.raises(ValueError, match="permutation"):
        uci_stream(x, y, 4, 1, order=perm[:-1])


@pytest.mark.data("uci-gal/naval-propulsion-plant")
def test_naval_has_the_reference_14_features():
    from ppl_cl.experiments.vips import load_uci_full

    x, y = load_uci_full("naval")
    assert x.shape == (11934, 14) and y.shape == (11934,)
    assert np.all(x.std(0) > 0)
