"""Starting or joining a Dask cluster: used by jobs and the command line only.

The library itself never creates a client.
"""

from __future__ import annotations

import contextlib
import logging
import os

import dask

from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from ..core.blas_threads import CountedLimit, usable_cores

__all__ = [
    "connect",
    "SingleThreadedBLAS",
    "default_local_cluster_kwargs",
    "in_process_kwargs",
    "SMALL_INPUT_BYTES",
    "GIL_FREE_JOBS",
    "local_cluster_kind",
    "NO_TASK_PROFILE",
]


class SingleThreadedBLAS(WorkerPlugin):
    """Limit BLAS to one thread in each worker process.

    Dask already runs one task per worker thread; a multi-threaded BLAS inside
    each task would oversubscribe the cores. Nannies set OMP_NUM_THREADS=1
    for the processes they start, but workers started otherwise (or an
    already-loaded BLAS) need the limit applied at run time.
    """

    name = "slem-dask-single-threaded-blas"
    # The same limit every time: a job on a scheduler that has it registers nothing,
    # so a stopped worker cannot hold its start (a registration waits for every worker).
    idempotent = True

    def setup(self, worker):
        _WORKERS_BLAS.enter()

    def teardown(self, worker):
        # Workers in the caller's own process (LocalCluster(processes=False) joined by
        # address) share its BLAS: the last of them to end gives the caller its threads back.
        _WORKERS_BLAS.leave()


def _process_wide_single_blas_thread():
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


#: One BLAS thread while any worker of this process has the plugin (process-wide:
#: threadpoolctl's setting, not a task thread's); counted, as the workers of one process
#: share one BLAS and may end in any order.
_WORKERS_BLAS = CountedLimit(_process_wide_single_blas_thread)


#: glibc settings for worker processes. Distributed's nannies set
#: MALLOC_TRIM_THRESHOLD_=64 KiB so that freed memory goes back to the OS at once;
#: every partition then allocates its 32-128 MB arrays on fresh, zero-filled pages.
#: Keeping them in the heap made a 1e6 x 512 fit 22% faster (8.0 s -> 6.2 s on 2
#: cores); memory stays bounded by the partitions in flight, as before. Arrays of
#: 256 MiB and more (d x d partials and partitions at d = 8192) are still mapped
#: and unmapped at once: kept in the heap they left freed gigabytes in each
#: worker's resident memory (issue 9).
WORKER_MALLOC = {
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": 2**30,
    "distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_": 2**28,
}
_MALLOC_VARIABLES = [key.rsplit(".", 1)[1] for key in WORKER_MALLOC]

#: What a LocalCluster's worker processes import as they start: the tasks' code (and
#: with it zarr, numcodecs, scipy). Imported by the first task instead, it was 3.0 s of
#: the demo's first fit's 3.3 s, reported as that job's ``open`` (2 cores, both workers
#: importing at once); it is the cluster's start-up, which the command reports apart.
WORKER_PRELOAD = ("slem_dask.pipeline",)


#: dask settings of a LocalCluster this module starts, unless its caller wants the
#: workers' statistical profile of the tasks (a performance report shows it). Every
#: 10 ms while a task runs, a worker takes the GIL and walks the stack of each task
#: thread, on the event loop that an in-process cluster's scheduler, worker and client
#: share: at 400,000 x 512 that loop took 0.063-0.084 CPU s per second of the fit (tasks
#: 3.4 CPU s), and 0.045-0.062 without the profile (per-thread CPU from /proc, on a
#: shared 2-core machine). Nothing of slem-dask reads that profile, and an in-process
#: cluster has no dashboard that would show it.
NO_TASK_PROFILE = {"distributed.worker.profile.enabled": False}


def _preload() -> dict:
    """dask's setting that has worker processes import :data:`WORKER_PRELOAD` too."""
    return {
        "distributed.worker.preload": [
            *dask.config.get("distributed.worker.preload", []),
            *WORKER_PRELOAD,
        ]
    }


