"""Experiment registry, configs and run folders.

An experiment is a function ``run(config, ctx) -> metrics`` registered with :func:`register`
together with

* a config dataclass whose defaults are the **full** (paper-sized) setting,
* a ``quick`` dict of overrides that makes it finish in a minute or two on a laptop CPU,
* ``paper``: the numbers the paper reports for keys of ``metrics["summary"]``
  (:class:`PaperNumber`, with citation), which ``ppl-cl reproduce`` sets beside ours,
* ``headline=True`` if ``ppl-cl reproduce`` runs it.

:func:`run_experiment` builds the config (quick, then ``--set key=value`` overrides parsed by
field type), seeds everything, and writes into the run folder

* ``config.json`` — experiment, seed, device, quick flag, the config, library versions, the
  code version (git commit, dirty flag) and the machine (:mod:`ppl_cl.provenance`);
* ``metrics.json`` — what ``run`` returned, which must hold a flat ``summary`` dict of
  numbers/strings (the headline numbers), plus ``figures`` and ``wall_time_s``;
* figures saved through ``ctx.savefig`` as PNG, and whatever else the experiment writes;
* ``progress.log`` — one line per unit of work an experiment reports through ``ctx.log``
  (e.g. each continual task: epochs, validation, accuracy, seconds) or iterates with
  ``ctx.progress`` (each task, batch, seed, epoch; every twentieth of a long stream of
  chunks), written as it happens, so
  that a long run can be followed with ``tail -f`` and a killed run leaves its record; a run
  that raises (missing data, non-finite loss, Ctrl-C, SIGTERM under ``ppl-cl``) ends it with a
  ``failed: ...``, ``interrupted`` or ``terminated (SIGTERM)`` line;
* ``checkpoints/`` — per-unit state saved through ``ctx.save_checkpoint`` while the run is in
  progress; ``run_experiment(..., resume=True)`` (``ppl-cl run --resume``) continues a run
  that was stopped from these (refusing a folder of other settings, leaving a finished run as
  it is), and they are removed once ``metrics.json`` is written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ppl_cl.configs import CHECKPOINT_EVERY_S, apply_overrides
from ppl_cl.configs.validate import check_device_name
from ppl_cl.errors import ConfigError, DeviceError, Terminated
from ppl_cl.persist import (CheckpointError, atomic_write_text, load_tree, make_folder,
                            read_meta, save_tree)
from ppl_cl.progress import progress, progress_enabled
from ppl_cl.provenance import code_version, machine_info
from ppl_cl.seeding import check_seed, seed_everything

__all__ = ["PaperNumber", "Claim", "ExperimentSpec", "check_device", "check_seed", "make_folder",
           "config_differences", "RunContext", "register", "build_config", "run_spec",
           "registered_specs", "ConfigError", "DeviceError", "Terminated"]


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def config_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``"key: recorded -> current"`` for every field that differs between two run
    fingerprints (experiment, seed, quick, config; nested configs by dotted key, e.g.
    ``config.learner.beta: 1.0 -> 5.0``)."""
    a, b = _flat(_jsonable(recorded)), _flat(_jsonable(current))
    missing = object()
    return [f"{k}: {a.get(k, '(absent)')!r} -> {b.get(k, '(absent)')!r}"
            for k in sorted(set(a) | set(b)) if a.get(k, missing) != b.get(k, missing)]


