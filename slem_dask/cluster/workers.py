"""Workers too small for a job's tasks: refused before computing, or explained after.

A worker's nanny restarts it when its process passes 95% of its memory limit
(``distributed.worker.memory.terminate``). A task that needs more than that
kills every worker it is tried on, and distributed gives up after four with a
``KilledWorker`` traceback that never says "memory" (or, when the dead worker
held a scattered model, "lost dependencies"). So:

- :func:`check_memory`, before a job computes: each worker with a nanny and a
  memory limit (and a worker in this process, an in-process LocalCluster, against
  the least of its limit and what this process holds plus the machine's available
  memory: past it the whole process is killed) must hold its current process
  memory (measured after importing what the tasks import: the job names their
  modules) plus one task per thread under 95% of its limit; if not, one line
  names the worker, its limit, the partition and a ``--partition-rows`` whose tasks stay under the pause threshold (80%: the
  worker then never stops taking tasks, and stays well below a restart).
- :func:`explain_failures`, around the jobs: a ``KilledWorker``, or a job that
  lost its cluster while nannies reported memory restarts
  (``client.get_events("worker-restart-memory")``), becomes one line naming the
  workers, their limit, the partition and the same fix.

Bytes one task needs: :mod:`slem_dask.parallel.task_memory` (the estimates and their
measurements with ``benchmarks/bench_task_memory.py``), re-exported here.

Checked against real workers (one ``dask worker --memory-limit``, 135 MiB in use):
at 200 MB, encode partitions of 3,000 rows x 512 float32 ran and 4,000 were
killed (the check refuses 3,000); at 400 MB, 45,000 rows x 256 ran (pausing
once) and 50,000 were killed (the check refuses above 41,000 and suggests
30,000, which ran without pausing).

Partition rows do not change what a fit task holds: for a fit the fix is memory
or smaller chunks. Search and evaluate are not estimated; their deaths are
explained after the fact. A kernel fit's in-memory path holds its rows and
factor rows on the workers for the whole fit: :func:`kernel_fit_bytes`
(:mod:`slem_dask.parallel.task_memory`) estimates them (README's measurements with
``bench_memory.py``: 6.5-6.6 KB per row at d = 512, r = 256, float32, up to
n = 2,000,000; 5.8 KB at d = 256), and ``KernelSLEM(strategy="auto")`` streams instead when they exceed the
workers' memory (:func:`slem_dask.parallel.kernel_stream.choose_strategy`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

import numpy as np

from ..storage import IntegrityError
from ..storage.nodes.workers import ask_workers, listed_workers, wait_for_a_worker
from ..parallel.task_memory import (
    MiB,
    encode_task_bytes,  # noqa: F401
    fit_task_bytes,
    kernel_fit_bytes,
)

__all__ = [
    "WorkerMemoryError",
    "check_memory",
    "encode_task_bytes",
    "fit_task_bytes",
    "kernel_fit_bytes",
    "explain_failures",
    "memory_events",
    "last_memory_event",
]

#: The fraction of its limit at which a nanny restarts a worker, when dask's
#: configuration does not say (distributed's default).
TERMINATE = 0.95
PAUSE = 0.8


class WorkerMemoryError(IntegrityError):
    """A job's tasks need more memory than its workers have; nothing was computed."""


