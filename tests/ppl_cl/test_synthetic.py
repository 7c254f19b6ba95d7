"""Tests of ppl_cl.data.synthetic: sizes, constants, determinism, kinematics, generative laws.

Statistical checks compare an estimate with its true value in units of the estimate's standard
error (k = 5 standard errors: a false alarm has probability below 1e-6 per check).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ppl_cl.data import synthetic as S

K_SE = 5.0  # tolerance in standard errors


def _same(a, b) -> bool:
    """Bit-identical (nested tuples/lists of arrays)."""
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b))
    return np.array_equal(np.asarray(a), np.asarray(b))


# -- four blobs ---------------------------------------------------------------------------------

def test_four_blobs_shapes_labels_and_square():
    x, y = S.four_blobs()
    assert x.shape == (200, 2) and x.dtype == np.float64
    assert y.shape == (200,) and y.dtype == np.int64
    assert np.array_equal(y, np.repeat(np.arange(4), 50))
    assert S.FOUR_BLOBS_TASKS == ((0, 1), (2, 3))
    for seed in range(5):  # the paper's range [-3, 3]^2
        xs, _ = S.four_blobs(seed=seed)
        assert np.all(np.abs(xs) <= 3.0)
    x7, y7 = S.four_blobs(n_per_class=7)
    assert x7.shape == (28, 2) and np.bincount(y7).tolist() == [7, 7, 7, 7]


def test_four_blobs_deterministic_and_seed_dependent():
    assert _same(S.four_blobs(seed=3), S.four_blobs(seed=3))
    assert not np.array_equal(S.four_blobs(seed=3)[0], S.four_blobs(seed=4)[0])
    assert _same(S.four_blobs(seed=np.random.default_rng(5)), S.four_blobs(seed=5))


def test_four_blobs_moments_match_the_specification():
    n = 4000
    x, y = S.four_blobs(n_per_class=n, seed=1)
    for k in range(4):
        mu = np.asarray(S.FOUR_BLOBS_MEANS[k])
        Sigma = np.asarray(S.FOUR_BLOBS_COVARIANCES[k])
        xk = x[y == k]
        # mean: standard error sqrt(Sigma_jj / n)
        assert np.all(np.abs(xk.mean(0) - mu) < K_SE * np.sqrt(np.diag(Sigma) / n))
        # covariance entries: Var(S_ij) ~ (Sigma_ii Sigma_jj + Sigma_ij^2) / n (Gaussian data)
        C = np.cov(xk.T)
        se = np.sqrt((np.outer(np.diag(Sigma), np.diag(Sigma)) + Sigma**2) / n)
        assert np.all(np.abs(C - Sigma) < K_SE * se)


def test_four_blobs_rejects_bad_sizes():
    with pytest.raises(ValueError, match="n_per_class"):
        S.four_blobs(n_per_class=0)
    with pytest.raises(TypeError, match="seed"):
        S.four_blobs(seed=1.5)


# -- ELLA linear tasks -------------------------------------------------------------------------

def test_ella_tasks_shapes_sparsity_and_bias():
    data = S.ella_linear_tasks()
    assert len(data.tasks) == 100
    assert data.basis.shape == (13, 6) and data.codes.shape == (100, 6)
    assert np.all((data.codes != 0).sum(axis=1) == 3)  # sparsity level 0.5 of ELLA
    assert data.parameters.shape == (100, 13)
    for x, y in data.tasks:
        assert x.shape == (100, 13) and y.shape == (100,)
        assert np.all(x[:, -1] == 1.0)
    no_bias = S.ella_linear_tasks(n_tasks=3, bias_feature=False, n_nonzero=2, seed=1)
    assert not np.any(np.all(no_bias.tasks[0][0] == 1.0, axis=0))
    assert np.all((no_bias.codes != 0).sum(axis=1) == 2)


def test_ella_tasks_reproduce_theta_by_least_squares():
    """theta_t = L s_t: per-task OLS estimates match within the noise-derived law.

    With fixed X_t and Gaussian noise, theta_hat_t - theta_t ~ N(0, sigma^2 (X_t^T X_t)^-1), so
    sum_t (theta_hat_t - theta_t)^T X_t^T X_t (theta_hat_t - theta_t) / sigma^2 ~ chi2(T d) and
    sum_t ||y_t - X_t theta_t||^2 / sigma^2 ~ chi2(T n) exactly.
    """
    sigma = 0.7
    data = S.ella_linear_tasks(noise_std=sigma, seed=2)
    theta = data.parameters
    T, d = theta.shape
    n = data.tasks[0][0].shape[0]
    q_fit, q_noise = 0.0, 0.0
    for t, (x, y) in enumerate(data.tasks):
        theta_hat = np.linalg.lstsq(x, y, rcond=None)[0]
        r = x @ (theta_hat - theta[t])
        q_fit += r @ r / sigma**2
        q_noise += np.sum((y - x @ theta[t]) ** 2) / sigma**2
    for q, dof in ((q_fit, T * d), (q_noise, T * n)):
        assert abs(q - dof) < K_SE * math.sqrt(2 * dof)


def test_ella_tasks_deterministic_and_validated():
    a, b = S.ella_linear_tasks(n_tasks=4, seed=7), S.ella_linear_tasks(n_tasks=4, seed=7)
    assert _same(a.tasks, b.tasks) and _same(a.basis, b.basis) and _same(a.codes, b.codes)
    assert not np.array_equal(a.basis, S.ella_linear_tasks(n_tasks=4, seed=8).basis)
    with pytest.raises(ValueError, match="n_nonzero"):
        S.ella_linear_tasks(n_latent=6, n_nonzero=7)
    with pytest.raises(ValueError, match="noise_std"):
        S.ella_linear_tasks(noise_std=0.0)
    with pytest.raises(ValueError, match="n_tasks"):
        S.ella_linear_tasks(n_tasks=0)


# -- robot arm -----------------------------------------------------------------------------------

LINKS = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])


def test_kinematics_all_zero_stretches_along_base_x():
    P = S.arm_joint_positions(np.zeros(8), LINKS)
    assert P.shape == (9, 3)
    expected = np.stack([np.concatenate([[0.0], np.cumsum(LINKS)]), np.zeros(9), np.zeros(9)], 1)
    np.testing.assert_allclose(P, expected, atol=1e-15)
    np.testing.assert_allclose(S.arm_forward_kinematics(np.zeros(8), LINKS), [3.6, 0, 0],
                               atol=1e-14)


@pytest.mark.parametrize("angles, expected", [
    # joint 1 (yaw about z) by +90 deg: the whole arm points along +y
    ({0: np.pi / 2}, (0.0, 3.6, 0.0)),
    # joint 2 (pitch about the local y) by +90 deg: R_y(90) e_x = -e_z after link 1
    ({1: np.pi / 2}, (0.1, 0.0, -3.5)),
    # joint 2 by 180 deg: links 2..8 fold back along -x
    ({1: np.pi}, (0.1 - 3.5, 0.0, 0.0)),
    # yaw 90 then pitch 90: link 1 along +y, then straight down
    ({0: np.pi / 2, 1: np.pi / 2}, (0.0, 0.1, -3.5)),
    # joint 3 (yaw) by -90 deg: links 3..8 along -y
    ({2: -np.pi / 2}, (0.3, -3.3, 0.0)),
    # last joint (pitch) by +90 deg: only the last link turns down
    ({7: np.pi / 2}, (2.8, 0.0, -0.8)),
])
def test_kinematics_hand_checked_turns(angles, expected):
    q = np.zeros(8)
    for i, a in angles.items():
        q[i] = a
    np.testing.assert_allclose(S.arm_forward_kinematics(q, LINKS), expected, atol=1e-12)


def test_kinematics_planar_when_only_yaw_joints_move():
    """Pitch joints at zero: all yaw axes stay vertical, so the arm is the planar chain
    p = sum_i l_i (cos phi_i, sin phi_i, 0), phi_i = sum of the yaw angles up to joint i."""
    rng = np.random.default_rng(0)
    q = np.zeros((20, 8))
    q[:, 0::2] = rng.uniform(-np.pi, np.pi, size=(20, 4))
    phi = np.cumsum(q, axis=1)  # pitch angles are 0, so the cumulative sum is the heading
    expected = np.stack([(LINKS * np.cos(phi)).sum(1), (LINKS * np.sin(phi)).sum(1),
                         np.zeros(20)], axis=1)
    np.testing.assert_allclose(S.arm_forward_kinematics(q, LINKS), expected, atol=1e-12)


def test_kinematics_is_rigid():
    rng = np.random.default_rng(1)
    q = rng.uniform(-np.pi, np.pi, size=(50, 8))
    P = S.arm_joint_positions(q, LINKS)
    assert P.shape == (50, 9, 3)
    np.testing.assert_allclose(np.linalg.norm(np.diff(P, axis=1), axis=2),
                               np.broadcast_to(LINKS, (50, 8)), rtol=1e-12)
    np.testing.assert_allclose(P[:, 0], 0.0)


def test_kinematics_rejects_bad_input():
    with pytest.raises(ValueError, match="link_lengths"):
        S.arm_forward_kinematics(np.zeros((3, 8)), np.ones(7))
    with pytest.raises(ValueError, match="joint axis"):
        S.arm_forward_kinematics(np.zeros(2), np.ones(2), joint_axes=("z", "w"))


def test_robot_arm_tasks_sizes_and_targets():
    tasks = S.robot_arm_tasks()
    lengths = S.robot_arm_link_lengths()
    assert S.ROBOT_ARM_TARGET == (0.1, 0.1, 0.1)
    assert len(tasks) == 113 and lengths.shape == (113, 8)
    assert np.all((lengths >= 0.1) & (lengths <= 0.3))
    for t, (x, y) in enumerate(tasks):
        assert x.shape[1] == 8 and 50 <= x.shape[0] <= 100 and y.shape == (x.shape[0],)
        assert np.all(np.abs(x) <= np.pi / 2)
        # y is the distance to the target of the arm with this task's (fixed) link lengths
        p = S.arm_forward_kinematics(x, lengths[t])
        np.testing.assert_array_equal(y, np.linalg.norm(p - np.array([0.1, 0.1, 0.1]), axis=1))
    sizes = {x.shape[0] for x, _ in tasks}
    assert len(sizes) > 1


def test_robot_arm_tasks_deterministic_and_validated():
    a, b = S.robot_arm_tasks(n_tasks=3, seed=4), S.robot_arm_tasks(n_tasks=3, seed=4)
    assert _same(a, b)
    c = S.robot_arm_tasks(n_tasks=3, seed=5)
    assert not np.array_equal(a[0][1][:10], c[0][1][:10])
    with pytest.raises(ValueError, match="max_configs"):
        S.robot_arm_tasks(min_configs=50, max_configs=40)
    with pytest.raises(ValueError, match="link_length_range"):
        S.robot_arm_tasks(link_length_range=(0.0, 1.0))
    with pytest.raises(ValueError, match="target"):
        S.robot_arm_tasks(target=(0.1, 0.1))


# -- VIPS --------------------------------------------------------------------------------------

def _noise_std_ok(residual: np.ndarray, sigma: float) -> bool:
    """Sample variance within K_SE standard errors (sigma^2 sqrt(2 / (n - 1))) of sigma^2."""
    n = residual.size
    return abs(residual.var(ddof=1) - sigma**2) < K_SE * sigma**2 * math.sqrt(2.0 / (n - 1))


def test_vips_function_values():
    np.testing.assert_allclose(S.vips_function(np.array([0.0, np.pi / 2, np.pi])),
                               [1.0, 0.0, -1.0], atol=1e-15)


def test_vips_d1_d2_d3_sizes_ranges_and_order():
    x1, y1 = S.vips_d1(0)
    assert x1.shape == (500, 1) and y1.shape == (500,)
    assert np.all(np.diff(x1[:, 0]) >= 0) and x1.min() > 0 and x1.max() < 10
    x2, y2 = S.vips_d2(0)
    assert x2.shape == (150, 1) and y2.shape == (150,)
    assert x2.min() > 0 and x2.max() < 10 and not np.all(np.diff(x2[:, 0]) >= 0)
    x3, y3 = S.vips_d3(0)
    assert x3.shape == (1300, 1) and y3.shape == (1300,)
    assert np.all((x3[:1000] >= 4.5) & (x3[:1000] <= 7.0))
    assert np.all((x3[1000:] > 0) & (x3[1000:] < 10))
    assert S.VIPS_NOISE_STD == 0.2
    for x, y in ((x1, y1), (x2, y2), (x3, y3)):
        assert _noise_std_ok(y - S.vips_function(x[:, 0]), 0.2)


def test_vips_d3_outliers_follow_the_truncated_cauchy():
    """Fraction of the Cauchy(6, 1) | (0, 10) part inside [4.5, 7] against its exact value."""
    F = stats.cauchy(loc=6.0, scale=1.0).cdf
    p = (F(7.0) - F(4.5)) / (F(10.0) - F(0.0))
    inside = np.concatenate([((S.vips_d3(s)[0][1000:, 0] >= 4.5) & (S.vips_d3(s)[0][1000:, 0]
                                                                     <= 7.0)) for s in range(5)])
    assert abs(inside.mean() - p) < K_SE * math.sqrt(p * (1 - p) / inside.size)
    # and it does reach the outer parts of (0, 10)
    x = np.concatenate([S.vips_d3(s)[0][1000:, 0] for s in range(5)])
    assert x.min() < 2.0 and x.max() > 9.0


def test_vips_speed_accuracy_set():
    data = S.vips_speed_accuracy(0)
    assert data.x.shape == (1000, 1) and data.y.shape == (1000,)
    assert np.all(np.diff(data.x[:, 0]) >= 0) and data.x.min() > 0 and data.x.max() < 12
    np.testing.assert_array_equal(data.x_test[:, 0], np.linspace(0, 10, 500))
    np.testing.assert_array_equal(data.f_test, S.vips_function(np.linspace(0, 10, 500)))
    assert _noise_std_ok(data.y - S.vips_function(data.x[:, 0]), 1.0)


@pytest.mark.parametrize("make", [S.vips_d1, S.vips_d2, S.vips_d3, S.vips_speed_accuracy])
def test_vips_sets_deterministic(make):
    assert _same(make(3), make(3))
    assert not np.array_equal(make(3)[1], make(4)[1])


# -- Kalman piecewise series ---------------------------------------------------------------------

def test_kalman_constants_are_the_papers():
    assert S.KALMAN_SEGMENT_MEANS == (1.3, 1.0, 1.3, 0.95, 0.6, 0.25, 0.8, 0.5)
    assert S.KALMAN_CHANGE_POINTS == (451, 709, 958, 1547, 2147, 2769, 2957)
    assert S.KALMAN_SERIES_LENGTH == 3058 and S.KALMAN_NOISE_VARIANCE == 0.01


def test_kalman_series_structure_and_noise():
    s = S.kalman_piecewise_series(0)
    assert s.y.shape == (3058,) and s.mean.shape == (3058,)
    np.testing.assert_array_equal(s.change_points, [451, 709, 958, 1547, 2147, 2769, 2957])
    assert s.change_points.dtype == np.int64
    np.testing.assert_array_equal(s.segment_means, [1.3, 1.0, 1.3, 0.95, 0.6, 0.25, 0.8, 0.5])
    bounds = [0, *S.KALMAN_CHANGE_POINTS, 3058]
    for k in range(8):  # segment k is mean[bounds[k]:bounds[k+1]]
        assert np.all(s.mean[bounds[k]: bounds[k + 1]] == S.KALMAN_SEGMENT_MEANS[k])
    jumps = np.flatnonzero(np.diff(s.mean) != 0) + 1
    np.testing.assert_array_equal(jumps, S.KALMAN_CHANGE_POINTS)
    assert _noise_std_ok(s.y - s.mean, math.sqrt(0.01))


def test_kalman_series_deterministic():
    assert _same(S.kalman_piecewise_series(2), S.kalman_piecewise_series(2))
    assert not np.array_equal(S.kalman_piecewise_series(2).y, S.kalman_piecewise_series(3).y)
    np.testing.assert_array_equal(S.kalman_piecewise_series(2).mean, S.kalman_piecewise_series(3).mean)
