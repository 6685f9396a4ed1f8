"""The ``slem-dask`` command line: demo, fit, encode, run, search, evaluate.

Without ``--scheduler`` (or $DASK_SCHEDULER_ADDRESS) every command starts a
LocalCluster sized to this machine and closes it at the end.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys

from ._version import __version__

EXIT_ERROR = 1


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _grid(convert):
    """argparse type: one value or a comma-separated list of them, as a list."""
    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"expected comma-separated values such as "
                                             f"1e-3,1e-2, got {text!r}")
        values = [convert(t) for t in items]
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"{text!r} repeats a value")
        return values

    return parse


def _at_least_two(text: str) -> int:
    value = _positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected an integer >= 2 (a model needs at least "
                                         f"2 negatives), got {text!r}")
    return value


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="address of a running dask scheduler, e.g. tcp://host:8786 "
                        "(default: $DASK_SCHEDULER_ADDRESS, else a LocalCluster on this machine)")
    g.add_argument("--workers", type=_positive_int, metavar="N",
                   help="LocalCluster worker processes (default: one per core)")
    g.add_argument("--threads-per-worker", type=_positive_int, metavar="N",
                   help="LocalCluster threads per worker (default: 1)")
    g.add_argument("--local-cluster", choices=("auto", "processes", "threads"), default="auto",
                   help="without --scheduler: a LocalCluster of worker processes, or one "
                        "worker in this process with a thread per core (starts in a fraction "
                        "of the time); auto (default): threads for inputs under 256 MiB, "
                        "unless --workers or --threads-per-worker is given")
    g.add_argument("--task-timeout", type=_positive_float, metavar="SECONDS",
                   help="give up (exit 1) when no task of the job finishes for SECONDS, "
                        "naming the workers it waits for (default: wait; a line is printed "
                        "after every 60 s without progress, $SLEM_DASK_STALL_WARNING)")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show progress bars (default: when the output is a terminal)")
    g.add_argument("--performance-report", metavar="HTML",
                   help="save Dask's performance report of the run to this HTML file")
    g.add_argument("--tls-ca-file", metavar="PEM", help="CA certificate, for a TLS scheduler")
    g.add_argument("--tls-cert", metavar="PEM", help="client certificate, for a TLS scheduler")
    g.add_argument("--tls-key", metavar="PEM", help="client private key, for a TLS scheduler")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _add_kernel_args(p: argparse.ArgumentParser) -> None:
    from .core.kernels import KERNELS

    g = p.add_argument_group("kernel SLEM (with --kernel; without it, a linear SLEM)")
    g.add_argument("--kernel", choices=KERNELS,
                   help="fit a KernelSLEM with this kernel (intersection, chi2: non-negative "
                        "histograms only)")
    g.add_argument("--gamma", type=_positive_float,
                   help="gamma of the rbf, quad and poly kernels (default: 0.1)")
    g.add_argument("--degree", type=_positive_int,
                   help="degree of the poly kernel (default: 2)")
    g.add_argument("--rank", type=_positive_int, metavar="R",
                   help="maximum number of pivots of the incomplete Cholesky factor "
                        "(default: no limit, stop on --tol)")
    g.add_argument("--pivoting", choices=("greedy", "rpcholesky"),
                   help="greedy: one pass over the negatives per pivot; rpcholesky: "
                        "randomly pivoted, many pivots per pass (default: greedy)")
    g.add_argument("--tol", type=_fraction,
                   help="stop when the residual trace is below TOL x the trace (default: 1e-3)")
    g.add_argument("--seed", type=int, metavar="N",
                   help="random seed of rpcholesky (default 0, as in job specs: reruns give "
                        "the same model)")
    g.add_argument("--kernel-memory", choices=("auto", "in-memory", "streaming"),
                   help="in-memory: the workers hold the negatives' rows and factor rows for "
                        "the whole fit (fast while they fit); streaming: every pass reads the "
                        "negatives again, memory independent of their number; auto: in-memory "
                        "if its estimate fits in 60%% of the workers' memory limits (default: "
                        "auto; the report says which and why)")
    g.add_argument("--repivot", action="store_true", default=None,
                   help="with --update (implied): refit the kernel model's pivots on all rows "
                        "instead of merging the appended rows into the stored statistics")


def _add_partition_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--partition-rows", type=_positive_int, metavar="N",
                   help="rows per dask partition, rounded up to whole zarr chunks/shards "
                        "(default: about 64 MiB of float64 per partition)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slem-dask",
        description="Square-loss exemplar machines for image retrieval, on Dask. "
                    "PATH arguments are zarr v3 arrays: a local path or an fsspec URL.")
    parser.add_argument("--version", action="version", version=f"slem-dask {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="generate a small corpus, fit, encode, evaluate, print a table")
    p.add_argument("--workdir", default="slem-demo", help="where the corpus and model go "
                   "(default: ./slem-demo)")
    p.add_argument("--negatives", type=_at_least_two, default=50_000, metavar="N",
                   help="number of negatives to generate, at least 2 (default: 50000)")
    p.add_argument("--instances", type=_positive_int, default=1_000, metavar="N",
                   help="number of instances; the database holds 4 views of each (default: 1000)")
    p.add_argument("--dim", type=_positive_int, default=128, metavar="D",
                   help="descriptor dimension (default: 128)")
    p.add_argument("--lam", type=_positive_float, default=1e-3, help="ridge lambda (default: 1e-3)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the generated corpus and of the kernel pivots (default: 0)")
    _add_cluster_args(p)

    p = sub.add_parser("fit", help="fit a linear (or, with --kernel, kernel) SLEM model on "
                       "negatives stored in zarr")
    p.add_argument("--negatives", required=True, metavar="PATH",
                   help="zarr array (n, d) of negatives, e.g. corpus.zarr/negatives")
    p.add_argument("--model", required=True, metavar="PATH", help="zarr group to write the model to")
    p.add_argument("--lam", type=_positive_float, default=1e-3,
                   help="ridge lambda > 0 (default: 1e-3)")
    p.add_argument("--theta", type=_positive_float, default=1.0,
                   help="weight of the positive; changes only exemplar() norms (default: 1)")
    p.add_argument("--precision", choices=("auto", "float64"), default="auto",
                   help="arithmetic inside blocks (linear SLEM): auto = the input's (float32 "
                        "stays float32, within 1e-5 of float64), float64 = float64 throughout "
                        "(default: auto)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing model written by slem-dask (refit from scratch, "
                        "also with --update); anything else at MODEL is never deleted")
    p.add_argument("--update", action="store_true",
                   help="if MODEL was fitted on the first rows of NEGATIVES, merge the rows "
                        "appended since (reads only the new rows)")
    _add_kernel_args(p)
    _add_partition_arg(p)
    _add_cluster_args(p)

    p = sub.add_parser("encode", help="encode positives stored in zarr with a fitted model")
    p.add_argument("--model", required=True, metavar="PATH", help="model written by `fit`")
    p.add_argument("--positives", required=True, metavar="PATH",
                   help="zarr array (m, d) of descriptors to encode")
    p.add_argument("--out", required=True, metavar="PATH", help="zarr array to write (m, d)")
    p.add_argument("--dtype", choices=("float32", "float64"),
                   help="dtype of the output (default: the positives' float dtype)")
    p.add_argument("--precision", choices=("auto", "float64"),
                   help="arithmetic of a linear SLEM encoding: auto = the input's (float32 "
                        "stays float32, within 1e-5 of float64), float64 = float64 "
                        "(default: the model's setting)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output written by slem-dask (without it, an "
                        "unfinished output is resumed, partitions whose positives changed or "
                        "were appended are encoded, and an output of another model is an "
                        "error); anything else at OUT is never deleted")
    _add_partition_arg(p)
    _add_cluster_args(p)

    p = sub.add_parser("run", help="run a job spec (TOML): fit and encode steps, re-runnable")
    p.add_argument("spec", metavar="SPEC.toml", help="job spec, e.g. jobs/demo.toml")
    p.add_argument("--overwrite", action="store_true",
                   help="refit the model and rebuild every output from scratch (only stores "
                        "written by slem-dask are ever replaced)")
    _add_cluster_args(p)

    p = sub.add_parser("search", help="exact top-k of encoded queries against an encoded "
                       "database; writes (scores, indices) to zarr")
    p.add_argument("--queries", required=True, metavar="PATH",
                   help="zarr array (q, d) of query encodings")
    p.add_argument("--database", required=True, metavar="PATH",
                   help="zarr array (m, d) of database encodings")
    p.add_argument("--k", type=_positive_int, default=100, metavar="K",
                   help="results per query, at most the database size (default: 100)")
    p.add_argument("--out", required=True, metavar="PATH",
                   help="zarr group to write, with arrays scores (q, k) and indices (q, k)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing search result written by slem-dask")
    p.add_argument("--force", action="store_true",
                   help="search even if queries and database were encoded by different models")
    _add_partition_arg(p)
    _add_cluster_args(p)

    p = sub.add_parser("evaluate", help="compare raw, PCA-whitening, E-SVM and SLEM on a "
                       "corpus: results table and precision-recall plot")
    p.add_argument("--corpus", required=True, metavar="PATH",
                   help="zarr group with negatives, database, queries, database_labels, "
                        "query_labels (datasets.write_corpus; `demo` writes WORKDIR/corpus.zarr)")
    p.add_argument("--methods", default="raw,pca,esvm,slem", metavar="LIST",
                   help="comma-separated methods among raw, pca, esvm, slem, kernel "
                        "(kernel: rbf, gamma 0.5, rank 256, rpcholesky) "
                        "(default: raw,pca,esvm,slem)")
    p.add_argument("--negatives", type=_positive_int, metavar="N",
                   help="fit on the first N negatives (default: all)")
    p.add_argument("--k", type=_positive_int, metavar="K",
                   help="ranking length for mAP (default: the database, up to 10000)")
    p.add_argument("--p-at", type=_positive_int, metavar="K",
                   help="k of the P@k column (default: median number of relevant items)")
    p.add_argument("--plot", metavar="PNG", help="save precision-recall curves to this PNG")
    g = p.add_argument_group(
        "parameters (each takes one value or a comma-separated grid, e.g. --lam 1e-3,1e-2,1e-1:"
        " every setting gets a row, and the best per method is marked *)")
    g.add_argument("--lam", type=_grid(_positive_float), metavar="LAM[,LAM...]",
                   help="ridge lambda of linear and kernel SLEM (default: 1e-3)")
    g.add_argument("--gamma", type=_grid(_positive_float), metavar="G[,G...]",
                   help="kernel SLEM rbf gamma (default: 0.5)")
    g.add_argument("--rank", type=_grid(_positive_int), metavar="R[,R...]",
                   help="kernel SLEM rank (default: 256)")
    g.add_argument("--esvm-lam", type=_grid(_positive_float), default=[1e-2],
                   metavar="LAM[,LAM...]", help="E-SVM ridge lambda (default: 1e-2)")
    g.add_argument("--esvm-iters", type=_grid(_positive_int), default=[1000],
                   metavar="T[,T...]",
                   help="E-SVM stochastic sub-gradient steps per positive (default: 1000)")
    g.add_argument("--pca-eps", type=_grid(_positive_float), default=[1e-6],
                   metavar="EPS[,EPS...]",
                   help="PCA whitening regularizer added to the variances (default: 1e-6)")
    _add_partition_arg(p)
    _add_cluster_args(p)

    p = sub.add_parser("verify", help="check a model, output or search result written by "
                       "slem-dask end to end (checksums, completeness); exit 1 on any problem")
    p.add_argument("paths", nargs="+", metavar="PATH", help="stores to check")

    p = sub.add_parser("versions", help="list the committed versions of a store written by "
                       "slem-dask (newest last), with the folder each can be read from")
    p.add_argument("path", metavar="PATH")
    p = sub.add_parser("rollback", help="make an earlier version of a store the current one "
                       "(a new commit; the history is kept)")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--to", type=int, required=True, metavar="N",
                   help="the version to restore (see `slem-dask versions PATH`)")
    parser.commands = sub.choices  # command -> its parser, for errors in its own words
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args, but an unknown option is reported by its command's parser (its usage,
    not the top-level one) with the closest option it has: argparse itself leaves
    unknown options to the top-level parser."""
    import difflib

    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = parser.commands[args.command]
        options = [o for action in command._actions for o in action.option_strings]
        close = difflib.get_close_matches(unknown[0].split("=")[0], options, n=1)
        command.error(f"unrecognized arguments: {' '.join(unknown)}"
                      + (f"; did you mean {close[0]}?" if close else ""))
    return args


