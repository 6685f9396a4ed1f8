"""The command line's checks before a cluster starts (inputs, TLS, the report file) and
its choice of a local cluster's kind."""

from __future__ import annotations

import os

#: The commands that run without a cluster (:mod:`slem_dask.cli.stores`).
STORE_COMMANDS = ("verify", "versions", "rollback", "export")


def _security(args):
    """A TLS Security from --tls-* (all three or none), else None: the client then
    follows dask's configuration (distributed.comm.tls.* in YAML or DASK_* variables)."""
    given = [args.tls_ca_file, args.tls_cert, args.tls_key]
    if not any(given):
        return None
    address = getattr(args, "scheduler_address", None)
    if not address:
        raise ValueError(
            "--tls-ca-file, --tls-cert and --tls-key apply to a TLS scheduler: "
            "give its address with --scheduler tls://host:8786 (a LocalCluster "
            "needs no certificates)"
        )
    if not address.startswith("tls://"):
        raise ValueError(
            f"--tls-* options were given but the scheduler address {address!r} "
            f"is not a TLS address; use --scheduler tls://HOST:PORT"
        )
    if not all(given):
        raise ValueError("--tls-ca-file, --tls-cert and --tls-key go together; give all three")
    for flag, path in zip(("--tls-ca-file", "--tls-cert", "--tls-key"), given, strict=True):
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{flag}: no file at {path!r}; give a PEM file "
                f"(deploy/tls/make_certs.py makes a test set)"
            )
    from distributed.security import Security

    return Security(
        tls_ca_file=args.tls_ca_file,
        tls_client_cert=args.tls_cert,
        tls_client_key=args.tls_key,
        require_encryption=True,
    )


def _performance_report(path):
    """Dask's performance report of the run, written to ``path`` when the block ends (a
    path checked before any cluster starts, by :func:`_check_report_path`)."""
    import contextlib

    if not path:
        return contextlib.nullcontext()
    from distributed import performance_report

    return performance_report(filename=path)


def _check_report_path(args) -> None:
    """--performance-report: distributed writes it only once the job has run, so a folder
    that does not exist, or a folder given as the file, is refused before any cluster."""
    from ..cluster.preflight import check_output_file

    check_output_file(
        "--performance-report", getattr(args, "performance_report", None), "report.html"
    )


def _check_inputs(args, spec) -> None:
    """What can be checked from metadata alone, so that bad paths fail in a second
    instead of after a cluster start-up. The jobs check again (cheaply) themselves."""
    from .. import storage

    paths = {
        k: getattr(args, k, None)
        for k in ("negatives", "model", "positives", "out", "queries", "database", "corpus")
    }
    if spec is not None:
        paths.update(
            {
                "model.path": spec.model.path,
                "fit.negatives": spec.fit.negatives if spec.fit else None,
                **{f"encode[{i}].positives": e.positives for i, e in enumerate(spec.encode)},
                **{f"encode[{i}].out": e.out for i, e in enumerate(spec.encode)},
            }
        )
    for key, path in paths.items():
        if isinstance(path, str) and storage.canonical(path).url.startswith("memory://"):
            raise ValueError(
                f"{key} {path!r}: a memory:// store lives only as long as one process, and "
                f"this command's would vanish when it exits; give a path or a URL (file://, "
                f"s3://...) that the workers and later commands can read"
            )

    if args.command == "run":
        from ..pipeline.jobspec import check_inputs

        check_inputs(spec)
    elif args.command == "fit":
        from ..pipeline import _open_negatives

        _open_negatives(
            args.negatives, args.model, args.overwrite, args.update, getattr(args, "repivot", False)
        )
    elif args.command == "search":  # an up-to-date re-run is the job's to say
        from ..pipeline.search import check_search_out

        check_search_out(args.queries, args.database, args.out, args.k, args.overwrite, args.metric)
    elif args.command == "encode":
        from ..pipeline import check_encode_inputs, load_encoding_model

        # read once, only what an encode uses: the job encodes with it
        args.loaded_model = load_encoding_model(args.model, args.positives, args.precision)
        check_encode_inputs(
            args.loaded_model,
            args.model,
            args.positives,
            args.out,
            args.dtype,
            args.overwrite,
            partition_rows=args.partition_rows,
            precision=args.precision,
        )


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
    if (
        args.command == "run"
        and spec is not None
        and not getattr(spec, "generate", None)
        and spec.model.type == "linear"
    ):
        return (
            "linear fit"
            if spec.fit and not spec.encode
            else "linear encode"
            if spec.encode and not spec.fit
            else "linear fit and encode"
        )
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
        paths = [
            own[name] if own else f"{str(args.corpus).rstrip('/')}/{name}"
            for name in ("negatives", "database", "queries")
        ]
    elif args.command == "run" and spec is not None and not getattr(spec, "generate", None):
        paths = ([spec.fit.negatives] if spec.fit else []) + [e.positives for e in spec.encode]
    else:
        return None
    try:
        return sum(int(storage.open_input(p, "input").nbytes) for p in paths)
    except Exception:  # noqa: BLE001 - the job itself reports a bad input
        return None


def _evaluate_arrays(args) -> dict | None:
    """`evaluate`'s own labelled descriptors (name -> path), or None with --corpus."""
    if args.corpus is not None:
        return None
    return {
        "negatives": args.negatives_from,
        "database": args.database,
        "queries": args.queries,
        "database_labels": args.database_labels,
        "query_labels": args.query_labels,
    }
