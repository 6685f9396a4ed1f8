"""Which side of a lost connection to an object store a message blames: a dask worker
that cannot reach a store this client reaches is not told to "start it" (found by
tests/system/test_partitions.py, a worker's link to S3 cut mid-fit)."""

from slem_dask.storage.backends.s3 import S3Backend


def _connection_error(endpoint):
    from botocore.exceptions import EndpointConnectionError

    return EndpointConnectionError(endpoint_url=endpoint)


def test_a_worker_that_cannot_reach_a_reachable_store_is_named_as_the_worker(s3_server):
    backend = S3Backend(f"s3://{s3_server.bucket}/x.zarr")
    line = backend.describe_error(_connection_error(s3_server.endpoint))
    assert line.startswith("a dask worker could not reach the object store"), line
    assert "while this client reaches it" in line and "start it" not in line


def test_a_store_that_nobody_reaches_is_named_as_unreachable(s3_server, monkeypatch):
    import socket

    with socket.socket() as s:  # a port with nothing behind it
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    from conftest import _forget_s3_clients

    _forget_s3_clients()
    backend = S3Backend(f"s3://{s3_server.bucket}/x.zarr")
    line = backend.describe_error(_connection_error(dead))
    assert line.startswith(f"cannot reach the object store at {dead}"), line
    assert "start it" in line
    _forget_s3_clients()
