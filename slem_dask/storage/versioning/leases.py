"""Leases: one job at a time writes a store (advisory; safety comes from commits).

A lease is the file ``.NAME.slem-dask-lease`` beside the store, created
atomically (:meth:`Backend.create`). Its owner rewrites it every
``LEASE_HEARTBEAT`` seconds with a counter one higher. Whether an owner is alive
is judged without comparing clocks of two hosts:

* an owner in this host's boot and PID namespace is alive while its pid runs (the
  same process: same start time);
* any other owner (another host, container or PID namespace) is alive while its
  record keeps changing: a record that this observer sees unchanged for
  ``LEASE_TTL`` seconds of its own monotonic clock is stale and may be taken over.

An owner trusts its own lease only while it renewed it less than ``TRUSTED_PART * LEASE_TTL``
seconds ago (3/4 of it; counted from the start of the renewal that succeeded, on
its monotonic clock): an observer judges it stale no sooner than ``LEASE_TTL`` after
that renewal landed. A heartbeat that cannot reach the store (a store that stopped
answering: each request ends at its deadline, :mod:`.deadlines`) therefore stops
claiming the lease once that time is up, and the job's :meth:`Lease.check` refuses the
commit, as it does for a lease taken over.

Not every backend has a conditional replace, so a heartbeat's write can land after
another job took the lease over (a process paused between its read and its write, a
write delivered late) and overwrite that job's record. The late writer renews nothing
by it, and the job that took over treats it as a late write, not as a new owner: it
writes its own record back (:meth:`Lease.held`, the heartbeat).

A lease only keeps two jobs from doing the same work at once (:mod:`.held_leases`: a
command whose lease was lost ends at once). What readers see is protected by
:mod:`.versions`: a job whose lease was taken over, and which goes on writing (a
stalled client, a late worker), writes only into its own draft, and its commit fails.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import uuid
import warnings

from .errors import IntegrityError, lost_lease_advice
from .held_leases import OPEN as _OPEN
from .held_leases import lost_lease, open_leases
from ..backends.deadlines import LOOK_SECONDS, answer_within
from ..backends.outcomes import FAILED
from .processes import host_identity, process_group, where
from .processes import process_start as _process_start
from .processes import process_stopped as _process_stopped
from .records import forget_lease_copies
from ..backends.registry import backend_for

__all__ = [
    "Lease",
    "LeaseHeldError",
    "LeaseLostError",
    "LeaseWaitWarning",
    "LEASE_TTL",
    "host_identity",
    "lost_lease",
    "open_leases",
]

#: A lease whose record an observer sees unchanged this many seconds is stale
#: ($SLEM_DASK_LEASE_TTL, else DEFAULT_LEASE_TTL: the commands' --help states it).
DEFAULT_LEASE_TTL = 120.0
LEASE_TTL = float(os.environ.get("SLEM_DASK_LEASE_TTL", DEFAULT_LEASE_TTL))
LEASE_HEARTBEAT = max(0.2, min(30.0, LEASE_TTL / 4))
#: The part of LEASE_TTL an owner trusts its lease after renewing it: an observer takes
#: it over no sooner than LEASE_TTL after that renewal landed; the rest is a margin for
#: two clocks' rates (three heartbeats may fail before the owner stops trusting it).
TRUSTED_PART = 0.75
#: The most seconds an interrupted job waits to delete its lease.
INTERRUPTED_RELEASE_WAIT = 3.0
#: The tokens of the leases this process holds now. A record of this process with any
#: other token is one it released (a late heartbeat write put it back after the release
#: deleted it): else this process, alive, refused its own next job for as long as it ran.
_HELD_HERE: set[str] = set()


class LeaseHeldError(FileExistsError):
    """Another live slem-dask job writes this store."""


class LeaseLostError(IntegrityError):
    """This job's lease was taken over (it was thought dead): it must not commit."""


class LeaseWaitWarning(UserWarning):
    """A job waits to see whether the owner of a store's lease is alive, or took the
    lease over from a dead one (the default ``on_wait`` of :class:`Lease`)."""


MOST_RECORDED_TTL = 86400.0  # the longest TTL a record may ask to be watched (damaged: a day)


def recorded_ttl(record: dict | None) -> float:
    """How long an observer watches the owner of ``record`` before it judges it dead: the
    owner's own ``SLEM_DASK_LEASE_TTL`` (written in its record, as its heartbeat follows
    it), or this process's if longer or unknown. A job started with a shorter TTL took a
    live job's lease over after its own TTL, while that job beat every quarter of its
    longer one (found by a new user, stop 52)."""
    return max(LEASE_TTL, _owner_ttl(record))


