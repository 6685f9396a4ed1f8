"""The ``slem-dask`` command line's options: the parser, its value types and the checks of
option combinations that argparse cannot express (:mod:`slem_dask.cli.main` runs the commands)."""

from __future__ import annotations

import argparse
import math

from .._version import __version__

#: Kernel options of `fit` and their defaults, applied only with --kernel.
KERNEL_DEFAULTS = {
    "gamma": 0.1,
    "degree": 2,
    "rank": None,
    "pivoting": "greedy",
    "tol": 1e-3,
    "seed": 0,
    "kernel_memory": "auto",
    "repivot": False,
}


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _lam(text: str):
    """--lam: a number > 0 (absolute) or "<c>x" (c times the negatives' tr(Sigma))."""
    relative = text.strip().lower().endswith("x")
    try:
        value = _positive_float(text.strip()[:-1] if relative else text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc} (a number is absolute; Cx is C times the negatives' total variance, e.g. 0.01x)"
        ) from None
    return f"{value:g}x" if relative else value


#: What --lam means, for the help texts.
_LAM_HELP = (
    "ridge lambda of linear SLEM: a number > 0 is absolute (the data's squared "
    "units); Cx is C times the negatives' total variance tr(Sigma), whatever "
    "their scale (default: 0.01x; about 3e-3 on L2-normalized descriptors). "
    "Kernel SLEM takes a number (default: 1e-3)"
)


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
            raise argparse.ArgumentTypeError(
                f"expected comma-separated values such as 1e-3,1e-2, got {text!r}"
            )
        values = [convert(t) for t in items]
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"{text!r} repeats a value")
        return values

    return parse


def _at_least_two(text: str) -> int:
    value = _positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 2 (a model needs at least 2 negatives), got {text!r}"
        )
    return value


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
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
        help="LocalCluster workers (default: worker processes, one per core; "
        "with --local-cluster threads, one in this process)",
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
    g.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show progress bars (default: when the output is a terminal)",
    )
    g.add_argument(
        "--performance-report",
        metavar="HTML",
        help="save Dask's performance report of the run to this HTML file",
    )
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
        type=_positive_float,
        help="gamma of the rbf, quad and poly kernels (default: 0.1)",
    )
    g.add_argument("--degree", type=_positive_int, help="degree of the poly kernel (default: 2)")
    g.add_argument(
        "--rank",
        type=_positive_int,
        metavar="R",
        help="maximum number of pivots of the incomplete Cholesky factor "
        "(default: no limit, stop on --tol)",
    )
    g.add_argument(
        "--pivoting",
        choices=("greedy", "rpcholesky"),
        help="greedy: one pass over the negatives per pivot; rpcholesky: "
        "randomly pivoted, many pivots per pass (default: greedy)",
    )
    g.add_argument(
        "--tol",
        type=_fraction,
        help="stop when the residual trace is below TOL x the trace (default: 1e-3)",
    )
    g.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="random seed of rpcholesky (default 0, as in job specs: reruns give the same model)",
    )
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slem-dask",
        description="Square-loss exemplar machines for image retrieval, on Dask. "
        "PATH arguments are descriptors as zarr v3 or v2 arrays, .npy files or folders of "
        ".npy shards, HDF5 (FILE.h5:/dataset) or .fvecs/.bvecs/.ivecs: a local path, "
        "or for zarr an object store URL (s3://, gs://, az://).",
    )
    parser.add_argument("--version", action="version", version=f"slem-dask {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_demo_command(sub)
    _add_fit_command(sub)
    _add_encode_command(sub)
    _add_run_command(sub)
    _add_search_command(sub)
    _add_evaluate_command(sub)
    _add_store_commands(sub)
    parser.commands = sub.choices  # command -> its parser, for errors in its own words
    return parser


def _add_demo_command(sub) -> None:
    """``demo``: a generated corpus, fitted, encoded and evaluated."""
    p = sub.add_parser("demo", help="generate a small corpus, fit, encode, evaluate, print a table")
    p.add_argument(
        "--workdir",
        default="slem-demo",
        help="where the corpus and model go (default: ./slem-demo)",
    )
    p.add_argument(
        "--negatives",
        type=_at_least_two,
        default=50_000,
        metavar="N",
        help="number of negatives to generate, at least 2 (default: 50000)",
    )
    p.add_argument(
        "--instances",
        type=_positive_int,
        default=1_000,
        metavar="N",
        help="number of instances; the database holds 4 views of each (default: 1000)",
    )
    p.add_argument(
        "--dim",
        type=_positive_int,
        default=128,
        metavar="D",
        help="descriptor dimension (default: 128)",
    )
    p.add_argument("--lam", type=_lam, default=None, help=_LAM_HELP)
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the generated corpus and of the kernel pivots (default: 0)",
    )
    _add_cluster_args(p)


