r"""VAR-GP as a Pyro program: Variational Auto-Regressive Gaussian Processes for continual
learning (Kapoor, Karaletsos & Bui, ICML 2021).

``K`` independent GPs, one per class, with a softmax likelihood (single head); an ARD (or, as
eq. 20 is printed, isotropic) exponentiated-quadratic kernel on log-hyperparameters ``theta``
with prior ``N(0, I)`` at the first task and ``q_{t-1}(theta)`` afterwards; per-task inducing
inputs ``Z_t`` and outputs ``u_t``. For task ``t`` the approximate running joint (eq. 6) and the
guide (eq. 7) are

    model:  p(y^(t) | f) p(f_{!= u<=t} | u_<=t, theta) p(u_t | u_<t, theta) q(u_<t | theta) q_{t-1}(theta)
    guide:  p(f_{!= u<=t} | u_<=t, theta) q(u_t | u_<t, theta)     q(u_<t | theta) q_t(theta)

and ``Trace_ELBO``-family losses on them give the generalized continual bound (eq. 8; eq. 5 at
t = 1):

    F(q_t) = sum_i E_q[log p(y_i | f)] - beta KL[q_t(theta) || q_{t-1}(theta)]
             - E_{q_t(theta) q(u_<t | theta)} KL[q(u_t | u_<t, theta) || p(u_t | u_<t, theta)].

The sites of :meth:`VARGPModel.model` and :meth:`VARGPModel.guide` are exactly these factors:

* ``theta`` — log-hyperparameters, in a ``theta_samples`` plate of S draws scaled by 1/S (the
  "3 samples from the variational distribution" of Sect. 5) and by the tempering ``beta``;
* ``u_1 .. u_{t-1}`` — the frozen guide factors of earlier tasks, identical in model and guide
  (their log-densities cancel: eq. 7's ``q(u_<t | theta)``);
* ``u_t`` — the prior conditional ``p(u_t | u_<t, theta) = N(A_t u_<t, C_t)`` in the model and the
  auto-regressive guide ``N(A_t u_<t + m_t, L_t L_t^T)``; with ``TraceMeanField_ELBO`` the KL of
  this site is analytic and, as the paper notes, independent of ``u_<t``;
* ``y`` — the softmax likelihood, observed, inside a ``data`` plate of size N subsampled to the
  minibatch (scale N/B) and an ``f_samples`` plate of S_f draws scaled by 1/S_f.

The likelihood term uses the closed-form marginal ``q(f | theta) = int p(f | u) q(u_<=t | theta)``
(App. C.3, eq. 22, computed in whitened form, see :mod:`models.vargp_math`) rather than the
sampled ``u``: the pattern of Pyro's own ``pyro.contrib.gp.models.VariationalSparseGP``, whose
model also computes ``f_loc, f_var`` from the variational parameters. It avoids the variance of
ancestral sampling ("we can avoid variance introduced by the ancestral sampling", App. C.3).

Ablations (Sect. 5.3, App. B.1) are options of the same program:

* ``guide="block_diagonal"`` — ``q'(u_t | u_<t, theta) = N(m_t, S_t)`` (no ``A_t``); the KL of
  ``u_t`` then depends on the sampled ``u_<t``;
* ``guide="global"`` — one set of inducing points at a time (App. B.1, eq. 16): the model draws
  ``u_t ~ p(u_t | theta)`` and adds the factor ``previous_posterior`` =
  ``E_{p(u_{t-1} | u_t, theta)}[log q(u_{t-1}) - log p(u_{t-1} | theta)]``;
* hyperparameters given as :class:`PointHyperparameters` — the "MLE hypers" ablation:
  ``theta`` is a ``pyro.param`` of the model (no KL term for it in eq. 5 or eq. 8).

Print the program with ``pyro.poutine.trace(m.model).get_trace(x, y).format_shapes()``.
"""

from __future__ import annotations

import math
from typing import Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.distributions import constraints
from torch import Tensor

from models.vargp_math import (HyperPosterior, Hyperparameters, InducingSet,
                               PointHyperparameters, concat_inducing_inputs,
                               conditional_prior_mean, f_marginals, kernel_theta,
                               previous_posterior_term, prior_cholesky, sample_f, task_slices,
                               whitened_posterior)

__all__ = ["VARGPModel", "SoftmaxLikelihood", "GaussianLikelihood", "GUIDES",
           "init_inducing_set", "standard_hyper_prior", "initial_hyperparameters",
           "median_distance",
           "predictive_probabilities", "f_marginals_of_state", "posterior_factors",
           "task_program", "InducingSet", "HyperPosterior", "PointHyperparameters",
           "Hyperparameters"]

