"""A real multi-process LocalCluster gives the numpy results (marked ``cluster``: run with --slow).

One module-scoped cluster of 2 single-threaded worker processes serves every
test here. The tests at the bottom (cluster sizing) start nothing and always run.
"""

import os
import re
from types import SimpleNamespace

import dask.array as da
import numpy as np
import pytest
import zarr

from slem_dask import KernelSLEM, LinearSLEM, load_model, storage
from slem_dask.cluster.connect import default_local_cluster_kwargs
from slem_dask.storage.nodes.workers import listed_workers

D = 10


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    X = (rng.standard_normal((500, D)) * rng.uniform(0.5, 2, D) + 100.0).astype(np.float32)
    P = (rng.standard_normal((130, D)) + 100.0).astype(np.float32)
    return X, P


def write_array(path, data, chunk_rows):
    arr = zarr.create_array(
        store=str(path), shape=data.shape, dtype=data.dtype, chunks=(chunk_rows, data.shape[1])
    )
    arr[...] = data
    return str(path)


def _alignment_of_args(block, *args):
    return np.array([[a.flags.aligned for a in args]])


@pytest.mark.cluster
def test_a_workers_tasks_get_the_shared_model_arrays_aligned(client, monkeypatch):
    """distributed delivers a scattered array at any byte offset in its buffer (A^-1 at
    offsets 5 and 57 on two workers), and numpy's matmul then copies it whole on every
    call; the tasks of map_rows see aligned copies (parallel/blocks.aligned)."""
    from slem_dask.parallel import blocks

    monkeypatch.setattr(blocks, "SCATTER_BYTES", 0)  # scatter even these small arrays
    x = da.from_array(np.ones((40, 6), np.float32), chunks=(10, 6))
    args = (np.ones(6), np.ones((6, 6), np.float32), np.ones((5, 7)))
    seen = []
    with blocks.scatter_large_arrays(client):
        lazy = blocks.map_rows(
            _alignment_of_args, x, tuple(blocks.shared(a) for a in args), 3, bool, "X", "t"
        )
        seen.append(client.compute(lazy).result())
    assert seen[0].shape == (4, 3) and seen[0].all(), seen[0]


@pytest.mark.cluster
@pytest.mark.parametrize(
    "chunks,precision", [(7, "float64"), (64, "float64"), ((1, 200, 299), "float64"), (64, "auto")]
)
def test_fit_and_transform_on_processes_equal_numpy(client, data, chunks, precision):
    X, P = data
    want = LinearSLEM(lam=0.02, theta=3.0, precision="float64").fit(X)
    got = LinearSLEM(lam=0.02, theta=3.0, precision=precision).fit(
        da.from_array(X, chunks=(chunks, D))
    )
    Pd = da.from_array(P, chunks=(29, D))
    if (
        precision == "auto"
    ):  # float32 inside blocks: the 1e-5 contract (tests/parallel/test_precision.py)
        cov = want.covariance_
        assert np.abs(got.covariance_ - cov).max() <= 1e-5 * np.abs(cov).max()
        Z = client.compute(got.transform(Pd)).result()
        assert np.abs(Z - want.transform(P)).max() <= 1e-5
        return
    for name in ("mean_", "covariance_", "precision_"):
        a, b = getattr(got, name), getattr(want, name)
        assert np.linalg.norm(a - b) <= 1e-12 * np.linalg.norm(b), name
    Z = got.transform(Pd)
    assert Z.chunks == Pd.chunks
    np.testing.assert_allclose(
        client.compute(Z).result(), want.transform(P), rtol=1e-12, atol=1e-13
    )
    Z32 = client.compute(got.transform(Pd, dtype=np.float32)).result()
    assert Z32.dtype == np.float32
    np.testing.assert_allclose(Z32, want.transform(P), rtol=0, atol=1.5e-7)
    # both workers are still there (asked of the scheduler: client.scheduler_info()
    # once listed 0 of them under load, its cache overwritten by the periodic refresh)
    assert len(listed_workers(client)) == 2


