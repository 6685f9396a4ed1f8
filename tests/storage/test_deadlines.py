"""Every storage request has a deadline (slem_dask/storage/backends/deadlines.py, issue 38): each
client's file system, whoever makes it (a backend, zarr from a URL), has the connect and
read timeouts and the bounded tries of one policy, set by $SLEM_DASK_STORAGE_TIMEOUT and
$SLEM_DASK_STORAGE_ATTEMPTS; a server that accepts connections and never answers is
told from one that answers; a lease that could not be renewed in time is not trusted,
and its heartbeat stops claiming it."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
import uuid

import pytest

from slem_dask.storage.backends import deadlines
from slem_dask.storage.versioning import leases
from slem_dask.storage.backends.registry import backend_for

from conftest import use_server
from faultproxy import FaultProxy, Rule

AZURITE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey="
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;"
)


@pytest.fixture
def policy(monkeypatch):
    monkeypatch.setenv(deadlines.ENV_TIMEOUT, "7")
    monkeypatch.setenv(deadlines.ENV_ATTEMPTS, "2")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", AZURITE)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    yield deadlines.install()
    monkeypatch.undo()
    deadlines.install()  # the defaults again, for the tests after this one


def _s3_config(fs) -> dict:
    return fs.config_kwargs


def test_the_policy_comes_from_the_environment(policy):
    assert policy == deadlines.Deadlines(timeout=7.0, attempts=2)
    assert policy.connect == 7.0 and deadlines.Deadlines(timeout=60).connect == 10.0
    assert deadlines.Deadlines().timeout == deadlines.DEFAULT_TIMEOUT


@pytest.mark.parametrize(
    "name, value",
    [
        (deadlines.ENV_TIMEOUT, "soon"),
        (deadlines.ENV_TIMEOUT, "0"),
        (deadlines.ENV_ATTEMPTS, "1.5"),
        (deadlines.ENV_ATTEMPTS, "0"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as info:
        deadlines.current()
    message = str(info.value)
    assert message.startswith(f"${name} = {value!r}: expected ") and "\n" not in message


def test_every_client_made_by_url_has_the_deadlines(policy):
    """zarr opens gs:// and az:// stores by URL (fsspec makes their file systems): those
    had no deadline on GCS at all, and Azure's listings and deletes waited 60 s a try,
    four tries 15 + 3**i s apart."""
    import fsspec

    s3 = fsspec.filesystem("s3", anon=True, skip_instance_cache=True)
    assert _s3_config(s3)["connect_timeout"] == 7.0 and _s3_config(s3)["read_timeout"] == 7.0
    assert _s3_config(s3)["retries"]["total_max_attempts"] == 2 and s3.retries == 1
    gs = fsspec.filesystem("gs", token="anon", skip_instance_cache=True)
    assert gs.requests_timeout.sock_read == 7.0 and gs.requests_timeout.sock_connect == 7.0
    assert gs._slem_attempts == 2
    az = fsspec.filesystem("az", skip_instance_cache=True)
    connection = az.service_client._pipeline._transport.connection_config
    assert (connection.timeout, connection.read_timeout) == (7.0, 7.0)
    retry = az.service_client._config.retry_policy
    assert retry.total_retries == retry.read_retries == 1 and retry.initial_backoff == 1.0


def test_zarr_chunk_io_goes_through_file_systems_with_the_deadlines(policy):
    from zarr.storage import FsspecStore

    gs = FsspecStore.from_url("gs://bucket/x.zarr", storage_options={"token": "anon"}).fs
    assert gs.requests_timeout.sock_read == 7.0
    s3 = FsspecStore.from_url("s3://bucket/x.zarr", storage_options={"anon": True}).fs
    assert s3.config_kwargs["read_timeout"] == 7.0 and s3.retries == 1


def test_what_a_user_sets_wins(policy, monkeypatch):
    import fsspec
    from fsspec.config import conf

    monkeypatch.setitem(conf, "s3", json.loads(json.dumps(conf["s3"])))
    conf["s3"]["config_kwargs"]["read_timeout"] = 99  # a user's FSSPEC_S3
    s3 = fsspec.filesystem("s3", anon=True, skip_instance_cache=True)
    assert s3.config_kwargs["read_timeout"] == 99 and s3.config_kwargs["connect_timeout"] == 7
    gs = fsspec.filesystem("gs", token="anon", requests_timeout=3, skip_instance_cache=True)
    assert gs.requests_timeout == 3


def test_request_bounds_are_minutes_by_default():
    policy = deadlines.Deadlines()
    for kind in ("s3", "gcs", "azure"):
        assert 60 < policy.request_bound(kind) < 600, (kind, policy.request_bound(kind))


# -- a server that accepts connections and never answers (a stopped store)


def test_a_silent_server_is_told_from_one_that_answers_and_one_that_is_down():
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(403)
            self.end_headers()

        def log_message(self, *args):
            pass

    answering = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=answering.serve_forever, daemon=True).start()
    silent = socket.create_server(("127.0.0.1", 0))  # its backlog accepts; nobody answers
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{free.getsockname()[1]}"
    try:
        assert deadlines.silent_endpoint(f"http://127.0.0.1:{answering.server_port}", 5) is None
        said = deadlines.silent_endpoint(f"http://127.0.0.1:{silent.getsockname()[1]}", 0.5)
        assert said == "accepted a connection but sent nothing for 0.5 s"
        assert deadlines.silent_endpoint(down, 5) == "Connection refused"
    finally:
        answering.shutdown()
        silent.close()


# -- the lease of a job whose store stops answering


@pytest.fixture
def silent_s3(seaweedfs_server, monkeypatch):
    """SeaweedFS behind a fault proxy, with short deadlines and a short lease TTL.

    5 s, not 1: the store is silent only once the test says so, and until then each
    request must be answered whatever the load. With 1 s, CI (``pytest --slow`` beside
    the emulators on 2 cores) once timed out connecting to the proxy in ``acquire``."""
    use_server(seaweedfs_server, monkeypatch)
    with FaultProxy(seaweedfs_server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        monkeypatch.setenv(deadlines.ENV_TIMEOUT, "5")
        monkeypatch.setenv(deadlines.ENV_ATTEMPTS, "1")
        monkeypatch.setattr(leases, "LEASE_TTL", 4.0)
        monkeypatch.setattr(leases, "LEASE_HEARTBEAT", 0.5)
        proxy.root = f"s3://{seaweedfs_server.bucket}/dl-{uuid.uuid4().hex[:8]}"
        yield proxy


@pytest.mark.slow
def test_a_lease_that_could_not_be_renewed_is_not_trusted_nor_claimed_again(silent_s3):
    """Its store stopped answering: the heartbeat's requests end at their deadline, the
    job no longer trusts its lease (another host takes it over after the TTL), and once
    the store answers again the old heartbeat does not write it any more. (Before, a
    lease was trusted as long as its record read back, and its heartbeat went on.)"""
    lease = leases.Lease(f"{silent_s3.root}/out.zarr", "encode").acquire()
    try:
        assert lease.held() and lease.trusted_for() > 0
        silent_s3.rules = [Rule("any", "silent")]
        end = time.monotonic() + 120  # a test that waits, never one that hangs
        while lease.trusted_for() > 0 and time.monotonic() < end:
            time.sleep(0.2)
        assert not lease.held()
        with pytest.raises(leases.LeaseLostError, match=r"was not renewed for \d+ s"):
            lease.check()
        silent_s3.resume()
        before = lease.read()
        lease._thread.join(timeout=60)  # the heartbeat has ended, or ends at its deadline
        assert not lease._thread.is_alive()
        time.sleep(4 * leases.LEASE_HEARTBEAT)
        assert lease.read() == before  # nobody renewed it: another job may take it over
    finally:
        lease.release()
    assert lease.read() is not None  # not deleted: this job no longer knows it holds it
    backend_for(silent_s3.root).remove_tree("")


def test_the_storage_timeout_option_sets_the_policy_while_the_command_runs(monkeypatch):
    """--storage-timeout: the variable the policy (and a local cluster's workers) read,
    for the command's run only."""
    import os

    from slem_dask.cli.main import _storage_timeout
    from slem_dask.cli.parser import build_parser

    args = build_parser().parse_args(
        ["encode", "--model", "m", "--positives", "p", "--out", "o", "--storage-timeout", "3"]
    )
    assert args.storage_timeout == 3.0
    monkeypatch.delenv(deadlines.ENV_TIMEOUT, raising=False)
    with _storage_timeout(args.storage_timeout):
        assert deadlines.current().timeout == 3.0
    assert deadlines.ENV_TIMEOUT not in os.environ


def test_the_line_of_a_job_that_met_its_deadline_names_the_deadline_it_was_given(
    monkeypatch, capsys
):
    """`encode --storage-timeout 3` on a stopped store said "(20 s a try, ...)": the
    line was made after the option's setting had been undone (seen by SIGSTOP of
    fake-gcs-server mid-encode). It names the deadline the job ran with."""
    from slem_dask.cli import main as cli_main

    monkeypatch.delenv(deadlines.ENV_TIMEOUT, raising=False)

    def stalled(args):
        raise TimeoutError("a request met its deadline")

    # the line is made where the command's error is handled, as the backends make it
    monkeypatch.setattr(cli_main, "_run", stalled)
    monkeypatch.setattr(
        cli_main, "_storage_line", lambda exc, args: deadlines.timeout_line("http://h:9", "gs://b")
    )
    argv = ["encode", "--model", "m.zarr", "--positives", "p.npy", "--out", "o.zarr"]
    assert cli_main.main([*argv, "--storage-timeout", "3"]) == 1
    err = capsys.readouterr().err
    assert "(3 s a try, " in err and "20 s a try" not in err, err
    assert deadlines.ENV_TIMEOUT not in __import__("os").environ  # undone after the command
