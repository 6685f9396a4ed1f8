"""What reading and writing chunks costs on S3, in requests (deterministic, unlike time;
benchmarks/bench_object_stores.py times it): one GET per chunk read, one PUT carrying
the crc32c of its body per output chunk written, and what is written reads back."""

import base64
import collections
import uuid

import numpy as np
import pytest
import zarr

from slem_dask import storage
from slem_dask.storage.versioning import versions
from slem_dask.storage.nodes.checksums import crc32c

D = 16


@pytest.fixture
def calls(monkeypatch):
    """Every S3 API call of this process, as (operation, parameters)."""
    from aiobotocore.client import AioBaseClient

    seen = []
    real = AioBaseClient._make_api_call

    async def recorded(self, operation, params):
        seen.append((operation, dict(params)))
        return await real(self, operation, params)

    monkeypatch.setattr(AioBaseClient, "_make_api_call", recorded)
    return seen


def _root(server) -> str:
    return f"s3://{server.bucket}/req-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("s3_server", ["seaweedfs", "moto"], indirect=True)
def test_reading_rows_from_s3_sends_one_get_per_chunk_and_nothing_else(s3_server, calls):
    rows = np.random.default_rng(3).standard_normal((100, D)).astype("float32")
    path = f"{_root(s3_server)}/x.zarr"
    zarr.create_array(store=path, shape=rows.shape, dtype="float32", chunks=(20, D))[...] = (
        rows  # zstd: zarr's default codec
    )
    arr = storage.open_input(path, "x")
    calls.clear()
    np.testing.assert_array_equal(storage.read_rows(arr, 10, 90, "x"), rows[10:90])
    assert collections.Counter(op for op, _ in calls) == {"GetObject": 5}


@pytest.mark.parametrize("s3_server", ["seaweedfs", "moto"], indirect=True)
def test_a_missing_chunk_on_s3_is_still_named(s3_server):
    rows = np.ones((60, D), dtype="float32")
    path = f"{_root(s3_server)}/x.zarr"
    arr = zarr.create_array(store=path, shape=rows.shape, dtype="float32", chunks=(20, D))
    arr[...] = rows
    import fsspec

    fs, where = fsspec.core.url_to_fs(path)
    fs.rm(f"{where}/c/1/0")
    with pytest.raises(Exception, match="c/1/0"):
        storage.read_rows(storage.open_input(path, "x"), 0, 60, "x")


@pytest.mark.parametrize("s3_server", ["seaweedfs", "moto"], indirect=True)
def test_an_output_chunk_on_s3_is_one_put_with_the_crc32c_of_its_body(s3_server, calls):
    block = np.random.default_rng(4).standard_normal((30, D)).astype("float32")
    out = storage.create_output(f"{_root(s3_server)}/out.zarr", (60, D), 30, "float32", {})
    calls.clear()
    assert storage.write_partition(block, out, 1)[0, 1] == crc32c(block.tobytes())
    # SeaweedFS checks the body's crc32c and says so: the trailer needs no read-back;
    # moto does not: the worker reads it back
    # one HEAD of the draft's zarr.json first: a fenced job's late task must not grow a
    # deleted draft again (storage.versioning.gc.draft_alive); then the chunk's one PUT
    fence = {"HeadObject": 1}
    assert collections.Counter(op for op, _ in calls) == (
        {**fence, "PutObject": 1}
        if s3_server.name == "seaweedfs"
        else {**fence, "PutObject": 1, "GetObject": 1}
    )
    puts = [params for op, params in calls if op == "PutObject"]
    assert len(puts) == 1 and puts[0]["Key"].endswith("out.zarr/c/1/0")
    body = bytes(puts[0]["Body"])
    assert body == block.tobytes() + np.array([crc32c(block.tobytes())], "<u4").tobytes()
    assert base64.b64decode(puts[0]["ChecksumCRC32C"]) == crc32c(body).to_bytes(4, "big")
    # zarr reads back what was written, bit for bit
    np.testing.assert_array_equal(zarr.open_array(out.store_path.store, mode="r")[30:], block)


