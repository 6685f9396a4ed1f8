"""What a commit on a local or network file system waits for: the version's bytes and
names on stable storage, so that a power loss or a kernel crash after the commit cannot
take them back.

A write returns once its bytes are in the page cache; the kernel writes them to the disk
up to 30 s later (``vm.dirty_expire_centisecs``), and ext4 and XFS allocate a file's
blocks only then. A chunk renamed into place and then lost that way reads, after the
reboot, as an empty file, under a commit record that was written (and fsynced) after
it: the committed version would be unreadable (its checksums say so) while the
version before it may be pruned already. So before a commit record is created:

* every file of the version is ``fdatasync``-ed and every folder of it ``fsync``-ed,
  up to the folder that holds the store (the names of new files and folders are in
  their folders, the store's own name in that one);
* the record's own folder is ``fsync``-ed after its link (:meth:`.local.LocalBackend.create`),
  so that a commit that was reported stays.

Waiting for 512 MiB of chunks at the end of a job would cost what writing them back
costs (0.3 s here, 2026-11-30). The encode's tasks therefore start each chunk's
writeback as they write it (:func:`start_writeback`, Linux's ``sync_file_range``, which
does not wait), and the commit's ``fdatasync`` finds the bytes on the disk already:
16-20 ms for 16 chunks of 32 MiB (docs/benchmarks.md, durability). A model's writer
does the same after each member array (:func:`start_writeback_tree`).

Each system call here runs within the storage deadline (:mod:`.local_deadline`): a hung
network mount fails the commit in one line, before any record is written.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import sys

from .local_deadline import bounded_call

__all__ = ["make_durable", "start_writeback", "start_writeback_tree", "sync_folder"]

#: sync_file_range(2): start writing the range's dirty pages, do not wait
_SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def _sync_file_range():
    """libc's ``sync_file_range`` (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def start_writeback(fd: int) -> None:
    """Have the kernel start writing the open file ``fd``'s bytes to the disk now,
    without waiting for them (nothing where the system cannot). Its result is not
    looked at: the commit's ``fdatasync`` (:func:`make_durable`) reports any failure."""
    function = _sync_file_range()
    if function is not None:
        function(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def start_writeback_tree(top: str) -> None:
    """:func:`start_writeback` of every file under ``top`` (a model's member array just
    written through zarr, whose chunks the commit will wait for), each call within the
    storage deadline: at d = 8192 a model is 1 GiB, and its read-back before the commit
    then overlaps with writing it to the disk."""
    files, _ = bounded_call(functools.partial(_tree, top), top, "start_writeback")
    for path in files:
        bounded_call(functools.partial(_start_file_writeback, path), path, "start_writeback")


def _start_file_writeback(path: str) -> None:
    fd = _open(path)
    if fd is not None:
        try:
            start_writeback(fd)
        finally:
            os.close(fd)


def _open(path: str) -> int | None:
    """``path`` opened to be synced, or None if it is gone: a draft condemned meanwhile
    (another job took the store over), which the commit's claim then refuses."""
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None


def _sync_file(path: str) -> None:
    fd = _open(path)
    if fd is None:
        return
    try:
        (getattr(os, "fdatasync", None) or os.fsync)(fd)  # macOS has no fdatasync
    finally:
        os.close(fd)


def _sync_folder(path: str) -> None:
    fd = _open(path)
    if fd is None:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise  # a file system that cannot fsync a folder keeps its names as it does
    finally:
        os.close(fd)


def sync_folder(path: str) -> None:
    """The names in the folder ``path`` on stable storage (already within a deadline)."""
    _sync_folder(path)


def _tree(top: str) -> tuple[list[str], list[str]]:
    """(files, folders) under ``top``, the deepest folders first."""
    files, folders = [], []
    for folder, _, names in os.walk(top):
        folders.append(folder)
        files += [os.path.join(folder, name) for name in names]
    return files, folders[::-1]


def make_durable(root: str, top: str) -> None:
    """Every file and folder under ``top`` on stable storage, and the folders from
    ``top``'s parent up to ``root``'s parent (where ``top``'s own name, its parents'
    and the store's are kept); each call within the storage deadline."""
    files, folders = bounded_call(functools.partial(_tree, top), top, "make_durable")
    for path in files:
        bounded_call(functools.partial(_sync_file, path), path, "make_durable")
    folder = top  # inside root: up to it, then the store's own name in its parent
    while folder != root and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
        folders.append(folder)
    if os.path.dirname(root) != root:  # made by the store's first job
        folders.append(os.path.dirname(root))
    for path in folders:
        bounded_call(functools.partial(_sync_folder, path), path, "make_durable")
