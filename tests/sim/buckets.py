"""Fake gcsfs and adlfs file systems under the real
:class:`~slem_dask.storage.backends.gcs.GCSBackend` and :class:`~slem_dask.storage.backends.azure.AzureBackend`.

Each stands where the library's file system stands (``cat_file``, ``pipe_file``, ``ls``,
``info``, ``rm_file``, ``find``, ``rm``, ``copy``; Azure's ``service_client`` for Copy
Blob), makes each request through :func:`.transport.attempt`, retries as the library
does, and raises what it raises:

* gcsfs (``gcsfs.retry.retry_request``: 6 attempts, backoff 1, 2, 4... s; 5xx, 429,
  408 and every ``aiohttp.ClientError`` retried): ``gcsfs.retry.HttpError`` (503,
  500: no OSError), ``aiohttp.ServerDisconnectedError`` (no OSError),
  ``aiohttp.ClientConnectorError`` and ``aiohttp.ServerTimeoutError``; 404 as
  FileNotFoundError, 412 as FileExistsError. Read timeout: ``requests_timeout``, else
  aiohttp's 300 s.
* adlfs over azure-core (``ExponentialRetry``: 4 attempts, backoff 15 s, 18 s,
  24 s; 5xx and every ServiceRequestError / ServiceResponseError retried):
  ``HttpResponseError`` (503 ServerBusy), ``ServiceRequestError``,
  ``ServiceResponseError`` (none an OSError); 404 as FileNotFoundError (and
  ResourceNotFoundError from Copy Blob), 409 as FileExistsError. Read timeout:
  ``read_timeout``, else azure-core's 300 s.
"""

from __future__ import annotations

import types

from .transport import Failure, attempt, retrying, span

GCS_ENDPOINT = "http://sim-gcs:4443"
AZURE_ENDPOINT = "http://sim-azure:10000/devstoreaccount1"


def _gcs_error(failure: Failure):
    import aiohttp
    from gcsfs.retry import HttpError

    if failure.kind == "refused":
        key = types.SimpleNamespace(host="sim-gcs", port=4443, ssl=False)
        return aiohttp.ClientConnectorError(key, OSError(111, "Connection refused"))
    if failure.kind == "reply_lost":
        return aiohttp.ServerDisconnectedError()
    if failure.kind == "timeout":
        return aiohttp.ServerTimeoutError(f"Timeout on reading data from socket: {failure.path}")
    return HttpError({"code": 503, "message": "Service Unavailable"})


def _gcs_retryable(exc) -> bool:
    import aiohttp
    from gcsfs.retry import HttpError

    if isinstance(exc, HttpError):
        return exc.code in (*range(500, 505), 429, 408)
    return isinstance(exc, aiohttp.ClientError)


def _azure_error(failure: Failure):
    from azure.core import exceptions as ax

    if failure.kind == "refused":
        return ax.ServiceRequestError(f"Cannot connect to host sim-azure:10000 ({failure.path})")
    if failure.kind == "reply_lost":
        return ax.ServiceResponseError(f"Connection closed by the server ({failure.path})")
    if failure.kind == "timeout":
        return ax.ServiceResponseTimeoutError(f"Read timed out ({failure.path})")
    exc = ax.HttpResponseError(message="Operation could not be completed within the timeout.")
    exc.status_code, exc.reason, exc.error_code = 503, "Service Unavailable", "ServerBusy"
    return exc


def _azure_retryable(exc) -> bool:
    from azure.core import exceptions as ax

    if isinstance(exc, ax.HttpResponseError) and not isinstance(
        exc, (ax.ResourceNotFoundError, ax.ResourceExistsError)
    ):
        return (exc.status_code or 0) >= 500 and exc.status_code not in (501, 505)
    return isinstance(exc, (ax.ServiceRequestError, ax.ServiceResponseError))


