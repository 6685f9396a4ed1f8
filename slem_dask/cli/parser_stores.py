"""The options of the commands on stores, which start no cluster: ``verify``, ``versions``,
``rollback`` and ``export``."""

from __future__ import annotations

from .parser_types import _positive_int


def _add_store_commands(sub) -> None:
    """``verify``, ``versions``, ``rollback``, ``export``: stores, without a cluster."""
    p = sub.add_parser(
        "verify",
        help="check a model, output or search result written by "
        "slem-dask end to end (checksums, completeness): a versioned store's current "
        "version, or the version whose folder is given (`slem-dask versions P` lists "
        "them); exit 1 on any problem",
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="stores slem-dask wrote (a model, an output, a search result, a corpus), as "
        "local paths or URLs (s3://, gs://, az://)",
    )

    p = sub.add_parser(
        "versions",
        help="list the committed versions of a store written by "
        "slem-dask (newest last), with the folder each can be read from",
    )
    p.add_argument(
        "path",
        metavar="PATH",
        help="the store whose versions to list (a path or URL, as given to the command that wrote it)",
    )
    _add_rollback_and_export(sub)


def _add_rollback_and_export(sub) -> None:
    """``rollback`` and ``export``: a version of a store made current, or copied out."""
    p = sub.add_parser(
        "rollback",
        help="make an earlier version of a store the current one "
        "(a new commit; the history is kept), once that version is checked whole",
    )
    p.add_argument(
        "path",
        metavar="PATH",
        help="the store to roll back (a path or URL, as given to the command that wrote it)",
    )
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
    p.add_argument(
        "path",
        metavar="PATH",
        help="the store to copy out (a path or URL, as given to the command that wrote it)",
    )
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
