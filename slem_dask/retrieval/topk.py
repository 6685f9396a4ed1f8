"""Exact top-k search (inner product, cosine or L2: :mod:`.distances`), numpy or dask, ties
broken by database index."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial

import dask
import numpy as np

from ..core.blas_threads import usable_cores
from ..core.candidates import topk_search
from ..core.ranking import merge_topk, settled_ranking
from ..core.validation import Array, Rows, check_finite_rows, check_rows, is_dask_array
from .distances import check_metric, prepared_pair, to_scores

__all__ = ["search"]

_SPLIT_EVERY = 8
#: Query rows per task when numpy queries meet a dask database.
_QUERY_ROWS = 16384
#: Float64 scores one task of a whole-ranking search holds (a block of queries
#: against every database row); the task's ranking temporaries are a few times this.
_WHOLE_RANKING_BYTES = 32 * 2**20
#: Whole-ranking searches split the queries into at least this many tasks.
_WHOLE_RANKING_TASKS = 8
#: Largest database (as float64) that every whole-ranking task holds in one block;
#: larger databases take the per-block top-k and merges whatever k is.
_WHOLE_RANKING_DATABASE_BYTES = 512 * 2**20


#: Float32 bytes of database rows per task of a dask search: each task returns its
#: block's exact top k (candidates re-scored in float64), so a few large blocks re-score
#: and merge less than many zarr chunks would (1M x 128: 8 tasks, not 123).
_DATABASE_BLOCK_BYTES = 64 * 2**20
#: Database rows below which a numpy search runs in one thread (splitting and
#: merging would cost more than the second core saves).
_PARALLEL_MIN_ROWS = 65536


def _check_finite(x, name: str, row_offset: int = 0) -> None:
    check_finite_rows(
        x,
        name,
        row_offset,
        remedy="scores against them are undefined: drop or repair those rows before searching",
    )


def _finite_check(q_offset: int, db_offset: int):
    """The kernel's ``on_nonfinite``: names the input and its rows (global numbers)."""

    def check(name, x):
        _check_finite(x, name, q_offset if name == "queries" else db_offset)

    return check


