"""The ``ppl-cl`` command: list / run / reproduce experiments, inspect data.

    ppl-cl list
    ppl-cl run NAME [--quick] [--seed N] [--device cpu|cuda] [--out DIR] [--set key=value ...]
    ppl-cl reproduce [--quick] [--out DIR] [--only NAME ...] [--seeds N ...] [--set key=value ...]
    ppl-cl report RUN_DIR [RUN_DIR ...] [--out DIR]
    ppl-cl compare STREAM [--learners a,b,c] [--quick] [--seeds N ...] [--out DIR]
                   [--set key=value ...]      (ppl-cl compare --list: streams and learners)
    ppl-cl sweep NAME [NAME ...] --out DIR [--seeds N ...] [--grid key=v1,v2 ...]
                 [--set key=value ...] [--quick] [--address auto|HOST:PORT | --local-processes N]
                 [--cpus-per-run N] [--gpus-per-run F]
    ppl-cl data list [--no-checksum]
    ppl-cl data path NAME

Every command takes ``--data-dir DIR`` (searched before ``PPL_CL_DATA`` and the cache folder;
it must exist). ``run``, ``reproduce`` and ``compare`` use one thread for torch, XLA and BLAS
unless ``--threads N`` (or ``OMP_NUM_THREADS``) says more (:func:`_default_threads`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from ppl_cl.configs import CHECKPOINT_EVERY_S
from ppl_cl.errors import ConfigError, DeviceError, Terminated

__all__ = ["main"]


def _parse_sets(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set: expected key=value, received {item!r}")
        key, value = item.split("=", 1)
        if not key.strip():
            raise ConfigError(f"--set: expected key=value with a key, received {item!r}")
        out[key.strip()] = value
    return out


def _default_threads() -> int:
    """The thread count of a run without ``--threads``: ``OMP_NUM_THREADS`` when the user set
    it, else 1. Not the libraries' defaults (a thread per core): beside any other busy
    process, torch / XLA / BLAS threads that wait for each other at every parallel region slow
    a run down far more than in proportion, while the problems a run solves gain little from
    a second thread on an idle machine. Not a rule that reads the load average either: that is
    a one-minute average (it sees a job late and a finished one long after), and it cannot see
    the jobs that start after this run."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return 1


def _set_threads(threads: int | None) -> int:
    """One thread budget for torch, JAX / XLA and BLAS in this process, set before they load:
    ``--threads N``, else :func:`_default_threads` (1 unless ``OMP_NUM_THREADS`` says more).
    Returns the number set."""
    if threads is None:
        threads = _default_threads()
    if threads < 1:
        raise ConfigError(f"--threads: expected an int >= 1, received {threads}")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    flags = os.environ.get("XLA_FLAGS", "")
    if "intra_op_parallelism_threads" not in flags:
        extra = f"intra_op_parallelism_threads={threads}"
        if threads == 1 and "xla_cpu_multi_thread_eigen" not in flags:
            extra = "--xla_cpu_multi_thread_eigen=false " + extra
        os.environ["XLA_FLAGS"] = (flags + " " + extra).strip()
    if "torch" in sys.modules:     # torch reads OMP_NUM_THREADS only when it loads
        sys.modules["torch"].set_num_threads(threads)
    _size_xla_pool(threads)
    return threads


def _size_xla_pool(threads: int) -> None:
    """Create JAX's CPU client with an intra-op pool of ``threads`` threads.

    XLA's CPU runtime splits a computation (a matrix product, a fusion) over a pool of one
    thread per CPU the process may run on when the client is created; no flag sizes it
    (``--xla_cpu_multi_thread_eigen=false`` and ``intra_op_parallelism_threads`` leave it as it
    is: measured, a one-thread run took 1.9 cores for a jitted product). So the client is
    created while the process may run on ``threads`` CPUs only, and afterwards every thread of
    the process may run on all of them again (the pool keeps its size; the scheduler still
    places the threads). A no-op when ``threads`` covers every CPU or on a system without
    ``sched_setaffinity``."""
    if not hasattr(os, "sched_setaffinity"):
        return
    cpus = os.sched_getaffinity(0)
    if threads >= len(cpus):
        return
    os.sched_setaffinity(0, set(sorted(cpus)[:threads]))
    try:
        import jax

        jax.devices("cpu")
    finally:
        for tid in os.listdir("/proc/self/task"):   # threads started meanwhile inherit the mask
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:                          # a thread that has ended since
                pass


