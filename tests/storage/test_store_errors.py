"""One line for each misconfiguration of s3://, gs:// and az:// stores
(slem_dask/storage/backends/s3.py, gcs.py, azure.py): a missing bucket or container, wrong or
missing credentials, an identity that may not write, an endpoint that does not answer;
S3 on SeaweedFS and moto (tests/s3server.py), the others on the emulators where they can
show it (tests/emulators.py)."""

import uuid

import pytest

from slem_dask.storage.backends.azure import AzureBackend
from slem_dask.storage.backends.gcs import GCSBackend
from slem_dask.storage.backends.s3 import S3Backend

S3_KINDS = ["seaweedfs", "moto"]

OPERATIONS = {
    "read": lambda b: b.read("k"),
    "create": lambda b: b.create("k", b"."),
    "put": lambda b: b.put("k", b"."),
    "list": lambda b: b.list(""),
    "exists": lambda b: b.exists("k"),
}


def _failure(backend, op):
    with pytest.raises(Exception) as info:
        OPERATIONS[op](backend)
    message = backend.describe_error(info.value)
    assert message is not None, repr(info.value)
    assert "\n" not in message
    return message


# -- S3 ------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPERATIONS)
def test_describe_error_wrong_secret(s3_server, monkeypatch, op):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    message = _failure(S3Backend(f"s3://{s3_server.bucket}/p"), op)
    assert "AWS_SECRET_ACCESS_KEY" in message and "worker" in message


@pytest.mark.parametrize("op", ["read", "create", "put", "list"])
def test_describe_error_access_denied(s3_server, monkeypatch, op):
    key, secret = s3_server.readonly
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    b = S3Backend(f"s3://{s3_server.bucket}/p")
    if op in ("read", "list"):  # this identity may read and list
        OPERATIONS[op](b)
        return
    message = _failure(b, op)
    assert "denied" in message and "AWS_ACCESS_KEY_ID" in message


@pytest.mark.parametrize("s3_server", S3_KINDS, indirect=True)
@pytest.mark.parametrize("op", OPERATIONS)
def test_describe_error_no_credentials(s3_server, monkeypatch, op):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    message = _failure(S3Backend(f"s3://{s3_server.bucket}/p"), op)
    assert "AWS_ACCESS_KEY_ID" in message and "AWS_SECRET_ACCESS_KEY" in message
    assert "worker" in message


@pytest.mark.parametrize("s3_server", S3_KINDS, indirect=True)
@pytest.mark.parametrize("op", OPERATIONS)
def test_describe_error_missing_bucket(s3_server, op):
    message = _failure(S3Backend("s3://no-such-bucket-slem/p"), op)
    assert "'no-such-bucket-slem' does not exist" in message
    assert s3_server.endpoint in message


@pytest.mark.parametrize("op", OPERATIONS)
def test_describe_error_unreachable_endpoint(monkeypatch, tmp_path, op):
    from s3server import free_port

    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }.items():
        monkeypatch.setenv(name, value)
    # no resends (s3fs and botocore would take 6 s to give up)
    b = S3Backend("s3://bucket/p", config_kwargs={"retries": {"max_attempts": 1}})
    monkeypatch.setattr(b.fs, "retries", 1)
    message = _failure(b, op)
    assert closed in message and "AWS_ENDPOINT_URL" in message and "worker" in message


def test_describe_error_is_none_for_other_errors(s3_server):
    b = S3Backend(f"s3://{s3_server.bucket}/p")
    assert b.describe_error(ValueError("x")) is None
    assert b.describe_error(FileNotFoundError("k")) is None


@pytest.fixture
def gcs(gcs_emulator, monkeypatch):
    for name, value in gcs_emulator.env().items():
        monkeypatch.setenv(name, value)
    return gcs_emulator


@pytest.fixture
def azure(azure_emulator, monkeypatch):
    for name in (
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_STORAGE_CLIENT_ID",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in azure_emulator.env().items():
        monkeypatch.setenv(name, value)
    return azure_emulator


# -- a missing bucket (container) ------------------------------------------------------


@pytest.mark.parametrize("op", OPERATIONS)
def test_gcs_missing_bucket(gcs, op):
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:6]}"
    message = _failure(GCSBackend(f"gs://{bucket}/p"), op)
    assert f"bucket {bucket!r} does not exist" in message and gcs.endpoint in message
    assert "STORAGE_EMULATOR_HOST" in message and "worker" in message


