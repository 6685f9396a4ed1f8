"""Where a scattered model array goes: straight to a worker when this process can
reach the workers, else through the scheduler (parallel/replicas.scatter_everywhere)."""

import numpy as np
import pytest

from slem_dask.parallel.replicas import scatter_everywhere, workers_are_local


@pytest.mark.parametrize(
    "addresses,local",
    [
        (["tcp://127.0.0.1:40001", "tcp://127.0.0.1:40002"], True),
        (["tcp://[::1]:40001"], True),
        (["tcp://localhost:40001"], True),
        (["tls://127.0.0.2:40001"], True),
        (["tcp://127.0.0.1:40001", "tcp://10.0.0.7:40002"], False),
        (["tcp://10.0.0.7:40001"], False),
        (["tcp://worker-3.cluster.local:40001"], False),
        ([], False),
    ],
)
def test_workers_are_local_only_on_loopback(addresses, local):
    assert workers_are_local(addresses) is local


class _RecordingClient:
    """What scatter_everywhere asks of a client, with no cluster behind it."""

    def __init__(self, direct_to_workers, addresses):
        self.direct_to_workers = direct_to_workers
        self.addresses = addresses
        self.calls = []

    def nthreads(self):
        return {a: 1 for a in self.addresses}

    def scatter(self, data, **kwargs):
        self.calls.append(kwargs)
        return {key: f"future of {key}" for key in data}


@pytest.mark.parametrize(
    "told,addresses,direct",
    [
        (None, ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], True),  # a LocalCluster
        (None, ["tcp://10.0.0.7:1", "tcp://10.0.0.8:2"], False),  # a remote cluster
        (False, ["tcp://127.0.0.1:1"], False),  # Client(direct_to_workers=False)
        (True, ["tcp://10.0.0.7:1"], True),  # Client(direct_to_workers=True)
    ],
)
def test_scatter_goes_direct_only_where_the_workers_can_be_reached(told, addresses, direct):
    client = _RecordingClient(told, addresses)
    assert scatter_everywhere(client, "k", np.ones(3)) == "future of k"
    assert client.calls == [{"broadcast": True, "direct": direct}]


def test_a_jobs_scattered_arrays_are_let_go_when_its_block_ends():
    # asyncio handles made by a direct scatter keep a copy of the caller's context, and
    # with it the futures the block held: the workers kept the arrays after the job
    import contextvars

    from slem_dask.parallel import blocks

    client = _RecordingClient(None, ["tcp://127.0.0.1:1"])
    with blocks.scatter_large_arrays(client):
        assert blocks.shared(np.ones(blocks.SCATTER_BYTES // 8 + 1)).startswith("future of")
        survivor = contextvars.copy_context()
    assert survivor[blocks._scatter_client][1] == []
    assert client.calls == [{"broadcast": True, "direct": True}]
