"""``ppl-cl sweep``: experiments x seeds x ``--grid`` values as independent runs.

A sweep is the cross product of experiment names, seeds and the values of each ``--grid`` key,
with fixed ``--set`` overrides applied to every run. Each run is one ``ppl-cl run`` in a
process of its own (``python -m ppl_cl.cli run NAME --seed S --out DIR --set ...``: the CLI's
own code path), so its run folder is exactly what ``ppl-cl run`` writes, its thread budget is
set before torch / JAX load, and a run that raises, runs out of memory or is killed stops no
other. The runs are spread over

* Ray (the optional extra ``pip install -e ".[ray]"``): one Ray task per run declaring
  ``num_cpus`` / ``num_gpus`` (fractions let runs share a GPU), on a local Ray instance by
  default or an existing cluster with ``address`` (``ray start --head``, then
  ``--address auto`` or ``HOST:PORT``); every node needs the same install and ``out`` on a
  file system every node sees;
* a local pool of ``local_processes`` processes (no Ray needed), which is also what runs when
  Ray is not installed and no address is given.

Each run gets ``cpus_per_run`` threads (``--threads`` of ``ppl-cl run``: torch, BLAS and
XLA), and a local pool may not hold more threads than the machine has CPUs.

**Folders.** ``out/<experiment>/seed<S>`` without a grid, else
``out/<experiment>/<key>=<value>,<key>=<value>/seed<S>`` (grid keys in the order given; a
character other than letters, digits and ``._+-=,`` becomes ``_`` and the folder name gets a
short hash of the exact values). The output of each run's process goes to
``out/sweep-logs/<same path>.log``; ``out/sweep.json`` records every run's status and error;
``out/report.md`` and ``out/reproduce.json`` are the pooled report of the finished runs
(:func:`ppl_cl.experiments.reproduce.collect`: mean ± std over seeds per experiment and
setting).

**Restarts.** Started again with the same arguments, a sweep skips every run whose folder
holds a finished run (``metrics.json``) of the same experiment, seed, quick flag and overrides,
and continues every other run that has a folder with ``--resume`` (from its checkpoints, where
the experiment saves them; from the start otherwise). A folder holding a run of other settings
is an error before anything runs, unless ``force`` (which replaces it, and reruns finished
runs).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ppl_cl.configs import CHECKPOINT_EVERY_S
from ppl_cl.errors import ConfigError, DeviceError

__all__ = ["SweepRun", "parse_grid", "expand", "run_folder", "plan", "usable_cpus",
           "ray_available", "sweep"]

#: the folder under ``out`` that holds each run's process output
LOGS_DIR = "sweep-logs"
_SAFE = re.compile(r"[^A-Za-z0-9._+=,-]")
#: seconds a run's process has to write its log line and exit after SIGTERM before SIGKILL
_GRACE_S = 60.0


# ---------------------------------------------------------------------------------------------
# the grid
# ---------------------------------------------------------------------------------------------
def _split_values(text: str) -> list[str]:
    """``v1,v2,...`` split on the commas outside brackets and quotes, so that list values keep
    theirs: ``[64,64],[128]`` -> ``["[64,64]", "[128]"]``."""
    out, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return out


def parse_grid(items: Sequence[str] | None) -> dict[str, list[str]]:
    """``--grid key=v1,v2`` strings as ``{key: [v1, v2]}`` (keys in the order given).

    Raises :class:`ConfigError` for an item without ``key=``, an empty value, a value given
    twice or a key given twice."""
    grid: dict[str, list[str]] = {}
    for item in items or []:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"--grid: expected key=v1,v2,..., received {item!r}")
        if key in grid:
            raise ConfigError(f"--grid: key {key!r} given twice (list its values once: "
                              f"{key}=v1,v2)")
        values = _split_values(text)
        if any(v == "" for v in values):
            raise ConfigError(f"--grid {item}: empty value")
        dup = sorted({v for v in values if values.count(v) > 1})
        if dup:
            raise ConfigError(f"--grid {item}: value(s) {', '.join(dup)} given twice")
        grid[key] = values
    return grid


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: ``ppl-cl run experiment --seed seed [--quick] --set ...`` into
    ``out_dir``. ``overrides`` are the fixed ``--set`` values followed by this run's grid
    values; ``grid`` the grid values alone (they name the folder)."""

    experiment: str
    seed: int
    quick: bool
    overrides: dict[str, str]
    grid: dict[str, str]
    out_dir: Path

    @property
    def label(self) -> str:
        """``experiment key=value ... seed=S``, for progress lines."""
        parts = [self.experiment] + [f"{k}={v}" for k, v in self.grid.items()]
        return " ".join(parts + [f"seed={self.seed}"])

    @property
    def rel(self) -> Path:
        """The folder relative to the sweep's ``out`` (``experiment/[grid/]seedS``)."""
        return Path(*self.out_dir.parts[-(3 if self.grid else 2):])


