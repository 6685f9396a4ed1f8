"""How many BLAS threads the caller's own dense factorizations get.

Workers run one BLAS thread per task (:func:`slem_dask.parallel.blocks.single_threaded_blas`,
``cluster``'s worker settings); this is for the d x d (linear) and r x r (kernel)
factorizations the caller runs itself, between or after passes over the data.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "factorization_threads",
    "one_blas_thread",
    "usable_cores",
    "CountedLimit",
    "TaskThreadsController",
    "task_threads_controller",
    "THREADED_POTRF_MIN",
    "OPENBLAS_THREADED_POTRF_MAX",
]

#: Below this order the factorization runs on one BLAS thread. More threads save at
#: most about 1 ms there (d = 512: 3.8 ms on 2 threads, 4.7 ms on 1, on this
#: project's machine), and then OpenBLAS's idle threads spin, waiting for more work,
#: for about 100 ms of a core each after the call: a core that the workers of the
#: job (or of the next one) need.
THREADED_POTRF_MIN = 1024

#: Above this order OpenBLAS's multi-threaded dpotrf crashed (SIGSEGV) on this
#: project's machine (OpenBLAS 0.3.31, 2 threads: d = 16384 crashed, d = 12288 and
#: 14336 did not; with its Haswell kernels and with its SkylakeX ones, though not in
#: every run); OpenBLAS issues 2562 and 1413 report the same for large orders.
#: Above it, OpenBLAS runs the factorization on one thread (d = 16384: 91 s).
OPENBLAS_THREADED_POTRF_MAX = 12288


def factorization_threads(d: int):
    """The BLAS threads for a dense factorization of order ``d``: one below
    THREADED_POTRF_MIN, as the caller set them up to OPENBLAS_THREADED_POTRF_MAX,
    one above it when the BLAS is OpenBLAS."""
    if THREADED_POTRF_MIN <= d <= OPENBLAS_THREADED_POTRF_MAX:
        return contextlib.nullcontext()
    if d > OPENBLAS_THREADED_POTRF_MAX and not any(
        info.get("internal_api") == "openblas" for info in _controller().info()
    ):
        return contextlib.nullcontext()
    return task_threads_controller().limit(limits=1, user_api="blas")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or
    ``taskset`` sets it), else the machine's."""
    import os

    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def one_blas_thread():
    """One BLAS thread per call while several threads of this process each run their
    own BLAS calls (a thread per core already keeps the cores busy)."""
    return task_threads_controller().limit(limits=1, user_api="blas")


@functools.cache
def task_threads_controller() -> TaskThreadsController:
    """The one :class:`TaskThreadsController` of this process (scanned once)."""
    return TaskThreadsController()


@functools.cache
def _controller():
    # Scanning the loaded libraries costs ~1.5 ms, once per round of a greedy kernel
    # fit (r + 1 rounds) if not kept; numpy's and scipy's BLAS are loaded by now
    # (this package imports scipy.linalg).
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


class TaskThreadsController:
    """Sets every loaded BLAS's thread count from any thread: ``limit(limits=n,
    user_api="blas")`` returns an object whose ``restore_original_limits()`` undoes it
    (threadpoolctl's interface; also a context manager). Every limit of this package
    goes through it: :func:`one_blas_thread`, :func:`factorization_threads` and
    :func:`slem_dask.parallel.blocks.single_threaded_blas`.

    OpenBLAS 0.3.31 (numpy's and scipy's wheels) ignores ``openblas_set_num_threads``,
    which threadpoolctl calls, from every thread but the first one that called it:
    when that was the caller's main thread, a limit set from a task thread left every
    task's products on all cores (1.6x the time of a 200,000 x 128 kernel fit at the
    median, its tasks' BLAS threads spinning against each other). Its
    ``openblas_set_num_threads_local`` takes effect from any thread, so OpenBLAS is set
    through it where the library has it, every other BLAS through threadpoolctl.
    """

    def __init__(self):
        import ctypes

        self._others, self._local = [], []
        for lib in _controller().select(user_api="blas").lib_controllers:
            setter = None
            if lib.internal_api == "openblas":
                try:
                    setter = ctypes.CDLL(lib.filepath).openblas_set_num_threads_local
                except (OSError, AttributeError):  # an OpenBLAS before 0.3.27
                    setter = None
            if setter is None:
                self._others.append(lib)
            else:
                setter.argtypes, setter.restype = [ctypes.c_int], ctypes.c_int
                self._local.append(setter)

    def limit(self, limits: int, user_api: str = "blas"):
        previous = [setter(int(limits)) for setter in self._local]
        others = [(lib, lib.num_threads) for lib in self._others]
        for lib, _ in others:
            lib.set_num_threads(int(limits))
        return _Restore(self._local, previous, others)


class _Restore:
    """A limit in force: undone by ``restore_original_limits()`` or on leaving a ``with``."""

    def __init__(self, local, previous, others):
        self._local, self._previous, self._others = local, previous, others

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.restore_original_limits()

    def restore_original_limits(self) -> None:
        for setter, count in zip(self._local, self._previous, strict=True):
            setter(count)
        for lib, count in self._others:
            lib.set_num_threads(count)


class CountedLimit:
    """A BLAS limit that concurrent users of one process share: the first user in sets
    it (``set_limit()``, which returns what undoes it, threadpoolctl's interface), the
    last one out restores what the first found. One process has one BLAS: a user that
    restored on its own way out would lift the limit under the others, and with two
    workers of one process ending in turn, the second restored the first's limit and
    left the caller on one thread for good (tests/cluster/test_local_cluster.py)."""

    def __init__(self, set_limit: Callable[[], Any]):
        self._set_limit = set_limit
        self._lock = threading.Lock()
        self._users = 0
        self._limit: Any = None

    def enter(self) -> None:
        with self._lock:
            if self._users == 0:
                self._limit = self._set_limit()
            self._users += 1

    def leave(self) -> None:
        with self._lock:
            self._users = max(0, self._users - 1)  # a teardown without its setup: no-op
            if self._users == 0 and self._limit is not None:
                self._limit.restore_original_limits()
                self._limit = None
