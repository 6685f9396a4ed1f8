"""A write of a draft's key that lands late, after a newer write of the same key (a store
that lets a timed-out request, retried by its client, overtake the retry: the
simulation's ``late_overtakes``, docs/testing-faults.md). No key of a draft is written
twice with other bytes, so whichever write of a version's ``zarr.json`` lands last, the
committed version still matches its record and reads."""

from pathlib import Path

import numpy as np
import pytest
import zarr.storage._local as zarr_local

from slem_dask import storage
from slem_dask.storage.backends.local import LocalBackend
from slem_dask.storage.versioning import versions


def _is_version_document(path: Path) -> bool:
    """Whether ``path`` is the root ``zarr.json`` of a version folder (what its record
    covers)."""
    return path.name == "zarr.json" and path.parent.parent.name == "versions"


@pytest.fixture
def writes(monkeypatch) -> list:
    """Every write of a version's root ``zarr.json``, as (kind, path, bytes), kind
    ``create`` (refused by the store where the key exists) or ``put``: through zarr's
    local store and through slem-dask's local backend."""
    seen: list = []
    real_put, real_create = zarr_local._put, LocalBackend.create

    def put(path, value, exclusive=False):
        if _is_version_document(Path(path)):
            seen.append(("create" if exclusive else "put", Path(path), value.to_bytes()))
        return real_put(path, value, exclusive=exclusive)

    def create(self, key, data):
        if _is_version_document(Path(self._path(key))):
            seen.append(("create", Path(self._path(key)), data))
        return real_create(self, key, data)

    monkeypatch.setattr(zarr_local, "_put", put)
    monkeypatch.setattr(LocalBackend, "create", create)
    return seen


def _lands_late(write) -> None:
    """``write`` applied now, as a request that timed out and lands after everything
    since: a put overwrites, a create is refused where the key exists."""
    kind, path, data = write
    if kind == "put" or not path.exists():
        path.write_bytes(data)


def test_a_late_first_write_of_a_groups_document_leaves_the_version_whole(tmp_path, writes):
    """write_group writes its group's zarr.json once, last, with its attributes: the
    first write landing after the commit changes nothing (before: zarr wrote it empty
    first, and that late write made the record check refuse the committed version)."""
    path = str(tmp_path / "m.zarr")
    arrays = {"coef": np.arange(12.0).reshape(3, 4), "labels": np.arange(5)}
    storage.write_model_store(path, "X", {"lam": 0.1}, arrays, {})
    assert writes, "the group's zarr.json was never written"
    _lands_late(writes[0])
    store = versions.VersionedStore(path)
    assert store.check(store.head())
    meta, read = storage.read_model_store(path)
    assert meta["model"] == "X" and read["coef"].tolist() == arrays["coef"].tolist()
    assert storage.verify(path)[1] == []


def test_a_late_first_write_of_an_outputs_document_leaves_the_version_whole(tmp_path, writes):
    """create_output creates the array's zarr.json (complete: false) only if absent, and
    mark_complete rewrites it once: the create landing after the commit is refused by the
    store (before: a plain write of the incomplete document undid the complete one, and
    readers refused the committed version)."""
    path = str(tmp_path / "out.zarr")
    block = np.arange(24, dtype=np.float32).reshape(8, 3)
    with versions.VersionedStore(path).transaction("encode") as tx:
        draft = tx.begin()
        arr = storage.create_output(draft.location, (8, 3), 4, np.float32, {"n_rows": 8})
        crcs = [
            int(storage.write_partition(block[i * 4 : i * 4 + 4], arr, i)[0, 1]) for i in (0, 1)
        ]
        storage.mark_complete(arr, {"partition_crc32c": crcs})
        tx.commit("encoding", {"rows": 8})
    assert writes, "the output's zarr.json was never written"
    _lands_late(writes[0])
    store = versions.VersionedStore(path)
    assert store.check(store.head())
    assert np.array_equal(storage.open_output(path)[...], block)


def test_a_late_first_write_of_a_corpus_document_leaves_the_version_whole(tmp_path, writes):
    """write_corpus writes each document once, after what it describes: the group's
    first write landing after the commit changes nothing (before: zarr wrote the group's
    zarr.json empty first, then three times more)."""
    from slem_dask import datasets

    path = str(tmp_path / "corpus.zarr")
    corpus = datasets.make_corpus(n_negatives=200, n_instances=10, d=8)
    datasets.write_corpus(corpus, path, chunk_rows=64, attrs={"note": 1})
    assert writes, "the corpus's zarr.json was never written"
    _lands_late(writes[0])
    store = versions.VersionedStore(path)
    assert store.check(store.head())
    assert storage.verify(path)[1] == []
    assert storage.open_node(path)["queries"][...].tolist() == corpus.queries.tolist()


def test_a_heartbeat_that_lands_after_the_release_does_not_hold_the_store(tmp_path):
    """A heartbeat's write of the lease that timed out lands after its job released
    (deleted) the lease, putting this process's record back: the next job of the same
    process, which is alive, takes the lease at once (before: refused as "being written
    by another slem-dask job" for as long as the process ran)."""
    from slem_dask.storage.versioning.leases import Lease

    path = str(tmp_path / "s.zarr")
    first = Lease(path, "first").acquire()
    late = first._backend.read(first._key)  # the heartbeat's bytes, sent before release
    first.release()
    first._backend.put(first._key, late)  # ... and landing after it
    second = Lease(path, "second").acquire()
    try:
        assert second.held()
    finally:
        second.release()
    assert not Path(second.file.location).exists()


def test_a_lease_held_in_this_process_still_refuses_a_second_job(tmp_path):
    """The same process's lease, still held (another thread's job), is not taken."""
    from slem_dask.storage.versioning.leases import Lease, LeaseHeldError

    path = str(tmp_path / "s.zarr")
    with Lease(path, "first"):
        with pytest.raises(LeaseHeldError, match="being written by another slem-dask job"):
            Lease(path, "second").acquire()


def test_a_lease_this_process_is_still_taking_is_not_taken_for_a_released_one(
    tmp_path, monkeypatch
):
    """Another thread reads the lease between its record's creation and the end of
    ``acquire``: the record is this process's and its job is alive, so the lease is
    refused, not taken over (before: taken for one this process had released; the
    first job's draft was deleted and its heartbeat overwrote the second's record, so
    two racing encodes both failed under load)."""
    from slem_dask.storage.versioning.leases import Lease, LeaseHeldError

    path = str(tmp_path / "s.zarr")
    first, second = Lease(path, "first"), Lease(path, "second")
    create, refused = Lease._create, []

    def create_then_look(self):
        made = create(self)
        if self is first and made:  # the record exists; first.acquire() has not returned
            with pytest.raises(LeaseHeldError, match="being written by another"):
                second.acquire()
            refused.append(second.took_over)
        return made

    monkeypatch.setattr(Lease, "_create", create_then_look)
    first.acquire()
    try:
        assert refused == [None] and first.held()
    finally:
        first.release()
