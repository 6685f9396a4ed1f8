"""The sweeps through the real backends (:mod:`.backends`): which modes run on which
backend, and running them on every core (each sweep in a process of its own).

Replay one failure with the command its message gives, e.g.::

    PYTHONPATH=.:tests python -m sim.run --backend gcs --mode burst --seed 55
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

#: the modes every object store (the real S3, GCS and Azure backend classes) meets
OBJECT_MODES = (
    "interleave",
    "crash",
    "errors",
    "lost_reply",
    "twice",
    "late",
    "no_conditional",
    "all",
    "burst",
    "hang",
    "pause",
    "transport",
    # a late request overwrites a newer one: safe since no key of a draft is written
    # with a plain write once it held other bytes (docs/testing-faults.md)
    "late_overtakes",
)
#: the modes of the real LocalBackend (``shared``: a store sharing P's versions/
#: folder through a symlink, and a user's symlink inside P, under ``interleave``)
LOCAL_MODES = (
    "interleave",
    "crash",
    "errors",
    "all",
    "pause",
    "nfs",
    "shared",
    "shared_crash",
)
SWEEPS = [(b, m) for b in ("s3", "gcs", "azure") for m in OBJECT_MODES] + [
    ("local", m) for m in LOCAL_MODES
]
#: what a seed of the local sweeps costs against one of the object stores' (a tree of
#: real files per seed): the local sweeps get fewer seeds, the same share of time
LOCAL_COST = 2


def seeds_of(backend: str, total: int) -> int:
    """Seeds of one sweep of ``backend`` when ``total`` are shared by all sweeps."""
    weight = sum(1 / LOCAL_COST if b == "local" else 1 for b, _ in SWEEPS)
    share = int(-(-total // weight))
    return share if backend != "local" else -(-share // LOCAL_COST)


def sweep(
    backend: str, mode: str, seeds: int, start: int = 0, **options
) -> tuple[str, str, int, str | None]:
    """Run seeds ``start`` to ``start + seeds`` (``options``: of :func:`.run.run_seed`);
    (backend, mode, seeds run, the first failure or None)."""
    from . import run

    shared = mode.startswith("shared")
    if shared:
        mode = mode.removeprefix("shared").lstrip("_") or "interleave"
        options = {**options, "shared": True}
    for seed in range(start, start + seeds):
        try:
            run.run_seed(seed, mode, backend=backend, **options)
        except run.SeedFailed as failed:
            return backend, mode, seed - start + 1, str(failed)
    return backend, mode, seeds, None


def pool() -> ProcessPoolExecutor:
    """Processes for the sweeps: one per core (spawned: no fork of a process with
    threads)."""
    return ProcessPoolExecutor(
        max_workers=workers(), mp_context=multiprocessing.get_context("spawn")
    )


def run_split(executor, backend: str, mode: str, seeds: int, **options) -> str | None:
    """Seeds 0 to ``seeds`` of one sweep, split between the processes of ``executor``;
    the failure of the lowest seed that failed, or None."""
    parts = workers()
    size = -(-seeds // parts)
    jobs = [
        executor.submit(sweep, backend, mode, min(size, seeds - start), start, **options)
        for start in range(0, seeds, size)
    ]
    failures = [job.result()[3] for job in jobs]
    return next((f for f in failures if f), None)


def workers() -> int:
    """One process per core, at least two (the sweeps are independent)."""
    return max(2, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2))


def run_all(sweeps: list, total: int) -> list:
    """Every sweep of ``sweeps`` ((backend, mode) pairs) with its share of ``total``
    seeds, on :func:`workers` processes; their results, in order."""
    with pool() as executor:
        jobs = [executor.submit(sweep, b, m, seeds_of(b, total)) for b, m in sweeps]
        return [job.result() for job in jobs]
