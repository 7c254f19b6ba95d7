"""Synthetic datasets of the five papers, regenerated from their descriptions (NumPy only).

Every generator takes ``seed`` (an int or a ``numpy.random.Generator``) and is deterministic:
the same seed gives bit-identical arrays. Inputs are float64, class labels int64. Where a paper
is vague, the docstring says what was chosen and why; constants of the papers are module-level
tuples so that tests check them exactly.

* :func:`four_blobs` -- VAR-GP 2-D toy (Kapoor et al. 2021, Sect. 5, Fig. 2);
* :func:`ella_linear_tasks` -- GP-ELLA synthetic tasks (Clingerman & Eaton 2017, Sect. 5.1,
  data model of Ruvolo & Eaton 2013);
* :func:`robot_arm_tasks` -- GP-ELLA robot-arm kinematics (Sect. 5.1), with the forward
  kinematics :func:`arm_joint_positions` / :func:`arm_forward_kinematics`;
* :func:`vips_d1`, :func:`vips_d2`, :func:`vips_d3` -- VIPS Fig. 1 (Pescador-Barrios et al.
  2024, Sect. 5.1, App. F.1); :func:`vips_speed_accuracy` -- VIPS Fig. 2a (Sect. 5.2,
  App. F.2.1);
* :func:`kalman_piecewise_series` -- the Kalman OCL time series (Titsias et al. 2024,
  Sect. 4.1, Fig. 1, App. C).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ppl_cl.seeding import as_generator

__all__ = [
    "FOUR_BLOBS_MEANS", "FOUR_BLOBS_COVARIANCES", "four_blobs", "FOUR_BLOBS_TASKS",
    "EllaTasks", "ella_linear_tasks",
    "ROBOT_ARM_TARGET", "ROBOT_ARM_JOINT_AXES", "arm_joint_positions", "arm_forward_kinematics",
    "robot_arm_link_lengths", "robot_arm_tasks",
    "vips_function", "vips_d1", "vips_d2", "vips_d3", "vips_speed_accuracy",
    "vips_speed_accuracy_reference", "SpeedAccuracyData",
    "VIPS_NOISE_STD", "VIPS_SPEED_NOISE_STD",
    "KALMAN_SERIES_LENGTH", "KALMAN_SEGMENT_MEANS", "KALMAN_CHANGE_POINTS",
    "KALMAN_NOISE_VARIANCE", "PiecewiseSeries", "kalman_piecewise_series",
]


def _child_generators(seed: int | np.random.Generator, n: int) -> list[np.random.Generator]:
    """``n`` independent generators derived from ``seed`` (SeedSequence spawning)."""
    if isinstance(seed, np.random.Generator):
        return list(seed.spawn(n))
    as_generator(seed)  # type check
    return [np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(n)]


def _check_positive_int(value: int, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, received {value!r}")
    return int(value)


# ===========================================================================================
# VAR-GP: 2-D four-class toy (Kapoor et al. 2021, Sect. 5 "Synthetic Classification Dataset",
# Fig. 2; tasks {0, 1} then {2, 3})
# ===========================================================================================

FOUR_BLOBS_MEANS: tuple[tuple[float, float], ...] = (
    (0.8, 1.5),
    (0.5, -0.2),
    (2.5, 1.0),
    (-0.5, 1.5),
)
"""Blob centres, class 0..3."""

FOUR_BLOBS_COVARIANCES: tuple[tuple[tuple[float, float], tuple[float, float]], ...] = (
    ((0.4**2, 0.0), (0.0, 0.4**2)),
    ((0.6**2, 0.0), (0.0, 0.1**2)),
    ((0.1**2, 0.0), (0.0, 0.6**2)),
    ((0.2, 0.1), (0.1, 0.1)),
)
"""Blob covariances, class 0..3."""

FOUR_BLOBS_TASKS: tuple[tuple[int, ...], ...] = ((0, 1), (2, 3))
"""The two tasks of the toy: classes 0/1 (task 0), then 2/3 (task 1)."""


def four_blobs(n_per_class: int = 50, seed: int | np.random.Generator = 0,
               shift: tuple[float, float] = (0.0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
    """The 2-D four-class toy data set of VAR-GP (Kapoor et al. 2021, Sect. 5, Fig. 2).

    The paper says only: four classes in ``[-3, 3]^2``, observed as tasks {0, 1} then {2, 3}
    (:data:`FOUR_BLOBS_TASKS`). The reference code draws 4 Gaussian blobs of 50 points each;
    the blob parameters (:data:`FOUR_BLOBS_MEANS`, :data:`FOUR_BLOBS_COVARIANCES`: three
    axis-aligned blobs and one correlated one) are those of ``ToyDataset`` in
    uber-research/vargp ``var_gp/datasets.py``, which then shifts every point by
    ``(-0.5, -1)`` (``shift``). Points are not truncated to the square.

    Args:
        n_per_class: points per class (reference: 50).
        seed: int seed or ``numpy.random.Generator``.
        shift: added to every point (the reference's toy: ``(-0.5, -1)``).

    Returns:
        ``x`` float64 of shape ``(4 * n_per_class, 2)`` and ``y`` int64 of shape
        ``(4 * n_per_class,)``, ordered by class (all of class 0 first, then 1, 2, 3).
    """
    n = _check_positive_int(n_per_class, "n_per_class")
    rng = as_generator(seed)
    xs, ys = [], []
    for k, (mean, cov) in enumerate(zip(FOUR_BLOBS_MEANS, FOUR_BLOBS_COVARIANCES)):
        # x = mu + C eps, C C^T = Sigma (Cholesky factor, the blob's covariance)
        C = np.linalg.cholesky(np.asarray(cov, dtype=np.float64))
        eps = rng.standard_normal((n, 2))
        xs.append(np.asarray(mean, dtype=np.float64) + eps @ C.T + np.asarray(shift))
        ys.append(np.full(n, k, dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


# ===========================================================================================
# GP-ELLA synthetic regression tasks (Clingerman & Eaton 2017, Sect. 5.1; data of Ruvolo &
# Eaton 2013, ELLA, Sect. 5)
# ===========================================================================================


class EllaTasks(NamedTuple):
    """Tasks of the linear factorized model ``y = x^T theta_t + eps``, ``theta_t = L s_t``.

    Attributes:
        tasks: list of ``(x (n_per_task, dim), y (n_per_task,))``.
        basis: ``L``, shape ``(dim, n_latent)``.
        codes: ``S`` with rows ``s_t``, shape ``(n_tasks, n_latent)`` (sparse).
    """

    tasks: list[tuple[np.ndarray, np.ndarray]]
    basis: np.ndarray
    codes: np.ndarray

    @property
    def parameters(self) -> np.ndarray:
        """True task parameters ``theta_t = L s_t`` as rows, shape ``(n_tasks, dim)``."""
        return self.codes @ self.basis.T


def ella_linear_tasks(n_tasks: int = 100, n_per_task: int = 100, dim: int = 13,
                      n_latent: int = 6, noise_std: float = 1.0, n_nonzero: int | None = None,
                      bias_feature: bool = True, seed: int | np.random.Generator = 0
                      ) -> EllaTasks:
    """Synthetic lifelong regression tasks (GP-ELLA Sect. 5.1, from Ruvolo & Eaton 2013).

    GP-ELLA: "100 synthetic tasks ... n_t = 100 instances with d = 13 features, with labels
    generated via a linear factorized model on six latent basis vectors with added Gaussian
    noise". The generative model, with every choice the papers leave open stated::

        L[i, j] ~ N(0, 1)                         basis, (dim, n_latent)
        s_t: n_nonzero entries at random positions (uniform without replacement),
             each ~ N(0, 1); the others exactly 0  (default n_nonzero = n_latent // 2,
             ELLA's "sparsity level 0.5")
        theta_t = L s_t                            (dim,)
        x_ti[:dim-1] ~ N(0, I); x_ti[dim-1] = 1    standard normal features + a bias feature
        y_ti = x_ti^T theta_t + eps_ti,  eps_ti ~ N(0, noise_std^2)

    Choices: ELLA draws 12 standard-normal features and appends the bias as the 13th feature
    "prior to learning", i.e. its true intercept is 0. Here the bias feature is part of the
    generative model, so the intercept ``theta_t[dim-1]`` comes from ``L s_t`` like every other
    coefficient and ``basis`` is ``(dim, n_latent)`` as in GP-ELLA's notation. With
    ``bias_feature=False`` all ``dim`` features are standard normal. Neither paper gives the
    noise level; ``noise_std=1.0`` (the noiseless signal has standard deviation about
    ``sqrt((dim - 1) * n_nonzero) ~ 6`` per task) is our choice.

    Args:
        n_tasks, n_per_task, dim, n_latent: sizes (paper: 100, 100, 13, 6).
        noise_std: standard deviation of the Gaussian label noise (> 0).
        n_nonzero: nonzero entries per code ``s_t`` (1..n_latent).
        bias_feature: last feature constant 1 (see above).
        seed: int seed or ``numpy.random.Generator``.

    Returns:
        :class:`EllaTasks` with ``tasks`` (list of ``(x (n_per_task, dim), y (n_per_task,))``),
        ``basis`` ``(dim, n_latent)`` and ``codes`` ``(n_tasks, n_latent)``.
    """
    T = _check_positive_int(n_tasks, "n_tasks")
    n = _check_positive_int(n_per_task, "n_per_task")
    d = _check_positive_int(dim, "dim", 2 if bias_feature else 1)
    k = _check_positive_int(n_latent, "n_latent")
    nnz = k // 2 if n_nonzero is None else n_nonzero
    if isinstance(nnz, bool) or not isinstance(nnz, (int, np.integer)) or not 1 <= nnz <= k:
        raise ValueError(f"n_nonzero: expected an int in 1..{k} (n_latent), received {nnz!r}")
    if not np.isfinite(noise_std) or noise_std <= 0:
        raise ValueError(f"noise_std: expected a positive float, received {noise_std!r}")
    rng = as_generator(seed)

    L = rng.standard_normal((d, k))
    S = np.zeros((T, k))
    for t in range(T):
        support = rng.choice(k, size=nnz, replace=False)
        S[t, support] = rng.standard_normal(nnz)
    Theta = S @ L.T  # rows theta_t = L s_t

    tasks = []
    for t in range(T):
        x = rng.standard_normal((n, d))
        if bias_feature:
            x[:, -1] = 1.0
        y = x @ Theta[t] + noise_std * rng.standard_normal(n)
        tasks.append((x, y))
    return EllaTasks(tasks=tasks, basis=L, codes=S)


# ===========================================================================================
# GP-ELLA robot arm kinematics (Clingerman & Eaton 2017, Sect. 5.1)
# ===========================================================================================

ROBOT_ARM_TARGET: tuple[float, float, float] = (0.1, 0.1, 0.1)
"""The point whose distance to the end effector is the regression target."""

ROBOT_ARM_JOINT_AXES: tuple[str, ...] = ("z", "y", "z", "y", "z", "y", "z", "y")
"""Rotation axis of each revolute joint in its own (local) frame: yaw, pitch, yaw, ..."""


def _rotation(axis: str, angle: np.ndarray) -> np.ndarray:
    """Rotation matrices about a local ``axis`` by ``angle`` (radians), shape ``angle.shape + (3, 3)``."""
    c, s = np.cos(angle), np.sin(angle)
    one, zero = np.ones_like(angle), np.zeros_like(angle)
    if axis == "x":
        rows = ((one, zero, zero), (zero, c, -s), (zero, s, c))
    elif axis == "y":
        rows = ((c, zero, s), (zero, one, zero), (-s, zero, c))
    elif axis == "z":
        rows = ((c, -s, zero), (s, c, zero), (zero, zero, one))
    else:
        raise ValueError(f"joint axis: expected 'x', 'y' or 'z', received {axis!r}")
    return np.stack([np.stack(r, axis=-1) for r in rows], axis=-2)


def arm_joint_positions(joint_angles: np.ndarray, link_lengths: np.ndarray,
                        joint_axes: tuple[str, ...] | None = None) -> np.ndarray:
    """Positions of the base, every joint and the end effector of a serial revolute arm.

    Forward kinematics as a chain of homogeneous transforms. Joint ``i`` (1-based) rotates by
    ``q_i`` about axis ``a_i`` of its local frame and is followed by a link of length ``l_i``
    along the local x axis::

        T_i = [[R_{a_i}(q_i), 0], [0, 1]] @ [[I, l_i e_x], [0, 1]]
        T_0^k = T_1 T_2 ... T_k,     p_k = T_0^k [0, 0, 0, 1]^T  (position after link k)

    The base frame is the world frame at the origin; with all angles zero the arm is
    stretched along the base x axis, so the end effector sits at ``(sum_i l_i, 0, 0)``.

    Args:
        joint_angles: ``q``, shape ``(n, dof)`` (radians), or ``(dof,)`` for one configuration.
        link_lengths: ``l``, shape ``(dof,)``.
        joint_axes: local rotation axes, default :data:`ROBOT_ARM_JOINT_AXES` (first ``dof``).

    Returns:
        ``(n, dof + 1, 3)`` positions ``p_0 = 0, p_1, ..., p_dof`` (``p_dof`` = end effector);
        ``(dof + 1, 3)`` for a single configuration.
    """
    q = np.asarray(joint_angles, dtype=np.float64)
    single = q.ndim == 1
    q = q[None] if single else q
    lengths = np.asarray(link_lengths, dtype=np.float64)
    if q.ndim != 2:
        raise ValueError(f"joint_angles: expected shape (n, dof), received {np.shape(joint_angles)}")
    dof = q.shape[1]
    if lengths.shape != (dof,):
        raise ValueError(f"link_lengths: expected shape ({dof},) (one length per joint), "
                         f"received {lengths.shape}")
    axes = ROBOT_ARM_JOINT_AXES if joint_axes is None else tuple(joint_axes)
    if len(axes) < dof:
        raise ValueError(f"joint_axes: expected at least {dof} axes, received {len(axes)}")
    n = q.shape[0]
    T = np.broadcast_to(np.eye(4), (n, 4, 4)).copy()  # T_0^0 = I
    positions = [T[:, :3, 3].copy()]
    for i in range(dof):
        step = np.broadcast_to(np.eye(4), (n, 4, 4)).copy()
        step[:, :3, :3] = _rotation(axes[i], q[:, i])
        link = np.eye(4)
        link[0, 3] = lengths[i]
        T = T @ step @ link  # T_0^{i+1} = T_0^i T_{i+1}
        positions.append(T[:, :3, 3].copy())
    out = np.stack(positions, axis=1)
    return out[0] if single else out


def arm_forward_kinematics(joint_angles: np.ndarray, link_lengths: np.ndarray,
                           joint_axes: tuple[str, ...] | None = None) -> np.ndarray:
    """End-effector position ``p_dof`` of :func:`arm_joint_positions`: ``(n, 3)`` (or ``(3,)``)."""
    return arm_joint_positions(joint_angles, link_lengths, joint_axes)[..., -1, :]


def robot_arm_link_lengths(n_tasks: int = 113, dof: int = 8,
                           link_length_range: tuple[float, float] = (0.1, 0.3),
                           seed: int | np.random.Generator = 0) -> np.ndarray:
    """The per-task link lengths that :func:`robot_arm_tasks` uses with the same arguments.

    ``l_{t,i} ~ U(link_length_range)`` independently, shape ``(n_tasks, dof)``. Drawn from the
    first of two generators spawned from ``seed`` (the second draws the configurations), so
    they are reproducible on their own.
    With a ``Generator`` as ``seed`` each call spawns new children, so only int seeds
    reproduce the lengths of a separate :func:`robot_arm_tasks` call.
    """
    rng_links, _ = _child_generators(seed, 2)
    return _draw_link_lengths(rng_links, n_tasks, dof, link_length_range)


def _draw_link_lengths(rng: np.random.Generator, n_tasks: int, dof: int,
                       link_length_range: tuple[float, float]) -> np.ndarray:
    T = _check_positive_int(n_tasks, "n_tasks")
    dof = _check_positive_int(dof, "dof")
    lo, hi = (float(v) for v in link_length_range)
    if not 0 < lo <= hi:
        raise ValueError(f"link_length_range: expected 0 < low <= high, received {link_length_range!r}")
    return rng.uniform(lo, hi, size=(T, dof))


def robot_arm_tasks(n_tasks: int = 113, min_configs: int = 50, max_configs: int = 100,
                    dof: int = 8, target: tuple[float, float, float] = ROBOT_ARM_TARGET,
                    link_length_range: tuple[float, float] = (0.1, 0.3),
                    angle_range: tuple[float, float] = (-np.pi / 2, np.pi / 2),
                    joint_axes: tuple[str, ...] | None = None,
                    seed: int | np.random.Generator = 0
                    ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Robot-arm kinematics tasks of GP-ELLA (Clingerman & Eaton 2017, Sect. 5.1).

    Paper: 113 tasks of simulated 8-DOF arms with revolute joints; link lengths fixed within a
    task, joint angles varying per instance; target = distance of the end effector to
    ``[0.1, 0.1, 0.1]``; at least 50 configurations per task. Our choices for what the paper
    leaves open:

    * kinematics: :func:`arm_joint_positions` (base at the origin, links along the local x
      axis, joint axes :data:`ROBOT_ARM_JOINT_AXES` = alternating yaw (z) and pitch (y));
    * link lengths ``l_{t,i} ~ U(0.1, 0.3)`` per task (:func:`robot_arm_link_lengths`), so the
      reach (0.8 to 2.4) is large compared to the target's distance 0.17 from the base;
    * joint angles ``q_{t,n,i} ~ U(-pi/2, pi/2)`` independently (typical joint limits);
    * configurations per task ``n_t ~ U{min_configs, ..., max_configs}`` (inclusive).

    Args:
        n_tasks, min_configs, max_configs, dof: sizes (paper: 113 tasks, >= 50, 8 DOF).
        target: the point in R^3.
        link_length_range, angle_range: ranges of the uniform draws above.
        joint_axes: override of :data:`ROBOT_ARM_JOINT_AXES`.
        seed: int seed or ``numpy.random.Generator``.

    Returns:
        List of ``(x (n_t, dof) joint angles, y (n_t,) distance ||p_dof(x) - target||)``.
    """
    T = _check_positive_int(n_tasks, "n_tasks")
    lo_n = _check_positive_int(min_configs, "min_configs")
    hi_n = _check_positive_int(max_configs, "max_configs")
    if hi_n < lo_n:
        raise ValueError(f"max_configs: expected >= min_configs ({lo_n}), received {hi_n}")
    a_lo, a_hi = (float(v) for v in angle_range)
    if not a_lo < a_hi:
        raise ValueError(f"angle_range: expected low < high, received {angle_range!r}")
    goal = np.asarray(target, dtype=np.float64)
    if goal.shape != (3,):
        raise ValueError(f"target: expected a point in R^3, received shape {goal.shape}")
    rng_links, rng = _child_generators(seed, 2)
    lengths = _draw_link_lengths(rng_links, T, dof, link_length_range)
    tasks = []
    for t in range(T):
        n_t = int(rng.integers(lo_n, hi_n, endpoint=True))
        q = rng.uniform(a_lo, a_hi, size=(n_t, dof))
        p = arm_forward_kinematics(q, lengths[t], joint_axes)
        tasks.append((q, np.linalg.norm(p - goal, axis=1)))
    return tasks


# ===========================================================================================
# VIPS synthetic data (Pescador-Barrios et al. 2024, Sect. 5.1 / App. F.1 and Sect. 5.2 / App. F.2.1;
# docs/vips.md, "Fig. 1")
# ===========================================================================================

VIPS_NOISE_STD: float = 0.2
"""Observation noise standard deviation of D1, D2, D3 (Fig. 1)."""

VIPS_SPEED_NOISE_STD: float = 1.0
"""Observation noise standard deviation of the speed/accuracy set (Fig. 2a)."""


def vips_function(x: np.ndarray) -> np.ndarray:
    """The test function of VIPS' synthetic experiments, ``f(x) = sin(2x) + cos(5x)``."""
    x = np.asarray(x, dtype=np.float64)
    return np.sin(2.0 * x) + np.cos(5.0 * x)


def _vips_observe(x: np.ndarray, noise_std: float, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(x (n, 1), y = f(x) + noise_std * eps (n,))``."""
    y = vips_function(x) + noise_std * rng.standard_normal(x.shape[0])
    return x.reshape(-1, 1), y


def vips_d1(seed: int | np.random.Generator = 0) -> tuple[np.ndarray, np.ndarray]:
    """VIPS data set D1 (Fig. 1, App. F.1): a growing input space.

    ``N = 500``, ``x ~ U(0, 10)`` sorted ascending, ``y = f(x) + 0.2 eps``. Split into 10
    consecutive batches by the streams, so later batches reach new inputs.

    Returns:
        ``x`` ``(500, 1)`` and ``y`` ``(500,)``.
    """
    rng = as_generator(seed)
    x = np.sort(rng.uniform(0.0, 10.0, size=500))
    return _vips_observe(x, VIPS_NOISE_STD, rng)


def vips_d2(seed: int | np.random.Generator = 0) -> tuple[np.ndarray, np.ndarray]:
    """VIPS data set D2 (Fig. 1, App. F.1): a stationary distribution.

    ``N = 150``, ``x ~ U(0, 10)`` i.i.d. in draw order (not sorted; the paper shuffles and
    splits into 10 batches), ``y = f(x) + 0.2 eps``.

    Returns:
        ``x`` ``(150, 1)`` and ``y`` ``(150,)``.
    """
    rng = as_generator(seed)
    x = rng.uniform(0.0, 10.0, size=150)
    return _vips_observe(x, VIPS_NOISE_STD, rng)


def _truncated_cauchy(rng: np.random.Generator, n: int, loc: float, scale: float,
                      low: float, high: float) -> np.ndarray:
    """``n`` draws of Cauchy(loc, scale) conditioned on ``(low, high)``, by inverse CDF.

    ``F(x) = 1/2 + arctan((x - loc) / scale) / pi``; ``u ~ U(F(low), F(high))`` and
    ``x = loc + scale * tan(pi (u - 1/2))`` is exactly the truncated law (no rejection loop).
    """
    F_lo = 0.5 + np.arctan((low - loc) / scale) / np.pi
    F_hi = 0.5 + np.arctan((high - loc) / scale) / np.pi
    u = rng.uniform(F_lo, F_hi, size=n)
    return np.clip(loc + scale * np.tan(np.pi * (u - 0.5)), low, high)


def vips_d3(seed: int | np.random.Generator = 0) -> tuple[np.ndarray, np.ndarray]:
    """VIPS data set D3 (Fig. 1, App. F.1): concentrated data with late outliers.

    1000 points ``x ~ U(4.5, 7)`` followed by 300 points from Cauchy(6, 1) truncated to
    ``(0, 10)`` (appended last, so the streams put them in the latter batches);
    ``y = f(x) + 0.2 eps``. The truncation conditions the Cauchy law on ``(0, 10)``
    (inverse-CDF sampling), our reading of "truncated".

    Returns:
        ``x`` ``(1300, 1)`` and ``y`` ``(1300,)``; rows 0..999 uniform, rows 1000..1299 Cauchy.
    """
    rng = as_generator(seed)
    x_uniform = rng.uniform(4.5, 7.0, size=1000)
    x_cauchy = _truncated_cauchy(rng, 300, loc=6.0, scale=1.0, low=0.0, high=10.0)
    return _vips_observe(np.concatenate([x_uniform, x_cauchy]), VIPS_NOISE_STD, rng)


class SpeedAccuracyData(NamedTuple):
    """The VIPS speed/accuracy set (Fig. 2a): training stream and a noiseless test grid."""

    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    f_test: np.ndarray


def vips_speed_accuracy(seed: int | np.random.Generator = 0) -> SpeedAccuracyData:
    """The synthetic set of VIPS' speed/accuracy comparison (Sect. 5.2, Fig. 2a, App. F.2.1).

    ``N = 1000``, ``x ~ U(0, 12)`` sorted ascending, ``y = f(x) + 1.0 eps``; test inputs
    ``linspace(0, 10, 500)`` with noiseless targets ``f(x_test)``. The streams cut the training
    set into 4 consecutive batches.

    Returns:
        :class:`SpeedAccuracyData` ``(x (1000, 1), y (1000,), x_test (500, 1), f_test (500,))``.
    """
    rng = as_generator(seed)
    x = np.sort(rng.uniform(0.0, 12.0, size=1000))
    x, y = _vips_observe(x, VIPS_SPEED_NOISE_STD, rng)
    x_test = np.linspace(0.0, 10.0, 500)
    return SpeedAccuracyData(x, y, x_test.reshape(-1, 1), vips_function(x_test))


def vips_speed_accuracy_reference() -> SpeedAccuracyData:
    """The same set as drawn by the authors' script (guiomarpescador/vips
    ``experiments/toy/run_toy.py``): NumPy's legacy generator seeded with 42, ``x = 12 *
    rand(1000, 1)``, then ``y = f(x) + randn(1000, 1)`` (in that order, so the draw is theirs
    value for value), rows sorted by ``x``; the same noiseless test grid.

    Returns:
        :class:`SpeedAccuracyData` ``(x (1000, 1), y (1000,), x_test (500, 1), f_test (500,))``.
    """
    rs = np.random.RandomState(42)
    x = rs.rand(1000, 1) * 12.0
    y = vips_function(x[:, 0]) + VIPS_SPEED_NOISE_STD * rs.randn(1000)
    order = np.argsort(x[:, 0], kind="stable")
    x_test = np.linspace(0.0, 10.0, 500)
    return SpeedAccuracyData(x[order], y[order], x_test.reshape(-1, 1), vips_function(x_test))


# ===========================================================================================
# Kalman OCL: piecewise-constant time series (Sect. 4.1, Fig. 1, App. C)
# ===========================================================================================

KALMAN_SERIES_LENGTH: int = 3058
"""Number of observations."""

KALMAN_SEGMENT_MEANS: tuple[float, ...] = (1.3, 1.0, 1.3, 0.95, 0.6, 0.25, 0.8, 0.5)
"""Mean of each of the 8 segments."""

KALMAN_CHANGE_POINTS: tuple[int, ...] = (451, 709, 958, 1547, 2147, 2769, 2957)
"""0-based index at which each new segment starts (segment k covers [c_{k-1}, c_k))."""

KALMAN_NOISE_VARIANCE: float = 0.01
"""Variance of the Gaussian observation noise."""


class PiecewiseSeries(NamedTuple):
    """A noisy piecewise-constant series.

    Attributes:
        y: observations, ``(n,)``.
        mean: the noiseless piecewise-constant mean, ``(n,)``.
        change_points: 0-based start index of segments 1..K-1, ``(K - 1,)`` int64.
        segment_means: mean of each segment, ``(K,)``.
    """

    y: np.ndarray
    mean: np.ndarray
    change_points: np.ndarray
    segment_means: np.ndarray


def kalman_piecewise_series(seed: int | np.random.Generator = 0) -> PiecewiseSeries:
    """The artificial series of the Kalman OCL paper (Sect. 4.1, Fig. 1, App. C).

    3058 observations in 8 segments with means :data:`KALMAN_SEGMENT_MEANS` and change points
    :data:`KALMAN_CHANGE_POINTS`; ``y_n = mean_n + eps_n``, ``eps_n ~ N(0, 0.01)``.

    Index convention (the paper says the change points "occurred at the time steps" listed):
    each change point is the 0-based index of the first observation of the new segment, so
    segment 0 is ``y[0:451]``, segment 1 ``y[451:709]``, ..., segment 7 ``y[2957:3058]``.

    Returns:
        :class:`PiecewiseSeries` with ``y`` ``(3058,)``, ``mean`` ``(3058,)``,
        ``change_points`` ``(7,)`` int64 and ``segment_means`` ``(8,)``.
    """
    rng = as_generator(seed)
    means = np.asarray(KALMAN_SEGMENT_MEANS, dtype=np.float64)
    change_points = np.asarray(KALMAN_CHANGE_POINTS, dtype=np.int64)
    # segment index of step n = number of change points <= n
    segment = np.searchsorted(change_points, np.arange(KALMAN_SERIES_LENGTH), side="right")
    mean = means[segment]
    y = mean + np.sqrt(KALMAN_NOISE_VARIANCE) * rng.standard_normal(KALMAN_SERIES_LENGTH)
    return PiecewiseSeries(y=y, mean=mean, change_points=change_points, segment_means=means)
