"""The member arrays of a group that slem-dask wrote (a model, a search result, a
corpus), read whole: a read that fails names the chunk that fails it and how to get the
store back. A model's arrays are checked as they are read: chunk by chunk against the
crc32c their commit recorded (:func:`read_recorded`), or, where nothing was recorded of a
member's chunks, against its recorded SHA-256 (:func:`read_hashed`: each block of rows
hashed on a second thread while the next one is read; at d = 8192 the SHA-256 of A^-1's
512 MiB alone takes 0.39 s on this CPU, with SHA-NI; issue 42); either may read it
straight into another dtype (:class:`MemberCast`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..versioning.errors import ChangedChunkError, CorruptChunkError, rollback_advice
from .checksums import chunk_key, hash_array_header
from .chunks import _reason, read_rows

#: Bytes of rows read (and then hashed) at a time, rounded to whole chunks of rows.
_BLOCK_BYTES = 1 << 25


@dataclass(frozen=True)
class MemberCast:
    """A member read straight into another dtype: each element multiplied by ``factor``
    and cast to ``dtype``, as ``np.multiply(a, factor, out=..., casting="same_kind")``
    gives it, bit for bit (a LinearSLEM's A^-1 read as the scaled float32 copy that
    float32 encoding uses, with no float64 copy of it ever held)."""

    dtype: np.dtype
    factor: float


def read_hashed(
    arr, key: str, head: bytes, cast: MemberCast | None = None
) -> tuple[np.ndarray, str]:
    """The zarr array ``arr`` read whole, and its SHA-256 as
    :func:`.checksums.array_digests` computes it (``head``: its
    :func:`.checksums.digest_head`, ``key``: its name in the group), the same digest of
    the same bytes. The rows are read in blocks of whole chunks (arrays of rows through
    :func:`.chunks.read_rows`, which decodes each chunk straight into the block), each
    block hashed while the next is read: hashlib and the read's decoding release the
    GIL. ``cast``: the result in its dtype, each block cast once it is hashed (the
    stored bytes are the ones hashed)."""
    out = np.empty(arr.shape, dtype=arr.dtype if cast is None else cast.dtype)
    h = hashlib.sha256(head)
    hash_array_header(h, key, np.dtype(arr.dtype), out.shape)
    if out.ndim == 0 or out.size == 0:
        stored = np.asarray(arr[...])
        h.update(np.ascontiguousarray(stored).reshape(-1).view(np.uint8).data)
        _store(out, stored, cast)
        return out, h.hexdigest()
    _read_in_blocks(
        arr, key, out, cast, lambda block: h.update(block.reshape(-1).view(np.uint8).data)
    )
    return out, h.hexdigest()


def read_recorded(arr, key: str, crcs: list, cast: MemberCast | None = None) -> np.ndarray:
    """The 2-D zarr array ``arr`` (member ``key``) read whole, each chunk's bytes checked
    against its crc32c trailer and that trailer against ``crcs``, the one its writer
    recorded for it (:class:`ChangedChunkError` if not), in place of a digest of the
    whole: the record, in the group's metadata, is covered by the metadata's checksum
    and the commit's SHA-256 of it, so every byte read is pinned to the ones written.
    Only for arrays :func:`.chunks.trailers_checked_by_rows` accepts. ``cast``: as
    :func:`read_hashed`'s."""
    out = np.empty(arr.shape, dtype=arr.dtype if cast is None else cast.dtype)
    if out.size:  # else no chunk to read
        _read_in_blocks(arr, key, out, cast, None, crcs)
    return out


def _read_in_blocks(
    arr,
    key: str,
    out: np.ndarray,
    cast: MemberCast | None,
    seen: Callable[[np.ndarray], Any] | None,
    crcs: list | None = None,
) -> None:
    """``arr`` read into ``out`` in blocks of whole chunks (:func:`_read_block`), each
    block, as stored, handed to ``seen`` (in order) and then cast into ``out`` on a
    second thread while the next block is read. Without a cast the blocks are read into
    ``out``; with one, into two buffers in turn, each reused once its block is cast."""
    rows = _block_rows(arr, out)
    buffers = [np.empty((rows,) + out.shape[1:], dtype=arr.dtype) for _ in range(2 if cast else 0)]
    pending: list[Future | None] = [None, None]  # the second thread's work on each block

    def finish(block: np.ndarray, lo: int, hi: int) -> None:
        if seen is not None:
            seen(block)
        if cast is not None:
            _store(out[lo:hi], block, cast)

    with ThreadPoolExecutor(1, thread_name_prefix="slem-dask-block") as pool:
        try:
            for i, lo in enumerate(range(0, out.shape[0], rows)):
                hi = min(out.shape[0], lo + rows)
                block = buffers[i % 2][: hi - lo] if cast else out[lo:hi]
                if pending[i % 2] is not None:  # this buffer's last block is done: reuse it
                    pending[i % 2].result()  # type: ignore[union-attr]
                _read_block(arr, lo, hi, block, key, crcs)
                if seen is not None or cast is not None:
                    pending[i % 2] = pool.submit(finish, block, lo, hi)
            for done in pending:
                if done is not None:
                    done.result()
        finally:  # a failed read: the blocks in work are finished before out is dropped
            wait([done for done in pending if done is not None])


