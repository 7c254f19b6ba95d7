"""Configs of the GP-Tree learner (Achituve et al. 2021) and of its Polya-Gamma baselines.

Light module: stdlib only. Each default names where it comes from: the paper (section) or the
authors' code (IdanAchituve/GP-Tree, file), marked (ref). Where the paper and the code disagree
the paper is followed and the field says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from ppl_cl.configs.validate import check_device_name, int_at_least, one_of, positive

__all__ = ["GPTreeConfig", "SBMGPConfig", "LSMConfig", "OVEConfig"]






@dataclass(frozen=True)
class GPTreeConfig:
    """GP-Tree: a tree of binary PG-augmented GP classifiers (Sect. 3).

    Tree and inference:

    * ``inference``: node inference of the base session: ``"gibbs"`` (Sect. 5.1, Table 1) or
      ``"vi"`` (Sect. 3.2, inducing points; the DKL and FSCIL base session). Novel sessions are
      always fitted by Gibbs (Sect. 3.4).
    * ``tree``: ``"kmeans"`` — divisive 2-means (k-means++) on L2-normalized class prototypes
      (Sect. 3.1); ``"random"`` — a random balanced split ("GP-Tree Rnd.", Table 1);
      ``"chain"`` — the stick-breaking chain in label order (SBM-GP, Fig. 1a).
    * ``kmeans_n_init``: 50 (ref GP_Tree/class_splits.py, ``KMeans(n_init=50,
      random_state=42)``); ``kmeans_seed``: 42 (ref, same line).

    Kernel (RBF or normalized linear on L2-normalized inputs, App. C):

    * ``kernel``: ``"rbf"`` (App. C.2-C.3) or ``"linear"`` (Table 1's grid, App. C.1).
    * ``gibbs_outputscale``: 8 (App. C.3 "fixed output-scale of 8"; ref --gibbs-outputscale).
    * ``vi_outputscale``: 4 (App. C.3 "initial output-scale of 4"; ref --outputscale).
    * ``lengthscale``: 1 (App. C.3; ref --lengthscale / --gibbs-lengthscale).
    * ``gibbs_jitter``: 1e-3 (ref GP_Tree/kernel_class.py default ``jitter_val``).
    * ``vi_jitter``: 1e-2 (ref GP_Tree/gp_model.py, ``OneClassGPModel(jitter_val=1e-2)``).

    Gibbs (Sect. 3.2):

    * ``num_chains``: 30 (ref FSCIL/cub/trainer.py --num-draws 30; App. C.1 used 20 / 10).
    * ``num_steps``: 10 sweeps after the prior initialization (ref --num-steps 10; App. C.1
      used 1 for Table 1).
    * ``predict``: ``"quadrature"`` — ``E[sigma(f*)]`` by Gauss-Hermite (Sect. 3.2) — or
      ``"mean"`` — ``sigma(E f*)``, "a single sample at the expected value location" (App.
      C.1, Table 1). ``quadrature_points``: 20 (GPyTorch's GaussHermiteQuadrature1D default,
      used by the reference).

    VI and DKL (Sect. 3.2-3.3, App. B-C):

    * ``inducing_per_class``: 5 (App. C.3; ref --num-inducing-points 5). Also the number of
      exemplars per base class kept for novel sessions (Sect. 3.4).
    * ``natural_lr``: 0.05 (App. C.2-C.3 "natural gradient ... learning rate of 0.05"; the
      reference trainer's default is 0.1; the paper is followed).
    * ``learning_rate``: 0.01 (App. C.3, CUB "it was set to 0.01"), ``momentum``: 0.9,
      ``weight_decay``: 1e-4 (ref --wd), SGD, ``batch_size``: 128 (App. C.3).
    * ``epochs``: 100 and ``milestones``: (40, 60) with decay 0.1 (App. C.3);
      ``pretrain_epochs``: 20 epochs of cross-entropy with a softmax head before the GP-Tree
      loss (App. C.3, CUB; ref --move-to-gp-epoch 20). Without a backbone the VI nodes train
      their kernel and inducing inputs for ``epochs - pretrain_epochs`` epochs.
    * ``learn_kernel`` / ``learn_inducing``: train output scale, lengthscale and inducing
      inputs by SGD on the per-node weighted negative ELBO (App. C.2; ref --learn-location).
    * ``inducing_kmeans_n_init``: 5 (ref GP_Tree/Learner.py ``_init_Xbar``: KMeans(n_init=5,
      max_iter=200, random_state=42) per class).
    * ``backbone``: ``"none"`` (a GP on the given features), ``"mlp"`` or ``"cnn"`` (28 x 28
      images) — :mod:`models.backbones_torch`; ``hidden``: widths of the MLP's hidden layers;
      ``embedding_dim``: the feature size the GPs see (512 in App. C.3; small here).

    * ``patience``: 0 — no early stopping (the paper trains a fixed number of epochs); > 0
      with a validation batch (``GPTree.update(..., validation=...)``): stop the tree loss
      after that many epochs without a better validation accuracy, keep the best epoch.

    Few-shot class-incremental sessions (Sect. 3.4, App. D.2):

    * ``fscil_tree``: ``"gptree"`` — a new root over the base tree and a sub-tree of all
      novel classes so far (the paper's choice); ``"session"`` — a new root over the tree so
      far and a sub-tree of this session's classes ("Session Tree", Table 4); ``"rebuild"`` —
      the whole tree rebuilt over base exemplars and novel embeddings, all nodes by Gibbs
      ("Rebuild Tree", Table 4).

    Other: ``seed`` (every random choice), ``device``, ``dtype`` ("float64" / "float32"),
    ``predict_chunk`` (test points per prediction block, bounds memory).
    """

    inference: Literal["gibbs", "vi"] = "gibbs"
    tree: Literal["kmeans", "random", "chain"] = "kmeans"
    kmeans_n_init: int = 50
    kmeans_seed: int = 42
    kernel: Literal["rbf", "linear"] = "rbf"
    gibbs_outputscale: float = 8.0
    vi_outputscale: float = 4.0
    lengthscale: float = 1.0
    gibbs_jitter: float = 1e-3
    vi_jitter: float = 1e-2
    num_chains: int = 30
    num_steps: int = 10
    predict: Literal["quadrature", "mean"] = "quadrature"
    quadrature_points: int = 20
    inducing_per_class: int = 5
    natural_lr: float = 0.05
    learning_rate: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-4
    batch_size: int = 128
    epochs: int = 100
    milestones: tuple[int, ...] = (40, 60)
    pretrain_epochs: int = 20
    learn_kernel: bool = True
    learn_inducing: bool = True
    inducing_kmeans_n_init: int = 5
    backbone: Literal["none", "mlp", "cnn"] = "none"
    hidden: tuple[int, ...] = (256, 256)
    embedding_dim: int = 64
    fscil_tree: Literal["gptree", "session", "rebuild"] = "gptree"
    patience: int = 0
    seed: int = 0
    device: str = "cpu"
    dtype: Literal["float64", "float32"] = "float64"
    predict_chunk: int = 2048

    def __post_init__(self) -> None:
        for name in ("milestones", "hidden"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        one_of("inference", self.inference, ("gibbs", "vi"))
        one_of("tree", self.tree, ("kmeans", "random", "chain"))
        one_of("kernel", self.kernel, ("rbf", "linear"))
        one_of("predict", self.predict, ("quadrature", "mean"))
        one_of("backbone", self.backbone, ("none", "mlp", "cnn"))
        one_of("fscil_tree", self.fscil_tree, ("gptree", "session", "rebuild"))
        one_of("dtype", self.dtype, ("float64", "float32"))
        for name in ("kmeans_n_init", "num_chains", "num_steps", "quadrature_points",
                     "inducing_per_class", "batch_size", "epochs", "inducing_kmeans_n_init",
                     "embedding_dim", "predict_chunk"):
            int_at_least(name, getattr(self, name))
        for name in ("gibbs_outputscale", "vi_outputscale", "lengthscale", "gibbs_jitter",
                     "vi_jitter", "learning_rate"):
            positive(name, getattr(self, name))
        if not (0.0 < self.natural_lr <= 1.0):
            raise ValueError(f"natural_lr: expected a value in (0, 1], received {self.natural_lr!r}")
        if not (0.0 <= self.momentum < 1.0):
            raise ValueError(f"momentum: expected a value in [0, 1), received {self.momentum!r}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay: expected >= 0, received {self.weight_decay!r}")
        if not isinstance(self.pretrain_epochs, int) or not 0 <= self.pretrain_epochs < self.epochs:
            raise ValueError(f"pretrain_epochs: expected an int in [0, epochs), received "
                             f"{self.pretrain_epochs!r} (epochs = {self.epochs})")
        if not isinstance(self.patience, int) or isinstance(self.patience, bool) or self.patience < 0:
            raise ValueError(f"patience: expected an int >= 0, received {self.patience!r}")
        if any(not isinstance(h, int) or h < 1 for h in self.hidden):
            raise ValueError(f"hidden: expected positive ints, received {self.hidden!r}")
        if any(not isinstance(m, int) or m < 1 for m in self.milestones):
            raise ValueError(f"milestones: expected positive ints, received {self.milestones!r}")
        if self.backbone != "none" and self.inference != "vi":
            raise ValueError("backbone: a backbone is trained through the VI bound; set "
                             "inference='vi' (Sect. 3.3) or backbone='none'")
        check_device_name(self.device)

    def replace(self, **changes) -> "GPTreeConfig":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class SBMGPConfig(GPTreeConfig):
    """Stick-break multinomial GP (Linderman et al. 2015) with the same PG Gibbs machinery: the
    degenerate chain tree in label order (Sect. 3.1, Fig. 1a), ``tree="chain"`` only. Zero prior
    mean at every node, as the authors' GP-Tree code (Linderman et al. choose the means so that
    the prior over classes is uniform; see :class:`ppl_cl.learners.gp_tree.SBMGP`)."""

    tree: Literal["kmeans", "random", "chain"] = "chain"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tree != "chain":
            raise ValueError(f"tree: SBM-GP is the stick-breaking chain, expected 'chain', "
                             f"received {self.tree!r}")


@dataclass(frozen=True)
class _MulticlassGibbsConfig:
    kernel: Literal["rbf", "linear"] = "rbf"
    outputscale: float = 8.0
    lengthscale: float = 1.0
    jitter: float = 1e-3
    num_chains: int = 20
    num_steps: int = 10
    num_predict_samples: int = 20
    predict: Literal["mc", "mean"] = "mc"
    seed: int = 0
    device: str = "cpu"
    dtype: Literal["float64", "float32"] = "float64"
    predict_chunk: int = 1024

    def __post_init__(self) -> None:
        one_of("kernel", self.kernel, ("rbf", "linear"))
        one_of("predict", self.predict, ("mc", "mean"))
        one_of("dtype", self.dtype, ("float64", "float32"))
        for name in ("num_chains", "num_steps", "num_predict_samples", "predict_chunk"):
            int_at_least(name, getattr(self, name))
        for name in ("outputscale", "lengthscale", "jitter"):
            positive(name, getattr(self, name))


@dataclass(frozen=True)
class LSMConfig(_MulticlassGibbsConfig):
    """Logistic-softmax GP classifier (Galy-Fajou et al. 2020) by Gibbs on its three
    augmentations (lambda Gamma, n Poisson, omega PG); one GP per class.

    Defaults follow GP-Tree's Gibbs nodes so the comparison varies the likelihood only:
    kernel RBF with output scale 8, lengthscale 1, jitter 1e-3 (App. C.3), 20 chains (App.
    C.1 for up to 20 classes), ``num_steps`` 10 sweeps (ref --num-steps), and
    ``num_predict_samples`` f* draws per chain for the Monte Carlo predictive (``predict="mc"``)
    or the likelihood at the predictive mean of f* (``predict="mean"``, "a single sample at the
    expected value location", App. C.1)."""


@dataclass(frozen=True)
class OVEConfig(_MulticlassGibbsConfig):
    """One-vs-each GP classifier (Snell & Zemel 2021) by PG Gibbs; the conditional of all C
    latent functions is one ``C n``-dimensional Gaussian (App. C.1: the paper could run it up to
    10 classes, with 10 chains at 8 classes and 3 at 10). Defaults as :class:`LSMConfig`;
    ``max_joint_dim`` refuses problems whose joint dimension ``C n`` exceeds it (memory)."""

    max_joint_dim: int = 6000

    def __post_init__(self) -> None:
        super().__post_init__()
        int_at_least("max_joint_dim", self.max_joint_dim)
