"""The loops that drive a learner over a stream: one module for every method.

* :func:`evaluate_tasks` — one row of the accuracy matrix ``R[i, j]`` and of the mean
  predictive entropy after a task (VAR-GP Table 1 / Fig. 3, GP-Tree);
* :func:`predict_tasks` — the predictives of the test sets of the tasks so far (pooled
  regression scores, calibration);
* :func:`continual_tasks` — tasks one after another: ``update`` on task ``i`` (with its
  validation batch where the learner takes one), then every task's test set scored; resumable
  after any task (VAR-GP Sect. 5, Split / Permuted MNIST);
* :func:`prequential` — online chunks: predict a chunk, then learn from it (Kalman OCL
  Sect. 4.2, eq. 14);
* :func:`select_prequential` — the candidate settings with the highest cumulative log
  predictive on a (held-out) stream (prequential MDL, Kalman OCL App. D.1).

Each loop is generic over any learner of the protocol (:mod:`ppl_cl.learner`) and returns its
raw records; metrics are :mod:`ppl_cl.metrics`' pure functions of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ppl_cl.batch import Batch, as_numpy
from ppl_cl.metrics import average_accuracy, final_average_accuracy, forgetting
from ppl_cl.predictive import CategoricalPredictive, GaussianPredictive
from ppl_cl.progress import progress as _progress

__all__ = ["evaluate_tasks", "predict_tasks", "ContinualResult", "continual_tasks",
           "PrequentialResult", "prequential", "select_prequential"]


# -- continual tasks ----------------------------------------------------------------------------

def evaluate_tasks(learner: Any, tasks: Sequence[Any], upto: int | None = None,
                   use_task_id: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and mean predictive entropy of ``learner`` on the test sets of ``tasks``.

    Calls ``learner.predict(task.test.x, task_id=task.task_id if use_task_id else None)`` for
    tasks ``0..upto`` (all when ``upto`` is None); the prediction must be a
    :class:`~ppl_cl.predictive.CategoricalPredictive`. After training on task ``i``::

        R[i], H[i] = evaluate_tasks(learner, tasks, upto=i)   # lower triangle of row i
        R[i], H[i] = evaluate_tasks(learner, tasks)           # the whole row (VAR-GP Fig. 3)

    Args:
        learner: anything with ``predict(x, task_id=None)`` (a :class:`~ppl_cl.learner.Learner`).
        tasks: ``TaskSplit``-like objects with ``.test.x``, ``.test.y`` and ``.task_id``.
        upto: index of the last task to evaluate (inclusive).
        use_task_id: pass each task's id to ``predict`` (multi-head / task-aware learners).

    Returns:
        ``(accuracies, entropies)``, both of shape ``(len(tasks),)``: accuracy in ``[0, 1]`` and
        mean per-point predictive entropy in nats; NaN for tasks after ``upto``.
    """
    T = len(tasks)
    if T == 0:
        raise ValueError("tasks: expected at least one task, received none")
    if upto is None:
        upto = T - 1
    if not isinstance(upto, (int, np.integer)) or not 0 <= upto < T:
        raise ValueError(f"upto: expected an int in 0..{T - 1}, received {upto!r}")
    accuracies = np.full(T, np.nan)
    entropies = np.full(T, np.nan)
    for j in range(int(upto) + 1):
        task = tasks[j]
        test = getattr(task, "test", None)
        if test is None or getattr(test, "y", None) is None:
            raise ValueError(f"tasks[{j}]: expected a test batch with targets (task.test.y), "
                             f"received {type(task).__name__}")
        task_id = getattr(task, "task_id", None) if use_task_id else None
        predictive = learner.predict(test.x, task_id=task_id)
        if not isinstance(predictive, CategoricalPredictive):
            raise TypeError(f"learner.predict: expected a CategoricalPredictive for task {j}, "
                            f"received {type(predictive).__name__}")
        y = np.asarray(as_numpy(test.y)).reshape(-1)
        if len(predictive) != y.shape[0]:
            raise ValueError(f"learner.predict: expected {y.shape[0]} predictions for task {j}, "
                             f"received {len(predictive)}")
        if y.shape[0] == 0:
            raise ValueError(f"tasks[{j}].test: expected at least one test point, received none")
        accuracies[j] = predictive.accuracy(y)
        entropies[j] = predictive.entropy().mean()
    return accuracies, entropies


def predict_tasks(learner: Any, tasks: Sequence[Any], upto: int | None = None,
                  use_task_id: bool = False) -> list:
    """``learner.predict(task.test.x, task_id=...)`` for tasks ``0..upto`` (all when ``upto``
    is None), in order: the predictives :func:`evaluate_tasks` scores, for any metric (the
    pooled test RMSE / NLPD of a regression stream, the calibration of the test predictions).

    Args: as :func:`evaluate_tasks`.
    """
    T = len(tasks)
    if T == 0:
        raise ValueError("tasks: expected at least one task, received none")
    upto = T - 1 if upto is None else upto
    if not isinstance(upto, (int, np.integer)) or not 0 <= upto < T:
        raise ValueError(f"upto: expected an int in 0..{T - 1}, received {upto!r}")
    return [learner.predict(task.test.x,
                            task_id=getattr(task, "task_id", None) if use_task_id else None)
            for task in tasks[: int(upto) + 1]]


