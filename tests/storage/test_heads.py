"""Finding the head of a versioned store (slem_dask.storage.versioning.heads): what a fresh process
(every command, every worker) asks of the storage does not grow with the length of the
store's history, and a head hint that is wrong in any way costs requests, never a
wrong head."""

import collections
import json
import os

import pytest
import zarr

from slem_dask.storage.backends import backend as backend_module
from slem_dask.storage.versioning import heads
from slem_dask.storage.versioning import versions
from slem_dask.storage.backends.local import LocalBackend


class _Counted:
    """Calls of the backends rooted at one store (its lease and probe, beside it, apart),
    and the names their listings gave."""

    def __init__(self, root: str):
        self.root, self.calls = root, collections.Counter()

    def note(self, backend, op: str, names=None) -> None:
        if backend.root == self.root:
            self.calls[op] += 1
            if names is not None:
                self.calls["names listed"] += len(names)


def _counting(counted: _Counted, lists_from_a_name: bool):
    class Counting(LocalBackend):
        def read(self, key):
            counted.note(self, "read")
            return super().read(key)

        def put(self, key, data):
            counted.note(self, "put")
            return super().put(key, data)

        def create(self, key, data):
            counted.note(self, "create")
            return super().create(key, data)

        def exists(self, key):
            counted.note(self, "exists")
            return super().exists(key)

        def list(self, prefix):
            names = super().list(prefix)
            counted.note(self, "list", names)
            return names

    class ListsFromAName(Counting):
        """As S3 does (StartAfter): only the names after are sent."""

        lists_from_a_name = True

        def list_after(self, prefix, start_after):
            names = [n for n in LocalBackend.list(self, prefix) if n > start_after]
            counted.note(self, "list", names)
            return names

    return ListsFromAName if lists_from_a_name else Counting


def _history(path: str, n: int) -> None:
    """``n - 1`` commit records written straight to disk (cheap), then one real commit
    (which leaves the head hint as every commit does)."""
    os.makedirs(os.path.join(path, "commits"))
    for seq in range(1, n):
        record = versions.Commit(
            seq,
            f"{seq:08d}-{'0' * 12}",
            "model",
            f"job {seq}",
            "host",
            "0" * 64,
            "2026-01-01T00:00:00Z",
            {},
        )
        with open(os.path.join(path, "commits", f"{seq:08d}.json"), "wb") as f:
            f.write(record.to_json())
    _commit(versions.VersionedStore(path), n)


def _commit(store, i):
    draft = store.begin()
    zarr.open_group(store=draft.location, mode="w").attrs["i"] = i
    return store.commit(draft, "model", f"job {i}")


def _a_job(path: str, monkeypatch, lists_from_a_name: bool) -> collections.Counter:
    """What a fresh process asks of the store at ``path`` in a job that reads it and
    writes it: the head found (as readers and checks find it), a new version committed,
    the garbage collected."""
    counted = _Counted(LocalBackend(path).root)
    cls = _counting(counted, lists_from_a_name)
    monkeypatch.setattr(versions, "backend_for", lambda url: cls(url[len("file://") :]))
    monkeypatch.setattr(heads, "_HEAD_SEEN", {})  # a new process
    monkeypatch.setattr(backend_module, "_PROBED", set())
    _, store, head = versions.resolve(path)
    assert store.is_versioned() and store.has_history()
    commit = _commit(store, head.seq + 1)
    assert commit.seq == head.seq + 1 and versions.VersionedStore(path).head() == commit
    store.collect_garbage()
    return counted.calls


@pytest.mark.parametrize("lists_from_a_name", [False, True], ids=["reads", "listing"])
def test_a_fresh_process_asks_the_same_of_a_store_whatever_its_history(
    tmp_path, monkeypatch, lists_from_a_name
):
    short, long = str(tmp_path / "short.zarr"), str(tmp_path / "long.zarr")
    _history(short, 3)
    _history(long, 2500)  # more than two pages of an S3 listing
    asked_short = _a_job(short, monkeypatch, lists_from_a_name)
    asked_long = _a_job(long, monkeypatch, lists_from_a_name)
    assert asked_long == asked_short
    assert asked_long["names listed"] < 30 and sum(asked_long.values()) < 80
    assert versions.VersionedStore(long).head().seq == 2501


@pytest.mark.parametrize("lists_from_a_name", [False, True], ids=["reads", "listing"])
def test_a_stale_hint_costs_a_few_requests_more(tmp_path, monkeypatch, lists_from_a_name):
    path = str(tmp_path / "m.zarr")
    _history(path, 2000)
    _write_hint(path, {"head": 1000})  # a slow committer overwrote it with an old number
    counted = _Counted(LocalBackend(path).root)
    cls = _counting(counted, lists_from_a_name)
    monkeypatch.setattr(versions, "backend_for", lambda url: cls(url[len("file://") :]))
    monkeypatch.setattr(heads, "_HEAD_SEEN", {})
    assert versions.VersionedStore(path).head().seq == 2000
    if lists_from_a_name:  # one listing from the hint: the names since, no more
        assert counted.calls["list"] == 1 and counted.calls["names listed"] == 1001
    else:  # 1000 records since the hint: about 2 log2(1000) reads
        assert counted.calls["list"] == 0 and counted.calls["read"] <= 2 + 2 * 11