def _cmd_list(args) -> int:
    from ppl_cl.experiments import registry

    reg = registry()
    width = max(len(n) for n in reg) if reg else 10
    for name in sorted(reg):
        spec = reg[name]
        flag = "*" if spec.headline else " "
        print(f"{flag} {name:<{width}}  {spec.description}")
    print("\n* = run by `ppl-cl reproduce`")
    return 0


def _cmd_run(args) -> int:
    from ppl_cl.experiments import run_experiment

    metrics = run_experiment(args.name, quick=args.quick, seed=args.seed, device=args.device,
                             out=args.out, overrides=_parse_sets(args.set),
                             data_dir=args.data_dir, show_progress=args.progress,
                             resume=args.resume, checkpoint_every_s=args.checkpoint_every,
                             force=args.force)
    print(json.dumps(metrics["summary"], indent=2, default=str))
    out = args.out or "runs/" + args.name
    if metrics.get("already_finished"):
        print(f"ppl-cl: {out} holds a finished run of these settings: nothing to resume, "
              "nothing retrained (--force retrains it)", file=sys.stderr)
    else:
        print(f"wrote {out}/metrics.json ({metrics['wall_time_s']:.1f} s)", file=sys.stderr)
    return 0


def _cmd_reproduce(args) -> int:
    from ppl_cl.experiments.reproduce import reproduce

    res = reproduce(args.out, quick=args.quick, seed=args.seed, seeds=args.seeds,
                    device=args.device, only=args.only, overrides=_parse_sets(args.set),
                    data_dir=args.data_dir, show_progress=args.progress, resume=args.resume,
                    checkpoint_every_s=args.checkpoint_every, force=args.force)
    with open(f"{args.out}/report.md") as fh:
        print(fh.read())
    for name, r in res["results"].items():
        if r["status"] == "error":
            detail = r["traceback"] if args.debug else r["error"].splitlines()[0]
            print(f"ppl-cl: {name} failed: {detail}", file=sys.stderr)
    return 1 if res["failed"] else 0


def _cmd_compare(args) -> int:
    from ppl_cl.experiments import compare, run_experiment

    if args.stream is None and not args.list:
        raise ConfigError("compare: name a stream (ppl-cl compare --list shows them)")
    if args.list:
        print("streams:")
        for name, (_, doc) in compare.STREAMS.items():
            print(f"  {name:<28} {doc}")
        print("learners:")
        for name, d in compare.COMPARE_LEARNERS.items():
            print(f"  {name:<28} {d.kind:<15} {d.label}")
        return 0
    if args.stream not in compare.STREAMS:
        raise ConfigError(f"compare: unknown stream {args.stream!r}; known: "
                          f"{', '.join(compare.STREAMS)}")
    overrides = _parse_sets(args.set)
    if args.learners:     # CompareConfig checks the names (a ConfigError naming the bad ones)
        overrides["learners"] = json.dumps([n.strip() for n in args.learners.split(",")
                                            if n.strip()])
    seeds = args.seeds or [0]
    base = Path(args.out or f"runs/compare-{args.stream}")
    if len(seeds) > 1:
        from ppl_cl.persist import make_folder

        make_folder(base)
    results = []
    for seed in seeds:
        out = base if len(seeds) == 1 else base / f"seed-{seed}"
        metrics = run_experiment(f"compare-{args.stream}", quick=args.quick, seed=seed,
                                 device=args.device, out=out, overrides=overrides,
                                 data_dir=args.data_dir, show_progress=args.progress,
                                 force=args.force)
        results.append(metrics)
    title = f"{args.stream}: {compare.STREAMS[args.stream][1]}"
    if len(seeds) > 1:
        from ppl_cl.persist import atomic_write_text

        atomic_write_text(base / "report.md", compare.aggregate_seeds(results, title))
    print((base / "report.md").read_text(encoding="utf-8"))
    print(f"wrote {base}/report.md", file=sys.stderr)
    return 0


