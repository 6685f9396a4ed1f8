"""Closed-form linear SLEM (docs/math.md#closed-form).

Notation (docs/math.md#notation): negatives have mean ``mu`` and population
covariance ``Sigma``; ``A = Sigma + lam I`` (docs/math.md#woodbury);
``delta = x0 - mu``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from .blas_threads import factorization_threads
from .lapack import cholesky_inverse_in_place
from .steps import long_step
from .statistics import mirror_upper
from .validation import check_finite_rows, degenerate_encodings_error

__all__ = [
    "regularized_covariance",
    "precision_matrix",
    "encode_rows",
    "encode_rows_and_degenerate",
    "EncodeRefusingDegenerate",
    "condition_bound",
    "float32_encoding_ok",
    "float32_matrix",
    "float32_factor",
    "exemplar_solution",
]


def regularized_covariance(cov: np.ndarray, lam: float) -> np.ndarray:
    """A = Sigma + lam Id (docs/math.md#woodbury)."""
    a = np.array(cov, dtype=np.float64, copy=True)
    a[np.diag_indices_from(a)] += lam
    return a


def precision_matrix(cov: np.ndarray, lam: float) -> np.ndarray:
    """A^-1, the one inverse shared by all positives (docs/math.md#woodbury).

    Computed from the Cholesky factor of A, which is positive definite for any
    lam > 0 because Sigma is positive semi-definite: LAPACK potrf then potri,
    in place in one d x d copy (at d = 8192 each d x d float64 matrix is 512 MiB,
    so no identity right-hand side and no transposed temporary), then the
    computed triangle mirrored, so that A^-1 is exactly symmetric (the encoder
    relies on A^-1 = A^-T).
    """
    a = regularized_covariance(cov, lam)
    d = a.shape[0]
    with factorization_threads(d), long_step(f"the Cholesky inverse of A ({d} x {d})"):
        return _cholesky_inverse(a, lam)


def _cholesky_inverse(a: np.ndarray, lam: float) -> np.ndarray:
    # LAPACK potrf then potri in place, with the GIL released (core.lapack: at d = 8192
    # they take tens of seconds, which must not silence the dask workers of this process).
    factor_info, inverse_info = cholesky_inverse_in_place(a)
    if factor_info > 0:  # pragma: no cover - only for lam ~ -min eig
        raise np.linalg.LinAlgError(
            f"A = Sigma + lam*I is not positive definite for lam={lam!r}; increase lam"
        )
    if factor_info < 0:  # pragma: no cover
        raise ValueError(f"LAPACK dpotrf: illegal argument {-factor_info}")
    if inverse_info != 0:  # pragma: no cover
        raise np.linalg.LinAlgError(f"LAPACK dpotri failed (info={inverse_info}) for lam={lam!r}")
    mirror_upper(a)  # the upper triangle holds A^-1
    return a


def encode_rows(
    rows: np.ndarray, mean: np.ndarray, precision: np.ndarray, dtype=None
) -> np.ndarray:
    """L2-normalized SLEM vectors of ``rows``: the direction of A^-1 (x0 - mu)
    (docs/math.md#encoder).

    By docs/math.md#theta, w* = 2 theta / (theta delta^T A^-1 delta
    + theta + 1) A^-1 delta: theta and the scalar factor change only the norm,
    so the normalized vector is A^-1 delta / |A^-1 delta| for every theta.
    Centred before the product, so data far from the origin loses no digits.
    A row equal to mu has no direction and maps to 0. A row with NaN or inf is
    refused (:class:`~.validation.NonFiniteRowsError`, naming it as a row of ``rows``):
    its product, and so its sum of squares, is NaN or inf, which the check of every
    piece's norms below already looks for, so finite input costs no pass of its own
    (``map_rows`` relies on it: :data:`encode_rows.checks_finite_rows`).

    ``dtype``: of the result; default: the dtype it is computed in (no copy).
    Computed in float64, or in float32 when both ``rows`` and ``precision``
    (A^-1, cast by the caller) are float32: then delta = (x0 - hi) - lo with
    mu = hi + lo split into two float32 terms (x0 - hi rounds only relative to
    delta, however far the data sit from the origin), one float32 product,
    and norms from float32 sums of 64 squares added in float64 (:func:`_row_squares`;
    :func:`float32_encoding_ok` says when the whole stays within 1e-5 of float64).
    """
    return encode_rows_and_degenerate(rows, mean, precision, dtype)[0]


def encode_rows_and_degenerate(
    rows: np.ndarray, mean: np.ndarray, precision: np.ndarray, dtype=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(:func:`encode_rows`, the rows it encoded to all zeros, those it encoded with NaN
    or inf), found by the encoding's own norms, with no pass of their own: a row whose
    sum of squares lies inside the safe range (:data:`_SAFE_SQUARES`) is scaled by a
    finite factor to a norm of 1 (its largest entry at least 1/sqrt(d), far above
    float16's and float32's smallest normal numbers), so only a row encoded again
    outside it can be all zeros (x0 = mu) or not finite (an A^-1 near float64's
    largest numbers). ``slem-dask encode`` refuses both, as :func:`check_encoded_rows`
    does for any model (tests/core/test_linear_degenerate.py compares the two)."""
    rows = np.asarray(rows)
    single = precision.dtype == np.float32 and rows.dtype == np.float32
    if single:
        high = mean.astype(np.float32)
        low = (mean - high).astype(np.float32)
    else:
        high, low = np.asarray(mean, dtype=np.float64), None
        precision = np.asarray(precision, dtype=np.float64)
    vectors = np.empty((rows.shape[0], precision.shape[1]), dtype=precision.dtype)
    step = max(_PIECE_MIN_ROWS, _PIECE_BYTES // max(1, rows.shape[1] * precision.itemsize))
    centred = np.empty((min(step, rows.shape[0]), rows.shape[1]), dtype=precision.dtype)
    centre = _Centring(rows, high, low)
    safe_low, safe_high = _SAFE_SQUARES[single]
    zero: list[np.ndarray] = []
    nonfinite: list[np.ndarray] = []
    # piece by piece, so that each piece's centring, norms and scaling run in cache. The
    # loops of every call below release the GIL (ufuncs, the BLAS, np.einsum); what holds
    # it is each call's Python part, once per piece (8 pieces a partition at d = 512):
    # hence one errstate for all pieces and no guarded division unless a piece needs one
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):  # checked below
        for lo in range(0, rows.shape[0], step):
            hi = min(rows.shape[0], lo + step)
            delta, out = centred[: hi - lo], vectors[lo:hi]
            centre(lo, hi, delta)
            # A^-1 is symmetric, so the rows of (A^-1 delta)^T are delta^T A^-1.
            np.matmul(delta, precision, out=out)
            squares = _row_squares(out, scratch=delta)  # delta is spent: room for squares
            inside = (squares >= safe_low) & (squares <= safe_high)
            if inside.all():  # every sum > 0: 1 / norm needs no guard
                np.divide(1.0, np.sqrt(squares, out=squares), out=squares)
                np.multiply(out, squares[:, None].astype(out.dtype), out=out)
                continue
            extreme = np.flatnonzero(~inside)
            _normalize_guarded(rows, lo, out, squares, extreme, mean, precision)
            zero.append(lo + extreme[squares[extreme] == 0])
            nonfinite.append(lo + extreme[~np.isfinite(squares[extreme])])
    vectors = vectors if dtype is None else vectors.astype(dtype, copy=False)
    return vectors, _indices(zero), _indices(nonfinite)


def _indices(pieces: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.intp)


def _normalize_guarded(rows, lo: int, out, squares, extreme, mean, precision) -> None:
    """Normalize ``out``, the products of the piece of ``rows`` from row ``lo``, of which
    the rows ``extreme`` (indices) left the safe range of squares: those are encoded
    again, scaled (:func:`_scaled_directions`), and a row equal to the mean stays 0
    (``squares`` holds their new sums of squares: 0 for such a row). NaN or inf in such
    a row: refused, every such row of ``rows`` counted, the first five named."""
    piece = rows[lo : lo + out.shape[0]]
    if not np.isfinite(piece[extreme]).all():
        check_finite_rows(rows, "rows")
    out[extreme] = _scaled_directions(piece[extreme], mean, precision)
    squares[extreme] = np.einsum("ij,ij->i", out[extreme], out[extreme], dtype=np.float64)
    norms = np.sqrt(squares)
    scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    np.multiply(out, scale[:, None].astype(out.dtype), out=out)


#: encode_rows refuses rows with NaN or inf itself, at no cost for finite rows: a caller
#: that would check them first (``parallel.blocks.map_rows``: a pass over every block,
#: with a boolean copy of it) leaves that to it.
encode_rows.checks_finite_rows = True  # type: ignore[attr-defined]
encode_rows_and_degenerate.checks_finite_rows = True  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class EncodeRefusingDegenerate:
    """:func:`encode_rows` as a task of ``slem-dask encode``, which must never write a
    row without a direction: the rows it encodes to all zeros or with NaN or inf are
    refused as :func:`~.validation.check_encoded_rows` refuses them (``zero_reason``:
    why this model gives a row 0), from the encoding's own norms, where the check
    took a pass of its own over the output (4 ms of a 32 MiB partition, issue 42).
    ``row_offset``: the row of the whole input that ``rows`` starts at, for the message."""

    zero_reason: str
    checks_finite_rows: ClassVar[bool] = True
    takes_row_offset: ClassVar[bool] = True

    def __call__(self, rows, mean, precision, row_offset: int = 0) -> np.ndarray:
        vectors, zero, nonfinite = encode_rows_and_degenerate(rows, mean, precision)
        error = degenerate_encodings_error(zero, nonfinite, row_offset, self.zero_reason)
        if error is not None:
            raise error
        return vectors


#: Rows per piece in :func:`encode_rows`: about 4 MiB of centred rows (2,048 rows at
#: d = 512), so the passes over a piece stay in cache, but never fewer than 1,024, so that
#: the BLAS's packing of A^-1 (d x d) is amortized over enough rows. 1 MiB pieces packed
#: A^-1 four times as often (OpenBLAS sgemm_itcopy: 1.7% of an encode job's CPU at
#: d = 512): a 16,384 x 512 partition took 82.7 ms against 77.9 ms on one thread, 108.1
#: ms against 103.3 ms with two threads encoding at once (best of 15 and 6). At d = 8192
#: A^-1 (256 MiB) is packed from memory, not cache: with two threads encoding at once,
#: 4,096 rows in pieces of 512 took 4.12 s (best of 4) against 3.66 s in pieces of
#: 1,024, 3.75 s of 2,048 and 3.50 s of 4,096 (issue 42).
_PIECE_BYTES = 2**22
_PIECE_MIN_ROWS = 1024


class _Centring:
    """delta = (x0 - high) - low for rows ``lo:hi`` of ``rows`` (``low``: None, or the
    float32 rest of the mean), each row subtracted as numpy would row by row, the same
    bits. A C-contiguous ``rows`` is subtracted _CENTRE_RUN values at a time (the mean
    repeated along a run of whole rows): numpy's loop over a broadcast (rows, d) operand
    restarts every d values, and at d = 128 the centring of a 65,536-row partition took
    5.1 ms against 3.9 ms in runs of 8,192 values (a plain copy: 2.8 ms; issue 42)."""

    def __init__(self, rows: np.ndarray, high: np.ndarray, low: np.ndarray | None):
        d = rows.shape[1]
        self.rows, self.high, self.low = rows, high, low
        self.reps = max(1, _CENTRE_RUN // max(1, d)) if rows.flags.c_contiguous else 1
        if self.reps > 1:
            self.run_high = np.tile(high, self.reps)
            self.run_low = None if low is None else np.tile(low, self.reps)

    def __call__(self, lo: int, hi: int, delta: np.ndarray) -> None:
        whole = (hi - lo) // self.reps * self.reps if self.reps > 1 else 0
        if whole:  # runs of self.reps rows: every value less the same entry of the mean
            width = self.reps * self.rows.shape[1]
            runs, out = (
                self.rows[lo : lo + whole].reshape(-1, width),
                delta[:whole].reshape(-1, width),
            )
            np.subtract(runs, self.run_high, out=out)
            if self.low is not None:
                np.subtract(out, self.run_low, out=out)
        if whole < hi - lo:  # the rows left over: row by row
            rest = delta[whole : hi - lo]
            np.subtract(self.rows[lo + whole : hi], self.high, out=rest)
            if self.low is not None:
                np.subtract(rest, self.low, out=rest)


#: Values per run of the centring's subtraction (:class:`_Centring`).
_CENTRE_RUN = 8192


#: Columns per float32 partial sum of squares in :func:`_row_squares`.
_SQUARES_PIECE = 64
#: Row sums of squares inside which float32 partial sums are kept: no square overflowed
#: float32 (each is at most the sum), and squares flushed below 2^-126 (at most d of
#: them) are under 2^-40 of the sum. Outside, the row is summed again in float64.
_FLOAT32_PARTIAL_SQUARES = (2.0**-100, 2.0**100)


def _row_squares(vectors: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """Each row's sum of squares, float64. float32 rows of a width divisible by
    _SQUARES_PIECE: each run of 64 squares summed in float32 (np.vecdot of the run with
    itself, in numpy's or the BLAS's order: for 64 positive terms any order is within
    63 u = 3.8e-6, u = 2^-24, with the squares' own rounding 64 u; the norm within
    1.9e-6), those sums added in float64. One pass, whose loop releases the GIL: the
    squares written to ``scratch`` (C-contiguous, the shape of ``vectors``) and summed by
    a product with a vector of ones, numpy < 2's way here, took 786 us of a 8,192 x 128
    piece against 438 us (issue 42); np.einsum held the GIL for 35 us of every 86 us
    piece of 512 x 512. Anything else: float64 throughout, by np.einsum."""
    n, d = vectors.shape
    if vectors.dtype != np.float32 or d % _SQUARES_PIECE or not vectors.flags.c_contiguous:
        return np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64)
    runs = vectors.reshape(n * (d // _SQUARES_PIECE), _SQUARES_PIECE)
    with np.errstate(over="ignore", under="ignore"):  # such rows are summed again below
        if _VECDOT is not None:
            partial = _VECDOT(runs, runs)
        else:  # numpy < 2
            squared = np.multiply(vectors, vectors, out=scratch)
            partial = np.matmul(squared.reshape(runs.shape), _ONES)
    # np.add.reduce: ndarray.sum's own reduction, without its Python wrapper
    squares = np.add.reduce(partial.reshape(n, -1), 1, np.float64)
    low, high = _FLOAT32_PARTIAL_SQUARES
    inside = (squares >= low) & (squares <= high)
    if not inside.all():  # tiny, huge, NaN or inf: as before, in float64
        redo = np.flatnonzero(~inside)
        squares[redo] = np.einsum("ij,ij->i", vectors[redo], vectors[redo], dtype=np.float64)
    return squares


#: np.vecdot (numpy >= 2), else None: :func:`_row_squares` then squares and sums apart.
_VECDOT = getattr(np, "vecdot", None)
#: The vector of ones whose product with squares sums them (:func:`_row_squares`).
_ONES = np.ones(_SQUARES_PIECE, dtype=np.float32)


#: Sums of squares of an encoding row (float64, float32) inside which it is kept as
#: computed: its entries neither underflowed (float32 products below ~2^-90 lose
#: digits) nor overflowed. Outside (0, NaN and inf included), the row is encoded again
#: by :func:`_scaled_directions`; for data near unit scale that never happens.
_SAFE_SQUARES = {False: (2.0**-900, 2.0**900), True: (2.0**-180, 2.0**250)}


def _scale_rows(x: np.ndarray) -> np.ndarray:
    """``x`` with each row multiplied by the power of two that brings its largest
    magnitude into [0.5, 1) (exact: a direction is unchanged; all-zero rows stay 0)."""
    peak = np.abs(x).max(axis=1)
    exponent = np.frexp(np.where(np.isfinite(peak), peak, 0.0))[1]
    return np.ldexp(x, -exponent[:, None])


def _scaled_directions(rows: np.ndarray, mean: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """A^-1 (x0 - mu) up to a positive factor per row, for rows whose plain product
    over- or underflows (values of 1e200, or x0 within 1e-150 of mu at the scale of A):
    x0 and mu are scaled by a power of two (the larger magnitude of the row and of mu)
    before they are subtracted, delta is brought to a largest entry near 1, and so is
    the product, in float64. A row equal to mu stays 0."""
    x = np.asarray(rows, dtype=np.float64)
    mu = np.asarray(mean, dtype=np.float64)
    peak = np.maximum(np.abs(x).max(axis=1), np.abs(mu).max())
    exponent = np.frexp(peak)[1][:, None]
    delta = _scale_rows(np.ldexp(x, -exponent) - np.ldexp(mu[None, :], -exponent))
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        return _scale_rows(delta @ np.asarray(precision, dtype=np.float64))


def float32_matrix(precision: np.ndarray) -> np.ndarray:
    """A^-1 cast to float32 for float32 encoding, first scaled by a power of two to a
    largest entry in [0.5, 1) (:func:`float32_factor`): encodings are directions, so the
    factor changes nothing, but A^-1 of negatives of magnitude 1e30 (entries ~1e-60)
    would flush to float32 zeros. Exact (no rounding beyond the cast's); one float32
    copy, no float64 one. Element by element, so a load that casts A^-1 block by block
    with the same factor gets the same bits (``storage.MemberCast``)."""
    out = np.empty(precision.shape, dtype=np.float32)
    return np.multiply(precision, float32_factor(precision), out=out, casting="same_kind")


def float32_factor(precision: np.ndarray) -> float:
    """The power of two :func:`float32_matrix` scales A^-1 by (1.0 for an A^-1 that is 0
    or not finite, which the cast keeps as it is)."""
    peak = float(max(precision.max(), -precision.min()))
    return 2.0 ** -np.frexp(peak)[1] if np.isfinite(peak) and peak > 0 else 1.0


#: Largest bound on cond(A) for which float32 encoding is used with precision="auto".
FLOAT32_ENCODE_MAX_COND = 1e3


def condition_bound(cov: np.ndarray, lam: float) -> float:
    """An upper bound on cond_2(A), A = Sigma + lam I: (|Sigma|_inf + lam) / lam.

    |Sigma|_2 <= |Sigma|_inf for a symmetric matrix and the smallest
    eigenvalue of A is at least lam; one pass over Sigma, no factorization.
    """
    # a block of rows at a time: np.abs(cov) whole was a d x d temporary (512 MiB at
    # d = 8192, 1.9 CPU s of page faults in a fresh process); each row's sum is the same
    # reduction over the same contiguous row either way, bit for bit
    rows = max(1, _BOUND_BLOCK_BYTES // max(1, cov.shape[1] * cov.itemsize))
    buffer = np.empty((min(rows, cov.shape[0]), cov.shape[1]), dtype=cov.dtype)
    peaks = [  # np.max of them: a NaN anywhere stays NaN (no float32 encoding), as before
        np.abs(cov[lo : lo + rows], out=buffer[: min(rows, cov.shape[0] - lo)]).sum(axis=1).max()
        for lo in range(0, cov.shape[0], rows)
    ]
    return float((np.max(peaks) + lam) / lam)


#: Bytes of |Sigma| rows that :func:`condition_bound` holds at once.
_BOUND_BLOCK_BYTES = 1 << 22


def float32_encoding_ok(bound: float) -> bool:
    """Whether float32 encoding stays within 1e-5 of float64, given ``bound``, the
    :func:`condition_bound` of Sigma and lambda: the float32 rounding of delta, A^-1 and
    the product is amplified by at most cond(A), so it is used only while the bound is
    <= FLOAT32_ENCODE_MAX_COND (measured errors: tests/parallel/test_precision.py)."""
    return bound <= FLOAT32_ENCODE_MAX_COND


def exemplar_solution(
    x0: np.ndarray, mean: np.ndarray, precision: np.ndarray, theta: float
) -> tuple[np.ndarray, float]:
    """Exact minimizer (w*, nu*) of J(w, nu) for one positive x0.

    w*  = 2 theta / (theta delta^T A^-1 delta + theta + 1) A^-1 delta
          (docs/math.md#woodbury)
    nu* = (theta - 1)/(theta + 1) - (theta x0 + mu)^T w* / (theta + 1)
          (docs/math.md#closed-form)
    ``theta x0 + mu`` is rewritten ``theta delta + (theta + 1) mu`` so that the
    large common offset of x0 and mu is never subtracted twice.
    """
    x0 = np.asarray(x0, dtype=np.float64)
    delta = x0 - mean
    a_inv_delta = precision @ delta
    quad = float(delta @ a_inv_delta)
    w = (2.0 * theta / (theta * quad + theta + 1.0)) * a_inv_delta
    nu = (
        (theta - 1.0) / (theta + 1.0) - (theta / (theta + 1.0)) * float(delta @ w) - float(mean @ w)
    )
    return w, nu
