"""S3 and S3-compatible object stores as a :class:`~slem_dask.storage.backends.backend.Backend`,
through s3fs.

The atomic create is a conditional ``PUT`` with ``If-None-Match: *``: the store
refuses it with 412 PreconditionFailed when the key exists, and at most one of
racing writers gets 200. It needs a store that implements conditional writes
(AWS S3 since August 2024; SeaweedFS and moto pass the contract tests,
``tests/storage/test_backends.py``); one that ignored the header would overwrite
silently, so check a new store with those tests.

Configuration is s3fs's and botocore's: the endpoint from ``AWS_ENDPOINT_URL``
(or ``AWS_ENDPOINT_URL_S3``, or fsspec's ``FSSPEC_S3_ENDPOINT_URL``), credentials
from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (or a profile), the region
from ``AWS_DEFAULT_REGION``; keyword arguments given to :class:`S3Backend` go to
``s3fs.S3FileSystem`` and take precedence.
"""

from __future__ import annotations

import builtins  # `list` in a backend class is its method: annotations say builtins.list
import asyncio
import functools
import os

from . import deadlines
from .backend import Backend
from .cloud import EVERY_WORKER, cached_filesystem, http_kind, transport_kind
from .cloud import chain as _chain  # an exception and those it was raised from
from .outcomes import (
    NOT_FOUND,
    UNKNOWN,
    UNREACHABLE,
    AccessRefusedError,
    OutcomeUnknownError,
    os_error_kind,
)
from .s3_messages import response_message

__all__ = ["S3Backend"]

# names a writer keeps private until it renames them (as LocalBackend skips them)
_PRIVATE_SUFFIXES = (".partial", ".tmp")
_CONFLICT_TRIES = 6  # 409 ConditionalRequestConflict: another conditional write in flight
_CONFLICT_BACKOFF = 0.05  # seconds, doubled at each try
_COPY_BATCH = 64
_DELETE_BATCH = 1000  # the most DeleteObjects takes


