"""Deadlines of storage requests: how long any request to an object store may wait for
an answer, and how often it is tried, on every backend, in one place.

A store that stops answering (a stopped process, a cut network, an overloaded service)
holds a request without a deadline forever, and with it the job, its lease and every
job after it on that output. Every file system slem-dask or zarr makes for S3 (s3fs,
aiobotocore), Google Cloud Storage (gcsfs, aiohttp) and Azure Blob (adlfs, azure-core)
gets the same policy (:func:`install`, as fsspec's defaults: the options a user passes
win):

* ``connect``: seconds to open a connection (at most :data:`CONNECT_CAP`);
* ``timeout``: seconds a request waits for the store's next bytes (the read timeout):
  ``$SLEM_DASK_STORAGE_TIMEOUT`` (or ``--storage-timeout``), default :data:`DEFAULT_TIMEOUT`;
* ``attempts``: tries of one request (``$SLEM_DASK_STORAGE_ATTEMPTS``, default
  :data:`DEFAULT_ATTEMPTS`) in botocore, gcsfs and azure-core (s3fs's own loop, which
  tried botocore's whole call 5 times more, is set to once).

:meth:`Deadlines.request_bound` is the most one request can take before it raises, per
store kind; a job whose store is silent ends after a few of those (docs/object-stores.md,
"When a store stops answering"). On local disk the protocol's own calls get
``timeout`` x ``attempts`` seconds (:mod:`.local_deadline`: a hung NFS mount), zarr's
chunk I/O and the bulk calls none (mount with ``soft,timeo=`` for those).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

__all__ = [
    "Deadlines",
    "current",
    "install",
    "silent_endpoint",
    "is_timeout",
    "answer_within",
    "LOOK_SECONDS",
    "ENV_TIMEOUT",
    "ENV_ATTEMPTS",
    "DEFAULT_TIMEOUT",
    "DEFAULT_ATTEMPTS",
]

ENV_TIMEOUT = "SLEM_DASK_STORAGE_TIMEOUT"
ENV_ATTEMPTS = "SLEM_DASK_STORAGE_ATTEMPTS"
#: Seconds a request waits for the store's answer (its next bytes) before it fails.
DEFAULT_TIMEOUT = 20.0
#: Tries of one request (the first and the retries) where the client lets them be set.
DEFAULT_ATTEMPTS = 5
#: The most seconds to open a connection (a store that accepts none is down).
CONNECT_CAP = 10.0
#: azure-storage-blob's waits between tries as set here: 1 s, then 1 + 2**i s, each
#: up to AZURE_JITTER s more.
AZURE_BACKOFF_START = 1.0
AZURE_BACKOFF_BASE = 2.0
AZURE_JITTER = 0.5
#: botocore's standard retry mode waits at most this long between tries.
BOTOCORE_BACKOFF_CAP = 20.0
#: The most seconds a job that has failed waits to learn more from its store for its
#: last line (who took its lease, what its output holds): the store may be the one that
#: stopped answering, and each request would wait for its whole deadline (a job that
#: lost its lease to a stopped emulator ended 130-160 s after the loss, 2026-11-30).
LOOK_SECONDS = 10.0


@dataclass(frozen=True)
class Deadlines:
    """The deadlines of every storage request (see the module)."""

    timeout: float = DEFAULT_TIMEOUT
    attempts: int = DEFAULT_ATTEMPTS

    @property
    def connect(self) -> float:
        return min(self.timeout, CONNECT_CAP)

    def request_bound(self, kind: str) -> float:
        """The most seconds one request to a store of ``kind`` ('s3', 'gcs', 'azure')
        that answers nothing takes before it raises, retries and waits between them
        included (a store that trickles bytes resets the read timeout at each)."""
        one = self.connect + self.timeout
        if kind == "gcs":  # gcsfs waits up to 1 + 2**(i-1) s before its i-th retry
            return self.attempts * one + sum(1 + 2 ** (i - 1) for i in range(1, self.attempts))
        if kind == "azure":
            waits = sum(
                AZURE_BACKOFF_START + (AZURE_BACKOFF_BASE**i if i else 0) + AZURE_JITTER
                for i in range(self.attempts - 1)
            )
            return self.attempts * one + waits
        return self.attempts * one + (self.attempts - 1) * BOTOCORE_BACKOFF_CAP

    def said(self) -> str:
        """The policy as a user sets it, for messages."""
        tries = f"{self.attempts} tr{'y' if self.attempts == 1 else 'ies'}"
        return f"{self.timeout:g} s a try, {tries}: ${ENV_TIMEOUT}, ${ENV_ATTEMPTS}"

    # -- each client's options ---------------------------------------------

    def s3fs_options(self) -> dict:
        """s3fs keyword arguments: botocore's timeouts and bounded retries."""
        return {
            "config_kwargs": {
                "connect_timeout": self.connect,
                "read_timeout": self.timeout,
                "retries": {"total_max_attempts": self.attempts, "mode": "standard"},
            }
        }

    def gcsfs_options(self) -> dict:
        """gcsfs keyword arguments: each aiohttp request's connect and read timeouts
        (gcsfs's own default is none: a silent store held a request forever)."""
        import aiohttp

        return {
            "requests_timeout": aiohttp.ClientTimeout(
                total=None, sock_connect=self.connect, sock_read=self.timeout
            )
        }

    azure_backoff_start = AZURE_BACKOFF_START
    azure_backoff_base = AZURE_BACKOFF_BASE
    azure_jitter = AZURE_JITTER

    def adlfs_options(self) -> dict:
        """adlfs keyword arguments: the timeouts of its uploads and downloads (the
        other requests get them, and the retry policy, from
        :func:`.azure_client.limit_azure_client`)."""
        return {"connection_timeout": self.connect, "read_timeout": self.timeout}