def _cmd_report(args) -> int:
    from ppl_cl.experiments.reproduce import collect
    from ppl_cl.results import save_entry

    if args.label is not None and args.save is None:
        raise ConfigError("--label: only with --save")
    notes = None
    if args.notes is not None:
        try:
            notes = Path(args.notes).read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"--notes {args.notes}: cannot read the file "
                              f"({getattr(err, 'strerror', None) or err})") from None
    try:
        collect(args.run_dirs, args.out, notes=notes)
        if args.save is not None:
            entry_label = args.label
            if entry_label is None:
                quick = {json.loads(Path(d, "metrics.json").read_text())["quick"]
                         for d in args.run_dirs}
                entry_label = "quick" if quick == {True} else "default"
            save_entry(args.save, entry_label, args.run_dirs)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(str(err)) from err
    with open(f"{args.out}/report.md") as fh:
        print(fh.read())
    if args.save is not None:
        print(f"wrote entry {entry_label!r} of {args.save}", file=sys.stderr)
    return 0


def _cmd_tables(args) -> int:
    from ppl_cl.tables import write_tables

    changed = write_tables(check=args.check)
    for path in changed:
        print(f"{'differs' if args.check else 'wrote'}: {path}")
    return 1 if args.check and changed else 0


def _cmd_sweep(args) -> int:
    from ppl_cl.sweep import parse_grid, sweep

    res = sweep(args.names, out=args.out, seeds=args.seeds, grid=parse_grid(args.grid),
                sets=_parse_sets(args.set), quick=args.quick, address=args.address,
                local_processes=args.local_processes, cpus_per_run=args.cpus_per_run,
                gpus_per_run=args.gpus_per_run, device=args.device, force=args.force,
                checkpoint_every_s=args.checkpoint_every, data_dir=args.data_dir)
    if res["report"]:
        with open(res["report"]) as fh:
            print(fh.read())
    for e in res["failed"]:
        print(f"ppl-cl: {e['dir']} failed: {e['error']} (log: {e['log']})", file=sys.stderr)
    return 1 if res["failed"] else 0


def _cmd_data(args) -> int:
    from ppl_cl.data.root import DATASETS, data_roots, dataset_status, locate

    if args.data_cmd == "path":
        print(locate(args.name, args.data_dir))
        return 0
    print("data roots searched, in order:")
    for r in data_roots(args.data_dir):
        print(f"  {r}{'' if r.exists() else '  (does not exist)'}")
    print()
    rows = [dataset_status(n, args.data_dir, checksums=not args.no_checksum) for n in DATASETS]
    w = max(len(r["name"]) for r in rows)
    print(f"{'dataset':<{w}}  found  checksum  where")
    for r in rows:
        where = r["root"] if r["found"] else f"missing {r['missing'][0]} (from {r['source']})"
        print(f"{r['name']:<{w}}  {'yes' if r['found'] else 'no ':<5}  {r['checksum']:<8}  {where}")
    return 0


def _add_run_options(sp) -> None:
    """The options `ppl-cl run` and `ppl-cl reproduce` share."""
    sp.add_argument("--quick", action="store_true", help="small sizes (minutes on a CPU)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--device", default="cpu", help="cpu or cuda")
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bars (default: when stderr is a terminal)")
    sp.add_argument("--resume", action="store_true",
                    help="continue a stopped run from the checkpoints in its run folder "
                         "(same experiment, seed and settings; a finished run is left as "
                         "it is)")
    sp.add_argument("--force", action="store_true",
                    help="replace a finished run in the output folder (with --resume: "
                         "retrain it from the start)")
    sp.add_argument("--threads", type=int, default=None, metavar="N",
                    help="threads for torch, JAX and BLAS (default 1, or OMP_NUM_THREADS "
                         "when set: safe beside other jobs; more only on a machine kept "
                         "free for this run)")
    sp.add_argument("--checkpoint-every", type=float, default=CHECKPOINT_EVERY_S,
                    metavar="SECONDS",
                    help="seconds between the snapshots saved within a long unit of work "
                         "(a VAR-GP task), which --resume continues from (default "
                         "%(default)g)")


def _add_run(sub, common) -> None:
    """`ppl-cl run NAME`."""
    r = sub.add_parser("run", parents=[common], help="run one experiment")
    r.add_argument("name")
    _add_run_options(r)
    r.add_argument("--out", default=None, help="run folder (default runs/NAME)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override")


