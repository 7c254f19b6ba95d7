"""Continual-learning protocols of the papers as lists of :class:`~ppl_cl.batch.Batch` objects.

* :func:`split_tasks` -- Split MNIST (Zenke et al. 2017; VAR-GP Sect. 5): tasks of class
  groups, single head (labels keep their global values);
* :func:`permuted_tasks` -- Permuted MNIST (VAR-GP Sect. 5): one fixed pixel permutation per
  task, the first task unpermuted;
* :func:`class_incremental_sessions` -- few-shot class-incremental learning (Tao et al. 2020;
  GP-Tree Sect. 5.3 and App. C.3): a base session, then ``n_ways``-way ``n_shots``-shot
  sessions, each tested on all classes seen so far;
* :func:`sorted_batches` -- VIPS' streaming UCI protocol (Sect. 5.3): sort by one input
  column, cut into consecutive batches;
* :func:`online_chunks`, :func:`task_stream` -- online continual learning (Kalman OCL paper,
  Sect. 4.2): a stream of small chunks; tasks concatenated with boundaries kept for plots
  but not given to the learner;
* :func:`validation_split` -- VAR-GP reference validation set (last ``n_valid`` of a random
  permutation);
* :func:`uci_stream` (with :func:`stream_order`, :func:`cut_batches`) -- the VIPS reference's
  sorted batches of a UCI set, each cut into train / test parts (``load_data``);
* :class:`Unit`, :class:`Stream`, :func:`per_class`, :func:`class_units` -- a stream as
  ``ppl-cl compare`` feeds it (ppl_cl/experiments/compare.py builds them).

Inputs may be NumPy arrays, torch tensors or JAX arrays; rows and columns are selected in the
array's own library (a GPU tensor stays on its device), only the labels / the sort column are
read on the host. Every random choice takes an explicit ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np

from ppl_cl.batch import Batch, array_backend, as_numpy
from ppl_cl.seeding import as_generator

__all__ = [
    "TaskSplit", "split_tasks", "task_permutations", "permuted_tasks",
    "class_incremental_sessions", "sorted_batches", "online_chunks", "TaskStream", "task_stream",
    "validation_split", "SPLIT_MNIST_CLASS_GROUPS", "SORTS", "stream_order", "cut_batches",
    "uci_stream", "Unit", "Stream", "per_class", "class_units",
]

SPLIT_MNIST_CLASS_GROUPS: tuple[tuple[int, ...], ...] = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
"""The five digit pairs of Split MNIST, in order."""


class TaskSplit(NamedTuple):
    """One task of a continual protocol.

    Attributes:
        train: the task's training batch (``task_id`` set).
        test: the task's test batch (``task_id`` set).
        task_id: index of the task / session.
        classes: the classes the task introduces (``None`` when every task has all classes,
            as in Permuted MNIST).
    """

    train: Batch
    test: Batch
    task_id: int
    classes: tuple[int, ...] | None


# -- backend-neutral helpers ----------------------------------------------------------------

def _take(a: Any, index: np.ndarray, axis: int = 0) -> Any:
    """``a`` indexed by the integer array ``index`` along ``axis``, in ``a``'s own library."""
    index = np.asarray(index, dtype=np.int64)
    kind = array_backend(a)
    if kind == "torch":
        import torch

        return torch.index_select(a, axis, torch.as_tensor(index, device=a.device))
    if kind == "jax":
        import jax.numpy as jnp

        return jnp.take(a, jnp.asarray(index), axis=axis)
    return np.take(np.asarray(a), index, axis=axis)


def _concat(arrays: Sequence[Any]) -> Any:
    """Concatenate along rows in the arrays' common library."""
    kinds = {array_backend(a) for a in arrays}
    if len(kinds) != 1:
        raise TypeError(f"tasks: expected arrays of one library, received {sorted(kinds)}")
    kind = kinds.pop()
    if kind == "torch":
        import torch

        return torch.cat(list(arrays), dim=0)
    if kind == "jax":
        import jax.numpy as jnp

        return jnp.concatenate(list(arrays), axis=0)
    return np.concatenate([np.asarray(a) for a in arrays], axis=0)


