"""The few outcomes of a storage request, the only storage errors the commit protocol
reasons in (docs/guarantees-protocol.md, "One error model").

A backend's client library fails in its own types (botocore's ``ClientError`` and
``EndpointConnectionError``, gcsfs's ``HttpError``, aiohttp's errors, azure-core's
``HttpResponseError``, ``ServiceRequestError`` and ``ServiceResponseError``, fsspec's
and the OS's ``OSError``), many of them no ``OSError``. Each backend module turns them
into these kinds in ONE place, its :meth:`~.backend.Backend.outcome_kind`, and every
public method of every backend goes through it (:func:`at_the_boundary`, applied by
:class:`~.backend.Backend` to its subclasses), so that no client type reaches the
protocol (:mod:`.publish`, :mod:`.versions`, :mod:`.rollback`, :mod:`.leases`,
:mod:`.gc`, :mod:`.groups`):

* **applied** / **not applied**: a method's return (``create`` True or False);
* **not found**: ``FileNotFoundError`` (``read`` returns None);
* **refused** (:class:`StorageRefusedError`; :class:`AccessRefusedError` is also a
  ``PermissionError``, :class:`~.backend.StorageConfigError` one of them): the store
  answered no, and nothing was applied (credentials, permissions, a read-only or full
  file system, a request it does not implement);
* **unreachable** (:class:`StoreUnreachableError`): no request reached the store (a
  connection refused, a name that does not resolve): nothing was applied;
* **unknown** (:class:`OutcomeUnknownError`): the request may or may not have been
  applied (a 5xx left after the client's retries, a lost reply, a timeout once sent,
  anything the backend does not recognise). A write's unknown outcome is settled by
  reading back, never guessed (:func:`settle_create`, :func:`.publish.publish`).

All are ``OSError``: callers that only report keep working, and ``errno``,
``strerror`` and ``filename`` of an ``OSError`` mapped are kept.
"""

from __future__ import annotations

import errno
import functools

__all__ = [
    "StorageError",
    "OutcomeUnknownError",
    "StoreUnreachableError",
    "StorageRefusedError",
    "AccessRefusedError",
    "at_the_boundary",
    "os_error_kind",
    "settle_create",
    "FAILED",
    "UNKNOWN",
    "REFUSED",
    "UNREACHABLE",
    "NOT_FOUND",
]


class StorageError(OSError):
    """A storage request failed; its subclass says what became of it."""


class OutcomeUnknownError(StorageError):
    """The request may or may not have been applied: read back to learn which."""


class StoreUnreachableError(StorageError):
    """No request reached the store: nothing was applied."""


class StorageRefusedError(StorageError):
    """The store refused the request: nothing was applied."""


class AccessRefusedError(StorageRefusedError, PermissionError):
    """The store refused who asks (credentials, permissions): nothing was applied."""


#: every failure a backend raises: a caller that only needs "it did not succeed" (a
#: heartbeat, a clean-up) catches these, and nothing of a client can slip past them
FAILED = (StorageError, FileNotFoundError)

#: kinds :meth:`.backend.Backend.outcome_kind` answers (NOT_FOUND: the exception is a
#: ``FileNotFoundError`` as it is, or is made one)
UNKNOWN, REFUSED, UNREACHABLE, NOT_FOUND = (
    OutcomeUnknownError,
    StorageRefusedError,
    StoreUnreachableError,
    FileNotFoundError,
)

#: errnos with which the OS refuses a request before applying anything
_REFUSED_ERRNOS = frozenset(
    {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG}
)
_NOT_FOUND_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR})
_UNREACHABLE_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN}
)
#: exceptions of a bug or of the caller (an argument), never of the store: not mapped
_NOT_STORAGE = (
    TypeError,
    AttributeError,
    AssertionError,
    NameError,
    ImportError,
    NotImplementedError,
    RecursionError,
    MemoryError,
    StopIteration,
    KeyboardInterrupt,
)


def os_error_kind(exc: BaseException) -> type[OSError] | None:
    """The kind of a plain ``OSError`` (the OS's, or a client's that subclasses it);
    None for anything else."""
    if not isinstance(exc, OSError):
        return None
    if isinstance(exc, StorageError):  # mapped already: its own kind
        return StorageRefusedError if isinstance(exc, StorageRefusedError) else type(exc)
    if isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        return NOT_FOUND
    if isinstance(exc, PermissionError) or exc.errno in _REFUSED_ERRNOS:
        return REFUSED
    if isinstance(exc, ConnectionRefusedError) or exc.errno in _UNREACHABLE_ERRNOS:
        return UNREACHABLE
    return UNKNOWN  # EIO, ESTALE, a reset or timed-out connection: it may have landed


def _mapped(exc: Exception, kind: type[OSError], message: str) -> OSError:
    if kind is REFUSED and isinstance(exc, PermissionError):
        kind = AccessRefusedError
    new = kind(message)
    if isinstance(exc, OSError) and exc.errno is not None:  # a full disk is told by it
        new.errno, new.strerror, new.filename = exc.errno, exc.strerror, exc.filename
    return new


def at_the_boundary(method):
    """``method`` of a backend with every exception of its client turned into one of
    the kinds above by the backend's :meth:`~.backend.Backend.outcome_kind` (raised
    from the original, which stays its ``__cause__``: describe_error reads it)."""
    if getattr(method, "_at_the_boundary", False):
        return method

    @functools.wraps(method)
    def mapped(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (StorageError, *_NOT_STORAGE):
            raise
        except Exception as exc:  # noqa: BLE001 - sorted here, into the few kinds
            kind = self.outcome_kind(exc)
            if kind is NOT_FOUND and isinstance(exc, FileNotFoundError):
                raise
            where = f"{self.root}/{args[0]}" if args and isinstance(args[0], str) else self.root
            raise _mapped(exc, kind, f"{method.__name__} {where}: {_line(exc)}") from exc

    mapped._at_the_boundary = True  # type: ignore[attr-defined]
    return mapped


def settle_create(backend, key: str, data: bytes, cause: BaseException) -> bool:
    """After a create of ``key`` whose outcome is unknown (``cause``): read it back. True
    if it holds exactly ``data`` (the request landed, or a resent copy did), False if it
    holds other bytes (another writer's); :class:`OutcomeUnknownError` if it is absent
    (it may still land: the caller may create it again, the same bytes cannot be
    created twice) or cannot be read."""
    try:
        held = backend.read(key)
    except StorageError as exc:
        raise OutcomeUnknownError(
            f"cannot learn whether {backend.root}/{key} was created ({_line(cause)}; "
            f"reading it back: {_line(exc)})"
        ) from cause
    if held is None:
        raise OutcomeUnknownError(
            f"create {backend.root}/{key}: {_line(cause)}; not there when read back "
            f"(it may still land)"
        ) from cause
    return held == bytes(data)


def _line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())