def _add_reproduce(sub, common) -> None:
    """`ppl-cl reproduce`."""
    rp = sub.add_parser("reproduce", parents=[common], help="run the headline experiments")
    _add_run_options(rp)
    rp.add_argument("--out", default="runs/reproduce")
    rp.add_argument("--only", nargs="+", default=None,
                    help="only these experiments (headline or not)")
    rp.add_argument("--seeds", nargs="+", type=int, default=None,
                    help="run every experiment once per seed; the report gives mean ± std")
    rp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="config override applied to every experiment (use with --only)")


def _add_report(sub, common) -> None:
    """`ppl-cl report RUN_DIR ...`."""
    rr = sub.add_parser("report", parents=[common],
                        help="the reproduce table from finished run folders (mean ± std)")
    rr.add_argument("run_dirs", nargs="+",
                    help="folders written by `ppl-cl run`, or an earlier report's "
                         "reproduce.json (its seeds join their groups)")
    rr.add_argument("--out", default="runs/report")
    rr.add_argument("--notes", metavar="FILE", default=None,
                    help="text file (markdown) added under '## Notes' and as the JSON's notes")
    rr.add_argument("--save", metavar="FILE", default=None,
                    help="also write the runs (one experiment, size and set of overrides) as "
                         "entry --label of results/<experiment>.json, which README.md and "
                         "docs/ quote (`ppl-cl tables` writes their tables from it)")
    rr.add_argument("--label", default=None,
                    help="the entry's name in the --save file (default: 'quick' or 'default')")


def _add_tables(sub, common) -> None:
    """`ppl-cl tables`."""
    tb = sub.add_parser("tables", parents=[common],
                        help="write the number tables of README.md and docs/*.md from results/")
    tb.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when a committed table differs")


def _add_compare(sub, common) -> None:
    """`ppl-cl compare STREAM`."""
    cp = sub.add_parser("compare", parents=[common],
                        help="one stream through several learners: one table, one figure")
    cp.add_argument("stream", nargs="?", default=None, help="a stream (--list shows them)")
    cp.add_argument("--list", action="store_true", help="list the streams and learners")
    cp.add_argument("--learners", default=None, metavar="A,B,C",
                    help="learners to run (default: every learner of the stream's kind)")
    cp.add_argument("--quick", action="store_true", help="small sizes (minutes on a CPU)")
    cp.add_argument("--seeds", nargs="+", type=int, default=None, metavar="N",
                    help="seeds (default 0); several: a run folder each and a mean ± std table")
    cp.add_argument("--device", default="cpu", help="cpu or cuda")
    cp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    cp.add_argument("--force", action="store_true",
                    help="replace finished runs in the output folder")
    cp.add_argument("--threads", type=int, default=None, metavar="N",
                    help="threads for torch, JAX and BLAS (as for `ppl-cl run`)")
    cp.add_argument("--out", default=None, help="folder (default runs/compare-STREAM)")
    cp.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override")


def _add_sweep(sub, common) -> None:
    """`ppl-cl sweep NAME ...`."""
    sw = sub.add_parser("sweep", parents=[common],
                        help="experiments x seeds x --grid values as independent runs (Ray, or "
                             "a local process pool), then the pooled report")
    sw.add_argument("names", nargs="+", metavar="NAME", help="experiments (`ppl-cl list`)")
    sw.add_argument("--out", required=True,
                    help="the sweep's folder: a run folder per run, sweep.json, report.md")
    sw.add_argument("--seeds", nargs="+", type=int, default=[0], metavar="N",
                    help="seeds, each run separately (default 0)")
    sw.add_argument("--grid", action="append", metavar="KEY=V1,V2",
                    help="config key and its values (commas inside [...] stay in a value); "
                         "the runs are the product of every --grid, experiment and seed")
    sw.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="config override applied to every run")
    sw.add_argument("--quick", action="store_true", help="small sizes (minutes on a CPU)")
    sw.add_argument("--address", default=None, metavar="auto|HOST:PORT",
                    help="a running Ray cluster (`ray start --head`; default: a local Ray "
                         "instance when Ray is installed)")
    sw.add_argument("--local-processes", type=int, default=None, metavar="N",
                    help="run on a local pool of N processes, without Ray (the default when "
                         "Ray is not installed: CPUs / --cpus-per-run)")
    sw.add_argument("--cpus-per-run", type=int, default=1, metavar="N",
                    help="CPUs declared per run, and its threads (default 1)")
    sw.add_argument("--gpus-per-run", type=float, default=0.0, metavar="F",
                    help="GPU share per run on Ray, in (0, 1]: 0.5 puts two runs on a GPU "
                         "(implies --device cuda)")
    sw.add_argument("--device", default=None,
                    help="cpu or cuda (default: cuda with --gpus-per-run, else cpu)")
    sw.add_argument("--force", action="store_true",
                    help="rerun finished runs, replace folders holding other settings")
    sw.add_argument("--checkpoint-every", type=float, default=CHECKPOINT_EVERY_S,
                    metavar="SECONDS", help="as for `ppl-cl run` (default %(default)g)")


