"""The ``slem-dask`` command line: demo, fit, encode, run, search, evaluate.

This module runs a command: parse (:mod:`.parser`), check before any cluster starts
(:mod:`.checks`), connect, run the jobs (:mod:`.jobs`), and end in one line whatever
happens (:mod:`.endings`: errors, interrupts, a closed stdout).

Without ``--scheduler`` (or $DASK_SCHEDULER_ADDRESS) every command starts a
LocalCluster sized to this machine and closes it at the end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings

from .parser import _check_option_combinations, _glue_negative_values, _parse, build_parser
from .checks import (
    STORE_COMMANDS,
    _check_inputs,
    _check_report_path,
    _evaluate_arrays,
    _local_processes,
    _performance_report,
    _security,
)
from .jobs import _jobs, _print_results
from .endings import (
    EXIT_BROKEN_PIPE,  # noqa: F401
    _flush_stdout,
    _interrupted,
    _not_complete,
    WRITTEN,
    _paths_of,
    _reader_gone,
    _spec_paths,
    _stdout_is_gone,
)

#: Exit status of a command that failed (its one-line error on stderr).
EXIT_ERROR = 1


@contextlib.contextmanager
def _storage_timeout(seconds: float | None):
    """--storage-timeout: $SLEM_DASK_STORAGE_TIMEOUT while the command runs (a local
    cluster's workers inherit it; storage.deadlines reads it), as it was afterwards."""
    from ..storage.backends import ENV_TIMEOUT

    if seconds is None:
        yield
        return
    before = os.environ.get(ENV_TIMEOUT)
    os.environ[ENV_TIMEOUT] = f"{seconds:g}"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_TIMEOUT, None)
        else:
            os.environ[ENV_TIMEOUT] = before


def _run(args) -> int:
    if args.command in STORE_COMMANDS:
        return _store_command(args)
    progress = sys.stdout.isatty() if args.progress is None else args.progress
    spec, scheduler, workers, threads = _cluster_settings(args)
    security = _check_before_cluster(args, spec)
    import time

    from ..cluster.connect import connect

    started = time.perf_counter()
    processes, why = _local_processes(args, spec, workers, threads)
    with (
        connect(
            scheduler,
            workers,
            threads,
            security=security,
            quiet=not progress,
            processes=processes,
            task_profile=bool(args.performance_report),  # the report's "Worker Profile"
        ) as client,
        _performance_report(args.performance_report),
    ):
        from ..storage import listed_workers

        listed = listed_workers(client)
        where = (
            ""
            if args.scheduler_address
            else f" (local worker processes: {why})"
            if processes
            else f" in this process ({sum(client.nthreads().values())} threads; {why})"
        )
        none_yet = (
            f" (none connected yet: nothing runs until one does; start workers with "
            f"`dask worker {client.scheduler.address}`)"
            if not listed
            else ""
        )
        print(
            f"dask: {client.scheduler.address} with {len(listed)} worker(s){none_yet}{where}, "
            f"start-up {time.perf_counter() - started:.2f} s (the jobs' own times follow)",
            flush=True,
        )
        reports, rows = _watched_jobs(args, client, spec, progress)
        # done: a Ctrl-C while the cluster closes must not say that nothing was written
        args.finished = (reports, rows if args.command in ("demo", "evaluate") else None)
    _print_results(args, *args.finished)
    return 0


def _store_command(args) -> int:
    """``verify``, ``versions``, ``rollback``, ``export``: no cluster."""
    from . import stores as cli_stores

    if args.command == "verify":
        return 0 if cli_stores.verify(args.paths) else EXIT_ERROR
    if args.command == "export":
        cli_stores.export(args)
        return 0
    cli_stores.versions(args)
    return 0


def _cluster_settings(args):
    """(the job spec of ``run``, or None; scheduler, workers, threads per worker): the
    options, else the spec's ``[cluster]``. The spec is read before any cluster starts:
    its errors come first."""
    spec = None
    scheduler, workers, threads = args.scheduler, args.workers, args.threads_per_worker
    if args.command == "run":
        from ..pipeline.jobspec import load_spec

        spec = load_spec(args.spec)
        scheduler = scheduler or spec.cluster.scheduler
        workers = workers or spec.cluster.workers
        threads = threads or spec.cluster.threads_per_worker
        if args.task_timeout is None and spec.cluster.task_timeout is not None:
            args.task_timeout = spec.cluster.task_timeout
            args.task_timeout_source = "[cluster] task_timeout"
    args.scheduler_address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS")
    return spec, scheduler, workers, threads


def _check_before_cluster(args, spec):
    """Every check that needs no cluster, before one starts; the TLS Security (or None)."""
    from ..cluster.preflight import check_store_names, check_writable, output_paths

    security = _security(args)  # before any cluster starts, like every input check
    outputs = output_paths(args, spec)
    check_store_names(outputs, files_only=True)  # an export there: named for what it is
    _check_inputs(args, spec)  # input errors come before any cluster starts
    check_writable(outputs)  # so do read-only output folders
    _check_report_path(args)  # and a report file that could not be written at the end
    if args.command == "search":
        from ..pipeline.search import check_search_inputs

        check_search_inputs(args.queries, args.database, args.k, args.force)
    elif args.command == "evaluate":
        from ..pipeline.evaluate import check_evaluate_inputs

        check_evaluate_inputs(
            args.corpus,
            args.methods,
            args.negatives,
            args.k,
            args.plot,
            _evaluate_arrays(args),
            args.ground_truth,
        )
    return security


