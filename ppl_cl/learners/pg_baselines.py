"""Polya-Gamma Gibbs baselines of GP-Tree's Table 1 as learners: logistic-softmax (LSM,
Galy-Fajou et al. 2020) and one-vs-each (OVE, Snell & Zemel 2021). The stick-break
multinomial GP (SBM-GP) is :class:`ppl_cl.learners.gp_tree.SBMGP` (GP-Tree on the chain tree).

``update(batch)`` adds the batch to the data seen so far (new classes may appear) and runs the
sampler of :mod:`inference.pg_multiclass` from the prior (``num_steps`` sweeps,
``num_chains`` chains). ``predict`` is the Monte Carlo predictive: for every chain's last
state, ``num_predict_samples`` draws of ``f*`` per class from the GP conditional (eq. 12 per
class for LSM; ``f* | f`` for OVE), pushed through the likelihood and averaged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from inference.pg_multiclass import LSMGibbs, MulticlassProblem, OVEGibbs
from models.gp_tree import (NodeKernelParams, gibbs_predictive, gibbs_predictive_cache, node_gram,
                            node_kernel)
from models.linalg_torch import jitter_cholesky
from ppl_cl.batch import Batch, as_numpy
from ppl_cl.configs.gp_tree import LSMConfig, OVEConfig
from ppl_cl.learner import Learner
from ppl_cl.learners.gp_tree import NotFittedError
from ppl_cl.predictive import CategoricalPredictive

__all__ = ["LSMGibbsClassifier", "OVEGibbsClassifier"]

_DTYPES = {"float64": torch.float64, "float32": torch.float32}


class _MulticlassGibbs(Learner):
    config_cls: type = LSMConfig

    def __init__(self, config=None, /, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        cfg = self.config
        self.dtype = _DTYPES[cfg.dtype]
        self.device = torch.device(cfg.device)
        self.X: torch.Tensor | None = None
        self.y: torch.Tensor | None = None
        self.state = None
        self.f_trace: torch.Tensor | None = None
        self.num_updates = 0
        self._cache = None

    # -- helpers -------------------------------------------------------------------------------
    def _params(self) -> NodeKernelParams:
        c = self.config
        return NodeKernelParams(torch.tensor(c.outputscale, dtype=self.dtype, device=self.device),
                                torch.tensor(c.lengthscale, dtype=self.dtype, device=self.device),
                                c.jitter, c.kernel)

    @property
    def num_classes(self) -> int:
        return 0 if self.y is None else int(self.y.max()) + 1

    @property
    def input_dim(self) -> int | None:
        return None if self.X is None else int(self.X.shape[1])

    def _problem(self, X, y) -> MulticlassProblem:
        K = node_gram(self._params(), X)
        Y = torch.nn.functional.one_hot(y, int(y.max()) + 1).to(self.dtype)
        return MulticlassProblem(K, jitter_cholesky(K, name="K"), Y)

    def _engine(self):
        raise NotImplementedError

    # -- protocol ------------------------------------------------------------------------------
    def update(self, batch: Batch) -> dict[str, Any]:
        if not isinstance(batch, Batch):
            raise TypeError(f"batch: expected a ppl_cl.Batch, received {type(batch).__name__}")
        batch.validate(input_dim=self.input_dim)
        y_np = as_numpy(batch.y)
        if not np.issubdtype(y_np.dtype, np.integer) or y_np.min() < 0:
            raise ValueError("y: expected integer class labels >= 0")
        X_new = torch.as_tensor(as_numpy(batch.x)).to(self.device, self.dtype)
        y_new = torch.as_tensor(y_np.astype(np.int64), device=self.device)
        X = X_new if self.X is None else torch.cat([self.X, X_new])
        y = y_new if self.y is None else torch.cat([self.y, y_new])
        present = torch.unique(y)
        if present.numel() < 2:
            raise ValueError(f"y: a single class {present.tolist()} seen; a classifier needs two")
        missing = sorted(set(range(int(y.max()) + 1)) - set(present.tolist()))
        if missing:
            raise ValueError(f"classes {missing} have no examples (labels must be 0..C-1 with "
                             "every class present)")
        problem = self._problem(X, y)
        engine = self._engine()
        state, _, draws = engine.run(problem, self.config.num_steps,
                                     seed=self.config.seed * 7919 + self.num_updates, keep=True)
        lls = [float(ll.mean()) for ll in draws["log_likelihood"]]
        self.X, self.y, self.state = X, y, state
        self.f_trace = draws["f"]                                          # (steps, ch, C, n)
        self.num_updates += 1
        self._cache = None
        return {"num_data": int(X.shape[0]), "num_classes": self.num_classes,
                "train_log_likelihood": lls}

    def _latent_predictive(self, Xs: torch.Tensor, with_variance: bool = True):
        """Mean and variance of the class functions at ``Xs``: ``(chains, C, m)`` each."""
        raise NotImplementedError

    def _likelihood(self, f: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def predict(self, x: Any, task_id: int | None = None) -> CategoricalPredictive:
        if self.state is None:
            raise NotFittedError(f"{type(self).__name__}.predict before any update()")
        xb = Batch(x).validate(input_dim=self.input_dim, require_targets=False, allow_empty=True)
        Xs = torch.as_tensor(as_numpy(xb.x)).to(self.device, self.dtype)
        g = torch.Generator(device=self.device)
        g.manual_seed(self.config.seed + 104729)
        out = []
        S = self.config.num_predict_samples
        at_mean = self.config.predict == "mean"
        for s in range(0, Xs.shape[0], self.config.predict_chunk):
            mean, var = self._latent_predictive(Xs[s:s + self.config.predict_chunk],
                                                with_variance=not at_mean)  # (ch, C, m)
            if at_mean:
                out.append(self._likelihood(mean).mean(0).T)
                continue
            eps = torch.randn(S, *mean.shape, dtype=self.dtype, device=self.device, generator=g)
            f = mean + var.sqrt() * eps                                    # (S, ch, C, m)
            out.append(self._likelihood(f).mean((0, 1)).T)                 # (m, C)
        if not out:
            return CategoricalPredictive(np.zeros((0, self.num_classes)))
        return CategoricalPredictive(as_numpy(torch.cat(out)).astype(np.float64))

    def state_dict(self) -> dict[str, Any]:
        if self.state is None:
            return {"fitted": False}
        return {"fitted": True, "X": self.X, "y": self.y, "num_updates": self.num_updates,
                "f_trace": self.f_trace,
                "state": {k: v for k, v in self.state._asdict().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._cache = None
        if not state["fitted"]:
            self.X = self.y = self.state = None
            return
        self.X = torch.as_tensor(state["X"]).to(self.device, self.dtype)
        self.y = torch.as_tensor(state["y"]).to(self.device)
        self.num_updates = int(state["num_updates"])
        self.f_trace = torch.as_tensor(state["f_trace"]).to(self.device, self.dtype)
        st = {k: torch.as_tensor(v) for k, v in state["state"].items()}
        st = {k: (v.to(self.device, self.dtype) if v.is_floating_point() else v)
              for k, v in st.items()}
        self.state = self._state_cls(**st)

    def _log_likelihood(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``log p(y_n | f_n)`` of the likelihood the sampler targets, ``f (..., C, n)`` ->
        ``(..., n)``."""
        raise NotImplementedError

    @torch.no_grad()
    def to_inference_data(self):
        """The Gibbs chains of the last update at the training points (all data seen):
        ``posterior.f`` with dims ``(chain, draw, class, obs)`` (every sweep after the prior
        initialization, none removed as warm-up), ``log_likelihood.y`` = ``log p(y_n | f_n)``
        per draw and ``observed_data.y`` (for ``az.loo`` / ``az.compare``), and
        ``sample_stats``: ``log_lik`` (the log likelihood summed over points) and ``lp`` (that plus
        ``sum_c log N(f_c | 0, K)``: the log posterior density of f up to a constant)."""
        from ppl_cl.inference_data import mcmc_attrs, samples_to_inference_data

        if self.state is None:
            raise NotFittedError(f"{type(self).__name__}.to_inference_data before any update()")
        f = self.f_trace.transpose(0, 1)                                   # (ch, S, C, n)
        ll = self._log_likelihood(f, self.y)                               # (ch, S, n)
        L = jitter_cholesky(node_gram(self._params(), self.X), name="K")
        n = self.X.shape[0]
        white = torch.linalg.solve_triangular(L, f.reshape(-1, n).T, upper=False)
        log_prior = (-0.5 * (white ** 2).sum(0) - torch.log(torch.diagonal(L)).sum()
                     - 0.5 * n * np.log(2 * np.pi)).reshape(f.shape[:-1]).sum(-1)
        ll_sum = ll.sum(-1)
        return samples_to_inference_data(
            {"f": as_numpy(f)}, dims={"f": ["class", "obs"], "y": ["obs"]},
            log_likelihood={"y": as_numpy(ll)}, observed_data={"y": as_numpy(self.y)},
            sample_stats={"log_lik": as_numpy(ll_sum),
                          "lp": as_numpy(ll_sum + log_prior)},
            attrs={**mcmc_attrs(f"Polya-Gamma Gibbs ({self.learner_name})",
                                "independent chains from the GP prior, every sweep kept (no "
                                "warm-up removed): r_hat and ESS diagnose the sampler"),
                   "learner": self.learner_name})


