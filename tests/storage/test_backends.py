"""The Backend contract (slem_dask/storage/backends/backend.py), run against every backend:
a local folder, memory://, S3 on two real servers on 127.0.0.1 (SeaweedFS's
`weed` and moto's server, tests/s3server.py), Google Cloud Storage on fake-gcs-server
and Azure Blob on Azurite (tests/emulators.py)."""

import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import time
import uuid

import pytest

from slem_dask.storage.backends.azure import AzureBackend
from slem_dask.storage.backends.registry import backend_for
from slem_dask.storage.backends.fsspec_backend import FsspecBackend
from slem_dask.storage.backends.gcs import GCSBackend
from slem_dask.storage.backends.local import LocalBackend
from slem_dask.storage.backends.s3 import S3Backend

S3_KINDS = ["seaweedfs", "moto"]
EMULATED = {"gcs": ("gs", GCSBackend), "azure": ("az", AzureBackend)}
KINDS = ["local", "memory", *(f"s3-{k}" for k in S3_KINDS), *EMULATED]


def _make(kind, request, tmp_path):
    if kind == "local":
        return backend_for(f"file://{tmp_path / 'root'}")
    if kind == "memory":
        return backend_for(f"memory://slem-{uuid.uuid4().hex}")
    if kind in EMULATED:
        server = request.getfixturevalue(f"{kind}_emulator")
    else:
        server = request.getfixturevalue(f"{kind[3:]}_server")
    mp = request.getfixturevalue("monkeypatch")
    for name, value in server.env().items():
        mp.setenv(name, value)
    protocol = EMULATED[kind][0] if kind in EMULATED else "s3"
    return backend_for(f"{protocol}://{server.bucket}/{uuid.uuid4().hex}")


@pytest.fixture(params=KINDS)
def backend(request, tmp_path):
    b = _make(request.param, request, tmp_path)
    yield b
    b.remove_tree("")


# -- plain operations --------------------------------------------------------------------


def test_backend_for_picks_the_backend_of_the_url(backend, request):
    kind = request.node.callspec.params["backend"]
    expected = {
        "local": LocalBackend,
        "memory": FsspecBackend,
        **{k: cls for k, (_, cls) in EMULATED.items()},
    }.get(kind, S3Backend)
    assert type(backend) is expected


def test_read_and_put(backend):
    assert backend.read("a/b/c") is None
    backend.put("a/b/c", b"one")
    assert backend.read("a/b/c") == b"one"
    backend.put("a/b/c", b"two")  # put replaces
    assert backend.read("a/b/c") == b"two"
    assert backend.read("a/b") is None  # a folder is not an object
    backend.put("top", b"")
    assert backend.read("top") == b""


def test_create_is_create_if_absent(backend):
    assert backend.create("m/key", b"first") is True
    assert backend.create("m/key", b"second") is False
    assert backend.read("m/key") == b"first"
    backend.put("m/other", b"put")
    assert backend.create("m/other", b"create") is False
    assert backend.read("m/other") == b"put"
    backend.delete("m/key")
    assert backend.create("m/key", b"third") is True  # absent again
    assert backend.read("m/key") == b"third"


def test_list_is_one_level_and_sorted(backend):
    for key in ["d/z", "d/a", "d/b/c", "d/b/e", "d-x/y", "dx"]:
        backend.put(key, b".")
    assert backend.list("d") == ["a", "b", "z"]
    assert backend.list("d/") == ["a", "b", "z"]
    assert backend.list("d/b") == ["c", "e"]
    assert backend.list("") == ["d", "d-x", "dx"]
    assert backend.list("missing") == []
    assert backend.list("dx") == []  # an object, not a folder
    backend.put("d/new", b".")  # a listing is never stale
    assert backend.list("d") == ["a", "b", "new", "z"]


def test_exists(backend):
    backend.put("f/obj", b".")
    backend.put("ab", b".")
    assert backend.exists("f/obj")
    assert backend.exists("f")  # a non-empty folder
    assert not backend.exists("f/missing")
    assert not backend.exists("a")  # a prefix of a name is not a folder
    assert not backend.exists("missing/deeper")
    backend.delete("f/obj")
    assert not backend.exists("f")


