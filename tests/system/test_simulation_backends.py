"""The deterministic simulation through the real backends (issue 38): the protocol code
over the real S3Backend, GCSBackend and AzureBackend classes on fake client libraries
that retry and fail as s3fs/botocore, gcsfs/aiohttp and adlfs/azure-core do (their own
exception types, most no OSError), and over the real LocalBackend on a folder of files
with faults at its os calls (tests/sim/backends.py, docs/testing-faults.md).

``SLEM_SIM_SEEDS`` seeds (10,000 with --slow, as CI runs it; 2,000 in the fast suite:
tests/conftest.py) are shared between the sweeps of
``sim.sweep.SWEEPS``, run on every core. What today's code still gets wrong is listed
in ``KNOWN`` with the seed that shows it, so that the sweep fails loudly once fixed.
"""

from __future__ import annotations


import pytest

pytest.importorskip("greenlet")
pytest.importorskip("s3fs")
pytest.importorskip("gcsfs")
pytest.importorskip("adlfs")

from sim import history, sweep
from sim import run as sim

#: every simulated takeover says so (leases.LeaseWaitWarning): hundreds of lines a history
pytestmark = pytest.mark.filterwarnings(
    "ignore::slem_dask.storage.versioning.leases.LeaseWaitWarning"
)


#: (backend, mode) -> what still fails there, and the seed that showed it first
KNOWN: dict = {}


def test_every_invariant_holds_on_the_real_backends(sim_seeds):
    """Every mode on every backend (``sim.sweep.SWEEPS``), its share of the seeds each:
    every invariant of tests/sim/checks.py holds after every step; every failed or
    killed writer's command, run again, succeeds; every job ends in success or one line
    of an expected kind."""
    failures, fixed = [], []
    for backend, mode, ran, failure in sweep.run_all(sweep.SWEEPS, sim_seeds):
        label = f"{backend} {mode}"
        if failure and (backend, mode) not in KNOWN:
            failures.append(f"{label} ({ran} seeds): {failure}")
        elif not failure and (backend, mode) in KNOWN:
            fixed.append(f"{label}: {KNOWN[backend, mode]}")
    assert not failures, "\n".join(failures)
    assert not fixed, "fixed, remove from KNOWN:\n" + "\n".join(fixed)


def test_the_sweeps_cover_every_backend_and_fault():
    """At least 10,000 seeds by default, on each backend, and every fault of the
    transport in some mode."""
    backends = {b for b, _ in sweep.SWEEPS}
    assert backends == {"s3", "gcs", "azure", "local"}
    assert sum(sweep.seeds_of(b, 10_000) for b, _ in sweep.SWEEPS) >= 10_000
    drawn = set()
    for _, mode in sweep.SWEEPS:
        faults = sim.MODES.get(mode.removeprefix("shared").lstrip("_") or "interleave")
        drawn |= {name for name, p in vars(faults).items() if p and p is not False}
    assert {"late_5xx", "hang", "silence", "burst", "pause", "crash", "twice"} <= drawn
    assert {"late_overtakes"} <= drawn  # a late request that overtakes a newer one


@pytest.mark.parametrize(
    "backend",
    [
        "sim",
        "s3",
        "gcs",
        "azure",
        "local",
    ],
)
def test_fates_and_commits_stay_bounded_over_a_long_history(backend):
    """Thirty rounds of writers killed, failed and fenced on one store, each closed by a
    writer alone: fates/ keeps no fate file of a draft far below the head, commits/ one
    record per number (issue 38: fates/ grew by one file per draft that never
    committed, forever); on local disk, no private file of a write killed before its
    link or rename below that bound, nor one of the lease beside the store (seeds 1 and 2
    failed before: they stayed for good)."""
    for seed in range(3):
        history.long_history(seed, "crash", backend)


def test_a_seed_replays_exactly_on_a_real_backend():
    """The same seed gives the same run, request by request, on the real backends too
    (the fakes draw from the seed alone)."""
    for backend, mode in [("gcs", "transport"), ("azure", "burst"), ("local", "crash")]:
        first = _trace(3, mode, backend)
        assert len(first[1]) > 20
        assert first == _trace(3, mode, backend)


def _trace(seed: int, mode: str, backend: str) -> tuple:
    try:
        return None, sim.run_seed(seed, mode, backend=backend, trace=True).trace
    except sim.SeedFailed as failed:
        return str(failed).split("\n")[0], failed.trace
