"""Ctrl-C ends every job that writes a versioned store within seconds, even when the
store has stopped answering (issue 38, "Deadlines everywhere"): the clean-up an
interrupt runs (abandoning the draft, releasing the lease, the pruning beside the
draft) is waited for a few seconds at most, the lease's heartbeat stops, and the
same job completes once the store answers again.

A store that stopped answering is simulated on local disk: once the job is
interrupted, every call of :class:`~slem_dask.storage.backends.local.LocalBackend` blocks until
the test ends (a request that never answers; the object stores' own, through the
fault proxy's black hole, are in tests/system/test_fault_proxy.py)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from slem_dask.storage.backends import deadlines
from slem_dask.storage.nodes import groups
from slem_dask.storage.versioning import leases
from slem_dask.storage.backends import local_deadline
from slem_dask.storage.backends import outcomes
from slem_dask.storage.versioning import versions
from slem_dask.storage.backends.local import LocalBackend

#: A test waits this long for an interrupted call to return, never forever: generous
#: (a loaded machine), and far below "never" (the old code's bound with a silent store).
RETURN_WITHIN = 120.0
CALLS = ("read", "create", "put", "list", "exists", "delete", "remove_tree", "copy_tree")


@pytest.fixture
def silent(monkeypatch):
    """``silent.stop()``: from then on every LocalBackend call blocks until the test
    ends (or ``silent.resume()``)."""

    class Silent:
        stopped = False
        answer = threading.Event()

        def stop(self):
            self.stopped = True

        def resume(self):
            self.stopped = False
            self.answer.set()

    state = Silent()
    for name in CALLS:
        original = getattr(LocalBackend, name)

        def blocking(self, *args, _original=original, **kwargs):
            if state.stopped:
                state.answer.wait()
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(LocalBackend, name, blocking)
    yield state
    state.resume()  # the threads the job left waiting end with the test
    for thread in threading.enumerate():
        if thread.name in ("slem-dask-abandon", "lease-release"):
            thread.join(RETURN_WITHIN)


def _interrupted_within_bound(call) -> None:
    """Run ``call`` (which gets a KeyboardInterrupt) in a thread: it must raise it and
    return within RETURN_WITHIN seconds, its lease's heartbeat stopped."""
    raised = _within_bound(call, "the interrupted job still waits on its silent store")
    assert isinstance(raised, KeyboardInterrupt), raised
    beating = [t.name for t in threading.enumerate() if t.name.startswith("slem-dask-lease-")]
    assert not beating, f"the lease is still renewed: {beating}"


ARRAYS = {"w": np.arange(12, dtype="float64").reshape(3, 4)}


def test_an_interrupted_write_group_ends_with_its_store_silent(tmp_path, silent, monkeypatch):
    """write_group abandoned its draft on Ctrl-C as on any failure, and released its
    lease: each waited for the silent store (minutes a request by default)."""
    path = tmp_path / "model.zarr"
    write_arrays = groups._write_arrays

    def interrupted(group, arrays):
        silent.stop()
        raise KeyboardInterrupt

    monkeypatch.setattr(groups, "_write_arrays", interrupted)
    _interrupted_within_bound(lambda: groups.write_group(path, {"kind": "t"}, ARRAYS, "test"))
    silent.resume()
    monkeypatch.setattr(groups, "_write_arrays", write_arrays)
    for thread in threading.enumerate():  # what the interrupt left to finish
        if thread.name in ("slem-dask-abandon", "lease-release"):
            thread.join(RETURN_WITHIN)
    commit = groups.write_group(path, {"kind": "t"}, ARRAYS, "test")  # the same job again
    assert commit.seq == 1 and versions.VersionedStore(path).head() == commit


def _two_versions(path) -> None:
    for i in range(2):
        groups.write_group(path, {"kind": "t"}, {"w": ARRAYS["w"] + i}, "test", overwrite=True)


def test_an_interrupted_rollback_ends_with_its_store_silent(tmp_path, silent, monkeypatch):
    """rollback_to abandoned its draft on Ctrl-C, waiting for the silent store."""
    path = tmp_path / "model.zarr"
    _two_versions(path)
    copy_tree = LocalBackend.copy_tree

    def interrupted(self, *args, **kwargs):
        silent.stop()
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalBackend, "copy_tree", interrupted)
    store = versions.VersionedStore(path)
    _interrupted_within_bound(lambda: store.rollback(1))
    silent.resume()
    monkeypatch.setattr(LocalBackend, "copy_tree", copy_tree)
    for thread in threading.enumerate():
        if thread.name in ("slem-dask-abandon", "lease-release"):
            thread.join(RETURN_WITHIN)
    commit = versions.VersionedStore(path).rollback(1)  # the same job again
    assert commit.seq == 3 and commit.source == "rollback to 1"


def test_an_interrupted_heartbeat_does_not_renew_the_lease(tmp_path, monkeypatch):
    """A heartbeat whose read outlived the job's end (an interrupt while it waited on a
    silent store) wrote the lease once more: renewed by a job that had ended."""
    monkeypatch.setattr(leases, "LEASE_HEARTBEAT", 0.05)
    lease = leases.Lease(tmp_path / "out.zarr", "test").acquire()
    reading, answer = threading.Event(), threading.Event()
    read = lease.read

    def slow_read():
        reading.set()
        answer.wait()
        return read()

    monkeypatch.setattr(lease, "read", slow_read)
    assert reading.wait(RETURN_WITHIN)  # the heartbeat waits on its read
    lease._stop.set()  # the job ends (release() does this first)
    before = read()
    answer.set()
    lease._thread.join(RETURN_WITHIN)
    assert not lease._thread.is_alive() and read() == before


