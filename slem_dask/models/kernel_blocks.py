"""What a dask task runs to encode blocks of rows with a fitted kernel model.

:class:`_Encoder` holds the fitted state that encoding needs (shipped once per worker);
the block functions check a block's rows and return its encodings, or the parts the
similarity of two sets of encodings needs (docs/math.md#kernel-primal).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.cholesky import exact_parts, lowrank_parts, similarity_from_parts
from ..core.kernels import check_histogram, kernel_diagonal, kernel_matrix
from ..core.validation import check_finite_rows
from ..parallel.blocks import aligned


@dataclass(frozen=True, eq=False)
class _Encoder:
    """What encoding needs from a fitted model: shipped once per worker (``shared``)."""

    kernel: str
    gamma: float
    degree: int
    lam: float
    exact: bool
    pivot_rows: np.ndarray
    pivot_factor: np.ndarray
    mean: np.ndarray
    g_factor: np.ndarray
    pivots: np.ndarray
    negatives: np.ndarray | None
    factor: np.ndarray | None

    def parts(self, block):
        """(z, v, c) of the rows of a numpy block (core.cholesky.lowrank_parts / exact_parts)."""
        k_piv = kernel_matrix(block, self.pivot_rows, self.kernel, self.gamma, self.degree)
        k_self = kernel_diagonal(block, self.kernel, self.gamma, self.degree)
        if self.exact:
            # an exact encoder is built with the negatives and their factor (narrowed here)
            assert self.negatives is not None and self.factor is not None
            k_neg = kernel_matrix(block, self.negatives, self.kernel, self.gamma, self.degree)
            return exact_parts(
                k_neg,
                k_piv,
                k_self,
                self.pivot_factor,
                self.factor,
                self.pivots,
                self.mean,
                self.g_factor,
                self.lam,
            )
        return lowrank_parts(k_piv, k_self, self.pivot_factor, self.mean, self.g_factor, self.lam)


def _checked(block, enc: _Encoder, name: str, block_info=None):
    offset = block_info[0]["array-location"][0][0] if block_info else 0
    block = np.asarray(block)
    check_finite_rows(block, name, row_offset=offset)
    check_histogram(block, enc.kernel, name, row_offset=offset)
    return block


def _encode_block(block, enc: _Encoder, name: str, dtype, unit: bool = False, block_info=None):
    enc = aligned(enc)  # as distributed delivered it: at any byte offset
    block = _checked(block, enc, name, block_info)
    z = enc.parts(block)[0]
    if unit:
        norms = np.sqrt(np.einsum("ij,ij->i", z, z))
        np.divide(z, norms[:, None], out=z, where=norms[:, None] > 0)
    return z.astype(dtype, copy=False)


def _packed_block(block, enc: _Encoder, name: str, block_info=None):
    """[z | v | c] of a block: what the similarity needs besides the kernel."""
    enc = aligned(enc)
    block = _checked(block, enc, name, block_info)
    z, v, c = enc.parts(block)
    return np.hstack([z, v, c[:, None]])


def _similarity_block(pp, p, pq, q, enc: _Encoder):
    enc = aligned(enc)
    r = enc.pivot_factor.shape[0]
    k_pq = kernel_matrix(p, q, enc.kernel, enc.gamma, enc.degree)
    return similarity_from_parts(
        pp[:, :r], pp[:, r : 2 * r], pp[:, 2 * r], pq[:, :r], pq[:, r : 2 * r], pq[:, 2 * r], k_pq
    )