@pytest.mark.cluster
def test_fit_job_and_encode_job_equal_the_library(client, data, tmp_path):
    from slem_dask.pipeline import encode_job, fit_job

    X, P = data
    negatives = write_array(tmp_path / "negatives.zarr", X, 40)
    positives = write_array(tmp_path / "positives.zarr", P, 16)
    model_path = str(tmp_path / "model.zarr")
    out = str(tmp_path / "codes.zarr")
    fit_job(
        client, negatives, model_path, lam=0.02, theta=3.0, partition_rows=80, precision="float64"
    )
    model = load_model(model_path)
    want = LinearSLEM(lam=0.02, theta=3.0, precision="float64").fit(X)
    for name in ("mean_", "covariance_", "precision_"):
        a, b = getattr(model, name), getattr(want, name)
        assert np.linalg.norm(a - b) <= 1e-12 * np.linalg.norm(b), name
    encode_job(client, model_path, positives, out, partition_rows=32)
    arr = storage.open_output(out)
    assert arr.dtype == np.float32
    np.testing.assert_allclose(arr[...], want.transform(P), rtol=0, atol=1.5e-7)
    meta = arr.attrs[storage.ATTR]
    # a fit job's model is named by its inputs and parameters (docs/numerics.md)
    assert meta["complete"] is True and meta["model_fingerprint"] == model.identity_
    encode_job(client, model_path, positives, out, dtype="float64", overwrite=True)
    np.testing.assert_allclose(
        storage.open_output(out)[...], want.transform(P, dtype=np.float64), rtol=1e-12, atol=1e-13
    )


@pytest.mark.cluster
def test_encode_job_failure_on_processes_leaves_no_output(client, data, tmp_path):
    from slem_dask.pipeline import encode_job

    X, P = data
    P = P.copy()
    P[[5, 100], 0] = np.nan
    positives = write_array(tmp_path / "positives.zarr", P, 8)
    model_path = str(tmp_path / "model.zarr")
    LinearSLEM().fit(X).save(model_path)
    with pytest.raises(ValueError, match=r"row\(s\) with NaN or inf"):
        encode_job(client, model_path, positives, str(tmp_path / "codes.zarr"), partition_rows=8)
    assert sorted(os.listdir(tmp_path)) == ["model.zarr", "positives.zarr"]


