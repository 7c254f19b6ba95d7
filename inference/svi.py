"""Stochastic variational inference for any Pyro model/guide pair, on the engine contract.

:class:`SVI` is an engine of :mod:`inference.base` (kind ``"host"``): ``init(rng, *batch) ->
SVIState`` (``rng``: an int seed or a torch generator state) and ``step(rng, state, batch) ->
(SVIState, SVIInfo)``, where the state holds *values only*

* ``params``: the unconstrained values of every ``pyro.param`` site (Pyro's param store is
  filled from them for the duration of a step and restored afterwards, so nothing persists in
  the global store);
* ``optimizer``: the Yogi moments (:mod:`inference.yogi`, the optimizer of Kapoor et al. 2021,
  Sect. 5) as tensors;
* ``rng_state``: the state of the torch generator that Pyro's samples draw from during the step
  (:func:`inference.base.using_torch_rng`); the caller's global random state is untouched;
* ``step``: the number of steps taken.

The state is complete: a fresh :class:`SVI` built on the same model and guide steps from a
saved state exactly as the engine that made it. The parameters' constraints are not state but
part of the program: during a step each ``pyro.param`` site hands its declared constraint to
the param store as it is reached (:class:`_SiteConstraints`), and :meth:`SVI.constrained`
reads them off one evaluation of the program.

A step evaluates ``loss.differentiable_loss(model, guide, *batch, **model_kwargs)`` (default
:class:`inference.elbo.LazyTraceMeanField_ELBO`; the model must put its observations in
``pyro.plate("data", num_data, subsample=...)`` so that the likelihood is scaled by N / B while
the KL terms are not, Hoffman et al. 2013), its gradient with respect to the unconstrained
parameters, and one Yogi update. Epochs, minibatches, validation, early stopping and resume are
the run loop's (:func:`inference.loop.run_loop`): the engine knows nothing of them.

Finite-loss guard: a NaN/inf loss or gradient raises :class:`NonFiniteLossError` naming the
quantity and the step *before* any parameter changes (the state passed in stays valid).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from typing import Any, Callable, NamedTuple

import pyro
import torch
from torch import Tensor
from torch.distributions import constraints

from pyro.poutine.messenger import Messenger

from inference.base import torch_rng_state, using_torch_rng
from inference.elbo import LazyTraceMeanField_ELBO
from inference.yogi import YogiConfig, YogiState, yogi_init, yogi_update

__all__ = ["SVI", "SVIState", "SVIInfo", "NonFiniteLossError"]


class NonFiniteLossError(FloatingPointError):
    """The ELBO loss or its gradient became NaN or infinite."""


_NON_FINITE = re.compile(r"(?<![A-Za-z])(nan|inf)(?![A-Za-z])")


@contextlib.contextmanager
def _no_nan_warnings():
    """Silence Pyro's "Encountered NaN" warnings (loss and backward hook): the finite-loss guard
    of :meth:`SVI.step` raises the clear error instead."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Encountered NaN", category=UserWarning)
        yield


class _SiteConstraints(Messenger):
    """Give Pyro's param store the constraint of each ``pyro.param`` site as the program
    declares it, the first time the site is reached with an initial value: the store of a step
    holds the state's unconstrained values only, and the constraint is what the program says
    (``pyro.param(name, init, constraint=...)``), so nothing of it is kept between steps."""

    def _pyro_param(self, msg):
        name = msg["args"][0]
        store = pyro.get_param_store()
        # a retrieval-only call ``pyro.param(name)`` carries no constraint (real by default)
        if len(msg["args"]) > 1 and name not in store._constraints:
            store._constraints[name] = msg["kwargs"].get("constraint", constraints.real)


class SVIState(NamedTuple):
    """The state of :class:`SVI` (values only; module docstring)."""

    params: dict[str, Tensor]
    optimizer: YogiState
    rng_state: Tensor
    step: int


class SVIInfo(NamedTuple):
    """What one step saw: the loss (negative ELBO estimate) and the gradient's 2-norm."""

    loss: float
    grad_norm: float


