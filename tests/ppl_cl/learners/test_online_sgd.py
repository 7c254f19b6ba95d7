"""The online-SGD baseline (ppl_cl/learners/online_sgd.py, inference/online_sgd.py): one SGD
step per chunk equals a hand-written step on the cross-entropy, the engine follows the contract,
save/load mid-stream resumes exactly, bad input leaves the state unchanged, and the config holds
only the baseline's own settings."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_cl import Batch
from ppl_cl.configs.kalman import NetworkConfig, OnlineSGDConfig
from ppl_cl.data.streams import online_chunks
from ppl_cl.learners import load_learner
from ppl_cl.learners.online_sgd import OnlineSGDClassifier
from ppl_cl.protocols import prequential


def _blobs(n=60, d=6, K=4, seed=0):
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).normal(scale=2.0, size=(K, d))
    y = rng.integers(0, K, size=n)
    return (centres[y] + rng.normal(size=(n, d))).astype(np.float32), y.astype(np.int64)


def test_config_has_only_the_baselines_settings():
    names = {f.name for f in dataclasses.fields(OnlineSGDConfig)}
    assert names == {"num_classes", "input_dim", "network", "feature_bias",
                     "feature_normalization", "learning_rate", "replay_capacity", "replay_size",
                     "dtype", "seed"}
    with pytest.raises(ValueError, match="learning_rate"):
        OnlineSGDConfig(learning_rate=0.0)


def test_one_update_is_one_sgd_step_on_the_chunk_cross_entropy():
    """Identity features, no replay: (W, b) <- (W, b) - lr grad L with L the mean cross-entropy
    of the chunk, written out in NumPy (softmax gradient (p - onehot) / b)."""
    x, y = _blobs(10, d=3, K=3)
    lr = 0.3
    sgd = OnlineSGDClassifier(num_classes=3, input_dim=3, network=NetworkConfig("identity"),
                              feature_bias=True, learning_rate=lr, dtype="float64")
    # uniform first prediction (zero head)
    np.testing.assert_allclose(sgd.predict(x).probs, 1 / 3, rtol=1e-12)
    record = sgd.update(Batch(x, y))
    phi = np.concatenate([x.astype(np.float64), np.ones((10, 1))], axis=1)
    p = np.full((10, 3), 1 / 3)
    resid = (p - np.eye(3)[y]) / 10
    W, b = -lr * phi.T @ resid, -lr * resid.sum(0)              # head weights (m, K), bias (K,)
    np.testing.assert_allclose(record["loss"], np.log(3.0), rtol=1e-12)
    logits = phi @ W + b
    ref = np.exp(logits - logits.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(sgd.predict(x).probs, ref, rtol=1e-10)


def test_engine_follows_the_contract():
    from inference.base import Engine, is_state
    from inference.online_sgd import OnlineSGD

    engine = OnlineSGD(lambda key: [], lambda theta, x: x, 3, 2, 0.1, replay_capacity=4,
                       replay_size=10)            # more replayed slots than the memory holds
    assert isinstance(engine, Engine)
    state = engine.init(jax.random.PRNGKey(0), input_dim=3)
    new, info = engine.step(jax.random.PRNGKey(1), state,
                            (jnp.ones((2, 3)), jnp.array([0, 1], jnp.int32)))
    assert is_state(new) and is_state(info) and int(new.memory.size) == 2
    assert np.isfinite(float(info.loss))


def test_save_load_mid_stream_resumes_exactly_and_bad_input_is_refused(tmp_path):
    x, y = _blobs(60, seed=4)
    chunks = online_chunks(x, y, 10)
    s = OnlineSGDClassifier(num_classes=4, input_dim=6, network=NetworkConfig("mlp", 8, (8,)),
                            replay_capacity=20, replay_size=5)
    for c in chunks[:3]:
        s.update(c)
    before = s.state_dict()
    with pytest.raises(ValueError, match="labels in 0..3"):
        s.update(Batch(x[:5], np.full(5, 7)))
    with pytest.raises(TypeError, match="ppl_cl.Batch"):
        s.update((x[:5], y[:5]))
    for k in ("params", "opt_state"):
        for a, b in zip(before[k], s.state_dict()[k]):
            np.testing.assert_array_equal(a, b)
    s.save(tmp_path / "s.npz")
    t = load_learner(tmp_path / "s.npz")
    assert isinstance(t, OnlineSGDClassifier) and t.config == s.config
    np.testing.assert_array_equal(prequential(s, chunks[3:]).log_prob,
                                  prequential(t, chunks[3:]).log_prob)
