"""Yogi (Zaheer, Reddi, Sachan, Kale & Kumar, NeurIPS 2018) as pure functions on torch tensors.

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

The moments are a :class:`YogiState` of tensors (the engine contract of :mod:`inference.base`:
optimizer state as arrays), updated out of place by :func:`yogi_update`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["YogiConfig", "YogiState", "yogi_init", "yogi_update"]


class YogiConfig(NamedTuple):
    """Hyperparameters of Yogi (defaults of ``optax.yogi``)."""

    learning_rate: float = 1e-2
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-3
    initial_accumulator: float = 1e-6

    def check(self) -> "YogiConfig":
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate: expected > 0, received {self.learning_rate}")
        if not (0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0):
            raise ValueError(f"betas: expected each in [0, 1), received {(self.b1, self.b2)}")
        if not self.eps >= 0:
            raise ValueError(f"eps: expected >= 0, received {self.eps}")
        if not self.initial_accumulator > 0:
            raise ValueError(f"initial_accumulator: expected > 0, received "
                             f"{self.initial_accumulator}")
        return self


class YogiState(NamedTuple):
    """First and second moments per parameter (same keys and shapes) and the step count."""

    count: int
    mu: dict[str, Tensor]
    nu: dict[str, Tensor]


def yogi_init(params: dict[str, Tensor], config: YogiConfig = YogiConfig()) -> YogiState:
    """Both accumulators at ``initial_accumulator``, count 0."""
    a = config.check().initial_accumulator
    return YogiState(0, {n: torch.full_like(p, a) for n, p in params.items()},
                     {n: torch.full_like(p, a) for n, p in params.items()})


@torch.no_grad()
def yogi_update(params: dict[str, Tensor], grads: dict[str, Tensor], state: YogiState,
                config: YogiConfig = YogiConfig()) -> tuple[dict[str, Tensor], YogiState]:
    """One Yogi step (module docstring). Parameters without a gradient (``None``) keep their
    value and moments. Returns new tensors; the inputs are not modified."""
    b1, b2, lr, eps = config.b1, config.b2, config.learning_rate, config.eps
    t = state.count + 1
    new_params, mu, nu = {}, {}, {}
    for name, p in params.items():
        g = grads.get(name)
        if g is None:
            new_params[name], mu[name], nu[name] = p, state.mu[name], state.nu[name]
            continue
        g2 = g * g
        m = torch.add(state.mu[name] * b1, g, alpha=1.0 - b1)
        v = torch.addcmul(state.nu[name], torch.sign(state.nu[name] - g2), g2, value=-(1.0 - b2))
        m_hat = m / (1.0 - b1 ** t)
        v_hat = v / (1.0 - b2 ** t)
        new_params[name] = torch.addcdiv(p, m_hat, v_hat.sqrt().add_(eps), value=-lr)
        mu[name], nu[name] = m, v
    return new_params, YogiState(t, mu, nu)
