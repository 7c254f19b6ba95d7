"""Yogi (Zaheer, Reddi, Sachan, Kale & Kumar, NeurIPS 2018) as a ``torch.optim.Optimizer``.

Pyro has no Yogi; VAR-GP (Kapoor et al. 2021, Sect. 5) trains with it. Yogi is Adam with an
*additive* second-moment update (Zaheer et al. 2018, Algorithm 2):

    m_t = b1 m_{t-1} + (1 - b1) g_t
    v_t = v_{t-1} - (1 - b2) sign(v_{t-1} - g_t^2) g_t^2
    x_t = x_{t-1} - lr * m_hat_t / (sqrt(v_hat_t) + eps)

with the bias corrections ``m_hat = m / (1 - b1^t)``, ``v_hat = v / (1 - b2^t)`` and both
accumulators started at ``initial_accumulator`` — exactly ``optax.yogi`` (and the
``torch_optimizer.Yogi`` the reference code used), whose defaults are taken here
(``b1 = 0.9, b2 = 0.999, eps = 1e-3, initial_accumulator = 1e-6``). The test suite runs the
same problem through ``optax.yogi`` and compares the iterates.
"""

from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["Yogi"]


class Yogi(torch.optim.Optimizer):
    """Yogi optimizer (see the module docstring for the update).

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        betas: ``(b1, b2)``.
        eps: added to ``sqrt(v_hat)``.
        initial_accumulator: initial value of both moment accumulators (must be > 0).
    """

    def __init__(self, params: Iterable, lr: float = 1e-2, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-3, initial_accumulator: float = 1e-6):
        if not lr > 0:
            raise ValueError(f"lr: expected > 0, received {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas: expected each in [0, 1), received {betas}")
        if not eps >= 0:
            raise ValueError(f"eps: expected >= 0, received {eps}")
        if not initial_accumulator > 0:
            raise ValueError(f"initial_accumulator: expected > 0, received {initial_accumulator}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      initial_accumulator=initial_accumulator))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.full_like(p, group["initial_accumulator"])
                    state["exp_avg_sq"] = torch.full_like(p, group["initial_accumulator"])
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                g2 = g * g
                m.mul_(b1).add_(g, alpha=1.0 - b1)
                v.addcmul_(torch.sign(v - g2), g2, value=-(1.0 - b2))
                t = state["step"]
                m_hat = m / (1.0 - b1 ** t)
                v_hat = v / (1.0 - b2 ** t)
                p.addcdiv_(m_hat, v_hat.sqrt().add_(group["eps"]), value=-group["lr"])
        return loss