@dataclasses.dataclass
class Plan:
    """One job's partitions, as :func:`check_memory` saw them (for later messages)."""

    what: str  # "encode" or "fit"
    name: str  # the input, e.g. "positives"
    rows: int  # rows per partition
    d: int
    dtype: str
    task_bytes: int  # what one task needs, estimated
    per_row: float  # bytes per row of a partition (0: rows do not matter)
    fixed: int  # bytes that do not depend on the partition's rows
    unit: int  # partitions are whole multiples of this many rows
    resumed: bool = False  # a committed output keeps its partitions: --overwrite
    limits: dict = dataclasses.field(default_factory=dict)  # worker -> memory limit
    in_use: int = 0  # the most a worker held before the job (0: not measured)

    def partition(self) -> str:
        size = self.rows * self.d * np.dtype(self.dtype).itemsize
        return (
            f"partitions of {self.rows} rows x {self.d} {self.dtype} ({size / MiB:.1f} MiB; "
            f"about {self.task_bytes / MiB:.0f} MiB per {self.what} task)"
        )

    def rows_that_fit(self, budget: float) -> int:
        """The most rows per partition (whole units) whose task fits in ``budget``."""
        if self.per_row <= 0:
            return 0
        rows = int((budget - self.fixed) // self.per_row)
        return max(0, rows // self.unit * self.unit)


_plan = contextvars.ContextVar("slem_dask_partition_plan", default=None)
#: What helps a job whose workers die for memory when its partitions do not matter (a
#: kernel fit held in memory: --kernel-memory streaming), set by the job.
_remedy = contextvars.ContextVar("slem_dask_memory_remedy", default=None)
#: True inside an :func:`explain_failures` block: outside one, nothing reads the plan or
#: the remedy, and a value set there would outlive its job in the caller's context (a
#: notebook's next failure would describe an earlier job's partitions)
_explaining = contextvars.ContextVar("slem_dask_explaining", default=False)


def note_memory_remedy(text: str) -> None:
    """Say what helps if this job's workers die for memory (:func:`explain_failures`
    says it instead of a partition size); kept until explain_failures' block ends."""
    if _explaining.get():
        _remedy.set(text)


def _terminate_fraction() -> float | None:
    import dask

    value = dask.config.get("distributed.worker.memory.terminate", TERMINATE)
    return float(value) if value else None


def _pause_fraction() -> float:
    """Above this fraction of its limit a worker takes no new task: a suggested partition
    keeps a worker below it, so that it runs without pausing and far from a restart."""
    import dask

    value = dask.config.get("distributed.worker.memory.pause", PAUSE)
    return float(value) if value else PAUSE


def _worker_memory(task_modules: tuple = (), dask_worker=None) -> int:
    # What the tasks import (the job's modules, e.g. slem_dask.pipeline: zarr, numcodecs,
    # the models) is counted: a fresh worker grows from ~62 to ~135 MiB with it. The job
    # names them, so that this module imports nothing above it.
    import importlib

    import psutil

    for name in task_modules:
        importlib.import_module(name)
    return int(psutil.Process().memory_info().rss)


def _limited_workers(client) -> dict:
    """Workers that a nanny restarts above a memory limit: {address: info}."""
    return {
        a: w for a, w in listed_workers(client).items() if w.get("memory_limit") and w.get("nanny")
    }


def _in_process_workers(client) -> dict:
    """Workers in this process (an in-process LocalCluster: no nanny to restart them;
    past its memory the whole process is killed): {address: info}, each with its
    memory limit lowered to what this process may still take: the memory in use
    plus this machine's available memory, when that is less."""
    import os

    import psutil

    found = {
        a: dict(w)
        for a, w in listed_workers(client).items()
        if a.startswith("inproc://") and str(os.getpid()) in a.split("/") and not w.get("nanny")
    }
    if found:
        room = psutil.Process().memory_info().rss + psutil.virtual_memory().available
        for w in found.values():
            w["memory_limit"] = min(w.get("memory_limit") or room, room)
    return found


def check_memory(client, plan: Plan, n_tasks: int, task_modules: tuple = ()) -> None:
    """Refuse a job whose tasks cannot fit in its workers (see the module); record
    ``plan`` for :func:`explain_failures`. ``task_modules``: the names of the modules
    the job's tasks import, imported on each worker before its memory is measured."""
    if _explaining.get():
        _plan.set(plan)
    fraction = _terminate_fraction()
    if client is None or n_tasks <= 0:
        return
    wait_for_a_worker(client)  # else no worker is checked, and those that join are not
    limited = _limited_workers(client)
    plan.limits = {a: w["memory_limit"] for a, w in limited.items()}
    in_process = _in_process_workers(client)
    limited.update(in_process)
    if not limited:
        return
    used = ask_workers(
        client,
        _worker_memory,
        tuple(task_modules),
        workers=list(limited),
        what="the check of the workers' memory",
    )  # one that left: dropped
    # measured even when there is no threshold to check against: the rows suggested
    # after workers die for memory must pass the check that the next run makes
    plan.in_use = max(used.values(), default=0)
    if fraction is None:
        return
    short = []  # (rows that fit, address, info, tasks at once, in use) of the short ones
    for address, w in limited.items():
        if address not in used:
            continue
        tasks = min(int(w.get("nthreads", 1) or 1), n_tasks)
        if tasks * plan.task_bytes > fraction * w["memory_limit"] - used[address]:
            fits = plan.rows_that_fit(
                (_pause_fraction() * w["memory_limit"] - used[address]) / tasks
            )
            short.append((fits, address, w, tasks, used[address]))
    if not short:
        return
    fits, address, w, tasks, in_use = min(short, key=lambda s: s[0])
    others = f" (and {len(short) - 1} other worker(s))" if len(short) > 1 else ""
    threads = f"{tasks} tasks at once (one per thread), each" if tasks > 1 else "one task"
    has = (
        f"worker {address}{others} has a memory limit of {w['memory_limit'] / MiB:.1f} "
        f"MiB (its nanny restarts it at {fraction:.0%}; {in_use / MiB:.0f} MiB in use)"
        if address not in in_process
        else f"worker {address} runs in this process, which may use {w['memory_limit'] / MiB:.1f}"
        f" MiB (dask's memory limit, or what it holds plus this machine's available "
        f"memory, whichever is less; the job is refused above {fraction:.0%} of it; "
        f"{in_use / MiB:.0f} MiB in use)"
    )
    raise WorkerMemoryError(
        f"{has}, too "
        f"little for {threads} of {plan.partition()}; nothing was computed: "
        f"{_fix(plan, fits, in_use, tasks, address in in_process)}"
    )


#: Where more memory comes from: `dask worker --memory-limit` sets a worker process's; a
#: worker in this process has what the machine has free (no option of slem-dask sets it).
_MORE_MEMORY = {
    False: "give the workers more memory (dask worker --memory-limit)",
    True: "free memory on this machine (the worker runs in this process), or run "
    "on a cluster with more memory (--scheduler)",
}


def _fix(plan: Plan, rows: int, in_use: float, tasks: int, in_process: bool = False) -> str:
    """The remedy: a --partition-rows that fits (``rows``), else the memory a worker needs."""
    if rows and rows < plan.rows:
        return _smaller_partitions(plan, rows, in_process=in_process)
    smallest = plan.fixed + plan.unit * plan.per_row if plan.per_row else plan.task_bytes
    want = (in_use + tasks * smallest) / _pause_fraction()
    why = (
        f"even {plan.unit} rows (one chunk of the {plan.name}) need about "
        f"{smallest / MiB:.0f} MiB per task"
        if plan.per_row
        else f"a {plan.what} task holds whole chunks of the {plan.name}, whatever "
        f"--partition-rows says"
    )
    more = (
        f"this process needs about {want / MiB:.0f} MiB: {_MORE_MEMORY[True]}"
        if in_process
        else f"give each worker at least {want / MiB:.0f} MiB (dask "
        f"worker --memory-limit) or fewer threads"
    )
    return f"{why}: {more}, or store the {plan.name} in smaller chunks"


def _smaller_partitions(plan: Plan, rows: int, or_less: str = "", in_process: bool = False) -> str:
    """The remedy "--partition-rows ROWS"; a committed output keeps its partition size
    unless rebuilt (--overwrite). A failed job's draft does not: a run with other
    partitions starts its own."""
    need = plan.fixed + rows * plan.per_row
    flag, notes = f"--partition-rows {rows}{or_less}", []
    if plan.what == "encode" and plan.resumed:
        flag = f"--overwrite {flag}"
        notes.append(
            f"without --overwrite the existing output keeps its partitions of {plan.rows} rows"
        )
    notes += ["partition_rows in a job spec", f"about {need / MiB:.0f} MiB per task"]
    return f"pass {flag} ({'; '.join(notes)}), or {_MORE_MEMORY[in_process]}"


# -- after the fact ----------------------------------------------------------------
def last_memory_event(client) -> float:
    """The scheduler time of the last memory restart logged so far (-inf: none): what
    :func:`memory_events` counts from for a job that starts now."""
    return max((t for t, _ in memory_events(client)), default=float("-inf"))


def memory_events(client, after: float = float("-inf")) -> list:
    """The nannies' memory restarts logged after scheduler time ``after``: [(time, msg)]."""
    try:
        return [(t, msg) for t, msg in client.get_events("worker-restart-memory") if t > after]
    except Exception:  # noqa: BLE001 - an old or lost scheduler: nothing to add
        return []


def _killed_worker(exc: BaseException):
    from distributed.scheduler import KilledWorker

    while exc is not None:
        if isinstance(exc, KilledWorker):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _lost_dependencies(exc: BaseException) -> bool:
    from concurrent.futures import CancelledError

    while exc is not None:
        if isinstance(exc, CancelledError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _limits(limits: dict, dead: list) -> str:
    """The memory limits of the workers that died (as seen before the job), else of all."""
    values = {limits[a] for a in dead if limits.get(a)} or {v for v in limits.values() if v}
    if not values:
        return "memory limit unknown"
    return "memory limit " + ", ".join(f"{v / MiB:.1f}" for v in sorted(values)) + " MiB"


def _restarted(dead: list, names: dict | None) -> list:
    """The workers of ``dead`` (addresses in the nannies' restart events) as they were
    before the job (``names``: address -> name then): a restarted worker comes back
    at a new address, and its later restarts log that one; unknown ones stay."""
    if not names or not any(a in names for a in dead):
        return dead
    return [a for a in dead if a in names]


def explain(
    exc: BaseException, events: list, limits: dict, what_is_kept: str, names: dict | None = None
) -> str | None:
    """One line for a job that failed because workers died (``events``: the nannies'
    memory restarts during the job; ``limits``: worker -> memory limit before it;
    ``names``: worker -> name before it), or None if it did not fail so."""
    killed = _killed_worker(exc)
    if killed is None and not (events and _lost_dependencies(exc)):
        return None
    plan = _plan.get()
    dead = _restarted(sorted({msg.get("worker", "?") for _, msg in events}), names)
    if killed is not None and not dead:
        last = getattr(getattr(killed, "last_worker", None), "address", None)
        dead = [last] if last else []
    who = (
        ", ".join(
            a if not (names or {}).get(a) or names[a] == a else f"{a} ({names[a]})" for a in dead
        )
        or "the workers"
    )
    if events:
        what = (
            f"worker(s) {who} ({_limits(limits, dead)}) were restarted by their nannies "
            f"{len(events)} time(s) for exceeding their memory limit"
        )
    else:
        tries = getattr(killed, "allowed_failures", 3) + 1
        what = (
            f"{tries} workers died running the same task (last: {who}; "
            f"{_limits(limits, dead)}), most likely out of memory (see the workers' logs)"
        )
    if _remedy.get() is not None:
        return f"{what}; {what_is_kept}: {_remedy.get()}"
    if plan is None:
        return f"{what}; {what_is_kept}: {_MORE_MEMORY[False]}, or pass a smaller --partition-rows"
    # The estimate was too low (or not checked): at most half of what died, or
    # what fits in a limit by the estimate, whole chunks.
    limit = min((v for v in limits.values() if v), default=0)
    budget = plan.task_bytes / 2
    if limit:
        budget = min(budget, _pause_fraction() * limit - plan.in_use)
    rows = plan.rows_that_fit(budget)
    if rows and rows < plan.rows:
        fix = _smaller_partitions(plan, rows, or_less=" or less")
    else:
        fix = f"{_MORE_MEMORY[False]} or fewer threads, or store the {plan.name} in smaller chunks"
    return f"{what} while computing {plan.partition()}; {what_is_kept}: {fix}"


def _worker_limits(client, field: str = "memory_limit") -> dict:
    try:
        return {a: w.get(field) for a, w in listed_workers(client).items()}
    except Exception:  # noqa: BLE001
        return {}


@contextlib.contextmanager
def explain_failures(client, what_is_kept: str = "nothing was marked complete"):
    """Turn worker deaths during the block into one :class:`WorkerMemoryError` line."""
    if client is None:
        yield
        return
    before = last_memory_event(client)
    limits = _worker_limits(client)
    names = {a: str(n) for a, n in _worker_limits(client, "name").items()}
    token, remedy = _plan.set(None), _remedy.set(None)
    explaining = _explaining.set(True)
    try:
        yield
    except Exception as exc:
        if _killed_worker(exc) is None and not _lost_dependencies(exc):
            raise
        limits.update({a: v for a, v in _worker_limits(client).items() if a not in limits})
        text = explain(exc, memory_events(client, before), limits, what_is_kept, names)
        if text is None:
            raise
        raise WorkerMemoryError(text) from None
    finally:
        _plan.reset(token)
        _remedy.reset(remedy)
        _explaining.reset(explaining)
