"""Descriptors that are not zarr: ``.npy`` files and shards, HDF5 datasets, TEXMEX
(fvecs, bvecs, ivecs). ``formats`` opens them as row arrays; ``formats_detect`` which
format a path holds; ``format_messages`` the one-line refusals. ``_h5py`` and
``_datasets`` (opening an HDF5 file, listing its datasets) serve the ground truth's reader.

Imports ``storage.backends`` only (its store paths).
"""

from .formats import (  # noqa: F401
    SUPPORTED,
    FileArray,
    FormatError,
    Part,
    _datasets,
    _h5py,
    open_file_input,
)
from .formats_detect import file_format, remote_format, split_hdf5  # noqa: F401
