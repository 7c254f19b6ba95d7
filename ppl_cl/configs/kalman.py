"""Settings of the Kalman-filter learners (Titsias et al. 2024) and of
the online-SGD baseline: :class:`KalmanConfig` (:class:`ppl_cl.learners.kalman.KalmanClassifier`),
:class:`KalmanRegressorConfig` (:class:`ppl_cl.learners.kalman.KalmanRegressor`),
:class:`OnlineSGDConfig` (:class:`ppl_cl.learners.online_sgd.OnlineSGDClassifier`), and the
representation they share, :class:`NetworkConfig`.

The defaults are Algorithm 1's (``s2 = 1/K``, ``s_w2 = 1/m``, ``delta_0 = 0``, ``alpha_0 = 1``)
and the paper's App. D settings; an experiment that validated other values holds them in its own
``learner`` field (``ppl_cl.experiments.kalman``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ppl_cl.configs.validate import int_at_least, one_of, positive

__all__ = ["NetworkConfig", "KalmanConfig", "KalmanRegressorConfig", "OnlineSGDConfig"]

#: S, the Monte Carlo samples of the softmax predictive (eqs. 12-13)
MC_SAMPLES = 16

NetworkName = Literal["identity", "mlp", "cnn", "resnet18", "rff"]
Transition = Literal["always", "last", "first"]
Optimizer = Literal["sgd", "adamw"]
DType = Literal["float32", "float64"]








@dataclass(frozen=True)
class NetworkConfig:
    """The representation ``phi(x; theta)`` (Sect. 2; :func:`models.feature_networks.feature_network`).

    Attributes:
        name: ``"identity"`` (phi(x) = x: pre-extracted features, the paper's fixed-backbone
            setting), ``"mlp"``, ``"cnn"``, ``"resnet18"`` (App. D.4's CIFAR backbone) or
            ``"rff"`` (random Fourier features of the SE kernel, Rahimi & Recht 2007: with the
            default prior variance 1/m and no fine-tuning, the regression learner approximates
            the GP with kernel ``exp(-|x - x'|^2 / (2 lengthscale^2))``).
        feature_dim: m, the network's output size (ignored by ``"identity"``).
        hidden: the MLP's hidden layer sizes.
        input_shape: ``(H, W, C)`` of the image networks (inputs arrive flattened); ``None``
            for ``"identity"`` / ``"mlp"``.
        channels: the CNN's conv widths, one avg-pooled block each.
        resnet_width: base width of the ResNet-18 (64 is the standard network).
        lengthscale: the SE kernel's lengthscale of ``"rff"`` (> 0; ignored by the other
            networks; configs saved without it load with 1).
    """

    name: NetworkName = "identity"
    feature_dim: int | None = None
    hidden: tuple[int, ...] = (256,)
    input_shape: tuple[int, ...] | None = None
    channels: tuple[int, ...] = (32, 64)
    resnet_width: int = 64
    lengthscale: float = 1.0

    def __post_init__(self) -> None:
        one_of("network.name", self.name, ("identity", "mlp", "cnn", "resnet18", "rff"))
        if self.name != "identity":
            int_at_least("network.feature_dim", self.feature_dim, 1)
        for name in ("hidden", "channels"):
            for v in getattr(self, name):
                int_at_least(f"network.{name}", v, 1)
        if self.input_shape is not None and (len(self.input_shape) != 3 or
                                             any(not isinstance(v, int) or v < 1
                                                 for v in self.input_shape)):
            raise ValueError(f"network.input_shape: expected (height, width, channels), "
                             f"received {self.input_shape!r}")
        int_at_least("network.resnet_width", self.resnet_width, 1)
        positive("network.lengthscale", self.lengthscale)


@dataclass(frozen=True)
class _KalmanCommon:
    """Fields shared by :class:`KalmanConfig` and :class:`KalmanRegressorConfig`
    (documented there)."""

    input_dim: int | None = None
    network: NetworkConfig = field(default_factory=NetworkConfig)
    feature_bias: bool = False
    feature_normalization: bool = False
    fine_tune: bool = False
    learning_rate: float = 0.01
    backbone_scale: float = 1.0
    optimizer: Optimizer = "sgd"
    weight_decay: float = 1e-4
    learn_forgetting: bool = True
    initial_forgetting: float = 1.0
    forgetting_learning_rate: float = 0.01
    max_delta: float | None = None
    transition: Transition = "always"
    prior_variance: float | None = None
    noise_variance: float | None = None
    replay_capacity: int = 0
    replay_size: int = 10
    block_size: int | None = None
    dtype: DType = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        int_at_least("input_dim", self.input_dim, 1, allow_none=True)
        if not isinstance(self.network, NetworkConfig):
            raise ValueError(f"network: expected a NetworkConfig, received "
                             f"{type(self.network).__name__}")
        g0 = self.initial_forgetting
        if isinstance(g0, bool) or not isinstance(g0, (int, float)) or not (0.0 < g0 <= 1.0):
            raise ValueError(f"initial_forgetting: expected gamma_0 in (0, 1], received {g0!r}")
        one_of("transition", self.transition, ("always", "last", "first"))
        one_of("optimizer", self.optimizer, ("sgd", "adamw"))
        one_of("dtype", self.dtype, ("float32", "float64"))
        for name in ("learning_rate", "backbone_scale", "forgetting_learning_rate"):
            positive(name, getattr(self, name))
        for name in ("prior_variance", "noise_variance", "max_delta"):
            positive(name, getattr(self, name), allow_none=True)
        if not (isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay: expected >= 0, received {self.weight_decay!r}")
        int_at_least("replay_capacity", self.replay_capacity, 0)
        int_at_least("replay_size", self.replay_size, 1)
        int_at_least("block_size", self.block_size, 1, allow_none=True)
        int_at_least("seed", self.seed, 0)


@dataclass(frozen=True)
class KalmanConfig(_KalmanCommon):
    """Online K-way classification with the Kalman filter (Sect. 2.1, Algorithm 1, App. D.2).

    Attributes:
        num_classes: K.
        input_dim: d of the inputs ``(n, d)`` (images flattened); ``None``: from the first
            batch.
        network: the representation (:class:`NetworkConfig`; default identity features).
        feature_bias / feature_normalization: App. D.3 ("use bias", "use normalization":
            divide the network's features by the square root of their dimension).
        fine_tune: train theta on the chunk's predictive log-loss (Sect. 2.1.2); ``False``
            keeps the random (or given) features, the paper's "no backbone finetuning" rows.
        learn_calibration: train alpha of eq. 13 (Sect. 2.1.2).
        initial_calibration: alpha_0 (Sect. 2.1.2 starts from the plain softmax, 1).
        learning_rate: eta, the step size of alpha; theta's is ``backbone_scale * eta``
            (App. D.1, Table 2 grid 0.1 ... 0.0001).
        backbone_scale: beta, the relative backbone-alpha gradient scale (App. D.1).
        optimizer: ``"sgd"`` or ``"adamw"`` with ``weight_decay`` (App. D.3, Table 3; AdamW
            lambda = 1e-4 for CLOC from scratch).
        learn_forgetting: online SGD on delta (Sect. 2.1.1, eq. 9); ``False`` keeps gamma_0.
        initial_forgetting: gamma_0 (Algorithm 1: delta_0 = 0, gamma_0 = 1).
        forgetting_learning_rate: rho, the SGD step of delta (App. D.1 grid 0.5 ... 0.001).
        max_delta: an upper clip of delta (``None``: only ``delta >= 0``, as in Sect. 2.1.1).
        calibrated_forgetting: learn delta on the calibrated eq. 13 (Sect. 2.1.2 replaces the
            softmax of eq. 11 by the calibrated one; the default); ``False``: on eq. 12.
        transition: App. D.2's ``"always"`` (Always Markov) or ``"last"`` (Last Step Markov:
            the transition on the chunk's last point); ``"first"``: the chunk as one time
            step with its transition before the first point (an alternative reading).
        prior_variance: s_w2 (``None``: Algorithm 1's 1/m).
        noise_variance: s2 of the Gaussian surrogate (``None``: Algorithm 1's 1/K).
        num_samples: S, Monte Carlo samples of eqs. 12-13.
        replay_capacity / replay_size: memory of the most recent points (0: no replay) and
            points replayed per chunk (App. D.4: 100 and 10).
        block_size: points per block of the blocked recursion (``None``:
            :func:`inference.kalman.default_block_size`).
        dtype: ``"float32"`` or ``"float64"`` (the learner switches JAX x64 on).
        seed: PRNG seed (network init, Monte Carlo draws, replay draws).
    """

    num_classes: int = 10
    learn_calibration: bool = True
    initial_calibration: float = 1.0
    calibrated_forgetting: bool = True
    num_samples: int = MC_SAMPLES
    #: App. C's mean-preserving transition is the regressor's option; the classifier always
    #: shrinks the mean (a class constant, not a setting)
    mean_preserving: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        int_at_least("num_classes", self.num_classes, 2)
        positive("initial_calibration", self.initial_calibration)
        int_at_least("num_samples", self.num_samples, 1)


@dataclass(frozen=True)
class KalmanRegressorConfig(_KalmanCommon):
    """Online regression with the drift prior and the Kalman filter (eqs. 1-6, App. B, App. C).

    Attributes:
        noise_variance: s2 of eq. 1 (``None``: 1).
        prior_variance: s_w2 (``None``: 1/m).
        mean_preserving: App. C's transition ``m_n^- = m_{n-1}`` (no shrinkage of the mean).
        dtype: ``"float64"`` (regression in double precision).
        The other fields as in :class:`KalmanConfig` (``fine_tune`` trains theta on the
        Gaussian log predictive; regression has no calibration).
    """

    mean_preserving: bool = False
    dtype: DType = "float64"
    #: not settings of the regressor (a Gaussian likelihood has no calibration alpha and a
    #: closed-form predictive): the values its filter runs with, so that both configs name
    #: every option of the filter
    learn_calibration: ClassVar[bool] = False
    calibrated_forgetting: ClassVar[bool] = False
    num_samples: ClassVar[int] = MC_SAMPLES


@dataclass(frozen=True)
class OnlineSGDConfig:
    """The online-SGD baseline of Sect. 4.2 (Bornschein et al. 2022): the same representation
    with a linear softmax head, one SGD step per chunk on its cross-entropy.

    Attributes:
        num_classes: K; input_dim: d (``None``: from the first batch).
        network: the representation (:class:`NetworkConfig`; an MLP 256-256).
        feature_bias / feature_normalization: as in :class:`KalmanConfig`; a bias and raw
            features suit the SGD head.
        learning_rate: the SGD step size of all parameters (0.2: the rate chosen for the MNIST
            streams on their first 3000 points; rates above 0.5 diverged there).
        replay_capacity / replay_size: as in :class:`KalmanConfig` (App. D.4).
        dtype, seed: as in :class:`KalmanConfig`.
    """

    num_classes: int = 10
    input_dim: int | None = None
    network: NetworkConfig = field(default_factory=lambda: NetworkConfig("mlp", 256))
    feature_bias: bool = True
    feature_normalization: bool = False
    learning_rate: float = 0.2
    replay_capacity: int = 0
    replay_size: int = 10
    dtype: DType = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        int_at_least("num_classes", self.num_classes, 2)
        int_at_least("input_dim", self.input_dim, 1, allow_none=True)
        if not isinstance(self.network, NetworkConfig):
            raise ValueError(f"network: expected a NetworkConfig, received "
                             f"{type(self.network).__name__}")
        positive("learning_rate", self.learning_rate)
        int_at_least("replay_capacity", self.replay_capacity, 0)
        int_at_least("replay_size", self.replay_size, 1)
        one_of("dtype", self.dtype, ("float32", "float64"))
        int_at_least("seed", self.seed, 0)
