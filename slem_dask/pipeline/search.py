"""The search job: exact top-k of encoded queries against an encoded database,
written to a zarr group (``slem-dask search``)."""

from __future__ import annotations

import time
import warnings

import numpy as np

from .. import storage
from .._version import __version__
from ..retrieval.distances import SCORE_NAMES, unit_norm_warning
from ..retrieval.topk import search
from .common import JobFailed, JobReport, _compute, _detail, full_disk_said
from .options import SearchOptions, options_from

__all__ = [
    "check_search_inputs",
    "check_search_out",
    "search_input_warnings",
    "search_job",
    "open_search_result",
]

#: Rows of each input whose norms decide the unit-norm warning.
_NORM_SAMPLE_ROWS = 1000


def check_search_inputs(queries: str, database: str, k: int, force: bool = False):
    """Open both zarr arrays and check shapes and k, before any cluster starts.

    Queries and database encoded by slem-dask with different models are refused
    (their scores mean nothing) unless ``force``."""
    q = storage.open_input(queries, "queries")
    db = storage.open_input(database, "database")
    mq, mdb = storage.output_meta(q), storage.output_meta(db)
    if (
        not force
        and mq
        and mdb
        and mq.get("encoding_fingerprint") != mdb.get("encoding_fingerprint")
    ):
        models = [storage.shown_path(m.get("model_path")) for m in (mq, mdb)]
        # named as fit and encode print a model: `model identity` (before it was
        # recorded: the encoding fingerprint)
        ids = [
            str(m.get("model_fingerprint") or m.get("encoding_fingerprint"))[:16] for m in (mq, mdb)
        ]
        raise ValueError(
            f"queries ({queries!r}) and database ({database!r}) were encoded with different "
            f"models ({models[0]!r}, model identity {ids[0]}, and {models[1]!r}, model "
            f"identity {ids[1]}): their scores are not comparable. Encode both with one "
            f"model, or pass --force to search anyway"
        )
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


def search_job(
    client,
    queries: str,
    database: str,
    out: str,
    k: int = 100,
    partition_rows: int | None = None,
    overwrite: bool = False,
    force: bool = False,
    progress: bool = False,
    options: SearchOptions | None = None,
    metric: str = "ip",
) -> JobReport:
    """Exact top-k of every query row against the database rows; write a zarr group.

    ``options``: a :class:`SearchOptions` (its fields are the keywords ``k`` ...
    ``progress``, which build one when it is not given; give one or the other).

    ``out`` gets arrays ``scores`` (float64) and ``indices`` (int64), each
    (n_queries, k), best first, ties to the lower database index, and the
    group attribute ``slem_dask`` = {kind: "search", complete: true, metric,
    score}. ``metric``: "ip", "cosine" or "l2" (:func:`slem_dask.search`); for
    "l2" the scores are squared L2 distances, ascending (``score`` says which). The group
    is written beside ``out`` and renamed into place (local stores), under a
    lease, with a crc32c on every chunk. ``progress``: show a progress bar.
    """
    options = options_from(
        SearchOptions,
        options,
        k=k,
        partition_rows=partition_rows,
        overwrite=overwrite,
        force=force,
        progress=progress,
        metric=metric,
    )
    k, force = options.k, options.force
    t0 = time.perf_counter()
    queries, database, out = map(storage.canonical, (queries, database, out))
    committed = check_search_out(queries, database, out, k, options.overwrite, options.metric)
    q_arr, db_arr = check_search_inputs(str(queries), str(database), k, force=force)
    for warning in search_input_warnings(q_arr, db_arr, str(queries), str(database), options):
        warnings.warn(warning, stacklevel=2)
    action = "replace" if options.overwrite and storage._exists(out) else "create"
    if committed is not None:  # this search again: up to date, or its inputs changed
        if committed["inputs"] == _inputs_now(q_arr, db_arr, queries, database):
            return _up_to_date_report(queries, database, out, (q_arr, db_arr), options, t0)
        action = "search again (inputs changed)"
    n_queries = int(q_arr.shape[0])  # scores float64 and indices int64, k of each
    with (
        full_disk_said(out, 16 * n_queries * k, f"nothing was written ({str(out)!r} is as before)"),
        storage.VersionedStore(out).transaction("slem-dask search") as tx,
    ):
        rows, partitions, times = _search_and_write(
            client, (queries, database, out), k, options, tx, action
        )
    return _search_report(
        queries, database, out, (k, options.metric), action, (rows, partitions), (t0, *times)
    ).split_lease_wait(tx)


