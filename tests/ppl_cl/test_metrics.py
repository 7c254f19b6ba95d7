"""Metrics: hand-computed cases, edge cases, independent references and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from ppl_cl.metrics import (
    average_accuracy,
    average_log_predictive,
    average_online_accuracy,
    backward_transfer,
    cumulative_log_predictive,
    expected_calibration_error,
    final_average_accuracy,
    forgetting,
    nlpd,
    nlpd_predictive,
    paired_accuracy_difference,
    predictive_entropy_matrix,
    reliability_diagram_data,
    rmse,
)
from ppl_cl.predictive import CategoricalPredictive, GaussianPredictive

NAN = np.nan

# R[i, j]: accuracy on task j after training on task i (upper triangle unused).
#   after task 0: A_0 = 0.9
#   after task 1: A_1 = (0.8 + 0.7) / 2 = 0.75
#   after task 2: A_2 = (0.6 + 0.5 + 1.0) / 3 = 0.7
#   forgetting: f_0 = max(0.9, 0.8) - 0.6 = 0.3, f_1 = 0.7 - 0.5 = 0.2, F = 0.25
#   BWT: ((0.6 - 0.9) + (0.5 - 0.7)) / 2 = -0.25
R_FORGET = np.array([[0.9, NAN, NAN],
                     [0.8, 0.7, NAN],
                     [0.6, 0.5, 1.0]])

# A case where forgetting and -BWT differ (the best accuracy on task 0 is reached later):
#   f_0 = max(0.5, 0.9) - 0.7 = 0.2, f_1 = 0.8 - 0.9 = -0.1, F = 0.05
#   BWT = ((0.7 - 0.5) + (0.9 - 0.8)) / 2 = 0.15
#   A = [0.5, (0.9 + 0.8) / 2, (0.7 + 0.9 + 0.6) / 3] = [0.5, 0.85, 0.7333...]
R_TRANSFER = np.array([[0.5, NAN, NAN],
                       [0.9, 0.8, NAN],
                       [0.7, 0.9, 0.6]])


# -- accuracy matrix ----------------------------------------------------------------------
def test_accuracy_matrix_metrics_hand_computed():
    np.testing.assert_allclose(average_accuracy(R_FORGET), [0.9, 0.75, 0.7])
    assert final_average_accuracy(R_FORGET) == pytest.approx(0.7)
    assert forgetting(R_FORGET) == pytest.approx(0.25)
    np.testing.assert_allclose(forgetting(R_FORGET, per_task=True), [0.3, 0.2])
    assert backward_transfer(R_FORGET) == pytest.approx(-0.25)

    np.testing.assert_allclose(average_accuracy(R_TRANSFER), [0.5, 0.85, 2.2 / 3])
    assert forgetting(R_TRANSFER) == pytest.approx(0.05)
    np.testing.assert_allclose(forgetting(R_TRANSFER, per_task=True), [0.2, -0.1])
    assert backward_transfer(R_TRANSFER) == pytest.approx(0.15)


def test_upper_triangle_is_ignored():
    # Zero-shot accuracies above the diagonal (e.g. from evaluate_tasks without upto) change
    # nothing: the metrics read only j <= i.
    filled = np.where(np.isnan(R_FORGET), 0.33, R_FORGET)
    for fn in (average_accuracy, forgetting, backward_transfer, final_average_accuracy):
        np.testing.assert_allclose(fn(filled), fn(R_FORGET))


def test_single_task_edge_case():
    R = np.array([[0.8]])
    np.testing.assert_allclose(average_accuracy(R), [0.8])
    assert final_average_accuracy(R) == pytest.approx(0.8)
    assert math.isnan(forgetting(R))  # no earlier task: undefined
    assert forgetting(R, per_task=True).shape == (0,)
    assert math.isnan(backward_transfer(R))


def test_no_forgetting_when_accuracy_never_drops():
    R = np.array([[1.0, NAN], [1.0, 1.0]])
    assert forgetting(R) == 0.0
    assert backward_transfer(R) == 0.0
    assert final_average_accuracy(R) == 1.0


def test_accuracy_matrix_validation():
    with pytest.raises(ValueError, match=r"square matrix \(T, T\)"):
        average_accuracy(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"square matrix"):
        forgetting(np.zeros(3))
    with pytest.raises(ValueError, match=r"at \[1, 1\]"):
        backward_transfer(np.array([[0.5, NAN], [0.5, NAN]]))
    with pytest.raises(TypeError, match="numeric"):
        average_accuracy(np.array([["a"]]))


# -- paired comparison of two learners ---------------------------------------------------------
def test_paired_difference_one_task_is_the_matched_pairs_formula():
    """One task, every point its own cluster: D = mean(d), SE = sd(d, ddof=1) / sqrt(n) (the
    textbook matched-pairs standard error); counts of discordant pairs by hand."""
    rng = np.random.default_rng(0)
    a = rng.random(400) < 0.9
    b = np.where(rng.random(400) < 0.8, a, rng.random(400) < 0.85)
    d = a.astype(float) - b.astype(float)
    res = paired_accuracy_difference([a], [b])
    assert res["difference"] == pytest.approx(d.mean(), abs=1e-15)
    assert res["se"] == pytest.approx(d.std(ddof=1) / math.sqrt(400), rel=1e-12)
    assert res["z"] == pytest.approx(res["difference"] / res["se"])
    assert res["a_only"] == int((a & ~b).sum()) and res["b_only"] == int((~a & b).sum())
    assert res["accuracy_a"] == pytest.approx(a.mean()) and res["num_clusters"] == 400
    pa, pb = a.mean(), b.mean()
    assert res["unpaired_se"] == pytest.approx(math.sqrt((pa * (1 - pa) + pb * (1 - pb)) / 400))
    # strongly agreeing learners: pairing shrinks the error far below the unpaired one
    assert res["se"] < 0.7 * res["unpaired_se"]


def test_paired_difference_clusters_are_image_means():
    """T tasks scoring the same n images (Permuted MNIST): with image clusters the SE is that
    of the per-image mean difference s_i = mean_t d_ti, sd(s, ddof=1) / sqrt(n); identical
    learners give D = SE = 0."""
    rng = np.random.default_rng(1)
    T, n = 4, 250
    a = [rng.random(n) < 0.9 for _ in range(T)]
    b = [rng.random(n) < 0.88 for _ in range(T)]
    ids = [np.arange(n)] * T
    s = np.mean([x.astype(float) - y for x, y in zip(a, b)], axis=0)
    res = paired_accuracy_difference(a, b, ids)
    assert res["difference"] == pytest.approx(s.mean(), abs=1e-15)
    assert res["se"] == pytest.approx(s.std(ddof=1) / math.sqrt(n), rel=1e-12)
    assert res["num_points"] == T * n and res["num_clusters"] == n
    same = paired_accuracy_difference(a, a, ids)
    assert same["difference"] == 0 and same["se"] == 0 and math.isnan(same["z"])


def test_paired_difference_se_matches_monte_carlo_spread():
    """Calibration against the sampling distribution it estimates: test sets of n images, each
    image of a kind shared by its T permuted copies (easy for both learners, or handled far
    better by one), so an image's copies are correlated, and the learners agree often. Over
    2000 simulated test sets the root-mean-square SE estimate equals the standard deviation of
    D within its Monte Carlo error (relative SE of a standard deviation from R draws ~
    1 / sqrt(2 (R - 1)) = 1.6 %; 4 sigma = 6.3 %); treating the T copies as independent
    points instead underestimates it (here by about a third)."""
    rng = np.random.default_rng(3)
    reps, T, n = 2000, 5, 200
    D, se, se_flat = np.empty(reps), np.empty(reps), np.empty(reps)
    for r in range(reps):
        kind = rng.choice(3, size=n, p=[0.75, 0.15, 0.10])  # per image, shared by its copies:
        p_a = np.array([0.97, 0.90, 0.40])[kind]            # easy for both, or one learner
        p_b = np.array([0.96, 0.45, 0.85])[kind]            # handles it far better
        u = rng.random((T, n))                           # shared noise: the learners agree often
        a = u < p_a
        b = np.where(rng.random((T, n)) < 0.7, u < p_b, rng.random((T, n)) < p_b)
        res = paired_accuracy_difference(list(a), list(b), [np.arange(n)] * T)
        D[r], se[r] = res["difference"], res["se"]
        se_flat[r] = paired_accuracy_difference(list(a), list(b))["se"]
    sd = D.std(ddof=1)
    assert abs(math.sqrt(np.mean(se ** 2)) / sd - 1) < 4 / math.sqrt(2 * (reps - 1))
    assert math.sqrt(np.mean(se_flat ** 2)) < 0.8 * sd


def test_paired_difference_validation():
    a = np.array([1, 0, 1], dtype=bool)
    with pytest.raises(ValueError, match="same number"):
        paired_accuracy_difference([a], [a, a])
    with pytest.raises(ValueError, match="same number"):
        paired_accuracy_difference([], [])
    with pytest.raises(ValueError, match="task 0"):
        paired_accuracy_difference([a], [a[:2]])
    with pytest.raises(ValueError, match="0/1"):
        paired_accuracy_difference([np.array([1.0, 0.5, 0.0])], [a])
    with pytest.raises(ValueError, match="finite"):
        paired_accuracy_difference([np.array([1.0, np.nan, 0.0])], [a])
    with pytest.raises(ValueError, match="clusters"):
        paired_accuracy_difference([a], [a], [np.arange(2)])


# -- online metrics -------------------------------------------------------------------------------
def test_average_online_accuracy():
    # running means of [1, 0, 1, 1]: 1/1, 1/2, 2/3, 3/4
    np.testing.assert_allclose(average_online_accuracy([1, 0, 1, 1]), [1, 0.5, 2 / 3, 0.75])
    np.testing.assert_allclose(average_online_accuracy(np.array([True, False])), [1.0, 0.5])
    np.testing.assert_array_equal(average_online_accuracy(np.ones(5, dtype=bool)), np.ones(5))
    np.testing.assert_allclose(average_online_accuracy(torch.tensor([0, 1])), [0.0, 0.5])
    assert average_online_accuracy(np.zeros(0)).shape == (0,)
    with pytest.raises(ValueError, match="0/1"):
        average_online_accuracy([1, 2])
    with pytest.raises(ValueError, match="finite"):
        average_online_accuracy([1.0, NAN])
    with pytest.raises(ValueError, match=r"shape \(n,\)"):
        average_online_accuracy(np.ones((2, 2)))


def test_log_predictive_running_sum_and_mean():
    lp = [-1.0, -2.0, -0.5]
    np.testing.assert_allclose(cumulative_log_predictive(lp), [-1.0, -3.0, -3.5])
    np.testing.assert_allclose(average_log_predictive(lp), [-1.0, -1.5, -3.5 / 3])
    # a zero-probability event gives -inf, which is a valid (if dire) log predictive
    assert cumulative_log_predictive([-1.0, -np.inf])[-1] == -np.inf
    with pytest.raises(ValueError, match="finite"):
        cumulative_log_predictive([-1.0, NAN])


# -- regression ----------------------------------------------------------------------------------
def test_rmse_hand_computed():
    # errors (0, 0, 2): sqrt(4 / 3)
    assert rmse([1.0, 2.0, 3.0], [1.0, 2.0, 5.0]) == pytest.approx(math.sqrt(4 / 3))
    pred = GaussianPredictive(np.array([1.0, 2.0, 5.0]), np.ones(3))
    assert rmse(np.array([1.0, 2.0, 3.0]), pred) == pytest.approx(math.sqrt(4 / 3))
    with pytest.raises(ValueError, match=r"expected shape \(3,\)"):
        rmse([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        rmse([1.0, NAN], [1.0, 2.0])


def test_nlpd_hand_computed_and_against_references():
    # point 0: 0.5 log(2 pi);  point 1: 0.5 log(2 pi 4) + 1 / (2 * 4)
    y, mu, var = np.array([0.0, 1.0]), np.array([0.0, 0.0]), np.array([1.0, 4.0])
    expected = (0.5 * math.log(2 * math.pi) + 0.5 * math.log(8 * math.pi) + 0.125) / 2
    assert nlpd(y, mu, var) == pytest.approx(expected, rel=1e-14)
    # scipy (independent) and the predictive's log_prob (consistency)
    rng = np.random.default_rng(0)
    y, mu, var = rng.normal(size=50), rng.normal(size=50), rng.uniform(0.1, 3.0, size=50)
    ref = -norm.logpdf(y, loc=mu, scale=np.sqrt(var)).mean()
    pred = GaussianPredictive(mu, var)
    assert nlpd(y, mu, var) == pytest.approx(ref, rel=1e-12)
    assert nlpd_predictive(pred, y) == pytest.approx(-pred.log_prob(y).mean(), rel=1e-14)


def test_nlpd_validation():
    with pytest.raises(ValueError, match="strictly positive"):
        nlpd([0.0], [0.0], [0.0])
    with pytest.raises(ValueError, match=r"variance: expected shape \(2,\)"):
        nlpd([0.0, 1.0], [0.0, 1.0], [1.0])
    with pytest.raises(TypeError, match="GaussianPredictive"):
        nlpd_predictive(CategoricalPredictive(np.full((1, 2), 0.5)), [0])


# -- predictive entropy matrix --------------------------------------------------------------------
def test_predictive_entropy_matrix_from_array_and_predictives():
    H = np.array([[math.log(2), NAN], [0.5 * math.log(2), 0.0]])
    np.testing.assert_allclose(predictive_entropy_matrix(H, num_classes=2),
                               [[1.0, NAN], [0.5, 0.0]])

    uniform = CategoricalPredictive(np.full((3, 10), 0.1))          # entropy log 10 -> 1
    half = CategoricalPredictive(np.array([[0.5, 0.5] + [0.0] * 8]))  # log 2 / log 10
    out = predictive_entropy_matrix([[uniform, None], [half, uniform]])
    np.testing.assert_allclose(out, [[1.0, NAN], [math.log(2) / math.log(10), 1.0]], atol=1e-12)


def test_predictive_entropy_matrix_validation():
    with pytest.raises(ValueError, match="num_classes: required"):
        predictive_entropy_matrix(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="log K"):  # log2(10) bits > log 10 nats
        predictive_entropy_matrix(np.full((1, 1), math.log2(10)), num_classes=10)
    with pytest.raises(ValueError, match="K >= 2"):
        predictive_entropy_matrix(np.zeros((1, 1)), num_classes=1)
    with pytest.raises(ValueError, match="10 classes"):
        predictive_entropy_matrix([[CategoricalPredictive(np.full((1, 2), 0.5))]], num_classes=10)


# -- calibration ----------------------------------------------------------------------------------
def _binary(confidence, correct):
    """Probabilities [c, 1-c] with label 0 when correct, 1 otherwise (top label = class 0)."""
    c = np.asarray(confidence, dtype=np.float64)
    probs = np.stack([c, 1.0 - c], axis=1)
    return probs, np.where(np.asarray(correct, dtype=bool), 0, 1)


def test_ece_zero_for_perfectly_calibrated_construction():
    # 10 points at confidence 0.8 with 8 right, 10 at 0.6 with 6 right: acc(B) = conf(B)
    probs, y = _binary([0.8] * 10 + [0.6] * 10, [1] * 8 + [0] * 2 + [1] * 6 + [0] * 4)
    assert expected_calibration_error(probs, y) == pytest.approx(0.0, abs=1e-12)
    # all correct at confidence 1
    probs, y = _binary(np.ones(7), np.ones(7))
    assert expected_calibration_error(probs, y) == pytest.approx(0.0, abs=1e-12)


def test_ece_known_value_for_miscalibrated_construction():
    # bin of 0.9: 5/10 right -> |0.5 - 0.9| = 0.4 with weight 10/20; bin of 0.6: 6/10 -> 0
    # ECE = 0.5 * 0.4 = 0.2
    probs, y = _binary([0.9] * 10 + [0.6] * 10, [1] * 5 + [0] * 5 + [1] * 6 + [0] * 4)
    assert expected_calibration_error(probs, y) == pytest.approx(0.2, abs=1e-12)
    # all correct at confidence 0.7: ECE = 1 - 0.7
    probs, y = _binary(np.full(4, 0.7), np.ones(4))
    assert expected_calibration_error(probs, y, n_bins=10) == pytest.approx(0.3, abs=1e-12)
    # a CategoricalPredictive gives the same
    assert expected_calibration_error(CategoricalPredictive(probs), y, 10) == pytest.approx(0.3)


def test_reliability_bins_right_closed_and_empty_bins():
    # n_bins = 5: 0.6 sits on an edge and belongs to (0.4, 0.6] (bin 2); 0.9 to bin 4
    probs, y = _binary([0.6, 0.6, 0.9], [1, 0, 1])
    d = reliability_diagram_data(probs, y, n_bins=5)
    np.testing.assert_allclose(d.bin_edges, np.linspace(0, 1, 6))
    np.testing.assert_array_equal(d.counts, [0, 0, 2, 0, 1])
    np.testing.assert_allclose(d.accuracy, [NAN, NAN, 0.5, NAN, 1.0])
    np.testing.assert_allclose(d.confidence, [NAN, NAN, 0.6, NAN, 0.9])
    # ECE = (2/3) |0.5 - 0.6| + (1/3) |1 - 0.9| = 0.1
    assert d.ece == pytest.approx(0.1, abs=1e-12)


def test_ece_against_loop_reference():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(4) * 0.7, size=500)
    y = rng.integers(0, 4, size=500)
    conf, pred = probs.max(axis=1), probs.argmax(axis=1)
    edges = np.linspace(0, 1, 16)
    ref = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (conf > lo) & (conf <= hi)
        if m.any():
            ref += m.mean() * abs((pred[m] == y[m]).mean() - conf[m].mean())
    assert expected_calibration_error(probs, y) == pytest.approx(ref, rel=1e-12)


def test_ece_monte_carlo_calibrated_and_overconfident():
    """Labels drawn from a known correctness probability q_i: per bin the accuracy is a mean of
    independent Bernoullis, so |ECE - sum_b w_b |mean_b(q) - conf_b|| <= sum_b w_b |noise_b| and
    each noise_b has sd sqrt(sum_i q_i (1 - q_i)) / n_b; we allow 4 sd per bin."""
    rng = np.random.default_rng(2)
    n = 20000
    conf = rng.uniform(0.5, 1.0, size=n)
    for q in (conf, 0.5 + (conf - 0.5) / 2):  # calibrated, then overconfident
        correct = rng.random(n) < q
        probs, y = _binary(conf, correct)
        d = reliability_diagram_data(probs, y)
        index = np.clip(np.searchsorted(d.bin_edges, conf, side="left") - 1, 0, 14)
        expected, tol = 0.0, 0.0
        for b in range(15):
            m = index == b
            if m.any():
                expected += m.sum() / n * abs(q[m].mean() - conf[m].mean())
                tol += m.sum() / n * 4 * math.sqrt((q[m] * (1 - q[m])).sum()) / m.sum()
        assert abs(d.ece - expected) <= tol
    assert expected > 0.1  # the overconfident case is clearly miscalibrated


def test_calibration_validation():
    with pytest.raises(ValueError, match="summing to 1"):
        expected_calibration_error(np.array([[0.5, 0.6]]), np.array([0]))
    with pytest.raises(ValueError, match=r"labels in 0..1"):
        expected_calibration_error(np.array([[0.5, 0.5]]), np.array([2]))
    with pytest.raises(TypeError, match="integer labels"):
        expected_calibration_error(np.array([[0.5, 0.5]]), np.array([0.0]))
    with pytest.raises(ValueError, match="n_bins"):
        expected_calibration_error(np.array([[0.5, 0.5]]), np.array([0]), n_bins=0)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        expected_calibration_error(np.full((2, 2), 0.5), np.array([0]))