def _add_fit_command(sub) -> None:
    """``fit``: a model from negatives."""
    p = sub.add_parser(
        "fit",
        help="fit a linear (or, with --kernel, kernel) SLEM model on "
        "negatives (zarr, .npy, HDF5, TEXMEX)",
    )
    p.add_argument(
        "--negatives",
        required=True,
        metavar="PATH",
        help="descriptors (n, d) of negatives: a zarr array (e.g. "
        "corpus.zarr/negatives), .npy, a folder or quoted glob of .npy "
        "shards, FILE.h5:/dataset, .fvecs/.bvecs/.ivecs (docs/your-data.md)",
    )
    p.add_argument(
        "--model", required=True, metavar="PATH", help="zarr group to write the model to"
    )
    p.add_argument("--lam", type=_lam, default=None, help=_LAM_HELP)
    p.add_argument(
        "--theta",
        type=_positive_float,
        default=1.0,
        help="weight of the positive in the loss; it scales each weight vector "
        "without turning it, so the L2-normalized encodings do not depend on "
        "it (default: 1)",
    )
    p.add_argument(
        "--precision",
        choices=("auto", "float64"),
        default="auto",
        help="arithmetic inside blocks (linear SLEM): auto = the input's (float32 "
        "stays float32, within 1e-5 of float64), float64 = float64 throughout "
        "(default: auto)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing model written by slem-dask (refit from scratch, "
        "also with --update); anything else at MODEL is never deleted",
    )
    p.add_argument(
        "--update",
        action="store_true",
        help="if MODEL was fitted on the first rows of NEGATIVES, merge the rows "
        "appended since (reads only the new rows); a kernel model keeps its "
        "pivots (give its kernel options; --repivot refits)",
    )
    _add_kernel_args(p)
    _add_partition_arg(p)
    _add_cluster_args(p)


def _add_encode_command(sub) -> None:
    """``encode``: positives with a fitted model."""
    p = sub.add_parser(
        "encode", help="encode positives (zarr, .npy, HDF5, TEXMEX) with a fitted model"
    )
    p.add_argument("--model", required=True, metavar="PATH", help="model written by `fit`")
    p.add_argument(
        "--positives",
        required=True,
        metavar="PATH",
        help="descriptors (m, d) to encode, in any input format of fit --negatives",
    )
    p.add_argument("--out", required=True, metavar="PATH", help="zarr array to write (m, d)")
    p.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        help="dtype of the output (default: float64 for float64 positives, "
        "float32 for any other (float32, float16, integers); a re-run "
        "continues an output in the dtype it was started with)",
    )
    p.add_argument(
        "--precision",
        choices=("auto", "float64"),
        help="arithmetic of a linear SLEM encoding: auto = the input's (float32 "
        "stays float32, within 1e-5 of float64), float64 = float64 "
        "(default: the model's setting)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing output written by slem-dask (without it, an "
        "unfinished output is resumed, partitions whose positives changed or "
        "were appended are encoded, and an output of another model is an "
        "error); anything else at OUT is never deleted",
    )
    _add_partition_arg(p)
    _add_cluster_args(p)


def _add_run_command(sub) -> None:
    """``run``: a job spec."""
    p = sub.add_parser("run", help="run a job spec (TOML): fit and encode steps, re-runnable")
    p.add_argument("spec", metavar="SPEC.toml", help="job spec, e.g. jobs/demo.toml")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="refit the model and rebuild every output from scratch (only stores "
        "written by slem-dask are ever replaced)",
    )
    _add_cluster_args(p)