def _restore_environment(saved: dict) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def default_local_cluster_kwargs(
    n_workers: int | None = None, threads_per_worker: int | None = None
) -> dict:
    """A LocalCluster sized to the machine: one single-threaded process per core.

    Processes rather than threads: zarr decoding and the float64 conversions
    hold the GIL in places, and separate processes keep the cores busy.
    """
    cores = usable_cores()
    threads = threads_per_worker or 1
    workers = n_workers or max(1, cores // threads)
    return {
        "n_workers": workers,
        "threads_per_worker": threads,
        "processes": True,
        "dashboard_address": ":0",  # a free port: never clash with another cluster
    }


#: Inputs below this size run on an in-process LocalCluster (one worker, a thread
#: per core) unless worker processes are asked for: starting and stopping worker
#: processes (1.3 s and more on 2 cores) would take longer than the job itself.
SMALL_INPUT_BYTES = 256 * 2**20

#: Jobs whose tasks release the GIL for nearly all their time run on an in-process
#: LocalCluster whatever their size: a linear fit (read, zstd decode, a float32
#: product per sub-block), a linear encode (read, decode, product, crc32c, write),
#: a job spec (``slem-dask run``) of a linear model that does either or both, and a
#: kernel fit (kernel blocks, products and triangular solves in BLAS and numpy, one
#: BLAS thread per task: 6.8-7.6 s in-process against 9.3-10.4 s with worker
#: processes at 400,000 x 512, rank 256). Worker processes would add their start-up
#: (1.3-1.9 s on 2 cores) and a first task on workers that still import slem-dask,
#: zarr and numcodecs (1.6-2.9 s at 400,000 x 512), and gain nothing back
#: (benchmarks/bench_entry_points.py, benchmarks/bench_rpcholesky.py).
GIL_FREE_JOBS = ("linear fit", "linear encode", "linear fit and encode", "kernel fit")


def _mib(size: int) -> str:
    """A size in MiB that a small input does not print as "0 MiB"."""
    mib = size / 2**20
    return f"{mib:.0f} MiB" if mib >= 10 else f"{mib:.2g} MiB"


def local_cluster_kind(job: str, input_bytes: int | None) -> tuple[bool, str]:
    """``--local-cluster auto``: (worker processes?, why) for ``job`` (a name such as
    "linear fit", "kernel fit", "search") reading ``input_bytes`` (None: not known
    before it runs)."""
    limit = f"{SMALL_INPUT_BYTES // 2**20} MiB"
    if job in GIL_FREE_JOBS:
        return False, (
            f"a {job}: its tasks release the GIL (zstd, BLAS); "
            f"--local-cluster processes for worker processes"
        )
    if input_bytes is None:
        return True, "input size not known before the run"
    if input_bytes >= SMALL_INPUT_BYTES:
        return True, f"input {_mib(input_bytes)} >= {limit}"
    return False, (
        f"input {_mib(input_bytes)} < {limit}; --local-cluster processes for worker processes"
    )


def in_process_kwargs(n_workers: int | None = None, threads_per_worker: int | None = None) -> dict:
    """A LocalCluster in this process: one worker with a thread per core, or
    ``n_workers`` workers of ``threads_per_worker`` threads (default: the cores shared).

    No dashboard: the command line never prints its address (a free port), and
    starting it (importing bokeh, a web server) took 0.5 s of a small job's 2 s.
    The worker's memory limit is dask's default, this machine's memory, and
    :func:`slem_dask.cluster.workers.check_memory` checks the job's tasks against it.
    """
    workers = n_workers or 1
    threads = threads_per_worker or max(1, usable_cores() // workers)
    # dashboard_address=None alone still binds the scheduler's HTTP server (health and
    # metrics routes) to port 8787, with a three-line warning when another Dask holds it
    return {
        "n_workers": workers,
        "threads_per_worker": threads,
        "processes": False,
        "dashboard_address": None,
        "scheduler_kwargs": {"dashboard": False, "dashboard_address": ":0"},
    }


@contextlib.contextmanager
def connect(
    scheduler: str | None = None,
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    security=None,
    quiet: bool = False,
    processes: bool = True,
    task_profile: bool = False,
):
    """Yield a Client: to ``scheduler`` (or $DASK_SCHEDULER_ADDRESS) if given,
    else to a new LocalCluster, closed on exit: worker processes sized to this
    machine, or with ``processes=False`` one worker in this process (threads;
    no BLAS limit is set process-wide, the tasks limit their own BLAS threads).

    A LocalCluster's workers log nothing below CRITICAL: task errors (bad rows,
    say) come back to the caller as exceptions and are reported once, there. Its
    workers keep no statistical profile of the tasks unless ``task_profile`` (a
    performance report's "Worker Profile"): see :data:`NO_TASK_PROFILE`.
    """
    address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if address:
        try:
            client = Client(address, security=security, timeout="20s")
        except (OSError, ValueError, TypeError) as exc:
            source = "--scheduler" if scheduler else "DASK_SCHEDULER_ADDRESS"
            raise ConnectionError(
                f"could not connect to the dask scheduler at {address!r} (from {source}): "
                f"{exc}; check the address (e.g. tcp://host:8786) and that `dask scheduler` "
                f"is running there, or omit it to use a LocalCluster on this machine"
            ) from None
        try:
            _register_blas_plugin(client)
            yield client
        finally:
            client.close()
        return
    profile = {} if task_profile else NO_TASK_PROFILE
    if not processes:
        with _in_process(profile, n_workers, threads_per_worker) as client:
            yield client
        return
    kwargs = default_local_cluster_kwargs(n_workers, threads_per_worker)
    with contextlib.ExitStack() as stack:
        stack.enter_context(dask.config.set({**WORKER_MALLOC, **profile, **_preload()}))
        # the nannies put these variables in this process's environment to hand them to
        # the workers they spawn, and leave them there: every later subprocess of the
        # caller (a `dask worker` of its own) would keep freed memory in its heap
        saved = {k: os.environ.get(k) for k in _MALLOC_VARIABLES}
        stack.callback(_restore_environment, saved)
        with _sigint_for_this_process_only():
            cluster = stack.enter_context(LocalCluster(**kwargs, silence_logs=logging.CRITICAL))
        client = stack.enter_context(Client(cluster))
        _register_blas_plugin(client)
        yield client


@contextlib.contextmanager
def _in_process(profile: dict, n_workers: int | None, threads_per_worker: int | None):
    """A client of a LocalCluster whose worker runs in this process (:func:`connect`)."""
    with (
        dask.config.set(profile),  # read once, as the worker starts
        LocalCluster(
            **in_process_kwargs(n_workers, threads_per_worker), silence_logs=logging.CRITICAL
        ) as cluster,
        Client(cluster) as client,
    ):
        try:
            yield client
        except BaseException:
            _close_workers_now(cluster)
            raise


def _close_workers_now(cluster) -> None:
    """Close an in-process cluster's workers without waiting for the tasks they still
    run: a command that failed or gave up (its lease lost, --task-timeout, Ctrl-C) ends
    then, and a task stuck in a request to a store that stopped answering would hold
    the cluster's close for that request's whole deadline (45 s more of a job that had
    lost its lease, 2026-11-30). Its threads are daemons: they end with the process."""
    for worker in list(cluster.workers.values()):
        try:
            cluster.sync(worker.close, executor_wait=False, timeout=5, reason="job-ended")
        except Exception:  # noqa: BLE001 - the cluster's own close follows
            pass


def _register_blas_plugin(client, rounds: int = 3) -> None:
    """Register :class:`SingleThreadedBLAS` on every worker, now and later. The scheduler
    sends it to the workers it lists; one that leaves meanwhile failed the command with
    distributed's bare "Address removed.": while the scheduler answers, it is sent again
    (to the workers then listed), and after ``rounds`` tries said in one line."""
    from distributed.comm.core import CommClosedError

    for attempt in range(rounds):
        try:
            client.register_plugin(SingleThreadedBLAS())
            return
        except (CommClosedError, OSError) as exc:
            try:
                client.scheduler_info()  # the scheduler answers: a worker's failure
            except Exception:  # noqa: BLE001 - the scheduler is gone: its error says so
                raise exc from None
            if attempt == rounds - 1:
                text = str(exc).splitlines()[0][:200] if str(exc) else "no reply"
                raise ConnectionError(
                    f"a worker failed {rounds} times to take slem-dask's set-up while the "
                    f"scheduler answers ({type(exc).__name__}: {text}); no job started: run "
                    f"the same command again once the cluster's workers are steady"
                ) from None


@contextlib.contextmanager
def _sigint_for_this_process_only():
    """Start worker processes that Ctrl-C does not reach; Ctrl-C meanwhile waits.

    Ctrl-C sends SIGINT to the whole foreground process group: worker processes
    still importing printed a KeyboardInterrupt traceback each, and the
    half-started cluster more, after slem-dask's one line. SIGINT is blocked
    while the cluster starts, and a blocked signal stays blocked in the threads
    and processes started meanwhile (the cluster's event loop, the workers), so
    only this process gets it; the nannies stop the workers when it closes the
    cluster. A Ctrl-C pressed during start-up is raised when this block ends,
    inside the caller's cleanup.
    """
    import signal
    import threading

    if (
        not hasattr(signal, "pthread_sigmask")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    from multiprocessing import resource_tracker

    # Started later, in the cluster's event loop, the tracker would unblock SIGINT
    # there once it has spawned (its own start-up blocks and then unblocks it).
    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