def _print_table(rows: list[dict]) -> None:
    cols = list(rows[0])
    text = [[f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in text)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for t in text:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip())


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
    for flag, path in zip(("--tls-ca-file", "--tls-cert", "--tls-key"), given):
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
    from . import integrity, storage

    paths = {k: getattr(args, k, None) for k in ("negatives", "model", "positives", "out",
                                                 "queries", "database", "corpus")}
    if spec is not None:
        paths.update({"model.path": spec.model.path,
                      "fit.negatives": spec.fit.negatives if spec.fit else None,
                      **{f"encode[{i}].positives": e.positives for i, e in enumerate(spec.encode)},
                      **{f"encode[{i}].out": e.out for i, e in enumerate(spec.encode)}})
    for key, path in paths.items():
        if isinstance(path, str) and integrity.canonical(path).url.startswith("memory://"):
            raise ValueError(
                f"{key} {path!r}: a memory:// store lives only as long as one process, and "
                f"this command's would vanish when it exits; give a path or a URL (file://, "
                f"s3://...) that the workers and later commands can read")

    if args.command == "run":
        from .jobspec import check_inputs

        check_inputs(spec)
    elif args.command == "fit":
        from .pipeline import _open_negatives

        _open_negatives(args.negatives, args.model, args.overwrite, args.update)
    elif args.command == "search":
        storage.check_distinct(args.out, "--out", {"queries": args.queries,
                                                  "database": args.database})
        if storage._exists(args.out):
            if not args.overwrite:
                raise FileExistsError(f"output {str(integrity.canonical(args.out))!r} already "
                                      f"exists; pass --overwrite to replace it")
            integrity.check_may_replace(args.out, "search result", kind="search")
    elif args.command == "encode":
        from .models import load_model
        from .pipeline import check_encode_inputs

        args.loaded_model = load_model(args.model)  # read once: the job encodes with it
        check_encode_inputs(args.loaded_model, args.model, args.positives, args.out,
                            args.dtype, args.overwrite, partition_rows=args.partition_rows,
                            precision=args.precision)


