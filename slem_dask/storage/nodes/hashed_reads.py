"""A model's arrays read and hashed at once: each block of rows is hashed on a second
thread while the next one is read, so that checking A^-1 against its recorded SHA-256
costs little beyond reading it (at d = 8192, 512 MiB: read 0.96 s then hashed 0.45 s,
one after the other; issue 42)."""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .checksums import hash_array_header

#: Bytes of rows read (and then hashed) at a time, rounded to whole chunks of rows.
_BLOCK_BYTES = 1 << 25


def read_hashed(arr, key: str, head: bytes) -> tuple[np.ndarray, str]:
    """The zarr array ``arr`` read whole, and its SHA-256 as
    :func:`.checksums.array_digests` computes it (``head``: its
    :func:`.checksums.digest_head`, ``key``: its name in the group), the same digest of
    the same bytes. The rows are read in blocks of whole chunks into one array (as
    ``arr[...]`` would be), each block hashed while the next is read: hashlib and the
    read's decoding release the GIL."""
    from zarr.core.buffer import default_buffer_prototype

    out = np.empty(arr.shape, dtype=arr.dtype)
    h = hashlib.sha256(head)
    hash_array_header(h, key, out.dtype, out.shape)
    if out.ndim == 0 or out.size == 0:
        out[...] = arr[...]
        h.update(out.reshape(-1).view(np.uint8).data)
        return out, h.hexdigest()
    rows = _block_rows(arr, out)
    wrap = default_buffer_prototype().nd_buffer.from_numpy_array
    pending: Future | None = None
    with ThreadPoolExecutor(1, thread_name_prefix="slem-dask-hash") as pool:
        try:
            for lo in range(0, out.shape[0], rows):
                block = out[lo : lo + rows]
                arr.get_basic_selection((slice(lo, lo + rows),), out=wrap(block))
                if pending is not None:
                    pending.result()
                pending = pool.submit(h.update, block.reshape(-1).view(np.uint8).data)
        finally:  # a failed read: the block being hashed is finished before out is dropped
            if pending is not None:
                pending.result()
    return out, h.hexdigest()


def _block_rows(arr, out: np.ndarray) -> int:
    """Rows per block: whole chunks of rows, about _BLOCK_BYTES, at least one chunk."""
    chunk_rows = max(1, int(arr.chunks[0]))
    row_bytes = max(1, out[0].nbytes)
    return chunk_rows * max(1, _BLOCK_BYTES // (chunk_rows * row_bytes))
