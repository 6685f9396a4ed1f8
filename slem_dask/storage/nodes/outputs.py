"""Encoded outputs: one zarr chunk per dask partition, written into a job's draft and
marked complete, with a checksum of its metadata, before the draft is committed."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, cast

import numpy as np

import zarr

from ..._version import __version__
from .checksums import chunk_key, crc32c, stored_crc32c
from ..versioning import versions
from .checksums import CHECKSUM, json_params, metadata_checksum
from .chunks import _where
from ..versioning.gc import DraftFencedError, draft_alive
from ..versioning.errors import IntegrityError
from .inputs import _exists, open_node
from ..versioning.ownership import ATTR, slem_dask_kind
from ..backends.paths import canonical, zarr_store
from ..backends.local_durable import start_writeback
from ..backends.registry import backend_for
from .readers import DIMENSIONS, fill_value

if TYPE_CHECKING:
    from zarr.core.metadata import ArrayV3Metadata


def create_output(
    location: str, shape: tuple[int, int], partition_rows: int, dtype, meta: dict
) -> zarr.Array:
    """Create the output array up front in a draft ``location`` (a version folder of
    :mod:`.versions`), one zarr chunk per dask partition.

    Chunks equal to the partitions mean every task writes whole chunks of its
    own (no read-modify-write on a chunk that another task also writes: the
    data-loss trap of dask#12583 and zarr-python#3682). It is marked
    ``complete: false`` until :func:`mark_complete`. The caller holds the lease.
    """
    # write_empty_chunks: a partition whose encodings are all 0 must still leave
    # a chunk behind, since a resumed run takes a present chunk as done.
    # No compressor: encodings are dense floats that zstd shrinks by ~7% while
    # tripling the time to write a chunk (benchmarks/, bench_encode.py); a crc32c
    # trailer only (CHECKSUM).
    # The marker goes into the array's own metadata document, written in one piece
    # with it: there is no moment when the array exists without "complete: false".
    # Dimension names label it for xarray; a NaN fill value makes a chunk that is not
    # there (a version pruned under a plain zarr reader) read as NaN, never as zeros.
    # (zarr's ArrayConfigParams types every key as required; a partial config is fine)
    # The document is made in memory and created at the draft only if absent: it is
    # rewritten once, complete (mark_complete), and a store may let a timed-out write,
    # retried by its client, land after a newer one; a late plain write of this one
    # would undo the complete document after the commit (its record would no longer
    # match), while a late create is refused by the store.
    config = {"write_empty_chunks": True}
    memory: dict = {}
    zarr.create_array(
        store=memory,
        shape=shape,
        dtype=np.dtype(dtype).newbyteorder("<"),
        chunks=(max(1, partition_rows), shape[1]),
        compressors=CHECKSUM,
        config=config,  # type: ignore[arg-type]
        fill_value=fill_value(dtype),
        dimension_names=DIMENSIONS,
        attributes={
            ATTR: json_params(
                {"kind": "encoding", "complete": False, "package_version": __version__, **meta}
            )
        },
    )
    _create_document(location, memory["zarr.json"].to_bytes())
    arr = zarr.open_array(store=zarr_store(location, "w"), mode="r+", zarr_format=3)
    return arr.with_config(config)  # type: ignore[call-overload]


def _create_document(location: str, document: bytes) -> None:
    """``zarr.json`` of the draft ``location`` created only if absent (the backend's
    conditional create; a lost reply or a retry is settled by reading it back)."""
    where = canonical(location)
    if not backend_for(where.url).create("zarr.json", document):
        raise IntegrityError(
            f"output {str(where)!r}: the draft already holds a zarr.json that this job did "
            f"not write (expected a new, empty draft); nothing was written: run the job again"
        )


def output_meta(arr: zarr.Array) -> dict | None:
    """The ``slem_dask`` attribute of an output written by slem-dask, else None."""
    meta = arr.attrs.get(ATTR)
    return dict(meta) if isinstance(meta, dict) and meta.get("kind") == "encoding" else None


def update_meta(arr: zarr.Array, **fields) -> dict:
    meta = dict(cast("dict[str, Any]", arr.attrs[ATTR]))  # zarr types attributes as any JSON
    meta.update(json_params(fields))
    arr.attrs[ATTR] = meta
    return meta


def open_existing_output(path, strict: bool = True) -> zarr.Array | None:
    """The output array that readers of ``path`` see (read only), or None if there is
    none (nothing, a group, or only drafts). ``strict``: a head version that does not
    match its commit record is an error (else None: it is about to be replaced)."""
    path = canonical(path)
    if not _exists(path):
        return None
    try:
        node = open_node(path)
    except versions.VersionError as exc:
        if strict:
            raise type(exc)(f"output: {exc}") from None
        return None
    except Exception:  # noqa: BLE001 - damaged or foreign: the caller's checks say which
        if versions.VersionedStore(path).is_versioned():
            raise  # a committed version that cannot be opened: say why, not "not an array"
        return None
    return node if isinstance(node, zarr.Array) else None


def is_legacy(path) -> bool:
    """Whether ``path`` holds a store that slem-dask 0.2 wrote in place, without versions."""
    path = canonical(path)
    return (
        _exists(path)
        and not versions.VersionedStore(path).has_history()
        and slem_dask_kind(path) is not None
    )


def write_partition(block: np.ndarray, arr: zarr.Array, index: int, block_info=None) -> np.ndarray:
    """Write one partition's rows (its own chunk) and return [[index, crc32c]]: the
    checksum zarr's codec computed from these rows, as this worker reads it back (or as
    the S3 server confirmed it stored). The client compares it with the chunk it reads:
    the two see the same chunk."""
    if not draft_alive(arr):  # a fenced job's late task: never grow a deleted draft again
        raise DraftFencedError(
            f"output {_where(arr)!r}: this job's draft was deleted by another slem-dask job "
            f"that took the store over (this job was fenced); partition {index} was not "
            f"written"
        )
    rows = int(arr.chunks[0])
    lo = index * rows
    block = np.ascontiguousarray(block, dtype=arr.dtype)
    written, confirmed = _write_local_chunk(arr, index, block), None
    if not written:
        written, confirmed = _write_s3_chunk(arr, index, block)
    if not written:
        arr[lo : lo + block.shape[0]] = block
    # an S3 server that checked the body's crc32c and says so stored exactly these
    # bytes, trailer included: reading the trailer back would tell nothing more
    crc = confirmed if confirmed is not None else stored_crc32c(arr, index)
    if crc is None and not draft_alive(arr):  # deleted beneath the write: fenced
        raise DraftFencedError(
            f"output {_where(arr)!r}: this job's draft was deleted by another slem-dask job "
            f"that took the store over while partition {index} was written (this job was "
            f"fenced); nothing it wrote is visible to readers"
        )
    if crc is None:
        raise IntegrityError(
            f"output {_where(arr)!r}: partition {index} was written but cannot be read back "
            f"on this worker; check the storage"
        )
    return np.array([[index, crc]], dtype=np.int64)


def _write_local_chunk(arr: zarr.Array, index: int, block: np.ndarray) -> bool:
    """Write ``block`` as chunk ``(index, 0)`` of a local output the way zarr would
    (the row bytes, little-endian, then their crc32c; to a ``.partial`` file renamed
    into place), in one gathered write of the rows and the trailer. zarr's crc32c codec
    copies the whole chunk to append 4 bytes (32 MB a partition at d = 512). False,
    writing nothing, for anything else (another layout or store, or a last chunk that
    zarr pads to its full size): the caller writes through zarr then.
    tests/storage/test_storage.py checks that zarr reads what this writes, bit for bit."""
    import uuid

    from zarr.storage import LocalStore

    store = arr.store_path.store
    if not (isinstance(store, LocalStore) and _crc_trailer_layout(arr, block)):
        return False
    raw = block.reshape(-1).view(np.uint8)
    trailer = np.array([crc32c(raw)], dtype="<u4").tobytes()
    data = memoryview(raw)  # type: ignore[arg-type]  # a buffer (numpy stubs: >= 3.12)
    path = os.path.join(str(store.root), chunk_key(arr, (index, 0)))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.partial"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        parts, left = [data, memoryview(trailer)], len(data) + 4
        while left:  # writev may write less than asked (signals, large sizes)
            done = os.writev(fd, parts)
            left -= done
            while parts and done >= len(parts[0]):
                done -= len(parts[0])
                parts.pop(0)
            if parts and done:
                parts[0] = parts[0][done:]
        start_writeback(fd)  # on the disk by the commit, which waits for it (local_durable)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    finally:
        if fd >= 0:
            os.close(fd)
        if os.path.exists(tmp):
            os.remove(tmp)
    return True


def _crc_trailer_layout(arr: zarr.Array, block: np.ndarray) -> bool:
    """Whether chunk bytes of ``arr`` are ``block``'s row bytes then their crc32c (the
    bytes + crc32c codecs of :func:`create_output`, a whole little-endian chunk)."""
    from zarr.codecs import BytesCodec, Crc32cCodec

    codecs = tuple(cast("ArrayV3Metadata", arr.metadata).codecs)  # outputs are zarr v3
    return (
        block.shape == tuple(arr.chunks)
        and len(codecs) == 2
        and isinstance(codecs[0], BytesCodec)
        and isinstance(codecs[1], Crc32cCodec)
        and block.dtype.byteorder in "<=|"
        and np.little_endian
    )


#: The largest object one PutObject may write (S3's limit, 5 GiB), less the trailer.
_ONE_PUT_BYTES = 5 * 2**30 - 4


def _write_s3_chunk(arr: zarr.Array, index: int, block: np.ndarray) -> tuple[bool, int | None]:
    """Write ``block`` as chunk ``(index, 0)`` of an output on S3 the way zarr would (the
    row bytes, then their crc32c), in ONE PutObject that carries the crc32c of the
    whole body: a server that checks it (AWS S3, SeaweedFS; not moto) refuses a body
    that arrived altered, and botocore does not compute a CRC32 of its own over the
    32 MB (in the event loop's one thread). zarr's path copies the chunk twice (its
    crc32c codec, then ``to_bytes``); this builds the body once.

    Returns (written, confirmed): confirmed is the trailer's crc32c if the server
    answered with the body's checksum it checked (the object is then these bytes),
    else None; (False, None), writing nothing, for anything but an S3 output of this
    layout (the caller writes through zarr). tests/storage/test_object_store_requests.py
    checks what is sent and that zarr reads it back."""
    import base64

    from zarr.core.sync import sync
    from zarr.storage import FsspecStore
    from zarr.storage._common import _dereference_path

    store = arr.store_path.store
    if not (
        isinstance(store, FsspecStore)
        and "s3" in _protocols(store.fs)
        and _crc_trailer_layout(arr, block)
        and block.nbytes < _ONE_PUT_BYTES
    ):
        return False, None
    raw = block.reshape(-1).view(np.uint8)
    body = bytearray(raw.nbytes + 4)
    view = np.frombuffer(body, np.uint8)
    view[: raw.nbytes] = raw
    view[raw.nbytes :] = np.frombuffer(np.array([crc32c(raw)], dtype="<u4").tobytes(), np.uint8)
    whole = base64.b64encode(crc32c(view).to_bytes(4, "big")).decode()
    path = _dereference_path(store.path, chunk_key(arr, (index, 0)))
    # chunksize: one PUT whatever the size (s3fs goes multipart from 2 chunksizes on)
    answer = sync(store.fs._pipe_file(path, body, chunksize=len(body), ChecksumCRC32C=whole))
    trailer = int(view[raw.nbytes :].view("<u4")[0])
    return True, trailer if (answer or {}).get("ChecksumCRC32C") == whole else None


def _protocols(fs) -> tuple:
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def remove_stray_partials(path) -> int:
    """Delete the temporary ``*.partial`` files that a killed writer leaves in a local
    zarr store (zarr writes a chunk to such a file, then renames it). Returns how many."""
    path = canonical(path)
    if not path.is_local:
        return 0
    removed = 0
    for root, _, files in os.walk(path.location):
        for name in files:
            if name.endswith(".partial"):
                os.remove(os.path.join(root, name))
                removed += 1
    return removed


def mark_complete(arr: zarr.Array, extra: dict | None = None) -> None:
    """Mark an output complete, with a checksum of its metadata: an output whose
    fingerprints or recorded chunk checksums were edited is refused by every reader."""
    meta = dict(cast("dict[str, Any]", arr.attrs[ATTR]))  # zarr types attributes as any JSON
    meta.update(
        json_params(
            {
                **(extra or {}),
                "complete": True,
                "completed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )
    )
    meta.pop("metadata_checksum", None)
    arr.attrs[ATTR] = {**meta, "metadata_checksum": metadata_checksum(meta)}


def head_seq(path) -> int:
    """The sequence number of the committed head of ``path`` (0: none)."""
    try:
        head = versions.VersionedStore(path).head()
    except Exception:  # noqa: BLE001 - damaged or unreachable: nothing committed to tell
        return 0
    return head.seq if head else 0


def marked_complete(path, after: int | None = None) -> bool:
    """Whether the slem-dask output at ``path`` is complete (its job verified it before
    committing it), in a version committed after sequence number ``after`` if given;
    False for anything else, unreadable included."""
    try:
        if after is not None and head_seq(path) <= after:
            return False
        meta = output_meta(open_node(path))
    except Exception:  # noqa: BLE001 - absent, a group, damaged: not a complete output
        return False
    return bool(meta and meta.get("complete"))
