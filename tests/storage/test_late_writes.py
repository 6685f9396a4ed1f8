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


def _first_write_timing_out(tmp_path, monkeypatch, error):
    """A first write_group whose chunk write fails with ``error`` (a request that met
    its deadline, and lands later), then that write landing once the job has ended."""
    import zarr

    from slem_dask.storage.nodes import groups

    path = tmp_path / "model.zarr"
    real = zarr.Array.__setitem__
    failed: list = []

    def times_out(self, key, value):
        if not failed:
            failed.append(Path(str(self.store_path.store.root)) / str(self.store_path.path))
            raise error
        return real(self, key, value)

    monkeypatch.setattr(zarr.Array, "__setitem__", times_out)
    with pytest.raises(type(error)):
        groups.write_group(path, {"kind": "t"}, {"w": np.arange(6.0)}, "model")
    monkeypatch.setattr(zarr.Array, "__setitem__", real)
    late = failed[0] / "c" / "0"  # the request lands after the job's clean-up
    late.parent.mkdir(parents=True, exist_ok=True)
    late.write_bytes(b"late chunk")
    return path, late


@pytest.mark.parametrize(
    "error",
    [
        TimeoutError("the object store did not answer within its deadline"),
        storage.OutcomeUnknownError("a request's outcome is unknown"),
        RuntimeError("a client's own error type (aiohttp, google.api_core)"),
    ],
    ids=["timeout", "unknown outcome", "client error"],
)
def test_a_late_write_of_a_failed_first_write_is_slem_dasks_for_the_next_run(
    tmp_path, monkeypatch, error
):
    """A first write that failed on its storage kept its draft's fate file: the write
    that landed after it is provably slem-dask's, so the same job run again replaces it
    (before: the fate file went with the failed first write, and every re-run, with
    --overwrite too, refused a store "not written by slem-dask"; seen on fake-gcs-server
    and Azurite through the fault proxy)."""
    from slem_dask.storage.nodes import groups
    from slem_dask.storage.versioning.ownership import check_may_replace

    path, late = _first_write_timing_out(tmp_path, monkeypatch, error)
    assert late.exists()
    check_may_replace(path, "model store", kind="model")  # not refused
    groups.write_group(path, {"kind": "t"}, {"w": np.arange(6.0)}, "model", overwrite=True)
    store = versions.VersionedStore(str(path))
    assert store.head().seq == 1 and not late.exists()  # the regrown folder went


def test_a_first_write_refused_for_its_input_leaves_no_store(tmp_path, monkeypatch):
    """A failure whose writes had all answered (here: refused before any was made)
    leaves nothing at all, fate file included."""
    import zarr

    from slem_dask.storage.nodes import groups

    def refused(self, key, value):
        raise ValueError("bad input")

    monkeypatch.setattr(zarr.Array, "__setitem__", refused)
    path = tmp_path / "model.zarr"
    with pytest.raises(ValueError, match="bad input"):
        groups.write_group(path, {"kind": "t"}, {"w": np.arange(6.0)}, "model")
    assert not path.exists() and list(tmp_path.iterdir()) == []
