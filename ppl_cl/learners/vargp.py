"""VAR-GP learner (Kapoor, Karaletsos & Bui, ICML 2021): the model and guides of
:mod:`models.vargp` trained task after task by the SVI engine (:class:`inference.svi.SVI`) in
the run loop (:func:`inference.loop.run_loop`).

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

import math
from typing import Any, Callable

import numpy as np
import torch

from inference.loop import (LoopConfig, NoImprovement, Plateau, run_loop, state_from_tree,
                            state_to_tree)
from inference.svi import SVI
from inference.yogi import YogiConfig
from models.vargp import (MAX_PLATE_NESTING, HyperPosterior, Hyperparameters, InducingSet,
                          PointHyperparameters, median_distance, posterior_factors,
                          predictive_probabilities, task_program)
from models.vargp_math import (concat_inducing_inputs, f_marginals, kernel_theta, mc_softmax,
                               task_slices)
from ppl_cl.batch import Batch, as_numpy
from ppl_cl.configs import CHECKPOINT_EVERY_S
from ppl_cl.configs.vargp import VARGPConfig
from ppl_cl.learner import Learner, check_batch
from ppl_cl.predictive import CategoricalPredictive
from ppl_cl.progress import progress_enabled

__all__ = ["VARGP", "VARGPConfig", "check_torch_device"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def check_torch_device(device: str) -> torch.device:
    """``torch.device(device)``, or a ``ValueError`` with the install hint when this torch
    has no CUDA or sees no such GPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: this torch ({torch.__version__}) sees no CUDA "
                             "device (a CUDA build of torch and a GPU are needed, e.g. "
                             "pip install torch --index-url https://download.pytorch.org/whl/cu126)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r}: torch sees {torch.cuda.device_count()} GPU(s)")
    return dev


def _loop_record(result: Any) -> dict[str, Any]:
    """What a task's run loop did, for :meth:`VARGP.update`'s record."""
    return {"epochs": result.epochs, "steps": result.steps, "best_epoch": result.kept_epoch,
            "best_validation": result.kept_validation, "stopped_early": result.stopped_early,
            "final_loss": result.epoch_losses[-1], "wall_time_s": result.wall_time_s,
            "seconds_per_epoch": result.seconds_per_epoch,
            "epoch_losses": list(result.epoch_losses),
            "validation": [v for _, v in result.validation]}


