"""The real :class:`~slem_dask.storage.backends.local.LocalBackend` on a temporary folder, with
faults at the ``os`` calls it makes.

:class:`DiskServer` is the folder (``<tmp>/bucket/...``, the keys of the object-store
worlds) seen as a :class:`.server.SimServer` by the checks: its ``objects`` are the
files, by their physical path (a file reached through a symlink is judged where it
lies). The module ``os``, ``shutil`` and ``open`` of :mod:`slem_dask.storage.backends.local` are
replaced by wrappers that yield to the scheduler before every system call that reads,
lists or changes the folder (a crash between any two), and may fail it:

* ``lost_request`` / ``unavailable`` / ``late``: EIO, nothing done;
* ``lost_reply``: done, then EIO (an NFS reply lost), with ``Faults.nfs`` only;
* ``twice``: done, then done again by a retransmission (a ``link`` then says EEXIST,
  an ``unlink`` or ``rename`` ENOENT), with ``Faults.nfs`` only;
* ``delay`` / ``hang``: minutes of simulated time (a local call has no deadline).

Local-disk semantics (``run_seed(..., shared=True)``): a user's symlink inside the
store named like a draft, pointing at a folder of theirs; and a second store ``Q``
whose ``versions/`` is a symlink to ``P``'s (issue 38, item 5).
"""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import tempfile
import types

from .server import SimServer


class DiskServer(SimServer):
    """A folder of real files, as the checks see an object store."""

    def __init__(self, root: str):
        super().__init__()
        self.root = os.path.realpath(root)
        self.links = False  # whether the harness made symlinks
        self._real: dict = {}

    def changed(self, key: str, by: str = "slem-dask") -> None:
        """``key`` was written, renamed or deleted: its bytes as they are now."""
        path = self.path(key)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                self.objects[key] = f.read()
            self.writers.setdefault(key, by)
        else:
            self.objects.pop(key, None)
        self.stamps[key] = self.stamps.get(key, 0) + 1
        self.mutations += 1
        self.record_changes += "/commits/" in key

    def key(self, path: str) -> str:
        """The physical key of ``path`` (its folder resolved: symlinks followed; the
        symlinks are made before the run, so each folder's resolution is kept)."""
        folder, name = os.path.split(path)
        real = self._real.get(folder)
        if real is None:
            real = self._real[folder] = os.path.realpath(folder) if self.links else folder
        return f"{real}/{name}"[len(self.root) + 1 :]

    def link_folder(self, key: str, target: str) -> None:
        """The harness makes ``key`` a symlink to the folder ``target`` (keys)."""
        os.makedirs(self.path(target), exist_ok=True)
        os.makedirs(os.path.dirname(self.path(key)), exist_ok=True)
        os.symlink(self.path(target), self.path(key))
        self.links, self._real = True, {}

    def path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def write(self, key: str, data: bytes) -> None:  # the harness: no faults
        os.makedirs(os.path.dirname(self.path(key)), exist_ok=True)
        with open(self.path(key), "wb") as f:
            f.write(bytes(data))
        self.changed(key)

    def seed_user_object(self, key: str, data: bytes = b"user data") -> None:
        self.writers[key] = "user"
        self.write(key, data)

    def remove(self, key: str, actor: str) -> None:
        raise AssertionError("deletes on disk go through the os wrappers")


def _eio(what: str) -> OSError:
    return OSError(errno.EIO, os.strerror(errno.EIO), what)


class Disk:
    """The ``os`` calls of LocalBackend, under the world's faults."""

    def __init__(self, world, server: DiskServer):
        self.world, self.server = world, server

    def call(self, op: str, path: str, apply, mutates: bool):
        world = self.world
        world.before_call(op if not world.tracing else f"{op} {self.server.key(path)}")
        fault = world.draw_fault(mutates)
        if fault in ("lost_reply", "twice") and not world.faults.nfs:
            fault = None  # a local file system answers every call it made
        if fault in ("delay", "hang"):
            world.advance(world.rng.uniform(30, 400))
        elif fault in ("lost_request", "unavailable", "late", "late_5xx"):
            raise _eio(path)
        result = apply()
        if fault == "lost_reply":
            raise _eio(path)
        if fault == "twice":
            return apply()
        return result

    def changed(self, path: str) -> None:
        self.server.changed(self.server.key(path))

    def removing(self, path: str) -> None:
        """Judge a delete before it happens (as SimServer.remove does)."""
        key = self.server.key(path)
        if self.server.judge is not None and os.path.lexists(path):
            self.server.judge(self.server, key, self.world.actor_name())

    # os -------------------------------------------------------------------------------
    def link(self, src, dst):
        def apply():
            os.link(src, dst)
            self.changed(dst)

        return self.call("link", dst, apply, True)

    def replace(self, src, dst):
        def apply():
            os.replace(src, dst)
            self.changed(src)
            self.changed(dst)

        return self.call("replace", dst, apply, True)

    def remove(self, path):
        def apply():
            self.removing(path)
            os.remove(path)
            self.changed(path)

        return self.call("remove", path, apply, True)

    def rmdir(self, path):
        return self.call("rmdir", path, lambda: os.rmdir(path), True)

    def listdir(self, path):
        return self.call("listdir", path, lambda: os.listdir(path), False)

    def open(self, path, mode="r", *args, **kwargs):
        writes = any(c in mode for c in "wax+")

        def apply():
            f = builtins.open(path, mode, *args, **kwargs)
            if writes:
                self.changed(path)  # a private file, written whole before it is named
            return f

        return self.call("open", path, apply, writes)

    def rmtree(self, path, ignore_errors=False, **_):
        """shutil.rmtree, one call per file (a crash stops it part-way); it never
        follows a symlink."""
        try:
            for folder, dirs, files in os.walk(path, topdown=False):
                for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
                    self.remove(os.path.join(folder, name))
                for name in dirs:
                    if not os.path.islink(os.path.join(folder, name)):
                        self.rmdir(os.path.join(folder, name))
            self.rmdir(path)
        except OSError:
            if not ignore_errors:
                raise

    def copy2(self, src, dst, **_):
        def apply():
            shutil.copy2(src, dst)
            self.changed(dst)

        return self.call("copy", dst, apply, True)

    def module_os(self):
        fake = types.ModuleType("os")
        fake.__dict__.update(vars(os))
        for name in ("link", "replace", "remove", "rmdir", "listdir"):
            setattr(fake, name, getattr(self, name))
        fake.fsync = lambda fd: None  # durability is not what the simulation checks
        return fake

    def module_shutil(self):
        fake = types.ModuleType("shutil")
        fake.__dict__.update(vars(shutil))
        fake.rmtree, fake.copy2 = self.rmtree, self.copy2
        return fake


def make_server(world) -> DiskServer:
    # in memory where the machine has it: each seed makes and removes a tree of files
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    world.tmp = tempfile.TemporaryDirectory(prefix="slem-sim-", dir=shm)
    return DiskServer(world.tmp.name)


def backend(world, url: str):
    from slem_dask.storage.backends.local import LocalBackend

    return LocalBackend(world.server.path(url[len("sim://") :]))


def patches(world) -> dict:
    from slem_dask.storage.backends import local

    disk = Disk(world, world.server)
    uuid = types.SimpleNamespace(uuid4=lambda: types.SimpleNamespace(hex=world.token()))
    return {
        (local, "uuid"): uuid,
        (local, "os"): disk.module_os(),
        (local, "shutil"): disk.module_shutil(),
        (local, "open"): disk.open,
    }
