"""One interface to the bytes under a store path, whatever holds them.

slem-dask's commit protocol (:mod:`slem_dask.storage.versions`) needs few
operations, and one of them must be atomic: :meth:`Backend.create`, a write
that succeeds for exactly one of any number of racing writers (``link(2)`` on a
local file system, a conditional ``PUT`` with ``If-None-Match: *`` on S3). All
the others may be plain: what they touch is either immutable once committed or
private to one job.

Keys are ``/``-separated and relative to the backend's root. One backend per
module: :mod:`.local` (POSIX file systems), :mod:`.s3` (S3 and S3-compatible
object stores through s3fs).
"""

from __future__ import annotations

import abc

__all__ = ["Backend", "backend_for", "StorageConfigError", "describe_storage_error"]


class StorageConfigError(OSError):
    """The storage cannot be used as configured (credentials, bucket, endpoint); the
    message names the path and the fix."""


class Backend(abc.ABC):
    """Bytes under one root (a local folder, an S3 prefix)."""

    #: the root as a user writes it (a path, or a URL)
    root: str
    #: whether :meth:`create` is atomic here (commits need it)
    atomic_create: bool = True

    @abc.abstractmethod
    def read(self, key: str) -> bytes | None:
        """The bytes of ``key``, or None if it does not exist."""

    @abc.abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if it does not exist, atomically: True if this call created
        it, False if it existed. Of any number of racing calls exactly one returns True,
        and a reader never sees ``key`` half-written."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write ``key`` whole (readers see the old bytes or the new, never a part)."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Names directly under the folder ``prefix`` ('' for the root), sorted; [] if
        there is none."""

    def list_after(self, prefix: str, start_after: str) -> list[str]:
        """The names of :meth:`list` that sort after ``start_after``; object stores
        override it to be sent only those (the cost of finding the newest of many
        names then does not grow with their number)."""
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
    def copy_tree(self, src: str, dst: str, names: list[str] | None = None) -> None:
        """Give ``dst`` its own copy of the objects under ``src`` (of ``names`` only,
        relative to ``src``, if given) without rewriting their bytes where the storage
        can: a hard link on a local file system, a server-side copy on S3. Later writes
        to ``src`` never change ``dst``."""

    def prune_empty(self) -> None:
        """Remove folders left empty under the root, and the root if it is empty (object
        stores have no folders: nothing to do)."""

    def describe_error(self, exc: BaseException) -> str | None:
        """One line for a failure of this storage (credentials, bucket, endpoint), or
        None when ``exc`` is not one."""
        return None


def backend_for(url: str) -> Backend:
    """The backend of a canonical store URL (``file:///abs/path``, ``s3://bucket/key``,
    ``memory://…``; other fsspec protocols go through :mod:`.fsspec_backend`)."""
    if url.startswith("file://"):
        from .local import LocalBackend

        return LocalBackend(url[len("file://"):])
    if url.startswith(("s3://", "s3a://")):
        from .s3 import S3Backend

        return S3Backend(url)
    from .fsspec_backend import FsspecBackend

    return FsspecBackend(url)


def describe_storage_error(exc: BaseException, paths) -> str | None:
    """One line for an object store's failure (credentials, bucket, endpoint) met while
    a command worked on ``paths``, naming the path and the fix; None for any other error."""
    for path in paths:
        if "://" not in str(path) or str(path).startswith(("file://", "memory://")):
            continue
        try:
            backend = backend_for(str(path))
        except Exception:  # noqa: BLE001 - no such backend installed: nothing to say
            continue
        line = backend.describe_error(exc)
        if line:
            return line
    return None
