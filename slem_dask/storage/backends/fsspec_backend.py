"""Any other fsspec file system as a :class:`~slem_dask.storage.backends.backend.Backend`.

Only :meth:`FsspecBackend.create` needs more than fsspec offers: fsspec's own
exclusive create (``pipe_file(mode="create")``, ``open(mode="xb")``) is, for most
file systems, a check followed by a write, which two writers can both pass. So
``create`` is atomic only where this module knows how: ``memory://`` lives in
one process, where a lock around the check and the write is enough. On other
protocols it refuses (StorageConfigError) rather than pretend; local paths, S3, GCS
and Azure have their own backends (:mod:`.local`, :mod:`.s3`, :mod:`.gcs`, :mod:`.azure`).
"""

from __future__ import annotations

import builtins  # `list` in a backend class is its method: annotations say builtins.list
import functools
import threading

from .backend import Backend, StorageConfigError
from .outcomes import UNKNOWN, settle_create

__all__ = ["FsspecBackend"]

_PRIVATE_SUFFIXES = (".partial", ".tmp")
# protocols whose whole file system is inside this process
_IN_PROCESS = {"memory"}
_LOCK = threading.Lock()


class FsspecBackend(Backend):
    """Files under an fsspec URL (``memory://name``, …); ``storage_options`` go to
    the file system."""

    def __init__(self, url: str, **storage_options):
        from fsspec.core import url_to_fs

        self.root = url.rstrip("/")
        self.storage_options = dict(storage_options)
        self.fs, path = url_to_fs(url, **storage_options)
        self._base = path.rstrip("/")
        protocol = self.fs.protocol
        self.protocol = protocol if isinstance(protocol, str) else protocol[0]

    def __reduce__(self):
        return functools.partial(FsspecBackend, self.root, **self.storage_options), ()

    def __repr__(self):
        return f"FsspecBackend({self.root!r})"

    def _path(self, key: str) -> str:
        return "/".join([self._base, *[p for p in key.split("/") if p]])

    def read(self, key: str) -> bytes | None:
        try:
            return self.fs.cat_file(self._path(key))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    @property
    def atomic_create(self) -> bool:  # type: ignore[override]  # Backend: a class attribute
        return self.protocol in _IN_PROCESS

    def create(self, key: str, data: bytes) -> bool:
        if self.protocol not in _IN_PROCESS:
            raise StorageConfigError(
                f"{self.root}: fsspec's {self.protocol}:// file system offers no atomic "
                "create-if-absent that slem-dask knows of, so it cannot commit there "
                "safely; use a local path, s3://, gs:// or az://"
            )
        path = self._path(key)
        with _LOCK:  # the file system is in this process: the lock serialises writers
            if self.fs.exists(path):
                return self.fs.cat_file(path) == bytes(data)  # idempotent (Backend.create)
            try:
                self.fs.pipe_file(path, bytes(data))
            except Exception as exc:  # noqa: BLE001 - sorted by outcome_kind
                if self.outcome_kind(exc) is not UNKNOWN:
                    raise
                return settle_create(self, key, data, exc)  # it may have landed: read back
            return True

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(key), bytes(data))

    def list(self, prefix: str) -> list[str]:
        path = self._path(prefix)
        self.fs.invalidate_cache(path)  # another writer may have changed it
        try:
            entries = self.fs.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = {
            e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != path.rstrip("/")
        }
        return sorted(names)

    def exists(self, key: str) -> bool:
        path = self._path(key)
        self.fs.invalidate_cache(path)
        if self.fs.isfile(path):
            return True
        return bool(self.list(key))

    def delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass

    def remove_tree(self, prefix: str) -> None:
        path = self._path(prefix)
        self.fs.invalidate_cache(path)
        if self.fs.isdir(path):
            self.fs.rm(path, recursive=True)
        elif self.fs.isfile(path):
            self.fs.rm_file(path)

    def copy_tree(self, src: str, dst: str, names: builtins.list[str] | None = None) -> None:
        """``cp_file`` of each file: a copy of the bytes on memory://, a server-side
        copy where the file system has one."""
        src_path, dst_path = self._path(src), self._path(dst)
        if names is None:
            self.fs.invalidate_cache(src_path)
            names = [
                p[len(src_path) :].lstrip("/")
                for p in self.fs.find(src_path)
                if not p.endswith(_PRIVATE_SUFFIXES)
            ]
        for name in names:
            self.fs.cp_file(f"{src_path}/{name.strip('/')}", f"{dst_path}/{name.strip('/')}")