def _watched_jobs(args, client, spec, progress: bool):
    """The command's jobs, with stalls and lost workers said in one line each."""
    from ..cluster import watchdog
    from ..cluster import workers as worker_faults

    with (
        watchdog.watch(
            client,
            args.task_timeout,
            what_is_kept=lambda: _not_complete(args, advice=False),
            source=getattr(args, "task_timeout_source", "--task-timeout"),
            progress_every=None if progress else watchdog.progress_line_seconds(),
            stores=_watched_stores(args, spec),
        ),
        worker_faults.explain_failures(client, _not_complete(args, short=True)),
    ):
        return _jobs(args, client, spec, progress)


def _watched_stores(args, spec) -> list[str]:
    """The stores a stall line may name, the one the command writes first: its tasks
    wait there (an encode named its model, read at its start from the same silent
    object store, while its writes to --out waited; a helper's run)."""
    option = {"encode": "out", **WRITTEN}.get(args.command)
    written = getattr(args, option, None) if option else None
    return sorted(_paths_of(args) + _spec_paths(spec), key=lambda path: path != written)


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


def _quiet_client_loggers() -> None:
    """Interrupting a run leaves asyncio tasks of the closing client behind; their "Task
    exception was never retrieved" tracebacks say nothing to a user. gcsfs logs each
    request it gave up on with its traceback, then raises it: the command says it once,
    in one line (storage.deadlines: a request met its deadline)."""
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)


def main(argv=None) -> int:
    try:  # building the parser imports numpy (the kernels' names): a Ctrl-C may come here
        parser = build_parser()
        argv = _glue_negative_values(list(sys.argv[1:] if argv is None else argv))
        args = _parse(parser, argv)
    except KeyboardInterrupt:
        print("slem-dask: interrupted before any job started", file=sys.stderr)
        return 130
    _check_option_combinations(parser, args)
    _quiet_client_loggers()
    try:  # the first imports of dask, distributed and zarr: an interrupt may come here
        if _EXECUTABLE:  # after the parsing: --help and argument errors import no dask
            _import_dask_array_without_xarray()
        # A lost scheduler is reported once, as one line saying what is kept
        # (pipeline.JobFailed); the client's own reconnection log lines would only repeat it.
        import distributed  # noqa: F401 - its import sets its loggers' levels: override after

        logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
        from .. import storage  # noqa: F401 - imported here, where an interrupt is said
    except KeyboardInterrupt:
        return _interrupted(args)
    # the command's deadlines hold until its last line: its error names them
    with _storage_timeout(getattr(args, "storage_timeout", None)):
        if args.command == "run":
            if len(args.spec) > 1:
                return _run_specs(args)
            args.spec = args.spec[0]
        return _run_reported(args)


def _run_specs(args) -> int:
    """``run A.toml B.toml ...``: each spec as if run alone, in order, each with its own
    report; the first that fails (or is interrupted) stops the rest, and says so."""
    import copy

    specs = list(args.spec)
    for i, path in enumerate(specs, 1):
        print(f"slem-dask run: {path} ({i} of {len(specs)})", flush=True)
        one = copy.copy(args)
        one.spec = path
        code = _run_reported(one)
        if code != 0:
            rest = specs[i:]
            if rest:
                print(
                    f"slem-dask run: {path} did not finish, so {len(rest)} later spec(s) "
                    f"were not run ({' '.join(rest[:3])}{' ...' if len(rest) > 3 else ''}); "
                    f"the specs before it are complete",
                    file=sys.stderr,
                )
            return code
    return 0


def _run_reported(args) -> int:
    """One command (one spec of ``run``), ended in one line whatever happens."""
    from ..storage import IntegrityError

    formatted, warnings.formatwarning = warnings.formatwarning, _warning_line(args.command)
    try:
        return _run(args)
    except KeyboardInterrupt:
        return _interrupted(args)
    except Exception as exc:  # noqa: BLE001 - an object store's failures are not OSErrors
        if isinstance(exc, BrokenPipeError) and _stdout_is_gone():
            return _reader_gone(args)
        from ..storage import is_out_of_space

        line = _storage_line(exc, args)
        written = (
            exc.filename
            if isinstance(exc, OSError) and exc.filename
            else next(
                (
                    p
                    for p in (getattr(args, n, None) for n in ("out", "model", "workdir"))
                    if isinstance(p, str)
                ),
                None,
            )
        )  # what the command writes
        if line is None and is_out_of_space(exc) and written:  # not said by a job
            from ..pipeline.common import out_of_space_line

            line = out_of_space_line(exc, written, None, _not_complete(args, advice=False))
        if line is None and not isinstance(
            exc,
            (ValueError, TypeError, FileNotFoundError, FileExistsError, OSError, IntegrityError),
        ):
            raise
        print(f"slem-dask {args.command}: error: {line or exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        warnings.formatwarning = formatted


def _storage_line(exc: BaseException, args) -> str | None:
    """One line for a storage failure: the backend's own (credentials, bucket,
    endpoint, a 5xx burst), else a client library's exception as one line (never a
    traceback); None for any other error."""
    from ..storage.backends import is_storage_failure
    from ..storage.versioning import describe_storage_error

    line = describe_storage_error(exc, _paths_of(args))
    if line is None and not isinstance(exc, OSError) and is_storage_failure(exc):
        line = " ".join(f"{type(exc).__name__}: {exc}".split())
    return line


def _warning_line(command: str):
    """Warnings shown as one line like the errors ("slem-dask fit: warning: ..."), not
    Python's "file:line: Category: ..." and a line of slem-dask's source (the text only:
    warnings recorded by a caller, such as pytest, stay recorded)."""

    def text(message, category, filename, lineno, line=None):
        return f"slem-dask {command}: warning: {message}\n"

    return text


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