def _commit_many(path: str, n: int) -> versions.VersionedStore:
    store = versions.VersionedStore(path)
    for i in range(n):
        draft = store.begin()
        zarr.open_group(store=draft.location, mode="w").attrs["i"] = i
        store.commit(draft, "model", f"job {i}")
    return store


@pytest.mark.parametrize("s3_server", ["seaweedfs", "moto"], indirect=True)
def test_finding_the_head_on_s3_lists_from_the_head_seen_not_the_whole_history(
    s3_server, calls, monkeypatch
):
    from aiobotocore.client import AioBaseClient

    listed = []
    real = AioBaseClient._make_api_call

    async def keys_listed(self, operation, params):
        out = await real(self, operation, params)
        if operation == "ListObjectsV2" and params.get("Prefix", "").endswith("commits/"):
            listed.append(len(out.get("Contents", [])))
        return out

    monkeypatch.setattr(AioBaseClient, "_make_api_call", keys_listed)
    store = _commit_many(f"{_root(s3_server)}/m.zarr", 6)
    versions.VersionedStore(store.path).head()  # a job that follows the commits
    listed.clear()
    for _ in range(3):  # a new object each time: what every job, reader and check does
        fresh = versions.VersionedStore(store.path)
        assert fresh.head().seq == 6 and fresh.is_versioned()
    assert listed and max(listed) == 1  # the head's own record, not all six


def test_a_stale_head_seen_never_gives_a_wrong_head(tmp_path):
    import shutil

    path = str(tmp_path / "m.zarr")
    assert _commit_many(path, 4).head().seq == 4  # seen: 4
    shutil.rmtree(path)  # replaced by a shorter history
    assert versions.VersionedStore(path).head() is None
    assert not versions.VersionedStore(path).is_versioned()
    store = _commit_many(path, 2)
    assert store.head().seq == 2 and store.head().job == "job 1"
    _commit_many(path, 5)  # and past the head seen
    assert versions.VersionedStore(path).head().seq == 7


@pytest.mark.parametrize("s3_server", ["seaweedfs"], indirect=True)
def test_saving_a_model_on_s3_never_asks_for_zarr_v2_names(s3_server, calls):
    from slem_dask import LinearSLEM

    rows = np.random.default_rng(5).standard_normal((50, D)).astype("float32")
    LinearSLEM(lam=0.1).fit(rows).save(f"{_root(s3_server)}/model.zarr")
    v2 = [
        params["Key"]
        for _, params in calls
        if params.get("Key", "").endswith((".zgroup", ".zattrs", ".zmetadata", ".zarray"))
    ]
    assert v2 == []


@pytest.mark.parametrize("s3_server", ["seaweedfs", "moto"], indirect=True)
def test_opening_and_reading_a_store_on_s3_asks_for_no_object_sizes(s3_server, calls):
    """s3fs sends a HEAD (for the size) before each plain GET unless told not to: opening
    an input (its zarr.json), a saved model (zarr.json of the group and of each array,
    whose small chunks zarr reads whole) costs GETs only."""
    from slem_dask import LinearSLEM, load_model

    rows = np.random.default_rng(6).standard_normal((60, D)).astype("float32")
    root = _root(s3_server)
    zarr.create_array(store=f"{root}/x.zarr", shape=rows.shape, dtype="float32", chunks=(20, D))[
        ...
    ] = rows
    LinearSLEM(lam=0.1).fit(rows).save(f"{root}/model.zarr")
    calls.clear()
    storage.open_input(f"{root}/x.zarr", "x")
    model = load_model(f"{root}/model.zarr")
    np.testing.assert_allclose(model.mean_, rows.astype("float64").mean(axis=0), rtol=1e-6)
    documents = [
        p["Key"]
        for op, p in calls
        if op == "GetObject" and not p["Key"].split("/")[-2] == "commits"
    ]
    sized = [p["Key"] for op, p in calls if op == "HeadObject" and p["Key"] in documents]
    assert documents and sized == []
