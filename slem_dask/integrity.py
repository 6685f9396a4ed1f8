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
KINDS = ("model", "encoding", "search")

#: A lease whose owner stopped refreshing it this many seconds ago is stale
#: (for owners on other hosts; a dead pid on this host is stale at once).
LEASE_TTL = float(os.environ.get("SLEM_DASK_LEASE_TTL", "120"))
LEASE_HEARTBEAT = max(0.5, min(30.0, LEASE_TTL / 4))


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
    """'model', 'encoding' or 'search' if slem-dask wrote the zarr node at ``path``."""
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
    if found is not None and kind is not None and found != kind:
        names = {"model": "a model", "encoding": "an encoded output",
                 "search": "a search result"}
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


# -- leases -------------------------------------------------------------------------
class IntegrityError(RuntimeError):
    """A job stopped to keep a guarantee (its message says what is kept and what to do)."""


class LeaseHeldError(FileExistsError):
    """Another live slem-dask job writes this store."""


class LeaseLostError(IntegrityError):
    """This job's lease was taken over (it was thought dead): it must not mark complete."""


def _process_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = _process_start(pid)
    return start is None or now is None or now == start  # a reused pid is another process


class Lease:
    """Exclusive right to write one store, for the lifetime of a job.

    ``with Lease(path, "encode"):`` takes it (or raises :class:`LeaseHeldError`
    naming the owner), refreshes it every few seconds from a daemon thread, and
    removes it on exit. :meth:`check` before marking complete proves that no
    other job took it over meanwhile.
    """

    def __init__(self, target, job: str):
        self.target = canonical(target)
        self.job = job
        self.file = self.target.parent.child(f".{self.target.name}.slem-dask-lease")
        self.token = uuid.uuid4().hex
        self.took_over: dict | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # the lease file itself
    def _record(self) -> dict:
        return {"token": self.token, "job": self.job, "host": socket.gethostname(),
                "pid": os.getpid(), "pid_start": _process_start(os.getpid()),
                "store": self.target.url, "started": getattr(self, "_started", time.time()),
                "heartbeat": time.time()}

    def _create(self) -> bool:
        data = json.dumps(self._record()).encode()
        if self.file.is_local:
            # written whole to a private file, then hard-linked into place: link() fails
            # if the lease exists, and a lease never exists half-written
            os.makedirs(os.path.dirname(self.file.location), exist_ok=True)
            tmp = f"{self.file.location}.{self.token}.new"
            with open(tmp, "wb") as f:
                f.write(data)
            try:
                os.link(tmp, self.file.location)
                return True
            except FileExistsError:
                return False
            finally:
                os.remove(tmp)
        fs, root = _fs(self.file)  # pragma: no cover - needs a remote store
        try:  # exclusive create where the filesystem supports it, else best effort
            with fs.open(root, "xb") as f:
                f.write(data)
            return True
        except (FileExistsError, ValueError, NotImplementedError):
            if fs.exists(root):
                return False
            fs.pipe(root, data)
            return True

    def read(self) -> dict | None:
        try:
            if self.file.is_local:
                with open(self.file.location, "rb") as f:
                    return json.loads(f.read())
            fs, root = _fs(self.file)  # pragma: no cover
            return json.loads(fs.cat(root))
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return None

    def _replace(self) -> None:
        data = json.dumps(self._record()).encode()
        if self.file.is_local:
            tmp = f"{self.file.location}.{self.token}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.file.location)
        else:  # pragma: no cover
            fs, root = _fs(self.file)
            fs.pipe(root, data)

    def is_stale(self, record: dict | None) -> bool:
        if not record:  # unreadable (damaged): stale once nobody has touched it for a while
            try:
                age = time.time() - os.path.getmtime(self.file.location)
            except OSError:
                return True
            return age > LEASE_TTL
        if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
            return not _pid_alive(record["pid"], record.get("pid_start"))
        return time.time() - float(record.get("heartbeat", 0)) > LEASE_TTL

    def describe(self, record: dict | None) -> str:
        if not record:
            return (f"an unreadable lease file {self.file.location!r} (taken over once "
                    f"untouched for {LEASE_TTL:.0f} s; delete it if no job runs)")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("started", 0)))
        return (f"{record.get('job', 'a job')} (pid {record.get('pid')} on host "
                f"{record.get('host')}, since {since}; lease {self.file.location!r})")

    def acquire(self) -> "Lease":
        self._started = time.time()
        for _ in range(5):
            if self._create():
                break
            record = self.read()
            if not self.is_stale(record):
                raise self._held(record)
            # stale: move it aside atomically (one taker wins the rename), then retry
            aside = f"{self.file.location}.stale-{self.token}"
            try:
                if self.file.is_local:
                    os.rename(self.file.location, aside)
                    os.remove(aside)
                else:  # pragma: no cover
                    fs, root = _fs(self.file)
                    fs.rm(root)
                self.took_over = record or {}
            except FileNotFoundError:
                pass
        else:  # pragma: no cover - five lost races in a row
            raise LeaseHeldError(f"could not take the lease of {str(self.target)!r}; retry")
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, daemon=True,
                                        name=f"slem-dask-lease-{self.target.name}")
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(LEASE_HEARTBEAT):
            record = self.read()
            if not record or record.get("token") != self.token:
                return  # taken over: check() will refuse completion
            try:
                self._replace()
            except OSError:
                pass

    def check(self) -> None:
        record = self.read()
        if not record or record.get("token") != self.token:
            owner = f" by {self.describe(record)}" if record else ""
            raise LeaseLostError(
                f"the lease of {str(self.target)!r} was taken over{owner} while this job "
                f"ran (it was thought dead); nothing was marked complete: run the job again")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        record = self.read()
        if record and record.get("token") == self.token:
            try:
                if self.file.is_local:
                    os.remove(self.file.location)
                else:  # pragma: no cover
                    fs, root = _fs(self.file)
                    fs.rm(root)
            except FileNotFoundError:
                pass

    def check_free(self) -> None:
        """Raise :class:`LeaseHeldError` if a live job holds the lease (taking nothing):
        the checks made before a cluster starts."""
        record = self.read()
        if (record is not None or exists(self.file)) and not self.is_stale(record):
            raise self._held(record)

    def _held(self, record: dict | None) -> LeaseHeldError:
        return LeaseHeldError(
            f"{str(self.target)!r} is being written by another slem-dask job: "
            f"{self.describe(record)}; wait until it ends (one writer per store), or write "
            f"to another path. A lease of a dead job is taken over automatically (after "
            f"{LEASE_TTL:.0f} s for a job on another host)")

    def __enter__(self) -> "Lease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


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
    path = canonical(path)
    document = unreadable_document(path)
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
    rows, cols = _unit_shape(arr)[:2]
    n_cols = -(-int(arr.shape[1]) // cols)
    out = []
    for i in range(lo // rows, -(-hi // rows)):
        for j in range(n_cols):
            out.append((_full_key(arr, (i, j)), i * rows, min((i + 1) * rows, arr.shape[0])))
    return out


def _listing(arr, path: StorePath) -> dict[str, tuple]:
    """{store key: (size, mtime in ns)} for every chunk of ``arr``."""
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
    from the listing is an error."""
    out = []
    for key, a, b in chunk_keys_for_rows(arr, lo, hi):
        if key not in listing:
            raise missing_chunk_error(name, path, key, a, b)
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
    locations = [p.location for p in paths]
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