#: How the search warning names an input file that records nothing (its format).
_FILE_KINDS = {"npy": "a .npy file", "npy shards": "a set of .npy shards", "hdf5": "an HDF5 file"}


def _one_side_encoded(other_arr, queries_encoded: bool, queries: str, database: str) -> str:
    """The warning for slem-dask encodings searched against rows that are not, as far as
    their store says: a file (.npy, HDF5, fvecs) records nothing, and may hold
    encodings exported from slem-dask (`slem-dask export`) as well as raw descriptors."""
    encoded, other, path = (
        ("the queries are slem-dask encodings", "the database", database)
        if queries_encoded
        else ("the database is a slem-dask encoding", "the queries", queries)
    )
    fmt = getattr(other_arr, "format", None)
    if fmt is not None:
        kind = _FILE_KINDS.get(fmt, f"a .{fmt} file")
        export = " (as `slem-dask export --to OUT.npy` writes them)" if fmt == "npy" else ""
        return (
            f"{encoded}; {path!r} ({other}) is {kind}, which records nothing of what it "
            f"holds: raw descriptors against encodings score little (encode both with the "
            f"same model: `slem-dask encode`), encodings saved in it{export} are searched "
            f"as such"
        )
    return (
        f"{encoded} but {other} ({path!r}) {'is' if queries_encoded else 'are'} not (raw "
        f"descriptors?): their scores mean little; encode both with the same model "
        f"(`slem-dask encode`)"
    )


def search_input_warnings(q_arr, db_arr, queries: str, database: str, options) -> list[str]:
    """One-line warnings on what a search of these inputs means: inner product of rows
    far from unit norm, raw descriptors against slem-dask encodings, or (with --force)
    encodings of two models."""
    said = []
    mq, mdb = storage.output_meta(q_arr), storage.output_meta(db_arr)
    if bool(mq) != bool(mdb):
        said.append(_one_side_encoded(db_arr if mq else q_arr, bool(mq), queries, database))
    elif mq and mdb and mq.get("encoding_fingerprint") != mdb.get("encoding_fingerprint"):
        said.append(
            "queries and database are encodings of different models (searched anyway: "
            "--force); their scores are not comparable"
        )
    sample = {
        name: storage.read_rows(arr, 0, min(_NORM_SAMPLE_ROWS, arr.shape[0]), name)
        for name, arr in (("queries", q_arr), ("database", db_arr))
    }
    norms = unit_norm_warning(sample, options.metric)
    return said + ([norms] if norms else [])


def _search_and_write(client, paths, k: int, options: SearchOptions, tx, action: str):
    """In ``out``'s transaction ``tx`` (under its lease): reopen the inputs, search, check
    that they did not change while read, write the result. ("q x db" rows, database
    partitions, (t1, t2, t3))."""
    queries, database, out = paths
    # what is read: a versioned input stays the version opened here, whatever commits
    # meanwhile; a plain one is fingerprinted before and after
    q_arr, db_arr = check_search_inputs(str(queries), str(database), k, force=options.force)
    if action.startswith("search again"):  # what another job may have committed since
        _committed_search(out, queries, database, k, options.metric)
    seen = _inputs_now(q_arr, db_arr, queries, database)
    storage.check_workers_see(client, {"database": database})
    db = storage.dask_rows(db_arr, options.partition_rows, name="database")
    q = storage.dask_rows(q_arr, options.partition_rows, name="queries")
    t1 = time.perf_counter()
    scores, indices = _compute(
        client, search(q, db, k, metric=options.metric), progress=options.progress
    )
    t2 = time.perf_counter()
    read = _inputs_now(q_arr, db_arr, queries, database)
    if read != seen:  # not a bad input: a writer's, as a fit's or an encode's JobFailed
        named = {"queries": queries, "database": database}
        changed = " and the ".join(f"{n} {str(named[n])!r}" for n in seen if seen[n] != read[n])
        raise JobFailed(
            f"the {changed} changed while this search read them; nothing was written "
            f"({str(out)!r} is as before): run the search again once they are no longer "
            f"being written"
        )
    storage.write_group(
        out,
        _result_meta(queries, database, k, seen, q_arr, db_arr, options.metric),
        {"scores": scores.astype(np.float64), "indices": indices.astype(np.int64)},
        "search result",
        overwrite=True,
        transaction=tx,
    )
    return f"{q.shape[0]} x {db_arr.shape[0]}", db.numblocks[0], (t1, t2, time.perf_counter())


