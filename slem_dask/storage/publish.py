"""Creating one commit record and learning, by reading it back, whether it landed:
the step of :meth:`.versions.VersionedStore.commit` where a storage outcome can be
ambiguous (a lost reply, a retry's 412, a timeout), with the errors a commit raises."""

from __future__ import annotations

import time

from .backend import Backend
from .errors import IntegrityError
from .heads import COMMITS, commit_name
from .outcomes import StorageError, StorageRefusedError, StoreUnreachableError

__all__ = ["CommitConflictError", "CommitUnknownError", "publish"]

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
