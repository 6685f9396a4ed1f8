"""Zarr v3 storage: input arrays, model stores and encoded outputs.

Layout and contracts (see README, "Zarr layout"):

* inputs are 2-D zarr arrays, addressed by a local path or an fsspec URL;
* a model is a zarr group whose attribute ``slem_dask`` (written last) says
  what it holds; its arrays are float64;
* an output is a 2-D zarr array whose ``slem_dask`` attribute carries
  ``complete: false`` while it is written and ``complete: true`` at the end.

Readers refuse a model or output that is not marked complete, so a run that
dies part-way never leaves something that looks valid. The rules that make
"complete" mean "right" (canonical paths, leases, checksums, fingerprints,
what may be deleted) live in :mod:`slem_dask.integrity`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import Any

import dask
import numpy as np
import zarr

from .. import integrity
from . import versions
from .._version import __version__
from ..integrity import canonical
from ..validation import check_array_metadata

__all__ = [
    "ATTR",
    "open_input",
    "dask_rows",
    "row_partition",
    "fingerprint",
    "write_model_store",
    "read_model_store",
    "create_output",
    "mark_complete",
    "open_output",
]

ATTR = integrity.ATTR
MODEL_FORMAT_VERSION = 2

#: Every chunk slem-dask writes ends in a crc32c of its bytes (zarr v3 codec).
CHECKSUM = [zarr.codecs.Crc32cCodec()]

#: Bytes of input per dask partition when the caller does not choose.
DEFAULT_PARTITION_BYTES = 64 * 2**20


def _exists(path) -> bool:
    """Whether ``path`` holds something to read or to refuse replacing: a committed
    version, or any store that is not slem-dask's drafts alone (a killed first write
    leaves only drafts: the next run reuses or deletes them)."""
    path = canonical(path)
    if not integrity.exists(path):
        return False
    store = versions.VersionedStore(path)
    return store.is_versioned() or not store.has_history()


def _demo_member(name: str) -> str:
    """The array of the demo corpus that an input called ``name`` would be."""
    return {"positives": "database", "queries": "queries", "database": "database"}.get(
        name, "negatives")


def _demo_example(name: str) -> str:
    """That array's path from the working directory: the demo's folder, or above it."""
    folder = "" if os.path.isdir("corpus.zarr") else "slem-demo/"
    return f"{folder}corpus.zarr/{_demo_member(name)}"


def open_node(path, mode: str = "r"):
    """The zarr v3 node that readers of ``path`` see: the head version of a versioned
    store (its metadata checked against its commit record), a member of one, or a plain
    zarr node. Raises FileNotFoundError when there is nothing to read."""
    location, store, commit = versions.resolve(path)
    if store is not None:
        store.check(commit)
    return zarr.open(store=location, mode=mode, zarr_format=3)


def read_version(arr: zarr.Array, path) -> dict:
    """What a job reads through ``arr``, opened from ``path``, for the record: the URL
    and, for a versioned store, the committed version that ``arr`` was opened in (its
    sequence number and folder), else a fingerprint of the plain array's listing."""
    path = canonical(path)
    parts = _where(arr).rstrip("/").split("/")
    if versions.VERSIONS in parts[:-1]:
        i = len(parts) - 1 - parts[::-1].index(versions.VERSIONS)
        if i + 1 < len(parts):
            owner = versions.VersionedStore("/".join(parts[:i]) or "/")
            commit = owner.commit_at(versions.draft_seq(parts[i + 1]) or 0)
            if commit is not None:
                return {"url": path.url, "version": commit.seq, "version_id": commit.version}
    return {"url": path.url,
            "fingerprint": integrity.rows_fingerprint(arr, path, "input", int(arr.shape[0]))}


def input_version(path) -> dict:
    """What a job read at ``path``, for the record: its URL and, for a versioned store,
    the committed version (sequence number and folder) that was read."""
    path = canonical(path)
    location, store, commit = versions.resolve(path)
    out = {"url": path.url}
    if commit is not None:
        out.update(version=commit.seq, version_id=commit.version)
    else:  # a plain zarr array: what its listing says
        try:
            arr = zarr.open_array(store=location, mode="r", zarr_format=3)
            out["fingerprint"] = integrity.rows_fingerprint(arr, path, "input",
                                                            int(arr.shape[0]))
        except Exception:  # noqa: BLE001 - not an array: its readers say why
            pass
    return out


