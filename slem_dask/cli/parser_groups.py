"""Option groups that several commands share: the cluster's, the kernel SLEM's and
--partition-rows."""

from __future__ import annotations

import argparse

from .parser_types import _fraction, _gamma, _positive_float, _positive_int
from ..core.kernel_defaults import KERNEL_DEFAULTS


def _add_cluster_args(p: argparse.ArgumentParser, writes_stores: bool = True) -> None:
    if writes_stores:
        p.epilog = LEASE_EPILOG
    g = p.add_argument_group("cluster")
    g.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="address of a running dask scheduler, e.g. tcp://host:8786 "
        "(default: $DASK_SCHEDULER_ADDRESS, else a LocalCluster on this machine)",
    )
    g.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        help="LocalCluster workers (default: one per core, as processes, or one in this "
        "process with a thread per core where --local-cluster auto picks threads)",
    )
    g.add_argument(
        "--threads-per-worker",
        type=_positive_int,
        metavar="N",
        help="LocalCluster threads per worker (default: 1; with --local-cluster "
        "threads, the cores shared among the workers)",
    )
    g.add_argument(
        "--local-cluster",
        choices=("auto", "processes", "threads"),
        default="auto",
        help="without --scheduler: a LocalCluster of worker processes, or one "
        "worker in this process with a thread per core (starts in a fraction "
        "of the time); auto (default): threads for a linear fit or encode "
        "and a kernel fit of any size, and for other inputs under 256 MiB, "
        "unless --workers or --threads-per-worker is given",
    )
    g.add_argument(
        "--task-timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="give up (exit 1) when no task of the job finishes for SECONDS, "
        "naming the workers it waits for (default: wait; a line is printed "
        "after every 60 s without progress, $SLEM_DASK_STALL_WARNING)",
    )
    _add_storage_timeout(g)
    _add_report_and_tls_args(g)


#: What every command that writes a store says of its lease, below its options.
LEASE_EPILOG = (
    "A job holds a lease on each store it writes, renewed every quarter of "
    "$SLEM_DASK_LEASE_TTL (seconds, default 120). A job of another host or container "
    "that sees a lease unchanged for that long takes it over, and says so; the job "
    "that held it, if it resumes, ends with an error within seconds and commits "
    "nothing (as does a job whose lease went unrenewed for 3/4 of that time: a store "
    "that did not answer, a process stopped). On one host and PID namespace a job "
    "holds its lease while its process exists, even stopped. Set the same value on "
    "every host (a watcher waits out the longer of its own and the owner's)."
)


def _add_report_and_tls_args(g) -> None:
    """What the run shows (progress, a performance report), and the client's
    certificates for a scheduler that speaks TLS."""
    g.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show progress bars (default: when the output is a terminal); without "
        "them, one line of progress to stderr every 60 s while tasks run "
        "($SLEM_DASK_PROGRESS_LINES seconds)",
    )
    g.add_argument(
        "--performance-report",
        metavar="HTML",
        help="save Dask's performance report of the run to this HTML file",
    )
    g.add_argument("--tls-ca-file", metavar="PEM", help="CA certificate, for a TLS scheduler")
    g.add_argument("--tls-cert", metavar="PEM", help="client certificate, for a TLS scheduler")
    g.add_argument("--tls-key", metavar="PEM", help="client private key, for a TLS scheduler")


def _add_storage_timeout(g) -> None:
    g.add_argument(
        "--storage-timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="seconds any request to an object store waits for its answer before it "
        "is tried again (default 20, $SLEM_DASK_STORAGE_TIMEOUT; $SLEM_DASK_STORAGE_ATTEMPTS "
        "tries, default 5): a job whose store stops answering ends after a few minutes; "
        "workers of --scheduler need the variable",
    )


def _add_kernel_args(p: argparse.ArgumentParser) -> None:
    from ..core.kernels import KERNELS

    g = p.add_argument_group("kernel SLEM (with --kernel; without it, a linear SLEM)")
    g.add_argument(
        "--kernel",
        choices=KERNELS,
        help="fit a KernelSLEM with this kernel (intersection, chi2: non-negative "
        "histograms only; linear: the linear kernel's low-rank factor, where "
        "no --kernel fits the linear SLEM on the exact d x d covariance)",
    )
    g.add_argument(
        "--gamma",
        type=_gamma,
        help="gamma of the rbf, quad and poly kernels: a number, or Cx, C over the "
        "negatives' median squared distance (rbf; quad, poly: squared norm) "
        f"(default: {KERNEL_DEFAULTS['gamma']})",
    )
    g.add_argument("--degree", type=_positive_int, help="degree of the poly kernel (default: 2)")
    g.add_argument(
        "--rank",
        type=_positive_int,
        metavar="R",
        help="maximum number of pivots of the incomplete Cholesky factor "
        f"(default: {KERNEL_DEFAULTS['rank']}, fewer once --tol is reached)",
    )
    g.add_argument(
        "--pivoting",
        choices=("greedy", "rpcholesky"),
        help="greedy: one pass over the negatives per pivot; rpcholesky: "
        f"randomly pivoted, many pivots per pass (default: {KERNEL_DEFAULTS['pivoting']})",
    )
    g.add_argument(
        "--tol",
        type=_fraction,
        help="stop when the residual trace is below TOL x the trace "
        f"(default: {KERNEL_DEFAULTS['tol']:g})",
    )
    g.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help=f"random seed of rpcholesky (default {KERNEL_DEFAULTS['random_state']}, as in the "
        "library and job specs: reruns give the same model)",
    )
    _add_kernel_run_args(g)


def _add_kernel_run_args(g) -> None:
    """How a kernel fit runs: its memory strategy, and re-pivoting on an update."""
    g.add_argument(
        "--kernel-memory",
        choices=("auto", "in-memory", "streaming"),
        help="in-memory: the workers hold the negatives' rows and factor rows for "
        "the whole fit (fast while they fit); streaming: every pass reads the "
        "negatives again, memory independent of their number; auto: in-memory "
        "if its estimate fits in 60%% of the workers' memory limits (default: "
        "auto; the report says which and why)",
    )
    g.add_argument(
        "--repivot",
        action="store_true",
        default=None,
        help="with --update (implied): refit the kernel model's pivots on all rows "
        "instead of merging the appended rows into the stored statistics",
    )


def _add_partition_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--partition-rows",
        type=_positive_int,
        metavar="N",
        help="rows per dask partition, rounded up to whole zarr chunks/shards "
        "(default: about 64 MiB of float64 per partition)",
    )
