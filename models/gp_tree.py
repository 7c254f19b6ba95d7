"""GP-Tree's binary node: a Polya-Gamma-augmented GP classifier (Achituve et al. 2021, ICML).

Generative model of one internal node ``v`` of the tree (paper Sect. 2.3, 3.1-3.2), on the
node's points ``X (n, d)`` with node labels ``y in {0, 1}`` (1 = "go to the right child"):

    f ~ N(0, K),  K = k(X, X) + jitter I                                    (zero-mean GP)
    p(y | f) = prod_j sigma(f_j)^{y_j} (1 - sigma(f_j))^{1 - y_j}           (eq. 3)
             = prod_j e^{y_j f_j} / (1 + e^{f_j})

and, with the Polya-Gamma identity (eq. 2, ``b = 1``, ``kappa_j = y_j - 1/2``),

    omega_j ~ PG(1, 0),   p(y, omega | f) = prod_j 2^{-1} exp(kappa_j f_j - omega_j f_j^2 / 2)
                                                  PG(omega_j | 1, 0)                   (eq. 2)

whose conditionals are the block-Gibbs steps (eq. 4)

    f | omega, y ~ N(Sigma kappa, Sigma),   Sigma = (K^-1 + Omega)^-1,   Omega = diag(omega)
    omega | f    ~ PG(1, f).

Kernels act on L2-normalized inputs (App. C): RBF ``s exp(-|x^ - x'^|^2 / (2 l^2))`` or the
normalized linear ``s x^.x'^`` (Table 1's grid), ``x^ = x / |x|``.

Numerics without inverses. With ``S = diag(sqrt(omega))`` and
``B = I + S K S = M M^T`` (SPD with eigenvalues >= 1, well conditioned for any omega; formed
elementwise, ``B_ij = [i = j] + s_i s_j K_ij``, so one Cholesky of n^3/3 flops per chain and
nothing else cubic), ``(K + Omega^-1)^-1 = S B^-1 S``, and

* a draw of eq. 4 by Matheron's rule on the pseudo-observations ``z = kappa / omega`` with noise
  ``Omega^-1``: ``f0 = chol(K) eps_0``,
  ``f = f0 + K S M^-T M^-1 (S^-1 kappa - S f0 - eps_1)``, ``eps_0, eps_1 ~ N(0, I)``
  (``S^-1 kappa = kappa / sqrt(omega)`` is moderate: a PG(1, f) draw below 1e-3 has
  probability ~exp(-125));
* ``log p(y | omega, X) = -n log 2 + 1/2 kappa^T Sigma kappa - sum_i log M_ii`` (eq. 10) with
  ``kappa^T Sigma kappa = kappa^T K kappa - |M^-1 S K kappa|^2``; eq. 10 writes it as
  ``N(Omega^-1 kappa | 0, K + Omega^-1)`` times omega-only factors (equal, see the tests);
* the augmented predictive at ``x*`` (eq. 12):
  ``mu* = k*^T S M^-T M^-1 S^-1 kappa``, ``var* = k** - |M^-1 S k*|^2``.

Variational node (Sect. 3.2, App. A; Wenzel et al. 2019) over inducing values ``fbar`` at
inducing inputs ``Xbar (m, d)``: ``p(fbar) = N(0, K_mm)`` (eq. 5), ``p(f | fbar)`` (eq. 6),
``q(omega) = prod PG(1, c_i)``, ``q(fbar) = N(mu~, Sigma~)`` held by its natural parameters
``eta = Sigma~^-1 mu~``, ``H = -Sigma~^-1 / 2``. With ``A = K_nm K_mm^-1``,
``Q_ii = k_ii - A_i K_mi``, ``lambda_i = E_q[omega_i] = tanh(c_i/2) / (2 c_i)`` and
``E_q f_i^2 = Q_ii + A_i Sigma~ A_i^T + (A_i mu~)^2``:

    ELBO = sum_i [kappa_i A_i mu~ - lambda_i E f_i^2 / 2 - log cosh(c_i/2) + lambda_i c_i^2 / 2]
           - n log 2 - KL(N(mu~, Sigma~) || N(0, K_mm))                      (eq. 13, App. A.1)
    c_i  = sqrt(E_q f_i^2)                                                   (eq. 16)
    eta* = A^T kappa,   H* = -1/2 (K_mm^-1 + A^T Lambda A)                   (eq. 17 fixed point)

(App. A omits the constants ``-n log 2`` and those of the KL; they are kept here so that the
ELBO bounds ``log p(y | X)``). Predictive (eq. 14):
``mu* = k_m*^T K_mm^-1 mu~``, ``var* = k** - k_m*^T K_mm^-1 k_m* + k_m*^T K_mm^-1 Sigma~ K_mm^-1 k_m*``.
Class probabilities use ``p(y* = 1) = E[sigma(f*)]`` by Gauss-Hermite quadrature (Sect. 3.2).

Shapes: leading batch axes ``...`` (nodes of a tree level, Gibbs chains) broadcast throughout.
"""

