"""Checksums: the crc32c trailer of every chunk slem-dask writes (zarr v3's ``crc32c``
codec), SHA-256 fingerprints of models and of metadata."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Any

import numpy as np

import zarr
import zarr.codecs

from ..versioning.ownership import ATTR


def chunk_key(arr, coords) -> str:
    """The store key of the chunk at ``coords`` of ``arr``, from the store's root."""
    key = arr.metadata.encode_chunk_key(coords)
    return f"{arr.path}/{key}" if arr.path else key


def _store_get(arr, key: str, suffix: int | None = None, head: int | None = None):
    """The bytes of ``key`` (or its last ``suffix`` / first ``head`` bytes), None if absent."""
    from zarr.abc.store import RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    store = arr.store_path.store
    byte_range = (
        SuffixByteRequest(suffix) if suffix else RangeByteRequest(0, head) if head else None
    )
    if byte_range is not None and _plain_ranges_only(store):
        try:
            size = sync(store.getsize(key))
        except FileNotFoundError:
            return None
        start = max(0, size - suffix) if suffix else 0
        end = size if suffix else min(head, size)
        if end <= start:
            return b""
        byte_range = RangeByteRequest(start, end)
    buf = sync(store.get(key, prototype=default_buffer_prototype(), byte_range=byte_range))
    return None if buf is None else buf.to_bytes()


def _plain_ranges_only(store) -> bool:
    """Whether ``store`` reads only ranges inside the object: adlfs (Azure) sends a
    suffix range as a negative offset, and a range over an empty blob, which Azure
    refuses (seen on Azurite and adlfs 2026.8)."""
    protocol = getattr(getattr(store, "fs", None), "protocol", ())
    protocol = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    return bool({"abfs", "az", "abfss"} & set(protocol))


#: Below this many bytes a checksum is computed through google_crc32c's module (it
#: holds the GIL, but only for microseconds); above, through its C library by ctypes.
_UNLOCKED_CRC_BYTES = 1 << 16


@functools.cache
def _unlocked_crc32c():
    """google_crc32c's own C function ``crc32c_value``, called through ctypes, which
    releases the GIL during the call, or None where its library is not found or
    disagrees with the module. The module's ``value`` holds the GIL (its C extension
    has no Py_BEGIN_ALLOW_THREADS): 1.5 ms per 16 MiB chunk during which no other
    thread of a threaded dask fit or encode could run Python."""
    import ctypes
    import glob

    import google_crc32c

    folder = os.path.dirname(google_crc32c.__file__)
    # where the wheels put it: auditwheel (Linux) beside the package, delocate (macOS) in it
    candidates = glob.glob(os.path.join(folder + ".libs", "libcrc32c*.so*")) + glob.glob(
        os.path.join(folder, ".dylibs", "libcrc32c*.dylib")
    )
    for path in sorted(candidates):
        try:
            function = ctypes.CDLL(path).crc32c_value
        except (OSError, AttributeError):
            continue
        function.restype = ctypes.c_uint32
        function.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        probe = np.frombuffer(b"slem-dask crc32c probe" * 3000, np.uint8)
        if function(probe.ctypes.data, probe.nbytes) == google_crc32c.value(probe):
            return function
    return None


def crc32c(data) -> int:
    """The crc32c of a bytes-like object (bytes, memoryview or a contiguous uint8
    array), as google_crc32c.value computes it; large buffers without holding the GIL."""
    import google_crc32c

    view = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
    function = _unlocked_crc32c() if view.nbytes >= _UNLOCKED_CRC_BYTES else None
    if function is not None:
        view = np.ascontiguousarray(view)
        return int(function(view.ctypes.data, view.nbytes))
    try:
        return int(google_crc32c.value(data))
    except (TypeError, ValueError):  # it takes read-only, contiguous buffers only
        return int(google_crc32c.value(view.tobytes()))


def stored_crc32c(arr, row_chunk: int) -> int | None:
    """The crc32c trailer of output chunk ``(row_chunk, 0)``, or None if it is absent."""
    tail = _store_get(arr, chunk_key(arr, (row_chunk, 0)), suffix=4)
    return None if tail is None or len(tail) != 4 else int(np.frombuffer(tail, "<u4")[0])


def self_consistent_crc32c(arr, row_chunk: int) -> int | None:
    """Read a whole output chunk; its crc32c if the payload matches the trailer and
    has the expected size, else None (absent, truncated or corrupt)."""
    data = _store_get(arr, chunk_key(arr, (row_chunk, 0)))
    expected = int(np.prod(arr.chunks)) * arr.dtype.itemsize + 4
    if data is None or len(data) != expected:
        return None
    crc = int(np.frombuffer(data[-4:], "<u4")[0])
    return crc if crc32c(memoryview(data)[:-4]) == crc else None


def delete_chunk(arr, row_chunk: int) -> None:
    from zarr.core.sync import sync

    sync(arr.store_path.store.delete(chunk_key(arr, (row_chunk, 0))))


#: Every chunk slem-dask writes ends in a crc32c of its bytes (zarr v3 codec).
CHECKSUM = [zarr.codecs.Crc32cCodec()]