@pytest.mark.parametrize("op", OPERATIONS)
def test_azure_missing_container(azure, op):
    container = f"no-such-container-{uuid.uuid4().hex[:6]}"
    message = _failure(AzureBackend(f"az://{container}/p"), op)
    assert f"container {container!r} does not exist" in message
    assert azure.endpoint in message and "worker" in message


def test_a_missing_key_in_an_existing_bucket_is_no_error(gcs, azure):
    for backend in (
        GCSBackend(f"gs://{gcs.bucket}/{uuid.uuid4().hex}"),
        AzureBackend(f"az://{azure.bucket}/{uuid.uuid4().hex}"),
    ):
        assert backend.read("k") is None and backend.list("") == []
        assert not backend.exists("k")


# -- credentials -----------------------------------------------------------------------


@pytest.mark.parametrize("op", OPERATIONS)
def test_azure_wrong_key(azure, monkeypatch, op):
    wrong = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk="
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure.connection_string(wrong))
    message = _failure(AzureBackend(f"az://{azure.bucket}/p"), op)
    assert "refused the credentials" in message and "AccountKey" in message
    assert "AZURE_STORAGE_CONNECTION_STRING" in message and "worker" in message


@pytest.mark.parametrize("op", OPERATIONS)
def test_azure_no_credentials(azure, monkeypatch, op):
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    message = _failure(AzureBackend(f"az://{azure.bucket}/p"), op)
    assert "no Azure credentials" in message and "AZURE_STORAGE_ACCOUNT_KEY" in message


@pytest.mark.parametrize("value", ["", "garbage"])
def test_azure_malformed_connection_string(azure, monkeypatch, value):
    """azure-storage-blob's ValueError ("Connection string is either blank or
    malformed") reached the user as it was, with its type and no remedy."""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", value)
    message = _failure(AzureBackend(f"az://{azure.bucket}/p"), "read")
    assert "AZURE_STORAGE_CONNECTION_STRING is empty or malformed" in message, message
    assert "AccountKey=" in message and "ValueError" not in message, message


def test_gcs_refused_credentials_and_denials(monkeypatch, tmp_path):
    """fake-gcs-server takes any caller: the errors gcsfs raises for GCS's 401 and 403
    are made here."""
    from gcsfs.retry import HttpError

    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    b = GCSBackend("gs://bucket/p")
    unauthorized = HttpError({"code": 401, "message": "Invalid Credentials"})
    assert "refused the credentials" in b.describe_error(unauthorized)
    forbidden = OSError("Forbidden: b/bucket/o/p\nno storage.objects.get access")
    assert "access denied" in b.describe_error(forbidden)
    assert "'bucket'" in b.describe_error(forbidden)
    # gcsfs falls back to anonymous access when the key file is missing: say so
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    for exc in (unauthorized, forbidden):
        message = b.describe_error(exc)
        assert "GOOGLE_APPLICATION_CREDENTIALS names no file" in message
        assert str(tmp_path / "missing.json") in message
    assert b.describe_error(ValueError("x")) is None


# -- unreachable endpoints ------------------------------------------------------------


@pytest.mark.slow  # gcsfs's five resends wait 31 s
def test_gcs_unreachable_endpoint(monkeypatch):
    from s3server import free_port

    closed = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", closed)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    message = _failure(GCSBackend(f"gs://bucket-{uuid.uuid4().hex[:6]}/p"), "read")
    assert closed in message and "STORAGE_EMULATOR_HOST" in message


def test_azure_unreachable_endpoint(azure, monkeypatch):
    from azure.storage.blob._shared.policies_async import ExponentialRetry
    from s3server import free_port

    # the SDK's three resends as they are, without its waits (15, 18 and 24 s)
    monkeypatch.setattr(ExponentialRetry, "get_backoff_time", lambda self, settings: 0)

    closed = azure.endpoint.rsplit(":", 1)[0] + f":{free_port()}"
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING", azure.connection_string().replace(azure.endpoint, closed)
    )
    message = _failure(AzureBackend(f"az://{azure.bucket}/p"), "read")
    assert closed in message and "AZURE_STORAGE_CONNECTION_STRING" in message


