"""One stream, several methods: ``ppl-cl compare STREAM`` (docs/compare.md).

Every learner shares one protocol (:mod:`ppl_cl.learner`), so one stream can be fed to several
of them and scored by the same metrics. Each stream registers an experiment
``compare-<stream>`` (config :class:`CompareConfig`); ``ppl-cl compare`` runs it for one or
more seeds and writes the registry's run folder: ``config.json``, ``metrics.json`` (a flat
summary keyed ``<metric>_<learner>``), one figure of curves per learner over the stream's
units, ``curves.json`` and ``report.md`` with the table.

The protocol (the same for every learner of a stream's kind):

* the stream is a list of *units* (tasks, class-incremental sessions, sorted batches, the
  tasks of an online stream), each with training points and a test set;
* a learner is fed either whole units (``feed="task"``: VAR-GP, GP-Tree, the GPs, the online
  sparse GPs, GP-ELLA) or each unit in chunks of ``chunk_size`` points (``feed="chunks"``: the
  Kalman filters and online SGD, which learn one chunk at a time); an *online* stream (the
  Kalman OCL MNIST streams) admits only chunk learners;
* prequential scoring (Kalman OCL Sect. 4.2, eq. 14): every training point is predicted
  before the learner has seen it (the unit, or the chunk, is predicted before its update);
  this gives the average online accuracy and the cumulative log-loss (classification) and
  the online NLPD (regression; not on the multi-task streams, where every unit is a task
  the task-aware learners have no predictive for before its data). A learner that cannot
  predict before any data (GP-Tree builds its tree from the first classes) scores its first
  unit with the uniform
  distribution, and a learner whose predictive covers only the classes it has seen is mixed
  with :data:`SMOOTHING` of the uniform over all classes for these scores (an unseen class
  costs log(K / 0.001) nats, not infinity);
* after each unit the test sets of the units seen so far are scored: the accuracy matrix
  ``R[i, j]`` (final average accuracy, forgetting; VAR-GP Sect. 5) and, at the end, the
  expected calibration error of the pooled test predictions (15 bins); for regression the
  RMSE and NLPD on the pooled test points of the units so far (VIPS Sect. 5), and M, the
  inducing points, where the learner has them;
* ``wall_time_s``: seconds in the learner's ``update`` and ``predict`` calls, the test-set
  scoring included (a learner may defer its fit to the first prediction, as the shared GP).

A learner that cannot take a stream's protocol is listed in ``metrics.json``
(``not_applicable``) and ``report.md`` with the reason, never skipped silently.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from ppl_cl.batch import Batch, as_numpy
from ppl_cl.configs.validate import check_ints, check_positive
from ppl_cl.data.streams import Stream, Unit, class_units
from ppl_cl.experiments.base import RunContext, register
from ppl_cl.learners import learner_class

__all__ = ["CompareConfig", "Stream", "STREAMS", "COMPARE_LEARNERS", "CompareLearner",
           "build_stream", "not_applicable", "run_learner", "compare_stream", "report_markdown",
           "aggregate_seeds"]


@dataclass(frozen=True)
class CompareConfig:
    """What ``compare-<stream>`` runs.

    Attributes:
        learners: the learners to run (names of :data:`COMPARE_LEARNERS`); empty: every
            learner of the stream's kind.
        n_train: training points per unit (per class for the class-split streams; per unit
            otherwise); 0: the stream's default size (docs/compare.md).
        n_test: test points per unit (per class for the class-split streams); 0: default.
        n_units: units kept (tasks, sessions, batches); 0: all of the stream's.
        chunk_size: points per chunk of the chunk learners (Kalman OCL Sect. 4.2: 10).
        vargp_max_epochs: VAR-GP's epochs per task (no validation set, so no early
            stopping), with the small-budget settings of
            :data:`ppl_cl.configs.vargp.SMALL_BUDGET` (the streams are hundreds of points per
            task, far from the paper's protocol); its other settings are the learner's.
        vargp_inducing: VAR-GP's inducing points per class and task (0: the learner's 60);
            its cost grows with K x M x tasks (26 letters: 1560 points per task at 60).
        gibbs_steps, gibbs_chains: GP-Tree's Gibbs sweeps and parallel chains per node.
        exact_max_train: the exact GP refits on at most this many of the points seen
            (a random subset; exact GPs are cubic); 0: all.
        fixed_m: M of the fixed-M online sparse GP (Bui et al. 2017).
        rff_features: random Fourier features of the Kalman regressors.
        rff_lengthscale: their SE lengthscale; 0: the median distance of the first unit's
            inputs (a heuristic: a GP fits its lengthscale, the filter's features stay fixed).
    """

    learners: tuple[str, ...] = ()
    n_train: int = 0
    n_test: int = 0
    n_units: int = 0
    chunk_size: int = 10
    vargp_max_epochs: int = 40
    vargp_inducing: int = 0
    gibbs_steps: int = 10
    gibbs_chains: int = 30
    exact_max_train: int = 2000
    fixed_m: int = 100
    rff_features: int = 500
    rff_lengthscale: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.learners, (list, str)):
            value = [self.learners] if isinstance(self.learners, str) else self.learners
            object.__setattr__(self, "learners", tuple(value))
        bad = [n for n in self.learners if n not in COMPARE_LEARNERS]
        if bad:
            raise ValueError(f"learners: unknown {bad}; known: {sorted(COMPARE_LEARNERS)}")
        check_ints(self, "n_train", "n_test", "n_units", "exact_max_train", "vargp_inducing",
                   minimum=0)
        check_positive(self, "rff_lengthscale", allow_zero=True)
        check_ints(self, "chunk_size", "vargp_max_epochs", "gibbs_steps", "gibbs_chains",
                   "fixed_m", "rff_features")


# ---------------------------------------------------------------------------------------------
# streams
# ---------------------------------------------------------------------------------------------
def _mnist(data_dir):
    from ppl_cl.data.loaders import load_mnist

    xtr, ytr = load_mnist("train", data_dir=data_dir)
    xte, yte = load_mnist("test", data_dir=data_dir)
    return xtr, ytr, xte, yte


def _split(name: str, loader, per_class: tuple[int, int]):
    def build(c: CompareConfig, seed: int, data_dir) -> Stream:
        from ppl_cl.data.streams import SPLIT_MNIST_CLASS_GROUPS

        n_tr, n_te = c.n_train or per_class[0], c.n_test or per_class[1]
        groups = SPLIT_MNIST_CLASS_GROUPS[: c.n_units or None]
        units = class_units(*loader(data_dir, seed), groups, n_tr, n_te, seed)
        n_x = sum(len(u.train) for u in units)
        n_y = sum(len(u.test) for u in units)
        return Stream(name, "classification", units, 10, new_classes=True,
                      size=f"{len(units)} tasks of 2 classes, {n_x} training and {n_y} test "
                           f"images in all")
    return build


def _digits(data_dir, seed):
    from ppl_cl.data.loaders import load_digits
    from ppl_cl.data.streams import validation_split

    x, y = load_digits()
    (xtr, ytr), (xte, yte) = validation_split(x, y, 540, seed=seed)
    return xtr, ytr, xte, yte


def _permuted(c: CompareConfig, seed: int, data_dir) -> Stream:
    from ppl_cl.data.streams import permuted_tasks

    xtr, ytr, xte, yte = _mnist(data_dir)
    n_tasks = c.n_units or 5
    n_tr, n_te = c.n_train or 1000, c.n_test or 500
    rng = np.random.default_rng(seed)
    units = []
    for t in permuted_tasks(xtr, ytr, xte, yte, n_tasks=n_tasks, seed=seed):
        i = rng.permutation(len(t.train))[:n_tr]
        j = rng.permutation(len(t.test))[:n_te]
        units.append(Unit(Batch(np.asarray(t.train.x)[i].astype(np.float32),
                                np.asarray(t.train.y)[i]),
                          Batch(np.asarray(t.test.x)[j].astype(np.float32),
                                np.asarray(t.test.y)[j])))
    return Stream("permuted-mnist", "classification", units, 10,
                  size=f"{n_tasks} permutations, {n_tr} training and {n_te} test images each")


def _letter(c: CompareConfig, seed: int, data_dir) -> Stream:
    from ppl_cl.experiments.gp_tree import letter_split

    xtr, ytr, xte, yte = letter_split(data_dir)
    groups = [tuple(range(10))] + [tuple(range(10 + 4 * s, 14 + 4 * s)) for s in range(4)]
    groups = groups[: c.n_units or None]
    n_tr, n_te = c.n_train or 100, c.n_test or 100
    units = class_units(xtr, ytr, xte, yte, groups, n_tr, n_te, seed)
    return Stream("letter-sessions", "classification", units, 26, new_classes=True,
                  size=f"a base session of 10 letters and {len(groups) - 1} sessions of 4 new "
                       f"letters; <= {n_tr} training and <= {n_te} test rows per letter")


def _kalman_mnist(stationary: bool):
    def build(c: CompareConfig, seed: int, data_dir) -> Stream:
        xtr, ytr, xte, yte = _mnist(data_dir)
        n = c.n_train or 10000
        n_te = c.n_test or 2000
        rng = np.random.default_rng(seed)
        xtr, xte = xtr.astype(np.float32), xte.astype(np.float32)
        if stationary:
            i = rng.permutation(len(ytr))[:n]
            j = rng.permutation(len(yte))[:n_te]
            units = [Unit(Batch(xtr[i], ytr[i]), Batch(xte[j], yte[j]))]
            size = f"{n} shuffled training images in chunks of {c.chunk_size}; {n_te} test"
        else:
            groups = [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)][: c.n_units or None]
            units = []
            for g in groups:
                i = rng.permutation(np.flatnonzero(np.isin(ytr, g)))[: n // 5]
                j = rng.permutation(np.flatnonzero(np.isin(yte, g)))[: n_te // 5]
                units.append(Unit(Batch(xtr[i], ytr[i]), Batch(xte[j], yte[j])))
            size = (f"{len(groups)} class-pair tasks of {n // 5} images in order, chunks of "
                    f"{c.chunk_size}; {n_te // 5} test images per task")
        return Stream("kalman-mnist-" + ("stationary" if stationary else "nonstationary"),
                      "classification", units, 10, online=True, size=size)
    return build


def _uci(name: str):
    def build(c: CompareConfig, seed: int, data_dir) -> Stream:
        from ppl_cl.data.standardize import zscore
        from ppl_cl.data.streams import uci_stream
        from ppl_cl.experiments.vips import DEFAULT_FOLDS, load_uci_full

        x, y = load_uci_full(name, data_dir)
        n_batches = 20
        folds = uci_stream(zscore(x), zscore(y), n_batches, DEFAULT_FOLDS.get(name, 5), seed=seed)
        train, test = folds[0]
        keep = c.n_units or n_batches
        units = [Unit(Batch(*train[i]), Batch(*test[i])) for i in range(keep)]
        return Stream(f"uci-{name}", "regression", units,
                      size=f"the first {keep} of {n_batches} batches sorted by the first input "
                           f"(VIPS Sect. 5.2), fold 0")
    return build


def _multitask(name: str):
    def build(c: CompareConfig, seed: int, data_dir) -> Stream:
        from ppl_cl.data.standardize import split_and_center

        if name == "schools":
            from ppl_cl.data.loaders import load_schools
            tasks = load_schools(data_dir=data_dir)
        elif name == "parkinsons":
            from ppl_cl.data.loaders import load_parkinsons
            tasks = load_parkinsons("motor", data_dir=data_dir)
        else:
            from ppl_cl.data.synthetic import ella_linear_tasks
            tasks = ella_linear_tasks(n_tasks=12, n_per_task=40, dim=5, n_latent=3,
                                      seed=seed).tasks
        rng = np.random.default_rng(seed)
        data = split_and_center(tasks, rng)
        order = rng.permutation(len(data))[: c.n_units or (40 if name == "schools" else None)]
        units = [Unit(Batch(data[t][0], data[t][1], task_id=int(t)),
                      Batch(data[t][2], data[t][3], task_id=int(t)), int(t)) for t in order]
        return Stream(name, "regression", units, multitask=True,
                      size=f"{len(units)} of {len(data)} tasks in a random order, a 50/50 split "
                           f"per task (GP-ELLA Sect. 5.2)")
    return build


def _synthetic_regression(c: CompareConfig, seed: int, data_dir) -> Stream:
    from ppl_cl.data.streams import uci_stream
    from ppl_cl.data.synthetic import vips_d1

    x, y = vips_d1(seed)
    n_batches = c.n_units or 5
    train, test = uci_stream(x, y, n_batches, 1, seed=seed)[0]
    units = [Unit(Batch(*train[i]), Batch(*test[i])) for i in range(n_batches)]
    return Stream("synthetic-regression", "regression", units,
                  size=f"VIPS D1 (500 points on [0, 10]) in {n_batches} sorted batches, 80/20")


#: stream name -> (builder, description)
STREAMS: dict[str, tuple[Callable[[CompareConfig, int, Any], Stream], str]] = {
    "split-mnist": (_split("split-mnist", lambda d, s: _mnist(d), (1000, 500)),
                    "Split MNIST, 5 digit-pair tasks, single head"),
    "split-digits": (_split("split-digits", _digits, (0, 0)),
                     "the Split-MNIST protocol on scikit-learn's 8x8 digits (always available)"),
    "permuted-mnist": (_permuted, "Permuted MNIST (pixel permutations, 10 classes per task)"),
    "letter-sessions": (_letter, "UCI letter, class-incremental sessions (10 + 4 x 4 letters)"),
    "kalman-mnist-stationary": (_kalman_mnist(True),
                                "MNIST online stream, shuffled (Kalman OCL Sect. 4.2)"),
    "kalman-mnist-nonstationary": (_kalman_mnist(False),
                                   "MNIST online stream, 5 class-pair tasks in order"),
    "uci-concrete": (_uci("concrete"), "UCI concrete, sorted batches (VIPS Table 1)"),
    "uci-kin8nm": (_uci("kin8nm"), "UCI kin8nm, sorted batches (VIPS Table 1)"),
    "uci-skillcraft": (_uci("skillcraft"), "UCI skillcraft, sorted batches (VIPS Table 1)"),
    "schools": (_multitask("schools"), "London schools, one task per school (GP-ELLA Sect. 5)"),
    "parkinsons": (_multitask("parkinsons"),
                   "Parkinson's telemonitoring, motor UPDRS, one task per patient"),
    "synthetic-regression": (_synthetic_regression,
                             "VIPS D1 in sorted batches (generated, always available)"),
    "synthetic-multitask": (_multitask("synthetic"),
                            "12 linear factorized tasks (GP-ELLA Sect. 5.1, generated)"),
}

#: quick sizes of each stream (``--quick``): minutes on the 2-core CPU
QUICK: dict[str, dict[str, Any]] = {
    "split-mnist": {"n_train": 100, "n_test": 100, "vargp_max_epochs": 20, "gibbs_steps": 3,
                    "gibbs_chains": 10},
    "split-digits": {"vargp_max_epochs": 20, "gibbs_steps": 3, "gibbs_chains": 10},
    "permuted-mnist": {"n_units": 3, "n_train": 300, "n_test": 200, "vargp_max_epochs": 20},
    "letter-sessions": {"n_train": 40, "n_test": 40, "gibbs_steps": 3, "gibbs_chains": 10,
                        "vargp_max_epochs": 20, "vargp_inducing": 10},
    "kalman-mnist-stationary": {"n_train": 1000, "n_test": 500},
    "kalman-mnist-nonstationary": {"n_train": 1000, "n_test": 500},
    "uci-concrete": {"n_units": 4},
    "uci-kin8nm": {"n_units": 2},
    "uci-skillcraft": {"n_units": 4},
    "schools": {"n_units": 8},
    "parkinsons": {"n_units": 8},
    "synthetic-regression": {},
    "synthetic-multitask": {"n_units": 6},
}


def build_stream(name: str, config: CompareConfig, seed: int = 0, data_dir=None) -> Stream:
    """The stream ``name`` at ``config``'s sizes (``seed``: subsamples, splits, task order)."""
    if name not in STREAMS:
        raise ValueError(f"stream: unknown {name!r}; known: {', '.join(STREAMS)}")
    return STREAMS[name][0](config, seed, data_dir)


# ---------------------------------------------------------------------------------------------
# learners
# ---------------------------------------------------------------------------------------------
class CompareLearner(NamedTuple):
    """How ``ppl-cl compare`` builds and feeds one of its learners.

    ``learner`` is the name of the learner's class in the one learner registry,
    :data:`ppl_cl.learners.LEARNERS` (the name its checkpoints record); ``make`` builds it with
    the comparison's settings. Several entries may share one class (the online sparse GP's
    selection rules, the Kalman regressor with and without a learned drift)."""

    learner: str                    # a name of ppl_cl.learners.LEARNERS
    kind: str                       # "classification" / "regression"
    feed: str                       # "task" or "chunks"
    make: Callable[[Stream, CompareConfig, int, str], Any]
    label: str
    task_aware: bool = False        # needs task ids (multi-task learners)


def _vargp(s: Stream, c: CompareConfig, seed: int, device: str):
    from ppl_cl.configs.vargp import SMALL_BUDGET

    VARGP = learner_class("vargp")
    extra = {"inducing_per_task": c.vargp_inducing} if c.vargp_inducing else {}
    return VARGP(num_classes=s.num_classes, max_epochs=c.vargp_max_epochs, stopping="none",
                 **SMALL_BUDGET,
                 seed=seed, device=device, progress=False, **extra)


def _gptree(s: Stream, c: CompareConfig, seed: int, device: str):
    return learner_class("gp-tree")(num_steps=c.gibbs_steps, num_chains=c.gibbs_chains,
                                    seed=seed, device=device)


def label_shift(s: Stream) -> bool:
    """Whether the stream's units change the label distribution: some unit holds only some of
    the classes (class-incremental tasks, class pairs in order), not every class."""
    every = set(range(s.num_classes))
    return any(set(np.unique(np.asarray(u.train.y)).tolist()) != every for u in s.units)


def _kalman_config(s: Stream, seed: int):
    """Kalman OCL's best MNIST row (learned gamma, fine-tuning + replay) with the Table 3
    settings of the stream's kind: the non-stationary ones (Always Markov, a bias feature)
    where the units shift the labels (:func:`label_shift`), the stationary ones (Last Step
    Markov, no bias) where every unit holds every class (Permuted MNIST, a shuffled stream).
    The bias feature is a per-class intercept: with normalized features it carries most of
    the prior variance of the logits (about 92 % on MNIST, s_w2 against s_w2 |phi|^2 / m), so
    with a learned drift the filter explains each chunk by moving the intercepts and forgets
    the features (docs/compare.md); that tracks a shift of the labels and fails where there
    is none."""
    from ppl_cl.experiments.kalman import KalmanOnlineMnistConfig, kalman_row

    stream = "nonstationary" if label_shift(s) else "stationary"
    return kalman_row(KalmanOnlineMnistConfig(), stream, "learned", "replay",
                       num_classes=s.num_classes, input_dim=s.input_dim, seed=seed)


def _kalman(s: Stream, c: CompareConfig, seed: int, device: str):
    return learner_class("kalman-classifier")(_kalman_config(s, seed))


def _sgd(s: Stream, c: CompareConfig, seed: int, device: str):
    from ppl_cl.experiments.kalman import mnist_sgd_config

    return learner_class("online-sgd-classifier")(dataclasses.replace(
        mnist_sgd_config(), num_classes=s.num_classes, input_dim=s.input_dim, seed=seed))


def _exact(s: Stream, c: CompareConfig, seed: int, device: str):
    return _Capped(learner_class("exact-gp")(kernel="se"), c.exact_max_train, seed)


def _online_sgpr(policy: str):
    def make(s: Stream, c: CompareConfig, seed: int, device: str):
        from ppl_cl.configs.vips import UCI_OIPS_RHO

        extra = {"fixed_m": c.fixed_m} if policy == "fixed" else {}
        return learner_class("online-sgpr")(policy=policy, oips_rho=UCI_OIPS_RHO, seed=seed,
                                            **extra)
    return make


def _gp_ella(s: Stream, c: CompareConfig, seed: int, device: str):
    return learner_class("gp-ella")(seed=seed)


def _individual(s: Stream, c: CompareConfig, seed: int, device: str):
    return learner_class("gp-ella-individual-gps")()


def _shared(s: Stream, c: CompareConfig, seed: int, device: str):
    extra = {"max_train": c.exact_max_train} if c.exact_max_train else {}
    return learner_class("gp-ella-shared-gp")(seed=seed, **extra)


def median_distance(x: np.ndarray, max_points: int = 1000, seed: int = 0) -> float:
    """The median pairwise Euclidean distance of (at most ``max_points`` random rows of)
    ``x``: the lengthscale heuristic of the random-feature learners."""
    from scipy.spatial.distance import pdist

    x = np.asarray(x, dtype=np.float64)
    if x.shape[0] > max_points:
        x = x[np.random.default_rng(seed).choice(x.shape[0], max_points, replace=False)]
    d = pdist(x)
    d = d[d > 0]
    return float(np.median(d)) if d.size else 1.0


def _kalman_rff(drift: bool):
    def make(s: Stream, c: CompareConfig, seed: int, device: str):
        from ppl_cl.configs.kalman import NetworkConfig
        KalmanRegressor = learner_class("kalman-regressor")
        # the SE lengthscale of the features: given, or the median distance of the first
        # unit's inputs (inputs only: the prequential scores stay honest)
        ell = c.rff_lengthscale or median_distance(np.asarray(s.units[0].train.x), seed=seed)
        # signal and noise on the scale of the targets (the GPs fit theirs): the variance of
        # the first unit's targets, signal s2 (prior s2 / m), noise 0.1 s2
        s2 = float(np.var(np.asarray(s.units[0].train.y, np.float64))) or 1.0
        return KalmanRegressor(network=NetworkConfig("rff", c.rff_features, lengthscale=ell),
                               input_dim=s.input_dim, noise_variance=0.1 * s2,
                               prior_variance=s2 / c.rff_features, learn_forgetting=drift,
                               seed=seed)
    return make


#: compare name -> how it is built and fed; each names its class in ppl_cl.learners.LEARNERS
COMPARE_LEARNERS: dict[str, CompareLearner] = {
    "vargp": CompareLearner("vargp", "classification", "task", _vargp, "VAR-GP"),
    "gp-tree": CompareLearner("gp-tree", "classification", "task", _gptree, "GP-Tree (Gibbs)"),
    "kalman": CompareLearner("kalman-classifier", "classification", "chunks", _kalman,
                             "Kalman OCL (learned gamma, fine-tuning + replay)"),
    "online-sgd": CompareLearner("online-sgd-classifier", "classification", "chunks", _sgd,
                                 "online SGD + replay"),
    "exact-gp": CompareLearner("exact-gp", "regression", "task", _exact,
                               "exact GP (refit on all seen)"),
    "vips": CompareLearner("online-sgpr", "regression", "task", _online_sgpr("vips"),
                           "online SGPR, VIPS"),
    "cv": CompareLearner("online-sgpr", "regression", "task", _online_sgpr("cv"),
                         "online SGPR, Conditional Var."),
    "oips": CompareLearner("online-sgpr", "regression", "task", _online_sgpr("oips"),
                           "online SGPR, OIPS"),
    "fixed-m": CompareLearner("online-sgpr", "regression", "task", _online_sgpr("fixed"),
                              "online SGPR, fixed M"),
    "gp-ella": CompareLearner("gp-ella", "regression", "task", _gp_ella, "GP-ELLA",
                              task_aware=True),
    "individual-gps": CompareLearner("gp-ella-individual-gps", "regression", "task",
                                     _individual, "individual GPs", task_aware=True),
    "shared-gp": CompareLearner("gp-ella-shared-gp", "regression", "task", _shared,
                                "shared GP", task_aware=True),
    "kalman-rff": CompareLearner("kalman-regressor", "regression", "chunks", _kalman_rff(False),
                                 "Kalman regressor on RFF, gamma = 1"),
    "kalman-rff-drift": CompareLearner("kalman-regressor", "regression", "chunks",
                                       _kalman_rff(True),
                                       "Kalman regressor on RFF, learned gamma"),
}


class _Capped:
    """An exact GP that refits on at most ``cap`` random points of all it has seen (its
    ``update`` gets the whole subsample each time; the cap keeps the cubic cost bounded)."""

    def __init__(self, gp, cap: int, seed: int):
        self.gp, self.cap, self.rng = gp, cap, np.random.default_rng(seed)
        self.x, self.y = [], []

    def update(self, batch: Batch) -> dict:
        x = np.concatenate(self.x + [np.asarray(as_numpy(batch.x), np.float64)])
        y = np.concatenate(self.y + [np.asarray(as_numpy(batch.y), np.float64)])
        if self.cap and x.shape[0] > self.cap:
            i = self.rng.choice(x.shape[0], self.cap, replace=False)
            xs, ys = x[i], y[i]
        else:
            xs, ys = x, y
        fresh = type(self.gp)(self.gp.config)
        record = fresh.update(Batch(xs, ys))       # validates before anything is kept
        self.gp = fresh
        self.x, self.y = [x], [y]
        return record

    def predict(self, x, task_id=None):
        return self.gp.predict(x)


def not_applicable(name: str, stream: Stream) -> str | None:
    """Why learner ``name`` cannot take ``stream``'s protocol, or None if it can."""
    d = COMPARE_LEARNERS[name]
    if d.kind != stream.kind:
        return f"a {d.kind} learner; the stream is {stream.kind}"
    if stream.online and d.feed == "task":
        if name == "vargp":
            return ("adds M inducing points per task at every update; a stream of chunks of "
                    "10 points would give it M inducing points per 10 points")
        return ("builds a tree of the classes of each session; an online chunk of 10 points "
                "mixes classes it has seen with new ones")
    if name == "gp-tree" and not stream.new_classes:
        return ("class-incremental: each update must bring new classes; here every task has "
                "the same 10 classes")
    if d.task_aware and not stream.multitask:
        return ("a multi-task learner (one GP per task id, shared structure across tasks); a "
                "single-task stream gives it one task, where it is an exact GP")
    return None


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------
def _uniform(n: int, k: int):
    from ppl_cl.predictive import CategoricalPredictive

    return CategoricalPredictive(np.full((n, k), 1.0 / k))


#: the uniform share mixed into the prequential predictive of a learner whose classes are
#: only those it has seen (GP-Tree): an unseen class then costs log(K / SMOOTHING) nats
SMOOTHING = 1e-3


def _padded(pred, k: int, smoothing: float = 0.0):
    """A categorical predictive over all ``k`` classes: the learner's (over the classes it
    has seen, 0..k'-1) padded with zeros, mixed with ``smoothing`` of the uniform."""
    from ppl_cl.predictive import CategoricalPredictive

    p = np.asarray(pred.probs, dtype=np.float64)
    if p.shape[1] == k:
        return pred
    full = np.zeros((p.shape[0], k))
    full[:, : p.shape[1]] = p
    if smoothing:
        full = (1 - smoothing) * full + smoothing / k
    return CategoricalPredictive(full)


def _predict(learner, x, task_id, stream: Stream):
    from ppl_cl.errors import NotFittedError

    try:
        pred = learner.predict(x, task_id=task_id)
    except NotFittedError:
        if stream.kind != "classification":
            raise
        return _uniform(len(x), stream.num_classes)
    if stream.kind == "classification":
        pred = _padded(pred, stream.num_classes, SMOOTHING)
    return pred


class _Driven:
    """A learner as the comparison drives it through :mod:`ppl_cl.protocols`: ``predict`` is
    the prequential predictive (:func:`_predict`: the uniform before any data, padded and
    smoothed to every class), ``update`` the learner's, and ``clock`` sums the seconds of
    these calls and of :meth:`timed` ones (the test-set scoring)."""

    def __init__(self, learner, stream: Stream):
        self.learner, self.stream, self.clock = learner, stream, 0.0

    def timed(self, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.clock += time.perf_counter() - t0

    def predict(self, x, task_id=None):
        return self.timed(_predict, self.learner, x, task_id, self.stream)

    def update(self, batch: Batch):
        return self.timed(self.learner.update, batch)


def unit_chunks(unit: Unit, entry: "CompareLearner", chunk_size: int) -> list[Batch]:
    """The batches a learner is fed from one unit: the whole unit (``feed="task"``) or chunks
    of ``chunk_size`` points in order (``feed="chunks"``), with the unit's task id for a
    task-aware learner."""
    x, y = np.asarray(unit.train.x), np.asarray(unit.train.y)
    n = len(unit.train)
    step = chunk_size if entry.feed == "chunks" else max(n, 1)
    tid = unit.task_id if entry.task_aware else None
    return [Batch(x[idx], y[idx], task_id=tid)
            for idx in (np.arange(a, min(a + step, n)) for a in range(0, n, step))]


class _Scores:
    """The per-unit curves of :func:`run_learner` and the final metrics built from them."""

    def __init__(self, stream: Stream):
        U = len(stream.units)
        self.stream, self.R = stream, np.full((U, U), np.nan)
        self.logp, self.correct = [], []
        self.curves: dict[str, list] = {"rmse": [], "nlpd": [], "m": [], "online": []}

    def online(self, result) -> None:
        """The prequential scores of one unit (none on a multi-task stream)."""
        if result.log_prob.size == 0 and result.correct is None and result.sq_error is None:
            return
        self.logp.append(result.log_prob)
        if self.stream.kind == "classification":
            self.correct.append(result.correct)
            self.curves["online"].append(float(np.mean(np.concatenate(self.correct))))
        else:
            self.curves["online"].append(float(-np.mean(np.concatenate(self.logp))))

    def regression(self, predictives: list, tests: list, record) -> None:
        """RMSE and NLPD on the pooled test points of the units so far, and M."""
        from ppl_cl.metrics import nlpd, rmse

        mu = np.concatenate([p.mean for p in predictives])
        var = np.concatenate([p.variance for p in predictives])
        y = np.concatenate([np.asarray(u.test.y, np.float64) for u in tests])
        self.curves["rmse"].append(rmse(y, mu))
        self.curves["nlpd"].append(nlpd(y, mu, var))
        self.curves["m"].append(float(record["m"]) if isinstance(record, dict) and "m" in record
                                else float("nan"))

    def classification_summary(self, test_predictives: list) -> dict[str, Any]:
        from ppl_cl.metrics import average_accuracy, expected_calibration_error, forgetting

        k = self.stream.num_classes
        probs = np.concatenate([_padded(p, k).probs for p in test_predictives])
        y = np.concatenate([np.asarray(u.test.y) for u in self.stream.units])
        logp, avg = np.concatenate(self.logp), average_accuracy(self.R)
        out = dict(final_avg_accuracy=float(avg[-1]),
                   online_accuracy=float(np.mean(np.concatenate(self.correct))),
                   cum_logloss=float(-logp.sum()), mean_logloss=float(-logp.mean()),
                   ece=float(expected_calibration_error(probs, y)),
                   accuracy_matrix=self.R.tolist(), average_accuracy=avg.tolist(),
                   online_curve=self.curves["online"])
        if len(self.R) > 1:
            out["forgetting"] = float(forgetting(self.R))
        return out

    def regression_summary(self) -> dict[str, Any]:
        c = self.curves
        out = dict(rmse=c["rmse"][-1], nlpd=c["nlpd"][-1], rmse_curve=c["rmse"],
                   nlpd_curve=c["nlpd"])
        if self.logp:
            out.update(online_nlpd=float(-np.concatenate(self.logp).mean()),
                       online_curve=c["online"])
        if np.isfinite(c["m"]).any():
            out.update(m=c["m"][-1], m_curve=c["m"])
        return out


def run_learner(name: str, stream: Stream, config: CompareConfig, seed: int = 0,
                device: str = "cpu", progress=None) -> dict[str, Any]:
    """Feed ``stream`` to learner ``name`` (module docstring) and score it, through the loops
    of :mod:`ppl_cl.protocols` only: per unit, :func:`~ppl_cl.protocols.prequential` over
    its chunks (learning only on a multi-task stream), then
    :func:`~ppl_cl.protocols.evaluate_tasks` (a row of ``R``) or
    :func:`~ppl_cl.protocols.predict_tasks` (pooled RMSE / NLPD) on the units so far.

    Returns per-unit curves and the final metrics (fractions for accuracies, nats for
    log-losses)."""
    from ppl_cl.protocols import evaluate_tasks, predict_tasks, prequential

    entry = COMPARE_LEARNERS[name]
    driven = _Driven(entry.make(stream, config, seed, device), stream)
    scores = _Scores(stream)
    units = stream.units if progress is None else progress(stream.units, desc=name)
    for i, unit in enumerate(units):
        result = prequential(driven, unit_chunks(unit, entry, config.chunk_size),
                             score=not stream.multitask)
        scores.online(result)
        if stream.kind == "classification":
            scores.R[i] = driven.timed(evaluate_tasks, driven.learner, stream.units, upto=i)[0]
        else:
            preds = driven.timed(predict_tasks, driven.learner, stream.units, upto=i,
                                 use_task_id=entry.task_aware)
            scores.regression(preds, stream.units[: i + 1], result.records[-1])
    out: dict[str, Any] = {"wall_time_s": driven.clock, "units": len(stream.units)}
    if stream.kind == "classification":
        out.update(scores.classification_summary(predict_tasks(driven.learner, stream.units)))
    else:
        out.update(scores.regression_summary())
    return out


#: the summary's metrics per kind, in table order: (key, column title, format)
METRICS = {
    "classification": (("final_avg_accuracy", "final avg. acc.", "{:.4f}"),
                       ("forgetting", "forgetting", "{:.4f}"),
                       ("online_accuracy", "avg. online acc.", "{:.4f}"),
                       ("cum_logloss", "cum. log-loss", "{:.1f}"),
                       ("ece", "ECE", "{:.4f}"),
                       ("wall_time_s", "wall time (s)", "{:.1f}")),
    "regression": (("rmse", "RMSE", "{:.4f}"), ("nlpd", "NLPD", "{:.4f}"),
                   ("online_nlpd", "online NLPD", "{:.4f}"), ("m", "M", "{:.0f}"),
                   ("wall_time_s", "wall time (s)", "{:.1f}")),
}


def _key(metric: str, learner: str) -> str:
    return f"{metric}_{learner.replace('-', '_')}"


def report_markdown(stream: Stream | dict, summary: dict, not_app: dict[str, str],
                    learners: list[str], title: str, std: dict | None = None) -> str:
    """The table of ``report.md``: one row per learner, one column per metric (mean ± std
    over seeds when ``std`` is given), then the learners that cannot take the stream."""
    kind = stream.kind if isinstance(stream, Stream) else stream["kind"]
    size = stream.size if isinstance(stream, Stream) else stream["size"]
    cols = METRICS[kind]
    lines = [f"# {title}", "", f"Stream: {size}.", "",
             "| learner | " + " | ".join(c[1] for c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for name in learners:
        cells = []
        for metric, _, fmt in cols:
            v = summary.get(_key(metric, name))
            if v is None:
                cells.append("-")
                continue
            cell = fmt.format(v)
            if std is not None and _key(metric, name) in std:
                cell += " ± " + fmt.format(std[_key(metric, name)])
            cells.append(cell)
        lines.append(f"| {COMPARE_LEARNERS[name].label} (`{name}`) | " + " | ".join(cells) + " |")
    if not_app:
        lines += ["", "Not run (the protocol does not fit):", ""]
        lines += [f"- `{n}`: {why}" for n, why in not_app.items()]
    lines.append("")
    return "\n".join(lines)


def _figure(stream: Stream, results: dict[str, dict], title: str):
    import matplotlib.pyplot as plt

    if stream.kind == "classification":
        panels = (("average_accuracy", "average accuracy on the tasks seen"),
                  ("online_curve", "average online accuracy (prequential)"))
    else:
        panels = (("rmse_curve", "test RMSE (units seen)"), ("nlpd_curve", "test NLPD"),
                  ("m_curve", "M (inducing points)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        for name, res in results.items():
            if key in res:
                v = np.asarray(res[key], dtype=float)
                ax.plot(np.arange(1, len(v) + 1), v, marker="o", ms=3,
                        label=COMPARE_LEARNERS[name].label)
        ax.set_xlabel("units (tasks / sessions / batches)")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def compare_stream(stream_name: str, config: CompareConfig, ctx: RunContext) -> dict:
    """Every learner of ``config`` (or of the stream's kind) on ``stream_name``; writes
    ``report.md``, ``curves.json`` and ``compare.png`` into the run folder."""
    import jax

    stream = build_stream(stream_name, config, ctx.seed, ctx.data_dir)
    names = list(config.learners) or [n for n, d in COMPARE_LEARNERS.items()
                                      if d.kind == stream.kind]
    not_app = {n: why for n in names if (why := not_applicable(n, stream)) is not None}
    run = [n for n in names if n not in not_app]
    if not run:
        from ppl_cl.errors import ConfigError

        raise ConfigError(f"learners: none of {names} can take the stream {stream_name!r}: "
                         + "; ".join(f"{n}: {w}" for n, w in not_app.items()))
    results: dict[str, dict] = {}
    summary: dict[str, Any] = {"units": len(stream.units)}
    with jax.default_device(ctx.jax_device()):
        for name in run:
            ctx.log(f"{name}: start")
            res = run_learner(name, stream, config, ctx.seed, ctx.device,
                              progress=lambda it, desc: ctx.progress(it, desc=desc))
            results[name] = res
            for metric, _, _ in METRICS[stream.kind]:
                if metric in res:
                    summary[_key(metric, name)] = res[metric]
            ctx.log(f"{name}: " + ", ".join(f"{m} {res[m]:.4g}" for m, _, _ in
                                            METRICS[stream.kind] if m in res))
    title = f"{stream_name}: {STREAMS[stream_name][1]}"
    (ctx.out_dir / "report.md").write_text(
        report_markdown(stream, summary, not_app, run, title), encoding="utf-8")
    (ctx.out_dir / "curves.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    ctx.savefig(_figure(stream, results, title), "compare")
    return {"summary": summary, "not_applicable": not_app, "learners": run,
            "stream": {"name": stream_name, "kind": stream.kind, "size": stream.size}}


def aggregate_seeds(metrics: list[dict], title: str) -> str:
    """``report.md`` over several seeds' ``metrics.json``: mean ± std (ddof 1) per cell."""
    first = metrics[0]
    keys = set().union(*(m["summary"] for m in metrics))
    mean, std = {}, {}
    for k in keys:
        vals = [m["summary"][k] for m in metrics if isinstance(m["summary"].get(k), (int, float))]
        if vals:
            mean[k] = float(np.mean(vals))
            if len(vals) > 1:
                std[k] = float(np.std(vals, ddof=1))
    seeds = ", ".join(str(m["seed"]) for m in metrics)
    return report_markdown(first["stream"], mean, first["not_applicable"], first["learners"],
                           f"{title} (seeds {seeds}: mean ± std)", std=std)


def _register(stream: str) -> None:
    def run(config: CompareConfig, ctx: RunContext, stream=stream) -> dict:
        return compare_stream(stream, config, ctx)

    register(f"compare-{stream}", CompareConfig, quick=QUICK[stream],
             description=f"compare: {STREAMS[stream][1]}")(run)


for _name in STREAMS:
    _register(_name)