def _grid_folder(grid: dict[str, str]) -> str:
    raw = ",".join(f"{k}={v}" for k, v in grid.items())
    safe = _SAFE.sub("_", raw)
    if safe != raw:
        safe += "-" + hashlib.sha1(raw.encode()).hexdigest()[:8]
    return safe


def run_folder(out: str | Path, experiment: str, grid: dict[str, str], seed: int) -> Path:
    """The run folder of one run (see the module docstring)."""
    base = Path(out) / experiment
    return (base / _grid_folder(grid) if grid else base) / f"seed{seed}"


def expand(names: Sequence[str], seeds: Sequence[int], grid: dict[str, list[str]] | None = None,
           *, sets: dict[str, str] | None = None, quick: bool = False,
           out: str | Path = "runs/sweep") -> list[SweepRun]:
    """Every run of the sweep, experiment by experiment (in the order named), then grid point
    by grid point (``itertools.product`` of the keys' values in the order given: the last key
    varies fastest), then seed by seed.

    Every run's config is built here (unknown experiments and keys, bad values: a
    :class:`ConfigError` naming the experiment), so a typo stops the sweep before any run.
    """
    from ppl_cl.experiments import build_config, get

    grid = dict(grid or {})
    sets = dict(sets or {})
    if not names:
        raise ConfigError("sweep: name at least one experiment")
    if len(set(names)) != len(names):
        raise ConfigError(f"sweep: experiment named twice in {' '.join(names)}")
    from ppl_cl.seeding import check_seed

    seeds = list(seeds)
    if not seeds:
        raise ConfigError("--seeds: give at least one seed")
    for seed in seeds:
        check_seed(seed, "--seeds")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: seed given twice in {' '.join(map(str, seeds))}")
    both = sorted(set(grid) & set(sets))
    if both:
        raise ConfigError(f"--set and --grid both give {', '.join(both)}")
    runs = []
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    for name in names:
        spec = get(name)
        for point in points:
            overrides = {**sets, **point}
            build_config(spec, quick=quick, overrides=overrides)   # ConfigError before any run
            for seed in seeds:
                runs.append(SweepRun(name, int(seed), bool(quick), overrides, dict(point),
                                     run_folder(out, name, point, seed)))
    return runs


