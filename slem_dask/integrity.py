"""The data-integrity rules of slem-dask live in :mod:`slem_dask.storage`, one concern
per module (paths, ownership, leases, versions, checksums, fingerprints, workers); this
module keeps their names where earlier code and tests look for them."""

from __future__ import annotations

from .storage.checksums import (  # noqa: F401
    _full_key, _store_get, delete_chunk, self_consistent_crc32c, stored_crc32c)
from .storage.errors import (  # noqa: F401
    CorruptChunkError, DamagedMetadataError, DamagedStoreError, IntegrityError,
    MissingChunkError, StorageViewError, is_out_of_space, missing_chunk_error)
from .storage.chunks import chunk_keys_for_rows, iter_chunk_keys, unit_rows  # noqa: F401
from .storage.fingerprints import (  # noqa: F401
    _listing, partition_fingerprints, rows_fingerprint)
from .storage.leases import LEASE_TTL, Lease, LeaseHeldError, LeaseLostError  # noqa: F401
from .storage.ownership import (  # noqa: F401
    ATTR, KINDS, check_may_replace, damaged_metadata, remove, slem_dask_kind,
    unreadable_document, unreadable_marker)
from .storage.paths import (  # noqa: F401
    StorePath, _relation, canonical, check_outside_inputs, exists)
from .storage.workers import check_workers_see, store_signature  # noqa: F401
