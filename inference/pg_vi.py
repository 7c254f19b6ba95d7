"""Polya-Gamma variational inference for a sparse binary GP node (GP-Tree App. A-B; Wenzel et
al. 2019): closed-form ``c`` updates, natural-gradient steps on ``(eta, H)``, minibatches.

Per step on a minibatch ``B`` of the node's ``n`` points (Algorithm 1 of the paper, inner loop):

1. ``c_B <- sqrt(E_q f_i^2)`` (eq. 16) under the current ``q(fbar)``;
2. ``(eta, H) <- (eta, H) + rho ((eta*, H*) - (eta, H))`` with the minibatch fixed point of
   eq. 17 (``rho`` the natural learning rate: 0.05 in App. C.2-C.3, ``natural_lr`` of
   ``ppl_cl/configs/gp_tree.py``); ``rho = 1`` on the full batch is exact coordinate ascent;
3. the ELBO (eq. 13) at the new ``(c, eta, H)``, differentiable in the kernel blocks of the
   batch: ``Info.loss = -ELBO / n`` is what the kernel hyperparameters, inducing inputs and a
   backbone descend (App. C.2: "dividing the loss at each node by the total number of training
   samples relevant for that node").

Engine contract (:mod:`inference.base`, ``kind = "host"``): ``init(rng, num_data,
num_inducing, ...) -> VIState``; ``step(rng, state, batch) -> (VIState, VIInfo)``; both are
deterministic (``rng`` unused, ``None`` is fine). ``c`` is held for every point of the node
(initialized at 1 as in the reference) and updated on the batch indices.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from models.gp_tree import (NaturalParams, natural_gradient_target, natural_to_moments,
                            optimal_c, pg_vi_elbo, vi_marginals)
from models.linalg_torch import jitter_cholesky

__all__ = ["VIState", "VIBatch", "VIInfo", "PGVI"]


class VIState(NamedTuple):
    """``eta (m,)``, ``H (m, m)`` (natural parameters of q(fbar)), ``c (n,)`` (tilts of
    q(omega) for every point of the node) and the step count (0-d int64)."""

    eta: Tensor
    H: Tensor
    c: Tensor
    step: Tensor


class VIBatch(NamedTuple):
    """One minibatch of a node: ``K_mm (m, m)`` (jitter included), ``K_mb (m, b)``,
    ``k_bb (b,)`` (diagonal of the batch's prior covariance), ``kappa (b,)``, ``index (b,)``
    (positions of the batch points among the node's ``n``) and ``num_data`` (n)."""

    K_mm: Tensor
    K_mb: Tensor
    k_bb: Tensor
    kappa: Tensor
    index: Tensor
    num_data: int


class VIInfo(NamedTuple):
    """``elbo`` (0-d, eq. 13 scaled to the node; differentiable in the batch's kernel blocks)
    and ``loss = -elbo / num_data``."""

    elbo: Tensor
    loss: Tensor


class PGVI:
    """Natural-gradient PG-VI engine.

    Args:
        learning_rate: natural-gradient step ``rho`` in (0, 1], required: the tuned value is
            the config's (``natural_lr`` of ``ppl_cl/configs/gp_tree.py``, 0.05 by App.
            C.2-C.3).
    """

    kind = "host"

    def __init__(self, learning_rate: float):
        if not (0.0 < learning_rate <= 1.0):
            raise ValueError(f"learning_rate: expected a value in (0, 1], received {learning_rate!r}")
        self.learning_rate = float(learning_rate)

    def init(self, rng, num_data: int, num_inducing: int, dtype=torch.float64,
             device=None) -> VIState:
        """``eta = 0``, ``H = -I/2`` (q(fbar) = N(0, I)) and ``c = 1`` (the reference init);
        ``rng`` unused (deterministic)."""
        del rng
        return VIState(torch.zeros(num_inducing, dtype=dtype, device=device),
                       -0.5 * torch.eye(num_inducing, dtype=dtype, device=device),
                       torch.ones(num_data, dtype=dtype, device=device),
                       torch.zeros((), dtype=torch.int64))

    def step(self, rng, state: VIState, batch: VIBatch) -> tuple[VIState, VIInfo]:
        del rng
        # steps 1-2 on detached kernel blocks: the variational updates are closed forms
        with torch.no_grad():
            L_mm = jitter_cholesky(batch.K_mm.detach(), name="K_mm")
            K_mb, k_bb = batch.K_mb.detach(), batch.k_bb.detach()
            q = natural_to_moments(NaturalParams(state.eta, state.H))
            marg = vi_marginals(L_mm, K_mb, k_bb, q)
            c_b = optimal_c(marg)                                                  # eq. 16
            target = natural_gradient_target(L_mm, marg, batch.kappa, c_b, batch.num_data)
            rho = self.learning_rate
            eta = state.eta + rho * (target.eta - state.eta)                         # eq. 17
            H = state.H + rho * (target.H - state.H)
            H = 0.5 * (H + H.transpose(-1, -2))
            c = state.c.clone()
            c[batch.index] = c_b
        # step 3: the bound at the new state, differentiable in the kernel blocks
        q_new = natural_to_moments(NaturalParams(eta, H))
        L_grad = jitter_cholesky(batch.K_mm, name="K_mm")
        elbo = pg_vi_elbo(L_grad, batch.K_mb, batch.k_bb, batch.kappa, c_b, q_new,
                          batch.num_data)
        return (VIState(eta, H, c, state.step + 1),
                VIInfo(elbo, -elbo / batch.num_data))

    @staticmethod
    def elbo(state: VIState, batch: VIBatch, update_c: bool = True) -> Tensor:
        """The bound (eq. 13) at ``state`` on ``batch``; with ``update_c`` at the optimal
        ``c`` of eq. 16 (the bound as a function of q(fbar) alone), else at ``state.c``."""
        L_mm = jitter_cholesky(batch.K_mm, name="K_mm")
        q = natural_to_moments(NaturalParams(state.eta, state.H))
        if update_c:
            with torch.no_grad():
                c = optimal_c(vi_marginals(L_mm, batch.K_mb.detach(), batch.k_bb.detach(), q))
        else:
            c = state.c[batch.index]
        return pg_vi_elbo(L_mm, batch.K_mb, batch.k_bb, batch.kappa, c, q, batch.num_data)