def _as_pair(x: Any, y: Any, name: str) -> Batch:
    """Structural check of one ``(x (n, d), y (n,))`` pair through :class:`Batch`."""
    try:
        batch = Batch(x, y)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{name}: {err}") from err
    if batch.y is None:
        raise ValueError(f"{name}: expected targets y, received None")
    return batch


def _labels(y: Any, name: str) -> np.ndarray:
    """Integer class labels on the host."""
    labels = as_numpy(y)
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"{name}: expected integer class labels, received dtype {labels.dtype}")
    return labels


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, received {value!r}")
    return int(value)


def _subset(batch: Batch, index: np.ndarray, task_id: int | None) -> Batch:
    return Batch(_take(batch.x, index), _take(batch.y, index), task_id)


# -- Split MNIST ---------------------------------------------------------------------------

def split_tasks(x_train: Any, y_train: Any, x_test: Any, y_test: Any,
                class_groups: Sequence[Sequence[int]] = SPLIT_MNIST_CLASS_GROUPS
                ) -> list[TaskSplit]:
    """Split-MNIST-style tasks: task ``t`` holds the examples of the classes ``class_groups[t]``.

    Single head (Zenke et al. 2017; VAR-GP Sect. 5, "Split MNIST"): labels keep their global
    values (a 10-way classifier sees digits 2/3 as labels 2/3, not 0/1). Rows keep their
    original order within each task.

    Args:
        x_train, y_train: training inputs ``(n, d)`` and integer labels ``(n,)``.
        x_test, y_test: test inputs ``(m, d)`` and integer labels ``(m,)``.
        class_groups: disjoint, non-empty groups of class labels, one per task.

    Returns:
        One :class:`TaskSplit` per group, ``classes`` = the group.

    Raises:
        ValueError: empty or overlapping groups, or a class missing from the train or test set.
    """
    train = _as_pair(x_train, y_train, "x_train/y_train")
    test = _as_pair(x_test, y_test, "x_test/y_test")
    if train.input_dim != test.input_dim:
        raise ValueError(f"x_test: expected shape (m, {train.input_dim}) (as x_train), received "
                         f"{tuple(test.x.shape)}")
    groups = [tuple(int(c) for c in g) for g in class_groups]
    if not groups:
        raise ValueError("class_groups: expected at least one group, received none")
    seen: dict[int, int] = {}
    for t, g in enumerate(groups):
        if not g:
            raise ValueError(f"class_groups: group {t} is empty")
        for c in g:
            if c in seen:
                raise ValueError(f"class_groups: class {c} appears in groups {seen[c]} and {t}; "
                                 "groups must be disjoint")
            seen[c] = t
    y_tr, y_te = _labels(train.y, "y_train"), _labels(test.y, "y_test")
    for name, labels in (("y_train", y_tr), ("y_test", y_te)):
        missing = sorted(set(seen) - set(np.unique(labels).tolist()))
        if missing:
            raise ValueError(f"class_groups: classes {missing} have no examples in {name}")
    out = []
    for t, g in enumerate(groups):
        idx_tr = np.flatnonzero(np.isin(y_tr, g))
        idx_te = np.flatnonzero(np.isin(y_te, g))
        out.append(TaskSplit(_subset(train, idx_tr, t), _subset(test, idx_te, t), t, g))
    return out


# -- Permuted MNIST ------------------------------------------------------------------------

