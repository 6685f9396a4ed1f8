"""A fake S3 client library under the real :class:`slem_dask.storage.backends.s3.S3Backend`.

:class:`FakeS3FileSystem` stands where ``s3fs.S3FileSystem`` stands: ``call_s3`` and
``_call_s3`` go through s3fs's own retry wrapper (``s3fs.core._error_wrapper``: its
retries, its translation of ClientError into OSError, and the botocore errors it lets
through untranslated, which are no OSError); ``get_s3`` gives the raw client that
``S3Backend.create`` calls itself. :class:`FakeS3Client` answers as aiobotocore does,
with botocore's legacy retries (5 attempts; 5xx, throttling, connection errors and
read timeouts retried) and its errors: ``ClientError`` (404 NoSuchKey, 412
PreconditionFailed, 503 SlowDown...), ``EndpointConnectionError``,
``ConnectionClosedError``, ``ReadTimeoutError``.
"""

from __future__ import annotations

import zlib

from .transport import Failure, attempt, retrying, run_inline, span

ENDPOINT = "http://sim-s3:9000"


def _client_error(code: str, status: int, op: str, message: str = "", **extra):
    from botocore.exceptions import ClientError

    error = {"Code": code, "Message": message or code, **extra}
    return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, op)


def _botocore_error(failure: Failure, op: str):
    """What botocore raises for what one attempt met."""
    from botocore import exceptions as bx

    if failure.kind == "refused":
        return bx.EndpointConnectionError(endpoint_url=ENDPOINT)
    if failure.kind == "reply_lost":
        return bx.ConnectionClosedError(endpoint_url=ENDPOINT)
    if failure.kind == "timeout":
        return bx.ReadTimeoutError(endpoint_url=ENDPOINT)
    code, status = (
        ("SlowDown", 503) if zlib.crc32(failure.path.encode()) % 2 else ("InternalError", 500)
    )
    return _client_error(code, status, op, "Please reduce your request rate.")


def _retryable(exc) -> bool:
    from botocore import exceptions as bx

    if isinstance(exc, bx.ClientError):
        status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
        return status >= 500 or exc.response["Error"]["Code"] in ("SlowDown", "Throttling")
    return isinstance(exc, (bx.ConnectionError, bx.HTTPClientError))


class _Body:
    def __init__(self, data: bytes):
        self.data = data

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def read(self):
        return self.data


