"""Versioned stores: what readers see changes only by an atomic commit.

Every model, encoded output, search result and corpus that slem-dask writes at a
path ``P`` is a *versioned store*::

    P/commits/00000001.json        one record per commit, created atomically, never rewritten
    P/commits/.head                where the search for the head starts (:mod:`.heads`)
    P/versions/00000001-<token>/   one complete zarr v3 node per attempt (array or group)
    P/versions/00000001-<token>.slem-dask   its marker, written before anything in it

A job writes into a version folder of its own (a *draft*), invisible to readers,
then commits it: it creates ``commits/<s>.json`` naming the draft, where ``s`` is
one more than the head it started from. Creation is atomic (``link(2)`` locally,
``If-None-Match: *`` on S3), so of two jobs that started from the same head
exactly one commits; the other fails naming the winner. Hence:

* **fencing**: a job that lost its right to write (its lease taken over, its
  commit beaten) only ever wrote into its own draft, which no commit names: its
  late writes never reach readers;
* **snapshot reads**: readers resolve the head once and read that version folder,
  which nobody writes after its commit;
* **atomic, durable publish**: the path holds the previous complete version until the
  commit record exists, then the new one, on stable storage before its record is
  (``Backend.make_durable``); a job killed at any moment leaves a draft that the next
  run may reuse (copying what verifies), deleted once another commits in its place;
* **no clocks**: which draft may still commit is decided by sequence numbers,
  never by comparing times. A draft for sequence ``s`` can only ever be committed
  as ``s``; once ``commits/<s>`` names another draft it is dead and deleted. A job
  holding the lease also deletes the drafts of uncommitted numbers that killed or
  fenced jobs left, settling each with a fate file first (:mod:`.gc`);
* **idempotent commits**: each record carries a token of its job attempt, and an
  ambiguous create (a lost reply, a retry's 412, a timeout) is resolved by reading
  the record back (:meth:`VersionedStore.commit`); a draft that a record names is
  never deleted, and a folder is deleted only when its name is a version's
  (``<seq>-<12 hex digits>``) and slem-dask's marker is beside it (or, pruned, its
  own commit record names it): nothing that slem-dask did not write is touched.
  Commit records naming anything else are damaged metadata, refused by readers.

The last ``keep`` committed versions stay readable (``SLEM_DASK_KEEP_VERSIONS``,
default 3) until the next job that writes begins its draft: it prunes all but the last
``keep - 1`` (:meth:`VersionedStore.make_room`, or :meth:`VersionedStore.making_room`
while it writes), so storage holds ``keep`` versions, a draft included, plus what a job
writes while the oldest is being deleted, and a reader has until two newer versions are
committed and a third job begins writing; pruned versions' records stay, for the history.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from . import gc
from ..backends.backend import Backend, check_conditional_writes
from .heads import COMMITS, commit_name, commit_names, last_commit_name, write_hint
from .records import (
    FORMAT,  # noqa: F401
    VERSION_NAME,  # noqa: F401
    VERSIONS,
    Commit,
    DamagedCommitError,  # noqa: F401
    VersionError,
    _checksum,
    draft_seq,
    version_folder_seq,
)
from .markers import MARKER, check_own_folders, is_link, listed, marker_document, trusted
from .publish import CommitConflictError, CommitUnknownError, publish
from ..backends.registry import backend_for
from .rollback import rollback_to
from .errors import rollback_advice
from .rootmarker import mark_after_commit
from .leases import Lease
from .transaction import INTERRUPTED_ABANDON_WAIT, Transaction

__all__ = [
    "Commit",
    "Draft",
    "VersionedStore",
    "CommitConflictError",
    "VersionError",
    "DamagedCommitError",
    "CommitUnknownError",
    "resolve",
    "KEEP_VERSIONS",
]

KEEP_VERSIONS = max(2, int(os.environ.get("SLEM_DASK_KEEP_VERSIONS", "3")))


@dataclass(frozen=True)
class Draft:
    """A version folder being written by one job, to be committed as ``seq``."""

    seq: int
    version: str
    location: str  # what zarr opens


class VersionedStore:
    """The versioned store at a canonical path (see the module docstring)."""

    # for :mod:`.gc`, which does not import this module
    seq_of = staticmethod(draft_seq)
    listed_versions = staticmethod(listed)

    def __init__(self, path):
        from ..backends.paths import canonical

        self.path = canonical(path)
        self.backend: Backend = backend_for(self.path.url)

    # reading ---------------------------------------------------------------------------
    def is_versioned(self) -> bool:
        """Whether the store has a committed version (or anything under commits/)."""
        name, listing = last_commit_name(self.backend, self._seen_key())
        return name is not None or bool(listing)

    def has_history(self) -> bool:
        """Whether slem-dask ever wrote here as a versioned store (committed or not):
        a commit record, a version folder begun with its marker, or a draft's fate file."""
        return self._history_besides(None)

    def commits(self) -> list[Commit]:
        """Every commit record (the whole history: one listing of commits/)."""
        return [self._read_commit(name) for name in commit_names(self.backend)]

    def _read_commit(self, name: str) -> Commit:
        key = f"{COMMITS}/{name}"
        data = self.backend.read(key)
        if data is None:
            raise DamagedCommitError(f"the commit record {self._where(key)!r} vanished")
        return Commit.from_json(data, self._where(key))

    def commit_at(self, seq: int) -> Commit | None:
        key = f"{COMMITS}/{commit_name(seq)}"
        data = self.backend.read(key)
        return None if data is None else Commit.from_json(data, self._where(key))

    def head(self) -> Commit | None:
        name = last_commit_name(self.backend, self._seen_key())[0]
        return self._read_commit(name) if name else None

    def head_seq(self) -> int:
        """The head's sequence number (0: none), without reading its record
        (:mod:`.heads`: a few requests whatever the length of the history)."""
        name = last_commit_name(self.backend, self._seen_key())[0]
        return int(name[:-5]) if name else 0

    def _seen_key(self) -> tuple:
        return (repr(self.backend), self.path.url)

    def location(self, version: str) -> str:
        self._folder(version)
        return self.path.child(VERSIONS).child(version).location

    def _folder(self, version: str) -> str:
        """The key of a version folder, refused for any name that is not a version's
        (so nothing outside ``P/versions`` is ever read or deleted through it)."""
        if draft_seq(version) is None:
            raise DamagedCommitError(
                f"{str(self.path)!r}: {version!r} is not the name of a version folder "
                f"(<sequence number>-<12 hex digits> directly under {VERSIONS}/); "
                f"slem-dask neither reads nor deletes it"
            )
        return f"{VERSIONS}/{version}"

    def _marker(self, version: str) -> str:
        return self._folder(version) + MARKER

    def exists(self, version: str) -> bool:
        return self.backend.exists(f"{self._folder(version)}/zarr.json")

    def check(self, commit: Commit) -> bytes:
        """The version's zarr.json, after checking it is the one that was committed."""
        key = f"{self._folder(commit.version)}/zarr.json"
        data = self.backend.read(key)
        if data is None and self.head_seq() - commit.seq >= KEEP_VERSIONS - 1:
            raise VersionError(  # not damage: what storage does to old versions
                f"{str(self.path)!r}: version {commit.seq} ({commit.version}) was pruned "
                f"(storage keeps the last {KEEP_VERSIONS} versions, a new job's draft "
                f"included); read a version that is kept (`slem-dask versions {self.path}`)"
            )
        if data is None:
            raise DamagedCommitError(
                f"{str(self.path)!r}: version {commit.seq} ({commit.version}) has no "
                f"zarr.json: it was pruned or deleted; read a newer version "
                f"(`slem-dask versions {self.path}`)"
            )
        if _checksum(data) != commit.checksum:
            raise DamagedCommitError(
                f"{str(self.path)!r}: the metadata document 'zarr.json' of version "
                f"{commit.seq} does not match its commit record (edited or damaged): write "
                f"it again{rollback_advice(self.path, commit.seq)}"
            )
        return data

    def _where(self, key: str) -> str:
        return str(self.path.child(key))

    # writing ---------------------------------------------------------------------------
    def begin(self) -> Draft:
        """A new draft, to be committed as the version after the current head. Refused
        up front where the storage cannot commit atomically."""
        if not self.backend.atomic_create:
            from ..backends.backend import StorageConfigError

            raise StorageConfigError(
                f"{str(self.path)!r}: this storage offers no atomic create-if-absent, so "
                f"slem-dask cannot commit versions there safely; write to a local path or "
                f"to s3://, gs:// or az://"
            )
        check_own_folders(self)  # no folder that another store may share
        self._probe_conditional_writes()
        head = self.head()
        seq = (head.seq if head else 0) + 1
        version = f"{seq:08d}-{uuid.uuid4().hex[:12]}"
        # before anything of the draft: a folder without its marker is never a draft
        self.backend.put(self._marker(version), marker_document(self, version))
        return Draft(seq, version, self.location(version))

    def _probe_conditional_writes(self) -> None:
        """Refuse a store that ignores conditional writes (once per bucket or file
        system). The probe key goes beside ``P``, where its lease goes: deleting it
        leaves no empty folder at ``P`` (SeaweedFS would list one, and ``P`` would then
        look like someone else's)."""
        check_conditional_writes(backend_for(self.path.parent.url), str(self.path))

    def make_room(self, mine: str | None = None) -> list[str]:
        """Before a job that will commit writes its draft: prune all but the last
        ``keep - 1`` versions. The oldest kept version goes before the new one is
        written, not after its commit: storage then holds ``keep`` versions at most,
        the draft included, and a local write reuses the memory and disk that version
        held (benchmarks/results/history.md, "Integrity overhead"). A job that finds nothing
        to write never calls it, so re-runs do not thin the history. The caller holds
        the store's lease: drafts of killed or fenced jobs, but ``mine`` (the caller's
        own draft, once it reused their chunks), are deleted too (:mod:`.gc`)."""
        return gc.collect(self, KEEP_VERSIONS - 1, mine=mine, leased=True)

    @contextlib.contextmanager
    def making_room(self, mine: str | None = None):
        """:meth:`make_room` in a thread while the body writes the draft: deleting a
        large version (0.5 s of unlinks for 2 GB on local disk, batches of DELETEs on
        S3) then costs the job no wall time, and a local write takes the pages it frees
        as they are freed. Only versions older than the kept ones are touched, never the
        draft. The body's error wins (it waits seconds at most for the pruning); after a
        body that succeeded, a pruning that failed is raised (before the caller commits)."""
        failure: list[BaseException] = []

        def prune() -> None:
            try:
                self.make_room(mine)
            except BaseException as exc:  # noqa: BLE001 - handed to the job's thread
                failure.append(exc)

        thread = threading.Thread(target=prune, name="slem-dask-make-room", daemon=True)
        thread.start()
        failed = True
        try:
            yield
            failed = False
        finally:  # a job that failed (Ctrl-C, its lease lost) ends within seconds: a pruning
            # in a request to a silent store would hold it to that request's deadline (145 s
            # on Azurite, 2026-11-30); left running, it prunes only what nothing needs
            thread.join(INTERRUPTED_ABANDON_WAIT if failed else None)
        if failure:
            raise failure[0]

    def drafts(self, seq: int) -> list[str]:
        """Other drafts that may still be committed as ``seq`` (left by killed or
        stalled jobs): their chunks may be reused, after checks, never adopted."""
        return trusted(self, self.backend.list(VERSIONS), seq)

    def commit(
        self, draft: Draft, kind: str, job: str, summary: dict | None = None, source: str = ""
    ) -> Commit:
        """Make ``draft`` the head, atomically, or raise :class:`CommitConflictError`
        if another job committed its sequence number first."""
        data = self.backend.read(f"{self._folder(draft.version)}/zarr.json")
        if data is None and self.commit_at(draft.seq) is not None:
            self._raise_conflict(draft.seq)  # the winner's commit deleted this dead draft
        if data is None and gc.fate_of(self.backend, draft.version) == gc.DEAD:
            raise gc.DraftFencedError(gc.fenced_message(self, draft.version))
        if data is None:
            raise DamagedCommitError(
                f"{str(self.path)!r}: the draft {draft.version} has no "
                f"zarr.json; nothing was committed"
            )
        self.backend.make_durable(self._folder(draft.version))  # a power loss keeps it
        if gc.claim(self.backend, draft.version, gc.COMMIT) != gc.COMMIT:
            if self.commit_at(draft.seq) is not None:
                self._raise_conflict(draft.seq)  # the winner deleted this dead draft
            raise gc.DraftFencedError(gc.fenced_message(self, draft.version))
        commit = self._create(
            draft.seq, draft.version, kind, job, _checksum(data), summary or {}, source
        )
        self._clean_after_commit(draft.seq, draft.version)
        return commit

    def _clean_after_commit(self, seq: int, version: str) -> None:
        """Delete ``seq``'s other drafts (now dead) and settled fate files. The commit
        stands whatever happens here: a storage failure leaves that garbage to the next
        job that writes (:func:`.gc.collect`), and must not fail a job whose version
        readers see (it would report a failure, and abandon its draft). Any failure, as
        for the head hint and the root marker: botocore's errors are no OSError."""
        try:
            gc.after_commit(self, seq, version)
        except Exception:  # noqa: BLE001 - the commit stands: its job succeeds
            pass

    def _create(self, seq, version, kind, job, checksum, summary, source) -> Commit:
        record = Commit(
            seq,
            version,
            kind,
            job,
            socket.gethostname(),
            checksum,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            summary,
            source,
            token=uuid.uuid4().hex,
        )
        if not self._publish(seq, record):
            self._raise_conflict(seq)
        write_hint(self.backend, seq)  # where the next head search starts
        mark_after_commit(self, kind)  # zarr.open(P) then names the right call
        return record

    def _publish(self, seq: int, record: Commit) -> bool:
        """Create ``commits/<seq>.json`` holding ``record``: True once it holds exactly
        these bytes (its token makes them this attempt's alone), False once it holds
        another record. Whatever the backend answered (True, an error, or False from one
        that does not read back), the record is read back: one read per commit, which
        also catches an overwrite on a store whose lack of conditional writes was
        accepted. If it is absent the same bytes are created again, which cannot commit
        anything twice."""
        self._probe_conditional_writes()
        return publish(self.backend, self.path, seq, record.to_json())

    def _raise_conflict(self, seq: int):
        winner = self.commit_at(seq)
        by = (
            f"{winner.job} on host {winner.host}, at {winner.created} by its clock"
            if winner
            else "another job"
        )
        raise CommitConflictError(
            f"{str(self.path)!r}: version {seq} was committed by {by} while this job "
            f"ran; this job's writes were never visible and are discarded: see that "
            f"version with `slem-dask versions {self.path}` before you run this job again"
        )

    def abandon(self, draft: Draft, keep_fate: bool = False) -> None:
        """Delete a draft that will not be committed, unless its commit record names it
        after all (a commit whose reply was lost): then it is a version, and stays.

        Its fate file is settled first (``dead``, or this job's own ``commit`` claim) and
        KEPT, like a commit record: a write of this job still in flight (a request that
        timed out, a worker's task still running) may land after any clean-up and regrow
        the folder without its marker; that file proves the regrowth slem-dask's, and
        the next collection deletes it (:mod:`.gc`).

        Except for a store's first draft, when nothing else is there and no write of its
        job can land any more (not ``keep_fate``): then no store is left at all.

        A draft whose job claimed its commit (fate ``commit``) is kept while no record
        of its number names another: the outcome of its commit is unknown (its record
        may land late), and only that commit's sequence number, once another draft
        takes it, makes it dead (:func:`.gc.collect`)."""
        if self._committed(draft.version):
            return
        if gc.claim(self.backend, draft.version, gc.DEAD) == gc.COMMIT:
            record = self.commit_at(draft.seq)  # this job began its commit: unless
            if record is None:  # another draft took the number, its record may land
                return  # late (a lost reply, a 5xx after it was applied): kept
        self.delete_version(draft.version)
        if not keep_fate and not self._history_besides(draft.version):
            self.backend.delete(f"{gc.FATES}/{draft.version}")
            self.backend.prune_empty()

    def _history_besides(self, version: str | None) -> bool:
        """:meth:`has_history`, not counting ``version``'s fate file (None: counting all).
        Trusted by content only, never by a name that a user's folder can hold: a commit
        record that reads back whole, a marker that names its folder and this store
        (:func:`.markers.proves`), a fate file holding a fate."""
        return (
            self._a_record_reads()
            or bool(trusted(self, self.backend.list(VERSIONS)))
            or any(
                draft_seq(v) is not None
                and v != version
                and gc.fate_of(self.backend, v) in (gc.COMMIT, gc.DEAD)
                for v in self.backend.list(gc.FATES)
            )
        )

    def _a_record_reads(self) -> bool:
        """Whether a commit record of this store reads back whole (its checksum holds):
        the head's, or where that one is damaged, any other."""
        name, listing = last_commit_name(self.backend, self._seen_key())
        if name is None:
            return False
        try:
            self._read_commit(name)
            return True
        except DamagedCommitError:  # rare: then the others, newest first
            others = reversed(listing or commit_names(self.backend))
        for other in others:
            try:
                self._read_commit(other)
                return True
            except DamagedCommitError:
                continue
        return False

    def _committed(self, version: str) -> bool:
        """Whether the commit record of the version's own sequence number names it (the
        first record to name a version is always that one)."""
        record = self.commit_at(self._seq(version))
        return record is not None and record.version == version

    def _seq(self, version: str) -> int:
        self._folder(version)
        seq = draft_seq(version)
        assert seq is not None  # _folder refused any other name
        return seq

    def delete_version(self, version: str) -> None:
        """Its zarr.json, the folder, then its marker: a version deleted in part (a
        crash, a failed request) never looks whole to a reader or a rollback, and a
        crash leaves a marker that the next collection removes, never an unmarked
        remnant."""
        folder = self._folder(version)
        if is_link(self, version):
            return  # a user's link: neither it nor what it leads to is the store's
        self.backend.delete(f"{folder}/zarr.json")
        self.backend.remove_tree(folder)
        self.backend.delete(self._marker(version))

    def transaction(self, job: str, lease: Lease | None = None) -> Transaction:
        """``job``'s write of this store (:mod:`.transaction`), under its lease."""
        return Transaction(self, job, lease)

    def rollback(self, seq: int, job: str = "slem-dask rollback", check=None) -> Commit:
        """Commit version ``seq``'s content again as the new head, or return the head if it
        holds it (``seq``, or a rollback to it), in a transaction like any job's commit
        (:func:`.rollback.rollback_to`, and its ``check``: ``storage.rollback``'s)."""
        with self.transaction(job) as tx:
            return rollback_to(tx, seq, check)

    def collect_garbage(self, keep: int = KEEP_VERSIONS) -> list[str]:
        """Delete dead drafts and versions older than the last ``keep`` commits (unless
        a kept commit names them), decided by sequence numbers alone (:func:`.gc.collect`;
        drafts of sequences not committed yet are left: only a lease holder may judge
        their jobs dead)."""
        return gc.collect(self, keep)