def task_permutations(input_dim: int, n_tasks: int = 10, seed: int | np.random.Generator = 0,
                      first_unpermuted: bool = True) -> np.ndarray:
    """The input permutations of :func:`permuted_tasks`, shape ``(n_tasks, input_dim)``.

    Permutation ``t`` is the ``t``-th draw of ``rng.permutation(input_dim)`` with
    ``rng = default_rng(seed)``; with ``first_unpermuted`` the first is replaced by the
    identity, so tasks ``1..n_tasks-1`` do not depend on that flag.
    """
    d = _check_int(input_dim, "input_dim", 1)
    T = _check_int(n_tasks, "n_tasks", 1)
    rng = as_generator(seed)
    perms = np.stack([rng.permutation(d) for _ in range(T)])
    if first_unpermuted:
        perms[0] = np.arange(d)
    return perms


def permuted_tasks(x_train: Any, y_train: Any, x_test: Any, y_test: Any, n_tasks: int = 10,
                   seed: int | np.random.Generator = 0, first_unpermuted: bool = True
                   ) -> list[TaskSplit]:
    """Permuted-MNIST tasks (VAR-GP Sect. 5, "Permuted MNIST").

    Task ``t`` is the whole data set with its input features reordered by one fixed
    permutation ``pi_t`` (:func:`task_permutations`): ``x_t[:, j] = x[:, pi_t[j]]``, the same
    ``pi_t`` for train and test. The first task is unpermuted by default (the paper's upper
    bound on later tasks). Labels are unchanged.

    Args:
        x_train, y_train, x_test, y_test: as in :func:`split_tasks` (labels may be any
            targets; they are passed through).
        n_tasks: number of tasks (paper: 10).
        seed: seed of the permutations.
        first_unpermuted: task 0 uses the identity permutation.

    Returns:
        ``n_tasks`` :class:`TaskSplit` objects with ``classes=None``.
    """
    train = _as_pair(x_train, y_train, "x_train/y_train")
    test = _as_pair(x_test, y_test, "x_test/y_test")
    if train.input_dim != test.input_dim:
        raise ValueError(f"x_test: expected shape (m, {train.input_dim}) (as x_train), received "
                         f"{tuple(test.x.shape)}")
    perms = task_permutations(train.input_dim, n_tasks, seed, first_unpermuted)
    return [TaskSplit(Batch(_take(train.x, p, axis=1), train.y, t),
                      Batch(_take(test.x, p, axis=1), test.y, t), t, None)
            for t, p in enumerate(perms)]


# -- few-shot class-incremental sessions -----------------------------------------------------

