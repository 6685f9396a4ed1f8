"""The ``slem-dask`` command line: demo, fit, encode, run, search, evaluate.

Without ``--scheduler`` (or $DASK_SCHEDULER_ADDRESS) every command starts a
LocalCluster sized to this machine and closes it at the end.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

from .parser import (_check_option_combinations, _glue_negative_values, _parse,
                         build_parser)

EXIT_ERROR = 1
#: Exit status when stdout's reader went away (`slem-dask ... | head -1`): 128 + SIGPIPE,
#: what a shell reports for a program that SIGPIPE ended, not 0: not all the output was
#: read, and a pipe closed while a job ran stops that job (`set -o pipefail` scripts see it).
EXIT_BROKEN_PIPE = 141


def _print_table(rows: list[dict]) -> None:
    cols = list(rows[0])
    text = [[f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in text)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    print("  ".join("-" * w for w in widths))
    for t in text:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)).rstrip())


def _security(args):
    """A TLS Security from --tls-* (all three or none), else None: the client then
    follows dask's configuration (distributed.comm.tls.* in YAML or DASK_* variables)."""
    given = [args.tls_ca_file, args.tls_cert, args.tls_key]
    if not any(given):
        return None
    address = getattr(args, "scheduler_address", None)
    if not address:
        raise ValueError("--tls-ca-file, --tls-cert and --tls-key apply to a TLS scheduler: "
                         "give its address with --scheduler tls://host:8786 (a LocalCluster "
                         "needs no certificates)")
    if not address.startswith("tls://"):
        raise ValueError(f"--tls-* options were given but the scheduler address {address!r} "
                         f"is not a TLS address; use --scheduler tls://HOST:PORT")
    if not all(given):
        raise ValueError("--tls-ca-file, --tls-cert and --tls-key go together; give all three")
    for flag, path in zip(("--tls-ca-file", "--tls-cert", "--tls-key"), given, strict=True):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{flag}: no file at {path!r}; give a PEM file "
                                    f"(deploy/tls/make_certs.py makes a test set)")
    from distributed.security import Security

    return Security(tls_ca_file=args.tls_ca_file, tls_client_cert=args.tls_cert,
                    tls_client_key=args.tls_key, require_encryption=True)


def _performance_report(path):
    import contextlib

    if not path:
        return contextlib.nullcontext()
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"--performance-report: folder {parent!r} does not exist")
    from distributed import performance_report

    return performance_report(filename=path)


def _check_inputs(args, spec) -> None:
    """What can be checked from metadata alone, so that bad paths fail in a second
    instead of after a cluster start-up. The jobs check again (cheaply) themselves."""
    from .. import storage

    paths = {k: getattr(args, k, None) for k in ("negatives", "model", "positives", "out",
                                                 "queries", "database", "corpus")}
    if spec is not None:
        paths.update({"model.path": spec.model.path,
                      "fit.negatives": spec.fit.negatives if spec.fit else None,
                      **{f"encode[{i}].positives": e.positives for i, e in enumerate(spec.encode)},
                      **{f"encode[{i}].out": e.out for i, e in enumerate(spec.encode)}})
    for key, path in paths.items():
        if isinstance(path, str) and storage.canonical(path).url.startswith("memory://"):
            raise ValueError(
                f"{key} {path!r}: a memory:// store lives only as long as one process, and "
                f"this command's would vanish when it exits; give a path or a URL (file://, "
                f"s3://...) that the workers and later commands can read")

    if args.command == "run":
        from ..pipeline.jobspec import check_inputs

        check_inputs(spec)
    elif args.command == "fit":
        from ..pipeline import _open_negatives

        _open_negatives(args.negatives, args.model, args.overwrite, args.update,
                        getattr(args, "repivot", False))
    elif args.command == "search":
        storage.check_distinct(args.out, "--out", {"queries": args.queries,
                                                  "database": args.database})
        if storage._exists(args.out):
            if not args.overwrite:
                raise FileExistsError(f"output {str(storage.canonical(args.out))!r} already "
                                      f"exists; pass --overwrite to replace it")
            storage.check_may_replace(args.out, "search result", kind="search")
    elif args.command == "encode":
        from ..models import load_model
        from ..pipeline import check_encode_inputs

        args.loaded_model = load_model(args.model)  # read once: the job encodes with it
        check_encode_inputs(args.loaded_model, args.model, args.positives, args.out,
                            args.dtype, args.overwrite, partition_rows=args.partition_rows,
                            precision=args.precision)


