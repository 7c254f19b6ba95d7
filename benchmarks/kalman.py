"""Kalman-filter throughput (points per second) against two peers measured in the same run.

Workloads (Titsias et al. 2024; issue 4, item 7), float32 by default:

* **classification** (m features, K classes, shared covariance, eqs. 7-8), for m in
  {64, 256, 1024} and K in {10, 100}:
  - ``ours-sequential``: :func:`inference.kalman.filter` (one ``lax.scan`` step per point:
    one mat-vec ``A phi`` and one rank-1 update of A);
  - ``ours-blocked``: :func:`inference.kalman.filter_blocked` (blocks of B points, two
    matrix-matrix products per block);
  - both with fixed gamma and with learned gamma (the SGD step of eq. 9 with the Monte Carlo
    estimate eq. 12, S = 16 samples);
  - ``numpy-per-point``: a straightforward per-point NumPy loop of the same recursion (fixed
    gamma).
* **regression** (K = 1, eqs. 4-5, fixed gamma), same m: ours (sequential / blocked), the NumPy
  loop, and dynamax's ``lgssm_filter`` on the same model (state dimension m, dynamics
  ``gamma I``, process noise ``(1 - gamma^2) s_w2 I``, emission ``phi_n^T``) — dynamax runs the
  generic O(m^3)-per-step Kalman filter. If dynamax is not installed the script uses a generic
  O(m^3) filter written here in JAX instead and labels it ``generic-m3-jax`` (not dynamax).

Memory-bandwidth bound: the machine's copy bandwidth is measured in the same run (NumPy copy of
a 256 MiB array; bytes read + written per second); the bound for the per-point recursion is
``bandwidth / (2 m^2 bytes)`` points per second (each step reads and writes the m x m
covariance once). The blocked recursion reads A twice per *block*, so it is not bounded by this
per-step figure and can exceed "100 %".

GPU: the same code runs on a CUDA GPU (``--device cuda`` with a CUDA jaxlib); the blocked
recursion is the GPU design (few large kernels per block instead of per-point kernel launches).

    python benchmarks/kalman.py [--sizes 64 256 1024] [--classes 10 100] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import warnings
from pathlib import Path

import numpy as np
from _timing import best_of




def memory_bandwidth(n_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Copy bandwidth in bytes/s (read + write) of a ``n_bytes`` float32 array."""
    a = np.ones(n_bytes // 4, dtype=np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    t = best_of(lambda: np.copyto(b, a), repeats)
    return 2.0 * a.nbytes / t


def numpy_filter(A, M, X, Y, gamma, s_w2, s2):
    """Straightforward per-point NumPy recursion (eqs. 4-5 / 7-8), fixed gamma."""
    g2, c = gamma * gamma, (1.0 - gamma * gamma) * s_w2
    eye = np.eye(A.shape[0], dtype=A.dtype)
    for phi, y in zip(X, Y):
        A_pred = g2 * A + c * eye
        M_pred = gamma * M
        k = A_pred @ phi
        S = s2 + phi @ k
        M = M_pred + np.outer(k, (y - phi @ M_pred) / S)
        A = A_pred - np.outer(k, k) / S
    return A, M


def _generic_m3_filter(jnp, jax):
    """A generic LGSSM filter (dense F P F^T + Q, Cholesky solve of S): the O(m^3) baseline used
    when dynamax is unavailable."""

    def run(F, Q, H, R, mu0, P0, ys):
        def body(carry, xs):
            mu, P = carry
            h, y = xs
            mu, P = F @ mu, F @ P @ F.T + Q
            S = h @ P @ h + R
            k = P @ h / S
            return (mu + k * (y - h @ mu), P - jnp.outer(k, k) * S), None

        (mu, P), _ = jax.lax.scan(body, (mu0, P0), (H, ys))
        return mu, P

    return run


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--classes", type=int, nargs="+", default=[10, 100])
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--block-size", type=int, default=0,
                   help="points per block of ours-blocked (0: default_block_size(m) = m/8 in "
                        "[16, 128])")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seconds", type=float, default=1.0,
                   help="target duration of one timed run (sets the number of points)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "kalman.json"))
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from inference import kalman as kf
    from models.kalman import DriftPrior, GaussianLikelihood, SoftmaxLikelihood, SurrogateLikelihood

    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.dtype(args.dtype)
    device = jax.devices("gpu")[0] if args.device.startswith("cuda") else jax.devices("cpu")[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from dynamax.linear_gaussian_ssm import (ParamsLGSSM, ParamsLGSSMDynamics,
                                                     ParamsLGSSMEmissions, ParamsLGSSMInitial,
                                                     lgssm_filter)
        peer = "dynamax-lgssm_filter"
    except ImportError:
        lgssm_filter = None
        peer = "generic-m3-jax (dynamax not installed)"

    bandwidth = memory_bandwidth()
    itemsize = dtype.itemsize
    gamma, seed = 0.999, 0
    rows: list[dict] = []

    def bound(m: int) -> float:
        return bandwidth / (2.0 * m * m * itemsize)

    def record(method, task, m, K, n, seconds, learned=False):
        pps = n / seconds
        row = {"method": method, "task": task, "m": m, "K": K, "learned_gamma": learned,
               "dtype": args.dtype, "device": str(device.platform), "n_points": n,
               "seconds": seconds, "points_per_s": pps,
               "fraction_of_bandwidth_bound": pps / bound(m)}
        rows.append(row)
        print(f"{task:14s} {method:34s} m={m:5d} K={K:4d} learned={learned!s:5s} "
              f"{pps:12.0f} pts/s  ({100 * row['fraction_of_bandwidth_bound']:6.1f} % of bound)",
              flush=True)

    # the timed functions return the final state only (what a stream consumer keeps), so XLA
    # drops per-point diagnostics that the state does not need
    def final_state(fn):
        def run(key, state, X, Y, params, options, **kw):
            return fn(key, state, X, Y, params, options, **kw)[0]
        return run

    seq = jax.jit(final_state(kf.filter), static_argnames=("options",))
    blk = jax.jit(final_state(kf.filter_blocked), static_argnames=("options", "block_size"))

    def time_ours(fn, n_points, state, X, Y, params, options, **kw):
        key = jax.random.PRNGKey(seed)
        compiled = fn.lower(key, state, X, Y, params, options, **kw).compile()
        run = lambda: jax.block_until_ready(compiled(key, state, X, Y, params))  # noqa: E731
        run()
        return best_of(run, args.repeats)

    def block_for(m: int) -> int:
        return args.block_size or kf.default_block_size(m)

    def points_for(m: int, per_point_cost: float) -> int:
        # rough per-point seconds -> points for ~args.seconds, in multiples of the block size
        n = int(args.seconds / per_point_cost)
        B = block_for(m)
        return max(B, min(200_000, (n // B) * B))

    with jax.default_device(device):
        for m in args.sizes:
            rng = np.random.default_rng(m)
            s_w2 = 1.0 / m
            est = max(2.0 * m * m * itemsize / bandwidth, 4e-6)   # per-point estimate
            for K in [1] + list(args.classes):
                task = "regression" if K == 1 else "classification"
                n = points_for(m, est * (1.5 if K == 1 else 2.0))
                X = (rng.normal(size=(n, m)) / math.sqrt(m)).astype(args.dtype)
                if K == 1:
                    Y = rng.normal(size=(n,)).astype(args.dtype)
                    params = kf.KalmanParams(DriftPrior(s_w2), GaussianLikelihood(1.0))
                    lik = "gaussian"
                else:
                    Y = rng.integers(0, K, size=n).astype(np.int32)
                    params = kf.KalmanParams(DriftPrior(s_w2), SurrogateLikelihood(1.0 / K),
                                             SoftmaxLikelihood(1.0))
                    lik = "softmax"
                state = kf.init(m, K, prior=params.prior, initial_forgetting=gamma, dtype=dtype)
                Xj, Yj = jnp.asarray(X), jnp.asarray(Y)
                for learned in (False, True):
                    if K == 1 and learned:
                        continue
                    opts = kf.FilterOptions(likelihood=lik, learn_forgetting=learned,
                                            learning_rate=0.01, num_samples=args.samples)
                    t = time_ours(seq, n, state, Xj, Yj, params, opts)
                    record("ours-sequential (lax.scan)", task, m, K, n, t, learned)
                    t = time_ours(blk, n, state, Xj, Yj, params, opts, block_size=block_for(m))
                    record(f"ours-blocked (B={block_for(m)})", task, m, K, n, t, learned)
                # NumPy per-point loop, fixed gamma (fewer points: it is slow)
                n_np = max(16, min(n, int(0.5 * args.seconds / (est * 4 + 2e-5))))
                A0 = (s_w2 * np.eye(m)).astype(args.dtype)
                M0 = np.zeros((m, K), dtype=args.dtype)
                T = Y[:n_np, None].astype(args.dtype) if K == 1 else \
                    np.eye(K, dtype=args.dtype)[Y[:n_np]]
                noise = 1.0 if K == 1 else 1.0 / K
                t = best_of(lambda: numpy_filter(A0, M0, X[:n_np], T, gamma, s_w2, noise),
                             args.repeats)
                record("numpy-per-point", task, m, K, n_np, t)
                if K != 1:
                    continue
                # the peer on the regression case: same model, same state dimension
                n_pe = max(8, min(n, int(args.seconds / (2.0 * m**3 / 2e10 + 2e-5))))
                Xp, Yp = jnp.asarray(X[:n_pe]), jnp.asarray(Y[:n_pe])
                eye = jnp.eye(m, dtype=dtype)
                if lgssm_filter is not None:
                    dparams = ParamsLGSSM(
                        initial=ParamsLGSSMInitial(mean=jnp.zeros(m, dtype), cov=s_w2 * eye),
                        dynamics=ParamsLGSSMDynamics(
                            weights=gamma * eye, bias=jnp.zeros(m, dtype),
                            input_weights=jnp.zeros((m, 0), dtype),
                            cov=(1 - gamma**2) * s_w2 * eye),
                        emissions=ParamsLGSSMEmissions(
                            weights=Xp[:, None, :], bias=jnp.zeros(1, dtype),
                            input_weights=jnp.zeros((1, 0), dtype), cov=jnp.eye(1, dtype=dtype)))
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        fn = jax.jit(lgssm_filter)
                        compiled = fn.lower(dparams, Yp[:, None]).compile()
                        run = lambda: jax.block_until_ready(  # noqa: E731
                            compiled(dparams, Yp[:, None]).filtered_means)
                        run()
                        t = best_of(run, args.repeats)
                else:
                    gen = jax.jit(_generic_m3_filter(jnp, jax))
                    a = (gamma * eye, (1 - gamma**2) * s_w2 * eye, Xp, jnp.asarray(1.0, dtype),
                         jnp.zeros(m, dtype), s_w2 * eye, Yp)
                    compiled = gen.lower(*a).compile()
                    run = lambda: jax.block_until_ready(compiled(*a))  # noqa: E731
                    run()
                    t = best_of(run, args.repeats)
                record(peer, task, m, 1, n_pe, t)

    def pps(method_prefix, task, m, K, learned=False):
        for r in rows:
            if r["method"].startswith(method_prefix) and r["task"] == task and r["m"] == m \
                    and r["K"] == K and r["learned_gamma"] == learned:
                return r["points_per_s"]
        return float("nan")

    ratios = {}
    for m in args.sizes:
        ratios[f"regression_m{m}_sequential_over_peer"] = \
            pps("ours-sequential", "regression", m, 1) / pps(peer.split(" ")[0], "regression", m, 1)
        ratios[f"regression_m{m}_blocked_over_peer"] = \
            pps("ours-blocked", "regression", m, 1) / pps(peer.split(" ")[0], "regression", m, 1)
        for K in args.classes:
            ratios[f"classification_m{m}_K{K}_sequential_over_numpy"] = \
                pps("ours-sequential", "classification", m, K) / pps("numpy", "classification", m, K)
            ratios[f"classification_m{m}_K{K}_blocked_over_numpy"] = \
                pps("ours-blocked", "classification", m, K) / pps("numpy", "classification", m, K)
    result = {
        "benchmark": "kalman",
        "peer": peer,
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "jax": jax.__version__, "device": str(device)},
        "dtype": args.dtype,
        "memory_bandwidth_bytes_per_s": bandwidth,
        "bound_definition": "bandwidth / (2 m^2 itemsize): each per-point step reads and writes "
                            "the m x m covariance once",
        "rows": rows,
        "ratios": ratios,
        "notes": ["numpy-per-point and the peer run fewer points than ours (they are slower); "
                  "points/s is points / best-of-repeats seconds after compilation",
                  "learned_gamma rows include the delta SGD step (eq. 12 Monte Carlo with "
                  f"S = {args.samples} for classification)",
                  "GPU targets of the issue were not measured unless device is a GPU"],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps({"memory_bandwidth_GB_per_s": bandwidth / 1e9, **ratios}, indent=2))
    return result


if __name__ == "__main__":
    main()
