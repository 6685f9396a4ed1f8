"""One error model at the backend boundary (issue 38, slem_dask/storage/backends/outcomes.py): the
real clients' own exception types (gcsfs's HttpError and aiohttp's errors, azure-core's
HttpResponseError and ServiceResponseError, botocore's errors), raised through the real
backend classes on the emulators, reach the commit protocol only as the few outcome
kinds; a commit whose record lands late is never left pointing at a deleted folder, a
lost reply followed by 503s is no false failure, the lease heartbeat outlives a 503
burst, and a lease that cannot be released does not fail a committed job."""

import time
import uuid

import numpy as np
import pytest

from slem_dask.storage.nodes import groups
from slem_dask.storage.versioning import leases
from slem_dask.storage.versioning import publish
from slem_dask.storage.versioning import versions
from slem_dask.storage.backends.azure import AzureBackend
from slem_dask.storage.backends.gcs import GCSBackend
from slem_dask.storage.backends.outcomes import (
    AccessRefusedError,
    OutcomeUnknownError,
    StoreUnreachableError,
)


@pytest.fixture
def gcs(gcs_emulator, monkeypatch):
    for name, value in gcs_emulator.env().items():
        monkeypatch.setenv(name, value)
    return f"gs://{gcs_emulator.bucket}/{uuid.uuid4().hex[:8]}"


@pytest.fixture
def azure(azure_emulator, monkeypatch):
    for name in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in azure_emulator.env().items():
        monkeypatch.setenv(name, value)
    return f"az://{azure_emulator.bucket}/{uuid.uuid4().hex[:8]}"


@pytest.fixture
def faults():
    """Faults of the test's own, undone apart from the store's environment."""
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(params=["gcs", "azure"])
def root(request, monkeypatch):
    monkeypatch.setattr(publish, "_PUBLISH_BACKOFF", 0.0)
    return request.param, request.getfixturevalue(request.param)


def unavailable(kind: str) -> Exception:
    """The client's own 503, as it raises it after its retries."""
    if kind == "gcs":
        from gcsfs.retry import HttpError

        return HttpError({"code": 503, "message": "Service Unavailable"})
    from azure.core.exceptions import HttpResponseError

    error = HttpResponseError(message="The server is busy. ErrorCode:ServerBusy")
    error.status_code = 503
    return error


def lost_reply(kind: str) -> Exception:
    """The client's own error for a request sent whose reply never came."""
    if kind == "gcs":
        import aiohttp

        return aiohttp.ServerDisconnectedError()
    from azure.core.exceptions import ServiceResponseError

    return ServiceResponseError("Connection aborted: the server closed the connection")


def _fs(url: str):
    return (GCSBackend if url.startswith("gs://") else AzureBackend)(url).fs


def _write(path: str, value: float, **kwargs):
    return groups.write_group(
        path,
        {"kind": "search", "complete": True},
        {"x": np.full(4, value)},
        "search result",
        **kwargs,
    )


def _faults_on(monkeypatch, fs, name: str, when, fault):
    """``fs.<name>`` raising ``fault(path, args, kwargs)`` (an exception, or None to
    call the real method) for the paths that ``when`` selects."""
    real = getattr(fs, name)

    def faulty(path, *args, **kwargs):
        if when(path):
            error = fault(path, args, kwargs)
            if error is not None:
                raise error
        return real(path, *args, **kwargs)

    monkeypatch.setattr(fs, name, faulty)
    return real


# -- the kinds -------------------------------------------------------------------------


def test_every_client_failure_reaches_the_protocol_as_one_of_the_kinds(root, monkeypatch):
    kind, url = root
    backend = (GCSBackend if kind == "gcs" else AzureBackend)(url)
    fs = backend.fs
    for error, expected in [
        (unavailable(kind), OutcomeUnknownError),
        (lost_reply(kind), OutcomeUnknownError),
    ]:
        monkeypatch.setattr(fs, "cat_file", lambda *a, e=error, **k: (_ for _ in ()).throw(e))
        with pytest.raises(expected) as info:
            backend.read("k")
        assert info.value.__cause__ is error and "\n" not in str(info.value)
        assert url in str(info.value)
    if kind == "gcs":
        from gcsfs.retry import HttpError

        refused = HttpError({"code": 401, "message": "Invalid Credentials"})
    else:
        from azure.core.exceptions import ServiceRequestError

        refused = ServiceRequestError("Cannot connect to host 127.0.0.1:1")
    monkeypatch.setattr(fs, "pipe_file", lambda *a, **k: (_ for _ in ()).throw(refused))
    with pytest.raises(AccessRefusedError if kind == "gcs" else StoreUnreachableError):
        backend.put("k", b".")


