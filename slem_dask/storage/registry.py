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

__all__ = ["backend_for", "describe_storage_error"]


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


def describe_storage_error(exc: BaseException, paths) -> str | None:
    """One line for an object store's failure (credentials, bucket, endpoint) met while
    a command worked on ``paths``, naming the path and the fix; None for any other error."""
    for path in paths:
        if "://" not in str(path) or str(path).startswith(("file://", "memory://")):
            continue
        try:
            backend = backend_for(str(path))
        except Exception:  # noqa: BLE001 - no such backend installed: nothing to say
            continue
        line = backend.describe_error(exc)
        if line:
            return line
    return None