def _numpy_search(queries, database, k: int):
    """topk_search on contiguous parts of the database, one thread per core (one BLAS
    thread each: the selection after each float32 product is single-threaded numpy,
    so parts in parallel use both cores where BLAS threads alone leave one idle),
    merged exactly."""
    from ..parallel.blocks import single_threaded_blas

    m = len(database)
    if 2 * k >= m:
        return _numpy_whole_ranking(queries, database, k)
    parts = min(usable_cores(), m // _PARALLEL_MIN_ROWS)
    if parts < 2 or 2 * k >= m // parts:
        return topk_search(queries, database, k, on_nonfinite=_finite_check(0, 0))
    bounds = np.linspace(0, m, parts + 1).astype(np.int64)

    def run(lo, hi):
        with single_threaded_blas():
            return topk_search(
                queries, database[lo:hi], k, offset=int(lo), on_nonfinite=_finite_check(0, int(lo))
            )

    with ThreadPoolExecutor(parts) as pool:
        results = list(pool.map(run, bounds[:-1], bounds[1:]))
    return merge_topk(results, k)


def _numpy_whole_ranking(queries, database, k: int):
    """The first k of each query's whole ranking, a block of queries at a time (one
    float64 product and one sort per row: cheaper than merging lists that long)."""
    _check_finite(queries, "queries")
    _check_finite(database, "database")
    rows = max(1, _WHOLE_RANKING_BYTES // (8 * max(1, len(database))))
    scores = np.empty((len(queries), k))
    indices = np.empty((len(queries), k), dtype=np.int64)
    for i in range(0, len(queries), rows):
        scores[i : i + rows], indices[i : i + rows] = settled_ranking(
            queries[i : i + rows], database, k
        )
    return scores, indices


def _topk_packed(queries, database, q_offset, db_offset, k, metric="ip"):
    """Top-min(k, block rows) of one query block against one database block, as
    (score, index) pairs interleaved in float64 columns (width 2 min(k, rows)): no
    padding, so a block shorter than k ships only its own rows, and blocks
    concatenated along the columns stay a list of pairs. The offsets are the
    blocks' global row ids (their first entries are used)."""
    from ..parallel.blocks import single_threaded_blas

    q0, d0 = int(q_offset[0]), int(db_offset[0])
    if metric != "ip":  # named as given, before a norm of NaN makes them all NaN
        _check_finite(queries, "queries", q0)
        _check_finite(database, "database", d0)
        queries, database = prepared_pair(queries, database, metric, q0, d0)
    with single_threaded_blas():
        scores, indices = topk_search(
            queries, database, k, offset=d0, on_nonfinite=_finite_check(q0, d0)
        )
    return _interleave(scores, indices)


def _interleave(scores, indices):
    out = np.empty((len(scores), 2 * scores.shape[1]))
    out[:, 0::2] = scores
    out[:, 1::2] = indices  # row ids < 2**53: exact in float64
    return out


def _merge_packed(x, axis, keepdims, k):
    """Merge concatenated (score, index) pair lists of the same queries (reduction step)."""
    top, idx = merge_topk([(x[:, 0::2], x[:, 1::2].astype(np.int64))], k)
    return _interleave(top, idx)


def _rank_whole(queries, database, q_offset, k, metric="ip"):
    """The first k of the whole ranking of one query block against all database rows
    (float64, as one block), as interleaved (score, index) pairs."""
    _check_finite(queries, "queries", int(q_offset[0]))
    _check_finite(database, "database")
    from ..parallel.blocks import single_threaded_blas

    queries, database = prepared_pair(queries, database, metric, int(q_offset[0]))
    with single_threaded_blas():
        top, indices = settled_ranking(queries, database, k)
    return _interleave(top, indices)


def _whole_ranking(queries, database, k, metric="ip"):
    # When k is at least half the database, sorting each query's whole row of scores
    # once is cheaper than a top-k per database block and merges of lists that long
    # (1000 queries x 20,000 rows on 2 cores: 1.55 s instead of 10.7 s, bench_search.py).
    import dask.array as da

    n_q, n_db = queries.shape[0], database.shape[0]
    rows = max(1, min(_WHOLE_RANKING_BYTES // (8 * n_db), -(-n_q // _WHOLE_RANKING_TASKS)))
    queries = queries.rechunk({0: rows, 1: -1})
    database = database.astype(np.float64).rechunk({1: -1})
    token = dask.base.tokenize(queries, database, k, metric)
    ranked = da.blockwise(
        _rank_whole,
        "ij",
        queries,
        "ia",
        database,
        "ba",
        _row_ids(queries),
        "i",
        k=k,
        metric=metric,
        new_axes={"j": 2 * k},
        concatenate=True,
        dtype=np.float64,
        meta=np.empty((0, 0), dtype=np.float64),
        name="search-whole-" + token,
    )
    return _dask_scores(ranked[:, 0::2], queries, metric), ranked[:, 1::2].astype(np.int64)


def _larger_row_blocks(database):
    """Row chunks merged up to about _DATABASE_BLOCK_BYTES of float32 (whole chunks)."""
    first = max(database.chunks[0])
    target = _DATABASE_BLOCK_BYTES // (4 * max(1, database.shape[1]))
    if first >= target:
        return database
    return database.rechunk({0: (target // first) * first})


def _identity(x, axis, keepdims):
    return x


def _row_ids(x):  # -> dask.array.Array
    """Global row index of every row of ``x``, chunked like its rows (a block's first
    entry is its offset)."""
    import dask.array as da

    return da.arange(x.shape[0], chunks=(x.chunks[0],), dtype=np.int64)


def check_k(k, meaning: str = "") -> int:
    """A rank count ``k`` as an int >= 1; anything else (0, a negative, a float, a bool,
    text) is one ValueError naming it, ``meaning`` saying what it counts."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1{meaning}, got {k!r}")
    return int(k)


def search(queries: Rows, database: Rows, k: int = 100, metric: str = "ip") -> tuple[Array, Array]:
    """Exact top-k, best first: by inner product (``metric="ip"``, cosine for
    L2-normalized rows), cosine similarity (``"cosine"``) or squared L2 distance
    (``"l2"``, nearest first; the scores are squared distances), as
    :mod:`slem_dask.retrieval.distances` defines them.

    Returns ``(scores, indices)``, each (n_queries, k), float64 and int64; ties
    go to the lower database index. numpy (or xarray) inputs give numpy
    arrays; if either input is a dask array both results are lazy dask arrays
    (row chunks of the queries), so ``scores, indices = search(...)`` unpacks
    without computing and ``dask.compute(scores, indices)`` runs one graph.

    Memory is bounded over both sides: float32 scores are formed a block of
    queries times a block of database rows at a time (about 16 MiB each), the
    rows within a proven rounding margin of each query's k-th score are scored
    again in float64 (:mod:`slem_dask.core.candidates`), and dask database
    blocks (merged up to about 64 MiB) are combined by a tree of top-k merges.
    For a dask search with k at least half the database (a whole ranking) and a
    database of at most 512 MiB as float64,
    each task instead holds the whole database and ranks a block of queries
    against it with one sort per row. Rows with NaN or inf on either side are
    an error that names the side and the rows. ``cosine`` and ``l2`` search float64
    copies of each block (``l2``: one column more), about twice a float32 block.
    """
    queries = check_rows(queries, "queries")
    database = check_rows(database, "database")
    if queries.shape[1] != database.shape[1]:
        raise ValueError(
            f"queries have {queries.shape[1]} features but database rows have "
            f"{database.shape[1]}; encode both with the same model"
        )
    k = check_k(k)
    metric = check_metric(metric)
    if k > database.shape[0]:
        raise ValueError(
            f"k={k} is larger than the database ({database.shape[0]} rows); use "
            f"k <= {database.shape[0]}"
        )
    if not is_dask_array(database) and not is_dask_array(queries):
        if metric == "ip":
            return _numpy_search(queries, database, k)
        _check_finite(queries, "queries")
        _check_finite(database, "database")
        prepared_queries, prepared_database = prepared_pair(queries, database, metric)
        scores, indices = _numpy_search(prepared_queries, prepared_database, k)
        return to_scores(scores, queries, metric), indices
    return _dask_search(queries, database, k, metric)


def _dask_search(queries, database, k: int, metric: str = "ip"):
    """:func:`search` once checked, when either side is a dask array (lazy results)."""
    import dask.array as da

    if not is_dask_array(queries):
        queries = da.from_array(np.asarray(queries), chunks=(_QUERY_ROWS, -1))
    database = da.asarray(database)
    if (
        2 * k >= database.shape[0]
        and 8 * database.shape[0] * database.shape[1] <= _WHOLE_RANKING_DATABASE_BYTES
    ):
        return _whole_ranking(queries, database, k, metric)
    database = _larger_row_blocks(database)
    token = dask.base.tokenize(queries, database, k, metric)
    packed = da.blockwise(
        _topk_packed,
        "ij",
        queries,
        "ia",
        database,
        "ja",
        _row_ids(queries),
        "i",
        _row_ids(database),
        "j",
        k=k,
        metric=metric,
        adjust_chunks={"j": lambda rows: 2 * min(k, rows)},
        concatenate=True,
        dtype=np.float64,
        meta=np.empty((0, 0), dtype=np.float64),
        name="search-topk-" + token,
    )
    merged = da.reduction(
        packed,
        chunk=_identity,
        combine=partial(_merge_packed, k=k),
        aggregate=partial(_merge_packed, k=k),
        axis=1,
        keepdims=True,
        concatenate=True,
        split_every=_SPLIT_EVERY,
        dtype=np.float64,
        output_size=2 * k,
        meta=np.empty((0, 0), dtype=np.float64),
        name="search-merge-" + token,
    )
    return _dask_scores(merged[:, 0::2], queries, metric), merged[:, 1::2].astype(np.int64)


def _dask_scores(inner, queries, metric: str):
    """The stored scores of ``metric`` from the prepared rows' inner products, block by
    block of query rows (:func:`.distances.to_scores`)."""
    import dask.array as da

    if metric != "l2":
        return inner
    return da.blockwise(
        to_scores,
        "ij",
        inner,
        "ij",
        queries,
        "ia",
        metric=metric,
        concatenate=True,
        dtype=np.float64,
        meta=np.empty((0, 0), dtype=np.float64),
    )