def _local_processes(args, spec, workers, threads) -> tuple[bool, str]:
    """Whether a LocalCluster (if one is started) has worker processes, and why."""
    from ..cluster.connect import local_cluster_kind

    choice = args.local_cluster
    if choice != "auto":
        return choice == "processes", f"--local-cluster {choice}"
    if args.workers or args.threads_per_worker:
        return True, "--workers/--threads-per-worker given"
    if workers or threads:
        return True, "workers/threads_per_worker set in the spec's [cluster]"
    return local_cluster_kind(_job_kind(args, spec), _input_bytes(args, spec))


def _job_kind(args, spec) -> str:
    """What the command computes, as :func:`slem_dask.cluster.connect.local_cluster_kind` names it."""
    from ..models import LinearSLEM

    if args.command == "fit":
        return "kernel fit" if args.kernel else "linear fit"
    if args.command == "encode":
        linear = isinstance(getattr(args, "loaded_model", None), LinearSLEM)
        return "linear encode" if linear else "kernel encode"
    if args.command == "run" and spec is not None and not getattr(spec, "generate", None) \
            and spec.model.type == "linear":
        return "linear fit" if spec.fit and not spec.encode else \
            "linear encode" if spec.encode and not spec.fit else "linear fit and encode"
    return args.command


def _input_bytes(args, spec) -> int | None:
    """Uncompressed bytes of the arrays a command reads, or None if not known
    before it runs (a spec that generates its data, a store that is not there)."""
    from .. import storage

    if args.command == "fit":
        paths = [args.negatives]
    elif args.command == "encode":
        paths = [args.positives]
    elif args.command == "search":
        paths = [args.queries, args.database]
    elif args.command == "evaluate":
        own = _evaluate_arrays(args)
        paths = [own[name] if own else f"{str(args.corpus).rstrip('/')}/{name}"
                 for name in ("negatives", "database", "queries")]
    elif args.command == "run" and spec is not None and not getattr(spec, "generate", None):
        paths = ([spec.fit.negatives] if spec.fit else []) + [e.positives for e in spec.encode]
    else:
        return None
    try:
        return sum(int(storage.open_input(p, "input").nbytes) for p in paths)
    except Exception:  # noqa: BLE001 - the job itself reports a bad input
        return None


#: The commands that run without a cluster (:mod:`slem_dask.cli.stores`).
_STORE_COMMANDS = ("verify", "versions", "rollback", "export")


def _run(args) -> int:
    from ..cluster.connect import connect

    if args.command in _STORE_COMMANDS:
        from . import stores as cli_stores

        if args.command == "verify":
            return 0 if cli_stores.verify(args.paths) else EXIT_ERROR
        if args.command == "export":
            cli_stores.export(args)
            return 0
        cli_stores.versions(args)
        return 0
    progress = sys.stdout.isatty() if args.progress is None else args.progress
    spec = None
    scheduler, workers, threads = args.scheduler, args.workers, args.threads_per_worker
    if args.command == "run":
        from ..pipeline.jobspec import load_spec

        spec = load_spec(args.spec)  # before any cluster starts: spec errors come first
        scheduler = scheduler or spec.cluster.scheduler
        workers = workers or spec.cluster.workers
        threads = threads or spec.cluster.threads_per_worker
        if args.task_timeout is None and spec.cluster.task_timeout is not None:
            args.task_timeout = spec.cluster.task_timeout
            args.task_timeout_source = "[cluster] task_timeout"
    args.scheduler_address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS")
    security = _security(args)  # before any cluster starts, like every input check
    _check_inputs(args, spec)  # input errors come before any cluster starts
    from ..cluster.preflight import check_writable, output_paths

    check_writable(output_paths(args, spec))  # so do read-only output folders
    if args.command == "search":
        from ..pipeline.search import check_search_inputs

        check_search_inputs(args.queries, args.database, args.k, args.force)
    elif args.command == "evaluate":
        from ..pipeline.evaluate import check_evaluate_inputs

        check_evaluate_inputs(args.corpus, args.methods, args.negatives, args.k, args.plot,
                              _evaluate_arrays(args))
    import time

    started = time.perf_counter()
    processes, why = _local_processes(args, spec, workers, threads)
    with connect(scheduler, workers, threads, security=security, quiet=not progress,
                 processes=processes) as client, _performance_report(args.performance_report):
        info = client.scheduler_info()
        if args.scheduler_address:
            where = ""
        elif processes:
            where = f" (local worker processes: {why})"
        else:
            where = f" in this process ({sum(client.nthreads().values())} threads; {why})"
        print(f"dask: {info.get('address', '')} with {len(info['workers'])} worker(s){where}, "
              f"start-up {time.perf_counter() - started:.2f} s (the jobs' own times follow)",
              flush=True)
        from ..cluster import watchdog
        from ..cluster import workers as worker_faults

        with watchdog.watch(client, args.task_timeout,
                            what_is_kept=lambda: _not_complete(args, advice=False),
                            source=getattr(args, "task_timeout_source", "--task-timeout"),
                            progress_every=None if progress else
                            watchdog.progress_line_seconds(),
                            stores=_paths_of(args) + _spec_paths(spec)), \
                worker_faults.explain_failures(client, _not_complete(args, short=True)):
            reports, rows = _jobs(args, client, spec, progress)
        # done: a Ctrl-C while the cluster closes must not say that nothing was written
        args.finished = (reports, rows if args.command in ("demo", "evaluate") else None)
    _print_results(args, *args.finished)
    return 0


