"""One job's write of a versioned store, from its lease to its commit: the one interface
through which every job writes (in the spirit of Icechunk's ``Session``).

::

    with VersionedStore(out).transaction("slem-dask encode") as tx:  # the lease, held
        draft = tx.begin()  # this job's draft; tx.others(): killed runs' drafts to reuse
        with tx.making_room():  # the garbage rule, while the draft is written
            ...  # write into draft.location
        tx.check_lease()  # a job that lost its lease must not blame the storage
        tx.commit("encoding", {"rows": n})  # CommitConflictError, DraftFencedError,
        #                                     CommitUnknownError: the typed outcomes

What becomes of a draft on failure is the job's to say, through :meth:`discard` (it
will not be committed), :meth:`discarded_on_failure` (small writes: nothing worth
resuming) or :meth:`fenced` (another job took the store over); a draft left alone is
kept for a re-run to reuse. The store is a :class:`.versions.VersionedStore` (not
imported: it opens transactions, :meth:`.versions.VersionedStore.transaction`)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, NoReturn

from ..backends import deadlines
from ..backends.outcomes import FAILED, OutcomeUnknownError
from . import gc
from .leases import Lease
from .errors import IntegrityError
from .publish import CommitUnknownError
from .records import Commit

__all__ = ["Transaction", "abandon_after_failure", "INTERRUPTED_ABANDON_WAIT"]

#: The most seconds an interrupted job (Ctrl-C) waits for its draft to be abandoned.
INTERRUPTED_ABANDON_WAIT = 3.0


class Transaction:
    """``job``'s write of ``store``: its lease (taken on entry and released on exit,
    unless ``lease``, one the caller holds, is given), its draft, its commit."""

    def __init__(self, store, job: str, lease: Lease | None = None, on_wait=None):
        self.store = store
        self.job = job
        self._own_lease = lease is None
        self.lease = Lease(store.path, job, on_wait) if lease is None else lease
        self.draft: Any = None  # a versions.Draft once begun
        #: seconds :meth:`__enter__` spent taking the lease (another job's: waited out)
        self.lease_wait = 0.0

    def __enter__(self) -> Transaction:
        if self._own_lease:
            start = time.monotonic()
            self.lease.acquire()
            self.lease_wait = time.monotonic() - start
        return self

    def __exit__(self, kind, *exc) -> None:
        if self._own_lease:
            self.lease.__exit__(kind, *exc)

    def check_free(self) -> None:
        """:class:`.leases.LeaseHeldError` if a job in this PID namespace holds the lease
        and runs, taking nothing and waiting for nothing: the check before a cluster
        starts (:meth:`.leases.Lease.check_free`)."""
        self.lease.check_free()

    # the draft ---------------------------------------------------------------------------
    def begin(self):
        """This job's draft, to be committed as the version after the head."""
        self.draft = self.store.begin()
        return self.draft

    def begin_scratch(self):
        """A draft this job writes but never commits (a streaming fit's statistics):
        the garbage rule deletes it once another draft of the job makes room."""
        return self.store.begin()

    def others(self, draft=None) -> list[str]:
        """The drafts that killed or stalled runs left for ``draft``'s version (this
        job's by default): their chunks may be reused after checks, never adopted."""
        draft = draft or self.draft
        return [v for v in self.store.drafts(draft.seq) if v != draft.version]

    # the garbage rule ------------------------------------------------------------------------
    def make_room(self, mine=None) -> list[str]:
        """Prune before writing (:meth:`.versions.VersionedStore.make_room`), sparing
        ``mine`` (this job's draft by default, once begun)."""
        mine = mine or self.draft
        return self.store.make_room(mine=mine.version if mine is not None else None)

    def making_room(self):
        """:meth:`make_room` in a thread while the body writes the draft."""
        return self.store.making_room(mine=self.draft.version)

    def collect_garbage(self) -> None:
        """After a commit that leaves old versions behind: a failure leaves them to the
        next job that writes (the commit stands)."""
        try:
            self.store.collect_garbage()
        except FAILED:
            pass

    # checks and outcomes ------------------------------------------------------------------
    def check_lease(self) -> None:
        """:class:`.leases.LeaseLostError` if another job took the store over."""
        self.lease.check()

    def raise_if_fenced(self) -> None:
        """:class:`.gc.DraftFencedError` if another job condemned or deleted the draft."""
        if gc.was_fenced(self.store, self.draft.version):
            raise gc.DraftFencedError(gc.fenced_message(self.store, self.draft.version)) from None

    def commit(self, kind: str, summary: dict | None = None, source: str = "", job=None) -> Commit:
        """Make the draft the head, atomically (the record's job: ``job``, else this
        transaction's); :class:`.publish.CommitConflictError` if another job committed
        its number first, :class:`.gc.DraftFencedError` if it was fenced,
        :class:`.publish.CommitUnknownError` if the outcome could not be learnt (the
        draft is then kept)."""
        return self.store.commit(self.draft, kind, job or self.job, summary, source)

    def discard(self, interrupted: bool = False) -> None:
        """Delete the draft, which will not be committed (kept if a record names it);
        ``interrupted`` (Ctrl-C): best effort, waited a few seconds at most
        (:func:`abandon_after_failure`)."""
        if interrupted:
            abandon_after_failure(self.store, self.draft, interrupted=True)
        else:
            self.store.abandon(self.draft)

    def fenced(self) -> NoReturn:
        """Called with a :class:`.gc.DraftFencedError` caught: the draft is the job's
        that fenced this one, and left alone; unless that job committed its number
        (the draft is then dead by it, and only this job can tell a chunk that its
        tasks wrote after the draft's marker went: deleted), a conflict."""
        store, draft = self.store, self.draft
        record = store.commit_at(draft.seq)
        if record is not None and record.version != draft.version:
            store.abandon(draft)
            store._raise_conflict(draft.seq)
        raise gc.DraftFencedError(gc.fenced_message(store, draft.version)) from None

    @contextlib.contextmanager
    def discarded_on_failure(self):
        """A body whose failure discards the draft, best effort (small: nothing worth
        resuming; Ctrl-C: within seconds), unless the commit's outcome is unknown (its
        record may still land)."""
        try:
            yield
        except CommitUnknownError:
            raise
        except BaseException as exc:
            interrupted = isinstance(exc, KeyboardInterrupt)
            abandon_after_failure(self.store, self.draft, interrupted, writes_may_land(exc))
            raise


