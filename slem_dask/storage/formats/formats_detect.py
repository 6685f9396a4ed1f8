"""Which file format a location holds (magic bytes, else suffix), split from
:mod:`slem_dask.storage.formats.formats`, which opens and reads them: detection needs no reader.
"""

from __future__ import annotations

import glob
import os
import re

import numpy as np

NPY_MAGIC = b"\x93NUMPY"
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
HDF5_SUFFIXES = (".h5", ".hdf5", ".he5", ".hdf")
#: TEXMEX files: each row is an int32 dimension, then that many values of this dtype
TEXMEX: dict[str, np.dtype] = {
    ".fvecs": np.dtype("<f4"),
    ".bvecs": np.dtype("u1"),
    ".ivecs": np.dtype("<i4"),
}
GLOB_CHARS = "*?["
#: ``FILE.h5:/dataset`` or ``FILE.h5:dataset``: a colon right after an HDF5 suffix (a
#: file name cannot hold the ``/`` after it, and fsspec's ``::`` chaining is not used)
_HDF5_MEMBER = re.compile(r"^(.*?\.(?:h5|hdf5|he5|hdf)):(.+)$", re.IGNORECASE)


def natural_key(name: str):
    """Natural order: runs of digits compare as numbers (``emb_2`` before ``emb_10``)."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name)]


def split_hdf5(location: str) -> tuple[str, str | None]:
    """(file, dataset) of ``FILE.h5:/dataset``; (location, None) for anything else or for
    an existing file whose name itself holds the colon."""
    m = _HDF5_MEMBER.match(location)
    if m is None or os.path.exists(location):
        return location, None
    return m.group(1), "/" + m.group(2).lstrip("/")


def _is_zarr_folder(folder: str) -> bool:
    return any(
        os.path.exists(os.path.join(folder, n))
        for n in ("zarr.json", ".zarray", ".zgroup", "commits", "versions")
    )


def file_format(location: str) -> str | None:
    """The format :mod:`.formats` reads at ``location`` (a local path), or None for a
    zarr store (or nothing): decided by a file's magic bytes, else its suffix."""
    if split_hdf5(location)[1] is not None:  # FILE.h5:/dataset
        return "hdf5"
    if any(c in location for c in GLOB_CHARS) and not os.path.exists(location):
        return "npy shards"
    if os.path.isdir(location):
        if _is_zarr_folder(location):
            return None
        return "npy shards" if glob.glob(os.path.join(glob.escape(location), "*.npy")) else None
    if not os.path.isfile(location):
        return None
    with open(location, "rb") as f:
        head = f.read(8)
    if head.startswith(NPY_MAGIC):
        return "npy"
    if head == HDF5_MAGIC:
        return "hdf5"
    suffix = os.path.splitext(location)[1].lower()
    if suffix in TEXMEX:
        return suffix[1:]
    if suffix in HDF5_SUFFIXES:
        return "hdf5"  # its magic is missing: opening it says so
    if suffix == ".npy":
        return "npy"  # likewise
    return "unknown"


def remote_format(url: str) -> str | None:
    """The file format a URL names by its suffix (these are read from local disk only)."""
    base = url.rstrip("/")
    suffix = os.path.splitext(split_hdf5(base)[0])[1].lower()
    if suffix == ".npy" or any(c in base for c in GLOB_CHARS):
        return "npy"
    if suffix in HDF5_SUFFIXES:
        return "hdf5"
    return suffix[1:] if suffix in TEXMEX else None
