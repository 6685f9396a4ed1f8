"""Sufficient statistics of the negatives: count, mean and centred scatter.

The scatter of a block is computed around the block's own mean and blocks are
merged with the pairwise update of Chan, Golub and LeVeque (1979,
docs/math.md#chan-merge), so that the covariance never goes through the
cancellation-prone ``X^T X / n - mu mu^T`` (the form the source documents write,
algebraically equal; docs/math.md#scatter).

Precision contract. Statistics are merged across blocks in float64, always.
Inside a block, float64 input (and any non-float32 input) is computed in
float64 (``precision="float64"``, exact to ~1e-12). A float32 block with
``precision="auto"`` is computed in float32: the block is shifted by its own
mean rounded to float32 (so the shift is exact up to the rounding of the
*centred* values, however far the data sit from the origin), and the scatter
of at most :data:`FLOAT32_PRODUCT_ROWS` rows at a time is one float32 product
``Xc^T Xc``, summed in float64. The result is within 1e-5 (max abs error /
max abs entry) of the same statistics computed in float64 on the same float32
values, also for data offset by 1e4 standard deviations
(tests/parallel/test_precision.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .validation import MAX_ABS_VALUE, LargeValuesError, large_values_detail

__all__ = [
    "ScatterStats",
    "ScatterAccumulator",
    "block_statistics",
    "column_mean",
    "merge_statistics",
    "merge_many",
    "merge_into",
    "array_statistics",
    "mirror_upper",
    "covariance",
    "check_precision",
    "compute_dtype",
    "FLOAT32_PRODUCT_ROWS",
    "product_rows",
    "PRECISIONS",
]

#: Values of the ``precision`` parameter: "auto" computes a block in the input's
#: precision (float32 stays float32), "float64" computes everything in float64.
PRECISIONS = ("auto", "float64")

#: Rows per float32 product inside a block: bounds the float32 rounding of one
#: inner product (its error grows like sqrt(rows) * 6e-8 relative to the sum of
#: the magnitudes of its terms: 5.4e-6 at 8192); the partial products are summed in
#: float64. Measured on tests/parallel/test_precision.py's data, 4096 -> 8192 rows moved the
#: error from 3.5e-7 to 3.8e-7 and saved 1.5 ms of a 57 ms block (16,384 x 512).
FLOAT32_PRODUCT_ROWS = 8192


def check_precision(precision) -> str:
    """The ``precision`` parameter, checked: "auto" or "float64"."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"precision must be one of {PRECISIONS}, got {precision!r}; use 'auto' to "
            f"compute float32 input in float32 inside blocks (error <= 1e-5 relative), or "
            f"'float64' to compute everything in float64"
        )
    return precision


def compute_dtype(dtype, precision: str = "auto") -> np.dtype:
    """The dtype a block of ``dtype`` is computed in: float32 only for float32 input
    with ``precision="auto"``; float64 for everything else."""
    if check_precision(precision) == "auto" and np.dtype(dtype) == np.float32:
        return np.dtype(np.float32)
    return np.dtype(np.float64)


@dataclass(frozen=True)
class ScatterStats:
    """Statistics of a set of rows.

    count: number of rows; mean: (d,) float64; scatter: (d, d) float64, the sum
    of outer products of the rows centred on ``mean``; nonfinite: number of
    rows holding NaN or inf (those rows are left out of the other fields, and a
    caller that finds nonfinite > 0 must reject the data).
    """

    count: int
    mean: np.ndarray
    scatter: np.ndarray
    nonfinite: int = 0

    @property
    def n_features(self) -> int:
        return int(self.mean.shape[0])

    def to_array(self) -> np.ndarray:
        """One float64 row [count, nonfinite, mean, scatter.ravel()]: the form a dask
        block returns, so that reading a block and reducing it stay one task."""
        return np.concatenate(([self.count, self.nonfinite], self.mean, self.scatter.ravel()))

    @classmethod
    def from_array(cls, packed: np.ndarray) -> ScatterStats:
        packed = np.asarray(packed, dtype=np.float64).ravel()
        d = int(round((-1 + np.sqrt(1 + 4 * (packed.size - 2))) / 2))  # size = 2 + d + d^2
        return cls(
            int(packed[0]),
            packed[2 : 2 + d].copy(),
            packed[2 + d :].reshape(d, d).copy(),
            int(packed[1]),
        )