def test_delete(backend):
    backend.put("x/y", b".")
    backend.delete("x/y")
    assert backend.read("x/y") is None
    backend.delete("x/y")  # absent: no error
    backend.delete("never/was")


def test_remove_tree(backend):
    for key in ["t/a", "t/b/c", "t/b/d/e", "tx/y", "t-z"]:
        backend.put(key, b".")
    backend.remove_tree("t")
    assert backend.list("t") == [] and not backend.exists("t")
    assert backend.read("tx/y") == b"." and backend.read("t-z") == b"."
    backend.remove_tree("t")  # nothing there: no error
    backend.remove_tree("missing")
    backend.remove_tree("t-z")  # one object
    assert backend.read("t-z") is None
    backend.put("e/f/g", b".")
    backend.delete("e/f/g")  # may leave empty folders (a local disk, SeaweedFS)
    backend.remove_tree("e")
    assert backend.list("") == ["tx"]


def test_copy_tree(backend):
    backend.put("src/a", b"A")
    backend.put("src/b/c", b"C")
    backend.put("src/half.tmp", b"private")  # a writer's temporary: not copied
    backend.copy_tree("src", "dst")
    assert backend.read("dst/a") == b"A" and backend.read("dst/b/c") == b"C"
    assert backend.list("dst") == ["a", "b"]
    backend.copy_tree("src", "some", names=["b/c"])
    assert backend.list("some") == ["b"] and backend.read("some/b/c") == b"C"
    with pytest.raises(FileNotFoundError):
        backend.copy_tree("src", "other", names=["not-there"])


def test_copy_tree_is_isolated_from_later_writes(backend):
    backend.put("v1/chunk", b"old")
    backend.put("v1/meta", b"m")
    backend.copy_tree("v1", "v2")
    backend.put("v1/chunk", b"new")
    backend.delete("v1/meta")
    assert backend.read("v2/chunk") == b"old"
    assert backend.read("v2/meta") == b"m"
    backend.put("v2/chunk", b"v2's")
    assert backend.read("v1/chunk") == b"new"


def test_a_backend_survives_pickling(backend):
    backend.put("p", b"pickled")
    again = pickle.loads(pickle.dumps(backend))
    assert again.root == backend.root and again.read("p") == b"pickled"


# -- racing creates ----------------------------------------------------------------------


def _race_threads(backend, key, n):
    barrier = threading.Barrier(n)
    results = [None] * n

    def run(i):
        barrier.wait(timeout=60)
        results[i] = backend.create(key, f"writer {i}".encode())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def _check_one_winner(backend, key, results):
    winners = [i for i, r in enumerate(results) if r is True]
    assert len(winners) == 1 and all(r is False for r in results if r is not True), results
    assert backend.read(key) == f"writer {winners[0]}".encode()


# On S3, 20 trials by threads take ~45 s on SeaweedFS (it makes racing conditional
# PUTs to one key wait for each other, ~1 s each): by default 3, all 20 with --slow
def _trials(request, kind):
    return 3 if kind.startswith("s3") and not request.config.getoption("--slow") else 20


def test_racing_creates_from_threads_make_one_winner(backend, request, monkeypatch):
    kind = request.node.callspec.params["backend"]
    if kind == "memory":  # widen the gap between check and write, which the lock closes
        exists = backend.fs.exists

        def slow_exists(path, **kwargs):
            found = exists(path, **kwargs)
            time.sleep(0.002)
            return found

        monkeypatch.setattr(backend.fs, "exists", slow_exists)
    for trial in range(_trials(request, kind)):
        key = f"race/{trial}"
        _check_one_winner(backend, key, _race_threads(backend, key, 6))


_RACER = {}


def _init_racer(barrier, backend):
    _RACER.update(barrier=barrier, backend=backend)


def _race(args):
    key, i = args
    _RACER["barrier"].wait(timeout=60)
    return _RACER["backend"].create(key, f"writer {i}".encode())


