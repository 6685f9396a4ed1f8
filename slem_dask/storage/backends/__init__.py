"""Backends: the bytes under a path, one module per storage and one error model.

``backend`` the interface (atomic create-if-absent, read, list, delete), with ``local``
(POSIX), ``s3``, ``gcs``, ``azure`` (``cloud`` what the buckets share; ``*_client`` their
clients' file systems, which carry ``deadlines``; ``s3_messages`` S3's refusals in one
line) and ``fsspec_backend`` (other); ``registry`` picks the backend of a URL;
``outcomes`` the few kinds of failure every backend raises (each backend maps its
client's exceptions at its boundary); ``paths`` canonical store paths.

Imports nothing of slem_dask: the versioning protocol, the formats and the nodes stand on it.
"""

from .deadlines import ENV_TIMEOUT, LOOK_SECONDS, answer_within  # noqa: F401
from .backend import Backend, StorageConfigError, check_conditional_writes  # noqa: F401
from .outcomes import (  # noqa: F401
    AccessRefusedError,
    OutcomeUnknownError,
    StorageError,
    StorageRefusedError,
    StoreUnreachableError,
)
from .paths import (  # noqa: F401
    StorePath,
    canonical,
    check_outside_inputs,
    exists,
    shown_path,
    zarr_store,
)
from .registry import backend_for, is_storage_failure  # noqa: F401
