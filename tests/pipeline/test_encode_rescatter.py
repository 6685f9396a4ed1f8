"""An encode whose scattered model the cluster lost (every worker that held it left,
the scheduler still up) sends it again and encodes the partitions left
(``pipeline.encode_retry.encode_partitions``); the real cluster case is
tests/cluster/test_worker_faults.py's, which kills the only worker."""

import warnings
from concurrent.futures import CancelledError
from types import SimpleNamespace

import numpy as np
import pytest

from slem_dask import storage
from slem_dask.parallel import replicas
from slem_dask.pipeline import common, encode_retry, encode_write
from slem_dask.pipeline.common import JobFailed

KEPT = "5 of 8 partitions are kept"


class _Client:
    """What encode_partitions asks of a client: connected, its nannies' restarts, a
    wait for a worker."""

    status = "running"

    def __init__(self):
        self.restarts: list = []
        self.worker_back = True

    def get_events(self, topic):
        assert topic == "worker-restart-memory"
        return list(self.restarts)

    def wait_for_workers(self, n, timeout):
        assert n == 1 and timeout == encode_retry.WORKER_WAIT
        if not self.worker_back:
            raise TimeoutError


@pytest.fixture
def attempts(monkeypatch):
    """Each attempt's partitions; its compute fails while ``lost`` lists failures left
    (after ``on_fail``), else returns [partition, 100 + partition] for each. Chunks 0
    and 1 were written. ``check``: the check of the workers before a new attempt."""
    seen = SimpleNamespace(todo=[], checks=0, lost=[], cluster_lost=True, on_fail=None)
    seen.check = lambda: None
    monkeypatch.setattr(
        encode_write, "_write_partitions", lambda model, arr, target, todo, *a: list(todo)
    )

    def compute(client, todo, progress):
        seen.todo.append(todo)
        if seen.lost:
            if seen.on_fail:
                seen.on_fail()
            raise seen.lost.pop(0)
        return np.array([[i, 100 + i] for i in todo])

    monkeypatch.setattr(common, "_compute", compute)
    monkeypatch.setattr(replicas, "lost", lambda futures: seen.cluster_lost)
    monkeypatch.setattr(
        storage, "self_consistent_crc32c", lambda target, i: 50 + i if i < 2 else None
    )
    return seen


def _encode(seen, client):
    def check():
        seen.checks += 1
        seen.check()

    return encode_retry.encode_partitions(
        client,
        model=None,
        plan=SimpleNamespace(arr=None, rows=10, out_dtype="float32", precision=None),
        target=None,
        todo=[0, 1, 2, 3],
        progress=False,
        check=check,
        kept=lambda: KEPT,
    )


def test_a_lost_model_is_sent_again_and_only_the_partitions_left_are_encoded(attempts):
    attempts.lost = [CancelledError("already forgotten")]
    with pytest.warns(UserWarning) as said:
        assert _encode(attempts, _Client()) == {0: 50, 1: 51, 2: 102, 3: 103}
    assert attempts.todo == [[0, 1, 2, 3], [2, 3]] and attempts.checks == 1
    assert [str(w.message) for w in said] == [
        "the model was lost with every worker that held it (killed or restarted); sent "
        "again to the workers now listed, 2 partition(s) left to encode"
    ]


def test_a_model_lost_every_time_ends_in_one_true_line(attempts):
    attempts.lost = [CancelledError("already forgotten")] * (encode_retry.RESCATTERS + 1)
    with pytest.raises(JobFailed) as failed, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _encode(attempts, _Client())
    assert str(failed.value) == (
        "every worker that held the model left while it encoded, 3 times (killed, or "
        "restarted by their nannies), though the scheduler stayed up: the workers' logs "
        "say why they died (a kill by the kernel's OOM killer leaves no nanny event); "
        f"{KEPT}"
    )
    assert len(attempts.todo) == 3 and attempts.checks == 2


def test_no_worker_back_ends_the_wait_in_one_line(attempts):
    # a worker without a nanny never returns: the wait was for ever
    attempts.lost = [CancelledError("already forgotten")]
    client = _Client()
    client.worker_back = False
    with pytest.raises(JobFailed, match=r"and no worker came back within 60 s .*dask worker"):
        _encode(attempts, client)
    assert len(attempts.todo) == 1 and attempts.checks == 0


def test_workers_that_cannot_see_the_stores_keep_what_was_written(attempts):
    # a StorageViewError from the check deleted the draft, with the partitions written
    attempts.lost = [CancelledError("already forgotten")]

    def refused():
        raise storage.StorageViewError("worker tcp://w2 cannot see the output")

    attempts.check = refused
    with pytest.raises(JobFailed) as failed:
        _encode(attempts, _Client())
    assert str(failed.value) == f"worker tcp://w2 cannot see the output; {KEPT}"


@pytest.mark.parametrize(
    "why", ["model kept", "client closed", "memory restart", "memory restart seen late"]
)
def test_a_compute_cancelled_for_another_reason_is_not_tried_again(attempts, why):
    cancelled = CancelledError("cancelled")
    attempts.lost = [cancelled]
    client = _Client()
    if why == "model kept":  # the watchdog's cancel: the model is still on the workers
        attempts.cluster_lost = False
    elif why == "client closed":  # the scheduler is gone: "lost the dask cluster"
        client.status = "connecting"
    elif why == "memory restart":  # a nanny restarted it: explain_failures says what helps
        client.restarts = [(1.0, {"worker": "tcp://w0"})]  # before this job: not counted
        attempts.on_fail = lambda: client.restarts.append((2.0, {"worker": "tcp://w1"}))
    else:  # logged by the nanny only while the job waits for the worker to return
        waited = client.wait_for_workers
        client.wait_for_workers = lambda n, timeout: (
            client.restarts.append((2.0, {"worker": "tcp://w1"})),
            waited(n, timeout),
        )
    with pytest.raises(CancelledError) as raised:
        _encode(attempts, client)
    assert raised.value is cancelled
    assert len(attempts.todo) == 1 and attempts.checks == 0


def test_without_a_cluster_nothing_is_tried_again(attempts):
    attempts.lost = [CancelledError("cancelled")]
    with pytest.raises(CancelledError):
        _encode(attempts, None)
    assert len(attempts.todo) == 1


def test_lost_says_whether_a_scattered_future_is_gone():
    future = SimpleNamespace
    assert not replicas.lost([])
    assert not replicas.lost([future(status="finished"), future(status="pending")])
    for status in ("cancelled", "lost", "error"):
        assert replicas.lost([future(status="finished"), future(status=status)])
