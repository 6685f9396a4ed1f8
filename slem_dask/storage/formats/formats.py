"""Descriptors in files other than zarr, read lazily by row ranges: ``.npy`` (one file,
or a folder or glob of shards read as one array in natural name order), HDF5 datasets
(``FILE.h5:/path/to/dataset``) and TEXMEX ``.fvecs`` / ``.bvecs`` / ``.ivecs``.

Each format is opened into a :class:`FileArray`: the files it reads (with their size
and mtime, which fingerprint what a job read), its shape and dtype, and one small
reader of rows [a, b) of one file. Nothing is loaded whole: ``.npy`` and TEXMEX files
are memory-mapped per read, HDF5 datasets sliced through h5py. Files are read from
local (or mounted) disk; a URL of such a file is refused with a one-line way forward.
"""

from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import dataclass

import numpy as np

from .formats_detect import (  # noqa: F401 (re-exported: callers import them from here)
    GLOB_CHARS,
    HDF5_MAGIC,
    HDF5_SUFFIXES,
    NPY_MAGIC,
    TEXMEX,
    file_format,
    natural_key,
    remote_format,
    split_hdf5,
)
from .format_messages import (
    _no_single_2d_dataset,
    _reshape_hint,
    _unmappable_npy,
    _whole_rows_agree,
)
from ..backends.paths import StorePath

#: How a message names each format file_format returns.
_FORMAT_NAMES = {
    "npy": ".npy file",
    "npy shards": ".npy shards",
    "hdf5": "HDF5 file",
    **{f"{kind}vecs": f".{kind}vecs file" for kind in "fbi"},
}

SUPPORTED = (
    "a zarr array (v2 or v3), a .npy file, a folder or quoted glob of .npy "
    "shards, an HDF5 dataset (FILE.h5 or FILE.h5:/dataset), or a .fvecs/.bvecs/"
    ".ivecs file"
)


class FormatError(ValueError):
    """An input file that cannot be read as the format it is: one line, with the fix."""


@dataclass(frozen=True)
class Part:
    """One file of an input: its absolute path, its first row in the whole array, its
    row count, and its size and mtime when it was opened (what a fingerprint names)."""

    file: str
    start: int
    rows: int
    size: int
    mtime_ns: int


