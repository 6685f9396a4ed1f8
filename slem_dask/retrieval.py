"""Downstream retrieval: exact top-k search and evaluation (mAP, precision/recall@k)."""

from __future__ import annotations

import dask
import numpy as np

from .core.ranking import average_precision, block_topk, merge_topk
from .validation import check_rows, is_dask_array

__all__ = ["search", "mean_average_precision", "precision_recall_at_k"]

_SPLIT_EVERY = 8


def _score_block(queries, block, offset, k):
    scores = np.asarray(queries, dtype=np.float64) @ np.asarray(block, dtype=np.float64).T
    return block_topk(scores, offset, k)


def _merge(parts, k):
    return merge_topk(parts, k)


def search(queries, database, k: int = 100):
    """Exact top-k by inner product (cosine for L2-normalized rows), best first.

    Returns ``(scores, indices)``, each (n_queries, k); ties go to the lower
    database index. A dask ``database`` is scanned block by block with a tree
    of top-k merges, so memory is bounded by the block size and k, never by
    the database size. Results are numpy arrays (computed) for numpy inputs
    and Delayed for dask inputs: call ``dask.compute(search(...))``.
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
    if k > database.shape[0]:
        raise ValueError(
            f"k={k} is larger than the database ({database.shape[0]} rows); use "
            f"k <= {database.shape[0]}"
        )
    if not is_dask_array(database) and not is_dask_array(queries):
        return _score_block(queries, database, 0, k)
    import dask.array as da

    if is_dask_array(queries):
        queries = dask.delayed(queries.rechunk({0: -1}).to_delayed().ravel()[0])
    else:
        queries = dask.delayed(np.asarray(queries), pure=True, traverse=False)
    database = da.asarray(database)
    offsets = np.cumsum((0,) + database.chunks[0][:-1])
    parts = [dask.delayed(_score_block, pure=True)(queries, block, int(off), k)
             for block, off in zip(database.to_delayed().ravel(), offsets)]
    while len(parts) > 1:
        parts = [dask.delayed(_merge, pure=True)(parts[i:i + _SPLIT_EVERY], k)
                 for i in range(0, len(parts), _SPLIT_EVERY)]
    return parts[0]


def _per_query(indices, relevant, junk, name="relevant"):
    indices = np.asarray(indices)
    if indices.ndim != 2:
        raise ValueError(f"indices must be 2-D (n_queries, k), got shape {indices.shape}")
    relevant = list(relevant)
    if len(relevant) != len(indices):
        raise ValueError(
            f"{name} has {len(relevant)} entries but indices has {len(indices)} queries; "
            f"give one collection of relevant indices per query"
        )
    junk = [()] * len(indices) if junk is None else list(junk)
    if len(junk) != len(indices):
        raise ValueError(f"junk has {len(junk)} entries but indices has {len(indices)} queries")
    for i, rel in enumerate(relevant):
        if len(np.atleast_1d(rel)) == 0:
            raise ValueError(
                f"relevant[{i}] is empty: query {i} has no relevant item, so its AP is "
                f"undefined; drop that query"
            )
    return indices, relevant, junk


def mean_average_precision(indices, relevant, junk=None, mode: str = "non-interpolated"):
    """Mean over queries of :func:`slem_dask.core.ranking.average_precision`.

    ``indices``: (n_queries, k) ranked database indices (e.g. from :func:`search`);
    ``relevant`` and ``junk``: one collection of database indices per query.
    """
    indices, relevant, junk = _per_query(indices, relevant, junk)
    return float(np.mean([average_precision(r, rel, j, mode)
                          for r, rel, j in zip(indices, relevant, junk)]))


def precision_recall_at_k(indices, relevant, k: int, junk=None) -> tuple[float, float]:
    """Mean precision@k and recall@k over queries (junk removed before cutting at k)."""
    indices, relevant, junk = _per_query(indices, relevant, junk)
    precisions, recalls = [], []
    for ranking, rel, j in zip(indices, relevant, junk):
        rel = np.unique(np.asarray(rel, dtype=np.int64))
        ranking = np.asarray(ranking)
        if len(j):
            ranking = ranking[~np.isin(ranking, np.asarray(j))]
        hits = np.count_nonzero(np.isin(ranking[:k], rel))
        precisions.append(hits / k)
        recalls.append(hits / rel.size)
    return float(np.mean(precisions)), float(np.mean(recalls))
