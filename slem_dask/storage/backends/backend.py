"""One interface to the bytes under a store path, whatever holds them.

slem-dask's commit protocol (:mod:`slem_dask.storage.versioning.versions`) needs few
operations, and one of them must be atomic: :meth:`Backend.create`, a write
that succeeds for exactly one of any number of racing writers (``link(2)`` on a
local file system, a conditional ``PUT`` with ``If-None-Match: *`` on S3). All
the others may be plain: what they touch is either immutable once committed or
private to one job.

Every outcome a backend cannot vouch for (a lost reply, a retry, a timeout) is
resolved by reading back, never guessed: :meth:`Backend.create` is idempotent
(True when the key holds exactly the caller's bytes, whoever's request put them
there), so writers that race always write distinct bytes (a token of their own).
Whether a store honours the atomic create is probed once per store
(:func:`check_conditional_writes`) before slem-dask commits there. A backend must
also read its own writes: :meth:`Backend.read` right after a write that returned
sees it (AWS S3, GCS and Azure Blob Storage are strongly consistent), since commits
are confirmed by reading their record back.

Keys are ``/``-separated and relative to the backend's root. One backend per
module: :mod:`.local` (POSIX file systems), :mod:`.s3` (S3 and S3-compatible
object stores through s3fs), :mod:`.gcs` (Google Cloud Storage through gcsfs),
:mod:`.azure` (Azure Blob through adlfs).
"""

from __future__ import annotations

import builtins  # `list` in a backend class is its method: annotations say builtins.list
import abc
import os
import threading
import uuid

from .outcomes import UNKNOWN, StorageRefusedError, at_the_boundary, os_error_kind

__all__ = [
    "Backend",
    "StorageConfigError",
    "check_conditional_writes",
    "ACCEPT_NO_CONDITIONAL_WRITES",
]

#: Set to 1 to commit on a store that ignores conditional writes
#: (docs/guarantees-protocol.md: only safe while one job at a time writes each store).
ACCEPT_NO_CONDITIONAL_WRITES = "SLEM_DASK_ACCEPT_NO_CONDITIONAL_WRITES"


class StorageConfigError(StorageRefusedError):
    """The storage cannot be used as configured (credentials, bucket, endpoint); the
    message names the path and the fix. Refused: nothing was written."""


#: the methods through which the protocol reaches storage: each subclass's own are
#: wrapped so that they raise only the kinds of :mod:`.outcomes`
BOUNDARY = (
    "read",
    "create",
    "put",
    "list",
    "list_after",
    "exists",
    "delete",
    "remove_tree",
    "copy_tree",
    "prune_empty",
    "make_durable",
)


