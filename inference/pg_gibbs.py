"""Block Gibbs sampling of Polya-Gamma-augmented binary GP nodes, many chains at once.

The sampler of GP-Tree (Achituve et al. 2021, Sect. 2.3 / 3.2, eq. 4) for any node of
:mod:`models.gp_tree`: with ``K = L L^T`` fixed (the kernel is not sampled),

    omega | f ~ PG(1, f),     f | omega ~ N(Sigma kappa, Sigma),  Sigma = (K^-1 + Omega)^-1.

The Gaussian draw is :func:`models.gp_tree.sample_f_given_omega` (Matheron's rule with one
Cholesky of ``I + S K S`` per chain, ``S = diag(sqrt(omega))``).

Engine contract of :mod:`inference.base` (kind ``"host"``; ``init(rng, problem) -> State``,
``step(rng, state, problem) -> (State, Info)``, NamedTuples of tensors, randomness explicit):
``init`` takes an ``int`` seed or a torch generator state as ``rng``; the generator state
(uint8 tensor) then lives in :class:`GibbsState`, so ``step(None, ...)`` continues the chain
from it and the same state gives the same chain, while ``step(rng, ...)`` with a seed or a
generator state draws from that instead. The state is ``(f, omega)`` for ``C`` parallel chains of ``G`` nodes:

* ``G`` nodes of one tree level are sampled in one batched call: :func:`pad_problems` stacks
  their covariances into ``(G, n_max, n_max)`` with an identity block on the padding and
  ``kappa = 0`` there. A padded point is then a priori independent of the real ones, so it
  cannot change their conditionals (``Sigma`` stays block diagonal) and the real block of each
  node is sampled exactly as alone.
* ``init`` draws ``f`` from the prior ``N(0, K)`` and ``omega | f`` (the reference
  initialization, GP_Tree/gp_model_gibbs.py ``initial_gibbs_state``); ``step`` draws
  ``f | omega`` and then ``omega | f``, as the reference's ``next_gibbs_state``.

Every PG draw happens on the device of the state through :func:`inference.polya_gamma.
random_polyagamma`; ``pg_sampler="polyagamma"`` selects the reference scheme instead (draws by
the ``polyagamma`` package on a host copy of ``f`` at every step, as the reference code does
with pypolyagamma) for speed comparisons.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor

from inference.base import run_sweeps, torch_generator, torch_rng_state
from inference.polya_gamma import random_polyagamma, random_polyagamma_reference
from models.gp_tree import sample_f_given_omega

__all__ = ["GibbsProblem", "GibbsState", "GibbsInfo", "PGGibbs", "Workspace", "pad_problems",
           "unpad"]


class GibbsProblem(NamedTuple):
    """The fixed inputs of ``G`` nodes' conditionals.

    Attributes:
        K: prior covariance per node, ``(G, n, n)`` (identity on padding).
        L: ``chol(K)`` per node, ``(G, n, n)`` (identity on padding).
        kappa: ``y - 1/2`` per node, ``(G, n)`` (0 on padding).
        mask: ``(G, n)`` bool, True for real points.
    """

    K: Tensor
    L: Tensor
    kappa: Tensor
    mask: Tensor


class GibbsState(NamedTuple):
    """Chains of the augmented posterior: ``f, omega (G, C, n)``, the generator state
    (``torch.Generator.get_state()``) and the number of sweeps done (0-d int64)."""

    f: Tensor
    omega: Tensor
    rng_state: Tensor
    step: Tensor


class GibbsInfo(NamedTuple):
    """Per sweep: ``log p(y | omega_prev, X)`` of eq. 10 for every node and chain ``(G, C)``
    (at the omega the f-draw conditioned on; a free by-product of the draw); padding adds a
    constant ``-n_pad log 2`` only, so :func:`unpad` users compare within a node."""

    log_marginal: Tensor


def pad_problems(Ks: Sequence[Tensor], kappas: Sequence[Tensor],
                 Ls: Sequence[Tensor] | None = None) -> GibbsProblem:
    """Stack nodes of different sizes into one :class:`GibbsProblem` (identity / 0 padding);
    ``Ls`` (the Cholesky factors of ``Ks``) are computed when not given."""
    from models.linalg_torch import jitter_cholesky

    if Ls is None:
        Ls = [jitter_cholesky(K, name="K") for K in Ks]
    n_max = max(int(K.shape[-1]) for K in Ks)
    like = Ks[0]
    G = len(Ks)
    K_all = torch.eye(n_max, dtype=like.dtype, device=like.device).repeat(G, 1, 1)
    L_all = K_all.clone()
    kappa_all = torch.zeros(G, n_max, dtype=like.dtype, device=like.device)
    mask = torch.zeros(G, n_max, dtype=torch.bool, device=like.device)
    for g, (K, L, kappa) in enumerate(zip(Ks, Ls, kappas)):
        n = K.shape[-1]
        K_all[g, :n, :n] = K
        L_all[g, :n, :n] = L
        kappa_all[g, :n] = kappa
        mask[g, :n] = True
    return GibbsProblem(K_all, L_all, kappa_all, mask)


def unpad(x: Tensor, problem: GibbsProblem, g: int) -> Tensor:
    """Node ``g``'s real points of ``x (G, C, n)`` -> ``(C, n_g)``."""
    n = int(problem.mask[g].sum())
    return x[g, :, :n]


