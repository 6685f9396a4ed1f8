"""A job's tasks that stop progressing: said while waiting, and given up on if asked.

A worker that is stopped (SIGSTOP, swapped out, cut off from the network) keeps
its tasks: the scheduler waits for it until its ``worker-ttl`` (5 minutes by
default) and the client waits in silence. :func:`watch` polls the scheduler
from a background thread for the tasks this client is waiting for; when none
of them has finished for ``warn_after`` seconds it prints one line naming the
workers that hold the running ones, and after ``task_timeout`` seconds without
progress it cancels the client's pending futures (the job's compute then ends)
and the job fails with one line (:class:`TaskTimeout`).

That line says what the scheduler knows: a worker not heard from (stopped, swapping,
cut off) or paused by dask for memory (with its memory and limit) is named with its
remedy; an object store of the job that does not answer is named as such; tasks that
run on workers that answer are long tasks, said as progress (done/total, rate, time
left), not as a worker to restart. Without progress bars a line of progress comes
every ``progress_every`` seconds while tasks finish.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from ..core.steps import current_step
from .stall_text import describe, duration, long_tasks, remedy, running
from ..storage import IntegrityError
from ..storage.versioning.errors import lost_lease_advice
from ..storage.versioning.leases import LeaseLostError, lost_lease, open_leases

__all__ = ["watch", "TaskTimeout", "stall_warning_seconds", "progress_line_seconds"]

#: Seconds without a finished task before the first warning ($SLEM_DASK_STALL_WARNING).
DEFAULT_STALL_WARNING = 60.0
#: Seconds between two lines of progress without a terminal ($SLEM_DASK_PROGRESS_LINES).
DEFAULT_PROGRESS_LINES = 60.0
#: Seconds between two looks at the scheduler ($SLEM_DASK_WATCH_INTERVAL).
DEFAULT_INTERVAL = 2.0
#: A worker not heard from for this many of its heartbeat intervals (0.5 s up to 10
#: workers, 1 s up to 50, more beyond), and at least 3 s, is said to be silent.
SILENT_HEARTBEATS = 5


class TaskTimeout(IntegrityError):
    """The job's tasks made no progress for --task-timeout seconds; the job gave up."""


def _env_seconds(name: str, default: float) -> float:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"${name} = {text!r}: expected a number of seconds > 0") from None
    if not value > 0:
        raise ValueError(f"${name} = {text!r}: expected a number of seconds > 0")
    return value


def stall_warning_seconds() -> float:
    return _env_seconds("SLEM_DASK_STALL_WARNING", DEFAULT_STALL_WARNING)


def progress_line_seconds() -> float:
    """Seconds between progress lines of a job shown without progress bars
    ($SLEM_DASK_PROGRESS_LINES, default a minute)."""
    return _env_seconds("SLEM_DASK_PROGRESS_LINES", DEFAULT_PROGRESS_LINES)


def _task_walker():
    """What a client waits for, and what that still needs, walked on the scheduler: a
    closure, shipped by value with :func:`_probe_function`'s probe."""

    def walk(cs):
        done = ("memory", "erred", "forgotten")
        stack = [ts for ts in cs.wants_what if ts.state not in done]
        seen, processing, inputs, no_worker = set(), {}, {}, 0
        while stack:  # what the client waits for, and what that still needs
            ts = stack.pop()
            if ts.key in seen:
                continue
            seen.add(ts.key)
            if ts.state == "processing" and ts.processing_on is not None:
                address = ts.processing_on.address
                processing[address] = processing.get(address, 0) + 1
                for dts in ts.dependencies:  # a task also waits for its inputs' holders
                    for ws in dts.who_has or ():
                        inputs[ws.address] = inputs.get(ws.address, 0) + 1
            elif ts.state == "no-worker":
                no_worker += 1
            stack.extend(d for d in ts.dependencies if d.state not in done and d.key not in seen)
        return seen, processing, inputs, no_worker

    return walk


def _probe_function():
    """The function run on the scheduler: defined here so that cloudpickle ships it by
    value (a scheduler without slem-dask installed can run it)."""

    beats = SILENT_HEARTBEATS
    walk = _task_walker()

    def probe(client_id, dask_scheduler=None):
        from time import time

        cs = dask_scheduler.clients.get(client_id)
        if cs is None:
            return None
        seen, processing, inputs, no_worker = walk(cs)
        try:
            from distributed.scheduler import heartbeat_interval

            beat = heartbeat_interval(len(dask_scheduler.workers))
        except ImportError:  # pragma: no cover - renamed in some release
            beat = 1.0
        now = time()
        workers, paused = {}, {}
        for address, ws in dask_scheduler.workers.items():
            age = now - ws.last_seen
            info = {
                "name": str(ws.name),
                "status": ws.status.name,
                "silent": age if age >= max(3.0, beats * beat) else 0.0,
                "memory": int(ws.memory.process),
                "limit": int(ws.memory_limit or 0),
            }
            if address in processing or address in inputs:
                workers[address] = info
            if info["status"] == "paused":  # dask's memory monitor: it takes no task
                paused[address] = info
        return {
            "remaining": len(seen),
            "signature": hash(frozenset(seen)),
            "processing": processing,
            "no_worker": no_worker,
            "workers": workers,
            "inputs": {a: n for a, n in inputs.items() if a not in processing},
            "paused": paused,
            "n_workers": len(dask_scheduler.workers),
            "address": dask_scheduler.address,
        }

    return probe