# ---------------------------------------------------------------------------------------------
# what a restart does with each folder
# ---------------------------------------------------------------------------------------------
def _recorded(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "config.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _differences(run: SweepRun, recorded: dict) -> list[str]:
    mine = {"experiment": run.experiment, "seed": run.seed, "quick": run.quick,
            "overrides": run.overrides}
    return [f"{k} {recorded.get(k)!r} there, {v!r} here" for k, v in mine.items()
            if recorded.get(k) != v]


def plan(runs: Sequence[SweepRun], force: bool = False) -> list[str]:
    """What to do with each run: ``"skip"`` (its folder holds a finished run of the same
    experiment, seed, quick flag and overrides), ``"resume"`` (its folder holds an unfinished
    one: ``ppl-cl run --resume``), ``"start"`` (no run there yet), or with ``force``
    ``"replace"`` (``ppl-cl run --force``) in place of skip and of a folder of other settings.

    Raises :class:`ConfigError` for a folder that holds a run of other settings (without
    ``force``)."""
    actions = []
    for run in runs:
        recorded = _recorded(run.out_dir)
        finished = (run.out_dir / "metrics.json").is_file()
        if recorded is None:
            actions.append("replace" if finished and force else "start")
            continue
        diff = _differences(run, recorded)
        if diff and not force:
            raise ConfigError(f"{run.out_dir} holds a run of other settings ({'; '.join(diff)}); "
                              "use another --out, or --force to replace it")
        if diff or (finished and force):
            actions.append("replace")
        else:
            actions.append("skip" if finished else "resume")
    return actions


# ---------------------------------------------------------------------------------------------
# one run in a process of its own
# ---------------------------------------------------------------------------------------------
def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def _run_argv(run: SweepRun, action: str, *, threads: int, device: str,
              checkpoint_every_s: float, data_dir: str | None) -> list[str]:
    argv = ["run", run.experiment, "--seed", str(run.seed), "--out", str(run.out_dir),
            "--threads", str(threads), "--device", device, "--no-progress",
            "--checkpoint-every", repr(float(checkpoint_every_s)), "--debug"]
    if run.quick:
        argv.append("--quick")
    if action == "resume":
        argv.append("--resume")
    elif action == "replace":
        argv.append("--force")
    if data_dir is not None:
        argv += ["--data-dir", data_dir]
    for k, v in run.overrides.items():
        argv += ["--set", f"{k}={v}"]
    return argv


def _error_of(returncode: int, output: str) -> str:
    """One line saying why a run's process failed: the last line of its traceback (``ppl-cl
    run --debug``), or the signal that killed it."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if returncode == 128 + signal.SIGTERM:
        return "terminated (SIGTERM)"
    if returncode == 130:
        return "interrupted"
    return last or f"exit status {returncode}"


class _Stopped(Exception):
    """The sweep is stopping: no new run starts."""


class _Processes:
    """The live runs' processes, so that a stopping sweep can end them (and start no more)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self.stopping = False

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        with self._lock:
            if self.stopping:
                raise _Stopped()
            proc = subprocess.Popen(argv, **kw)
            self._procs.add(proc)
            return proc

    def done(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.discard(proc)

    def stop(self, grace_s: float = _GRACE_S, wait_first_s: float = 0.0) -> None:
        """SIGTERM every live run (each writes ``terminated (SIGTERM)`` to its progress log and
        keeps its checkpoints), SIGKILL those still alive after ``grace_s``. ``wait_first_s``:
        give them that long to end by themselves first (Ctrl-C in a terminal reaches every
        run's process too)."""
        with self._lock:
            self.stopping = True
            procs = list(self._procs)
        deadline = time.monotonic() + wait_first_s
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def execute(task: dict[str, Any], processes: _Processes | None = None) -> dict[str, Any]:
    """Run one ``ppl-cl run`` (``task["argv"]``) in a new Python process with its output
    appended to ``task["log"]``; returns ``{"returncode", "error", "wall_time_s", "host"}``.

    The body of both executors' tasks (a Ray task runs it on its node). The process gets
    SIGTERM if the process that started it dies (Linux), so a killed sweep leaves no run
    behind."""
    processes = processes or _Processes()
    log = Path(task["log"])
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **task.get("env", {}), PARENT_ENV: str(os.getpid())}
    argv = [sys.executable, "-m", "ppl_cl.cli", *task["argv"]]
    t0 = time.perf_counter()
    with open(log, "ab") as fh:
        fh.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        fh.flush()
        start = fh.tell()
        proc = processes.popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=env)
        try:
            returncode = proc.wait()
        except BaseException:           # a Ray task cancelled, Ctrl-C: end the run, then go
            proc.terminate()
            try:
                proc.wait(timeout=_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            processes.done(proc)
    with open(log, "rb") as fh:
        fh.seek(start)
        output = fh.read().decode(errors="replace")
    return {"returncode": returncode,
            "error": None if returncode == 0 else _error_of(returncode, output),
            "wall_time_s": time.perf_counter() - t0, "host": os.uname().nodename}


PARENT_ENV = "PPL_CL_SWEEP_PARENT"
"""The variable that tells a run's process the pid of the sweep's process that started it."""


def die_with_parent() -> None:
    """In a run's process, first thing (``python -m ppl_cl.cli``): when :data:`PARENT_ENV`
    names the sweep's process that started it, ask Linux to send SIGTERM when that process
    dies, and stop at once if it is already gone (it died before the call). Done in the run's
    process rather than between fork and exec (``preexec_fn``), which runs the at-fork hooks of
    every library loaded in the sweep's process (JAX warns there) and may deadlock on a lock
    another thread held at the fork. Off Linux, or without the variable: nothing."""
    parent = os.environ.pop(PARENT_ENV, None)
    if parent is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover
        return
    prctl(1, int(signal.SIGTERM))          # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        os._exit(128 + signal.SIGTERM)


# ---------------------------------------------------------------------------------------------
# executors
# ---------------------------------------------------------------------------------------------
def ray_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def _run_local(tasks: list[dict], processes_n: int, on_done: Callable[[int, dict], None]) -> None:
    """``tasks`` on a pool of ``processes_n`` threads, each waiting on one run's process;
    ``on_done(i, result)`` in this thread as each finishes. Ctrl-C / SIGTERM here ends the
    live runs (SIGTERM: they keep their checkpoints) before it propagates."""
    procs = _Processes()
    pool = futures.ThreadPoolExecutor(max_workers=processes_n, thread_name_prefix="ppl-cl-run")
    pending = {pool.submit(execute, t, procs): i for i, t in enumerate(tasks)}
    try:
        while pending:
            done, _ = futures.wait(pending, timeout=0.5, return_when=futures.FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                try:
                    result = fut.result()
                except Exception as err:     # could not start the process at all
                    result = {"returncode": None, "error": f"{type(err).__name__}: {err}",
                              "wall_time_s": 0.0, "host": os.uname().nodename}
                on_done(i, result)
    except BaseException as exc:
        procs.stop(wait_first_s=5.0 if isinstance(exc, KeyboardInterrupt) else 0.0)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _ray_task(task: dict) -> dict:
    return execute(task)


def _run_ray(tasks: list[dict], *, address: str | None, cpus: int, gpus: float,
             on_done: Callable[[int, dict], None]) -> None:
    """One Ray task per run declaring ``num_cpus=cpus, num_gpus=gpus``; on a local Ray
    instance (started here and shut down at the end) when ``address`` is None."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=0)(_ray_task)
        pending = {remote.remote(t): i for i, t in enumerate(tasks)}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in done:
                    i = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as err:     # the task's worker died, the node was lost...
                        first = (str(err).strip().splitlines() or [""])[-1]
                        result = {"returncode": None, "host": None, "wall_time_s": 0.0,
                                  "error": f"{type(err).__name__}: {first}"}
                    on_done(i, result)
        except BaseException:
            for ref in pending:               # KeyboardInterrupt in each task: it ends its run
                ray.cancel(ref)
            for ref in pending:
                try:
                    ray.get(ref, timeout=_GRACE_S)
                except Exception:
                    pass
            raise
    finally:
        if started:
            ray.shutdown()


# ---------------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------------
def _headline(run: SweepRun, summary: dict) -> str:
    from ppl_cl.experiments import get
    from ppl_cl.experiments.reproduce import format_value

    keys = [k for k in get(run.experiment).table_keys if k in summary][:3] or \
        [k for k, v in summary.items() if isinstance(v, float)][:3]
    return ", ".join(f"{k}={format_value(summary[k])}" for k in keys)


def _memory_env(gpus_per_run: float) -> dict[str, str]:
    """Runs sharing a GPU: JAX preallocates 75% of a GPU's memory in each process unless told;
    each run gets 90% of its share instead (a user's own setting wins)."""
    if 0 < gpus_per_run < 1 and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in os.environ:
        return {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 * gpus_per_run:.3f}"}
    return {}


def _forwarded_env() -> dict[str, str]:
    """What a run on another node needs from this one's environment: the extra experiment
    modules (:data:`ppl_cl.experiments.EXTRA_ENV`)."""
    from ppl_cl.experiments import EXTRA_ENV

    return {EXTRA_ENV: os.environ[EXTRA_ENV]} if os.environ.get(EXTRA_ENV) else {}


def _executor(address: str | None, local_processes: int | None, cpus_per_run: int,
              gpus_per_run: float, device: str | None, checkpoint_every_s: float):
    """Check the executor's arguments of :func:`sweep` (a :class:`ConfigError` before any run);
    returns ``(device, use_ray, local_processes, default_pool)``."""
    from ppl_cl.configs.validate import check_device_name

    if isinstance(cpus_per_run, bool) or not isinstance(cpus_per_run, int) or cpus_per_run < 1:
        raise ConfigError(f"--cpus-per-run: expected an int >= 1, received {cpus_per_run!r}")
    if not 0 <= gpus_per_run <= 1:
        raise ConfigError(f"--gpus-per-run: expected a fraction of one GPU in [0, 1] (a run "
                          f"uses one device), received {gpus_per_run!r}")
    if not checkpoint_every_s >= 0:
        raise ConfigError(f"--checkpoint-every: expected >= 0 seconds, received "
                          f"{checkpoint_every_s!r}")
    device = device or ("cuda" if gpus_per_run > 0 else "cpu")
    check_device_name(device, "--device", DeviceError)
    if device == "cpu" and gpus_per_run > 0:
        raise ConfigError("--gpus-per-run with --device cpu would hold GPUs no run uses")
    if local_processes is not None:
        if address is not None:
            raise ConfigError("--local-processes and --address: choose the local pool or a "
                              "Ray cluster")
        if isinstance(local_processes, bool) or not isinstance(local_processes, int) \
                or local_processes < 1:
            raise ConfigError(f"--local-processes: expected an int >= 1, received "
                              f"{local_processes!r}")
    use_ray = local_processes is None and (address is not None or ray_available())
    if use_ray and not ray_available():
        raise ConfigError(f"--address {address}: Ray is not installed (pip install -e "
                          "\".[ray]\", or pip install 'ray>=2.9'); without a cluster use "
                          "--local-processes N")
    if use_ray and device != "cpu" and gpus_per_run == 0:
        raise ConfigError(f"--device {device} on Ray needs --gpus-per-run F (Ray shows no GPU "
                          "to a task that declares none)")
    default_pool = not use_ray and local_processes is None
    if not use_ray:
        cpus = usable_cpus()
        if default_pool:
            local_processes = max(1, cpus // cpus_per_run)
        if local_processes * cpus_per_run > cpus:
            raise ConfigError(
                f"--local-processes {local_processes} x --cpus-per-run {cpus_per_run} = "
                f"{local_processes * cpus_per_run} threads on {cpus} CPU(s): that "
                "oversubscribes the machine (runs slow down far more than in proportion); "
                "lower one of them")

    return device, use_ray, local_processes, default_pool


def _folders(out: str | Path, data_dir: str | None) -> tuple[Path, str | None]:
    """The sweep's folder and the data root, checked and made absolute."""
    out = Path(out).absolute()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out: expected a folder, received the file {out}")
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        raise ConfigError(f"--data-dir {data_dir}: no such folder")
    data_dir = None if data_dir is None else str(Path(data_dir).expanduser().absolute())
    return out, data_dir


def _entries(runs: list, actions: list[str], out: Path, count, echo) -> list[dict]:
    """One ``sweep.json`` entry per run; the runs finished earlier are marked ``skipped``
    with their summary (and said)."""
    n = len(runs)
    entries: list[dict] = [{"experiment": r.experiment, "seed": r.seed, "quick": r.quick,
                            "overrides": r.overrides, "grid": r.grid, "dir": str(r.out_dir),
                            "log": str(out / LOGS_DIR / r.rel) + ".log", "action": a,
                            "status": "unfinished", "error": None, "wall_time_s": None,
                            "summary": None}
                           for r, a in zip(runs, actions)]
    for r, e in zip(runs, entries):
        if e["action"] == "skip":
            e["status"] = "skipped"
            e["summary"] = json.loads((r.out_dir / "metrics.json").read_text())["summary"]
            echo(f"[{next(count)}/{n}] skipped {r.label}: finished earlier "
                 f"({_headline(r, e['summary'])})")
    return entries


def _where(use_ray: bool, address: str | None, cpus_per_run: int, gpus_per_run: float,
           local_processes: int | None) -> str:
    """The executor, in words (the sweep's first line)."""
    return (f"Ray ({address or 'a local instance'}), {cpus_per_run} CPU(s)"
            + (f" and {gpus_per_run:g} GPU" if gpus_per_run else "") + " per run"
            if use_ray else
            f"a local pool of {local_processes} process(es) x {cpus_per_run} thread(s)")


def _record(run: Any, e: dict, result: dict, prefix: str, echo) -> None:
    """Write a finished run's ``result`` (from the executor) into its entry ``e`` and say it;
    a run that ended well but whose ``metrics.json`` this machine cannot see failed."""
    e["wall_time_s"] = result["wall_time_s"]
    e["host"] = result.get("host")
    metrics_path = run.out_dir / "metrics.json"
    if result["returncode"] == 0 and not metrics_path.is_file():
        result = {**result, "error": f"the run finished on {result.get('host')} but "
                  f"{metrics_path} is not visible here: --out must be on a file system "
                  "that every node shares"}
    if result["error"] is None:
        e["status"] = "done"
        e["summary"] = json.loads(metrics_path.read_text())["summary"]
        echo(f"{prefix} done {run.label} in {result['wall_time_s']:.1f} s "
             f"({_headline(run, e['summary'])})")
    else:
        e["status"], e["error"] = "failed", result["error"]
        echo(f"{prefix} FAILED {run.label}: {result['error']} (log: {e['log']})")


def _report(runs: list, entries: list[dict], out: Path, echo, executor: str) -> dict:
    """The pooled report of the finished runs (:func:`ppl_cl.experiments.reproduce.collect`)
    and :func:`sweep`'s result."""
    from ppl_cl.experiments.reproduce import collect

    n = len(runs)
    finished = [r.out_dir for r, e in zip(runs, entries) if e["status"] in ("done", "skipped")]
    report = None
    if finished:
        collect(finished, out)
        report = str(out / "report.md")
    failed = [e for e in entries if e["status"] == "failed"]
    echo(f"ppl-cl sweep: {len(finished)} of {n} run(s) finished, {len(failed)} failed"
         + (f"; report: {report}" if report else ""))
    return {"runs": entries, "failed": failed, "executor": executor,
            "report": report}


def sweep(names: Sequence[str], *, out: str | Path, seeds: Sequence[int] = (0,),
          grid: dict[str, list[str]] | None = None, sets: dict[str, str] | None = None,
          quick: bool = False, address: str | None = None,
          local_processes: int | None = None, cpus_per_run: int = 1,
          gpus_per_run: float = 0.0, device: str | None = None, force: bool = False,
          checkpoint_every_s: float = CHECKPOINT_EVERY_S, data_dir: str | None = None,
          echo: Callable[[str], None] | None = None) -> dict:
    """Run the sweep (module docstring); write ``out/sweep.json`` and the pooled report
    ``out/report.md`` / ``out/reproduce.json`` of its finished runs.

    Args:
        names, seeds, grid, sets, quick: the runs (:func:`expand`).
        address: a Ray cluster (``"auto"``, ``"HOST:PORT"``, ``"ray://HOST:PORT"``); None: a
            local Ray instance, or the local pool when Ray is not installed.
        local_processes: processes of a local pool (no Ray); cpus_per_run: CPUs = threads per run.
        gpus_per_run: GPUs per run (Ray), a fraction to share one (0.5: two runs per GPU).
        device: ``--device`` of every run (default ``"cpu"``, or ``"cuda"`` with GPUs).
        force: rerun finished runs and replace folders of other settings.
        checkpoint_every_s, data_dir: as for ``ppl-cl run``; echo: the progress lines' sink.

    Raises:
        ConfigError: before any run starts: bad arguments, unknown experiments or keys, a
            folder of other settings, Ray asked for but not installed.

    Returns:
        ``{"runs": [...], "failed": [...], "executor": ..., "report": path or None}``; each
        run's entry has ``experiment, seed, overrides, dir, action, status`` (``done``,
        ``skipped``: finished earlier, ``failed``, ``unfinished``: stopped or never started
        by an interrupted sweep), ``error``, ``wall_time_s``, ``summary``.
    """
    from ppl_cl.persist import atomic_write_text, make_folder

    echo = echo or (lambda line: print(line, file=sys.stderr, flush=True))
    device, use_ray, local_processes, default_pool = _executor(
        address, local_processes, cpus_per_run, gpus_per_run, device, checkpoint_every_s)

    out, data_dir = _folders(out, data_dir)
    runs = expand(names, seeds, grid, sets=sets, quick=quick, out=out)
    actions = plan(runs, force=force)
    if default_pool:   # said once the names and folders are known good
        echo(f"ppl-cl sweep: Ray is not installed: a local pool of {local_processes} "
             f"process(es) (pip install -e \".[ray]\" for Ray)")

    n, count = len(runs), itertools.count(1)
    entries = _entries(runs, actions, out, count, echo)
    todo = [i for i, e in enumerate(entries) if e["action"] != "skip"]
    resumed = sum(entries[i]["action"] == "resume" for i in todo)
    echo(f"ppl-cl sweep: {n} run(s): {n - len(todo)} finished earlier, {resumed} to resume, "
         f"{len(todo) - resumed} to start, on "
         f"{_where(use_ray, address, cpus_per_run, gpus_per_run, local_processes)}")

    env = {**_memory_env(gpus_per_run), **_forwarded_env()}
    argv = {"threads": cpus_per_run, "device": device, "checkpoint_every_s": checkpoint_every_s,
            "data_dir": data_dir}
    tasks = [{"argv": _run_argv(runs[i], entries[i]["action"], **argv),
              "log": entries[i]["log"], "env": env} for i in todo]

    meta = {"executor": "ray" if use_ray else "local", "address": address,
            "cpus_per_run": cpus_per_run, "gpus_per_run": gpus_per_run, "device": device}

    def save() -> None:
        atomic_write_text(out / "sweep.json", json.dumps({**meta, "runs": entries}, indent=2,
                                                         default=str))

    def on_done(k: int, result: dict) -> None:
        _record(runs[todo[k]], entries[todo[k]], result, f"[{next(count)}/{n}]", echo)
        save()

    make_folder(out)
    save()
    try:
        if tasks and use_ray:
            _run_ray(tasks, address=address, cpus=cpus_per_run, gpus=gpus_per_run,
                     on_done=on_done)
        elif tasks:
            _run_local(tasks, local_processes, on_done)
    finally:
        save()

    return _report(runs, entries, out, echo, meta["executor"])
