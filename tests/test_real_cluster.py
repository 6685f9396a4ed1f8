"""The command line against a real `dask scheduler` and two `dask worker` processes on
127.0.0.1: fault tolerance (a worker killed, the client killed), resume, concurrency."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from slem_dask import load_model, storage

pytestmark = pytest.mark.cluster

BIN = Path(sys.executable).parent
N_ROWS, DIM, PART = 120_000, 64, 1_000   # 120 partitions: long enough to interrupt


def _start(args, **kw):
    return subprocess.Popen([str(BIN / "dask"), *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, **kw)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A scheduler and two single-threaded workers, without nannies so that a killed
    worker stays dead."""
    tmp = tmp_path_factory.mktemp("cluster")
    sched_file = tmp / "scheduler.json"
    procs = [_start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                     "--scheduler-file", str(sched_file)])]
    deadline = time.time() + 60
    while not sched_file.exists() and time.time() < deadline:
        time.sleep(0.2)
    address = json.loads(sched_file.read_text())["address"]
    workers = [_start(["worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                       "--host", "127.0.0.1", "--name", f"w{i}"]) for i in range(2)]
    procs += workers
    from distributed import Client

    with Client(address) as client:
        client.wait_for_workers(2, timeout=60)
    yield {"address": address, "workers": workers, "tmp": tmp}
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


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
    _cli(cluster, "encode", "--model", f"{path}/model", "--positives", f"{path}/positives",
         "--out", f"{path}/clean", "--partition-rows", str(PART))
    return path


def _cli(cluster, *args, check=True, **kw):
    cmd = [str(BIN / "slem-dask"), *args, "--scheduler", cluster["address"], "--no-progress"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _chunks(path):
    return sorted(p for p in Path(path, "c").rglob("*") if p.is_file())


def _wait_for_chunks(path, low, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if Path(path, "c").exists() and len(_chunks(path)) >= low:
            return True
        time.sleep(0.02)
    return False


def _same_bytes(a, b):
    ca, cb = _chunks(a), _chunks(b)
    assert [p.relative_to(a) for p in ca] == [p.relative_to(b) for p in cb]
    return all(x.read_bytes() == y.read_bytes() for x, y in zip(ca, cb))


def test_cli_against_real_scheduler_equals_library(cluster, corpus):
    model = load_model(f"{corpus}/model")
    positives = zarr.open_array(f"{corpus}/positives")[...]
    out = storage.open_output(f"{corpus}/clean")[...]
    np.testing.assert_array_equal(out, model.transform(positives, dtype="float32"))


def test_worker_killed_mid_encode_job_completes_identically(cluster, corpus):
    out = f"{corpus}/worker_killed"
    proc = subprocess.Popen(
        [str(BIN / "slem-dask"), "encode", "--model", f"{corpus}/model", "--positives",
         f"{corpus}/positives", "--out", out, "--partition-rows", str(PART),
         "--scheduler", cluster["address"], "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert _wait_for_chunks(out, 10, proc), "encode ended before it could be interrupted"
    victim = cluster["workers"][0]
    os.kill(victim.pid, signal.SIGKILL)
    written_when_killed = len(_chunks(out))
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert written_when_killed < N_ROWS // PART
    assert storage.output_meta(zarr.open_array(out))["complete"] is True
    assert _same_bytes(out, f"{corpus}/clean")
    assert not list(Path(out).rglob("*.partial"))


def test_client_killed_mid_encode_rerun_resumes_identically(cluster, corpus):
    out = f"{corpus}/client_killed"
    args = ["encode", "--model", f"{corpus}/model", "--positives", f"{corpus}/positives",
            "--out", out, "--partition-rows", str(PART)]
    proc = subprocess.Popen([str(BIN / "slem-dask"), *args, "--scheduler", cluster["address"],
                             "--no-progress"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    assert _wait_for_chunks(out, 10, proc), "encode ended before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(1.0)  # tasks already running on the workers may still land
    before = len(_chunks(out))
    assert before < N_ROWS // PART
    with pytest.raises(ValueError, match="unfinished"):
        storage.open_output(out)
    rerun = _cli(cluster, *args)
    assert "resume" in rerun.stdout
    encoded = int(rerun.stdout.split("partitions")[1].split("encoded")[0])
    assert encoded == N_ROWS // PART - before
    assert _same_bytes(out, f"{corpus}/clean")


def test_two_concurrent_encodes_equal_sequential(cluster, corpus):
    outs = [f"{corpus}/concurrent_a", f"{corpus}/concurrent_b"]
    procs = [subprocess.Popen(
        [str(BIN / "slem-dask"), "encode", "--model", f"{corpus}/model", "--positives",
         f"{corpus}/{src}", "--out", out, "--scheduler", cluster["address"], "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for src, out in zip(("positives", "others"), outs)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    _cli(cluster, "encode", "--model", f"{corpus}/model", "--positives", f"{corpus}/others",
         "--out", f"{corpus}/sequential_b")
    np.testing.assert_array_equal(storage.open_output(outs[0])[...],
                                  storage.open_output(f"{corpus}/clean")[...])
    np.testing.assert_array_equal(storage.open_output(outs[1])[...],
                                  storage.open_output(f"{corpus}/sequential_b")[...])
