"""Nearest-neighbour ground truth for ``slem-dask evaluate --ground-truth``: the ids of each
query's true nearest database rows, nearest first, as the ANN world ships them (TEXMEX
``.ivecs`` such as SIFT1M's ``sift_groundtruth.ivecs``, ann-benchmarks' HDF5 ``neighbors``,
or a ``.npy`` / zarr array of shape (queries, k))."""

from __future__ import annotations

import numpy as np

from .. import storage
from ..retrieval.metrics import check_neighbors
from ..storage import formats

__all__ = ["GROUND_TRUTH_OPTION", "read_ground_truth"]

#: The option of ``slem-dask evaluate`` that names the ground truth (in messages).
GROUND_TRUTH_OPTION = "--ground-truth"
_FIX = (
    "give the ids of each query's nearest --database rows, nearest first, as a (queries, k) "
    ".ivecs, .npy, zarr array or HDF5 dataset (ann-benchmarks: FILE.hdf5:/neighbors)"
)


def read_ground_truth(
    path: str, n_queries: int, n_database: int, name: str = GROUND_TRUTH_OPTION
) -> np.ndarray:
    """The ground truth at ``path`` as int64 (n_queries, k), checked (shape, integer
    dtype, ids in [0, n_database)); an ann-benchmarks HDF5 file given without a dataset
    is read at its ``neighbors``. Every refusal is one line naming ``name``."""
    where = storage.canonical(path)
    fmt = formats.file_format(where.location) if where.is_local else None
    shown = f"{name} {str(where)!r}"
    if fmt in ("fvecs", "bvecs"):
        raise ValueError(
            f"{shown} is a .{fmt} file of vectors, not neighbour ids; give the .ivecs ground "
            f"truth (TEXMEX: e.g. sift_groundtruth.ivecs)"
        )
    if fmt == "hdf5":
        ids = _read_hdf5(where.location, shown)
    elif fmt == "npy":
        try:
            ids = np.load(where.location, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            raise ValueError(
                f"{shown} cannot be read as a .npy array ({exc}); save the ids with "
                f"np.save(path, ids.astype(np.int64))"
            ) from None
    elif fmt is None and where.is_local:
        ids = _read_zarr(str(where), shown)
    else:  # .ivecs, shards, remote files: the descriptors' readers (always 2-D)
        arr = storage.open_input(str(where), name)
        ids = storage.read_rows(arr, 0, arr.shape[0], name)
    return check_neighbors(np.asarray(ids), n_queries, n_database, name=shown, fix=_FIX)


def _read_zarr(path: str, shown: str) -> np.ndarray:
    import zarr

    try:
        node = storage.open_node(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{shown}: no such file or zarr array; {_FIX}") from None
    if not isinstance(node, zarr.Array):
        members = sorted(k for k, v in node.members() if isinstance(v, zarr.Array))
        raise ValueError(
            f"{shown} is a zarr group (arrays: {', '.join(members) or 'none'}); give the "
            f"array of neighbour ids inside it"
        )
    return node[...]


def _read_hdf5(location: str, shown: str) -> np.ndarray:
    """The named dataset, or else the file's one dataset called ``neighbors``."""
    file, dataset = formats.split_hdf5(location)
    h5py = formats._h5py(file, shown)
    try:
        f = h5py.File(file, "r")
    except OSError as exc:
        raise ValueError(f"{shown} is not a readable HDF5 file ({exc}); {_FIX}") from None
    with f:
        found = formats._datasets(f)
        if dataset is None:
            named = [k for k in found if k.rsplit("/", 1)[-1] == "neighbors"]
            if len(named) != 1:
                raise ValueError(
                    f"{shown} has {len(named) or 'no'} datasets called neighbors (datasets: "
                    f"{', '.join(found[:6]) or 'none'}); name the ids' dataset as "
                    f"{file}:/dataset"
                )
            dataset = named[0]
        node = f.get(dataset)
        if not isinstance(node, h5py.Dataset):
            raise ValueError(
                f"{shown} has no dataset {dataset!r} (datasets: "
                f"{', '.join(found[:6]) or 'none'}); name the ids' dataset as {file}:/dataset"
            )
        return node[...]