def _env_number(name: str, default, kind):
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not value > 0:
        what = "a number of seconds > 0" if kind is float else "a whole number >= 1"
        raise ValueError(f"${name} = {text!r}: expected {what} (default {default:g})")
    return value


def current() -> Deadlines:
    """The deadlines set by the environment (the same on every dask worker: a local
    cluster's workers inherit it; remote workers need the variables as well)."""
    return Deadlines(
        _env_number(ENV_TIMEOUT, DEFAULT_TIMEOUT, float),
        _env_number(ENV_ATTEMPTS, DEFAULT_ATTEMPTS, int),
    )


_CLASSES = {
    "s3": "slem_dask.storage.backends.s3_client.DeadlineS3FileSystem",
    "s3a": "slem_dask.storage.backends.s3_client.DeadlineS3FileSystem",
    "gs": "slem_dask.storage.backends.gcs_client.DeadlineGCSFileSystem",
    "gcs": "slem_dask.storage.backends.gcs_client.DeadlineGCSFileSystem",
    "az": "slem_dask.storage.backends.azure_client.DeadlineAzureBlobFileSystem",
    "abfs": "slem_dask.storage.backends.azure_client.DeadlineAzureBlobFileSystem",
    "abfss": "slem_dask.storage.backends.azure_client.DeadlineAzureBlobFileSystem",
}
_installed: Deadlines | None = None


def install() -> Deadlines:
    """Give every file system made in this process for s3://, gs:// and az:// (by
    slem-dask, by zarr from a URL, by a user's own fsspec call) the current deadlines:
    botocore's as fsspec's default s3 options (keys a user set in ``FSSPEC_S3`` or
    passes explicitly win), and the file-system classes of :mod:`.s3_client`,
    :mod:`.gcs_client` and :mod:`.azure_client` in fsspec's registry (named, not
    imported). Run when
    slem_dask.storage is imported (in every process that runs its tasks) and whenever
    a backend makes a file system (the variables may have changed)."""
    global _installed
    policy = current()
    if policy == _installed:
        return policy
    import fsspec
    from fsspec.config import conf

    # under "s3" only: fsspec applies the entries of each of the class's protocols in
    # turn ("s3", then "s3a"), so a second copy would override a user's FSSPEC_S3
    previous = _installed.s3fs_options() if _installed is not None else {}
    _merge(conf.setdefault("s3", {}), policy.s3fs_options(), previous)
    if _installed is None:
        for protocol, path in _CLASSES.items():
            fsspec.register_implementation(protocol, path, clobber=True)
    _installed = policy
    return policy


