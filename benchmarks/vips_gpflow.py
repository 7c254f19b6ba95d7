"""GPflow side of ``benchmarks/vips.py`` (run with an interpreter that has the ``bench`` extra):
for each batch in the npz, fit GPflow's SGPR (Titsias 2009) on ``(x, y)`` with the inducing
inputs ``Z`` fixed, isotropic SE from ``hp = (variance, lengthscale, noise)``, by
``gpflow.optimizers.Scipy`` (L-BFGS-B). Each fit builds a new model, so its time includes the
tracing of that model's ``tf.function``; the first fit of the process (TensorFlow's own start-up)
is timed apart (``first_call_s``) and then batch 1 is fitted again."""

import json
import sys
import time

import numpy as np


def main(npz: str, out: str) -> None:
    import gpflow
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    gpflow.config.set_default_float(np.float64)
    data = np.load(npz)
    n = int(data["n"])

    def fit(i):
        x, y, Z, hp = data[f"x{i}"], data[f"y{i}"][:, None], data[f"Z{i}"], data[f"hp{i}"]
        k = gpflow.kernels.SquaredExponential(variance=hp[0], lengthscales=hp[1])
        # a noise left at the floor by the previous fit (1e-6, GPflow's own lower bound) has an
        # infinite unconstrained value, which GPflow refuses: start one part in 1e6 above it
        floor = gpflow.config.default_likelihood_positive_minimum()
        m = gpflow.models.SGPR((x, y), k, Z, noise_variance=max(float(hp[2]), floor * (1 + 1e-6)))
        gpflow.set_trainable(m.inducing_variable, False)
        t = time.perf_counter()
        res = gpflow.optimizers.Scipy().minimize(m.training_loss, m.trainable_variables)
        return time.perf_counter() - t, int(res.nit)

    first, _ = fit(0)
    rows = []
    for i in range(n):
        s, it = fit(i)
        rows.append({"fit_s": s, "iterations": it})
        print(f"gpflow batch {i + 1}: {s:.2f} s, {it} iterations", flush=True)
    with open(out, "w") as fh:
        json.dump({"first_call_s": first, "rows": rows}, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
