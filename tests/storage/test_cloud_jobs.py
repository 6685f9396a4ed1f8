"""The jobs and the commit protocol on Google Cloud Storage and Azure Blob, each on its
emulator (fake-gcs-server, Azurite; tests/emulators.py, started by tests/conftest.py):
the same results as on local disk, versions and rollback, one winner among racing
commits, fencing, one-line configuration errors."""

import threading
import uuid

import numpy as np
import pytest
import zarr

from slem_dask import LinearSLEM, load_model, pipeline, storage
from slem_dask.cli.main import main
from slem_dask.storage import leases, versions
from slem_dask.storage.registry import backend_for

from reference import partitionwise

D = 8
PROTOCOLS = {"gcs": "gs", "azure": "az"}


@pytest.fixture(params=list(PROTOCOLS))
def cloud(request, monkeypatch):
    """A fresh prefix in the emulator's bucket, with the inputs written there."""
    server = request.getfixturevalue(f"{request.param}_emulator")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    root = f"{PROTOCOLS[request.param]}://{server.bucket}/t-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(21)
    data = {"neg": rng.standard_normal((300, D)).astype("float32"),
            "pos": rng.standard_normal((200, D)).astype("float32"),
            "other": rng.standard_normal((200, D)).astype("float32")}
    for name, rows in data.items():
        arr = zarr.create_array(store=f"{root}/{name}.zarr", shape=rows.shape,
                                dtype=rows.dtype, chunks=(40, D),
                                config={"write_empty_chunks": True})
        arr[...] = rows
    yield {"root": root, "server": server, "kind": request.param, **data}
    backend_for(root).remove_tree("")


def _expected(model_path, rows):
    model = load_model(model_path)
    return partitionwise(lambda p: model.transform(p, dtype="float32"), rows, 40)


@pytest.mark.slow
def test_fit_encode_verify_versions_and_rollback_match_local_disk(cloud, tmp_path):
    root = cloud["root"]
    model, out = f"{root}/model.zarr", f"{root}/out.zarr"
    pipeline.fit_job(None, f"{root}/neg.zarr", model, lam=0.1)
    arr = zarr.create_array(store=str(tmp_path / "neg.zarr"), shape=cloud["neg"].shape,
                            dtype="float32", chunks=(40, D))
    arr[...] = cloud["neg"]
    pipeline.fit_job(None, str(tmp_path / "neg.zarr"), str(tmp_path / "model.zarr"), lam=0.1)
    local = load_model(str(tmp_path / "model.zarr"))
    assert load_model(model).fingerprint_ == local.fingerprint_
    pipeline.encode_job(None, model, f"{root}/pos.zarr", out, partition_rows=40)
    first = storage.read_all(out)
    np.testing.assert_array_equal(first, _expected(model, cloud["pos"]))
    again = pipeline.encode_job(None, model, f"{root}/pos.zarr", out, partition_rows=40)
    assert again.facts["action"] == "up to date"
    # a second version from other rows, then back to the first by rollback
    pipeline.encode_job(None, model, f"{root}/other.zarr", out, partition_rows=40,
                        overwrite=True)
    np.testing.assert_array_equal(storage.read_all(out), _expected(model, cloud["other"]))
    for path in (model, out):
        assert storage.verify(path)[1] == []
    assert [c.seq for c in versions.VersionedStore(out).commits()] == [1, 2]
    assert main(["versions", out]) == 0
    assert main(["rollback", out, "--to", "1"]) == 0
    np.testing.assert_array_equal(storage.read_all(out), first)
    assert storage.verify(out)[1] == []


def test_racing_commits_have_one_winner(cloud):
    store = versions.VersionedStore(f"{cloud['root']}/race.zarr")
    drafts = [store.begin() for _ in range(4)]
    for d in drafts:
        zarr.open_group(store=d.location, mode="w").attrs["who"] = d.version
    results = []

    def commit(d):
        try:
            store.commit(d, "model", d.version)
            results.append(d.version)
        except versions.CommitConflictError as exc:
            results.append(str(exc))

    threads = [threading.Thread(target=commit, args=(d,)) for d in drafts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if "committed by" not in r]
    assert len(winners) == 1 and len(store.commits()) == 1
    assert storage.open_node(store.path).attrs["who"] == winners[0]


