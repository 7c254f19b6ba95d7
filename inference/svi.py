"""Continual stochastic variational inference for any Pyro model/guide pair.

One call of :meth:`ContinualSVI.fit` trains the parameters of one task (the guide's and the
model's ``pyro.param`` sites) by minibatch SVI — Algorithm 1 of Kapoor et al. (2021) for VAR-GP,
but nothing here knows about GPs:

* **minibatches with the right N/B scaling**: every epoch draws a permutation of the task's N
  rows (a seeded generator) and calls ``model(*batch, num_data=N)``; the model must put its
  observations in ``pyro.plate("data", num_data, subsample=...)`` so that the likelihood is
  scaled by N / B while the KL terms are not (Hoffman et al. 2013);
* **Monte Carlo**: ``num_particles`` ELBO particles (optionally vectorized); models may draw
  further samples themselves in plates (VAR-GP draws S theta and S_f f samples);
* **optimizer**: Yogi (:class:`inference.yogi.Yogi`, the optimizer of the paper) or Adam, over
  the unconstrained values of the param store;
* **early stopping** on a validation metric (higher is better, e.g. accuracy), Algorithm 1 of
  the paper: stop after epoch ``e`` when ``e > patience`` and
  ``|A_e - A_{e - patience}| < tolerance``; the parameters of the best validation epoch are
  restored at the end (``restore_best``, the default; Algorithm 1 has no such step and keeps
  the last epoch's parameters, which ``restore_best=False`` does);
* **finite-loss guard**: a NaN/inf loss or gradient raises :class:`NonFiniteLossError` naming
  the epoch and step *before* the optimizer touches the parameters;
* **snapshots within a task**: ``fit(..., checkpoint=fn)`` hands ``fn`` a snapshot of the loop
  (parameters, optimizer moments, random-number states, losses, validation history, the best
  epoch's parameters) after an epoch once ``checkpoint_every_s`` seconds have passed since the
  last one; ``fit(..., resume=snapshot)`` continues from it and ends exactly where the
  uninterrupted fit ends, so a long task stopped mid-way loses at most that much work;
* a tqdm progress bar over epochs; device-agnostic (tensors stay where the data and
  parameters are); deterministic under ``seed`` (the global torch RNG is forked, so the
  caller's random state is left untouched).

Each fit runs in its own param-store scope (``pyro.get_param_store().scope()``): the
parameters of the task start from the model's/guide's initial values, and the store seen by
the caller is restored afterwards. The trained values come back in :class:`FitResult`.

Engine contract (STYLE.md 2): :meth:`ContinualSVI.init` -> :class:`SVIState`,
:meth:`ContinualSVI.step` ``(state, *batch) -> (state, StepInfo)``; :meth:`ContinualSVI.fit`
is the loop over epochs and minibatches built on them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
import warnings
from typing import Any, Callable, NamedTuple, Sequence

import pyro
import torch
from tqdm.auto import tqdm

from inference.elbo import LazyTraceMeanField_ELBO
from inference.yogi import Yogi

__all__ = ["SVIConfig", "SVIState", "StepInfo", "FitResult", "ContinualSVI",
           "NonFiniteLossError", "minibatch_indices", "plateau_reached", "SNAPSHOT_FORMAT"]

#: version of the within-task snapshot of :meth:`ContinualSVI.fit` (``checkpoint=``/``resume=``)
SNAPSHOT_FORMAT = 1


class NonFiniteLossError(FloatingPointError):
    """The ELBO loss or its gradient became NaN or infinite."""


_NON_FINITE = re.compile(r"(?<![A-Za-z])(nan|inf)(?![A-Za-z])")


@contextlib.contextmanager
def _no_nan_warnings():
    """Silence Pyro's "Encountered NaN" warnings (loss and backward hook): the finite-loss guard
    of :meth:`ContinualSVI.step` raises the clear error instead."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Encountered NaN", category=UserWarning)
        yield


