"""Type-II maximum likelihood: L-BFGS-B on an unconstrained parametrization of a pytree of
positive hyperparameters, as an engine.

Generic over the model: it minimizes any scalar ``objective(params, *data)`` of a pytree whose
leaves are positive (kernel variances, lengthscales, noise variances). Each leaf is optimized
through a bijector from the real line (``value = forward(raw)``):

* :class:`Exp` (the default): ``raw = log(value)``, so positivity needs no constraint, and
  ``lower_bounds`` / ``upper_bounds`` (same structure, a floor / ceiling per leaf; 0 / None for
  none) become box constraints on ``raw``, e.g. a noise floor of 1e-6 or the kernel-variance box
  [1e-6, 2e3] of the VIPS reference;
* :class:`Softplus` (``value = softplus(raw) + shift``) and :class:`SigmoidBox`
  (``value = low + (high - low) sigmoid(raw)``): GPflow's parametrization (``positive()``,
  ``positive(lower=1e-6)`` for a Gaussian likelihood's variance, and TensorFlow Probability's
  ``Sigmoid(low, high)`` bijector), with no box constraint at all.
  :func:`gpflow_parametrization` builds it for a GP's kernel + noise.

The two reach the same optimum of a unimodal objective, but L-BFGS-B's path depends on the
parametrization (the first step is along the raw-space gradient, and the curvature differs), so
on an objective with several basins they may end in different ones: the VIPS reference fits
with GPflow's (guiomarpescador/vips ``experiments/uci/utils_uci.py``), and matching its
results needs the same.

The objective and its gradient with respect to the hyperparameters are one jitted
``value_and_grad`` call, cached by objective (and by JAX by parameter structure and data shapes:
fits of one model on data of one shape, in any parametrization, compile once); the bijectors
and the chain rule through them are elementwise NumPy on the host; the iterations run in
SciPy's L-BFGS-B (Byrd et al. 1995) — the robust choice of GPflow and of the papers' code.

Engine contract (:mod:`inference.base`): :class:`Type2ML` ``init(params) -> Type2MLState`` and
``step(rng, state, data) -> (Type2MLState, Type2MLInfo)``, where one step is one type-II ML fit
on the step's data (a batch, a task), warm-started from the state's hyperparameters: what a
continual learner does with each batch (the exact GP refits on all data so far, VIPS after each
batch's selection, GP-ELLA per task). :func:`fit_type2ml` is the one-call form.

Used by the exact GP (R&W eq. 5.8 gradients via autodiff), VIPS (fit of kernel + noise on the
online ELBO) and GP-ELLA (per-task GP fits, eq. 4 of Clingerman & Eaton 2017).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import expit

__all__ = ["Type2MLResult", "Type2MLState", "Type2MLInfo", "Type2ML", "NonFiniteObjectiveError",
           "fit_type2ml", "value_and_grad_of", "Exp", "Softplus", "SigmoidBox", "Identity",
           "PARAMETRIZATIONS",
           "gpflow_parametrization", "GPFLOW_NOISE_SHIFT"]

PARAMETRIZATIONS = ("log", "gpflow")
"""Names of the parametrizations the GP learners offer (``"log"``: :class:`Exp` with box
bounds; ``"gpflow"``: :func:`gpflow_parametrization`)."""

GPFLOW_NOISE_SHIFT = 1e-6
"""GPflow's ``DEFAULT_VARIANCE_LOWER_BOUND``: a Gaussian likelihood's variance is
``softplus(raw) + 1e-6`` (``gpflow.likelihoods.Gaussian``)."""


# ------------------------------------------------------------------------------------------
# bijectors from the real line onto each hyperparameter's domain (host-side NumPy: the
# objective is jitted over the hyperparameters themselves, and the chain rule through these
# elementwise maps is applied to its gradient on the host)
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Exp:
    """``value = exp(raw)``, optionally boxed: ``lower <= value <= upper`` becomes the L-BFGS-B
    bound ``log(lower) <= raw <= log(upper)`` (0 / inf: none)."""

    lower: float = 0.0
    upper: float = math.inf

    def forward(self, raw):
        return np.exp(raw)

    def derivative(self, raw):
        return np.exp(raw)

    def inverse(self, value):
        return np.log(value)

    def raw_bounds(self):
        lo = np.where((np.asarray(self.lower) > 0) & np.isfinite(self.lower),
                      np.log(np.maximum(self.lower, 1e-300)), -np.inf)
        hi = np.where((np.asarray(self.upper) > 0) & np.isfinite(self.upper),
                      np.log(np.maximum(self.upper, 1e-300)), np.inf)
        return lo, hi


@dataclasses.dataclass(frozen=True)
class Softplus:
    """``value = log(1 + exp(raw)) + shift`` (GPflow's ``positive(lower=shift)``: TensorFlow
    Probability's ``Shift(shift)(Softplus())``); its inverse is ``log(expm1(value - shift))``."""

    shift: float = 0.0

    def forward(self, raw):
        return np.logaddexp(0.0, raw) + self.shift

    def derivative(self, raw):
        return expit(raw)

    def inverse(self, value):
        """``log(expm1(value - shift))``, finite at the floor: a value that the fit left at the
        shift exactly (a raw value far below -50, where ``softplus`` underflows next to the
        shift) maps to ``log(tiny) = -708``, not ``-inf``, which would make the next fit's
        L-BFGS-B steps ``-inf - (-inf) = NaN``."""
        v = np.maximum(np.asarray(value, np.float64) - self.shift, np.finfo(np.float64).tiny)
        return v + np.log(-np.expm1(-v))      # log(expm1(v)) without overflow

    def raw_bounds(self):
        return -np.inf, np.inf


@dataclasses.dataclass(frozen=True)
class SigmoidBox:
    """``value = low + (high - low) sigmoid(raw)`` (TensorFlow Probability's ``Sigmoid(low,
    high)``, which the VIPS reference puts on the kernel variance with ``[1e-6, 2e3]``)."""

    low: float
    high: float

    def forward(self, raw):
        # TensorFlow Probability's form: each side of 0 from its nearer end of the box
        diff = self.high - self.low
        return np.where(raw < 0, self.low + diff * expit(raw), self.high - diff * expit(-raw))

    def derivative(self, raw):
        s = expit(raw)
        return (self.high - self.low) * s * (1.0 - s)

    def inverse(self, value):
        """``logit`` of the value's place in the box, finite at either end (as
        :meth:`Softplus.inverse`: a value at ``low`` or ``high`` exactly maps to about -/+708)."""
        v = np.asarray(value, np.float64)
        tiny = np.finfo(np.float64).tiny
        return np.log(np.maximum(v - self.low, tiny)) - np.log(np.maximum(self.high - v, tiny))

    def raw_bounds(self):
        return -np.inf, np.inf


@dataclasses.dataclass(frozen=True)
class Identity:
    """The leaf is optimized as it is (an unconstrained parameter)."""

    def forward(self, raw):
        return np.asarray(raw)

    def derivative(self, raw):
        return np.ones_like(raw)

    def inverse(self, value):
        return np.asarray(value, np.float64)

    def raw_bounds(self):
        return -np.inf, np.inf


_BIJECTORS = (Exp, Softplus, SigmoidBox, Identity)


def _is_bijector(x: Any) -> bool:
    return isinstance(x, _BIJECTORS)


def gpflow_parametrization(params: Any, *, variance_bounds: tuple[float, float] | None = None,
                           noise_shift: float = GPFLOW_NOISE_SHIFT) -> Any:
    """GPflow's transforms for a GP's hyperparameters, as a pytree of bijectors like ``params``.

    ``params`` has a ``kernel`` (a :class:`models.kernels_jax.Kernel`) and a ``noise_variance``
    (:class:`models.exact_gp.GPRegressionParams`). Every kernel leaf gets :class:`Softplus`
    (GPflow's ``positive()``), except leaves named ``variance`` when ``variance_bounds`` is
    given, which get :class:`SigmoidBox` (the VIPS reference's ``Sigmoid(1e-6, 2e3)``); the
    noise variance gets ``Softplus(shift=1e-6)`` (GPflow's Gaussian likelihood).
    """
    from models.kernels_jax import Kernel

    def walk(k):
        children, aux = k.tree_flatten()
        out = []
        for name, c in zip(k._fields, children):
            if isinstance(c, Kernel):
                out.append(walk(c))
            elif name == "variance" and variance_bounds is not None:
                out.append(SigmoidBox(float(variance_bounds[0]), float(variance_bounds[1])))
            else:
                out.append(Softplus())
        return type(k).tree_unflatten(aux, out)

    return type(params)(walk(params.kernel), Softplus(float(noise_shift)))


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
def _jitted_value_and_grad(objective: Callable) -> Callable:
    """``jax.jit(jax.value_and_grad(objective))``, one per objective: keyed by the objective
    alone (not by the parametrization), so every fit of one model on data of one shape, and any
    plain evaluation through :func:`value_and_grad_of`, share one compiled program."""
    return jax.jit(jax.value_and_grad(objective))


def value_and_grad_of(objective: Callable, params: Any, *data) -> tuple[Any, Any]:
    """``(objective(params, *data), d objective / d params)`` by the compiled program the fits of
    ``objective`` use (so a plain evaluation at a new data shape compiles what a later fit at
    that shape reuses)."""
    return _jitted_value_and_grad(objective)(params, *data)


class Type2ML:
    """Type-II ML engine: each ``step`` fits ``objective(params, *data)`` by L-BFGS-B from the
    state's hyperparameters (module docstring).

    Args:
        objective: scalar function of a pytree of positive hyperparameters and the data arrays
            (jit-compatible; a module-level function compiles once per data shape).
        lower_bounds, upper_bounds: pytrees like the parameters (a leaf broadcast over its
            hyperparameter; 0 / None: no floor, None / inf: no ceiling), for the default
            log parametrization.
        unconstrained: optional pytree of bools like the parameters; a ``True`` leaf is optimized
            on the real line as it is (no log, no bounds), e.g. a multi-task GP's task factor.
        transforms: optional pytree like the parameters whose leaves are bijectors
            (:class:`Exp`, :class:`Softplus`, :class:`SigmoidBox`, :class:`Identity`; e.g.
            :func:`gpflow_parametrization`), replacing ``lower_bounds`` / ``upper_bounds`` /
            ``unconstrained`` (which must then be ``None``).
        max_iterations: L-BFGS iterations per fit; tolerance: SciPy's ``ftol`` (relative
            reduction of the objective at which to stop); gtol: SciPy's ``gtol``.
    """

    kind = "host"

    def __init__(self, objective: Callable[..., jax.Array], *, lower_bounds: Any = None,
                 upper_bounds: Any = None, unconstrained: Any = None, transforms: Any = None,
                 max_iterations: int = 1000, tolerance: float = 1e-9, gtol: float = 1e-8):
        if transforms is not None and not (lower_bounds is None and upper_bounds is None
                                           and unconstrained is None):
            raise ValueError("transforms: give either transforms or lower_bounds / "
                             "upper_bounds / unconstrained, not both")
        self.objective = objective
        self.lower_bounds, self.upper_bounds = lower_bounds, upper_bounds
        self.unconstrained = unconstrained
        self.transforms = transforms
        self.max_iterations, self.tolerance, self.gtol = int(max_iterations), tolerance, gtol

    def init(self, rng: Any, params: Any) -> Type2MLState:
        """The state at the starting hyperparameters ``params`` (``rng`` is unused: the fit is
        deterministic)."""
        del rng
        return Type2MLState(jax.tree_util.tree_map(jnp.asarray, params), jnp.nan, 0)

    def _leaf_transforms(self, leaves0: list) -> tuple:
        """One bijector per parameter leaf."""
        n = len(leaves0)
        if self.transforms is not None:
            ts = tuple(jax.tree_util.tree_leaves(self.transforms, is_leaf=_is_bijector))
            if len(ts) != n or not all(_is_bijector(t) for t in ts):
                raise ValueError(f"transforms: expected {n} bijectors (one per leaf of the "
                                 f"parameters), received {len(ts)}")
            return ts
        if self.unconstrained is None:
            free = (False,) * n
        else:
            free = tuple(bool(f) for f in jax.tree_util.tree_leaves(self.unconstrained))
            if len(free) != n:
                raise ValueError(f"unconstrained: expected {n} leaves (one per leaf "
                                 f"of the parameters), received {len(free)}")

        def bound_leaves(tree, default):
            if tree is None:
                return (default,) * n
            out = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: x is None)
            return tuple(default if b is None else b for b in out)

        lo, hi = bound_leaves(self.lower_bounds, 0.0), bound_leaves(self.upper_bounds, math.inf)
        ts = []
        for f, a, b in zip(free, lo, hi):
            if f:
                ts.append(Identity())
            else:
                a_arr, b_arr = np.asarray(a, np.float64), np.asarray(b, np.float64)
                if a_arr.ndim or b_arr.ndim:      # per-element bounds: one Exp per leaf element
                    ts.append(_ElementwiseExp(tuple(np.ravel(a_arr)), tuple(np.ravel(b_arr))))
                else:
                    ts.append(Exp(float(a_arr), float(b_arr)))
        return tuple(ts)

    def step(self, rng: Any, state: Type2MLState, data: tuple = ()
             ) -> tuple[Type2MLState, Type2MLInfo]:
        """One L-BFGS-B fit on ``data`` from ``state.params`` (``rng`` is unused).

        Raises:
            NonFiniteObjectiveError: if the objective is not finite at the start.
        """
        init_params = state.params
        leaves0, treedef = jax.tree_util.tree_flatten(init_params)
        transforms = self._leaf_transforms(leaves0)
        shapes = [np.shape(p) for p in leaves0]
        dtypes = [jnp.result_type(p) for p in leaves0]
        sizes = [int(np.prod(sh)) for sh in shapes]
        splits = np.cumsum(sizes)[:-1]
        flat0 = np.concatenate([np.ravel(t.inverse(np.asarray(p, np.float64)))
                                for p, t in zip(leaves0, transforms)]) if leaves0 else np.zeros(0)
        vg = _jitted_value_and_grad(self.objective)
        data = tuple(data)

        def constrained(x: np.ndarray) -> list[np.ndarray]:
            return [t.forward(r.reshape(sh)) for r, t, sh in
                    zip(np.split(x, splits), transforms, shapes)]

        def params_of(values: list[np.ndarray]) -> Any:
            return jax.tree_util.tree_unflatten(
                treedef, [jnp.asarray(v, dt) for v, dt in zip(values, dtypes)])

        lo = np.concatenate([_leaf_bound(t, 0, sh) for sh, t in zip(shapes, transforms)]) \
            if leaves0 else np.zeros(0)
        hi = np.concatenate([_leaf_bound(t, 1, sh) for sh, t in zip(shapes, transforms)]) \
            if leaves0 else np.zeros(0)
        bounds = None
        if np.isfinite(lo).any() or np.isfinite(hi).any():
            bounds = [(float(a) if np.isfinite(a) else None, float(b) if np.isfinite(b) else None)
                      for a, b in zip(lo, hi)]
            flat0 = np.clip(flat0, lo, hi)

        memo: dict = {}

        def evaluate(x: np.ndarray, values: list[np.ndarray]) -> tuple[float, Any]:
            # the objective at x (``values``: constrained(x)); the last point is remembered, so
            # that L-BFGS-B's first call (the start, already evaluated for the finiteness
            # check) costs nothing
            key = x.tobytes()
            if key not in memo:
                v, g = vg(params_of(values), *data)
                memo.clear()
                memo[key] = (float(v), g)
            return memo[key]

        def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
            with np.errstate(over="ignore", invalid="ignore"):   # a far line-search trial
                values = constrained(x)
                derivs = [t.derivative(r) for t, r in zip(transforms, np.split(x, splits))]
            if not all(np.isfinite(v).all() for v in values + derivs):
                return 1e300, np.zeros_like(x)
            v, g = evaluate(x, values)
            g = np.concatenate([np.ravel(np.asarray(gl, np.float64)) * np.ravel(dv)
                                for gl, dv in zip(jax.tree_util.tree_leaves(g), derivs)])
            if not (np.isfinite(v) and np.isfinite(g).all()):
                # a failed factorization mid line-search: a huge value makes L-BFGS-B backtrack
                return 1e300, np.zeros_like(g)
            return v, g

        v0 = evaluate(flat0, constrained(flat0))[0]
        if not np.isfinite(v0):
            raise NonFiniteObjectiveError(f"objective is {v0} at the initial "
                                          f"hyperparameters "
                                          f"{jax.tree_util.tree_map(np.asarray, init_params)}")

        from scipy.optimize import minimize

        res = minimize(fun, flat0, jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": self.max_iterations, "ftol": self.tolerance,
                                "gtol": self.gtol})
        params = params_of(constrained(np.asarray(res.x, np.float64)))
        value = float(res.fun) if np.isfinite(res.fun) and res.fun < 1e300 else \
            float(vg(params, *data)[0])
        return (Type2MLState(params, value, state.fits + 1),
                Type2MLInfo(value, int(res.nit), bool(res.success), str(res.message)))


