"""Kalman-filter throughput (points per second) of our engine against two peers.

Every side filters the same stream of N points (float32 unless ``--dtype float64``) and returns
the same outputs: the log marginal likelihood ``sum_n log p(y_n | y_{1:n-1})``, and, where the
side can return it without storing every step, the final filtered mean and covariance.

* ``ours-scan``: :func:`inference.kalman.filter` (one ``lax.scan`` step per point: one mat-vec
  ``A phi`` and one rank-1 update of A);
* ``ours-blocked``: :func:`inference.kalman.filter_blocked` at the default block size (8 in
  float32, the accuracy-safe choice) and at ``B = m / 8`` (faster; in float32 its rounding error
  grows with B, see :func:`inference.kalman.default_block_size`);
* ``numpy-inplace``: the same recursion in NumPy / BLAS with preallocated buffers and in-place
  rank-1 updates (``?ger``), fixed gamma;
* ``dynamax-lgssm_filter`` (regression only): dynamax's ``lgssm_filter`` on the same model
  (state ``w`` in R^m, dynamics ``gamma I``, process noise ``(1 - gamma^2) s_w2 I``, emission
  ``phi_n^T``, noise ``s2``). dynamax's linear-Gaussian API takes dense dynamics and has no
  structured (scaled-identity) path, so this is its *generic* O(m^3)-per-step filter. It is
  timed (i) returning the log marginal likelihood only (XLA then drops the per-step stacks) and
  (ii) returning its default posterior (all T filtered means and m x m covariances), labelled.
  It runs in a separate process (``--worker dynamax``): importing dynamax sets JAX's default
  matmul precision globally, which must not touch our timings.

Classification (K classes sharing one covariance, eqs. 7-8) is timed for ours and NumPy; dynamax
would need a state of dimension m K for it.

Bandwidth (per-point recursions only: scan and NumPy; the blocked recursion reads A twice per
block, not per point, so no byte count is given for it). What the figures mean:

* ``bytes_per_point = (3 m^2 + 3 m K + m) * itemsize``: the bytes one step must move between
  the core and wherever A and M live (A read twice -- for ``k = A phi`` and for the rank-1
  update, which needs k first -- and written once; M likewise; phi read once). A lower bound
  on the traffic of a per-point recursion, not a measurement of it.
* ``achieved_bytes_per_s = points_per_s * bytes_per_point``: the least traffic the measured
  speed implies.
* ``peak_copy_bandwidth``: a *measured peak copy bandwidth* of main memory: the fastest of
  ``--peak-repeats`` (30) ``np.copyto`` calls between two float32 arrays of max(256 MiB, 4x the
  last-level cache), counting the bytes read and written (STREAM's convention, no
  write-allocate traffic), measured before and after the timings; the larger of the two is
  the peak. On a loaded machine the best of many repeats is the least disturbed copy; it can
  still be low (then a ratio can exceed 1, see below).
* ``achieved_over_peak_copy_bandwidth``: the ratio of the two, always recorded;
  ``fraction_of_peak_copy_bandwidth`` is that ratio only when it is a fraction of a limit:
  the working set (A and M, ``(m^2 + m K) * itemsize``) is larger than every cache (read from
  sysfs, ``machine.caches_bytes``) and the ratio is at most 1; else it is null and
  ``bandwidth_note`` says why: a working set that fits in a cache is served from it (the
  byte count then bounds traffic to that cache, not to memory, and a ratio above 100 % says
  just that), and a ratio above 1 with a working set beyond the caches means the peak
  measurement itself was slowed by other jobs.

``--smoke``: tiny sizes (m = 16, K in {1, 3}, short streams, one repeat, a short peak
measurement), seconds; it checks the script runs and writes its JSON, its numbers mean
nothing.

    python benchmarks/kalman.py [--sizes 64 256 1024] [--classes 10] [--seconds 1.0]
        [--smoke] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
from _timing import best_of

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from ppl_cl.provenance import (code_version, machine_info, relative_to_repo,  # noqa: E402
                               write_json)

GAMMA, SEED = 0.999, 0


# ---------------------------------------------------------------------------------------------
# the stream (the same in every process)
# ---------------------------------------------------------------------------------------------
def stream(m: int, K: int, n: int, dtype: str):
    """Features ``(n, m)``, targets (regression ``(n,)`` reals; classification ``(n,)``
    labels), s_w2 = 1/m and s2 (1 regression, 1/K classification)."""
    # features and targets from two generators, so that the first n' points of a stream of n
    # are the stream of n' (the peers run shorter prefixes)
    rng_x, rng_y = (np.random.default_rng([1000 * m + K, i]) for i in (0, 1))
    X = (rng_x.normal(size=(n, m)) / math.sqrt(m)).astype(dtype)
    Y = rng_y.normal(size=n).astype(dtype) if K == 1 else \
        rng_y.integers(0, K, size=n).astype(np.int32)
    return X, Y, 1.0 / m, (1.0 if K == 1 else 1.0 / K)


def cache_sizes() -> dict[str, int]:
    """Sizes in bytes of the data and unified caches of CPU 0 (``{"L1d": ..., "L2": ...,
    "L3": ...}``) from Linux sysfs; empty where sysfs does not say."""
    units = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    out = {}
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind, level, size = ((d / f).read_text().strip() for f in ("type", "level", "size"))
            nbytes = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        except (OSError, ValueError):
            continue
        if kind != "Instruction":
            out[f"L{level}" + ("d" if kind == "Data" else "")] = nbytes
    return out


def peak_copy_bandwidth(array_bytes: int, repeats: int) -> dict:
    """Measured peak copy bandwidth of main memory: bytes read + written per second by the
    fastest of ``repeats`` ``np.copyto`` calls between two float32 arrays of ``array_bytes``
    (choose it well above the last-level cache, so that the copy goes to memory)."""
    a = np.ones(max(1, array_bytes // 4), dtype=np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)          # touches b's pages: no page faults in the timed copies
    t = best_of(lambda: np.copyto(b, a), repeats)
    return {"bytes_per_s": 2.0 * a.nbytes / t, "array_bytes": a.nbytes, "repeats": repeats,
            "best_copy_s": t}


def bandwidth_fields(points_per_s: float, bytes_per_point: int, working_set: int, peak: float,
                     caches: dict[str, int]) -> dict:
    """The bandwidth figures of one per-point row (their meaning: the module docstring)."""
    achieved = points_per_s * bytes_per_point
    ratio = achieved / peak
    fits = next((level for level, size in sorted(caches.items(), key=lambda kv: kv[1])
                 if working_set <= size), None)
    fraction = None
    if fits is not None:
        note = (f"working set ({working_set} bytes) fits in {fits}: bytes_per_point bounds "
                "traffic to that cache, not to memory; the ratio to the memory peak is no "
                "fraction of a limit" + (" (above 1: served from cache)" if ratio > 1 else ""))
    elif ratio > 1:
        note = ("above the measured peak although the working set " +
                ("is larger than every cache" if caches else "may not fit in a cache (cache "
                 "sizes unknown)") + ": the peak measurement was slowed or the data were in "
                "cache; no fraction")
    elif caches:
        fraction = ratio
        note = ("working set larger than every cache: the fraction of the measured peak copy "
                "bandwidth that the least traffic of the step reaches")
    else:
        note = "cache sizes unknown: the ratio may compare cache traffic with a memory peak"
    return {"bytes_per_point": bytes_per_point, "working_set_bytes": working_set,
            "working_set_fits_in": fits, "achieved_bytes_per_s": achieved,
            "achieved_over_peak_copy_bandwidth": ratio,
            "fraction_of_peak_copy_bandwidth": fraction, "bandwidth_note": note}


# ---------------------------------------------------------------------------------------------
# NumPy in-place filter
# ---------------------------------------------------------------------------------------------
def numpy_inplace_filter(X, T, gamma, s_w2, s2):
    """Eqs. 4-5 / 7-8 at fixed gamma, in place: ``k = gamma^2 A phi + (1 - gamma^2) s_w2 phi``,
    ``A <- gamma^2 A + (1 - gamma^2) s_w2 I - k k^T / S``, ``M <- gamma M + k r^T / S`` with
    BLAS ``?ger`` rank-1 updates on preallocated arrays. Returns ``(M, A, log marginal
    likelihood)`` (the Gaussian one-step log predictive of the targets ``T``, ``(n, K)``)."""
    from scipy.linalg.blas import get_blas_funcs

    n, m = X.shape
    K = T.shape[1]
    dtype = X.dtype
    A = np.zeros((m, m), dtype)
    A[np.diag_indices(m)] = s_w2
    M = np.zeros((m, K), dtype)
    k = np.empty(m, dtype)
    mu = np.empty(K, dtype)
    ger = get_blas_funcs("ger", (A,))
    g2, c = gamma * gamma, (1.0 - gamma * gamma) * s_w2
    diag = np.diag_indices(m)
    loglik = 0.0
    log2pi = math.log(2.0 * math.pi)
    for phi, t in zip(X, T):
        np.dot(A, phi, out=k)
        k *= g2
        k += c * phi
        S = s2 + float(phi @ k)
        np.dot(phi, M, out=mu)
        mu *= gamma
        r = t - mu
        loglik += -0.5 * float(K * (log2pi + math.log(S)) + (r @ r) / S)
        M *= gamma
        ger(1.0 / S, r, k, a=M.T, overwrite_a=True)          # M += k r^T / S (in place)
        A *= g2
        A[diag] += c
        ger(-1.0 / S, k, k, a=A.T, overwrite_a=True)         # A -= k k^T / S (in place)
    return M, A, loglik


# ---------------------------------------------------------------------------------------------
# dynamax (separate process)
# ---------------------------------------------------------------------------------------------
def dynamax_worker(args) -> None:
    """Time dynamax's lgssm_filter on the regression stream of size ``args.m``; print JSON."""
    import jax
    import jax.numpy as jnp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import dynamax
        from dynamax.linear_gaussian_ssm import (ParamsLGSSM, ParamsLGSSMDynamics,
                                                 ParamsLGSSMEmissions, ParamsLGSSMInitial,
                                                 lgssm_filter)
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.dtype(args.dtype)
    m, n = args.m, args.n
    X, Y, s_w2, s2 = stream(m, 1, n, args.dtype)
    eye = jnp.eye(m, dtype=dtype)
    # dynamax's initial distribution is that of w_1: N(0, s_w2 I) (variance preserving)
    params = ParamsLGSSM(
        initial=ParamsLGSSMInitial(mean=jnp.zeros(m, dtype), cov=s_w2 * eye),
        dynamics=ParamsLGSSMDynamics(weights=GAMMA * eye, bias=jnp.zeros(m, dtype),
                                     input_weights=jnp.zeros((m, 0), dtype),
                                     cov=(1 - GAMMA**2) * s_w2 * eye),
        emissions=ParamsLGSSMEmissions(weights=jnp.asarray(X)[:, None, :],
                                       bias=jnp.zeros(1, dtype),
                                       input_weights=jnp.zeros((1, 0), dtype),
                                       cov=s2 * jnp.eye(1, dtype=dtype)))
    ys = jnp.asarray(Y)[:, None]
    out = {"dynamax": dynamax.__version__, "default_matmul_precision":
           str(jax.config.jax_default_matmul_precision), "rows": []}
    for label, fn in (("loglik only", lambda p, y: lgssm_filter(p, y).marginal_loglik),
                      ("full posterior (T means and covariances)", lgssm_filter)):
        compiled = jax.jit(fn).lower(params, ys).compile()
        run = lambda: jax.block_until_ready(compiled(params, ys))  # noqa: E731
        value = run()
        t = best_of(run, args.repeats)
        ll = float(value if label == "loglik only" else value.marginal_loglik)
        out["rows"].append({"output": label, "seconds": t, "n_points": n, "loglik": ll})
    print(json.dumps(out))