@dataclasses.dataclass(frozen=True)
class SVIConfig:
    """Settings of one task's SVI run (defaults: VAR-GP's, paper App. D.1 / Sect. 5).

    Attributes:
        learning_rate: step size (ref: 3e-3 Split MNIST, 3.7e-3 Permuted MNIST, 1e-2 toy).
        batch_size: B (ref: 512).
        max_epochs: E (ref: 500).
        patience: K epochs of Algorithm 1 (ref: 200).
        tolerance: delta of Algorithm 1 (ref: 1e-4).
        num_particles: ELBO particles; vectorize_particles: vectorize them.
        max_plate_nesting: passed to the ELBO (None: Pyro infers it).
        optimizer: ``"yogi"`` or ``"adam"``.
        restore_best: restore the parameters of the best validation epoch.
        validate_every: validate every this many epochs.
        seed: seeds minibatch order and every Monte Carlo draw of the run.
        progress: show a tqdm bar over epochs.
        clip_norm: optional gradient-norm clipping (off by default, not in the paper).
        validate_args: when Pyro checks distribution arguments and sample supports:
            ``"first"`` (default) on the initializing evaluation and the first step of a fit,
            where a malformed program shows itself, then not again; ``"always"``; ``"never"``.
            Each check reads a boolean back from the device, so on a GPU it stalls the queue of
            launched kernels once per distribution per step (the auto-regressive guide builds
            ``2 t`` Gaussians per step); non-finite losses and gradients are caught by the
            finite-loss guard whatever this setting.
    """

    learning_rate: float = 3e-3
    batch_size: int = 512
    max_epochs: int = 500
    patience: int = 200
    tolerance: float = 1e-4
    num_particles: int = 1
    vectorize_particles: bool = False
    max_plate_nesting: int | None = None
    optimizer: str = "yogi"
    restore_best: bool = True
    validate_every: int = 1
    seed: int = 0
    progress: bool = False
    clip_norm: float | None = None
    validate_args: str = "first"

    def __post_init__(self) -> None:
        checks = [("learning_rate", self.learning_rate > 0), ("batch_size", self.batch_size >= 1),
                  ("max_epochs", self.max_epochs >= 1), ("patience", self.patience >= 1),
                  ("tolerance", self.tolerance >= 0), ("num_particles", self.num_particles >= 1),
                  ("validate_every", self.validate_every >= 1),
                  ("optimizer", self.optimizer in ("yogi", "adam")),
                  ("validate_args", self.validate_args in ("first", "always", "never"))]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"SVIConfig.{name}: invalid value {getattr(self, name)!r}")


class SVIState(NamedTuple):
    """The engine state: live parameter tensors (unconstrained), the optimizer, counters."""

    params: dict[str, torch.Tensor]
    optimizer: torch.optim.Optimizer
    step: int
    epoch: int


class StepInfo(NamedTuple):
    loss: float
    grad_norm: float


class FitResult(NamedTuple):
    """What one task's SVI run produced.

    Attributes:
        params: constrained parameter values (detached clones), of the best validation epoch
            when ``restore_best`` and a validation function were given, else of the last step.
        epoch_losses: mean minibatch loss per epoch.
        validation: validation metric per validated epoch, as ``(epoch, value)``.
        best_epoch: epoch of the restored parameters (1-based; the last epoch otherwise).
        best_validation: the metric at ``best_epoch`` (None without validation, or when
            ``restore_best=False`` and the last epoch was not validated).
        epochs, steps: epochs run and optimizer steps taken.
        stopped_early: True if the plateau rule stopped the run before ``max_epochs``.
        wall_time_s: seconds spent in the loop (a resumed fit adds the stopped calls' time up
            to the snapshot it resumed from); seconds_per_epoch: training time per epoch
            (validation excluded).
    """

    params: dict[str, torch.Tensor]
    epoch_losses: list[float]
    validation: list[tuple[int, float]]
    best_epoch: int
    best_validation: float | None
    epochs: int
    steps: int
    stopped_early: bool
    wall_time_s: float
    seconds_per_epoch: float


def minibatch_indices(num_data: int, batch_size: int, generator: torch.Generator
                      ) -> list[torch.Tensor]:
    """One epoch: a random permutation of ``range(num_data)`` cut into batches of ``batch_size``
    (the last one may be smaller; every row is used once)."""
    perm = torch.randperm(num_data, generator=generator)
    return list(perm.split(batch_size))


def plateau_reached(history: Sequence[float], patience: int, tolerance: float) -> bool:
    """Algorithm 1 of Kapoor et al. (2021): ``e > K and |A_e - A_{e-K}| < delta``."""
    e = len(history)
    return e > patience and abs(history[-1] - history[-1 - patience]) < tolerance


