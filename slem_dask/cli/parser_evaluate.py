"""The options of ``evaluate``: what to evaluate on, the methods and the grids of their
parameters."""

from __future__ import annotations

import argparse

from .parser_groups import _add_cluster_args, _add_partition_arg
from .parser_types import _gamma, _grid, _lam, _positive_float, _positive_int
from ..core.kernel_defaults import KERNEL_DEFAULTS


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
    _add_own_descriptors(p)
    _add_method_options(p)
    _add_parameter_grids(p)
    _add_partition_arg(p)
    _add_cluster_args(p, writes_stores=False)  # it reads, and writes no store


def _add_own_descriptors(p: argparse.ArgumentParser) -> None:
    """One's own labelled descriptors, the alternative to --corpus (a group of their own)."""
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
        "--ground-truth",
        metavar="PATH",
        help="ids of each query's nearest database rows, nearest first, shape (queries, k): "
        ".ivecs (TEXMEX, e.g. sift_groundtruth.ivecs), ann-benchmarks HDF5 (FILE.hdf5 or "
        "FILE.hdf5:/neighbors), .npy or zarr; adds 1-R@1, R@10 and 10-R@10 to the table "
        "(docs/your-data.md), and the labels may then be left out",
    )


def _add_method_options(p: argparse.ArgumentParser) -> None:
    """The methods compared, how many negatives they fit on, and how they are scored."""
    p.add_argument(
        "--methods",
        default="raw,pca,esvm,slem",
        metavar="LIST",
        help="comma-separated methods among raw, pca, esvm, slem, kernel "
        f"(kernel: rbf, gamma {KERNEL_DEFAULTS['gamma']}, rank <= {KERNEL_DEFAULTS['rank']}, "
        f"{KERNEL_DEFAULTS['pivoting']}) "
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


def _add_parameter_grids(p: argparse.ArgumentParser) -> None:
    """The methods' parameters, each one value or a grid of them (a group of their own)."""
    g = p.add_argument_group(
        "parameters (each takes one value or a comma-separated grid, e.g. --lam 1e-3,1e-2,1e-1:"
        " every setting gets a row, and the best per method is marked *)"
    )
    _add_grid(
        g,
        "--lam",
        _lam,
        "LAM",
        "ridge lambda of linear SLEM (absolute, or Cx: C times tr(Sigma); "
        "default: 0.01x) and of kernel SLEM (a number; default: 1e-3)",
    )
    _add_grid(
        g,
        "--gamma",
        _gamma,
        "G",
        "kernel SLEM rbf gamma: a number, or Cx, C over the negatives' median squared "
        f"distance (default: {KERNEL_DEFAULTS['gamma']})",
    )
    _add_grid(
        g, "--rank", _positive_int, "R", f"kernel SLEM rank (default: {KERNEL_DEFAULTS['rank']})"
    )
    _add_grid(
        g,
        "--esvm-lam",
        _positive_float,
        "LAM",
        "E-SVM ridge lambda (default: 1e-2)",
        default=[1e-2],
    )
    _add_grid(
        g,
        "--esvm-iters",
        _positive_int,
        "T",
        "E-SVM stochastic sub-gradient steps per positive (default: 1000)",
        default=[1000],
    )
    _add_grid(
        g,
        "--pca-eps",
        _positive_float,
        "EPS",
        "PCA whitening regularizer added to the variances (default: 1e-6)",
        default=[1e-6],
    )


def _add_grid(group, flag: str, convert, name: str, text: str, *, default=None) -> None:
    """``flag``, which takes one value or a comma-separated grid of them (``convert``
    parses each), shown as NAME[,NAME...] in --help, which says ``text``."""
    group.add_argument(
        flag, type=_grid(convert), default=default, metavar=f"{name}[,{name}...]", help=text
    )
