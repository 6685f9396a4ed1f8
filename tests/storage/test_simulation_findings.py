"""Storage-protocol bugs found by the deterministic simulation (tests/sim/,
docs/testing-faults.md), each as a plain test on a local store; the simulation's
sweeps (tests/system/test_protocol_simulation.py) are their regression tests under faults."""

import json
from pathlib import Path

import pytest
import zarr

from slem_dask import storage
from slem_dask.storage.versioning import gc
from slem_dask.storage.versioning import versions


def _committed(store, value, job="job"):
    draft = store.begin()
    group = zarr.open_group(store=draft.location, mode="w")
    group.attrs["value"] = value
    group.create_array("x", shape=(4,), dtype="f8", chunks=(2,))[...] = value
    return store.commit(draft, "model", job)


def _value(path):
    return storage.open_node(path).attrs["value"]


def test_a_failed_clean_up_after_the_record_does_not_fail_the_commit(tmp_path, monkeypatch):
    """commit(): the record landed, then deleting the number's dead drafts failed (a
    503): the job's version is what readers see, so the job succeeds (found with seed 2
    of mode errors: the job reported the 503)."""
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))

    def unavailable(*_):
        raise OSError("503 SlowDown")

    monkeypatch.setattr(gc, "after_commit", unavailable)
    commit = _committed(store, 1.0)
    assert commit.seq == 1 and store.head() == commit and _value(store.path) == 1.0


def test_a_failed_read_back_of_the_record_is_tried_again(tmp_path):
    """_publish: the read-back of a created record fails once (a lost reply): it is
    resolved by trying again, not reported as the read's error (seed 1 of mode all)."""
    import types

    from slem_dask.storage.backends.outcomes import at_the_boundary

    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    real, failed = store.backend.read, []

    def read(self, key):
        if key == "commits/00000001.json" and not failed:  # the record, not the head hint
            failed.append(key)
            raise OSError("connection lost (reply)")
        return real(key)

    # through the backend's boundary, as its own read would fail (issue 38)
    store.backend.read = types.MethodType(at_the_boundary(read), store.backend)
    draft = store.begin()
    zarr.open_group(store=draft.location, mode="w").attrs["value"] = 1.0
    assert store.commit(draft, "model", "job").seq == 1 and failed


def test_a_rollback_survives_a_stale_prune_of_the_old_folder(tmp_path):
    """rollback commits a copy of the old version in a draft of its own: a job whose
    lease was taken over and that still prunes by its old listing of the commits
    deletes the old folder, and the head stays whole (seed 7 and 407 of interleave:
    the head named a deleted folder)."""
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    first = _committed(store, 1.0)
    _committed(store, 2.0)
    back = store.rollback(1)
    assert back.seq == 3 and back.source == "rollback to 1" and back.version != first.version
    store.delete_version(first.version)  # the stale prune
    assert store.check(store.head()) and _value(store.path) == 1.0
    assert storage.open_node(store.path)["x"][...].tolist() == [1.0] * 4
    assert store.rollback(1) == store.head()  # already current: nothing committed


def test_a_version_deleted_in_part_is_never_whole(tmp_path, monkeypatch):
    """A prune that stops part-way (a crash, a failed request) deletes the version's
    zarr.json first: a rollback to it is refused, never committed with a chunk missing
    (seed 58 of lost_reply)."""
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    old = _committed(store, 1.0)
    _committed(store, 2.0)
    real = store.backend.remove_tree

    def stops(prefix):
        (Path(store.location(old.version)) / "x" / "c" / "1").unlink()
        raise OSError("connection lost")

    monkeypatch.setattr(store.backend, "remove_tree", stops)
    with pytest.raises(OSError):
        store.delete_version(old.version)
    monkeypatch.setattr(store.backend, "remove_tree", real)
    assert not store.exists(old.version)
    with pytest.raises(versions.DamagedCommitError, match="pruned or deleted"):
        store.rollback(1)
    assert store.head().seq == 2 and _value(store.path) == 2.0


def test_what_a_fenced_job_wrote_after_its_draft_was_condemned_is_deleted(tmp_path):
    """A fenced job's worker writes a chunk into its draft after a lease holder
    condemned it (marker gone): the fate file is the last proof that slem-dask wrote
    it, so the folder goes before the fate file is forgotten (crash seed 231 with
    --bound: the folder stayed for good)."""
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    _committed(store, 1.0)
    fenced = store.begin()
    zarr.open_group(store=fenced.location, mode="w").attrs["value"] = 9.0
    assert gc.condemn(store, fenced.version)
    stray = Path(fenced.location) / "x" / "c" / "0"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"late")  # the worker's write in flight lands
    _committed(store, 2.0)  # its number is committed: the folder goes, the file stays
    store.collect_garbage()
    assert not Path(fenced.location).exists()
    assert (Path(store.path.location) / gc.FATES / fenced.version).read_text() == gc.DEAD


