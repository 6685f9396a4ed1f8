"""Search scores in one fixed order, and how far a BLAS product may be from them.

A BLAS matrix product rounds each entry in an order of its own: it depends on the
kernel (``OPENBLAS_CORETYPE``, MKL, Accelerate, BLIS...), on the shapes of the call
and on where the row sits in it (full tiles and edge tiles are summed differently),
so two copies of a row in different blocks may get scores that differ in the last
bit. Every score that search reports is instead :func:`pair_scores`'s: the
float64 products of the two rows, summed left to right, one feature after the
other, the same elementwise operations for every pair. It is bitwise the same for
every copy of a row, in every block, chunking, BLAS and machine (IEEE float64
arithmetic without flush-to-zero, as numpy runs it).

BLAS products still find the rows that can matter: both the BLAS score and the
fixed-order one are within gamma_d(u64) sum |q_i x_i| of the exact dot product,
whatever order either sums in (Higham, Accuracy and Stability, 3.1), so they are
within :func:`blas_gap` of each other.
"""

from __future__ import annotations

import numpy as np

__all__ = ["RESCORE_ELEMENTS", "blas_gap", "float64_norm_bounds", "pair_scores"]

_U64 = 2.0**-53
#: float64 elements per side of one step of :func:`pair_scores` (pairs x features).
RESCORE_ELEMENTS = 2**21


def _gamma(n: int, u: float) -> float:
    """Higham's gamma_n(u) = n u / (1 - n u): how far (relative to the sum of the
    magnitudes) n operations at unit roundoff u may move a sum; also candidates.py's."""
    return n * u / (1 - n * u)


def pair_scores(queries, database, rows, cols) -> np.ndarray:
    """float64 inner products of the pairs (queries[rows], database[cols]).

    The products (exact for float32 rows: 24 x 24 bits fit in 53) are summed
    strictly left to right, feature after feature, with one vector add per feature
    over all pairs of a step: no BLAS, no pairwise or SIMD-lane reordering whose
    shape could depend on the number of pairs, their position or the machine.
    """
    rows, cols = np.asarray(rows), np.asarray(cols)
    out = np.empty(rows.size)
    d = queries.shape[1]
    step = max(1, RESCORE_ELEMENTS // max(1, d))
    for lo in range(0, rows.size, step):
        products = np.multiply(
            queries[rows[lo : lo + step]], database[cols[lo : lo + step]], dtype=np.float64
        )
        by_feature = np.ascontiguousarray(products.T)  # (d, pairs): each add is contiguous
        total = out[lo : lo + step]
        total[:] = 0.0
        for feature in by_feature:
            total += feature
    return out


def float64_norm_bounds(x) -> np.ndarray:
    """Upper bounds on the 2-norms of the rows of ``x`` (as float64); inf where a
    row's squares overflow, NaN where the row holds NaN."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[1]
    with np.errstate(over="ignore", invalid="ignore"):
        squares = np.einsum("ij,ij->i", x, x)
        # the float64 sum of squares is low by at most gamma_d of itself, plus what
        # underflow (even flushed to zero) loses: < 2**-1022 in each of its 2d operations
        return np.sqrt((squares + 2 * d * 2.0**-1022) / (1 - _gamma(d, _U64))) * (1 + 2.0**-50)


def blas_gap(query_norms, database_norm: float, d: int) -> np.ndarray:
    """Per query, a bound on |BLAS float64 score - pair_scores| over the database
    rows (norms bounded by ``database_norm``): each is within gamma_d(u64) ||q|| ||x||
    of the exact product (Cauchy-Schwarz), plus underflow; inf where a norm is."""
    if d * _U64 >= 0.5:
        return np.full(np.shape(query_norms), np.inf)
    with np.errstate(over="ignore", invalid="ignore"):
        return (
            2 * _gamma(d, _U64) * (1 + 2.0**-40) * np.asarray(query_norms) * database_norm
            + 4 * d * 2.0**-1022
        )
