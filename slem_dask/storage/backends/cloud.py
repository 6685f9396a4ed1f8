"""What Google Cloud Storage (:mod:`.gcs`) and Azure Blob (:mod:`.azure`) share as
backends: a bucket (container) and a prefix, reached through their fsspec file
system (gcsfs, adlfs), the same one zarr reads and writes array chunks through.

Each store's module supplies the create-only write and the one-line errors. Every
listing goes to the store (another process may have written since), and a key or
listing that is absent is told apart from a bucket that is: a job on a missing
bucket must fail, not find an empty store.
"""

from __future__ import annotations

import builtins  # `list` in a backend class is its method: annotations say builtins.list
import functools
import json
import os
import threading
import weakref

from . import deadlines
from .backend import Backend
from .outcomes import (
    NOT_FOUND,
    REFUSED,
    UNKNOWN,
    UNREACHABLE,
    AccessRefusedError,
    os_error_kind,
    settle_create,
)

__all__ = ["BucketBackend", "cached_filesystem"]

_PRIVATE_SUFFIXES = (".partial", ".tmp")  # a writer's temporaries (as LocalBackend skips)
try:  # in every process that imports the storage layer: zarr's file systems too
    deadlines.install()
except ValueError:  # a bad $SLEM_DASK_STORAGE_TIMEOUT: said where a file system is made
    pass
_FILESYSTEMS: dict = {}
_FILESYSTEMS_LOCK = threading.Lock()
EVERY_WORKER = "(the client and every dask worker need the same variables)"


def cached_filesystem(protocol: str, options: dict, env_prefixes: tuple[str, ...]):
    """One file system per process, protocol, options and environment: fsspec's own
    instance cache ignores the environment, so a process that changed its endpoint or
    keys (a test, a long-lived client) would keep talking to the old store. Every one
    has the deadlines of :mod:`.deadlines` (``SLEM_DASK_STORAGE_`` variables)."""
    import fsspec

    deadlines.install()
    prefixes = (*env_prefixes, "SLEM_DASK_STORAGE_")
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(prefixes)))
    token = (protocol, os.getpid(), json.dumps(options, sort_keys=True, default=repr), env)
    with _FILESYSTEMS_LOCK:
        fs = _FILESYSTEMS.get(token)
        if fs is None:
            fs = _FILESYSTEMS[token] = fsspec.filesystem(
                protocol, skip_instance_cache=True, **{"use_listings_cache": False, **options}
            )
        return fs


class NoSuchBucketError(FileNotFoundError):
    """The bucket (container) of a store does not exist."""


