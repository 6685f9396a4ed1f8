"""Google Cloud Storage as a :class:`~slem_dask.storage.backends.backend.Backend`, through
gcsfs (which zarr reads and writes the arrays' chunks through, too).

The atomic create is an upload with ``ifGenerationMatch=0``: GCS refuses it with 412
when the object exists, and at most one of racing writers succeeds.

Configuration is gcsfs's and google-auth's: credentials from
``GOOGLE_APPLICATION_CREDENTIALS`` (a service-account key file), ``gcloud auth
application-default login`` or the metadata server of a Google Cloud machine; an
emulator's address from ``STORAGE_EMULATOR_HOST``; keyword arguments given to
:class:`GCSBackend` go to ``gcsfs.GCSFileSystem`` (``token``, ``project``,
``endpoint_url``…) and take precedence.
"""

from __future__ import annotations

import asyncio
import os
import sys
import weakref

from .cloud import EVERY_WORKER, BucketBackend, at_exit_before_zarr, chain, http_kind
from .outcomes import REFUSED, UNREACHABLE, AccessRefusedError

__all__ = ["GCSBackend"]


def _close_sessions_at_exit() -> None:
    """Close each gcsfs file system's aiohttp session on the loop it was opened on (zarr's,
    for the file systems zarr reads chunks through) while that loop still runs: gcsfs's
    own finalizer closes it on fsspec's loop at exit, which printed 'attached to a
    different loop' and 'Task was destroyed but it is pending!' after every Python read
    of gs://. Python keeps the finalizers in a private registry: if it is not there,
    nothing is done. Without gcsfs imported there is no such file system: importing it
    here would cost every command's exit 0.3 s (grpc, google-auth), and a Ctrl-C then
    printed an import's traceback after a finished job."""
    GCSFileSystem = getattr(sys.modules.get("gcsfs"), "GCSFileSystem", None)
    if GCSFileSystem is None:
        return
    for info in list(getattr(weakref.finalize, "_registry", {}).values()):
        fs = info.weakref()
        session = getattr(fs, "_session", None) if isinstance(fs, GCSFileSystem) else None
        loop = getattr(session, "_loop", None)
        if session is None or session.closed or loop is None or not loop.is_running():
            continue
        try:
            asyncio.run_coroutine_threadsafe(session.close(), loop).result(timeout=2)
        except Exception:  # noqa: BLE001 - closing at exit: nothing left to tell
            pass


at_exit_before_zarr(_close_sessions_at_exit)