def time_dynamax(args, m: int, n: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "dynamax", "--m", str(m),
           "--n", str(n), "--dtype", args.dtype, "--repeats", str(args.repeats)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                         env.get("PYTHONPATH", "")])
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------
def _arguments(argv) -> argparse.Namespace:
    """The command line (``--smoke``: the smoke test's tiny sizes)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--classes", type=int, nargs="+", default=[10])
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=0.5,
                   help="target duration of one timed run of ours (sets N)")
    p.add_argument("--no-dynamax", action="store_true")
    p.add_argument("--peak-repeats", type=int, default=30,
                   help="np.copyto calls of the peak copy bandwidth (best of), before and after")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes (m 16, K 1 and 3, one repeat): seconds, numbers meaningless")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "kalman.json"))
    p.add_argument("--worker", choices=["dynamax"], help=argparse.SUPPRESS)
    p.add_argument("--m", type=int, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.sizes, args.classes, args.repeats, args.seconds = [16], [3], 1, 0.01
        args.peak_repeats = 3
    return args


class _Recorder:
    """``rec(method, m, K, n, seconds, bytes_per_point=None, **extra)``: one row of the
    result (and a printed line)."""

    def __init__(self, itemsize: int):
        self.rows: list[dict] = []
        self.itemsize = itemsize

    def __call__(self, method, m, K, n, seconds, bytes_per_point=None, **extra):
        row = {"method": method, "task": "regression" if K == 1 else "classification", "m": m,
               "K": K, "n_points": n, "seconds": seconds, "points_per_s": n / seconds, **extra}
        if bytes_per_point is not None:
            row["bandwidth"] = (n / seconds, bytes_per_point, (m * m + m * K) * self.itemsize)
        self.rows.append(row)
        print(f"{row['task']:14s} {method:44s} m={m:5d} K={K:4d} {n / seconds:12.0f} pts/s",
              flush=True)


def _outputs(fn):
    """Our side returns the final state and the log marginal likelihood."""
    import jax.numpy as jnp

    def run(key, state, X, Y, params, options, **kw):
        final, info = fn(key, state, X, Y, params, options, **kw)
        return final.mean, final.covariance, jnp.sum(info.log_predictive)
    return run


def _time_size(args, m: int, K: int, dtype, record, scan, blocked) -> None:
    """Time every filter at state size ``m`` and ``K`` outputs (1: regression), recording each
    with ``record`` (a :class:`_Recorder`)."""
    import jax
    import jax.numpy as jnp

    from inference import kalman as kf
    from models.kalman import DriftPrior, GaussianLikelihood, SoftmaxLikelihood, SurrogateLikelihood

    itemsize = dtype.itemsize
    bpp = (3 * m * m + 3 * m * K + m) * itemsize
    # N from a rough per-point cost (at least 2 m^2 flops), a multiple of 128
    n = int(args.seconds / max(4e-6, 4.0 * m * m / 4e9))
    n = max(512, min(100_000, n // 128 * 128))
    X, Y, s_w2, s2 = stream(m, K, n, args.dtype)
    if K == 1:
        params = kf.KalmanParams(DriftPrior(s_w2), GaussianLikelihood(s2))
        options = kf.FilterOptions(learning_rate=0.1, likelihood="gaussian", learn_forgetting=False)
    else:
        params = kf.KalmanParams(DriftPrior(s_w2), SurrogateLikelihood(s2),
                                 SoftmaxLikelihood(1.0))
        options = kf.FilterOptions(learning_rate=0.1, likelihood="softmax",
                                   learn_forgetting=False, num_samples=1)
    state = kf.init(m, K, prior=params.prior, initial_forgetting=GAMMA, dtype=dtype)
    Xj, Yj = jnp.asarray(X), jnp.asarray(Y)
    key = jax.random.PRNGKey(SEED)
    lls = {}
    for method, fn, kw in (
            ("ours-scan", scan, {}),
            (f"ours-blocked (B={kf.default_block_size(m, dtype)}, default)", blocked, {}),
            (f"ours-blocked (B={kf.default_block_size(m)} = m/8)", blocked,
             {"block_size": kf.default_block_size(m)})):
        compiled = fn.lower(key, state, Xj, Yj, params, options, **kw).compile()
        run = lambda: jax.block_until_ready(compiled(key, state, Xj, Yj, params))  # noqa: E731,B023
        out = run()
        t = best_of(run, args.repeats)
        extra = {"bytes_per_point": bpp} if method == "ours-scan" else {}
        lls[method] = float(out[2])
        record(method, m, K, n, t, **extra)
    # NumPy: the Gaussian (surrogate) log marginal of the same targets
    n_np = max(256, min(n, int(0.5 * args.seconds / (2.0 * m * m / 2e9 + 1.5e-5))))
    T = Y[:n_np, None] if K == 1 else np.eye(K, dtype=args.dtype)[Y[:n_np]]
    t = best_of(lambda: numpy_inplace_filter(X[:n_np], T, GAMMA, s_w2, s2),
                args.repeats)
    record("numpy-inplace", m, K, n_np, t, bytes_per_point=bpp)
    if K == 1:
        # consistency: the same log marginal likelihood on the first n_np points
        ll_np = numpy_inplace_filter(X[:n_np], T, GAMMA, s_w2, s2)[2]
        _, _, ll_ours = jax.jit(_outputs(kf.filter), static_argnames=("options",))(
            key, state, Xj[:n_np], Yj[:n_np], params, options)
        record.rows[-1]["loglik_rel_diff_vs_ours"] = abs(ll_np - float(ll_ours)) / abs(ll_np)
    if K == 1 and not args.no_dynamax:
        n_dx = max(64, min(n, int(0.5 * args.seconds / (6.0 * m**3 / 2e10 + 2e-5))))
        res = time_dynamax(args, m, n_dx)
        if "error" in res:
            print(f"dynamax failed at m={m}: {res['error']}", flush=True)
            return
        _, _, ll_ours = jax.jit(_outputs(kf.filter), static_argnames=("options",))(
            key, state, Xj[:n_dx], Yj[:n_dx], params, options)
        for r in res["rows"]:
            record(f"dynamax-lgssm_filter, generic dense ({r['output']})", m, 1,
                   r["n_points"], r["seconds"], dynamax=res["dynamax"],
                   loglik_rel_diff_vs_ours=abs(r["loglik"] - float(ll_ours))
                   / abs(float(ll_ours)))


def _add_bandwidth(rows: list[dict], peak: float, caches: dict) -> None:
    """The bandwidth fields of the per-point rows (:func:`bandwidth_fields`)."""
    for row in rows:
        if "bandwidth" in row:
            row.update(bandwidth_fields(*row.pop("bandwidth"), peak, caches))
            print(f"{row['task']:14s} {row['method']:44s} m={row['m']:5d} K={row['K']:4d} "
                  f"{row['achieved_bytes_per_s'] / 1e9:7.2f} GB/s least traffic, "
                  f"{row['achieved_over_peak_copy_bandwidth']:.2f} x measured peak copy "
                  f"bandwidth ({row['bandwidth_note'].split(':')[0]})", flush=True)


def _ratios(args, rows: list[dict]) -> dict:
    """Our points per second over the NumPy and dynamax filters', per size and task."""
    def pps(prefix, m, K):
        got = [r["points_per_s"] for r in rows
               if r["method"].startswith(prefix) and r["m"] == m and r["K"] == K]
        return got[0] if got else float("nan")

    ratios = {}
    for m in args.sizes:
        for K in [1] + list(args.classes):
            task = "regression" if K == 1 else f"classification_K{K}"
            scan_pps = pps("ours-scan", m, K)
            best_ours = max(r["points_per_s"] for r in rows
                            if r["method"].startswith("ours") and r["m"] == m and r["K"] == K)
            ratios[f"{task}_m{m}_scan_over_numpy_inplace"] = scan_pps / pps("numpy-inplace", m, K)
            ratios[f"{task}_m{m}_best_ours_over_numpy_inplace"] = \
                best_ours / pps("numpy-inplace", m, K)
            if K == 1 and any(r["method"].startswith("dynamax") and r["m"] == m for r in rows):
                dx = pps("dynamax-lgssm_filter, generic dense (loglik only)", m, 1)
                ratios[f"{task}_m{m}_scan_over_dynamax_generic_loglik_only"] = scan_pps / dx
                ratios[f"{task}_m{m}_best_ours_over_dynamax_generic_loglik_only"] = best_ours / dx
    return ratios


