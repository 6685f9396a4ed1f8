"""What every batch job shares: the job report, computing on the cluster with progress and
stall warnings, and the errors a job raises when it fails or loses its cluster."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field

from concurrent.futures import CancelledError

import dask
from distributed.comm.core import CommClosedError

from .. import storage
from ..core.validation import RowsError


#: Seconds of waiting for a lease from which a report shows it apart from ``open``.
LEASE_WAIT_SHOWN = 0.5


@dataclass
class JobReport:
    """What a job did, for printing and for the attributes of what it wrote."""

    name: str
    facts: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)

    def split_lease_wait(self, tx) -> JobReport:
        """The time ``tx`` waited for another job's lease, shown as ``lease wait`` ahead of
        the other timings and taken out of ``open``, which it was part of (a job that
        waited two minutes for a lease read as two minutes spent opening its stores).
        Taking a free lease (a write and a read back, milliseconds) stays in ``open``.
        Returns this report."""
        wait = tx.lease_wait
        if wait >= LEASE_WAIT_SHOWN and "open" in self.timings:
            timings = {"lease wait": wait, **self.timings}
            timings["open"] = max(0.0, timings["open"] - wait)
            self.timings = timings
        return self

    def lines(self) -> list[str]:
        out = [f"{self.name}:"]
        out += [f"  {k:<18} {v}" for k, v in self.facts.items()]
        out += [f"  {k + ' [s]':<18} {v:.2f}" for k, v in self.timings.items()]
        return out


def _detail(exc: ValueError, path=None) -> str:
    """An input's error without the library's parameter name (the job names the store);
    rows of an input read from several files (``path``: .npy shards) are also named by
    file and row there."""
    if not isinstance(exc, RowsError):
        return str(exc)
    where = _rows_in_files(path, exc.rows) if exc.rows and path is not None else None
    if not where or "(rows " not in exc.detail:
        return exc.detail
    end = exc.detail.index(")", exc.detail.index("(rows "))  # after the rows it shows
    return f"{exc.detail[:end]}: {where}{exc.detail[end:]}"


def _rows_in_files(path, rows) -> str | None:
    """Where ``rows`` of the input at ``path`` are, by file and row ("emb_2.npy row 7"),
    if it is read from several files; None otherwise (or if it cannot be opened)."""
    from .. import storage

    try:
        arr = storage.open_input(str(path), "input")
    except Exception:  # noqa: BLE001 - the message stands without it
        return None
    locate = getattr(arr, "locate_rows", None)
    return locate(rows) if locate is not None else None


def _compute(client, obj, progress: bool):
    """Compute one collection or Delayed on ``client``, with a progress bar if asked."""
    if client is None:
        return dask.compute(obj)[0]
    future = client.compute(obj)  # a list of futures for a list of collections
    if progress:
        from distributed import progress as show_progress

        show_progress(future)
        sys.stdout.write("\n")
    try:
        return client.gather(future)
    except BaseException as exc:
        # Ctrl-C, and the watchdog's cancel (its lease lost, --task-timeout), end a job
        # within seconds even when its tasks wait on a store that does not answer (they
        # end at their requests' deadlines, minutes): such a job removes nothing its
        # tasks may still write into (its draft stays, for a re-run or the taker)
        given_up = isinstance(exc, (KeyboardInterrupt, CancelledError))
        _settle(client, future, timeout=INTERRUPTED_SETTLE if given_up else 60.0)
        raise


def _threads(client) -> int:
    """Threads that run tasks: the cluster's, or those of dask's local scheduler."""
    if client is None:
        return int(dask.config.get("num_workers", None) or os.cpu_count() or 1)
    return max(1, sum(client.nthreads().values()))


#: The most seconds a job interrupted or given up on waits for its running tasks to end.
INTERRUPTED_SETTLE = 3.0


def _settle(client, future, timeout: float = 60.0) -> None:
    """After a failed compute, cancel the rest and wait (up to ``timeout``) until no task
    runs on the workers: tasks already running when one failed keep going, and the
    caller must not remove an output while they still write chunks into it."""
    try:
        client.cancel(future)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            busy = _run_within(
                client,
                lambda dask_worker: (
                    len(dask_worker.state.executing) + len(dask_worker.state.long_running)
                ),
                min(5.0, deadline - time.monotonic()),
            )
            if not busy or not any(busy.values()):
                return  # idle, or a worker does not answer (stopped: it writes nothing)
            time.sleep(0.05)
    except Exception:  # cleanup is best effort: the original error is what matters
        pass


def _run_within(client, function, seconds: float):
    """``client.run(function)``, or None if a worker has not answered within ``seconds``
    (a stopped worker would hold the call as long as it is stopped) or the call failed
    (the client closed while the worker slept)."""
    return storage.backends.answer_within(lambda: client.run(function), seconds)


class JobFailed(storage.IntegrityError):
    """A job stopped for a reason outside its inputs (lost scheduler, workers that do
    not see the same storage, a store taken over); the message says what is kept."""


#: What the jobs' tasks import (zarr, numcodecs, the models): workers.check_memory imports
#: it on each worker before measuring what the worker holds, as a task's worker would.
TASK_MODULES = ("slem_dask.pipeline",)

#: Errors that mean the connection to the cluster is gone, not that the data is bad.
_LOST = (CancelledError, CommClosedError, ConnectionError, TimeoutError)


def _lost_cluster(exc: BaseException, what_is_kept: str) -> JobFailed:
    text = str(exc)
    why = (
        "the connection to the scheduler was lost"
        if "connection" in text.lower() or isinstance(exc, (CommClosedError, ConnectionError))
        else f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else 'cancelled'}"
    )
    return JobFailed(f"lost the dask cluster while computing ({why}); {what_is_kept}")


def update_refusal(model_path, meta: dict, negatives, arr) -> str | None:
    """Why ``--update`` cannot append the rows of ``arr`` (the store ``negatives``) to the
    model at ``model_path`` (``meta``: its metadata: fitted on the first ``n_samples``
    rows of ``source``, ``n_features`` wide), with the remedy for its kind; None when
    it can."""
    source, n_features = meta.get("source"), meta.get("n_features")
    n_rows = int(meta.get("n_samples", -1))
    fitted = (
        f"--update: the model {str(model_path)!r} was fitted on {n_rows} rows of "
        f"{storage.shown_path(source)!r}"
    )
    if source is None:  # saved by the library: `fit(X).save(path)` read no store
        why = (
            f"--update: the model {str(model_path)!r} was fitted on {n_rows} rows given in "
            f"memory (saved by the library, e.g. LinearSLEM().fit(X).save(...)), not read "
            f"from a store: an update appends the rows added to the store a fit read"
        )
    elif source != negatives.url:
        why = (
            f"{fitted}, not of {str(negatives)!r}: an update appends the rows added to the "
            f"same store since (a store moved or copied elsewhere counts as another one)"
        )
    elif n_features != arr.shape[1]:
        why = (
            f"{fitted} with {n_features} features; that store now has {arr.shape[1]} "
            f"(shape {arr.shape})"
        )
    elif n_rows > arr.shape[0]:
        why = (
            f"{fitted}; that store now holds only {arr.shape[0]} rows (shape {arr.shape}): "
            f"rows were removed"
        )
    else:
        return None
    return why + (
        "; refit on all rows with --repivot (same parameters) or --overwrite"
        if meta.get("model") == "KernelSLEM"
        else "; fit from scratch with --overwrite"
    )


# -- a full disk ----------------------------------------------------------------------
MiB = 2**20


def size_text(n: float) -> str:
    n = max(n, 0)
    return (
        f"{n / 2**30:.1f} GiB"
        if n >= 2**30
        else f"{n / MiB:.1f} MiB"
        if n >= MiB
        else f"{n / 1024:.1f} KiB"
    )


def _local_room(path) -> tuple[str, int] | None:
    """(mount point, bytes free there) of the file system that holds the local ``path``
    (or its nearest existing folder); None for an object store or if unknown."""
    import shutil

    path = storage.canonical(path)
    if not path.is_local:
        return None
    where = path.location
    while where != os.path.dirname(where) and not os.path.exists(where):
        where = os.path.dirname(where)
    try:
        free = shutil.disk_usage(where).free
        while not os.path.ismount(where):
            where = os.path.dirname(where)
    except OSError:
        return None
    return where, int(free)


def out_of_space_line(exc: OSError, path, needed: float | None, what_is_kept: str) -> str:
    """One line for a write that found no space (ENOSPC, or a quota: EDQUOT): the store,
    the space the job needs (``needed``: an estimate in bytes, None if unknown), what is
    free there, what the failure left, and what to free."""
    room = _local_room(path)
    facts = [f"{exc.strerror or exc}" + (f" writing {exc.filename}" if exc.filename else "")]
    if needed:
        facts.append(f"this job writes about {size_text(needed)} there")
    if room is not None:
        facts.append(f"{size_text(room[1])} free on the file system mounted at {room[0]}")
    if needed and room is not None and room[1] < needed:
        free = f"free at least {size_text(needed - room[1])} on {room[0]}"
    else:
        free = (
            f"free space on {room[0]}"
            if room is not None
            else "free space (or raise the quota) on that storage"
        )
    return (
        f"no space left on the storage of {str(path)!r} ({'; '.join(facts)}); "
        f"{what_is_kept}: {free} (files you no longer need; each slem-dask store keeps "
        f"its last versions until its next job: `slem-dask versions PATH` lists them, "
        f"SLEM_DASK_KEEP_VERSIONS=2 keeps fewer), or write to another path, then run "
        f"the same command again"
    )


@contextlib.contextmanager
def full_disk_said(path, needed=None, what_is_kept: str = "nothing was written"):
    """A write of the block that finds no space becomes one :class:`JobFailed` line
    (:func:`out_of_space_line`); ``needed``: bytes, or a function that estimates them
    when it happens; ``what_is_kept``: a text, or a function that says it then."""
    try:
        yield
    except OSError as exc:
        if not storage.is_out_of_space(exc):
            raise
        try:
            size = needed() if callable(needed) else needed
        except Exception:  # noqa: BLE001 - an estimate must not hide the full disk
            size = None
        kept = what_is_kept() if callable(what_is_kept) else what_is_kept
        raise JobFailed(out_of_space_line(exc, path, size, kept)) from None


def hint_small_chunks(report: JobReport, arr, name: str, path, stacklevel: int = 3) -> None:
    """Say once (a warning, kept in the report) that ``arr`` is stored in chunks so
    small that reaching them costs more than their data, and what to rechunk to
    (``stacklevel``: the warning's, counted from this function)."""
    import warnings

    hint = storage.small_chunks_hint(arr, name, path)
    if hint:
        report.facts["hint"] = hint
        warnings.warn(hint, storage.SmallChunksWarning, stacklevel=stacklevel)
