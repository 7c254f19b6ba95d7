"""Type-II maximum likelihood: L-BFGS-B on a log-parametrized pytree of positive
hyperparameters, as an engine.

Generic over the model: it minimizes any scalar ``objective(params, *data)`` of a pytree whose
leaves are positive (kernel variances, lengthscales, noise variances). It optimizes
``raw = log(params)`` so positivity needs no constraint, and ``lower_bounds`` /
``upper_bounds`` (same structure, a floor / ceiling per leaf; 0 / None for none) become box
constraints on ``raw``, e.g. a noise floor of 1e-6 or the kernel-variance box [1e-6, 2e3] of
the VIPS reference.

The objective and its gradient are one jitted ``value_and_grad`` call (cached by objective,
parameter structure and data shapes, so fits of one model on data of one shape compile once);
the iterations run in SciPy's L-BFGS-B (Byrd et al. 1995) — the robust choice of GPflow and of
the papers' code.

Engine contract (:mod:`inference.base`): :class:`Type2ML` ``init(params) -> Type2MLState`` and
``step(rng, state, data) -> (Type2MLState, Type2MLInfo)``, where one step is one type-II ML fit
on the step's data (a batch, a task), warm-started from the state's hyperparameters: what a
continual learner does with each batch (the exact GP refits on all data so far, VIPS after each
batch's selection, GP-ELLA per task). :func:`fit_type2ml` is the one-call form.

Used by the exact GP (R&W eq. 5.8 gradients via autodiff), VIPS (fit of kernel + noise on the
online ELBO) and GP-ELLA (per-task GP fits, eq. 4 of Clingerman & Eaton 2017).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

__all__ = ["Type2MLResult", "Type2MLState", "Type2MLInfo", "Type2ML", "NonFiniteObjectiveError",
           "fit_type2ml"]


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


class Type2MLState(NamedTuple):
    """State of :class:`Type2ML`: the current hyperparameters (a pytree of arrays), the
    objective there (NaN before the first step) and the number of fits done."""

    params: Any
    value: Any
    fits: int


class Type2MLInfo(NamedTuple):
    """One step (fit): the objective at its end (``loss``), L-BFGS iterations, SciPy's success
    flag and termination message."""

    loss: float
    iterations: int
    converged: bool
    message: str


@functools.lru_cache(maxsize=64)
def _value_and_grad(objective: Callable, unravel: Callable, free: tuple[bool, ...]) -> Callable:
    def f(flat, data):
        return objective(_positive(unravel(flat), free), *data)

    return jax.jit(jax.value_and_grad(f))


def _positive(raw: Any, free: tuple[bool, ...]) -> Any:
    """``exp`` of every leaf of ``raw`` except the ``free`` ones (optimized as they are)."""
    leaves, treedef = jax.tree_util.tree_flatten(raw)
    return jax.tree_util.tree_unflatten(
        treedef, [x if f else jnp.exp(x) for x, f in zip(leaves, free)])


class _Unravel:
    """``ravel_pytree``'s inverse keyed by the pytree's structure, shapes and dtypes (hashable,
    so the jitted objective is reused across fits of the same parameter layout)."""

    def __init__(self, template: Any):
        leaves, self.treedef = jax.tree_util.tree_flatten(template)
        self.shapes = tuple(tuple(np.shape(x)) for x in leaves)
        self.dtypes = tuple(str(jnp.result_type(x)) for x in leaves)
        _, self._unravel = ravel_pytree(template)

    def __call__(self, flat):
        return self._unravel(flat)

    def __hash__(self) -> int:
        return hash((self.treedef, self.shapes, self.dtypes))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Unravel) and (self.treedef, self.shapes, self.dtypes) == (
            other.treedef, other.shapes, other.dtypes)


class Type2ML:
    """Type-II ML engine: each ``step`` fits ``objective(params, *data)`` by L-BFGS-B from the
    state's hyperparameters (module docstring).

    Args:
        objective: scalar function of a pytree of positive hyperparameters and the data arrays
            (jit-compatible; a module-level function compiles once per data shape).
        lower_bounds, upper_bounds: pytrees like the parameters (a leaf broadcast over its
            hyperparameter; 0 / None: no floor, None / inf: no ceiling).
        unconstrained: optional pytree of bools like the parameters; a ``True`` leaf is optimized
            on the real line as it is (no log, no bounds), e.g. a multi-task GP's task factor.
        max_iterations: L-BFGS iterations per fit; tolerance: SciPy's ``ftol`` (relative
            reduction of the objective at which to stop); gtol: SciPy's ``gtol``.
    """

    def __init__(self, objective: Callable[..., jax.Array], *, lower_bounds: Any = None,
                 upper_bounds: Any = None, unconstrained: Any = None,
                 max_iterations: int = 1000, tolerance: float = 1e-9, gtol: float = 1e-8):
        self.objective = objective
        self.lower_bounds, self.upper_bounds = lower_bounds, upper_bounds
        self.unconstrained = unconstrained
        self.max_iterations, self.tolerance, self.gtol = int(max_iterations), tolerance, gtol

    def init(self, params: Any) -> Type2MLState:
        return Type2MLState(jax.tree_util.tree_map(jnp.asarray, params), jnp.nan, 0)

    def step(self, rng: Any, state: Type2MLState, data: tuple = ()
             ) -> tuple[Type2MLState, Type2MLInfo]:
        """One L-BFGS-B fit on ``data`` from ``state.params`` (``rng`` is unused).

        Raises:
            NonFiniteObjectiveError: if the objective is not finite at the start.
        """
        init_params = state.params
        leaves0, treedef = jax.tree_util.tree_flatten(init_params)
        if self.unconstrained is None:
            free = tuple(False for _ in leaves0)
        else:
            free = tuple(bool(f) for f in jax.tree_util.tree_leaves(self.unconstrained))
            if len(free) != len(leaves0):
                raise ValueError(f"unconstrained: expected {len(leaves0)} leaves (one per leaf "
                                 f"of the parameters), received {len(free)}")
        raw0 = jax.tree_util.tree_unflatten(treedef, [
            jnp.asarray(p) if f else jnp.log(jnp.asarray(p)) for p, f in zip(leaves0, free)])
        flat0, _ = ravel_pytree(raw0)
        unravel = _Unravel(raw0)
        dtype = flat0.dtype
        value_and_grad = _value_and_grad(self.objective, unravel, free)
        data = tuple(data)

        bounds = None
        if self.lower_bounds is not None or self.upper_bounds is not None:
            def log_bound(bounds_tree, default):
                if bounds_tree is None:
                    return np.full(flat0.shape, default)
                bounds = jax.tree_util.tree_leaves(bounds_tree, is_leaf=lambda x: x is None)
                out = [np.broadcast_to(np.log(np.float64(b)) if b is not None and 0 < b < np.inf
                                       and not f else default, np.shape(p))
                       for p, b, f in zip(leaves0, bounds, free)]
                return np.concatenate([np.ravel(a) for a in out])

            lo = log_bound(self.lower_bounds, -np.inf)
            hi = log_bound(self.upper_bounds, np.inf)
            bounds = [(float(a) if np.isfinite(a) else None, float(b) if np.isfinite(b) else None)
                      for a, b in zip(lo, hi)]
            flat0 = jnp.clip(flat0, jnp.asarray(lo, dtype), jnp.asarray(hi, dtype))

        v0, _ = value_and_grad(flat0, data)
        if not np.isfinite(float(v0)):
            raise NonFiniteObjectiveError(f"objective is {float(v0)} at the initial "
                                          f"hyperparameters "
                                          f"{jax.tree_util.tree_map(np.asarray, init_params)}")

        def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
            v, g = value_and_grad(jnp.asarray(x, dtype), data)
            v, g = float(v), np.asarray(g, dtype=np.float64)
            if not (np.isfinite(v) and np.isfinite(g).all()):
                # a failed factorization mid line-search: a huge value makes L-BFGS-B backtrack
                return 1e300, np.zeros_like(g)
            return v, g

        from scipy.optimize import minimize

        res = minimize(fun, np.asarray(flat0, dtype=np.float64), jac=True, method="L-BFGS-B",
                       bounds=bounds, options={"maxiter": self.max_iterations,
                                               "ftol": self.tolerance, "gtol": self.gtol})
        flat = jnp.asarray(res.x, dtype)
        params = _positive(unravel(flat), free)
        value = float(value_and_grad(flat, data)[0])
        return (Type2MLState(params, value, state.fits + 1),
                Type2MLInfo(value, int(res.nit), bool(res.success), str(res.message)))


def fit_type2ml(objective: Callable[..., jax.Array], init_params: Any, *,
                data: tuple | None = (), lower_bounds: Any = None, upper_bounds: Any = None,
                unconstrained: Any = None, max_iterations: int = 1000,
                tolerance: float = 1e-9, gradient_tolerance: float = 1e-8) -> Type2MLResult:
    """Minimize ``objective(params, *data)`` over the positive pytree ``params`` by L-BFGS-B in
    log space (one :meth:`Type2ML.step`).

    Args:
        objective: scalar function of a pytree like ``init_params`` and the ``data`` arrays
            (jit-compatible).
        init_params: starting point; every leaf must be positive.
        data: arrays passed to ``objective`` after the parameters.
        lower_bounds, upper_bounds: optional pytrees with the structure of ``init_params``; a
            leaf is a floor / ceiling for the matching hyperparameter (broadcast over it), 0 /
            None / inf for none.
        unconstrained: optional pytree of bools (see :class:`Type2ML`).
        max_iterations: L-BFGS iteration cap.
        tolerance: relative reduction of the objective at which to stop (SciPy ``ftol``).
        gradient_tolerance: projected-gradient size at which to stop (SciPy ``gtol``; GPflow's
            ``Scipy`` optimizer keeps SciPy's default 1e-5).

    Raises:
        NonFiniteObjectiveError: if the objective is not finite at ``init_params``.
    """
    engine = Type2ML(objective, gtol=gradient_tolerance, lower_bounds=lower_bounds, upper_bounds=upper_bounds,
                     unconstrained=unconstrained, max_iterations=max_iterations,
                     tolerance=tolerance)
    state, info = engine.step(None, engine.init(init_params), tuple(data or ()))
    return Type2MLResult(state.params, info.loss, info.iterations, info.converged,
                         info.message)