class Workspace:
    """A sampler's buffer for the ``(..., n, n)`` Cholesky factor of every sweep
    (:func:`models.gp_tree.precision_factor`'s ``out``), kept while the shape, dtype and device
    stay the same: a fresh array of that size each sweep costs its page faults (measured on a
    loaded 2-core machine, a 200-point node with 30 chains: sweeps 1.5x faster in CPU time and
    2x in wall-clock time with the buffer kept). It holds no state of the chain (results do not
    depend on it)."""

    def __init__(self) -> None:
        self._buffer: Tensor | None = None

    def get(self, shape: Sequence[int], like: Tensor) -> Tensor | None:
        """The buffer for ``shape`` with the dtype and device of ``like`` (None when ``like``
        records gradients: in-place factorization is not differentiable)."""
        if torch.is_grad_enabled() and like.requires_grad:
            return None
        w, shape = self._buffer, torch.Size(shape)
        if w is None or w.shape != shape or w.dtype != like.dtype or w.device != like.device:
            self._buffer = None                                   # release before allocating
            w = self._buffer = torch.empty(shape, dtype=like.dtype, device=like.device)
        return w


class PGGibbs:
    """Block Gibbs engine for Polya-Gamma augmented binary GP nodes.

    Args:
        num_chains: parallel chains ``C`` (ref: 30 in FSCIL, 20 / 10 in Table 1).
        pg_sampler: ``"torch"`` (on-device exact sampler) or ``"polyagamma"`` (host reference).
    """

    kind = "host"

    def __init__(self, num_chains: int = 30, pg_sampler: Literal["torch", "polyagamma"] = "torch"):
        if not isinstance(num_chains, int) or num_chains < 1:
            raise ValueError(f"num_chains: expected an int >= 1, received {num_chains!r}")
        if pg_sampler not in ("torch", "polyagamma"):
            raise ValueError(f"pg_sampler: expected 'torch' or 'polyagamma', received {pg_sampler!r}")
        self.num_chains = num_chains
        self.pg_sampler = pg_sampler
        self._workspace = Workspace()

    def _omega(self, f: Tensor, g: torch.Generator) -> Tensor:
        if self.pg_sampler == "torch":
            return random_polyagamma(1, f, g, validate=False)
        # reference scheme: host copy, numpy draw seeded from the torch generator, copy back
        seed = int(torch.randint(0, 2**62, (1,), generator=g, device=f.device).item())
        return random_polyagamma_reference(1, f, seed=np.random.default_rng(seed))

    # -- contract ------------------------------------------------------------------------------
    def init(self, rng: int | Tensor, problem: GibbsProblem) -> GibbsState:
        """Chains started at ``f ~ N(0, K)``, ``omega ~ PG(1, f)``; ``rng``: an int seed (a
        generator on the device of ``problem`` seeded with it) or a generator state."""
        device = problem.L.device
        g = torch_generator(torch_rng_state(rng, device), device)
        G, n = problem.kappa.shape
        eps = torch.randn(G, self.num_chains, n, dtype=problem.L.dtype, device=device, generator=g)
        f = (problem.L.unsqueeze(1) @ eps.unsqueeze(-1)).squeeze(-1)
        omega = self._omega(f, g)
        return GibbsState(f, omega, g.get_state(), torch.zeros((), dtype=torch.int64))

    def step(self, rng, state: GibbsState, problem: GibbsProblem) -> tuple[GibbsState, GibbsInfo]:
        """One sweep: ``f | omega`` (eq. 4, Gaussian), then ``omega | f`` (PG). ``rng``: None
        (the state's generator) or a seed / generator state that replaces it."""
        device = problem.L.device
        g = torch_generator(state.rng_state if rng is None else torch_rng_state(rng, device),
                            device)
        eps0 = torch.randn(state.f.shape, dtype=state.f.dtype, device=state.f.device, generator=g)
        eps1 = torch.randn(state.f.shape, dtype=state.f.dtype, device=state.f.device, generator=g)
        G, C, n = state.f.shape
        f, log_marg = sample_f_given_omega(problem.K.unsqueeze(1), problem.L.unsqueeze(1),
                                           state.omega, problem.kappa.unsqueeze(1), eps0, eps1,
                                           self._workspace.get((G, C, n, n), problem.K))
        omega = self._omega(f, g)
        return (GibbsState(f, omega, g.get_state(), state.step + 1), GibbsInfo(log_marg))

    def run(self, problem: GibbsProblem, num_steps: int, seed: int | Tensor = 0,
            state: GibbsState | None = None, keep: bool = False
            ) -> tuple[GibbsState, GibbsInfo, dict[str, Tensor] | None]:
        """``init(seed, problem)`` (unless ``state`` is given) then ``num_steps`` sweeps; with
        ``keep`` the draws of every sweep, ``{"f", "omega"}: (num_steps, G, C, n)``, and the
        sweeps' augmented log marginals, ``"log_marginal": (num_steps, G, C)``, are returned
        too. ``seed``: an int or a generator state (:meth:`init`'s ``rng``)."""
        empty = GibbsInfo(torch.zeros(problem.kappa.shape[0], self.num_chains,
                                      dtype=problem.L.dtype, device=problem.L.device))
        return run_sweeps(self, problem, num_steps, seed, state, keep, ("f", "omega"), empty)
