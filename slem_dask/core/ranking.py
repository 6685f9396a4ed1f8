"""Exact top-k and average precision, in numpy.

Ranking order everywhere: higher score first, ties broken by lower database
index, so results do not depend on how the database is split into blocks.
"""

from __future__ import annotations

import numpy as np

__all__ = ["block_topk", "merge_topk", "average_precision"]


def block_topk(scores: np.ndarray, offset: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k columns of each row of ``scores`` (q, m); indices shifted by ``offset``.

    O(q m) with no full sort: a partition finds each row's k-th best score t,
    then every score > t is taken, and of the scores == t the ones with the
    lowest index, exactly as many as needed.
    """
    q, m = scores.shape
    k = min(k, m)
    if k == 0:
        return np.empty((q, 0), scores.dtype), np.empty((q, 0), np.int64)
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1:k]
    above = scores > kth
    tied = scores == kth
    needed = k - above.sum(axis=1, keepdims=True)
    chosen = above | (tied & (np.cumsum(tied, axis=1) <= needed))
    rows, cols = np.nonzero(chosen)  # row-major: k per row, in index order
    cols = cols.reshape(q, k)
    top = np.take_along_axis(scores, cols, axis=1)
    order = np.argsort(-top, axis=1, kind="stable")  # stable keeps index order on ties
    return np.take_along_axis(top, order, axis=1), np.take_along_axis(cols, order, axis=1) + offset


def merge_topk(parts, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge several (scores, indices) top-k lists of the same queries into one."""
    parts = list(parts)
    scores = np.concatenate([p[0] for p in parts], axis=1)
    indices = np.concatenate([p[1] for p in parts], axis=1)
    order = np.lexsort((indices, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(indices, order, axis=1)


def average_precision(ranking, relevant, junk=(), mode: str = "non-interpolated") -> float:
    """Average precision of one ranked list of database indices.

    Junk items are removed from the ranking before precision is counted (the
    Holidays / Oxford protocol). Relevant items that the ranking does not
    contain (beyond k) count as never retrieved.

    mode="non-interpolated": mean over relevant items of the precision at the
    rank of each one. mode="trapezoid": the Oxford ``compute_ap`` rule, the
    area under the precision-recall curve with trapezoids, precision at rank 0
    taken as 1.
    """
    relevant = np.unique(np.asarray(relevant, dtype=np.int64))
    if relevant.size == 0:
        raise ValueError("average_precision needs at least one relevant item")
    ranking = np.asarray(ranking, dtype=np.int64)
    junk = np.asarray(junk, dtype=np.int64)
    if junk.size:
        ranking = ranking[~np.isin(ranking, junk)]
    hits = np.isin(ranking, relevant)
    hit_ranks = np.flatnonzero(hits)  # 0-based rank of each hit, junk removed
    n_rel = relevant.size
    if mode == "non-interpolated":
        return float(np.sum(np.arange(1, hit_ranks.size + 1) / (hit_ranks + 1)) / n_rel)
    if mode == "trapezoid":
        j = np.arange(hit_ranks.size)
        prec_before = np.where(hit_ranks == 0, 1.0, j / np.maximum(hit_ranks, 1))
        prec_after = (j + 1) / (hit_ranks + 1)
        return float(np.sum((prec_before + prec_after) / 2.0) / n_rel)
    raise ValueError(f"mode must be 'non-interpolated' or 'trapezoid', got {mode!r}")