class GCSBackend(BucketBackend):
    """Objects under ``gs://bucket/prefix``."""

    protocols = ("gs", "gcs")
    env_prefixes = ("GOOGLE_", "STORAGE_EMULATOR_HOST", "GCSFS_", "CLOUDSDK_", "NO_GCE_CHECK")
    service = "Google Cloud Storage"
    client_modules = (
        ("aiohttp", "ClientError"),
        ("gcsfs.retry", "HttpError"),
        ("google.auth.exceptions", "GoogleAuthError"),
    )
    client, extra = "gcsfs", "gcs"
    endpoint_variable = "STORAGE_EMULATOR_HOST (unset for GCS itself)"

    _zonal: bool | None = None

    @property
    def atomic_create(self) -> bool:  # type: ignore[override]  # Backend: a class attribute
        return not self._is_zonal()

    def _is_zonal(self) -> bool:
        """Whether the bucket is a zonal one (Rapid storage), asked once. There gcsfs
        writes over gRPC appendable objects, and its create-only upload overwrites an
        existing object (gcsfs 2026.10, extended_gcsfs.simple_upload)."""
        if self._zonal is None:
            from fsspec.asyn import sync

            probe = getattr(self.fs, "_is_zonal_bucket", None)  # the extended gcsfs only
            self._zonal = bool(probe and sync(self.fs.loop, probe, self.bucket))
        return self._zonal

    def _create(self, path: str, data: bytes) -> bool:
        if self._is_zonal():
            from .backend import StorageConfigError

            raise StorageConfigError(
                f"{self.root}: bucket {self.bucket!r} is a zonal bucket, where gcsfs's "
                "create-only upload overwrites, so slem-dask cannot commit there safely; "
                "use a bucket of another storage class"
            )
        try:  # gcsfs: ifGenerationMatch=0, and a 412 raised as FileExistsError
            self.fs.pipe_file(path, data, mode="create")
            return True
        except FileExistsError:
            return False

    def _bucket_exists(self) -> bool:
        from fsspec.asyn import sync

        try:  # a listing of one object: storage.objects.list suffices (buckets.get
            # is not in roles/storage.objectAdmin)
            sync(
                self.fs.loop,
                self.fs._call,
                "GET",
                "b/{}/o",
                self.bucket,
                maxResults=1,
                json_out=True,
            )
            return True
        except FileNotFoundError:
            return False

    # -- errors --------------------------------------------------------------

    def _client_kind(self, exc: Exception) -> type[OSError] | None:
        """gcsfs's and google-auth's failures, as the outcome kinds (the one place that
        knows them): an ``HttpError`` by its status (a 503 left after gcsfs's retries
        may have been applied), a 403 (an ``OSError("Forbidden: ...")``) refused, a
        502 (a ``requests`` ProxyError) unknown, credentials that cannot be had refused
        before any request, a token server that cannot be reached unreachable."""
        from gcsfs.retry import HttpError
        from google.auth import exceptions as gx

        if isinstance(exc, HttpError):
            return http_kind(exc.code if isinstance(exc.code, int) else None)
        if isinstance(exc, OSError) and str(exc).startswith("Forbidden"):
            return AccessRefusedError
        if isinstance(exc, gx.TransportError):
            return UNREACHABLE  # the token was not had: no request reached the store
        if isinstance(exc, (gx.RefreshError, gx.DefaultCredentialsError)):
            return AccessRefusedError
        if isinstance(exc, gx.GoogleAuthError):
            return REFUSED
        return None

    def _endpoint(self) -> str:
        return (
            self.storage_options.get("endpoint_url")
            or os.environ.get("STORAGE_EMULATOR_HOST")
            or "https://storage.googleapis.com"
        )

    def _describe_error(self, exc: BaseException) -> str | None:
        import aiohttp
        import google.auth.exceptions as gx

        key_file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        for e in chain(exc):
            if isinstance(e, (aiohttp.ClientConnectorError, ConnectionRefusedError)):
                return (
                    f"cannot reach Google Cloud Storage at {self._endpoint()} for "
                    f"{self.root}: start it, or fix STORAGE_EMULATOR_HOST (unset for "
                    f"GCS itself) {EVERY_WORKER}"
                )
            if (
                isinstance(e, gx.GoogleAuthError)
                or getattr(e, "code", None) == 401
                or (isinstance(e, OSError) and str(e).startswith("Forbidden"))
            ):
                if key_file and not os.path.isfile(key_file):
                    return (
                        f"GOOGLE_APPLICATION_CREDENTIALS names no file ({key_file}), "
                        f"so {self.root} was tried without credentials: set it to a "
                        f"service-account key file {EVERY_WORKER}"
                    )
                if isinstance(e, OSError):  # 403: who it is is known, what it may do not
                    return (
                        f"access denied to {self.root} (403 Forbidden): the identity "
                        "of GOOGLE_APPLICATION_CREDENTIALS needs storage.objects "
                        f"get, create, list and delete on bucket {self.bucket!r} "
                        f"(roles/storage.objectAdmin) {EVERY_WORKER}"
                    )
                return (
                    f"Google Cloud Storage refused the credentials for {self.root}: "
                    "set GOOGLE_APPLICATION_CREDENTIALS to a valid service-account key "
                    f"file, or run `gcloud auth application-default login` {EVERY_WORKER}"
                )
        return self._missing_bucket_line(exc, self._endpoint(), "STORAGE_EMULATOR_HOST")
