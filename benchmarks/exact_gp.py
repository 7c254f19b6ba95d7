"""Exact GP speed against scikit-learn's GaussianProcessRegressor, measured in the same run.

For n in {500, 1000, 2000} points in d = 8 (ARD SE kernel + Gaussian noise) it times

* one log marginal likelihood + gradient evaluation (ours: jitted JAX autodiff through the
  Cholesky; sklearn: its analytic gradient, R&W eq. 5.9) — the inner step of type-II ML;
* a whole type-II ML fit from the same initial point (ours: ExactGP.update; sklearn: fit with
  no restarts), with the log marginal likelihood each reaches.

Writes ``benchmarks/results/exact_gp.json`` (or ``--out``) with ratios ``sklearn / ours``
(> 1: we are faster), the machine (load averages before and after) and the commit.
``--smoke``: n = 40 in d = 2, one repeat (seconds; checks the script, the numbers mean nothing).

    python benchmarks/exact_gp.py [--sizes 500 1000 2000] [--repeats 5] [--smoke] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from _timing import best_of

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from ppl_cl.provenance import (code_version, machine_info, relative_to_repo,  # noqa: E402
                               write_json)


def _arguments(argv) -> argparse.Namespace:
    """The command line (``--smoke``: the smoke test's tiny sizes)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000])
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--smoke", action="store_true",
                   help="n 40, d 2, one repeat: seconds, the numbers mean nothing")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "exact_gp.json"))
    args = p.parse_args(argv)
    if args.smoke:
        args.sizes, args.dim, args.repeats = [40], 2, 1
    return args


def main(argv=None) -> dict:
    args = _arguments(argv)
    load_before = os.getloadavg()

    import jax
    import jax.numpy as jnp
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process import kernels as sk

    from models.exact_gp import GPRegressionParams, log_marginal_likelihood
    from models.kernels_jax import SquaredExponential
    from ppl_cl import Batch
    from ppl_cl.learners.exact_gp import ExactGP
    from ppl_cl.numerics import enable_x64

    enable_x64()
    rows = []
    for n in args.sizes:
        rng = np.random.default_rng(n)
        X = rng.uniform(-2, 2, size=(n, args.dim))
        y = np.sin(X @ rng.normal(size=args.dim)) + 0.1 * rng.normal(size=n)
        Xj, yj = jnp.asarray(X), jnp.asarray(y)

        # one value-and-gradient evaluation at the same hyperparameters
        raw = jnp.zeros(args.dim + 2)

        @jax.jit
        def ours_vg(r):
            def f(r):
                p = GPRegressionParams(SquaredExponential(jnp.exp(r[0]), jnp.exp(r[1:-1])),
                                       jnp.exp(r[-1]))
                return log_marginal_likelihood(p, Xj, yj)
            return jax.value_and_grad(f)(r)

        jax.block_until_ready(ours_vg(raw))  # compile outside the timing
        t_ours = best_of(lambda: jax.block_until_ready(ours_vg(raw)), args.repeats)
        kernel = sk.ConstantKernel(1.0) * sk.RBF(np.ones(args.dim)) + sk.WhiteKernel(1.0)
        gpr = GaussianProcessRegressor(kernel, alpha=0.0, optimizer=None).fit(X, y)
        t_sk = best_of(lambda: gpr.log_marginal_likelihood(gpr.kernel_.theta, eval_gradient=True),
                        args.repeats)

        # whole type-II ML fit from variance 1, lengthscales 1, noise 0.1
        t0 = time.perf_counter()
        rec = ExactGP(kernel="se-ard", noise_variance=0.1).update(Batch(X, y))
        fit_ours = time.perf_counter() - t0
        kernel = (sk.ConstantKernel(1.0, (1e-5, 1e5)) * sk.RBF(np.ones(args.dim), (1e-5, 1e5))
                  + sk.WhiteKernel(0.1, (1e-6, 1e5)))
        t0 = time.perf_counter()
        ref = GaussianProcessRegressor(kernel, alpha=0.0, n_restarts_optimizer=0).fit(X, y)
        fit_sk = time.perf_counter() - t0
        row = {"n": n, "d": args.dim,
               "value_and_grad_s": {"ppl_cl": t_ours, "sklearn": t_sk, "ratio_sklearn_over_ours": t_sk / t_ours},
               "fit_s": {"ppl_cl": fit_ours, "sklearn": fit_sk, "ratio_sklearn_over_ours": fit_sk / fit_ours},
               "fit_log_marginal_likelihood": {"ppl_cl": rec["log_marginal_likelihood"],
                                               "sklearn": float(ref.log_marginal_likelihood_value_)},
               "fit_iterations_ppl_cl": rec["iterations"]}
        rows.append(row)
        print(json.dumps(row))

    result = {"benchmark": "exact_gp", "device": "cpu",
              "machine": {**machine_info(), "jax": jax.__version__,
                          "load_average_before": load_before,
                          "load_average_after": os.getloadavg(),
                          "XLA_FLAGS": os.environ.get("XLA_FLAGS")},
              "code": code_version(),
              "settings": {"sizes": args.sizes, "dim": args.dim, "repeats": args.repeats,
                           "smoke": args.smoke},
              "note": "fit time includes JIT compilation for ppl_cl"
                      + ("; --smoke: tiny sizes, the numbers mean nothing" if args.smoke else ""),
              "rows": rows}
    print(f"wrote {relative_to_repo(write_json(args.out, result))}")
    return result


if __name__ == "__main__":
    main()
