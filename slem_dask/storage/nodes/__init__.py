"""What reads and writes zarr nodes: inputs, encoded outputs, models and search results.

``inputs`` opening what a job reads; ``chunks`` reading rows, every missing or damaged
chunk named; ``fingerprints`` what a job read; ``checksums`` crc32c of every chunk,
SHA-256 of models and metadata (``recorded`` the chunk crcs a version records);
``outputs`` encoded outputs (one chunk per partition); ``groups`` models and search
results (small arrays, written whole); ``readers`` zarr, xarray (``xarrays``,
``dimensions``) and dask readers of one committed version; ``export`` a plain copy of
one version; ``workers`` checking that every worker sees the stores as the client does;
``verify`` ``slem-dask verify`` (``export`` and ``verify`` are each a module and a
function of that name: import them from their module, or ``export`` from here as
``export_version``).

Imports ``storage.backends``, ``storage.versioning`` and ``storage.formats``.
"""

from .export import export as export_version  # noqa: F401 - the name export is the module's
from .readers import VersionStore, open_dataset, open_zarr  # noqa: F401
