"""Creating one commit record and learning, by reading it back, whether it landed:
the step of :meth:`.versions.VersionedStore.commit` where a storage outcome can be
ambiguous (a lost reply, a retry's 412, a timeout), with the errors a commit raises."""

from __future__ import annotations

import errno

from .backend import Backend, StorageConfigError
from .errors import IntegrityError
from .heads import COMMITS, commit_name

__all__ = ["CommitConflictError", "CommitUnknownError", "publish"]

_PUBLISH_TRIES = 3  # creates of one commit record whose outcome stayed unknown
#: errors with which a create was refused before anything was written (a read-only,
#: forbidden or full file system): not an ambiguous outcome
_REFUSED = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})


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
    (:meth:`.versions.VersionedStore._publish`)."""
    key = f"{COMMITS}/{commit_name(seq)}"
    failure: OSError | None = None
    for _ in range(_PUBLISH_TRIES):
        try:
            backend.create(key, data)  # its answer alone is not trusted
        except (StorageConfigError, PermissionError, FileNotFoundError):
            raise  # refused: nothing was written
        except OSError as exc:  # a lost reply, a timeout: it may have landed
            if exc.errno in _REFUSED:
                raise  # a read-only or full file system: nothing was written
            failure = exc
        try:
            held = backend.read(key)
        except (PermissionError, StorageConfigError):
            raise
        except OSError as exc:  # the read-back failed too: the outcome is still unknown
            failure = exc
            continue
        if held is not None:
            return held == data
    why = (
        f"the storage failed: {failure}"
        if failure is not None
        else f"{key} was never there when read back"
    )
    raise CommitUnknownError(
        f"{str(path)!r}: cannot learn whether version {seq} was committed "
        f"({why}); if it was, it is complete and stays: see "
        f"`slem-dask versions {path}`, or run the same command again"
    ) from failure