class BucketBackend(Backend):
    """Objects under ``PROTOCOL://bucket/prefix`` through an fsspec file system.
    Subclasses set ``protocols`` and ``env_prefixes`` and implement :meth:`_create`,
    :meth:`_bucket_exists` and :meth:`describe_error`."""

    protocols: tuple[str, ...] = ()
    env_prefixes: tuple[str, ...] = ()
    bucket_word = "bucket"  # what the store calls one (Azure: "container")

    def __init__(self, url: str, **storage_options):
        protocol, sep, path = url.partition("://")
        bucket, _, prefix = path.strip("/").partition("/")
        if not sep or protocol not in self.protocols or not bucket:
            raise ValueError(f"not a {self.protocols[0]}://bucket/prefix URL: {url!r}")
        self.protocol = protocol
        self.root = f"{protocol}://{bucket}/{prefix.strip('/')}".rstrip("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.storage_options = dict(storage_options)
        self._fs = None

    @property
    def fs(self):
        """The file system, made on first use: a backend whose credentials are missing
        must still be made, to say so (:meth:`describe_error`)."""
        if self._fs is None:
            self._fs = cached_filesystem(self.protocols[0], self.storage_options, self.env_prefixes)
        return self._fs

    def __reduce__(self):  # to dask workers: they build their own client
        return functools.partial(type(self), self.root, **self.storage_options), ()

    def __repr__(self):
        return f"{type(self).__name__}({self.root!r})"

    def probe_scope(self) -> str:
        """What one check that create-only writes are refused vouches for: the bucket
        at its endpoint (the same service answers for every key in it)."""
        return f"{self.bucket_word} {self.protocol}://{self.bucket} at {self._endpoint()}"

    def _endpoint(self) -> str:
        raise NotImplementedError

    endpoint_variable = ""  # what sets the endpoint, for a message's fix

    def unreachable(self, timeout: float | None = None) -> str | None:
        """One line if the endpoint does not answer a request within ``timeout`` seconds
        (the connect deadline): down, or stopped (whose kernel still accepts
        connections), so the job's tasks wait on it; None if it answers."""
        endpoint = self._endpoint()
        why = deadlines.silent_endpoint(endpoint, timeout) if "://" in endpoint else None
        if why is None:
            return None
        return deadlines.silent_line(endpoint, self.root, why, self.endpoint_variable)

    def _path(self, key: str) -> str:
        return "/".join([self.bucket, *[p for p in [self.prefix, *key.split("/")] if p]])

    def _check_bucket(self) -> None:
        """Raise NoSuchBucketError if the bucket is missing. Asked once per process and
        configuration (an absent key is the common case, a vanished bucket is not): the
        answer is kept with the file system, which a job's many backends share."""
        seen = self.fs.__dict__.setdefault("_slem_buckets_seen", set())
        if self.bucket not in seen:
            if not self._bucket_exists():
                raise NoSuchBucketError(
                    f"{self.bucket_word} {self.bucket!r} of {self.root} does not exist"
                )
            seen.add(self.bucket)

    def _bucket_exists(self) -> bool:
        raise NotImplementedError

    def _create(self, path: str, data: bytes) -> bool:
        """One create-only write of ``path``: True if written, False if the store
        refused it because the object exists."""
        raise NotImplementedError

    # -- Backend -------------------------------------------------------------

    def read(self, key: str) -> bytes | None:
        if not key.strip("/") and not self.prefix:
            return None
        try:
            return self.fs.cat_file(self._path(key))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            self._check_bucket()
            return None

    def create(self, key: str, data: bytes) -> bool:
        """A create-only write. When the store refuses it (the object exists) the
        object is read back: True if it holds ``data`` (the client resent a request
        whose first copy landed, or a racing writer wrote the same bytes), so racing
        writers should write distinct bytes (a token of their own). A failure whose
        outcome is unknown (a 5xx after the client's retries, a lost reply) reads the
        object back too (:func:`.outcomes.settle_create`): True, False, or
        OutcomeUnknownError if it is absent (it may still land); a refusal raises."""
        path, data = self._path(key), bytes(data)
        try:
            if self._create(path, data):
                return True
        except Exception as exc:  # noqa: BLE001 - sorted by outcome_kind
            if self.outcome_kind(exc) is not UNKNOWN:
                raise  # refused, unreachable, not found: nothing was written
            return settle_create(self, key, data, exc)  # a 5xx, a lost reply: read back
        return self.read(key) == data

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(key), bytes(data))

    def list(self, prefix: str) -> list[str]:
        path = self._path(prefix).rstrip("/")
        try:
            entries = self.fs.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            entries = []
        names = {e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != path}
        if not names:
            self._check_bucket()
        return sorted(names)

    def exists(self, key: str) -> bool:
        if key.strip("/") or self.prefix:
            try:  # fsspec's isfile would answer False for a refused request too
                if self.fs.info(self._path(key))["type"] == "file":
                    return True
            except FileNotFoundError:
                pass
        return bool(self.list(key))  # a folder: one level listed (asks for the bucket)

    def delete(self, key: str) -> None:
        if not key.strip("/") and not self.prefix:
            return
        try:
            self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass

    def _objects_under(self, folder: str) -> builtins.list[str]:
        try:
            return self.fs.find(folder.rstrip("/") + "/", withdirs=False)
        except FileNotFoundError:
            return []

    def remove_tree(self, prefix: str) -> None:
        path = self._path(prefix)
        found = self._objects_under(path)
        for i in range(0, len(found), 1000):
            try:
                self.fs.rm(found[i : i + 1000])
            except FileNotFoundError:  # deleted meanwhile
                pass
        if prefix.strip("/") or self.prefix:
            try:
                self.fs.rm_file(path)  # the prefix may name one object
            except FileNotFoundError:
                pass

    def copy_tree(self, src: str, dst: str, names: builtins.list[str] | None = None) -> None:
        """A server-side copy of each object (no bytes through this process); the copy
        is a new object, so later writes to ``src`` leave ``dst`` as it was. An
        existing ``dst`` object is overwritten."""
        src_path, dst_path = self._path(src), self._path(dst)
        if names is None:
            names = [
                p[len(src_path) :].lstrip("/")
                for p in self._objects_under(src_path)
                if not p.endswith(_PRIVATE_SUFFIXES)
            ]
        pairs = [(f"{src_path}/{n.strip('/')}", f"{dst_path}/{n.strip('/')}") for n in names]
        self._copy_all(pairs)

    def _copy_all(self, pairs: builtins.list[tuple[str, str]]) -> None:
        if pairs:
            self.fs.copy([s for s, _ in pairs], [d for _, d in pairs], on_error="raise")

    # -- errors --------------------------------------------------------------

    def outcome_kind(self, exc: Exception) -> type[OSError]:
        """The outcome of a request that raised ``exc``, from its HTTP status where it
        has one (:func:`http_kind`), else its transport (:func:`transport_kind`);
        subclasses add their client's own types (:meth:`_client_kind`)."""
        return (
            self._client_kind(exc)
            or transport_kind(exc)
            or (REFUSED if isinstance(exc, ValueError) else None)  # a request refused
            or os_error_kind(exc)  # before it was sent (no credentials, a 400)
            or UNKNOWN
        )

    def _client_kind(self, exc: Exception) -> type[OSError] | None:
        return None

    client_modules: tuple[tuple[str, str], ...] = (("aiohttp", "ClientError"),)

    @classmethod
    def client_exceptions(cls) -> tuple[type[BaseException], ...]:
        return imported_types(cls.client_modules)

    client = extra = ""  # the fsspec package of the store, and slem-dask's extra for it

    def describe_error(self, exc: BaseException) -> str | None:
        for e in chain(exc):
            if isinstance(e, ImportError) and self.client and self.client in str(e):
                return (
                    f"{self.root} needs {self.client}, which is not installed: pip "
                    f"install 'slem-dask[{self.extra}]' (on every dask worker too)"
                )
        if deadlines.is_timeout(exc):
            return deadlines.timeout_line(self._endpoint(), f"{self.protocol}://{self.bucket}")
        try:
            return self._describe_error(exc) or self._unavailable_line(exc)
        except ImportError:  # the client is not installed: nothing more to say
            return None

    service = ""  # the store's name, in words

    def _unavailable_line(self, exc: BaseException) -> str | None:
        """The line for a 5xx (or 429) left after the client's retries: what is kept, and
        to run again. The store's root is named only where the failure names it (an
        encode's output on the same store as its model must not blame the model)."""
        for e in chain(exc):
            status = next(
                (
                    v
                    for v in (getattr(e, n, None) for n in ("status_code", "code", "status"))
                    if isinstance(v, int) and not isinstance(v, bool)
                ),
                None,
            )
            what = None
            if status is not None and (status >= 500 and status != 501 or status == 429):
                what = f"answered {status} (unavailable or overloaded) to every retry"
            elif (
                isinstance(e, self.client_exceptions())
                and isinstance(e, Exception)
                and self.outcome_kind(e) is UNKNOWN
            ):
                what = f"lost the connection ({type(e).__name__}: {e})".replace("\n", " ")
            if what:
                where = f"{self.bucket}/{self.prefix}".rstrip("/")
                named = any(where in str(x) for x in chain(exc))
                return (
                    f"{self.service} at {self._endpoint()} {what}"
                    f"{f' for {self.root}' if named else ''}; what readers see is as "
                    "before (a job commits only whole versions): wait, then run the same "
                    "command again (it resumes); if it persists, check the store's health"
                )
        return None

    def _describe_error(self, exc: BaseException) -> str | None:
        return None

    def _missing_bucket_line(
        self, exc: BaseException, endpoint: str, fix: str, missing: bool = False
    ) -> str | None:
        """The line for a failure on a missing bucket: ``missing``, a NoSuchBucketError,
        or any 'not found' while the bucket is indeed missing (asked now)."""
        missing = missing or any(isinstance(e, NoSuchBucketError) for e in chain(exc))
        if not missing and any(isinstance(e, FileNotFoundError) for e in chain(exc)):
            try:
                missing = not self._bucket_exists()
            except Exception:  # noqa: BLE001 - the store cannot say: no line
                return None
        if missing:
            return (
                f"{self.bucket_word} {self.bucket!r} does not exist at {endpoint}: "
                f"create it, or "
                f"fix the URL {self.root} or {fix} {EVERY_WORKER}"
            )
        return None


