"""What a commit recorded of its version's chunks: the crc32c trailer of every chunk, in
the version's root ``zarr.json``, which the commit record's checksum covers. A reader of
that version (:class:`.readers.VersionStore`) checks each chunk it reads against it, so
that a chunk that is missing, or that is not the chunk that was written (swapped in from
another version, damaged), raises naming it instead of reading as fill values.

Where each kind records them: an output (an array at the version's root) in its
``slem_dask`` attribute ``partition_crc32c`` (chunk ``(i, 0)`` is partition ``i``); a
model, search result or corpus (a group) in its ``slem_dask`` attribute
``chunk_crc32c``, ``{array name: [crc32c of each chunk, in C order]}``, None for a chunk
that zarr did not write (all fill values: zarr's ``write_empty_chunks=False``)."""

from __future__ import annotations

import json
from typing import Any

from zarr.core.buffer import default_buffer_prototype

from ..versioning.errors import rollback_advice
from ..versioning.ownership import ATTR
from ..versioning.rootmarker import _json

__all__ = [
    "CHUNK_CRC32C",
    "NOT_A_CHUNK",
    "UNRECORDED",
    "MISCOUNTED",
    "recorded_chunks",
    "ChunkLookup",
    "CheckedReads",
    "trailer",
]

#: The metadata field of a group written by slem-dask that records its chunks' crc32c.
CHUNK_CRC32C = "chunk_crc32c"
#: What :meth:`ChunkLookup.expected` says of a key that is no chunk of an array.
NOT_A_CHUNK = "not a chunk"
#: ... of a chunk of an array whose commit recorded no checksums (an earlier release).
UNRECORDED = "unrecorded"
#: ... of a chunk of an array whose record does not have one checksum per chunk.
MISCOUNTED = "miscounted"


def recorded_chunks(root_document: bytes) -> dict[str, list]:
    """{path of an array in the version ("" for an output, the version's own array): the
    recorded crc32c of each of its chunks}, read from the version's root ``zarr.json`` as
    its commit covers it; {} where nothing was recorded."""
    try:
        doc = json.loads(root_document)
    except ValueError:
        return {}
    meta = (doc.get("attributes") or {}).get(ATTR) if isinstance(doc, dict) else None
    if not isinstance(meta, dict):
        return {}
    if doc.get("node_type") == "array":
        crcs = meta.get("partition_crc32c")
        written = meta.get("kind") == "encoding" and meta.get("complete")
        return {"": crcs} if written and isinstance(crcs, list) else {}
    recorded = meta.get(CHUNK_CRC32C)
    if not isinstance(recorded, dict):
        return {}
    return {name: crcs for name, crcs in recorded.items() if isinstance(crcs, list)}


def _candidates(key: str) -> list[tuple[str, list[str]]]:
    """(array path, chunk coordinates) for each way ``key`` may name a chunk in zarr v3's
    default encoding (``<array>/c/<i>/<j>``; ``<array>/c`` for a 0-d array)."""
    parts = key.split("/")
    return [("/".join(parts[:i]), parts[i + 1 :]) for i, part in enumerate(parts) if part == "c"]