def _local_processes(args, spec, workers, threads) -> tuple[bool, str]:
    """Whether a LocalCluster (if one is started) has worker processes, and why."""
    from .cluster import SMALL_INPUT_BYTES

    choice = args.local_cluster
    if choice != "auto":
        return choice == "processes", f"--local-cluster {choice}"
    if args.workers or args.threads_per_worker:
        return True, "--workers/--threads-per-worker given"
    if workers or threads:
        return True, "workers/threads_per_worker set in the spec's [cluster]"
    size = _input_bytes(args, spec)
    if size is None:
        return True, "input size not known before the run"
    if size >= SMALL_INPUT_BYTES:
        return True, f"input {size / 2**20:.0f} MiB >= {SMALL_INPUT_BYTES // 2**20} MiB"
    return False, (f"input {size / 2**20:.0f} MiB < {SMALL_INPUT_BYTES // 2**20} MiB; "
                   f"--local-cluster processes for worker processes")


def _input_bytes(args, spec) -> int | None:
    """Uncompressed bytes of the arrays a command reads, or None if not known
    before it runs (a spec that generates its data, a store that is not there)."""
    from . import storage

    if args.command == "fit":
        paths = [args.negatives]
    elif args.command == "encode":
        paths = [args.positives]
    elif args.command == "search":
        paths = [args.queries, args.database]
    elif args.command == "evaluate":
        paths = [f"{str(args.corpus).rstrip('/')}/{name}"
                 for name in ("negatives", "database", "queries")]
    elif args.command == "run" and spec is not None and not getattr(spec, "generate", None):
        paths = ([spec.fit.negatives] if spec.fit else []) + [e.positives for e in spec.encode]
    else:
        return None
    try:
        return sum(int(storage.open_input(p, "input").nbytes) for p in paths)
    except Exception:  # noqa: BLE001 - the job itself reports a bad input
        return None