def resolve(path) -> tuple[str, VersionedStore | None, Commit | None]:
    """What to open for ``path``: (zarr location, its versioned store, its commit).

    ``P`` of a versioned store gives its head version; ``P/member`` a member of the
    head version of a versioned group (a corpus' ``negatives``);
    ``P/versions/<id>`` that version, if it was committed; anything else is a
    plain zarr node, opened as it is (store and commit None).
    """
    from ..backends.paths import canonical

    path = canonical(path)
    store = VersionedStore(path)
    head = store.head()  # a few requests, whatever the length of the history
    if head is not None:
        return store.location(head.version), store, head
    if (seq := version_folder_seq(path)) is not None:
        owner = VersionedStore(path.parent.parent)
        if owner.is_versioned():
            commit = owner.commit_at(seq)
            if commit is None or commit.version != path.name:
                raise VersionError(
                    f"{str(path)!r} is a version folder that was never committed (a draft "
                    f"of a job that failed, was interrupted or lost its race); read the "
                    f"store {str(owner.path)!r} itself, or a version listed by "
                    f"`slem-dask versions {owner.path}`"
                )
            return path.location, owner, commit
    if path.parent.url != path.url:
        parent = VersionedStore(path.parent)
        head = parent.head()
        if head is not None:
            return (
                parent.path.child(VERSIONS).child(head.version).child(path.name).location,
                parent,
                head,
            )
    return path.location, None, None