def _read_block(
    arr, lo: int, hi: int, block: np.ndarray, key: str, crcs: list | None = None
) -> None:
    if arr.ndim == 2:  # rows: decoded straight into the block (zarr would copy it twice)
        read_rows(arr, lo, hi, f"array {key!r}", out=block, recorded=crcs)
        return
    from zarr.core.buffer import default_buffer_prototype

    wrap = default_buffer_prototype().nd_buffer.from_numpy_array
    arr.get_basic_selection((slice(lo, hi),), out=wrap(block))


def _store(out: np.ndarray, stored: np.ndarray, cast: MemberCast | None) -> None:
    if cast is None:
        out[...] = stored
    else:
        np.multiply(stored, cast.factor, out=out, casting="same_kind")


def _block_rows(arr, out: np.ndarray) -> int:
    """Rows per block: whole chunks of rows, about _BLOCK_BYTES stored, at least one chunk."""
    chunk_rows = max(1, int(arr.chunks[0]))
    row_bytes = max(1, out[0].size * np.dtype(arr.dtype).itemsize)
    return chunk_rows * max(1, _BLOCK_BYTES // (chunk_rows * row_bytes))


def read_whole(arr) -> np.ndarray:
    return np.asarray(arr[...])


#: How to get each kind of group back once a chunk is damaged (beside a rollback).
_REMEDIES = {
    "model": "refit the model and save it over this one (`slem-dask fit ... --overwrite`, "
    "or model.save(path, overwrite=True))",
    "search result": "run `slem-dask search` again with --overwrite",
}


def read_member(
    path, what: str, key: str, seq: int | None, read: Callable[..., Any], *args: Any
) -> Any:
    """``read(*args)``, the reading of member ``key`` of the ``what`` at ``path`` (its
    version ``seq``, None: a plain store), a failure named as damage: the first chunk of
    the member that cannot be read, why, and how to get the store back."""
    try:
        return read(*args)
    except ChangedChunkError:
        raise  # not damage that a read names: the caller says what its record says
    except Exception as exc:  # noqa: BLE001
        arr = args[0]
        where = _unreadable_chunk(arr)
        chunk, cause = (
            (f"chunk {where[0]} of array {key!r}", where[1]) if where else (f"array {key!r}", exc)
        )
        raise CorruptChunkError(
            f"{what} {str(path)!r}: {chunk} cannot be read ({_reason(cause)}); the store "
            f"is damaged: {_REMEDIES.get(what, 'write it again')}{rollback_advice(path, seq)}"
        ) from None


def _unreadable_chunk(arr) -> tuple[str, BaseException] | None:
    """(the chunk's key and rows, as words; its error) of the first chunk of rows of
    ``arr`` that cannot be read; None when each reads on its own."""
    try:
        n, rows = (int(arr.shape[0]), max(1, int(arr.chunks[0]))) if arr.ndim else (1, 1)
        whole_rows = tuple(arr.chunks[1:]) == tuple(arr.shape[1:])
    except Exception:  # noqa: BLE001 - not even its shape: the caller says what it can
        return None
    for i, lo in enumerate(range(0, n, rows)):
        hi = min(n, lo + rows)
        try:
            arr[lo:hi] if arr.ndim else arr[...]
        except Exception as exc:  # noqa: BLE001
            key = chunk_key(arr, (i,) + (0,) * (arr.ndim - 1)) if arr.ndim else None
            named = f"{key!r} " if key is not None and whole_rows else ""
            return f"{named}(rows {lo}-{hi - 1})" if arr.ndim else "(its only chunk)", exc
    return None
