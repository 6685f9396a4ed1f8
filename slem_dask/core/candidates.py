"""Exact top-k by inner product from float32 candidates and a float64 re-score.

The ranking (float64 scores, higher first, ties to the lower database index) is
the one :func:`slem_dask.core.ranking.exact_topk_search` computes; only the
route differs:

1. float32 scores ``fl32(q . x)`` (one sgemm per block) and, per query, a
   running k-th best float32 score t, kept with a comparison and a
   ``flatnonzero`` per block (O(n) per query row, no sort of the rows);
2. a proven bound E on the distance between a float32 score and the float64
   score it stands for, so every row whose float32 score is >= t - 2E is kept
   as a candidate: k rows have float64 scores >= t - E, and any row below
   t - 2E in float32 is below t - E in float64, so it is not in the top k;
3. the candidates only, scored again in float64 by
   :func:`slem_dask.core.dots.pair_scores` (one fixed summation order for every
   pair, whatever the block, chunking or BLAS) and ranked with ties to the
   lower index.

Rows whose candidates are too many (near-ties by the thousand) take the exact
path, and so do inputs the bound cannot cover (float32 overflow).
"""

from __future__ import annotations

import numpy as np

from .dots import _U64, _gamma  # gamma_n(u) and float64's unit roundoff: one definition
from .ranking import exact_topk_search, rescore_and_rank

__all__ = ["topk_search", "candidate_topk", "score_error_factor", "row_norm_bounds"]

_U32 = 2.0**-24  # unit roundoff of float32
#: Bytes of float32 scores one step holds (its comparison mask is a quarter of that).
SCORE_BLOCK_BYTES = 16 * 2**20
#: Largest float32 magnitude any partial sum may reach for the bound to hold (no
#: overflow): float32's largest finite value is just under 2**128.
_NO_OVERFLOW = 2.0**126


def score_error_factor(d: int) -> float:
    """G such that |fl32(q32 . x32) - fl64(q64 . x64)| <= G ||q32|| ||x32|| + eta.

    q32, x32 are the inputs rounded to float32 (relative error <= u32 each,
    0 for float32 inputs), the float32 product has a relative error <= gamma_d
    on sum |q_i x_i| whatever the summation order or blocking (Higham, Numerical
    Stability, 3.1), so fl32 is within gamma_{d+2}(u32) sum |q_i x_i| of the
    exact q . x; the float64 score is within gamma_d(u64) of it; and
    sum |q_i x_i| <= ||q32|| ||x32|| / (1 - u32)^2 by Cauchy-Schwarz.
    """
    if (d + 2) * _U32 >= 0.5:
        return np.inf
    return (_gamma(d + 2, _U32) + _gamma(d, _U64)) / (1 - _U32) ** 2 * (1 + 2.0**-40)


def _underflow_term(d: int) -> float:
    # Each of the <= 2d float32 operations may lose < 2**-126 to underflow even when
    # the BLAS flushes subnormals to zero; float64's own underflow is far below that.
    return 2 * d * 2.0**-126


def row_norm_bounds(x32: np.ndarray) -> np.ndarray:
    """Upper bounds (float64) on the 2-norms of the rows of a float32 array.

    The float32 sum of squares is low by at most gamma_d of itself, plus what
    underflow loses (< 2**-126 in each of its 2d operations, subnormals flushed or
    not); NaN or inf in a row, or a square that overflows, gives a non-finite
    bound, so the same pass is the finite check.
    """
    d = x32.shape[1]
    squares = np.einsum("ij,ij->i", x32, x32).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.sqrt((squares + _underflow_term(d)) / (1 - _gamma(d, _U32))) * (1 + 2.0**-50)


def _round_down_f32(values: np.ndarray) -> np.ndarray:
    """float32 values <= the given float64 ones (the cast rounds to nearest)."""
    out = values.astype(np.float32)
    high = out.astype(np.float64) > values
    out[high] = np.nextafter(out[high], np.float32(-np.inf))
    return out


