"""The one engine contract (docs/design.md; the pattern of BlackJAX ``blackjax/base.py``).

Every engine of this package has two functions,

    init(rng, *args, **kwargs)  -> State
    step(rng, state, batch)     -> (State, Info)

where ``State`` and ``Info`` are ``typing.NamedTuple``\\ s whose leaves are arrays (JAX, NumPy or
torch) or Python scalars: parameters, optimizer moments, counters and the random state are all
values, never objects with hidden state (no ``torch.optim.Optimizer``, no global RNG, no live
``torch.Generator``). The engine object holds only the static choices it was built with; it
keeps nothing between calls, so a fresh instance built with the same arguments takes the same
step from a restored state (``tests/inference/test_engine_contract.py`` checks this, that
``step`` leaves its input state unmodified, and that the same ``rng`` gives the same step for
every engine of ``inference/``). So any loop drives any engine (:mod:`inference.loop`) and a
state can be saved and restored bit for bit.

Two kinds of engine, named by the class attribute ``kind``:

* ``"jax"``: ``step`` is a pure JAX function of ``(rng, state, batch)`` (no host round trip,
  no Python control flow on traced values), so it can be ``jax.jit``-ed and run under
  ``jax.lax.scan`` (the contract test scans each of them);
* ``"host"``: ``step`` is driven from Python (torch, NumPy/SciPy, an L-BFGS-B fit, data-
  dependent shapes); it is called once per step from a Python loop.

Randomness is explicit, and ``rng`` comes first in ``init`` as in ``step``:

* JAX engines take a PRNG key as ``rng`` and keep none in the state;
* torch engines carry the state of their generator in the state (a ``uint8`` tensor, field
  ``rng_state``; :func:`torch_generator_state`). Their ``init`` takes an ``int`` seed or a
  generator state as ``rng`` (:func:`torch_rng_state`), never a live ``torch.Generator``;
  their ``step`` takes ``rng=None`` (continue with the carried state) or a seed / generator
  state that replaces it. Pyro draws from torch's global generator, so a Pyro engine runs its
  step inside :func:`using_torch_rng`, which swaps the carried state in and out and leaves the
  caller's global state untouched;
* a deterministic engine takes ``rng`` and ignores it (``None`` is fine).

``Info`` holds what one step saw (losses, acceptance, gradient norms...). The run loop of
:mod:`inference.loop` needs one scalar field ``loss`` (lower is better) in the Info of the
engines it trains.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Protocol, TypeVar, runtime_checkable

__all__ = ["Engine", "State", "Info", "KINDS", "is_state", "run_sweeps", "torch_generator",
           "torch_generator_state", "torch_rng_state", "using_torch_rng"]

State = TypeVar("State", bound=tuple)
Info = TypeVar("Info", bound=tuple)

KINDS = ("jax", "host")
"""The values of an engine's ``kind`` (module docstring)."""


@runtime_checkable
class Engine(Protocol[State, Info]):
    """An inference engine: ``init(rng, ...) -> State`` and ``step(rng, state, batch) ->
    (State, Info)``, of kind ``"jax"`` or ``"host"`` (the class attribute ``kind``; module
    docstring). ``isinstance(obj, Engine)`` checks that ``init`` and ``step`` exist."""

    def init(self, rng: Any, *args: Any, **kwargs: Any) -> State:
        """The starting state (parameters, moments, counters, random state); ``rng``: a JAX
        key, an int seed or a torch generator state (None for a deterministic engine)."""
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
    lists, dicts and JAX pytree classes such as the kernels of ``models/kernels_jax.py``) are
    arrays or scalars: what the contract allows in a State or an Info."""
    if not (isinstance(tree, tuple) and hasattr(tree, "_fields")):
        return False

    def ok(node: Any) -> bool:
        if isinstance(node, dict):
            return all(isinstance(k, str) and ok(v) for k, v in node.items())
        if isinstance(node, (tuple, list)):
            return all(ok(v) for v in node)
        if callable(getattr(node, "tree_flatten", None)):      # a registered pytree class
            return all(ok(v) for v in node.tree_flatten()[0])
        return _is_leaf(node)

    return ok(tuple(tree))


def run_sweeps(engine: Any, problem: Any, num_steps: int, rng: Any, state: Any, keep: bool,
               state_fields: tuple[str, ...], empty_info: Any) -> tuple[Any, Any, dict | None]:
    """The sweep loop of the host samplers (``PGGibbs.run`` in ``inference/pg_gibbs.py``,
    ``LSMGibbs.run`` / ``OVEGibbs.run`` in ``inference/pg_multiclass.py``):
    ``engine.init(rng, problem)`` unless ``state`` is given, then ``num_steps`` sweeps
    ``state, info = engine.step(None, state, problem)``, each continuing from the generator
    state carried in the state (so the draws are those of the explicit loop).

    Returns ``(state, info, draws)``: ``info`` is the last sweep's (``empty_info`` when
    ``num_steps`` is 0); with ``keep``, ``draws`` stacks along a new first axis of length
    ``num_steps`` the fields ``state_fields`` of every sweep's state and every field of its
    Info (None when ``keep`` is False or ``num_steps`` is 0)."""
    import torch

    state = engine.init(rng, problem) if state is None else state
    info = empty_info
    trace: dict[str, list] = {k: [] for k in (*state_fields, *empty_info._fields)}
    for _ in range(num_steps):
        state, info = engine.step(None, state, problem)
        if keep:
            for k in state_fields:
                trace[k].append(getattr(state, k))
            for k in info._fields:
                trace[k].append(getattr(info, k))
    draws = {k: torch.stack(v) for k, v in trace.items()} if keep and num_steps else None
    return state, info, draws


# ---------------------------------------------------------------------------------------------
# explicit torch randomness
# ---------------------------------------------------------------------------------------------
def torch_generator_state(seed: int, device: Any = "cpu"):
    """The state (``uint8`` tensor) of a fresh torch generator seeded with ``seed`` on
    ``device`` (``torch.Generator(device).manual_seed(seed).get_state()``)."""
    import torch

    return torch.Generator(device=torch.device(device)).manual_seed(int(seed)).get_state()


def torch_rng_state(rng: Any, device: Any = "cpu"):
    """The generator state a torch engine starts from, given as ``rng``: an ``int`` seed
    (:func:`torch_generator_state` on ``device``) or a generator state (a ``uint8`` tensor,
    returned as it is). A live ``torch.Generator`` is refused: its state would be shared with
    the caller and advanced behind its back."""
    import torch

    if isinstance(rng, torch.Generator):
        raise TypeError("rng: expected an int seed or a generator state (a uint8 tensor, "
                        "torch.Generator.get_state()), received a live torch.Generator")
    if isinstance(rng, torch.Tensor):
        if rng.dtype != torch.uint8:
            raise TypeError(f"rng: a generator state is a uint8 tensor, received {rng.dtype}")
        return rng
    import operator

    try:
        seed = operator.index(rng)
    except TypeError:
        raise TypeError(f"rng: expected an int seed or a generator state, received "
                        f"{type(rng).__name__}") from None
    return torch_generator_state(seed, device)


def torch_generator(rng_state: Any, device: Any = "cpu"):
    """A fresh ``torch.Generator`` on ``device`` set to ``rng_state`` (a private draw source
    for one call; the state it ends in is read back with ``get_state()``)."""
    import torch

    g = torch.Generator(device=torch.device(device))
    g.set_state(rng_state)
    return g


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