def _lands_late(draft) -> Path:
    """A write of ``draft``'s job, in flight (a slow or timed-out request, a worker's
    task still running) while the draft was deleted, lands now: the folder is regrown,
    without its marker."""
    stray = Path(draft.location) / "x" / "c" / "0"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"late")
    return stray


@pytest.mark.parametrize("how", ["condemned", "lost its number", "abandoned"])
def test_a_write_that_lands_after_every_clean_up_is_deleted_by_the_next_job(tmp_path, how):
    """A draft is deleted (condemned by the job that took the store over; deleted as
    the other draft of a number that job committed; abandoned by its own job), its
    number committed and every clean-up done; then a write of its job that was in
    flight lands, regrowing the folder without a marker. Its fate file, kept for good,
    proves the folder slem-dask's: the next collection deletes it (garbage beyond the
    bound before: crash seeds 321 and 490, all seeds 1 and 34 with --bound, where the
    folder stayed for good)."""
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    _committed(store, 1.0)
    draft = store.begin()
    zarr.open_group(store=draft.location, mode="w").attrs["value"] = 9.0
    if how == "condemned":
        assert gc.condemn(store, draft.version)
    elif how == "abandoned":
        store.abandon(draft)
    _committed(store, 2.0)  # the number is committed: after_commit deletes the loser
    store.collect_garbage()
    assert not Path(draft.location).exists()
    _lands_late(draft)
    store.collect_garbage()
    assert not Path(draft.location).exists()
    assert store.head().seq == 2 and _value(store.path) == 2.0
    assert gc.fate_of(store.backend, draft.version) == gc.DEAD


def test_a_folder_named_like_a_draft_without_marker_or_fate_file_is_kept(tmp_path):
    """The other side of the rule: a folder named like a draft that slem-dask has no
    proof of writing (no marker, no fate file, no commit record) is never deleted."""
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    _committed(store, 1.0)
    users = Path(store.path.location) / "versions" / "00000001-0123456789ab"
    (users / "notes").mkdir(parents=True)
    _committed(store, 2.0)
    store.collect_garbage()
    store.make_room()
    assert (users / "notes").is_dir()


def test_a_group_whose_commit_outcome_is_unknown_keeps_its_draft(tmp_path, monkeypatch):
    """write_group: every create of the commit record times out, and the job says it
    cannot learn whether the version was committed; the request lands later: the
    record names the draft, so the draft must still be there (it was abandoned, i.e.
    deleted: found by tests/system/test_protocol_simulation.py's late-landing test)."""
    import numpy as np

    from slem_dask.storage.nodes import groups
    from slem_dask.storage.backends.local import LocalBackend
    from slem_dask.storage.backends.outcomes import at_the_boundary

    path, sent, real = str(tmp_path / "m.zarr"), [], LocalBackend.create

    def create(self, key, data):
        if key.startswith("commits/"):
            sent.append((self, key, data))
            raise TimeoutError(f"{key}: read timeout (the request may still arrive)")
        return real(self, key, data)

    # through the backend's boundary, as its own create would fail (issue 38)
    monkeypatch.setattr(LocalBackend, "create", at_the_boundary(create))
    with pytest.raises(versions.CommitUnknownError, match="cannot learn whether version 1"):
        groups.write_group(path, {"kind": "search"}, {"x": np.ones(4)}, "search result")
    monkeypatch.undo()
    backend, key, data = sent[0]
    assert real(backend, key, data)  # the first request lands
    store = versions.VersionedStore(path)
    assert store.check(store.head())  # the head's version is there, whole


def test_a_local_write_whose_empty_folder_is_pruned_meanwhile_makes_it_again(tmp_path, monkeypatch):
    """Another job's prune_empty (a failed first write leaves no store) removes the
    folder a local write just made, still empty, before the write opens its private
    file: the write makes it again, rather than failing FileNotFoundError (found by the
    simulation through the real LocalBackend: local interleave seed 14)."""
    import os

    from slem_dask.storage.backends import local
    from slem_dask.storage.backends.local import LocalBackend

    real_makedirs, pruned = os.makedirs, []

    def makedirs(path, exist_ok=False):
        real_makedirs(path, exist_ok=exist_ok)
        if not pruned and path.endswith("0123456789ab"):  # another job's rmdir, right after
            pruned.append(path)
            os.rmdir(path)

    monkeypatch.setattr(local.os, "makedirs", makedirs)
    backend = LocalBackend(str(tmp_path / "P.zarr"))
    backend.put("versions/00000001-0123456789ab/zarr.json", b"{}")
    assert pruned
    assert backend.read("versions/00000001-0123456789ab/zarr.json") == b"{}"


def _retransmitted(real):
    """An NFS call whose first reply was lost: done, then resent, and the resent one
    answers ENOENT (the name is already gone)."""

    def call(*args):
        real(*args)
        real(*args)  # FileNotFoundError, as the server answers the retransmission

    return call


