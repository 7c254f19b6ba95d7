"""Tests of ppl_cl.data.streams: the papers' protocols on scikit-learn's bundled 8x8 digits."""

from __future__ import annotations

import numpy as np
import pytest

from ppl_cl.data import streams as St


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float64)
    y = y.astype(np.int64)
    return x[:1200], y[:1200], x[1200:], y[1200:]


def _rows(a: np.ndarray) -> set[bytes]:
    return {r.tobytes() for r in np.ascontiguousarray(a)}


# -- split tasks -----------------------------------------------------------------------------------

def test_split_tasks_classes_single_head_and_no_overlap(digits):
    x_tr, y_tr, x_te, y_te = digits
    tasks = St.split_tasks(x_tr, y_tr, x_te, y_te)
    assert len(tasks) == 5
    for t, task in enumerate(tasks):
        group = St.SPLIT_MNIST_CLASS_GROUPS[t]
        assert task.task_id == t and task.classes == group
        assert task.train.task_id == t and task.test.task_id == t
        # single head: labels keep their global values
        assert set(np.unique(task.train.y)) == set(group) == set(np.unique(task.test.y))
        # exactly the rows of these classes, in data order
        np.testing.assert_array_equal(task.train.x, x_tr[np.isin(y_tr, group)])
        np.testing.assert_array_equal(task.test.y, y_te[np.isin(y_te, group)])
    assert sum(len(t.train) for t in tasks) == len(y_tr)
    assert sum(len(t.test) for t in tasks) == len(y_te)


def test_split_tasks_custom_groups_and_errors(digits):
    x_tr, y_tr, x_te, y_te = digits
    tasks = St.split_tasks(x_tr, y_tr, x_te, y_te, class_groups=[(3,), (1, 7, 9)])
    assert [t.classes for t in tasks] == [(3,), (1, 7, 9)]
    assert len(tasks[0].train) == int((y_tr == 3).sum())
    with pytest.raises(ValueError, match="class 1 appears in groups 0 and 1"):
        St.split_tasks(x_tr, y_tr, x_te, y_te, class_groups=[(0, 1), (1, 2)])
    with pytest.raises(ValueError, match=r"classes \[11\] have no examples in y_train"):
        St.split_tasks(x_tr, y_tr, x_te, y_te, class_groups=[(0, 11)])
    with pytest.raises(ValueError, match="group 1 is empty"):
        St.split_tasks(x_tr, y_tr, x_te, y_te, class_groups=[(0,), ()])
    with pytest.raises(ValueError, match="x_test"):
        St.split_tasks(x_tr, y_tr, x_te[:, :10], y_te)
    with pytest.raises(TypeError, match="integer class labels"):
        St.split_tasks(x_tr, y_tr.astype(float), x_te, y_te)


def test_split_tasks_keeps_torch_and_jax_arrays(digits):
    import jax.numpy as jnp
    import torch

    x_tr, y_tr, x_te, y_te = digits
    tasks = St.split_tasks(torch.as_tensor(x_tr), torch.as_tensor(y_tr), jnp.asarray(x_te),
                           jnp.asarray(y_te), class_groups=[(0, 1)])
    assert isinstance(tasks[0].train.x, torch.Tensor) and isinstance(tasks[0].train.y, torch.Tensor)
    assert type(tasks[0].test.x).__module__.startswith("jax")
    np.testing.assert_array_equal(tasks[0].train.x.numpy(), x_tr[np.isin(y_tr, (0, 1))])
    np.testing.assert_array_equal(np.asarray(tasks[0].test.y), y_te[np.isin(y_te, (0, 1))])


# -- permuted tasks --------------------------------------------------------------------------------

def test_permuted_tasks_same_permutation_for_train_and_test(digits):
    x_tr, y_tr, x_te, y_te = digits
    tasks = St.permuted_tasks(x_tr, y_tr, x_te, y_te, n_tasks=4, seed=3)
    perms = St.task_permutations(64, n_tasks=4, seed=3)
    assert len(tasks) == 4 and all(t.classes is None for t in tasks)
    np.testing.assert_array_equal(perms[0], np.arange(64))  # first task unpermuted
    np.testing.assert_array_equal(tasks[0].train.x, x_tr)
    for t, task in enumerate(tasks):
        assert sorted(perms[t]) == list(range(64))
        np.testing.assert_array_equal(task.train.x, x_tr[:, perms[t]])
        np.testing.assert_array_equal(task.test.x, x_te[:, perms[t]])
        np.testing.assert_array_equal(task.train.y, y_tr)
        np.testing.assert_array_equal(task.test.y, y_te)
        assert task.task_id == task.train.task_id == t
    assert len({p.tobytes() for p in perms}) == 4


