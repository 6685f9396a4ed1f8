"""Versioned stores: what readers see changes only by an atomic commit.

Every model, encoded output, search result and corpus that slem-dask writes at a
path ``P`` is a *versioned store*::

    P/commits/00000001.json        one record per commit, created atomically, never rewritten
    P/versions/00000001-<token>/   one complete zarr v3 node per attempt (array or group)

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
* **atomic publish**: the path holds the previous complete version until the
  commit record exists, then the new one; a job killed at any moment leaves a
  draft that the next run may reuse (copying what verifies) and that is deleted
  once another draft commits in its place;
* **no clocks**: which draft may still commit is decided by sequence numbers,
  never by comparing times. A draft for sequence ``s`` can only ever be committed
  as ``s``; once ``commits/<s>`` names another draft it is dead and deleted.

The last ``keep`` committed versions stay readable (``SLEM_DASK_KEEP_VERSIONS``,
default 3) until the next job that writes begins its draft: it prunes all but the last
``keep - 1`` (:meth:`VersionedStore.make_room`, or :meth:`VersionedStore.making_room`
while it writes), so storage holds ``keep`` versions, a draft included, plus what a job
writes while the oldest is being deleted, and a reader has until two newer versions are
committed and a third job begins writing; pruned versions' records stay, for the history.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from .backend import Backend, backend_for
from .errors import IntegrityError

__all__ = ["Commit", "Draft", "VersionedStore", "CommitConflictError", "VersionError",
           "DamagedCommitError", "resolve",
           "KEEP_VERSIONS"]

COMMITS, VERSIONS = "commits", "versions"
FORMAT = 1
KEEP_VERSIONS = max(2, int(os.environ.get("SLEM_DASK_KEEP_VERSIONS", "3")))


class CommitConflictError(IntegrityError):
    """Another job committed the version this job meant to commit; nothing of this job
    is visible to readers."""


class VersionError(ValueError):
    """A version that cannot be read as asked (never committed, pruned)."""


class DamagedCommitError(VersionError):
    """A commit record cannot be read, or its version folder does not match it."""


def _checksum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Commit:
    """One commit record: version ``seq`` of a store is the folder ``version``."""

    seq: int
    version: str
    kind: str
    job: str
    host: str
    checksum: str  # sha256 of the version's zarr.json at commit
    created: str  # as the committing host wrote it: shown, never compared
    summary: dict
    source: str = ""  # "rollback to N" and the like

    def to_json(self) -> bytes:
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__}
        fields["format"] = FORMAT
        fields["record_checksum"] = _checksum(json.dumps(fields, sort_keys=True).encode())
        return json.dumps(fields, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> "Commit":
        try:
            fields = json.loads(data)
            recorded = fields.pop("record_checksum")
            if _checksum(json.dumps(fields, sort_keys=True).encode()) != recorded:
                raise ValueError("its checksum does not match its content")
            fields.pop("format")
            return cls(**fields)
        except (ValueError, KeyError, TypeError) as exc:
            raise DamagedCommitError(
                f"the commit record {where!r} cannot be read ({exc}); the store's history "
                f"is damaged: restore that file from a copy") from None


@dataclass(frozen=True)
class Draft:
    """A version folder being written by one job, to be committed as ``seq``."""

    seq: int
    version: str
    location: str  # what zarr opens


def draft_seq(version: str) -> int | None:
    head, _, token = version.partition("-")
    return int(head) if head.isdigit() and token else None


#: The newest commit's sequence number this process saw, per store: where the next
#: search for the head starts (:meth:`VersionedStore._last_commit_name`).
_HEAD_SEEN: dict = {}


class VersionedStore:
    """The versioned store at a canonical path (see the module docstring)."""

    def __init__(self, path):
        from .paths import canonical

        self.path = canonical(path)
        self.backend: Backend = backend_for(self.path.url)

    # reading ---------------------------------------------------------------------------
    def is_versioned(self) -> bool:
        """Whether the store has a committed version."""
        if self._hint_key() in _HEAD_SEEN:  # one short listing, from the head seen
            if self._last_commit_name() is not None:
                return True
        return bool(self.backend.list(COMMITS))

    def has_history(self) -> bool:
        """Whether slem-dask ever wrote here as a versioned store (committed or not)."""
        return self.is_versioned() or any(draft_seq(v) is not None
                                          for v in self.backend.list(VERSIONS))

    def commits(self) -> list[Commit]:
        return [self._read_commit(name) for name in self._commit_names()]

    def _commit_names(self, after: str | None = None) -> list[str]:
        names = self.backend.list(COMMITS) if after is None else \
            self.backend.list_after(COMMITS, after)
        return [n for n in names if n.endswith(".json") and n[:-5].isdigit()]

    def _read_commit(self, name: str) -> Commit:
        key = f"{COMMITS}/{name}"
        data = self.backend.read(key)
        if data is None:
            raise DamagedCommitError(f"the commit record {self._where(key)!r} vanished")
        return Commit.from_json(data, self._where(key))

    def commit_at(self, seq: int) -> Commit | None:
        data = self.backend.read(f"{COMMITS}/{seq:08d}.json")
        return None if data is None else Commit.from_json(data, self._where(f"{COMMITS}/{seq:08d}.json"))

    def head(self) -> Commit | None:
        name = self._last_commit_name()
        return self._read_commit(name) if name else None

    def _last_commit_name(self) -> str | None:
        """The newest commit record's name, in one short listing whatever the length of
        the history: listed from the head this process last saw on (the names sort by
        sequence number). If that lists nothing, the record seen is gone (the store was
        deleted, or replaced by a shorter history): the whole listing says what is there.
        A hint that is wrong in any way costs one more listing, never a wrong head."""
        seen = _HEAD_SEEN.get(self._hint_key())
        names = self._commit_names(after=f"{seen - 1:08d}.json") if seen else []
        if not names:
            names = self._commit_names()
        if names:
            _HEAD_SEEN[self._hint_key()] = int(names[-1][:-5])
        return names[-1] if names else None

    def _hint_key(self) -> tuple:
        return (repr(self.backend), self.path.url)

    def location(self, version: str) -> str:
        return self.path.child(VERSIONS).child(version).location

    def exists(self, version: str) -> bool:
        return self.backend.exists(f"{VERSIONS}/{version}/zarr.json")

    def check(self, commit: Commit) -> bytes:
        """The version's zarr.json, after checking it is the one that was committed."""
        key = f"{VERSIONS}/{commit.version}/zarr.json"
        data = self.backend.read(key)
        if data is None:
            raise DamagedCommitError(
                f"{str(self.path)!r}: version {commit.seq} ({commit.version}) has no "
                f"zarr.json: it was pruned or deleted; read a newer version "
                f"(`slem-dask versions {self.path}`)")
        if _checksum(data) != commit.checksum:
            raise DamagedCommitError(
                f"{str(self.path)!r}: the metadata document 'zarr.json' of version "
                f"{commit.seq} does not match its commit record (edited or damaged); roll "
                f"back to an earlier version "
                f"(`slem-dask rollback {self.path} --to N`) or write it again")
        return data

    def _where(self, key: str) -> str:
        return str(self.path.child(key))

    # writing ---------------------------------------------------------------------------
    def begin(self) -> Draft:
        """A new draft, to be committed as the version after the current head. Refused
        up front where the storage cannot commit atomically."""
        if not self.backend.atomic_create:
            from .backend import StorageConfigError

            raise StorageConfigError(
                f"{str(self.path)!r}: this storage offers no atomic create-if-absent, so "
                f"slem-dask cannot commit versions there safely; write to a local path or "
                f"to s3://")
        head = self.head()
        seq = (head.seq if head else 0) + 1
        version = f"{seq:08d}-{uuid.uuid4().hex[:12]}"
        return Draft(seq, version, self.location(version))

    def make_room(self) -> list[str]:
        """Before a job that will commit writes its draft: prune all but the last
        ``keep - 1`` versions. The oldest kept version goes before the new one is
        written, not after its commit: storage then holds ``keep`` versions at most,
        the draft included, and a local write reuses the memory and disk that version
        held (README, "What the integrity guarantees cost"). A job that finds nothing
        to write never calls it, so re-runs do not thin the history."""
        return self.collect_garbage(keep=KEEP_VERSIONS - 1)

    @contextlib.contextmanager
    def making_room(self):
        """:meth:`make_room` in a thread while the body writes the draft: deleting a
        large version (0.5 s of unlinks for 2 GB on local disk, batches of DELETEs on
        S3) then costs the job no wall time, and a local write takes the pages it frees
        as they are freed. Only versions older than the kept ones are touched, never the
        draft. The body's error wins; after a body that succeeded, a pruning that failed
        is raised (before the caller commits)."""
        failure: list[BaseException] = []

        def prune() -> None:
            try:
                self.make_room()
            except BaseException as exc:  # noqa: BLE001 - handed to the job's thread
                failure.append(exc)

        thread = threading.Thread(target=prune, name="slem-dask-make-room", daemon=True)
        thread.start()
        try:
            yield
        finally:
            thread.join()
        if failure:
            raise failure[0]

    def drafts(self, seq: int) -> list[str]:
        """Other drafts that may still be committed as ``seq`` (left by killed or
        stalled jobs): their chunks may be reused, after checks, never adopted."""
        return [v for v in self.backend.list(VERSIONS) if draft_seq(v) == seq]

    def commit(self, draft: Draft, kind: str, job: str, summary: dict | None = None,
               source: str = "") -> Commit:
        """Make ``draft`` the head, atomically, or raise :class:`CommitConflictError`
        if another job committed its sequence number first."""
        data = self.backend.read(f"{VERSIONS}/{draft.version}/zarr.json")
        if data is None and self.commit_at(draft.seq) is not None:
            self._raise_conflict(draft.seq)  # the winner's commit deleted this dead draft
        if data is None:
            raise DamagedCommitError(f"{str(self.path)!r}: the draft {draft.version} has no "
                                     f"zarr.json; nothing was committed")
        commit = self._create(draft.seq, draft.version, kind, job, _checksum(data),
                              summary or {}, source)
        for version in self.drafts(draft.seq):  # dead: their number is taken (one listing)
            if version != draft.version:
                self.backend.remove_tree(f"{VERSIONS}/{version}")
        return commit

    def _create(self, seq, version, kind, job, checksum, summary, source) -> Commit:
        record = Commit(seq, version, kind, job, socket.gethostname(), checksum,
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), summary, source)
        if not self.backend.create(f"{COMMITS}/{seq:08d}.json", record.to_json()):
            self._raise_conflict(seq)
        return record

    def _raise_conflict(self, seq: int):
        winner = self.commit_at(seq)
        by = f"{winner.job} on host {winner.host}, at {winner.created} by its clock" \
            if winner else "another job"
        raise CommitConflictError(
            f"{str(self.path)!r}: version {seq} was committed by {by} while this job "
            f"ran; this job's writes were never visible and are discarded: run it "
            f"again to build on that version")

    def abandon(self, draft: Draft) -> None:
        """Delete a draft that will not be committed (and the store's folder, if that
        leaves nothing in it)."""
        self.backend.remove_tree(f"{VERSIONS}/{draft.version}")
        if not self.has_history():
            self.backend.prune_empty()

    def rollback(self, seq: int, job: str = "slem-dask rollback") -> Commit:
        """Commit the content of version ``seq`` again as the new head, and return that
        commit; if the head already holds it (it is version ``seq``, or a rollback to it),
        commit nothing and return the head: readers already see that content."""
        old = self.commit_at(seq)
        if old is None:
            raise ValueError(f"{str(self.path)!r} has no version {seq}; list them with "
                             f"`slem-dask versions {self.path}`")
        head = self.head()
        if head.version == old.version:  # a new commit would change nothing but the history
            return head
        self.check(old)  # still there, unchanged
        record = self._create(head.seq + 1, old.version, old.kind, job, old.checksum,
                              old.summary, f"rollback to {seq}")
        self.collect_garbage()
        return record

    def collect_garbage(self, keep: int = KEEP_VERSIONS) -> list[str]:
        """Delete dead drafts and versions older than the last ``keep`` commits (unless
        a kept commit names them). Decided by sequence numbers alone; reads only the
        commit records of the last ``keep`` versions and of the folders present, so its
        cost does not grow with the length of the history."""
        seqs = [int(n[:-5]) for n in self._commit_names()]
        if not seqs:
            return []
        last = max(seqs)
        records: dict[int, Commit | None] = {}

        def record(seq: int) -> Commit | None:
            if seq not in records:
                records[seq] = self.commit_at(seq)
            return records[seq]

        kept = {record(seq).version for seq in seqs if seq > last - keep and record(seq)}
        removed = []
        for version in self.backend.list(VERSIONS):
            seq = draft_seq(version)
            if seq is None or version in kept or seq > last:
                continue  # not ours, kept, or a draft that may still commit
            # committed at its own sequence number and too old, or a draft whose number
            # another draft took: either way nobody may read or commit it any more
            self.backend.remove_tree(f"{VERSIONS}/{version}")
            removed.append(version)
        return removed