def _jobs(args, client, spec, progress: bool):
    """Run the command's job(s) on ``client``: (reports, rows of a results table)."""
    from .. import pipeline

    rows = None
    if args.command == "run":
        from ..pipeline.jobspec import run_spec

        run_spec(client, spec, overwrite=args.overwrite, progress=progress,
                 on_report=lambda r: print("\n".join(r.lines()), flush=True))
        reports = []  # printed as each step finished
    elif args.command == "fit":
        reports = [pipeline.fit_job(client, args.negatives, args.model, lam=args.lam,
                                    theta=args.theta, partition_rows=args.partition_rows,
                                    overwrite=args.overwrite, update=args.update,
                                    progress=progress, kernel=args.kernel,
                                    gamma=args.gamma, degree=args.degree, rank=args.rank,
                                    pivoting=args.pivoting, tol=args.tol, seed=args.seed,
                                    precision=args.precision,
                                    kernel_memory=args.kernel_memory, repivot=args.repivot)]
    elif args.command == "search":
        reports = [pipeline.search_job(client, args.queries, args.database, args.out,
                                       k=args.k, partition_rows=args.partition_rows,
                                       overwrite=args.overwrite, force=args.force,
                                       progress=progress)]
    elif args.command == "evaluate":
        from ..pipeline import evaluate as evaluation

        rows, _, report = evaluation.evaluate_job(
            client, args.corpus, args.methods, n_negatives=args.negatives, k=args.k,
            p_at=args.p_at, plot=args.plot, grids=_evaluate_grids(args),
            partition_rows=args.partition_rows, arrays=_evaluate_arrays(args))
        reports = [report]
    elif args.command == "encode":
        from ..storage import head_seq

        args.head_before = head_seq(args.out)  # what an interrupt says is committed
        reports = [pipeline.encode_job(client, args.model, args.positives, args.out,
                                       dtype=args.dtype, partition_rows=args.partition_rows,
                                       overwrite=args.overwrite, progress=progress,
                                       precision=args.precision,
                                       model=getattr(args, "loaded_model", None))]
    else:
        rows, reports = pipeline.demo_job(
            client, workdir=args.workdir, n_negatives=args.negatives,
            n_instances=args.instances, d=args.dim, lam=args.lam, seed=args.seed,
            progress=progress)
    return reports, rows


def _print_results(args, reports, rows) -> None:
    for report in reports:
        print("\n".join(report.lines()))
    if args.command == "demo":
        print()
        _print_table(rows)
    if args.command == "evaluate":
        from ..pipeline.evaluate import format_table

        print()
        print(format_table(rows))


def _evaluate_arrays(args) -> dict | None:
    """`evaluate`'s own labelled descriptors (name -> path), or None with --corpus."""
    if args.corpus is not None:
        return None
    return {"negatives": args.negatives_from, "database": args.database,
            "queries": args.queries, "database_labels": args.database_labels,
            "query_labels": args.query_labels}