def _versions(args) -> int:
    from .storage import versions

    store = versions.VersionedStore(args.path)
    if not store.has_history():
        raise ValueError(f"{str(store.path)!r} has no versions: it was not written by this "
                         f"slem-dask (or not at all); `slem-dask verify {args.path}` says what "
                         f"it is")
    if args.command == "rollback":
        commit = store.rollback(args.to)
        print(f"{store.path}: version {commit.seq} is now current ({commit.source})")
        return 0
    commits = store.commits()
    head = commits[-1].seq if commits else None
    for c in commits:
        state = "current" if c.seq == head else (
            "readable" if store.exists(c.version) else "pruned")
        where = store.location(c.version) if state != "pruned" else "-"
        print(f"{c.seq:>5}  {c.kind:<9} {state:<8} {c.created}  {c.job} on {c.host}"
              f"{'  (' + c.source + ')' if c.source else ''}  {where}")
    if not commits:
        print(f"{store.path}: no committed version (an unfinished first write)")
    return 0


def _verify(paths) -> int:
    from . import storage

    code = 0
    for path in paths:
        what, problems = storage.verify(path)
        if problems:
            code = EXIT_ERROR
            print(f"{path}: {what}: {len(problems)} problem(s)")
            for problem in problems:
                print(f"  - {problem}")
        else:
            print(f"{path}: {what}: ok")
    return code


