"""VAR-GP learner (Kapoor, Karaletsos & Bui, ICML 2021): the model and guides of
:mod:`models.vargp` trained task after task by :class:`inference.svi.ContinualSVI`.

``update(task)`` validates the task (and the optional validation batch) first, then trains the
new task's parameters ``Z_t, m_t, L_t`` and ``q_t(theta)`` with the old tasks' parameters frozen
(Algorithm 1 of the paper), and only then commits them to the learner's state. ``predict``
averages the softmax over theta and f samples (App. A.1). The state (all inducing sets and
``q_t(theta)``) is saved and loaded exactly, and every Monte Carlo draw is seeded from the
config, so a run resumed after task t predicts and continues exactly like an uninterrupted one.

Ablations of Sect. 5.3 / App. B.1 are options: ``guide="block_diagonal"``, ``guide="global"``,
``hyperparameters="point"`` (the "MLE hypers" row of Table 1).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from inference.svi import ContinualSVI, SVIConfig
from models.vargp import (GUIDES, HYPERPARAMETER_MODES, MAX_PLATE_NESTING, HyperPosterior,
                          InducingSet, SoftmaxLikelihood, VARGPModel, carry_forward_global_set,
                          init_inducing_set,
                          median_heuristic_theta, posterior_factors, predictive_probabilities,
                          prior_conditional_scale_tril, standard_hyper_prior)
from models.vargp_math import concat_inducing_inputs, f_marginals, task_slices
from ppl_cl.batch import Batch, as_numpy
from ppl_cl.learner import Learner
from ppl_cl.predictive import CategoricalPredictive
from ppl_cl.progress import progress_enabled

__all__ = ["VARGP"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _as_batch(data: Any, name: str) -> Batch:
    if isinstance(data, Batch):
        return data
    if isinstance(data, tuple) and len(data) == 2:
        return Batch(*data)
    raise TypeError(f"{name}: expected a Batch / Task or an (x, y) tuple, received "
                    f"{type(data).__name__}")


class VARGP(Learner):
    """Variational Auto-Regressive GP classifier for continual learning (single head).

    Args:
        num_classes: K (one GP per class, softmax likelihood).
        inducing_per_task: M per task and class (ref: 60 Split MNIST, 100 Permuted MNIST,
            20 toy).
        guide: ``"autoregressive"`` (VAR-GP), ``"block_diagonal"`` or ``"global"`` (ablations).
        hyperparameters: ``"variational"`` (q(theta), prior N(0, I)), ``"point"`` (MLE) or
            ``"fixed"`` (theta stays at its initial value; a diagnostic of forgetting through
            theta, not a Table 1 row).
        beta: tempering of ``KL[q_t(theta) || q_{t-1}(theta)]`` (ref: 10 Split, 1.64 Permuted,
            1 toy).
        learning_rate, batch_size, max_epochs, patience, tolerance: Algorithm 1 (ref: Yogi,
            batch 512, at most 500 epochs, patience 200, tolerance 1e-4).
        restore_best: end a task with the parameters of its best validation epoch (default),
            or, with ``False``, with those of its last epoch, as Algorithm 1 does (it has no
            restore step). Only matters when ``update`` gets a validation batch.
        num_theta_samples: theta draws per ELBO evaluation (ref: 3).
        num_f_samples: f draws per theta draw in the ELBO and in prediction (ref: 10).
        num_predict_samples: theta draws for prediction (App. A.1; ref: 10).
        theta_init: where the mean of q_1(theta) (or the point theta) starts: ``"median"`` —
            log-lengthscales at the log median pairwise distance of the first task's inputs
            (:func:`models.vargp.median_heuristic_theta`; needed on MNIST, where l = 1 makes
            every kernel value vanish), log-variance 0 — or ``"prior"`` (all zeros, the prior
            mean). The prior stays N(0, I) either way. Later tasks start from q_{t-1}(theta).
        theta_init_scale: initial standard deviation of q_1(theta), as a multiple of the prior's
            (1). It matters: with few optimizer steps per task q(theta)'s scale stays near it and
            sets how tightly later tasks hold theta (Split MNIST uses 1e-3, chosen on validation
            data; ``benchmarks/results/vargp_split_mnist_theta_init_scale.md``).
        ard: one lengthscale per input feature (Sect. 4.3: "log-ARD lengthscales"; theta has
            ``D + 1`` entries) or, with ``False``, a single lengthscale (eq. 20 as printed, one
            ``sigma``; theta has 2 entries). The median-heuristic start is the same number for
            every lengthscale, so the two kernels start equal and differ in what can drift.
        per_class_hyperparameters: one theta per class GP instead of one shared theta.
        per_class_inducing_inputs: independent ``Z_t`` per class GP (reference code) or one
            ``Z_t`` shared by the K GPs.
        learn_inducing_inputs: optimize ``Z_t`` (Algorithm 1 does).
        scale_tril_init: initial ``L_t``: ``"prior"`` — the Cholesky factor of the prior
            conditional covariance ``C_t`` at the mean of ``q_{t-1}(theta)`` (identity in
            whitened coordinates) — or ``"identity"`` (the paper's words; equal to "prior" when
            ``K_ZZ = I``, but a huge initial KL when inducing inputs are close; see
            :func:`models.vargp.prior_conditional_scale_tril`).
        global_init: where the single inducing set of ``guide="global"`` starts at task
            ``t > 1``: ``"task"`` — a random subset of task t's inputs with ``q(u_t)`` at the
            prior (Algorithm 1, line 1, as for every other guide) — or ``"previous"`` — a random
            ``round(M (t-1) / t)`` rows of ``Z_{t-1}`` (so every task seen keeps about M / t of
            the M inducing inputs) plus fresh task inputs, with ``q(u_t)`` at the previous
            posterior carried to them (:func:`models.vargp.carry_forward_global_set`; the
            streaming sparse GP of Bui et al. 2017). App. B.1 does not say which.
        jitter: relative jitter on ``K_ZZ`` (None: 1e-5 in float32, 1e-8 in float64).
        optimizer: ``"yogi"`` (paper) or ``"adam"``.
        seed: seeds inducing-point initialization, minibatches and every Monte Carlo draw.
        device: torch device; dtype: ``"float32"`` or ``"float64"``.
        progress: show progress bars (None: when stderr is a terminal / ``PPL_CL_PROGRESS``).
    """

    learner_name = "vargp"

    def __init__(self, num_classes: int, *, inducing_per_task: int = 60,
                 guide: str = "autoregressive", hyperparameters: str = "variational",
                 beta: float = 1.0, learning_rate: float = 3e-3, batch_size: int = 512,
                 max_epochs: int = 500, patience: int = 200, tolerance: float = 1e-4,
                 restore_best: bool = True, num_theta_samples: int = 3, num_f_samples: int = 10,
                 num_predict_samples: int = 10, theta_init: str = "median",
                 theta_init_scale: float = 0.1, ard: bool = True,
                 per_class_hyperparameters: bool = False, per_class_inducing_inputs: bool = True,
                 learn_inducing_inputs: bool = True, scale_tril_init: str = "prior",
                 global_init: str = "task", jitter: float | None = None,
                 optimizer: str = "yogi", seed: int = 0, device: str = "cpu",
                 dtype: str = "float32", progress: bool | None = None):
        if not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
            raise ValueError(f"num_classes: expected an int >= 2, received {num_classes!r}")
        if guide not in GUIDES:
            raise ValueError(f"guide: expected one of {GUIDES}, received {guide!r}")
        if hyperparameters not in HYPERPARAMETER_MODES:
            raise ValueError(f"hyperparameters: expected one of {HYPERPARAMETER_MODES}, "
                             f"received {hyperparameters!r}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(_DTYPES)}, received {dtype!r}")
        for name, value in (("inducing_per_task", inducing_per_task),
                            ("num_theta_samples", num_theta_samples),
                            ("num_f_samples", num_f_samples),
                            ("num_predict_samples", num_predict_samples)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, received {value!r}")
        if theta_init not in ("median", "prior"):
            raise ValueError(f"theta_init: expected 'median' or 'prior', received {theta_init!r}")
        if scale_tril_init not in ("prior", "identity"):
            raise ValueError(f"scale_tril_init: expected 'prior' or 'identity', received "
                             f"{scale_tril_init!r}")
        if global_init not in ("task", "previous"):
            raise ValueError(f"global_init: expected 'task' or 'previous', received "
                             f"{global_init!r}")
        if not theta_init_scale > 0:
            raise ValueError(f"theta_init_scale: expected > 0, received {theta_init_scale}")
        super().__init__(num_classes=int(num_classes), inducing_per_task=int(inducing_per_task),
                         guide=guide, hyperparameters=hyperparameters, beta=float(beta),
                         learning_rate=float(learning_rate), batch_size=int(batch_size),
                         max_epochs=int(max_epochs), patience=int(patience),
                         tolerance=float(tolerance), restore_best=bool(restore_best),
                         num_theta_samples=int(num_theta_samples),
                         num_f_samples=int(num_f_samples),
                         num_predict_samples=int(num_predict_samples),
                         theta_init=theta_init, theta_init_scale=float(theta_init_scale),
                         ard=bool(ard), per_class_hyperparameters=bool(per_class_hyperparameters),
                         per_class_inducing_inputs=bool(per_class_inducing_inputs),
                         learn_inducing_inputs=bool(learn_inducing_inputs),
                         scale_tril_init=scale_tril_init, global_init=global_init,
                         jitter=jitter,
                         optimizer=optimizer, seed=int(seed), device=str(device), dtype=dtype,
                         progress=progress)
        self._svi_config(1)  # validates the engine settings now, not at the first update
        self.num_classes = int(num_classes)
        self.device = torch.device(device)
        self.dtype = _DTYPES[dtype]
        self.jitter = float(jitter) if jitter is not None else (
            1e-5 if self.dtype == torch.float32 else 1e-8)
        self.input_dim: int | None = None
        self.tasks: list[InducingSet] = []
        self.hyper: HyperPosterior | torch.Tensor | None = None
        self.num_updates = 0
        self.history: list[dict[str, Any]] = []

    # -- helpers -------------------------------------------------------------------------------
    def _seed(self, purpose: int, index: int = 0) -> int:
        return (self.config["seed"] * 1_000_003 + purpose * 10_007 + index) % (2**63 - 1)

    def _svi_config(self, task_index: int) -> SVIConfig:
        c = self.config
        progress = c["progress"] if c["progress"] is not None else progress_enabled()
        return SVIConfig(learning_rate=c["learning_rate"], batch_size=c["batch_size"],
                         max_epochs=c["max_epochs"], patience=c["patience"],
                         tolerance=c["tolerance"], optimizer=c["optimizer"],
                         restore_best=c["restore_best"],
                         max_plate_nesting=MAX_PLATE_NESTING, seed=self._seed(1, task_index),
                         progress=bool(progress))

    def _num_hyper_sets(self) -> int:
        return self.num_classes if self.config["per_class_hyperparameters"] else 1

    def _num_lengthscales(self, input_dim: int) -> int:
        return input_dim if self.config["ard"] else 1

    def _initial_hyper(self, x: torch.Tensor) -> HyperPosterior | torch.Tensor:
        if self.hyper is not None:
            return self.hyper
        prior = standard_hyper_prior(self._num_hyper_sets(), self._num_lengthscales(self.input_dim),
                                     self.dtype, self.device)
        loc = prior.loc
        if self.config["theta_init"] == "median":
            loc = median_heuristic_theta(x, self._num_hyper_sets(),
                                         generator=torch.Generator().manual_seed(self._seed(5)),
                                         ard=self.config["ard"])
        if self.config["hyperparameters"] != "variational":
            return loc
        return HyperPosterior(loc, prior.scale * self.config["theta_init_scale"])

    def _prediction_sets(self) -> list[InducingSet]:
        return list(self.tasks)

    def _probs(self, x: torch.Tensor, sets, hyper, seed: int) -> torch.Tensor:
        c = self.config
        return predictive_probabilities(
            x, sets, hyper, guide=c["guide"], jitter=self.jitter,
            num_theta_samples=c["num_predict_samples"], num_f_samples=c["num_f_samples"],
            generator=torch.Generator().manual_seed(seed))

    # -- the protocol --------------------------------------------------------------------------
    def update(self, batch: Batch, validation: Batch | tuple | None = None, *,
               checkpoint: Callable[[dict[str, Any]], None] | None = None,
               checkpoint_every_s: float = 600.0,
               resume: dict[str, Any] | None = None) -> dict[str, Any]:
        """Train on the next task (Algorithm 1); old tasks' parameters stay frozen.

        Args:
            batch: the task's training data (``x (N, D)``, integer labels ``y (N,)`` in
                ``0..K-1``).
            validation: optional held-out batch for early stopping on its accuracy (Algorithm
                1) and, with ``restore_best``, for restoring the best epoch; without it the
                run lasts ``max_epochs`` and keeps the last parameters.
            checkpoint: called during the task, every ``checkpoint_every_s`` seconds at an
                epoch's end, with ``{"task": t, "fit": snapshot}`` (a tree for
                :func:`ppl_cl.persist.save_tree`; see ``inference.svi.ContinualSVI.fit``).
            resume: such a tree, saved while this learner (same config and state) trained
                task ``t``: training continues after the snapshot's epoch and ends as the
                uninterrupted update does.

        Returns:
            ``task``, ``epochs``, ``steps``, ``best_epoch``, ``best_validation``,
            ``stopped_early``, ``final_loss``, ``wall_time_s``, ``seconds_per_epoch``,
            ``epoch_losses``, ``validation`` and where theta ended (``theta_log_variance``,
            ``theta_log_lengthscale_median`` / ``_min`` / ``_max``, ``theta_scale_median``).

        Raises:
            ValueError / TypeError (before any state change) for labels outside the classes,
            a changed feature dimension, an empty task or non-finite inputs;
            ``inference.svi.NonFiniteLossError`` if training diverges (state unchanged).
        """
        batch = _as_batch(batch, "batch")
        K = self.num_classes
        batch.validate(input_dim=self.input_dim, num_classes=K, require_targets=True)
        if validation is not None:
            validation = _as_batch(validation, "validation")
            validation.validate(input_dim=batch.input_dim, num_classes=K, require_targets=True)
        c = self.config
        t = self.num_updates + 1
        if resume is not None and int(resume.get("task", -1)) != t:
            raise ValueError(f"resume: the snapshot was saved during task {resume.get('task')}, "
                             f"this update trains task {t}")
        x, y = batch.torch(self.device, self.dtype)
        input_dim_before = self.input_dim
        self.input_dim = batch.input_dim  # needed by _initial_hyper; restored on failure
        try:
            past = self.tasks[-1:] if c["guide"] == "global" else self.tasks
            hyper_init = self._initial_hyper(x)
            M = c["inducing_per_task"]
            generator = torch.Generator().manual_seed(self._seed(2, t))
            if c["guide"] == "global" and c["global_init"] == "previous" and past:
                init = carry_forward_global_set(
                    x, past[0], _theta_mean(hyper_init), M, keep=round(M * (t - 1) / t),
                    jitter=self.jitter, generator=generator)
            else:
                init = init_inducing_set(x, K, M,
                                         per_class_inputs=c["per_class_inducing_inputs"],
                                         generator=generator)
                if c["scale_tril_init"] == "prior":
                    init = init._replace(scale_tril=prior_conditional_scale_tril(
                        _theta_mean(hyper_init), [] if c["guide"] == "global" else past,
                        init.inducing_inputs, K, self.jitter))
            program = self.program(past, init, hyper_init)
            validate = None
            if validation is not None:
                xv, yv = validation.torch(self.device, self.dtype)
                val_seed = self._seed(3, t)

                def validate() -> float:
                    sets, hyper = program.current_state()
                    probs = self._probs(xv, sets, hyper, val_seed)
                    return float((probs.argmax(-1) == yv).to(torch.float64).mean())

            engine = ContinualSVI(program.model, program.guide, self._svi_config(t))
            result = engine.fit(
                (x, y), validate=validate, desc=f"VAR-GP task {t}",
                checkpoint=None if checkpoint is None else (
                    lambda snap: checkpoint({"task": t, "fit": snap})),
                checkpoint_every_s=checkpoint_every_s,
                resume=None if resume is None else resume["fit"])
        except BaseException:
            self.input_dim = input_dim_before
            raise
        new_set, new_hyper = self._from_params(result.params, init, hyper_init)
        # commit (nothing above touched the state except input_dim)
        self.tasks = [new_set] if c["guide"] == "global" else [*self.tasks, new_set]
        self.hyper = new_hyper
        self.num_updates = t
        record = {"task": t, "num_data": int(x.shape[0]), "epochs": result.epochs,
                  "steps": result.steps, "best_epoch": result.best_epoch,
                  "best_validation": result.best_validation,
                  "stopped_early": result.stopped_early,
                  "final_loss": result.epoch_losses[-1], "wall_time_s": result.wall_time_s,
                  "seconds_per_epoch": result.seconds_per_epoch,
                  "epoch_losses": list(result.epoch_losses),
                  "validation": [v for _, v in result.validation]}
        record.update(_theta_summary(new_hyper))
        self.history.append(record)
        return record

    def program(self, past: list[InducingSet], init: InducingSet,
                hyper_init: HyperPosterior | torch.Tensor) -> VARGPModel:
        """The Pyro program (``model``/``guide``) of a task under this learner's config: frozen
        earlier sets ``past``, the task's starting set ``init`` and hyperparameters
        ``hyper_init``, the prior over theta being the current ``q_{t-1}(theta)`` (Sect. 3)."""
        c = self.config
        return VARGPModel(
            num_classes=self.num_classes, past=past, init=init,
            hyper_prior=self.hyper if isinstance(self.hyper, HyperPosterior) else None,
            hyper_init=hyper_init, guide=c["guide"], hyperparameters=c["hyperparameters"],
            likelihood=SoftmaxLikelihood(c["num_f_samples"]), beta=c["beta"],
            num_theta_samples=c["num_theta_samples"], jitter=self.jitter,
            learn_inducing_inputs=c["learn_inducing_inputs"])

    def _from_params(self, params: dict[str, torch.Tensor], init: InducingSet,
                     hyper_init: HyperPosterior | torch.Tensor
                     ) -> tuple[InducingSet, HyperPosterior | torch.Tensor]:
        Z = params.get("inducing_inputs", init.inducing_inputs)
        new_set = InducingSet(Z, params["inducing_mean"], params["inducing_scale_tril"]).detach()
        if self.config["hyperparameters"] == "fixed":
            return new_set, hyper_init.detach().clone()
        if self.config["hyperparameters"] == "point":
            return new_set, params["theta"].detach().clone()
        return new_set, HyperPosterior(params["theta_loc"], params["theta_scale"]).detach()

    def _check_ready(self) -> None:
        if not self.tasks:
            raise RuntimeError("VARGP: call update() with a task before predict / "
                               "to_inference_data")

    def predict(self, x: Any, task_id: int | None = None) -> CategoricalPredictive:
        """Posterior predictive (App. A.1): softmax averaged over ``num_predict_samples`` theta
        draws and ``num_f_samples`` f draws each (seeded from the config: the same state gives
        the same probabilities). ``task_id`` is ignored (single head)."""
        self._check_ready()
        b = Batch(x).validate(input_dim=self.input_dim, require_targets=False, allow_empty=True)
        xt, _ = b.torch(self.device, self.dtype)
        probs = self._probs(xt, self._prediction_sets(), self.hyper, self._seed(4))
        return CategoricalPredictive(as_numpy(probs).astype(np.float64))

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        hyper: Any = None
        if isinstance(self.hyper, HyperPosterior):
            hyper = {"loc": self.hyper.loc, "scale": self.hyper.scale}
        elif self.hyper is not None:
            hyper = {"theta": self.hyper}
        return {"input_dim": self.input_dim, "num_updates": self.num_updates,
                "tasks": [{"inducing_inputs": s.inducing_inputs, "mean": s.mean,
                           "scale_tril": s.scale_tril} for s in self.tasks],
                "hyper": hyper, "history": self.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def conv(t):
            return torch.as_tensor(as_numpy(t)).to(device=self.device, dtype=self.dtype)

        tasks = [InducingSet(conv(s["inducing_inputs"]), conv(s["mean"]), conv(s["scale_tril"]))
                 for s in state["tasks"]]
        hyper = state["hyper"]
        if hyper is None:
            hyper_val = None
        elif "theta" in hyper:
            hyper_val = conv(hyper["theta"])
        else:
            hyper_val = HyperPosterior(conv(hyper["loc"]), conv(hyper["scale"]))
        point = self.config["hyperparameters"] != "variational"
        if hyper_val is not None and isinstance(hyper_val, HyperPosterior) == point:
            raise ValueError("state: hyperparameters do not match the config "
                             f"(hyperparameters={self.config['hyperparameters']!r})")
        if hyper_val is not None and state["input_dim"] is not None:
            width = _theta_mean(hyper_val).shape[-1]
            expected = self._num_lengthscales(int(state["input_dim"])) + 1
            if width != expected:
                raise ValueError(f"state: theta has {width} entries per set but the config "
                                 f"(ard={self.config['ard']}) expects {expected}")
        self.tasks = tasks
        self.hyper = hyper_val
        self.input_dim = None if state["input_dim"] is None else int(state["input_dim"])
        self.num_updates = int(state["num_updates"])
        self.history = list(state.get("history", []))

    # -- ArviZ ---------------------------------------------------------------------------------
    @torch.no_grad()
    def to_inference_data(self, num_draws: int = 200, x: Any = None, y: Any = None,
                          seed: int = 0, max_elements: int = 2**24):
        """ArviZ export of the current posterior: draws of ``theta ~ q_t(theta)`` (as
        ``log_variance (hyper_set)`` and ``log_lengthscale (hyper_set, feature)``) and, for
        each task ``j``, of the inducing outputs ``u_task{j} (class, inducing)`` from the joint
        q(u_<=t | theta) of eq. 22 (drawn in whitened form, ``u = L v``); the inducing inputs go
        to ``constant_data``. With ``x, y``, ``log_likelihood["y"]`` holds
        ``log p(y_i | theta, u)`` per draw (softmax averaged over ``num_f_samples`` draws of
        ``f | u, theta``), so ``az.loo`` works.

        Returns:
            ``arviz.InferenceData`` with one chain of ``num_draws`` draws.
        """
        from ppl_cl.inference_data import from_nested_dict

        self._check_ready()
        c = self.config
        gen = torch.Generator().manual_seed(int(seed))
        sets = self._prediction_sets()
        Z = concat_inducing_inputs(sets)
        M = Z.shape[-2]
        H = self._num_hyper_sets()
        if isinstance(self.hyper, HyperPosterior):
            eps = torch.randn((num_draws, 1, *self.hyper.loc.shape), generator=gen,
                              dtype=self.dtype).to(self.device)
            theta = self.hyper.loc + self.hyper.scale * eps             # (S, 1, H, D+1)
        else:
            theta = self.hyper.expand(num_draws, 1, *self.hyper.shape)
        xt = yt = None
        if x is not None:
            b = Batch(x, y).validate(input_dim=self.input_dim, num_classes=self.num_classes,
                                     require_targets=y is not None)
            xt, yt = b.torch(self.device, self.dtype)
        K = self.num_classes
        chunk = max(1, max_elements // max(1, K * M * M))
        u_draws, loglik = [], []
        for start in range(0, num_draws, chunk):
            th = theta[start:start + chunk]
            _, L, v_bar, factors = posterior_factors(th, sets, guide=c["guide"],
                                                     jitter=self.jitter)
            v = v_bar.clone()
            for rows, R in factors:
                e = torch.randn((*v_bar.shape[:-1], R.shape[-1], 1), generator=gen,
                                dtype=self.dtype).to(self.device)
                v[..., rows] = v[..., rows] + (R @ e).squeeze(-1)
            u_draws.append((L @ v.unsqueeze(-1)).squeeze(-1)[:, 0])    # (s, K, M)
            if xt is not None and yt is not None:
                f_loc, f_var = f_marginals(th, xt, Z, L, v, [])         # (s, 1, K, n)
                e = torch.randn((th.shape[0], c["num_f_samples"], *f_loc.shape[2:]),
                                generator=gen, dtype=self.dtype).to(self.device)
                p = torch.softmax(f_loc + f_var.sqrt() * e, dim=-2).mean(1)  # (s, K, n)
                loglik.append(p.gather(-2, yt.expand(p.shape[0], 1, -1)).squeeze(-2).log())
        u = torch.cat(u_draws)
        ard = self.config["ard"]
        posterior: dict[str, Any] = {
            "log_variance": as_numpy(theta[:, 0, :, 0])[None],
            "log_lengthscale": as_numpy(theta[:, 0, :, 1:] if ard else theta[:, 0, :, 1])[None]}
        dims: dict[str, list[str]] = {"log_variance": ["hyper_set"],
                                      "log_lengthscale": (["hyper_set", "feature"] if ard
                                                          else ["hyper_set"])}
        constant: dict[str, Any] = {}
        for j, (s, rows) in enumerate(zip(sets, task_slices(sets)), start=1):
            name = f"u_task{j}"
            posterior[name] = as_numpy(u[..., rows])[None]
            dims[name] = ["class", f"inducing_{j}"]
            constant[f"inducing_inputs_task{j}"] = as_numpy(s.inducing_inputs)
            dims[f"inducing_inputs_task{j}"] = ["inducing_class", f"inducing_{j}", "feature"]
        groups: dict[str, Any] = {"posterior": posterior, "constant_data": constant}
        coords: dict[str, Any] = {"hyper_set": np.arange(H), "class": np.arange(K),
                                  "feature": np.arange(self.input_dim)}
        if loglik:
            groups["log_likelihood"] = {"y": as_numpy(torch.cat(loglik))[None]}
            groups["observed_data"] = {"y": as_numpy(yt)}
            dims["y"] = ["obs"]
            coords["obs"] = np.arange(yt.shape[0])
        return from_nested_dict(groups, dims=dims, coords=coords,
                                attrs={"learner": "vargp", "guide": c["guide"],
                                       "hyperparameters": c["hyperparameters"],
                                       "num_tasks": self.num_updates})


def _theta_mean(hyper: HyperPosterior | torch.Tensor) -> torch.Tensor:
    """The mean of q(theta), or the point theta of the MLE ablation."""
    return hyper.loc if isinstance(hyper, HyperPosterior) else hyper


def _theta_summary(hyper: HyperPosterior | torch.Tensor) -> dict[str, float]:
    """Where the (mean of the) log-hyperparameters ended after a task, for the trajectory of
    theta over tasks (Sect. 5.3: MLE hyperparameters "stuck in a local minimum"):
    ``theta_log_variance`` (mean over the hyperparameter sets) and the median / min / max of all
    log-lengthscales; ``theta_scale_median``: median std of q_t(theta) (0 for point theta)."""
    loc = _theta_mean(hyper).detach().to("cpu", torch.float64)
    log_l = loc[..., 1:]
    scale = float(hyper.scale.detach().median()) if isinstance(hyper, HyperPosterior) else 0.0
    return {"theta_log_variance": float(loc[..., 0].mean()),
            "theta_log_lengthscale_median": float(log_l.median()),
            "theta_log_lengthscale_min": float(log_l.min()),
            "theta_log_lengthscale_max": float(log_l.max()),
            "theta_scale_median": scale}
