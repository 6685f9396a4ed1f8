"""A job's tasks that stop progressing: said while waiting, and given up on if asked.

A worker that is stopped (SIGSTOP, swapped out, cut off from the network) keeps
its tasks: the scheduler waits for it until its ``worker-ttl`` (5 minutes by
default) and the client waits in silence. :func:`watch` polls the scheduler
from a background thread for the tasks this client is waiting for; when none
of them has finished for ``warn_after`` seconds it prints one line naming the
workers that hold the running ones, and after ``task_timeout`` seconds without
progress it cancels the client's pending futures (the job's compute then ends)
and the job fails with one line (:class:`TaskTimeout`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from .integrity import IntegrityError

__all__ = ["watch", "TaskTimeout", "stall_warning_seconds"]

#: Seconds without a finished task before the first warning ($SLEM_DASK_STALL_WARNING).
DEFAULT_STALL_WARNING = 60.0
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


def _probe_function():
    """The function run on the scheduler: defined here so that cloudpickle ships it by
    value (a scheduler without slem-dask installed can run it)."""

    beats = SILENT_HEARTBEATS

    def probe(client_id, dask_scheduler=None):
        from time import time

        cs = dask_scheduler.clients.get(client_id)
        if cs is None:
            return None
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
        try:
            from distributed.scheduler import heartbeat_interval

            beat = heartbeat_interval(len(dask_scheduler.workers))
        except ImportError:  # pragma: no cover - renamed in some release
            beat = 1.0
        now = time()
        workers = {}
        for address in {**processing, **inputs}:
            ws = dask_scheduler.workers.get(address)
            if ws is not None:
                age = now - ws.last_seen
                workers[address] = {"name": str(ws.name), "status": ws.status.name,
                                    "silent": age if age >= max(3.0, beats * beat) else 0.0}
        return {"remaining": len(seen), "signature": hash(frozenset(seen)),
                "processing": processing, "no_worker": no_worker, "workers": workers,
                "inputs": {a: n for a, n in inputs.items() if a not in processing},
                "n_workers": len(dask_scheduler.workers)}

    return probe


def _label(address: str, info: dict) -> str:
    name = info.get("name", "")
    return address if not name or name == address else f"{address} ({name})"


def describe(state: dict) -> str:
    """The workers a stalled job waits for, e.g. "worker tcp://h:1 (w0; 2 tasks; not heard
    from for 58 s: stopped, swapping or cut off)"."""
    parts = []
    for address, count in sorted(state["processing"].items()):
        info = state["workers"].get(address, {})
        notes = [f"{count} task{'s' if count > 1 else ''}"]
        if info.get("silent"):
            notes.append(f"not heard from for {info['silent']:.0f} s: stopped, swapping or "
                         f"cut off")
        elif info.get("status") not in (None, "running"):
            notes.append(f"status {info['status']}")  # paused: its memory is full
        else:
            notes.append("responding: its tasks still run, or wait for their inputs")
        parts.append(f"{_label(address, info)} ({'; '.join(notes)})")
    for address, count in sorted(state.get("inputs", {}).items()):
        info = state["workers"].get(address, {})
        if info.get("silent"):  # holds data the running tasks need, and is silent
            parts.append(f"{_label(address, info)} (holds inputs of {count} of those tasks; "
                         f"not heard from for {info['silent']:.0f} s: stopped, swapping or "
                         f"cut off)")
    if state["no_worker"]:
        parts.append(f"{state['no_worker']} task(s) that no connected worker can run "
                     f"({state['n_workers']} worker(s) connected)")
    if not parts:
        return "tasks queued on the scheduler"
    return ("worker " if len(parts) == 1 and state["processing"] else "workers: ") + \
        ", ".join(parts)


def _remedy(state: dict, why: bool = True) -> str:
    one = len(state["processing"]) + sum(
        1 for a in state.get("inputs", {}) if state["workers"].get(a, {}).get("silent")) == 1
    text = "check or restart " + ("that worker" if one else "those workers")
    if why:
        text += " (its tasks then run elsewhere)" if one else \
            " (their tasks then run elsewhere)"
    return text


class _Watch:
    def __init__(self, client, task_timeout, warn_after, interval, out, source):
        self.client, self.task_timeout, self.warn_after = client, task_timeout, warn_after
        self.interval, self.out, self.source = interval, out, source
        self.message = None  # set when the job was given up on
        self.remedy = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slem-dask-watchdog",
                                        daemon=True)

    def _say(self, text: str) -> None:
        print(f"slem-dask: {text}", file=self.out, flush=True)

    def _run(self) -> None:
        probe = _probe_function()
        last, since, warned = None, time.monotonic(), 0
        while not self._stop.wait(self.interval):
            try:
                state = self.client.run_on_scheduler(probe, self.client.id)
            except Exception:  # noqa: BLE001 - a lost scheduler is the job's to report
                continue
            now = time.monotonic()
            key = None if not state or not state["remaining"] else \
                (state["remaining"], state["signature"])
            if key is None or key != last:  # something finished (or nothing to wait for)
                if warned and key is not None:
                    self._say(f"tasks progress again after {now - since:.0f} s")
                last, since, warned = key, now, 0
                continue
            stalled = now - since
            if self.task_timeout is not None and stalled >= self.task_timeout:
                self.message = (f"no task of this job finished for {stalled:.0f} s "
                                f"({self.source}{' ' if self.source.startswith('--') else ' = '}"
                                f"{self.task_timeout:g}), waiting for "
                                f"{describe(state)}")
                self.remedy = _remedy(state, why=False)
                self._cancel()
                return
            if stalled >= self.warn_after * (warned + 1):
                warned += 1
                hint = ("" if self.task_timeout is not None else
                        "; --task-timeout SECONDS gives up after that long without progress")
                self._say(f"no task finished for {stalled:.0f} s, waiting for "
                          f"{describe(state)}: {_remedy(state)}{hint}")

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
def watch(client, task_timeout: float | None = None, warn_after: float | None = None,
          interval: float | None = None, what_is_kept: str = "nothing was marked complete",
          out=None, source: str = "--task-timeout"):
    """Watch the tasks ``client`` waits for while the block runs (see the module).

    If the job was given up on (``task_timeout``, set by ``source``), whatever the
    block raised becomes one :class:`TaskTimeout` naming the workers and ``what_is_kept``
    (a text, or a function that says it as it is when the job is given up on).
    """
    if client is None:
        yield None
        return
    warn_after = warn_after if warn_after is not None else stall_warning_seconds()
    interval = interval if interval is not None else _env_seconds("SLEM_DASK_WATCH_INTERVAL",
                                                                   DEFAULT_INTERVAL)
    interval = min(interval, warn_after / 2, (task_timeout or warn_after) / 2)
    dog = _Watch(client, task_timeout, warn_after, interval, out or sys.stderr, source)
    try:
        with dog:
            yield dog
    except BaseException:
        if dog.message is None:
            raise
        kept = what_is_kept() if callable(what_is_kept) else what_is_kept
        raise TaskTimeout(f"{dog.message}; {kept}: {dog.remedy} (or raise "
                          f"{source}), then run the same command again") from None