def _run(args) -> int:
    from .cluster import connect

    if args.command == "verify":
        return _verify(args.paths)
    if args.command in ("versions", "rollback"):
        return _versions(args)
    progress = sys.stdout.isatty() if args.progress is None else args.progress
    spec = None
    scheduler, workers, threads = args.scheduler, args.workers, args.threads_per_worker
    if args.command == "run":
        from .jobspec import load_spec

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
    from .preflight import check_writable, output_paths

    check_writable(output_paths(args, spec))  # so do read-only output folders
    if args.command in ("search", "evaluate"):
        from . import evaluation

        if args.command == "search":
            evaluation.check_search_inputs(args.queries, args.database, args.k, args.force)
        else:
            evaluation.check_evaluate_inputs(args.corpus, args.methods, args.negatives, args.k,
                                             args.plot)
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
        from . import watchdog, workers as worker_faults

        with watchdog.watch(client, args.task_timeout, what_is_kept=_not_complete(args),
                            source=getattr(args, "task_timeout_source", "--task-timeout")), \
                worker_faults.explain_failures(client, _not_complete(args, short=True)):
            reports, rows = _jobs(args, client, spec, progress)
        # done: a Ctrl-C while the cluster closes must not say that nothing was written
        args.finished = (reports, rows if args.command in ("demo", "evaluate") else None)
    _print_results(args, *args.finished)
    return 0


def _jobs(args, client, spec, progress: bool):
    """Run the command's job(s) on ``client``: (reports, rows of a results table)."""
    from . import pipeline

    rows = None
    if args.command == "run":
        from .jobspec import run_spec

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
        from . import evaluation

        reports = [evaluation.search_job(client, args.queries, args.database, args.out,
                                         k=args.k, partition_rows=args.partition_rows,
                                         overwrite=args.overwrite, force=args.force)]
    elif args.command == "evaluate":
        from . import evaluation

        rows, _, report = evaluation.evaluate_job(
            client, args.corpus, args.methods, n_negatives=args.negatives, k=args.k,
            p_at=args.p_at, plot=args.plot, grids=_evaluate_grids(args),
            partition_rows=args.partition_rows)
        reports = [report]
    elif args.command == "encode":
        from .storage import head_seq

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
        from .evaluation import format_table

        print()
        print(format_table(rows))


def _evaluate_grids(args) -> dict[str, dict]:
    """`evaluate`'s parameter options as method -> {parameter: [values]}."""
    kernel = {name: getattr(args, name) for name in ("lam", "gamma", "rank")
              if getattr(args, name) is not None}
    return {"slem": {"lam": args.lam or [1e-3]}, "kernel": kernel,
            "pca": {"eps": args.pca_eps},
            "esvm": {"lam": args.esvm_lam, "n_iter": args.esvm_iters}}


#: Kernel options of `fit` and their defaults, applied only with --kernel.
KERNEL_DEFAULTS = {"gamma": 0.1, "degree": 2, "rank": None, "pivoting": "greedy",
                   "tol": 1e-3, "seed": 0, "kernel_memory": "auto", "repivot": False}