#: the guide structures: VAR-GP, Block Diag. as the authors' code (only the KL of u_t drops
#: A_t) and as the text reads (block diagonal in the guide and the prediction), Global
GUIDES = ("autoregressive", "block_diagonal", "block_diagonal_joint", "global")
MAX_PLATE_NESTING = 3  # theta_samples (-3), f_samples (-2), classes / data (-1)


# ---------------------------------------------------------------------------------------------
# likelihoods
# ---------------------------------------------------------------------------------------------
class SoftmaxLikelihood:
    """``p(y | f) = Cat(y; softmax(f_1..f_K))`` (Sect. 3); ``E_q(f)[log p(y | f)]`` by
    ``num_f_samples`` reparameterized draws of ``f ~ q(f | theta)`` (ref code: 10), each weighted
    1/num_f_samples in an ``f_samples`` plate.

    Called inside the model's ``data`` plate with ``f_loc, f_var: (S, 1, B, K)`` and labels
    ``y: (B,)``.
    """

    num_outputs = None

    def __init__(self, num_f_samples: int = 10):
        if num_f_samples < 1:
            raise ValueError(f"num_f_samples: expected >= 1, received {num_f_samples}")
        self.num_f_samples = int(num_f_samples)

    def __call__(self, f_loc: Tensor, f_var: Tensor, y: Tensor | None) -> Tensor:
        S_f = self.num_f_samples
        f = sample_f(f_loc, f_var, S_f)                                 # (S, S_f, B, K)
        with pyro.plate("f_samples", S_f, dim=-2), poutine.scale(scale=1.0 / S_f):
            return pyro.sample("y", dist.Categorical(logits=f), obs=y)


class GaussianLikelihood:
    """``p(y | f) = N(y; f, noise_variance)`` with the exact expectation under q(f) = N(mu, v):
    ``E[log N(y; f, s2)] = log N(y; mu, s2) - v / (2 s2)`` — the observed site ``y`` plus the
    factor ``y_variance``. Used by the limit-case test (ELBO = exact log marginal likelihood);
    one output (``num_classes=1``)."""

    num_outputs = 1

    def __init__(self, noise_variance: float):
        if not noise_variance > 0:
            raise ValueError(f"noise_variance: expected > 0, received {noise_variance}")
        self.noise_variance = float(noise_variance)

    def __call__(self, f_loc: Tensor, f_var: Tensor, y: Tensor | None) -> Tensor:
        mu, v = f_loc[..., 0], f_var[..., 0]                            # (S, 1, B)
        out = pyro.sample("y", dist.Normal(mu, math.sqrt(self.noise_variance)), obs=y)
        pyro.factor("y_variance", -0.5 * v / self.noise_variance)
        return out


# ---------------------------------------------------------------------------------------------
# initial values
# ---------------------------------------------------------------------------------------------
def standard_hyper_prior(num_hyper_sets: int, num_lengthscales: int, dtype=torch.float32,
                         device=None) -> HyperPosterior:
    """``p(theta) = N(0, I)`` over ``[log gamma, log l_1..l_D]`` (Sect. 4.3), shape ``(H, D+1)``;
    ``num_lengthscales`` is ``D`` for the ARD kernel or 1 for an isotropic one (eq. 20 as
    printed: one ``sigma``), shape ``(H, 2)``."""
    shape = (num_hyper_sets, num_lengthscales + 1)
    return HyperPosterior(torch.zeros(shape, dtype=dtype, device=device),
                          torch.ones(shape, dtype=dtype, device=device))


def init_inducing_set(x: Tensor, num_classes: int, num_inducing: int, *,
                      per_class_inputs: bool = True, generator: torch.Generator | None = None,
                      mean_std: float = 0.0, scale: float = 1.0) -> InducingSet:
    """Algorithm 1, line 1: ``Z_t`` a random subset of the task's inputs (an independent subset
    per class GP when ``per_class_inputs``, as the reference code), ``m_t ~ N(0, mean_std^2)``
    and ``L_t = scale * I``. The authors' code (uber-research/vargp ``var_gp/vargp.py``,
    ``VARGP.__init__``) draws ``m_t`` with std 0.5 and stores ``L_t``'s diagonal as
    ``softplus(1) = 1.3133``; App. C.2 says "initialized at an identity matrix".

    Args:
        x: the task's inputs ``(N, D)``; subsets are drawn without replacement (with
            replacement only if ``N < num_inducing``).
        generator: a CPU ``torch.Generator`` (explicit seed) for Z and m.
    """
    N = x.shape[0]
    Kz = num_classes if per_class_inputs else 1
    rows = []
    for _ in range(Kz):
        if N >= num_inducing:
            idx = torch.randperm(N, generator=generator)[:num_inducing]
        else:
            idx = torch.randint(N, (num_inducing,), generator=generator)
        rows.append(idx.to(x.device))
    Z = torch.stack([x[i] for i in rows])                               # (Kz, M, D)
    m = mean_std * torch.randn(num_classes, num_inducing, generator=generator,
                               dtype=x.dtype).to(x.device)
    L = scale * torch.eye(num_inducing, dtype=x.dtype, device=x.device).expand(
        num_classes, num_inducing, num_inducing).clone()
    return InducingSet(Z.clone(), m, L)


