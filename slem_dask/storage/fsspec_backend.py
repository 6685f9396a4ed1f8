"""Any other fsspec file system (``memory://``, ``gcs://``, …) as a
:class:`~slem_dask.storage.backend.Backend`.

Its :meth:`create` is atomic only as far as the file system makes an exclusive
create atomic: within one process for ``memory://`` (a lock here serializes the
check and the write); other remote file systems get the check-then-write, which
two hosts can race. For S3 use :mod:`.s3` (conditional writes).
"""

from __future__ import annotations

import threading

from .backend import Backend

__all__ = ["FsspecBackend"]

_LOCK = threading.Lock()


class FsspecBackend(Backend):
    def __init__(self, url: str):
        import fsspec

        self.root = url if url.endswith("://") else url.rstrip("/")
        self.fs, self._root = fsspec.core.url_to_fs(self.root)

    def _path(self, key: str) -> str:
        return f"{self._root.rstrip('/')}/{key}" if key else self._root

    def read(self, key: str) -> bytes | None:
        try:
            return self.fs.cat_file(self._path(key))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def create(self, key: str, data: bytes) -> bool:
        with _LOCK:
            if self.fs.exists(self._path(key)):
                return False
            self.fs.pipe_file(self._path(key), data)
            return True

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(key), data)

    def list(self, prefix: str) -> list[str]:
        try:
            self.fs.invalidate_cache(self._path(prefix))
            entries = self.fs.ls(self._path(prefix), detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def exists(self, key: str) -> bool:
        return self.fs.exists(self._path(key))

    def delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass

    def remove_tree(self, prefix: str) -> None:
        try:
            self.fs.rm(self._path(prefix), recursive=True)
        except FileNotFoundError:
            pass

    def copy_tree(self, src: str, dst: str, names: list[str] | None = None) -> None:
        if names is None:
            base = self._path(src).rstrip("/") + "/"
            names = [p[len(base):] for p in self.fs.find(self._path(src))
                     if p.startswith(base)]
        for name in names:
            self.fs.copy(self._path(f"{src}/{name}"), self._path(f"{dst}/{name}"))