class FakeBucketFS:
    """The fsspec file system of a bucket store, on the world's server (a path is
    ``bucket/key``, as the server's keys are)."""

    loop = None
    library = ""

    def __init__(self, world, options: dict):
        self.world = world
        self.options = options
        self._slem_buckets_seen = {"bucket"}  # the bucket exists (cloud._check_bucket)

    @property
    def server(self):
        return self.world.server

    # the library: subclasses ---------------------------------------------------------
    attempts = 1
    timeout: float | None = None

    def error(self, failure: Failure) -> Exception:
        raise NotImplementedError

    def retryable(self, exc) -> bool:
        raise NotImplementedError

    def backoff(self, i: int) -> float:
        raise NotImplementedError

    def exists_error(self, path: str) -> Exception:
        return FileExistsError(path)

    def _request(self, op: str, path: str, apply, mutates: bool):
        def once():
            try:
                return attempt(self.world, op, path, apply, mutates, self.timeout)
            except Failure as failure:
                raise self.error(failure) from None

        with span(self.world, f"{self.library} {op} {path}"):
            return retrying(self.world, self.attempts, self.retryable, self.backoff, once)

    # fsspec ----------------------------------------------------------------------------
    def cat_file(self, path, **_):
        def apply():
            data = self.server.objects.get(path)
            if data is None:
                raise FileNotFoundError(2, "No such file or directory", path)
            return data

        return self._request("get", path, apply, False)

    def pipe_file(self, path, value, mode="overwrite", **_):
        data = bytes(value)

        def apply():
            if mode == "create" and path in self.server.objects:
                if not self.world.faults.ignore_conditional:
                    raise self.exists_error(path)
            self.server.write(path, data)

        return self._request("put" if mode != "create" else "create", path, apply, True)

    def _under(self, path: str) -> list[str]:
        folder = path.rstrip("/") + "/"
        return sorted(k for k in self.server.objects if k.startswith(folder))

    def ls(self, path, detail=False, **_):
        folder = path.rstrip("/") + "/"

        def apply():
            names = {folder + k[len(folder) :].split("/", 1)[0] for k in self._under(path)}
            return sorted(names)

        return self._request("list", path, apply, False)

    def info(self, path, **_):
        def apply():
            if path in self.server.objects:
                return {"name": path, "type": "file", "size": len(self.server.objects[path])}
            if self._under(path):
                return {"name": path, "type": "directory", "size": 0}
            raise FileNotFoundError(2, "No such file or directory", path)

        return self._request("info", path, apply, False)

    def rm_file(self, path, **_):
        actor = self.world.actor_name()

        def apply():
            if path not in self.server.objects:
                raise FileNotFoundError(2, "No such file or directory", path)
            self.server.remove(path, actor)

        return self._request("delete", path, apply, True)

    def find(self, path, withdirs=False, **_):
        return self._request("list", path, lambda: self._under(path), False)

    def rm(self, paths, **_):
        for path in paths:
            try:
                self.rm_file(path)
            except FileNotFoundError:
                pass

    def copy(self, srcs, dsts, on_error="raise", **_):
        for src, dst in zip(srcs, dsts, strict=True):
            self._request("copy", dst, self._copier(src, dst, FileNotFoundError), True)

    def _copier(self, src: str, dst: str, missing):
        def apply():
            data = self.server.objects.get(src)
            if data is None:
                raise missing(f"{src}: no such object")
            self.server.write(dst, data)

        return apply


class FakeGCSFileSystem(FakeBucketFS):
    library = "gcsfs"
    attempts = 6

    def __init__(self, world, options: dict):
        super().__init__(world, options)
        self.timeout = 300.0  # aiohttp's total default: gcsfs sets no timeout of its own
        if "deadlines" in options:  # slem-dask's gcsfs class: a read timeout, its tries
            self.timeout, self.attempts = options["deadlines"]
        elif options.get("requests_timeout"):
            self.timeout = float(options["requests_timeout"])

    def error(self, failure):
        return _gcs_error(failure)

    def retryable(self, exc):
        return _gcs_retryable(exc)

    def backoff(self, i):
        return min(self.world.rng.random() + 2**i, 32)


class FakeAzureFileSystem(FakeBucketFS):
    library = "adlfs"
    attempts = 4
    account_url = AZURE_ENDPOINT

    def __init__(self, world, options: dict):
        super().__init__(world, options)
        self.timeout = options.get("read_timeout") or 300.0  # azure-core's default
        self.attempts = int(options.get("retry_total", 3)) + 1
        self.deadlines = "deadlines" in options
        if self.deadlines:  # slem-dask's adlfs class: its timeouts, tries and waits
            self.timeout, self.attempts = options["deadlines"]
        self.service_client = _ServiceClient(self)

    def error(self, failure):
        return _azure_error(failure)

    def retryable(self, exc):
        return _azure_retryable(exc)

    def backoff(self, i):
        if self.deadlines:  # deadlines.AZURE_BACKOFF_*: 1 s, then 1 + 2**i s, + jitter
            return 1 + (2**i if i else 0) + self.world.rng.uniform(0, 0.5)
        return 15 + 3**i * self.world.rng.uniform(0.8, 1.2)


class _ServiceClient:
    """What AzureBackend's Copy Blob uses of azure-storage-blob's async clients."""

    def __init__(self, fs: FakeAzureFileSystem):
        self.fs = fs

    def get_container_client(self, container):
        return types.SimpleNamespace(
            get_blob_client=lambda blob: _BlobClient(self.fs, f"{container}/{blob}")
        )


class _BlobClient:
    def __init__(self, fs: FakeAzureFileSystem, path: str):
        self.fs, self.path = fs, path
        self.url = f"{AZURE_ENDPOINT}/{path}"

    async def start_copy_from_url(self, url):
        src = url[len(AZURE_ENDPOINT) + 1 :]
        self.fs._request("copy", self.path, self.fs._copier(src, self.path, _not_found(src)), True)
        return {"copy_status": "success"}


def _not_found(src: str):
    from azure.core.exceptions import ResourceNotFoundError

    def make(message):
        exc = ResourceNotFoundError(message=message)
        exc.status_code, exc.error_code = 404, "CannotVerifyCopySource"
        return exc

    return make