class LSMGibbsClassifier(_MulticlassGibbs):
    """Logistic-softmax GP classifier by PG Gibbs (:class:`inference.pg_multiclass.LSMGibbs`)."""

    learner_name = "lsm-gibbs"
    config_cls = LSMConfig

    @property
    def _state_cls(self):
        from inference.pg_multiclass import LSMState
        return LSMState

    def _engine(self):
        return LSMGibbs(num_chains=self.config.num_chains)

    def _latent_predictive(self, Xs, with_variance: bool = True):
        if self._cache is None:
            K = node_gram(self._params(), self.X)
            kappa = 0.5 * (torch.nn.functional.one_hot(self.y, self.num_classes).T.to(self.dtype)
                           - self.state.counts)
            omega = self.state.omega.clamp_min(1e-12)
            self._cache = (K, omega, kappa, gibbs_predictive_cache(K, omega, kappa))
        K, omega, kappa, cache = self._cache
        k = node_kernel(self._params())
        return gibbs_predictive(K, omega, kappa, k(self.X, Xs), k.diag(Xs) + self.config.jitter,
                                cache, with_variance=with_variance)

    def _likelihood(self, f):
        sig = torch.sigmoid(f)
        return sig / sig.sum(-2, keepdim=True)

    def _log_likelihood(self, f, y):
        # logistic-softmax: log sigma(f_y) - log sum_c sigma(f_c)
        ls = torch.nn.functional.logsigmoid(f)                              # (..., C, n)
        idx = y.expand(*f.shape[:-2], 1, -1)
        return ls.gather(-2, idx).squeeze(-2) - torch.logsumexp(ls, dim=-2)