def class_incremental_sessions(x_train: Any, y_train: Any, x_test: Any, y_test: Any,
                               n_base_classes: int, n_ways: int, n_shots: int, n_sessions: int,
                               seed: int | np.random.Generator = 0,
                               class_order: Sequence[int] | None = None) -> list[TaskSplit]:
    """Few-shot class-incremental sessions (Tao et al. 2020; GP-Tree Sect. 5.3, App. C.3).

    Session 0 holds all training examples of the first ``n_base_classes`` classes of
    ``class_order``; session ``s = 1..n_sessions`` holds ``n_shots`` training examples of each
    of the next ``n_ways`` classes. The test batch of session ``s`` holds every test example
    of all classes seen up to and including session ``s``. CUB: 100 base classes and 10
    sessions of 10-way 5-shot; mini-ImageNet: 60 base and 8 sessions of 5-way 5-shot.

    Choices: Tao et al. fix the shots by index files; here they are drawn uniformly without
    replacement from each novel class's training examples with ``seed`` (rows then kept in
    data order). ``class_order`` defaults to the sorted labels of the training set (the
    benchmarks' convention of "the first 100 classes").

    Args:
        x_train, y_train, x_test, y_test: as in :func:`split_tasks`.
        n_base_classes: classes of session 0 (>= 1).
        n_ways: new classes per incremental session (>= 1).
        n_shots: training examples per new class (>= 1).
        n_sessions: number of incremental sessions after the base session (>= 0); the result
            has ``n_sessions + 1`` entries.
        seed: seed of the shot selection.
        class_order: order in which classes arrive (distinct labels present in the data).

    Returns:
        ``n_sessions + 1`` :class:`TaskSplit` objects; ``classes`` = the classes introduced
        by the session.
    """
    train = _as_pair(x_train, y_train, "x_train/y_train")
    test = _as_pair(x_test, y_test, "x_test/y_test")
    if train.input_dim != test.input_dim:
        raise ValueError(f"x_test: expected shape (m, {train.input_dim}) (as x_train), received "
                         f"{tuple(test.x.shape)}")
    n_base = _check_int(n_base_classes, "n_base_classes", 1)
    ways = _check_int(n_ways, "n_ways", 1)
    shots = _check_int(n_shots, "n_shots", 1)
    sessions = _check_int(n_sessions, "n_sessions", 0)
    y_tr, y_te = _labels(train.y, "y_train"), _labels(test.y, "y_test")
    present = np.unique(y_tr)
    order = present if class_order is None else np.asarray([int(c) for c in class_order])
    if len(set(order.tolist())) != len(order):
        raise ValueError("class_order: expected distinct classes, received duplicates")
    needed = n_base + ways * sessions
    if needed > len(order):
        raise ValueError(f"n_base_classes + n_ways * n_sessions = {needed} classes needed, "
                         f"but only {len(order)} are available")
    order = order[:needed]
    for name, labels in (("y_train", y_tr), ("y_test", y_te)):
        missing = sorted(set(order.tolist()) - set(np.unique(labels).tolist()))
        if missing:
            raise ValueError(f"classes {missing} have no examples in {name}")
    counts = {int(c): int((y_tr == c).sum()) for c in order[n_base:]}
    short = {c: k for c, k in counts.items() if k < shots}
    if short:
        raise ValueError(f"n_shots: expected at least {shots} training examples per novel class, "
                         f"classes {sorted(short)} have {sorted(set(short.values()))}")
    rng = as_generator(seed)
    out = []
    base = tuple(int(c) for c in order[:n_base])
    idx_tr = np.flatnonzero(np.isin(y_tr, base))
    idx_te = np.flatnonzero(np.isin(y_te, base))
    out.append(TaskSplit(_subset(train, idx_tr, 0), _subset(test, idx_te, 0), 0, base))
    for s in range(1, sessions + 1):
        new = tuple(int(c) for c in order[n_base + (s - 1) * ways: n_base + s * ways])
        picks = [np.sort(rng.choice(np.flatnonzero(y_tr == c), size=shots, replace=False))
                 for c in new]
        idx_tr = np.sort(np.concatenate(picks))
        seen = order[: n_base + s * ways]
        idx_te = np.flatnonzero(np.isin(y_te, seen))
        out.append(TaskSplit(_subset(train, idx_tr, s), _subset(test, idx_te, s), s, new))
    return out


# -- streaming batches ---------------------------------------------------------------------

def sorted_batches(x: Any, y: Any, column: int = 0, n_batches: int = 20) -> list[Batch]:
    """VIPS' streaming protocol (Sect. 5.3): sort rows by ``x[:, column]``, cut into batches.

    The sort is stable (ties keep their order); ``n`` rows are cut into ``n_batches``
    consecutive batches whose sizes differ by at most one (the first ``n % n_batches`` batches
    get one extra row, as ``numpy.array_split``). ``task_id`` is the batch index.

    Args:
        x: inputs ``(n, d)``; y: targets ``(n,)``.
        column: the sort column (negative indices count from the end).
        n_batches: number of batches, ``1 <= n_batches <= n`` (paper: 20; 50 for bike and
            elevators; 10 for the synthetic sets, 4 for Fig. 2a).

    Returns:
        ``n_batches`` :class:`Batch` objects covering every row exactly once.
    """
    data = _as_pair(x, y, "x/y")
    n, d = data.x.shape
    if isinstance(column, bool) or not isinstance(column, (int, np.integer)) or not -d <= column < d:
        raise ValueError(f"column: expected an int in {-d}..{d - 1} (x has {d} columns), "
                         f"received {column!r}")
    B = _check_int(n_batches, "n_batches", 1)
    if B > n:
        raise ValueError(f"n_batches: expected at most n = {n} (one row per batch), received {B}")
    key = as_numpy(_take(data.x, np.asarray([column % d]), axis=1)).reshape(-1)
    order = np.argsort(key, kind="stable")
    return [_subset(data, idx, b) for b, idx in enumerate(np.array_split(order, B))]