@pytest.mark.cluster
def test_jobs_send_large_model_arrays_to_the_workers_not_in_the_graph(client, tmp_path):
    # A 2 MiB encoding matrix (d = 724, float32) and E-SVM's negatives would ride in the
    # task graph through the scheduler; under a 1 MB warning threshold distributed says so.
    import time
    import warnings

    import dask

    from slem_dask.datasets import make_corpus, write_corpus
    from slem_dask.pipeline.evaluate import evaluate_job
    from slem_dask.pipeline import encode_job

    rng = np.random.default_rng(4)
    d = 724
    X = rng.standard_normal((1500, d)).astype(np.float32)
    P = rng.standard_normal((60, d)).astype(np.float32)
    model_path = str(tmp_path / "model.zarr")
    want = LinearSLEM(lam=0.1).fit(X)
    want.save(model_path)
    assert want.precision_.astype(np.float32).nbytes >= 2**20  # parallel.SCATTER_BYTES
    kernel_path = str(tmp_path / "kernel.zarr")
    kernel = KernelSLEM(kernel="rbf", gamma=1 / d, rank=200).fit(X)  # 1.2 MB of pivot rows
    kernel.save(kernel_path)
    positives = write_array(tmp_path / "positives.zarr", P, 20)
    corpus = str(tmp_path / "corpus.zarr")
    write_corpus(
        make_corpus(n_negatives=3000, n_instances=10, group_size=2, d=64, seed=1),
        corpus,
        chunk_rows=500,
    )
    with (
        dask.config.set({"distributed.admin.large-graph-warning-threshold": "1MB"}),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("error", message="Sending large graph")
        encode_job(client, model_path, positives, str(tmp_path / "codes.zarr"), partition_rows=20)
        encode_job(client, kernel_path, positives, str(tmp_path / "kcodes.zarr"), partition_rows=20)
        rows, _, _ = evaluate_job(client, corpus, methods="esvm")
    np.testing.assert_allclose(
        storage.open_output(str(tmp_path / "codes.zarr"))[...], want.transform(P), rtol=0, atol=2e-6
    )
    np.testing.assert_allclose(
        storage.open_output(str(tmp_path / "kcodes.zarr"))[...],
        kernel.transform(P),
        rtol=0,
        atol=1e-6,
    )
    assert 0 < rows[0]["mAP"] <= 1
    deadline = time.monotonic() + 60  # releases reach the scheduler asynchronously
    while client.who_has() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not client.who_has()  # the scattered arrays are released after each job


@pytest.mark.cluster
def test_a_scattered_model_survives_the_loss_of_a_worker(client):
    # Scattered data, unlike a task, cannot be computed again: every worker holds a copy,
    # so a worker killed before any task ran does not take the only one with it.
    import signal

    from slem_dask.parallel.blocks import encode_blocks, scatter_large_arrays, shared

    rng = np.random.default_rng(2)
    d = 600
    matrix = rng.standard_normal((d, d))
    mean = rng.standard_normal(d)
    P = rng.standard_normal((40, d))
    with scatter_large_arrays(client):
        shipped = shared(matrix)
        # Distributed's memory manager drops surplus replicas every 2 s; a loaded machine
        # let one of its cycles pass between the scatter and the kill, and the worker
        # killed held the last copy. Run a cycle here, so that every run sees one.
        client.amm.run_once()
        holders = client.who_has(shipped)[shipped.key]
        assert len(holders) == len(client.nthreads()) == 2
        pids = client.run(os.getpid)
        os.kill(pids[holders[0]], signal.SIGKILL)
        z = encode_blocks(da.from_array(P, chunks=(10, d)), mean, shipped, np.float64)
        got = client.compute(z).result(timeout=60)
    client.wait_for_workers(2, timeout=60)  # the nanny restarts it for the other tests
    want = encode_blocks(da.from_array(P, chunks=(10, d)), mean, matrix, np.float64)
    np.testing.assert_allclose(got, want.compute(scheduler="sync"), rtol=1e-12, atol=1e-15)


@pytest.mark.cluster
def test_a_local_clusters_model_is_scattered_straight_to_every_worker(client, monkeypatch):
    # the workers listen on loopback, so the array skips the scheduler (replicas.py)
    from slem_dask.parallel.replicas import PREFIX, scatter_everywhere

    seen = []
    real = type(client).scatter
    monkeypatch.setattr(
        type(client), "scatter", lambda self, *a, **k: seen.append(k) or real(self, *a, **k)
    )
    value = np.arange(300_000.0)
    future = scatter_everywhere(client, PREFIX + "straight-to-workers", value)
    assert seen == [{"broadcast": True, "direct": True}]
    assert len(client.who_has(future)[future.key]) == len(client.nthreads()) == 2
    np.testing.assert_array_equal(future.result(), value)


@pytest.mark.cluster
def test_fit_job_rejects_nonfinite_negatives_and_writes_nothing(client, data, tmp_path):
    from slem_dask.pipeline import fit_job

    X = data[0].copy()
    X[[0, 499], 3] = np.inf
    negatives = write_array(tmp_path / "negatives.zarr", X, 50)
    with pytest.raises(ValueError, match=r"2 row\(s\) with NaN or inf \(rows 0, 499\) out of 500"):
        fit_job(client, negatives, str(tmp_path / "model.zarr"))
    assert os.listdir(tmp_path) == ["negatives.zarr"]


@pytest.mark.cluster
def test_connect_limits_blas_threads_on_workers(client):
    from slem_dask.cluster.connect import connect

    with connect(client.scheduler.address) as c:

        def blas_threads():
            from threadpoolctl import threadpool_info

            return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

        per_worker = c.run(blas_threads)
    assert len(per_worker) == 2
    assert all(threads and set(threads) == {1} for threads in per_worker.values())


# -- sizing (no cluster started) -------------------------------------------------
def test_default_local_cluster_kwargs():
    cores = len(os.sched_getaffinity(0))
    kw = default_local_cluster_kwargs()
    assert (kw["n_workers"], kw["threads_per_worker"], kw["processes"]) == (cores, 1, True)
    assert default_local_cluster_kwargs(3, 2)["n_workers"] == 3
    assert default_local_cluster_kwargs(None, 2)["n_workers"] == max(1, cores // 2)


def test_auto_runs_linear_jobs_and_kernel_fits_in_this_process_whatever_their_size():
    from slem_dask.cluster.connect import SMALL_INPUT_BYTES, local_cluster_kind

    big = 100 * SMALL_INPUT_BYTES
    for job in ("linear fit", "linear encode", "linear fit and encode", "kernel fit"):
        processes, why = local_cluster_kind(job, big)
        assert not processes and "release the GIL" in why
    # other jobs: threads below the threshold only (not measured with threads)
    for job in ("kernel encode", "search", "evaluate"):
        assert local_cluster_kind(job, big)[0]
        assert local_cluster_kind(job, SMALL_INPUT_BYTES)[0]
        assert not local_cluster_kind(job, SMALL_INPUT_BYTES - 1)[0]
        assert local_cluster_kind(job, None) == (True, "input size not known before the run")
    # the reason names a small input's size as it is, not "0 MiB"
    assert local_cluster_kind("search", 2**18)[1].startswith("input 0.25 MiB < ")
    assert local_cluster_kind("search", 3 * 2**20)[1].startswith("input 3 MiB < ")
    assert local_cluster_kind("search", 600 * 2**20)[1] == "input 600 MiB >= 256 MiB"


def test_the_in_process_cluster_starts_no_dashboard():
    from slem_dask.cluster.connect import in_process_kwargs

    kw = in_process_kwargs()
    assert kw["processes"] is False and kw["dashboard_address"] is None
    assert kw["n_workers"] == 1 and kw["threads_per_worker"] == len(os.sched_getaffinity(0))


def test_local_cluster_threads_takes_workers_and_threads_per_worker():
    # --local-cluster threads --workers 2 ran one worker of a thread per core
    from slem_dask.cluster.connect import connect

    with connect(n_workers=2, threads_per_worker=3, processes=False) as client:
        assert sorted(client.nthreads().values()) == [3, 3]
    with connect(threads_per_worker=1, processes=False) as client:
        assert list(client.nthreads().values()) == [1]


def _in_process_refusal(monkeypatch, available: int, rows: int = 100_000):
    """What check_memory says of an in-process worker when this machine has ``available``
    bytes free, for encode tasks of ``rows`` x 512 float32 (None: nothing said)."""
    import psutil

    from slem_dask.cluster import workers
    from slem_dask.cluster.connect import connect

    per_row, fixed = workers.encode_task_bytes(None, rows, 512, "float32")
    plan = workers.Plan(
        "encode",
        "positives",
        rows,
        512,
        "float32",
        int(fixed + per_row * rows),
        per_row,
        fixed,
        1000,
    )
    real = psutil.virtual_memory()

    class Tight:
        total = real.total

    Tight.available = available if available is not None else real.available
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Tight)
    with connect(processes=False) as client:
        try:
            workers.check_memory(client, plan, 10)
        except workers.WorkerMemoryError as exc:
            return str(exc)
    return None


def test_an_in_process_worker_is_checked_against_the_memory_this_machine_has(monkeypatch):
    # No nanny restarts an in-process worker: past its memory the whole process is
    # killed. Its tasks are checked against what this process may still take.
    assert _in_process_refusal(monkeypatch, None) is None  # this machine has room for it
    said = _in_process_refusal(monkeypatch, 300 * 2**20)
    assert "runs in this process" in said and "--partition-rows" in said


@pytest.mark.parametrize(
    "available, fix",
    [
        (
            300 * 2**20,
            r"pass --partition-rows \d+ \(.*\), or free memory on this machine \(the "
            r"worker runs in this process\), or run on a cluster with more memory "
            r"\(--scheduler\)$",
        ),
        (
            2**20,
            r"even 1000 rows \(one chunk of the positives\) need about \d+ MiB per task: this "
            r"process needs about \d+ MiB: free memory on this machine \(the worker runs in "
            r"this process\), or run on a cluster with more memory \(--scheduler\), or store "
            r"the positives in smaller chunks$",
        ),
    ],
    ids=["smaller partitions", "no partition"],
)
def test_an_in_process_worker_is_told_a_remedy_that_applies_in_process(monkeypatch, available, fix):
    said = _in_process_refusal(monkeypatch, available)
    assert "--memory-limit" not in said and "fewer threads" not in said, said
    assert re.search(fix, said), said


def test_the_in_process_cluster_binds_no_fixed_port(caplog):
    """Another Dask on port 8787 must not make every in-process command warn (distributed
    binds the scheduler's HTTP server to 8787 unless told otherwise)."""
    import socket
    import warnings

    from distributed import LocalCluster

    from slem_dask.cluster.connect import in_process_kwargs

    holder = socket.socket()
    try:
        holder.bind(("", 8787))
        holder.listen()
    except OSError:
        pass  # something else already holds it: the same situation
    try:
        with warnings.catch_warnings(record=True) as caught, caplog.at_level("WARNING"):
            warnings.simplefilter("always")
            with LocalCluster(**in_process_kwargs()):
                pass
        said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
        assert not [m for m in said if "already in use" in m], said
    finally:
        holder.close()


# -- a worker that leaves while the workers are checked before a job (issue 31) ---------------
def test_a_worker_that_leaves_during_the_checks_before_a_job_is_dropped(tmp_path, monkeypatch):
    """The scheduler asks the workers it lists; one of them leaves before it answers
    (distributed's "Address removed.", or a connection that times out): the job runs on
    the workers that remain instead of failing with that text."""
    import dask
    from distributed import Client, LocalCluster

    from slem_dask import pipeline

    rng = np.random.default_rng(3)
    write_array(tmp_path / "neg.zarr", rng.standard_normal((300, D)).astype(np.float32), 50)
    with (
        dask.config.set({"distributed.comm.timeouts.connect": "2s"}),
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            memory_limit=0,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        run, left = client.run, []

        def run_after_one_left(function, *args, workers=None, **kw):
            listed = workers or list(listed_workers(client))
            if not left:  # the first check: one worker leaves after the list was taken
                left.append(listed[0])
                name = next(k for k, w in cluster.workers.items() if w.worker_address == listed[0])
                cluster.sync(cluster.workers[name].close)
            return run(function, *args, workers=listed, **kw)

        monkeypatch.setattr(client, "run", run_after_one_left)
        report = pipeline.fit_job(client, str(tmp_path / "neg.zarr"), str(tmp_path / "m.zarr"))
        assert left and left[0] not in listed_workers(client)
    assert report.facts["rows read"] == 300
    assert load_model(str(tmp_path / "m.zarr")).n_features_in_ == D


class _Cluster:
    """A client whose scheduler lists ``rounds[i]`` after the i-th run, and whose run
    answers ``answer(address)`` for each worker asked (an exception: it did not)."""

    def __init__(self, first, rounds, answer):
        self.listed, self.rounds, self.answer, self.asked = first, list(rounds), answer, []

    @property
    def scheduler(self):  # what listed_workers asks: the scheduler's identity
        return SimpleNamespace(
            identity=lambda n_workers: {"workers": dict.fromkeys(self.listed, {})}
        )

    def sync(self, function, *args, **kwargs):
        return function(*args, **kwargs)

    def run(self, function, *args, workers=None, on_error="raise"):
        assert on_error == "return"
        self.asked.append(list(workers))
        if self.rounds:
            self.listed = self.rounds.pop(0)
        return {a: self.answer(a) for a in workers}


def test_asking_the_workers_drops_one_that_left_and_asks_one_that_joined():
    from distributed.comm.core import CommClosedError

    from slem_dask.storage.nodes.workers import ask_workers

    def answer(a):
        return CommClosedError("Address removed.") if a == "b" else a.upper()

    fake = _Cluster(["a", "b"], [["a", "c"], ["a", "c"]], answer)
    assert ask_workers(fake, print) == {"a": "A", "c": "C"}
    assert fake.asked == [["a", "b"], ["c"]]
    fake = _Cluster(["a", "b"], [["a", "c"]], answer)  # only the workers named are asked
    assert ask_workers(fake, print, workers=["a", "b"]) == {"a": "A"}


def test_a_worker_that_answers_in_the_last_round_or_joins_during_it_is_no_error():
    """The rounds end with every worker asked answering: a worker that failed to answer
    twice answers the third time, or workers keep joining (a cluster scaling up). The
    answers are returned (a bare StopIteration was raised)."""
    from slem_dask.storage.nodes.workers import ask_workers

    slow = []

    def answer(a):
        if a == "b" and len(slow) < 2:
            slow.append(a)
            return OSError("Timed out trying to connect to b")
        return a.upper()

    for workers in (None, ["a", "b"]):
        slow.clear()
        fake = _Cluster(["a", "b"], [], answer)
        assert ask_workers(fake, print, workers=workers) == {"a": "A", "b": "B"}
        assert fake.asked == [["a", "b"], ["b"], ["b"]]
    fake = _Cluster(["a"], [["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d"]], str.upper)
    assert ask_workers(fake, print) == {"a": "A", "b": "B", "c": "C"}
    assert fake.asked == [["a"], ["b"], ["c"]]  # d joined after the last round


def test_a_listed_worker_that_never_answers_the_checks_fails_the_job_in_one_line():
    from slem_dask.storage.nodes.workers import WorkerLeftError, ask_workers

    fake = _Cluster(
        ["a", "b"], [], lambda a: OSError("Timed out trying to connect to b") if a == "b" else 1
    )
    with pytest.raises(WorkerLeftError) as info:
        ask_workers(fake, print, what="the check of the workers' memory")
    assert fake.asked == [["a", "b"], ["b"], ["b"]]  # asked again, then given up
    assert str(info.value) == (
        "worker b stopped answering during the check of the workers' memory (OSError: Timed "
        "out trying to connect to b) while still listed by the scheduler, so it is leaving or "
        "stuck; the job stopped before its tasks ran: run the same command again (it checks "
        "the workers that are there then)"
    )
    fake = _Cluster(["a"], [], lambda a: ValueError("bad input"))  # the check's own error
    with pytest.raises(ValueError, match="bad input"):
        ask_workers(fake, print)


def test_a_worker_that_leaves_while_connect_sets_up_the_workers_is_not_the_commands_end(
    monkeypatch,
):
    """connect(ADDRESS) registers the BLAS plugin; the scheduler's broadcast of it fails
    with "Address removed." when a worker leaves meanwhile: it is sent again while the
    scheduler answers, and a worker that never takes it is said in one line."""
    from distributed import Client, LocalCluster
    from distributed.comm.core import CommClosedError

    from slem_dask.cluster.connect import connect

    real, calls = Client.register_plugin, []

    def leaving_once(self, plugin, *args, **kwargs):
        calls.append(plugin)
        if len(calls) == 1 or fail_always:
            raise CommClosedError("Address removed.")
        return real(self, plugin, *args, **kwargs)

    monkeypatch.setattr(Client, "register_plugin", leaving_once)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, memory_limit=0, dashboard_address=":0"
    ) as cluster:
        fail_always = False
        with connect(cluster.scheduler_address) as c:
            plugins = c.run(lambda dask_worker: sorted(dask_worker.plugins))
        assert len(calls) == 2 and len(plugins) == 2
        assert all("slem-dask-single-threaded-blas" in names for names in plugins.values())
        fail_always, calls[:] = True, []
        with pytest.raises(ConnectionError) as info:
            with connect(cluster.scheduler_address):
                pass
    assert len(calls) == 3 and str(info.value) == (
        "a worker failed 3 times to take slem-dask's set-up while the scheduler answers "
        "(CommClosedError: Address removed.); no job started: run the same command again "
        "once the cluster's workers are steady"
    )


def test_joining_an_in_process_cluster_gives_the_caller_its_blas_threads_back():
    """connect(ADDRESS) limits every worker's BLAS to one thread; workers in the caller's
    own process share the caller's BLAS, which stayed on one thread for the rest of the
    process (every later numpy product of the caller single-threaded, and a later
    in-process transform's last bits those of one thread)."""
    from distributed import LocalCluster
    from threadpoolctl import threadpool_info

    from slem_dask.cluster.connect import connect

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = blas_threads()
    if max(before) < 2:
        pytest.skip(f"BLAS runs on one thread here ({before}): nothing to give back")
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with connect(cluster.scheduler_address) as client:
            in_workers = client.run(blas_threads)
    assert all(n == 1 for threads in in_workers.values() for n in threads)
    assert blas_threads() == before


def _profiling(client) -> list[bool]:
    """Whether each worker keeps dask's statistical profile of its tasks."""
    return sorted(
        client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks).values()
    )