@dataclass(frozen=True, eq=False)
class FileArray:
    """A 2-D array of rows kept in files (see the module docstring): what the pipeline
    reads in place of a zarr array. ``url``: the input as given, canonical."""

    format: str  # "npy", "npy shards", "hdf5", "fvecs", "bvecs", "ivecs"
    url: str
    parts: tuple[Part, ...]
    shape: tuple[int, int]
    dtype: np.dtype  # native byte order: what reads return
    unit: int = 1  # rows read whole (an HDF5 dataset's chunk rows)
    dataset: str | None = None  # hdf5
    #: whether the storage itself is in chunks (a chunked HDF5 dataset); npy, fvecs,
    #: bvecs and contiguous HDF5 are read by row ranges, whatever ``unit`` says
    stored_in_chunks: bool = False

    ndim = 2
    shards = None  # no zarr shards: reads are whole rows of files

    @property
    def attrs(self) -> dict:
        return {}  # none of slem-dask's metadata: never an output of it

    @property
    def chunks(self) -> tuple[int, int]:
        return (self.unit, self.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.shape[0]) * int(self.shape[1]) * self.dtype.itemsize

    @property
    def location(self) -> str:
        return self.url[len("file://") :] if self.url.startswith("file://") else self.url

    def __dask_tokenize__(self):
        return (
            "slem-file-array",
            self.format,
            self.url,
            self.parts,
            self.dataset,
            str(self.dtype),
            self.shape,
        )

    def __repr__(self) -> str:
        return f"<{self.format} input {self.location!r} shape={self.shape} dtype={self.dtype}>"

    def locate_rows(self, rows) -> str | None:
        """``rows`` (of the whole input) by file and row within it ("emb_2.npy rows 0,
        7; emb_3.npy row 1"), for an input read from several files; else None."""
        if len(self.parts) < 2:
            return None
        by_file: dict[str, list[int]] = {}
        for row in rows:
            part = next(p for p in self.parts if p.start <= row < p.start + p.rows)
            by_file.setdefault(os.path.basename(part.file), []).append(row - part.start)
        return "; ".join(
            f"{file} row{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}"
            for file, r in by_file.items()
        )

    def read(
        self, lo: int, hi: int, name: str = "input", out: np.ndarray | None = None
    ) -> np.ndarray:
        """Rows [lo, hi), read from the files that hold them (each checked unchanged)."""
        if out is None:
            out = np.empty((hi - lo, self.shape[1]), dtype=self.dtype)
        for part in self.parts:
            a, b = max(lo, part.start), min(hi, part.start + part.rows)
            if a >= b:
                continue
            _check_unchanged(part, name)
            _READERS[self.format](self, part, a - part.start, b - part.start, out[a - lo : b - lo])
        return out

    def __getitem__(self, key):
        """numpy indexing by rows (an int, a slice or ``...``), then any columns: only
        the rows between the first and the last asked are read."""
        key = key if isinstance(key, tuple) else (key,)
        rows, rest = (
            (slice(None), ()) if key[0] is Ellipsis and len(key) == 1 else (key[0], key[1:])
        )
        if isinstance(rows, (int, np.integer)):
            i = int(rows) + (self.shape[0] if rows < 0 else 0)
            if not 0 <= i < self.shape[0]:
                raise IndexError(f"row {int(rows)} of {self.shape[0]}")
            return self.read(i, i + 1)[(0,) + tuple(rest)]
        if not isinstance(rows, slice):
            raise TypeError(f"{self!r}: index rows by an int or a slice, got {rows!r}")
        wanted = range(*rows.indices(self.shape[0]))
        if not wanted:
            block = self.read(0, 0)
        else:
            lo, hi = min(wanted), max(wanted) + 1
            block = self.read(lo, hi)
            block = block if rows.step in (None, 1) else block[np.asarray(wanted) - lo]
        return block[(slice(None),) + tuple(rest)] if rest else block

    def fingerprint(self, lo: int, hi: int, name: str = "input") -> str:
        """A digest of the files holding rows [lo, hi) (name, and size and mtime as they
        are now: a job compares it before and after reading) and of the rows' place in
        them: it changes when any of those files is rewritten."""
        h = hashlib.sha256(
            repr((self.format, self.dataset, str(self.dtype), self.shape[1], lo, hi)).encode()
        )
        for part in self.parts:
            if part.start < hi and lo < part.start + part.rows:
                try:
                    st = os.stat(part.file)
                except FileNotFoundError:
                    raise FileNotFoundError(
                        f"{name}: {part.file!r} (rows {part.start}-"
                        f"{part.start + part.rows - 1} of {self.location!r}) was removed; "
                        f"restore it, or run the job again on the files there are"
                    ) from None
                h.update(
                    repr(
                        (
                            os.path.basename(part.file),
                            part.start,
                            part.rows,
                            st.st_size,
                            st.st_mtime_ns,
                        )
                    ).encode()
                )
        return h.hexdigest()[:32]

    def signature(self) -> dict:
        """What a worker must see as the client does: each file's name and size, and
        the first 64 KiB of the first."""
        sig: dict[str, object] = {
            "files": [
                (p.file, os.path.getsize(p.file) if os.path.exists(p.file) else None)
                for p in self.parts
            ]
        }
        with open(self.parts[0].file, "rb") as f:
            sig["head"] = hashlib.sha256(f.read(2**16)).hexdigest()
        return sig


def _check_unchanged(part: Part, name: str) -> None:
    try:
        st = os.stat(part.file)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{name}: {part.file!r} was removed while this job read "
            f"it; run the job again once the input is complete"
        ) from None
    if st.st_size != part.size:
        raise FormatError(
            f"{name}: {part.file!r} changed size while this job read it "
            f"({part.size} -> {st.st_size} bytes); run the job again once the "
            f"input is no longer being written"
        )


# -- readers: rows [a, b) of one file into ``out`` -------------------------------------


def _read_npy(arr: FileArray, part: Part, a: int, b: int, out: np.ndarray) -> None:
    out[...] = np.load(part.file, mmap_mode="r", allow_pickle=False)[a:b]


def _read_hdf5(arr: FileArray, part: Part, a: int, b: int, out: np.ndarray) -> None:
    with _h5py(arr.location, "input").File(part.file, "r") as f:
        out[...] = f[arr.dataset][a:b]


def _read_texmex(arr: FileArray, part: Part, a: int, b: int, out: np.ndarray) -> None:
    kind = TEXMEX["." + arr.format]
    d = arr.shape[1]
    width = 4 + d * kind.itemsize
    raw = np.memmap(part.file, dtype=np.uint8, mode="r", shape=(part.rows, width))[a:b]
    dims = np.ascontiguousarray(raw[:, :4]).view("<i4").ravel()
    bad = np.flatnonzero(dims != d)
    if bad.size:
        raise FormatError(
            f"{part.file!r}: row {part.start + a + int(bad[0])} declares dimension "
            f"{int(dims[bad[0]])}, the file's first row {d}; a .{arr.format} file must "
            f"hold rows of one dimension: regenerate it"
        )
    out[...] = np.ascontiguousarray(raw[:, 4:]).view(kind)


