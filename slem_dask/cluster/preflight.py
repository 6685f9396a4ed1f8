"""Checks of what a command will write, made before any cluster starts.

A read-only output folder used to fail after the cluster had started (the
lease, then the store, are created there), with the operating system's
message and no remedy. :func:`check_writable` creates and removes a probe file
where each output goes: in its folder (the nearest existing ancestor when
folders are still to be made, as zarr makes them), and in the store itself
when it exists (a resumed output). Local paths only: the permissions of an
object store (s3://...) show only when it is written.
"""

from __future__ import annotations

import errno
import os
import re
import uuid

__all__ = ["check_store_names", "check_writable", "check_output_file", "output_paths"]

#: File systems that are the kernel's view of processes, devices and settings, not storage:
#: they refuse new files (with ENOENT on /proc, EACCES on /sys, even for root).
KERNEL_FILE_SYSTEMS = {
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "debugfs",
    "tracefs",
    "securityfs",
    "configfs",
    "bpf",
    "pstore",
    "efivarfs",
    "fusectl",
    "devpts",
    "mqueue",
    "binfmt_misc",
    "nsfs",
}


def _file_system(folder: str, table: str = "/proc/self/mounts") -> str | None:
    """The type of the file system ``folder`` is on (its longest mount point in the
    mounts ``table``), or None where that cannot be read (not Linux)."""
    try:
        with open(table) as f:
            mounts = [fields[1:3] for fields in map(str.split, f) if len(fields) > 2]
    except OSError:
        return None
    path = os.path.realpath(folder)
    best, kind = "", None
    for point, fs in mounts:
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), point)  # "\040": " "
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fs
    return kind


def _probe(folder: str) -> OSError | None:
    name = os.path.join(folder, f".slem-dask-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError as exc:
        return exc
    os.close(fd)
    os.unlink(name)
    return None


#: Options and spec keys whose path becomes a versioned zarr store (a folder).
_STORE_KEYS = re.compile(r"--model|--out|model\.path|generate\.path|encode\[\d+\]\.out")


def _check_store_name(key: str, path, target: str) -> None:
    """Refuse a store named as a file format slem-dask reads (``codes.npy``): it would
    be a folder that ``np.load`` or h5py cannot open, and a user who typed it wanted that
    file; ``slem-dask export`` writes one. Such a file there already (an export) is no
    store either; a folder of that name (a store written so) is left to the store checks."""
    from ..storage.formats.formats import HDF5_SUFFIXES, TEXMEX

    suffix = os.path.splitext(target.rstrip("/"))[1].lower()
    if (
        _STORE_KEYS.fullmatch(key)
        and suffix in (".npy", *HDF5_SUFFIXES, *TEXMEX)
        and not os.path.isdir(target)
    ):
        raise ValueError(
            f"{key} {str(path)!r}: slem-dask writes a versioned zarr store (a folder) "
            f"there, not a {suffix} file; name it .zarr (e.g. "
            f"{os.path.splitext(str(path).rstrip('/'))[0] + '.zarr'!r}), and copy a version "
            f"out as .npy with `slem-dask export STORE --to OUT.npy`"
        )


def check_store_names(paths: dict[str, object], files_only: bool = False) -> None:
    """A ValueError for a store of ``paths`` ({option: path}) named like a file
    (:func:`_check_store_name`). ``files_only``: only where such a file is (an export's
    ``codes.npy``), which the commands check before their inputs, so that the file is
    not called something slem-dask did not write (:func:`check_writable` checks the rest)."""
    from ..storage import canonical

    for key, path in paths.items():
        where = canonical(path) if path else None
        if where is None or not where.is_local:
            continue
        if not files_only or os.path.isfile(where.location):
            _check_store_name(key, path, where.location)


def check_writable(paths: dict[str, object]) -> None:
    """Raise PermissionError (one line: the option, the folder, the fix) unless a file
    can be created where each local output of ``paths`` ({option: path}) goes; a
    ValueError for a new store named like a file (:func:`check_store_names`)."""
    from ..storage import canonical

    check_store_names(paths)
    for key, path in paths.items():
        if not path:
            continue
        where = canonical(path)
        if not where.is_local:
            continue
        target = where.location
        if key == "--workdir" and os.path.exists(target) and not os.path.isdir(target):
            raise NotADirectoryError(  # the demo makes it a folder: os.makedirs' errno 17
                f"--workdir {str(path)!r}: {target!r} is a file, not a folder; give a "
                f"folder (new or existing) for the demo's corpus and models"
            )
        folder = os.path.dirname(target.rstrip("/")) or "/"
        while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
            if os.path.exists(folder):  # a file where a folder must go
                raise NotADirectoryError(
                    f"{key} {str(path)!r}: {folder!r} is a file, not a folder; give an "
                    f"output path whose parent is a folder"
                )
            folder = os.path.dirname(folder)
        folders = [folder] + ([target] if os.path.isdir(target) else [])
        for place in folders:
            exc = _probe(place)
            if exc is None:
                continue
            kind = _file_system(place)
            if kind in KERNEL_FILE_SYSTEMS:  # its errno (ENOENT on /proc) would mislead
                raise OSError(
                    f"{key} {str(path)!r}: the folder {place!r} is on a {kind} file system, "
                    f"the kernel's view of the system, not storage: it cannot hold a zarr "
                    f"store; choose an output path in a regular folder"
                )
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                why = (
                    "is on a read-only file system"
                    if exc.errno == errno.EROFS
                    else f"is not writable by this user (uid {os.getuid()})"
                )
                raise PermissionError(
                    f"{key} {str(path)!r}: the folder {place!r} {why}, so nothing can be "
                    f"written there; choose an output path in a writable folder, or make "
                    f"{place!r} writable (remount it read-write, chmod/chown)"
                )
            error = OSError(
                f"{key} {str(path)!r}: cannot create a file in {place!r} "
                f"({exc.strerror}); check that folder"
            )
            error.errno = exc.errno  # kept for callers; not in the message ("[Errno 2] ...")
            raise error


def check_output_file(option: str, path, example: str) -> None:
    """A file that a command writes when it ends (``--plot PNG``, ``--performance-report
    HTML``), checked before any cluster starts: its folder exists and is writable, and it
    is no folder (``example``: a file name to suggest inside one). None: nothing to check."""
    if path is None or path == "":
        return
    folder = os.path.dirname(os.path.abspath(str(path)))
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"{option}: folder {folder!r} does not exist; create it first "
            f"(mkdir -p {folder}) or give another path for {str(path)!r}"
        )
    if not os.access(folder, os.W_OK):
        raise PermissionError(
            f"{option}: folder {folder!r} is not writable; give another path for {str(path)!r}"
        )
    if os.path.isdir(str(path)):
        raise IsADirectoryError(
            f"{option}: {str(path)!r} is a folder; give a file name such as "
            f"{os.path.join(str(path), example)}"
        )


def output_paths(args, spec=None) -> dict[str, object]:
    """{option or spec key: path} of what a command writes (stores, plots, reports)."""
    paths = {}
    for option in ("model", "out", "workdir", "plot", "performance_report"):
        if args.command == "encode" and option == "model":
            continue  # read, not written
        value = getattr(args, option, None)
        if value:
            paths["--" + option.replace("_", "-")] = value
    if args.command != "fit":
        paths.pop("--model", None)
    if spec is not None:
        if spec.fit is not None:
            paths["model.path"] = spec.model.path
        for i, step in enumerate(spec.encode):
            paths[f"encode[{i}].out"] = step.out
        if spec.generate is not None and not os.path.exists(spec.generate.path):
            paths["generate.path"] = spec.generate.path
    return paths