class _Progress:
    """Tasks done of those the client waits for, since they were submitted."""

    def __init__(self):
        self.total, self.start, self.left = None, 0.0, 0

    def see(self, remaining: int, now: float) -> None:
        if not remaining:
            self.total = None  # nothing to wait for: the next compute starts afresh
        elif self.total is None or remaining > self.left:  # a new computation
            self.total, self.start = remaining, now
        self.left = remaining

    def text(self, now: float) -> str:
        done, elapsed = self.total - self.left, max(now - self.start, 1e-9)
        line = f"{done} of {self.total} tasks done in {duration(elapsed)}"
        if not done:
            return line + " (none finished yet: no estimate of the time left)"
        rate = done / elapsed
        per_minute = f"{rate * 60:.0f}" if rate * 60 >= 100 else f"{rate * 60:.3g}"
        return line + (f" ({per_minute}/min; about {duration(self.left / rate)} left at that rate)")


def _unreachable_store(stores) -> str | None:
    """The first of ``stores`` (paths or URLs) whose object store does not answer, said
    as its backend says it; None when all answer (or cannot be asked)."""
    from ..storage.backends.registry import backend_for
    from ..storage.backends.paths import canonical

    for path in stores:
        try:
            url = canonical(path).url
            if url.startswith(("file://", "memory://")):
                continue
            said = getattr(backend_for(url), "unreachable", lambda: None)()
        except Exception:  # noqa: BLE001 - a check must not stop the watch
            continue
        if said:
            return said
    return None


class _Watch:
    def __init__(
        self,
        client,
        task_timeout,
        warn_after,
        interval,
        out,
        source,
        progress_every=None,
        stores=(),
    ):
        self.client, self.task_timeout, self.warn_after = client, task_timeout, warn_after
        self.interval, self.out, self.source = interval, out, source
        self.progress_every, self.stores = progress_every, list(stores)
        self.progress = _Progress()
        self.message = None  # set when the job was given up on
        self.remedy = ""
        self.lost = None  # the job's lease, once it can no longer commit under it
        self._held_before = open_leases()  # another caller's: not this job's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slem-dask-watchdog", daemon=True)

    def _say(self, text: str) -> None:
        print(f"slem-dask: {text}", file=self.out, flush=True)

    def _run(self) -> None:
        probe = _probe_function()
        last, since, warned = None, time.monotonic(), 0
        said_at = since  # the last progress line (without a terminal)
        step_said: tuple = (None, 0)  # (the step said, how many times)
        while not self._stop.wait(self.interval):
            if self._lease_lost():
                continue
            try:
                state = self.client.run_on_scheduler(probe, self.client.id)
            except Exception:  # noqa: BLE001 - a lost scheduler is the job's to report
                continue
            now = time.monotonic()
            self.progress.see(state["remaining"] if state else 0, now)
            key = (
                None
                if not state or not state["remaining"]
                else (state["remaining"], state["signature"])
            )
            if key is None:  # no task waited for: a step of this process may run long
                step_said = self._say_long_step(now, step_said)
            if key is None or key != last:  # something finished (or nothing to wait for)
                if warned and key is not None:
                    self._say(f"tasks progress again after {now - since:.0f} s")
                last, since, warned = key, now, 0
                if (
                    key is not None
                    and self.progress_every
                    and now - max(said_at, self.progress.start) >= self.progress_every
                ):
                    said_at = now
                    self._say(self.progress.text(now))
                continue
            stalled = now - since
            if self.task_timeout is not None and stalled >= self.task_timeout:
                self._give_up(state, stalled)
                return
            if stalled >= self.warn_after * (warned + 1):
                warned += 1
                said_at = now
                self._say(self._stall_line(state, stalled, now))

    def _lease_lost(self) -> bool:
        """Whether the job lost its lease: then whatever it waits for is cancelled, now
        and at every look after (a compute that starts later), for its commit would be
        refused however long it ran on."""
        lost = self.lost or lost_lease(self._held_before)
        if lost is None:
            return False
        self.lost = lost
        self._cancel()
        return True

    def _say_long_step(self, now: float, said: tuple) -> tuple:
        """One line each ``warn_after`` seconds that this process computes a long step
        of its own (no dask task is waited for then): which, for how long; returns what
        was said so far, (step, times)."""
        step = current_step()
        if step is None:
            return (None, 0)
        what, started = step
        times = said[1] if said[0] == step else 0
        took = now - started
        if took >= self.warn_after * (times + 1):
            self._say(
                f"this process computes {what} for {duration(took)} so far (no dask "
                f"task runs meanwhile: the workers wait for it, they are not stuck)"
            )
            times += 1
        return (step, times)

    def _stall_line(self, state: dict, stalled: float, now: float) -> str:
        """What the job waits for after ``stalled`` seconds without a finished task."""
        hint = (
            ""
            if self.task_timeout is not None
            else "; --task-timeout SECONDS gives up after that long without progress"
        )
        store = _unreachable_store(self.stores)
        if store:  # its tasks wait on the store, not on a worker
            return f"no task finished for {stalled:.0f} s: {store}"
        if long_tasks(state):
            return (
                f"no task finished for {stalled:.0f} s; {self.progress.text(now)}; "
                f"{running(state)}: long tasks, not a stuck worker{hint}"
            )
        return (
            f"no task finished for {stalled:.0f} s, waiting for {describe(state)}: "
            f"{remedy(state)}{hint}"
        )

    def _give_up(self, state: dict, stalled: float) -> None:
        store = _unreachable_store(self.stores)
        self.message = (
            f"no task of this job finished for {stalled:.0f} s "
            f"({self.source}{' ' if self.source.startswith('--') else ' = '}"
            f"{self.task_timeout:g}), waiting for "
            f"{'the object store: ' + store if store else describe(state)}"
        )
        self.remedy = "once the store answers" if store else remedy(state, why=False)
        self._cancel()

    def _cancel(self) -> None:
        """Cancel what the client waits for: its compute raises, the job ends."""
        from distributed import Future

        async def pending():
            return [k for k, st in self.client.futures.items() if st.status == "pending"]

        try:
            keys = self.client.sync(pending)
            self.client.cancel([Future(k, self.client) for k in keys])
        except Exception:  # noqa: BLE001 - the scheduler may be gone as well
            pass

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=max(5.0, 2 * self.interval))