def check_device(device: str, backends: tuple[str, ...] = ("torch", "jax")) -> str:
    """Check ``--device`` once, before any work: for ``cuda`` / ``cuda:N`` every library in
    ``backends`` must see that GPU (torch built with CUDA and a device present; a CUDA build
    of jaxlib); a :class:`DeviceError` names what is missing and how to install it."""
    check_device_name(device, "--device", DeviceError)
    if device == "cpu":
        return device
    index = int(device[5:]) if ":" in device else 0
    if "torch" in backends:
        import torch

        if not torch.cuda.is_available():
            built = "built without CUDA" if torch.version.cuda is None else \
                f"built for CUDA {torch.version.cuda} but sees no GPU"
            raise DeviceError(f"--device {device}: torch {torch.__version__} is {built} (install "
                              "a CUDA build, e.g. pip install torch --index-url "
                              "https://download.pytorch.org/whl/cu126)")
        if index >= torch.cuda.device_count():
            raise DeviceError(f"--device {device}: torch sees {torch.cuda.device_count()} GPU(s)")
    if "jax" in backends:
        import jax

        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            gpus = []
        if len(gpus) <= index:
            raise DeviceError(f"--device {device}: JAX sees {len(gpus)} GPU(s) (install a CUDA "
                              "build of jaxlib, e.g. pip install 'jax[cuda12]')")
    return device


@dataclass(frozen=True)
class PaperNumber:
    """A number reported in a paper, for the ``reproduce`` table, printed with the digits it
    was given (90.57 ± 1.06, not 90.57 ± 1.1). A float forgets trailing zeros, so a table
    printed with fixed decimals says how many (``decimals=2``: 10.09 ± 0.40, 97.20 ± 0.08);
    without, the shortest form (``0.33 ± 0.01``)."""

    value: float
    source: str
    std: float | None = None
    note: str = ""
    decimals: int | None = None

    def format(self) -> str:
        def fmt(x: float) -> str:
            return f"{x:g}" if self.decimals is None else f"{x:.{self.decimals}f}"
        return fmt(self.value) + (f" ± {fmt(self.std)}" if self.std is not None else "")


@dataclass(frozen=True)
class Claim:
    """A statement of a paper that a run's summary can check, e.g. Table 1's order of rows:
    ``Claim("VAR-GP > Block Diag. > Global > MLE Hypers", ("final_avg_accuracy", ...))``
    holds when the keys' values are strictly decreasing (``increasing=True``: increasing).
    ``at_most`` adds conditions ``(a, b, tolerance)``: ``summary[a] <= summary[b] + tolerance``
    (e.g. one method's RMSE within a stated tolerance of another's), all of which must hold too.
    ``ppl-cl reproduce`` and ``ppl-cl report`` say for each claim whether it holds."""

    text: str
    keys: tuple[str, ...]
    increasing: bool = False
    at_most: tuple[tuple[str, str, float], ...] = ()

    @property
    def all_keys(self) -> tuple[str, ...]:
        """``keys`` and then the keys of ``at_most`` not among them, in order."""
        out = list(self.keys)
        for a, b, _ in self.at_most:
            out += [k for k in (a, b) if k not in out]
        return tuple(out)

    def check(self, summary: dict[str, Any]) -> bool | None:
        """True / False, or None when a key is missing from the summary."""
        values = {}
        for k in self.all_keys:
            v = summary.get(k)
            if isinstance(v, dict) and "mean" in v:
                v = v["mean"]
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                return None
            values[k] = float(v)
        ordered = [values[k] for k in self.keys]
        pairs = zip(ordered, ordered[1:])
        order_ok = all(b > a for a, b in pairs) if self.increasing else \
            all(a > b for a, b in pairs)
        return order_ok and all(values[a] <= values[b] + tol for a, b, tol in self.at_most)


@dataclass
class ExperimentSpec:
    name: str
    run: Callable[[Any, "RunContext"], dict]
    config_cls: type
    quick: dict[str, Any] = field(default_factory=dict)
    headline: bool = False
    paper: dict[str, PaperNumber] = field(default_factory=dict)
    description: str = ""
    #: the summary keys of the headline table (default: those with a paper number)
    headline_keys: tuple[str, ...] = ()
    claims: tuple[Claim, ...] = ()
    #: the array libraries the run uses on ``--device cuda`` ("torch", "jax")
    backends: tuple[str, ...] = ("torch", "jax")

    @property
    def table_keys(self) -> tuple[str, ...]:
        return tuple(self.headline_keys) or tuple(self.paper)


