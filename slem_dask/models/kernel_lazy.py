"""The lazy (dask) paths of :class:`~.kernel.KernelSLEM`'s encodings and similarities:
graphs of :mod:`.kernel_blocks`' block functions, one task per block, the fitted state
shipped once (``shared``), with names that the inputs and the model's fingerprint fix."""

from __future__ import annotations

import dask
import numpy as np

from ..parallel.blocks import shared
from .kernel_blocks import _encode_block, _Encoder, _packed_block, _similarity_block

__all__ = ["lazy_encode", "lazy_similarity"]


def lazy_encode(X, enc: _Encoder, r: int, fingerprint: str, dtype, unit: bool):
    """:meth:`~.kernel.KernelSLEM.transform` of a dask array ``X``: lazy, (n, r), chunked
    by ``X``'s rows."""
    # type: ignore: dask types Array.map_blocks as the module's map_blocks, whose
    # first argument is the function, so it takes _encode_block for an array
    return X.map_blocks(
        _encode_block,  # type: ignore[arg-type]
        shared(enc),
        "X",
        dtype,
        unit,
        dtype=dtype,
        chunks=(X.chunks[0], (r,)),
        meta=np.empty((0, r), dtype=dtype),
        name="kslem-encode-" + dask.base.tokenize(X, fingerprint, dtype, unit),
    )


def lazy_similarity(P, Q, enc: _Encoder, rank: int, fingerprint: str):
    """:meth:`~.kernel.KernelSLEM.similarity` where ``P`` or ``Q`` is a dask array: lazy,
    chunked like P x Q."""
    import dask.array as da

    lazy_p, lazy_q = da.asarray(P), da.asarray(Q)
    width = 2 * rank + 1
    token = fingerprint
    enc_d = shared(enc)
    # type: ignore: as in transform, dask's typing of Array.map_blocks
    packed = [
        arr.map_blocks(
            _packed_block,
            enc_d,
            name,  # type: ignore[arg-type]
            dtype=np.float64,
            chunks=(arr.chunks[0], (width,)),
            meta=np.empty((0, width)),
            name=f"kslem-parts-{name}-" + dask.base.tokenize(arr, token),
        )
        for arr, name in ((lazy_p, "P"), (lazy_q, "Q"))
    ]
    return da.blockwise(
        _similarity_block,
        "ij",
        packed[0],
        "ia",
        lazy_p,
        "ib",
        packed[1],
        "ja",
        lazy_q,
        "jb",
        enc_d,
        None,
        dtype=np.float64,
        concatenate=True,
        meta=np.empty((0, 0)),
        name="kslem-similarity-" + dask.base.tokenize(lazy_p, lazy_q, token),
    )
