"""Azure Blob Storage (and ADLS Gen2) as a :class:`~slem_dask.storage.backends.backend.Backend`,
through adlfs (which zarr reads and writes the arrays' chunks through, too).

The atomic create is a Put Blob with ``If-None-Match: *``: Azure refuses it with 409
BlobAlreadyExists when the blob exists, and at most one of racing writers succeeds.

Configuration is adlfs's: ``AZURE_STORAGE_CONNECTION_STRING``, or
``AZURE_STORAGE_ACCOUNT_NAME`` with ``AZURE_STORAGE_ACCOUNT_KEY`` (or
``AZURE_STORAGE_SAS_TOKEN``, or a service principal's ``AZURE_STORAGE_CLIENT_ID`` /
``_SECRET`` / ``AZURE_STORAGE_TENANT_ID``); keyword arguments given to
:class:`AzureBackend` go to ``adlfs.AzureBlobFileSystem`` and take precedence.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import weakref

from .cloud import EVERY_WORKER, BucketBackend, at_exit_before_zarr, chain, http_kind
from .outcomes import UNKNOWN, UNREACHABLE, AccessRefusedError

__all__ = ["AzureBackend"]

_COPY_POLL = 0.05  # seconds between looks at a pending server-side copy
_COPY_BATCH = 64


def _close_clients_at_exit() -> None:
    """Run adlfs's finalizers (which close each file system's Azure client through its
    event loop) before zarr's exit handler stops zarr's loop: run after it, each printed
    a 'Loop is not running' traceback at the end of every command on az://. Python
    keeps the finalizers in a private registry: if it is not there, nothing is done.
    Without adlfs imported there is no such file system, and nothing to import."""
    AzureBlobFileSystem = getattr(sys.modules.get("adlfs"), "AzureBlobFileSystem", None)
    if AzureBlobFileSystem is None:  # never imported: no finalizers of its own to run
        return

    for finalizer, info in list(getattr(weakref.finalize, "_registry", {}).items()):
        if isinstance(info.weakref(), AzureBlobFileSystem):
            try:
                finalizer()
            except Exception:  # noqa: BLE001 - closing at exit: nothing left to tell
                pass


at_exit_before_zarr(_close_clients_at_exit)


class AzureBackend(BucketBackend):
    """Blobs under ``az://container/prefix`` (``abfs://`` is the same store)."""

    protocols = ("az", "abfs", "abfss")
    env_prefixes = ("AZURE_",)
    service = "Azure Blob Storage"
    client_modules = (("aiohttp", "ClientError"), ("azure.core.exceptions", "AzureError"))
    client, extra = "adlfs", "azure"
    bucket_word = "container"
    endpoint_variable = "the BlobEndpoint of AZURE_STORAGE_CONNECTION_STRING"

    def __init__(self, url: str, **storage_options):
        super().__init__(url, **storage_options)
        # abfs[s]://container@account.dfs.core.windows.net/path (Spark's and Azure's own
        # form): the account from the host, as adlfs reads it when zarr opens the URL
        container, at, host = self.bucket.partition("@")
        if at:
            self.bucket = container
            account = re.match(r"([^.]+)\.(dfs|blob)\.core\.windows\.net$", host)
            if account and "account_name" not in storage_options:
                self.storage_options["account_name"] = account.group(1)

    def __reduce__(self):  # the options as given: the URL still names the account
        import functools

        options = {
            k: v
            for k, v in self.storage_options.items()
            if k != "account_name" or "@" not in self.root
        }
        return functools.partial(type(self), self.root, **options), ()

    def _sync(self, coro_fn, *args):
        from fsspec.asyn import sync

        return sync(self.fs.loop, coro_fn, *args)

    def _create(self, path: str, data: bytes) -> bool:
        try:  # adlfs: overwrite=False, sent as If-None-Match: *; 409 as FileExistsError
            self.fs.pipe_file(path, data, mode="create")
            return True
        except FileExistsError:
            return False

    def _bucket_exists(self) -> bool:
        from azure.core.exceptions import ResourceNotFoundError

        async def exists():  # a listing of one blob: list permission suffices (a
            # container SAS may not read the container's properties)
            container = self.fs.service_client.get_container_client(self.bucket)
            try:
                async for _ in container.list_blobs(results_per_page=1).by_page():
                    break
                return True
            except ResourceNotFoundError:
                return False

        return self._sync(exists)

    def _copy_all(self, pairs: list[tuple[str, str]]) -> None:
        """Copy Blob of each pair, waiting for those the service runs in the
        background (it may, even within one account) until they have succeeded."""
        self._sync(self._copy_pairs, pairs)

    async def _copy_pairs(self, pairs):
        for i in range(0, len(pairs), _COPY_BATCH):
            await asyncio.gather(*[self._copy(s, d) for s, d in pairs[i : i + _COPY_BATCH]])

    async def _copy(self, src: str, dst: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        container = self.fs.service_client.get_container_client(self.bucket)
        source = container.get_blob_client(src.split("/", 1)[1])
        target = container.get_blob_client(dst.split("/", 1)[1])
        try:
            status = (await target.start_copy_from_url(source.url))["copy_status"]
        except ResourceNotFoundError as exc:
            raise FileNotFoundError(f"cannot copy {self.protocol}://{src}: no such blob") from exc
        while status == "pending":
            await asyncio.sleep(_COPY_POLL)
            status = (await target.get_blob_properties()).copy.status
        if status != "success":
            raise OSError(
                f"the copy of {self.protocol}://{src} to {self.protocol}://{dst} ended {status!r}"
            )

    # -- errors --------------------------------------------------------------

    def _client_kind(self, exc: Exception) -> type[OSError] | None:
        """azure-core's failures, as the outcome kinds (the one place that knows them):
        ``ServiceRequestError`` sent nothing (unreachable), ``ServiceResponseError``
        sent the request and lost the reply (unknown), ``HttpResponseError`` by its
        status (a 503 left after the SDK's retries may have been applied)."""
        from azure.core import exceptions as ax

        if isinstance(exc, ax.ServiceRequestError):
            return UNREACHABLE
        if isinstance(exc, ax.ServiceResponseError):
            return UNKNOWN
        if isinstance(exc, ax.ClientAuthenticationError):
            return AccessRefusedError
        if isinstance(exc, ax.HttpResponseError):
            return http_kind(exc.status_code) or UNKNOWN
        if isinstance(exc, ax.AzureError):
            return UNKNOWN
        return None

    def _endpoint(self) -> str:
        url = getattr(self._fs, "account_url", None)
        if not url:  # no file system (yet): the endpoint of the connection string
            fields = dict(
                part.split("=", 1)
                for part in os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "").split(";")
                if "=" in part
            )
            url = fields.get("BlobEndpoint")
        return url or "Azure Blob Storage"

    def _describe_error(self, exc: BaseException) -> str | None:
        from azure.core import exceptions as ax

        for e in chain(exc):
            if isinstance(e, ax.ServiceRequestError):
                return (
                    f"cannot reach Azure Blob Storage at {self._endpoint()} for "
                    f"{self.root}: start it, or fix the BlobEndpoint of "
                    f"AZURE_STORAGE_CONNECTION_STRING {EVERY_WORKER}"
                )
            if isinstance(e, ValueError) and "blank or malformed" in str(e):
                return (  # azure-storage-blob's words for a string it cannot parse
                    f"AZURE_STORAGE_CONNECTION_STRING is empty or malformed (for "
                    f"{self.root}): set it to the account's connection string, "
                    "'DefaultEndpointsProtocol=https;AccountName=...;AccountKey=...;"
                    f"BlobEndpoint=...' (Azurite prints its own) {EVERY_WORKER}"
                )
            if isinstance(e, ValueError) and "connection_string or account_name" in str(e):
                return (
                    f"no Azure credentials for {self.root}: set "
                    "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME and "
                    f"AZURE_STORAGE_ACCOUNT_KEY {EVERY_WORKER}"
                )
            code = getattr(e, "error_code", None)
            code = getattr(code, "value", code)  # a StorageErrorCode, or a str
            if isinstance(e, ax.ClientAuthenticationError) or code in (
                "AuthenticationFailed",
                "InvalidAuthenticationInfo",
                "AuthorizationFailure",
                "AuthorizationPermissionMismatch",
                "InsufficientAccountPermissions",
            ):
                # Azurite answers a wrong key with AuthorizationFailure, Azure with
                # AuthenticationFailed: the key and the permissions are both suspects
                return (
                    f"Azure Blob Storage at {self._endpoint()} refused the credentials "
                    f"for {self.root} ({code or 'authentication failed'}): check the "
                    "AccountKey of AZURE_STORAGE_CONNECTION_STRING (or "
                    "AZURE_STORAGE_ACCOUNT_KEY), and that it may read, write, list "
                    f"and delete in container {self.bucket!r} {EVERY_WORKER}"
                )
            if code == "ContainerNotFound":
                return self._missing_bucket_line(
                    exc, self._endpoint(), "AZURE_STORAGE_CONNECTION_STRING", True
                )
        return self._missing_bucket_line(exc, self._endpoint(), "AZURE_STORAGE_CONNECTION_STRING")