class SVI:
    """SVI engine for one Pyro model/guide pair.

    Args:
        model, guide: Pyro callables taking ``(*batch, **model_kwargs)``.
        optimizer: :class:`inference.yogi.YogiConfig` (learning rate and moments' settings).
        model_kwargs: keyword arguments of every model/guide call (e.g. ``num_data=N``).
        num_particles, vectorize_particles, max_plate_nesting: of the default ELBO.
        loss: a Pyro ELBO instead of the default.
        validate_args: when Pyro checks distribution arguments and sample supports:
            ``"first"`` (default) on the initializing evaluation and the first step, where a
            malformed program shows itself; ``"always"``; ``"never"``. Each check reads a
            boolean back from the device, which stalls a GPU once per distribution per step.
        device: where the model's random draws happen (the generator carried in the state).
    """

    kind = "host"

    def __init__(self, model: Callable, guide: Callable, optimizer: YogiConfig = YogiConfig(), *,
                 model_kwargs: dict[str, Any] | None = None, num_particles: int = 1,
                 vectorize_particles: bool = False, max_plate_nesting: int | None = None,
                 loss: Any = None, validate_args: str = "first", device: Any = "cpu"):
        if validate_args not in ("first", "always", "never"):
            raise ValueError(f"validate_args: expected 'first', 'always' or 'never', received "
                             f"{validate_args!r}")
        if int(num_particles) < 1:
            raise ValueError(f"num_particles: expected >= 1, received {num_particles}")
        self.model, self.guide = model, guide
        self.optimizer = optimizer.check()
        self.model_kwargs = dict(model_kwargs or {})
        self.loss = loss or LazyTraceMeanField_ELBO(
            num_particles=num_particles, vectorize_particles=vectorize_particles,
            max_plate_nesting=max_plate_nesting if max_plate_nesting is not None
            else float("inf"))
        self.validate_args = validate_args
        self.device = torch.device(device)

    def _validating(self, step: int) -> bool:
        return self.validate_args == "always" or (self.validate_args == "first" and step == 0)

    def _loss(self, batch: tuple) -> Tensor:
        return self.loss.differentiable_loss(self.model, self.guide, *batch, **self.model_kwargs)

    @contextlib.contextmanager
    def _store(self, params: dict[str, Tensor], constraints_: dict[str, Any] | None = None):
        """Pyro's param store holding exactly ``params`` (unconstrained) during the block, with
        ``constraints_`` or, without them, the constraints the program's sites declare
        (:class:`_SiteConstraints`)."""
        with pyro.get_param_store().scope({"params": dict(params),
                                           "constraints": dict(constraints_ or {})}), \
                _SiteConstraints():
            yield pyro.get_param_store()

    def _fresh_parameters(self, rng_state: Tensor, batch: tuple, validate: bool
                          ) -> tuple[dict[str, Any], Tensor]:
        """One evaluation of the program on ``batch`` in an empty param store: its scope
        (``{"params", "constraints"}``) and the generator state after it."""
        with pyro.get_param_store().scope() as scope, torch.no_grad(), \
                pyro.validation_enabled(validate), \
                using_torch_rng(rng_state, self.device) as cell:
            self._loss(tuple(batch))
        return scope, cell.state

    # -- the contract ------------------------------------------------------------------------
    def init(self, rng: int | Tensor, *batch: Tensor) -> SVIState:
        """Create the parameters by one loss evaluation on ``batch`` (no step), with the
        generator seeded by ``rng`` (an int seed or a generator state); the moments start at
        Yogi's initial accumulator."""
        scope, rng_state = self._fresh_parameters(torch_rng_state(rng, self.device), batch,
                                                  self._validating(0))
        params = {n: p.detach() for n, p in scope["params"].items()}
        if not params:
            raise ValueError("model and guide declare no pyro.param: nothing to optimize")
        return SVIState(params, yogi_init(params, self.optimizer), rng_state, 0)

    def step(self, rng: Any, state: SVIState, batch: tuple) -> tuple[SVIState, SVIInfo]:
        """One gradient step on ``batch``. ``rng``: None (the state's generator) or a generator
        state that replaces it. Raises :class:`NonFiniteLossError` (state untouched) if the
        loss or a gradient is not finite."""
        where = f"optimizer step {state.step + 1}"
        leaves = {n: p.detach().requires_grad_() for n, p in state.params.items()}
        rng_state = state.rng_state if rng is None else torch_rng_state(rng, self.device)
        with self._store(leaves), using_torch_rng(rng_state, self.device) as cell, \
                pyro.validation_enabled(self._validating(state.step)), _no_nan_warnings():
            try:
                loss = self._loss(tuple(batch))
            except ValueError as err:
                # Pyro's distribution validation meets the NaN first (e.g. a NaN logit)
                if _NON_FINITE.search(str(err)):
                    raise NonFiniteLossError(
                        f"the SVI loss evaluation produced NaN/inf at {where}: "
                        f"{str(err).splitlines()[0]}") from err
                raise
            if not torch.isfinite(loss):
                raise NonFiniteLossError(
                    f"the SVI loss (negative ELBO) became {float(loss.detach())} at {where}; "
                    f"the parameters keep their last finite values. Lower the learning rate or "
                    f"check the data/initialization.")
            names = list(leaves)
            grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
        grads = dict(zip(names, grads))
        present = [g for g in grads.values() if g is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g)
                                                     for g in present])) \
            if present else torch.zeros(())
        if not torch.isfinite(norm):
            bad = [n for n, g in grads.items() if g is not None and not torch.isfinite(g).all()]
            raise NonFiniteLossError(
                f"the SVI gradient became non-finite at {where} (parameters {bad}); the "
                f"parameters keep their last finite values.")
        params, moments = yogi_update(state.params, grads, state.optimizer, self.optimizer)
        return (SVIState(params, moments, cell.state, state.step + 1),
                SVIInfo(float(loss.detach()), float(norm)))

    # -- reading a state -----------------------------------------------------------------------
    @torch.no_grad()
    def constrained(self, state: SVIState, *batch: Tensor) -> dict[str, Tensor]:
        """The constrained values of the parameters (what ``pyro.param(name)`` returns), as
        detached tensors. The constraints are read off one evaluation of the program on
        ``batch`` (any batch the model accepts; the state and the caller's random state are
        untouched)."""
        scope, _ = self._fresh_parameters(state.rng_state, batch, False)
        missing = sorted(set(state.params) - set(scope["constraints"]))
        if missing:
            raise ValueError(f"parameters {missing} of the state are not declared by the "
                             f"program on this batch")
        with self._store(state.params, scope["constraints"]) as store:
            return {n: store[n].detach().clone() for n in state.params}
