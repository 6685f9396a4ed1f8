"""Dask orchestration: the pure math of :mod:`slem_dask.core` mapped over row blocks.

Nothing here computes: every function takes dask arrays and returns lazy dask
arrays or Delayed objects. The caller (an estimator's ``fit``, a job) decides
when to compute, and on which client.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np

from .core.linear import encode_rows
from .core.statistics import ScatterStats, block_statistics, merge_many
from .validation import check_finite_rows

__all__ = ["scatter_statistics", "encode_blocks", "shared"]

#: How many partial results one task of a tree reduction merges.
SPLIT_EVERY = 8


def _packed_block_statistics(block):
    return block_statistics(block).to_array()[None, :]


def _merge_parts(parts):
    return merge_many(p if isinstance(p, ScatterStats) else ScatterStats.from_array(p)
                      for p in parts)


def scatter_statistics(x: da.Array, split_every: int = SPLIT_EVERY):
    """Delayed :class:`ScatterStats` of all rows of ``x``.

    One task per row block (one BLAS-3 call each), then a tree of merges
    ``split_every`` wide, so no task ever holds more than ``split_every``
    d x d scatter matrices and the data are never gathered. The block
    statistics are a ``map_blocks`` of ``x``, so dask fuses each with the task
    that produces its block (a zarr read, say): a block is reduced where it
    was read, and never sent between workers (measured on 62 blocks of
    16384 x 512 read from zarr: 8.9 s unfused, 1 s of it transfers).
    """
    d = x.shape[1]
    packed = x.map_blocks(_packed_block_statistics, dtype=np.float64,
                          chunks=((1,) * x.numblocks[0], (2 + d + d * d,)),
                          meta=np.empty((0, 0), dtype=np.float64))
    parts = list(packed.to_delayed().ravel())
    while True:  # at least one merge level: it also unpacks a single block
        parts = [dask.delayed(_merge_parts, pure=True)(parts[i:i + split_every])
                 for i in range(0, len(parts), split_every)]
        if len(parts) == 1:
            return parts[0]


def shared(value):
    """Wrap a small in-memory array so it enters the graph once.

    Tasks that take it refer to one key: the scheduler ships it to each worker
    once, instead of pickling a copy into every task.
    """
    return dask.delayed(value, pure=True, traverse=False)


def _encode_block(block, mean, precision, out_dtype, name, block_info=None):
    offset = block_info[0]["array-location"][0][0] if block_info else 0
    check_finite_rows(block, name, row_offset=offset)
    return encode_rows(block, mean, precision, dtype=out_dtype)


def encode_blocks(p: da.Array, mean, precision, out_dtype, name: str = "positives") -> da.Array:
    """Lazy linear SLEM vectors of the rows of ``p``, with the row chunks of ``p``.

    ``mean`` and ``precision`` may be numpy arrays or results of :func:`shared`.
    """
    out_dtype = np.dtype(out_dtype)
    d = p.shape[1]
    return da.map_blocks(
        _encode_block,
        p,
        mean,
        precision,
        out_dtype,
        name,
        dtype=out_dtype,
        chunks=(p.chunks[0], (d,)),
        meta=np.empty((0, d), dtype=out_dtype),
        name="slem-encode-" + dask.base.tokenize(p, mean, precision, out_dtype),
    )