def open_input(path: str, name: str) -> zarr.Array:
    """Open an existing 2-D zarr array for reading, with a clear error otherwise."""
    path = str(canonical(path))
    try:
        node = open_node(path)
    except versions.VersionError as exc:
        raise type(exc)(f"{name}: {exc}") from None
    except FileNotFoundError:
        if versions.VersionedStore(path).has_history():
            raise ValueError(
                f"{name}: {path!r} is an unfinished slem-dask output (the run that wrote "
                f"it stopped part-way, and nothing was committed); run the same `slem-dask "
                f"encode` again to finish it (it resumes), or with --overwrite to start "
                f"over") from None
        raise FileNotFoundError(
            f"{name}: no zarr array at {path!r}; give the path of an existing zarr "
            f"array, e.g. {_demo_example(name)} (written by "
            f"`slem-dask demo`)"
        ) from None
    except Exception as exc:  # zarr raises several types for non-zarr folders
        raise integrity.damaged_metadata(name, path, exc) or ValueError(
            f"{name}: {path!r} is not a readable zarr store ({type(exc).__name__}: {exc}); "
            f"give the path of a zarr v3 array"
        ) from None
    if isinstance(node, zarr.Group):
        members = sorted(k for k, v in node.members() if isinstance(v, zarr.Array))
        hint = f" (arrays in it: {', '.join(members)})" if members else ""
        example = _demo_member(name)
        if members and example not in members:
            example = members[0]
        raise ValueError(
            f"{name}: {path!r} is a zarr group, not an array{hint}; give the path of "
            f"an array inside it, e.g. {path.rstrip('/')}/{example}"
        )
    if node.ndim != 2:
        fix = ("; if it is one descriptor, store it as one row: x.reshape(1, -1) "
               "(zarr.create_array(..., shape=(1, len(x)), ...))" if node.ndim == 1 else
               "; store it as 2-D rows, e.g. x.reshape(len(x), -1)")
        raise ValueError(
            f"{name}: the zarr array at {path!r} has shape {node.shape} ({node.ndim}-D); "
            f"expected a 2-D array (n_rows, n_features){fix}"
        )
    if 0 in node.shape:
        raise ValueError(
            f"{name}: the zarr array at {path!r} has shape {node.shape}: it has no "
            f"{'features (columns)' if node.shape[1] == 0 else 'rows'}"
        )
    if not (np.issubdtype(node.dtype, np.floating) or np.issubdtype(node.dtype, np.integer)):
        raise TypeError(
            f"{name}: the zarr array at {path!r} has dtype {node.dtype}; expected real numbers"
        )
    check_array_metadata(node, name, path)  # before any chunk is listed or read
    meta = node.attrs.get(ATTR)
    if isinstance(meta, dict) and meta.get("kind") == "encoding" and meta.get("complete") \
            and "metadata_checksum" in meta \
            and meta["metadata_checksum"] != metadata_checksum(meta):
        raise ValueError(
            f"{name}: the metadata of the slem-dask output {path!r} does not match its "
            f"checksum (a fingerprint or recorded checksum was edited); run its "
            f"`slem-dask encode` again with --overwrite")
    if isinstance(meta, dict) and meta.get("kind") == "encoding" and not meta.get("complete"):
        raise ValueError(
            f"{name}: {path!r} is an unfinished slem-dask output (the run that wrote it "
            f"stopped part-way); run the same `slem-dask encode` again to finish it "
            f"(it resumes), or with --overwrite to start over"
        )
    return node


