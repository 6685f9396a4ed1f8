"""The metrics of exact search (inner product, cosine, L2) as inner products of prepared rows.

Every metric runs through the one exact inner-product search (:mod:`.topk`), so its
guarantees (float64 scores summed in one fixed order, ties to the lower index, on any
BLAS and chunking) carry over:

* ``ip``: the rows as given; score q . x, higher first.
* ``cosine``: each row divided by its norm (the square root of its fixed-order sum of
  squares, in float64); score the inner product of the unit rows, higher first.
* ``l2``: a query becomes [q, c] and a database row [x, -||x||^2 / (2c)], so the inner
  product is s = q . x - ||x||^2 / 2, which ranks rows exactly as the squared distance
  ||q - x||^2 = ||q||^2 - 2 s does (ascending). c is a power of two near the largest
  database row norm of the block, so the last product is -||x||^2 / 2 bit for bit
  whatever c: s does not depend on how the database is split, and c only keeps the
  float32 candidate margin small. The stored score is ||q||^2 - 2 s (never below 0).
"""

from __future__ import annotations

import numpy as np

from ..core.dots import RESCORE_ELEMENTS
from ..core.validation import rows_text

__all__ = [
    "METRICS",
    "SCORE_NAMES",
    "check_metric",
    "row_squares",
    "prepared_pair",
    "to_scores",
    "unit_norm_warning",
]

#: The search metrics, in the order ``--metric`` lists them.
METRICS = ("ip", "cosine", "l2")
#: What a search result's scores are, per metric (recorded in its attributes).
SCORE_NAMES = {
    "ip": "inner product (higher first)",
    "cosine": "cosine similarity (higher first)",
    "l2": "squared L2 distance (lower first)",
}


def check_metric(metric) -> str:
    """``metric`` as one of :data:`METRICS`; anything else is one ValueError naming it."""
    if not isinstance(metric, str) or metric not in METRICS:
        raise ValueError(
            f"metric must be one of {', '.join(METRICS)} (inner product, cosine similarity, "
            f"squared L2 distance), got {metric!r}"
        )
    return metric


def row_squares(x) -> np.ndarray:
    """float64 sum of squares of each row, summed left to right feature by feature (the
    order of :func:`slem_dask.core.dots.pair_scores`): the same bits for a row in any
    block, on any BLAS."""
    x = np.asarray(x)
    out = np.zeros(len(x))
    step = max(1, RESCORE_ELEMENTS // max(1, x.shape[1]))
    for lo in range(0, len(x), step):
        by_feature = np.ascontiguousarray(np.square(x[lo : lo + step], dtype=np.float64).T)
        total = out[lo : lo + step]
        for feature in by_feature:
            total += feature
    return out


def _unit_rows(x, name: str, row_offset: int) -> np.ndarray:
    """The rows divided by their norms (float64); a row of zeros has no direction."""
    norms = np.sqrt(row_squares(x))
    zero = np.flatnonzero(norms == 0)
    if zero.size:
        raise ValueError(
            f"{name} rows {rows_text(zero + row_offset, zero.size)} ({zero.size} in all) are "
            f"zero, which have no cosine similarity; drop those rows, or search with "
            f"metric 'l2' or 'ip'"
        )
    return np.asarray(x, dtype=np.float64) / norms[:, None]


def _l2_scale(squares: np.ndarray) -> float:
    """A power of two near the largest row norm, from the rows' sums of squares (1 for
    zero or non-finite rows)."""
    largest = float(np.sqrt(squares.max(initial=0.0)))
    if not np.isfinite(largest) or largest == 0:
        return 1.0
    return float(2.0 ** np.clip(np.round(np.log2(largest)), -500, 500))


def prepared_pair(queries, database, metric: str, q_offset: int = 0, db_offset: int = 0):
    """(queries, database) whose inner products rank as ``metric`` does (module docstring).
    ``q_offset``, ``db_offset``: the blocks' first global rows (for messages)."""
    if metric == "ip":
        return queries, database
    if metric == "cosine":
        return (
            _unit_rows(queries, "queries", q_offset),
            _unit_rows(database, "database", db_offset),
        )
    squares = row_squares(database)
    c = _l2_scale(squares)
    with np.errstate(over="ignore", invalid="ignore"):  # non-finite rows: named by search
        q = np.hstack([np.asarray(queries, dtype=np.float64), np.full((len(queries), 1), c)])
        x = np.hstack([np.asarray(database, dtype=np.float64), (-0.5 / c * squares)[:, None]])
    return q, x


def to_scores(inner, queries, metric: str) -> np.ndarray:
    """The stored scores of ``metric`` from the prepared rows' inner products ``inner``
    (n_queries, k) of ``queries`` (as given): the squared distance ||q||^2 - 2 s for
    l2 (clipped at 0, which it can undershoot by rounding when q is a database row)."""
    if metric != "l2":
        return inner
    return np.maximum(row_squares(queries)[:, None] - 2.0 * inner, 0.0)


def unit_norm_warning(rows: dict, metric: str, tolerance: float = 0.1) -> str | None:
    """The one-line warning when inner product is asked of rows far from unit norm, or
    None. ``rows``: name -> a sample of rows (e.g. the first thousand) of that input."""
    if metric != "ip":
        return None
    far = {}
    for name, x in rows.items():
        norms = np.sqrt(row_squares(x))
        # non-finite rows are search's own error, named by row; here they would make
        # the range read "nan to nan"
        norms = norms[np.isfinite(norms)]
        if norms.size and np.any(np.abs(norms - 1.0) > tolerance):
            far[name] = (float(norms.min()), float(np.median(norms)), float(norms.max()))
    if not far:
        return None
    said = "; ".join(
        f"{name} norms {lo:.3g} to {hi:.3g} (median {mid:.3g}) in its first {len(rows[name])} rows"
        for name, (lo, mid, hi) in far.items()
    )
    return (
        f"inner product of rows far from unit norm ({said}): longer rows outrank nearer ones; "
        f"for nearest neighbours use --metric l2 (or --metric cosine for angles), or "
        f"normalize the rows (slem-dask encodings are unit rows)"
    )