@dataclass(frozen=True)
class ContinualResult:
    """What :func:`continual_tasks` saw.

    Attributes:
        accuracy_matrix: ``R (T, T)``, ``R[i, j]`` = accuracy on task j's test set after task i
            (every j: the upper triangle holds zero-shot accuracies).
        entropy_matrix: ``H (T, T)``, mean predictive entropy (nats) on task j after task i.
        records: what ``learner.update`` returned for each task.
    """

    accuracy_matrix: np.ndarray
    entropy_matrix: np.ndarray
    records: list

    @property
    def average_accuracy(self) -> np.ndarray:
        """Mean accuracy over the tasks seen, after each task (fractions)."""
        return average_accuracy(self.accuracy_matrix)

    @property
    def final_average_accuracy(self) -> float:
        return final_average_accuracy(self.accuracy_matrix)

    @property
    def forgetting(self) -> float:
        """Mean drop from each task's accuracy right after it to its final accuracy (0 for one
        task)."""
        return forgetting(self.accuracy_matrix) if len(self.accuracy_matrix) > 1 else 0.0


def continual_tasks(learner: Any, tasks: Sequence[Any], validations: Sequence[Batch] | None = None,
                    *, resume: dict[str, Any] | None = None,
                    after_task: Callable[[int, dict[str, Any], dict[str, Any]], None] | None = None,
                    update_kwargs: Callable[[int], dict[str, Any]] | None = None,
                    progress: bool | None = False, desc: str = "tasks") -> ContinualResult:
    """Train ``learner`` on ``tasks`` in order; after each, score every task's test set.

    Args:
        learner: a learner of the protocol (classification: ``predict`` gives a
            :class:`~ppl_cl.predictive.CategoricalPredictive`).
        tasks: ``TaskSplit``-like objects (``.train``, ``.test`` batches, ``.task_id``).
        validations: one batch per task, passed as ``learner.update(train, validation=v)``
            (early stopping); None: ``learner.update(train)``.
        resume: a tree from ``after_task`` (``{"learner", "R", "H"}``): the learner's state is
            loaded and the loop continues after the tasks it has done.
        after_task: ``after_task(i, record, tree)`` after task ``i`` (0-based), with the tree
            to resume from (for checkpoints and progress lines).
        update_kwargs: ``update_kwargs(i)`` -> extra keyword arguments of the ``update`` of
            task ``i`` (e.g. a within-task snapshot to resume from).
        progress: progress bar over tasks; desc: its label.
    """
    T = len(tasks)
    if T == 0:
        raise ValueError("tasks: expected at least one task, received none")
    if validations is not None and len(validations) != T:
        raise ValueError(f"validations: expected one batch per task ({T}), received "
                         f"{len(validations)}")
    R = np.full((T, T), np.nan)
    H = np.full((T, T), np.nan)
    records: list = []
    start = 0
    if resume is not None:
        learner.load_state_dict(resume["learner"])
        records = list(resume.get("records", []))
        start = len(records)
        if start > T:
            raise ValueError(f"resume: {start} tasks done, the stream has {T}")
        R[:start] = np.asarray(resume["R"], dtype=float)[:start]
        H[:start] = np.asarray(resume["H"], dtype=float)[:start]
    for i in _progress(range(start, T), desc=desc, total=T, initial=start, enabled=progress):
        kwargs = dict(update_kwargs(i)) if update_kwargs is not None else {}
        if validations is not None:
            kwargs["validation"] = validations[i]
        record = learner.update(tasks[i].train, **kwargs)
        records.append(record)
        R[i], H[i] = evaluate_tasks(learner, tasks)
        if after_task is not None:
            after_task(i, record, {"learner": learner.state_dict(), "R": R, "H": H,
                                   "records": records})
    return ContinualResult(R, H, records)


# -- prequential evaluation -------------------------------------------------------------------

@dataclass(frozen=True)
class PrequentialResult:
    """Per-point results of :func:`prequential`, in stream order.

    Attributes:
        log_prob: ``log p(y_i | x_i, data before i's chunk)``, ``(N,)``.
        correct: for categorical predictives, ``argmax p == y_i`` as bool ``(N,)``; else None.
        sq_error: for Gaussian predictives, ``(mean_i - y_i)^2`` ``(N,)``; else None.
        records: the dict returned by ``learner.update`` for each chunk.
        predictives: with ``keep_predictives``, each chunk's predictive (made before its
            update); else empty.
    """

    log_prob: np.ndarray
    correct: np.ndarray | None
    sq_error: np.ndarray | None
    records: list[dict[str, Any]]
    predictives: list = field(default_factory=list)