def http_kind(status) -> type[OSError] | None:
    """The outcome of an HTTP answer ``status`` (None: no status): a 5xx, 408 or 429
    after the client's retries may have been applied; any other 4xx was refused."""
    if not isinstance(status, int) or status < 400:
        return None
    if status in (401, 403):
        return AccessRefusedError
    if status == 404:
        return NOT_FOUND
    if status >= 500 and status != 501 or status in (408, 429):
        return UNKNOWN
    return REFUSED  # 400, 405, 409, 411, 412 not taken as "exists", 501 not implemented


def transport_kind(exc: BaseException) -> type[OSError] | None:
    """The outcome of an aiohttp (or socket) failure: a connection that was never made
    reached nothing; one lost or timed out once made may have been applied."""
    import asyncio

    (connector,) = imported_types([("aiohttp", "ClientConnectorError")]) or (None,)
    (client,) = imported_types([("aiohttp", "ClientError")]) or (None,)
    if connector is not None and isinstance(exc, connector):
        return UNREACHABLE
    if isinstance(exc, ConnectionRefusedError):
        return UNREACHABLE
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, ConnectionError)):
        return UNKNOWN
    if client is not None and isinstance(exc, client):
        return UNKNOWN  # a server that disconnected, a payload cut short
    return None


def imported_types(names) -> tuple[type[BaseException], ...]:
    """The classes ``(module, name)`` of the modules already imported."""
    import sys

    found = (getattr(sys.modules.get(module), name, None) for module, name in names)
    return tuple(t for t in found if isinstance(t, type))


def chain(exc: BaseException | None):
    """``exc`` and the exceptions it was raised from or during."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


class _Anchor:
    pass


_ANCHORS: list[_Anchor] = []


def at_exit_before_zarr(handler) -> None:
    """Run ``handler`` at interpreter exit before zarr stops its event loop and before
    weakref runs the finalizers left (where the SDKs close their clients, on a loop that
    may be gone). Exit handlers run last registered first: zarr registers its own when it
    is imported, weakref when its first finalizer is made, so both are made to exist
    before ``handler`` is registered."""
    import atexit

    import zarr  # noqa: F401 - its exit handler registered before this one

    _ANCHORS.append(_Anchor())
    weakref.finalize(_ANCHORS[-1], int)
    atexit.register(handler)