_REGISTRY: dict[str, ExperimentSpec] = {}


def registered_specs() -> dict[str, ExperimentSpec]:
    """The experiments registered so far (``ppl_cl.experiments.registry()`` imports every
    experiment module first)."""
    return dict(_REGISTRY)


def register(name: str, config_cls: type, *, quick: dict[str, Any] | None = None,
             headline: bool = False, paper: dict[str, PaperNumber] | None = None,
             description: str = "", headline_keys: tuple[str, ...] = (),
             claims: tuple[Claim, ...] = (),
             backends: tuple[str, ...] = ("torch", "jax")) -> Callable:
    """Decorator registering ``run(config, ctx) -> metrics`` as experiment ``name``.

    Args:
        config_cls: a dataclass whose defaults are the full (paper-sized) setting.
        quick: overrides (dotted keys reach the learner config) for a run of about a minute.
        headline: ``ppl-cl reproduce`` runs it.
        paper: the paper's numbers for summary keys.
        headline_keys: the summary keys of the report's headline table (default: ``paper``'s
            keys); every other summary key is a diagnostic, reported apart.
        claims: statements of the paper the summary can check (:class:`Claim`).
        backends: the libraries checked for a GPU on ``--device cuda``.
    """
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"{name}: config_cls must be a dataclass")
    field_names = {f.name for f in dataclasses.fields(config_cls)}
    bad = {k.partition(".")[0] for k in (quick or {})} - field_names
    if bad:
        raise TypeError(f"{name}: quick overrides name unknown fields {sorted(bad)}")

    def deco(fn: Callable) -> Callable:
        if name in _REGISTRY:
            raise RuntimeError(f"experiment {name!r} registered twice")
        doc = description or ((fn.__doc__ or "").strip().splitlines() or [""])[0]
        _REGISTRY[name] = ExperimentSpec(name, fn, config_cls, dict(quick or {}), headline,
                                         dict(paper or {}), doc, tuple(headline_keys),
                                         tuple(claims), tuple(backends))
        return fn

    return deco


def build_config(spec: ExperimentSpec, quick: bool = False,
                 overrides: dict[str, Any] | None = None) -> Any:
    """The config dataclass: full defaults, then ``quick`` overrides, then ``--set`` strings
    (dotted keys reach into the learner config: ``learner.beta=10``;
    :func:`ppl_cl.configs.apply_overrides`)."""
    config = spec.config_cls()
    if quick and spec.quick:
        config = apply_overrides(config, spec.quick, where=spec.name)
    if overrides:
        config = apply_overrides(config, overrides, where=spec.name)
    return config


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------
#: the folder of a run's checkpoints (``<out_dir>/checkpoints``), removed once ``metrics.json``
#: is written and, unless the run resumes, when it starts
CHECKPOINT_DIR = "checkpoints"