def _add_data(sub, common) -> None:
    """`ppl-cl data list|path`."""
    d = sub.add_parser("data", parents=[common], help="datasets: where they are, checksums")
    dsub = d.add_subparsers(dest="data_cmd", required=True)
    dl = dsub.add_parser("list", parents=[common])
    dl.add_argument("--no-checksum", action="store_true", help="skip hashing the files")
    dp = dsub.add_parser("path", parents=[common])
    dp.add_argument("name")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ppl-cl", description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=None, help="data root searched first")
    common.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (default: one line)")
    sub = p.add_subparsers(dest="cmd", required=True)

    sub.add_parser("list", parents=[common], help="list registered experiments")
    for add in (_add_run, _add_reproduce, _add_report, _add_tables, _add_compare, _add_sweep,
                _add_data):
        add(sub, common)
    return p


def _raise_terminated(signum, frame) -> None:
    raise Terminated(signal.Signals(signum).name)


def _check_args(args) -> None:
    """What can be checked before any work or any folder: seeds in range and an existing
    ``--data-dir``, each error naming its option (:class:`ConfigError`)."""
    from ppl_cl.seeding import check_seed

    if getattr(args, "seed", None) is not None:
        check_seed(args.seed, "--seed")
    for seed in getattr(args, "seeds", None) or []:
        check_seed(seed, "--seeds")
    data_dir = getattr(args, "data_dir", None)
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        what = "is not a folder" if Path(data_dir).expanduser().exists() else "no such folder"
        raise ConfigError(f"--data-dir {data_dir}: {what}")


def main(argv: list[str] | None = None) -> int:
    """Run one ``ppl-cl`` command; returns the exit status.

    Errors are one ``ppl-cl: ...`` line on stderr (``--debug``: the traceback too): status 2
    for a bad argument, config, path, device, data or checkpoint, 1 for a run that failed.
    While ``run``, ``reproduce`` or ``sweep`` works, SIGTERM (``kill``, a batch system's time
    limit) raises :class:`~ppl_cl.errors.Terminated` in the main thread, so the run's
    ``progress.log`` ends with ``terminated (SIGTERM)`` (its checkpoints stay for ``--resume``)
    and the status is 143 (128 + SIGTERM), as if the signal had killed the process; a sweep
    passes it on to its live runs first. The previous handler is restored on return."""
    args = build_parser().parse_args(argv)
    handlers = {"list": _cmd_list, "run": _cmd_run, "reproduce": _cmd_reproduce,
                "report": _cmd_report, "tables": _cmd_tables, "compare": _cmd_compare,
                "sweep": _cmd_sweep, "data": _cmd_data}
    running = args.cmd in ("run", "reproduce", "compare")
    catch = (running or args.cmd == "sweep") and \
        threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if catch else None
    try:
        _check_args(args)
        if running:
            _set_threads(args.threads)
        return handlers[args.cmd](args)
    except Terminated as err:
        print(f"ppl-cl: terminated ({err})", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("ppl-cl: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # user-facing errors: one line, non-zero exit
        from ppl_cl.data.root import MissingDataError
        from ppl_cl.persist import CheckpointError

        if args.debug:
            raise
        first = (str(err).splitlines() or [type(err).__name__])[0]
        if isinstance(err, (MissingDataError, ConfigError, DeviceError, CheckpointError,
                            FileNotFoundError, NotADirectoryError, FileExistsError,
                            PermissionError)):
            print(f"ppl-cl: {first}", file=sys.stderr)
            return 2
        print(f"ppl-cl: the run failed: {type(err).__name__}: {first} (--debug shows the "
              "traceback)", file=sys.stderr)
        return 1
    finally:
        if catch:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    from ppl_cl.sweep import die_with_parent

    die_with_parent()   # a sweep's run: end with the sweep
    sys.exit(main())