def _evaluate_grids(args) -> dict[str, dict]:
    """`evaluate`'s parameter options as method -> {parameter: [values]}."""
    from ..core.validation import DEFAULT_LAM

    kernel = {name: getattr(args, name) for name in ("lam", "gamma", "rank")
              if getattr(args, name) is not None}
    if "lam" in kernel:  # a lambda relative to tr(Sigma) is linear SLEM's only
        kernel["lam"] = [v for v in kernel["lam"] if not isinstance(v, str)] or [1e-3]
    return {"slem": {"lam": args.lam or [DEFAULT_LAM]}, "kernel": kernel,
            "pca": {"eps": args.pca_eps},
            "esvm": {"lam": args.esvm_lam, "n_iter": args.esvm_iters}}


#: Set by :func:`console_main`: this process is the ``slem-dask`` executable.
_EXECUTABLE = False


def _import_dask_array_without_xarray() -> None:
    """Import dask.array without its optional import of xarray.

    dask.array imports xarray (and with it pandas) when installed, only so that
    ``da.from_array`` recognizes a DataArray; no command passes one, and the two cost
    0.3 s of every run (imports 1.2 -> 0.9 s on this project's machine). Only the
    executable does this, in its own process: ``main()`` called from Python leaves
    dask.array as it is, so that a caller's xarray inputs keep working.
    """
    if "dask.array" in sys.modules or "xarray" in sys.modules:
        return
    sys.modules["xarray"] = None  # import_optional_dependency: ImportError, so "absent"
    try:
        import dask.array  # noqa: F401
    finally:
        if sys.modules.get("xarray", 0) is None:
            del sys.modules["xarray"]


