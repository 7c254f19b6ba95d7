"""Evaluation metrics of the five papers (NumPy float64; inputs may be numpy / torch / jax).

Continual learning over T tasks (VAR-GP, GP-Tree) is summarized by the **accuracy matrix**

    R[i, j] = accuracy on the test set of task j after training on tasks 0..i,   R: (T, T).

Only the lower triangle ``j <= i`` enters :func:`average_accuracy`, :func:`forgetting` and
:func:`backward_transfer`; entries ``j > i`` (tasks not trained yet) may be NaN or hold
zero-shot accuracies and are ignored (:func:`ppl_cl.protocols.evaluate_tasks` fills one row of R
and of the entropy matrix); :func:`paired_accuracy_difference` compares two learners scored
on the same test points (a paired standard error of their average-accuracy difference).

Online learning (Kalman filter, Titsias et al. 2024) is summarized by running means of
per-point outcomes: :func:`average_online_accuracy` (eq. 14), :func:`cumulative_log_predictive`
and :func:`average_log_predictive` (Fig. 1 right). Regression (VIPS, GP-ELLA, exact GP) uses
:func:`rmse` and :func:`nlpd`; uncertainty is inspected with :func:`predictive_entropy_matrix`
(VAR-GP Fig. 3) and calibration with :func:`expected_calibration_error` (Guo et al. 2017).

Every function validates its inputs and raises ``ValueError`` / ``TypeError`` naming the
argument, what was expected and what was received.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ppl_cl.batch import as_numpy
from ppl_cl.predictive import CategoricalPredictive, GaussianPredictive

__all__ = [
    "average_accuracy",
    "final_average_accuracy",
    "forgetting",
    "backward_transfer",
    "paired_accuracy_difference",
    "average_online_accuracy",
    "cumulative_log_predictive",
    "average_log_predictive",
    "rmse",
    "nlpd",
    "nlpd_predictive",
    "predictive_entropy_matrix",
    "ReliabilityDiagram",
    "reliability_diagram_data",
    "expected_calibration_error",
]


# -- input checks --------------------------------------------------------------------------
def _float_array(a: Any, name: str) -> np.ndarray:
    arr = np.asarray(as_numpy(a))
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"{name}: expected a numeric array, received dtype {arr.dtype}")
    return arr.astype(np.float64)


def _vector(a: Any, name: str, *, allow_neg_inf: bool = False) -> np.ndarray:
    v = _float_array(a, name)
    if v.ndim != 1:
        raise ValueError(f"{name}: expected shape (n,), received {v.shape}")
    bad = np.isnan(v) | (np.isinf(v) if not allow_neg_inf else np.isposinf(v))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}: expected finite values, received {v[i]} at index {i} "
                         f"({int(bad.sum())} bad of {v.size})")
    return v


def _accuracy_matrix(R: Any, name: str = "accuracy_matrix") -> np.ndarray:
    """Check ``R: (T, T)`` with a finite lower triangle (diagonal included)."""
    R = _float_array(R, name)
    if R.ndim != 2 or R.shape[0] != R.shape[1] or R.shape[0] == 0:
        raise ValueError(f"{name}: expected a square matrix (T, T) with T >= 1, received shape "
                         f"{R.shape}")
    lower = np.tril(np.ones(R.shape, dtype=bool))
    bad = lower & ~np.isfinite(R)
    if bad.any():
        i, j = (int(k) for k in np.argwhere(bad)[0])
        raise ValueError(f"{name}: entries with j <= i must be finite (accuracy on task j after "
                         f"training on task i), received {R[i, j]} at [{i}, {j}]")
    return R


# -- accuracy matrix -------------------------------------------------------------------------
def average_accuracy(accuracy_matrix: Any) -> np.ndarray:
    """Average accuracy over the tasks seen so far, after each task.

    .. math::  A_i = \\frac{1}{i+1} \\sum_{j=0}^{i} R_{i,j}

    (Chaudhry et al. 2018, "Riemannian Walk", average accuracy A_k; the curve of VAR-GP Fig. 5
    of Kapoor et al. 2021, whose final value is their Table 1 "final average test accuracy").

    Args:
        accuracy_matrix: ``R`` of shape ``(T, T)``; entries above the diagonal are ignored.

    Returns:
        ``A`` of shape ``(T,)``.
    """
    R = _accuracy_matrix(accuracy_matrix)
    T = R.shape[0]
    lower = np.tril(np.ones((T, T), dtype=bool))
    return np.where(lower, R, 0.0).sum(axis=1) / np.arange(1, T + 1)


def final_average_accuracy(accuracy_matrix: Any) -> float:
    """``A_{T-1} = mean_j R[T-1, j]``: average accuracy over all tasks after the last one."""
    return float(average_accuracy(accuracy_matrix)[-1])


def forgetting(accuracy_matrix: Any, *, per_task: bool = False) -> float | np.ndarray:
    """Average forgetting after the last task (Chaudhry et al. 2018, eq. 3 of "Riemannian Walk").

    With the last task ``k = T-1``, the forgetting of an earlier task ``j < k`` is the drop from
    the best accuracy it ever had to the final one,

    .. math::  f_j = \\max_{j \\le l \\le k-1} R_{l,j} - R_{k,j},
               \\qquad F = \\frac{1}{k} \\sum_{j=0}^{k-1} f_j .

    The maximum runs over rows ``l >= j`` only: before task j is trained (``l < j``) its entries
    are unused by convention (see the module docstring).

    Args:
        accuracy_matrix: ``R`` of shape ``(T, T)``.
        per_task: return the vector ``f`` of shape ``(T-1,)`` instead of its mean.

    Returns:
        ``F`` (a float) — NaN when ``T == 1`` (no earlier task, forgetting is undefined) — or
        ``f`` of shape ``(T-1,)``.
    """
    R = _accuracy_matrix(accuracy_matrix)
    k = R.shape[0] - 1
    f = np.array([R[j:k, j].max() - R[k, j] for j in range(k)], dtype=np.float64)
    if per_task:
        return f
    return float(f.mean()) if k else math.nan


def backward_transfer(accuracy_matrix: Any) -> float:
    """Backward transfer (Lopez-Paz & Ranzato 2017, GEM, Sec. 4):

    .. math::  \\mathrm{BWT} = \\frac{1}{T-1} \\sum_{j=0}^{T-2} (R_{T-1,j} - R_{j,j}).

    Negative values mean forgetting. Returns NaN when ``T == 1`` (undefined).
    """
    R = _accuracy_matrix(accuracy_matrix)
    T = R.shape[0]
    if T == 1:
        return math.nan
    j = np.arange(T - 1)
    return float(np.mean(R[T - 1, j] - R[j, j]))


def paired_accuracy_difference(correct_a: Sequence[Any], correct_b: Sequence[Any],
                               clusters: Sequence[Any] | None = None) -> dict[str, float]:
    """Difference of two learners' average accuracy over the same tasks' test sets, with the
    standard error of the *paired* comparison.

    ``correct_a[t][i]`` says whether learner A classified test point ``i`` of task ``t``
    correctly (likewise B, on the same points). The average accuracy over the ``T`` tasks
    (Chaudhry et al. 2018; VAR-GP Table 1 after the last task) is ``A = sum_{t,i} w_ti c_ti``
    with ``w_ti = 1 / (T n_t)``, so the difference is ``D = sum_{t,i} w_ti d_ti``,
    ``d = c_a - c_b``. Points that share a cluster id (``clusters[t][i]``; Permuted MNIST scores
    the same test images under every task's permutation, so the image is the cluster) are one
    draw from the test distribution; by default every point is its own cluster. With cluster
    totals ``S_c = sum_{(t,i) in c} w_ti d_ti`` over ``C`` clusters, the cluster-robust
    variance of a total is ``Var(D) = C / (C - 1) sum_c (S_c - D / C)^2`` (conservative when
    tasks have different sizes). Points both learners get right, or both wrong, add nothing to
    it: the pairing removes the test set's own sampling noise, which the unpaired binomial
    standard error ``sqrt(sum_t (a_t (1 - a_t) + b_t (1 - b_t)) / n_t) / T`` (also returned,
    for comparison) keeps.

    Returns:
        ``difference`` (A - B), ``se``, ``z`` (``difference / se``, inf or nan when ``se`` is
        0), ``unpaired_se``, ``accuracy_a``, ``accuracy_b`` (all as fractions),
        ``a_only`` / ``b_only`` (points only A / only B got right), ``num_points``,
        ``num_clusters``.
    """
    if len(correct_a) != len(correct_b) or len(correct_a) == 0:
        raise ValueError(f"correct_a, correct_b: expected the same number (> 0) of tasks, "
                         f"received {len(correct_a)} and {len(correct_b)}")
    T = len(correct_a)
    if clusters is not None and len(clusters) != T:
        raise ValueError(f"clusters: expected {T} arrays (one per task), received {len(clusters)}")
    ca, cb, ids = [], [], []
    offset = 0
    for t in range(T):
        a, b = _vector(correct_a[t], f"correct_a[{t}]"), _vector(correct_b[t], f"correct_b[{t}]")
        if a.shape != b.shape or a.shape[0] == 0:
            raise ValueError(f"task {t}: expected the same number (> 0) of points for A and B, "
                             f"received {a.shape[0]} and {b.shape[0]}")
        for name, c in (("correct_a", a), ("correct_b", b)):
            if not np.isin(c, (0.0, 1.0)).all():
                raise ValueError(f"{name}[{t}]: expected booleans or 0/1 values")
        ca.append(a)
        cb.append(b)
        if clusters is None:
            ids.append(offset + np.arange(a.shape[0]))
            offset += a.shape[0]
        else:
            c = np.asarray(clusters[t]).reshape(-1)
            if c.shape != a.shape:
                raise ValueError(f"clusters[{t}]: expected {a.shape[0]} ids, received "
                                 f"{c.shape[0]}")
            ids.append(c)
    w = np.concatenate([np.full(a.shape[0], 1.0 / (T * a.shape[0])) for a in ca])
    a_all, b_all = np.concatenate(ca), np.concatenate(cb)
    wd = w * (a_all - b_all)
    _, inverse = np.unique(np.concatenate(ids), return_inverse=True)
    S = np.bincount(inverse, weights=wd)
    C, D = S.shape[0], float(wd.sum())
    se = math.sqrt(C / (C - 1) * float(((S - D / C) ** 2).sum())) if C > 1 else float("nan")
    acc_a = np.array([a.mean() for a in ca])
    acc_b = np.array([b.mean() for b in cb])
    n = np.array([a.shape[0] for a in ca], dtype=float)
    unpaired = math.sqrt(float(((acc_a * (1 - acc_a) + acc_b * (1 - acc_b)) / n).sum())) / T
    z = D / se if se > 0 else (float("nan") if D == 0 else math.copysign(math.inf, D))
    return {"difference": D, "se": se, "z": z, "unpaired_se": unpaired,
            "accuracy_a": float(acc_a.mean()), "accuracy_b": float(acc_b.mean()),
            "a_only": int(((a_all == 1) & (b_all == 0)).sum()),
            "b_only": int(((a_all == 0) & (b_all == 1)).sum()),
            "num_points": int(a_all.shape[0]), "num_clusters": int(C)}


# -- online (prequential) metrics -------------------------------------------------------------
def average_online_accuracy(correct: Any) -> np.ndarray:
    """Running accuracy of a prequential stream (eq. 14 of Titsias et al. 2024):

    .. math::  \\mathrm{acc}_o(n) = \\frac{1}{n} \\sum_{i=1}^{n} 1[\\hat y_i = y_i].

    With chunks of size b the paper's ``acc_o`` after chunk n is entry ``n b - 1`` of the result.

    Args:
        correct: ``(N,)`` booleans or 0/1 (prediction made before learning point i was right).

    Returns:
        ``acc_o`` of shape ``(N,)``.
    """
    c = _vector(correct, "correct")
    if not np.isin(c, (0.0, 1.0)).all():
        raise ValueError("correct: expected booleans or 0/1 values, received "
                         f"{c[~np.isin(c, (0.0, 1.0))][:3]}")
    return np.cumsum(c) / np.arange(1, c.shape[0] + 1)


def cumulative_log_predictive(log_probs: Any) -> np.ndarray:
    """Running sum ``L_n = sum_{i<=n} log p(y_i | y_{1:i-1})`` (prequential log-likelihood; minus
    the code length of prequential MDL used to select hyperparameters in Titsias et al. 2024,
    App. D). ``log_probs: (N,)`` (``-inf`` allowed, NaN not); returns ``(N,)``."""
    return np.cumsum(_vector(log_probs, "log_probs", allow_neg_inf=True))


def average_log_predictive(log_probs: Any) -> np.ndarray:
    """Running mean ``(1/n) sum_{i<=n} log p(y_i | y_{1:i-1})`` — the "accumulated average log
    predictive density" of Fig. 1 (right) of Titsias et al. 2024. ``(N,) -> (N,)``."""
    L = cumulative_log_predictive(log_probs)
    return L / np.arange(1, L.shape[0] + 1)


# -- regression --------------------------------------------------------------------------------
def rmse(y: Any, mean: Any) -> float:
    """Root mean squared error ``sqrt((1/n) sum_i (y_i - mu_i)^2)`` (VIPS Table 1, GP-ELLA
    Fig. 2). ``y: (n,)``; ``mean: (n,)`` or a :class:`~ppl_cl.predictive.GaussianPredictive`."""
    if isinstance(mean, GaussianPredictive):
        mean = mean.mean
    y = _vector(y, "y")
    mu = _vector(mean, "mean")
    if y.shape != mu.shape:
        raise ValueError(f"mean: expected shape {y.shape} (as y), received {mu.shape}")
    if y.shape[0] == 0:
        raise ValueError("y: expected at least one point, received an empty array")
    return float(np.sqrt(np.mean((y - mu) ** 2)))


def nlpd(y: Any, mean: Any, variance: Any) -> float:
    """Mean negative log predictive density of independent Gaussians (VIPS Sec. 5, NLPD):

    .. math::  \\mathrm{NLPD} = \\frac{1}{n} \\sum_i \\left[\\tfrac12 \\log(2\\pi\\sigma_i^2)
               + \\frac{(y_i - \\mu_i)^2}{2\\sigma_i^2}\\right].

    The per-point log density is :meth:`GaussianPredictive.log_prob` (one place for the math).

    Args:
        y, mean, variance: shape ``(n,)``; ``variance > 0`` (the predictive variance of ``y``,
            observation noise included).
    """
    y = _vector(y, "y")
    mu = _vector(mean, "mean")
    var = _vector(variance, "variance")
    for name, a in (("mean", mu), ("variance", var)):
        if a.shape != y.shape:
            raise ValueError(f"{name}: expected shape {y.shape} (as y), received {a.shape}")
    if y.shape[0] == 0:
        raise ValueError("y: expected at least one point, received an empty array")
    if (var <= 0).any():
        raise ValueError(f"variance: expected strictly positive values, received min {var.min()}")
    return float(-np.mean(GaussianPredictive(mu, var).log_prob(y)))


def nlpd_predictive(predictive: GaussianPredictive, y: Any) -> float:
    """:func:`nlpd` of a :class:`~ppl_cl.predictive.GaussianPredictive` at targets ``y: (n,)``."""
    if not isinstance(predictive, GaussianPredictive):
        raise TypeError(f"predictive: expected a GaussianPredictive, received "
                        f"{type(predictive).__name__}")
    return nlpd(y, predictive.mean, predictive.variance)


# -- uncertainty and calibration --------------------------------------------------------------
def predictive_entropy_matrix(entropies: Any, num_classes: int | None = None) -> np.ndarray:
    """Mean predictive entropy per (trained-up-to task i, test task j), normalized by ``log K``
    — VAR-GP Fig. 3 of Kapoor et al. 2021 ("normalized by the entropy of a random ten-way
    classifier, log 10"):

    .. math::  \\tilde H_{i,j} = \\frac{1}{\\log K} \\frac{1}{n_j} \\sum_{x \\in
               \\mathcal{D}^{test}_j} \\mathbb{H}[p(y \\mid x, \\mathcal{D}_{0..i})] \\in [0, 1].

    Args:
        entropies: either an array ``(T, T)`` of mean entropies in nats (NaN for cells not
            evaluated, e.g. the second output of :func:`evaluate_tasks` stacked over rows), or a
            ``T x T`` nested list of :class:`~ppl_cl.predictive.CategoricalPredictive` (None
            for cells not evaluated).
        num_classes: ``K >= 2``; required for an array, inferred from the predictives otherwise.

    Returns:
        ``(T, T)`` array in ``[0, 1]`` (NaN where not evaluated).
    """
    if isinstance(entropies, (list, tuple)) and any(
            isinstance(c, CategoricalPredictive) for row in entropies
            for c in (row if isinstance(row, (list, tuple)) else [])):
        T = len(entropies)
        if any(not isinstance(row, (list, tuple)) or len(row) != T for row in entropies):
            raise ValueError(f"entropies: expected a {T} x {T} nested list of predictives")
        H = np.full((T, T), np.nan)
        for i, row in enumerate(entropies):
            for j, cell in enumerate(row):
                if cell is None:
                    continue
                if not isinstance(cell, CategoricalPredictive):
                    raise TypeError(f"entropies[{i}][{j}]: expected a CategoricalPredictive or "
                                    f"None, received {type(cell).__name__}")
                if num_classes is None:
                    num_classes = cell.num_classes
                if cell.num_classes != num_classes:
                    raise ValueError(f"entropies[{i}][{j}]: expected {num_classes} classes, "
                                     f"received {cell.num_classes}")
                H[i, j] = cell.entropy().mean()
    else:
        H = _float_array(entropies, "entropies")
        if H.ndim != 2 or H.shape[0] != H.shape[1] or H.shape[0] == 0:
            raise ValueError(f"entropies: expected a square matrix (T, T), received {H.shape}")
        if num_classes is None:
            raise ValueError("num_classes: required when entropies is an array")
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
        raise ValueError(f"num_classes: expected an int K >= 2, received {num_classes!r}")
    log_K = math.log(num_classes)
    seen = ~np.isnan(H)
    if np.isinf(H).any():
        raise ValueError("entropies: expected finite values (NaN marks cells not evaluated), "
                         "received inf")
    if seen.any() and (H[seen].min() < -1e-12 or H[seen].max() > log_K * (1 + 1e-9)):
        raise ValueError(f"entropies: expected mean entropies in [0, log K = {log_K:.4g}] nats, "
                         f"received values in [{H[seen].min():.4g}, {H[seen].max():.4g}] "
                         f"(wrong K, or entropies in bits?)")
    return H / log_K


@dataclass(frozen=True)
class ReliabilityDiagram:
    """Per-bin statistics of top-label confidence (Guo et al. 2017, Sec. 2, Fig. 1).

    Attributes:
        bin_edges: ``(n_bins + 1,)`` equal-width edges of ``[0, 1]``; bin m is
            ``(edges[m], edges[m+1]]``.
        counts: ``(n_bins,)`` number of points per bin.
        accuracy: ``(n_bins,)`` fraction of correct top-label predictions (NaN for empty bins).
        confidence: ``(n_bins,)`` mean top-label probability (NaN for empty bins).
        ece: expected calibration error (see :func:`expected_calibration_error`).
    """

    bin_edges: np.ndarray
    counts: np.ndarray
    accuracy: np.ndarray
    confidence: np.ndarray
    ece: float


def _probs_and_labels(probs: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(probs, CategoricalPredictive):
        p = probs.probs
    else:
        p = _float_array(probs, "probs")
        if p.ndim != 2 or p.shape[1] < 2:
            raise ValueError(f"probs: expected shape (n, K) with K >= 2, received {p.shape}")
        if not np.isfinite(p).all() or (p < 0).any():
            raise ValueError("probs: expected finite non-negative probabilities")
        sums = p.sum(axis=1)
        if np.abs(sums - 1.0).max(initial=0.0) > 1e-6:
            raise ValueError(f"probs: expected rows summing to 1, received row sums in "
                             f"[{sums.min():.6g}, {sums.max():.6g}]")
    y_arr = np.asarray(as_numpy(y))
    if y_arr.ndim != 1 or y_arr.shape[0] != p.shape[0]:
        raise ValueError(f"y: expected shape ({p.shape[0]},) (one label per row of probs), "
                         f"received {y_arr.shape}")
    if y_arr.size and not np.issubdtype(y_arr.dtype, np.integer):
        raise TypeError(f"y: expected integer labels, received dtype {y_arr.dtype}")
    if y_arr.size and (y_arr.min() < 0 or y_arr.max() >= p.shape[1]):
        raise ValueError(f"y: expected labels in 0..{p.shape[1] - 1}, received "
                         f"{int(y_arr.min())}..{int(y_arr.max())}")
    if p.shape[0] == 0:
        raise ValueError("probs: expected at least one point, received none")
    return p, y_arr.astype(np.int64)


def reliability_diagram_data(probs: Any, y: Any, n_bins: int = 15) -> ReliabilityDiagram:
    """Bin the top-label confidence ``c_i = max_k p_ik`` into ``n_bins`` equal-width bins
    ``B_m = ((m-1)/M, m/M]`` and report per-bin accuracy, mean confidence and count
    (Guo et al. 2017, eqs. 1-3).

    Args:
        probs: ``(n, K)`` class probabilities (rows sum to 1) or a ``CategoricalPredictive``.
        y: ``(n,)`` integer labels in ``0..K-1``.
        n_bins: number of bins ``M >= 1``.
    """
    if not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins: expected an int >= 1, received {n_bins!r}")
    p, labels = _probs_and_labels(probs, y)
    confidence = p.max(axis=1)
    correct = (p.argmax(axis=1) == labels).astype(np.float64)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    # bin m holds edges[m] < c <= edges[m+1]; c >= 1/K > 0 so bin 0 is never left of its edge
    index = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, n_bins - 1)
    counts = np.bincount(index, minlength=n_bins)
    sum_correct = np.bincount(index, weights=correct, minlength=n_bins)
    sum_conf = np.bincount(index, weights=confidence, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.where(counts > 0, sum_correct / counts, np.nan)
        conf = np.where(counts > 0, sum_conf / counts, np.nan)
    # ECE = sum_m (|B_m| / n) |acc(B_m) - conf(B_m)| = (1/n) sum_m |sum_correct_m - sum_conf_m|
    ece = float(np.abs(sum_correct - sum_conf).sum() / labels.shape[0])
    return ReliabilityDiagram(edges, counts, acc, conf, ece)


def expected_calibration_error(probs: Any, y: Any, n_bins: int = 15) -> float:
    """Expected calibration error of the top label (eq. 3 of Guo et al. 2017):

    .. math::  \\mathrm{ECE} = \\sum_{m=1}^{M} \\frac{|B_m|}{n}
               \\left|\\mathrm{acc}(B_m) - \\mathrm{conf}(B_m)\\right|

    with equal-width confidence bins ``B_m = ((m-1)/M, m/M]`` (empty bins contribute 0).
    See :func:`reliability_diagram_data` for the arguments.
    """
    return reliability_diagram_data(probs, y, n_bins).ece