def test_permutations_seeded_and_flag_only_changes_task_zero():
    a = St.task_permutations(64, 5, seed=1)
    np.testing.assert_array_equal(a, St.task_permutations(64, 5, seed=1))
    assert not np.array_equal(a[1:], St.task_permutations(64, 5, seed=2)[1:])
    b = St.task_permutations(64, 5, seed=1, first_unpermuted=False)
    np.testing.assert_array_equal(a[1:], b[1:])
    assert not np.array_equal(b[0], np.arange(64))
    with pytest.raises(ValueError, match="n_tasks"):
        St.task_permutations(64, 0)


# -- few-shot class-incremental sessions ----------------------------------------------------------

def test_class_incremental_sessions_protocol(digits):
    x_tr, y_tr, x_te, y_te = digits
    sessions = St.class_incremental_sessions(x_tr, y_tr, x_te, y_te, n_base_classes=4, n_ways=2,
                                             n_shots=5, n_sessions=3, seed=0)
    assert len(sessions) == 4
    base = sessions[0]
    assert base.classes == (0, 1, 2, 3) and base.task_id == 0
    np.testing.assert_array_equal(base.train.x, x_tr[np.isin(y_tr, (0, 1, 2, 3))])
    train_rows = _rows(x_tr)
    seen = {0, 1, 2, 3}
    for s in range(1, 4):
        sess = sessions[s]
        new = (4 + 2 * (s - 1), 5 + 2 * (s - 1))
        assert sess.classes == new and sess.task_id == s == sess.train.task_id
        assert np.bincount(sess.train.y, minlength=10)[list(new)].tolist() == [5, 5]
        assert len(sess.train) == 10
        assert _rows(sess.train.x) <= train_rows  # real training examples
        for xi, yi in zip(sess.train.x, sess.train.y):  # ... with their own labels
            assert yi in y_tr[np.all(x_tr == xi, axis=1)]
        seen |= set(new)
        assert set(np.unique(sess.test.y)) == seen  # test covers all classes seen so far
        assert len(sess.test) == int(np.isin(y_te, list(seen)).sum())


def test_class_incremental_sessions_seed_order_and_errors(digits):
    x_tr, y_tr, x_te, y_te = digits
    kw = dict(n_base_classes=4, n_ways=2, n_shots=5, n_sessions=3)
    a = St.class_incremental_sessions(x_tr, y_tr, x_te, y_te, seed=0, **kw)
    b = St.class_incremental_sessions(x_tr, y_tr, x_te, y_te, seed=0, **kw)
    c = St.class_incremental_sessions(x_tr, y_tr, x_te, y_te, seed=1, **kw)
    np.testing.assert_array_equal(a[2].train.x, b[2].train.x)
    assert not np.array_equal(a[2].train.x, c[2].train.x)
    order = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]
    d = St.class_incremental_sessions(x_tr, y_tr, x_te, y_te, class_order=order, **kw)
    assert d[0].classes == (9, 8, 7, 6) and d[1].classes == (5, 4)
    assert set(np.unique(d[1].test.y)) == {9, 8, 7, 6, 5, 4}
    with pytest.raises(ValueError, match="12 classes needed"):
        St.class_incremental_sessions(x_tr, y_tr, x_te, y_te, n_base_classes=4, n_ways=2,
                                      n_shots=5, n_sessions=4)
    with pytest.raises(ValueError, match="n_shots"):
        St.class_incremental_sessions(x_tr, y_tr, x_te, y_te, n_base_classes=4, n_ways=2,
                                      n_shots=1000, n_sessions=1)
    with pytest.raises(ValueError, match="duplicates"):
        St.class_incremental_sessions(x_tr, y_tr, x_te, y_te, class_order=[0, 0, 1, 2, 3, 4, 5,
                                                                           6, 7, 8], **kw)
    with pytest.raises(ValueError, match="n_ways"):
        St.class_incremental_sessions(x_tr, y_tr, x_te, y_te, n_base_classes=4, n_ways=0,
                                      n_shots=5, n_sessions=1)


# -- sorted batches, chunks, task streams -----------------------------------------------------------

def test_sorted_batches_cover_every_row_once_in_order():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(103, 3))
    x[10:20, 1] = 0.5  # ties keep their order (stable sort)
    y = np.arange(103, dtype=np.float64)  # row ids
    batches = St.sorted_batches(x, y, column=1, n_batches=10)
    assert [len(b) for b in batches] == [11, 11, 11] + [10] * 7
    assert [b.task_id for b in batches] == list(range(10))
    ids = np.concatenate([b.y for b in batches]).astype(int)
    np.testing.assert_array_equal(np.sort(ids), np.arange(103))  # every row exactly once
    np.testing.assert_array_equal(ids, np.argsort(x[:, 1], kind="stable"))
    key = np.concatenate([b.x[:, 1] for b in batches])
    assert np.all(np.diff(key) >= 0)
    np.testing.assert_array_equal(np.concatenate([b.x for b in batches]), x[ids])
    last = St.sorted_batches(x, y, column=-1, n_batches=103)
    assert all(len(b) == 1 for b in last)