def _check_option_combinations(parser: argparse.ArgumentParser, args) -> None:
    """Options that parse on their own but make no sense together: usage errors (exit 2)."""
    sub = parser._subparsers._group_actions[0].choices[args.command]  # the command's usage
    if args.command == "fit":
        given = [f"--{name.replace('_', '-')}" for name in KERNEL_DEFAULTS
                 if getattr(args, name) is not None]
        if args.kernel is None and given:
            verb = "applies" if len(given) == 1 else "apply"
            sub.error(f"{', '.join(given)} {verb} only to kernel SLEM models, but no "
                         f"--kernel was given (without it `fit` fits a linear SLEM); add "
                         f"--kernel rbf (or another kernel), or drop {', '.join(given)}")
        for name, default in KERNEL_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, default)
        args.update = args.update or args.repivot  # --repivot: an update that refits
    if args.command == "evaluate" and args.p_at is not None and args.k is not None \
            and args.p_at > args.k:
        sub.error(f"--p-at {args.p_at} is larger than the ranking length --k {args.k}: "
                     f"P@{args.p_at} would count missing ranks as misses; use --p-at "
                     f"{args.k} or less, or a larger --k")


def _glue_negative_values(argv: list[str]) -> list[str]:
    """``--lam -1e-3`` as ``--lam=-1e-3``: argparse takes '-1e-3' for an option (only
    '-1' and '-.5' look like numbers to it) and would say "expected one argument";
    glued, the value reaches the option's own check, which says what is allowed."""
    out = []
    for token in argv:
        if (out and out[-1].startswith("--") and "=" not in out[-1]
                and token.startswith("-") and _is_number_list(token)):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def _is_number_list(text: str) -> bool:
    try:
        [float(v) for v in text.split(",")]
    except ValueError:
        return False
    return True


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
        # A lost scheduler is reported once, as one line saying what is kept
        # (pipeline.JobFailed); the client's own reconnection log lines would only repeat it.
        import distributed  # noqa: F401 - its import sets its loggers' levels: override after

        logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
        from .integrity import IntegrityError
    except KeyboardInterrupt:
        return _interrupted(args)
    try:
        return _run(args)
    except KeyboardInterrupt:
        return _interrupted(args)
    except Exception as exc:  # noqa: BLE001 - an object store's failures are not OSErrors
        from .storage.backend import describe_storage_error

        line = describe_storage_error(exc, _paths_of(args))
        if line is None and not isinstance(exc, (ValueError, TypeError, FileNotFoundError,
                                                 FileExistsError, OSError, IntegrityError)):
            raise
        print(f"slem-dask {args.command}: error: {line or exc}", file=sys.stderr)
        return EXIT_ERROR


def _paths_of(args) -> list[str]:
    """The store paths a command names (for an object store's one-line errors)."""
    names = ("negatives", "model", "positives", "out", "queries", "database", "corpus", "path")
    paths = [getattr(args, n) for n in names if isinstance(getattr(args, n, None), str)]
    return paths + [p for p in getattr(args, "paths", None) or [] if isinstance(p, str)]


def _interrupted(args) -> int:
    """What an interrupt (Ctrl-C) leaves behind, said in one line; exit status 130."""
    if getattr(args, "finished", None) is not None:
        _print_results(args, *args.finished)
        print(f"slem-dask {args.command}: interrupted while the dask cluster was closing, "
              f"after the job had finished: what it wrote above is complete",
              file=sys.stderr)
        return 130
    if args.command == "encode":  # the interrupt may come after the job marked it complete
        from .storage import marked_complete

        if marked_complete(args.out, after=getattr(args, "head_before", None)):
            print(f"slem-dask encode: interrupted after the output was finished: "
                  f"{args.out!r} is complete (`slem-dask verify {args.out}` checks it again)",
                  file=sys.stderr)
            return 130
    print(f"slem-dask {args.command}: interrupted; {_not_complete(args)}", file=sys.stderr)
    return 130


def _not_complete(args, short: bool = False) -> str:
    """What a command stopped before its end leaves, in its own words (``short``: without
    the advice to run it again)."""
    if short:
        return ("the steps reported above are complete, the one under way was not marked "
                "complete" if args.command in ("run", "demo") else "nothing was marked complete")
    # demo and run write several stores one after the other: the ones they had
    # finished are complete (and verified), only the one under way is not
    said = {"encode": "nothing was committed: readers still see the previous version, if "
                      "any; the partitions already written are kept in this job's draft: run "
                      "the same command again to resume",
            "run": "the steps reported above are complete; the one under way was not marked "
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

    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
