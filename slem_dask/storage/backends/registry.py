"""Which backend holds a store URL: the one place that knows every backend module
(:mod:`.local`, :mod:`.s3`, :mod:`.gcs`, :mod:`.azure`, :mod:`.fsspec_backend`), each
of which imports only the interface, :mod:`.backend`. Their client libraries (s3fs,
gcsfs, adlfs) are imported by the backends on first use, so this module costs none of
them."""

from __future__ import annotations

from .azure import AzureBackend
from .backend import Backend
from .fsspec_backend import FsspecBackend
from .gcs import GCSBackend
from .local import LocalBackend
from .s3 import S3Backend

__all__ = ["backend_for", "is_storage_failure"]


def backend_for(url: str) -> Backend:
    """The backend of a canonical store URL (``file:///abs/path``, ``s3://bucket/key``,
    ``gs://bucket/key``, ``az://container/key``, ``memory://…``; other fsspec protocols
    go through :mod:`.fsspec_backend`)."""
    if url.startswith("file://"):
        return LocalBackend(url[len("file://") :])
    if url.startswith(("s3://", "s3a://")):
        return S3Backend(url)
    if url.startswith(("gs://", "gcs://")):
        return GCSBackend(url)
    if url.startswith(("az://", "abfs://", "abfss://")):
        return AzureBackend(url)
    return FsspecBackend(url)


def is_storage_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or one it was raised from) is a failure of a storage request: one
    of the outcome kinds a backend raises, or a client library's own exception raised
    where zarr reached the store itself. A reader must not call it damage ("not a zarr
    group"): the store did not answer, the data may be right."""
    from .outcomes import StorageError

    types = (StorageError,) + tuple(
        t
        for cls in (S3Backend, GCSBackend, AzureBackend, LocalBackend, FsspecBackend)
        for t in cls.client_exceptions()
    )
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, types):
            return True
        cause = cause.__cause__ or cause.__context__
    return False
