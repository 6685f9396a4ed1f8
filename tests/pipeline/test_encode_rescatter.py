"""An encode whose scattered model the cluster lost (every worker that held it left,
the scheduler still up) sends it again and encodes the partitions left
(``pipeline.encode_write.encode_partitions``); the real cluster case is
tests/cluster/test_worker_faults.py's, which kills the only worker."""

from concurrent.futures import CancelledError
from types import SimpleNamespace

import numpy as np
import pytest

from slem_dask import storage
from slem_dask.parallel import replicas
from slem_dask.pipeline import common, encode_write
from slem_dask.pipeline.common import JobFailed


class _Client:
    """What encode_partitions asks of a client: connected, and its nannies' restarts."""

    status = "running"

    def __init__(self, restarts=()):
        self.restarts = list(restarts)

    def get_events(self, topic):
        assert topic == "worker-restart-memory"
        return self.restarts


@pytest.fixture
def attempts(monkeypatch):
    """Each attempt's partitions; its compute fails while ``lost`` lists failures left,
    else returns [partition, 100 + partition] for each. Chunks 0 and 1 were written."""
    seen = SimpleNamespace(todo=[], checks=0, lost=[], cluster_lost=True, on_fail=None)
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


def _encode(seen, client=None):
    def check():
        seen.checks += 1

    return encode_write.encode_partitions(
        client or _Client(),
        model=None,
        plan=SimpleNamespace(arr=None, rows=10, out_dtype="float32", precision=None),
        target=None,
        todo=[0, 1, 2, 3],
        progress=False,
        check=check,
        kept=lambda: "5 of 8 partitions are kept",
    )


def test_a_lost_model_is_sent_again_and_only_the_partitions_left_are_encoded(attempts):
    attempts.lost = [CancelledError("already forgotten")]
    assert _encode(attempts) == {0: 50, 1: 51, 2: 102, 3: 103}
    assert attempts.todo == [[0, 1, 2, 3], [2, 3]] and attempts.checks == 1


def test_a_model_lost_every_time_ends_in_one_true_line(attempts):
    attempts.lost = [CancelledError("already forgotten")] * (encode_write.RESCATTERS + 1)
    with pytest.raises(JobFailed) as failed:
        _encode(attempts)
    assert str(failed.value) == (
        "every worker that held the model left while it encoded, 3 times (killed, or "
        "restarted by their nannies), though the scheduler stayed up; 5 of 8 partitions "
        "are kept"
    )
    assert "lost the dask cluster" not in str(failed.value)
    assert len(attempts.todo) == 3 and attempts.checks == 2


@pytest.mark.parametrize(
    "why",
    ["model kept", "client closed", "memory restart", "no cluster"],
)
def test_a_compute_cancelled_for_another_reason_is_not_tried_again(attempts, why):
    attempts.lost = [CancelledError("cancelled")]
    client = _Client()
    if why == "model kept":  # the watchdog's cancel: the model is still on the workers
        attempts.cluster_lost = False
    elif why == "client closed":  # the scheduler is gone: "lost the dask cluster"
        client.status = "closed"
    elif why == "memory restart":  # a nanny restarted it: explain_failures says what helps
        client.restarts = [(1.0, {"worker": "tcp://w0"})]  # before this job: not counted
        attempts.on_fail = lambda: client.restarts.append((2.0, {"worker": "tcp://w1"}))
    with pytest.raises(CancelledError):
        if why == "no cluster":
            encode_write.encode_partitions(
                None,
                None,
                SimpleNamespace(arr=None, rows=10, out_dtype="float32", precision=None),
                None,
                [0, 1, 2, 3],
                False,
                check=lambda: None,
                kept=lambda: "",
            )
        else:
            _encode(attempts, client)
    assert len(attempts.todo) == 1 and attempts.checks == 0


def test_lost_says_whether_a_scattered_future_is_gone():
    future = SimpleNamespace
    assert not replicas.lost([])
    assert not replicas.lost([future(status="finished"), future(status="pending")])
    for status in ("cancelled", "lost", "error"):
        assert replicas.lost([future(status="finished"), future(status=status)])