def _optimizer_tree(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """``opt.state_dict()`` with string keys (a checkpoint tree allows no integer keys) and
    copies of its tensors (the optimizer updates its moments in place)."""
    sd = opt.state_dict()
    return {"state": {str(i): {k: x.detach().clone() if torch.is_tensor(x) else x
                               for k, x in v.items()} for i, v in sd["state"].items()},
            "param_groups": [dict(g) for g in sd["param_groups"]]}


def _optimizer_state_dict(tree: dict[str, Any]) -> dict[str, Any]:
    groups = []
    for g in tree["param_groups"]:
        g = dict(g)
        g["params"] = [int(i) for i in g["params"]]
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": {int(i): dict(v) for i, v in tree["state"].items()}, "param_groups": groups}


class ContinualSVI:
    """SVI engine for one Pyro model/guide pair (one task of a continual stream).

    Args:
        model, guide: Pyro callables taking ``(*batch, num_data=N, **kwargs)``.
        config: :class:`SVIConfig`.
        loss: a Pyro ELBO (default :class:`inference.elbo.LazyTraceMeanField_ELBO`, Pyro's
            ``TraceMeanField_ELBO`` computing only the terms it uses, with the config's
            particles; its analytic KL terms are what VAR-GP's bound uses).
        num_data_kwarg: name of the keyword that receives N (None: not passed).
    """

    def __init__(self, model: Callable, guide: Callable, config: SVIConfig | None = None, *,
                 loss=None, num_data_kwarg: str | None = "num_data"):
        self.model, self.guide = model, guide
        self.config = config or SVIConfig()
        c = self.config
        self.loss = loss or LazyTraceMeanField_ELBO(num_particles=c.num_particles,
                                                vectorize_particles=c.vectorize_particles,
                                                max_plate_nesting=c.max_plate_nesting
                                                if c.max_plate_nesting is not None
                                                else float("inf"))
        self.num_data_kwarg = num_data_kwarg

    # -- engine contract -----------------------------------------------------------------------
    def _loss(self, *args, **kwargs) -> torch.Tensor:
        return self.loss.differentiable_loss(self.model, self.guide, *args, **kwargs)

    def _validating(self, step: int) -> bool:
        mode = self.config.validate_args
        return mode == "always" or (mode == "first" and step == 0)

    def init(self, *args, **kwargs) -> SVIState:
        """Create the parameters (one loss evaluation without a step) and the optimizer."""
        with torch.no_grad(), pyro.validation_enabled(self._validating(0)):
            self._loss(*args, **kwargs)
        params = dict(pyro.get_param_store().named_parameters())
        if not params:
            raise ValueError("model and guide declare no pyro.param: nothing to optimize")
        c = self.config
        if c.optimizer == "yogi":
            opt = Yogi(params.values(), lr=c.learning_rate)
        else:
            opt = torch.optim.Adam(params.values(), lr=c.learning_rate)
        return SVIState(params, opt, 0, 0)

    def step(self, state: SVIState, *args, where: str = "", **kwargs
             ) -> tuple[SVIState, StepInfo]:
        """One gradient step on one minibatch. Raises :class:`NonFiniteLossError` (parameters
        untouched) if the loss or a gradient is not finite."""
        opt = state.optimizer
        opt.zero_grad(set_to_none=True)
        where = where or f"step {state.step + 1}"
        try:
            with pyro.validation_enabled(self._validating(state.step)), _no_nan_warnings():
                loss = self._loss(*args, **kwargs)
        except ValueError as err:
            # Pyro's distribution validation meets the NaN first (e.g. a NaN logit)
            if _NON_FINITE.search(str(err)):
                raise NonFiniteLossError(
                    f"SVI loss evaluation produced NaN/inf at {where}: "
                    f"{str(err).splitlines()[0]}") from err
            raise
        if not torch.isfinite(loss):
            raise NonFiniteLossError(
                f"SVI loss became {float(loss.detach())} at {where}; the parameters keep their "
                f"last finite values. Lower the learning rate or check the data/initialization.")
        with _no_nan_warnings():
            loss.backward()
        grads = [p.grad for p in state.params.values() if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])) \
            if grads else torch.zeros(())
        if not torch.isfinite(norm):
            bad = [n for n, p in state.params.items()
                   if p.grad is not None and not torch.isfinite(p.grad).all()]
            raise NonFiniteLossError(
                f"SVI gradient became non-finite at {where} (parameters {bad}); the parameters "
                f"keep their last finite values.")
        if self.config.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(list(state.params.values()), self.config.clip_norm)
        opt.step()
        return state._replace(step=state.step + 1), StepInfo(float(loss.detach()), float(norm))

    # -- the loop --------------------------------------------------------------------------------
    def fit(self, data: Sequence[torch.Tensor], *, validate: Callable[[], float] | None = None,
            desc: str = "svi", checkpoint: Callable[[dict[str, Any]], None] | None = None,
            checkpoint_every_s: float = 600.0, resume: dict[str, Any] | None = None,
            **kwargs: Any) -> FitResult:
        """Train on ``data`` (tensors sharing their first axis, N rows) for one task.

        Args:
            data: e.g. ``(x, y)``; minibatches are ``tuple(t[idx] for t in data)``.
            validate: called (inside the run's param-store scope) after every
                ``validate_every`` epochs; returns the metric to maximize (e.g. validation
                accuracy). None: no early stopping, the last parameters are returned.
            desc: progress-bar label.
            checkpoint: called with a snapshot of the loop (a tree of tensors and JSON values,
                for :func:`ppl_cl.persist.save_tree` or ``torch.save``) after an epoch when at
                least ``checkpoint_every_s`` seconds have passed since the fit started or the
                last snapshot, unless the fit stops after that epoch.
            resume: a snapshot from ``checkpoint`` of the same fit (model, guide, config, data,
                validation); the loop continues after its epoch and returns what the
                uninterrupted fit returns (same parameters, losses and validation history;
                ``wall_time_s`` adds the snapshot's own wall time, so it counts the stopped
                calls too, up to their last snapshot; snapshots written before the snapshot
                carried ``wall_time_s`` count this call only).
            kwargs: passed to model and guide on every call.
        """
        data = tuple(data)
        if not data:
            raise ValueError("data: expected at least one tensor")
        N = int(data[0].shape[0])
        if N == 0:
            raise ValueError("data: expected at least one row, received 0")
        for t in data:
            if int(t.shape[0]) != N:
                raise ValueError(f"data: all tensors need {N} rows, received shapes "
                                 f"{[tuple(d.shape) for d in data]}")
        c = self.config
        device = data[0].device
        if self.num_data_kwarg is not None:
            kwargs = {**kwargs, self.num_data_kwarg: N}
        devices = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        t0 = time.perf_counter()
        with pyro.get_param_store().scope(), torch.random.fork_rng(devices=devices):
            torch.manual_seed(c.seed)
            order = torch.Generator().manual_seed(c.seed)
            first = tuple(t[:min(N, c.batch_size)] for t in data)
            state = self.init(*first, **kwargs)
            epoch_losses: list[float] = []
            history: list[float] = []
            validation: list[tuple[int, float]] = []
            best_value, best_epoch, best_snapshot = -math.inf, 0, None
            stopped_early = False
            train_time = 0.0
            wall_before = 0.0  # wall time of the stopped calls, from the resumed snapshot
            start = 0
            if resume is not None:
                state, order = self._restore(state, resume, order, devices)
                start = state.epoch
                epoch_losses = [float(v) for v in resume["epoch_losses"]]
                validation = [(int(e), float(v)) for e, v in resume["validation"]]
                history = [v for _, v in validation]
                if resume["best_epoch"] > 0:
                    best_value, best_epoch = float(resume["best_value"]), int(resume["best_epoch"])
                if resume["best_params"] is not None:
                    best_snapshot = {n: torch.as_tensor(v).to(state.params[n])
                                     for n, v in resume["best_params"].items()}
                train_time = float(resume["train_time_s"])
                wall_before = float(resume.get("wall_time_s", 0.0))
            last_checkpoint = time.perf_counter()
            bar = tqdm(range(start + 1, c.max_epochs + 1), desc=desc, disable=not c.progress,
                       leave=False, dynamic_ncols=True, initial=start, total=c.max_epochs)
            epoch = start
            for epoch in bar:
                t_ep = time.perf_counter()
                total, count = 0.0, 0
                for b, idx in enumerate(minibatch_indices(N, c.batch_size, order)):
                    idx = idx.to(device)
                    batch = tuple(t[idx] for t in data)
                    state, info = self.step(state, *batch,
                                            where=f"epoch {epoch}, minibatch {b + 1} "
                                                  f"(optimizer step {state.step + 1})", **kwargs)
                    total += info.loss * len(idx)
                    count += len(idx)
                train_time += time.perf_counter() - t_ep
                epoch_losses.append(total / count)
                state = state._replace(epoch=epoch)
                postfix = {"loss": f"{epoch_losses[-1]:.4g}"}
                if validate is not None and epoch % c.validate_every == 0:
                    with torch.no_grad():
                        value = float(validate())
                    validation.append((epoch, value))
                    history.append(value)
                    postfix["val"] = f"{value:.4f}"
                    if value > best_value:
                        best_value, best_epoch = value, epoch
                        if c.restore_best:
                            best_snapshot = {n: p.detach().clone()
                                             for n, p in state.params.items()}
                    if plateau_reached(history, c.patience, c.tolerance):
                        stopped_early = epoch < c.max_epochs
                        bar.set_postfix(postfix)
                        break
                bar.set_postfix(postfix)
                if (checkpoint is not None and epoch < c.max_epochs
                        and time.perf_counter() - last_checkpoint >= checkpoint_every_s):
                    checkpoint({
                        "format": SNAPSHOT_FORMAT, "epoch": epoch, "step": state.step,
                        "params": {n: p.detach().clone() for n, p in state.params.items()},
                        "optimizer": _optimizer_tree(state.optimizer),
                        "rng": self._rng_state(order, devices),
                        "epoch_losses": list(epoch_losses),
                        "validation": [[e, v] for e, v in validation],
                        "best_epoch": best_epoch,
                        "best_value": best_value if best_epoch > 0 else None,
                        "best_params": best_snapshot,
                        "train_time_s": train_time,
                        "wall_time_s": wall_before + time.perf_counter() - t0})
                    last_checkpoint = time.perf_counter()
            bar.close()
            if best_snapshot is not None:
                with torch.no_grad():
                    for n, p in state.params.items():
                        p.copy_(best_snapshot[n])
            else:  # the last epoch's parameters are kept: report its metric, not the best one
                best_epoch = epoch
                best_value = dict(validation).get(epoch)
            store = pyro.get_param_store()
            params = {n: store[n].detach().clone() for n in state.params}
        wall = wall_before + time.perf_counter() - t0
        return FitResult(params, epoch_losses, validation, best_epoch,
                         best_value if validation else None, epoch, state.step, stopped_early,
                         wall, train_time / max(epoch, 1))

    # -- snapshots within a task -----------------------------------------------------------------
    @staticmethod
    def _rng_state(order: torch.Generator, devices: list[int]) -> dict[str, Any]:
        return {"torch": torch.get_rng_state(), "order": order.get_state(),
                "cuda": [torch.cuda.get_rng_state(d) for d in devices]}

    def _restore(self, state: SVIState, snap: dict[str, Any], order: torch.Generator,
                 devices: list[int]) -> tuple[SVIState, torch.Generator]:
        """Load a :meth:`fit` snapshot into the freshly initialized ``state`` (in place)."""
        if snap.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"resume: snapshot format {snap.get('format')!r}, this engine "
                             f"reads {SNAPSHOT_FORMAT}")
        saved = snap["params"]
        if set(saved) != set(state.params) or any(
                tuple(torch.as_tensor(saved[n]).shape) != tuple(p.shape)
                for n, p in state.params.items()):
            raise ValueError(
                "resume: the snapshot's parameters "
                f"{ {n: tuple(torch.as_tensor(v).shape) for n, v in saved.items()} } do not match "
                f"this fit's { {n: tuple(p.shape) for n, p in state.params.items()} }")
        epoch = int(snap["epoch"])
        if not 1 <= epoch < self.config.max_epochs:
            raise ValueError(f"resume: snapshot after epoch {epoch}, this fit runs "
                             f"{self.config.max_epochs} epochs")
        with torch.no_grad():
            for n, p in state.params.items():
                p.copy_(torch.as_tensor(saved[n]))
        state.optimizer.load_state_dict(_optimizer_state_dict(snap["optimizer"]))
        rng = snap["rng"]
        torch.set_rng_state(torch.as_tensor(rng["torch"]).cpu())
        order.set_state(torch.as_tensor(rng["order"]).cpu())
        for d, st in zip(devices, rng["cuda"]):
            torch.cuda.set_rng_state(torch.as_tensor(st).cpu(), d)
        return state._replace(step=int(snap["step"]), epoch=epoch), order
