"""One run loop for any engine of the init/step contract (:mod:`inference.base`).

:func:`run_loop` trains an engine on a dataset by epochs of minibatches:

* **minibatches**: every epoch is a random permutation of the N rows cut into batches of
  ``batch_size`` (the last may be smaller), drawn from a generator of the loop's own (a
  ``torch.Generator`` for torch data, whose state the loop carries; for NumPy / JAX data a
  NumPy generator seeded by ``(seed, epoch)``), so the order is reproducible and resumable;
* **the step's randomness**: a JAX engine gets ``jax.random.fold_in(rng, step)`` for a key
  ``rng``; a torch engine carries its generator in its state and gets ``None``;
* **validation and early stopping**: ``validate(engine_state) -> float`` (higher is better)
  every ``validate_every`` epochs; ``stopping`` is :class:`Plateau` (Algorithm 1 of Kapoor et
  al. 2021: stop when ``e > K`` and ``|A_e - A_{e-K}| < delta`` over the validated epochs) or
  :class:`NoImprovement` (stop after ``patience`` validations without a new best, the
  ``EarlyStopper`` of uber-research/vargp ``var_gp/train_utils.py``), or None;
* **which state is kept**: ``keep="best"`` returns the engine state of the best validated
  epoch, ``keep="last"`` the last one;
* **snapshots and exact resume**: after an epoch, once ``snapshot_every_s`` seconds have passed
  since the start or the last snapshot, ``snapshot(loop_state)`` receives the whole
  :class:`LoopState` (engine state, minibatch-order state, histories, the best state);
  ``run_loop(..., resume=loop_state)`` continues from it and ends exactly where the
  uninterrupted loop ends. :func:`state_to_tree` / :func:`state_from_tree` turn a LoopState
  into a tree of arrays for :func:`ppl_cl.persist.save_tree` and back;
* **epoch-indexed schedules**: an engine with ``end_epoch(state) -> state`` has it called after
  the steps of every epoch (e.g. the MultiStepLR position of :mod:`inference.gp_tree_vi`);
  ``order=`` starts the torch minibatch order from a given generator state (a second phase
  continuing the permutations of a first), ``on_epoch(epoch, loss)`` is called after every
  epoch;
* a progress bar over epochs (tqdm).

The engine's ``step`` may raise (e.g. a non-finite loss); the loop does not catch it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Literal, NamedTuple, Sequence

from inference.base import Engine

__all__ = ["Plateau", "NoImprovement", "LoopConfig", "LoopState", "LoopResult", "run_loop",
           "plateau_reached", "state_to_tree", "state_from_tree", "SNAPSHOT_FORMAT"]

#: version of the :class:`LoopState` tree written by :func:`state_to_tree`
SNAPSHOT_FORMAT = 2


class Plateau(NamedTuple):
    """Algorithm 1 of Kapoor et al. (2021): stop after validation ``e`` when ``e > patience``
    and ``|A_e - A_{e - patience}| < tolerance`` (counted in validations)."""

    patience: int = 200
    tolerance: float = 1e-4

    def improves(self, value: float, best: float | None) -> bool:
        return best is None or value > best

    def stop(self, history: Sequence[float], best_index: int) -> bool:
        return plateau_reached(history, self.patience, self.tolerance)


class NoImprovement(NamedTuple):
    """Stop after ``patience`` validations in a row without a new best, a new best being at
    least ``min_delta`` above the last one (the ``EarlyStopper`` of uber-research/vargp,
    ``var_gp/train_utils.py``: patience 20 checks, delta 1e-4)."""

    patience: int = 20
    min_delta: float = 0.0

    def improves(self, value: float, best: float | None) -> bool:
        return best is None or value >= best + self.min_delta

    def stop(self, history: Sequence[float], best_index: int) -> bool:
        return len(history) - 1 - best_index >= self.patience


def plateau_reached(history: Sequence[float], patience: int, tolerance: float) -> bool:
    """``e > K and |A_e - A_{e-K}| < delta`` for the history ``A_1..A_e``."""
    e = len(history)
    return e > patience and abs(history[-1] - history[-1 - patience]) < tolerance


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Settings of :func:`run_loop`.

    Attributes:
        batch_size: rows per minibatch (B).
        max_epochs: at most this many epochs.
        validate_every: validate after every this many epochs.
        stopping: :class:`Plateau`, :class:`NoImprovement` or None (run ``max_epochs``).
        keep: ``"best"`` (the best validated epoch's state) or ``"last"``.
        seed: seeds the minibatch order.
        progress: show a progress bar; desc: its label.
    """

    batch_size: int
    max_epochs: int
    validate_every: int = 1
    stopping: Plateau | NoImprovement | None = None
    keep: Literal["best", "last"] = "best"
    seed: int = 0
    progress: bool = False
    desc: str = ""

    def __post_init__(self) -> None:
        for name, ok in (("batch_size", self.batch_size >= 1),
                         ("max_epochs", self.max_epochs >= 1),
                         ("validate_every", self.validate_every >= 1),
                         ("keep", self.keep in ("best", "last"))):
            if not ok:
                raise ValueError(f"LoopConfig.{name}: invalid value {getattr(self, name)!r}")
        if self.stopping is not None and self.stopping.patience < 1:
            raise ValueError(f"LoopConfig.stopping: patience must be >= 1, received "
                             f"{self.stopping.patience}")


