"""Type-II maximum likelihood: L-BFGS on a log-parametrized pytree of positive hyperparameters.

Generic over the model: it minimizes any scalar ``objective(params)`` of a pytree whose leaves
are positive (kernel variances, lengthscales, noise variances). It optimizes
``raw = log(params)`` so positivity needs no constraint, and ``lower_bounds`` (same structure,
a floor per leaf, 0 for none) become box constraints on ``raw``, e.g. a noise floor of 1e-6.

The objective and its gradient are one jitted ``value_and_grad`` call; the iterations run in
SciPy's L-BFGS-B (Byrd et al. 1995) — the robust choice of GPflow and of the papers' code.
An objective that takes its data as arguments, ``objective(params, *data)`` with ``data=...``,
is compiled once per (objective, parameter structure, data shapes) and reused by later calls:
a learner fitting many small tasks of a few padded sizes (GP-ELLA) pays the compilation once
per size instead of once per task. Leaves marked in ``unconstrained`` are optimized as they
are (no log), e.g. the task-covariance factor W of a multi-task GP.
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


_COMPILED: dict[Any, Callable] = {}


def _compiled_value_and_grad(objective: Callable, treedef: Any, shapes: tuple,
                             free: tuple[bool, ...], unravel: Callable) -> Callable:
    """``jit(value_and_grad)`` of ``flat, data -> objective(params(flat), *data)``, cached per
    (objective, parameter structure and shapes, free-leaf mask); jit itself keys on data shapes."""
    key = (objective, treedef, shapes, free)
    if key not in _COMPILED:
        def to_params(flat):
            leaves, tdef = jax.tree_util.tree_flatten(unravel(flat))
            return jax.tree_util.tree_unflatten(
                tdef, [x if f else jnp.exp(x) for x, f in zip(leaves, free)])

        _COMPILED[key] = jax.jit(jax.value_and_grad(
            lambda flat, data: objective(to_params(flat), *data)))
    return _COMPILED[key]


def fit_type2ml(objective: Callable[..., jax.Array], init_params: Any, *,
                data: tuple | None = None, lower_bounds: Any = None, upper_bounds: Any = None,
                unconstrained: Any = None, max_iterations: int = 1000,
                tolerance: float = 1e-9) -> Type2MLResult:
    """Minimize ``objective(params)`` over positive pytree ``params`` by L-BFGS-B in log space.

    Args:
        objective: scalar function of a pytree like ``init_params`` (jit-compatible); called
            as ``objective(params, *data)`` when ``data`` is given.
        init_params: starting point; every leaf must be positive (unless unconstrained).
        data: optional tuple of arrays passed to ``objective`` after ``params``; then the
            compiled objective is cached and reused across calls (module docstring).
        lower_bounds: optional pytree with the structure of ``init_params``; a leaf is a
            floor for the matching hyperparameter (broadcast over it), 0 for none.
        upper_bounds: the same for ceilings, ``inf`` (or 0) for none.
        unconstrained: optional pytree of bools with the structure of ``init_params``; a
            ``True`` leaf is optimized on the real line (no log, no bounds).
        max_iterations: L-BFGS iteration cap.
        tolerance: relative reduction of the objective at which to stop (SciPy ``ftol``).

    Raises:
        NonFiniteObjectiveError: if the objective is not finite at ``init_params``.
    """
    leaves0, treedef = jax.tree_util.tree_flatten(init_params)
    if unconstrained is None:
        free = tuple(False for _ in leaves0)
    else:
        free = tuple(bool(f) for f in jax.tree_util.tree_leaves(unconstrained))
        if len(free) != len(leaves0):
            raise ValueError(f"unconstrained: expected {len(leaves0)} leaves (one per leaf of "
                             f"init_params), received {len(free)}")
    raw0 = jax.tree_util.tree_unflatten(
        treedef, [jnp.asarray(p) if f else jnp.log(jnp.asarray(p)) for p, f in zip(leaves0, free)])
    flat0, unravel = ravel_pytree(raw0)
    dtype = flat0.dtype

    if data is None:
        @jax.jit
        def value_and_grad(flat: jax.Array):
            def f(fl):
                leaves, tdef = jax.tree_util.tree_flatten(unravel(fl))
                return objective(jax.tree_util.tree_unflatten(
                    tdef, [x if fr else jnp.exp(x) for x, fr in zip(leaves, free)]))
            return jax.value_and_grad(f)(flat)
    else:
        shapes = tuple((tuple(np.shape(p)), str(jnp.asarray(p).dtype)) for p in leaves0)
        compiled = _compiled_value_and_grad(objective, treedef, shapes, free, unravel)
        data_t = tuple(data)

        def value_and_grad(flat: jax.Array):
            return compiled(flat, data_t)

    def _log_bound_flat(bound_tree, default, is_lower):
        if bound_tree is None:
            return None
        leaves_b = jax.tree_util.tree_leaves(bound_tree)
        out = []
        for p, b, f in zip(leaves0, leaves_b, free):
            b = np.float64(b)
            ok = (b > 0) and np.isfinite(b) and not f
            out.append(np.broadcast_to(np.log(b) if ok else default, np.shape(p)))
        return np.concatenate([np.ravel(a) for a in out])

    lo_flat = _log_bound_flat(lower_bounds, -np.inf, True)
    hi_flat = _log_bound_flat(upper_bounds, np.inf, False)
    bounds = None
    if lo_flat is not None or hi_flat is not None:
        n = flat0.shape[0]
        lo_flat = np.full(n, -np.inf) if lo_flat is None else lo_flat
        hi_flat = np.full(n, np.inf) if hi_flat is None else hi_flat
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
                                           "gtol": 1e-8})
    flat = jnp.asarray(res.x, dtype)
    leaves, tdef = jax.tree_util.tree_flatten(unravel(flat))
    params = jax.tree_util.tree_unflatten(tdef, [x if f else jnp.exp(x)
                                                 for x, f in zip(leaves, free)])
    return Type2MLResult(params, float(value_and_grad(flat)[0]), int(res.nit), bool(res.success),
                         str(res.message))
