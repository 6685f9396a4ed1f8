"""A job that lost its lease ends at once (the watchdog cancels what it waits for), with
the refusal its commit would have met, instead of encoding every partition first.
In-process against one in-process scheduler; the takeover is another job's record
written over the lease, as a job on another host would after a TTL of silence."""

import json
import os
import threading

import pytest

from slem_dask import storage
from slem_dask.cluster import watchdog
from slem_dask.storage.backends.outcomes import OutcomeUnknownError
from slem_dask.storage.versioning import leases

from helpers import cli, encode_command, foreign_lease

pytestmark = pytest.mark.usefixtures("no_scheduler_env")  # conftest.py


def _taken_over(lease_file: str) -> None:
    """The lease record as a job of another host writes it when it takes the lease over."""
    with open(lease_file) as f:
        record = json.load(f)
    record.update(token="f" * 32, host="elsewhere", pid=4242)  # another host: watched
    with open(lease_file + ".new", "w") as f:
        json.dump(record, f)
    os.replace(lease_file + ".new", lease_file)


@pytest.mark.parametrize(
    "how, ttl, said",
    [
        ("not renewed", 2.0, "was not renewed for"),
        ("taken over", 30.0, "was taken over by slem-dask encode (pid 4242 on host elsewhere"),
    ],
)
def test_a_job_that_lost_its_lease_ends_at_once(
    capsys, scheduler, corpus, monkeypatch, how, ttl, said
):
    """The lease's store stops answering the job's heartbeat (its puts meet their
    deadline) as its first partition is written; "taken over": a job of another host
    then writes its record over the lease. Each task waits for the watchdog to cancel
    the job (20 s at most: without it, the job ran on to its commit's check)."""
    monkeypatch.setattr(leases, "LEASE_TTL", ttl)
    monkeypatch.setattr(leases, "LEASE_HEARTBEAT", 0.1)
    monkeypatch.setenv("SLEM_DASK_WATCH_INTERVAL", "0.1")
    out = corpus["dir"] / "codes.zarr"
    lease_file = str(corpus["dir"] / ".codes.zarr.slem-dask-lease")
    silent, cancelled, written, lock = (threading.Event(), threading.Event(), [], threading.Lock())
    real_put, real_cancel, real_write = (
        leases.Lease._put_record,
        watchdog._Watch._cancel,
        storage.write_partition,
    )

    def put_record(self):
        # under the lock that the takeover is written under: a put already under way
        # when the store falls silent would land after the other job's record and put
        # this job's back (a real taker writes its own back then: this test has none)
        with lock:
            if silent.is_set():
                raise OutcomeUnknownError("the request met its deadline (injected)")
            real_put(self)

    def cancel(self):
        real_cancel(self)
        cancelled.set()

    def write_partition(block, target, index, block_info=None):
        with lock:
            if not silent.is_set():
                silent.set()
                if how == "taken over":
                    _taken_over(lease_file)
        cancelled.wait(20)
        with lock:
            written.append(index)
        return real_write(block, target, index, block_info)

    monkeypatch.setattr(leases.Lease, "_put_record", put_record)
    monkeypatch.setattr(watchdog._Watch, "_cancel", cancel)
    monkeypatch.setattr(storage, "write_partition", write_partition)
    code, _, err = cli(capsys, scheduler, *encode_command(corpus, out, "--partition-rows", "20"))
    assert code == 1, err
    assert cancelled.is_set(), err  # ended by the watchdog, not by its commit's check
    assert f"the lease of {str(out)!r} {said}" in err, err
    assert "nothing was committed" in err and len(err.strip().splitlines()) == 1, err
    # the tasks that ran when it was lost finished; none of the 10 partitions started later
    assert len(written) <= 4, written
    assert not os.path.exists(out) or storage.VersionedStore(str(out)).head() is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # 1 / 0
