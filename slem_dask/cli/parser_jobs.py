"""The options of the commands that run a job on a cluster: ``demo``, ``fit``, ``encode``,
``run`` and ``search`` (``evaluate``'s are in :mod:`slem_dask.cli.parser_evaluate`)."""

from __future__ import annotations

from .parser_groups import _add_cluster_args, _add_kernel_args, _add_partition_arg
from .parser_types import _LAM_HELP, _at_least_two, _lam, _positive_float, _positive_int


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
        "--model",
        required=True,
        metavar="PATH",
        help="where to write the model: a versioned store of zarr groups "
        "(slem_dask.load_model reads it)",
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
    p.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="where to write the encodings, a versioned store of zarr arrays "
        "(slem_dask.open_zarr reads it): (m, d) for a linear model, (m, r) for a kernel "
        "model with r pivots (at most its --rank)",
    )
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
    """``run``: job specs, one after the other."""
    p = sub.add_parser(
        "run", help="run job specs (TOML): fit and encode steps, re-runnable, in the order given"
    )
    p.add_argument(
        "spec",
        metavar="SPEC.toml",
        nargs="+",
        help="job spec, e.g. jobs/demo.toml; several (jobs/*.toml) run one after the other, "
        "each with its own report, and the first that fails stops the rest",
    )
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
        "--metric",
        choices=("ip", "cosine", "l2"),
        default="ip",
        help="ranking: ip (inner product, highest first; cosine for unit rows such as "
        "encodings), cosine (cosine similarity) or l2 (nearest first; scores are squared "
        "L2 distances) (default: ip)",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="where to write the result, a versioned store of zarr groups with arrays "
        "scores (q, k) and indices (q, k) (slem_dask.open_dataset reads it)",
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
