"""The long step this process computes itself, outside any dask task, said by name.

A fit's d x d factorization runs in the client's process (at d = 8192: a Cholesky
inverse of tens of seconds, an eigendecomposition of minutes), while no task is pending:
the watchdog (:mod:`slem_dask.cluster.watchdog`) would see nothing to wait for and say
nothing. Each such step runs inside :func:`long_step`, and the watchdog names the one in
progress (:func:`current_step`) when it lasts.
"""

from __future__ import annotations

import contextlib
import threading
import time

__all__ = ["long_step", "current_step"]

_lock = threading.Lock()
_running: list[tuple[str, float]] = []


@contextlib.contextmanager
def long_step(what: str):
    """Mark ``what`` (e.g. "the Cholesky inverse of A, 8192 x 8192") as computing in
    this process while the block runs."""
    entry = (what, time.monotonic())
    with _lock:
        _running.append(entry)
    try:
        yield
    finally:
        with _lock:
            _running.remove(entry)


def current_step() -> tuple[str, float] | None:
    """(what, its time.monotonic() start) of the step begun last that still runs, or None."""
    with _lock:
        return _running[-1] if _running else None