class LoopState(NamedTuple):
    """Everything :func:`run_loop` needs to continue exactly.

    Attributes:
        engine: the engine's state after ``epoch`` epochs.
        epoch: epochs done; steps: engine steps done.
        order: state of the torch minibatch-order generator (None for NumPy / JAX data).
        epoch_losses: mean minibatch loss per epoch.
        validation: ``(epoch, value)`` per validation.
        best_epoch: epoch of the best validation (0: none yet); best_value: its value.
        best: the engine state at ``best_epoch`` (``keep="best"``), else None.
        train_time_s: seconds spent in steps; wall_time_s: seconds in the loop.
    """

    engine: Any
    epoch: int
    steps: int
    order: Any
    epoch_losses: tuple
    validation: tuple
    best_epoch: int
    best_value: float | None
    best: Any
    train_time_s: float
    wall_time_s: float


class LoopResult(NamedTuple):
    """What :func:`run_loop` returns.

    Attributes:
        state: the kept engine state (best validated epoch or last, per ``keep``).
        final: the :class:`LoopState` at the end (its ``engine`` is the last epoch's).
        epoch_losses, validation: histories (``validation`` as ``(epoch, value)``).
        kept_epoch: the epoch of ``state``; kept_validation: its validation value (None if
            that epoch was not validated).
        epochs, steps: done; stopped_early: the stopping rule ended the loop.
        wall_time_s: seconds in the loop (a resumed loop adds the snapshot's);
        seconds_per_epoch: step time per epoch (validation excluded).
    """

    state: Any
    final: LoopState
    epoch_losses: list
    validation: list
    kept_epoch: int
    kept_validation: float | None
    epochs: int
    steps: int
    stopped_early: bool
    wall_time_s: float
    seconds_per_epoch: float


# ---------------------------------------------------------------------------------------------
# minibatch order
# ---------------------------------------------------------------------------------------------
def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


class _TorchOrder:
    """Permutations from one ``torch.Generator`` across epochs (its state is carried)."""

    def __init__(self, seed: int, state: Any = None):
        import torch

        self._torch = torch
        self.gen = torch.Generator().manual_seed(int(seed))
        if state is not None:
            self.gen.set_state(torch.as_tensor(state).cpu())

    def epoch(self, n: int, batch_size: int, epoch: int, device: Any) -> list:
        perm = self._torch.randperm(n, generator=self.gen)
        return [idx.to(device) for idx in perm.split(batch_size)]

    def state(self) -> Any:
        return self.gen.get_state()


class _NumpyOrder:
    """A permutation per epoch from ``numpy.random.default_rng((seed, epoch))`` (stateless)."""

    def __init__(self, seed: int):
        self.seed = int(seed)

    def epoch(self, n: int, batch_size: int, epoch: int, device: Any) -> list:
        import numpy as np

        perm = np.random.default_rng((self.seed, epoch)).permutation(n)
        return [perm[i:i + batch_size] for i in range(0, n, batch_size)]

    def state(self) -> Any:
        return None


