"""Reading rows: dask arrays over whole-row partitions of a zarr array (or of a file
input, :mod:`.formats`), and the reader that names every missing or damaged chunk
(zarr would read a missing one as zeros)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import zarr
import dask

from .checksums import chunk_key, crc32c, recorded_crc32c
from ..versioning.ownership import ATTR
from ..versioning import versions
from ..versioning.errors import (
    ChangedChunkError,
    CorruptChunkError,
    MissingChunkError,
    missing_chunk_error,
    rollback_advice,
)
from ..formats.formats import FileArray
from .chunk_bytes import REMOTE_CHUNKS_IN_FLIGHT, chunks_bytes, is_local, read_whole_chunk_into


#: Bytes of input per dask partition when the caller does not choose.
DEFAULT_PARTITION_BYTES = 64 * 2**20

#: Attribute of an array made by :func:`dask_rows`: (zarr array, name, the dask array's
#: name, its rows). Statistics read the store through it while the array is still what
#: dask_rows made (:func:`slem_dask.parallel.blocks.scatter_statistics`): slicing, rechunking or
#: persisting makes another object, and ``x[...] = v`` gives x another name.
STORE_ROWS = "_slem_store_rows"


def row_partition(
    arr: zarr.Array,
    partition_rows: int | None = None,
    target_bytes: int = DEFAULT_PARTITION_BYTES,
    at_least_width: bool = True,
) -> int:
    """Rows per dask partition: a whole multiple of the store's shard (or chunk) rows.

    Reading a partition then touches whole storage units only, and writing an
    output chunked the same way can never race on a shared chunk or shard.
    ``at_least_width`` (a fit's default): never fewer rows than columns.
    """
    unit = unit_rows(arr)
    if partition_rows is None:
        row_bytes = max(1, arr.shape[1]) * 8  # the float64 copy a task makes
        # At least d rows: a fit's d x d partial then never outweighs its rows (issue 9).
        # An encode has no partial: at d = 8192 that rule made 512 MiB partitions, and
        # 10,000 rows two tasks of 8,192 and 1,808 rows (one core idle for most of it).
        width = arr.shape[1] if at_least_width else 1
        partition_rows = max(1, target_bytes // row_bytes, width)
    multiple = max(1, -(-int(partition_rows) // unit))  # round up
    return int(min(max(arr.shape[0], 1), multiple * unit)) if arr.shape[0] else unit


def dask_rows(
    arr: zarr.Array, partition_rows: int | None = None, name: str = "input", exact: bool = False
):
    """A dask array over the rows of ``arr``, whole rows per block.

    ``partition_rows`` is rounded up to whole storage units (chunks or shards),
    unless ``exact`` (to match an existing output's chunks).

    Each task checks that every chunk it reads is in the store (zarr would read
    a missing chunk as fill values) and names the store and chunk of any chunk
    that fails its checksum or cannot be decoded.
    """
    import dask.array as da

    # exact: the caller gives partition_rows (int(None) would fail here as before)
    rows = int(partition_rows) if exact else row_partition(arr, partition_rows)  # type: ignore[arg-type]
    n, d = arr.shape
    chunks = (tuple(min(rows, n - lo) for lo in range(0, n, rows)), (d,))
    x = da.map_blocks(
        _read_rows,
        arr,
        name,
        chunks=chunks,
        dtype=arr.dtype,
        meta=np.empty((0, d), dtype=arr.dtype),
        name="slem-read-" + dask.base.tokenize(array_token(arr), rows, name),
    )
    if not exact:  # whole storage units: statistics may read the store themselves
        setattr(x, STORE_ROWS, (arr, name, x.name, int(n)))
    return x


def array_token(arr) -> tuple:
    """What names an input's data in dask keys: its store and metadata (a zarr array),
    or its files with their sizes and mtimes (a :class:`.formats.FileArray`)."""
    if isinstance(arr, FileArray):
        return arr.__dask_tokenize__()
    return (str(arr.store_path), arr.metadata.to_dict())


def _read_rows(arr: zarr.Array, name: str, block_info=None) -> np.ndarray:
    (lo, hi), _ = block_info[None]["array-location"]
    return read_rows(arr, lo, hi, name)


def read_rows(
    arr: zarr.Array,
    lo: int,
    hi: int,
    name: str = "input",
    out: np.ndarray | None = None,
    recorded: list | None = None,
) -> np.ndarray:
    """Rows [lo, hi) of ``arr``: refused if a chunk is missing, named if one is corrupt.

    Arrays of whole-row chunks with the common codecs (bytes, then zstd and/or
    crc32c) are decoded here, straight into the result (see :class:`_RowChunkCodecs`);
    any other layout is read through zarr. ``out``: a C-ordered array of shape
    (hi - lo, d) and the array's dtype to read into (a buffer reused across reads).
    ``recorded``: the crc32c of each chunk as its writer recorded it (default: what the
    array's own attributes record, :func:`.checksums.recorded_crc32c`), which each chunk's
    trailer must equal (:class:`ChangedChunkError`); only where
    :func:`trailers_checked_by_rows` says the layout is decoded here.
    """
    if isinstance(arr, FileArray) and out is None:
        return arr.read(lo, hi, name)
    if out is None:
        out = np.empty((hi - lo, arr.shape[1]), dtype=arr.dtype)
    elif (
        out.shape != (hi - lo, arr.shape[1]) or out.dtype != arr.dtype or not out.flags.c_contiguous
    ):
        raise ValueError(
            f"out: expected a C-ordered {arr.dtype} array of shape "
            f"{(hi - lo, arr.shape[1])}, got {out.dtype} {out.shape}"
        )
    if isinstance(arr, FileArray):
        return arr.read(lo, hi, name, out)
    codecs = _RowChunkCodecs.of(arr)
    if codecs is not None:
        return codecs.read(arr, lo, hi, name, out, recorded)
    from zarr.core.sync import sync

    store = arr.store_path.store
    for key, a, b in chunk_keys_for_rows(arr, lo, hi):
        if not sync(store.exists(key)):
            raise _missing(arr, name, key, a, b)
    try:
        out[...] = arr[lo:hi]
        return out
    except Exception as exc:  # noqa: BLE001 - find and name the damaged chunk
        for key, a, b in chunk_keys_for_rows(arr, lo, hi):
            try:
                arr[a:b]
            except Exception as inner:  # noqa: BLE001
                raise _corrupt_chunk(arr, name, key, a, b, inner) from None
        raise exc


def _missing(arr, name, key, a, b) -> Exception:
    """The error for a chunk absent from ``arr``: a pruned version (many newer ones were
    committed while this job read it) says so; anything else is a missing chunk."""
    where = _where(arr)
    parts = where.rstrip("/").split("/")
    if versions.VERSIONS in parts[:-1]:
        i = len(parts) - 1 - parts[::-1].index(versions.VERSIONS)
        owner = versions.VersionedStore("/".join(parts[:i]) or "/")
        if i + 1 < len(parts) and not owner.exists(parts[i + 1]):
            return versions.VersionError(
                f"{name} {str(owner.path)!r}: the version this job read "
                f"({parts[i + 1]}) was pruned while it read it (storage keeps the last "
                f"{versions.KEEP_VERSIONS} versions, a new job's draft included, and newer "
                f"ones were committed meanwhile); run the job again to read the current "
                f"version"
            )
        if i + 1 < len(parts):  # a committed version of a store slem-dask wrote
            return MissingChunkError(
                f"{name} {where!r}: chunk {key!r} (rows {a}-{b - 1}) is missing from this "
                f"version of a store slem-dask wrote (`slem-dask verify "
                f"{'/'.join(parts[:i])}` lists every problem); restore the chunk, or run the "
                f"command that wrote it again (an encode re-encodes the missing partitions)"
            )
    return missing_chunk_error(name, where, key, a, b)


def _corrupt_chunk(arr, name, key, a, b, exc) -> CorruptChunkError:
    return CorruptChunkError(
        f"{name} {_where(arr)!r}: chunk {key!r} (rows {a}-{b - 1}) cannot be read "
        f"({_reason(exc)}); the store is damaged: restore that chunk (an "
        f"output of slem-dask encode: delete that chunk file and re-run the same "
        f"encode, which writes only missing partitions)"
    )


@dataclass(frozen=True)
class _RowChunkCodecs:
    """The decode steps of an array whose chunks are whole rows, encoded by zarr v3's
    ``bytes`` codec followed by any of ``zstd`` and ``crc32c``: the layout of
    slem-dask's outputs and of zarr's default float arrays.

    Why not ``arr[lo:hi]``: zarr decodes each chunk into a buffer of its own and
    then copies it into the result; here each chunk is decompressed straight into
    its rows of the result (a 20,000 x 512 float32 chunk: 50 ms instead of 75 ms
    on one core), which is most of the cost of a fit at d = 512 (issue 9). The
    steps are zarr's own, in its order (tests/parallel/test_store_statistics.py compares
    both readers on every supported codec chain, and the fallback on the others).
    """

    steps: tuple[str, ...]  # bytes-to-bytes decode steps, outermost first

    @classmethod
    def of(cls, arr) -> _RowChunkCodecs | None:
        from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

        meta = arr.metadata
        if (
            getattr(meta, "zarr_format", None) != 3
            or arr.ndim != 2
            or getattr(arr, "shards", None) is not None
            or arr.chunks[1] != arr.shape[1]
            or arr.dtype.kind != "f"
        ):
            return None
        codecs = tuple(meta.codecs)
        if not codecs or not isinstance(codecs[0], BytesCodec):
            return None
        endian = getattr(codecs[0].endian, "value", codecs[0].endian)
        if endian not in (None, "little") or not arr.dtype.isnative or np.little_endian is False:
            return None
        steps = []
        for codec in reversed(codecs[1:]):
            if isinstance(codec, Crc32cCodec):
                steps.append("crc32c")
            elif isinstance(codec, ZstdCodec):
                steps.append("zstd")
            else:
                return None
        return cls(tuple(steps))

    def read(
        self, arr, lo: int, hi: int, name: str, out: np.ndarray, recorded: list | None = None
    ) -> np.ndarray:
        recorded = recorded_crc32c(arr) if recorded is None else recorded
        keys = chunk_keys_for_rows(arr, lo, hi)
        local = is_local(arr)
        if local and self.steps == ("crc32c",):  # whole chunks read straight into ``out``
            keys = [
                k for k in keys if not self._read_in_place(arr, *k, lo, hi, name, out, recorded)
            ]
        batch = 1 if local else REMOTE_CHUNKS_IN_FLIGHT
        for i in range(0, len(keys), batch):
            part = keys[i : i + batch]
            fetched = chunks_bytes(arr, [k for k, _, _ in part])
            for (key, a, b), data in zip(part, fetched, strict=True):
                self._read_chunk(arr, key, a, b, lo, hi, name, out, recorded, data)
        return out

    def _read_in_place(self, arr, key, a, b, lo, hi, name, out, recorded) -> bool:
        """Whether the chunk at rows [a, b), whole within [lo, hi), was read straight into
        its rows of ``out`` and checked (False: to be read by :meth:`_read_chunk`)."""
        if a < lo or b > hi or b - a != arr.chunks[0]:
            return False
        target = out[a - lo : b - lo]
        stored = read_whole_chunk_into(arr, key, target)
        if stored is None:
            return False
        _check_recorded(arr, key, a, b, name, recorded, stored)
        if crc32c(target.reshape(-1).view(np.uint8)) != stored:
            error = ValueError("checksum: stored and computed crc32c do not match")
            raise _corrupt_chunk(arr, name, key, a, b, error)
        return True

    def _read_chunk(self, arr, key, a, b, lo, hi, name, out, recorded, data) -> None:
        rows = arr.chunks[0]
        if data is None:
            raise _missing(arr, name, key, a, b)
        _check_recorded(
            arr,
            key,
            a,
            b,
            name,
            recorded,
            int(data[-4:].view("<u4")[0]) if len(data) >= 4 else None,
        )
        start, stop = max(a, lo), min(b, hi)
        whole = start == a and stop - start == rows  # the chunk fills its rows of ``out``
        target = (
            out[start - lo : stop - lo]
            if whole
            else np.empty((rows, arr.shape[1]), dtype=arr.dtype)
        )
        try:
            self._decode(data, target)
        except ValueError as exc:
            raise _corrupt_chunk(arr, name, key, a, b, exc) from None
        if not whole:
            out[start - lo : stop - lo] = target[start - a : stop - a]

    def _decode(self, data: np.ndarray, target: np.ndarray) -> None:
        import numcodecs

        view = data
        for i, step in enumerate(self.steps):
            last = i == len(self.steps) - 1
            if step == "crc32c":
                if len(view) < 4 or crc32c(view[:-4]) != int(view[-4:].view("<u4")[0]):
                    raise ValueError("checksum: stored and computed crc32c do not match")
                view = view[:-4]
            else:  # zstd
                try:
                    if last and _zstd_content_size(view) == target.nbytes:
                        numcodecs.Zstd().decode(view, target)
                        return
                    view = np.frombuffer(numcodecs.Zstd().decode(view), np.uint8)
                except (RuntimeError, ValueError) as exc:
                    raise ValueError(f"zstd: {exc}") from None
        if len(view) != target.nbytes:
            raise ValueError(f"size {len(view)} bytes, expected {target.nbytes}")
        target.reshape(-1).view(np.uint8)[:] = view


def _check_recorded(arr, key, a, b, name, recorded, stored: int | None) -> None:
    """Refuse the chunk at rows [a, b) whose trailer ``stored`` is not the crc32c
    ``recorded`` of it (None: nothing recorded, nothing to compare)."""
    rows = arr.chunks[0]
    crc = recorded[a // rows] if recorded and a // rows < len(recorded) else None
    if crc is not None and stored != crc:
        raise ChangedChunkError(
            f"{name} {_where(arr)!r}: chunk {key!r} (rows {a}-{b - 1}) is not the "
            f"chunk its job wrote (its crc32c differs from the one recorded when the "
            f"store was committed); the store was modified: {_rewrite(arr)}"
        )


def trailers_checked_by_rows(arr) -> bool:
    """Whether :func:`read_rows` decodes ``arr`` itself and checks every chunk's bytes
    against a crc32c trailer, so that a ``recorded`` list of trailers pins each chunk."""
    codecs = _RowChunkCodecs.of(arr)
    return codecs is not None and codecs.steps[:1] == ("crc32c",)


def _rewrite(arr) -> str:
    """How to repair a store whose recorded chunk checksum does not match."""
    meta = arr.attrs.get(ATTR)
    if isinstance(meta, dict) and meta.get("kind") == "encoding":
        return "run its `slem-dask encode` again (it rewrites what differs)"
    # only the version's folder is known here, not the path the user gave: say PATH
    return "write it again" + rollback_advice("PATH")


def _zstd_content_size(frame) -> int | None:
    """The decompressed size a zstd frame declares in its header (RFC 8878, 3.1.1.1),
    or None when it declares none. Decompressing into a buffer of another size would
    leave part of it unwritten, silently."""
    if len(frame) < 6 or bytes(frame[:4]) != b"\x28\xb5\x2f\xfd":
        return None
    descriptor = frame[4]
    single_segment = (descriptor >> 5) & 1
    size_bytes = (0 if not single_segment else 1, 2, 4, 8)[descriptor >> 6]
    if size_bytes == 0:
        return None
    pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    if len(frame) < pos + size_bytes:
        return None
    size = int.from_bytes(bytes(frame[pos : pos + size_bytes]), "little")
    return size + 256 if size_bytes == 2 else size


def _where(arr: zarr.Array) -> str:
    """The store of ``arr`` as a user wrote it: a path, or a URL."""
    if isinstance(arr, FileArray):
        return arr.location
    store = arr.store_path.store
    if hasattr(store, "root"):  # LocalStore
        root = str(store.root)
    elif hasattr(store, "fs"):  # FsspecStore
        protocol = store.fs.protocol
        protocol = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
        root = f"{protocol}://{store.path.lstrip('/')}"  # type: ignore[attr-defined]  # FsspecStore
    else:
        root = str(store)
    return f"{root.rstrip('/')}/{arr.path}" if arr.path else root


def _reason(exc: BaseException) -> str:
    text = str(exc)
    if "checksum" in text.lower():
        return "its crc32c checksum does not match its bytes"
    if "reshape" in text or "buffer" in text.lower() or "size" in text.lower():
        return f"its size is wrong, it is truncated ({type(exc).__name__}: {text})"
    return f"{type(exc).__name__}: {text}"


def _unit_shape(arr) -> tuple[int, ...]:
    """Shape of the smallest unit of the store that is read or written whole (shard,
    else chunk)."""
    return tuple(int(n) for n in (getattr(arr, "shards", None) or arr.chunks))


def unit_rows(arr) -> int:
    """Rows of the smallest unit of the store that is read or written whole."""
    return _unit_shape(arr)[0]


def chunk_keys_for_rows(arr, lo: int, hi: int) -> list[tuple[str, int, int]]:
    """(store key, first row, last row + 1) of every storage unit holding rows [lo, hi)."""
    return list(iter_chunk_keys(arr, lo, hi))


def iter_chunk_keys(arr, lo: int, hi: int):
    """:func:`chunk_keys_for_rows`, one at a time: a declared size of 1e15 rows must
    not be enumerated before the first key is checked."""
    rows, cols = _unit_shape(arr)[:2]
    n_cols = -(-int(arr.shape[1]) // cols)
    for i in range(lo // rows, -(-hi // rows)):
        for j in range(n_cols):
            yield chunk_key(arr, (i, j)), i * rows, min((i + 1) * rows, arr.shape[0])


#: A store unit (chunk or shard) smaller than this, in a store of more than MANY_UNITS of
#: them, costs more to reach (a file open or an object request, a decode, its part of a
#: task: 0.1-0.6 ms each; issue 32: 100,000 one-row chunks, 3 MB in all, took a fit 62 s)
#: than to read.
SMALL_UNIT_BYTES = 64 * 2**10
MANY_UNITS = 1000
#: The chunk size suggested instead (whole rows).
SUGGESTED_UNIT_BYTES = 4 * 2**20


class SmallChunksWarning(UserWarning):
    """An input stored in so many tiny chunks that reading them costs more than the data."""


def small_chunks_hint(arr, name: str, path) -> str | None:
    """A hint to rechunk the input ``arr`` (``name`` at ``path``) when it is stored in
    more than MANY_UNITS units of under SMALL_UNIT_BYTES each; None otherwise (and for
    a file read by row ranges: .npy, fvecs, bvecs, contiguous HDF5)."""
    if not getattr(arr, "stored_in_chunks", True):
        return None
    rows, n, d = unit_rows(arr), int(arr.shape[0]), int(arr.shape[1])
    row_bytes = max(1, d * np.dtype(arr.dtype).itemsize)
    units = -(-n // max(1, rows))
    if units <= MANY_UNITS or rows * row_bytes >= SMALL_UNIT_BYTES:
        return None
    better = int(min(n, max(rows, SUGGESTED_UNIT_BYTES // row_bytes)))
    how = (  # dask.array.from_zarr cannot open an HDF5 file
        f"h5py's new_file.create_dataset(NAME, data=old_dataset[...], chunks=({better}, {d}))"
        f", or save the rows as .npy (read by row ranges, no chunks)"
        if getattr(arr, "format", None) == "hdf5"
        else f"dask.array.from_zarr(OLD).rechunk(({better}, {d})).to_zarr(NEW)"
    )
    return (
        f"{name} {str(path)!r} are stored in {units:,} chunks of {rows} row(s) "
        f"({_bytes(rows * row_bytes)} each): reaching each chunk (a file or request, a "
        f"decode) costs more than reading its data; rechunk to {better:,} rows per "
        f"chunk ({_bytes(better * row_bytes)}), e.g. {how}"
    )


def _bytes(n: int) -> str:
    return (
        f"{n} bytes" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB"
    )