@pytest.mark.parametrize(
    "hint",
    [
        None,
        b"{not json",
        {"head": "7"},
        {"head": True},
        {"head": 0},
        {"head": 9},
        {"head": 10**6},
        {},
    ],
)
def test_a_wrong_hint_never_gives_a_wrong_head(tmp_path, monkeypatch, hint):
    path = str(tmp_path / "m.zarr")
    store = versions.VersionedStore(path)
    for i in range(4):
        _commit(store, i)
    _write_hint(path, hint)
    monkeypatch.setattr(heads, "_HEAD_SEEN", {})
    fresh = versions.VersionedStore(path)
    assert fresh.head().seq == 4 and fresh.head_seq() == 4 and fresh.is_versioned()
    assert [c.seq for c in fresh.commits()] == [1, 2, 3, 4]  # the hint is no record
    monkeypatch.setattr(heads, "_HEAD_SEEN", {})
    assert _commit(fresh, 5).seq == 5 and heads.read_hint(fresh.backend) == 5


def test_a_hint_past_the_head_of_a_store_written_again_gives_its_head(tmp_path, monkeypatch):
    import shutil

    path = str(tmp_path / "m.zarr")
    store = versions.VersionedStore(path)
    for i in range(2):
        _commit(store, i)
    shutil.rmtree(path)  # deleted; a slow committer of the old store leaves its hint
    _commit(versions.VersionedStore(path), 0)
    _write_hint(path, {"head": 7})
    monkeypatch.setattr(heads, "_HEAD_SEEN", {})
    assert versions.VersionedStore(path).head().seq == 1
    assert not versions.VersionedStore(str(tmp_path / "none.zarr")).is_versioned()


def test_the_hint_is_written_after_each_commit_and_names_it(tmp_path):
    store = versions.VersionedStore(str(tmp_path / "m.zarr"))
    assert heads.read_hint(store.backend) is None
    for i in range(3):
        _commit(store, i)
        assert heads.read_hint(store.backend) == i + 1
    record = store.rollback(1)
    assert heads.read_hint(store.backend) == record.seq == 4


def _write_hint(path: str, hint) -> None:
    key = os.path.join(path, *heads.HINT.split("/"))
    if hint is None:
        os.remove(key)
        return
    with open(key, "wb") as f:
        f.write(hint if isinstance(hint, bytes) else json.dumps(hint).encode())


def test_a_path_without_history_costs_one_listing_per_look(tmp_path, monkeypatch):
    """Input stores are asked whether they are versioned many times a job: the hint is
    asked for once per process, then each look is the one listing it was before."""
    path = str(tmp_path / "input.zarr")
    zarr.create_array(store=path, shape=(4, 2), dtype="float32")
    counted = _Counted(LocalBackend(path).root)
    cls = _counting(counted, False)
    monkeypatch.setattr(versions, "backend_for", lambda url: cls(url[len("file://") :]))
    monkeypatch.setattr(heads, "_HEAD_SEEN", {})
    for _ in range(5):
        assert not versions.VersionedStore(path).is_versioned()
    assert counted.calls == {"read": 1, "list": 5, "names listed": 0}


@pytest.mark.parametrize("s3_server", ["seaweedfs"], indirect=True)
def test_a_fresh_process_finds_the_head_on_s3_in_one_short_listing(s3_server, monkeypatch):
    """1,200 records (more than a listing page): a fresh process's look at the head
    sends the same requests as at 3, and lists the head's record alone."""
    import uuid

    import fsspec
    from aiobotocore.client import AioBaseClient

    asked = {}
    for n in (3, 1200):
        path = f"s3://{s3_server.bucket}/heads-{uuid.uuid4().hex[:8]}/m.zarr"
        fs, where = fsspec.core.url_to_fs(path)
        fs.pipe(
            {
                f"{where}/commits/{seq:08d}.json": versions.Commit(
                    seq,
                    f"{seq:08d}-{'0' * 12}",
                    "model",
                    f"job {seq}",
                    "host",
                    "0" * 64,
                    "2026-01-01T00:00:00Z",
                    {},
                ).to_json()
                for seq in range(1, n)
            }
        )
        _commit(versions.VersionedStore(path), n)  # leaves the hint
        calls, real = collections.Counter(), AioBaseClient._make_api_call

        async def counted(self, operation, params, calls=calls, real=real):
            out = await real(self, operation, params)
            calls[operation] += 1
            if operation == "ListObjectsV2":
                calls["names listed"] += len(out.get("Contents", []))
            return out

        with monkeypatch.context() as m:
            m.setattr(AioBaseClient, "_make_api_call", counted)
            m.setattr(heads, "_HEAD_SEEN", {})  # a new process
            store = versions.VersionedStore(path)
            assert store.head().seq == n and store.is_versioned() and store.has_history()
        asked[n] = calls
    assert asked[1200] == asked[3] and asked[1200]["names listed"] <= 3


def test_a_hint_that_cannot_be_written_fails_no_commit(tmp_path, monkeypatch):
    store = versions.VersionedStore(str(tmp_path / "m.zarr"))
    _commit(store, 0)
    real = store.backend.put

    def put(key, data):
        if key == heads.HINT:
            raise RuntimeError("endpoint unreachable")  # not an OSError, as botocore's own
        return real(key, data)

    monkeypatch.setattr(store.backend, "put", put)
    assert _commit(store, 1).seq == 2 and heads.read_hint(store.backend) == 1
    monkeypatch.setattr(heads, "_HEAD_SEEN", {})
    assert versions.VersionedStore(store.path).head().seq == 2  # from the stale hint