def _owner_ttl(record: dict | None) -> float:
    """The TTL the owner of ``record`` runs with (this process's when not recorded)."""
    ttl = record.get("ttl") if isinstance(record, dict) else None
    if not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0:
        return LEASE_TTL
    return min(float(ttl), MOST_RECORDED_TTL)


def _warn(message: str) -> None:
    warnings.warn(LeaseWaitWarning(message), stacklevel=2)


def _pid_alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = _process_start(pid)
    return start is None or now is None or now == start  # a reused pid is another process


class Lease:
    """Exclusive right to write one store, for the lifetime of a job.

    ``with Lease(path, "encode"):`` takes it (waiting up to ``LEASE_TTL`` to tell a
    silent owner from a live one, or raising :class:`LeaseHeldError` naming the owner),
    refreshes it from a daemon thread, and removes it on exit. :meth:`check` before a
    commit says whether another job took it over meanwhile.
    """

    def __init__(self, target, job: str, on_wait=None):
        from ..backends.paths import canonical

        self.target = canonical(target)
        self.job = job
        # called with a message when acquire() must watch a lease, or took one over
        self.on_wait = on_wait if on_wait is not None else _warn
        self.file = self.target.parent.child(f".{self.target.name}.slem-dask-lease")
        self._backend = backend_for(self.target.parent.url)
        self._key = self.file.name
        self.token = uuid.uuid4().hex
        # when this job began, by this host's clock: shown to others, never compared
        self.started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
        self.took_over: dict | None = None
        self._beat_no = 0
        self._renewed_at: float | None = None  # monotonic start of the last renewal
        self._given_up = False  # the heartbeat stopped for good: taken over, or too late
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self) -> dict:
        return {
            "token": self.token,
            "job": self.job,
            **host_identity(),
            "pid": os.getpid(),
            "pid_start": _process_start(os.getpid()),
            "store": self.target.url,
            "beat": self._beat_no,
            "ttl": LEASE_TTL,  # observers watch this long at least (recorded_ttl)
            "started": self.started,  # each beat said its own time: a new job, it seemed
        }

    def _create(self) -> bool:
        started = time.monotonic()
        created = self._backend.create(self._key, json.dumps(self._record()).encode())
        if created:
            self._renewed_at = started
        return created

    def trusted_for(self) -> float:
        """Seconds this job may still count on its lease without renewing it (<= 0:
        not at all; see the module)."""
        if self._renewed_at is None:
            return 0.0
        return self._renewed_at + LEASE_TTL * TRUSTED_PART - time.monotonic()

    def _raw(self) -> bytes | None:
        return self._backend.read(self._key)

    def read(self) -> dict | None:
        raw = self._raw()
        try:
            record = json.loads(raw) if raw is not None else None
        except (ValueError, UnicodeDecodeError):
            return None
        return record if isinstance(record, dict) else None

    def _same_namespace(self, record: dict | None) -> bool:
        if not record or not isinstance(record.get("pid"), int):
            return False
        me = host_identity()
        return all(record.get(k) == me[k] and me[k] is not None for k in me)

    def is_stale(self, raw: bytes | None, watch: float | None = None) -> bool:
        """Whether the lease whose current bytes are ``raw`` belongs to no live job.
        Owners outside this PID namespace are watched for ``watch`` seconds (default:
        :func:`recorded_ttl`): stale if their record did not change meanwhile."""
        if raw is None:
            return True
        try:
            record = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            record = None
        if self._same_namespace(record):
            if record["pid"] == os.getpid() and record.get("token") not in _HELD_HERE:
                return True  # released by this very process (see _HELD_HERE)
            return not _pid_alive(record["pid"], record.get("pid_start"))
        watch = recorded_ttl(record) if watch is None else watch
        if self.on_wait and watch > 1:  # a longer TTL than ours is the owner's: say so
            mine = f" (its TTL; this job's: {LEASE_TTL:g} s)" if watch > LEASE_TTL else ""
            self.on_wait(
                f"the lease of {str(self.target)!r} is held by {self.describe(record)}; "
                f"waiting up to {watch:.0f} s{mine} to see whether that job is alive"
            )
        end = time.monotonic() + watch
        while time.monotonic() < end:
            time.sleep(min(max(LEASE_HEARTBEAT / 4, 0.05), max(0.0, end - time.monotonic())))
            if self._raw() != raw:
                return False  # it changed: alive (or released, or taken by a third job)
        return True

    def describe(self, record: dict | None) -> str:
        if not record:
            return f"an unreadable lease file {str(self.file)!r}"
        return (
            f"{record.get('job', 'a job')} ({where(record, host_identity())}, started "
            f"{record.get('started')} by its clock; lease {str(self.file)!r})"
        )

    def acquire(self) -> Lease:
        # counted as held here before the record exists: another thread of this process
        # reading it before the add took it for one this process had released
        # (is_stale), took the lease over and deleted this job's draft, and this job's
        # heartbeat then overwrote the other's record (both jobs failed, under load)
        _HELD_HERE.add(self.token)
        try:
            self._take()
        except BaseException:
            _HELD_HERE.discard(self.token)
            raise
        forget_lease_copies(self._backend, self._key, self.target.url, self.token)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._beat, daemon=True, name=f"slem-dask-lease-{self.target.name}"
        )
        self._thread.start()
        _OPEN.add(self)
        return self

    def _take(self) -> None:
        """Create the lease record, or take over a stale one (five races at most)."""
        for _ in range(5):
            if self._create():
                if self.took_over is not None:
                    self._say_taken_over()
                return
            raw = self._raw()
            if raw is None:
                continue  # released meanwhile
            if not self.is_stale(raw):
                record = self.read()
                if record is None and self._raw() is None:
                    continue  # released while we watched: race for it again
                raise self._held(record)
            if self._raw() != raw:
                continue  # someone else took it over while we watched
            self.took_over = self.read() or {}
            self._backend.delete(self._key)  # then race for it like everyone else
        raise LeaseHeldError(f"could not take the lease of {str(self.target)!r}; retry")

    def _beat(self) -> None:
        while not self._stop.wait(LEASE_HEARTBEAT):
            if self.trusted_for() <= 0:
                return  # not renewed in time: another job may own it; never claim it again
            try:
                record = self.read()
            except FAILED:  # a 503, a deadline met: not renewed this time (trusted_for()
                continue  # says how long that may go on); the heartbeat goes on
            except Exception:  # noqa: BLE001 - the process ends (its client's loop gone):
                return  # never renewed again, which check() refuses
            if not self._ours(record):
                self._given_up = True  # taken over: check() will refuse the commit
                return
            if self.trusted_for() <= 0 or self._stop.is_set():
                return  # the read outlived the lease (a silent store), or the job ended
                # while it waited (an interrupt): do not write
            started, previous = time.monotonic(), self._renewed_at
            try:
                self._put_record()
            except FAILED:
                continue  # as above: unrenewed; the next beat writes a higher counter
            except Exception:  # noqa: BLE001 - as above
                return
            if previous is not None and time.monotonic() - previous >= LEASE_TTL:
                # the put ended when an observer could have taken the lease over (this
                # process was paused after its read, or the put was slow): it may have
                # overwritten that job's record, so it renews nothing (that job writes
                # its own back: _ours); the lease is no longer trusted (check() says so)
                self._given_up = True
                return
            self._renewed_at = started

    def _ours(self, record: dict | None) -> bool:
        """Whether ``record``, the lease's current record, leaves the lease this job's: its
        token, or that of the job this one took the lease over from. The latter is a late
        write of that job (a heartbeat paused between its read and its put, or a put
        delivered late): it must not end this job, which then writes its own record back
        (:meth:`_reassert`); that job, reading this one's, stops claiming the lease."""
        if not record:
            return False
        token = record.get("token")
        return token == self.token or (
            isinstance(token, str) and token == (self.took_over or {}).get("token")
        )

    def _reassert(self, record: dict) -> dict | None:
        """This job's record written over a late write of the job it took the lease
        over from (see :meth:`_ours`), and the record read back."""
        if record.get("token") == self.token:
            return record
        self._put_record()
        return self.read()

    def _put_record(self) -> None:
        """Write this job's record with a counter one higher (a beat, or a write back)."""
        self._beat_no += 1
        self._backend.put(self._key, json.dumps(self._record()).encode())

    def held(self) -> bool:
        """Whether this job holds the lease: renewed in time (asked first, without a
        request), and its token in the record (written back over a late write of the job
        it took the lease over from, :meth:`_ours`)."""
        if self.trusted_for() <= 0:
            return False
        record = self.read()
        if record is None or not self._ours(record):
            return False
        record = self._reassert(record)
        return record is not None and record.get("token") == self.token

    def lost(self) -> bool:
        """Whether :meth:`check` will refuse the commit, known without a request: the
        heartbeat gave up (:meth:`_beat`), or the lease went unrenewed past its trust."""
        if self._thread is None or self._stop.is_set():
            return False
        return self._given_up or self.trusted_for() <= 0

    def check(self) -> None:
        """:class:`LeaseLostError` unless this job may commit, naming the lease's owner."""
        unrenewed = self._renewed_at is not None and self.trusted_for() <= 0
        if not unrenewed and self.held():
            return
        try:  # unrenewed: the store may be silent, each request waiting its deadline
            record = answer_within(self.read, LOOK_SECONDS) if unrenewed else self.read()
        except FAILED:
            if not unrenewed:
                raise
            record = None  # the store does not answer: say what this job knows
        if record is not None and not self._ours(record):
            raise LeaseLostError(
                f"the lease of {str(self.target)!r} was taken over by "
                f"{self.describe(record)} while this job ran (it was thought dead); "
                f"nothing was committed: see what that job wrote with `slem-dask versions "
                f"{self.target}` before you run this command again"
            )
        how = (  # mypy: _renewed_at is set when unrenewed
            f"was not renewed for {time.monotonic() - (self._renewed_at or 0):.0f} s (its "
            f"store did not answer, or this process was stopped or paused), so another "
            f"job may have taken it over"
            if unrenewed
            else "was deleted while this job ran (it was thought dead)"
        )
        raise LeaseLostError(
            f"the lease of {str(self.target)!r} {how}; {lost_lease_advice(self.target)}"
        )

    def release(self, wait: float | None = None) -> None:
        """Stop renewing the lease, and delete it if this job still holds it; ``wait``:
        the most seconds to wait for that (an interrupted job must end within seconds
        even when its store does not answer: the lease is then left as a killed job's
        is, and the next job takes it over)."""
        lost = self.lost()  # its heartbeat writes no more: not waited for (it may be in a
        # request to a store that does not answer, 5 s more of a job that lost its lease)
        self._stop.set()
        _HELD_HERE.discard(self.token)
        _OPEN.discard(self)
        if self._thread is not None:
            self._thread.join(timeout=0 if lost else 5 if wait is None else min(5, wait))
        if wait is None:
            self._delete_if_held()
            return
        deleting = threading.Thread(target=self._delete_quietly, daemon=True, name="lease-release")
        deleting.start()
        deleting.join(timeout=wait)

    def _delete_quietly(self) -> None:
        """:meth:`_delete_if_held` in a thread that may outlive the job: the interpreter
        may be exiting while it waits (its client's loop gone), with nothing to tell."""
        try:
            self._delete_if_held()
        except BaseException:  # noqa: BLE001 - see above
            pass

    def _delete_if_held(self) -> None:
        try:
            if self.held():
                self._backend.delete(self._key)
        except FAILED:  # a 503, a deadline met: the job's outcome stands (a version it
            # committed is committed): the lease is left as a killed job's is, and the
            # next job takes it over
            pass

    def check_free(self) -> None:
        """Raise :class:`LeaseHeldError` if a job in this PID namespace holds the lease
        and runs (taking nothing, waiting for nothing): the check made before a cluster
        starts. Owners elsewhere are judged by :meth:`acquire`, which may watch them."""
        raw = self._raw()
        if raw is not None and not self.is_stale(raw, watch=0):
            record = self.read()
            if self._same_namespace(record):
                raise self._held(record)

    def _say_taken_over(self) -> None:
        """Tell ``on_wait`` whose lease this job took over, and why it judged that job
        dead; nothing for a record of this very process (a late write of a job of it
        that ended: :data:`_HELD_HERE`)."""
        record = self.took_over or {}
        here = self._same_namespace(record)
        if here and record.get("pid") == os.getpid():
            return
        why = (  # a job whose process is gone cannot resume
            f"its process {record.get('pid')} is gone"
            if here
            else f"its record did not change for {recorded_ttl(record):.0f} s; if that job "
            f"resumes, it is refused and commits nothing"
        )
        self.on_wait(
            f"took the lease of {str(self.target)!r} over from {self.describe(record or None)}: {why}"
        )

    def _held(self, record: dict | None) -> LeaseHeldError:
        advice = "wait until it ends (one writer per store), or write to another path"
        if record and self._same_namespace(record) and _process_stopped(record["pid"]):
            group = process_group(record["pid"])
            advice = (
                f"its process is stopped (SIGSTOP, a debugger), and keeps the lease while "
                f"it exists: continue it with the worker processes stopped with it "
                f"(`kill -CONT -- -{group}`, its process group) or end it, then run this "
                f"command again, or write to another path; once stopped for more than "
                f"{TRUSTED_PART * _owner_ttl(record):.0f} s it can no longer commit (once "
                f"continued, it ends with an error): end it"
                if group
                else f"its process is stopped (SIGSTOP, a debugger): continue it (`kill "
                f"-CONT {record['pid']}`) or end it, then run this command again"
            )
        return LeaseHeldError(
            f"{str(self.target)!r} is being written by another slem-dask job: "
            f"{self.describe(record)}; {advice}. A dead job's lease is taken over "
            f"automatically: at once when its process, in this host's PID namespace, is "
            f"gone; after {recorded_ttl(record):.0f} s without a heartbeat when it runs "
            f"elsewhere (another host, container or PID namespace)"
        )

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, kind, *exc) -> None:
        # an interrupt (Ctrl-C) ends the job within seconds, answered or not
        self.release(wait=INTERRUPTED_RELEASE_WAIT if kind is KeyboardInterrupt else None)