from __future__ import annotations

import math
from typing import Callable, Literal, NamedTuple

import numpy as np
import pyro
import pyro.distributions as pdist
import torch
from torch import Tensor
from torch.distributions import constraints

from models.kernels_torch import Kernel, Linear, Normalized, SquaredExponential
from models.linalg_torch import jitter_cholesky

__all__ = ["NodeKernelParams", "node_kernel", "node_gram", "kappa_from_labels", "PolyaGamma",
           "bernoulli_node_model", "augmented_node_model", "sample_f_given_omega",
           "augmented_log_marginal", "gibbs_predictive", "gibbs_predictive_cache",
           "GibbsPredictiveCache", "precision_factor", "sigmoid_expectation",
           "NaturalParams", "natural_to_moments", "vi_marginals", "optimal_c", "pg_vi_elbo",
           "natural_gradient_target", "vi_predictive", "gauss_hermite"]

_LOG2 = math.log(2.0)
KernelName = Literal["rbf", "linear"]


# -- kernel ------------------------------------------------------------------------------------
class NodeKernelParams(NamedTuple):
    """Hyperparameters of a node's covariance ``k(x, x') + jitter [x = x']`` on unit inputs.

    Attributes:
        outputscale: ``s > 0`` (ref: 4 for VI nodes, 8 for Gibbs nodes; FSCIL/cub/trainer.py).
        lengthscale: ``l > 0`` of the RBF kernel (ref: 1); unused by the linear kernel.
        jitter: added to the diagonal of every Gram matrix on the training side (ref: 1e-2 VI,
            1e-3 Gibbs; GP_Tree/kernel_class.py, gp_model.py).
        kind: ``"rbf"`` or ``"linear"`` (normalized linear, i.e. cosine, kernel).
    """

    outputscale: Tensor
    lengthscale: Tensor
    jitter: float
    kind: str = "rbf"


def node_kernel(params: NodeKernelParams) -> Kernel:
    """``k`` of :class:`NodeKernelParams` on L2-normalized inputs (no jitter)."""
    if params.kind == "rbf":
        return Normalized(SquaredExponential(params.outputscale, params.lengthscale))
    if params.kind == "linear":
        return Normalized(Linear(params.outputscale))
    raise ValueError(f"kind: expected 'rbf' or 'linear', received {params.kind!r}")


def node_gram(params: NodeKernelParams, X: Tensor) -> Tensor:
    """``K = k(X, X) + jitter I``: ``X (..., n, d) -> (..., n, n)``."""
    K = node_kernel(params)(X)
    return K + params.jitter * torch.eye(X.shape[-2], dtype=K.dtype, device=K.device)


def kappa_from_labels(y: Tensor, dtype: torch.dtype) -> Tensor:
    """``kappa = y - 1/2`` (eq. 4) for node labels ``y in {0, 1}``."""
    return y.to(dtype) - 0.5