def _rows(data: tuple, idx: Any) -> tuple:
    return tuple(t[idx] for t in data)


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------
def _check_data(data: Sequence[Any]) -> tuple[tuple, int]:
    data = tuple(data)
    if not data:
        raise ValueError("data: expected at least one array")
    N = int(data[0].shape[0])
    if N == 0:
        raise ValueError("data: expected at least one row, received 0")
    if any(int(t.shape[0]) != N for t in data):
        raise ValueError(f"data: all arrays need {N} rows, received shapes "
                         f"{[tuple(t.shape) for t in data]}")
    return data, N


class _Run:
    """The mutable bookkeeping of one :func:`run_loop` call (histories, best state, timers)."""

    def __init__(self, ls: LoopState, config: LoopConfig):
        self.c = config
        self.engine_state, self.steps, self.epoch = ls.engine, int(ls.steps), int(ls.epoch)
        self.epoch_losses = list(ls.epoch_losses)
        self.validation = [(int(e), float(v)) for e, v in ls.validation]
        self.history = [v for _, v in self.validation]
        self.best_epoch, self.best_value, self.best = int(ls.best_epoch), ls.best_value, ls.best
        self.best_index = next((i for i, (e, _) in enumerate(self.validation)
                                if e == self.best_epoch), -1)
        self.train_time = float(ls.train_time_s)
        self.wall_before = float(ls.wall_time_s)
        self.stopped_early = False
        self.t0 = time.perf_counter()

    def epoch_steps(self, engine: Engine, data: tuple, batches: list, rng: Any,
                    fold_in: Any) -> None:
        """One epoch of steps (and the engine's ``end_epoch``, if it has one)."""
        t_ep = time.perf_counter()
        total, count = 0.0, 0
        for idx in batches:
            step_rng = None if fold_in is None else fold_in(rng, self.steps)
            self.engine_state, info = engine.step(step_rng, self.engine_state, _rows(data, idx))
            self.steps += 1
            n = len(idx)
            total += float(info.loss) * n
            count += n
        end_epoch = getattr(engine, "end_epoch", None)
        if end_epoch is not None:
            self.engine_state = end_epoch(self.engine_state)
        self.train_time += time.perf_counter() - t_ep
        self.epoch_losses.append(total / count)

    def validate(self, value: float) -> bool:
        """Record a validation of the current epoch; True when the stopping rule stops."""
        c = self.c
        self.validation.append((self.epoch, value))
        self.history.append(value)
        better = (c.stopping.improves(value, self.best_value) if c.stopping is not None
                  else self.best_value is None or value > self.best_value)
        if better:
            self.best_value, self.best_epoch = value, self.epoch
            self.best_index = len(self.history) - 1
            if c.keep == "best":
                self.best = self.engine_state
        if c.stopping is not None and c.stopping.stop(self.history, self.best_index):
            self.stopped_early = self.epoch < c.max_epochs
            return True
        return False

    def loop_state(self, order_state: Any) -> LoopState:
        return LoopState(self.engine_state, self.epoch, self.steps, order_state,
                         tuple(self.epoch_losses), tuple(self.validation), self.best_epoch,
                         self.best_value, self.best, self.train_time,
                         self.wall_before + time.perf_counter() - self.t0)

    def result(self, order_state: Any) -> LoopResult:
        c, final = self.c, self.loop_state(order_state)
        if c.keep == "best" and self.best is not None:
            kept, kept_epoch, kept_value = self.best, self.best_epoch, self.best_value
        else:
            kept, kept_epoch = self.engine_state, self.epoch
            kept_value = dict(self.validation).get(self.epoch)
        return LoopResult(kept, final, self.epoch_losses, self.validation, kept_epoch,
                          kept_value if self.validation else None, self.epoch, self.steps,
                          self.stopped_early, final.wall_time_s,
                          self.train_time / max(self.epoch, 1))