def _merge(into: dict, defaults: dict, previous: dict) -> None:
    """``defaults`` under ``into``, dicts merged key by key: a key that holds what the
    last :func:`install` set (``previous``) is renewed, any other stays (a user's
    ``FSSPEC_S3`` timeout, say)."""
    for key, value in defaults.items():
        if isinstance(value, dict):
            _merge(into.setdefault(key, {}), value, previous.get(key) or {})
        elif key not in into or into[key] == previous.get(key, object()):
            into[key] = value


def silent_endpoint(url: str, seconds: float | None = None) -> str | None:
    """Why the HTTP(S) server at ``url`` does not answer within ``seconds`` (the
    connect deadline): 'refused the connection', 'accepted a connection but sent
    nothing for 10 s'; None when it answers at all (any status). A stopped server's
    kernel still accepts connections: only a request tells it from a live one."""
    from urllib.parse import urlsplit

    seconds = current().connect if seconds is None else seconds
    parts = urlsplit(url if "://" in url else f"https://{url}")
    host = parts.hostname or "localhost"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        sock = socket.create_connection((host, port), timeout=seconds)
    except TimeoutError:
        return f"accepted no connection within {seconds:g} s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    try:
        if parts.scheme == "https":
            import ssl

            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        sock.settimeout(seconds)
        sock.sendall(f"HEAD / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        if sock.recv(1):
            return None
        return "closed the connection without an answer"
    except TimeoutError:
        return f"accepted a connection but sent nothing for {seconds:g} s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    finally:
        sock.close()


#: Timeouts that are not a TimeoutError: botocore's, azure-core's, fsspec's.
_TIMEOUT_NAMES = {
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "ServiceResponseTimeoutError",
    "ServiceRequestTimeoutError",
    "FSTimeoutError",
}


def is_timeout(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from or during, is a request
    that met its deadline: the store did not answer (the request's outcome is unknown)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, TimeoutError) or type(exc).__name__ in _TIMEOUT_NAMES:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def timeout_line(endpoint: str, bucket: str) -> str:
    """The one line of a job whose request to ``bucket`` (``gs://name``) at
    ``endpoint`` met its deadline: true whether the store is stopped, overloaded or
    cut off, and whichever of the job's paths in that bucket the request was for."""
    return (
        f"the object store at {endpoint} ({bucket}) did not answer a request within its "
        f"deadline ({current().said()}): it is stopped, overloaded or cut off from this "
        f"host or a worker; once it answers, run the same command again (a longer "
        f"--storage-timeout waits longer for a slow store)"
    )


def silent_line(endpoint: str, root: str, why: str, fix: str) -> str:
    """The line of a store that does not answer now (:func:`silent_endpoint`)."""
    return (
        f"the object store at {endpoint} does not answer ({why}) for {root}: start or "
        f"resume it, or fix {fix}; the job's tasks wait for it (each request gives up "
        f"after its deadline, {current().said()}), no worker needs a restart"
    )


def answer_within(look, seconds: float, failed=None):
    """``look()``'s answer, ``failed`` if it raised, or None if it gave none within
    ``seconds`` (its thread is left to finish, a daemon: the process may exit)."""
    import threading

    answer: dict = {}

    def run():
        try:
            answer["value"] = look()
        except Exception:  # noqa: BLE001 - the store could not say
            answer["value"] = failed

    thread = threading.Thread(target=run, daemon=True, name="slem-dask-look")
    thread.start()
    thread.join(seconds)
    return answer.get("value")
