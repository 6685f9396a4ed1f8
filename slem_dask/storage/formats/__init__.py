"""Descriptors that are not zarr: ``.npy`` files and shards, HDF5 datasets, TEXMEX
(fvecs, bvecs, ivecs). ``formats`` opens them as row arrays; ``formats_detect`` which
format a path holds; ``format_messages`` the one-line refusals.

Imports ``storage.backends`` only (its store paths).
"""

from .formats import SUPPORTED, FileArray, FormatError, Part, open_file_input  # noqa: F401
from .formats_detect import file_format, remote_format, split_hdf5  # noqa: F401
