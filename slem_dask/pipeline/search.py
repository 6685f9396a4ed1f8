"""The search job: exact top-k of encoded queries against an encoded database,
written to a zarr group (``slem-dask search``)."""

from __future__ import annotations

import time

import numpy as np

from .. import storage
from .._version import __version__
from ..retrieval.topk import search
from ..storage.paths import shown_path
from .common import JobReport, _compute, full_disk_said
from .options import SearchOptions, options_from

__all__ = ["check_search_inputs", "search_job", "open_search_result"]


def check_search_inputs(queries: str, database: str, k: int, force: bool = False):
    """Open both zarr arrays and check shapes and k, before any cluster starts.

    Queries and database encoded by slem-dask with different models are refused
    (their scores mean nothing) unless ``force``."""
    q = storage.open_input(queries, "queries")
    db = storage.open_input(database, "database")
    mq, mdb = storage.output_meta(q), storage.output_meta(db)
    if not force and mq and mdb and \
            mq.get("encoding_fingerprint") != mdb.get("encoding_fingerprint"):
        models = [shown_path(m.get("model_path")) for m in (mq, mdb)]
        raise ValueError(
            f"queries ({queries!r}) and database ({database!r}) were encoded with different "
            f"models (encoding fingerprints {str(mq.get('encoding_fingerprint'))[:16]} and "
            f"{str(mdb.get('encoding_fingerprint'))[:16]}; models {models[0]!r} and "
            f"{models[1]!r}): their scores are not comparable. Encode both with one model, "
            f"or pass --force to search anyway")
    if q.shape[1] != db.shape[1]:
        raise ValueError(
            f"queries ({queries!r}) have {q.shape[1]} features but database rows "
            f"({database!r}) have {db.shape[1]}; encode both with the same model"
        )
    if q.shape[0] < 1 or db.shape[0] < 1:
        raise ValueError(f"queries {q.shape} and database {db.shape} must both have rows")
    if k > db.shape[0]:
        raise ValueError(
            f"k={k} is larger than the database {database!r} ({db.shape[0]} rows); use "
            f"--k {db.shape[0]} or less"
        )
    return q, db


def search_job(client, queries: str, database: str, out: str, k: int = 100,
               partition_rows: int | None = None, overwrite: bool = False,
               force: bool = False, progress: bool = False,
               options: SearchOptions | None = None) -> JobReport:
    """Exact top-k of every query row against the database rows; write a zarr group.

    ``options``: a :class:`SearchOptions` (its fields are the keywords ``k`` ...
    ``progress``, which build one when it is not given; give one or the other).

    ``out`` gets arrays ``scores`` (float64) and ``indices`` (int64), each
    (n_queries, k), best first, ties to the lower database index, and the
    group attribute ``slem_dask`` = {kind: "search", complete: true}. The group
    is written beside ``out`` and renamed into place (local stores), under a
    lease, with a crc32c on every chunk. ``progress``: show a progress bar.
    """
    options = options_from(SearchOptions, options, k=k, partition_rows=partition_rows,
                           overwrite=overwrite, force=force, progress=progress)
    k, force = options.k, options.force
    t0 = time.perf_counter()
    queries, database, out = map(storage.canonical, (queries, database, out))
    storage.check_distinct(out, "--out", {"queries": queries, "database": database})
    q_arr, db_arr = check_search_inputs(str(queries), str(database), k, force=force)
    if storage._exists(out):
        if not options.overwrite:
            raise FileExistsError(f"output {str(out)!r} already exists; pass --overwrite to "
                                  f"replace it")
        storage.check_may_replace(out, "search result", kind="search")
    n_queries = int(q_arr.shape[0])  # scores float64 and indices int64, k of each
    with full_disk_said(out, 16 * n_queries * k, f"nothing was written ({str(out)!r} is as "
                                                 f"before)"), \
            storage.Lease(out, "slem-dask search") as lease:
        # what is read: a versioned input stays the version opened here, whatever commits
        # meanwhile; a plain one is fingerprinted before and after
        q_arr, db_arr = check_search_inputs(str(queries), str(database), k, force=force)
        seen = {"queries": storage.read_version(q_arr, queries),
                "database": storage.read_version(db_arr, database)}
        storage.check_workers_see(client, {"database": database})
        db = storage.dask_rows(db_arr, options.partition_rows, name="database")
        q = storage.dask_rows(q_arr, options.partition_rows, name="queries")
        t1 = time.perf_counter()
        scores, indices = _compute(client, search(q, db, k), progress=options.progress)
        t2 = time.perf_counter()
        read = {"queries": storage.read_version(q_arr, queries),
                "database": storage.read_version(db_arr, database)}
        if read != seen:
            raise ValueError(
                f"the queries or the database changed while they were searched "
                f"({seen} -> {read}); nothing was written: run the search again")
        storage.write_group(out, _result_meta(queries, database, k, seen, q_arr, db_arr),
                            {"scores": scores.astype(np.float64),
                             "indices": indices.astype(np.int64)},
                            "search result", overwrite=True, lease=lease)
        t3 = time.perf_counter()
    report = JobReport("search")
    report.facts.update({"queries": str(queries), "database": str(database),
                         "rows": f"{q.shape[0]} x {db_arr.shape[0]}", "k": k,
                         "partitions": db.numblocks[0], "out": str(out)})
    report.timings.update({"open": t1 - t0, "search": t2 - t1, "write": t3 - t2,
                           "total": t3 - t0})
    return report


def _result_meta(queries, database, k: int, seen: dict, q_arr, db_arr) -> dict:
    """The search result's ``slem_dask`` attribute: complete, and what it was read from."""
    return {"kind": "search", "complete": True, "k": int(k), "queries": queries.url,
            "database": database.url, "inputs": seen, "n_queries": int(q_arr.shape[0]),
            "n_database": int(db_arr.shape[0]), "package_version": __version__,
            "completed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def open_search_result(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(scores, indices) written by :func:`search_job`, refusing an unfinished one."""
    _, arrays = storage.read_search_store(path)
    return arrays["scores"], arrays["indices"]