def _add_search_command(sub) -> None:
    """``search``: exact top-k of encodings."""
    p = sub.add_parser(
        "search",
        help="exact top-k of encoded queries against an encoded "
        "database; writes (scores, indices) to zarr",
    )
    p.add_argument(
        "--queries",
        required=True,
        metavar="PATH",
        help="(q, d) query encodings (zarr, .npy, ...: any input format)",
    )
    p.add_argument(
        "--database",
        required=True,
        metavar="PATH",
        help="(m, d) database encodings (zarr, .npy, ...: any input format)",
    )
    p.add_argument(
        "--k",
        type=_positive_int,
        default=100,
        metavar="K",
        help="results per query, at most the database size (default: 100)",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="zarr group to write, with arrays scores (q, k) and indices (q, k)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing search result written by slem-dask",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="search even if queries and database were encoded by different models",
    )
    _add_partition_arg(p)
    _add_cluster_args(p)


def _add_evaluate_command(sub) -> None:
    """``evaluate``: the methods compared on a corpus or one's own descriptors."""
    p = sub.add_parser(
        "evaluate",
        help="compare raw, PCA-whitening, E-SVM and SLEM on a "
        "corpus: results table and precision-recall plot",
    )
    p.add_argument(
        "--corpus",
        metavar="PATH",
        help="zarr group with negatives, database, queries, database_labels, "
        "query_labels (datasets.write_corpus; `demo` writes WORKDIR/corpus.zarr)",
    )
    own = p.add_argument_group(
        "one's own labelled descriptors, instead of --corpus (descriptors: zarr, .npy, "
        ".npy shards, HDF5, .fvecs/.bvecs/.ivecs; labels: 1-D .npy, zarr or HDF5)"
    )
    own.add_argument("--negatives-from", metavar="PATH", help="descriptors to fit on")
    own.add_argument("--database", metavar="PATH", help="descriptors searched")
    own.add_argument("--queries", metavar="PATH", help="query descriptors")
    own.add_argument("--database-labels", metavar="PATH", help="one label per database row")
    own.add_argument(
        "--query-labels",
        metavar="PATH",
        help="one label per query row (relevant: database rows of its label)",
    )
    p.add_argument(
        "--methods",
        default="raw,pca,esvm,slem",
        metavar="LIST",
        help="comma-separated methods among raw, pca, esvm, slem, kernel "
        "(kernel: rbf, gamma 0.5, rank 256, rpcholesky) "
        "(default: raw,pca,esvm,slem)",
    )
    p.add_argument(
        "--negatives",
        type=_positive_int,
        metavar="N",
        help="fit on the first N negatives (default: all)",
    )
    p.add_argument(
        "--k",
        type=_positive_int,
        metavar="K",
        help="ranking length for mAP (default: the database, up to 10000)",
    )
    p.add_argument(
        "--p-at",
        type=_positive_int,
        metavar="K",
        help="k of the P@k column (default: median number of relevant items)",
    )
    p.add_argument("--plot", metavar="PNG", help="save precision-recall curves to this PNG")
    g = p.add_argument_group(
        "parameters (each takes one value or a comma-separated grid, e.g. --lam 1e-3,1e-2,1e-1:"
        " every setting gets a row, and the best per method is marked *)"
    )
    g.add_argument(
        "--lam",
        type=_grid(_lam),
        metavar="LAM[,LAM...]",
        help="ridge lambda of linear SLEM (absolute, or Cx: C times tr(Sigma); "
        "default: 0.01x) and of kernel SLEM (a number; default: 1e-3)",
    )
    g.add_argument(
        "--gamma",
        type=_grid(_positive_float),
        metavar="G[,G...]",
        help="kernel SLEM rbf gamma (default: 0.5)",
    )
    g.add_argument(
        "--rank",
        type=_grid(_positive_int),
        metavar="R[,R...]",
        help="kernel SLEM rank (default: 256)",
    )
    g.add_argument(
        "--esvm-lam",
        type=_grid(_positive_float),
        default=[1e-2],
        metavar="LAM[,LAM...]",
        help="E-SVM ridge lambda (default: 1e-2)",
    )
    g.add_argument(
        "--esvm-iters",
        type=_grid(_positive_int),
        default=[1000],
        metavar="T[,T...]",
        help="E-SVM stochastic sub-gradient steps per positive (default: 1000)",
    )
    g.add_argument(
        "--pca-eps",
        type=_grid(_positive_float),
        default=[1e-6],
        metavar="EPS[,EPS...]",
        help="PCA whitening regularizer added to the variances (default: 1e-6)",
    )
    _add_partition_arg(p)
    _add_cluster_args(p)