# -- a local disk that stops answering (a hung NFS mount): the protocol's calls have a
# deadline too (slem_dask/storage/backends/local_deadline.py)


@pytest.fixture
def short_local_deadline(monkeypatch):
    monkeypatch.setenv(deadlines.ENV_TIMEOUT, "0.5")
    monkeypatch.setenv(deadlines.ENV_ATTEMPTS, "2")
    assert local_deadline.local_bound() == 1.0


@pytest.fixture
def hung_link(monkeypatch):
    """``os.link`` to a name under ``commits/`` blocks until ``.set()`` (a hung mount),
    then makes the link (a request that lands late)."""
    answer = threading.Event()
    link = os.link

    def hung(src, dst, *args, **kwargs):
        if "/commits/" in str(dst):
            answer.wait()
        return link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", hung)
    yield answer
    answer.set()


def _within_bound(call, waits: str = "the call still waits on a local disk that does not answer"):
    """``call()``'s answer, or what it raised, run in a thread that must end within
    RETURN_WITHIN seconds (``waits``: the failure's words if it does not)."""
    answer: list = []

    def run():
        try:
            answer.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            answer.append(exc)

    job = threading.Thread(target=run, daemon=True)
    job.start()
    job.join(RETURN_WITHIN)
    assert not job.is_alive(), waits
    return answer[0]


def test_a_local_call_that_never_returns_meets_its_deadline(
    tmp_path, short_local_deadline, hung_link
):
    """A hung mount held a local call for ever: now it raises, as unknown (it may land
    later), in one line naming the file and the deadline's variables."""
    backend = LocalBackend(str(tmp_path))
    raised = _within_bound(lambda: backend.create("commits/1.json", b"x"))
    assert isinstance(raised, outcomes.OutcomeUnknownError), raised
    assert deadlines.is_timeout(raised)
    line = str(raised)
    assert "\n" not in line and f"{tmp_path}/commits/1.json" in line, line
    assert "within 1 s" in line and deadlines.ENV_TIMEOUT in line, line
    assert backend.read("other") is None  # the disk's other calls still answer
    hung_link.set()  # the hung call lands late: what a read-back then sees
    _within_bound(lambda: _until(lambda: backend.read("commits/1.json") == b"x"))


def _until(condition) -> bool:
    while not condition():
        time.sleep(0.05)
    return True


def test_a_commit_whose_local_create_never_returns_is_settled_by_reading_back(
    tmp_path, short_local_deadline, hung_link
):
    """The commit record's create on a hung mount: the job ends, its outcome unknown
    (its draft kept, as on an object store); once the mount answers and the create
    lands, the store reads back that version, whole."""
    path = tmp_path / "model.zarr"
    raised = _within_bound(lambda: groups.write_group(path, {"kind": "t"}, ARRAYS, "test"))
    assert isinstance(raised, versions.CommitUnknownError), raised
    assert "\n" not in str(raised), raised
    beating = [t.name for t in threading.enumerate() if t.name.startswith("slem-dask-lease-")]
    assert not beating, beating
    hung_link.set()
    store = versions.VersionedStore(path)
    _within_bound(lambda: _until(lambda: store.head() is not None))
    assert store.head().seq == 1
    store.check(store.head())  # its folder was kept: the version reads whole
    assert np.array_equal(groups.read_group_arrays(_group(path), path, "t")["w"], ARRAYS["w"])


def _group(path):
    from slem_dask.storage.nodes.groups import open_written_group

    return open_written_group(path, "t")


def test_a_forked_child_starts_its_own_disk_workers(tmp_path):
    """A child forked after a bounded call inherited the idle workers' queues, not
    their threads: its every local call would have waited for its deadline."""
    import multiprocessing

    backend = LocalBackend(str(tmp_path))
    backend.put("k", b"v")  # a worker now waits for the next call
    child = multiprocessing.get_context("fork").Process(target=_read_or_fail, args=(str(tmp_path),))
    child.start()
    child.join(RETURN_WITHIN)
    assert child.exitcode == 0, child.exitcode


def _read_or_fail(root: str) -> None:
    os.environ[deadlines.ENV_TIMEOUT] = "30"
    os.environ[deadlines.ENV_ATTEMPTS] = "1"
    os._exit(0 if LocalBackend(root).read("k") == b"v" else 1)


@pytest.mark.parametrize("step", ["read", "put"])
def test_a_heartbeat_that_meets_an_error_of_no_storage_kind_stops_quietly(
    tmp_path, monkeypatch, step
):
    """Its store's client failing otherwise (its event loop gone as the process ends)
    killed the heartbeat thread with a traceback on stderr, under a job's last line (seen
    once jobs stopped waiting for their stuck tasks): the heartbeat now stops there, the
    lease is never renewed again, and the commit is refused as for a silent store."""
    monkeypatch.setattr(leases, "LEASE_HEARTBEAT", 0.05)
    died: list = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    lease = leases.Lease(str(tmp_path / "s.zarr"), "a job").acquire()
    try:

        def closed(*args, **kwargs):
            raise RuntimeError("Event loop is closed")

        monkeypatch.setattr(lease, "read" if step == "read" else "_put_record", closed)
        lease._thread.join(RETURN_WITHIN)
        assert not lease._thread.is_alive() and died == []
        monkeypatch.setattr(leases, "LEASE_TTL", 0.2)  # until its trust has run out
        time.sleep(0.3)
        with pytest.raises(leases.LeaseLostError, match="was not renewed"):
            lease.check()
    finally:
        monkeypatch.undo()
        lease.release()
