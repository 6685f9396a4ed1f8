"""Rolling a versioned store back: the content of an old version committed again as
the new head, through a draft of its own (:meth:`.versions.VersionedStore.rollback`,
which holds the store's lease around it)."""

from __future__ import annotations

import threading

from ..backends.outcomes import FAILED
from .publish import CommitUnknownError
from .records import Commit, VersionError

__all__ = ["rollback_to", "abandon_after_failure", "INTERRUPTED_ABANDON_WAIT"]

#: The most seconds an interrupted job (Ctrl-C) waits for its draft to be abandoned.
INTERRUPTED_ABANDON_WAIT = 3.0


def abandon_after_failure(store, draft, interrupted: bool = False) -> None:
    """Abandon ``draft`` after its job failed, best effort: the job's own error is the
    one to report, and a storage that fails here too (a burst of 503s) leaves the draft
    to the next job that writes (:mod:`.gc`). :meth:`~.versions.VersionedStore.abandon`
    itself keeps a draft whose commit outcome is unknown.

    ``interrupted`` (Ctrl-C): the job ends within seconds even when its store does not
    answer (each request would wait for its deadline, minutes by default): the abandon
    runs in a thread waited for :data:`INTERRUPTED_ABANDON_WAIT` s at most, and a draft
    it did not finish deleting is left as a killed job's is, to the next job that
    writes (a kill may come at any step of an abandon: each is safe to stop after)."""
    if not interrupted:
        _abandon_quietly(store, draft)
        return
    thread = threading.Thread(
        target=_abandon_quietly, args=(store, draft, True), daemon=True, name="slem-dask-abandon"
    )
    thread.start()
    thread.join(INTERRUPTED_ABANDON_WAIT)


def _abandon_quietly(store, draft, in_thread: bool = False) -> None:
    try:
        store.abandon(draft)
    except FAILED:
        pass
    except BaseException:  # noqa: BLE001 - a thread that may outlive the job: the
        if not in_thread:  # interpreter may be exiting while it waits (its client's
            raise  # loop gone), with nothing left to tell


def rollback_to(store, seq: int, job: str) -> Commit:
    """Commit version ``seq``'s content again as ``store``'s head (the head itself if it
    already holds that content); the caller holds the store's lease. ``store`` is a
    :class:`.versions.VersionedStore` (not imported: versions imports this module)."""
    old = store.commit_at(seq)
    if old is None:
        raise ValueError(
            f"{str(store.path)!r} has no version {seq}; list them with "
            f"`slem-dask versions {store.path}`"
        )
    head = store.head()
    assert head is not None  # the record of ``old`` was read: the store has a head
    source = f"rollback to {seq}"
    if head.version == old.version or (head.source == source and head.checksum == old.checksum):
        return head  # a new commit would change nothing but the history
    store.check(old)  # still there, unchanged
    # a copy in a draft of its own, committed as any draft is: a job whose lease was
    # taken over may still prune the old folder, never a draft that a record names
    draft = store.begin()
    try:
        try:
            store.backend.copy_tree(store._folder(old.version), store._folder(draft.version))
        except FileNotFoundError:
            raise VersionError(
                f"{str(store.path)!r}: version {seq} was pruned while this rollback "
                f"copied it; nothing was committed: roll back to a version listed by "
                f"`slem-dask versions {store.path}`"
            ) from None
        # deleting a version begins with its zarr.json: if it is still there and
        # unchanged, nothing of the version was deleted while it was copied
        store.check(old)
        record = store.commit(draft, old.kind, job, old.summary, source)
    except CommitUnknownError:
        raise  # its record may still land, naming the draft: it stays
    except BaseException as exc:  # kept if its commit's outcome is unknown
        abandon_after_failure(store, draft, interrupted=isinstance(exc, KeyboardInterrupt))
        raise
    try:
        store.collect_garbage()
    except FAILED:  # the rollback is committed: what is left goes with the next job
        pass
    return record