def _add_store_commands(sub) -> None:
    """``verify``, ``versions``, ``rollback``, ``export``: stores, without a cluster."""
    p = sub.add_parser(
        "verify",
        help="check a model, output or search result written by "
        "slem-dask end to end (checksums, completeness); exit 1 on any problem",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="stores to check")

    p = sub.add_parser(
        "versions",
        help="list the committed versions of a store written by "
        "slem-dask (newest last), with the folder each can be read from",
    )
    p.add_argument("path", metavar="PATH")
    p = sub.add_parser(
        "rollback",
        help="make an earlier version of a store the current one "
        "(a new commit; the history is kept)",
    )
    p.add_argument("path", metavar="PATH")
    p.add_argument(
        "--to",
        type=int,
        required=True,
        metavar="N",
        help="the version to restore (see `slem-dask versions PATH`)",
    )
    p = sub.add_parser(
        "export",
        help="copy one committed version of a store written by "
        "slem-dask out as plain zarr, or an output as .npy, for tools that "
        "need a plain path",
    )
    p.add_argument("path", metavar="PATH")
    p.add_argument(
        "--to",
        required=True,
        metavar="OUT",
        help="OUT.zarr (a plain zarr v3 array or group) or OUT.npy (an output)",
    )
    p.add_argument(
        "--version",
        type=_positive_int,
        dest="export_version",
        metavar="N",
        help="the version to export (default: the current one; see `slem-dask versions PATH`)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export at OUT.zarr")


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
        command.error(
            f"unrecognized arguments: {' '.join(unknown)}"
            + (f"; did you mean {close[0]}?" if close else "")
        )
    return args


#: `evaluate`'s options for one's own labelled descriptors (instead of --corpus)
EVALUATE_OWN = ("negatives-from", "database", "queries", "database-labels", "query-labels")


def _check_option_combinations(parser: argparse.ArgumentParser, args) -> None:
    """Options that parse on their own but make no sense together: usage errors (exit 2)."""
    sub = parser._subparsers._group_actions[0].choices[args.command]  # the command's usage
    if args.command == "fit":
        given = [
            f"--{name.replace('_', '-')}"
            for name in KERNEL_DEFAULTS
            if getattr(args, name) is not None
        ]
        if args.kernel is None and given:
            verb = "applies" if len(given) == 1 else "apply"
            sub.error(
                f"{', '.join(given)} {verb} only to kernel SLEM models, but no "
                f"--kernel was given (without it `fit` fits a linear SLEM); add "
                f"--kernel rbf (or another kernel), or drop {', '.join(given)}"
            )
        for name, default in KERNEL_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, default)
        args.update = args.update or args.repivot  # --repivot: an update that refits
    if args.command == "evaluate":
        own = {name: getattr(args, name.replace("-", "_")) for name in EVALUATE_OWN}
        if args.corpus is None and not all(own.values()):
            missing = [f"--{n}" for n, v in own.items() if not v]
            sub.error(
                f"give --corpus, or one's own labelled descriptors with "
                f"{', '.join(f'--{n}' for n in own)} (missing: {', '.join(missing)})"
            )
        if args.corpus is not None and any(own.values()):
            sub.error(
                f"--corpus and {', '.join(f'--{n}' for n, v in own.items() if v)} "
                f"both name what to evaluate on; give one or the other"
            )
    if (
        args.command == "evaluate"
        and args.p_at is not None
        and args.k is not None
        and args.p_at > args.k
    ):
        sub.error(
            f"--p-at {args.p_at} is larger than the ranking length --k {args.k}: "
            f"P@{args.p_at} would count missing ranks as misses; use --p-at "
            f"{args.k} or less, or a larger --k"
        )


def _glue_negative_values(argv: list[str]) -> list[str]:
    """``--lam -1e-3`` as ``--lam=-1e-3``: argparse takes '-1e-3' for an option (only
    '-1' and '-.5' look like numbers to it) and would say "expected one argument";
    glued, the value reaches the option's own check, which says what is allowed."""
    out = []
    for token in argv:
        if (
            out
            and out[-1].startswith("--")
            and "=" not in out[-1]
            and token.startswith("-")
            and _is_number_list(token)
        ):
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