class Backend(abc.ABC):
    """Bytes under one root (a local folder, an S3 prefix).

    Every method of :data:`BOUNDARY` that a subclass defines raises only the outcome
    kinds of :mod:`.outcomes`: its client's exceptions are sorted by the subclass's
    :meth:`outcome_kind`, the one place per backend that knows them."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in BOUNDARY:
            if name in cls.__dict__:
                setattr(cls, name, at_the_boundary(cls.__dict__[name]))

    @classmethod
    def client_exceptions(cls) -> tuple[type[BaseException], ...]:
        """The base types of its client library's own exceptions (those of modules not
        imported yet cannot have been raised: none are imported here)."""
        return ()

    def outcome_kind(self, exc: Exception) -> type[OSError]:
        """What became of a request that raised ``exc`` (a kind of :mod:`.outcomes`):
        an ``OSError`` by its type and errno, anything unrecognised UNKNOWN (it may
        have been applied: read back). Backends whose clients raise other types
        override this, and only this."""
        return os_error_kind(exc) or UNKNOWN

    #: the root as a user writes it (a path, or a URL)
    root: str
    #: whether :meth:`create` is atomic here (commits need it)
    atomic_create: bool = True
    #: whether :meth:`list_after` is sent only the names after (S3's ``StartAfter``):
    #: the head of a versioned store is then found by one short listing
    #: (:mod:`.heads`), else by reading records
    lists_from_a_name: bool = False

    @abc.abstractmethod
    def read(self, key: str) -> bytes | None:
        """The bytes of ``key``, or None if it does not exist."""

    @abc.abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if it does not exist, atomically: True if this call created
        it, False if it existed. Of any number of racing calls exactly one returns True,
        and a reader never sees ``key`` half-written.

        Idempotent: when the storage answers "exists" (an S3 412, ``EEXIST``) the key is
        read back, and the call is True if it holds exactly ``data`` (a resent request,
        or an earlier call whose reply was lost, created it). Racing writers must
        therefore write distinct bytes. A request whose outcome is unknown (a 5xx, a
        lost reply) is settled by reading the key back (:func:`.outcomes.settle_create`);
        an outcome the backend cannot learn (the key absent, or the storage failing
        on the read too) raises :class:`.outcomes.OutcomeUnknownError`; callers then
        read the key back themselves (:func:`.publish.publish`).
        :class:`.outcomes.StorageRefusedError` (:class:`StorageConfigError` among them),
        :class:`.outcomes.StoreUnreachableError` and FileNotFoundError mean nothing
        was written."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write ``key`` whole (readers see the old bytes or the new, never a part)."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Names directly under the folder ``prefix`` ('' for the root), sorted; [] if
        there is none."""

    def list_after(self, prefix: str, start_after: str) -> builtins.list[str]:
        """The names of :meth:`list` that sort after ``start_after``; object stores
        override it to be sent only those (the cost of finding the newest of many
        names then does not grow with their number), and say so with
        :attr:`lists_from_a_name`."""
        return [name for name in self.list(prefix) if name > start_after]

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` is an object (file) or a non-empty folder."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove one object (file); no error if it is absent."""

    @abc.abstractmethod
    def remove_tree(self, prefix: str) -> None:
        """Remove everything under the folder ``prefix``; no error if there is nothing."""

    @abc.abstractmethod
    def copy_tree(self, src: str, dst: str, names: builtins.list[str] | None = None) -> None:
        """Give ``dst`` its own copy of the objects under ``src`` (of ``names`` only,
        relative to ``src``, if given) without rewriting their bytes where the storage
        can: a hard link on a local file system, a server-side copy on S3. Later writes
        to ``src`` never change ``dst``."""

    def probe_scope(self) -> str:
        """What one probe of conditional writes (:func:`check_conditional_writes`)
        vouches for, in words ("bucket s3://b at <endpoint>"): the root by default; a
        bucket on an object store, a file system locally. A backend whose stores differ
        within one scope must narrow it."""
        return self.root

    def prune_empty(self) -> None:
        """Remove folders left empty under the root, and the root if it is empty (object
        stores have no folders: nothing to do)."""
        return None  # a default, not abstract: object stores override nothing

    def make_durable(self, prefix: str) -> None:
        """Everything written under the folder ``prefix`` on stable storage, before a
        commit record names it (:mod:`.local_durable`). Object stores: nothing to do, a
        write they acknowledged is durable."""
        return None

    def describe_error(self, exc: BaseException) -> str | None:
        """One line for a failure of this storage (credentials, bucket, endpoint), or
        None when ``exc`` is not one."""
        return None

    def link_target(self, key: str) -> str | None:
        """Where ``key`` leads when it is a symbolic link, else None (:mod:`.markers`:
        nothing is deleted through a link). Object stores have no links."""
        return None

    def same_file(self, key: str, other: Backend) -> bool:
        """Whether ``key`` here and ``key`` under ``other`` are one file (a folder two
        stores share through a link or a bind mount). Object stores share no objects
        between paths."""
        return False


_PROBED: set[str] = set()  # scopes whose conditional writes were seen to work
_PROBE_LOCK = threading.Lock()


def check_conditional_writes(backend: Backend, where: str) -> None:
    """Refuse (StorageConfigError, one line naming ``where`` and the way to accept the
    risk) a store whose :meth:`Backend.create` does not refuse an existing key: a
    probe key created twice, once per :meth:`Backend.probe_scope` and process. A
    store that ignores ``If-None-Match`` would let two jobs commit the same version
    and delete each other's drafts. ``SLEM_DASK_ACCEPT_NO_CONDITIONAL_WRITES=1``
    skips the probe."""
    if os.environ.get(ACCEPT_NO_CONDITIONAL_WRITES, "") == "1":
        return
    scope = backend.probe_scope()
    with _PROBE_LOCK:
        if scope in _PROBED:
            return
        if not _probe(backend):
            raise StorageConfigError(
                f"{where!r}: {scope} does not refuse a second create of an "
                f"existing key (it ignores conditional writes, If-None-Match: *), so two "
                f"jobs could both commit one version and delete each other's work; use a "
                f"store that implements them (AWS S3, SeaweedFS, MinIO), or, if only one "
                f"job at a time ever writes each store, accept the risk with "
                f"{ACCEPT_NO_CONDITIONAL_WRITES}=1"
            )
        _PROBED.add(scope)


def _probe(backend: Backend) -> bool:
    """Create one fresh key twice, with distinct bytes: the second must be refused and
    the key must keep the first bytes. The key is deleted afterwards."""
    token = uuid.uuid4().hex
    key = f".slem-dask-probe-{token}"
    first, second = f"probe {token} 1".encode(), f"probe {token} 2".encode()
    try:
        created = backend.create(key, first)
        refused = not backend.create(key, second)
        return created and refused and backend.read(key) == first
    finally:
        backend.delete(key)
