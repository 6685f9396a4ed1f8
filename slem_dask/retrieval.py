"""Downstream retrieval: exact top-k search and evaluation (mAP, precision/recall@k)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial

import dask
import numpy as np

from .core.blas_threads import usable_cores
from .core.candidates import topk_search
from .core.ranking import as_id_array, average_precision, merge_topk, settled_ranking
from .validation import check_finite_rows, check_rows, is_dask_array

__all__ = ["search", "mean_average_precision", "precision_recall_at_k",
           "leave_one_out_map", "make_map_scorer", "map_scorer"]

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
    check_finite_rows(x, name, row_offset, remedy="scores against them are undefined: drop "
                                                  "or repair those rows before searching")


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
    from .parallel import single_threaded_blas

    m = len(database)
    if 2 * k >= m:
        return _numpy_whole_ranking(queries, database, k)
    parts = min(usable_cores(), m // _PARALLEL_MIN_ROWS)
    if parts < 2 or 2 * k >= m // parts:
        return topk_search(queries, database, k, on_nonfinite=_finite_check(0, 0))
    bounds = np.linspace(0, m, parts + 1).astype(np.int64)

    def run(lo, hi):
        with single_threaded_blas():
            return topk_search(queries, database[lo:hi], k, offset=int(lo),
                               on_nonfinite=_finite_check(0, int(lo)))

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
        scores[i:i + rows], indices[i:i + rows] = settled_ranking(
            queries[i:i + rows], database, k)
    return scores, indices


def _topk_packed(queries, database, q_offset, db_offset, k):
    """Top-min(k, block rows) of one query block against one database block, as
    (score, index) pairs interleaved in float64 columns (width 2 min(k, rows)): no
    padding, so a block shorter than k ships only its own rows, and blocks
    concatenated along the columns stay a list of pairs. The offsets are the
    blocks' global row ids (their first entries are used)."""
    from .parallel import single_threaded_blas

    q0, d0 = int(q_offset[0]), int(db_offset[0])
    with single_threaded_blas():
        scores, indices = topk_search(queries, database, k, offset=d0,
                                      on_nonfinite=_finite_check(q0, d0))
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


def _rank_whole(queries, database, q_offset, k):
    """The first k of the whole ranking of one query block against all database rows
    (float64, as one block), as interleaved (score, index) pairs."""
    _check_finite(queries, "queries", int(q_offset[0]))
    _check_finite(database, "database")
    from .parallel import single_threaded_blas

    with single_threaded_blas():
        top, indices = settled_ranking(queries, database, k)
    return _interleave(top, indices)