def _finite_rows(values: np.ndarray, mean: np.ndarray) -> np.ndarray | None:
    """Mask of the rows without NaN or inf, or None when all rows are finite.

    A column mean is NaN or inf when the column holds one (or overflows); only
    then are the rows checked element by element, so finite data pay nothing
    beyond the mean the statistics need anyway.
    """
    if np.isfinite(mean).all():
        return None
    finite = np.isfinite(values).all(axis=1)
    return None if finite.all() else finite


#: Elements of one float64 piece of :func:`column_mean` (2 MiB: stays in cache).
_MEAN_PIECE_ELEMENTS = 2**18


def column_mean(values: np.ndarray) -> np.ndarray:
    """The float64 mean of each column of the 2-D float ``values``.

    The same sum as ``values.mean(axis=0, dtype=np.float64)`` (every float32 value
    widened exactly, float64 additions; NaN and inf propagate alike), at about half
    its cost: numpy widens and adds row by row, here the rows are widened a cache-sized
    piece at a time and each piece is summed by one BLAS product with a ones vector.
    """
    m, d = values.shape
    if values.dtype == np.float64:
        return (np.ones(m) @ values) / m
    rows = min(m, max(1, _MEAN_PIECE_ELEMENTS // max(1, d)))
    wide, ones, total = np.empty((rows, d)), np.ones(rows), np.zeros(d)
    for start in range(0, m, rows):
        piece = wide[: min(rows, m - start)]
        np.copyto(piece, values[start : start + rows])
        total += ones[: piece.shape[0]] @ piece
    return total / m


#: Above this width the float32 product is done in column panels of this many
#: columns (upper block triangle only), so its float32 temporary is d x 1024
#: (32 MiB at d = 8192) instead of d x d (256 MiB).
_PANEL_COLUMNS = 1024


def product_rows(d: int) -> int:
    """Rows per float32 product: FLOAT32_PRODUCT_ROWS, fewer for wide rows
    (a centred chunk of 2048 x 8192 float32 is 64 MiB)."""
    return int(min(FLOAT32_PRODUCT_ROWS, max(256, 2**24 // max(1, d))))


#: A float32 product is used only while the largest column sum of squares of its
#: rows lies in [2^-80, 2^120], or is 0 with every centred value 0 (a sum of 0 from
#: values whose squares all underflowed is not: values ~1e-30 gave a covariance 1000x
#: too small): every partial sum of the product is at most that sum, so nothing
#: overflows float32 (3.4e38 = 2^128), and products flushed to zero below 2^-126 (at
#: most 4096 of them) stay below 1e-10 of it.
_FLOAT32_SQUARES = (2.0**-80, 2.0**120)


def _float32_safe(squares: np.ndarray, centred: np.ndarray) -> bool:
    top = float(squares.max())
    if top == 0.0:  # a constant block, or values whose every square underflowed (~1e-23)
        return not centred.any()
    return _FLOAT32_SQUARES[0] <= top <= _FLOAT32_SQUARES[1]  # NaN: False


def _add_scatter(
    scatter: np.ndarray, centred: np.ndarray, squares: np.ndarray, check_float32: bool = False
) -> bool:
    """scatter += centred^T centred (products in centred's dtype, float64 sum) and
    squares += its diagonal; True. With ``check_float32``: False, adding nothing,
    when float32 products would overflow or underflow (see :data:`_FLOAT32_SQUARES`).

    Narrow rows: numpy computes ``a.T @ a`` with one syrk and mirrors it
    (exactly symmetric); its diagonal costs nothing more. Wide rows: only the upper
    block triangle is updated, panel by panel (half the flops, like syrk), after one
    pass for the diagonal (under 1% of the product at d > 2048); the caller mirrors it.
    """
    d = centred.shape[1]
    if d <= 2 * _PANEL_COLUMNS:
        product = centred.T @ centred
        diagonal = product.diagonal()
        if check_float32 and not _float32_safe(diagonal, centred):
            return False
        scatter += product
        squares += diagonal
        return True
    diagonal = np.einsum("ij,ij->j", centred, centred)
    if check_float32 and not _float32_safe(diagonal, centred):
        return False
    for j0 in range(0, d, _PANEL_COLUMNS):
        j1 = min(d, j0 + _PANEL_COLUMNS)
        scatter[:j1, j0:j1] += centred[:, :j1].T @ centred[:, j0:j1]
    squares += diagonal
    return True


def mirror_upper(m: np.ndarray, rows: int = 256) -> None:
    """Copy the upper triangle of the square C-ordered ``m`` onto its lower one, in
    place, ``rows`` rows at a time (temporaries of rows x d at most)."""
    d = m.shape[0]
    for i in range(0, d, rows):
        j = min(d, i + rows)
        m[i:j, :i] = m[:i, i:j].T
        block = m[i:j, i:j]
        lower = np.tril_indices(j - i, -1)
        block[lower] = block.T[lower]


class ScatterAccumulator:
    """Statistics of a stream of row blocks, merged as they come into one float64
    scatter (owned by the accumulator), with no d x d matrix per block.

    Each block is shifted by ``shift``, its float64 mean rounded to the compute
    dtype: ``x - shift`` rounds only relative to the centred value (exactly when
    x and shift are within a factor 2, Sterbenz), so data far from the origin
    lose no digits. Its product ``(x - shift)^T (x - shift)`` (float32 for
    float32 input with ``precision="auto"``, at most :data:`FLOAT32_PRODUCT_ROWS`
    rows per product) is added straight into the float64 scatter, followed by
    two rank-one terms: ``-m r r^T`` with r = mean - shift (the scatter about the
    block's own mean; left out where below 2^-40 of the scatter, :func:`_significant`)
    and Chan et al.'s ``n_a m / (n_a + m) delta delta^T``
    (the merge with what came before). This is the same arithmetic as forming
    the block's statistics and calling :func:`merge_into`, without the block's
    own d x d matrix (512 MiB at d = 8192).
    """

    def __init__(self, n_features: int, precision: str = "auto"):
        self.precision = check_precision(precision)
        self.count = 0
        self.nonfinite = 0
        self.mean = np.zeros(int(n_features))
        self._scatter = None
        self._scratch = None

    def add(self, block: np.ndarray, overwrite: bool = False) -> bool:
        """Fold the rows of ``block`` in; True.

        ``overwrite``: the caller reads ``block`` no more (a reused read buffer), so a
        float32 block of at most :func:`product_rows` finite rows is shifted in place
        instead of into a scratch copy: one buffer and one pass over memory fewer
        (16 MiB blocks of 1M x 512 rows on 2 threads: 43.5 -> 41 ms a block, with the
        read). Then False means that its float32 product would overflow or underflow:
        nothing was folded in, ``block`` holds shifted values, and the caller passes its
        rows again, as read, without ``overwrite`` (they are then done in float64).
        """
        block = np.asarray(block)
        d = self.mean.shape[0]
        if block.ndim != 2 or block.shape[1] != d:
            raise ValueError(
                f"expected a 2-D block of rows with {d} columns, got shape {block.shape}"
            )
        if block.shape[0] == 0:
            return True
        dtype = compute_dtype(block.dtype, self.precision)
        values = block if block.dtype == dtype else block.astype(dtype)
        mean = column_mean(values)
        finite = _finite_rows(values, mean)
        if finite is not None:
            self.nonfinite += int(values.shape[0] - np.count_nonzero(finite))
            values = np.ascontiguousarray(values[finite])
            if values.shape[0] == 0:
                return True
            mean = column_mean(values)
        if self._scatter is None:
            self._scatter = np.zeros((d, d))
        m = values.shape[0]
        _exact_constant_columns(values, mean)
        shift = mean.astype(dtype)
        rows = product_rows(d)
        squares = np.zeros(d)  # sum of (x - shift)^2 per column, from the products
        in_place = (
            overwrite
            and values is block
            and dtype == np.float32
            and m <= rows
            and values.flags.c_contiguous
        )
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked below
            if in_place:
                centred = np.subtract(values, shift, out=values)
                if not _add_scatter(self._scatter, centred, squares, True):
                    return False
            else:
                self._add_shifted(values, shift, squares, rows)
        if dtype == np.float64:  # float32 (and narrower, and integer) input cannot reach it
            _check_magnitude(values, shift, squares)
        self._merge(mean, shift, squares, m)
        return True

    def _merge(self, mean: np.ndarray, shift: np.ndarray, squares: np.ndarray, m: int) -> None:
        """Fold a block of ``m`` rows, whose products about ``shift`` are in the scatter
        already, into the running mean and scatter (Chan's merge, in float64)."""
        residual = mean - shift.astype(np.float64)
        if _significant(residual, m, squares):
            _add_outer(self._scatter, residual, -float(m))
        if self.count:
            total = self.count + m
            delta = mean - self.mean
            _add_outer(self._scatter, delta, self.count * m / total)
            self.mean = self.mean + delta * (m / total)
        else:
            self.mean = mean
        self.count += m

    def _add_shifted(
        self, values: np.ndarray, shift: np.ndarray, squares: np.ndarray, rows: int
    ) -> None:
        """scatter += (values - shift)^T (values - shift), ``rows`` rows at a time through
        the scratch buffer, each product in the values' dtype where float32 is safe."""
        dtype, need = values.dtype, min(rows, values.shape[0])
        if self._scratch is None or self._scratch.dtype != dtype or len(self._scratch) < need:
            self._scratch = np.empty((need, values.shape[1]), dtype=dtype)
        for start in range(0, values.shape[0], rows):
            part = values[start : start + rows]
            centred = np.subtract(part, shift, out=self._scratch[: part.shape[0]])
            if not _add_scatter(self._scatter, centred, squares, dtype == np.float32):
                # float32 would overflow or underflow (values beyond ~1e16 or below
                # ~1e-13 around their mean): these rows in float64, exact as ever
                centred = part.astype(np.float64) - shift.astype(np.float64)
                _add_scatter(self._scatter, centred, squares)

    def result(self) -> ScatterStats:
        """The statistics so far; the accumulator gives up its scatter (no copy)."""
        d = self.mean.shape[0]
        scatter, self._scatter, self._scratch = self._scatter, None, None
        if scatter is None:
            return ScatterStats(0, np.zeros(d), np.zeros((d, d)), self.nonfinite)
        if d > 2 * _PANEL_COLUMNS:
            mirror_upper(scatter)
        stats = ScatterStats(self.count, self.mean, scatter, self.nonfinite)
        self.count, self.mean = 0, np.zeros(d)
        return stats


def _significant(residual: np.ndarray, m: int, squares: np.ndarray) -> bool:
    """Whether the block's scatter about its own mean, (x - shift)^T (x - shift) - m r r^T
    with r = mean - shift, needs its rank-one term: not when every m r_j^2 is below
    2^-40 of the largest square about the shift. Then no entry moves by more than that
    relative to the scatter's largest one, 10^5 times less than the float32 products'
    own rounding. As |r| <= 2^-24 |mean|, that is so for data within about 16 standard
    deviations of the origin (a float64 shift is the mean itself: r = 0).
    """
    top = float(squares.max(initial=0.0))
    return (
        bool(residual.any()) and not float(m) * float(np.square(residual).max()) <= 2.0**-40 * top
    )


def _check_magnitude(values: np.ndarray, shift: np.ndarray, squares: np.ndarray) -> None:
    """Refuse float64 values beyond MAX_ABS_VALUE. |x - shift| <= sqrt(squares) for every
    value of a column, so the block is scanned only when that bound exceeds the limit."""
    bound = float((np.abs(shift.astype(np.float64)) + np.sqrt(squares)).max(initial=0.0))
    if bound <= MAX_ABS_VALUE:  # False for NaN: the sums overflowed
        return
    peak = float(max(abs(values.max()), abs(values.min())))
    if not peak <= MAX_ABS_VALUE:
        raise LargeValuesError("X", large_values_detail(peak))


#: A column whose mean is this close to its first value (relative) is compared with it:
#: the float64 sum of m copies of c is within m 2^-53 |c| of m c (2^-20: m up to 2^33).
_CONSTANT_CANDIDATE = 2.0**-20


def _exact_constant_columns(values: np.ndarray, mean: np.ndarray) -> None:
    """Make the mean of a column that is constant in this block that constant, exactly,
    before the block is shifted by its mean.

    Summing n copies of c in float64 can round (mean(0.3, 0.3, ...) != 0.3). Then a
    positive equal to identical negatives got a direction made of rounding errors
    instead of none; and, a shift being that rounded mean, a float64 column constant at
    1e30 centred to values of 1e14 whose products with the other columns filled the
    covariance (found by a reviewer; the fit then failed as not positive definite).
    With the constant as the shift, the column centres to exact zeros. Candidates cost
    nothing (a mean next to its first value); only they are compared with it.
    """
    first = values[0].astype(np.float64)
    candidates = np.flatnonzero(np.abs(mean - first) <= _CONSTANT_CANDIDATE * np.abs(first))
    if candidates.size:
        same = (values[:, candidates] == values[0, candidates]).all(axis=0)
        mean[candidates[same]] = first[candidates[same]]


def block_statistics(block: np.ndarray, precision: str = "auto") -> ScatterStats:
    """Statistics of one block of rows (any float dtype), returned in float64.

    ``precision``: "auto" computes a float32 block in float32 (see the module
    docstring for the error bound); "float64" or any other input dtype: float64.
    """
    block = np.asarray(block)
    if block.ndim != 2:
        raise ValueError(f"expected a 2-D block of rows, got shape {block.shape}")
    acc = ScatterAccumulator(block.shape[1], precision)
    acc.add(block)
    return acc.result()


#: Rows of the scatter updated per step of :func:`_add_outer` (bounds its temporary).
_OUTER_ROWS = 256


def _add_outer(scatter: np.ndarray, delta: np.ndarray, weight: float) -> None:
    """scatter += weight * delta delta^T in place, exactly symmetric, with a
    temporary of at most _OUTER_ROWS x d (a d x d one is 512 MB at d = 8192)."""
    for start in range(0, delta.shape[0], _OUTER_ROWS):
        stop = start + _OUTER_ROWS
        scatter[start:stop] += np.multiply.outer(delta[start:stop], delta) * weight


def merge_statistics(a: ScatterStats, b: ScatterStats) -> ScatterStats:
    """Chan et al. pairwise merge of two sets of statistics."""
    nonfinite = a.nonfinite + b.nonfinite
    if a.count == 0:
        return ScatterStats(b.count, b.mean, b.scatter, nonfinite)
    if b.count == 0:
        return ScatterStats(a.count, a.mean, a.scatter, nonfinite)
    n = a.count + b.count
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / n)
    scatter = a.scatter + b.scatter
    _add_outer(scatter, delta, a.count * b.count / n)  # exactly symmetric
    return ScatterStats(n, mean, scatter, nonfinite)


def merge_into(total: ScatterStats, part: ScatterStats) -> ScatterStats:
    """Chan et al. merge of ``part`` into ``total``, reusing ``total.scatter``'s memory.

    For callers that own ``total`` (a merge task whose inputs have no other
    consumer): no third d x d matrix (512 MiB at d = 8192). Same arithmetic as
    :func:`merge_statistics`.
    """
    if total.count == 0 or part.count == 0:
        return merge_statistics(total, part)
    n = total.count + part.count
    delta = part.mean - total.mean
    mean = total.mean + delta * (part.count / n)
    scatter = total.scatter
    scatter += part.scatter
    _add_outer(scatter, delta, total.count * part.count / n)
    return ScatterStats(n, mean, scatter, total.nonfinite + part.nonfinite)


def array_statistics(
    x: np.ndarray, precision: str = "auto", block_bytes: int = 64 * 2**20
) -> ScatterStats:
    """Statistics of all rows of an in-memory array: blocks of about ``block_bytes`` of
    float64 rows (at least d rows), each merged into the total as it comes, so one d x d
    partial besides the total is held, whatever n (512 MiB each at d = 8192)."""
    rows = max(1, block_bytes // (8 * x.shape[1]), x.shape[1])
    total = block_statistics(x[:rows], precision)
    for start in range(rows, len(x), rows):
        total = merge_into(total, block_statistics(x[start : start + rows], precision))
    return total


def merge_many(parts) -> ScatterStats:
    """Merge a sequence of statistics, pairwise in a balanced tree.

    The tree keeps the merged groups of similar size, which is the order in
    which Chan's update loses the least precision.
    """
    parts = list(parts)
    if not parts:
        raise ValueError("merge_many needs at least one set of statistics")
    while len(parts) > 1:
        merged = [merge_statistics(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            merged.append(parts[-1])
        parts = merged
    return parts[0]


def covariance(stats: ScatterStats, in_place: bool = False) -> np.ndarray:
    """Population covariance Sigma = scatter / n (docs/math.md#scatter).

    ``in_place``: divide ``stats.scatter`` itself (for a caller that owns it and
    needs it no more: no second d x d matrix, 512 MiB at d = 8192).
    """
    if stats.count == 0:
        raise ValueError("covariance of zero rows is undefined")
    if in_place:
        return np.divide(stats.scatter, stats.count, out=stats.scatter)
    return stats.scatter / stats.count
