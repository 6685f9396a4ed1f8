"""Scores of rankings: mAP, precision/recall@k, leave-one-out mAP and its scikit-learn scorer,
and the nearest-neighbour recall figures of the ANN world (1-R@1, R@10, 10-R@10)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import dask
import numpy as np

from ..core.ranking import as_id_array, average_precision
from ..core.validation import Rows, check_rows, is_dask_array
from .topk import check_k, search

if TYPE_CHECKING:
    import numpy.typing as npt

#: One collection of database indices per query, in query order (lists, tuples, sets,
#: integer arrays; a 2-D integer array is one row per query).
PerQuery: TypeAlias = Sequence[Iterable[int]] | np.ndarray

__all__ = [
    "mean_average_precision",
    "precision_recall_at_k",
    "leave_one_out_map",
    "make_map_scorer",
    "map_scorer",
    "check_neighbors",
    "recall_at",
    "intersection_recall",
    "ann_recalls",
    "distance_recall",
]


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
        raise TypeError(
            f"{name} is a {type(collections).__name__}, which has no order; give "
            f"a list with one collection of database indices per query"
        )
    collections = list(collections)
    if len(collections) != n_queries:
        raise ValueError(
            f"{name} has {len(collections)} entries but indices has {n_queries} queries; "
            f"give one collection of {name} database indices per query"
        )
    return [as_id_array(c, f"{name}[{i}]") for i, c in enumerate(collections)]


def _per_query(
    indices, relevant, junk, name: str = "relevant"
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    indices = np.asarray(indices)
    if indices.ndim != 2:
        raise ValueError(f"indices must be 2-D (n_queries, k), got shape {indices.shape}")
    relevant = _check_per_query(relevant, name, len(indices))
    junk = (
        [np.empty(0, np.int64)] * len(indices)
        if junk is None
        else _check_per_query(junk, "junk", len(indices))
    )
    for i, rel in enumerate(relevant):
        if rel.size == 0:
            raise ValueError(
                f"{name}[{i}] is empty: query {i} has no relevant item, so its AP is "
                f"undefined; drop that query"
            )
    return indices, relevant, junk


def mean_average_precision(
    indices: npt.ArrayLike,
    relevant: PerQuery,
    junk: PerQuery | None = None,
    mode: str = "non-interpolated",
) -> float:
    """Mean over queries of :func:`slem_dask.core.ranking.average_precision`.

    ``indices``: (n_queries, k) ranked database indices (e.g. from :func:`search`);
    ``relevant`` and ``junk``: a sequence with one collection of database indices
    per query, in query order (lists, tuples, sets, frozensets or integer arrays); a
    dict is refused.
    """
    indices, relevant, junk = _per_query(indices, relevant, junk)
    return float(
        np.mean(
            [
                average_precision(r, rel, j, mode)
                for r, rel, j in zip(indices, relevant, junk, strict=True)
            ]
        )
    )


def precision_recall_at_k(
    indices: npt.ArrayLike, relevant: PerQuery, k: int, junk: PerQuery | None = None
) -> tuple[float, float]:
    """Mean precision@k and recall@k over queries (junk removed before cutting at k)."""
    # k = 0 divided by zero and a negative k cut from the end: refused, as search does
    k = check_k(k, " (the rank at which precision and recall are counted)")
    indices, relevant, junk = _per_query(indices, relevant, junk)
    precisions, recalls = [], []
    for ranking, rel, j in zip(indices, relevant, junk, strict=True):
        if j.size:
            ranking = ranking[~np.isin(ranking, j)]
        hits = np.count_nonzero(np.isin(ranking[:k], rel))
        precisions.append(hits / k)
        recalls.append(hits / rel.size)
    return float(np.mean(precisions)), float(np.mean(recalls))


def leave_one_out_map(
    encodings: Rows, labels: npt.ArrayLike, k: int | None = None, mode: str = "non-interpolated"
) -> float:
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
        raise ValueError(
            f"labels must be 1-D with one label per row ({len(z)} rows), got shape {labels.shape}"
        )
    n = len(z)
    # a given k is checked, not truncated: int(2.5) or int(True) would rank another length
    k = (
        min(n - 1, 10_000)
        if k is None
        else check_k(k, " (the ranking length), or None for every other row")
    )
    if n < 2 or k < 1:
        raise ValueError(
            f"leave-one-out mAP needs at least 2 rows and k >= 1 (got {n} rows, k={k})"
        )
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
        rel = order[starts[i] : ends[i]]
        rel = rel[rel != i]
        if rel.size:
            aps.append(average_precision(ranking[i], rel, (), mode))
    if not aps:
        raise ValueError(
            "leave-one-out mAP: no label occurs twice, so no row has a relevant "
            "item; give at least two rows of some label (in cross-validation, "
            "shuffle the folds, e.g. cv=KFold(5, shuffle=True) or "
            "StratifiedKFold, so that a held-out fold holds several rows per "
            "label)"
        )
    return float(np.mean(aps))


def make_map_scorer(
    k: int | None = None, mode: str = "non-interpolated"
) -> Callable[[Any, Rows, npt.ArrayLike | None], float]:
    """A scikit-learn scorer for retrieval: ``scorer(estimator, X, y)`` encodes ``X``
    with ``estimator.transform`` and returns :func:`leave_one_out_map` with labels ``y``.

    For ``GridSearchCV(LinearSLEM(), {"lam": [...]}, scoring=make_map_scorer())``: each
    fold fits on the training rows (the negatives) and ranks the held-out rows
    among themselves. Higher is better, as scikit-learn expects.
    """

    def scorer(estimator: Any, X: Rows, y: npt.ArrayLike | None) -> float:
        if y is None:
            raise ValueError("the mAP scorer needs labels y (relevant = same label)")
        return leave_one_out_map(estimator.transform(X), y, k=k, mode=mode)

    scorer.__name__ = f"map_scorer(k={k}, mode={mode!r})"
    return scorer


#: :func:`make_map_scorer` with its defaults (whole ranking, non-interpolated AP).
map_scorer = make_map_scorer()


def check_neighbors(
    neighbors: npt.ArrayLike,
    n_queries: int,
    n_database: int,
    name: str = "ground_truth",
    fix: str = "",
) -> np.ndarray:
    """Nearest-neighbour ground truth as an int64 (n_queries, k) array of database ids,
    nearest first; a wrong shape, dtype or id is one ValueError naming ``name``, with
    ``fix`` (how the caller's user gives another) appended."""
    gt = np.asarray(neighbors)
    fix = f"; {fix}" if fix else ""
    if gt.ndim != 2 or gt.shape[0] != n_queries or gt.shape[1] < 1:
        hint = " (one id per query: reshape it to (n_queries, 1))" if gt.ndim == 1 else ""
        raise ValueError(
            f"{name} has shape {gt.shape}; expected ({n_queries}, k): the ids of each of the "
            f"{n_queries} queries' k nearest database rows, nearest first{hint}{fix}"
        )
    if gt.dtype.kind not in "iu":
        raise ValueError(
            f"{name} holds {gt.dtype}; expected integer database ids (0-based row numbers), "
            f"e.g. saved with np.save(path, ids.astype(np.int64)){fix}"
        )
    gt = gt.astype(np.int64)
    bad = (gt < 0) | (gt >= n_database)
    if bad.any():
        row, col = (int(i[0]) for i in np.nonzero(bad))
        based = (
            " (they look 1-based: subtract 1)" if gt.min() >= 1 and gt.max() == n_database else ""
        )
        raise ValueError(
            f"{name} holds {int(bad.sum())} ids outside [0, {n_database}) (query {row}, "
            f"column {col}: {int(gt[row, col])}){based}; the ids must be rows of this "
            f"database (0-based){fix}"
        )
    return gt


def _checked_pair(indices, neighbors, r: int, needed: int) -> tuple[np.ndarray, np.ndarray]:
    indices = np.asarray(indices)
    if indices.ndim != 2:
        raise ValueError(f"indices must be 2-D (n_queries, k), got shape {indices.shape}")
    check_k(r, " (the number of results counted)")
    if indices.shape[1] < r:
        raise ValueError(
            f"indices hold {indices.shape[1]} results per query, fewer than the {r} counted; "
            f"search with k >= {r}"
        )
    gt = check_neighbors(neighbors, len(indices), np.iinfo(np.int64).max)
    if gt.shape[1] < needed:
        raise ValueError(
            f"the ground truth holds {gt.shape[1]} neighbours per query, fewer than the "
            f"{needed} counted; give a ground truth of at least {needed} columns"
        )
    return indices, gt


def recall_at(indices: npt.ArrayLike, neighbors: npt.ArrayLike, r: int) -> float:
    """FAISS's 1-recall@r ("R@r"): the fraction of queries whose true nearest neighbour
    (``neighbors[:, 0]``) is among their first ``r`` results (``indices[:, :r]``).
    ``recall_at(I, gt, 1)`` is 1-R@1."""
    indices, gt = _checked_pair(indices, neighbors, r, 1)
    return float(np.mean((indices[:, :r] == gt[:, :1]).any(axis=1)))


def intersection_recall(indices: npt.ArrayLike, neighbors: npt.ArrayLike, k: int) -> float:
    """k-recall@k ("10-R@10" for k = 10; FAISS's knn_intersection_measure, ann-benchmarks'
    recall by ids): the mean over queries of |first k results ∩ k true nearest| / k."""
    indices, gt = _checked_pair(indices, neighbors, k, k)
    found = [np.intersect1d(i[:k], g[:k]).size for i, g in zip(indices, gt, strict=True)]
    return float(np.sum(found) / (k * len(indices))) if len(indices) else float("nan")


def ann_recalls(indices: npt.ArrayLike, neighbors: npt.ArrayLike) -> dict[str, float]:
    """{"1-R@1", "R@10", "10-R@10"} of a ranking against nearest-neighbour ground truth:
    those its lengths allow (R@10 and 10-R@10 need 10 results, 10-R@10 ten true
    neighbours per query; docs/your-data.md defines them)."""
    indices, gt = np.asarray(indices), np.asarray(neighbors)
    out = {"1-R@1": recall_at(indices, gt, 1)}
    if indices.ndim == 2 and indices.shape[1] >= 10:
        out["R@10"] = recall_at(indices, gt, 10)
        if gt.ndim == 2 and gt.shape[1] >= 10:
            out["10-R@10"] = intersection_recall(indices, gt, 10)
    return out


def distance_recall(
    distances: npt.ArrayLike, true_distances: npt.ArrayLike, k: int = 10, epsilon: float = 1e-3
) -> float:
    """ann-benchmarks' k-nn recall: the mean over queries of the fraction of the first
    ``k`` results whose distance is at most the k-th true distance plus ``epsilon``
    (its ``knn_threshold``). Both in the benchmark's distance: for its euclidean sets
    the L2 distance, not squared (``np.sqrt`` of ``search(..., metric="l2")``'s scores),
    against the file's ``distances``. Unlike :func:`intersection_recall`, a result tied
    with a true neighbour at equal distance counts, whatever its id."""
    k = check_k(k, " (the number of results counted)")
    got, true = np.asarray(distances, dtype=np.float64), np.asarray(true_distances)
    if got.ndim != 2 or true.ndim != 2 or len(got) != len(true):
        raise ValueError(
            f"distances {got.shape} and true_distances {true.shape} must be 2-D, one row per query"
        )
    if got.shape[1] < k or true.shape[1] < k:
        raise ValueError(
            f"distance_recall at k={k} needs {k} results and {k} true distances per query, "
            f"got {got.shape[1]} and {true.shape[1]}"
        )
    threshold = true[:, k - 1 : k].astype(np.float64) + epsilon
    return float(np.mean(np.sum(got[:, :k] <= threshold, axis=1) / k))