def initial_hyperparameters(width: int, *, point: bool, mean: float = math.log(0.5),
                            noise: float = 0.05, log_variance: float = -2.0,
                            log_lengthscale: float | None = None,
                            generator: torch.Generator | None = None, dtype=torch.float32,
                            device=None) -> Hyperparameters:
    """Where ``q_t(theta)`` (or the point theta) starts at every task: each entry at ``mean +
    noise * N(0, 1)``, standard deviation ``exp(log_variance / 2)`` (uber-research/vargp
    ``var_gp/kernels.py``, ``RBFKernel.__init__``: log 0.5, 0.05, -2, built anew for every task
    with ``q_{t-1}(theta)`` only as the prior). ``width`` = D + 1 (ARD) or 2.
    ``log_lengthscale``: when given, the lengthscale entries (``theta[1:]``) start there
    instead of at ``mean`` (a data-scaled start, :func:`median_distance`); the same noise
    draw is added, so the two starts differ by a constant shift of the lengthscales."""
    loc = mean + noise * torch.randn(1, width, generator=generator, dtype=dtype)
    if log_lengthscale is not None:
        loc[:, 1:] += float(log_lengthscale) - mean
    loc = loc.to(device)
    if point:
        return PointHyperparameters(loc)
    return HyperPosterior(loc, torch.full_like(loc, math.exp(0.5 * log_variance)))


def median_distance(x: Tensor, max_rows: int = 1000,
                    generator: torch.Generator | None = None) -> float:
    """The median Euclidean distance between distinct rows of ``x (N, D)`` (at most
    ``max_rows`` of them, a seeded subset): the "median heuristic" lengthscale of an SE kernel
    (Schoelkopf & Smola 2002; Garreau et al. 2017). With every ARD lengthscale there, a typical
    pair of inputs is at squared scaled distance about 1 and the kernel neither vanishes off
    the diagonal (lengthscales far below it: the start of the authors' code on raw MNIST
    pixels, l = 0.5 against a median distance of about 10) nor is flat."""
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"median_distance: expected at least 2 rows (N, D), received shape "
                         f"{tuple(x.shape)}")
    n = x.shape[0]
    if n > max_rows:
        x = x[torch.randperm(n, generator=generator)[:max_rows].to(x.device)]
    d = torch.cdist(x.to(torch.float64), x.to(torch.float64))
    i, j = torch.triu_indices(d.shape[0], d.shape[0], offset=1)
    med = float(d[i, j].median())
    if not med > 0:
        raise ValueError("median_distance: the rows are (mostly) identical; the median "
                         "pairwise distance is 0")
    return med


