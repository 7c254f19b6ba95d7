"""SGD engines for GP-Tree's VI / DKL base session (Achituve et al. 2021, Sect. 3.2-3.3, App.
C.2-C.3): the cross-entropy pre-training of a backbone (Sect. 3.3) and the tree of PG-VI nodes
(:mod:`inference.pg_vi`) whose kernel, inducing inputs and backbone descend the sum over nodes of
``-ELBO_node / n_node`` (eq. 13; App. C.2 "dividing the loss at each node by the total number
of training samples relevant for that node").

Both are one engine, :class:`SGDEngine`, over a loss ``loss(params, nodes, batch) -> (loss,
nodes)``: the functional form of ``torch.optim.SGD`` (momentum, dampening 0, weight decay,
no Nesterov) with ``torch.optim.lr_scheduler.MultiStepLR`` stepped after every epoch, written
so that its numbers are bit-identical to theirs. Engine contract (:mod:`inference.base`): the
state holds the parameters, the momentum buffers and the schedule position as values; the
run loop (:func:`inference.loop.run_loop`) calls ``end_epoch`` after every epoch (the
scheduler's ``step()``).

Losses: :class:`CrossEntropyLoss` (``head(backbone(x))``, pre-training) and
:class:`TreeELBOLoss` (every internal node's PG-VI step, :class:`inference.pg_vi.PGVI`, on the
batch points of its classes, the natural-gradient updates of ``q(fbar)`` inside the loss).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, NamedTuple, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call

from inference.pg_vi import PGVI, VIBatch, VIState
from models.gp_tree import NodeKernelParams, node_kernel

__all__ = ["SGDState", "EngineState", "EngineInfo", "SGDEngine", "multistep_lr",
           "CrossEntropyLoss", "TreeNode", "TreeELBOLoss", "module_params"]


def multistep_lr(learning_rate: float, milestones: Sequence[int], gamma: float,
                 epoch: int) -> float:
    """The learning rate after ``epoch`` epochs of ``MultiStepLR(milestones, gamma)`` from
    ``learning_rate``: multiplied by ``gamma ** count`` at every epoch in ``milestones``
    (``count`` its repetitions), in the same order as torch, so the value is bit-identical."""
    counts = Counter(int(m) for m in milestones)
    lr = float(learning_rate)
    for t in range(1, int(epoch) + 1):
        if t in counts:
            lr = lr * gamma ** counts[t]
    return lr


class SGDState(NamedTuple):
    """Momentum buffers per trained parameter (zeros until its first gradient) and
    ``started`` (0-d bool: the buffer holds a value; torch.optim.SGD's buffer is None before)."""

    momentum: dict
    started: dict


class EngineState(NamedTuple):
    """``params`` (name -> tensor, trained or not), ``opt`` (:class:`SGDState`), ``nodes``
    (name -> :class:`inference.pg_vi.VIState`, empty for pre-training), ``epoch`` (epochs done:
    the MultiStepLR position) and ``step`` (steps done)."""

    params: dict
    opt: SGDState
    nodes: dict
    epoch: int
    step: int


class EngineInfo(NamedTuple):
    """``loss`` (0-d, detached) of the step's batch."""

    loss: Tensor


class SGDEngine:
    """SGD with momentum and a MultiStepLR schedule on ``loss`` (module docstring).

    Args:
        loss: ``loss(params, nodes, batch) -> (0-d loss, nodes)``; ``params`` are leaves, the
            trained ones requiring grad.
        trainable: names of the parameters SGD updates (the others pass through).
        learning_rate, momentum, weight_decay: as ``torch.optim.SGD``.
        milestones, gamma: as ``torch.optim.lr_scheduler.MultiStepLR`` (epochs of this engine).
    """

    kind = "host"

    def __init__(self, loss: Callable[[dict, dict, Any], tuple[Tensor, dict]],
                 trainable: Sequence[str], learning_rate: float, momentum: float = 0.0,
                 weight_decay: float = 0.0, milestones: Sequence[int] = (), gamma: float = 0.1):
        self.loss = loss
        self.trainable = tuple(trainable)
        self.learning_rate = float(learning_rate)
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self.milestones = tuple(int(m) for m in milestones)
        self.gamma = float(gamma)

    def init(self, rng, params: dict, nodes: dict | None = None) -> EngineState:
        """Detached copies of ``params``, zero momentum buffers, epoch 0 (``rng`` unused)."""
        del rng
        params = {k: v.detach().clone() for k, v in params.items()}
        missing = sorted(set(self.trainable) - set(params))
        if missing:
            raise ValueError(f"trainable: parameters {missing} are not in params")
        opt = SGDState({k: torch.zeros_like(params[k]) for k in self.trainable},
                       {k: torch.zeros((), dtype=torch.bool, device=params[k].device)
                        for k in self.trainable})
        return EngineState(params, opt, dict(nodes or {}), 0, 0)

    def lr(self, epoch: int) -> float:
        """The learning rate of epoch ``epoch + 1`` (after ``epoch`` scheduler steps)."""
        return multistep_lr(self.learning_rate, self.milestones, self.gamma, epoch)

    def end_epoch(self, state: EngineState) -> EngineState:
        """The scheduler's ``step()``: one epoch more."""
        return state._replace(epoch=state.epoch + 1)

    def step(self, rng, state: EngineState, batch: Any) -> tuple[EngineState, EngineInfo]:
        del rng  # deterministic
        leaves = {k: (v.detach().requires_grad_(True) if k in self.trainable else v)
                  for k, v in state.params.items()}
        loss, nodes = self.loss(leaves, state.nodes, batch)
        names = [k for k in self.trainable]
        grads = (torch.autograd.grad(loss, [leaves[k] for k in names], allow_unused=True)
                 if names and loss.requires_grad else [None] * len(names))
        params, opt = self._update(state, dict(zip(names, grads)), self.lr(state.epoch))
        return (EngineState(params, opt, nodes, state.epoch, state.step + 1),
                EngineInfo(loss.detach()))

    @torch.no_grad()
    def _update(self, state: EngineState, grads: dict, lr: float) -> tuple[dict, SGDState]:
        """``torch.optim.SGD``'s single-tensor update; a parameter without a gradient (unused
        by this batch's loss) keeps its value and its buffer, as torch skips it."""
        params = dict(state.params)
        momentum, started = dict(state.opt.momentum), dict(state.opt.started)
        for k, g in grads.items():
            if g is None:
                continue
            p = state.params[k]
            if self.weight_decay != 0:
                g = g.add(p, alpha=self.weight_decay)
            if self.momentum != 0:
                buf = torch.where(started[k], momentum[k].mul(self.momentum).add(g, alpha=1.0),
                                  g)
                momentum[k] = buf
                started[k] = torch.ones_like(started[k])
                g = buf
            params[k] = p.add(g, alpha=-lr)
        return params, SGDState(momentum, started)


# ---------------------------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------------------------
def module_params(prefix: str, module: nn.Module | None) -> dict[str, Tensor]:
    """``{prefix.name: parameter}`` of ``module`` (empty for None)."""
    if module is None:
        return {}
    return {f"{prefix}.{k}": v for k, v in module.named_parameters()}


def _call(module: nn.Module, prefix: str, params: dict, x: Tensor) -> Tensor:
    n = len(prefix) + 1
    return functional_call(module, {k[n:]: v for k, v in params.items()
                                    if k.startswith(prefix + ".")}, (x,))


class CrossEntropyLoss:
    """``CE(head(backbone(x)), y)`` for batches ``(x, y_index)`` (Sect. 3.3 pre-training);
    parameters ``backbone.*`` and ``head.*``."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        self.backbone, self.head = backbone, head
        self.ce = nn.CrossEntropyLoss()

    def __call__(self, params: dict, nodes: dict, batch) -> tuple[Tensor, dict]:
        x, y = batch[0], batch[1]
        z = _call(self.backbone, "backbone", params, x)
        return self.ce(_call(self.head, "head", params, z), y), nodes


class TreeNode(NamedTuple):
    """One internal node: its column in the batch's position array, its right classes
    ``(r,)``, the rows of its classes in the inducing array, its point count ``n``."""

    column: int
    right: Tensor
    rows: tuple
    num_data: int


class TreeELBOLoss:
    """Sum over internal nodes of the PG-VI step's ``-ELBO / n_node`` (eq. 13, App. C.2) on
    batches ``(x, y, positions (b, nodes))`` (``positions[:, j]``: the batch points' index
    among node j's points, -1 when not a point of the node). Parameters: ``backbone.*`` (when a
    backbone is given), ``inducing (C, M, d)``, ``<node>.log_outputscale`` /
    ``<node>.log_lengthscale``; ``nodes`` maps the node names to their :class:`VIState`."""

    def __init__(self, tree_nodes: dict[str, TreeNode], backbone: nn.Module | None,
                 natural_lr: float, kernel: str, jitter: float):
        self.tree_nodes = dict(tree_nodes)
        self.backbone = backbone
        self.engine = PGVI(natural_lr)
        self.kernel, self.jitter = kernel, float(jitter)

    def __call__(self, params: dict, nodes: dict, batch) -> tuple[Tensor, dict]:
        x, yb, pos_all = batch
        z = x if self.backbone is None else _call(self.backbone, "backbone", params, x)
        inducing = params["inducing"]
        d = inducing.shape[-1]
        loss = z.new_zeros(())
        nodes = dict(nodes)
        for name, tn in self.tree_nodes.items():
            pos = pos_all[:, tn.column]
            sel = pos >= 0
            if not bool(sel.any()):
                continue
            zb = z[sel]
            kap = torch.isin(yb[sel], tn.right).to(z.dtype) - 0.5
            Zbar = inducing[list(tn.rows)].reshape(-1, d)
            kp = NodeKernelParams(params[f"{name}.log_outputscale"].exp(),
                                  params[f"{name}.log_lengthscale"].exp(), self.jitter,
                                  self.kernel)
            k = node_kernel(kp)
            K_mm = k(Zbar) + self.jitter * torch.eye(Zbar.shape[0], dtype=z.dtype,
                                                     device=z.device)
            vb = VIBatch(K_mm, k(Zbar, zb), k.diag(zb) + self.jitter, kap, pos[sel],
                         tn.num_data)
            nodes[name], info = self.engine.step(None, nodes[name], vb)
            loss = loss + info.loss
        return loss, nodes

    def init_nodes(self, num_inducing: dict[str, int], dtype, device) -> dict[str, VIState]:
        """``PGVI.init`` of every node (``num_inducing``: inducing points per node)."""
        return {name: self.engine.init(None, tn.num_data, num_inducing[name], dtype, device)
                for name, tn in self.tree_nodes.items()}
