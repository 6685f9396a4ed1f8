"""Storage: every byte slem-dask reads or writes, and the rules that make "complete"
mean "right". Four subpackages, each importing only the ones above it in this list:

==============  ===========================================================================
``backends``    the bytes under a path: one module per storage (``local``, ``s3``, ``gcs``,
                ``azure``, ``fsspec_backend``) behind ``backend``, one error model
                (``outcomes``), the deadlines of every request, canonical store ``paths``
``versioning``  the versioned-store protocol: drafts, atomic commits (``versions``,
                ``records``, ``heads``, ``publish``, ``rollback``), one writer per store
                (``leases``), garbage and fencing (``gc``, ``markers``), what slem-dask
                wrote and may replace (``ownership``), the errors of a guarantee
``formats``     descriptors that are not zarr (``.npy``, shards, HDF5, TEXMEX)
``nodes``       what reads and writes zarr nodes: ``inputs``, ``chunks``, ``fingerprints``,
                ``checksums``, ``outputs`` (encodings), ``groups`` (models, search
                results), ``readers``, ``export``, ``workers``, ``verify``
==============  ===========================================================================

Each subpackage's ``__init__`` names what it offers. Layout and contracts:
docs/operations.md ("Versioned stores", "Integrity guarantees", "Zarr layout"),
docs/guarantees-protocol.md and docs/guarantees-garbage.md. The names below are this
package's interface; the jobs use them as ``storage.NAME`` (or a subpackage's face's
names), never a module inside (tests/system/test_import_layers.py). The flat paths of before the
split (``slem_dask.storage.versions``, ...) still import (``moved``).
"""

from __future__ import annotations

from .moved import install as _install_moved

from .versioning import versions  # noqa: F401
from .nodes.checksums import (  # noqa: F401
    CHECKSUM,
    chunk_key,
    delete_chunk,
    fingerprint,
    json_params,
    metadata_checksum,
    recorded_crc32c,
    self_consistent_crc32c,
    stored_crc32c,
)
from .nodes.chunks import (  # noqa: F401
    DEFAULT_PARTITION_BYTES,
    SmallChunksWarning,
    _RowChunkCodecs,
    _reason,
    _where,
    _zstd_content_size,
    chunk_keys_for_rows,
    iter_chunk_keys,
    dask_rows,
    read_rows,
    row_partition,
    small_chunks_hint,
)
from .versioning.errors import (  # noqa: F401
    CorruptChunkError,
    DamagedMetadataError,
    DamagedStoreError,
    IntegrityError,
    MissingChunkError,
    StorageViewError,
    is_out_of_space,
    missing_chunk_error,
)
from .nodes.fingerprints import (  # noqa: F401
    partition_fingerprints,
    read_version,
    rows_fingerprint,
    unit_rows,
)
from .nodes.groups import (  # noqa: F401
    ARRAY_SHA256,
    GROUP_CHUNK_BYTES,
    MODEL_FORMAT_VERSION,
    _check_written,
    open_written_group,
    read_group_arrays,
    read_search_store,
    replace_legacy,
    write_group,
    write_model_store,
)
from .nodes.member_reads import MemberCast  # noqa: F401
from .nodes.model_reads import read_model_meta, read_model_store  # noqa: F401
from .nodes.inputs import (  # noqa: F401
    _exists,
    _key,
    check_distinct,
    open_input,
    open_node,
    open_output,
    read_all,
    read_labels,
)
from .backends.outcomes import (  # noqa: F401
    AccessRefusedError,
    OutcomeUnknownError,
    StorageError,
    StorageRefusedError,
    StoreUnreachableError,
)
from .versioning.leases import LEASE_TTL, Lease, LeaseHeldError, LeaseLostError  # noqa: F401
from .versioning.gc import DraftFencedError  # noqa: F401
from .versioning.publish import CommitConflictError, CommitUnknownError  # noqa: F401
from .versioning.transaction import Transaction  # noqa: F401
from .versioning.versions import VersionedStore  # noqa: F401
from .nodes.outputs import (  # noqa: F401
    create_output,
    head_seq,
    is_legacy,
    mark_complete,
    marked_complete,
    open_existing_output,
    output_meta,
    remove_stray_partials,
    update_meta,
    write_partition,
)
from .versioning.ownership import (  # noqa: F401
    ATTR,
    KIND_NAMES,
    KINDS,
    check_may_replace,
    damaged_metadata,
    remove,
    slem_dask_kind,
    unreadable_document,
    unreadable_marker,
)
from .backends.paths import (  # noqa: F401
    StorePath,
    canonical,
    check_outside_inputs,
    exists,
    shown_path,
)
from .nodes.readers import VersionStore, open_dataset, open_zarr  # noqa: F401
from .nodes.verify import rollback, verify  # noqa: F401
from .nodes.workers import check_workers_see, listed_workers, store_signature  # noqa: F401

__all__ = [
    "ATTR",
    "open_input",
    "open_node",
    "dask_rows",
    "read_rows",
    "read_all",
    "row_partition",
    "fingerprint",
    "write_model_store",
    "read_model_store",
    "MemberCast",
    "ARRAY_SHA256",
    "read_model_meta",
    "create_output",
    "mark_complete",
    "open_output",
    "verify",
    "rollback",
    "versions",
    "Lease",
    "Transaction",
    "VersionedStore",
    "canonical",
    "VersionStore",
    "open_zarr",
    "open_dataset",
]

_install_moved()
