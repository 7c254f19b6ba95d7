"""The loops of ppl_cl.protocols on tiny deterministic learners: evaluate_tasks (rows of the
accuracy and entropy matrices), continual_tasks (tasks in order, resumable after any task) and
prequential (predict a chunk, then learn it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from ppl_cl.batch import Batch
from ppl_cl.data import streams as St
from ppl_cl.metrics import final_average_accuracy, predictive_entropy_matrix
from ppl_cl.predictive import CategoricalPredictive, GaussianPredictive
from ppl_cl.protocols import continual_tasks, evaluate_tasks, predict_tasks, prequential

NAN = np.nan


# -- evaluate_tasks -----------------------------------------------------------------------------
@dataclass
class _Split:
    train: Batch
    test: Batch
    task_id: int


class _ThresholdLearner:
    """predict: p(class 0 | x) = x[:, 0]; records the task ids it receives."""

    def __init__(self):
        self.task_ids = []

    def predict(self, x, task_id=None):
        self.task_ids.append(task_id)
        p0 = np.asarray(x, dtype=np.float64)[:, 0]
        return CategoricalPredictive(np.stack([p0, 1.0 - p0], axis=1))


def _entropy2(p):
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def _tasks():
    # task 0: probs [.9,.1] (predict 0, right) and [.2,.8] (predict 1, wrong): accuracy 1/2
    # task 1: probs [.5,.5] -> argmax 0, label 1: accuracy 0, entropy log 2
    t0 = Batch(np.array([[0.9], [0.2]]), np.array([0, 0]), task_id=0)
    t1 = Batch(np.array([[0.5]]), np.array([1]), task_id=1)
    return [_Split(t0, t0, 0), _Split(t1, t1, 1)]


def test_evaluate_tasks_fills_rows():
    learner = _ThresholdLearner()
    tasks = _tasks()
    acc, ent = evaluate_tasks(learner, tasks, upto=0)
    np.testing.assert_allclose(acc, [0.5, NAN])
    np.testing.assert_allclose(ent, [(_entropy2(0.9) + _entropy2(0.2)) / 2, NAN])
    assert learner.task_ids == [None]

    acc, ent = evaluate_tasks(learner, tasks, use_task_id=True)
    np.testing.assert_allclose(acc, [0.5, 0.0])
    np.testing.assert_allclose(ent, [(_entropy2(0.9) + _entropy2(0.2)) / 2, math.log(2)])
    assert learner.task_ids[1:] == [0, 1]

    # rows of R and H, then the entropy matrix normalized by log K
    R = np.full((2, 2), NAN)
    H = np.full((2, 2), NAN)
    for i in range(2):
        R[i], H[i] = evaluate_tasks(learner, tasks)
    assert final_average_accuracy(R) == pytest.approx(0.25)
    np.testing.assert_allclose(predictive_entropy_matrix(H, num_classes=2)[:, 1], [1.0, 1.0])


def test_evaluate_tasks_validation():
    class Regressor:
        def predict(self, x, task_id=None):
            return GaussianPredictive(np.zeros(len(x)), np.ones(len(x)))

    with pytest.raises(TypeError, match="CategoricalPredictive"):
        evaluate_tasks(Regressor(), _tasks())
    with pytest.raises(ValueError, match="upto"):
        evaluate_tasks(_ThresholdLearner(), _tasks(), upto=2)
    with pytest.raises(ValueError, match="at least one task"):
        evaluate_tasks(_ThresholdLearner(), [])



# -- prequential ---------------------------------------------------------------------------------

class CountingClassifier:
    """Predicts Laplace-smoothed class frequencies of everything seen; logs every call."""

    def __init__(self, num_classes: int, log: list):
        self.counts = np.ones(num_classes)
        self.log = log

    def predict(self, x, task_id=None):
        self.log.append(("predict", len(x), self.counts.sum()))
        return CategoricalPredictive(np.tile(self.counts / self.counts.sum(), (len(x), 1)))

    def update(self, batch):
        self.log.append(("update", len(batch), self.counts.sum()))
        self.counts += np.bincount(batch.y, minlength=self.counts.size)
        return {"seen": float(self.counts.sum())}


class RunningMeanRegressor:
    """Predicts N(mean of the targets seen so far, 1)."""

    def __init__(self):
        self.total, self.n = 0.0, 0

    def predict(self, x, task_id=None):
        mean = self.total / self.n if self.n else 0.0
        return GaussianPredictive(np.full(len(x), mean), np.ones(len(x)))

    def update(self, batch):
        self.total += float(np.sum(batch.y))
        self.n += len(batch)
        return {"n": self.n}


def test_prequential_predicts_before_updating_each_chunk():
    y = np.array([0, 0, 1, 2, 2, 2, 1, 0, 0, 1, 2])
    x = np.zeros((11, 2))
    chunks = St.online_chunks(x, y, chunk_size=3)
    log: list = []
    result = prequential(CountingClassifier(3, log), chunks)
    # predict then update on every chunk, the prediction made before the chunk is learned
    assert [e[0] for e in log] == ["predict", "update"] * 4
    for n, chunk in enumerate(chunks):
        assert log[2 * n][1] == log[2 * n + 1][1] == len(chunk)
        assert log[2 * n][2] == log[2 * n + 1][2]  # same state at predict and update
    # independent recomputation: p(y_i) = (1 + count of y_i before i's chunk) / (3 + seen)
    expected, correct = [], []
    for n, chunk in enumerate(chunks):
        before = y[: 3 * n]
        p = (1 + np.bincount(before, minlength=3)) / (3 + len(before))
        expected += list(np.log(p[chunk.y]))
        correct += list(np.argmax(p) == chunk.y)
    np.testing.assert_allclose(result.log_prob, expected, rtol=1e-12)
    np.testing.assert_array_equal(result.correct, correct)
    assert result.sq_error is None
    assert result.correct.dtype == bool and result.log_prob.shape == (11,)
    assert [r["seen"] for r in result.records] == [6.0, 9.0, 12.0, 14.0]


def test_prequential_gaussian_records_squared_error():
    y = np.array([1.0, 3.0, 2.0, 6.0, 4.0])
    chunks = St.online_chunks(np.zeros((5, 1)), y, chunk_size=2)
    result = prequential(RunningMeanRegressor(), chunks)
    means = np.array([0.0, 0.0, 2.0, 2.0, 3.0])  # mean of the targets of earlier chunks
    np.testing.assert_allclose(result.sq_error, (means - y) ** 2)
    np.testing.assert_allclose(result.log_prob, -0.5 * (np.log(2 * np.pi) + (y - means) ** 2))
    assert result.correct is None
    assert [r["n"] for r in result.records] == [2, 4, 5]


def test_prequential_without_scoring_only_learns():
    y = np.array([1.0, 3.0, 2.0])
    chunks = St.online_chunks(np.zeros((3, 1)), y, chunk_size=2)
    learner = RunningMeanRegressor()
    result = prequential(learner, chunks, score=False)
    assert result.log_prob.shape == (0,) and result.correct is None and result.sq_error is None
    assert [r["n"] for r in result.records] == [2, 3] and learner.total == 6.0


def test_predict_tasks_returns_the_test_predictives_in_order():
    learner = _ThresholdLearner()
    preds = predict_tasks(learner, _tasks(), use_task_id=True)
    assert learner.task_ids == [0, 1]
    np.testing.assert_allclose(preds[0].probs[:, 0], [0.9, 0.2])
    assert len(predict_tasks(learner, _tasks(), upto=0)) == 1 and learner.task_ids[-1] is None
    with pytest.raises(ValueError, match="upto"):
        predict_tasks(learner, _tasks(), upto=2)


def test_prequential_errors():
    class Bad:
        def predict(self, x, task_id=None):
            return np.zeros(len(x))

        def update(self, batch):
            return {}

    chunks = St.online_chunks(np.zeros((4, 1)), np.zeros(4), chunk_size=2)
    with pytest.raises(TypeError, match="CategoricalPredictive or a GaussianPredictive"):
        prequential(Bad(), chunks)
    with pytest.raises(ValueError, match="expected targets"):
        prequential(RunningMeanRegressor(), [Batch(np.zeros((2, 1)))])
    empty = prequential(RunningMeanRegressor(), [])
    assert empty.log_prob.shape == (0,) and empty.records == []




# -- continual tasks ------------------------------------------------------------------------------
class _MemoryLearner:
    """Predicts class 0 with probability x[:, 0] until it has seen a task whose labels are all
    1, then the reverse (a learner that 'forgets' in a known way); records its updates."""

    def __init__(self):
        self.flipped = False
        self.updates = []

    def update(self, batch, validation=None):
        self.updates.append((batch.task_id, None if validation is None else len(validation)))
        if np.all(np.asarray(batch.y) == 1):
            self.flipped = True
        return {"task": batch.task_id}

    def predict(self, x, task_id=None):
        p0 = np.asarray(x, dtype=np.float64)[:, 0]
        if self.flipped:
            p0 = 1.0 - p0
        return CategoricalPredictive(np.stack([p0, 1.0 - p0], axis=1))

    def state_dict(self):
        return {"flipped": self.flipped, "updates": list(self.updates)}

    def load_state_dict(self, state):
        self.flipped = bool(state["flipped"])
        self.updates = [tuple(u) for u in state["updates"]]


def _continual_tasks():
    t0 = Batch(np.array([[0.9], [0.8]]), np.array([0, 0]), task_id=0)
    t1 = Batch(np.array([[0.3], [0.1]]), np.array([1, 1]), task_id=1)
    t2 = Batch(np.array([[0.7], [0.2]]), np.array([0, 1]), task_id=2)
    return [_Split(t, t, i) for i, t in enumerate((t0, t1, t2))]


def test_continual_tasks_scores_every_task_after_each_and_resumes():
    tasks = _continual_tasks()
    valids = [t.test for t in tasks]
    res = continual_tasks(_MemoryLearner(), tasks, valids)
    # after task 0 class 0 is predicted where x > 0.5: task 0 right, task 1 right, task 2 right
    # after task 1 (all labels 1) the learner flips: task 0 wrong, task 1 wrong, task 2 wrong
    np.testing.assert_array_equal(res.accuracy_matrix, [[1, 1, 1], [0, 0, 0], [0, 0, 0]])
    # forgetting: task 0 drops from 1 to 0, task 1 was never right: (1 + 0) / 2
    assert res.final_average_accuracy == 0.0 and res.forgetting == pytest.approx(0.5)
    assert [r["task"] for r in res.records] == [0, 1, 2]
    # resumed from the tree after task 1: the same matrices and the learner's own state
    trees = []
    first = _MemoryLearner()
    continual_tasks(first, tasks[:2], valids[:2], after_task=lambda i, r, t: trees.append(t))
    tree = {**trees[-1], "R": np.pad(trees[-1]["R"], ((0, 1), (0, 1)), constant_values=NAN),
            "H": np.pad(trees[-1]["H"], ((0, 1), (0, 1)), constant_values=NAN)}
    again = _MemoryLearner()
    res2 = continual_tasks(again, tasks, valids, resume=tree)
    np.testing.assert_array_equal(res2.accuracy_matrix[:2, :2], res.accuracy_matrix[:2, :2])
    np.testing.assert_array_equal(res2.accuracy_matrix[2], res.accuracy_matrix[2])
    assert again.updates == [(0, 2), (1, 2), (2, 2)]   # only task 2 trained after the resume
    with pytest.raises(ValueError, match="one batch per task"):
        continual_tasks(_MemoryLearner(), tasks, valids[:1])
    with pytest.raises(ValueError, match="at least one task"):
        continual_tasks(_MemoryLearner(), [])
