"""Why a descriptor file cannot be read, in one line naming the file and the fix (split
from :mod:`slem_dask.storage.formats.formats`, which opens the files)."""

from __future__ import annotations

import os

import numpy as np


def _unmappable_npy(file: str, name: str, exc: ValueError) -> str:
    """Why a .npy file cannot be memory-mapped: shorter than its header says (a copy or a
    write cut off: saving it as numbers would not help), or not numbers (objects)."""
    fmt = np.lib.format
    headers = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
    needed = None
    with open(file, "rb") as f:
        try:
            read_header = headers.get(fmt.read_magic(f))
            if read_header is not None:
                shape, _, dtype = read_header(f)
                if not dtype.hasobject:
                    needed = f.tell() + int(np.prod(shape)) * dtype.itemsize
        except (ValueError, TypeError):
            pass
    size = os.path.getsize(file)
    if needed is not None and size < needed:
        return (
            f"{name}: the .npy file {file!r} is truncated: {size:,} bytes where its header "
            f"({shape}, {dtype}) needs {needed:,}; copy or save it again"
        )
    return (
        f"{name}: {file!r} is a .npy file that cannot be memory-mapped ({exc}); save it as "
        f"a numeric array (np.save(path, rows.astype(np.float32)))"
    )


def _reshape_hint(node) -> str:
    """How to write an n-D dataset's rows as the 2-D dataset descriptors are."""
    if node.ndim < 2:
        return ""
    return (
        f": write its rows as one, e.g. with h5py f['descriptors'] = "
        f"f['{node.name}'][...].reshape(-1, {node.shape[-1]}), and name that"
    )


def _no_single_2d_dataset(f, file: str, found: list[str], two_d: list[str], name: str) -> str:
    """Why no dataset of an HDF5 file given without one can be read: several 2-D ones
    (name one), or none (what the others are, and how to make one)."""
    shown = ", ".join(found[:6]) + (" ..." if len(found) > 6 else "")
    if two_d:
        return (
            f"{name}: the HDF5 file {file!r} holds {len(two_d)} 2-D datasets (datasets: "
            f"{shown}); name one as {file}:/path/to/dataset"
        )
    if not found:
        return f"{name}: the HDF5 file {file!r} holds no datasets; expected one 2-D dataset"
    first = f[found[0]]
    return (
        f"{name}: the HDF5 file {file!r} holds no 2-D dataset (datasets: {shown}; "
        f"{found[0]} has shape {first.shape}); descriptors are one 2-D dataset "
        f"(n_rows, n_features){_reshape_hint(first)}"
    )


def _whole_rows_agree(file: str, d: int, width: int, size: int) -> bool:
    """Whether the file's whole rows, where sampled (the second and the last), declare
    the first row's dimension too: a TEXMEX file cut short, not another format."""
    rows = size // width
    if rows < 2:
        return False
    with open(file, "rb") as f:
        for row in (1, rows - 1):
            f.seek(row * width)
            if int(np.frombuffer(f.read(4), "<i4")[0]) != d:
                return False
    return True
