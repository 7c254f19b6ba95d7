"""Type-II maximum likelihood: L-BFGS on a log-parametrized pytree of positive hyperparameters.

Generic over the model: it minimizes any scalar ``objective(params)`` of a pytree whose leaves
are positive (kernel variances, lengthscales, noise variances). It optimizes
``raw = log(params)`` so positivity needs no constraint, and ``lower_bounds`` (same structure,
a floor per leaf, 0 for none) become box constraints on ``raw``, e.g. a noise floor of 1e-6.

The objective and its gradient are one jitted ``value_and_grad`` call; the iterations run in
SciPy's L-BFGS-B (Byrd et al. 1995) — the robust choice of GPflow and of the papers' code.
Used by the exact GP (R&W eq. 5.8 gradients via autodiff), VIPS (fit of kernel + noise on the
online ELBO) and GP-ELLA (per-task GP fits, eq. 4 of Clingerman & Eaton 2017).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

__all__ = ["Type2MLResult", "NonFiniteObjectiveError", "fit_type2ml"]


class NonFiniteObjectiveError(FloatingPointError):
    """The objective was NaN / inf at the starting point."""


class Type2MLResult(NamedTuple):
    """Outcome of :func:`fit_type2ml`.

    Attributes:
        params: the optimized pytree (positive leaves).
        value: objective at ``params`` (e.g. negative log marginal likelihood).
        num_iterations: L-BFGS iterations taken.
        converged: SciPy's success flag.
        message: SciPy's termination message.
    """

    params: Any
    value: float
    num_iterations: int
    converged: bool
    message: str


_VALUE_AND_GRAD_CACHE: dict = {}


def _value_and_grad(objective: Callable, unravel: Callable, key: Any):
    """``jit(value_and_grad)`` of ``flat -> objective(exp(unravel(flat)), *args)``, cached by
    ``(objective, structure)`` so that repeated fits of one objective compile once per shape."""
    fn = _VALUE_AND_GRAD_CACHE.get(key) if key is not None else None
    if fn is None:
        @jax.jit
        def fn(flat: jax.Array, *args):
            return jax.value_and_grad(
                lambda f: objective(jax.tree_util.tree_map(jnp.exp, unravel(f)), *args))(flat)
        if key is not None:
            _VALUE_AND_GRAD_CACHE[key] = fn
    return fn


def fit_type2ml(objective: Callable[..., jax.Array], init_params: Any, *,
                lower_bounds: Any = None, upper_bounds: Any = None, max_iterations: int = 1000,
                tolerance: float = 1e-9, gradient_tolerance: float = 1e-8,
                args: tuple = ()) -> Type2MLResult:
    """Minimize ``objective(params)`` over positive pytree ``params`` by L-BFGS-B in log space.

    Args:
        objective: scalar function of a pytree like ``init_params`` (jit-compatible).
        init_params: starting point; every leaf must be positive.
        lower_bounds: optional pytree with the structure of ``init_params``; a leaf is a
            floor for the matching hyperparameter (broadcast over it), 0 for none.
        upper_bounds: optional pytree like ``lower_bounds``; a leaf is a ceiling, ``inf`` for
            none (VIPS bounds the kernel variance to [1e-6, 2e3], as the authors' code).
        max_iterations: L-BFGS iteration cap.
        tolerance: relative reduction of the objective at which to stop (SciPy ``ftol``).
        gradient_tolerance: projected-gradient size at which to stop (SciPy ``gtol``; GPflow's
            ``Scipy`` optimizer leaves SciPy's default 1e-5).
        args: extra arguments, ``objective(params, *args)`` (arrays or pytrees of arrays). With
            ``args`` the jitted value-and-grad is cached per ``objective`` (pass a module-level
            function), so a stream of fits with equal shapes compiles once.

    Raises:
        NonFiniteObjectiveError: if the objective is not finite at ``init_params``.
    """
    raw0 = jax.tree_util.tree_map(lambda p: jnp.log(jnp.asarray(p)), init_params)
    flat0, unravel = ravel_pytree(raw0)
    dtype = flat0.dtype

    structure = jax.tree_util.tree_structure(raw0)
    shapes = tuple((tuple(np.shape(leaf)), str(jnp.asarray(leaf).dtype))
                   for leaf in jax.tree_util.tree_leaves(raw0))
    vg = _value_and_grad(objective, unravel, (objective, structure, shapes) if args else None)

    def value_and_grad(flat: jax.Array):
        return vg(flat, *args)

    bounds = None
    if lower_bounds is not None or upper_bounds is not None:
        n = int(flat0.shape[0])
        lo_flat, hi_flat = np.full(n, -np.inf), np.full(n, np.inf)
        if lower_bounds is not None:
            lows = jax.tree_util.tree_map(
                lambda p, lb: np.broadcast_to(np.log(np.float64(lb)) if lb > 0 else -np.inf,
                                              np.shape(p)),
                init_params, lower_bounds)
            lo_flat = np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(lows)])
        if upper_bounds is not None:
            highs = jax.tree_util.tree_map(
                lambda p, ub: np.broadcast_to(np.log(np.float64(ub)) if np.isfinite(ub)
                                              else np.inf, np.shape(p)),
                init_params, upper_bounds)
            hi_flat = np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(highs)])
        if np.any(lo_flat > hi_flat):
            raise ValueError("lower_bounds exceed upper_bounds for some hyperparameter")
        bounds = [(float(lo) if np.isfinite(lo) else None, float(hi) if np.isfinite(hi) else None)
                  for lo, hi in zip(lo_flat, hi_flat)]
        flat0 = jnp.clip(flat0, jnp.asarray(lo_flat, dtype), jnp.asarray(hi_flat, dtype))

    v0, _ = value_and_grad(flat0)
    if not np.isfinite(float(v0)):
        raise NonFiniteObjectiveError(f"objective is {float(v0)} at the initial hyperparameters "
                                      f"{jax.tree_util.tree_map(np.asarray, init_params)}")

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        v, g = value_and_grad(jnp.asarray(x, dtype))
        v, g = float(v), np.asarray(g, dtype=np.float64)
        if not (np.isfinite(v) and np.isfinite(g).all()):
            # a failed factorization mid line-search: a huge value makes L-BFGS-B backtrack
            return 1e300, np.zeros_like(g)
        return v, g

    from scipy.optimize import minimize

    res = minimize(fun, np.asarray(flat0, dtype=np.float64), jac=True, method="L-BFGS-B",
                   bounds=bounds, options={"maxiter": max_iterations, "ftol": tolerance,
                                           "gtol": gradient_tolerance})
    flat = jnp.asarray(res.x, dtype)
    params = jax.tree_util.tree_map(jnp.exp, unravel(flat))
    return Type2MLResult(params, float(value_and_grad(flat)[0]), int(res.nit), bool(res.success),
                         str(res.message))