@dataclass
class RunContext:
    """What an experiment's ``run`` gets besides its config."""

    out_dir: Path
    seed: int = 0
    device: str = "cpu"
    quick: bool = False
    show_progress: bool | None = None
    data_dir: str | None = None
    figures: list[str] = field(default_factory=list)
    resume: bool = False
    #: what a checkpoint must match to be resumed from (experiment, seed, quick, config)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    #: seconds between the snapshots an experiment saves *within* a long unit of work (the
    #: VAR-GP streams: within a task), so that a run stopped mid-task loses at most this much
    checkpoint_every_s: float = CHECKPOINT_EVERY_S

    # -- progress log and checkpoints (resumable long runs) ------------------------------------
    def log(self, message: str) -> None:
        """Append a time-stamped line to ``<out_dir>/progress.log`` (flushed at once)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / "progress.log", "a", encoding="utf-8") as fh:
            fh.write(f"{stamp}  {message}\n")

    def _checkpoint_path(self, key: str) -> Path:
        if not key or not all(ch.isalnum() or ch in "-_" for ch in key):
            raise ValueError(f"checkpoint key must be letters, digits, '-' or '_', got {key!r}")
        return self.out_dir / CHECKPOINT_DIR / f"{key}.npz"

    def save_checkpoint(self, key: str, tree: Any) -> None:
        """Save ``tree`` (arrays, tensors, JSON values) under ``key``, stamped with this run's
        fingerprint; atomic, so a run killed mid-write keeps the previous checkpoint."""
        path = self._checkpoint_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_tree(path, tree, meta={"run": _jsonable(self.fingerprint)})

    def load_checkpoint(self, key: str) -> Any | None:
        """The tree saved under ``key`` if this run resumes and one exists, else None.

        Raises :class:`CheckpointError` if the checkpoint was written by a run with another
        experiment, seed, quick flag or config (resuming it would mix two runs)."""
        path = self._checkpoint_path(key)
        if not self.resume or not path.exists():
            return None
        tree, meta = load_tree(path)
        mine, theirs = _jsonable(self.fingerprint), dict(meta.get("run", {}))
        if mine != theirs:
            diff = config_differences(theirs, mine)
            raise CheckpointError(f"{path} was written by a different run ({'; '.join(diff)}); "
                                  "run without --resume, or with the original settings")
        return tree

    #: loops of at most this many items log every item; longer ones 20 lines in all
    LOG_EACH_UP_TO = 100

    def progress(self, iterable=None, *, desc: str = "", total: int | None = None,
                 log: bool = True, **kw):
        """A progress bar over ``iterable`` (:func:`ppl_cl.progress.progress`, shown when
        ``show_progress`` or, by default, on a terminal) that also writes ``progress.log``
        lines as the loop goes (``log=True``): ``"<desc>: i/n (s s)"`` after every item of a
        loop of at most :attr:`LOG_EACH_UP_TO` items (tasks, batches, seeds, epochs), after
        every n/20-th item of a longer one (the chunks of an online stream)."""
        enabled = progress_enabled() if self.show_progress is None else self.show_progress
        bar = progress(iterable, desc=desc, total=total, enabled=enabled, **kw)
        if iterable is None or not log:
            return bar
        if total is None:
            try:
                total = len(iterable)
            except TypeError:
                total = None
        return self._logged(bar, desc or "loop", total)

    def _logged(self, bar, desc: str, total: int | None):
        every = 1 if total is None or total <= self.LOG_EACH_UP_TO else math.ceil(total / 20)
        t0 = time.perf_counter()
        for i, item in enumerate(bar, start=1):
            yield item
            if i % every == 0 or i == total:
                self.log(f"{desc}: {i}/{'?' if total is None else total} "
                         f"({time.perf_counter() - t0:.1f} s)")

    def savefig(self, fig, name: str) -> Path:
        """Save a matplotlib figure as ``<out_dir>/<name>.png`` and close it."""
        import matplotlib.pyplot as plt

        path = self.out_dir / (name if name.endswith(".png") else f"{name}.png")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        self.figures.append(path.name)
        return path

    def jax_device(self):
        """The JAX device for ``--device`` (use as ``with jax.default_device(ctx.jax_device()):``)."""
        import jax

        if self.device.startswith("cuda"):
            try:
                gpus = jax.devices("gpu")
            except RuntimeError:
                gpus = []
            index = int(self.device[5:]) if ":" in self.device else 0
            if len(gpus) <= index:
                raise DeviceError(f"--device {self.device}: JAX sees {len(gpus)} GPU(s) "
                                  "(a CUDA build of jaxlib is needed, e.g. pip install jax[cuda12])")
            return gpus[index]
        return jax.devices("cpu")[0]


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("ppl-cl", "torch", "pyro-ppl", "jax", "numpyro", "numpy", "arviz"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def _check_summary(name: str, metrics: Any) -> None:
    if not isinstance(metrics, dict) or not isinstance(metrics.get("summary"), dict):
        raise TypeError(f"{name}: run() must return a dict with a 'summary' dict")
    for k, v in metrics["summary"].items():
        # a flat list of numbers is allowed too (a curve named by the issue, e.g. GP-Tree's
        # summary.session_acc)
        if isinstance(v, (list, tuple)) and all(isinstance(e, (int, float)) and
                                                not isinstance(e, bool) for e in v):
            continue
        if not isinstance(v, (int, float, str, bool)) and v is not None:
            raise TypeError(f"{name}: summary[{k!r}] must be a number, a string or a flat list "
                            f"of numbers, got {type(v).__name__}")


def _recorded_fingerprint(out_dir: Path) -> dict[str, Any] | None:
    """The experiment, seed, quick flag and config of the run whose ``config.json`` is in
    ``out_dir`` (None: no readable ``config.json``)."""
    try:
        recorded = json.loads((out_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(recorded, dict):
        return None
    return {k: recorded.get(k) for k in ("experiment", "seed", "quick", "config")}


def _resume_finished(out_dir: Path, fingerprint: dict, finished: bool) -> dict | None:
    """``--resume`` into ``out_dir``: a :class:`ConfigError` when its ``config.json`` or a
    checkpoint was written by a run of other settings; a finished run's metrics (marked
    ``already_finished``), or None to continue."""
    # the run recorded in config.json and the one every checkpoint was written by
    recorded = [_recorded_fingerprint(out_dir)] + [
        (read_meta(p) or {}).get("run")
        for p in sorted((out_dir / CHECKPOINT_DIR).glob("*.npz"))]
    for rec in filter(None, recorded):
        diff = config_differences(rec, fingerprint)
        if diff:
            raise ConfigError(f"--resume: {out_dir} holds a run of other settings "
                              f"({'; '.join(diff)}); resume with the original settings, "
                              "or choose another --out")
    if finished:
        try:
            metrics = json.loads((out_dir / "metrics.json").read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(f"--resume: {out_dir}/metrics.json is unreadable ({err}); "
                              "--force retrains the run") from None
        return {**metrics, "already_finished": True}
    return None


def _run_logged(spec: ExperimentSpec, config: Any, ctx: "RunContext") -> tuple[dict, float]:
    """``spec.run(config, ctx)`` and its start time; a run that stops says why in its log
    (its stderr may be long gone), and the checkpoints it saved stay for ``--resume``."""
    t0 = time.perf_counter()
    try:
        return spec.run(config, ctx), t0
    except BaseException as exc:
        first_line = (str(exc).splitlines() or [""])[0]
        if isinstance(exc, KeyboardInterrupt):
            what = "interrupted"
        elif isinstance(exc, Terminated):
            what = f"terminated ({first_line})"
        else:
            what = f"failed: {type(exc).__name__}: {first_line}"
        ctx.log(f"{what} after {time.perf_counter() - t0:.1f} s")
        raise


def run_spec(spec: ExperimentSpec, *, quick: bool = False, seed: int = 0, device: str = "cpu",
                   out: str | Path | None = None, overrides: dict[str, str] | None = None,
                   data_dir: str | None = None, show_progress: bool | None = None,
                   resume: bool = False, checkpoint_every_s: float = CHECKPOINT_EVERY_S,
                   force: bool = False) -> dict:
    """Run the experiment of ``spec`` and write its run folder; returns the metrics dict
    (``ppl_cl.experiments.run_experiment(name, ...)`` looks the spec up by name).

    Before any work (and before any folder is made): the seed is checked
    (:func:`check_seed`), the config is built (unknown keys and bad values raise
    :class:`ConfigError`), ``--device`` is checked for the libraries the experiment uses
    (:func:`check_device`), ``data_dir`` must be a folder, and ``out`` must be a folder that
    holds no finished run (a ``metrics.json``) unless ``resume`` or ``force`` (which empties it
    first). A run that fails leaves no ``metrics.json`` (so ``ppl-cl report`` refuses the
    folder), only its ``config.json``, ``progress.log`` (ending with why it stopped) and
    checkpoints.

    With ``resume=True`` an experiment that checkpoints its units of work (the VAR-GP streams
    do, after every task of every variant) continues from the checkpoints a stopped run with
    the same experiment, seed, quick flag and config left in ``out``; the result equals that
    of an uninterrupted run. A ``config.json`` in ``out`` of other settings refuses the resume
    (a :class:`ConfigError` naming the fields that differ; nothing in ``out`` is touched). A
    finished run of the same settings is not trained again: its metrics are returned, marked
    ``"already_finished": True`` (``force=True`` retrains it from the start). Without
    ``resume``, old checkpoints in ``out`` are discarded.
    ``checkpoint_every_s``: seconds between the snapshots taken within a unit of work (a
    VAR-GP task; 0: after every epoch), which ``resume`` continues from too."""
    if not checkpoint_every_s >= 0:
        raise ConfigError(f"checkpoint_every_s: expected >= 0 seconds, received "
                          f"{checkpoint_every_s!r}")
    name = spec.name
    check_seed(seed)
    config = build_config(spec, quick=quick, overrides=overrides)
    check_device(device, spec.backends)
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        raise ConfigError(f"--data-dir {data_dir}: no such folder")
    out_dir = Path(out) if out is not None else Path("runs") / name
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out: expected a folder for the run, received the file {out_dir}")
    fingerprint = {"experiment": name, "seed": seed, "quick": quick,
                   "config": _jsonable(config)}
    finished = (out_dir / "metrics.json").exists()
    if resume and not (force and finished):
        done = _resume_finished(out_dir, fingerprint, finished)
        if done is not None:
            return done
    if finished and (force or not resume):
        if not force:
            raise ConfigError(f"--out {out_dir}: holds a finished run (metrics.json); pass "
                              "--force to replace it, --resume to continue it, or another --out")
        shutil.rmtree(out_dir)
        resume = False          # --force: a fresh start, even with --resume
    make_folder(out_dir)
    ctx = RunContext(out_dir=out_dir, seed=seed, device=device, quick=quick,
                     show_progress=show_progress, data_dir=data_dir, resume=resume,
                     checkpoint_every_s=float(checkpoint_every_s), fingerprint=fingerprint)
    if not resume:
        shutil.rmtree(out_dir / CHECKPOINT_DIR, ignore_errors=True)
        (out_dir / "progress.log").unlink(missing_ok=True)
    ctx.log(f"{'resume' if resume else 'start'} {name} seed={seed} quick={quick} "
            f"device={device}")
    if data_dir is not None:
        from ppl_cl.data.root import set_data_dir

        set_data_dir(data_dir)
    atomic_write_text(out_dir / "config.json", json.dumps(_jsonable({
        "experiment": name, "seed": seed, "device": device, "quick": quick,
        "config": config, "overrides": overrides or {}, "versions": _versions(),
        "code": code_version(), "machine": machine_info(),
    }), indent=2))
    seed_everything(seed)
    metrics, t0 = _run_logged(spec, config, ctx)
    _check_summary(name, metrics)
    metrics = {**metrics, "experiment": name, "quick": quick, "seed": seed,
               "wall_time_s": time.perf_counter() - t0,
               "figures": sorted(set(metrics.get("figures", [])) | set(ctx.figures))}
    atomic_write_text(out_dir / "metrics.json", json.dumps(_jsonable(metrics), indent=2))
    shutil.rmtree(out_dir / CHECKPOINT_DIR, ignore_errors=True)
    ctx.log(f"done in {metrics['wall_time_s']:.1f} s")
    return metrics