_READERS = {
    "npy": _read_npy,
    "npy shards": _read_npy,
    "hdf5": _read_hdf5,
    "fvecs": _read_texmex,
    "bvecs": _read_texmex,
    "ivecs": _read_texmex,
}


# -- opening ---------------------------------------------------------------------------


def open_file_input(path: StorePath, name: str) -> FileArray | None:
    """The :class:`FileArray` at ``path``, or None where ``path`` is a zarr store (or
    nothing at all: the zarr opener then says so). Raises :class:`FormatError`, one
    line, for a file that cannot be read."""
    if not path.is_local:
        fmt = remote_format(path.url)
        if fmt is None:
            return None
        raise FormatError(
            f"{name}: {path.url!r} ({_FORMAT_NAMES.get(fmt, fmt)}) is on remote storage; "
            f"slem-dask reads .npy, HDF5 and .fvecs/.bvecs/.ivecs files from local or "
            f"mounted disk only: "
            f"copy it to a local path every worker sees, or convert it to a zarr array"
        )
    location = path.location
    fmt = file_format(location)
    if fmt is None:
        return None
    if fmt == "unknown":
        raise FormatError(
            f"{name}: no zarr array at {location!r}: it is a file of a format slem-dask "
            f"does not read (neither .npy, HDF5 nor TEXMEX); give {SUPPORTED}, or convert "
            f"it (e.g. np.save('x.npy', rows))"
        )
    if fmt == "npy":
        return _open_npy(path, [location], name, "npy")
    if fmt == "npy shards":
        return _open_npy(path, _shard_files(location, name), name, fmt)
    if fmt == "hdf5":
        return _open_hdf5(path, *split_hdf5(location), name)
    return _open_texmex(path, location, fmt, name)


def _shard_files(location: str, name: str) -> list[str]:
    pattern = os.path.join(glob.escape(location), "*.npy") if os.path.isdir(location) else location
    files = [f for f in glob.glob(pattern) if os.path.isfile(f)]
    if not files:
        raise FileNotFoundError(
            f"{name}: no file matches {location!r}; give a folder of "
            f".npy shards or a glob such as 'shards/*.npy' (quoted)"
        )
    others = [f for f in files if not f.endswith(".npy")]
    if others:
        raise FormatError(
            f"{name}: {location!r} matches {others[0]!r}, not a .npy file; "
            f"a glob of shards must match .npy files only, e.g. 'dir/*.npy'"
        )
    return sorted(files, key=lambda f: natural_key(os.path.basename(f)))


def _part(file: str, start: int, rows: int) -> Part:
    st = os.stat(file)
    return Part(os.path.realpath(file), start, rows, st.st_size, st.st_mtime_ns)