# -- item 1: a create that lands late while every retry gets 503 -------------------------


def test_a_commit_record_that_lands_late_never_names_a_deleted_folder(root, faults):
    """The record's create reaches the store late, its reply lost, while every retry and
    read-back gets 503: the job says the outcome is unknown and keeps its draft; once the
    record lands, the version it names is complete (it failed with the client's 503 and
    deleted its draft, on the code before)."""
    kind, path = root
    _write(path, 1.0)
    fs = _fs(path)
    late = []

    def create_lands_later(p, args, kwargs):
        if not late:
            late.append((p, args[0] if args else kwargs["value"]))  # applied, later
            return lost_reply(kind)
        return unavailable(kind)

    real_pipe = _faults_on(faults, fs, "pipe_file", lambda p: "/commits/" in p, create_lands_later)
    _faults_on(
        faults,
        fs,
        "cat_file",
        lambda p: bool(late) and p.endswith("commits/00000002.json"),
        lambda *_: unavailable(kind),
    )
    with pytest.raises(versions.CommitUnknownError) as info:
        _write(path, 2.0, overwrite=True)
    assert "\n" not in str(info.value) and "kept" in str(info.value)
    faults.undo()
    for p, data in late:  # the create lands now
        real_pipe(p, data)
    store = versions.VersionedStore(path)
    head = store.head()
    assert head.seq == 2
    store.check(head)  # its zarr.json is there, as committed
    assert groups.read_search_store(path)[1]["x"].tolist() == [2.0] * 4


