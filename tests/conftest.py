import os
import sys

import numpy as np
import pytest

# The test files sit in sub-folders mirroring the package (tests/core/, tests/storage/...);
# the support modules (helpers, reference, s3server, sim...) stay here and are imported
# by their bare names from every sub-folder, whatever pytest's import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_addoption(parser):
    parser.addoption(
        "--slow",
        action="store_true",
        default=False,
        help="also run the tests marked slow or cluster",
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow or multi-process cluster test: run with --slow")
    for item in items:
        # markers, not keywords: every test under tests/cluster/ has the keyword "cluster"
        if item.get_closest_marker("slow") or item.get_closest_marker("cluster"):
            item.add_marker(skip)


#: seeds of the simulation's sweeps (tests/sim/): CI's whole suite (--slow) runs the
#: issue's 10,000; the fast suite a fifth, to stay well under 10 minutes on 2 cores
SIM_SEEDS = {"slow": 10_000, "fast": 2_000}
#: seeds of each garbage-bound sweep (longer runs each: rollbacks and kills)
SIM_GARBAGE_SEEDS = {"slow": 2_000, "fast": 400}


def _sim_count(config, variable: str, defaults: dict) -> int:
    """``variable`` from the environment if set, else the default of this suite."""
    if os.environ.get(variable):
        return int(os.environ[variable])
    return defaults["slow" if config.getoption("--slow") else "fast"]


@pytest.fixture(scope="session")
def sim_seeds(request) -> int:
    """Seeds shared by the sweeps of one simulation test: ``SLEM_SIM_SEEDS``, else
    10,000 with --slow and 2,000 without."""
    return _sim_count(request.config, "SLEM_SIM_SEEDS", SIM_SEEDS)


@pytest.fixture(scope="session")
def sim_garbage_seeds(request) -> int:
    """Seeds of each garbage-bound sweep: ``SLEM_SIM_XFAIL_SEEDS``, else 2,000 with
    --slow and 400 without."""
    return _sim_count(request.config, "SLEM_SIM_XFAIL_SEEDS", SIM_GARBAGE_SEEDS)


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def corpus(tmp_path):
    """Negatives, two sets of positives and a linear model fitted on the negatives
    (helpers.small_corpus); a module that wants other rows defines its own."""
    from helpers import small_corpus

    return small_corpus(tmp_path, seed=5)


# -- object stores on 127.0.0.1, one per session, started on first use: real S3 servers
# (tests/s3server.py), Google Cloud Storage and Azure Blob emulators (tests/emulators.py)


def _session_server(name, module, kind, required_in_ci=False, env=None):
    """The session fixture ``name``: the ``kind`` server of tests/``module``.py, started
    on first use and stopped after the session; skipped where it cannot run here (failed
    under CI where ``required_in_ci``: .ci/run installs it, so a skip would hide a gap)."""

    @pytest.fixture(scope="session", name=name)
    def server_fixture():
        import importlib

        import s3server

        for variable, value in (env or {}).items():
            os.environ.setdefault(variable, value)
        try:
            server = importlib.import_module(module).STARTERS[kind]()
        except s3server.Unavailable as exc:
            if required_in_ci and os.environ.get("CI"):
                pytest.fail(f"{exc} (CI is set: .ci/run should have installed it)")
            pytest.skip(str(exc))
        print(f"\n{server.name} up in {server.started_in:.2f} s at {server.endpoint}")
        yield server
        server.stop()

    return server_fixture


# gcsfs reads it when first imported (by any test): else each of its clients asks the
# emulator over gRPC, which it does not serve, and waits 60 s (tests/emulators.py)
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

seaweedfs_server = _session_server("seaweedfs_server", "s3server", "seaweedfs")
moto_server = _session_server("moto_server", "s3server", "moto")
gcs_emulator = _session_server(
    "gcs_emulator", "emulators", "gcs", required_in_ci=True, env={"NO_GCE_CHECK": "true"}
)  # no metadata server to wait for
azure_emulator = _session_server("azure_emulator", "emulators", "azure", required_in_ci=True)


@pytest.fixture
def s3_server(request, monkeypatch):
    """The S3 server named by the test's parameter (``seaweedfs`` unless
    parametrized indirectly), with its variables set for this test only."""
    kind = getattr(request, "param", "seaweedfs")
    server = request.getfixturevalue(f"{kind}_server")
    use_server(server, monkeypatch)
    yield server
    _forget_s3_clients()


def use_server(server, monkeypatch):
    """Point this test's clients at ``server`` (S3, GCS or Azure emulator): its variables
    set, the caller's own AWS profile and endpoint unset, fsspec's cached clients gone."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL_S3",
        "AWS_REGION",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    _forget_s3_clients()  # fsspec caches clients by arguments, not by the environment


def _forget_s3_clients():
    try:
        import s3fs
    except ImportError:
        return
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def scheduler():
    """An in-process cluster's address, for command-line tests (``--scheduler``)."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
    ) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
def client():
    """A client of an in-process cluster (one worker, two threads), for jobs run through
    the library or, at ``client.scheduler.address``, the command line."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture
def no_scheduler_env(monkeypatch):
    """A DASK_SCHEDULER_ADDRESS in the caller's shell must not send the command line's
    jobs to another cluster (modules opt in with ``pytestmark``)."""
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
