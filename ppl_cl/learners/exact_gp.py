"""Exact GP regression learner (JAX, float64): the exact-GP baseline of VIPS and the
"individual GP" learner of GP-ELLA.

``update(batch)`` appends the batch to the data seen so far and refits the hyperparameters by
type-II maximum likelihood (L-BFGS-B in log space or in GPflow's parametrization, warm-started
from the current values, optionally with the noise reset to its start); ``predict`` gives
the exact Gaussian predictive (Rasmussen & Williams 2006, eqs. 2.25-2.26). The model and its
closed forms are in :mod:`models.exact_gp`, the optimizer in :mod:`inference.type2ml`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_cl.batch import Batch, as_numpy
from ppl_cl.configs.exact_gp import ExactGPConfig
from ppl_cl.inference_data import iid_attrs
from ppl_cl.learner import Learner, check_batch
from ppl_cl.numerics import enable_x64
from ppl_cl.predictive import GaussianPredictive

__all__ = ["ExactGP", "ExactGPConfig"]


class ExactGP(Learner):
    """Exact GP regression with type-II ML hyperparameters (:class:`ExactGPConfig`).

    ``ExactGP(kernel="se")`` or ``ExactGP(ExactGPConfig(...))``. The predictive includes the
    observation noise unless ``predict(..., latent=True)``.
    """

    learner_name = "exact-gp"
    config_cls = ExactGPConfig

    def __init__(self, config: ExactGPConfig | None = None, /, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        enable_x64()
        self._X: np.ndarray | None = None
        self._y: np.ndarray | None = None
        self._params = None  # models.exact_gp.GPRegressionParams, built on first data
        self._posterior = None

    # -- helpers -----------------------------------------------------------------------------
    def _initial_params(self, input_dim: int):
        import jax.numpy as jnp

        from models import kernels_jax
        from models.exact_gp import GPRegressionParams

        c = self.config
        ard = c.kernel.endswith("-ard")
        ls = jnp.full((input_dim if ard else 1,), c.lengthscale, jnp.float64)
        klass = kernels_jax.SquaredExponential if c.kernel.startswith("se") else kernels_jax.Matern52
        return GPRegressionParams(klass(jnp.asarray(c.variance, jnp.float64), ls),
                                  jnp.asarray(c.noise_variance, jnp.float64))

    def _condition(self) -> None:
        import jax.numpy as jnp

        from models.exact_gp import condition

        self._posterior = condition(self._params, jnp.asarray(self._X), jnp.asarray(self._y))

    @property
    def input_dim(self) -> int | None:
        return None if self._X is None else int(self._X.shape[1])

    @property
    def num_data(self) -> int:
        return 0 if self._X is None else int(self._X.shape[0])

    @property
    def params(self):
        """Current :class:`models.exact_gp.GPRegressionParams` (``None`` before any data)."""
        return self._params

    def hyperparameters(self) -> dict[str, np.ndarray]:
        """Kernel variance, lengthscale(s) and noise variance as NumPy arrays."""
        if self._params is None:
            raise self._not_fitted("hyperparameters()")
        k = self._params.kernel
        return {"variance": np.asarray(k.variance), "lengthscale": np.asarray(k.lengthscale),
                "noise_variance": np.asarray(self._params.noise_variance)}

    def leave_one_out(self) -> np.ndarray:
        """Closed-form leave-one-out log predictive of every training point, ``(n,)``
        (Rasmussen & Williams 2006, eq. 5.12; :func:`models.exact_gp.leave_one_out`): what
        ``az.loo`` of :meth:`to_inference_data` estimates by importance sampling."""
        from models.exact_gp import leave_one_out

        if self._posterior is None:
            raise self._not_fitted("leave_one_out()")
        return np.asarray(leave_one_out(self._posterior))

    def log_marginal_likelihood(self) -> float:
        """``log p(y | X, theta)`` of all data seen, at the current hyperparameters."""
        import jax.numpy as jnp

        from models.exact_gp import log_marginal_likelihood

        if self._X is None:
            raise self._not_fitted("log_marginal_likelihood()")
        return float(log_marginal_likelihood(self._params, jnp.asarray(self._X), jnp.asarray(self._y)))

    # -- protocol ----------------------------------------------------------------------------
    def update(self, batch: Batch) -> dict[str, Any]:
        """Append ``batch`` to the data and refit hyperparameters (if ``optimize``)."""
        import jax.numpy as jnp

        from inference.type2ml import fit_type2ml
        from models.exact_gp import GPRegressionParams, negative_log_marginal_likelihood

        check_batch(batch).validate(input_dim=self.input_dim, regression=True)
        x_new = as_numpy(batch.x).astype(np.float64)
        y_new = as_numpy(batch.y).astype(np.float64)
        X = x_new if self._X is None else np.concatenate([self._X, x_new])
        y = y_new if self._y is None else np.concatenate([self._y, y_new])
        params = self._params if self._params is not None else self._initial_params(X.shape[1])
        c = self.config
        if c.reset_noise:
            params = params._replace(noise_variance=jnp.asarray(c.noise_variance, jnp.float64))
        record: dict[str, Any] = {"num_data": int(X.shape[0])}
        if c.optimize:
            Xj, yj = jnp.asarray(X), jnp.asarray(y)
            import jax

            from inference.type2ml import gpflow_parametrization

            if c.parametrization == "gpflow":
                bounds = dict(transforms=gpflow_parametrization(
                    params, noise_shift=c.min_noise_variance))
            else:   # no floors on kernel hyperparameters, one on the noise
                bounds = dict(lower_bounds=GPRegressionParams(
                    kernel=jax.tree_util.tree_map(lambda _: 0.0, params.kernel),
                    noise_variance=c.min_noise_variance))
            result = fit_type2ml(negative_log_marginal_likelihood, params, data=(Xj, yj),
                                 max_iterations=c.max_iterations, tolerance=c.tolerance,
                                 gradient_tolerance=c.gradient_tolerance, **bounds)
            params = result.params
            record.update(log_marginal_likelihood=-result.value,
                          iterations=result.num_iterations, converged=result.converged)
        # commit the new state only after everything above succeeded
        self._X, self._y, self._params = X, y, params
        self._condition()
        if "log_marginal_likelihood" not in record:
            record["log_marginal_likelihood"] = self.log_marginal_likelihood()
        record.update({k: v.tolist() for k, v in self.hyperparameters().items()})
        return record

    def predict(self, x: Any, task_id: int | None = None, *, latent: bool = False,
                full_cov: bool = False):
        """Gaussian predictive at ``x (n, d)``; ``latent=True`` excludes the noise variance.
        Before any update it is the GP prior's at the starting hyperparameters.

        With ``full_cov=True`` returns ``(mean (n,), covariance (n, n))`` NumPy arrays instead.
        """
        import jax.numpy as jnp

        from models.exact_gp import posterior_predictive

        xb = Batch(x).validate(input_dim=self.input_dim, require_targets=False, allow_empty=True)
        xj = jnp.asarray(as_numpy(xb.x), jnp.float64)
        if self._posterior is None:          # the prior predictive at the starting values
            params = self._initial_params(xj.shape[1])
            K = params.kernel(xj)
            noise = params.noise_variance * jnp.eye(xj.shape[0]) if not latent else 0.0
            mean, var = jnp.zeros(xj.shape[0]), K + noise
            if not full_cov:
                var = jnp.diagonal(var)
        else:
            mean, var = posterior_predictive(self._params, self._posterior, xj,
                                             include_noise=not latent, full_cov=full_cov)
        if full_cov:
            return np.asarray(mean), np.asarray(var)
        return GaussianPredictive(np.asarray(mean), np.asarray(var))

    def state_dict(self) -> dict[str, Any]:
        if self._params is None:
            return {"X": None, "y": None, "hyperparameters": None}
        return {"X": self._X, "y": self._y, "hyperparameters": self.hyperparameters()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import jax.numpy as jnp

        if state["X"] is None:
            self._X = self._y = self._params = self._posterior = None
            return
        X, y = np.asarray(state["X"], np.float64), np.asarray(state["y"], np.float64)
        hp = state["hyperparameters"]
        params = self._initial_params(X.shape[1])
        if np.shape(hp["lengthscale"]) != tuple(params.kernel.lengthscale.shape):
            raise ValueError(f"lengthscale: expected shape {tuple(params.kernel.lengthscale.shape)} "
                             f"for kernel {self.config.kernel!r}, received {np.shape(hp['lengthscale'])}")
        params = params._replace(
            kernel=params.kernel.__class__(jnp.asarray(hp["variance"]), jnp.asarray(hp["lengthscale"])),
            noise_variance=jnp.asarray(hp["noise_variance"]))
        self._X, self._y, self._params = X, y, params
        self._condition()

    def to_inference_data(self, x: Any = None, y: Any = None, *, x_new: Any = None,
                          num_draws: int = 500, num_chains: int | None = None, seed: int = 0):
        """ArviZ InferenceData of the exact posterior over latent ``f``.

        Args:
            x, y: the points of ``posterior.f``, ``observed_data.y`` and the pointwise
                ``log_likelihood.y`` (``log N(y_i | f_i, sigma^2)`` per draw). Default (both
                None): the training data, so that ``az.loo`` estimates the GP's leave-one-out
                predictive (Rasmussen & Williams 2006, eq. 5.12). ``x`` without ``y``: the
                posterior at ``x``, no likelihood.
            x_new: out-of-sample inputs (test points): ``predictions`` holds ``f`` and
                ``y = f + noise`` there, drawn jointly with ``posterior.f`` (one Gaussian over
                ``[f(x); f(x_new)]``), ``predictions_constant_data`` the inputs ``x``.
            num_draws: independent draws in all, split into ``num_chains`` chains
                (default :func:`ppl_cl.inference_data.default_chains`).

        Hyperparameters (point estimates) go to ``constant_data``; the attributes say the draws
        are independent (``sampling``). The posterior covariance of a smooth kernel at many
        inputs is singular to rounding: its Cholesky takes a small jitter without a warning
        (:func:`ppl_cl.inference_data.gaussian_draws`).
        """
        import xarray as xr

        from ppl_cl.inference_data import gaussian_draws, gaussian_log_likelihood, \
            samples_to_inference_data

        if self._posterior is None:
            raise self._not_fitted("to_inference_data")
        if x is None and y is None:
            x, y = self._X, self._y
        x = self._X if x is None else as_numpy(Batch(x).validate(
            input_dim=self.input_dim, require_targets=False).x).astype(np.float64)
        if y is not None:
            y = Batch(x, as_numpy(y)).validate(regression=True).y.astype(np.float64)
        n = x.shape[0]
        xs = None
        if x_new is not None:
            xs = as_numpy(Batch(x_new).validate(input_dim=self.input_dim,
                                                require_targets=False).x).astype(np.float64)
        mean, cov = self.predict(x if xs is None else np.concatenate([x, xs]), latent=True,
                                 full_cov=True)
        rng = np.random.default_rng(seed)
        f_all = gaussian_draws({"f": mean}, {"f": cov}, num_draws=num_draws,
                               num_chains=num_chains, seed=rng, warn_jitter=False)["f"]
        hp = self.hyperparameters()
        s2 = float(hp["noise_variance"])
        chains, draws = f_all.shape[:2]
        sample_coords = {"chain": np.arange(chains), "draw": np.arange(draws)}
        groups: dict[str, Any] = {}
        if y is not None:
            groups["log_likelihood"] = {"y": gaussian_log_likelihood(f_all[..., :n], y, s2)}
            groups["observed_data"] = {"y": y}
        if xs is not None:
            f_new = f_all[..., n:]
            y_new = f_new + np.sqrt(s2) * rng.standard_normal(f_new.shape)
            dims = ("chain", "draw", "obs_new")
            groups["predictions"] = xr.Dataset(
                {"f": (dims, f_new), "y": (dims, y_new)},
                coords={**sample_coords, "obs_new": np.arange(xs.shape[0])})
            groups["predictions_constant_data"] = xr.Dataset(
                {"x": (("obs_new", "input_dim"), xs)},
                coords={"obs_new": np.arange(xs.shape[0]),
                        "input_dim": np.arange(xs.shape[1])})
        return samples_to_inference_data(
            {"f": f_all[..., :n]}, dims={"f": ["obs"], "y": ["obs"], "lengthscale": ["input_dim"]},
            coords={"obs": np.arange(n)}, constant_data=hp,
            attrs=iid_attrs("exact Gaussian posterior of GP regression given the "
                            "hyperparameters (point estimates, in constant_data)"), **groups)