def main(argv=None) -> int:
    try:  # building the parser imports numpy (the kernels' names): a Ctrl-C may come here
        parser = build_parser()
        argv = _glue_negative_values(list(sys.argv[1:] if argv is None else argv))
        args = _parse(parser, argv)
    except KeyboardInterrupt:
        print("slem-dask: interrupted before any job started", file=sys.stderr)
        return 130
    _check_option_combinations(parser, args)
    # Interrupting a run leaves asyncio tasks of the closing client behind; their
    # "Task exception was never retrieved" tracebacks say nothing to a user.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    try:  # the first imports of dask, distributed and zarr: an interrupt may come here
        if _EXECUTABLE:  # after the parsing: --help and argument errors import no dask
            _import_dask_array_without_xarray()
        # A lost scheduler is reported once, as one line saying what is kept
        # (pipeline.JobFailed); the client's own reconnection log lines would only repeat it.
        import distributed  # noqa: F401 - its import sets its loggers' levels: override after

        logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
        from ..storage import IntegrityError
    except KeyboardInterrupt:
        return _interrupted(args)
    formatted, warnings.formatwarning = warnings.formatwarning, _warning_line(args.command)
    try:
        return _run(args)
    except KeyboardInterrupt:
        return _interrupted(args)
    except Exception as exc:  # noqa: BLE001 - an object store's failures are not OSErrors
        if isinstance(exc, BrokenPipeError) and _stdout_is_gone():
            return _reader_gone(args)
        from ..storage import is_out_of_space
        from ..storage.registry import describe_storage_error

        line = describe_storage_error(exc, _paths_of(args))
        written = exc.filename if isinstance(exc, OSError) and exc.filename else next(
            (p for p in (getattr(args, n, None) for n in ("out", "model", "workdir"))
             if isinstance(p, str)), None)  # what the command writes
        if line is None and is_out_of_space(exc) and written:  # not said by a job
            from ..pipeline.common import out_of_space_line

            line = out_of_space_line(exc, written, None, _not_complete(args, advice=False))
        if line is None and not isinstance(exc, (ValueError, TypeError, FileNotFoundError,
                                                 FileExistsError, OSError, IntegrityError)):
            raise
        print(f"slem-dask {args.command}: error: {line or exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        warnings.formatwarning = formatted


def _warning_line(command: str):
    """Warnings shown as one line like the errors ("slem-dask fit: warning: ..."), not
    Python's "file:line: Category: ..." and a line of slem-dask's source (the text only:
    warnings recorded by a caller, such as pytest, stay recorded)."""
    def text(message, category, filename, lineno, line=None):
        return f"slem-dask {command}: warning: {message}\n"
    return text


def _paths_of(args) -> list[str]:
    """The store paths a command names (for an object store's one-line errors)."""
    names = ("negatives", "model", "positives", "out", "queries", "database", "corpus", "path",
             "to")
    paths = [getattr(args, n) for n in names if isinstance(getattr(args, n, None), str)]
    return paths + [p for p in getattr(args, "paths", None) or [] if isinstance(p, str)]


def _spec_paths(spec) -> list[str]:
    """The store paths a job spec names."""
    if spec is None:
        return []
    paths = [spec.model.path] + ([spec.fit.negatives] if spec.fit else [])
    return paths + [p for e in spec.encode for p in (e.positives, e.out)]


def _stdout_is_gone() -> bool:
    """Whether stdout's reader went away: a BrokenPipeError may also come from a socket of
    the cluster or of a store, an error to report. The write end of a pipe (or socket)
    without a reader polls as POLLERR (or POLLHUP), always reported, whatever is asked."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)
        return bool(poller.poll(0))
    except (AttributeError, ValueError, OSError):  # no poll (Windows), or not a file
        return False


def _reader_gone(args) -> int:
    """The reader of stdout went away: exit quietly, as Python's documentation says to
    (docs.python.org/3/library/signal.html, "Note on SIGPIPE"), saying only on stderr
    what a job cut short by it left."""
    _silence_stdout()
    if args.command not in _STORE_COMMANDS \
            and getattr(args, "finished", None) is None:
        print(f"slem-dask {args.command}: stopped: the reader of its output closed it "
              f"before the job finished; {_not_complete(args)}", file=sys.stderr)
    return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    """stdout to /dev/null, so that the flush at exit cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _flush_stdout(code: int) -> int:
    """Flush stdout; the exit status to use if its reader went away meanwhile (a pipe's
    output is buffered: that shows here), a failed job's own status first."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return code or EXIT_BROKEN_PIPE
    return code


def _interrupted(args) -> int:
    """What an interrupt (Ctrl-C) leaves behind, said in one line; exit status 130."""
    progress = getattr(args, "progress", None)
    if progress or (progress is None and sys.stdout.isatty()):
        sys.stdout.write("\n")  # end a progress line written with "\r" (kernel passes)
        sys.stdout.flush()
    if getattr(args, "finished", None) is not None:
        _print_results(args, *args.finished)
        print(f"slem-dask {args.command}: interrupted while the dask cluster was closing, "
              f"after the job had finished: what it wrote above is complete",
              file=sys.stderr)
        return 130
    head_before = getattr(args, "head_before", None)
    # the interrupt may come after the job committed its output: complete only if this
    # job's commit moved the head past the one it began from (unknown: not begun)
    if args.command == "encode" and head_before is not None:
        from ..storage import marked_complete

        if marked_complete(args.out, after=head_before):
            print(f"slem-dask encode: interrupted after the output was finished: "
                  f"{args.out!r} is complete (`slem-dask verify {args.out}` checks it again)",
                  file=sys.stderr)
            return 130
    print(f"slem-dask {args.command}: interrupted; {_not_complete(args)}", file=sys.stderr)
    return 130


def _not_complete(args, short: bool = False, advice: bool = True) -> str:
    """What a command stopped before its end leaves, in its own words (``short``: without
    the advice to run it again; ``advice=False``: an encode's without it, for a message
    that ends with its own)."""
    if short:
        return ("the steps reported above are complete, the one under way was not marked "
                "complete" if args.command in ("run", "demo") else "nothing was marked complete")
    if args.command == "encode":  # what the storage holds now, not what a job may leave
        from ..pipeline.encode import what_is_kept

        return what_is_kept(args.out, getattr(args, "head_before", None), advice=advice)
    # demo and run write several stores one after the other: the ones they had
    # finished are complete (and verified), only the one under way is not
    said = {"run": "the steps reported above are complete; the one under way was not marked "
                   "complete (an unfinished output is kept and refused by readers): run the "
                   "same spec again to resume",
            "demo": "the stores it had finished are complete (`slem-dask verify PATH` says "
                    "which); the one under way was not marked complete: run `slem-dask demo` "
                    "again to finish"}
    default = "nothing was marked complete (no model or output was written)"
    return said.get(args.command, default)


def console_main() -> None:
    """The ``slem-dask`` executable: :func:`main`, then exit without Python's teardown.

    When ``main`` returns, every job has finished, closed what it wrote and
    released its leases, and the cluster is closed; tearing down the interpreter
    after that (the modules of dask, distributed, zarr, scipy, pandas: 0.5-0.8 s
    on this project's machine) would be a quarter of a small job's wall time.
    Exit handlers still run and the output streams are flushed.
    """
    import atexit

    global _EXECUTABLE
    _EXECUTABLE = True
    code = _flush_stdout(main())
    sys.stderr.flush()
    atexit._run_exitfuncs()
    code = _flush_stdout(code)
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