def test_racing_creates_from_processes_make_one_winner(backend, request):
    kind = request.node.callspec.params["backend"]
    if kind == "memory":
        pytest.skip("memory:// lives in one process")
    n = 4
    # spawn, not fork: the parent runs s3fs's event-loop thread
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    with ctx.Pool(n, initializer=_init_racer, initargs=(barrier, backend)) as pool:
        for trial in range(_trials(request, kind)):
            key = f"race/{trial}"
            # each racer blocks at the barrier, so the n tasks go to n processes
            results = pool.map(_race, [(key, i) for i in range(n)], chunksize=1)
            _check_one_winner(backend, key, results)


# -- S3: create's handling of 409 and of a 412 after a resend (a stub client) ------------


class _StubClient:
    def __init__(self, outcomes):
        self.outcomes, self.calls = list(outcomes), 0

    async def put_object(self, **kwargs):
        assert kwargs["IfNoneMatch"] == "*"
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def _client_error(code, status, retries=0):
    from botocore.exceptions import ClientError

    return ClientError(
        {
            "Error": {"Code": code, "Message": code},
            "ResponseMetadata": {"HTTPStatusCode": status, "RetryAttempts": retries},
        },
        "PutObject",
    )


@pytest.fixture
def stubbed_s3(monkeypatch):
    """An S3Backend whose client is a stub (a private file system: the endpoint is
    never contacted) and whose key holds ``state["held"]``."""
    import slem_dask.storage.backends.s3 as s3

    monkeypatch.setattr(s3, "_CONFLICT_BACKOFF", 0.0)
    b = S3Backend("s3://bucket/p", endpoint_url=f"http://127.0.0.1:9/{uuid.uuid4().hex}")
    state = {"held": None, "client": None}

    async def set_session(*a, **k):
        return state["client"]

    async def get_s3(*a, **k):
        return state["client"]

    async def held(key):
        return state["held"]

    monkeypatch.setattr(b.fs, "set_session", set_session)
    monkeypatch.setattr(b.fs, "get_s3", get_s3)
    monkeypatch.setattr(b, "_held", held)

    def run(outcomes, held=None):
        state["client"], state["held"] = _StubClient(outcomes), held
        return b.create("k", b"mine"), state["client"].calls

    return run


def test_s3_create_retries_a_409_conflict(stubbed_s3):
    conflict = _client_error("ConditionalRequestConflict", 409)
    assert stubbed_s3([conflict, conflict, {}]) == (True, 3)


def test_s3_create_after_409s_is_false_only_if_the_key_then_exists(stubbed_s3):
    conflicts = [_client_error("ConditionalRequestConflict", 409) for _ in range(6)]
    assert stubbed_s3(conflicts, held=b"theirs") == (False, 6)
    with pytest.raises(OSError):
        stubbed_s3(conflicts)


def test_s3_create_412_is_false_and_412_after_a_resend_reads_the_key(stubbed_s3):
    # SeaweedFS's 412: no Condition field, which s3fs would turn into OSError(EINVAL)
    assert stubbed_s3([_client_error("PreconditionFailed", 412)]) == (False, 1)
    resent = _client_error("PreconditionFailed", 412, retries=1)
    assert stubbed_s3([resent], held=b"mine") == (True, 1)  # our first attempt landed
    assert stubbed_s3([resent], held=b"theirs") == (False, 1)


def test_s3_create_raises_other_errors(stubbed_s3):
    with pytest.raises(PermissionError):
        stubbed_s3([_client_error("AccessDenied", 403)])
    with pytest.raises(OSError):
        stubbed_s3([_client_error("InternalError", 500)])


def test_precondition_is_read_from_the_botocore_error_not_from_any_oserror():
    import errno

    from slem_dask.storage.backends.s3 import _precondition_failed

    translated = OSError(
        errno.EINVAL, "At least one of the pre-conditions you specified did not hold"
    )
    translated.__cause__ = _client_error("PreconditionFailed", 412)
    assert _precondition_failed(translated)
    assert not _precondition_failed(OSError(errno.EINVAL, "Invalid argument"))
    bad_request = OSError(errno.EINVAL, "bad")
    bad_request.__cause__ = _client_error("InvalidArgument", 400)
    assert not _precondition_failed(bad_request)