# -- the Polya-Gamma density ---------------------------------------------------------------------
class PolyaGamma(pdist.TorchDistribution):
    """``PG(1, c)``, with density ``cosh(c/2) exp(-c^2 w / 2) PG(w | 1, 0)`` (Polson et al. 2013,
    eq. 5) and ``PG(w | 1, 0) = 4 J*(4w | 1)``, ``J*`` the alternating series of Devroye
    (PSW eq. 15, evaluated with the piece that converges fastest on either side of 0.64).

    The density is what the model states; draws come from an engine's sampler, passed as
    ``sampler(b, z, generator) -> Tensor`` (``inference.polya_gamma.random_polyagamma``), since
    a model module does not depend on the inference layer.
    """

    arg_constraints = {"c": constraints.real}
    support = constraints.positive
    has_rsample = False

    def __init__(self, c: Tensor, sampler: Callable | None = None, validate_args=None):
        self.c = torch.as_tensor(c, dtype=torch.get_default_dtype()) if not isinstance(c, Tensor) else c
        self.sampler = sampler
        super().__init__(self.c.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return PolyaGamma(self.c.expand(batch_shape), self.sampler)

    @property
    def mean(self) -> Tensor:
        c = self.c.abs()
        safe = torch.where(c < 1e-4, torch.ones_like(c), c)
        return torch.where(c < 1e-4, 0.25 - c * c / 48.0, torch.tanh(safe / 2) / (2 * safe))

    def sample(self, sample_shape=torch.Size()) -> Tensor:
        if self.sampler is None:
            raise RuntimeError("PolyaGamma.sample: no sampler given; construct with "
                               "sampler=inference.polya_gamma.random_polyagamma")
        z = self.c.expand(torch.Size(sample_shape) + self.c.shape)
        return self.sampler(1, z, None)

    def log_prob(self, value: Tensor, terms: int = 24) -> Tensor:
        x = 4.0 * value                              # J*(1) variable
        t = 0.64
        n = torch.arange(terms, dtype=value.dtype, device=value.device)
        k = n + 0.5
        xe = x.unsqueeze(-1)
        left = torch.log(math.pi * k) + 1.5 * math.log(2.0 / math.pi) - 1.5 * torch.log(xe) \
            - 2.0 * k * k / xe
        right = torch.log(math.pi * k) - 0.5 * (k * math.pi) ** 2 * xe
        log_a = torch.where(xe <= t, left, right)
        sign = torch.where(n % 2 == 0, 1.0, -1.0).to(value.dtype)
        series = (sign * torch.exp(log_a - log_a[..., :1])).sum(-1)
        log_j = log_a[..., 0] + torch.log(series.clamp_min(torch.finfo(value.dtype).tiny))
        c = self.c
        return torch.log(torch.cosh(c / 2)) - 0.5 * c * c * value + math.log(4.0) + log_j


# -- the node as Pyro programs -------------------------------------------------------------------
def bernoulli_node_model(X: Tensor, y: Tensor | None, params: NodeKernelParams) -> Tensor:
    """Pyro program of eq. 3: ``f ~ N(0, K)``, ``y ~ Bernoulli(sigmoid(f))``; returns ``f``.
    (The target of the NUTS reference in the tests.)"""
    K = node_gram(params, X)
    f = pyro.sample("f", pdist.MultivariateNormal(torch.zeros_like(K[..., 0]), covariance_matrix=K))
    with pyro.plate("data", X.shape[-2]):
        pyro.sample("y", pdist.Bernoulli(logits=f), obs=None if y is None else y.to(K.dtype))
    return f


def augmented_node_model(X: Tensor, y: Tensor, params: NodeKernelParams,
                         sampler: Callable | None = None) -> Tensor:
    """Pyro program of the augmented joint (eqs. 2-4): ``f ~ N(0, K)``, ``omega_j ~ PG(1, 0)``
    and the factor ``sum_j kappa_j f_j - omega_j f_j^2 / 2 - log 2`` (``y`` observed through
    it). Marginalizing omega gives back :func:`bernoulli_node_model`; the conditionals are the
    Gibbs steps. ``sampler`` draws omega when the program runs forward."""
    K = node_gram(params, X)
    n = X.shape[-2]
    f = pyro.sample("f", pdist.MultivariateNormal(torch.zeros_like(K[..., 0]), covariance_matrix=K))
    kappa = kappa_from_labels(y, K.dtype)
    with pyro.plate("data", n):
        omega = pyro.sample("omega", PolyaGamma(torch.zeros(n, dtype=K.dtype, device=K.device),
                                                sampler))
        pyro.factor("y", kappa * f - 0.5 * omega * f * f - _LOG2)
    return f


# -- Gibbs closed forms ------------------------------------------------------------------------
def precision_factor(K: Tensor, omega: Tensor, out: Tensor | None = None
                     ) -> tuple[Tensor, Tensor]:
    """``s = sqrt(omega)`` and ``M = chol(I + S K S)``: ``K (..., n, n)``, ``omega (..., n)``.

    ``out``: a buffer of the shape of ``M`` (``broadcast(K, omega)``), reused across calls by a
    sampler (``inference.pg_gibbs.PGGibbs``): ``B`` is formed and factored in place there, so a
    sweep allocates no ``(chains, n, n)`` array (a fresh one costs its page faults every call:
    forming ``B`` in fresh arrays took about twice as long as the Cholesky factorization itself
    at 30 x 200 x 200 on a loaded 2-core machine). Not for tensors that need gradients."""
    s = torch.sqrt(omega)
    if out is not None:
        torch.mul(s.unsqueeze(-1), s.unsqueeze(-2), out=out)
        out.mul_(K).diagonal(dim1=-2, dim2=-1).add_(1.0)
        info = torch.empty(out.shape[:-2], dtype=torch.int32, device=out.device)
        torch.linalg.cholesky_ex(out, out=(out, info))
        if not bool((info > 0).any()):
            return s, out
        # B has eigenvalues >= 1 for finite omega >= 0; left to jitter_cholesky's escalation
        # and its error (rebuilt: the failed factorization overwrote the buffer)
    B = s.unsqueeze(-1) * K * s.unsqueeze(-2)
    B = B + torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
    M = jitter_cholesky(B, name="I + S K S")
    return s, (M if out is None else out.copy_(M))


def _solve_lower(M: Tensor, v: Tensor) -> Tensor:
    return torch.linalg.solve_triangular(M, v.unsqueeze(-1), upper=False).squeeze(-1)


def _matvec(A: Tensor, v: Tensor, transpose: bool = False) -> Tensor:
    """``A v`` (or ``A^T v``) for ``A (..., 1, n, n)`` shared by the chains of ``v (..., C, n)``:
    computed as ``v A^T`` so that the chains meet ``A`` in one matrix product instead of a
    broadcast copy of ``A`` per chain."""
    At = A if transpose else A.transpose(-1, -2)
    if A.dim() >= 3 and A.shape[-3] == 1 and v.dim() >= 2:
        At = At.squeeze(-3)
    return v @ At


def sample_f_given_omega(K: Tensor, L: Tensor, omega: Tensor, kappa: Tensor, eps_prior: Tensor,
                         eps_noise: Tensor, workspace: Tensor | None = None
                         ) -> tuple[Tensor, Tensor]:
    """One draw of ``f | omega, y`` (eq. 4) per leading index, and ``log p(y | omega)`` (eq. 10).

    Args:
        K: prior covariance ``(..., n, n)`` (broadcast over chains); L: ``chol(K)``.
        omega, kappa: ``(..., n)``; eps_prior, eps_noise: standard normal ``(..., n)``.
        workspace: optional buffer for ``chol(I + S K S)``, ``(..., n, n)``
            (:func:`precision_factor`'s ``out``).

    Returns:
        ``f (..., n)`` and the augmented log marginal ``(...)``.
    """
    s, M = precision_factor(K, omega, out=workspace)
    f0 = _matvec(L, eps_prior)                        # L eps: a draw of N(0, K)
    r = kappa / s - s * f0 - eps_noise
    w = torch.cholesky_solve(r.unsqueeze(-1), M).squeeze(-1)
    f = f0 + _matvec(K, s * w)
    Kk = _matvec(K, kappa)
    b = _solve_lower(M, s * Kk)
    log_marg = -K.shape[-1] * _LOG2 + 0.5 * ((kappa * Kk).sum(-1) - (b * b).sum(-1)) \
        - torch.log(torch.diagonal(M, dim1=-2, dim2=-1)).sum(-1)
    return f, log_marg


def augmented_log_marginal(K: Tensor, omega: Tensor, kappa: Tensor) -> Tensor:
    """``log p(y | omega, X)`` of eq. 10 (with its constants), shape ``(...)``."""
    s, M = precision_factor(K, omega)
    Kk = _matvec(K, kappa)
    b = _solve_lower(M, s * Kk)
    return -K.shape[-1] * _LOG2 + 0.5 * ((kappa * Kk).sum(-1) - (b * b).sum(-1)) \
        - torch.log(torch.diagonal(M, dim1=-2, dim2=-1)).sum(-1)


class GibbsPredictiveCache(NamedTuple):
    """What eq. 12 reuses across test points: ``s = sqrt(omega)``, ``M = chol(I + S K S)``
    ``(..., n, n)`` and the weights ``u = S M^-T M^-1 S^-1 kappa`` with ``mu* = u^T k*``."""

    s: Tensor
    M: Tensor
    u: Tensor


def gibbs_predictive_cache(K: Tensor, omega: Tensor, kappa: Tensor) -> GibbsPredictiveCache:
    """Factor once per draw of omega (``K (n, n)``, ``omega, kappa (..., n)``)."""
    s, M = precision_factor(K, omega)
    u = s * torch.cholesky_solve((kappa / s).unsqueeze(-1), M).squeeze(-1)
    return GibbsPredictiveCache(s, M, u)


def gibbs_predictive(K: Tensor, omega: Tensor, kappa: Tensor, K_xs: Tensor, k_ss: Tensor,
                     cache: GibbsPredictiveCache | None = None, with_variance: bool = True
                     ) -> tuple[Tensor, Tensor | None]:
    """Mean and variance of ``f* | omega, y`` at test points (eq. 12).

    Args:
        K: prior covariance of the training points ``(n, n)``.
        omega, kappa: ``(..., n)`` (one row per chain / draw).
        K_xs: ``k(X, X*)`` ``(n, s)``; k_ss: prior variances at ``X*`` ``(s,)``.
        cache: :func:`gibbs_predictive_cache` of the same ``(K, omega, kappa)``.
        with_variance: ``False`` skips the variance (one triangular solve per draw and test
            block, the dominant cost), for predictions at the mean (App. C.1).

    Returns:
        ``mean (..., s)``, ``var (..., s)`` (clamped at 0 against rounding; None without it).
    """
    cache = gibbs_predictive_cache(K, omega, kappa) if cache is None else cache
    mean = cache.u @ K_xs                                             # (..., s)
    if not with_variance:
        return mean, None
    a = torch.linalg.solve_triangular(cache.M, cache.s.unsqueeze(-1) * K_xs, upper=False)
    var = k_ss - (a * a).sum(-2)
    return mean, var.clamp_min(0.0)


# -- Gauss-Hermite ---------------------------------------------------------------------------
def gauss_hermite(num_points: int, dtype=torch.float64, device=None) -> tuple[Tensor, Tensor]:
    """Nodes ``x_i`` and weights ``w_i / sqrt(pi)`` with ``E_{N(m, v)}[g] ~ sum_i w_i
    g(m + sqrt(2 v) x_i)`` (``numpy.polynomial.hermite.hermgauss``)."""
    x, w = np.polynomial.hermite.hermgauss(num_points)
    return (torch.as_tensor(x, dtype=dtype, device=device),
            torch.as_tensor(w / math.sqrt(math.pi), dtype=dtype, device=device))


def sigmoid_expectation(mean: Tensor, var: Tensor, num_points: int = 20) -> Tensor:
    """``E[sigma(f)]``, ``f ~ N(mean, var)``, by Gauss-Hermite quadrature (Sect. 3.2; 20 nodes,
    GPyTorch's ``GaussHermiteQuadrature1D`` default used by the reference)."""
    x, w = gauss_hermite(num_points, mean.dtype, mean.device)
    f = mean.unsqueeze(-1) + torch.sqrt(2.0 * var).unsqueeze(-1) * x
    return (torch.sigmoid(f) * w).sum(-1)


# -- variational node (App. A) -------------------------------------------------------------------
class NaturalParams(NamedTuple):
    """``q(fbar) = N(mu~, Sigma~)`` in natural form: ``eta = Sigma~^-1 mu~`` ``(m,)`` and
    ``H = -Sigma~^-1 / 2`` ``(m, m)`` (App. A.2)."""

    eta: Tensor
    H: Tensor


class VIMoments(NamedTuple):
    """``mu~ (m,)``, ``Lp = chol(Sigma~^-1) (m, m)``; ``Sigma~ = Lp^-T Lp^-1``."""

    mean: Tensor
    Lp: Tensor


def natural_to_moments(nat: NaturalParams) -> VIMoments:
    """``mu~ = (-2H)^-1 eta`` through the Cholesky factor of the precision ``-2H``."""
    P = -2.0 * nat.H
    Lp = jitter_cholesky(0.5 * (P + P.transpose(-1, -2)), name="q(fbar) precision -2H")
    mean = torch.cholesky_solve(nat.eta.unsqueeze(-1), Lp).squeeze(-1)
    return VIMoments(mean, Lp)


class VIMarginals(NamedTuple):
    """Per-point quantities of the ELBO: ``A^T = K_mm^-1 K_mn`` ``(m, b)``, ``E f (b,)``,
    ``E f^2 (b,)``, and ``Q_ii (b,)``."""

    At: Tensor
    mean: Tensor
    second_moment: Tensor
    Q_diag: Tensor


def vi_marginals(L_mm: Tensor, K_mn: Tensor, k_nn: Tensor, q: VIMoments) -> VIMarginals:
    """``E_q f_i`` and ``E_q f_i^2 = Q_ii + A_i Sigma~ A_i^T + (A_i mu~)^2`` at the batch points.

    Args:
        L_mm: ``chol(K_mm)`` ``(m, m)``; K_mn: ``(m, b)``; k_nn: ``diag K_nn`` ``(b,)``.
    """
    At = torch.cholesky_solve(K_mn, L_mm)                             # (m, b)
    mean = q.mean @ At
    Q = k_nn - (K_mn * At).sum(-2)
    W = torch.linalg.solve_triangular(q.Lp, At, upper=False)           # Lp^-1 A^T
    second = Q + (W * W).sum(-2) + mean * mean
    return VIMarginals(At, mean, second, Q)


def optimal_c(marg: VIMarginals) -> Tensor:
    """``c_i = sqrt(E_q f_i^2)`` (eq. 16), the unique maximizer of the ELBO in ``c_i``."""
    return torch.sqrt(marg.second_moment.clamp_min(0.0))


def _lambda(c: Tensor) -> Tensor:
    """``E[PG(1, c)] = tanh(c/2) / (2c)`` (1/4 at 0)."""
    small = c.abs() < 1e-4
    safe = torch.where(small, torch.ones_like(c), c)
    return torch.where(small, 0.25 - c * c / 48.0, torch.tanh(safe / 2) / (2 * safe))


def _log_cosh(x: Tensor) -> Tensor:
    ax = x.abs()
    return ax + torch.log1p(torch.exp(-2.0 * ax)) - _LOG2


def gaussian_kl(L_mm: Tensor, q: VIMoments) -> Tensor:
    """``KL(N(mu~, Sigma~) || N(0, K_mm))`` with all constants (App. A.1)."""
    m = L_mm.shape[-1]
    eye = torch.eye(m, dtype=L_mm.dtype, device=L_mm.device)
    Lp_inv_t = torch.linalg.solve_triangular(q.Lp.transpose(-1, -2), eye, upper=True)  # Lp^-T
    V = torch.linalg.solve_triangular(L_mm, Lp_inv_t, upper=False)    # L^-1 Lp^-T
    trace = (V * V).sum()
    a = torch.linalg.solve_triangular(L_mm, q.mean.unsqueeze(-1), upper=False).squeeze(-1)
    logdet_K = 2.0 * torch.log(torch.diagonal(L_mm)).sum()
    logdet_S = -2.0 * torch.log(torch.diagonal(q.Lp)).sum()
    return 0.5 * (trace + (a * a).sum() - m + logdet_K - logdet_S)


def pg_vi_elbo(L_mm: Tensor, K_mn: Tensor, k_nn: Tensor, kappa: Tensor, c: Tensor,
               q: VIMoments, num_data: int | None = None) -> Tensor:
    """The PG-VI evidence lower bound (eq. 13, App. A.1) on a minibatch, scaled to the node.

    Args:
        L_mm, K_mn, k_nn: kernel blocks (differentiable in the kernel, inducing inputs and
            features); kappa: ``y - 1/2`` ``(b,)``; c: ``q(omega)`` tilts ``(b,)``.
        q: moments of ``q(fbar)`` (treated as given).
        num_data: ``n`` of the node (default: the batch size); the data terms are scaled by
            ``n / b`` as in eq. 17.
    """
    b = kappa.shape[-1]
    n = b if num_data is None else num_data
    marg = vi_marginals(L_mm, K_mn, k_nn, q)
    lam = _lambda(c)
    data = kappa * marg.mean - 0.5 * lam * marg.second_moment - _log_cosh(0.5 * c) \
        + 0.5 * lam * c * c - _LOG2
    return (n / b) * data.sum() - gaussian_kl(L_mm, q)


def natural_gradient_target(L_mm: Tensor, marg: VIMarginals, kappa: Tensor, c: Tensor,
                            num_data: int | None = None) -> NaturalParams:
    """The fixed point ``(eta*, H*)`` of eq. 17 on a minibatch (``s = n / b``):
    ``eta* = s A^T kappa``, ``H* = -1/2 (K_mm^-1 + s A^T Lambda A)``; a natural-gradient step
    of size ``rho`` is ``theta <- theta + rho (theta* - theta)``.

    Eq. 17 as printed carries ``n / (2|B|)`` where the reference code
    (GP_Tree/gp_model.py, ``VariationalELBO.update``) and the bound of App. A.1 give ``n/|B|``
    with ``kappa = y - 1/2`` (the code writes ``n/(2|B|)`` times labels in ``{-1, 1}``): the
    code's scaling is the one whose fixed point maximizes the ELBO, and it is used here.
    ``K_mm^-1`` is part of the natural parameter itself; it is formed from the Cholesky factor
    by triangular solves (``cholesky_solve``), never by an explicit inverse."""
    b = kappa.shape[-1]
    s = (b if num_data is None else num_data) / b
    lam = _lambda(c)
    eta = s * (marg.At @ kappa)
    eye = torch.eye(L_mm.shape[-1], dtype=L_mm.dtype, device=L_mm.device)
    K_inv = torch.cholesky_solve(eye, L_mm)
    P = K_inv + s * (marg.At * lam) @ marg.At.transpose(-1, -2)
    P = 0.5 * (P + P.transpose(-1, -2))
    return NaturalParams(eta, -0.5 * P)


def vi_predictive(L_mm: Tensor, q: VIMoments, K_ms: Tensor, k_ss: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and variance of ``f*`` under ``q(fbar)`` (eq. 14): ``K_ms (m, s)``, ``k_ss (s,)``."""
    At = torch.cholesky_solve(K_ms, L_mm)
    mean = q.mean @ At
    W = torch.linalg.solve_triangular(q.Lp, At, upper=False)
    var = k_ss - (K_ms * At).sum(-2) + (W * W).sum(-2)
    return mean, var.clamp_min(0.0)