@pytest.mark.slow
def test_a_job_that_lost_its_output_never_changes_it(cloud, monkeypatch):
    root = cloud["root"]
    LinearSLEM(lam=0.1).fit(cloud["neg"]).save(f"{root}/model.zarr")
    out = f"{root}/out.zarr"
    real_compute = pipeline.common._compute
    other = {}

    def stalled(client, obj, progress):
        if not other:
            other["running"] = True
            lease = leases.Lease(out, "x")
            lease._backend.delete(lease._key)  # taken over: the lease is gone
            other["report"] = pipeline.encode_job(None, f"{root}/model.zarr",
                                                  f"{root}/other.zarr", out, partition_rows=40)
        return real_compute(client, obj, progress)

    monkeypatch.setattr(pipeline.common, "_compute", stalled)
    monkeypatch.setattr(leases.Lease, "check", lambda self: None)
    with pytest.raises(versions.CommitConflictError, match="version 1 was committed"):
        pipeline.encode_job(None, f"{root}/model.zarr", f"{root}/pos.zarr", out,
                            partition_rows=40)
    np.testing.assert_array_equal(storage.read_all(out),
                                  _expected(f"{root}/model.zarr", cloud["other"]))
    assert storage.verify(out)[1] == []


def test_a_missing_bucket_is_one_line(cloud, capsys):
    scheme = PROTOCOLS[cloud["kind"]]
    missing = f"{scheme}://no-such-bucket-{uuid.uuid4().hex[:6]}/neg.zarr"
    code = main(["fit", "--negatives", missing, "--model", f"{cloud['root']}/m.zarr",
                 "--local-cluster", "threads", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "does not exist" in err and "no-such-bucket" in err and "worker" in err


def test_a_refused_azure_key_is_one_line(azure_emulator, monkeypatch, capsys):
    s = azure_emulator
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       s.connection_string("d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk="))
    root = f"az://{s.bucket}/t-{uuid.uuid4().hex[:8]}"
    code = main(["fit", "--negatives", f"{root}/neg.zarr", "--model", f"{root}/m.zarr",
                 "--local-cluster", "threads", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "refused the credentials" in err and "AZURE_STORAGE_CONNECTION_STRING" in err


@pytest.mark.cluster
def test_fit_and_encode_with_worker_processes(cloud):
    """Worker processes open the stores themselves, from the environment they inherit
    (and check, before the job, that they see the stores as the client does)."""
    root = cloud["root"]
    model, out = f"{root}/model.zarr", f"{root}/out.zarr"
    common = ["--local-cluster", "processes", "--workers", "2", "--no-progress"]
    assert main(["fit", "--negatives", f"{root}/neg.zarr", "--model", model, "--lam", "0.1",
                 *common]) == 0
    assert main(["encode", "--model", model, "--positives", f"{root}/pos.zarr", "--out", out,
                 "--partition-rows", "40", *common]) == 0
    np.testing.assert_array_equal(storage.read_all(out), _expected(model, cloud["pos"]))
    assert storage.verify(out)[1] == []


def test_python_reads_leave_nothing_on_stderr_at_exit(cloud, tmp_path):
    """Reading an output from Python (open_zarr, open_dataset) and exiting prints no
    traceback: gcsfs closed its session on another loop than its own at exit."""
    import os
    import subprocess
    import sys

    import slem_dask

    model, out = str(tmp_path / "model.zarr"), f"{cloud['root']}/out.zarr"
    LinearSLEM(lam=0.1).fit(cloud["neg"]).save(model)
    pipeline.encode_job(None, model, f"{cloud['root']}/pos.zarr", out, partition_rows=40)
    code = (f"import slem_dask; print(slem_dask.open_zarr({out!r}).shape); "
            f"print(slem_dask.open_dataset({out!r}).encodings.shape)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(slem_dask.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split("\n")[:2] == ["(200, 8)", "(200, 8)"], \
        done.stderr
    assert done.stderr == ""