def test_a_local_cluster_keeps_no_task_profile_unless_asked():
    # Every 10 ms while a task ran, the worker walked the task threads' stacks on the
    # event loop an in-process cluster shares with its scheduler and client; nothing
    # of slem-dask reads that profile. A performance report shows it: asked, it is kept.
    from slem_dask.cluster.connect import connect

    with connect(processes=False) as client:
        assert _profiling(client) == [False]
    with connect(processes=False, task_profile=True) as client:
        assert _profiling(client) == [True]


def _imported_pipeline() -> bool:
    import sys

    return "slem_dask.pipeline" in sys.modules


@pytest.mark.cluster
def test_a_local_clusters_workers_import_the_tasks_code_as_they_start():
    # imported by the first task instead, it was 3 of the demo's first fit's 3.3 s of
    # "open": the cluster's start-up, which the command reports apart; a user's own
    # preload is kept beside it
    import dask

    from slem_dask.cluster.connect import connect

    with dask.config.set({"distributed.worker.preload": ["json"]}):
        with connect(n_workers=1, processes=True) as client:
            imported = client.run(_imported_pipeline)
            preload = client.run(
                lambda: __import__("dask").config.get("distributed.worker.preload")
            )
        assert dask.config.get("distributed.worker.preload") == ["json"]  # as it was
    assert list(imported.values()) == [True]
    assert list(preload.values()) == [["json", "slem_dask.pipeline"]]
