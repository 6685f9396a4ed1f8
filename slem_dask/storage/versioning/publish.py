"""Creating one commit record and learning, by reading it back, whether it landed:
the step of :meth:`.versions.VersionedStore.commit` where a storage outcome can be
ambiguous (a lost reply, a retry's 412, a timeout), with the errors a commit raises."""

from __future__ import annotations

import time

from ..backends.backend import Backend
from .errors import IntegrityError
from .heads import COMMITS, commit_name
from ..backends.outcomes import StorageError, StorageRefusedError, StoreUnreachableError
from ..backends.registry import backend_for

__all__ = ["CommitConflictError", "CommitUnknownError", "describe_storage_error", "publish"]

_PUBLISH_TRIES = 3  # creates of one commit record whose outcome stayed unknown
_PUBLISH_BACKOFF = 0.5  # seconds before the second try, doubled for each next one


class CommitConflictError(IntegrityError):
    """Another job committed the version this job meant to commit; nothing of this job
    is visible to readers."""


class CommitUnknownError(IntegrityError):
    """Whether a commit record landed could not be learnt (the storage failed on the
    create and on reading it back); the draft is kept."""


def publish(backend: Backend, path, seq: int, data: bytes) -> bool:
    """Create ``commits/<seq>.json`` of the store at ``path`` holding ``data``: True
    once it holds exactly these bytes, False once it holds another record; raises
    :class:`CommitUnknownError` when the outcome cannot be learnt
    (:meth:`.versions.VersionedStore._publish`), and the store's refusal (nothing
    written) when the first create is refused. Reasons only in the outcome kinds of
    :mod:`.outcomes`: the backend raises no other storage error."""
    key = f"{COMMITS}/{commit_name(seq)}"
    failure: StorageError | None = None
    sent = False  # whether a create may have reached the store (then it may land)
    for attempt in range(_PUBLISH_TRIES):
        if attempt:
            time.sleep(_PUBLISH_BACKOFF * 2 ** (attempt - 1))  # a burst of 5xx may pass
        try:
            backend.create(key, data)  # its answer alone is not trusted
            sent = True
        except (StorageRefusedError, FileNotFoundError):
            if not sent:
                raise  # refused before any create could have landed: nothing written
        except StoreUnreachableError as exc:  # this one reached nothing
            failure = exc
        except StorageError as exc:  # unknown: it may land
            failure, sent = exc, True
        try:
            held = backend.read(key)
        except StorageRefusedError:
            if not sent:
                raise
            continue  # an earlier create may still land: the outcome stays unknown
        except StorageError as exc:  # the read-back failed too: the outcome is unknown
            failure = exc
            continue
        if held is not None:
            return held == data
    if not sent and failure is not None:
        raise failure  # no create reached the store: nothing was committed
    why = f"the storage failed: {failure}" if failure else f"{key} was never there when read back"
    raise CommitUnknownError(
        f"{str(path)!r}: cannot learn whether version {seq} was committed ({why}); "
        f"this job's version is kept as it is: if its record landed it is complete "
        f"and stays. See `slem-dask versions {path}` (it reads the store again), or "
        f"run the same command again"
    ) from failure


def describe_storage_error(exc: BaseException, paths) -> str | None:
    """One line for an object store's failure (credentials, bucket, endpoint) met while
    a command worked on ``paths``, naming the path and the fix; None for any other error,
    and for a commit whose outcome is unknown (its own message says what is kept). The
    paths that the failure names are asked first: a failure of an encode's output is
    not the model's."""
    from ..versioning.publish import CommitUnknownError

    if isinstance(exc, CommitUnknownError):
        return None
    texts = []
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        texts.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    urls = [str(p) for p in paths if "://" in str(p)]
    named = [u for u in urls if any(u.split("://", 1)[1].rstrip("/") in t for t in texts)]
    for path in named + [u for u in urls if u not in named]:
        if path.startswith(("file://", "memory://")):
            continue
        try:
            backend = backend_for(path)
        except Exception:  # noqa: BLE001 - no such backend installed: nothing to say
            continue
        line = backend.describe_error(exc)
        if line:
            return line
    return None