def _open_npy(path: StorePath, files: list[str], name: str, fmt: str) -> FileArray:
    parts: list[Part] = []
    first: np.ndarray | None = None
    for file in files:
        _check_npy_magic(file, name)
        try:
            a = np.load(file, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            raise FormatError(_unmappable_npy(file, name, exc)) from None
        if a.ndim != 2:
            raise FormatError(
                f"{name}: the .npy file {file!r} has shape {a.shape} ({a.ndim}-D); expected "
                f"2-D rows (n_rows, n_features): save x.reshape(len(x), -1)"
                if a.ndim > 1
                else f"{name}: the .npy file {file!r} has shape {a.shape} (1-D); expected 2-D "
                f"rows (n_rows, n_features): if it is one descriptor save x.reshape(1, -1)"
            )
        if first is not None and (a.shape[1], a.dtype) != (first.shape[1], first.dtype):
            raise FormatError(
                f"{name}: the shard {file!r} has {a.shape[1]} columns of {a.dtype}, the "
                f"first shard {files[0]!r} {first.shape[1]} of {first.dtype}; every shard "
                f"of one input must have the same columns and dtype"
            )
        start = parts[-1].start + parts[-1].rows if parts else 0
        parts.append(_part(file, start, int(a.shape[0])))
        first = a if first is None else first
    n = parts[-1].start + parts[-1].rows
    assert first is not None  # set with parts[0]: parts[-1] above exists
    return FileArray(
        fmt, path.url, tuple(parts), (n, int(first.shape[1])), first.dtype.newbyteorder("=")
    )


def _check_npy_magic(file: str, name: str) -> None:
    with open(file, "rb") as f:
        try:
            np.lib.format.read_magic(f)
        except ValueError as exc:
            raise FormatError(
                f"{name}: {file!r} is not a valid .npy file ({exc}): write it with "
                f"np.save(path, rows), or give {SUPPORTED}"
            ) from None


def _h5py(location: str, name: str):
    try:
        import h5py
    except ImportError:
        raise FormatError(
            f"{name}: {location!r} is an HDF5 file and h5py is not installed: pip install h5py "
            f"(or pip install 'slem-dask[hdf5]'), or convert the dataset to .npy or zarr"
        ) from None
    return h5py


def _datasets(f) -> list[str]:
    import h5py

    found = []
    f.visititems(
        lambda key, obj: found.append("/" + key) if isinstance(obj, h5py.Dataset) else None
    )
    return found


def _group_given(group, file: str, dataset: str, name: str) -> str:
    """Why a group named as the dataset of rows is refused, offering its 2-D datasets."""
    inside = [k for k in _datasets(group) if group[k.lstrip("/")].ndim == 2][:6]
    shown = " or ".join(f"{file}:{group.name.rstrip('/')}/{k.lstrip('/')}" for k in inside)
    return f"{name}: {dataset!r} in the HDF5 file {file!r} is a group, not a dataset; " + (
        f"name its dataset of rows: {shown}"
        if inside
        else f"it holds no 2-D dataset: name one of rows as {file}:/dataset"
    )


def _open_hdf5(path: StorePath, file: str, dataset: str | None, name: str) -> FileArray:
    h5py = _h5py(file, name)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{name}: no HDF5 file at {file!r}")
    try:
        f = h5py.File(file, "r")
    except OSError as exc:
        raise FormatError(
            f"{name}: {file!r} is not a readable HDF5 file ({exc}); give an "
            f"HDF5 file, or convert it to .npy or zarr"
        ) from None
    with f:
        if dataset is None:
            found = _datasets(f)
            two_d = [k for k in found if f[k].ndim == 2]
            if len(two_d) != 1:
                raise FormatError(_no_single_2d_dataset(f, file, found, two_d, name))
            dataset = two_d[0]
        node = f.get(dataset)
        if isinstance(node, h5py.Group):
            raise FormatError(_group_given(node, file, dataset, name))
        if not isinstance(node, h5py.Dataset):
            raise FormatError(
                f"{name}: the HDF5 file {file!r} has no dataset {dataset!r} (datasets: "
                f"{', '.join(_datasets(f)[:6]) or 'none'}); name one as {file}:/dataset"
            )
        if node.ndim != 2:
            raise FormatError(
                f"{name}: the HDF5 dataset {file}:{dataset} has shape "
                f"{node.shape}; expected 2-D rows (n_rows, n_features){_reshape_hint(node)}"
            )
        if node.shape[0]:
            try:
                node[0:1]  # a filter that is not installed fails here, not in a task
            except Exception as exc:  # noqa: BLE001 - h5py raises several types
                raise FormatError(
                    f"{name}: the HDF5 dataset {file}:{dataset} cannot be read ({exc}); "
                    f"its compression filter may need `pip install hdf5plugin`, or "
                    f"convert it to .npy or zarr"
                ) from None
        unit = int(node.chunks[0]) if node.chunks else 1
        part = _part(file, 0, int(node.shape[0]))
        return FileArray(
            "hdf5",
            path.url,
            (part,),
            (int(node.shape[0]), int(node.shape[1])),
            node.dtype.newbyteorder("="),
            unit,
            dataset,
            stored_in_chunks=node.chunks is not None,
        )


def _open_texmex(path: StorePath, file: str, fmt: str, name: str) -> FileArray:
    kind = TEXMEX["." + fmt]
    size = os.path.getsize(file)
    if size < 4:
        raise FormatError(f"{name}: the .{fmt} file {file!r} is {size} bytes: it holds no rows")
    with open(file, "rb") as f:
        d = int(np.frombuffer(f.read(4), "<i4")[0])
    width = 4 + d * kind.itemsize
    if d >= 1 and size % width and _whole_rows_agree(file, d, width, size):
        rows = size // width
        raise FormatError(
            f"{name}: the .{fmt} file {file!r} is cut short: its rows are 4 + {d} x "
            f"{kind.itemsize} bytes (dimension {d}), and it holds {rows} whole rows and "
            f"{size % width} bytes of one more (a copy or write that stopped early); "
            f"copy it again, or keep its whole rows (truncate -s {rows * width} FILE)"
        )
    if d < 1 or size % width:
        raise FormatError(
            f"{name}: {file!r} is not a .{fmt} file: its first row declares dimension {d}, "
            f"and its size ({size} bytes) is not a whole number of rows of 4 + {d} x "
            f"{kind.itemsize} bytes; check its suffix (.fvecs float32, .bvecs uint8, "
            f".ivecs int32)"
            if d >= 1
            else f"{name}: {file!r} is not a .{fmt} file: its first row declares dimension {d}"
        )
    part = _part(file, 0, size // width)
    return FileArray(fmt, path.url, (part,), (part.rows, d), kind.newbyteorder("="))