def run_loop(engine: Engine, state: Any, data: Sequence[Any], config: LoopConfig, *,
             rng: Any = None, validate: Callable[[Any], float] | None = None,
             snapshot: Callable[[LoopState], None] | None = None,
             snapshot_every_s: float = 600.0, resume: LoopState | None = None,
             order: Any = None, on_epoch: Callable[[int, float], None] | None = None
             ) -> LoopResult:
    """Train ``engine`` from ``state`` on ``data`` by epochs of minibatches (module docstring).

    Args:
        engine: follows :class:`inference.base.Engine`; its Info has a scalar ``loss``. An
            engine with ``end_epoch(state) -> state`` (an epoch-indexed schedule, e.g.
            MultiStepLR) has it called after the steps of every epoch.
        state: the engine's initial state (``engine.init(...)``); ignored when resuming except
            as the structure the snapshot must match.
        data: arrays sharing their first axis (N rows); a minibatch is the tuple of their rows.
        config: :class:`LoopConfig`.
        rng: a JAX PRNG key (each step gets ``fold_in(rng, step)``), or None (torch engines
            carry their generator in their state).
        validate: ``validate(engine_state) -> float``, higher is better; None: no validation,
            no early stopping, the last state is kept.
        snapshot: receives the :class:`LoopState` after an epoch once ``snapshot_every_s``
            seconds have passed since the start or the last snapshot (not after the last epoch).
        resume: a :class:`LoopState` from ``snapshot`` of the same run: continue after it.
        order: the starting state of the torch minibatch-order generator (e.g. ``final.order``
            of an earlier loop, so that two phases draw one stream of permutations); None:
            seeded by ``config.seed``. Ignored when resuming.
        on_epoch: ``on_epoch(epoch, mean_loss)`` after every epoch (e.g. a log line).
    """
    data, N = _check_data(data)
    c = config
    torch_data = _is_torch(data[0])
    device = data[0].device if torch_data else None
    if resume is not None:
        if not 1 <= int(resume.epoch) < c.max_epochs:
            raise ValueError(f"resume: snapshot after epoch {resume.epoch}, this loop runs "
                             f"{c.max_epochs} epochs")
        ls = resume
    else:
        ls = LoopState(state, 0, 0, order, (), (), 0, None, None, 0.0, 0.0)
    run = _Run(ls, c)
    batch_order = _TorchOrder(c.seed, ls.order) if torch_data else _NumpyOrder(c.seed)
    fold_in = None
    if rng is not None:
        import jax

        fold_in = jax.random.fold_in

    from tqdm.auto import tqdm

    last_snapshot = time.perf_counter()
    bar = tqdm(range(ls.epoch + 1, c.max_epochs + 1), desc=c.desc or "epochs",
               disable=not c.progress, leave=False, dynamic_ncols=True, initial=ls.epoch,
               total=c.max_epochs)
    for epoch in bar:
        run.epoch = epoch
        run.epoch_steps(engine, data, batch_order.epoch(N, c.batch_size, epoch, device), rng,
                        fold_in)
        if on_epoch is not None:
            on_epoch(epoch, run.epoch_losses[-1])
        postfix = {"loss": f"{run.epoch_losses[-1]:.4g}"}
        stop = False
        if validate is not None and epoch % c.validate_every == 0:
            value = float(validate(run.engine_state))
            postfix["val"] = f"{value:.4f}"
            stop = run.validate(value)
        bar.set_postfix(postfix)
        if stop:
            break
        if (snapshot is not None and epoch < c.max_epochs
                and time.perf_counter() - last_snapshot >= snapshot_every_s):
            snapshot(run.loop_state(batch_order.state()))
            last_snapshot = time.perf_counter()
    bar.close()
    return run.result(batch_order.state())