def _client_error(exc: BaseException | None):
    """The botocore ClientError behind ``exc`` (s3fs raises an OSError whose
    ``__cause__`` is it), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(getattr(exc, "response", None), dict):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _error_code(exc: BaseException | None) -> tuple[str, int]:
    """(S3 error code, HTTP status) of ``exc``; ('', 0) if it carries none. A HEAD
    response has no body, so its code is only the status ('404', '403')."""
    err = _client_error(exc)
    if err is None:
        return "", 0
    status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return str(err.response.get("Error", {}).get("Code", "")), int(status)


def _precondition_failed(exc: BaseException) -> bool:
    # SeaweedFS sends PreconditionFailed without the Condition field s3fs looks for,
    # so s3fs turns it into OSError(EINVAL): go by the code and the status instead
    code, status = _error_code(exc)
    return code == "PreconditionFailed" or status == 412


_CREDENTIALS = (
    "SignatureDoesNotMatch",
    "InvalidAccessKeyId",
    "InvalidToken",
    "ExpiredToken",
    "InvalidClientTokenId",
    "AccessDenied",
    "AllAccessDisabled",
    "AccountProblem",
)


def outcome_kind(exc: BaseException) -> type[OSError]:
    """botocore's, aiobotocore's and s3fs's failures as the outcome kinds (the one place
    that knows them): credentials that cannot be had refused before any request, a
    connection never made unreachable, a response by its code and status (a 5xx left
    after botocore's retries may have been applied), a connection dropped or timed
    out once the request may have been sent unknown."""
    from botocore import exceptions as bx

    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return AccessRefusedError
    if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectTimeoutError)):
        return UNREACHABLE  # nothing reached the store
    code, status = _error_code(exc)
    if code in _CREDENTIALS:
        return AccessRefusedError
    if code in ("NoSuchKey", "NoSuchBucket"):
        return NOT_FOUND
    if code in ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout"):
        return UNKNOWN
    kind = http_kind(status)
    if kind is not None:
        return kind
    if isinstance(exc, (bx.HTTPClientError, bx.ConnectionError)):
        return UNKNOWN  # a reply lost, a read timed out: it may have landed
    return transport_kind(exc) or os_error_kind(exc) or UNKNOWN


def _conflict(exc: BaseException) -> bool:
    code, status = _error_code(exc)
    return code in ("ConditionalRequestConflict", "OperationAborted") or (
        status == 409 and not code
    )


def _filesystem(options: dict):
    """One S3FileSystem per process, options and environment (AWS_ and FSSPEC_
    variables: the endpoint, the keys), every listing sent to the store
    (:func:`.cloud.cached_filesystem`)."""
    return cached_filesystem("s3", options, ("AWS_", "FSSPEC_"))


class S3Backend(Backend):
    """Objects under ``s3://bucket/prefix``. ``storage_options`` go to
    ``s3fs.S3FileSystem`` (``endpoint_url``, ``key``, ``secret``, ``client_kwargs``,
    ``config_kwargs``…); without them s3fs, botocore and fsspec's configuration
    read the environment, which must then be the same on every dask worker."""

    def __init__(self, url: str, **storage_options):
        protocol, sep, path = url.partition("://")
        bucket, _, prefix = path.strip("/").partition("/")
        if not sep or protocol not in ("s3", "s3a") or not bucket:
            raise ValueError(f"not an s3://bucket/prefix URL: {url!r}")
        self.root = f"{protocol}://{bucket}/{prefix.strip('/')}".rstrip("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.storage_options = dict(storage_options)
        self.fs = _filesystem(self.storage_options)

    def __reduce__(self):  # to dask workers: they build their own client
        return functools.partial(S3Backend, self.root, **self.storage_options), ()

    def __repr__(self):
        return f"S3Backend({self.root!r})"

    # -- helpers -------------------------------------------------------------

    def _key(self, key: str) -> str:
        return "/".join(p for p in [self.prefix, *key.split("/")] if p)

    def _folder(self, key: str) -> str:
        k = self._key(key)
        return f"{k}/" if k else ""

    def _sync(self, coro_fn, *args):
        from fsspec.asyn import sync

        return sync(self.fs.loop, coro_fn, *args)

    def _call(self, method: str, **kwargs):
        return self.fs.call_s3(method, Bucket=self.bucket, **kwargs)

    def _pages(self, prefix: str, delimiter: str | None, start_after: str | None = None):
        kwargs = {
            "Prefix": prefix,
            **({"Delimiter": delimiter} if delimiter else {}),
            **({"StartAfter": start_after} if start_after else {}),
        }
        while True:
            page = self._call("list_objects_v2", **kwargs)
            yield page
            if not page.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def _keys_under(self, folder: str) -> list[str]:
        return [o["Key"] for page in self._pages(folder, None) for o in page.get("Contents", [])]

    # -- Backend -------------------------------------------------------------

    def read(self, key: str) -> bytes | None:
        k = self._key(key)
        if not k:
            return None
        try:
            return self._sync(self._get, k)
        except FileNotFoundError as exc:
            if _error_code(exc)[0] == "NoSuchBucket":
                raise
            return None

    async def _get(self, key: str) -> bytes:
        # GetObject itself, not s3fs's cat_file: that sends a HEAD first, whose error
        # has no body, so a missing bucket, a wrong secret and a denial lose their codes
        response = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=key)
        async with response["Body"] as body:
            return await body.read()

    def create(self, key: str, data: bytes) -> bool:
        """Conditional PUT (``If-None-Match: *``), idempotent. A 412 reads the key back:
        True if it holds exactly ``data`` (this call's resent request, or an earlier
        call whose reply was lost, created it), else False. A lost reply, a timeout or
        a 5xx left after botocore's retries (the PUT may have landed) reads the key
        back too: True or False as above, and the error (OSError) if it is absent. A
        409 (another conditional write to the key in flight) is retried, and False once
        the key exists. Racing writers must write distinct bytes (a token of their own)."""
        return self._sync(self._create, self._key(key), bytes(data))

    async def _create(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError
        from s3fs.errors import translate_boto_error

        await self.fs.set_session()
        client = await self.fs.get_s3(self.bucket)
        # the client itself, not s3fs's call_s3: s3fs resends after connection errors
        # without saying so; here every ambiguous outcome is resolved by reading back
        extra = dict(getattr(self.fs, "s3_additional_kwargs", None) or {})
        for attempt in range(_CONFLICT_TRIES):
            try:
                await client.put_object(
                    Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*", **extra
                )
                return True
            except ClientError as exc:
                if _precondition_failed(exc):
                    return await self._holds(key, data)
                if _conflict(exc):
                    last = exc
                elif outcome_kind(exc) is UNKNOWN:  # a 5xx after botocore's retries
                    return await self._resolve(key, data, exc)
                else:
                    raise translate_boto_error(exc) from exc
            except Exception as exc:  # noqa: BLE001 - sorted by outcome_kind
                if outcome_kind(exc) is not UNKNOWN:
                    raise
                return await self._resolve(key, data, exc)  # a lost reply, a timeout
            await asyncio.sleep(_CONFLICT_BACKOFF * 2**attempt)
        if await self._holds(key, None):
            return False
        raise translate_boto_error(last) from last

    async def _resolve(self, key: str, data: bytes, cause: BaseException) -> bool:
        """After a PUT whose outcome is unknown: whether ``key`` holds exactly ``data``
        (True) or other bytes (False); OutcomeUnknownError if it is absent (it may still
        land; the caller may create it again: the same bytes cannot be created twice)."""
        held = await self._read_back(key, cause)
        if held is None:
            raise OutcomeUnknownError(
                f"create s3://{self.bucket}/{key}: {type(cause).__name__}: {cause}; not "
                f"there when read back (it may still land)"
            ) from cause
        return held == data

    async def _read_back(self, key: str, cause: BaseException) -> bytes | None:
        """What ``key`` holds after a PUT whose outcome is unknown; the PUT's error if
        the store cannot be read either (the outcome stays unknown)."""
        try:
            return await self._held(key)
        except Exception as exc:  # noqa: BLE001 - unknown outcome: say so, with the cause
            raise OutcomeUnknownError(
                f"cannot learn whether s3://{self.bucket}/{key} was created "
                f"({type(cause).__name__}: {cause}; reading it back: "
                f"{type(exc).__name__}: {exc})"
            ) from cause

    async def _held(self, key: str) -> bytes | None:
        try:
            return await self._get(key)
        except FileNotFoundError:
            return None

    async def _holds(self, key: str, data: bytes | None) -> bool:
        """Whether ``key`` exists (and holds ``data``, if given)."""
        got = await self._held(key)
        return got is not None and (data is None or got == data)

    def probe_scope(self) -> str:
        """A bucket at an endpoint: conditional writes are a property of the store."""
        return f"bucket s3://{self.bucket} at {self._endpoint()}"

    def put(self, key: str, data: bytes) -> None:
        # one PUT: the store shows the old object or the new one, never a part
        self._call("put_object", Key=self._key(key), Body=bytes(data))

    def list(self, prefix: str) -> list[str]:
        return self._names(prefix, None)

    lists_from_a_name = True

    def list_after(self, prefix: str, start_after: str) -> builtins.list[str]:
        # S3 lists keys in byte order, from StartAfter on
        return [n for n in self._names(prefix, start_after) if n > start_after]

    def _names(self, prefix: str, start_after: str | None) -> builtins.list[str]:
        folder = self._folder(prefix)
        names: set[str] = set()
        after = folder + start_after if start_after else None
        for page in self._pages(folder, "/", after):
            names.update(o["Key"][len(folder) :] for o in page.get("Contents", []))
            names.update(
                p["Prefix"][len(folder) :].rstrip("/") for p in page.get("CommonPrefixes", [])
            )
        names.discard("")  # a folder marker object ("prefix/") is not a name
        return sorted(names)

    def exists(self, key: str) -> bool:
        k = self._key(key)
        if k:
            try:
                self._call("head_object", Key=k)
                return True
            except FileNotFoundError:
                pass  # a HEAD 404 does not say whether the bucket exists: the listing does
        page = self._call("list_objects_v2", Prefix=self._folder(key), MaxKeys=1)
        return bool(page.get("KeyCount") or page.get("Contents"))

    def delete(self, key: str) -> None:
        k = self._key(key)
        if k:
            self._call("delete_object", Key=k)

    def remove_tree(self, prefix: str) -> None:
        folder = self._folder(prefix)
        keys = self._keys_under(folder)
        if folder:
            keys.append(folder[:-1])  # the prefix may name one object
        self._delete_keys(keys)
        # Stores with real directories (SeaweedFS) keep emptied ones, and list them.
        # Deleting "dir/" removes an empty one (deepest first); on AWS S3 nothing is
        # left to list, and this costs one request.
        if folder and self.list(prefix) or not folder and self.list(""):
            dirs, todo = [folder] if folder else [], [folder]
            while todo:
                for page in self._pages(todo.pop(), "/"):
                    found = [p["Prefix"] for p in page.get("CommonPrefixes", [])]
                    dirs += found
                    todo += found
            self._delete_keys(sorted(dirs, key=lambda d: (-d.count("/"), d)))

    def _delete_keys(self, keys: builtins.list[str]) -> None:
        for i in range(0, len(keys), _DELETE_BATCH):
            batch = keys[i : i + _DELETE_BATCH]
            out = self._call(
                "delete_objects", Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
            errors = [e for e in out.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                e = errors[0]
                raise OSError(
                    f"cannot delete s3://{self.bucket}/{e.get('Key')}: "
                    f"{e.get('Code')} {e.get('Message', '')}".strip()
                )

    def copy_tree(self, src: str, dst: str, names: builtins.list[str] | None = None) -> None:
        """Server-side CopyObject of each object (one request each, up to 5 GiB an
        object, which zarr chunks never reach); the copy is a new object, so later
        writes to ``src`` leave ``dst`` as it was. An existing ``dst`` object is
        overwritten."""
        src_folder, dst_folder = self._folder(src), self._folder(dst)
        if names is None:
            names = [
                k[len(src_folder) :]
                for k in self._keys_under(src_folder)
                if not k.endswith(_PRIVATE_SUFFIXES)
            ]
        pairs = [(src_folder + n.strip("/"), dst_folder + n.strip("/")) for n in names]
        self._sync(self._copy_all, pairs)

    async def _copy_all(self, pairs):
        for i in range(0, len(pairs), _COPY_BATCH):
            await asyncio.gather(
                *[
                    self.fs._call_s3(
                        "copy_object",
                        Bucket=self.bucket,
                        Key=d,
                        CopySource={"Bucket": self.bucket, "Key": s},
                    )
                    for s, d in pairs[i : i + _COPY_BATCH]
                ]
            )

    # -- errors --------------------------------------------------------------

    def outcome_kind(self, exc: Exception) -> type[OSError]:
        return outcome_kind(exc)

    @classmethod
    def client_exceptions(cls) -> tuple[type[BaseException], ...]:
        from .cloud import imported_types

        return imported_types(
            [("botocore.exceptions", n) for n in ("BotoCoreError", "ClientError")]
            + [("aiohttp", "ClientError")]
        )

    def _endpoint(self) -> str:
        client = getattr(self.fs, "_s3", None)
        url = getattr(getattr(client, "meta", None), "endpoint_url", None)
        return (
            url
            or self.storage_options.get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or os.environ.get("FSSPEC_S3_ENDPOINT_URL")
            or "AWS S3 (no endpoint set)"
        )

    def unreachable(self, timeout: float | None = None) -> str | None:
        """One line if the endpoint does not answer a request within ``timeout`` seconds
        (the connect deadline): down, or stopped (whose kernel still accepts
        connections), so the job's tasks wait on it; None if it answers."""
        endpoint = self._endpoint()
        why = deadlines.silent_endpoint(
            endpoint if "://" in endpoint else "https://s3.amazonaws.com", timeout
        )
        if why is None:
            return None
        return deadlines.silent_line(
            endpoint, self.root, why, "AWS_ENDPOINT_URL (or FSSPEC_S3_ENDPOINT_URL)"
        )

    def describe_error(self, exc: BaseException) -> str | None:
        if deadlines.is_timeout(exc):
            scheme = self.root.partition("://")[0]
            return deadlines.timeout_line(self._endpoint(), f"{scheme}://{self.bucket}")
        for e in _chain(exc):
            said = self._connection_message(e)
            if said:
                return said
        code, status = _error_code(exc)
        return response_message(self._endpoint(), self.root, self.bucket, code, status)

    def _connection_message(self, e: BaseException) -> str | None:
        """What a client-side failure (no credentials, no connection) means, if it is one."""
        from botocore import exceptions as bx

        if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError)):
            return (
                f"no S3 credentials for {self.root}: set AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) {EVERY_WORKER}"
            )
        if (
            isinstance(e, (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError))
            and self.unreachable() is None
        ):
            # the failed request was a worker's: "start it" would be untrue
            return (
                f"a dask worker could not reach the object store at "
                f"{self._endpoint()} for {self.root}, while this client reaches "
                "it: check the network between the workers and the store, and "
                f"that every worker has this client's AWS_ENDPOINT_URL; then run "
                "the same command again"
            )
        if isinstance(e, (bx.EndpointConnectionError, bx.ConnectTimeoutError)):
            return (
                f"cannot reach the object store at {self._endpoint()} for "
                f"{self.root}: start it, or fix AWS_ENDPOINT_URL (or "
                f"FSSPEC_S3_ENDPOINT_URL) {EVERY_WORKER}; a store that does not "
                "take bucket names in the host name needs path-style addressing, "
                'FSSPEC_S3=\'{"config_kwargs": {"s3": {"addressing_style": '
                '"path"}}}\''
            )
        return None
