"""Row-wise encoders mapped over dask blocks, for the baseline estimators.

Same contract as :func:`slem_dask.parallel.encode_blocks`: lazy, one task per
row block, explicit ``meta``, non-finite rows rejected with their global index.
"""

from __future__ import annotations

import dask
import numpy as np

from ..validation import check_finite_rows

__all__ = ["map_rows"]


def _apply(block, func, out_dtype, name, *args, block_info=None):
    offset = block_info[0]["array-location"][0][0] if block_info else 0
    check_finite_rows(block, name, row_offset=offset)
    return np.asarray(func(block, *args), dtype=out_dtype)


def map_rows(func, x, args: tuple, out_dim: int, out_dtype, name: str, label: str):
    """Lazy ``func(block, *args)`` over the row blocks of the dask array ``x``.

    ``args`` may hold results of :func:`slem_dask.parallel.shared` (one graph key
    each, shipped to each worker once); ``func`` maps (rows, d) to (rows, out_dim).
    """
    import dask.array as da

    out_dtype = np.dtype(out_dtype)
    return da.map_blocks(
        _apply, x, func, out_dtype, name, *args,
        dtype=out_dtype,
        chunks=(x.chunks[0], (out_dim,)),
        meta=np.empty((0, out_dim), dtype=out_dtype),
        name=f"{label}-" + dask.base.tokenize(x, func, args, out_dtype),
    )
