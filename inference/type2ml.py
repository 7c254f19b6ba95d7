"""Type-II maximum likelihood: L-BFGS on a pytree of positive hyperparameters, as an engine.

Generic over the model: it minimizes any scalar ``objective(params)`` of a pytree whose leaves
are positive (kernel variances, lengthscales, noise variances). The leaves are optimized in an
unconstrained coordinate ``raw`` with

    p = lower + exp(raw)                              (a floor ``lower >= 0``; 0 for none)
    p = lower + (upper - lower) sigmoid(raw)          (a box, where ``upper`` is finite)

so positivity and bounds (a noise floor of 1e-6, the kernel-variance box [1e-6, 2e3] of the
VIPS reference) need no constrained optimizer.

:class:`Type2ML` follows the engine contract of :mod:`inference.base`: ``init(params) ->
Type2MLState`` and ``step(rng, state, batch=None) -> (Type2MLState, Type2MLInfo)``, one L-BFGS
iteration (Nocedal & Wright 2006, Algorithm 7.5, memory 10) with a zoom line search satisfying
the strong Wolfe conditions (``optax.lbfgs``); the state (iterate, value, gradient, the
optimizer's curvature pairs) is a NamedTuple of arrays. :func:`fit_type2ml` runs the steps in
one jitted ``lax.while_loop`` until the relative decrease of the objective falls below
``tolerance`` (SciPy's ``ftol`` rule) or the gradient's largest entry below ``gtol``.

Used by the exact GP (R&W eq. 5.8 gradients via autodiff), and available to VIPS (fit of kernel
+ noise on the online ELBO) and GP-ELLA (per-task GP fits, eq. 4 of Clingerman & Eaton 2017).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

__all__ = ["Type2MLResult", "Type2MLState", "Type2MLInfo", "Type2ML", "NonFiniteObjectiveError",
           "fit_type2ml"]


class NonFiniteObjectiveError(FloatingPointError):
    """The objective was NaN / inf at the starting point."""


class Type2MLState(NamedTuple):
    """State of :class:`Type2ML`.

    Attributes:
        raw: the unconstrained iterate, flat ``(P,)``.
        value: ``objective`` at ``raw``; grad: its gradient in ``raw``, ``(P,)``.
        optimizer: the ``optax.lbfgs`` state (curvature pairs, line-search state).
        iteration: iterations taken; decrease: relative decrease of the last iteration.
    """

    raw: jax.Array
    value: jax.Array
    grad: jax.Array
    optimizer: Any
    iteration: jax.Array
    decrease: jax.Array


class Type2MLInfo(NamedTuple):
    """The objective after the step (``loss``) and the largest gradient entry."""

    loss: jax.Array
    grad_max: jax.Array


class Type2MLResult(NamedTuple):
    """Outcome of :func:`fit_type2ml`.

    Attributes:
        params: the optimized pytree (positive leaves).
        value: objective at ``params`` (e.g. negative log marginal likelihood).
        num_iterations: L-BFGS iterations taken.
        converged: a stopping rule (not the iteration cap) ended the run.
        message: why it ended.
    """

    params: Any
    value: float
    num_iterations: int
    converged: bool
    message: str


def _bounds(init_params: Any, bounds: Any, fill: float) -> Any:
    if bounds is None:
        return jax.tree_util.tree_map(lambda p: np.full(np.shape(p), fill), init_params)
    return jax.tree_util.tree_map(
        lambda p, b: np.broadcast_to(np.float64(fill if b is None else b), np.shape(p)),
        init_params, bounds)


class Type2ML:
    """L-BFGS engine for ``objective(params)`` over positive pytrees (module docstring).

    Args:
        objective: scalar function of a pytree like ``template`` (jit-compatible).
        template: a pytree of the parameters' structure and shapes (e.g. the start).
        lower_bounds, upper_bounds: pytrees like ``template`` (a leaf broadcast over its
            hyperparameter; None / 0 for no floor, None / inf for no ceiling).
        memory_size: L-BFGS memory.
    """

    def __init__(self, objective: Callable[[Any], jax.Array], template: Any, *,
                 lower_bounds: Any = None, upper_bounds: Any = None, memory_size: int = 10):
        import optax

        flat, self._unravel = ravel_pytree(template)
        self.dtype = flat.dtype
        low = _bounds(template, lower_bounds, 0.0)
        up = _bounds(template, upper_bounds, np.inf)
        self.lower = jnp.asarray(np.concatenate([np.ravel(a) for a in
                                                 jax.tree_util.tree_leaves(low)]), self.dtype)
        self.upper = jnp.asarray(np.concatenate([np.ravel(a) for a in
                                                 jax.tree_util.tree_leaves(up)]), self.dtype)
        if bool(jnp.any(self.lower < 0)) or bool(jnp.any(self.upper <= self.lower)):
            raise ValueError("bounds: expected 0 <= lower < upper for every hyperparameter")
        self._boxed = jnp.isfinite(self.upper)
        self.objective = objective
        self._solver = optax.lbfgs(memory_size=memory_size)

    # -- coordinates ---------------------------------------------------------------------------
    def to_params(self, raw: jax.Array) -> Any:
        """``raw`` -> the positive pytree (module docstring)."""
        width = jnp.where(self._boxed, self.upper - self.lower, 1.0)
        boxed = self.lower + width * jax.nn.sigmoid(raw)
        floored = self.lower + jnp.exp(raw)
        return self._unravel(jnp.where(self._boxed, boxed, floored))

    def to_raw(self, params: Any) -> jax.Array:
        p, _ = ravel_pytree(params)
        p = jnp.asarray(p, self.dtype)
        width = jnp.where(self._boxed, self.upper - self.lower, 1.0)
        tiny = jnp.finfo(self.dtype).tiny
        u = jnp.clip((p - self.lower) / width, tiny, 1.0 - jnp.finfo(self.dtype).eps)
        return jnp.where(self._boxed, jnp.log(u) - jnp.log1p(-u),
                         jnp.log(jnp.maximum(p - self.lower, tiny)))

    def _f(self, raw: jax.Array) -> jax.Array:
        return self.objective(self.to_params(raw))

    # -- the contract --------------------------------------------------------------------------
    def init(self, params: Any) -> Type2MLState:
        """Start at ``params`` (moved inside the bounds where they lie outside)."""
        raw = self.to_raw(params)
        value, grad = jax.value_and_grad(self._f)(raw)
        return Type2MLState(raw, value, grad, self._solver.init(raw), jnp.asarray(0),
                            jnp.asarray(jnp.inf, self.dtype))

    def step(self, rng: Any, state: Type2MLState, batch: Any = None
             ) -> tuple[Type2MLState, Type2MLInfo]:
        """One L-BFGS iteration with a zoom line search (deterministic: ``rng`` and ``batch``
        are unused)."""
        import optax

        updates, opt = self._solver.update(state.grad, state.optimizer, state.raw,
                                           value=state.value, grad=state.grad,
                                           value_fn=self._f)
        raw = optax.apply_updates(state.raw, updates)
        value, grad = jax.value_and_grad(self._f)(raw)
        decrease = (state.value - value) / jnp.maximum(
            jnp.maximum(jnp.abs(state.value), jnp.abs(value)), 1.0)
        new = Type2MLState(raw, value, grad, opt, state.iteration + 1, decrease)
        return new, Type2MLInfo(value, jnp.max(jnp.abs(grad)))


def fit_type2ml(objective: Callable[[Any], jax.Array], init_params: Any, *,
                lower_bounds: Any = None, upper_bounds: Any = None, max_iterations: int = 1000,
                tolerance: float = 1e-9, gtol: float = 1e-8) -> Type2MLResult:
    """Minimize ``objective(params)`` over the positive pytree ``params`` with :class:`Type2ML`.

    Args:
        objective: scalar function of a pytree like ``init_params`` (jit-compatible).
        init_params: starting point; every leaf must be positive.
        lower_bounds, upper_bounds: optional pytrees like ``init_params`` (see
            :class:`Type2ML`).
        max_iterations: L-BFGS iteration cap.
        tolerance: stop when ``(f_k - f_{k+1}) / max(|f_k|, |f_{k+1}|, 1) <= tolerance``.
        gtol: stop when the gradient's largest entry (in the unconstrained coordinates) is
            below ``gtol``.

    Raises:
        NonFiniteObjectiveError: if the objective is not finite at ``init_params``.
    """
    engine = Type2ML(objective, init_params, lower_bounds=lower_bounds,
                     upper_bounds=upper_bounds)
    state = jax.jit(engine.init)(init_params)
    if not np.isfinite(float(state.value)):
        raise NonFiniteObjectiveError(f"objective is {float(state.value)} at the initial "
                                      f"hyperparameters "
                                      f"{jax.tree_util.tree_map(np.asarray, init_params)}")

    def done(s: Type2MLState) -> jax.Array:
        return ((s.decrease <= tolerance) | (jnp.max(jnp.abs(s.grad)) <= gtol)
                | ~jnp.isfinite(s.value))

    def cond(s: Type2MLState) -> jax.Array:
        return (s.iteration < max_iterations) & ~done(s)

    def body(s: Type2MLState) -> Type2MLState:
        return engine.step(None, s)[0]

    final = jax.jit(lambda s: jax.lax.while_loop(cond, body, s))(state)
    if not np.isfinite(float(final.value)):
        raise NonFiniteObjectiveError(f"objective became {float(final.value)} after "
                                      f"{int(final.iteration)} L-BFGS iterations")
    converged = bool(done(final))
    message = ("relative decrease below tolerance" if float(final.decrease) <= tolerance
               else "gradient below gtol" if converged else "iteration cap reached")
    return Type2MLResult(engine.to_params(final.raw), float(final.value), int(final.iteration),
                         converged, message)
