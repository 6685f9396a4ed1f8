"""The data-integrity rules of slem-dask, in one place (used by :mod:`slem_dask.storage`).

* **Paths** are canonical (absolute, normalized, with a protocol) before they are
  compared, recorded or shipped to workers: :func:`canonical`.
* **Ownership**: slem-dask deletes only stores it wrote, recognized from their
  ``slem_dask`` attribute (:func:`written_by_slem_dask`), and never a store that is,
  contains or sits inside an input (:func:`check_outside_inputs`).
* **One writer**: a store is written under a lease, a sibling file
  ``.NAME.slem-dask-lease`` created atomically (O_EXCL) with owner, host, pid and
  time; a live owner makes a second writer refuse; a dead owner's lease is taken
  over (:class:`Lease`).
* **Checksums**: every chunk slem-dask writes ends in a crc32c (the zarr v3
  ``crc32c`` codec); a write task returns the trailer of the chunk it wrote, as its
  worker reads it back, and the client checks that it reads the same trailer
  before marking complete.
* **Fingerprints of inputs** come from the store listing (key, size, mtime per
  chunk): cheap, and they change whenever a chunk is rewritten.
* **Workers see the same stores**: :func:`check_workers_see` compares what each
  worker reads (metadata document, first chunk) with what the client reads.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import posixpath
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import numpy as np

__all__ = [
    "StorePath", "canonical", "check_outside_inputs", "Lease", "LeaseHeldError",
    "LeaseLostError", "MissingChunkError", "CorruptChunkError",
    "stored_crc32c", "unit_rows", "chunk_keys_for_rows", "rows_fingerprint",
    "partition_fingerprints", "check_workers_see", "store_signature",
]

#: Attribute that marks what slem-dask wrote (kind: model, encoding, search).
ATTR = "slem_dask"
KINDS = ("model", "encoding", "search", "corpus")



# -- paths --------------------------------------------------------------------------
@dataclass(frozen=True)
class StorePath:
    """A canonical store address. ``url`` has a protocol (``file:///abs/x.zarr``,
    ``s3://bucket/x.zarr``); ``location`` is what zarr opens; ``key`` what is compared."""

    url: str

    @property
    def is_local(self) -> bool:
        return self.url.startswith("file://")

    @property
    def location(self) -> str:
        return self.url[len("file://"):] if self.is_local else self.url

    @property
    def key(self) -> str:
        return self.location if self.is_local else self.url  # local: already resolved

    @property
    def parent(self) -> "StorePath":
        if self.is_local:
            return StorePath("file://" + os.path.dirname(self.location.rstrip("/") or "/"))
        protocol, rest = self.url.split("://", 1)
        rest = rest.rstrip("/")
        return StorePath(f"{protocol}://{rest.rsplit('/', 1)[0] if '/' in rest else ''}")

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def child(self, name: str) -> "StorePath":
        if self.url.endswith("://"):  # the root of a remote file system
            return StorePath(self.url + name)
        return StorePath(self.url.rstrip("/") + "/" + name)

    def __str__(self) -> str:  # what messages show: a plain path for local stores
        return self.location


def canonical(path) -> StorePath:
    """The canonical form of a local path or fsspec URL (``./x``, ``x/``, ``a/../x``,
    ``file://x``, a symlink to it and the absolute path all give the same: local paths
    are resolved, so that one store has one lease and one record)."""
    if isinstance(path, StorePath):
        return path
    text = os.fspath(path) if not isinstance(path, str) else path
    if not text:
        raise ValueError("a store path is empty; give a local path or an fsspec URL")
    if text.startswith("file://"):
        from urllib.parse import unquote

        text = unquote(text[len("file://"):])
    if "://" not in text:
        return StorePath("file://" + os.path.realpath(os.path.expanduser(text)))
    protocol, rest = text.split("://", 1)
    rest = posixpath.normpath(rest).lstrip("/") if rest.strip("/") else ""
    return StorePath(f"{protocol.lower()}://{rest}")


def _relation(target: StorePath, source: StorePath) -> str | None:
    t, s = target.key.rstrip("/"), source.key.rstrip("/")
    if t == s:
        return "is"
    if s.startswith(t + "/"):
        return "contains"
    if t.startswith(s + "/"):
        return "is inside"
    return None


def _suggestion(target: StorePath, inputs: list[StorePath]) -> str:
    """A path near the target, outside every input and containing none."""
    base = target
    while any(_relation(base, s) == "is inside" for s in inputs):
        base = base.parent  # climb out of the input it sits in
    if any(_relation(base, s) == "contains" for s in inputs):
        parent, stem = base, "slem-output"  # a new store inside the folder given
    else:  # base is an input itself: a sibling of it
        parent = base.parent
        stem = base.name[:-5] + "-slem" if base.name.endswith(".zarr") else base.name + "-slem"
    for i in range(100):
        candidate = parent.child(f"{stem}{'' if i == 0 else i}.zarr")
        if all(_relation(candidate, s) is None for s in inputs):
            return str(candidate)
    return str(parent.child(f"slem-output-{uuid.uuid4().hex[:8]}.zarr"))  # pragma: no cover


def check_outside_inputs(target, flag: str, inputs: dict[str, object],
                         outputs: dict[str, object] | None = None) -> None:
    """Refuse a store to be written that is, contains or sits inside an input
    (replacing it, with --overwrite, would destroy the input) or another output."""
    t = canonical(target)
    sources = {name: canonical(p) for name, p in inputs.items() if p is not None}
    others = {name: canonical(p) for name, p in (outputs or {}).items() if p is not None}
    everything = list(sources.values()) + list(others.values())
    for name, s in {**sources, **others}.items():
        relation = _relation(t, s)
        if relation:
            why = ("writing it would destroy the input" if name in sources
                   else "two steps cannot write one store")
            raise ValueError(
                f"{flag} {str(t)!r} {relation} the {name} {str(s)!r}; {why}: choose a path "
                f"outside every input and output, e.g. {_suggestion(t, everything)}")


# -- filesystem access (local or fsspec) ---------------------------------------------
def _fs(path: StorePath):
    import fsspec

    return fsspec.core.url_to_fs(path.url)


def exists(path: StorePath) -> bool:
    if path.is_local:
        return os.path.lexists(path.location)
    fs, root = _fs(path)
    return fs.exists(root)


def _read_json(path: StorePath, name: str) -> dict | None:
    try:
        if path.is_local:
            with open(os.path.join(path.location, name), "rb") as f:
                return json.loads(f.read())
        fs, root = _fs(path)
        with fs.open(f"{root}/{name}", "rb") as f:
            return json.loads(f.read())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def slem_dask_kind(path: StorePath) -> str | None:
    """'model', 'encoding', 'search' or 'corpus' if slem-dask wrote the store at
    ``path`` (its head version's kind for a versioned store), 'draft' for a versioned
    store with no committed version yet (left by a killed first write)."""
    from .storage.versions import VersionedStore, VersionError

    store = VersionedStore(path)
    if store.has_history():
        try:
            head = store.head()
        except VersionError:
            return "draft"  # its history is damaged: still slem-dask's to replace
        return head.kind if head else "draft"
    doc = _read_json(path, "zarr.json")
    if not isinstance(doc, dict):
        return None
    meta = (doc.get("attributes") or {}).get(ATTR)
    return meta.get("kind") if isinstance(meta, dict) and meta.get("kind") in KINDS else None


def unreadable_marker(path: StorePath) -> bool:
    """Whether ``path`` has a zarr.json that is not a JSON document: whether
    slem-dask wrote the store cannot be told (see :func:`slem_dask_kind`)."""
    return (not isinstance(_read_json(path, "zarr.json"), dict)
            and exists(path.child("zarr.json")))


def _is_empty_dir(path: StorePath) -> bool:
    if path.is_local:
        return os.path.isdir(path.location) and not os.listdir(path.location)
    fs, root = _fs(path)
    return fs.isdir(root) and not fs.ls(root)


def check_may_replace(path, what: str, flag: str = "--overwrite",
                      kind: str | None = None) -> None:
    """Refuse to delete anything at ``path`` that slem-dask did not write, or (``kind``)
    a slem-dask store of another kind (an output never replaces a model, say)."""
    path = canonical(path)
    if not exists(path) or _is_empty_dir(path):
        return
    found = slem_dask_kind(path)
    if found == "draft":
        return
    if found is not None and kind is not None and found != kind:
        names = {"model": "a model", "encoding": "an encoded output",
                 "search": "a search result", "corpus": "a corpus"}
        raise FileExistsError(
            f"{what} {str(path)!r} holds {names[found]} of slem-dask, not "
            f"{names[kind]}; {flag} replaces only a store of the same kind: choose another "
            f"path, or delete it yourself if it is really unwanted")
    if found is not None:
        return
    if unreadable_marker(path):
        whose = ("slem-dask cannot tell who wrote it: its metadata document zarr.json "
                 "cannot be read (damaged, or not zarr v3)")
    else:
        whose = f"was not written by slem-dask (it has no '{ATTR}' marker)"
    raise FileExistsError(
        f"{what} {str(path)!r} exists and {whose}; slem-dask never deletes what it did not "
        f"write, even with {flag}: choose another path, or remove it yourself if it is "
        f"really unwanted")


def remove(path) -> None:
    """Delete a store that :func:`check_may_replace` allowed (checked again here)."""
    path = canonical(path)
    check_may_replace(path, "store")
    if not exists(path):
        return
    if path.is_local:
        import shutil

        if os.path.isdir(path.location) and not os.path.islink(path.location):
            shutil.rmtree(path.location)
        else:
            os.remove(path.location)
    else:  # pragma: no cover - needs a remote store
        fs, root = _fs(path)
        fs.rm(root, recursive=True)


# -- leases (see slem_dask.storage.leases) ------------------------------------------
from .storage.errors import IntegrityError  # noqa: E402
from .storage.leases import (  # noqa: E402,F401
    LEASE_TTL, Lease, LeaseHeldError, LeaseLostError)


# -- chunks, checksums, fingerprints --------------------------------------------------
class DamagedStoreError(ValueError):
    """A store's chunk is missing, corrupt or truncated (the message names it)."""


class MissingChunkError(DamagedStoreError):
    """An input chunk is absent: zarr would read it as fill values."""


class CorruptChunkError(DamagedStoreError):
    """A chunk fails its checksum or cannot be decoded."""


class DamagedMetadataError(DamagedStoreError):
    """A node's metadata document (zarr.json) is there but zarr cannot read it."""


def _children(path: StorePath) -> list[str]:
    try:
        if path.is_local:
            return sorted(os.listdir(path.location))
        fs, root = _fs(path)
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    except OSError:
        return []


def unreadable_document(path: StorePath) -> str | None:
    """The first metadata document under ``path`` (its own zarr.json, then its
    members') that zarr cannot open, e.g. "precision/zarr.json"; None if all open."""
    import zarr

    for name in ["", *_children(path)]:
        node = path.child(name) if name else path
        if not exists(node.child("zarr.json")):
            continue
        try:
            zarr.open(store=node.location, mode="r")
        except Exception:  # noqa: BLE001 - any failure to parse is the answer
            return f"{name}/zarr.json" if name else "zarr.json"
    return None


def damaged_metadata(what: str, path, exc: BaseException) -> DamagedMetadataError | None:
    """The error for a store whose metadata document is there but cannot be read
    (truncated, edited, not zarr v3), naming the document; None when ``path`` has
    no unreadable document (then the failure is something else: no store, say)."""
    from .storage.versions import resolve

    path = canonical(path)
    try:
        where = canonical(resolve(path)[0])  # a versioned store: the version read
    except Exception:  # noqa: BLE001 - its history is damaged too: look at the path itself
        where = path
    document = unreadable_document(where)
    if document is None:
        return None
    return DamagedMetadataError(
        f"{what}: the metadata document {document!r} of {str(path)!r} cannot be read "
        f"({type(exc).__name__}: {exc}); the store is damaged or was not written as "
        f"zarr v3: restore it from a copy, or write it again")


def _full_key(arr, coords) -> str:
    key = arr.metadata.encode_chunk_key(coords)
    return f"{arr.path}/{key}" if arr.path else key


def _store_get(arr, key: str, suffix: int | None = None, head: int | None = None):
    """The bytes of ``key`` (or its last ``suffix`` / first ``head`` bytes), None if absent."""
    from zarr.abc.store import RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    byte_range = (SuffixByteRequest(suffix) if suffix else
                  RangeByteRequest(0, head) if head else None)
    buf = sync(arr.store_path.store.get(key, prototype=default_buffer_prototype(),
                                        byte_range=byte_range))
    return None if buf is None else buf.to_bytes()


def stored_crc32c(arr, row_chunk: int) -> int | None:
    """The crc32c trailer of output chunk ``(row_chunk, 0)``, or None if it is absent."""
    tail = _store_get(arr, _full_key(arr, (row_chunk, 0)), suffix=4)
    return None if tail is None or len(tail) != 4 else int(np.frombuffer(tail, "<u4")[0])


def self_consistent_crc32c(arr, row_chunk: int) -> int | None:
    """Read a whole output chunk; its crc32c if the payload matches the trailer and
    has the expected size, else None (absent, truncated or corrupt)."""
    import google_crc32c

    data = _store_get(arr, _full_key(arr, (row_chunk, 0)))
    expected = int(np.prod(arr.chunks)) * arr.dtype.itemsize + 4
    if data is None or len(data) != expected:
        return None
    crc = int(np.frombuffer(data[-4:], "<u4")[0])
    return crc if google_crc32c.value(data[:-4]) == crc else None


def delete_chunk(arr, row_chunk: int) -> None:
    from zarr.core.sync import sync

    sync(arr.store_path.store.delete(_full_key(arr, (row_chunk, 0))))


def _unit_shape(arr) -> tuple[int, ...]:
    """Shape of the smallest unit of the store that is read or written whole (shard,
    else chunk)."""
    return tuple(int(n) for n in (getattr(arr, "shards", None) or arr.chunks))


def unit_rows(arr) -> int:
    """Rows of the smallest unit of the store that is read or written whole."""
    return _unit_shape(arr)[0]


def chunk_keys_for_rows(arr, lo: int, hi: int) -> list[tuple[str, int, int]]:
    """(store key, first row, last row + 1) of every storage unit holding rows [lo, hi)."""
    return list(_iter_chunk_keys(arr, lo, hi))


def _iter_chunk_keys(arr, lo: int, hi: int):
    """:func:`chunk_keys_for_rows`, one at a time: a declared size of 1e15 rows must
    not be enumerated before the first key is checked."""
    rows, cols = _unit_shape(arr)[:2]
    n_cols = -(-int(arr.shape[1]) // cols)
    for i in range(lo // rows, -(-hi // rows)):
        for j in range(n_cols):
            yield _full_key(arr, (i, j)), i * rows, min((i + 1) * rows, arr.shape[0])


def _listing(arr, path: StorePath) -> dict[str, tuple]:
    """{store key: (size, mtime in ns)} for every chunk of ``arr``."""
    from .storage.versions import resolve

    path = canonical(resolve(path)[0])  # a versioned store: the version that was opened
    prefix = f"{arr.path}/" if arr.path else ""
    root = path.location
    # ``path`` names the array itself: strip the array's own prefix from the keys
    out: dict[str, tuple[int, int]] = {}
    if path.is_local:
        for dirpath, _, files in os.walk(root):
            for name in files:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                if rel == "zarr.json" or name.endswith(".partial"):
                    continue
                st = os.stat(full)
                out[prefix + rel] = (st.st_size, st.st_mtime_ns)
        return out
    fs, froot = _fs(path)  # pragma: no cover - needs a remote store
    for full, info in fs.find(froot, detail=True).items():
        rel = full[len(froot):].lstrip("/")
        if rel == "zarr.json":
            continue
        stamp = (info.get("mtime") or info.get("LastModified") or info.get("ETag")
                 or info.get("created") or "")
        out[prefix + rel] = (int(info.get("size", 0)), str(stamp))  # str: stable across runs
    return out


def missing_chunk_error(name: str, path, key: str, lo: int, hi: int) -> MissingChunkError:
    return MissingChunkError(
        f"{name} {str(path)!r}: chunk {key!r} (rows {lo}-{hi - 1}) is missing from the "
        f"store; zarr would read it as fill values (zeros), so slem-dask refuses it. If the "
        f"store is on storage that this machine or a worker does not mount, mount it "
        f"there; if the chunk was lost, restore or rewrite those rows; if those rows are all "
        f"zeros on purpose, zarr skipped the chunk (its default write_empty_chunks=False): "
        f"rewrite the array with zarr.create_array(..., config={{'write_empty_chunks': True}})")


def _digest(parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode())
    return h.hexdigest()[:32]


def _layout(arr) -> tuple:
    return (str(arr.dtype), tuple(arr.chunks), getattr(arr, "shards", None),
            json.dumps([c.to_dict() for c in arr.metadata.codecs], sort_keys=True, default=str),
            repr(arr.metadata.fill_value))


def _listed(listing: dict, arr, path: StorePath, name: str, lo: int, hi: int) -> list:
    """(key, listing entry) of every storage unit holding rows [lo, hi); a unit absent
    from the listing is an error.

    Keys are checked as they are generated: each present key is a distinct entry of
    the listing, so a declared size beyond what the store holds meets its first
    missing key within len(listing) + 1 keys, however many rows it declares."""
    out = []
    for key, a, b in _iter_chunk_keys(arr, lo, hi):
        if key not in listing:
            exc = missing_chunk_error(name, path, key, a, b)
            rows, cols = _unit_shape(arr)[:2]
            units = -(-int(arr.shape[0]) // rows) * -(-int(arr.shape[1]) // cols)
            if units > len(listing):  # say so when zarr.json declares more than is there
                exc = MissingChunkError(
                    f"{exc} (its zarr.json declares shape {arr.shape}: {units} chunk(s) "
                    f"of {rows} x {cols}, and the store holds {len(listing)} object(s))")
            raise exc
        out.append((key, listing[key]))
    return out


def partition_fingerprints(arr, path, name: str, rows: int) -> list[str]:
    """One fingerprint per row partition of ``rows`` rows, from the store listing.

    A partition's fingerprint changes when any chunk under it is rewritten (its
    size or mtime changes). A chunk absent from the listing is an error.
    """
    path = canonical(path)
    listing = _listing(arr, path)
    layout = _layout(arr)
    n = int(arr.shape[0])
    out = []
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        out.append(_digest([layout, hi - lo, *_listed(listing, arr, path, name, lo, hi)]))
    return out


def rows_fingerprint(arr, path, name: str, n_rows: int) -> str:
    """Fingerprint of the first ``n_rows`` rows: the listing of the storage units they
    fill completely, plus a digest of the content of the rows in a partly filled
    last unit (appending rewrites that unit, so its listing would change)."""
    path = canonical(path)
    rows = unit_rows(arr)
    full = (n_rows // rows) * rows
    listing = _listing(arr, path)
    parts = [_layout(arr), int(arr.shape[1]), n_rows,
             *(_listed(listing, arr, path, name, 0, full) if full else [])]
    if full < n_rows:
        _listed(listing, arr, path, name, full, n_rows)  # must exist; its rows are digested
        tail = np.ascontiguousarray(arr[full:n_rows])
        parts.append(hashlib.sha256(tail.tobytes()).hexdigest())
    return _digest(parts)


# -- what the workers see ------------------------------------------------------------
def store_signature(location: str) -> dict:
    """Digest of a store's metadata document and of its first chunk, as seen here."""
    import zarr

    try:
        node = zarr.open(store=location, mode="r")
    except Exception as exc:  # noqa: BLE001 - any failure is reported to the client
        return {"error": f"{type(exc).__name__}: {exc}"}
    doc = _store_get(node, f"{node.path}/zarr.json" if node.path else "zarr.json")
    sig = {"metadata": hashlib.sha256(doc or b"").hexdigest()}
    if isinstance(node, zarr.Array) and node.shape[0]:
        # the first chunk's size and its first and last 64 KiB: enough to tell a missing
        # mount or another file, without reading a whole chunk (37 MB at 20,000 x 512)
        # in the client and every worker before each job
        key = _full_key(node, (0,) * node.ndim)
        head = _store_get(node, key, head=_SIGNATURE_BYTES)
        tail = _store_get(node, key, suffix=_SIGNATURE_BYTES)
        sig["first_chunk"] = None if head is None or tail is None else (
            f"{_store_size(node, key)}:{hashlib.sha256(head + tail).hexdigest()}")
    return sig


_SIGNATURE_BYTES = 2**16


def _store_size(arr, key: str) -> int:
    from zarr.core.sync import sync

    return int(sync(arr.store_path.store.getsize(key)))


class StorageViewError(IntegrityError):
    """A worker reads a store differently from the client (or not at all)."""


def _worker_signatures(locations: list[str]) -> list[dict]:
    return [store_signature(loc) for loc in locations]


def check_workers_see(client, stores: dict[str, object]) -> None:
    """Refuse to compute unless every worker reads the same metadata and first chunk
    as the client for each store (a worker without the mount, or started in
    another directory with a relative path, would read nothing or something else)."""
    if client is None or not stores:
        return
    names = list(stores)
    paths = [canonical(stores[n]) for n in names]
    local = [p for p in paths if p.url.startswith("memory://")]
    if local:
        apart = [w for w in client.scheduler_info().get("workers", {})
                 if not w.startswith("inproc://")]
        if apart:
            raise StorageViewError(
                f"{str(local[0])!r} is a memory:// store: it lives in this process only, "
                f"and worker {apart[0]} is another process; use a path or URL every worker "
                f"can reach (a shared file system, s3://...), or an in-process cluster")
    from .storage.versions import resolve

    def read_at(p):  # what is read: a versioned store's head; a draft as it is
        try:
            return resolve(p)[0]
        except ValueError:
            return p.location

    locations = [read_at(p) for p in paths]
    here = _worker_signatures(locations)
    seen = client.run(_worker_signatures, locations)
    for worker, sigs in seen.items():
        for name, path, mine, theirs in zip(names, paths, here, sigs):
            if theirs != mine:
                what = theirs.get("error") or (
                    "another metadata document" if theirs.get("metadata") != mine.get("metadata")
                    else "another first chunk")
                raise StorageViewError(
                    f"worker {worker} does not see the {name} {str(path)!r} as this client "
                    f"does ({what}); every worker must reach the same storage at the same "
                    f"path: mount it on that worker, or use a URL (s3://...) all can read")


def is_out_of_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