def test_fit_whose_record_lands_late_says_so_in_one_line(root, faults, corpus, capsys):
    """Issue 38's first finding, through the command: `fit --overwrite` whose commit
    record lands late while every retry gets 503 exits 1 with one line, and the model
    it names afterwards verifies (a 100-line traceback and a model pointing at a
    deleted folder, on the code before)."""
    from slem_dask import storage
    from slem_dask.cli.main import main

    kind, path = root
    model = f"{path}/m.zarr"
    args = ["fit", "--negatives", corpus["negatives"], "--model", model]
    args += ["--local-cluster", "threads", "--no-progress"]
    assert main(args) == 0, capsys.readouterr().err
    fs, late = _fs(path), []

    def create_lands_later(p, args, kwargs):
        if not late:
            late.append((p, args[0] if args else kwargs["value"]))
            return lost_reply(kind)
        return unavailable(kind)

    real_pipe = _faults_on(faults, fs, "pipe_file", lambda p: "/commits/0" in p, create_lands_later)
    _faults_on(
        faults,
        fs,
        "cat_file",
        lambda p: bool(late) and "/commits/0" in p,
        lambda *_: unavailable(kind),
    )
    assert main([*args, "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "cannot learn whether version 2 was committed" in err, err
    faults.undo()
    for p, data in late:  # the create lands now
        real_pipe(p, data)
    assert versions.VersionedStore(model).head().seq == 2
    assert storage.verify(model)[1] == []


# -- item 2: a lost reply followed by 503s ---------------------------------------------


def test_a_lost_reply_then_503s_is_no_false_failure_and_no_extra_version(root, faults):
    """The record lands but its reply is lost, and the next reads get 503: the job
    learns it committed (on the code before it failed with the client's error, and a
    re-run committed one more version)."""
    kind, path = root
    for value in (1.0, 2.0, 3.0):
        _write(path, value, overwrite=True)
    fs = _fs(path)
    burst, applied = [3], []  # read-backs that get 503 once the record landed

    def applied_then_lost(p, args, kwargs):
        real_pipe(p, *args, **kwargs)  # applied; then its reply is lost
        applied.append(p)
        return lost_reply(kind)

    real_pipe = _faults_on(
        faults,
        fs,
        "pipe_file",
        lambda p: p.endswith("commits/00000004.json"),
        applied_then_lost,
    )

    def read_burst(p, args, kwargs):
        if burst[0]:
            burst[0] -= 1
            return unavailable(kind)
        return None

    _faults_on(
        faults,
        fs,
        "cat_file",
        lambda p: bool(applied) and p.endswith("commits/00000004.json"),
        read_burst,
    )
    commit = _write(path, 4.0, overwrite=True)
    faults.undo()
    store = versions.VersionedStore(path)
    assert commit.seq == 4 and store.head() == commit and burst == [0]
    assert len(store.listed_versions(store.backend.list("versions"))) <= versions.KEEP_VERSIONS


# -- item 3: the heartbeat and the release ---------------------------------------------


def test_the_lease_heartbeat_outlives_a_503_burst(root, faults, monkeypatch):
    kind, path = root
    monkeypatch.setattr(leases, "LEASE_HEARTBEAT", 0.05)
    lease = leases.Lease(path, "a job").acquire()
    try:
        fs = _fs(path)
        burst = [4]

        def fault(p, args, kwargs):
            if burst[0]:
                burst[0] -= 1
                return unavailable(kind)
            return None

        for name in ("cat_file", "pipe_file"):
            _faults_on(faults, fs, name, lambda p: p.endswith(lease._key), fault)
        beat = lease._beat_no
        while lease._thread.is_alive() and (burst[0] or lease._beat_no < beat + 2):
            time.sleep(0.02)  # until the burst is over and two beats followed it
        assert lease._thread.is_alive(), "the heartbeat died in the burst"
        faults.undo()
        assert lease.read()["beat"] >= 1 and lease.held()
    finally:
        lease.release()


def test_a_release_that_fails_does_not_fail_a_committed_job(root, faults):
    kind, path = root
    fs = _fs(path)
    _faults_on(
        faults,
        fs,
        "rm_file",
        lambda p: p.endswith(".slem-dask-lease"),
        lambda *_: unavailable(kind),
    )
    commit = _write(path, 1.0)  # on the code before: the client's 503, after the commit
    faults.undo()
    assert versions.VersionedStore(path).head() == commit


# -- item 7: messages ------------------------------------------------------------------


def test_a_503_burst_in_a_rollback_is_one_line(root, faults, capsys):
    from slem_dask.cli.main import main

    kind, path = root
    _write(path, 1.0)
    _write(path, 2.0, overwrite=True)
    fs = _fs(path)
    # listing the old version to copy it, and deleting the draft after: 503s
    _faults_on(faults, fs, "find", lambda p: True, lambda *_: unavailable(kind))
    assert main(["rollback", path, "--to", "1"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "503" in err and "run the same command again" in err, err
    faults.undo()
    assert versions.VersionedStore(path).head().seq == 2


def test_a_fenced_partition_write_says_fenced(tmp_path, monkeypatch):
    """The draft deleted by the job that took the store over, between a partition's
    write and its read-back: the worker says the job was fenced (on the code before:
    "cannot be read back on this worker; check the storage")."""
    import zarr

    from slem_dask.storage.versioning import gc
    from slem_dask.storage.nodes import outputs

    store = versions.VersionedStore(str(tmp_path / "o.zarr"))
    draft = store.begin()
    arr = zarr.create_array(
        store=draft.location, shape=(4, 2), chunks=(2, 2), dtype="f4", zarr_format=3
    )
    real = outputs.stored_crc32c

    def deleted_meanwhile(a, index):
        store.delete_version(draft.version)  # the other job condemned the draft
        return real(a, index)

    monkeypatch.setattr(outputs, "stored_crc32c", deleted_meanwhile)
    with pytest.raises(gc.DraftFencedError, match="fenced"):
        outputs.write_partition(np.ones((2, 2), "f4"), arr, 0)


def test_s3_heartbeat_and_release_outlive_botocore_errors(s3_server, monkeypatch):
    """botocore's own types, some no OSError (EndpointConnectionError, ReadTimeoutError),
    in the heartbeat's reads and writes and in the release's delete (on the code
    before: the first one ended the heartbeat)."""
    from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

    monkeypatch.setattr(leases, "LEASE_HEARTBEAT", 0.05)
    lease = leases.Lease(f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:8]}/m.zarr", "a job")
    lease.acquire()
    fs = lease._backend.fs
    slow_down = {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}
    burst = [
        ClientError(slow_down, "PutObject"),
        ReadTimeoutError(endpoint_url=s3_server.endpoint),
        EndpointConnectionError(endpoint_url=s3_server.endpoint),
    ] * 2
    real_call, real_async_call = fs.call_s3, fs._call_s3

    def on_lease(kwargs) -> bool:
        return str(kwargs.get("Key", "")).endswith(lease._key) and bool(burst)

    def call_s3(method, *args, **kwargs):
        if on_lease(kwargs):
            raise burst.pop()
        return real_call(method, *args, **kwargs)

    async def async_call_s3(method, *args, **kwargs):
        if on_lease(kwargs):
            raise burst.pop()
        return await real_async_call(method, *args, **kwargs)

    with pytest.MonkeyPatch.context() as faults:
        faults.setattr(fs, "call_s3", call_s3)
        faults.setattr(fs, "_call_s3", async_call_s3)
        beat = lease._beat_no
        while lease._thread.is_alive() and (burst or lease._beat_no < beat + 2):
            time.sleep(0.02)  # until the burst is over and two beats followed it
        assert lease._thread.is_alive(), "the heartbeat died in the burst"
        lease._stop.set()  # no beat takes the release's fault: the heartbeat ends first
        lease._thread.join()
        burst.append(EndpointConnectionError(endpoint_url=s3_server.endpoint))
        faults.setattr(fs, "call_s3", call_s3)
        lease.release()  # its delete fails: the job's outcome stands
    assert not burst and lease.held()  # left as a killed job's lease is


def test_a_failure_is_told_of_the_store_it_names_not_the_model():
    """encode: a 503 of the output store, on the same object store as the model, is
    told of the output (it named the model's path, on the code before)."""
    from gcsfs.retry import HttpError

    from slem_dask.storage.versioning.publish import describe_storage_error

    cause = HttpError({"code": 503, "message": "Service Unavailable"})
    try:
        try:
            raise cause
        except HttpError as exc:
            raise OutcomeUnknownError(f"put gs://b/out.zarr/versions/x: {exc}") from exc
    except OutcomeUnknownError as exc:
        line = describe_storage_error(exc, ["gs://b/model.zarr", "gs://b/out.zarr"])
    assert line is not None and "gs://b/out.zarr" in line and "model" not in line, line
    assert "503" in line and "\n" not in line
    bare = describe_storage_error(cause, ["gs://b/model.zarr", "gs://b/out.zarr"])
    assert bare is not None and "503" in bare and "model" not in bare, bare


def test_s3_client_failures_are_sorted_into_the_kinds():
    """botocore's types, OSErrors or not, and s3fs's translations of them."""
    from botocore import exceptions as bx
    from s3fs.errors import translate_boto_error

    from slem_dask.storage.backends import s3
    from slem_dask.storage.backends.outcomes import UNKNOWN, UNREACHABLE, StorageRefusedError

    def client_error(code: str, status: int) -> Exception:
        response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
        return bx.ClientError(response, "PutObject")

    url = "http://127.0.0.1:1"
    cases = [
        (client_error("SlowDown", 503), UNKNOWN),
        (client_error("InternalError", 500), UNKNOWN),
        (bx.ReadTimeoutError(endpoint_url=url), UNKNOWN),
        (bx.ConnectionClosedError(endpoint_url=url), UNKNOWN),
        (bx.EndpointConnectionError(endpoint_url=url), UNREACHABLE),
        (bx.ConnectTimeoutError(endpoint_url=url), UNREACHABLE),
        (bx.NoCredentialsError(), AccessRefusedError),
        (client_error("AccessDenied", 403), AccessRefusedError),
        (client_error("NoSuchBucket", 404), FileNotFoundError),
        (client_error("NotImplemented", 501), StorageRefusedError),
    ]
    for error, kind in cases:
        assert s3.outcome_kind(error) is kind, (error, kind)
        translated = translate_boto_error(error) if isinstance(error, bx.ClientError) else None
        if translated is not None:  # s3fs's OSError, the ClientError its cause
            assert s3.outcome_kind(translated) is kind, (translated, kind)


def test_a_rollback_whose_clean_up_fails_after_its_commit_succeeds(tmp_path, monkeypatch):
    """The rollback is committed, then its garbage collection meets a 503: readers see
    the rolled-back version, so the rollback succeeds (on the code before it failed,
    and the CLI's line said readers saw what they saw before: untrue)."""
    path = str(tmp_path / "s.zarr")
    _write(path, 1.0)
    _write(path, 2.0, overwrite=True)

    def unavailable_store(self, keep=versions.KEEP_VERSIONS):
        raise OutcomeUnknownError(f"list {self.path}/versions: 503 SlowDown")

    monkeypatch.setattr(versions.VersionedStore, "collect_garbage", unavailable_store)
    record = versions.VersionedStore(path).rollback(1)
    assert versions.VersionedStore(path).head() == record and record.seq == 3