class FakeS3Client:
    """aiobotocore's S3 client on the world's server (a key is ``bucket/key`` there)."""

    def __init__(self, world, options: dict):
        self.world = world
        config = dict(options.get("config_kwargs") or {})
        self.read_timeout = config.get("read_timeout", 60)  # botocore's default
        retries = config.get("retries") or {}
        self.attempts = int(retries.get("total_max_attempts", retries.get("max_attempts", 4) + 1))
        self.meta = type("Meta", (), {"endpoint_url": ENDPOINT})()

    @property
    def server(self):
        return self.world.server

    def _request(self, op: str, path: str, apply, mutates: bool):
        """One operation: botocore's attempts, each through the transport."""

        def once():
            try:
                return attempt(self.world, op, path, apply, mutates, self.read_timeout)
            except Failure as failure:
                raise _botocore_error(failure, op) from None

        with span(self.world, f"S3 {op} {path}"):
            return retrying(
                self.world,
                self.attempts,
                _retryable,
                lambda i: self.world.rng.uniform(0, 1) * 2**i,
                once,
            )

    async def put_object(self, Bucket, Key, Body, IfNoneMatch=None, **_):
        full, data = f"{Bucket}/{Key}", bytes(Body)

        def apply():
            if IfNoneMatch == "*" and full in self.server.objects:
                if not self.world.faults.ignore_conditional:
                    raise _client_error(
                        "PreconditionFailed", 412, "PutObject", Condition="If-None-Match"
                    )
            self.server.write(full, data)
            return {"ETag": '"sim"'}

        return self._request("PutObject", full, apply, True)

    async def get_object(self, Bucket, Key, **_):
        full = f"{Bucket}/{Key}"

        def apply():
            data = self.server.objects.get(full)
            if data is None:
                raise _client_error("NoSuchKey", 404, "GetObject")
            return {"Body": _Body(data)}

        return self._request("GetObject", full, apply, False)

    async def head_object(self, Bucket, Key, **_):
        full = f"{Bucket}/{Key}"

        def apply():
            if full not in self.server.objects:
                raise _client_error("404", 404, "HeadObject", "Not Found")
            return {"ContentLength": len(self.server.objects[full])}

        return self._request("HeadObject", full, apply, False)

    async def list_objects_v2(self, Bucket, Prefix="", Delimiter=None, StartAfter=None, **kw):
        folder = f"{Bucket}/{Prefix}"

        def apply():
            keys = sorted(k[len(Bucket) + 1 :] for k in self.server.objects if k.startswith(folder))
            keys = [k for k in keys if not StartAfter or k > StartAfter]
            contents, prefixes = [], []
            for k in keys:
                rest = k[len(Prefix) :]
                if Delimiter and Delimiter in rest:
                    p = Prefix + rest.split(Delimiter, 1)[0] + Delimiter
                    if p not in prefixes:
                        prefixes.append(p)
                else:
                    contents.append({"Key": k})
            if kw.get("MaxKeys"):
                contents = contents[: kw["MaxKeys"]]
            page = {"Contents": contents, "KeyCount": len(contents) + len(prefixes)}
            return {**page, "CommonPrefixes": [{"Prefix": p} for p in prefixes]}

        return self._request("ListObjectsV2", folder, apply, False)

    async def delete_object(self, Bucket, Key, **_):
        full, actor = f"{Bucket}/{Key}", self.world.actor_name()
        return self._request("DeleteObject", full, lambda: self.server.remove(full, actor), True)

    async def delete_objects(self, Bucket, Delete, **_):
        actor = self.world.actor_name()
        keys = [f"{Bucket}/{o['Key']}" for o in Delete["Objects"]]

        def apply():
            for full in keys:
                self.server.remove(full, actor)
            return {"Errors": []}

        return self._request("DeleteObjects", f"{Bucket}/[{len(keys)} keys]", apply, True)

    async def copy_object(self, Bucket, Key, CopySource, **_):
        src, dst = f"{CopySource['Bucket']}/{CopySource['Key']}", f"{Bucket}/{Key}"

        def apply():
            data = self.server.objects.get(src)
            if data is None:
                raise _client_error("NoSuchKey", 404, "CopyObject")
            self.server.write(dst, data)
            return {}

        return self._request("CopyObject", dst, apply, True)


class FakeS3FileSystem:
    """What S3Backend uses of ``s3fs.S3FileSystem``, with s3fs's own retry wrapper."""

    loop = None
    retries = 5  # s3fs's default

    def __init__(self, world, options: dict):
        self.world = world
        self.options = options
        self.s3_additional_kwargs: dict = {}
        self._s3 = FakeS3Client(world, options)
        # slem-dask's s3fs class tries botocore's whole call once (deadlines)
        default = 1 if "deadlines" in options else self.retries
        self.retries = int(options.get("retries", default))

    async def set_session(self, *_, **__):
        return self._s3

    async def get_s3(self, bucket=None):
        return self._s3

    async def _call_s3(self, method, *akwarglist, **kwargs):
        from s3fs.core import _error_wrapper

        fn = getattr(self._s3, method)
        with span(self.world, f"s3fs {method}"):
            return await _error_wrapper(fn, kwargs=kwargs, retries=self.retries)

    def call_s3(self, method, *akwarglist, **kwargs):
        return run_inline(self._call_s3(method, *akwarglist, **kwargs))