def test_a_lease_counts_as_lost_only_when_its_commit_would_be_refused(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(leases, "LEASE_TTL", 1.0)  # trusted for 0.75 s after a renewal
    monkeypatch.setattr(leases, "LEASE_HEARTBEAT", 0.05)
    before = leases.open_leases()
    lease = leases.Lease(tmp_path / "out.zarr", "encode").acquire()
    assert lease in leases.open_leases() and not lease.lost()
    assert leases.lost_lease(before) is None
    # a heartbeat that dies of an unexpected error leaves the lease trusted for the rest
    # of its time: a job that commits within it commits (it did before)
    read = lease.read
    monkeypatch.setattr(lease, "read", lambda: 1 / 0)
    deadline = time.monotonic() + 10
    while lease._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not lease._thread.is_alive()
    if lease.trusted_for() > 0.1:
        assert not lease.lost()
    while lease.trusted_for() > 0:
        time.sleep(0.01)
    assert lease.lost() and leases.lost_lease(before) is lease
    monkeypatch.setattr(lease, "read", read)  # the record is still this job's
    with pytest.raises(leases.LeaseLostError, match="was not renewed for"):
        lease.check()
    assert leases.lost_lease(leases.open_leases()) is None  # held before a watch: not its
    lease.release(wait=1)
    assert lease not in leases.open_leases() and not lease.lost()


def test_a_lost_lease_is_released_without_waiting_for_its_stuck_heartbeat(tmp_path, monkeypatch):
    """A job that lost its lease to a silent store waited 5 s more at its end for its
    heartbeat, in a request to that store: that heartbeat writes nothing any more, so
    the release no longer waits for it; once the store answers, it ends unwritten."""
    import time

    monkeypatch.setattr(leases, "LEASE_TTL", 1.0)  # trusted for 0.75 s after a renewal
    monkeypatch.setattr(leases, "LEASE_HEARTBEAT", 0.05)
    lease = leases.Lease(tmp_path / "out.zarr", "encode").acquire()
    read = lease.read
    answers = threading.Event()  # the store answers again
    monkeypatch.setattr(lease, "read", lambda: answers.wait(60) and read())
    deadline = time.monotonic() + 30
    while not lease.lost() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lease.lost() and lease._thread.is_alive()  # its heartbeat waits on the store
    record = read()
    start = time.monotonic()
    lease.release()
    took = time.monotonic() - start
    assert took < 4, took  # 5 s before: the heartbeat's join
    answers.set()
    lease._thread.join(30)
    assert not lease._thread.is_alive() and read() == record  # it renewed nothing


def test_a_lost_lease_whose_store_does_not_answer_still_says_what_to_look_at(tmp_path):
    """The watchdog's refusal when the lease's own check cannot read its record: what is
    known, and the same advice as the check's (a job that took over may have committed)."""

    class Silent:
        target = tmp_path / "out.zarr"

        def check(self):
            raise OutcomeUnknownError("the store did not answer within 5 s")

    with pytest.raises(leases.LeaseLostError) as caught:
        watchdog._raise_lost(Silent())
    message = str(caught.value)
    assert "nothing was committed" in message
    assert f"`slem-dask versions {Silent.target}` shows whether another job committed" in message
    assert message.endswith("(once the store answers, if it did not)")


def test_the_time_a_job_waited_for_a_lease_is_not_reported_as_opening(
    capsys, scheduler, corpus, monkeypatch
):
    """A job that waits out another host's silent lease says so in its report: `lease
    wait [s]` ahead of `open [s]`, which no longer holds it (it read as 2 s of opening)."""
    monkeypatch.setattr(leases, "LEASE_TTL", 2.0)
    out = corpus["dir"] / "codes.zarr"
    foreign_lease(out, pid=4242)
    with pytest.warns(leases.LeaseWaitWarning, match="took the lease of"):
        code, report, err = cli(
            capsys, scheduler, *encode_command(corpus, out, "--partition-rows", "40")
        )
    assert code == 0, err
    timings = {
        line.split(" [s]")[0].strip(): float(line.split()[-1])
        for line in report.splitlines()
        if " [s]" in line
    }
    assert list(timings)[:2] == ["lease wait", "open"], report
    assert timings["lease wait"] >= 1.5 and timings["open"] < 1.0, report
    assert timings["total"] >= timings["lease wait"] + timings["open"], report