def test_sorted_batches_errors():
    x, y = np.zeros((5, 2)), np.zeros(5)
    with pytest.raises(ValueError, match="n_batches: expected at most n = 5"):
        St.sorted_batches(x, y, n_batches=6)
    with pytest.raises(ValueError, match="n_batches"):
        St.sorted_batches(x, y, n_batches=0)
    with pytest.raises(ValueError, match="column"):
        St.sorted_batches(x, y, column=2)
    with pytest.raises(ValueError, match="y: expected shape"):
        St.sorted_batches(x, np.zeros(4))


def test_online_chunks():
    x = np.arange(46, dtype=np.float64).reshape(23, 2)
    y = np.arange(23)
    chunks = St.online_chunks(x, y, chunk_size=5)
    assert [len(c) for c in chunks] == [5, 5, 5, 5, 3]
    assert all(c.task_id is None for c in chunks)
    np.testing.assert_array_equal(np.concatenate([c.y for c in chunks]), y)
    shuffled = St.online_chunks(x, y, chunk_size=5, shuffle=True, seed=2)
    order = np.concatenate([c.y for c in shuffled])
    assert sorted(order) == list(range(23)) and not np.array_equal(order, y)
    np.testing.assert_array_equal(np.concatenate([c.x for c in shuffled]), x[order])
    again = np.concatenate([c.y for c in St.online_chunks(x, y, 5, shuffle=True, seed=2)])
    np.testing.assert_array_equal(order, again)
    with pytest.raises(ValueError, match="chunk_size"):
        St.online_chunks(x, y, chunk_size=0)


def test_task_stream_concatenates_and_keeps_boundaries(digits):
    x_tr, y_tr, x_te, y_te = digits
    tasks = St.split_tasks(x_tr, y_tr, x_te, y_te, class_groups=[(0, 1), (2, 3), (4, 5)])
    stream = St.task_stream(tasks, chunk_size=16)
    sizes = [len(t.train) for t in tasks]
    np.testing.assert_array_equal(stream.task_starts, [0, sizes[0], sizes[0] + sizes[1]])
    np.testing.assert_array_equal(np.bincount(stream.task_index), sizes)
    y = np.concatenate([c.y for c in stream.chunks])
    np.testing.assert_array_equal(y, np.concatenate([t.train.y for t in tasks]))
    assert all(c.task_id is None for c in stream.chunks)
    assert all(len(c) == 16 for c in stream.chunks[:-1]) and len(stream.chunks[-1]) <= 16
    # (x, y) pairs work too, and shuffling stays within tasks
    pairs = [(t.train.x, t.train.y) for t in tasks]
    sh = St.task_stream(pairs, chunk_size=7, shuffle_within_tasks=True, seed=0)
    ys = np.concatenate([c.y for c in sh.chunks])
    for t, group in enumerate(((0, 1), (2, 3), (4, 5))):
        assert set(np.unique(ys[sh.task_index == t])) == set(group)
    assert not np.array_equal(ys, y)
    with pytest.raises(ValueError, match="chunk_size"):
        St.task_stream(pairs, chunk_size=0)
    with pytest.raises(ValueError, match=r"tasks\[1\]"):
        St.task_stream([pairs[0], (pairs[1][0][:, :5], pairs[1][1])])
    with pytest.raises(ValueError, match="at least one task"):
        St.task_stream([])


# -- validation split ------------------------------------------------------------------------------

def test_validation_split_is_last_of_a_permutation(digits):
    x, y = digits[0], digits[1]
    (x_tr, y_tr), (x_va, y_va) = St.validation_split(x, y, n_valid=200, seed=4)
    perm = np.random.default_rng(4).permutation(1200)
    np.testing.assert_array_equal(x_va, x[perm[-200:]])
    np.testing.assert_array_equal(y_tr, y[perm[:-200]])
    assert x_tr.shape == (1000, 64) and x_va.shape == (200, 64)
    # disjoint and covering: split row ids
    ids = np.arange(1200)
    (id_tr, _), (id_va, _) = St.validation_split(ids[:, None].astype(float), ids, 200, seed=4)
    assert set(id_tr[:, 0].astype(int)).isdisjoint(id_va[:, 0].astype(int))
    assert sorted(np.concatenate([id_tr[:, 0], id_va[:, 0]]).astype(int)) == list(range(1200))
    (_, _), (x_va2, _) = St.validation_split(x, y, n_valid=200, seed=5)
    assert not np.array_equal(x_va, x_va2)
    with pytest.raises(ValueError, match="n_valid"):
        St.validation_split(x, y, n_valid=1200)
    with pytest.raises(ValueError, match="n_valid"):
        St.validation_split(x, y, n_valid=0)
