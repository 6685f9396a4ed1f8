"""The commands the simulated actors run, written the way slem-dask's jobs use the
protocol through its transaction (:mod:`slem_dask.storage.versioning.transaction`).

A version's node is a small stand-in for a zarr node: ``zarr.json`` (the content's
name, whether it is complete, the sha256 of each chunk) and chunks ``c/<i>``. The
sequence of calls is the jobs': ``writer_encode`` follows ``pipeline/encode.py`` (up
to date from the committed head alone, before any lease; else under the lease: draft
begun with its marker, its metadata created before anything else (only if absent:
a late copy never overwrites the complete one), chunks of the head
and of other drafts of its number reused, the oldest version pruned by
``making_room(mine=draft)`` while the chunks are written, each chunk write preceded by
the worker's check that the draft is alive, a fenced draft left to the job that fenced
it, a failed write keeping the draft for a resume), ``writer_group`` follows
``storage/groups.write_group`` (make room, draft, write the chunks, then the node's
``zarr.json`` once, read back, commit; any failure discards the draft). No key of a
draft is written with a plain write once it held other bytes (an encode's first
``zarr.json`` is a create): a late request that overtakes a newer one
(``late_overtakes``) cannot undo it. ``leased=False`` is a writer whose lease was taken over while it
went on (a stalled client): the fate files and the commit alone must keep readers
right.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json

from slem_dask.storage.versioning import gc
from slem_dask.storage.versioning import versions
from slem_dask.storage.versioning.errors import DamagedStoreError
from slem_dask.storage.versioning.leases import LeaseHeldError

from . import world

STORE = "sim://bucket/data/P.zarr"
#: a second store beside it (local disk: its versions/ a symlink to P's, issue 38 item 5)
OTHER = "sim://bucket/data/Q.zarr"


def lease_key(store: str) -> str:
    """The server's key of ``store``'s lease file."""
    parent, name = store[len("sim://") :].rsplit("/", 1)
    return f"{parent}/.{name}.slem-dask-lease"


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
    return json.dumps(
        {
            "content": content,
            "n": n,
            "complete": complete,
            "chunks": [sha(chunk(content, i)) for i in range(n)],
        },
        sort_keys=True,
    ).encode()


def head_content(store: versions.VersionedStore, head) -> dict | None:
    """The head's node, checked against its record (what encode's plan reads)."""
    return json.loads(store.check(head)) if head is not None else None


def _reuse(tx, head, content: str, n: int) -> list[int]:
    """Chunks the transaction's draft can link from the head or from other drafts of its
    sequence number (encode.reuse_partitions): the ones left to write."""
    store, draft = tx.store, tx.draft
    todo = set(range(n))
    sources = []
    if head is not None:
        meta = head_content(store, head)
        if meta["content"] == content:
            sources.append(head.version)
    sources += tx.others()
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


def _write(tx, content, todo, fenced_check=False):
    """The chunks left to write; an encode's worker first checks that its draft still
    has its zarr.json (``gc.draft_alive``): a fenced job never grows a deleted draft."""
    b, folder = tx.store.backend, f"versions/{tx.draft.version}"
    for i in todo:
        if fenced_check and not b.exists(f"{folder}/zarr.json"):
            raise gc.DraftFencedError(
                f"{STORE}: this job's draft was deleted by another "
                f"slem-dask job; chunk {i} was not written"
            )
        _put_in_draft(tx, f"c/{i}", chunk(content, i))


def _put_in_draft(tx, name: str, data: bytes, create: bool = False) -> None:
    """A write into the transaction's draft (``create``: only if absent, as
    ``create_output`` writes an encode's first ``zarr.json``: a late copy of it never
    overwrites the complete one). On local disk a job whose draft another job
    deleted meanwhile (zarr's store would make the folder again; LocalBackend's private
    file went with it) fails FileNotFoundError: told as encode tells a failed task."""
    key = f"versions/{tx.draft.version}/{name}"
    try:
        if create and not tx.store.backend.create(key, data):
            raise DamagedStoreError(f"{STORE}: {key} was there before this job created it")
        if not create:
            tx.store.backend.put(key, data)
    except FileNotFoundError:
        tx.raise_if_fenced()
        raise


def _check_and_commit(tx, content, n):
    """Read back every chunk, mark the node complete, check the lease, commit (the
    order of encode and write_group)."""
    b, folder = tx.store.backend, f"versions/{tx.draft.version}"
    tx.check_lease()  # first: a job that lost its lease must not blame the storage
    for i in range(n):  # read back before anything is marked complete
        if b.read(f"{folder}/c/{i}") != chunk(content, i):
            tx.raise_if_fenced()
            raise DamagedStoreError(
                f"{STORE}: chunk {i} of {tx.draft.version} cannot be read "
                f"back; nothing was committed: run the job again"
            )
    _put_in_draft(tx, "zarr.json", node(content, n, True))
    return tx.commit("sim")


class _LostLease:
    """The lease of a writer that lost it and goes on (a stalled client that never
    looks): its checks pass, and it holds nothing to release."""

    def check(self) -> None:
        pass


@contextlib.contextmanager
def _transaction(job: str, leased: bool, path: str = STORE):
    """The job's transaction of the store (its lease taken, or for ``leased=False`` a
    lost one); a refusal keeps what the lease file held at that moment, for the checks."""
    store = versions.VersionedStore(path)
    tx = store.transaction(job, lease=None if leased else _LostLease())
    try:
        tx.__enter__()
    except LeaseHeldError as exc:
        exc.lease_was = world.WORLD.server.objects.get(lease_key(path))  # the harness looks
        raise
    try:
        yield tx
    finally:
        if leased:
            tx.lease.release()


def _up_to_date(content: str) -> bool:
    """encode's check before any lease or draft: the committed head holds this content,
    complete (an up-to-date re-run writes nothing)."""
    store = versions.VersionedStore(STORE)
    head = store.head()
    if head is None:
        return False
    meta = head_content(store, head)
    if meta["content"] != content or not meta["complete"]:
        return False
    return all(
        store.backend.read(f"versions/{head.version}/c/{i}") == chunk(content, i)
        for i in range(meta["n"])
    )


def writer_encode(content: str, n: int, job: str, leased: bool = True):
    """pipeline/encode.py: up to date from the head alone; else, under the lease: begin,
    reuse, write while making room (``mine``: its draft), read back, commit."""
    if _up_to_date(content):
        return "up to date"
    with _transaction(job, leased) as tx:
        head = tx.store.head()
        tx.begin()
        _put_in_draft(tx, "zarr.json", node(content, n, False), create=True)
        todo = _reuse(tx, head, content, n)
        meta = head_content(tx.store, head)
        if meta is not None and meta["content"] == content and meta["complete"] and not todo:
            tx.discard()  # nothing to write: the head stays as it is
            return "up to date"
        try:
            with tx.making_room():
                _write(tx, content, todo, fenced_check=True)
            commit = _check_and_commit(tx, content, n)
        except versions.CommitConflictError:
            tx.discard()
            raise
        except gc.DraftFencedError:  # its draft is another job's to delete: left alone
            tx.fenced()  # dead by its number if that job committed: deleted, a conflict
        except DamagedStoreError:
            raise
        except ValueError:
            tx.discard()
            raise
        return commit.seq  # OSError and the rest: the draft stays, for a resume


def writer_group(content: str, n: int, job: str, leased: bool = True, path: str = STORE):
    """storage/groups.write_group: in its transaction, make room, begin, write, read
    back, commit; any failure discards the draft (small: nothing worth resuming)."""
    with _transaction(job, leased, path) as tx:
        tx.make_room()  # always commits: the oldest version goes first
        tx.begin()
        with tx.discarded_on_failure():  # its zarr.json once, last (_check_and_commit)
            _write(tx, content, range(n))
            commit = _check_and_commit(tx, content, n)
        return commit.seq


def reader():
    """A snapshot read of the store (what ``resolve`` and a checked open do): (seq,
    version, content), each chunk checked against the node it was read with."""
    floor = _committed_head()
    _, store, commit = versions.resolve(STORE)
    if (commit.seq if commit else 0) < floor:  # the head hint is a lower bound, no more
        raise TornRead(
            f"read version {commit.seq if commit else None} though version "
            f"{floor} was committed before the read began"
        )
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
            raise TornRead(
                f"chunk {i} read from version {commit.seq} ({commit.version}) "
                f"is not that version's: {data[:30]!r}"
            )
    return commit.seq, commit.version, meta["content"]


def _committed_head() -> int:
    """The newest commit record on the server now (the harness looks: no request)."""
    folder = STORE[len("sim://") :] + "/commits/"
    names = [k[len(folder) :] for k in world.WORLD.server.under(folder[:-1])]
    return max((int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()), default=0)


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
                raise MissingChunk(
                    f"{STORE}: chunk {i} of version {head.seq} is "
                    f"{'missing' if data is None else 'corrupt'}"
                )
    except (versions.VersionError, MissingChunk) as exc:
        from . import checks

        server = world.WORLD.server
        recs = checks.records(server)
        if head.version in checks.kept(recs) and checks.node_problem(server, head) is None:
            raise TornRead(
                f"verify reported {exc} while version {head.seq} is kept and whole"
            ) from None
        return [str(exc)]
    return []


def collect_garbage():
    return versions.VersionedStore(STORE).collect_garbage()


def rollback(seq: int):
    return versions.VersionedStore(STORE).rollback(seq).seq