# -- create after an ambiguous outcome -----------------------------------------------------


def test_create_is_true_when_the_object_already_holds_its_own_bytes(gcs, azure):
    """A create whose first request landed but whose reply was lost is resent by the
    client and refused (412 on GCS, 409 on Azure): the object is read back, and the
    create is True if it holds exactly the bytes written, False otherwise."""
    for backend in (
        GCSBackend(f"gs://{gcs.bucket}/{uuid.uuid4().hex}"),
        AzureBackend(f"az://{azure.bucket}/{uuid.uuid4().hex}"),
    ):
        backend.put("k", b"mine")  # as if the first request had landed
        assert backend.create("k", b"mine") is True
        assert backend.create("k", b"theirs") is False
        assert backend.read("k") == b"mine"
        backend.remove_tree("")


def test_gs_and_az_aliases_name_one_store():
    from slem_dask.storage.backends.paths import canonical

    assert canonical("gcs://b/x.zarr/") == canonical("gs://b/x.zarr")
    assert (
        canonical("abfs://c/x.zarr")
        == canonical("abfss://c/./x.zarr")
        == canonical("az://c/x.zarr")
    )


def test_gcs_refuses_to_commit_on_a_zonal_bucket(gcs, monkeypatch):
    """On a zonal bucket gcsfs's create-only upload overwrites (gcsfs 2026.10): the
    backend says it cannot create atomically, and its create refuses to write."""
    from slem_dask.storage.backends.backend import StorageConfigError

    b = GCSBackend(f"gs://{gcs.bucket}/{uuid.uuid4().hex}")
    assert b.atomic_create  # the emulator's bucket is a standard one

    async def zonal(bucket):
        return True

    zb = GCSBackend(f"gs://{gcs.bucket}/{uuid.uuid4().hex}")
    monkeypatch.setattr(zb.fs, "_is_zonal_bucket", zonal, raising=False)
    assert not zb.atomic_create
    with pytest.raises(StorageConfigError, match="zonal bucket"):
        zb.create("k", b"x")
    assert zb.read("k") is None


def test_an_abfs_url_with_the_account_in_its_host(azure, monkeypatch):
    """abfss://container@account.dfs.core.windows.net/path: the container is the part
    before '@', the account the host's first label (as adlfs reads it)."""
    import pickle

    b = AzureBackend("abfss://data@myaccount.dfs.core.windows.net/x.zarr")
    assert (b.bucket, b.prefix) == ("data", "x.zarr")
    assert b.storage_options == {"account_name": "myaccount"}
    again = pickle.loads(pickle.dumps(b))
    assert (again.root, again.bucket, again.storage_options) == (
        b.root,
        "data",
        {"account_name": "myaccount"},
    )
    # on the emulator, whose account is devstoreaccount1
    local = AzureBackend(
        f"az://{azure.bucket}@devstoreaccount1.blob.core.windows.net/{uuid.uuid4().hex}",
        connection_string=azure.connection_string(),
    )
    local.put("k", b"v")
    assert local.read("k") == b"v" and local.create("k", b"w") is False
    local.remove_tree("")


def test_a_missing_client_package_is_one_line():
    gcs, az = GCSBackend("gs://b/p"), AzureBackend("az://c/p")
    for backend, package, extra in ((gcs, "gcsfs", "gcs"), (az, "adlfs", "azure")):
        try:  # as fsspec raises it for a protocol whose package is absent
            raise ImportError(f"Install {package} to access the store")
        except ImportError as exc:
            message = backend.describe_error(exc)
        assert package in message and f"slem-dask[{extra}]" in message
        assert backend.describe_error(ImportError("no module named numpy")) is None


def test_one_probe_scope_per_bucket_and_endpoint(gcs, azure):
    a, b = GCSBackend(f"gs://{gcs.bucket}/x"), GCSBackend(f"gs://{gcs.bucket}/y/z")
    assert a.probe_scope() == b.probe_scope() == f"bucket gs://{gcs.bucket} at {gcs.endpoint}"
    assert GCSBackend("gs://other/x").probe_scope() != a.probe_scope()
    assert (
        AzureBackend(f"az://{azure.bucket}/p")
        .probe_scope()
        .startswith(f"container az://{azure.bucket} at ")
    )