def prequential(learner: Any, chunks: Iterable[Batch], progress: bool | None = False, *,
                keep_predictives: bool = False, score: bool = True) -> PrequentialResult:
    """Prequential (predict-then-learn) evaluation over a stream (Kalman OCL Sect. 4.2).

    For each chunk ``S_n``: ``p = learner.predict(S_n.x, task_id=S_n.task_id)`` *before*
    ``learner.update(S_n)``; the per-point log predictive ``log p(y_i)``, correctness
    (categorical) or squared error (Gaussian) are recorded. These feed the average online
    accuracy (eq. 14 of the Kalman paper) and the cumulative log predictive.

    Args:
        learner: any object with ``predict(x, task_id=None)`` returning a
            :class:`~ppl_cl.predictive.CategoricalPredictive` or
            :class:`~ppl_cl.predictive.GaussianPredictive`, and ``update(batch) -> dict``.
        chunks: the stream (e.g. :func:`online_chunks`), each with targets.
        progress: show a progress bar (``None``: the ``PPL_CL_PROGRESS`` default).
        keep_predictives: also return every chunk's predictive (e.g. the predictive means of
            Kalman OCL Fig. 1).
        score: predict each chunk before learning from it; ``False``: learn only (a stream
            of new tasks, which a multi-task learner has no predictive for before their
            data), and the result's per-point arrays are empty.

    Returns:
        :class:`PrequentialResult`.
    """
    log_probs, correct, sq_errors, records, predictives = [], [], [], [], []
    kind = None
    for n, chunk in enumerate(_progress(chunks, desc="prequential", enabled=progress)):
        if not isinstance(chunk, Batch):
            raise TypeError(f"chunks[{n}]: expected a Batch, received {type(chunk).__name__}")
        if chunk.y is None:
            raise ValueError(f"chunks[{n}]: expected targets y, received None")
        if not score:
            records.append(learner.update(chunk))
            continue
        pred = learner.predict(chunk.x, task_id=chunk.task_id)
        if isinstance(pred, CategoricalPredictive):
            this = "categorical"
        elif isinstance(pred, GaussianPredictive):
            this = "gaussian"
        else:
            raise TypeError(f"learner.predict: expected a CategoricalPredictive or a "
                            f"GaussianPredictive, received {type(pred).__name__}")
        if kind is not None and this != kind:
            raise TypeError(f"learner.predict: returned a {this} predictive at chunk {n} after "
                            f"{kind} ones")
        kind = this
        if len(pred) != len(chunk):
            raise ValueError(f"learner.predict: expected {len(chunk)} predictions for chunk {n}, "
                             f"received {len(pred)}")
        y = as_numpy(chunk.y)
        log_probs.append(pred.log_prob(y))
        if kind == "categorical":
            correct.append(pred.predicted_class() == y)
        else:
            sq_errors.append((pred.mean - y.astype(np.float64)) ** 2)
        if keep_predictives:
            predictives.append(pred)
        record = learner.update(chunk)
        records.append(record)

    def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

    return PrequentialResult(
        log_prob=cat(log_probs, np.float64),
        correct=cat(correct, bool) if kind == "categorical" else None,
        sq_error=cat(sq_errors, np.float64) if kind == "gaussian" else None,
        records=records,
        predictives=predictives,
    )




# -- selection by prequential MDL (Kalman OCL App. D.1) ------------------------------------------

def select_prequential(make_learner: Callable[[Any], Any], candidates: Sequence[Any],
                       chunks: Sequence[Batch], *, progress: bool | None = False,
                       desc: str = "select") -> tuple[int, np.ndarray]:
    """The candidate whose learner has the highest cumulative log predictive on ``chunks``:
    prequential MDL, the selection rule of Kalman OCL App. D.1 (after Bornschein et al. 2022).

    Run it on a held-out stream so that the reported stream does not choose its own settings.

    Args:
        make_learner: ``make_learner(candidate)`` -> a fresh learner.
        candidates: the settings to compare (any objects ``make_learner`` takes).
        chunks: the held-out stream.
        progress, desc: a progress bar over the candidates.

    Returns:
        ``(index of the best candidate, cumulative log predictive of each candidate)``; a
        candidate whose update fails with a ``ValueError`` (e.g. a step size that makes the
        state non-finite) scores ``-inf``; if every candidate fails the last error is raised.
    """
    if len(candidates) == 0:
        raise ValueError("candidates: expected at least one, received none")
    scores = np.full(len(candidates), -np.inf)
    error: Exception | None = None
    for i, cand in enumerate(_progress(candidates, desc=desc, enabled=progress)):
        try:
            scores[i] = prequential(make_learner(cand), chunks).log_prob.sum()
        except ValueError as err:           # diverged: this candidate loses
            error = err
    if not np.isfinite(scores).any():
        raise error if error is not None else ValueError("no candidate gave a finite score")
    return int(np.argmax(scores)), scores
