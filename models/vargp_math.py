r"""Gaussian algebra of VAR-GP (Kapoor, Karaletsos & Bui, ICML 2021): kernels on
log-hyperparameters, the auto-regressive joint q(u_<=t | theta) of App. C.3 (eq. 22), its
whitened form, and the marginal q(f | theta) used by the likelihood term of eqs. (5) and (8).

The Pyro program (model and guide) that uses these functions is :mod:`models.vargp`.

Notation (paper symbols, used as variable names below)
--------------------------------------------------------
``K`` classes (one GP per class), ``D`` input features, ``t`` the current task; task ``j``
owns ``M_j`` inducing inputs ``Z_j`` and outputs ``u_j``; ``M = sum_j M_j``.

* theta = [log gamma, log l_1, ..., log l_D]: the log-hyperparameters of the exponentiated
  quadratic kernel ``k(x, x') = gamma exp(-1/2 sum_d (x_d - x'_d)^2 / l_d^2)`` (App. C.1,
  eq. 20 — the extracted eq. 20 lost the minus sign and the ARD index; Sect. 4.3 says "log-ARD
  lengthscales and a log-scale factor"; ``gamma`` multiplies the kernel, it is a variance).
  With one lengthscale (eq. 20 as printed) theta = [log gamma, log l] has 2 entries where the
  layouts below say ``D + 1``; every function here takes either.
* Guide factors (Sect. 4.3): q(u_1) = N(m_1, S_1) and, for j > 1,
  q(u_j | u_<j, theta) = N(A_j u_<j + m_j, S_j),  A_j = K_{j,<j} K_{<j,<j}^{-1},  S_j = L_j L_j^T.
* Prior conditionals (Sect. 4.3.1): p(u_j | u_<j, theta) = N(A_j u_<j, C_j),
  C_j = K_{jj} - K_{j,<j} K_{<j,<j}^{-1} K_{<j,j}.

Layout of batched tensors
-------------------------
``theta: (S, 1, H, D + 1)`` — ``S`` hyperparameter draws, a singleton axis (the slot of the
f-sample plate of the Pyro program) and ``H`` = 1 (hyperparameters shared by the K GPs) or ``K``
(one set per class). Inducing inputs ``Z_j: (Kz, M_j, D)`` with ``Kz`` = K (one set per class,
as the reference code) or 1 (shared by the classes). Gram matrices and their Cholesky factors
are ``(S, 1, Kk, M, M)`` with ``Kk = max(H, Kz)`` (1 or K); variational means ``m_j: (K, M_j)``
and factors ``L_j: (K, M_j, M_j)``. Everything broadcasts over the leading axes.

One Cholesky gives every block
------------------------------
Let ``L = chol(K_{<=t,<=t})`` (with ``jitter * I`` added to the diagonal) be partitioned
by tasks. For the leading block ``<j`` and the block row ``j``:

    K_{<j,<j} = L_{<j} L_{<j}^T,   K_{j,<j} = L_{j,<j} L_{<j}^T
    =>  A_j = K_{j,<j} K_{<j,<j}^{-1} = L_{j,<j} L_{<j}^{-1},
        C_j = K_{jj} - A_j K_{<j,j} = L_{jj} L_{jj}^T.                                   (i)

So ``A_j u`` is one triangular solve, and ``L_jj`` (the j-th diagonal block of ``L``) is the
Cholesky factor of the prior conditional covariance C_j. No inverse is ever formed.

Eq. 22 in square-root form, and its whitened form
--------------------------------------------------
Eq. 22 states q(u_<=t | theta) = N(mu_<=t, Sigma_<=t) with
``mu_<=t = [mu_<t; A_t mu_<t + m_t]`` and
``Sigma_<=t = [[Sigma_<t, Sigma_<t A_t^T], [A_t Sigma_<t, S_t + A_t Sigma_<t A_t^T]]``.
Writing ``Sigma_<t = B_<t B_<t^T`` gives ``Sigma_<=t = B_<=t B_<=t^T`` with the lower-triangular

    B_<=t = [[B_<t, 0], [A_t B_<t, L_t]]                                                 (ii)

(:func:`autoregressive_joint` returns ``mu`` and ``Sigma`` literally by eq. 22). In whitened
coordinates ``v = L^{-1} u`` (the prior becomes N(0, I)) the joint is *block diagonal*: with
``L^{-1} = [[L_<t^{-1}, 0], [-L_tt^{-1} L_{t,<t} L_<t^{-1}, L_tt^{-1}]]`` and (i),

    L^{-1} mu_<=t = [L_<t^{-1} mu_<t;  L_tt^{-1} m_t],
    L^{-1} B_<=t  = blockdiag(L_<t^{-1} B_<t,  L_tt^{-1} L_t),                            (iii)

and by induction ``q(v_j) = N(L_jj^{-1} m_j, (L_jj^{-1} L_j)(L_jj^{-1} L_j)^T)`` independently
over tasks — the orthogonal-inducing-point structure of Sect. 4.3.2. The per-task KL of eq. (8)
is then ``KL[N(m_t, S_t) || N(0, C_t)]``, independent of ``u_<t``.

The block-diagonal ablation (Sect. 5.3) drops ``A_j`` from the guide: q(u_<=t) =
N(m, blockdiag(S_j)), whose whitened factor ``L^{-1} blockdiag(L_j)`` is a full triangle.

Marginal of f (the likelihood term)
-----------------------------------
With ``W = L^{-1} K_{Z,x}`` and the whitened mean ``v_bar`` and factor ``R`` of q(v),

    q(f(x) | theta) = N(W^T v_bar,  k(x, x) - ||W||^2 + ||R^T W||^2)   (column norms)     (iv)

which is q(f) = int p(f | u, theta) q(u | theta) du of eq. (7) in closed form (App. C.3: "we
can avoid variance introduced by the ancestral sampling").
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple, Sequence

import torch
from torch import Tensor

from models.kernels_torch import SquaredExponential, cat_rows
from models.linalg_torch import jitter_cholesky, symmetrize

__all__ = ["InducingSet", "HyperPosterior", "PointHyperparameters", "Hyperparameters",
           "sample_f", "mc_softmax", "kernel_from_theta", "kernel_theta", "cross_covariance",
           "concat_inducing_inputs",
           "task_slices", "prior_cholesky", "conditional_prior_mean", "autoregressive_joint",
           "whitened_posterior", "f_marginals", "gaussian_kl", "autoregressive_kl",
           "block_diagonal_expected_kl", "previous_posterior_term"]


class InducingSet(NamedTuple):
    """The inducing variables of one task and its guide factor (Sect. 4.3):

    ``q(u_j | u_<j, theta) = N(u_j; A_j u_<j + m_j, L_j L_j^T)`` (auto-regressive guide) or
    ``q(u_j) = N(u_j; m_j, L_j L_j^T)`` (block-diagonal and global guides).

    Attributes:
        inducing_inputs: ``Z_j``, shape ``(Kz, M_j, D)``; ``Kz`` is ``K`` or 1 (shared).
        mean: ``m_j``, shape ``(K, M_j)``.
        scale_tril: ``L_j``, shape ``(K, M_j, M_j)``, lower triangular, positive diagonal.
    """

    inducing_inputs: Tensor
    mean: Tensor
    scale_tril: Tensor

    @property
    def num_inducing(self) -> int:
        return int(self.mean.shape[-1])

    def detach(self) -> "InducingSet":
        return InducingSet(*(t.detach().clone() for t in self))

    def to(self, device=None, dtype=None) -> "InducingSet":
        return InducingSet(*(t.to(device=device, dtype=dtype) for t in self))


class HyperPosterior(NamedTuple):
    """Mean-field Gaussian over the log-hyperparameters (Sect. 4.3):
    ``q(theta) = N(theta; loc, diag(scale^2))`` with ``theta = [log gamma, log l_1..l_D]``.

    Attributes:
        loc: shape ``(H, D + 1)``.
        scale: shape ``(H, D + 1)``, positive.
    """

    loc: Tensor
    scale: Tensor

    @property
    def mean(self) -> Tensor:
        """``E[theta] = loc``, ``(H, D + 1)``."""
        return self.loc

    def draws(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        """``num_samples`` reparameterized draws ``loc + scale * eps``, ``(S, 1, H, D + 1)``
        (the layout of the module docstring); ``eps`` from ``generator`` (CPU) when given."""
        eps = torch.randn((num_samples, 1, *self.loc.shape), generator=generator,
                          dtype=self.loc.dtype).to(self.loc.device)
        return self.loc + self.scale * eps

    def detach(self) -> "HyperPosterior":
        return HyperPosterior(self.loc.detach().clone(), self.scale.detach().clone())

    def to(self, device=None, dtype=None) -> "HyperPosterior":
        return HyperPosterior(self.loc.to(device=device, dtype=dtype),
                              self.scale.to(device=device, dtype=dtype))


class PointHyperparameters(NamedTuple):
    """A point value of the log-hyperparameters (the "MLE Hypers" ablation of Table 1: theta
    a parameter of the model, no KL term).

    Attributes:
        theta: shape ``(H, D + 1)``.
    """

    theta: Tensor

    @property
    def mean(self) -> Tensor:
        return self.theta

    @property
    def scale(self) -> Tensor:
        """0: a point has no spread (for summaries beside :class:`HyperPosterior`)."""
        return torch.zeros_like(self.theta)

    def draws(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        """The point itself, ``(1, 1, H, D + 1)`` (every draw is the same)."""
        return self.theta.expand(1, 1, *self.theta.shape)

    def detach(self) -> "PointHyperparameters":
        return PointHyperparameters(self.theta.detach().clone())

    def to(self, device=None, dtype=None) -> "PointHyperparameters":
        return PointHyperparameters(self.theta.to(device=device, dtype=dtype))


#: the hyperparameters of a VAR-GP state: a distribution over theta or a point
Hyperparameters = HyperPosterior | PointHyperparameters


def sample_f(f_loc: Tensor, f_var: Tensor, num_samples: int,
             generator: torch.Generator | None = None) -> Tensor:
    """``num_samples`` draws of ``f ~ N(f_loc, f_var)`` per theta draw: inputs
    ``(S, 1, ...)``, output ``(S, num_samples, ...)`` (``eps`` from ``generator`` when given,
    else from torch's generator, as inside a Pyro program)."""
    shape = (f_loc.shape[0], num_samples, *f_loc.shape[2:])
    if generator is None:
        eps = torch.randn(shape, dtype=f_loc.dtype, device=f_loc.device)
    else:
        eps = torch.randn(shape, generator=generator, dtype=f_loc.dtype).to(f_loc.device)
    return f_loc + f_var.sqrt() * eps


def mc_softmax(f_loc: Tensor, f_var: Tensor, num_f_samples: int,
               generator: torch.Generator | None = None) -> Tensor:
    """``E_{q(f | theta)} softmax(f)`` by ``num_f_samples`` draws per theta draw (App. A.1):
    ``f_loc, f_var (S, 1, K, B)`` -> ``(S, K, B)`` (classes on axis -2)."""
    return torch.softmax(sample_f(f_loc, f_var, num_f_samples, generator), dim=-2).mean(1)


def kernel_from_theta(theta: Tensor) -> SquaredExponential:
    """ARD (or isotropic) exponentiated quadratic of App. C.1 (eq. 20) from log-hyperparameters.

    Args:
        theta: ``(..., D + 1)`` = ``[log gamma, log l_1, ..., log l_D]``, or ``(..., 2)`` =
            ``[log gamma, log l]`` for the isotropic kernel (eq. 20 as printed).

    Returns:
        ``SquaredExponential(variance=gamma (...), lengthscale=l (..., D) or (..., 1))``.
    """
    return SquaredExponential(theta[..., 0].exp(), theta[..., 1:].exp())


def concat_inducing_inputs(sets: Sequence[InducingSet]) -> Tensor:
    """``Z_<=t`` as one ``(Kz, M, D)`` tensor (task blocks in order)."""
    return cat_rows([s.inducing_inputs for s in sets])


def task_slices(sets: Sequence[InducingSet]) -> list[slice]:
    """Row ranges of each task's block inside ``u_<=t``."""
    out, start = [], 0
    for s in sets:
        out.append(slice(start, start + s.num_inducing))
        start += s.num_inducing
    return out


def kernel_theta(theta: Tensor, amplitude: str = "squared") -> Tensor:
    """The kernel's log-hyperparameters ``[log variance, log l_1..l_D]`` from the model's
    ``theta = [log gamma, log l_1..l_D]``: ``variance = gamma^2 = exp(2 theta_0)``
    (``amplitude="squared"``, uber-research/vargp ``var_gp/kernels.py``, ``RBFKernel.compute``)
    or ``variance = exp(theta_0)`` (``"linear"``: Sect. 4.3's "log-scale factor" as eq. 20 is
    printed). The lengthscales are the same either way."""
    if amplitude == "linear":
        return theta
    if amplitude != "squared":
        raise ValueError(f"amplitude: expected 'squared' or 'linear', received {amplitude!r}")
    return torch.cat([2.0 * theta[..., :1], theta[..., 1:]], dim=-1)


def prior_cholesky(theta: Tensor, inducing_inputs: Tensor, jitter: float) -> Tensor:
    """``L = chol(K_ZZ + jitter * I)``: the Cholesky factor of the GP prior p(u | theta), with
    an absolute jitter (uber-research/vargp ``var_gp/gp_utils.py``, ``cholesky``: 1e-4).

    Args:
        theta: ``(S, 1, H, D + 1)`` log-hyperparameters.
        inducing_inputs: ``Z``, shape ``(Kz, M, D)``.
        jitter: absolute diagonal jitter (part of the model: the same in every term).

    Returns:
        ``(S, 1, Kk, M, M)`` lower-triangular factors.
    """
    kern = kernel_from_theta(theta)
    K_ZZ = kern(inducing_inputs)
    if jitter:
        eye = torch.eye(K_ZZ.shape[-1], dtype=K_ZZ.dtype, device=K_ZZ.device)
        K_ZZ = K_ZZ + jitter * eye
    return jitter_cholesky(K_ZZ, name="K_ZZ (prior covariance of the inducing outputs)")


def conditional_prior_mean(prior_factor: Tensor, block: slice, past_outputs: Tensor) -> Tensor:
    """``A_j u_<j = L_{j,<j} L_<j^{-1} u_<j`` (identity (i) of the module docstring).

    Args:
        prior_factor: ``L``, the prior Cholesky factor of ``K_<=t``, ``(..., M, M)``.
        block: the rows of task ``j``; ``u_<j`` are the rows before ``block.start``.
        past_outputs: ``u_<j``, shape ``(..., K, block.start)``.

    Returns:
        ``(..., K, M_j)``.
    """
    L, u_past = prior_factor, past_outputs
    p = block.start
    if p == 0:
        return torch.zeros(*u_past.shape[:-1], block.stop - block.start, dtype=L.dtype,
                           device=L.device)
    alpha = torch.linalg.solve_triangular(L[..., :p, :p], u_past.unsqueeze(-1), upper=False)
    return (L[..., block, :p] @ alpha).squeeze(-1)


def autoregressive_joint(theta: Tensor, sets: Sequence[InducingSet], jitter: float
                         ) -> tuple[Tensor, Tensor]:
    """The closed-form joint q(u_<=t | theta) = N(mu, Sigma) of App. C.3, eq. 22.

    Recursion over tasks (j = 2..t)::

        mu_<=j    = [mu_<j; A_j mu_<j + m_j]
        Sigma_<=j = [[Sigma_<j,        Sigma_<j A_j^T              ],
                     [A_j Sigma_<j,    S_j + A_j Sigma_<j A_j^T    ]]

    with ``A_j = K_{j,<j} K_{<j,<j}^{-1}`` obtained from ``L`` by identity (i) (no inverse).

    Args:
        theta: ``(S, 1, H, D + 1)``.
        sets: the inducing sets of tasks ``1..t``.
        jitter: as in :func:`prior_cholesky`.

    Returns:
        ``mu (S, 1, K, M)`` and ``Sigma (S, 1, K, M, M)`` (symmetrized).
    """
    L = prior_cholesky(theta, concat_inducing_inputs(sets), jitter)
    blocks = task_slices(sets)
    first = sets[0]
    mu = first.mean.expand(*L.shape[:-3], *first.mean.shape)
    Sigma = (first.scale_tril @ first.scale_tril.transpose(-1, -2)).expand(
        *L.shape[:-3], *first.scale_tril.shape)
    for s, block in zip(sets[1:], blocks[1:]):
        p = block.start
        # A_j = L_{j,<j} L_<j^{-1}  (shape (..., M_j, M_<j)), via A_j^T = L_<j^{-T} L_{j,<j}^T
        A = torch.linalg.solve_triangular(L[..., :p, :p].transpose(-1, -2),
                                          L[..., block, :p].transpose(-1, -2),
                                          upper=True).transpose(-1, -2)
        mean_t = (A @ mu.unsqueeze(-1)).squeeze(-1) + s.mean
        cross = A @ Sigma                                       # A_t Sigma_<t
        S_t = s.scale_tril @ s.scale_tril.transpose(-1, -2)
        lower = S_t + cross @ A.transpose(-1, -2)
        Sigma = torch.cat([torch.cat([Sigma.expand(*cross.shape[:-2], p, p),
                                      cross.transpose(-1, -2)], dim=-1),
                           torch.cat([cross, lower], dim=-1)], dim=-2)
        mu = torch.cat([mu.expand(*mean_t.shape[:-1], p), mean_t], dim=-1)
        Sigma = symmetrize(Sigma)
    return mu, Sigma


def whitened_posterior(prior_factor: Tensor, sets: Sequence[InducingSet], structure: str
                       ) -> tuple[Tensor, list[tuple[slice, Tensor]]]:
    """q(v | theta) for ``v = L^{-1} u_<=t`` (identity (iii) of the module docstring).

    Args:
        prior_factor: ``L``, the prior Cholesky factor, ``(S, 1, Kk, M, M)``.
        sets: inducing sets of tasks ``1..t`` (one set for the global guide).
        structure: ``"autoregressive"`` — block-diagonal whitened factor
            ``blockdiag(L_jj^{-1} L_j)`` and mean ``L_jj^{-1} m_j``; ``"block_diagonal"`` —
            ``L^{-1} m`` and the full triangle ``L^{-1} blockdiag(L_j)``.

    Returns:
        ``v_bar (S, 1, K, M)`` and a list of ``(rows, R)`` with ``R (S, 1, K, m, m)`` such that
        ``Cov(v) = blockdiag over rows of R R^T``.
    """
    L = prior_factor
    blocks = task_slices(sets)
    if structure == "autoregressive" or len(sets) == 1:
        means, factors = [], []
        for s, b in zip(sets, blocks):
            L_jj = L[..., b, b]
            means.append(torch.linalg.solve_triangular(
                L_jj, s.mean.unsqueeze(-1), upper=False).squeeze(-1))
            factors.append((b, torch.linalg.solve_triangular(L_jj, s.scale_tril, upper=False)))
        lead = torch.broadcast_shapes(*(m.shape[:-1] for m in means))
        v_bar = torch.cat([m.expand(*lead, m.shape[-1]) for m in means], dim=-1)
        return v_bar, factors
    if structure == "block_diagonal":
        m = torch.cat([s.mean for s in sets], dim=-1)
        n = m.shape[-1]
        S_half = torch.zeros(sets[0].mean.shape[0], n, n, dtype=L.dtype, device=L.device)
        for s, b in zip(sets, blocks):
            S_half[..., b, b] = s.scale_tril
        v_bar = torch.linalg.solve_triangular(L, m.unsqueeze(-1), upper=False).squeeze(-1)
        R = torch.linalg.solve_triangular(L, S_half, upper=False)
        return v_bar, [(slice(0, m.shape[-1]), R)]
    raise ValueError(f"structure: expected 'autoregressive' or 'block_diagonal', "
                     f"received {structure!r}")


def cross_covariance(kernel: SquaredExponential, inducing_inputs: Tensor | Sequence[Tensor],
                     inputs: Tensor) -> Tensor:
    """``K_{Z,x}`` of shape ``(S, 1, Kz, M, B)`` for ``Z (Kz, M, D)``, ``x (B, D)``.

    ``Z`` may also be given as its task blocks ``Z_1, ..., Z_t`` (each ``(Kz_j, M_j, D)``, the
    rows of ``Z_<=t`` in order): the result is the same, but a frozen block (an earlier task's
    inducing inputs) then takes no part in the backward product for the inducing inputs, which
    at task t would otherwise cost t times the current block's.

    When the hyperparameters are shared by the classes (``H = 1``) the ``Kz`` sets are stacked
    into one ``(Kz M, D)`` block first, so that the inputs are never copied once per class
    (a broadcast batched matmul would materialize the scaled inputs ``x l^-2`` ``Kz`` times)."""
    kern, x = kernel, inputs
    blocks = [inducing_inputs] if isinstance(inducing_inputs, Tensor) else list(inducing_inputs)
    kz = max(Z.shape[0] for Z in blocks)
    if kern.lengthscale.shape[-2] == 1 and kz > 1:
        flat = [Z.expand(kz, *Z.shape[1:]).reshape(-1, Z.shape[-1]) for Z in blocks]
        K_flat = kern.stacked(flat, x)                               # (S, 1, 1, Kz M, B)
        parts = [K.reshape(*K.shape[:-3], kz, Z.shape[1], x.shape[0]) for K, Z in zip(
            K_flat.split([kz * Z.shape[1] for Z in blocks], dim=-2), blocks)]
        return cat_rows(parts)
    return kern.stacked(blocks, x)


def _row_blocks(W: Tensor, rows: Sequence[slice]) -> list[Tensor]:
    """``W[..., r, :]`` for each slice ``r``; blocks that tile the rows in order come from one
    ``split`` (whose backward writes one gradient, not a zero-filled copy of ``W`` per block)."""
    sizes = [r.stop - r.start for r in rows]
    tiles = all(r.step in (None, 1) for r in rows) and \
        [r.start for r in rows] == [0, *itertools.accumulate(sizes)][:-1] and \
        sum(sizes) == W.shape[-2]
    if tiles:
        return list(W.split(sizes, dim=-2))
    return [W[..., r, :] for r in rows]


def f_marginals(theta: Tensor, inputs: Tensor, inducing_inputs: Tensor | Sequence[Tensor],
                prior_factor: Tensor,
                whitened_mean: Tensor, whitened_factors: list[tuple[slice, Tensor]],
                min_variance: float = 1e-10) -> tuple[Tensor, Tensor]:
    """Mean and variance of q(f(x) | theta) by eq. (iv) of the module docstring.

    Args:
        theta: ``(S, 1, H, D + 1)``.
        inputs: ``x``, shape ``(B, D)``.
        inducing_inputs: ``Z_<=t`` as ``(Kz, M, D)`` (the rows of ``L``), or its task blocks
            (see :func:`cross_covariance`).
        prior_factor: ``L = chol(K_ZZ + jitter)``, ``(S, 1, Kk, M, M)``.
        whitened_mean, whitened_factors: ``v_bar`` and the blocks ``R`` of the whitened
            q(v) from :func:`whitened_posterior` (an empty list: ``v`` is a point, e.g. a draw).
        min_variance: floor on the variance (round-off can make it slightly negative).

    Returns:
        ``f_loc, f_var`` of shape ``(S, 1, K, B)``.
    """
    x, Z, L, v_bar, factors = inputs, inducing_inputs, prior_factor, whitened_mean, \
        whitened_factors
    kern = kernel_from_theta(theta)
    W = torch.linalg.solve_triangular(L, cross_covariance(kern, Z, x), upper=False)  # (S,1,Kk,M,B)
    f_loc = (W * v_bar.unsqueeze(-1)).sum(-2)                           # (S, 1, K, B)
    explained = torch.zeros_like(f_loc)
    for W_rows, (_, R) in zip(_row_blocks(W, [rows for rows, _ in factors]), factors):
        RtW = R.transpose(-1, -2) @ W_rows
        explained = explained + (RtW * RtW).sum(-2)
    k_xx = kern.variance.unsqueeze(-1)                                  # (S, 1, H, 1)
    f_var = k_xx - (W * W).sum(-2) + explained
    return f_loc, f_var.clamp_min(min_variance)


def gaussian_kl(mean: Tensor, scale_tril: Tensor, prior_scale_tril: Tensor) -> Tensor:
    """``KL[N(mean, S S^T) || N(0, P P^T)]`` for lower-triangular ``S`` and ``P`` (batched):

        1/2 [ ||P^{-1} S||_F^2 + ||P^{-1} mean||^2 - M + 2 sum log diag P - 2 sum log diag S ].
    """
    M = mean.shape[-1]
    PiS = torch.linalg.solve_triangular(prior_scale_tril, scale_tril, upper=False)
    Pim = torch.linalg.solve_triangular(prior_scale_tril, mean.unsqueeze(-1), upper=False)
    logdet_P = prior_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    logdet_S = scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return 0.5 * ((PiS * PiS).sum((-1, -2)) + (Pim * Pim).sum((-1, -2)) - M
                  + 2.0 * (logdet_P - logdet_S))


def autoregressive_kl(prior_factor: Tensor, current: InducingSet, block: slice) -> Tensor:
    """``D_t`` of eq. (8) for the auto-regressive guide:
    ``KL[q(u_t | u_<t) || p(u_t | u_<t)] = KL[N(m_t, S_t) || N(0, C_t)]`` with
    ``chol(C_t) = L_tt`` (``L = prior_factor``) — independent of ``u_<t`` (Sect. 4.3).
    Shape ``(S, 1, K)``."""
    return gaussian_kl(current.mean, current.scale_tril, prior_factor[..., block, block])


def block_diagonal_expected_kl(prior_factor: Tensor, sets: Sequence[InducingSet]) -> Tensor:
    """``E_{q(u_<t)} KL[N(m_t, S_t) || N(A_t u_<t, C_t)]`` for the block-diagonal guide, in
    closed form: with ``q(u_<t) = N(m_<t, B B^T)``, ``B = blockdiag(L_<t)``,

        E[...] = KL[N(m_t - A_t m_<t, S_t) || N(0, C_t)] + 1/2 ||L_tt^{-1} A_t B||_F^2.

    Shape ``(S, 1, K)``."""
    L = prior_factor
    blocks = task_slices(sets)
    *past, current = sets
    b = blocks[-1]
    p = b.start
    if not past:
        return autoregressive_kl(L, current, b)
    m_past = torch.cat([s.mean for s in past], dim=-1)
    shift = current.mean - conditional_prior_mean(L, b, m_past)
    kl = gaussian_kl(shift, current.scale_tril.expand(*shift.shape, shift.shape[-1]),
                     L[..., b, b])
    # A_t B = L_{t,<t} L_<t^{-1} B, then L_tt^{-1} (A_t B)
    B = torch.zeros(m_past.shape[0], p, p, dtype=L.dtype, device=L.device)
    for s, rows in zip(past, blocks[:-1]):
        B[..., rows, rows] = s.scale_tril
    AB = L[..., b, :p] @ torch.linalg.solve_triangular(L[..., :p, :p], B, upper=False)
    G = torch.linalg.solve_triangular(L[..., b, b], AB, upper=False)
    return kl + 0.5 * (G * G).sum((-1, -2))


def previous_posterior_term(theta: Tensor, current_outputs: Tensor, current_inputs: Tensor,
                            previous: InducingSet, jitter: float) -> Tensor:
    """The last term of the global-inducing-point bound (App. B.1, eq. 16), given ``u_t``:

        E_{p(u_{t-1} | u_t, theta)} [ log q(u_{t-1}) - log p(u_{t-1} | theta) ]

    in closed form. With ``p(u_{t-1} | u_t) = N(a, V)``, ``a = K_on K_nn^{-1} u_t``,
    ``V = K_oo - K_on K_nn^{-1} K_no`` (o: previous inducing inputs, n: current) and
    ``E_{N(a,V)} log N(x; m, P P^T) = log N(a; m, P P^T) - 1/2 ||P^{-1} V P^{-T}||_tr``:

        term = log N(a; m_o, S_o) - log N(a; 0, K_oo) - 1/2 [tr(S_o^{-1} V) - tr(K_oo^{-1} V)],
        tr(P^{-1} V P^{-T}) = ||P^{-1} L_oo||_F^2 - ||P^{-1} G^T||_F^2,  G = L_nn^{-1} K_no.

    Args:
        theta: ``(S, 1, H, D + 1)``; current_outputs: ``u_t`` of shape ``(S, 1, K, M_n)``;
        current_inputs: ``Z_t (Kz, M_n, D)``; previous: the previous task's set.

    Returns:
        ``(S, 1, K)``.
    """
    u = current_outputs
    kern = kernel_from_theta(theta)
    L_nn = prior_cholesky(theta, current_inputs, jitter)
    L_oo = prior_cholesky(theta, previous.inducing_inputs, jitter)
    G = torch.linalg.solve_triangular(L_nn, kern(current_inputs, previous.inducing_inputs),
                                      upper=False)                     # (..., M_n, M_o)
    a = (G.transpose(-1, -2) @ torch.linalg.solve_triangular(
        L_nn, u.unsqueeze(-1), upper=False)).squeeze(-1)               # (..., K, M_o)

    def expected_log_normal(mean: Tensor, P: Tensor) -> Tensor:
        M = P.shape[-1]
        r = torch.linalg.solve_triangular(P, (a - mean).unsqueeze(-1), upper=False)
        log_n = (-0.5 * (r * r).sum((-1, -2)) - P.diagonal(dim1=-2, dim2=-1).log().sum(-1)
                 - 0.5 * M * math.log(2.0 * math.pi))
        PiL = torch.linalg.solve_triangular(P, L_oo, upper=False)
        PiG = torch.linalg.solve_triangular(P, G.transpose(-1, -2), upper=False)
        trace = (PiL * PiL).sum((-1, -2)) - (PiG * PiG).sum((-1, -2))
        return log_n - 0.5 * trace

    return (expected_log_normal(previous.mean, previous.scale_tril)
            - expected_log_normal(torch.zeros_like(previous.mean), L_oo))