def _search_report(queries, database, out, asked, action: str, sizes, times) -> JobReport:
    """The report of a search that wrote its result: ``asked`` (k, metric), ``sizes``
    (rows, partitions), ``times`` (start, searched from, written from, done)."""
    rows, partitions = sizes
    k, metric = asked
    t0, t1, t2, t3 = times
    report = JobReport("search")
    report.facts.update(
        {
            "queries": str(queries),
            "database": str(database),
            "rows": rows,
            "k": k,
            "metric": metric,
            "partitions": partitions,
            "action": action,
            "out": str(out),
        }
    )
    report.timings.update({"open": t1 - t0, "search": t2 - t1, "write": t3 - t2, "total": t3 - t0})
    return report


def check_search_out(
    queries, database, out, k: int, overwrite: bool, metric: str = "ip"
) -> dict | None:
    """Check ``out`` before any cluster starts: apart from the inputs, and never a store
    that slem-dask did not write or of another kind. Without ``overwrite``, an existing
    result must be this search (:func:`_committed_search`): its metadata is returned,
    for the job to find it up to date or search again; else None."""
    queries, database, out = map(storage.canonical, (queries, database, out))
    storage.check_distinct(out, "--out", {"queries": queries, "database": database})
    if not storage._exists(out):
        return None
    storage.check_may_replace(out, "search result", kind="search")
    return None if overwrite else _committed_search(out, queries, database, k, metric)


def _inputs_now(q_arr, db_arr, queries, database) -> dict:
    """What the search reads, for the record: each input's version, or fingerprint."""
    return {
        "queries": storage.read_version(q_arr, queries),
        "database": storage.read_version(db_arr, database),
    }


def _committed_search(out, queries, database, k: int, metric: str = "ip") -> dict:
    """The metadata of the search result committed at ``out``, if it is this search
    (these queries and database paths, this k and metric), which a re-run without --overwrite may
    find up to date or search again; else the refusal that says what it holds."""
    replace = (
        "pass --overwrite to replace it with this search (a new version: `slem-dask "
        "versions` lists the ones kept)"
    )
    try:
        meta, _ = storage.read_search_store(out, arrays=False)  # unfinished, damaged: refused
    except storage.StorageError:
        raise  # the store did not answer: what it holds is unknown, not refused
    except (ValueError, OSError) as exc:
        raise FileExistsError(
            f"--out {str(out)!r} already exists and cannot be read as a "
            f"search result ({_detail(exc)}); {replace}"
        ) from None
    said = {"queries": str(queries), "database": str(database), "k": int(k), "metric": metric}
    held = {
        "queries": storage.shown_path(meta.get("queries")),  # recorded as URLs
        "database": storage.shown_path(meta.get("database")),
        "k": meta.get("k"),
        "metric": meta.get("metric", "ip"),  # results written before metrics were inner product
    }
    if held != said or not isinstance(meta.get("inputs"), dict):
        differ = (
            ", ".join(
                f"{key} {held[key]!r} (now {said[key]!r})" for key in said if held[key] != said[key]
            )
            or "no record of its inputs"
        )
        raise FileExistsError(
            f"--out {str(out)!r} already holds another search: {differ}; "
            f"{replace}, or give another --out"
        )
    return meta


def _up_to_date_report(queries, database, out, arrays, options, t0: float) -> JobReport:
    """The report of a re-run that found its committed result current: nothing written.
    ``arrays``: (queries, database) as read."""
    (q_arr, db_arr), k, metric = arrays, options.k, options.metric
    report = JobReport("search")
    report.facts.update(
        {
            "queries": str(queries),
            "database": str(database),
            "rows": f"{q_arr.shape[0]} x {db_arr.shape[0]}",
            "k": k,
            "metric": metric,
            "action": "up to date",
            "out": str(out),
        }
    )
    report.timings["total"] = time.perf_counter() - t0
    return report


def _result_meta(queries, database, k: int, seen: dict, q_arr, db_arr, metric: str) -> dict:
    """The search result's ``slem_dask`` attribute: complete, and what it was read from."""
    return {
        "kind": "search",
        "complete": True,
        "k": int(k),
        "metric": metric,
        "score": SCORE_NAMES[metric],
        "queries": queries.url,
        "database": database.url,
        "inputs": seen,
        "n_queries": int(q_arr.shape[0]),
        "n_database": int(db_arr.shape[0]),
        "package_version": __version__,
        "completed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def open_search_result(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(scores, indices) written by :func:`search_job`, refusing an unfinished one."""
    _, arrays = storage.read_search_store(path)
    return arrays["scores"], arrays["indices"]