class OVEGibbsClassifier(_MulticlassGibbs):
    """One-vs-each GP classifier by PG Gibbs (:class:`inference.pg_multiclass.OVEGibbs`)."""

    learner_name = "ove-gibbs"
    config_cls = OVEConfig

    @property
    def _state_cls(self):
        from inference.pg_multiclass import OVEState
        return OVEState

    def _engine(self):
        return OVEGibbs(num_chains=self.config.num_chains,
                        max_joint_dim=self.config.max_joint_dim)

    def _latent_predictive(self, Xs, with_variance: bool = True):
        if self._cache is None:
            K = node_gram(self._params(), self.X)
            L = jitter_cholesky(K, name="K")
            alpha = torch.cholesky_solve(self.state.f.reshape(-1, self.X.shape[0]).T, L)  # (n, ch C)
            self._cache = (L, alpha)
        L, alpha = self._cache
        k = node_kernel(self._params())
        K_xs = k(self.X, Xs)
        ch, C = self.state.f.shape[:2]
        mean = (alpha.T @ K_xs).reshape(ch, C, -1)
        if not with_variance:
            return mean, None
        a = torch.linalg.solve_triangular(L, K_xs, upper=False)
        var = (k.diag(Xs) + self.config.jitter - (a * a).sum(0)).clamp_min(0.0)
        return mean, var.expand_as(mean)

    def _likelihood(self, f):
        # prod_{c' != c} sigma(f_c - f_c') for every c: (..., C, m)
        d = f.unsqueeze(-2) - f.unsqueeze(-3)                              # [c, c'] = f_c - f_c'
        ls = torch.nn.functional.logsigmoid(d)
        C = f.shape[-2]
        eye = torch.eye(C, dtype=torch.bool, device=f.device).unsqueeze(-1)
        logp = ls.masked_fill(eye, 0.0).sum(-2)
        p = torch.exp(logp)
        return p / p.sum(-2, keepdim=True)

    def _log_likelihood(self, f, y):
        # the one-vs-each likelihood the sampler targets (Snell & Zemel 2021): the product
        # prod_{c' != y} sigma(f_y - f_c'), a lower bound of the softmax, not normalized over
        # classes (so az.compare with a normalized likelihood favours the other learner)
        idx = y.expand(*f.shape[:-2], 1, -1)
        f_y = f.gather(-2, idx)                                            # (..., 1, n)
        ls = torch.nn.functional.logsigmoid(f_y - f)                       # (..., C, n)
        return ls.sum(-2) - torch.nn.functional.logsigmoid(torch.zeros_like(f_y[..., 0, :]))
