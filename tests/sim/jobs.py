"""The commands the simulated actors run, written the way slem-dask's jobs use the
protocol (:mod:`slem_dask.storage.versions`, :mod:`slem_dask.storage.leases`).

A version's node is a small stand-in for a zarr node: ``zarr.json`` (the content's
name, whether it is complete, the sha256 of each chunk) and chunks ``c/<i>``. The
sequence of calls is the jobs': ``writer_encode`` follows ``pipeline/encode.py``
(draft begun and its metadata written before anything else, chunks of earlier drafts
and of the head reused, an up-to-date run abandons its draft, a failed write keeps the
draft for a resume), ``writer_group`` follows ``storage/groups.write_group`` (prune,
draft, write, read back, commit; any failure abandons the draft). ``leased=False``
is a writer whose lease was taken over while it went on (a stalled client): the
commit alone must keep readers right.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json

from slem_dask.storage import versions
from slem_dask.storage.errors import DamagedStoreError
from slem_dask.storage.leases import Lease, LeaseHeldError

from . import world

STORE = "sim://bucket/data/P.zarr"


class MissingChunk(DamagedStoreError):
    """A reader found a chunk of a committed version missing (it was pruned meanwhile)."""


class TornRead(AssertionError):
    """A reader saw parts of two versions: an invariant broke."""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=4096)
def chunk(content: str, i: int) -> bytes:
    return f"{content}: chunk {i}".encode() * 4


@functools.lru_cache(maxsize=4096)
def node(content: str, n: int, complete: bool) -> bytes:
    return json.dumps({"content": content, "n": n, "complete": complete,
                       "chunks": [sha(chunk(content, i)) for i in range(n)]},
                      sort_keys=True).encode()


def head_content(store: versions.VersionedStore, head) -> dict | None:
    """The head's node, checked against its record (what encode's plan reads)."""
    return json.loads(store.check(head)) if head is not None else None


def _reuse(store, draft, head, content: str, n: int) -> list[int]:
    """Chunks this draft can link from the head or from other drafts of its sequence
    number (encode.reuse_partitions): the ones left to write."""
    todo = set(range(n))
    sources = []
    if head is not None:
        meta = head_content(store, head)
        if meta["content"] == content:
            sources.append(head.version)
    sources += [v for v in store.drafts(draft.seq) if v != draft.version]
    for version in sources:
        raw = store.backend.read(f"versions/{version}/zarr.json")
        meta = json.loads(raw) if raw else None
        if not meta or meta["content"] != content:
            continue
        names = []
        for i in sorted(todo):
            if store.backend.read(f"versions/{version}/c/{i}") == chunk(content, i):
                names.append(f"c/{i}")
        if names:
            store.backend.copy_tree(f"versions/{version}", f"versions/{draft.version}", names)
            todo -= {int(name[2:]) for name in names}
    return sorted(todo)


def _write_and_commit(store, draft, content, n, todo, lease, job, prune=False):
    b, folder = store.backend, f"versions/{draft.version}"
    with store.making_room() if prune else contextlib.nullcontext():
        for i in todo:  # encode: the oldest version is pruned while the chunks are written
            b.put(f"{folder}/c/{i}", chunk(content, i))
    for i in range(n):  # read back before anything is marked complete
        if b.read(f"{folder}/c/{i}") != chunk(content, i):
            raise DamagedStoreError(f"{STORE}: chunk {i} of {draft.version} cannot be read "
                                    f"back; nothing was committed: run the job again")
    b.put(f"{folder}/zarr.json", node(content, n, True))
    if lease is not None:
        lease.check()
    return store.commit(draft, "sim", job)


def _lease(job: str, leased: bool) -> Lease | None:
    """The store's lease (None for a writer that lost it and goes on); a refusal keeps
    what the lease file held at that moment, for the checks."""
    if not leased:
        return None
    lease = Lease(STORE, job)
    try:
        return lease.acquire()
    except LeaseHeldError as exc:
        exc.lease_was = world.WORLD.server.objects.get(
            lease._backend._full(lease._key))  # the harness looks, no request
        raise


def writer_encode(content: str, n: int, job: str, leased: bool = True):
    lease = _lease(job, leased)
    try:
        store = versions.VersionedStore(STORE)
        head = store.head()
        draft = store.begin()
        store.backend.put(f"versions/{draft.version}/zarr.json", node(content, n, False))
        todo = _reuse(store, draft, head, content, n)
        meta = head_content(store, head)
        if meta is not None and meta["content"] == content and meta["complete"]:
            store.abandon(draft)
            return "up to date"
        try:
            commit = _write_and_commit(store, draft, content, n, todo, lease, job, prune=True)
        except versions.CommitConflictError:
            store.abandon(draft)
            raise
        except DamagedStoreError:
            raise
        except ValueError:
            store.abandon(draft)
            raise
        return commit.seq  # OSError and the rest: the draft stays, for a resume
    finally:
        if lease is not None:
            lease.release()


def writer_group(content: str, n: int, job: str, leased: bool = True):
    lease = _lease(job, leased)
    try:
        store = versions.VersionedStore(STORE)
        store.make_room()
        draft = store.begin()
        try:
            store.backend.put(f"versions/{draft.version}/zarr.json", node(content, n, False))
            commit = _write_and_commit(store, draft, content, n, range(n), lease, job)
        except BaseException:
            store.abandon(draft)
            raise
        return commit.seq
    finally:
        if lease is not None:
            lease.release()


def reader():
    """A snapshot read of the store (what ``resolve`` and a checked open do): (seq,
    version, content), each chunk checked against the node it was read with."""
    _, store, commit = versions.resolve(STORE)
    if commit is None:
        return None
    meta = json.loads(store.check(commit))
    if not meta["complete"]:
        raise TornRead(f"version {commit.seq} ({commit.version}) is committed incomplete")
    for i in range(meta["n"]):
        data = store.backend.read(f"versions/{commit.version}/c/{i}")
        if data is None:
            raise MissingChunk(f"{STORE}: chunk {i} of version {commit.seq} is missing")
        if sha(data) != meta["chunks"][i] or data != chunk(meta["content"], i):
            raise TornRead(f"chunk {i} read from version {commit.seq} ({commit.version}) "
                           f"is not that version's: {data[:30]!r}")
    return commit.seq, commit.version, meta["content"]


def verify():
    """What `slem-dask verify` checks of a versioned store: the head against its
    record, then every chunk. Its problems, each with the version it concerns; a
    problem is checked against the server at the moment it is found (a version that a
    newer one pruned meanwhile may be gone; one that is still kept must be whole)."""
    store = versions.VersionedStore(STORE)
    head = store.head()
    if head is None:
        return []
    try:
        meta = json.loads(store.check(head))
        for i in range(meta["n"]):
            data = store.backend.read(f"versions/{head.version}/c/{i}")
            if data is None or sha(data) != meta["chunks"][i]:
                raise MissingChunk(f"{STORE}: chunk {i} of version {head.seq} is "
                                   f"{'missing' if data is None else 'corrupt'}")
    except (versions.VersionError, MissingChunk) as exc:
        from . import checks

        server = world.WORLD.server
        recs = checks.records(server)
        if head.version in checks.kept(recs) and checks.node_problem(server, head) is None:
            raise TornRead(f"verify reported {exc} while version {head.seq} is kept and "
                           f"whole") from None
        return [str(exc)]
    return []


def collect_garbage():
    return versions.VersionedStore(STORE).collect_garbage()


def rollback(seq: int):
    return versions.VersionedStore(STORE).rollback(seq).seq