def test_a_retransmitted_unlink_of_the_private_file_does_not_fail_a_create(tmp_path, monkeypatch):
    """NFS: LocalBackend.create linked its record, then the unlink of its private file
    answered ENOENT (a retransmission): the create succeeded and says so (found with
    seed 4, now 2, of mode nfs on local disk: the commit was reported failed)."""
    from slem_dask.storage.backends import local

    backend = local.LocalBackend(str(tmp_path))
    fake_os = type(local.os)("os")
    fake_os.__dict__.update(vars(local.os))
    fake_os.remove = _retransmitted(local.os.remove)
    monkeypatch.setattr(local, "os", fake_os)
    assert backend.create("commits/00000001.json", b"record") is True
    assert backend.read("commits/00000001.json") == b"record"
    assert sorted(p.name for p in (tmp_path / "commits").iterdir()) == ["00000001.json"]
    fake_os.replace = _retransmitted(local.os.replace)
    backend.put("versions/v/zarr.json", b"meta")  # a resent rename: ENOENT as well
    assert backend.read("versions/v/zarr.json") == b"meta"


def _plant(folder: Path, name: str, data: bytes = b"x") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return folder / name


def test_private_files_of_killed_local_writes_are_deleted_once_settled(tmp_path):
    """A local write killed between its private file and its link leaves
    ``<name>.<32 hex>.tmp``: a job killed as it created its commit record leaves its draft
    too, and the job that deletes that draft deletes the record's private file; in fates/
    and versions/ they go once their number is 8 commits old; nothing else named like
    them goes (found by the long history on local disk, crash seeds 1 and 2: they
    stayed for good)."""
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    _committed(store, 1.0)
    killed = store.begin()  # number 2: killed as it created commits/00000002.json
    root, hex32 = tmp_path / "s.zarr", "0123456789abcdef" * 2
    doomed = [
        _plant(root / "commits", f"00000002.json.{hex32}.tmp"),
        _plant(root / "commits", f".head.{hex32}.tmp"),
        _plant(root / "fates", f"{killed.version}.{hex32}.tmp"),
        _plant(root / "versions", f"{killed.version}.slem-dask.{hex32}.tmp"),
    ]
    kept = [
        _plant(root / "commits", "notes.txt"),
        _plant(root / "commits", "00000002.json.tmp"),  # not a private file's name
        _plant(root / "fates", f"00000099-0123456789ab.{hex32}.tmp"),
        _plant(root / "versions", f"00000002-notes.{hex32}.tmp"),
    ]
    _committed(store, 2.0)  # number 2 by another job: the killed draft goes, and with it
    assert [p.exists() for p in doomed] == [False, False, True, True]  # its record's
    for value in range(3, 12):
        _committed(store, float(value))
    store.collect_garbage()
    assert [p.exists() for p in doomed] == [False] * 4
    assert all(p.exists() for p in kept)


def test_private_files_of_the_lease_are_deleted_by_its_next_holder_by_their_content(tmp_path):
    """Beside the store (the user's folder) a private copy of the lease goes only when it
    holds a whole lease record of this store from another job."""
    from slem_dask.storage.versioning.leases import Lease

    target, hex32 = tmp_path / "s.zarr", "0123456789abcdef" * 2
    lease = Lease(str(target), "old job")
    name = f".s.zarr.slem-dask-lease.{hex32}.tmp"
    old = _plant(tmp_path, name, json.dumps(lease._record()).encode())
    other = json.dumps({**lease._record(), "store": "file:///elsewhere.zarr"}).encode()
    kept = [
        _plant(tmp_path, name.replace("0123", "4567"), b""),  # empty: proves nothing
        _plant(tmp_path, name.replace("0123", "89ab"), other),  # another store's
        _plant(tmp_path, f"notes.{hex32}.tmp", old.read_bytes()),  # not the lease's
    ]
    taken = Lease(str(target), "new job").acquire()
    try:
        assert not old.exists() and all(p.exists() for p in kept)
    finally:
        taken.release()


def test_a_create_whose_private_file_was_collected_reads_its_name_back(tmp_path, monkeypatch):
    """A create whose private file another job's collection deleted before its link: a
    stalled create of a record whose number was committed meanwhile is a lost race,
    never a missing file; a create racing for a lease that another job took and
    released meanwhile tries again (found by the local sweep, interleave seed 18, while
    this fix was made: the job failed with FileNotFoundError)."""
    from slem_dask.storage.backends import local

    backend = local.LocalBackend(str(tmp_path))
    assert backend.create("commits/00000001.json", b"the winner's")
    fake_os = type(local.os)("os")
    fake_os.__dict__.update(vars(local.os))
    collections, real = [], local.os

    def collected_then_link(src, dst):
        if len(collections) < 2:  # gc._forget_private_copies, before the link
            collections.append(src)
            real.remove(src)
        real.link(src, dst)

    fake_os.link = collected_then_link
    monkeypatch.setattr(local, "os", fake_os)
    assert backend.create("commits/00000001.json", b"a stalled job's") is False
    assert backend.create(".s.zarr.slem-dask-lease", b"a racer's") is True
    assert backend.read(".s.zarr.slem-dask-lease") == b"a racer's" and len(collections) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".s.zarr.slem-dask-lease", "commits"]
