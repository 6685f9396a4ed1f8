"""The local (POSIX) file system as a :class:`~slem_dask.storage.backends.backend.Backend`.

The atomic create is ``link(2)`` of a private, fully written file: it fails if
the name exists, on every POSIX file system and on NFS, and the name never
points at a partly written file. ``link(2)`` is not idempotent over NFS: a
retransmitted request whose first reply was lost answers ``EEXIST`` although the
link was made, so an ``EEXIST`` is resolved by looking at what the name holds.
"""

from __future__ import annotations

import builtins  # `list` in a backend class is its method: annotations say builtins.list
import errno
import os
import shutil
import uuid

from .backend import Backend
from .local_deadline import with_deadlines
from .local_durable import make_durable, sync_folder
from .outcomes import UNKNOWN, os_error_kind, settle_create

__all__ = ["LocalBackend"]


def _discard(tmp: str) -> None:
    """Remove a private file once linked (or not). NFS: a retransmitted unlink whose
    first reply was lost answers ENOENT although the file is gone: read back (the name
    is absent) rather than fail a create that succeeded."""
    try:
        os.remove(tmp)
    except FileNotFoundError:
        if os.path.lexists(tmp):
            raise


@with_deadlines  # a hung network mount blocks a call for ever: local_deadline
class LocalBackend(Backend):
    #: writes leave ``<key>.<32 hex>.tmp`` when killed before the link or rename: the
    #: garbage collection deletes those of settled keys (:func:`.gc._forget_private_copies`)
    private_copies = True

    def __init__(self, root: str):
        self.root = root.rstrip("/") or "/"

    def __repr__(self):  # names the store in the heads seen (storage.heads), not the object
        return f"LocalBackend({self.root!r})"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *[p for p in key.split("/") if p]) if key else self.root

    def read(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def _private_copy(self, key: str, data: bytes) -> str:
        path = self._path(key)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        for tries_left in reversed(range(3)):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                f = open(tmp, "wb")
                break
            except FileNotFoundError:  # the folder, still empty, was pruned meanwhile
                if not tries_left:  # (another job's prune_empty): made again
                    raise
        with f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the name must never point at bytes a crash can lose
        return tmp

    def create(self, key: str, data: bytes) -> bool:
        for tries_left in reversed(range(3)):
            tmp = self._private_copy(key, data)
            try:
                created = self._link(tmp, key, data)
                if created:  # its name, too, survives a power loss (a commit reported stays)
                    sync_folder(os.path.dirname(self._path(key)))
                return created
            except FileNotFoundError:
                if os.path.lexists(tmp) or not tries_left:
                    raise
                # the private file went before its link: another job's collection
                # (gc._forget_private_copies, records.forget_lease_copies) or its
                # folder pruned: read back; absent, nothing was linked: again
                held = self.read(key)
                if held is not None:
                    return held == data
            finally:
                _discard(tmp)
        raise AssertionError("unreachable: the last try returns or raises")

    def _link(self, tmp: str, key: str, data: bytes) -> bool:
        try:
            os.link(tmp, self._path(key))
            return True
        except FileExistsError:
            return self._holds(tmp, key, data)
        except OSError as exc:
            if os_error_kind(exc) is not UNKNOWN:
                raise  # refused (read-only, full), or the folder vanished: not linked
            return settle_create(self, key, data, exc)  # EIO, ESTALE over NFS: read back

    def _holds(self, tmp: str, key: str, data: bytes) -> bool:
        """After EEXIST: whether the name is this call's own file (a retransmitted link
        that had landed) or holds exactly ``data`` (an earlier call whose reply was
        lost)."""
        try:
            if os.path.samefile(tmp, self._path(key)):
                return True
        except OSError:
            pass
        return self.read(key) == data

    def probe_scope(self) -> str:
        """The file system holding the root (its nearest existing folder's device)."""
        folder = self.root
        while not os.path.exists(folder) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
        try:
            return f"the local file system (device {os.stat(folder).st_dev})"
        except OSError:
            return self.root

    def put(self, key: str, data: bytes) -> None:
        tmp = self._private_copy(key, data)
        try:
            os.replace(tmp, self._path(key))
        except FileNotFoundError:
            # NFS: a retransmitted rename whose first reply was lost answers ENOENT;
            # read back: applied if the private file is gone and the name holds `data`
            if os.path.lexists(tmp) or self.read(key) != data:
                raise

    def make_durable(self, prefix: str) -> None:
        make_durable(self.root, self._path(prefix))  # each call within the deadline

    def list(self, prefix: str) -> list[str]:
        try:
            return sorted(os.listdir(self._path(prefix)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def exists(self, key: str) -> bool:
        path = self._path(key)
        if os.path.isdir(path):
            return bool(os.listdir(path))
        return os.path.lexists(path)

    def delete(self, key: str) -> None:
        try:
            os.remove(self._path(key))
        except FileNotFoundError:
            pass

    def remove_tree(self, prefix: str) -> None:
        path = self._path(prefix)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.remove(path)

    def link_target(self, key: str) -> str | None:
        path = self._path(key)
        return os.path.realpath(path) if os.path.islink(path) else None

    def same_file(self, key: str, other: Backend) -> bool:
        if not isinstance(other, LocalBackend):
            return False
        try:
            return os.path.samefile(self._path(key), other._path(key))
        except OSError:  # absent there (a store moved or renamed), or here
            return False

    def prune_empty(self) -> None:
        for folder, _, _ in sorted(os.walk(self.root), key=lambda t: -len(t[0])):
            try:
                os.rmdir(folder)  # fails, harmlessly, on a folder that holds something
            except OSError:
                pass

    def copy_tree(self, src: str, dst: str, names: builtins.list[str] | None = None) -> None:
        src_root, dst_root = self._path(src), self._path(dst)
        if names is None:
            names = []
            for folder, _, files in os.walk(src_root):
                rel = os.path.relpath(folder, src_root)
                names += [
                    f if rel == "." else f"{rel}/{f}"
                    for f in files
                    if not f.endswith((".partial", ".tmp"))
                ]
        for name in names:
            target = os.path.join(dst_root, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                # a link shares the inode: zarr replaces a chunk by rename, never in
                # place, so a later write to ``src`` gives src a new inode, not ``dst``
                os.link(os.path.join(src_root, name), target)
            except FileExistsError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
                shutil.copy2(os.path.join(src_root, name), target)