def _result(args, jax, rows, ratios, peaks, peak, caches, load_before) -> dict:
    """The benchmark's JSON."""
    return {
        "benchmark": "kalman",
        "machine": {**machine_info(), "jax": jax.__version__, "device": str(jax.devices()[0]),
                    "load_average_before": load_before, "load_average_after": os.getloadavg(),
                    "threads": "OMP/MKL/OPENBLAS_NUM_THREADS="
                               f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, XLA_FLAGS="
                               f"{os.environ.get('XLA_FLAGS', 'unset')}",
                    "caches_bytes": caches},
        "code": code_version(),
        "settings": {"sizes": args.sizes, "classes": args.classes, "repeats": args.repeats,
                     "seconds": args.seconds, "dynamax": not args.no_dynamax,
                     "peak_repeats": args.peak_repeats, "smoke": args.smoke},
        "dtype": args.dtype,
        "gamma": GAMMA,
        "outputs": "ours: final mean, final covariance and log marginal likelihood; "
                   "numpy-inplace: the same; dynamax: the log marginal likelihood (loglik only) "
                   "or its default full posterior",
        "peak_copy_bandwidth": {"bytes_per_s": peak, "before": peaks[0], "after": peaks[1],
                                "definition": "measured peak copy bandwidth of main memory: "
                                "bytes read + written per second by the fastest np.copyto "
                                "between two float32 arrays of array_bytes (max(256 MiB, 4x the "
                                "last-level cache)), best of `repeats`, measured before and "
                                "after the timings; the larger is the peak"},
        "bandwidth_definition": "per-point rows (ours-scan, numpy-inplace): bytes_per_point = "
                                "(3 m^2 + 3 m K + m) * itemsize (A read twice -- k = A phi, "
                                "then the rank-1 update, which needs k -- and written once; M "
                                "likewise; phi once): a lower bound on the bytes a per-point "
                                "step moves between the core and wherever A and M live, not a "
                                "measurement; achieved_bytes_per_s = points_per_s * "
                                "bytes_per_point (the least traffic the speed implies); "
                                "achieved_over_peak_copy_bandwidth = achieved_bytes_per_s / "
                                "peak_copy_bandwidth.bytes_per_s; "
                                "fraction_of_peak_copy_bandwidth = that ratio only when the "
                                "working set (A and M, (m^2 + m K) * itemsize) is larger than "
                                "every cache (machine.caches_bytes) and the ratio is at most "
                                "1, else null: a working set that fits in a cache is served "
                                "from it, the byte count then bounds traffic to that cache, "
                                "not to memory, and no ratio above 1 is meaningful "
                                "(bandwidth_note says which case a row is). No byte count for "
                                "the blocked recursion (it reads A twice per block)",
        "rows": rows,
        "ratios": ratios,
        "notes": ["points/s = N / best of the repeats after compilation; NumPy and dynamax run "
                  "fewer points than ours (they are slower)",
                  "fixed gamma everywhere (the filters, not the delta step)",
                  "the machine is shared: the load averages are recorded"]
        + (["--smoke: tiny sizes, the numbers mean nothing"] if args.smoke else []),
    }


