"""Storage: every byte slem-dask reads or writes, and the rules that make "complete"
mean "right". One concern per module:

=================  =========================================================================
``paths``          canonical store paths; nothing written over or inside an input
``backend``        one interface to the bytes under a path (atomic create-if-absent), with
                   ``local`` (POSIX), ``s3`` (S3 through s3fs), ``gcs`` and ``azure`` (through
                   gcsfs, adlfs; ``cloud`` what they share; ``s3_messages`` S3's refusals
                   in one line) and ``fsspec_backend`` (other);
                   ``registry`` picks the backend of a URL; ``outcomes`` the few kinds
                   of failure every backend raises (its client's exceptions mapped)
``deadlines``      the connect and read timeouts and bounded tries of every object-store
                   request (``s3_client``, ``gcs_client``, ``azure_client``: the clients'
                   file systems that carry them, whoever makes them)
``versions``       versioned stores: drafts, atomic commits, snapshot reads, history, rollback
``records``        the commit record's format; ``heads`` finding the head from ``commits/.head``
``publish``        creating a commit record and reading it back; ``rollback`` its copy-and-commit
``gc``             what is garbage under a store, settled by fate files, and its deletion
``markers``        whose a version folder is (its marker, trusted by content); no shared folder
``rootmarker``     ``P/zarr.json``: what plain zarr finds at a store's own path
``leases``         one writer per store, liveness judged without comparing hosts' clocks
``ownership``      what slem-dask wrote and may replace; nothing else is deleted
``checksums``      crc32c of every chunk, SHA-256 of models and metadata
``fingerprints``   what a job read: a committed version, or a plain array's chunk listing
``chunks``         reading rows, every missing or damaged chunk named
``inputs``         opening what a job reads
``groups``         models and search results (small arrays, written whole)
``outputs``        encoded outputs (one chunk per partition)
``readers``        zarr, xarray and dask readers of one committed version
``export``         ``slem-dask export``: a plain copy of one version
``formats``        descriptors that are not zarr (``.npy``, shards, HDF5, TEXMEX);
                   ``formats_detect`` which format a path holds
``workers``        checking that every worker sees the stores as the client does
``verify``         ``slem-dask verify``
``errors``         the errors by which a guarantee is kept
=================  =========================================================================

Layout and contracts: docs/operations.md ("Versioned stores", "Integrity guarantees",
"Zarr layout"), docs/guarantees-protocol.md and docs/guarantees-garbage.md. The names below
are this package's interface; the jobs use them as ``storage.NAME``.
"""

from __future__ import annotations

from . import versions  # noqa: F401
from .checksums import (  # noqa: F401
    CHECKSUM,
    delete_chunk,
    fingerprint,
    json_params,
    metadata_checksum,
    recorded_crc32c,
    self_consistent_crc32c,
    stored_crc32c,
)
from .chunks import (  # noqa: F401
    DEFAULT_PARTITION_BYTES,
    _RowChunkCodecs,
    _reason,
    _where,
    _zstd_content_size,
    chunk_keys_for_rows,
    iter_chunk_keys,
    dask_rows,
    read_rows,
    row_partition,
)
from .errors import (  # noqa: F401
    CorruptChunkError,
    DamagedMetadataError,
    DamagedStoreError,
    IntegrityError,
    MissingChunkError,
    StorageViewError,
    is_out_of_space,
    missing_chunk_error,
)
from .fingerprints import (  # noqa: F401
    partition_fingerprints,
    read_version,
    rows_fingerprint,
    unit_rows,
)
from .groups import (  # noqa: F401
    GROUP_CHUNK_BYTES,
    MODEL_FORMAT_VERSION,
    _check_written,
    read_group_arrays,
    read_model_meta,
    read_model_store,
    read_search_store,
    replace_legacy,
    write_group,
    write_model_store,
)
from .inputs import (  # noqa: F401
    _exists,
    _key,
    check_distinct,
    open_input,
    open_node,
    open_output,
    read_all,
    read_labels,
)
from .outcomes import (  # noqa: F401
    AccessRefusedError,
    OutcomeUnknownError,
    StorageError,
    StorageRefusedError,
    StoreUnreachableError,
)
from .leases import LEASE_TTL, Lease, LeaseHeldError, LeaseLostError  # noqa: F401
from .outputs import (  # noqa: F401
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
from .ownership import (  # noqa: F401
    ATTR,
    KINDS,
    check_may_replace,
    damaged_metadata,
    remove,
    slem_dask_kind,
    unreadable_document,
    unreadable_marker,
)
from .paths import StorePath, canonical, check_outside_inputs, exists  # noqa: F401
from .readers import VersionStore, open_dataset, open_zarr  # noqa: F401
from .verify import verify  # noqa: F401
from .workers import check_workers_see, store_signature  # noqa: F401

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
    "read_model_meta",
    "create_output",
    "mark_complete",
    "open_output",
    "verify",
    "versions",
    "Lease",
    "canonical",
    "VersionStore",
    "open_zarr",
    "open_dataset",
]