def chunk_index(doc, coords: list[str]) -> tuple[int, int] | None:
    """(index in C order, number of chunks) of the chunk at ``coords`` of the array whose
    metadata document is ``doc``; None where zarr would never read such a chunk (not an
    array, another key encoding, another rank, outside the chunk grid)."""
    if not isinstance(doc, dict) or doc.get("node_type") != "array":
        return None
    try:
        shape = [int(n) for n in doc["shape"]]
        chunks = [int(n) for n in doc["chunk_grid"]["configuration"]["chunk_shape"]]
        encoding = doc.get("chunk_key_encoding") or {"name": "default"}
        separator = (encoding.get("configuration") or {}).get("separator", "/")
        at = [int(c) for c in coords]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if encoding.get("name") != "default" or separator != "/" or not len(at) == len(shape):
        return None
    if len(chunks) != len(shape) or not all(chunks):
        return None
    grid = [-(-n // c) for n, c in zip(shape, chunks, strict=True)]
    if not all(0 <= a < g for a, g in zip(at, grid, strict=True)):
        return None
    index, count = 0, 1
    for a, g in zip(at, grid, strict=True):
        index, count = index * g + a, count * g
    return index, count


class CheckedReads:
    """The reads of :class:`.readers.VersionStore` that check what its version's commit
    recorded (a mixin: the store gives the attributes and methods declared here)."""

    path: str
    version: int
    folder: str
    _chunks: ChunkLookup

    async def _store(self) -> Any:
        raise NotImplementedError

    def _pruned(self) -> Exception:
        raise NotImplementedError

    def _prunable(self) -> bool:
        raise NotImplementedError

    async def _checked(self, inner_key: str, value, byte_range, store):
        """``value`` read for ``inner_key`` of the version folder, after checking it against
        what the version's commit recorded (:mod:`.recorded`)."""
        expected = await self._chunks.expected(inner_key, self._document)
        if value is None:
            return await self._absent(inner_key, store, expected)
        if expected in (NOT_A_CHUNK, UNRECORDED):
            return value
        if expected == MISCOUNTED:
            raise self._changed(inner_key, "its array's record does not count its chunks")
        # the last 4 bytes, without copying the chunk
        tail = value.as_numpy_array()[-4:].tobytes() if byte_range is None else None
        stored = trailer(tail if tail is not None else await self._tail(store, inner_key))
        if expected is None or stored != expected:
            raise self._changed(inner_key, "its crc32c differs from the one recorded")
        return value

    async def _absent(self, inner_key: str, store, expected):
        """None (zarr's fill value) for a key that no written chunk could be: nothing, a
        chunk that zarr did not write (all fill values), or a chunk of a version that
        recorded none (an earlier release) that is still there. A version pruned (or being
        pruned) under this reader raises, and so does a chunk that its commit recorded."""
        import asyncio

        if not await store.exists("zarr.json"):
            raise self._pruned()
        if expected is None or inner_key.endswith("zarr.json"):
            return None
        # (a key that is no chunk may be one whose array's zarr.json went first)
        if await asyncio.to_thread(self._prunable):  # its deletion is under way
            raise self._pruned()
        if expected in (UNRECORDED, NOT_A_CHUNK):
            return None
        from ..versioning.errors import MissingChunkError

        raise MissingChunkError(
            f"{self.path!r}: chunk {inner_key!r} of version {self.version} "
            f"({self.folder}) is missing: its commit recorded it as written (crc32c "
            f"{expected}), so zarr would read fill values in its place; the store is "
            f"damaged: write it again{rollback_advice(self.path, self.version)} "
            f"(`slem-dask verify {self.path}` names every missing chunk)"
        )

    def _changed(self, inner_key: str, why: str):
        from ..versioning.errors import CorruptChunkError

        return CorruptChunkError(
            f"{self.path!r}: chunk {inner_key!r} of version {self.version} "
            f"({self.folder}) is not the chunk that was written ({why} at its commit: "
            f"swapped in from another version, or damaged); the store was modified: write "
            f"it again{rollback_advice(self.path, self.version)}"
        )

    async def _document(self, inner_key: str):
        """The parsed JSON document at ``inner_key`` of the version folder, or None."""
        value = await (await self._store()).get(inner_key, default_buffer_prototype())
        return None if value is None else _json(value.to_bytes())

    @staticmethod
    async def _tail(store, inner_key: str) -> bytes:
        from zarr.abc.store import SuffixByteRequest

        value = await store.get(inner_key, default_buffer_prototype(), SuffixByteRequest(4))
        return b"" if value is None else value.to_bytes()


class ChunkLookup:
    """The recorded crc32c of the chunks of one version, by their keys in the version
    folder. ``documents`` (async, a key to the parsed JSON document there or None)
    reads the metadata of the version's arrays, on first use of each."""

    def __init__(self, root_document: bytes):
        self.recorded = recorded_chunks(root_document)
        self._root = _json(root_document)
        self._documents: dict[str, object] = {}

    def remember(self, key: str, document: bytes) -> None:
        """The metadata document at ``key`` as a reader was served it (read once)."""
        if key.endswith("/zarr.json"):
            self._documents.setdefault(key[: -len("/zarr.json")], _json(document))

    async def expected(self, key: str, documents) -> object:
        """The crc32c recorded for chunk ``key`` (None: recorded as not written),
        :data:`UNRECORDED` for a chunk of an array that records none,
        :data:`MISCOUNTED` for one whose record has another number of chunks, or
        :data:`NOT_A_CHUNK`."""
        for array, coords in _candidates(key):
            if array:
                if array not in self._documents:
                    self._documents[array] = await documents(f"{array}/zarr.json")
                doc = self._documents[array]
            else:
                doc = self._root  # the version's own array: the document its commit covers
            found = chunk_index(doc, coords)
            if found is None:
                continue
            index, count = found
            crcs = self.recorded.get(array)
            if crcs is None:
                return UNRECORDED
            return crcs[index] if len(crcs) == count else MISCOUNTED
        return NOT_A_CHUNK


def trailer(data: bytes) -> int | None:
    """The crc32c trailer of a chunk's bytes (its last 4, little-endian)."""
    return int.from_bytes(data[-4:], "little") if len(data) >= 4 else None


def _check_byte_range(byte_range) -> None:
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

    if byte_range is not None and not isinstance(
        byte_range, (RangeByteRequest, OffsetByteRequest, SuffixByteRequest)
    ):  # zarr's stores' own words
        raise TypeError(f"Unexpected byte_range, got {byte_range}.")


def _ranged(data: bytes, byte_range) -> bytes:
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start : byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset :]
    if isinstance(byte_range, SuffixByteRequest):
        return data[max(0, len(data) - byte_range.suffix) :]
    return data