@dataclasses.dataclass(frozen=True)
class _ElementwiseExp(Exp):
    """:class:`Exp` with a floor / ceiling per element of the leaf (flattened)."""

    lower: tuple = ()
    upper: tuple = ()


def _leaf_bound(t: Any, which: int, shape: tuple) -> np.ndarray:
    """The raw-space floor (0) / ceiling (1) of every element of a leaf, flattened."""
    b = np.asarray(t.raw_bounds()[which], np.float64)
    if b.ndim and b.size == int(np.prod(shape)):
        b = b.reshape(shape)
    return np.ravel(np.broadcast_to(b, shape))


def fit_type2ml(objective: Callable[..., jax.Array], init_params: Any, *,
                data: tuple | None = (), lower_bounds: Any = None, upper_bounds: Any = None,
                unconstrained: Any = None, transforms: Any = None, max_iterations: int = 1000,
                tolerance: float = 1e-9, gradient_tolerance: float = 1e-8) -> Type2MLResult:
    """Minimize ``objective(params, *data)`` over the positive pytree ``params`` by L-BFGS-B
    (one :meth:`Type2ML.step`): in log space with optional box bounds, or through the
    bijectors of ``transforms`` (e.g. :func:`gpflow_parametrization`).

    Args:
        objective: scalar function of a pytree like ``init_params`` and the ``data`` arrays
            (jit-compatible).
        init_params: starting point; every leaf must lie inside its bijector's domain
            (positive for the log parametrization).
        data: arrays passed to ``objective`` after the parameters.
        lower_bounds, upper_bounds: optional pytrees with the structure of ``init_params``; a
            leaf is a floor / ceiling for the matching hyperparameter (broadcast over it), 0 /
            None / inf for none.
        unconstrained: optional pytree of bools (see :class:`Type2ML`).
        transforms: optional pytree of bijectors like ``init_params`` (see :class:`Type2ML`).
        max_iterations: L-BFGS iteration cap.
        tolerance: relative reduction of the objective at which to stop (SciPy ``ftol``).
        gradient_tolerance: projected-gradient size at which to stop (SciPy ``gtol``; GPflow's
            ``Scipy`` optimizer keeps SciPy's default 1e-5).

    Raises:
        NonFiniteObjectiveError: if the objective is not finite at ``init_params``.
    """
    engine = Type2ML(objective, gtol=gradient_tolerance, lower_bounds=lower_bounds,
                     upper_bounds=upper_bounds, unconstrained=unconstrained,
                     transforms=transforms, max_iterations=max_iterations, tolerance=tolerance)
    state, info = engine.step(None, engine.init(None, init_params), tuple(data or ()))
    return Type2MLResult(state.params, info.loss, info.iterations, info.converged,
                         info.message)