# ---------------------------------------------------------------------------------------------
# the program
# ---------------------------------------------------------------------------------------------
class VARGPModel:
    """Model and guide of VAR-GP for the current task ``t`` (see the module docstring).

    Args:
        num_classes: ``K`` (one GP each); 1 with :class:`GaussianLikelihood`.
        past: frozen :class:`InducingSet` of tasks ``1..t-1`` (plain tensors, no gradients).
            For ``guide="global"`` at most one: the previous posterior ``q(u_{t-1})``.
        init: initial values of the current task's ``Z_t, m_t, L_t`` (e.g.
            :func:`init_inducing_set`).
        hyper_prior: ``q_{t-1}(theta)`` (``None``: ``N(0, I)``; unused for point hypers).
        hyper_init: initial hyperparameters, whose type is the choice of Table 1's rows: a
            :class:`HyperPosterior` (``q_t(theta)``, VAR-GP) or a :class:`PointHyperparameters`
            (the "MLE Hypers" ablation); width 2 (``[log gamma, log l]``) gives the isotropic
            kernel. None: ``q(theta) = N(0, I)``.
        guide: ``"autoregressive"`` (VAR-GP), ``"block_diagonal"`` (the authors' code: the KL of
            ``u_t`` drops ``A_t``, the likelihood and the prediction keep the auto-regressive
            joint), ``"block_diagonal_joint"`` (the text's reading: no ``A_t`` anywhere) or
            ``"global"``.
        likelihood: :class:`SoftmaxLikelihood` (default) or :class:`GaussianLikelihood`.
        beta: KL tempering factor of ``KL[q_t(theta) || q_{t-1}(theta)]`` (Sect. 4.2).
        num_theta_samples: S draws of theta per ELBO evaluation (ref: 3); 1 for point hypers.
        jitter: ``K_ZZ + jitter * I`` everywhere (part of the model).
        amplitude: ``"squared"`` (kernel variance ``exp(2 theta_0)``, the authors' code) or
            ``"linear"`` (``exp(theta_0)``); :func:`models.vargp_math.kernel_theta`.

    Parameters (``pyro.param`` names) of the current task: ``inducing_inputs`` ``(Kz, M, D)``,
    ``inducing_mean`` ``(K, M)``, ``inducing_scale_tril`` ``(K, M, M)`` (softplus diagonal,
    App. C.2), and ``theta_loc``/``theta_log_variance`` ``(H, D+1)`` (the code's ``log_mean`` /
    ``log_logvar``) or ``theta`` (point).
    """

    def __init__(self, *, num_classes: int, past: Sequence[InducingSet], init: InducingSet,
                 hyper_prior: HyperPosterior | None = None,
                 hyper_init: Hyperparameters | None = None,
                 guide: str = "autoregressive", likelihood=None, beta: float = 1.0,
                 num_theta_samples: int = 3, jitter: float = 1e-6,
                 amplitude: str = "squared"):
        if guide not in GUIDES:
            raise ValueError(f"guide: expected one of {GUIDES}, received {guide!r}")
        if guide == "global" and len(past) > 1:
            raise ValueError("guide='global' keeps one previous inducing set, received "
                             f"{len(past)}")
        if not beta > 0:
            raise ValueError(f"beta: expected > 0, received {beta}")
        if num_theta_samples < 1:
            raise ValueError(f"num_theta_samples: expected >= 1, received {num_theta_samples}")
        self.num_classes = int(num_classes)
        self.past = [p.detach() for p in past]
        self.init = init.detach()
        self.input_dim = int(init.inducing_inputs.shape[-1])
        self.guide_structure = guide
        self.likelihood = likelihood if likelihood is not None else SoftmaxLikelihood()
        if getattr(self.likelihood, "num_outputs", None) not in (None, self.num_classes):
            raise ValueError(f"likelihood has {self.likelihood.num_outputs} output(s) but "
                             f"num_classes={self.num_classes}")
        self.beta = float(beta)
        self.jitter = float(jitter)
        kernel_theta(init.mean.new_zeros(1, 2), amplitude)     # checks the name
        self.amplitude = amplitude
        dtype, device = init.mean.dtype, init.mean.device
        if hyper_init is None:
            hyper_init = standard_hyper_prior(1, self.input_dim, dtype, device)
        if not isinstance(hyper_init, (HyperPosterior, PointHyperparameters)):
            raise TypeError(f"hyper_init: expected a HyperPosterior or PointHyperparameters, "
                            f"received {type(hyper_init).__name__}")
        self.hyper_init = hyper_init.detach()
        self.point = isinstance(self.hyper_init, PointHyperparameters)
        self.num_theta_samples = 1 if self.point else int(num_theta_samples)
        H, width = self.hyper_init.mean.shape
        if width not in (self.input_dim + 1, 2):
            raise ValueError(f"hyper_init: expected {self.input_dim + 1} (ARD) or 2 (isotropic) "
                             f"log-hyperparameters per set, received {width}")
        self.hyper_prior = (hyper_prior.detach() if hyper_prior is not None
                            else standard_hyper_prior(H, width - 1, dtype, device))
        if tuple(self.hyper_prior.loc.shape) != (H, width):
            raise ValueError(f"hyper_prior: expected shape {(H, width)} like hyper_init, "
                             f"received {tuple(self.hyper_prior.loc.shape)}")
        self._cache: tuple | None = None
        self._factor_cache: dict[int, tuple[Tensor, dist.MultivariateNormal]] = {}

    # -- parameters of the current task ------------------------------------------------------
    def current_set(self) -> InducingSet:
        """``(Z_t, m_t, L_t)`` from the param store (created from ``init`` on first use)."""
        Z = pyro.param("inducing_inputs", self.init.inducing_inputs.clone())
        m = pyro.param("inducing_mean", self.init.mean.clone())
        L = pyro.param("inducing_scale_tril", self.init.scale_tril.clone(),
                       constraint=constraints.softplus_lower_cholesky)
        return InducingSet(Z, m, L)

    def sets(self) -> list[InducingSet]:
        """Inducing sets entering ``q(u_<=t)``: all tasks, or only the current (global)."""
        current = self.current_set()
        return [current] if self.guide_structure == "global" else [*self.past, current]

    def _theta(self, role: str) -> tuple[Tensor, Tensor]:
        """Sample (or look up) theta; returns the site value (the cache key) and the kernel's
        log-hyperparameters (:func:`models.vargp_math.kernel_theta`) as ``(S, 1, H, D+1)``."""
        if self.point:
            theta = pyro.param("theta", self.hyper_init.theta.clone())
            return theta, kernel_theta(theta.expand(1, 1, *theta.shape), self.amplitude)
        if role == "model":
            fn = dist.Normal(self.hyper_prior.loc, self.hyper_prior.scale)
        else:
            # q_t(theta)'s spread is optimized as an unconstrained log-variance, as the authors'
            # code does (``var_gp/kernels.py``: ``log_logvar``), not as Pyro's positive scale
            # (log sigma): under Yogi's near-sign steps the log-variance moves sigma half as
            # fast, and the KL's pull of sigma to the prior's 1 no longer wipes out the kernel
            # before the likelihood can grow the lengthscales (docs/vargp.md, Results).
            loc = pyro.param("theta_loc", self.hyper_init.loc.clone())
            log_variance = pyro.param("theta_log_variance",
                                      2.0 * torch.log(self.hyper_init.scale.clone()))
            fn = dist.Normal(loc, torch.exp(0.5 * log_variance))
        with poutine.scale(scale=self.beta):
            value = pyro.sample("theta", fn.to_event(2))               # (S, 1, 1, H, D+1)
        return value, kernel_theta(value.squeeze(-3), self.amplitude)

    def _prior_factor(self, key: Tensor, theta: Tensor, sets: list[InducingSet]) -> Tensor:
        """``chol(K_<=t,<=t)`` — computed once per theta draw and shared by guide and model:
        under replay the model receives the guide's sample tensor itself (``key``)."""
        Z_cur = sets[-1].inducing_inputs
        stamp = (key._version, Z_cur._version)   # in-place optimizer steps bump _version
        c = self._cache
        if c is not None and c[0] is key and c[1] is Z_cur and c[2] == stamp:
            return c[3]
        L = prior_cholesky(theta, concat_inducing_inputs(sets), self.jitter)
        self._cache = (key, Z_cur, stamp, L)
        return L

    def _guide_factor(self, j: int, L: Tensor, sets: list[InducingSet], blocks: list[slice],
                      u_past: list[Tensor]) -> dist.MultivariateNormal:
        """The guide factor of task ``j`` (1-based): ``N(A_j u_<j + m_j, L_j L_j^T)`` or, for the
        block-diagonal guide, ``N(m_j, L_j L_j^T)``.

        The guide builds it first; the model, replaying the guide's ``u_<j`` with the same ``L``
        (see :meth:`_prior_factor`), gets the guide's object back instead of building it again."""
        hit = self._factor_cache.get(j)
        if hit is not None and hit[0] is L:
            return hit[1]
        s = sets[j - 1]
        # A_t u_<t enters every factor of the auto-regressive guide, the earlier tasks' factors
        # of the code's block-diagonal ablation (its current factor drops A_t: only the KL of
        # u_t changes), and none of the text's block-diagonal reading
        with_A = self.guide_structure == "autoregressive" or (
            self.guide_structure == "block_diagonal" and j < len(sets))
        if with_A and u_past:
            loc = conditional_prior_mean(L, blocks[j - 1], torch.cat(u_past, -1)) + s.mean
        else:
            loc = s.mean
        factor = dist.MultivariateNormal(loc, scale_tril=s.scale_tril)
        self._factor_cache[j] = (L, factor)
        return factor

    def _prior_conditional(self, L: Tensor, blocks: list[slice], u_past: list[Tensor]
                           ) -> dist.MultivariateNormal:
        """``p(u_t | u_<t, theta) = N(A_t u_<t, C_t)``, ``chol(C_t) = L_tt`` (Sect. 4.3.1)."""
        b = blocks[-1]
        if u_past:
            loc = conditional_prior_mean(L, b, torch.cat(u_past, -1))
        else:
            loc = torch.zeros(L.shape[:-2] + (b.stop - b.start,), dtype=L.dtype,
                              device=L.device)
        return dist.MultivariateNormal(loc, scale_tril=L[..., b, b])

    # -- model and guide ---------------------------------------------------------------------
    def _theta_plate(self):
        """The ``theta_samples`` plate of S draws, each weighted 1/S (Sect. 5: 3 draws)."""
        import contextlib

        S = self.num_theta_samples
        stack = contextlib.ExitStack()
        stack.enter_context(poutine.scale(scale=1.0 / S))
        stack.enter_context(pyro.plate("theta_samples", S, dim=-3))
        return stack

    def _shared_start(self, role: str) -> tuple[Tensor, list[InducingSet], list[slice], Tensor]:
        """What model and guide both begin with: theta (sampled in the guide, replayed in the
        model), the inducing sets, their row blocks and ``chol(K_<=t,<=t)`` at theta."""
        key, theta = self._theta(role)
        sets = self.sets()
        return theta, sets, task_slices(sets), self._prior_factor(key, theta, sets)

    def model(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """The approximate running joint of eq. (6) (eq. 13 for the global ablation).

        Args:
            x: minibatch inputs ``(B, D)``; y: labels ``(B,)`` (or targets for the Gaussian
            likelihood); num_data: N, the task's size (the data plate scales by N / B).
        """
        B = x.shape[0]
        N = B if num_data is None else int(num_data)
        with self._theta_plate():
            theta, sets, blocks, L = self._shared_start("model")
            with pyro.plate("classes", self.num_classes, dim=-1):
                if self.guide_structure == "global":
                    u_t = pyro.sample("u", self._prior_conditional(L, blocks, []))
                    if self.past:
                        pyro.factor("previous_posterior", previous_posterior_term(
                            theta, u_t, sets[-1].inducing_inputs, self.past[0], self.jitter))
                else:
                    # q(u_<t | theta) of eq. (6): the guide's own factors (flagged as such, see
                    # the guide)
                    u_past: list[Tensor] = []
                    for j in range(1, len(sets)):
                        u_past.append(pyro.sample(
                            f"u_{j}", self._guide_factor(j, L, sets, blocks, u_past),
                            infer={"shared_factor": True}))
                    pyro.sample(f"u_{len(sets)}", self._prior_conditional(L, blocks, u_past))
            f_loc, f_var = self._f(theta, x, sets, L)
            with pyro.plate("data", N, subsample=torch.arange(B, device=x.device), dim=-1):
                return self.likelihood(f_loc.transpose(-1, -2), f_var.transpose(-1, -2), y)

    def guide(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> None:
        """The variational posterior of eq. (7): ``q_t(theta) q(u_<t | theta) q(u_t | u_<t, theta)``
        (``q_t(theta) q(u_t)`` for the global ablation). Same arguments as :meth:`model`."""
        self._cache = None
        self._factor_cache = {}
        with self._theta_plate():
            theta, sets, blocks, L = self._shared_start("guide")
            with pyro.plate("classes", self.num_classes, dim=-1):
                if self.guide_structure == "global":
                    s = sets[-1]
                    pyro.sample("u", dist.MultivariateNormal(s.mean, scale_tril=s.scale_tril))
                else:
                    # earlier tasks' factors are frozen and appear in the model too (eq. 6 and
                    # eq. 7 share q(u_<t | theta)); "shared_factor" lets
                    # inference.elbo.LazyTraceMeanField_ELBO skip their KL, which is 0
                    u_past: list[Tensor] = []
                    for j in range(1, len(sets) + 1):
                        u_past.append(pyro.sample(
                            f"u_{j}", self._guide_factor(j, L, sets, blocks, u_past),
                            infer={"shared_factor": j < len(sets)}))

    def _f(self, theta: Tensor, x: Tensor, sets: list[InducingSet], L: Tensor
           ) -> tuple[Tensor, Tensor]:
        v_bar, factors = whitened_posterior(L, sets, _joint_structure(self.guide_structure))
        # the task blocks, not Z_<=t: the frozen ones then cost no gradient (cross_covariance)
        return f_marginals(theta, x, [s.inducing_inputs for s in sets], L, v_bar, factors)

    # -- reading the result ------------------------------------------------------------------
    def state_from_params(self, params: dict[str, Tensor]
                          ) -> tuple[list[InducingSet], Hyperparameters]:
        """The inducing sets entering prediction (past + current, or the current one for the
        global guide) and the hyperparameters, from the constrained values of this program's
        parameters (``inference.svi.SVI.constrained``), detached."""
        current = InducingSet(params["inducing_inputs"], params["inducing_mean"],
                              params["inducing_scale_tril"]).detach()
        sets = [current] if self.guide_structure == "global" else [*self.past, current]
        if self.point:
            hyper: Hyperparameters = PointHyperparameters(params["theta"]).detach()
        else:
            hyper = HyperPosterior(params["theta_loc"],
                                   torch.exp(0.5 * params["theta_log_variance"])).detach()
        return sets, hyper

    @torch.no_grad()
    def accuracy(self, params: dict[str, Tensor], x: Tensor, y: Tensor, *,
                 num_theta_samples: int, num_f_samples: int,
                 generator: torch.Generator | None = None) -> float:
        """Accuracy of the posterior predictive (App. A.1) at this program's parameters
        ``params`` on ``(x, y)``: the validation score of Algorithm 1's early stopping."""
        sets, hyper = self.state_from_params(params)
        probs = predictive_probabilities(x, sets, hyper, guide=self.guide_structure,
                                         jitter=self.jitter, amplitude=self.amplitude,
                                         num_theta_samples=num_theta_samples,
                                         num_f_samples=num_f_samples, generator=generator)
        return float((probs.argmax(-1) == y).to(torch.float64).mean())


def task_program(x: Tensor, previous_sets: Sequence[InducingSet],
                 previous_hyper: Hyperparameters | None, *, num_classes: int, num_inducing: int,
                 guide: str = "autoregressive", point_hyperparameters: bool = False,
                 beta: float = 1.0, num_theta_samples: int = 3, num_f_samples: int = 10,
                 ard: bool = True, jitter: float = 1e-4, amplitude: str = "squared",
                 theta_init: tuple[float, float, float] = (math.log(0.5), 0.05, -2.0),
                 log_lengthscale_init: float | None = None,
                 inducing_mean_std: float = 0.5,
                 inducing_scale: float = math.log1p(math.e),
                 inducing_generator: torch.Generator | None = None,
                 theta_generator: torch.Generator | None = None) -> VARGPModel:
    """The program of the next task given the state after the tasks before it (Algorithm 1,
    line 1), started as the authors' code starts it (uber-research/vargp ``var_gp/vargp.py``,
    ``VARGP.create_clf``; ``var_gp/train_utils_global.py``, ``create_class_gp``):

    * hyperparameters: a fresh ``q_t(theta)`` (:func:`initial_hyperparameters`, ``theta_init``
      = mean, noise and log-variance) with ``q_{t-1}(theta)`` as its prior (``N(0, I)`` at the
      first task); the MLE ablation's point theta starts afresh too, with no prior;
    * inducing set: :func:`init_inducing_set` (a random subset of the task's inputs per class,
      ``m_t ~ N(0, inducing_mean_std^2)``, ``L_t = inducing_scale * I``, softplus(1) = 1.3133);
      the global guide at a later task keeps all of ``Z_{t-1}`` (adding task inputs only when
      ``M`` grew) with a fresh ``q(u_t)`` (``m_t`` as above, ``L_t`` the lower triangle of
      ones with ``inducing_scale`` on the diagonal, as ``torch.ones`` of the code's vector).

    Args:
        x: the task's inputs ``(N, D)``.
        previous_sets: inducing sets of tasks ``1..t-1`` (the one set of the global guide).
        previous_hyper: their hyperparameters (None at the first task).
        point_hyperparameters: the "MLE Hypers" ablation (theta a point).
        log_lengthscale_init: None (the code's start, every entry at ``theta_init[0]``, and
            the prior ``N(0, I)`` at the first task) or the log-lengthscale where the
            lengthscale entries start instead, and where the first task's prior centres them
            (a data-scaled start and prior: ``log median_distance(x_1)``, see
            :func:`median_distance`; later tasks' prior is ``q_{t-1}(theta)`` either way).
        inducing_generator, theta_generator: CPU generators (explicit seeds) of ``Z_t, m_t``
            and of theta's start.
    """
    K, M = int(num_classes), int(num_inducing)
    past = list(previous_sets[-1:]) if guide == "global" else list(previous_sets)
    width = x.shape[1] + 1 if ard else 2
    mean, noise, log_variance = theta_init
    hyper = initial_hyperparameters(width, point=point_hyperparameters, mean=mean, noise=noise,
                                    log_variance=log_variance,
                                    log_lengthscale=log_lengthscale_init,
                                    generator=theta_generator,
                                    dtype=x.dtype, device=x.device)
    if guide == "global" and past:
        Z_old = past[0].inducing_inputs
        Z = Z_old[:, :M]
        if Z_old.shape[-2] < M:
            extra = init_inducing_set(x, K, M - Z_old.shape[-2], generator=inducing_generator)
            Z = torch.cat([Z_old, extra.inducing_inputs.to(Z_old.dtype)], dim=-2)
        m = inducing_mean_std * torch.randn(K, M, generator=inducing_generator,
                                            dtype=x.dtype).to(x.device)
        ones = torch.ones(M, M, dtype=x.dtype, device=x.device).tril(-1)
        L = (ones + inducing_scale * torch.eye(M, dtype=x.dtype, device=x.device)).expand(
            K, M, M).clone()
        init = InducingSet(Z.clone(), m, L)
    else:
        init = init_inducing_set(x, K, M, generator=inducing_generator,
                                 mean_std=inducing_mean_std, scale=inducing_scale)
    hyper_prior = previous_hyper if isinstance(previous_hyper, HyperPosterior) else None
    if hyper_prior is None and log_lengthscale_init is not None:
        # the first task's prior N(0, I) centred at the data-scaled start for the lengthscales
        # (log l ~ N(log l_0, 1)): N(0, 1) on log l is a prior at l = 1 whatever the inputs'
        # scale, and at small N its KL pulls the lengthscales there (on raw pixels: a nearly
        # diagonal kernel)
        hyper_prior = standard_hyper_prior(1, width - 1, x.dtype, x.device)
        hyper_prior = HyperPosterior(
            torch.cat([hyper_prior.loc[..., :1],
                       torch.full_like(hyper_prior.loc[..., 1:], float(log_lengthscale_init))],
                      dim=-1), hyper_prior.scale)
    return VARGPModel(num_classes=K, past=past, init=init, hyper_prior=hyper_prior,
                      hyper_init=hyper, guide=guide,
                      likelihood=SoftmaxLikelihood(num_f_samples), beta=beta,
                      num_theta_samples=num_theta_samples, jitter=jitter, amplitude=amplitude)


def _joint_structure(guide: str) -> str:
    """The structure of q(u_<=t | theta) that the likelihood and the prediction use: block
    diagonal only for the text's reading of the block-diagonal ablation."""
    return "block_diagonal" if guide == "block_diagonal_joint" else "autoregressive"


# ---------------------------------------------------------------------------------------------
# prediction (App. A.1)
# ---------------------------------------------------------------------------------------------
def posterior_factors(theta: Tensor, sets: Sequence[InducingSet], *,
                      guide: str = "autoregressive", jitter: float = 1e-6
                      ) -> tuple[Tensor, Tensor, Tensor, list]:
    """Everything q(u_<=t | theta) needs at given theta draws ``(S, 1, H, D+1)``: the stacked
    inducing inputs ``Z``, ``L = chol(K_ZZ)`` and the whitened mean and factors of the joint
    (eq. 22; see :func:`models.vargp_math.whitened_posterior`) for the guide structure (the
    global guide has the auto-regressive form with a single set)."""
    sets = list(sets)
    Z = concat_inducing_inputs(sets)
    L = prior_cholesky(theta, Z, jitter)
    v_bar, factors = whitened_posterior(L, sets, _joint_structure(guide))
    return Z, L, v_bar, factors


def f_marginals_of_state(inputs: Tensor, sets: Sequence[InducingSet], theta: Tensor, *,
                         guide: str = "autoregressive", jitter: float = 1e-6
                         ) -> tuple[Tensor, Tensor]:
    """``q(f(x) | theta)`` at ``inputs (B, D)`` for given theta draws ``(S, 1, H, D+1)``:
    ``f_loc, f_var (S, 1, K, B)``."""
    Z, L, v_bar, factors = posterior_factors(theta, sets, guide=guide, jitter=jitter)
    return f_marginals(theta, inputs, Z, L, v_bar, factors)


@torch.no_grad()
def predictive_probabilities(inputs: Tensor, sets: Sequence[InducingSet],
                             hyper: Hyperparameters,
                             *, guide: str = "autoregressive", jitter: float = 1e-6,
                             amplitude: str = "squared",
                             num_theta_samples: int = 10, num_f_samples: int = 10,
                             generator: torch.Generator | None = None,
                             max_elements: int = 2**24) -> Tensor:
    """Posterior predictive of App. A.1 (eq. 12) by Monte Carlo:
    ``p(y* | x*) = 1/(S S_f) sum_{s, r} softmax(f^(s,r)(x*))`` with ``theta^(s) ~ q_t(theta)`` and
    ``f^(s,r) ~ q(f(x*) | theta^(s))`` (ref: 10 samples).

    Args:
        inputs: ``x``, shape ``(B, D)``; sets, hyper: the learner's state (inducing sets of
            tasks ``1..t`` and ``q_t(theta)`` or a point theta ``(H, D+1)``).
        guide: the guide structure the sets belong to; generator: CPU generator (seed).
        max_elements: bound on ``S * K * M * chunk`` per chunk of ``x`` (memory).

    Returns:
        ``(B, K)`` class probabilities.
    """
    x, sets = inputs, list(sets)
    theta = kernel_theta(hyper.draws(num_theta_samples, generator), amplitude)
    S = theta.shape[0]
    K = sets[-1].mean.shape[0]
    M = sum(s.num_inducing for s in sets)
    Z, L, v_bar, factors = posterior_factors(theta, sets, guide=guide, jitter=jitter)
    chunk = max(1, max_elements // max(1, S * K * M))
    out = []
    for start in range(0, x.shape[0], chunk):
        xb = x[start:start + chunk]
        f_loc, f_var = f_marginals(theta, xb, Z, L, v_bar, factors)    # (S, 1, K, b)
        f = sample_f(f_loc, f_var, num_f_samples, generator)          # (S, S_f, K, b)
        probs = torch.softmax(f, dim=-2).mean(dim=(0, 1))               # (K, b)
        out.append(probs.transpose(0, 1))
    return torch.cat(out, dim=0) if out else x.new_zeros(0, K)