def row_partition(arr: zarr.Array, partition_rows: int | None = None,
                  target_bytes: int = DEFAULT_PARTITION_BYTES) -> int:
    """Rows per dask partition: a whole multiple of the store's shard (or chunk) rows.

    Reading a partition then touches whole storage units only, and writing an
    output chunked the same way can never race on a shared chunk or shard.
    """
    unit = integrity.unit_rows(arr)
    if partition_rows is None:
        row_bytes = max(1, arr.shape[1]) * 8  # the float64 copy a task makes
        # At least d rows: a fit's d x d partial then never outweighs its rows (issue 9).
        partition_rows = max(1, target_bytes // row_bytes, arr.shape[1])
    multiple = max(1, -(-int(partition_rows) // unit))  # round up
    return int(min(max(arr.shape[0], 1), multiple * unit)) if arr.shape[0] else unit


def dask_rows(arr: zarr.Array, partition_rows: int | None = None, name: str = "input",
              exact: bool = False):
    """A dask array over the rows of ``arr``, whole rows per block.

    ``partition_rows`` is rounded up to whole storage units (chunks or shards),
    unless ``exact`` (to match an existing output's chunks).

    Each task checks that every chunk it reads is in the store (zarr would read
    a missing chunk as fill values) and names the store and chunk of any chunk
    that fails its checksum or cannot be decoded.
    """
    import dask.array as da

    rows = int(partition_rows) if exact else row_partition(arr, partition_rows)
    n, d = arr.shape
    chunks = (tuple(min(rows, n - lo) for lo in range(0, n, rows)), (d,))
    return da.map_blocks(_read_rows, arr, name, chunks=chunks, dtype=arr.dtype,
                         meta=np.empty((0, d), dtype=arr.dtype),
                         name="slem-read-" + dask.base.tokenize(
                             str(arr.store_path), arr.metadata.to_dict(), rows, name))


def _read_rows(arr: zarr.Array, name: str, block_info=None) -> np.ndarray:
    (lo, hi), _ = block_info[None]["array-location"]
    return read_rows(arr, lo, hi, name)


def read_rows(arr: zarr.Array, lo: int, hi: int, name: str = "input",
              out: np.ndarray | None = None) -> np.ndarray:
    """Rows [lo, hi) of ``arr``: refused if a chunk is missing, named if one is corrupt.

    Arrays of whole-row chunks with the common codecs (bytes, then zstd and/or
    crc32c) are decoded here, straight into the result (see :class:`_RowChunkCodecs`);
    any other layout is read through zarr. ``out``: a C-ordered array of shape
    (hi - lo, d) and the array's dtype to read into (a buffer reused across reads).
    """
    if out is None:
        out = np.empty((hi - lo, arr.shape[1]), dtype=arr.dtype)
    elif out.shape != (hi - lo, arr.shape[1]) or out.dtype != arr.dtype \
            or not out.flags.c_contiguous:
        raise ValueError(f"out: expected a C-ordered {arr.dtype} array of shape "
                         f"{(hi - lo, arr.shape[1])}, got {out.dtype} {out.shape}")
    codecs = _RowChunkCodecs.of(arr)
    if codecs is not None:
        return codecs.read(arr, lo, hi, name, out)
    from zarr.core.sync import sync

    store = arr.store_path.store
    for key, a, b in integrity.chunk_keys_for_rows(arr, lo, hi):
        if not sync(store.exists(key)):
            raise _missing(arr, name, key, a, b)
    try:
        out[...] = arr[lo:hi]
        return out
    except Exception as exc:  # noqa: BLE001 - find and name the damaged chunk
        for key, a, b in integrity.chunk_keys_for_rows(arr, lo, hi):
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
                f"({parts[i + 1]}) was pruned while it read it ({versions.KEEP_VERSIONS} "
                f"newer versions were committed meanwhile); run the job again to read the "
                f"current version")
    return integrity.missing_chunk_error(name, where, key, a, b)


def _corrupt_chunk(arr, name, key, a, b, exc) -> integrity.CorruptChunkError:
    return integrity.CorruptChunkError(
        f"{name} {_where(arr)!r}: chunk {key!r} (rows {a}-{b - 1}) cannot be read "
        f"({_reason(exc)}); the store is damaged: restore that chunk (an "
        f"output of slem-dask encode: delete that chunk file and re-run the same "
        f"encode, which writes only missing partitions)")


@dataclass(frozen=True)
class _RowChunkCodecs:
    """The decode steps of an array whose chunks are whole rows, encoded by zarr v3's
    ``bytes`` codec followed by any of ``zstd`` and ``crc32c``: the layout of
    slem-dask's outputs and of zarr's default float arrays.

    Why not ``arr[lo:hi]``: zarr decodes each chunk into a buffer of its own and
    then copies it into the result; here each chunk is decompressed straight into
    its rows of the result (a 20,000 x 512 float32 chunk: 50 ms instead of 75 ms
    on one core), which is most of the cost of a fit at d = 512 (issue 9). The
    steps are zarr's own, in its order (tests/test_storage.py compares both
    readers on every supported codec chain, and the fallback on the others).
    """

    steps: tuple[str, ...]  # bytes-to-bytes decode steps, outermost first

    @classmethod
    def of(cls, arr) -> "_RowChunkCodecs | None":
        from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

        meta = arr.metadata
        if (getattr(meta, "zarr_format", None) != 3 or arr.ndim != 2
                or getattr(arr, "shards", None) is not None
                or arr.chunks[1] != arr.shape[1] or arr.dtype.kind != "f"):
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

    def read(self, arr, lo: int, hi: int, name: str, out: np.ndarray) -> np.ndarray:
        rows = arr.chunks[0]
        recorded = recorded_crc32c(arr)
        for key, a, b in integrity.chunk_keys_for_rows(arr, lo, hi):
            data = _chunk_bytes(arr, key)
            if data is None:
                raise _missing(arr, name, key, a, b)
            crc = recorded[a // rows] if recorded and a // rows < len(recorded) else None
            if crc is not None and (len(data) < 4 or int(data[-4:].view("<u4")[0]) != crc):
                raise integrity.CorruptChunkError(
                    f"{name} {_where(arr)!r}: chunk {key!r} (rows {a}-{b - 1}) is not the "
                    f"chunk its job wrote (its crc32c differs from the one recorded when the "
                    f"output was committed); the store was modified: run its `slem-dask "
                    f"encode` again (it rewrites what differs)")
            start, stop = max(a, lo), min(b, hi)
            whole = start == a and stop - start == rows  # the chunk fills its rows of ``out``
            target = out[start - lo:stop - lo] if whole else np.empty((rows, arr.shape[1]),
                                                                       dtype=arr.dtype)
            try:
                self._decode(data, target)
            except ValueError as exc:
                raise _corrupt_chunk(arr, name, key, a, b, exc) from None
            if not whole:
                out[start - lo:stop - lo] = target[start - a:stop - a]
        return out

    def _decode(self, data: bytes, target: np.ndarray) -> None:
        import google_crc32c
        import numcodecs

        view = data
        for i, step in enumerate(self.steps):
            last = i == len(self.steps) - 1
            if step == "crc32c":
                if len(view) < 4 or google_crc32c.value(view[:-4]) != int(
                        view[-4:].view("<u4")[0]):
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


def recorded_crc32c(arr) -> list | None:
    """The crc32c of every chunk recorded when a slem-dask output was completed, in row
    order (None for anything else): readers compare each chunk's trailer with it."""
    meta = arr.attrs.get(ATTR)
    if not isinstance(meta, dict) or meta.get("kind") != "encoding" or not meta.get("complete"):
        return None
    crcs = meta.get("partition_crc32c")
    return crcs if isinstance(crcs, list) else None


def _chunk_bytes(arr, key: str) -> np.ndarray | None:
    """The stored bytes of one chunk as uint8 (no copy), or None if the chunk is absent."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync
    from zarr.storage import LocalStore

    store = arr.store_path.store
    if isinstance(store, LocalStore):
        # Read straight into an array: zarr's LocalStore reads a bytes object and
        # wraps it (22 ms instead of 10 ms for a 37 MB chunk).
        try:
            with open(os.path.join(store.root, key), "rb", buffering=0) as f:
                data = np.empty(os.fstat(f.fileno()).st_size, dtype=np.uint8)
                view, done = memoryview(data), 0
                while done < len(data):
                    got = f.readinto(view[done:])
                    if not got:
                        return data[:done]  # shrank while read: the checks will say so
                    done += got
                return data
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
    buf = sync(store.get(key, prototype=default_buffer_prototype()))
    return None if buf is None else buf.as_numpy_array().view(np.uint8).reshape(-1)


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
    size = int.from_bytes(bytes(frame[pos:pos + size_bytes]), "little")
    return size + 256 if size_bytes == 2 else size


def _where(arr: zarr.Array) -> str:
    """The store of ``arr`` as a user wrote it: a path, or a URL."""
    store = arr.store_path.store
    if hasattr(store, "root"):  # LocalStore
        root = str(store.root)
    elif hasattr(store, "fs"):  # FsspecStore
        protocol = store.fs.protocol
        protocol = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
        root = f"{protocol}://{store.path.lstrip('/')}"
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


def read_all(path, name: str = "encodings") -> np.ndarray:
    """A whole (small) array, with missing or corrupt chunks named."""
    arr = open_input(path, name)
    return read_rows(arr, 0, arr.shape[0], name)


def json_params(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as plain JSON values (numpy scalars such as np.float32(0.1) become floats)."""
    def native(value):
        if isinstance(value, np.generic):
            return value.item()
        raise TypeError(f"model parameter value {value!r} of type {type(value).__name__} "
                        f"cannot be stored; use a plain number or string")

    return json.loads(json.dumps(params, default=native))


def fingerprint(arrays: dict[str, np.ndarray], params: dict[str, Any]) -> str:
    """SHA-256 of a model's arrays (name, dtype, shape, bytes) and parameters."""
    h = hashlib.sha256()
    h.update(json.dumps(json_params(params), sort_keys=True).encode())
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(key.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.reshape(-1).view(np.uint8))  # the same bytes as a.tobytes(), without a copy
    return h.hexdigest()


def _check_overwrite(path, overwrite: bool, what: str, flag: str,
                     kind: str | None = None) -> None:
    integrity.check_may_replace(path, what, flag, kind)  # first: never suggest replacing
    if _exists(path) and not overwrite:
        raise FileExistsError(
            f"{what} {str(canonical(path))!r} already exists; pass {flag} to replace it, or "
            f"choose another path")


def _remove(path) -> None:
    integrity.remove(path)


def metadata_checksum(meta: dict) -> str:
    """SHA-256 of every metadata field but the checksum itself: a model whose
    n_samples, source or parameters were edited by hand is refused."""
    fields = {k: v for k, v in meta.items() if k != "metadata_checksum"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def replace_legacy(path, what: str) -> None:
    """Remove a store that slem-dask 0.2 wrote in place at ``path`` (no versions), so
    that a versioned store can take its place (only with --overwrite or --update)."""
    path = canonical(path)
    if _exists(path) and not versions.VersionedStore(path).has_history() \
            and integrity.slem_dask_kind(path) is not None:
        _remove(path)


def write_group(path, meta: dict, arrays: dict[str, np.ndarray], what: str,
                overwrite: bool = False, lease: integrity.Lease | None = None,
                job: str | None = None) -> versions.Commit:
    """Write a zarr group of small arrays (a model, a search result, a corpus) as a new
    version of the versioned store at ``path`` (:mod:`.versions`), and commit it.

    Readers see the previous version until the commit, then the whole new one. Every
    chunk carries a crc32c, and the group is read back before it is committed. Written
    under ``lease`` (taken here if not given).
    """
    path = canonical(path)
    own = lease is None
    lease = lease or integrity.Lease(path, f"write {what}").acquire()
    try:
        # under the lease: what is at the path stays as checked until it is replaced
        _check_overwrite(path, overwrite, what, "overwrite=True (CLI: --overwrite)",
                         meta.get("kind"))
        replace_legacy(path, what)
        store = versions.VersionedStore(path)
        draft = store.begin()
        try:
            group = zarr.open_group(store=draft.location, mode="w", zarr_format=3)
            for key, value in arrays.items():
                value = np.asarray(value)
                rows = _group_chunk_rows(value)
                arr = group.create_array(key, shape=value.shape, dtype=value.dtype,
                                         chunks=(rows, *value.shape[1:]) if value.ndim else None,
                                         compressors=CHECKSUM)
                if not value.ndim:
                    arr[...] = value
                for start in range(0, len(value) if value.ndim else 0, rows):
                    arr[start:start + rows] = value[start:start + rows]
            group.attrs[ATTR] = {**meta, "metadata_checksum": metadata_checksum(meta)}
            _check_written(draft.location, arrays, what)
            lease.check()  # no other job took the store over meanwhile
            commit = store.commit(draft, meta.get("kind", "group"), job or f"write {what}",
                                  {k: meta[k] for k in ("model", "k") if k in meta})
        except BaseException:
            store.abandon(draft)  # small: nothing worth resuming
            raise
        store.collect_garbage()
        return commit
    finally:
        if own:
            lease.release()


#: Bytes per chunk of the arrays of a model or search result: writing and checking a
#: chunk copies it once or twice, so a d x d array at d = 8192 (512 MiB) is written
#: in 16 chunks rather than as one.
GROUP_CHUNK_BYTES = 32 * 2**20


def _group_chunk_rows(value: np.ndarray) -> int:
    if not value.ndim or not value.size:
        return max(1, len(value) if value.ndim else 1)
    row_bytes = value[0].nbytes or 1
    return int(max(1, min(len(value), GROUP_CHUNK_BYTES // row_bytes)))


def _check_written(location: str, arrays: dict[str, np.ndarray], what: str) -> None:
    """Read a group back (through its checksums), chunk by chunk, before it is put in
    place: what is marked complete is what was computed."""
    group = zarr.open_group(store=location, mode="r")
    stored = dict(group.arrays())
    for key, value in arrays.items():
        value = np.asarray(value)
        same = key in stored and stored[key].shape == value.shape
        try:
            if same and not value.ndim:
                same = np.array_equal(stored[key][...], value, equal_nan=True)
            rows = stored[key].chunks[0] if same and value.ndim else 1
            for start in range(0, len(value) if same and value.ndim else 0, rows):
                if not np.array_equal(stored[key][start:start + rows],
                                      value[start:start + rows], equal_nan=True):
                    same = False
                    break
        except Exception as exc:  # noqa: BLE001 - a chunk that cannot be read back
            raise integrity.CorruptChunkError(
                f"{what}: array {key!r} of {location!r} cannot be read back "
                f"({_reason(exc)}); nothing was replaced: check the storage and write it "
                f"again") from None
        if not same:
            raise integrity.IntegrityError(
                f"{what}: array {key!r} read back from {location!r} differs from what was "
                f"written; nothing was replaced: check the storage and write it again")


def write_model_store(path, model_name: str, params: dict, arrays: dict[str, np.ndarray],
                      info: dict, overwrite: bool = False,
                      lease: integrity.Lease | None = None) -> str:
    """Write a model group; return its fingerprint (see :func:`write_group`)."""
    params = json_params(params)
    fp = fingerprint(arrays, params)
    meta = json_params({
        "kind": "model",
        "format_version": MODEL_FORMAT_VERSION,
        "model": model_name,
        "params": params,
        "fingerprint": fp,
        "package_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **info,
    })
    write_group(path, meta, arrays, "model store", overwrite=overwrite, lease=lease)
    return fp


def read_group_arrays(group, path, what: str) -> dict[str, np.ndarray]:
    """Every array of a group written by :func:`write_group`, corrupt chunks named."""
    arrays = {}
    try:
        members = list(group.arrays())
    except Exception as exc:  # noqa: BLE001 - a member's zarr.json that cannot be parsed
        raise integrity.damaged_metadata(what, path, exc) or integrity.DamagedStoreError(
            f"{what}: the arrays of {str(path)!r} cannot be listed ({_reason(exc)}); the "
            f"store is damaged: write it again") from None
    for key, arr in members:
        try:
            arrays[key] = np.asarray(arr[...])
        except Exception as exc:  # noqa: BLE001
            raise integrity.CorruptChunkError(
                f"{what}: array {key!r} of {str(path)!r} cannot be read ({_reason(exc)}); "
                f"the store is damaged: write it again") from None
    return arrays


def _open_group(path) -> zarr.Group:
    node = open_node(path)
    if isinstance(node, zarr.Array):
        raise zarr.errors.ContainsArrayError(str(path))
    return node


def read_search_store(path) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a search result written by ``slem-dask search``: (metadata, arrays), refusing
    one that is unfinished, edited or damaged."""
    path = str(canonical(path))
    try:
        group = _open_group(path)
    except versions.VersionError as exc:
        raise type(exc)(f"search result: {exc}") from None
    except FileNotFoundError:
        raise FileNotFoundError(f"search result: no zarr group at {path!r}") from None
    except Exception as exc:  # noqa: BLE001
        raise integrity.damaged_metadata("search result", path, exc) or ValueError(
            f"search result: {path!r} is not a zarr group ({type(exc).__name__}: {exc})"
        ) from None
    meta = group.attrs.get(ATTR)
    if not isinstance(meta, dict) or meta.get("kind") != "search":
        raise ValueError(f"search result: {path!r} was not written by `slem-dask search`")
    if not meta.get("complete"):
        raise ValueError(
            f"search result: {path!r} is unfinished (the run that wrote it stopped "
            f"part-way); run `slem-dask search` again with --overwrite")
    if meta.get("metadata_checksum") != metadata_checksum(meta):
        raise ValueError(f"search result: the metadata of {path!r} does not match its "
                         f"checksum; run `slem-dask search` again with --overwrite")
    return meta, read_group_arrays(group, path, "search result")


def read_model_store(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a model group written by :func:`write_model_store`: (metadata, arrays)."""
    path = str(canonical(path))
    try:
        group = _open_group(path)
    except versions.VersionError as exc:
        raise type(exc)(f"model: {exc}") from None
    except FileNotFoundError:
        raise FileNotFoundError(
            f"model: no zarr store at {path!r}; give the path written by "
            f"`slem-dask fit --model PATH` or model.save(PATH)"
        ) from None
    except zarr.errors.ContainsArrayError:
        raise ValueError(
            f"model: {path!r} is a zarr array, not a model (a model is a zarr group); give "
            f"the path written by `slem-dask fit --model PATH` or model.save(PATH)"
        ) from None
    except Exception as exc:
        raise integrity.damaged_metadata("model", path, exc) or ValueError(
            f"model: {path!r} is not a zarr group ({type(exc).__name__}: {exc}); give "
            f"the path written by `slem-dask fit --model PATH` or model.save(PATH)"
        ) from None
    meta = group.attrs.get(ATTR)
    if not isinstance(meta, dict) or meta.get("kind") != "model":
        raise ValueError(
            f"model: the zarr store at {path!r} was not written by slem-dask (no "
            f"'{ATTR}' model attribute; a run that stopped part-way leaves none); "
            f"fit a model with `slem-dask fit` or model.save(PATH)"
        )
    if meta.get("format_version") != MODEL_FORMAT_VERSION:
        raise ValueError(
            f"model: {path!r} has format_version {meta.get('format_version')!r}, this "
            f"slem-dask {__version__} reads {MODEL_FORMAT_VERSION}; refit the model"
        )
    if meta.get("metadata_checksum") != metadata_checksum(meta):
        raise ValueError(
            f"model: the metadata of {path!r} does not match its checksum (a field such as "
            f"n_samples, source or params was edited); the store was modified or damaged, "
            f"refit the model")
    arrays = read_group_arrays(group, path, "model")
    if fingerprint(arrays, meta["params"]) != meta.get("fingerprint"):
        raise ValueError(
            f"model: the arrays in {path!r} do not match its recorded fingerprint; the "
            f"store was modified or damaged, refit the model"
        )
    return meta, arrays


def create_output(location: str, shape: tuple[int, int], partition_rows: int, dtype,
                  meta: dict) -> zarr.Array:
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
    return zarr.create_array(store=location, shape=shape, dtype=np.dtype(dtype).newbyteorder("<"),
                             chunks=(max(1, partition_rows), shape[1]), overwrite=True,
                             compressors=CHECKSUM, config={"write_empty_chunks": True},
                             attributes={ATTR: json_params({
                                 "kind": "encoding", "complete": False,
                                 "package_version": __version__, **meta})})


def output_meta(arr: zarr.Array) -> dict | None:
    """The ``slem_dask`` attribute of an output written by slem-dask, else None."""
    meta = arr.attrs.get(ATTR)
    return dict(meta) if isinstance(meta, dict) and meta.get("kind") == "encoding" else None


def update_meta(arr: zarr.Array, **fields) -> dict:
    meta = dict(arr.attrs[ATTR])
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
        return None
    return node if isinstance(node, zarr.Array) else None


def is_legacy(path) -> bool:
    """Whether ``path`` holds a store that slem-dask 0.2 wrote in place, without versions."""
    path = canonical(path)
    return (_exists(path) and not versions.VersionedStore(path).has_history()
            and integrity.slem_dask_kind(path) is not None)


def write_partition(block: np.ndarray, arr: zarr.Array, index: int,
                    block_info=None) -> np.ndarray:
    """Write one partition's rows (its own chunk) and return [[index, crc32c]]: the
    checksum zarr's codec computed from these rows, as this worker reads it back. The
    client compares it with the chunk it reads: the two see the same chunk."""
    rows = int(arr.chunks[0])
    lo = index * rows
    arr[lo:lo + block.shape[0]] = np.ascontiguousarray(block, dtype=arr.dtype)
    crc = integrity.stored_crc32c(arr, index)
    if crc is None:
        raise integrity.IntegrityError(
            f"output {_where(arr)!r}: partition {index} was written but cannot be read back "
            f"on this worker; check the storage")
    return np.array([[index, crc]], dtype=np.int64)


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
    meta = dict(arr.attrs[ATTR])
    meta.update(json_params({**(extra or {}), "complete": True,
                             "completed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
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


def open_output(path, name: str = "encodings") -> zarr.Array:
    """Open an output written by slem-dask (refused, like any input, if unfinished)."""
    return open_input(path, name)


def _key(path) -> str:
    return canonical(path).key


def check_distinct(target, flag: str, inputs: dict[str, object]) -> None:
    """Refuse to write ``target`` where it would replace or nest in an input."""
    integrity.check_outside_inputs(target, flag, inputs)


# -- verification ---------------------------------------------------------------------
def verify(path) -> tuple[str, list[str]]:
    """Check a store written by slem-dask end to end: (what it is, problems found).

    A model: its metadata checksum, every chunk's crc32c, its fingerprint. An
    output: complete, every partition present with the recorded crc32c, and
    every chunk decodable. A search result: complete, every chunk decodable.
    """
    path = canonical(path)
    if not _exists(path):
        return "nothing", [f"no store at {str(path)!r}"]
    kind = integrity.slem_dask_kind(path)
    if kind is None:
        if integrity.unreadable_marker(path):
            return "unknown", [f"its metadata document 'zarr.json' cannot be read: the store "
                               f"is damaged, or is not a zarr v3 store"]
        return "unknown", [f"{str(path)!r} was not written by slem-dask (no '{ATTR}' marker)"]
    if kind == "model":
        try:
            meta, _ = read_model_store(path)
        except ValueError as exc:
            return kind, [str(exc)]
        return f"model ({meta['model']})", []
    if kind == "search":
        try:
            read_search_store(path)
        except ValueError as exc:
            return "search result", [str(exc)]
        return "search result", []
    try:
        arr = open_node(path)
    except versions.VersionError as exc:
        return "output", [str(exc)]
    except Exception as exc:  # noqa: BLE001 - its marker was read, zarr cannot read the rest
        location = versions.resolve(path)[0]
        return "output", [str(integrity.damaged_metadata("output", location, exc) or exc)]
    meta = output_meta(arr) or {}
    problems = [] if meta.get("complete") else ["unfinished (complete: false): re-run the "
                                                "encode to finish it"]
    crcs = meta.get("partition_crc32c") or []
    n_parts = -(-arr.shape[0] // int(arr.chunks[0]))
    if meta.get("complete") and len(crcs) != n_parts:
        problems.append(f"records {len(crcs)} partition checksums for {n_parts} partitions")
    for i in range(n_parts):
        key = integrity._full_key(arr, (i, 0))
        lo, hi = i * arr.chunks[0], min(arr.shape[0], (i + 1) * arr.chunks[0])
        crc = integrity.self_consistent_crc32c(arr, i)
        if crc is None:
            exists = integrity.stored_crc32c(arr, i) is not None
            problems.append(f"chunk {key!r} (rows {lo}-{hi - 1}) is "
                            f"{'corrupt or truncated' if exists else 'missing'}")
        elif i < len(crcs) and crcs[i] is not None and crcs[i] != crc:
            problems.append(f"chunk {key!r} (rows {lo}-{hi - 1}) is not the chunk that was "
                            f"written (crc32c {crc:08x}, recorded {crcs[i]:08x})")
    if len(problems) > 12:  # an interrupted output can miss thousands of chunks
        problems = problems[:10] + [f"... and {len(problems) - 10} more"]
    return "output", problems