# ---------------------------------------------------------------------------------------------
# LoopState <-> a tree of arrays (for ppl_cl.persist.save_tree)
# ---------------------------------------------------------------------------------------------
def _to_tree(node: Any) -> Any:
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return {f: _to_tree(getattr(node, f)) for f in node._fields}
    if isinstance(node, dict):
        return {k: _to_tree(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_to_tree(v) for v in node]
    return node


def state_to_tree(loop_state: LoopState) -> dict[str, Any]:
    """The :class:`LoopState` as nested dicts / lists of arrays and scalars, with
    ``format`` = :data:`SNAPSHOT_FORMAT`."""
    return {"format": SNAPSHOT_FORMAT, **_to_tree(loop_state)}


def _shape(x: Any) -> tuple | None:
    return tuple(x.shape) if hasattr(x, "shape") else None


def _from_tree(node: Any, like: Any, where: str, convert: Callable[[Any, Any], Any]) -> Any:
    if isinstance(like, tuple) and hasattr(like, "_fields"):
        if not isinstance(node, dict) or set(node) != set(like._fields):
            got = sorted(node) if isinstance(node, dict) else type(node).__name__
            raise ValueError(f"resume: {where} has fields {got}, expected {list(like._fields)}")
        return type(like)(*(_from_tree(node[f], getattr(like, f), f"{where}.{f}", convert)
                            for f in like._fields))
    if isinstance(like, dict):
        if not isinstance(node, dict) or set(node) != set(like):
            raise ValueError(f"resume: {where} has keys "
                             f"{sorted(node) if isinstance(node, dict) else node!r}, expected "
                             f"{sorted(like)}")
        return {k: _from_tree(node[k], like[k], f"{where}.{k}", convert) for k in like}
    if isinstance(like, (list, tuple)):
        if not isinstance(node, (list, tuple)) or len(node) != len(like):
            got = len(node) if isinstance(node, (list, tuple)) else repr(node)
            raise ValueError(f"resume: {where} has {got} entries, expected {len(like)}")
        return type(like)(_from_tree(n, l, f"{where}[{i}]", convert)
                          for i, (n, l) in enumerate(zip(node, like)))
    if _shape(like) is not None:
        if _shape(node) != _shape(like):
            raise ValueError(f"resume: {where} has shape {_shape(node)}, expected {_shape(like)}")
        return convert(node, like)
    if isinstance(like, bool) or like is None:
        return node
    if isinstance(like, int):
        return int(node)
    if isinstance(like, float):
        return float(node)
    return node


def state_from_tree(tree: dict[str, Any], engine_like: Any,
                    convert: Callable[[Any, Any], Any] | None = None) -> LoopState:
    """Rebuild a :class:`LoopState` from :func:`state_to_tree`'s output.

    Args:
        tree: the saved tree.
        engine_like: an engine state of the same structure (e.g. ``engine.init(...)``): the
            types of its NamedTuples are rebuilt and every array's shape is checked against it.
        convert: ``convert(saved_array, like_array)`` -> the array to use (default: saved
            values moved to the device and dtype of ``like`` for torch tensors, as is otherwise).
    """
    if tree.get("format") != SNAPSHOT_FORMAT:
        raise ValueError(f"resume: snapshot format {tree.get('format')!r}, this loop reads "
                         f"{SNAPSHOT_FORMAT}")
    if convert is None:
        def convert(saved: Any, like: Any) -> Any:
            if _is_torch(like):
                import torch

                return torch.as_tensor(saved).to(device=like.device, dtype=like.dtype)
            return saved

    def tuples(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: tuples(v) for k, v in node.items()}
        if isinstance(node, list):
            return tuple(tuples(v) for v in node)
        return node

    engine = _from_tree(tree["engine"], engine_like, "engine", convert)
    best = None if tree.get("best") is None else _from_tree(tree["best"], engine_like, "best",
                                                            convert)
    order = tree.get("order")
    best_value = tree.get("best_value")
    return LoopState(engine, int(tree["epoch"]), int(tree["steps"]), order,
                     tuple(float(v) for v in tree["epoch_losses"]),
                     tuple((int(e), float(v)) for e, v in tuples(tree["validation"])),
                     int(tree["best_epoch"]),
                     None if best_value is None or (isinstance(best_value, float)
                                                    and math.isnan(best_value))
                     else float(best_value),
                     best, float(tree["train_time_s"]), float(tree["wall_time_s"]))
