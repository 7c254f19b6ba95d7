"""Polya-Gamma Gibbs samplers of the multi-class baselines of GP-Tree's Table 1, on the same
machinery as :mod:`inference.pg_gibbs` (on-device PG draws, Cholesky factors, Matheron draws).

Logistic-softmax (LSM; Galy-Fajou et al. 2020, "Multi-class Gaussian process classification
made conjugate", Sect. 3): ``p(y = c | f) = sigma(f_c) / sum_k sigma(f_k)``, one GP per class
``f_k ~ N(0, K)``. With ``1 / sum_k sigma(f_k) = int exp(-lambda sum_k sigma(f_k)) d lambda``,
``exp(lambda sigma(-f_k)) = sum_n (lambda sigma(-f_k))^n / n!`` and the PG identity, the
augmented model is conditionally conjugate:

    lambda_i | f        ~ Gamma(1, sum_k sigma(f_ik))     (n marginalized: a block draw)
    n_ik | lambda_i, f  ~ Poisson(lambda_i sigma(-f_ik))
    omega_ik | n, f     ~ PG(y_ik + n_ik, f_ik)
    f_k | omega, n      ~ N(Sigma_k kappa_k, Sigma_k),  Sigma_k = (K^-1 + diag omega_k)^-1,
                          kappa_ik = (y_ik - n_ik) / 2.

One-vs-each (OVE; Snell & Zemel 2021, eqs. 5-8): ``p(y = c | f) = prod_{c' != c}
sigma(f_c - f_c')``; each point carries ``K - 1`` pair variables ``psi_ic' = f_{y_i} - f_c'``
with ``omega_ic' | f ~ PG(1, psi_ic')`` and the pseudo-observations ``z = Omega^-1 kappa``
(``kappa = 1/2``) of ``psi = A f`` with noise ``Omega^-1``. The joint conditional of the
``K n`` latent values is drawn by Matheron's rule with one Cholesky factor of
``I + S A K_blk A^T S`` (``S = Omega^{1/2}``, dimension ``K n`` with the ``n`` dummy pairs
``(i, y_i)`` decoupled): ``(A K_blk A^T)_{(i a),(j b)} = K_ij ([y_i = y_j] - [y_i = b] -
[a = y_j] + [a = b])``. Its cost grows as ``(K n)^3``, why the paper ran OVE up to 10 classes.

Both engines follow the contract of :mod:`inference.base` (kind ``"host"``): ``init(rng,
problem) -> State`` with ``rng`` an int seed or a torch generator state, and ``step(rng, state,
problem) -> (State, Info)`` with the generator state carried in ``State`` (``rng=None``
continues from it; a seed or generator state replaces it), as :class:`inference.pg_gibbs.PGGibbs`.
``run(problem, num_steps, seed, state, keep)`` is the loop of ``num_steps`` sweeps, as
:meth:`inference.pg_gibbs.PGGibbs.run`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from inference.base import run_sweeps, torch_generator, torch_rng_state
from inference.pg_gibbs import Workspace
from inference.polya_gamma import random_pg_counts, random_polyagamma
from models.linalg_torch import jitter_cholesky

__all__ = ["MulticlassProblem", "LSMState", "OVEState", "MulticlassInfo", "LSMGibbs", "OVEGibbs"]


class MulticlassProblem(NamedTuple):
    """``K (n, n)`` shared prior covariance of every class GP, ``L = chol(K)``, one-hot labels
    ``Y (n, C)`` (dtype of K)."""

    K: Tensor
    L: Tensor
    Y: Tensor


class LSMState(NamedTuple):
    """``f (chains, C, n)``, ``omega (chains, C, n)``, ``counts (chains, C, n)`` (Poisson
    ``n_ik``), ``lam (chains, n)``, generator state, step (0-d)."""

    f: Tensor
    omega: Tensor
    counts: Tensor
    lam: Tensor
    rng_state: Tensor
    step: Tensor


class OVEState(NamedTuple):
    """``f (chains, C, n)``, ``omega (chains, n, C)`` (0 at the dummy pair ``(i, y_i)``),
    generator state, step (0-d)."""

    f: Tensor
    omega: Tensor
    rng_state: Tensor
    step: Tensor


class MulticlassInfo(NamedTuple):
    """Mean training log-likelihood ``mean_i log p(y_i | f)`` per chain after the sweep."""

    log_likelihood: Tensor


def _gen(rng, device) -> torch.Generator:
    """A private generator on ``device`` from ``rng`` (an int seed or a generator state)."""
    return torch_generator(torch_rng_state(rng, device), device)


def _prior_draw(L: Tensor, shape, g) -> Tensor:
    eps = torch.randn(*shape, L.shape[-1], dtype=L.dtype, device=L.device, generator=g)
    return eps @ L.transpose(-1, -2)


def lsm_log_likelihood(f: Tensor, Y: Tensor) -> Tensor:
    """``mean_i log sigma(f_{i y_i}) - log sum_k sigma(f_ik)``: ``f (..., C, n)`` -> ``(...)``."""
    ls = torch.nn.functional.logsigmoid(f)
    return ((ls * Y.T).sum(-2) - torch.logsumexp(ls, dim=-2)).mean(-1)


def ove_log_likelihood(f: Tensor, Y: Tensor) -> Tensor:
    """``mean_i sum_{c != y_i} log sigma(f_{y_i} - f_c)``."""
    fy = (f * Y.T).sum(-2, keepdim=True)
    terms = torch.nn.functional.logsigmoid(fy - f) * (1.0 - Y.T)
    return terms.sum(-2).mean(-1)


class _Runs:
    """``run`` of the multiclass Gibbs engines (:class:`LSMGibbs`, :class:`OVEGibbs`)."""

    def run(self, problem: MulticlassProblem, num_steps: int, seed: int | Tensor = 0,
            state: LSMState | OVEState | None = None, keep: bool = False
            ) -> tuple[LSMState | OVEState, MulticlassInfo, dict[str, Tensor] | None]:
        """``init(seed, problem)`` (unless ``state`` is given) then ``num_steps`` sweeps, as
        :meth:`inference.pg_gibbs.PGGibbs.run`: the same draws as the loop ``state, info =
        step(None, state, problem)``. With ``keep`` the draws of every sweep are returned too,
        ``"f": (num_steps, chains, C, n)`` and ``"log_likelihood": (num_steps, chains)`` (None
        when ``keep`` is False or ``num_steps`` is 0); ``info`` is the last sweep's (zeros
        when ``num_steps`` is 0). ``seed``: an int or a generator state (:meth:`init`'s
        ``rng``)."""
        empty = MulticlassInfo(torch.zeros(self.num_chains, dtype=problem.K.dtype,
                                           device=problem.K.device))
        return run_sweeps(self, problem, num_steps, seed, state, keep, ("f",), empty)


class LSMGibbs(_Runs):
    """Block Gibbs for the logistic-softmax GP classifier (``num_chains`` parallel chains)."""

    kind = "host"

    def __init__(self, num_chains: int):
        if not isinstance(num_chains, int) or num_chains < 1:
            raise ValueError(f"num_chains: expected an int >= 1, received {num_chains!r}")
        self.num_chains = num_chains
        self._workspace = Workspace()

    def _augment(self, f: Tensor, Y: Tensor, g) -> tuple[Tensor, Tensor, Tensor]:
        """``(lambda, n, omega) | f`` as one block."""
        sig = torch.sigmoid(f)                                            # (ch, C, n)
        u = torch.rand(f.shape[0], f.shape[-1], dtype=f.dtype, device=f.device, generator=g)
        lam = -torch.log(u.clamp_min(torch.finfo(f.dtype).tiny)) / sig.sum(-2)   # Exp(sum sigma)
        counts = torch.poisson(lam.unsqueeze(-2) * (1.0 - sig), generator=g)
        b = (Y.T.unsqueeze(0) + counts).round().to(torch.int64)
        omega = random_pg_counts(b, f, g)
        return lam, counts, omega

    def init(self, rng: int | Tensor, problem: MulticlassProblem) -> LSMState:
        """Chains started at the prior ``f ~ N(0, K)`` and ``(lambda, n, omega) | f``."""
        g = _gen(rng, problem.K.device)
        C = problem.Y.shape[1]
        f = _prior_draw(problem.L, (self.num_chains, C), g)
        lam, counts, omega = self._augment(f, problem.Y, g)
        return LSMState(f, omega, counts, lam, g.get_state(), torch.zeros((), dtype=torch.int64))

    def step(self, rng, state: LSMState, problem: MulticlassProblem) -> tuple[LSMState, MulticlassInfo]:
        """One sweep; ``rng``: None (the state's generator) or a seed / generator state."""
        from models.gp_tree import sample_f_given_omega

        g = _gen(state.rng_state if rng is None else rng, problem.K.device)
        kappa = 0.5 * (problem.Y.T.unsqueeze(0) - state.counts)
        eps0 = torch.randn(state.f.shape, dtype=state.f.dtype, device=state.f.device, generator=g)
        eps1 = torch.randn(state.f.shape, dtype=state.f.dtype, device=state.f.device, generator=g)
        # omega_ik = 0 (b = 0 draws) leave point i out of class k's Gaussian; the sampler
        # needs omega > 0, so those get a tiny value with kappa = 0: an uninformative pseudo
        # observation of variance 1/tiny
        omega = state.omega.clamp_min(1e-12)
        f, _ = sample_f_given_omega(problem.K, problem.L, omega, kappa, eps0, eps1,
                                    self._workspace.get(omega.shape + omega.shape[-1:], problem.K))
        lam, counts, omega = self._augment(f, problem.Y, g)
        return (LSMState(f, omega, counts, lam, g.get_state(), state.step + 1),
                MulticlassInfo(lsm_log_likelihood(f, problem.Y)))


class OVEGibbs(_Runs):
    """Block Gibbs for the one-vs-each GP classifier (joint draw of all class functions)."""

    kind = "host"

    def __init__(self, num_chains: int, max_joint_dim: int = 6000):
        if not isinstance(num_chains, int) or num_chains < 1:
            raise ValueError(f"num_chains: expected an int >= 1, received {num_chains!r}")
        self.num_chains = num_chains
        self.max_joint_dim = max_joint_dim

    @staticmethod
    def _pairs(f: Tensor, Y: Tensor) -> Tensor:
        """``psi_ic = f_{y_i}(x_i) - f_c(x_i)`` as ``(chains, n, C)`` (0 at c = y_i)."""
        fy = (f * Y.T).sum(-2, keepdim=True)                              # (ch, 1, n)
        return (fy - f).transpose(-1, -2)

    def _omega(self, f: Tensor, Y: Tensor, g) -> Tensor:
        psi = self._pairs(f, Y)
        return random_polyagamma(1, psi, g, validate=False) * (1.0 - Y)

    def init(self, rng: int | Tensor, problem: MulticlassProblem) -> OVEState:
        """Chains started at the prior ``f ~ N(0, K)`` and ``omega | f``."""
        n, C = problem.Y.shape
        if n * C > self.max_joint_dim:
            raise ValueError(f"OVE joint dimension C n = {C} x {n} = {C * n} exceeds "
                             f"max_joint_dim = {self.max_joint_dim} (memory (C n)^2 per chain)")
        g = _gen(rng, problem.K.device)
        f = _prior_draw(problem.L, (self.num_chains, C), g)
        return OVEState(f, self._omega(f, problem.Y, g), g.get_state(),
                        torch.zeros((), dtype=torch.int64))

    def step(self, rng, state: OVEState, problem: MulticlassProblem) -> tuple[OVEState, MulticlassInfo]:
        """One sweep; ``rng``: None (the state's generator) or a seed / generator state."""
        g = _gen(state.rng_state if rng is None else rng, problem.K.device)
        K, L, Y = problem.K, problem.L, problem.Y
        n, C = Y.shape
        ch = state.f.shape[0]
        s = torch.sqrt(state.omega)                                       # (ch, n, C), 0 on dummies
        yi = Y.argmax(1)
        # G[(i a),(j b)] = [y_i = y_j] - [y_i = b] - [a = y_j] + [a = b]
        same = (yi[:, None] == yi[None, :]).to(K.dtype)                   # (n, n)
        eyeC = torch.eye(C, dtype=K.dtype, device=K.device)
        G = same[:, None, :, None] - Y[:, None, None, :] - Y.T[None, :, :, None] \
            + eyeC[None, :, None, :]                                      # (n, C, n, C)
        AKA = K[:, None, :, None] * G
        B = s.reshape(ch, n * C, 1) * AKA.reshape(n * C, n * C) * s.reshape(ch, 1, n * C)
        B = B + torch.eye(n * C, dtype=K.dtype, device=K.device)
        M = jitter_cholesky(B, name="OVE I + S A K A^T S")
        f0 = _prior_draw(L, (ch, C), g)                                   # (ch, C, n)
        eps = torch.randn(ch, n, C, dtype=K.dtype, device=K.device, generator=g)
        # S z - S A f0 - eps, with S z = kappa / sqrt(omega), kappa = 1/2 (dummies: 0)
        safe = torch.where(s > 0, s, torch.ones_like(s))
        r = torch.where(s > 0, 0.5 / safe, torch.zeros_like(s)) - s * self._pairs(f0, Y) \
            - eps * (s > 0)
        w = torch.cholesky_solve(r.reshape(ch, n * C, 1), M).reshape(ch, n, C) * s
        # A^T w: class c at point i gets [c = y_i] sum_c' w_ic' - w_ic
        Atw = Y * w.sum(-1, keepdim=True) - w                             # (ch, n, C)
        f = f0 + Atw.transpose(-1, -2) @ K                                # K symmetric
        omega = self._omega(f, Y, g)
        return (OVEState(f, omega, g.get_state(), state.step + 1),
                MulticlassInfo(ove_log_likelihood(f, Y)))