def resolve(path) -> tuple[str, "VersionedStore | None", Commit | None]:
    """What to open for ``path``: (zarr location, its versioned store, its commit).

    ``P`` of a versioned store gives its head version; ``P/member`` a member of the
    head version of a versioned group (a corpus' ``negatives``);
    ``P/versions/<id>`` that version, if it was committed; anything else is a
    plain zarr node, opened as it is (store and commit None).
    """
    from .paths import canonical

    path = canonical(path)
    store = VersionedStore(path)
    head = store.head()  # one listing and one read, for a versioned store
    if head is not None:
        return store.location(head.version), store, head
    if path.parent.name == VERSIONS and draft_seq(path.name) is not None:
        owner = VersionedStore(path.parent.parent)
        if owner.is_versioned():
            commit = owner.commit_at(draft_seq(path.name))
            if commit is None or commit.version != path.name:
                raise VersionError(
                    f"{str(path)!r} is a version folder that was never committed (a draft "
                    f"of a job that failed, was interrupted or lost its race); read the "
                    f"store {str(owner.path)!r} itself, or a version listed by "
                    f"`slem-dask versions {owner.path}`")
            return path.location, owner, commit
    if path.parent.url != path.url:
        parent = VersionedStore(path.parent)
        head = parent.head()
        if head is not None:
            return parent.path.child(VERSIONS).child(head.version).child(path.name).location, \
                parent, head
    return path.location, None, None
