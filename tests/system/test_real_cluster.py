"""The command line against a real `dask scheduler` and two `dask worker` processes on
127.0.0.1, started in another working directory than the client: fault tolerance (a
worker, the client or the scheduler killed), resume, concurrency, relative paths, a
worker that does not see the storage, a full disk."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from helpers import (
    can_unshare_mounts,
    head,
    local_worker_args,
    start_dask,
    start_local_scheduler,
    wait_for_workers,
)
from slem_dask.storage.versioning import versions

from slem_dask import LinearSLEM, load_model, storage
from reference import partitionwise

pytestmark = pytest.mark.cluster

BIN = Path(sys.executable).parent
N_ROWS, DIM, PART = 120_000, 64, 1_000  # 120 partitions: long enough to interrupt


def _start_cluster(tmp, n_workers=2, extra_worker_prefix=None):
    """A scheduler and single-threaded workers without nannies (a killed worker stays
    dead), all started in ``tmp/elsewhere``: not the client's working directory.
    ``extra_worker_prefix``: a command that starts one more worker (in another mount
    namespace, say)."""
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    scheduler, address = start_local_scheduler(tmp / "scheduler.json", cwd=elsewhere)
    workers = [
        start_dask(local_worker_args(address, f"w{i}", "--no-nanny"), cwd=elsewhere)
        for i in range(n_workers)
    ]
    if extra_worker_prefix:
        unmounted = local_worker_args(address, "unmounted", "--no-nanny")
        workers.append(start_dask(unmounted, prefix=extra_worker_prefix, cwd=elsewhere))
    wait_for_workers(address, len(workers))
    return {"address": address, "scheduler": scheduler, "workers": workers, "tmp": tmp}


def _stop_cluster(cluster):
    procs = [cluster["scheduler"], *cluster["workers"]]
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = _start_cluster(tmp_path_factory.mktemp("cluster"))
    yield cluster
    _stop_cluster(cluster)


@pytest.fixture(scope="module")
def corpus(cluster):
    tmp = cluster["tmp"]
    rng = np.random.default_rng(7)
    group = zarr.open_group(str(tmp / "corpus.zarr"), mode="w")
    for name, n in (("negatives", 20_000), ("positives", N_ROWS), ("others", 30_000)):
        arr = group.create_array(name, shape=(n, DIM), dtype="float32", chunks=(PART, DIM))
        arr[...] = (rng.standard_normal((n, DIM)) * rng.uniform(0.1, 3, DIM)).astype("float32")
    path = str(tmp / "corpus.zarr")
    _cli(cluster, "fit", "--negatives", f"{path}/negatives", "--model", f"{path}/model")
    _cli(
        cluster,
        *_encode_args(
            f"{path}/model", f"{path}/positives", f"{path}/clean", "--partition-rows", PART
        ),
    )
    return path


def _cli(cluster, *args, check=True, **kw):
    cmd = [
        str(BIN / "slem-dask"),
        *map(str, args),
        "--scheduler",
        cluster["address"],
        "--no-progress",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _encode_args(model, positives, out, *extra):
    return ["encode", "--model", model, "--positives", positives, "--out", out, *extra]


def _spawn(*args, cluster=None, **kw):
    """`slem-dask ARGS` started, not waited for: on ``cluster``'s scheduler, else on the
    LocalCluster its options start; stdout and stderr piped as text unless ``kw`` says."""
    on = ["--scheduler", cluster["address"]] if cluster else []
    cmd = [str(BIN / "slem-dask"), *map(str, args), *on, "--no-progress"]
    return subprocess.Popen(
        cmd, **{"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **kw}
    )


def _assert_one_won(procs):
    """Racing encodes of one --out: at least one finished, any other was refused."""
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    assert 0 in [code for _, _, code in results], results
    for _, err, code in results:
        assert (
            code == 0
            or "being written by another slem-dask job" in err
            or "cannot be resumed" in err
            or "is not what this run writes" in err
        ), err


def _root(path):
    """The folder holding an output's chunks: its committed version, else the draft of
    the job writing it (tests/helpers.py)."""
    if versions.VersionedStore(str(path)).is_versioned():
        return head(path)
    # version folders only: slem-dask's marker file sorts after its folder
    drafts = (
        sorted(p for p in Path(path, "versions").glob("*") if p.is_dir())
        if Path(path, "versions").is_dir()
        else []
    )
    return drafts[-1] if drafts else Path(path)


def _chunks(path):
    return sorted(p for p in Path(_root(path), "c").rglob("*") if p.is_file())


def _wait_for_chunks(path, low, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if Path(_root(path), "c").exists() and len(_chunks(path)) >= low:
            return True
        time.sleep(0.02)
    return False


def _busy(client) -> bool:
    """Whether the scheduler has a task assigned or a worker runs one."""
    if any(client.processing().values()):
        return True
    return any(client.run(lambda dask_worker: dask_worker.state.executing_count).values())


def _wait_until_workers_idle(cluster, timeout=120):
    """Until no task runs anywhere, twice in a row half a second apart (a killed client's
    tasks are released once the scheduler sees it gone; those already running finish)."""
    from distributed import Client

    with Client(cluster["address"]) as client:
        deadline = time.time() + timeout
        idle = 0
        while idle < 2:
            assert time.time() < deadline, "the workers still run the killed client's tasks"
            idle = 0 if _busy(client) else idle + 1
            time.sleep(0.5)


def _same_bytes(a, b):
    ca, cb = _chunks(a), _chunks(b)
    ra, rb = _root(a), _root(b)
    assert [p.relative_to(ra) for p in ca] == [p.relative_to(rb) for p in cb]
    return all(x.read_bytes() == y.read_bytes() for x, y in zip(ca, cb, strict=True))


def test_cli_against_real_scheduler_equals_library(cluster, corpus):
    model = load_model(f"{corpus}/model")
    positives = storage.open_node(f"{corpus}/positives")[...]
    arr = storage.open_output(f"{corpus}/clean")
    np.testing.assert_array_equal(
        arr[...],
        partitionwise(lambda p: model.transform(p, dtype="float32"), positives, arr.chunks[0]),
    )


def test_worker_killed_mid_encode_job_completes_identically(cluster, corpus):
    out = f"{corpus}/worker_killed"
    args = _encode_args(f"{corpus}/model", f"{corpus}/positives", out, "--partition-rows", PART)
    proc = _spawn(*args, cluster=cluster)
    assert _wait_for_chunks(out, 10, proc), "encode ended before it could be interrupted"
    victim = cluster["workers"][0]
    os.kill(victim.pid, signal.SIGKILL)
    written_when_killed = len(_chunks(out))
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert written_when_killed < N_ROWS // PART
    assert storage.output_meta(storage.open_node(out))["complete"] is True
    assert _same_bytes(out, f"{corpus}/clean")
    assert not list(Path(out).rglob("*.partial"))


def test_client_killed_mid_encode_rerun_resumes_identically(cluster, corpus):
    out = f"{corpus}/client_killed"
    args = _encode_args(f"{corpus}/model", f"{corpus}/positives", out, "--partition-rows", PART)
    proc = _spawn(*args, cluster=cluster, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert _wait_for_chunks(out, 10, proc), "encode ended before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    _wait_until_workers_idle(cluster)  # tasks already running on the workers still land
    before = len(_chunks(out))
    assert before < N_ROWS // PART
    with pytest.raises(ValueError, match="unfinished"):
        storage.open_output(out)
    rerun = _cli(cluster, *args)
    assert "resume" in rerun.stdout
    encoded = int(rerun.stdout.split("partitions")[1].split("encoded")[0])
    assert encoded == N_ROWS // PART - before
    assert _same_bytes(out, f"{corpus}/clean")


def _as_the_job_encoded(model, rows, out):
    """What an encode of ``rows`` into ``out`` wrote: one product per partition of
    ``out`` (tests/reference.partitionwise); one product of all rows can differ in the
    last bit by shape (docs/numerics.md), as it did on an AMD EPYC (AVX2)."""
    chunk = storage.open_node(str(out)).chunks[0]
    return partitionwise(lambda p: model.transform(p, dtype="float32"), rows, chunk)


def test_two_concurrent_encodes_equal_sequential(cluster, corpus):
    outs = [f"{corpus}/concurrent_a", f"{corpus}/concurrent_b"]
    procs = [
        _spawn(*_encode_args(f"{corpus}/model", f"{corpus}/{src}", out), cluster=cluster)
        for src, out in zip(("positives", "others"), outs, strict=True)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    _cli(cluster, *_encode_args(f"{corpus}/model", f"{corpus}/others", f"{corpus}/sequential_b"))
    np.testing.assert_array_equal(
        storage.open_output(outs[1])[...], storage.open_output(f"{corpus}/sequential_b")[...]
    )
    model = load_model(f"{corpus}/model")
    for src, out in zip(("positives", "others"), outs, strict=True):
        rows = storage.open_node(f"{corpus}/{src}")[...]
        np.testing.assert_array_equal(
            storage.open_output(out)[...], _as_the_job_encoded(model, rows, out)
        )


def test_relative_paths_with_workers_in_another_directory(cluster, corpus):
    """Issue 8, item 1: the client's relative paths are made absolute before they reach
    workers started elsewhere (they used to write zeros, marked complete)."""
    tmp = cluster["tmp"]
    rel = os.path.relpath(corpus, tmp)
    _cli(cluster, *_encode_args(f"{rel}/model", f"{rel}/others", f"{rel}/relative"), cwd=tmp)
    _cli(cluster, "fit", "--negatives", f"{rel}/negatives", "--model", f"{rel}/model_rel", cwd=tmp)
    model = load_model(f"{corpus}/model")
    np.testing.assert_array_equal(
        storage.read_all(f"{corpus}/relative"), _job_reference(model, corpus, "others", "relative")
    )
    np.testing.assert_allclose(
        load_model(f"{corpus}/model_rel").covariance_, model.covariance_, rtol=1e-12
    )
    assert not (tmp / "elsewhere" / rel).exists()


def test_racing_cli_encodes_on_a_shared_scheduler(cluster, corpus):
    """Issue 8, item 2: concurrent `slem-dask encode` of different positives to one --out."""
    model = load_model(f"{corpus}/model")
    for trial in range(3):
        out = f"{corpus}/race{trial}"
        procs = [
            _spawn(*_encode_args(f"{corpus}/model", f"{corpus}/{src}", out), cluster=cluster)
            for src in ("positives", "others")
        ]
        _assert_one_won(procs)
        meta = storage.output_meta(storage.open_node(out))
        assert meta["complete"] is True
        winner = meta["source"].rsplit("/", 1)[1]
        np.testing.assert_array_equal(
            storage.read_all(out), _job_reference(model, corpus, winner, f"race{trial}")
        )


def _job_reference(model, corpus, source, out):
    """What an encode job of ``corpus/source`` into ``corpus/out`` computes: the model's
    transform partition by partition on one BLAS thread, as the workers run it. One
    transform of all rows in this process is not it: OpenBLAS splits a large product
    between this process's threads, and the rows at the splits round their last bits
    otherwise (135,377 of 1,920,000 values here, by up to 2.4e-7)."""
    rows = storage.open_node(f"{corpus}/{source}")[...]
    partition_rows = storage.open_node(f"{corpus}/{out}").chunks[0]
    return partitionwise(lambda p: model.transform(p, dtype="float32"), rows, partition_rows)


def test_racing_cli_encodes_with_separate_local_clusters(cluster, corpus):
    """Issue 8, item 2, without a shared scheduler: each process starts its own LocalCluster."""
    out = f"{corpus}/race_local"
    procs = [
        _spawn(*_encode_args(f"{corpus}/model", f"{corpus}/{src}", out, "--workers", 1))
        for src in ("positives", "others")
    ]
    _assert_one_won(procs)
    meta = storage.output_meta(storage.open_node(out))
    model = load_model(f"{corpus}/model")
    source = storage.open_node(meta["source"][len("file://") :])[...]
    assert meta["complete"] is True
    np.testing.assert_array_equal(
        storage.read_all(out),
        partitionwise(
            lambda p: model.transform(p, dtype="float32"), source, storage.open_node(out).chunks[0]
        ),
    )


def test_worker_without_the_mount_is_refused_before_anything_is_written(tmp_path):
    """Issue 8, item 1: one worker host does not mount the storage (here: a worker in its
    own mount namespace with an empty tmpfs over the data folder)."""
    if not can_unshare_mounts():
        pytest.skip("needs `unshare --mount` (root or user namespaces) to hide a mount")
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(2)
    for name, n in (("negatives", 4000), ("positives", 6000)):
        arr = zarr.create_array(
            str(data / name), shape=(n, DIM), dtype="float32", chunks=(PART, DIM)
        )
        arr[...] = rng.standard_normal((n, DIM)).astype("float32")
    LinearSLEM().fit(storage.open_node(str(data / "negatives"))[...]).save(str(data / "model"))
    hide = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs none "{data}" && exec "$0" "$@"',
    ]
    cluster = _start_cluster(tmp_path, n_workers=1, extra_worker_prefix=hide)
    try:
        enc = _cli(
            cluster, *_encode_args(data / "model", data / "positives", data / "out"), check=False
        )
        assert enc.returncode == 1
        assert "does not see the positives" in enc.stderr and "unmounted" not in enc.stdout
        assert len(enc.stderr.strip().splitlines()) == 1
        # refused before any task ran: no draft that `verify` would call unfinished
        # (issue 40 item 4: it said "run the same command again")
        assert not (data / "out").exists(), sorted(str(p) for p in (data / "out").rglob("*"))
        assert storage.verify(str(data / "out"))[0] == "missing"
        fit = _cli(
            cluster,
            "fit",
            "--negatives",
            data / "negatives",
            "--model",
            data / "model2",
            check=False,
        )
        assert fit.returncode == 1 and "does not see the negatives" in fit.stderr
        assert not (data / "model2").exists()
    finally:
        _stop_cluster(cluster)


def test_scheduler_killed_mid_encode_keeps_finished_partitions(tmp_path):
    """Issue 8, item 6: one clear line, finished partitions kept, the re-run resumes."""
    data = tmp_path / "data"
    rng = np.random.default_rng(4)
    arr = zarr.create_array(
        str(data / "positives"), shape=(N_ROWS, DIM), dtype="float32", chunks=(PART, DIM)
    )
    arr[...] = rng.standard_normal((N_ROWS, DIM)).astype("float32")
    model = LinearSLEM().fit(rng.standard_normal((3000, DIM)))
    model.save(str(data / "model"))
    out = data / "out"
    cluster = _start_cluster(tmp_path)
    try:
        args = _encode_args(data / "model", data / "positives", out, "--partition-rows", PART)
        proc = _spawn(*args, cluster=cluster)
        assert _wait_for_chunks(out, 10, proc), "encode ended before it could be interrupted"
        cluster["scheduler"].kill()
        _, err = proc.communicate(timeout=120)
    finally:
        _stop_cluster(cluster)
    assert proc.returncode == 1, err
    assert len(err.strip().splitlines()) == 1 and "lost the dask cluster" in err, err
    assert "kept" in err and "Traceback" not in err
    kept = len(_chunks(out))
    assert kept >= 10
    with pytest.raises(ValueError, match="unfinished"):
        storage.open_output(str(out))
    cluster = _start_cluster(tmp_path)
    try:
        rerun = _cli(cluster, *args)
    finally:
        _stop_cluster(cluster)
    assert "resume" in rerun.stdout
    encoded = int(rerun.stdout.split("partitions")[1].split("encoded")[0])
    assert encoded <= N_ROWS // PART - kept + 2  # at most the chunks in flight at the kill
    np.testing.assert_array_equal(storage.read_all(out), _as_the_job_encoded(model, arr[...], out))


def test_disk_full_on_a_real_filesystem(cluster, corpus, tmp_path):
    """A 2 MiB tmpfs as the output's storage: the job stops with one line, keeps what it
    wrote, and resumes once there is space."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "none", str(mnt)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("needs permission to mount a tmpfs")
    try:
        args = _encode_args(
            f"{corpus}/model", f"{corpus}/others", mnt / "out", "--partition-rows", PART
        )
        full = _cli(cluster, *args, check=False)
        assert full.returncode == 1 and "no space left" in full.stderr, full.stderr
        assert len(full.stderr.strip().splitlines()) == 1
        assert not versions.VersionedStore(str(mnt / "out")).is_versioned()  # nothing visible
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        again = _cli(cluster, *args)
        assert "resume" in again.stdout
        model = load_model(f"{corpus}/model")
        others = storage.open_node(f"{corpus}/others")[...]
        np.testing.assert_array_equal(
            storage.read_all(mnt / "out"), _as_the_job_encoded(model, others, mnt / "out")
        )
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
