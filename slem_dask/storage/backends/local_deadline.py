"""A deadline on the commit protocol's own calls to a local or network file system.

A hung network mount (NFS ``hard``, the default) blocks a system call until the server
answers: for ever, in the state no signal but SIGKILL ends. The calls of
:class:`~.local.LocalBackend` that read or write one small file or list one folder
(markers, commit records, leases, fate files: :data:`BOUNDED`) therefore run in a
worker thread that the caller waits for at most :func:`local_bound` seconds
(``$SLEM_DASK_STORAGE_TIMEOUT`` x ``$SLEM_DASK_STORAGE_ATTEMPTS``, 100 s by default:
an object store's request with its tries). A call that has not answered by then is
abandoned where it blocks, and raises :class:`~.outcomes.OutcomeUnknownError` (from a
``TimeoutError``): it may still land, as an object store's request in flight may, and
the protocol settles it by reading back, as it does for them. The caller's thread
(the job's, a heartbeat's) stays free: the job ends with one line naming the folder,
Ctrl-C ends it within seconds, and its lease's heartbeat stops claiming the lease.

Not bounded: the calls whose time grows with a version's size (``remove_tree``,
``copy_tree``, ``prune_empty``) and zarr's own chunk I/O, in the job's tasks; no
deadline fits them without failing a large, slow but healthy job (``make_durable``
bounds each of its system calls instead: :mod:`.local_durable`). docs/object-stores.md,
"When a store stops answering", says what each bounds.

Threads: one per call at a time, kept for the next (a few at most in a job); a thread
stuck in a call is left behind (a daemon: the process still exits, an NFS wait being
killable), and a call not yet started when its caller gave up is never run.
"""

from __future__ import annotations

import functools
import os
import queue
import threading

from . import deadlines
from .outcomes import OutcomeUnknownError

__all__ = ["BOUNDED", "bounded_call", "with_deadlines", "local_bound", "call_within"]

#: LocalBackend's calls that touch one small file or one folder's names
BOUNDED = (
    "read",
    "create",
    "put",
    "list",
    "exists",
    "delete",
    "link_target",
    "same_file",
    "probe_scope",
)


def local_bound() -> float:
    """The most seconds one bounded call may take (see the module)."""
    policy = deadlines.current()
    return policy.timeout * policy.attempts


class _Call:
    __slots__ = ("function", "done", "result", "error", "given_up")

    def __init__(self, function):
        self.function = function
        self.done = threading.Event()
        self.result = None
        self.error: BaseException | None = None
        self.given_up = False


_idle: list[queue.SimpleQueue] = []  # workers waiting for a call
_idle_lock = threading.Lock()
_on_worker = threading.local()


def _forget_workers() -> None:
    """In a forked child: the workers' threads did not come along."""
    global _idle_lock
    _idle.clear()
    _idle_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_workers)


def _serve(calls: queue.SimpleQueue) -> None:
    _on_worker.active = True
    while True:
        call = calls.get()
        if not call.given_up:  # its caller gave up before it began: never run late
            try:
                call.result = call.function()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                call.error = exc
        call.done.set()
        with _idle_lock:
            _idle.append(calls)


def call_within(function, seconds: float, what: str):
    """``function()`` in a worker thread; TimeoutError naming ``what`` if it has not
    returned within ``seconds`` (it is abandoned there). Run in place when already in
    a worker (a call made by a bounded call: the outer one's deadline holds)."""
    if getattr(_on_worker, "active", False):
        return function()
    with _idle_lock:
        calls = _idle.pop() if _idle else None
    if calls is None:
        calls = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(calls,), daemon=True, name="slem-dask-disk").start()
    call = _Call(function)
    calls.put(call)
    try:
        answered = call.done.wait(seconds)
    finally:
        call.given_up = not call.done.is_set()  # also on Ctrl-C while it waits
    if not answered:
        raise TimeoutError(f"{what}: the file system did not answer within {seconds:g} s")
    if call.error is not None:
        raise call.error
    return call.result


def bounded_call(function, where: str, call: str):
    """``function()`` within :func:`local_bound` seconds, else
    :class:`~.outcomes.OutcomeUnknownError` in one line naming ``where`` and ``call``."""
    seconds = local_bound()
    try:
        return call_within(function, seconds, where)
    except TimeoutError as exc:
        raise OutcomeUnknownError(_line(call, where, seconds)) from exc


def _bounded(method):
    @functools.wraps(method)
    def bounded(self, *args, **kwargs):
        key = args[0] if args and isinstance(args[0], str) else ""
        where = f"{self.root}/{key}" if key else self.root
        return bounded_call(
            functools.partial(method, self, *args, **kwargs), where, method.__name__
        )

    return bounded


def _line(call: str, where: str, seconds: float) -> str:
    return (
        f"the file system holding {where!r} did not answer ({call}) within {seconds:g} s "
        f"(${deadlines.ENV_TIMEOUT} x ${deadlines.ENV_ATTEMPTS}): a hung network mount or "
        f"a failing disk; once it answers, run the same command again"
    )


def with_deadlines(cls):
    """Class decorator: each of :data:`BOUNDED` that ``cls`` defines runs within
    :func:`local_bound` (outside the outcome boundary: its line is already one)."""
    for name in BOUNDED:
        if name in cls.__dict__:
            setattr(cls, name, _bounded(cls.__dict__[name]))
    return cls