def online_chunks(x: Any, y: Any, chunk_size: int = 10, shuffle: bool = False,
                  seed: int | np.random.Generator = 0) -> list[Batch]:
    """Cut a data stream into consecutive chunks (Kalman OCL Sect. 4.2, App. D.2).

    Rows are taken in their order (or in one random order with ``shuffle``, the stationary
    CIFAR-100 protocol); every chunk has ``chunk_size`` rows except possibly the last.
    Chunks carry no ``task_id``: an online learner is not told about tasks.

    Args:
        x: inputs ``(n, d)``; y: targets ``(n,)``.
        chunk_size: rows per chunk (>= 1; paper: 10 for CIFAR-100, 128 for CLOC).
        shuffle: shuffle the rows once before chunking.
        seed: seed of the shuffle.

    Returns:
        ``ceil(n / chunk_size)`` :class:`Batch` objects.
    """
    data = _as_pair(x, y, "x/y")
    b = _check_int(chunk_size, "chunk_size", 1)
    n = len(data)
    order = as_generator(seed).permutation(n) if shuffle else np.arange(n)
    return [_subset(data, order[i: i + b], None) for i in range(0, n, b)]


class TaskStream(NamedTuple):
    """A non-stationary stream made of concatenated tasks.

    Attributes:
        chunks: the stream's chunks (no ``task_id``; chunks may straddle a task boundary).
        task_starts: index of the first point of each task in the stream, ``(n_tasks,)``
            (``task_starts[0] = 0``); for plots such as the Kalman paper's Fig. 2.
        task_index: task of every point of the stream, ``(N,)``.
    """

    chunks: list[Batch]
    task_starts: np.ndarray
    task_index: np.ndarray


