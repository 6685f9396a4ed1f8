"""The transaction every job writes through (slem_dask.storage.versioning.transaction):
it holds the store's lease, begins the draft, commits it or discards it, and answers
fenced and conflict as typed errors."""

import pytest
import zarr

from slem_dask import storage
from slem_dask.storage.versioning import gc, leases, versions


def _store(tmp_path) -> versions.VersionedStore:
    return versions.VersionedStore(str(tmp_path / "s.zarr"))


def _write(draft, value: float) -> None:
    zarr.open_group(store=draft.location, mode="w").attrs["value"] = value


def test_a_transaction_holds_the_lease_until_it_ends_and_commits_as_its_job(tmp_path):
    store = _store(tmp_path)
    with store.transaction("job one") as tx:
        with pytest.raises(leases.LeaseHeldError, match="job one"):
            leases.Lease(store.path, "job two").acquire()
        _write(tx.begin(), 1.0)
        commit = tx.commit("group", {"n": 1})
    assert (commit.seq, commit.job, commit.summary) == (1, "job one", {"n": 1})
    assert store.head() == commit
    leases.Lease(store.path, "job two").acquire().release()  # free again


def test_a_discarded_draft_leaves_the_head_as_it_was(tmp_path):
    store = _store(tmp_path)
    with store.transaction("writer") as tx:
        _write(tx.begin(), 1.0)
        tx.commit("group")
    with store.transaction("writer") as tx:
        draft = tx.begin()
        _write(draft, 2.0)
        with pytest.raises(RuntimeError, match="failed"), tx.discarded_on_failure():
            raise RuntimeError("the job failed")
    assert not store.exists(draft.version) and store.head().seq == 1


def test_a_fenced_draft_is_a_typed_error_and_left_to_the_job_that_fenced_it(tmp_path):
    store = _store(tmp_path)
    with store.transaction("stalled") as tx:
        draft = tx.begin()
        _write(draft, 1.0)
        assert gc.claim(store.backend, draft.version, gc.DEAD) == gc.DEAD  # another job
        with pytest.raises(storage.DraftFencedError, match="this job was fenced"):
            tx.raise_if_fenced()
        with pytest.raises(storage.DraftFencedError) as fenced:
            tx.commit("group")
        with pytest.raises(storage.DraftFencedError, match="this job was fenced"):
            try:
                raise fenced.value
            except storage.DraftFencedError:
                tx.fenced()
    assert store.head() is None and store.exists(draft.version)  # not this job's to delete


def test_a_fenced_draft_whose_number_another_job_committed_is_a_conflict(tmp_path):
    store = _store(tmp_path)
    with store.transaction("stalled") as tx:
        draft = tx.begin()
        _write(draft, 1.0)
        winner = store.begin()  # the job that took the store over, from the same head
        _write(winner, 2.0)
        store.commit(winner, "group", "winner")
        with pytest.raises(storage.CommitConflictError, match="committed by winner"):
            tx.fenced()
    assert not store.exists(draft.version)  # dead by its number: deleted by this job


def test_check_free_refuses_a_store_being_written_and_takes_nothing(tmp_path):
    store = _store(tmp_path)
    store.transaction("before the cluster starts").check_free()  # free: nothing taken
    with store.transaction("job one"):
        with pytest.raises(leases.LeaseHeldError, match="being written by another"):
            store.transaction("job two").check_free()
    store.transaction("job two").check_free()
    assert leases.Lease(store.path, "job three").read() is None  # none left behind
