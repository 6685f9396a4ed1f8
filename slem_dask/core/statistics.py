"""Sufficient statistics of the negatives: count, mean and centred scatter.

The scatter of a block is computed around the block's own mean and blocks are
merged with the pairwise update of Chan, Golub and LeVeque (1979), so that the
covariance never goes through the cancellation-prone ``X^T X / n - mu mu^T``
(the form written in slem_linear.tex, eq. U, and kernel_slem_note.tex,
eq. Sigmadef, which is algebraically equal). Everything is accumulated in
float64 whatever the input dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import blas

__all__ = [
    "ScatterStats",
    "block_statistics",
    "merge_statistics",
    "merge_many",
    "covariance",
]


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
    def from_array(cls, packed: np.ndarray) -> "ScatterStats":
        packed = np.asarray(packed, dtype=np.float64).ravel()
        d = int(round((-1 + np.sqrt(1 + 4 * (packed.size - 2))) / 2))  # size = 2 + d + d^2
        return cls(int(packed[0]), packed[2:2 + d].copy(),
                   packed[2 + d:].reshape(d, d).copy(), int(packed[1]))


def _centred_scatter(centred: np.ndarray) -> np.ndarray:
    """C^T C for a C-contiguous float64 block, with one BLAS-3 call.

    dsyrk computes only one triangle: half the flops of a general product.
    A C-ordered (m, d) block is the F-ordered (d, m) matrix C^T, so
    syrk(C^T, trans=0) = C^T C needs no copy.
    """
    if centred.shape[0] == 0:
        d = centred.shape[1]
        return np.zeros((d, d))
    upper = blas.dsyrk(1.0, centred.T, trans=0, lower=0)
    return np.triu(upper) + np.triu(upper, 1).T


def block_statistics(block: np.ndarray) -> ScatterStats:
    """Statistics of one block of rows (any float dtype), in float64."""
    block = np.asarray(block)
    if block.ndim != 2:
        raise ValueError(f"expected a 2-D block of rows, got shape {block.shape}")
    values = np.array(block, dtype=np.float64, order="C", copy=True)
    finite = np.isfinite(values).all(axis=1)
    nonfinite = int(values.shape[0] - np.count_nonzero(finite))
    if nonfinite:
        values = np.ascontiguousarray(values[finite])
    count = values.shape[0]
    d = values.shape[1]
    if count == 0:
        return ScatterStats(0, np.zeros(d), np.zeros((d, d)), nonfinite)
    mean = values.mean(axis=0)
    values -= mean
    return ScatterStats(count, mean, _centred_scatter(values), nonfinite)


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
    scatter += np.outer(delta, delta) * (a.count * b.count / n)  # exactly symmetric
    return ScatterStats(n, mean, scatter, nonfinite)


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


def covariance(stats: ScatterStats) -> np.ndarray:
    """Population covariance Sigma = scatter / n (kernel_slem_note.tex, eq. Sigmadef)."""
    if stats.count == 0:
        raise ValueError("covariance of zero rows is undefined")
    return stats.scatter / stats.count
