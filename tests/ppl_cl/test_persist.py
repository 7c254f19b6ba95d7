"""Checkpoints: round trip of mixed trees, atomicity, versions, and the Learner save/load path."""

import json

import jax.numpy as jnp
import dataclasses

import numpy as np
import pytest
import torch

from ppl_cl import persist
from ppl_cl.learner import Learner
from ppl_cl.persist import CheckpointError, load_tree, save_tree
from ppl_cl.predictive import GaussianPredictive


def test_round_trip_mixed_tree(tmp_path):
    tree = {"a": np.arange(3.0), "t": torch.tensor([[1.0, 2.0]], dtype=torch.float64),
            "j": jnp.ones(2), "nested": [1, "s", None, (2.5, True)], "empty": {}}
    save_tree(tmp_path / "c.npz", tree, meta={"k": 1})
    back, meta = load_tree(tmp_path / "c.npz")
    assert meta == {"k": 1}
    np.testing.assert_array_equal(back["a"], tree["a"])
    assert isinstance(back["t"], torch.Tensor) and back["t"].dtype == torch.float64
    assert type(back["j"]).__module__.startswith("jax")
    assert back["nested"] == [1, "s", None, (2.5, True)] and back["empty"] == {}


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "c.npz"
    save_tree(path, {"v": np.ones(2)})
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(persist.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        save_tree(path, {"v": np.zeros(2)})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.npz"]  # no temp file left


def test_version_and_garbage(tmp_path):
    path = tmp_path / "c.npz"
    save_tree(path, {"v": np.ones(1)})
    with np.load(path) as npz:
        header = json.loads(npz["__meta__"].tobytes())
        arrays = {k: npz[k] for k in npz.files if k != "__meta__"}
    header["format_version"] = 999
    np.savez(path, __meta__=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
    with pytest.raises(CheckpointError, match="format version 999"):
        load_tree(path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(CheckpointError, match="not a ppl_cl checkpoint"):
        load_tree(tmp_path / "junk.npz")
    with pytest.raises(FileNotFoundError):
        load_tree(tmp_path / "nope.npz")


@dataclasses.dataclass(frozen=True)
class _MeanConfig:
    prior_var: float = 1.0


class _Mean(Learner):
    """A running-mean regressor: the smallest learner that exercises the protocol."""

    learner_name = "test-running-mean"
    config_cls = _MeanConfig

    def __init__(self, config=None, /, **overrides):
        super().__init__(config, **overrides)
        self.n, self.total = 0, 0.0

    def update(self, batch):
        batch.validate(regression=True)
        self.n += len(batch)
        self.total += float(np.sum(batch.y))
        return {"n": self.n}

    def predict(self, x, task_id=None):
        m = self.total / max(self.n, 1)
        return GaussianPredictive(np.full(len(x), m), np.full(len(x), self.config.prior_var))

    def state_dict(self):
        return {"n": self.n, "total": np.asarray(self.total)}

    def load_state_dict(self, state):
        self.n, self.total = state["n"], float(state["total"])

    def to_inference_data(self):
        raise NotImplementedError


def test_learner_save_load(tmp_path):
    from ppl_cl import Batch

    a = _Mean(prior_var=2.0)
    a.update(Batch(np.zeros((3, 1)), np.array([1.0, 2.0, 3.0])))
    a.save(tmp_path / "m.npz")
    b = _Mean.load(tmp_path / "m.npz")
    assert isinstance(b, _Mean) and b.config == _MeanConfig(prior_var=2.0)
    np.testing.assert_array_equal(b.predict(np.zeros((2, 1))).mean, a.predict(np.zeros((2, 1))).mean)
    with pytest.raises(TypeError, match="load_learner"):
        Learner.load(tmp_path / "m.npz")
    with pytest.raises(CheckpointError, match="holds a 'test-running-mean' learner"):
        from ppl_cl.learners.exact_gp import ExactGP

        ExactGP.load(tmp_path / "m.npz")