def writes_may_land(exc: BaseException) -> bool:
    """Whether a write of a job that failed with ``exc`` may still land: a request that
    met its deadline or whose outcome is unknown, or a store client's own error type
    (whatever it means); not a refusal (bad input, a full or failing local disk that
    answered, a write read back wrong: each write had answered). Its draft's fate file is
    then kept, even for a first write: it proves what such a write regrows slem-dask's
    (before, a fit whose first write timed out left, once the late write landed, a
    folder no later run would touch; a helper's fault-proxy run on GCS and Azure)."""
    if isinstance(exc, (ValueError, TypeError, KeyboardInterrupt)) or type(exc) is IntegrityError:
        return False
    if deadlines.is_timeout(exc) or isinstance(exc, OutcomeUnknownError):
        return True
    return not isinstance(exc, OSError)


def abandon_after_failure(store, draft, interrupted: bool = False, keep_fate: bool = False) -> None:
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
        _abandon_quietly(store, draft, keep_fate)
        return
    thread = threading.Thread(
        target=_abandon_quietly,
        args=(store, draft, keep_fate, True),
        daemon=True,
        name="slem-dask-abandon",
    )
    thread.start()
    thread.join(INTERRUPTED_ABANDON_WAIT)


def _abandon_quietly(store, draft, keep_fate: bool, in_thread: bool = False) -> None:
    try:
        store.abandon(draft, keep_fate)
    except FAILED:
        pass
    except BaseException:  # noqa: BLE001 - a thread that may outlive the job: the
        if not in_thread:  # interpreter may be exiting while it waits (its client's
            raise  # loop gone), with nothing left to tell