def _thresholds(kth: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """float32 candidate thresholds kth - 2 margin, rounded down (-inf where kth is)."""
    with np.errstate(invalid="ignore"):
        theta = kth.astype(np.float64) - 2.0 * margin
    theta -= np.abs(theta) * 2.0**-50  # the subtraction's own rounding
    theta[~np.isfinite(kth)] = -np.inf
    return _round_down_f32(theta)


def _merge_values(best: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each row's k largest of ``best`` (q, k) and the new ``values`` of that row
    (``rows`` non-decreasing, as flatnonzero gives them)."""
    q, k = best.shape
    counts = np.bincount(rows, minlength=q)
    width = int(counts.max())
    pad = np.full((q, width), -np.inf, dtype=np.float32)
    starts = np.cumsum(counts) - counts
    pad[rows, np.arange(rows.size) - starts[rows]] = values
    return np.partition(np.concatenate([best, pad], axis=1), width, axis=1)[:, width:]


class _Candidates:
    """Float32 candidates of a group of queries, collected block by block."""

    def __init__(self, n_queries: int, k: int, margin: np.ndarray, cap: int):
        self.k, self.margin, self.cap = k, margin, cap
        self.best = np.full((n_queries, k), -np.inf, dtype=np.float32)
        self.theta = np.full(n_queries, -np.inf, dtype=np.float32)
        self.count = np.zeros(n_queries, dtype=np.int64)
        self.too_many = np.zeros(n_queries, dtype=bool)
        self.seen = 0
        self.rows, self.cols, self.values = [], [], []

    def add(self, scores: np.ndarray, first_col: int, mask: np.ndarray) -> None:
        q, m = scores.shape
        if self.seen == 0 and m > self.k:
            # no threshold yet: this block's own k-th best gives one without
            # collecting the whole block
            kth = np.partition(scores, m - self.k, axis=1)[:, m - self.k]
            self.theta = _thresholds(kth, self.margin)
        self.seen += m
        np.greater_equal(scores, self.theta[:, None], out=mask)
        flat = np.flatnonzero(mask)
        if not flat.size:
            return
        rows = flat // m
        values = scores.ravel()[flat]
        self.rows.append(rows)
        self.cols.append(flat - rows * m + first_col)
        self.values.append(values)
        self.count += np.bincount(rows, minlength=q)
        self.best = _merge_values(self.best, rows, values)
        self.theta = np.maximum(self.theta, _thresholds(self.best.min(axis=1), self.margin))
        # compact at twice the cap, so each compaction follows at least cap new
        # entries of some row (near-ties hovering at the cap do not re-compact per block)
        if (self.count > 2 * self.cap).any():
            self._compact()

    def _compact(self) -> None:
        """Drop what the thresholds have risen past; rows still over the cap (near-ties
        by the thousand) leave for the exact path, so memory stays bounded."""
        rows, cols, values = self._stored()
        over = np.bincount(rows[values >= self.theta[rows]], minlength=len(self.count)) > self.cap
        self.too_many |= over
        self.theta[self.too_many] = np.inf
        keep = values >= self.theta[rows]
        rows, cols, values = rows[keep], cols[keep], values[keep]
        self.rows, self.cols, self.values = [rows], [cols], [values]
        self.count = np.bincount(rows, minlength=len(self.count))

    def _stored(self):
        if not self.rows:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
        return (np.concatenate(self.rows), np.concatenate(self.cols), np.concatenate(self.values))

    def final(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, columns) of the candidates against the final thresholds, sorted by row."""
        self._compact()
        rows, cols, _ = self._stored()
        order = np.argsort(rows, kind="stable")
        return rows[order], cols[order]


def candidate_topk(
    queries,
    database,
    k: int,
    offset: int = 0,
    block_bytes: int = SCORE_BLOCK_BYTES,
    database_rows: int | None = None,
    on_nonfinite=None,
    stats: dict | None = None,
):
    """Top-k database rows of every query, float64 scores, ties to the lower index.

    The same result as :func:`slem_dask.core.ranking.exact_topk_search` (see the
    module docstring for why). ``on_nonfinite(name, array)`` is called with
    "queries" or "database" and that whole input when a row norm is not finite
    (NaN, inf, or squares beyond float32); if it returns, those inputs take the
    exact path. ``stats``, if given, counts rows by path ("candidate_rows",
    "exact_rows") and the float64 re-scores ("candidates").
    """
    queries = np.asarray(queries)
    database = np.asarray(database)
    q, m = len(queries), len(database)
    k = min(k, m)
    d = database.shape[1]
    stats = {} if stats is None else stats
    for key in ("candidate_rows", "exact_rows", "candidates"):
        stats.setdefault(key, 0)
    if q == 0 or k == 0:
        return np.empty((q, k)), np.empty((q, k), dtype=np.int64)
    rows_per_block = database_rows or max(1, block_bytes // (4 * min(q, 1024)))
    rows_per_block = min(m, max(rows_per_block, 1))
    q32, q_norms, x_norm = _norm_bounds(queries, database, rows_per_block)
    finite = _norms_finite(queries, database, q_norms, x_norm, on_nonfinite)
    factor = score_error_factor(d)
    if (
        not finite
        or 2 * k >= m
        or not np.isfinite(factor)
        or float(q_norms.max()) * x_norm * (1 + factor) + _underflow_term(d) >= _NO_OVERFLOW
    ):
        # whole rankings sort every row anyway; huge values would overflow float32
        stats["exact_rows"] += q
        return exact_topk_search(queries, database, k, offset, block_bytes=block_bytes)
    # float64 values that underflow float32 in the cast lose < 2**-149 each, absolutely
    margin = (
        factor * q_norms * x_norm
        + _underflow_term(d)
        + 2.0**-140 * np.sqrt(d) * (q_norms + x_norm + 1)
    )
    return _search_blocks(
        queries, q32, database, margin, k, offset, block_bytes, rows_per_block, stats
    )


def _search_blocks(queries, q32, database, margin, k, offset, block_bytes, rows_per_block, stats):
    """:func:`candidate_topk`'s float32 path: the candidates of a group of queries at a
    time (within ``margin`` of their k-th bound), then their float64 ranking."""
    q = len(queries)
    group = max(1, min(q, block_bytes // (4 * rows_per_block)))
    scores = np.empty((q, k))
    indices = np.empty((q, k), dtype=np.int64)
    buffers = (
        np.empty(group * rows_per_block, dtype=np.float32),
        np.empty(group * rows_per_block, dtype=bool),
    )
    for i in range(0, q, group):
        found = _candidates_of(
            q32[i : i + group], database, margin[i : i + group], k, rows_per_block, buffers
        )
        scores[i : i + group], indices[i : i + group] = _rank_candidates(
            found, queries[i : i + group], database, k, offset, block_bytes, stats
        )
    return scores, indices


def _norm_bounds(queries, database, rows_per_block: int):
    """(the queries in float32, upper bounds of their row norms, of the database's
    largest row norm), read a block of database rows at a time."""
    m = len(database)
    with np.errstate(over="ignore"):  # beyond float32: an infinite norm, the exact path
        q32 = queries.astype(np.float32, copy=False)
        q_norms = row_norm_bounds(q32)
        x_norm = max(
            (
                float(
                    row_norm_bounds(
                        database[j : j + rows_per_block].astype(np.float32, copy=False)
                    ).max()
                )
                for j in range(0, m, rows_per_block)
            ),
            default=0.0,
        )
    return q32, q_norms, x_norm


def _norms_finite(queries, database, q_norms, x_norm: float, on_nonfinite) -> bool:
    """Whether every row norm is finite; ``on_nonfinite(name, array)`` told of each
    input that has one that is not."""
    finite = True
    for name, norms, array in (("queries", q_norms.max(), queries), ("database", x_norm, database)):
        if not np.isfinite(norms):
            finite = False
            if on_nonfinite is not None:
                on_nonfinite(name, array)
    return finite


def _candidates_of(qb, database, margin, k: int, rows_per_block: int, buffers):
    """The float32 candidates of the queries ``qb`` (float32) among every database row,
    scored a block of rows at a time into the reused ``buffers`` (scores, mask)."""
    buffer, mask = buffers
    found = _Candidates(len(qb), k, margin, 4 * k + 1024)
    for j in range(0, len(database), rows_per_block):
        xb = database[j : j + rows_per_block].astype(np.float32, copy=False)
        shape = (len(qb), len(xb))  # contiguous views of the buffers
        out = buffer[: shape[0] * shape[1]].reshape(shape)
        np.matmul(qb, xb.T, out=out)
        found.add(out, j, mask[: out.size].reshape(shape))
    return found


def _rank_candidates(found, queries, database, k: int, offset: int, block_bytes: int, stats: dict):
    """(scores, indices) of a group of ``queries``: their candidates re-scored in
    float64, or the exact path for the queries with too many candidates."""
    rows, cols = found.final()
    fast = ~found.too_many
    stats["candidate_rows"] += int(fast.sum())
    stats["candidates"] += int(rows.size)
    if fast.all():
        return rescore_and_rank(queries, database, rows, cols, len(queries), k, offset)
    scores = np.empty((len(queries), k))
    indices = np.empty((len(queries), k), dtype=np.int64)
    slow = np.flatnonzero(~fast)
    stats["exact_rows"] += slow.size
    # renumber the fast rows 0.. so the padded candidate table has only them
    renumber = np.cumsum(fast) - 1
    fast_rows = np.flatnonzero(fast)
    if fast_rows.size:
        scores[fast_rows], indices[fast_rows] = rescore_and_rank(
            queries[fast_rows], database, renumber[rows], cols, fast_rows.size, k, offset
        )
    scores[slow], indices[slow] = exact_topk_search(
        queries[slow], database, k, offset, block_bytes=block_bytes
    )
    return scores, indices


def topk_search(
    queries,
    database,
    k: int,
    offset: int = 0,
    block_bytes: int | None = None,
    database_rows: int | None = None,
    on_nonfinite=None,
    stats: dict | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k database rows of every query by inner product: float64 scores, ties to the
    lower index, (scores, indices + offset) each (len(queries), min(k, len(database))).

    Float32 candidates and a float64 re-score of those that can matter (this module),
    the same result as :func:`slem_dask.core.ranking.exact_topk_search` at a fraction
    of its cost. ``block_bytes`` None (or 0): :data:`SCORE_BLOCK_BYTES`.
    """
    return candidate_topk(
        queries,
        database,
        k,
        offset,
        block_bytes=block_bytes or SCORE_BLOCK_BYTES,
        database_rows=database_rows,
        on_nonfinite=on_nonfinite,
        stats=stats,
    )