def task_stream(tasks: Sequence[tuple[Any, Any] | Batch | TaskSplit], chunk_size: int = 10,
                shuffle_within_tasks: bool = False, seed: int | np.random.Generator = 0
                ) -> TaskStream:
    """The task-agnostic non-stationary stream (Kalman OCL Sect. 4.2, after Lee et al. 2020).

    Tasks are concatenated in order (e.g. Split CIFAR-100: 10 tasks of 10 classes) and the
    result is cut into chunks of ``chunk_size`` rows like :func:`online_chunks`. The task
    boundaries are returned for evaluation and plots but are not put in the chunks.

    Args:
        tasks: ``(x, y)`` pairs, :class:`Batch` objects or :class:`TaskSplit` objects (their
            ``train`` batch is used), all with the same input dimension and array library.
        chunk_size: rows per chunk (>= 1).
        shuffle_within_tasks: shuffle the rows of each task (not across tasks).
        seed: seed of the shuffles.

    Returns:
        :class:`TaskStream`.
    """
    b = _check_int(chunk_size, "chunk_size", 1)
    if len(tasks) == 0:
        raise ValueError("tasks: expected at least one task, received none")
    batches = []
    for t, task in enumerate(tasks):
        if isinstance(task, TaskSplit):
            task = task.train
        if isinstance(task, Batch):
            batch = _as_pair(task.x, task.y, f"tasks[{t}]")
        else:
            try:
                x, y = task
            except (TypeError, ValueError) as err:
                raise TypeError(f"tasks[{t}]: expected an (x, y) pair, a Batch or a TaskSplit, "
                                f"received {type(task).__name__}") from err
            batch = _as_pair(x, y, f"tasks[{t}]")
        if batches and batch.input_dim != batches[0].input_dim:
            raise ValueError(f"tasks[{t}]: expected inputs of shape (n, {batches[0].input_dim}) "
                             f"(as tasks[0]), received {tuple(batch.x.shape)}")
        batches.append(batch)
    rng = as_generator(seed)
    if shuffle_within_tasks:
        batches = [_subset(bt, rng.permutation(len(bt)), None) for bt in batches]
    sizes = np.asarray([len(bt) for bt in batches], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    index = np.repeat(np.arange(len(batches), dtype=np.int64), sizes)
    whole = Batch(_concat([bt.x for bt in batches]), _concat([bt.y for bt in batches]))
    chunks = [_subset(whole, np.arange(i, min(i + b, len(whole))), None)
              for i in range(0, len(whole), b)]
    return TaskStream(chunks, starts, index)


# -- validation split ---------------------------------------------------------------------------

def validation_split(x: Any, y: Any, n_valid: int, seed: int | np.random.Generator = 0
                     ) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """Hold out a validation set: the last ``n_valid`` rows of a random permutation.

    As the VAR-GP reference code (10000 of the MNIST training set). The training part is the
    first ``n - n_valid`` rows of the same permutation, in permutation order.

    Args:
        x: inputs ``(n, d)``; y: targets ``(n,)``.
        n_valid: validation size, ``1 <= n_valid < n``.
        seed: seed of the permutation.

    Returns:
        ``((x_train, y_train), (x_valid, y_valid))`` in the inputs' array library.
    """
    data = _as_pair(x, y, "x/y")
    n = len(data)
    k = _check_int(n_valid, "n_valid", 1)
    if k >= n:
        raise ValueError(f"n_valid: expected less than n = {n} (training part must be non-empty), "
                         f"received {k}")
    perm = as_generator(seed).permutation(n)
    tr, va = perm[: n - k], perm[n - k:]
    return (_take(data.x, tr), _take(data.y, tr)), (_take(data.x, va), _take(data.y, va))


# -- the VIPS reference's UCI stream ------------------------------------------------------------

#: how rows tied in the first input are ordered (:func:`stream_order`)
SORTS = ("stable", "numpy", "none")


def stream_order(x: np.ndarray, sort: str = "stable") -> np.ndarray:
    """The row order of the stream: rows sorted by the first input.

    ``"stable"`` (default): ties in the first input keep their file order (a stable sort, the
    same on every machine). ``"numpy"``: NumPy's default ``argsort`` (introsort, the
    reference's call), whose order of tied rows depends on the NumPy build and the CPU
    (concrete's first input has 278 distinct values in 1030 rows, and the reference's order
    there is in ``tests/ppl_cl/experiments/data/concrete_reference_order.txt``). ``"none"``:
    file order.
    """
    if sort == "stable":
        return np.argsort(x[:, 0], kind="stable")
    if sort == "numpy":
        return np.argsort(x[:, 0])
    if sort == "none":
        return np.arange(x.shape[0])
    raise ValueError(f"sort: expected one of {', '.join(SORTS)}, received {sort!r}")


def cut_batches(order: np.ndarray, n_batches: int) -> list[np.ndarray]:
    """The rows of ``n_batches`` consecutive batches of ``order``: ``N // n_batches`` rows each,
    the last also taking the remainder (the reference's ``divide_batches*`` and the synthetic
    scripts' ``div_data``)."""
    N = order.shape[0]
    B = int(n_batches)
    if not 1 <= B <= N:
        raise ValueError(f"n_batches: expected 1..{N}, received {n_batches!r}")
    size = N // B
    return [order[b * size:(b + 1) * size] if b < B - 1 else order[(B - 1) * size:]
            for b in range(B)]


def uci_stream(x: np.ndarray, y: np.ndarray, n_batches: int, n_folds: int, seed: int = 0,
               order: np.ndarray | str = "stable"):
    """Per fold, the train and test parts of each batch, as the reference's ``load_data``
    (``divide_batches_kfolds``; ``divide_batches`` when ``n_folds == 1``).

    Rows are taken in ``order`` (a permutation of the rows, or a :func:`stream_order` name)
    and cut into ``n_batches`` consecutive batches of ``N // n_batches`` rows, the last taking
    the remainder as well. Each batch is shuffled by one ``RandomState(seed)`` drawn in batch
    order (the reference's ``np.random.seed(0)``); ``n_folds >= 2``: the contiguous KFold parts
    of the shuffled batch (``KFold(shuffle=False)``; fold k tests on part k and trains on the
    rest); ``n_folds == 1``: the first ``int((N // n_batches) * 0.8)`` rows of every shuffled
    batch train and the rest test (the last batch's extra rows all go to its test part).

    Returns:
        ``folds[k] = (train_batches, test_batches)``, lists of ``(x, y)``.
    """
    x, y = np.asarray(x), np.asarray(y)
    N = x.shape[0]
    order = stream_order(x, order) if isinstance(order, str) else np.asarray(order)
    if order.shape != (N,) or not np.array_equal(np.sort(order), np.arange(N)):
        raise ValueError(f"order: expected a permutation of the {N} rows")
    batches = cut_batches(order, n_batches)
    size = N // len(batches)
    rng = np.random.RandomState(seed)
    K = max(n_folds, 1)
    folds = [([], []) for _ in range(K)]
    for rows in batches:
        rows = rows[rng.permutation(rows.shape[0])]
        bx, by = x[rows], y[rows]
        if n_folds >= 2:
            parts = np.array_split(np.arange(bx.shape[0]), n_folds)   # sklearn KFold's sizes
            for k in range(n_folds):
                test = parts[k]
                train = np.setdiff1d(np.arange(bx.shape[0]), test)
                folds[k][0].append((bx[train], by[train]))
                folds[k][1].append((bx[test], by[test]))
        else:
            n_tr = int(size * 0.8)
            folds[0][0].append((bx[:n_tr], by[:n_tr]))
            folds[0][1].append((bx[n_tr:], by[n_tr:]))
    return folds


# -- the streams of ppl-cl compare -------------------------------------------------------------

class Unit(NamedTuple):
    """One task / session / batch: ``train`` and ``test`` batches; ``task_id`` is passed to
    ``update`` and ``predict`` of task-aware learners (multi-task regression), else None."""

    train: Batch
    test: Batch
    task_id: int | None = None


@dataclass(frozen=True)
class Stream:
    """A stream as the comparison feeds it.

    Attributes:
        name, kind: ``"classification"`` or ``"regression"``.
        units: the :class:`Unit` list, in order.
        num_classes: K (classification).
        online: only chunk learners take it (the Kalman OCL streams).
        multitask: units are tasks with ids (GP-ELLA's streams).
        new_classes: every unit brings classes no earlier unit had (class-incremental).
        size: what was kept, in words (for the report).
    """

    name: str
    kind: str
    units: list
    num_classes: int = 0
    online: bool = False
    multitask: bool = False
    new_classes: bool = False
    size: str = ""

    @property
    def input_dim(self) -> int:
        return int(self.units[0].train.x.shape[1])


def per_class(x, y, n: int, rng: np.random.Generator):
    """At most ``n`` rows of each class (0: all), in data order."""
    if n <= 0:
        return x, y
    keep = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:n] for c in np.unique(y)])
    keep.sort()
    return x[keep], y[keep]


def class_units(xtr, ytr, xte, yte, groups, n_train: int, n_test: int, seed: int) -> list:
    """The :func:`split_tasks` of ``groups`` as :class:`Unit` objects, each class cut to at most
    ``n_train`` training and ``n_test`` test rows (:func:`per_class`; one generator seeded by
    ``seed``), inputs as float32."""
    rng = np.random.default_rng(seed)
    out = []
    for t in split_tasks(xtr, ytr, xte, yte, groups):
        tx, ty = per_class(np.asarray(t.train.x), np.asarray(t.train.y), n_train, rng)
        sx, sy = per_class(np.asarray(t.test.x), np.asarray(t.test.y), n_test, rng)
        out.append(Unit(Batch(tx.astype(np.float32), ty), Batch(sx.astype(np.float32), sy)))
    return out