def _whole_ranking(queries, database, k):
    # When k is at least half the database, sorting each query's whole row of scores
    # once is cheaper than a top-k per database block and merges of lists that long
    # (1000 queries x 20,000 rows on 2 cores: 1.55 s instead of 10.7 s, bench_search.py).
    import dask.array as da

    n_q, n_db = queries.shape[0], database.shape[0]
    rows = max(1, min(_WHOLE_RANKING_BYTES // (8 * n_db), -(-n_q // _WHOLE_RANKING_TASKS)))
    queries = queries.rechunk({0: rows, 1: -1})
    database = database.astype(np.float64).rechunk({1: -1})
    token = dask.base.tokenize(queries, database, k)
    ranked = da.blockwise(
        _rank_whole, "ij", queries, "ia", database, "ba", _row_ids(queries), "i",
        k=k, new_axes={"j": 2 * k}, concatenate=True, dtype=np.float64,
        meta=np.empty((0, 0), dtype=np.float64), name="search-whole-" + token)
    return ranked[:, 0::2], ranked[:, 1::2].astype(np.int64)


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


def search(queries, database, k: int = 100):
    """Exact top-k by inner product (cosine for L2-normalized rows), best first.

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
    an error that names the side and the rows.
    """
    queries = check_rows(queries, "queries")
    database = check_rows(database, "database")
    if queries.shape[1] != database.shape[1]:
        raise ValueError(
            f"queries have {queries.shape[1]} features but database rows have "
            f"{database.shape[1]}; encode both with the same model"
        )
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    k = int(k)
    if k > database.shape[0]:
        raise ValueError(
            f"k={k} is larger than the database ({database.shape[0]} rows); use "
            f"k <= {database.shape[0]}"
        )
    if not is_dask_array(database) and not is_dask_array(queries):
        return _numpy_search(queries, database, k)
    import dask.array as da

    if not is_dask_array(queries):
        queries = da.from_array(np.asarray(queries), chunks=(_QUERY_ROWS, -1))
    database = da.asarray(database)
    if 2 * k >= database.shape[0] and \
            8 * database.shape[0] * database.shape[1] <= _WHOLE_RANKING_DATABASE_BYTES:
        return _whole_ranking(queries, database, k)
    database = _larger_row_blocks(database)
    token = dask.base.tokenize(queries, database, k)
    packed = da.blockwise(
        _topk_packed, "ij", queries, "ia", database, "ja",
        _row_ids(queries), "i", _row_ids(database), "j",
        k=k, adjust_chunks={"j": lambda rows: 2 * min(k, rows)}, concatenate=True,
        dtype=np.float64, meta=np.empty((0, 0), dtype=np.float64), name="search-topk-" + token)
    merged = da.reduction(packed, chunk=_identity,
                          combine=partial(_merge_packed, k=k),
                          aggregate=partial(_merge_packed, k=k), axis=1, keepdims=True,
                          concatenate=True, split_every=_SPLIT_EVERY, dtype=np.float64,
                          output_size=2 * k, meta=np.empty((0, 0), dtype=np.float64),
                          name="search-merge-" + token)
    return merged[:, 0::2], merged[:, 1::2].astype(np.int64)


def _check_per_query(collections, name: str, n_queries: int) -> list[np.ndarray]:
    """One id array per query from any sequence of per-query collections (list, tuple,
    set, frozenset, array); a mapping is refused, never read by its keys."""
    if hasattr(collections, "keys") and hasattr(collections, "values"):
        raise TypeError(
            f"{name} is a mapping ({type(collections).__name__}) of {len(collections)} "
            f"entries; give a sequence with one collection of database indices per query, "
            f"in query order, e.g. [{name}[q] for q in query_ids] (a mapping is not read "
            f"by its keys)"
        )
    if isinstance(collections, (set, frozenset)):
        raise TypeError(f"{name} is a {type(collections).__name__}, which has no order; give "
                        f"a list with one collection of database indices per query")
    collections = list(collections)
    if len(collections) != n_queries:
        raise ValueError(
            f"{name} has {len(collections)} entries but indices has {n_queries} queries; "
            f"give one collection of {name} database indices per query"
        )
    return [as_id_array(c, f"{name}[{i}]") for i, c in enumerate(collections)]


def _per_query(indices, relevant, junk, name="relevant"):
    indices = np.asarray(indices)
    if indices.ndim != 2:
        raise ValueError(f"indices must be 2-D (n_queries, k), got shape {indices.shape}")
    relevant = _check_per_query(relevant, name, len(indices))
    junk = ([np.empty(0, np.int64)] * len(indices) if junk is None
            else _check_per_query(junk, "junk", len(indices)))
    for i, rel in enumerate(relevant):
        if rel.size == 0:
            raise ValueError(
                f"{name}[{i}] is empty: query {i} has no relevant item, so its AP is "
                f"undefined; drop that query"
            )
    return indices, relevant, junk


def mean_average_precision(indices, relevant, junk=None, mode: str = "non-interpolated"):
    """Mean over queries of :func:`slem_dask.core.ranking.average_precision`.

    ``indices``: (n_queries, k) ranked database indices (e.g. from :func:`search`);
    ``relevant`` and ``junk``: a sequence with one collection of database indices
    per query, in query order (lists, tuples, sets, frozensets or integer arrays); a
    dict is refused.
    """
    indices, relevant, junk = _per_query(indices, relevant, junk)
    return float(np.mean([average_precision(r, rel, j, mode)
                          for r, rel, j in zip(indices, relevant, junk)]))


def precision_recall_at_k(indices, relevant, k: int, junk=None) -> tuple[float, float]:
    """Mean precision@k and recall@k over queries (junk removed before cutting at k)."""
    indices, relevant, junk = _per_query(indices, relevant, junk)
    precisions, recalls = [], []
    for ranking, rel, j in zip(indices, relevant, junk):
        if j.size:
            ranking = ranking[~np.isin(ranking, j)]
        hits = np.count_nonzero(np.isin(ranking[:k], rel))
        precisions.append(hits / k)
        recalls.append(hits / rel.size)
    return float(np.mean(precisions)), float(np.mean(recalls))


def leave_one_out_map(encodings, labels, k: int | None = None,
                      mode: str = "non-interpolated") -> float:
    """mAP of every row as a query against all the other rows; relevant: same label.

    Queries whose label no other row has are left out. ``k``: ranking length
    (default: all other rows, up to 10,000).
    """
    z = check_rows(encodings, "encodings")
    if is_dask_array(z):
        (z,) = dask.compute(z)
    z = np.asarray(z)
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != len(z):
        raise ValueError(f"labels must be 1-D with one label per row ({len(z)} rows), got "
                         f"shape {labels.shape}")
    n = len(z)
    k = min(n - 1, 10_000) if k is None else int(k)
    if n < 2 or k < 1:
        raise ValueError(f"leave-one-out mAP needs at least 2 rows and k >= 1 (got {n} rows, "
                         f"k={k})")
    _, indices = search(z, z, min(k + 1, n))
    rows = np.arange(n)
    is_self = indices == rows[:, None]
    # drop each row's own index (or the last entry when it ranked beyond k)
    keep = ~is_self
    keep[~is_self.any(axis=1), -1] = False
    ranking = indices[keep].reshape(n, -1)[:, :k]
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    starts = np.searchsorted(sorted_labels, labels, "left")
    ends = np.searchsorted(sorted_labels, labels, "right")
    aps = []
    for i in range(n):
        rel = order[starts[i]:ends[i]]
        rel = rel[rel != i]
        if rel.size:
            aps.append(average_precision(ranking[i], rel, (), mode))
    if not aps:
        raise ValueError("leave-one-out mAP: no label occurs twice, so no row has a relevant "
                         "item; give at least two rows of some label (in cross-validation, "
                         "shuffle the folds, e.g. cv=KFold(5, shuffle=True) or "
                         "StratifiedKFold, so that a held-out fold holds several rows per "
                         "label)")
    return float(np.mean(aps))


def make_map_scorer(k: int | None = None, mode: str = "non-interpolated"):
    """A scikit-learn scorer for retrieval: ``scorer(estimator, X, y)`` encodes ``X``
    with ``estimator.transform`` and returns :func:`leave_one_out_map` with labels ``y``.

    For ``GridSearchCV(LinearSLEM(), {"lam": [...]}, scoring=make_map_scorer())``: each
    fold fits on the training rows (the negatives) and ranks the held-out rows
    among themselves. Higher is better, as scikit-learn expects.
    """
    def scorer(estimator, X, y):
        if y is None:
            raise ValueError("the mAP scorer needs labels y (relevant = same label)")
        return leave_one_out_map(estimator.transform(X), y, k=k, mode=mode)

    scorer.__name__ = f"map_scorer(k={k}, mode={mode!r})"
    return scorer


#: :func:`make_map_scorer` with its defaults (whole ranking, non-interpolated AP).
map_scorer = make_map_scorer()