class VARGP(Learner):
    """Variational Auto-Regressive GP classifier for continual learning (single head).

    Built from a :class:`~ppl_cl.configs.vargp.VARGPConfig` (``VARGP()`` is the validated
    Split MNIST setting; ``VARGP(num_classes=4, beta=1.0)`` replaces fields). Each ``update``
    builds the task's Pyro program (:func:`models.vargp.task_program`), trains it with the SVI
    engine (:class:`inference.svi.SVI`) in the run loop (:func:`inference.loop.run_loop`:
    minibatches, Algorithm 1's early stopping on the validation accuracy, best-or-last epoch),
    and commits the new inducing set and ``q_t(theta)`` only when training succeeded.
    """

    learner_name = "vargp"
    config_cls = VARGPConfig

    def __init__(self, config: VARGPConfig | None = None, /, **overrides: Any):
        super().__init__(config, **overrides)
        c = self.config
        self.num_classes = c.num_classes
        self.device = check_torch_device(c.device)
        self.dtype = _DTYPES[c.dtype]
        self.jitter = float(c.jitter)
        self.input_dim: int | None = None
        self.tasks: list[InducingSet] = []
        self.hyper: Hyperparameters | None = None
        self.num_updates = 0
        self.history: list[dict[str, Any]] = []
        #: the median pairwise distance of the first task's inputs (``theta_start=
        #: "median_distance"``; None before the first update or with the code's start)
        self.start_lengthscale: float | None = None

    # -- helpers -------------------------------------------------------------------------------
    def _seed(self, purpose: int, index: int = 0) -> int:
        return (self.config.seed * 1_000_003 + purpose * 10_007 + index) % (2**63 - 1)

    def _probs(self, x: torch.Tensor, sets, hyper: Hyperparameters, seed: int) -> torch.Tensor:
        c = self.config
        return predictive_probabilities(
            x, sets, hyper, guide=c.guide, jitter=self.jitter, amplitude=c.amplitude,
            num_theta_samples=c.num_predict_samples, num_f_samples=c.num_predict_f_samples,
            generator=torch.Generator().manual_seed(seed))

    def _start_lengthscale(self, x: torch.Tensor) -> float | None:
        """Where the lengthscales start (``config.theta_start``): None for the code's start;
        else the stored median distance, computed from ``x`` (a seeded subset of at most 1000
        rows) at the first update."""
        if self.config.theta_start == "code":
            return None
        if self.start_lengthscale is not None:
            return self.start_lengthscale
        return median_distance(x, generator=torch.Generator().manual_seed(self._seed(6)))

    def program(self, x: torch.Tensor, start_lengthscale: float | None = None):
        """The Pyro program (``model``/``guide``) of the next task on inputs ``x``, from the
        current state (:func:`models.vargp.task_program`); ``start_lengthscale``: where the
        lengthscales start (None: the code's start)."""
        c = self.config
        t = self.num_updates + 1
        return task_program(
            x, self.tasks, self.hyper, num_classes=c.num_classes,
            num_inducing=c.inducing_per_task, guide=c.guide,
            point_hyperparameters=c.hyperparameters == "point", beta=c.beta,
            num_theta_samples=c.num_theta_samples, num_f_samples=c.num_f_samples, ard=c.ard,
            jitter=self.jitter, amplitude=c.amplitude,
            log_lengthscale_init=None if start_lengthscale is None
            else math.log(start_lengthscale),
            inducing_generator=torch.Generator().manual_seed(self._seed(2, t)),
            theta_generator=torch.Generator().manual_seed(self._seed(5, t)))

    # -- the protocol --------------------------------------------------------------------------
    def update(self, batch: Batch, validation: Batch | None = None, *,
               snapshot: Callable[[dict[str, Any]], None] | None = None,
               snapshot_every_s: float = CHECKPOINT_EVERY_S,
               resume: dict[str, Any] | None = None) -> dict[str, Any]:
        """Train on the next task (Algorithm 1); old tasks' parameters stay frozen.

        Args:
            batch: the task's training data (``x (N, D)``, integer labels ``y (N,)`` in
                ``0..K-1``).
            validation: optional held-out batch for early stopping on its accuracy
                (``config.stopping``; the experiments pass the validation images of every
                class seen so far); without it the run lasts ``max_epochs``. The last epoch's
                parameters are kept either way.
            snapshot: called during the task, every ``snapshot_every_s`` seconds at an epoch's
                end, with ``{"task": t, "loop": tree}`` (the run loop's state as a tree for
                :func:`ppl_cl.persist.save_tree`).
            resume: such a tree, saved while this learner (same config and state) trained
                task ``t``: training continues after its epoch and ends as the uninterrupted
                update does.

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
        batch = check_batch(batch)
        K = self.num_classes
        batch.validate(input_dim=self.input_dim, num_classes=K, require_targets=True)
        if validation is not None:
            check_batch(validation, "validation").validate(
                input_dim=batch.input_dim, num_classes=K, require_targets=True)
        c = self.config
        t = self.num_updates + 1
        if resume is not None and int(resume.get("task", -1)) != t:
            raise ValueError(f"resume: the snapshot was saved during task {resume.get('task')}, "
                             f"this update trains task {t}")
        x, y = batch.torch(self.device, self.dtype)
        N = int(x.shape[0])
        start = self._start_lengthscale(x)
        program = self.program(x, start)
        engine = SVI(program.model, program.guide, YogiConfig(learning_rate=c.learning_rate),
                     model_kwargs={"num_data": N}, max_plate_nesting=MAX_PLATE_NESTING,
                     device=self.device)
        seed = self._seed(1, t)
        B = min(N, c.batch_size)
        state = engine.init(seed, x[:B], y[:B])
        validate = None
        if validation is not None and c.stopping != "none":
            validate = self._validator(program, engine, validation, self._seed(3, t),
                                       (x[:B], y[:B]))
        result = run_loop(
            engine, state, (x, y), self._loop_config(seed, t), validate=validate,
            snapshot=None if snapshot is None else (
                lambda ls: snapshot({"task": t, "loop": state_to_tree(ls)})),
            snapshot_every_s=snapshot_every_s,
            resume=None if resume is None else state_from_tree(resume["loop"], state))
        sets, hyper = program.state_from_params(engine.constrained(result.state, x[:B], y[:B]))
        # commit (nothing above touched the state)
        self.tasks = sets if c.guide == "global" else [*self.tasks, sets[-1]]
        self.hyper = hyper
        self.input_dim = batch.input_dim
        self.num_updates = t
        self.start_lengthscale = start
        record = {"task": t, "num_data": N, **_loop_record(result),
                  **_theta_summary(hyper, c.amplitude), "theta_start": c.theta_start,
                  "start_lengthscale": start}
        self.history.append(record)
        return record

    def _validator(self, program: Any, engine: SVI, validation: Batch, val_seed: int,
                   probe: tuple):
        """``validate(state)``: the accuracy on ``validation`` (early stopping), its Monte
        Carlo draws seeded by ``val_seed`` at every call; ``probe``: a minibatch ``(x, y)`` the
        constrained parameters are read with (:meth:`inference.svi.SVI.constrained`)."""
        c = self.config
        xv, yv = validation.torch(self.device, self.dtype)

        def validate(s) -> float:
            return program.accuracy(engine.constrained(s, *probe), xv, yv,
                                    num_theta_samples=c.num_theta_samples,
                                    num_f_samples=c.num_f_samples,
                                    generator=torch.Generator().manual_seed(val_seed))
        return validate

    def _loop_config(self, seed: int, t: int) -> LoopConfig:
        """The run loop of task ``t`` (minibatches, epochs, the stopping rule, progress)."""
        c = self.config
        progress = c.progress if c.progress is not None else progress_enabled()
        stopping = {"code": NoImprovement(c.patience, c.tolerance),
                    "algorithm1": Plateau(c.patience, c.tolerance), "none": None}[c.stopping]
        return LoopConfig(batch_size=c.batch_size, max_epochs=c.max_epochs,
                          validate_every=c.validate_every if c.stopping == "code" else 1,
                          stopping=stopping, keep="last", seed=seed, progress=bool(progress),
                          desc=f"VAR-GP task {t}")

    def predict(self, x: Any, task_id: int | None = None) -> CategoricalPredictive:
        """Posterior predictive (App. A.1): softmax averaged over ``num_predict_samples`` theta
        draws and ``num_predict_f_samples`` f draws each (seeded from the config: the same
        state gives the same probabilities); before the first task, the prior predictive
        (1/K for every class). ``task_id`` is ignored (single head)."""
        b = Batch(x).validate(input_dim=self.input_dim, require_targets=False, allow_empty=True)
        if not self.tasks:
            # the prior predictive: the K class GPs are exchangeable a priori (zero mean, one
            # kernel), so E[softmax(f)] = 1/K for every class
            return CategoricalPredictive(np.full((len(b), self.num_classes),
                                                 1.0 / self.num_classes))
        xt, _ = b.torch(self.device, self.dtype)
        probs = self._probs(xt, self.tasks, self.hyper, self._seed(4))
        return CategoricalPredictive(as_numpy(probs).astype(np.float64))

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        hyper: Any = None
        if isinstance(self.hyper, HyperPosterior):
            hyper = {"loc": self.hyper.loc, "scale": self.hyper.scale}
        elif self.hyper is not None:
            hyper = {"theta": self.hyper.theta}
        return {"input_dim": self.input_dim, "num_updates": self.num_updates,
                "tasks": [{"inducing_inputs": s.inducing_inputs, "mean": s.mean,
                           "scale_tril": s.scale_tril} for s in self.tasks],
                "hyper": hyper, "history": self.history,
                "start_lengthscale": self.start_lengthscale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def conv(t):
            return torch.as_tensor(as_numpy(t)).to(device=self.device, dtype=self.dtype)

        tasks = [InducingSet(conv(s["inducing_inputs"]), conv(s["mean"]), conv(s["scale_tril"]))
                 for s in state["tasks"]]
        saved = state["hyper"]
        hyper: Hyperparameters | None = None
        if saved is not None:
            hyper = PointHyperparameters(conv(saved["theta"])) if "theta" in saved else \
                HyperPosterior(conv(saved["loc"]), conv(saved["scale"]))
            if isinstance(hyper, PointHyperparameters) != (self.config.hyperparameters == "point"):
                raise ValueError("state: hyperparameters do not match the config "
                                 f"(hyperparameters={self.config.hyperparameters!r})")
            if state["input_dim"] is not None:
                width = hyper.mean.shape[-1]
                expected = (int(state["input_dim"]) if self.config.ard else 1) + 1
                if width != expected:
                    raise ValueError(f"state: theta has {width} entries per set but the config "
                                     f"(ard={self.config.ard}) expects {expected}")
        self.tasks = tasks
        self.hyper = hyper
        self.input_dim = None if state["input_dim"] is None else int(state["input_dim"])
        self.num_updates = int(state["num_updates"])
        self.history = list(state.get("history", []))
        start = state.get("start_lengthscale")
        self.start_lengthscale = None if start is None else float(start)

    # -- ArviZ ---------------------------------------------------------------------------------
    @torch.no_grad()
    def to_inference_data(self, num_draws: int = 200, x: Any = None, y: Any = None,
                          seed: int = 0, max_elements: int = 2**24,
                          num_chains: int | None = None):
        """ArviZ export of the current posterior: draws of ``theta ~ q_t(theta)`` (as
        ``log_variance (hyper_set)`` and ``log_lengthscale (hyper_set, feature)``) and, for
        each task ``j``, of the inducing outputs ``u_task{j} (class, inducing)`` from the joint
        q(u_<=t | theta) of eq. 22 (drawn in whitened form, ``u = L v``); the inducing inputs go
        to ``constant_data``. With ``x, y``, ``log_likelihood["y"]`` holds
        ``log p(y_i | theta, u)`` per draw (softmax averaged over ``num_f_samples`` draws of
        ``f | u, theta``), so ``az.loo`` works.

        Returns:
            ``arviz.InferenceData`` of ``num_draws`` independent draws from the variational
            posterior, split into ``num_chains`` chains (default: up to 4 of at least 4 draws;
            the draws do not depend on it).
        """
        from ppl_cl.inference_data import from_nested_dict, iid_attrs, split_chains

        if not self.tasks:
            raise self._not_fitted("to_inference_data")
        c = self.config
        gen = torch.Generator().manual_seed(int(seed))
        sets = self.tasks
        Z = concat_inducing_inputs(sets)
        M = Z.shape[-2]
        theta = kernel_theta(self.hyper.draws(num_draws, gen), c.amplitude).expand(
            num_draws, 1, *self.hyper.mean.shape)
        H = theta.shape[-2]
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
            _, L, v_bar, factors = posterior_factors(th, sets, guide=c.guide, jitter=self.jitter)
            v = v_bar.clone()
            for rows, R in factors:
                e = torch.randn((*v_bar.shape[:-1], R.shape[-1], 1), generator=gen,
                                dtype=self.dtype).to(self.device)
                v[..., rows] = v[..., rows] + (R @ e).squeeze(-1)
            u_draws.append((L @ v.unsqueeze(-1)).squeeze(-1)[:, 0])    # (s, K, M)
            if xt is not None and yt is not None:
                f_loc, f_var = f_marginals(th, xt, Z, L, v, [])         # (s, 1, K, n)
                p = mc_softmax(f_loc, f_var, c.num_f_samples, gen)      # (s, K, n)
                loglik.append(p.gather(-2, yt.expand(p.shape[0], 1, -1)).squeeze(-2).log())
        u = torch.cat(u_draws)
        ard = c.ard
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
        groups: dict[str, Any] = {"posterior": split_chains(posterior, num_chains),
                                  "constant_data": constant}
        coords: dict[str, Any] = {"hyper_set": np.arange(H), "class": np.arange(K),
                                  "feature": np.arange(self.input_dim)}
        if loglik:
            groups["log_likelihood"] = split_chains({"y": as_numpy(torch.cat(loglik))[None]},
                                                    num_chains)
            groups["observed_data"] = {"y": as_numpy(yt)}
            dims["y"] = ["obs"]
            coords["obs"] = np.arange(yt.shape[0])
        return from_nested_dict(groups, dims=dims, coords=coords,
                                attrs={**iid_attrs("variational q(theta) q(u | theta) (eq. 22)"),
                                       "learner": "vargp", "guide": c.guide,
                                       "hyperparameters": c.hyperparameters,
                                       "num_tasks": self.num_updates})


def _theta_summary(hyper: Hyperparameters, amplitude: str) -> dict[str, float]:
    """Where the (mean of the) log-hyperparameters ended after a task, for the trajectory of
    theta over tasks (Sect. 5.3: MLE hyperparameters "stuck in a local minimum"):
    ``theta_log_variance`` (mean over the hyperparameter sets) and the median / min / max of all
    log-lengthscales; ``theta_scale_median``: median std of q_t(theta) (0 for point theta).
    ``theta_log_variance`` is the kernel's log variance (:func:`models.vargp_math.kernel_theta`)."""
    loc = kernel_theta(hyper.mean.detach(), amplitude).to("cpu", torch.float64)
    log_l = loc[..., 1:]
    return {"theta_log_variance": float(loc[..., 0].mean()),
            "theta_log_lengthscale_median": float(log_l.median()),
            "theta_log_lengthscale_min": float(log_l.min()),
            "theta_log_lengthscale_max": float(log_l.max()),
            "theta_scale_median": float(hyper.scale.detach().median())}