# -- S3: the variables the README names, each in a fresh process -------------------------

_CLIENT = """
import sys
from slem_dask.storage.backends.azure import AzureBackend
from slem_dask.storage.backends.registry import backend_for
b = backend_for(sys.argv[1])
b.put("env/probe", b"seen")
assert b.read("env/probe") == b"seen"
print("ok")
"""


@pytest.mark.slow  # ten fresh Pythons importing slem-dask and s3fs: ~20 s on 2 cores
def test_the_endpoint_and_addressing_variables_are_honoured(seaweedfs_server, tmp_path):
    s = seaweedfs_server
    local = s.endpoint.replace("127.0.0.1", "localhost")
    path_style = '{"config_kwargs": {"s3": {"addressing_style": "path"}}}'
    virtual = (
        '{"config_kwargs": {"s3": {"addressing_style": "virtual"}, '
        '"retries": {"max_attempts": 1}}}'
    )  # fail fast
    aws_config = tmp_path / "aws-config"
    aws_config.write_text("[default]\nregion = us-east-1\ns3 =\n    addressing_style = path\n")
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[slem]\naws_access_key_id = {s.key}\naws_secret_access_key = {s.secret}\n"
    )
    profile = {
        "AWS_PROFILE": "slem",
        "AWS_SHARED_CREDENTIALS_FILE": str(credentials),
        "AWS_ACCESS_KEY_ID": None,
        "AWS_SECRET_ACCESS_KEY": None,
    }
    cases = {  # name: (variables, whether the client reaches the bucket)
        "AWS_ENDPOINT_URL": ({"AWS_ENDPOINT_URL": s.endpoint}, True),
        "AWS_ENDPOINT_URL_S3": ({"AWS_ENDPOINT_URL_S3": s.endpoint}, True),
        "FSSPEC_S3_ENDPOINT_URL": ({"FSSPEC_S3_ENDPOINT_URL": s.endpoint}, True),
        "FSSPEC_S3_KEY/SECRET": (
            {
                "FSSPEC_S3_ENDPOINT_URL": s.endpoint,
                "FSSPEC_S3_KEY": s.key,
                "FSSPEC_S3_SECRET": s.secret,
                "AWS_ACCESS_KEY_ID": None,
                "AWS_SECRET_ACCESS_KEY": None,
            },
            True,
        ),
        "AWS_PROFILE": ({"AWS_ENDPOINT_URL": s.endpoint, **profile}, True),
        "wrong AWS_PROFILE": (
            {"AWS_ENDPOINT_URL": s.endpoint, **profile, "AWS_PROFILE": "other"},
            False,
        ),
        # with a host name, the addressing style decides: bucket.localhost does not resolve
        "host name, default style": ({"AWS_ENDPOINT_URL": local}, True),
        "FSSPEC_S3 path": ({"AWS_ENDPOINT_URL": local, "FSSPEC_S3": path_style}, True),
        "FSSPEC_S3 virtual": ({"AWS_ENDPOINT_URL": local, "FSSPEC_S3": virtual}, False),
        "AWS_CONFIG_FILE path": (
            {"AWS_ENDPOINT_URL": local, "AWS_CONFIG_FILE": str(aws_config)},
            True,
        ),
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_"))} | s.env()
    del base["AWS_ENDPOINT_URL"]
    url = f"s3://{s.bucket}/{uuid.uuid4().hex}"
    procs = {}
    for name, (variables, _) in cases.items():
        env = {**base, **variables}
        env = {k: v for k, v in env.items() if v is not None}
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", _CLIENT, url],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    outcomes = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        outcomes[name] = (proc.returncode == 0 and out.strip().endswith("ok"), out[-300:])
    for name, (_, reaches) in cases.items():
        assert outcomes[name][0] is reaches, (name, outcomes[name][1])
    S3Backend(url, endpoint_url=s.endpoint, key=s.key, secret=s.secret).remove_tree("")