def main(argv=None) -> dict:
    args = _arguments(argv)
    if args.worker == "dynamax":
        dynamax_worker(args)
        return {}

    import jax
    import jax.numpy as jnp

    from inference import kalman as kf

    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.dtype(args.dtype)
    load_before = os.getloadavg()
    caches = cache_sizes()
    peak_bytes = max(256 * 1024 ** 2, 4 * max(caches.values(), default=0))
    peaks = [peak_copy_bandwidth(peak_bytes, args.peak_repeats)]
    record = _Recorder(dtype.itemsize)
    scan = jax.jit(_outputs(kf.filter), static_argnames=("options",))
    blocked = jax.jit(_outputs(kf.filter_blocked), static_argnames=("options", "block_size"))
    for m in args.sizes:
        for K in [1] + list(args.classes):
            _time_size(args, m, K, dtype, record, scan, blocked)

    # the peak again after the timings (the load may have changed); the larger one is the peak
    peaks.append(peak_copy_bandwidth(peak_bytes, args.peak_repeats))
    peak = max(pk["bytes_per_s"] for pk in peaks)
    rows = record.rows
    _add_bandwidth(rows, peak, caches)
    ratios = _ratios(args, rows)
    result = _result(args, jax, rows, ratios, peaks, peak, caches, load_before)
    print(json.dumps(ratios, indent=2))
    print(f"wrote {relative_to_repo(write_json(args.out, result))}")
    return result

if __name__ == "__main__":
    main()