def json_params(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as plain JSON values (numpy scalars such as np.float32(0.1) become floats)."""

    def native(value):
        if isinstance(value, np.generic):
            return value.item()
        raise TypeError(
            f"model parameter value {value!r} of type {type(value).__name__} "
            f"cannot be stored; use a plain number or string"
        )

    return json.loads(json.dumps(params, default=native))


def fingerprint(arrays: dict[str, np.ndarray], params: dict[str, Any]) -> str:
    """SHA-256 of a model's arrays (name, dtype, shape, bytes) and parameters."""
    h = hashlib.sha256()
    h.update(json.dumps(json_params(params), sort_keys=True).encode())
    for key in sorted(arrays):
        _hash_array(h, key, arrays[key])
    return h.hexdigest()


def array_digests(arrays: dict[str, np.ndarray], params: dict[str, Any]) -> dict[str, str]:
    """SHA-256 of each array alone (name, dtype, shape, bytes) with the parameters,
    recorded beside a model's fingerprint: a reader that needs only some arrays (an
    encode: A^-1 and the mean, not Sigma) checks those, and the parameters, as strictly
    without reading the others."""
    head = digest_head(params)
    digests = {}
    for key in sorted(arrays):
        h = hashlib.sha256(head)
        _hash_array(h, key, arrays[key])
        digests[key] = h.hexdigest()
    return digests


def digest_head(params: dict[str, Any]) -> bytes:
    """The bytes every array's SHA-256 in :func:`array_digests` starts with."""
    return json.dumps(json_params(params), sort_keys=True).encode()


def chunk_record_digest(params: dict[str, Any], crcs: dict[str, list]) -> str:
    """SHA-256 of a model's parameters (:func:`digest_head`) and the crc32c recorded of
    each chunk of its arrays: what binds the two, as each array's own digest binds its
    bytes and the parameters, for a reader that checks the chunks against the record
    instead of hashing the arrays."""
    h = hashlib.sha256(digest_head(params))
    h.update(json.dumps(crcs, sort_keys=True).encode())
    return h.hexdigest()


def hash_array_header(h, key: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """What an array's SHA-256 hashes before its bytes: its name, dtype and shape."""
    h.update(key.encode())
    h.update(str(dtype).encode())
    h.update(str(shape).encode())


def _hash_array(h, key: str, array: np.ndarray) -> None:
    a = np.ascontiguousarray(array)
    hash_array_header(h, key, a.dtype, a.shape)
    # the same bytes as a.tobytes(), without a copy (an ndarray is a buffer: numpy's
    # stubs declare __buffer__ for Python >= 3.12 only)
    h.update(a.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # a buffer (numpy stubs: >= 3.12)


def metadata_checksum(meta: dict) -> str:
    """SHA-256 of every metadata field but the checksum itself: a model whose
    n_samples, source or parameters were edited by hand is refused."""
    fields = {k: v for k, v in meta.items() if k != "metadata_checksum"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def corpus_array_meta(crcs: list) -> dict:
    """The ``slem_dask`` attribute of an array of a corpus: its chunks' crc32c."""
    return {"kind": "corpus-array", "chunk_crc32c": crcs}


def recorded_crc32c(arr) -> list | None:
    """The crc32c of every chunk recorded when a slem-dask output was completed (or a
    corpus written), in row order (None for anything else): readers compare each
    chunk's trailer with it."""
    meta = arr.attrs.get(ATTR)
    if isinstance(meta, dict) and meta.get("kind") == "corpus-array":
        crcs = meta.get("chunk_crc32c")
        return crcs if isinstance(crcs, list) else None
    if not isinstance(meta, dict) or meta.get("kind") != "encoding" or not meta.get("complete"):
        return None
    crcs = meta.get("partition_crc32c")
    return crcs if isinstance(crcs, list) else None


def chunk_trailers(arr) -> list:
    """The crc32c trailer of every chunk of ``arr`` (None where a chunk is absent or too
    short), in C order of the chunk grid: what a group's writer records once the group
    was read back, and what its readers and ``slem-dask verify`` compare with that."""
    trailers = []
    for coords in np.ndindex(*arr.cdata_shape):
        tail = _store_get(arr, chunk_key(arr, coords), suffix=4)
        trailers.append(
            None if tail is None or len(tail) != 4 else int(np.frombuffer(tail, "<u4")[0])
        )
    return trailers


def chunk_change(arr, recorded: list) -> tuple[str, str] | None:
    """The first chunk of ``arr`` that is not the one ``recorded``, and what is wrong
    with it: (key, "missing") when no chunk is stored there, (key, "truncated") when
    one too short to end in a crc32c is, (key, "changed") when its crc32c differs;
    None when all match."""
    # strict=False: a record of another length is itself a change, reported below
    for i, (stored, crc) in enumerate(zip(chunk_trailers(arr), recorded, strict=False)):
        if stored != crc:
            key = chunk_key(arr, tuple(np.unravel_index(i, arr.cdata_shape)))
            if stored is not None or crc is None:
                return key, "changed"
            return key, "missing" if _store_get(arr, key) is None else "truncated"
    if len(recorded) != int(np.prod(arr.cdata_shape)):
        return f"{arr.path or '.'} (it records {len(recorded)} chunks)", "changed"
    return None