@contextlib.contextmanager
def watch(
    client,
    task_timeout: float | None = None,
    warn_after: float | None = None,
    interval: float | None = None,
    what_is_kept: str = "nothing was marked complete",
    out=None,
    source: str = "--task-timeout",
    progress_every: float | None = None,
    stores=(),
):
    """Watch the tasks ``client`` waits for while the block runs (see the module).

    If the job was given up on (``task_timeout``, set by ``source``), whatever the
    block raised becomes one :class:`TaskTimeout` naming the workers and ``what_is_kept``
    (a text, or a function that says it as it is when the job is given up on).
    ``progress_every``: seconds between lines of progress while tasks finish (done/total,
    rate, time left), for a job shown without progress bars; None: none. ``stores``: the
    job's store paths: one whose object store does not answer is named in a stall line.
    """
    if client is None:
        yield None
        return
    warn_after = warn_after if warn_after is not None else stall_warning_seconds()
    interval = (
        interval
        if interval is not None
        else _env_seconds("SLEM_DASK_WATCH_INTERVAL", DEFAULT_INTERVAL)
    )
    interval = min(interval, warn_after / 2, (task_timeout or warn_after) / 2)
    dog = _Watch(
        client,
        task_timeout,
        warn_after,
        interval,
        out or sys.stderr,
        source,
        progress_every,
        stores,
    )
    try:
        with dog:
            yield dog
    except BaseException:
        if dog.lost is not None:
            _raise_lost(dog.lost)
        if dog.message is None:
            raise
        kept = what_is_kept() if callable(what_is_kept) else what_is_kept
        raise TaskTimeout(
            f"{dog.message}; {kept}: {dog.remedy} (or raise "
            f"{source}), then run the same command again"
        ) from None


def _raise_lost(lease) -> None:
    """The job's end once its lease was lost: :meth:`Lease.check`'s own refusal, which
    says how (one read of the lease record, with the storage's deadline); if that read
    fails, the refusal without the new owner's name."""
    try:
        lease.check()
    except LeaseLostError:
        raise
    except Exception:  # noqa: BLE001 - the store did not answer: say what is known
        pass
    raise LeaseLostError(
        f"the lease of {str(lease.target)!r} was lost while this job ran (taken over by "
        f"another job, or not renewed in time); {lost_lease_advice(lease.target)}"
    ) from None
