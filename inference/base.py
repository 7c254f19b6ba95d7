"""The one engine contract (docs/design.md; the pattern of BlackJAX ``blackjax/base.py``).

Every engine of this package has two functions,

    init(...)                   -> State
    step(rng, state, batch)     -> (State, Info)

where ``State`` and ``Info`` are ``typing.NamedTuple``\\ s whose leaves are arrays (JAX, NumPy or
torch) or Python scalars: parameters, optimizer moments, counters and the random state are all
values, never objects with hidden state (no ``torch.optim.Optimizer``, no global RNG). So any
loop drives any engine (:mod:`inference.loop`), a state can be saved and restored bit for bit,
and a JAX engine's ``step`` can run under ``jax.lax.scan``.

Randomness is explicit:

* JAX engines take a PRNG key as ``rng`` and keep none in the state;
* torch engines carry the state of their generator in the state (a ``uint8`` tensor, field
  ``rng_state``; :func:`torch_generator_state`), and take ``rng=None`` (or a fresh generator
  state that replaces it). Pyro draws from torch's global generator, so a torch engine runs its
  step inside :func:`using_torch_rng`, which swaps the carried state in and out and leaves the
  caller's global state untouched.

``Info`` holds what one step saw (losses, acceptance, gradient norms...). The run loop of
:mod:`inference.loop` needs one scalar field ``loss`` (lower is better) in the Info of the
engines it trains.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, NamedTuple, Protocol, TypeVar, runtime_checkable

__all__ = ["Engine", "State", "Info", "is_state", "torch_generator_state", "using_torch_rng"]

State = TypeVar("State", bound=tuple)
Info = TypeVar("Info", bound=tuple)


@runtime_checkable
class Engine(Protocol[State, Info]):
    """An inference engine: ``init(...) -> State`` and ``step(rng, state, batch) ->
    (State, Info)`` (module docstring). ``isinstance(obj, Engine)`` checks that both exist."""

    def init(self, *args: Any, **kwargs: Any) -> State:
        """The starting state (parameters, moments, counters, random state)."""
        ...

    def step(self, rng: Any, state: State, batch: Any) -> tuple[State, Info]:
        """One update on ``batch`` (a tuple of arrays sharing their first axis, or ``None``
        for an engine that needs no data per step, e.g. a Gibbs sweep)."""
        ...


def _is_leaf(x: Any) -> bool:
    if x is None or isinstance(x, (bool, int, float, complex, str)):
        return True
    return hasattr(x, "shape") and hasattr(x, "dtype")


def is_state(tree: Any) -> bool:
    """True when ``tree`` is a NamedTuple whose leaves (through nested NamedTuples, tuples,
    lists and dicts) are arrays or scalars: what the contract allows in a State or an Info."""
    if not (isinstance(tree, tuple) and hasattr(tree, "_fields")):
        return False

    def ok(node: Any) -> bool:
        if isinstance(node, dict):
            return all(isinstance(k, str) and ok(v) for k, v in node.items())
        if isinstance(node, (tuple, list)):
            return all(ok(v) for v in node)
        return _is_leaf(node)

    return ok(tuple(tree))


# ---------------------------------------------------------------------------------------------
# explicit torch randomness
# ---------------------------------------------------------------------------------------------
def torch_generator_state(seed: int, device: Any = "cpu"):
    """The state (``uint8`` tensor) of a fresh torch generator seeded with ``seed`` on
    ``device`` (``torch.Generator(device).manual_seed(seed).get_state()``)."""
    import torch

    return torch.Generator(device=torch.device(device)).manual_seed(int(seed)).get_state()


class _RngCell:
    """Holds the generator state read back at the end of :func:`using_torch_rng`."""

    state: Any = None


@contextlib.contextmanager
def using_torch_rng(rng_state: Any, device: Any = "cpu") -> Iterator[_RngCell]:
    """Run a block on torch's *global* generator set to ``rng_state`` (what Pyro's
    ``rsample`` draws from) and read the advanced state back into ``cell.state``; the caller's
    global random state is restored afterwards.

    Args:
        rng_state: a CPU generator state for a CPU device, or a CUDA generator state for
            ``device`` a CUDA device (the state of the CUDA generator of that device).
        device: where the block's random draws happen.

    Example::

        with using_torch_rng(state.rng_state, device) as cell:
            loss = elbo(...)
        new_state = state._replace(rng_state=cell.state)
    """
    import torch

    device = torch.device(device)
    cell = _RngCell()
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        with torch.random.fork_rng(devices=[index]):
            torch.cuda.set_rng_state(rng_state.cpu(), index)
            yield cell
            cell.state = torch.cuda.get_rng_state(index)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(rng_state.cpu())
            yield cell
            cell.state = torch.get_rng_state()
