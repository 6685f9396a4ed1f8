"""A commit on a local file system names only bytes and names on stable storage
(slem_dask/storage/backends/local_durable.py): every file and folder of the version is
synced before its commit record is created, and the record's folder after it, so a
power loss after a reported commit cannot leave the version's chunks empty under it.

No test here cuts the power: they check the order of the system calls that make it
safe (fdatasync and fsync before the record's link), that a failing or hung sync
commits nothing, and that the encode's tasks start each chunk's writeback."""

from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest
import zarr

from slem_dask import LinearSLEM
from slem_dask.pipeline import encode_job
from slem_dask.storage.backends import deadlines, local_durable, outcomes
from slem_dask.storage.nodes import groups, outputs
from slem_dask.storage.versioning import versions

ARRAYS = {"w": np.arange(12.0).reshape(3, 4)}


@pytest.fixture
def calls(monkeypatch):
    """Every sync of a file or folder and every link, in order: (kind, path)."""
    seen: list[tuple[str, str]] = []
    sync_file, sync_folder, link = local_durable._sync_file, local_durable._sync_folder, os.link

    def file(path):
        seen.append(("file", path))
        sync_file(path)

    def folder(path):
        seen.append(("folder", path))
        sync_folder(path)

    def linked(src, dst, *args, **kwargs):
        link(src, dst, *args, **kwargs)
        seen.append(("link", str(dst)))

    monkeypatch.setattr(local_durable, "_sync_file", file)
    monkeypatch.setattr(local_durable, "_sync_folder", folder)
    monkeypatch.setattr(os, "link", linked)
    return seen


def _version_tree(path) -> tuple[list[str], list[str]]:
    """(files, folders) of the head version of the store at ``path``."""
    head = versions.VersionedStore(path).head()
    top = os.path.join(str(path), "versions", head.version)
    files, folders = [], []
    for folder, _, names in os.walk(top):
        folders.append(folder)
        files += [os.path.join(folder, n) for n in names]
    return files, folders


def _check_synced_before_its_record(path, seen, seq: int = 1) -> None:
    record = os.path.join(str(path), "commits", f"{seq:08d}.json")
    links = [i for i, (kind, p) in enumerate(seen) if kind == "link" and p == record]
    assert len(links) == 1, seen
    before = {p for kind, p in seen[: links[0]] if kind in ("file", "folder")}
    files, folders = _version_tree(path)
    assert files and set(files) <= before, set(files) - before  # every chunk, zarr.json
    # the version's own name, and the store's (a first commit made its folder)
    above = [os.path.join(str(path), "versions"), str(path), os.path.dirname(str(path))]
    assert set(folders + above) <= before, set(folders + above) - before
    after = [p for kind, p in seen[links[0] :] if kind == "folder"]
    assert os.path.join(str(path), "commits") in after  # the record's name, once linked


def test_a_group_is_on_stable_storage_before_its_commit_record(tmp_path, calls):
    path = tmp_path / "model.zarr"
    groups.write_group(path, {"kind": "t"}, ARRAYS, "test")
    _check_synced_before_its_record(path, calls)


def test_a_groups_chunks_start_their_writeback_as_each_array_is_written(tmp_path, monkeypatch):
    """A model's writer starts every chunk's writeback after each member array (at d =
    8192 the read-back of a 1 GiB model then overlaps with writing it to the disk), and
    before its group document, so before the commit that waits for them."""
    started: list[str] = []
    kick = local_durable._start_file_writeback
    monkeypatch.setattr(
        local_durable, "_start_file_writeback", lambda p: (started.append(p), kick(p))
    )
    written = groups.create_group_last
    monkeypatch.setattr(
        groups,
        "create_group_last",
        lambda *a, **k: (started.append("group document"), written(*a, **k))[1],
    )
    path = tmp_path / "model.zarr"
    arrays = {"w": np.arange(4096.0).reshape(1024, 4), "b": np.arange(3.0)}
    groups.write_group(path, {"kind": "t"}, arrays, "test")
    files = [p for p in _version_tree(path)[0] if not p.endswith("/zarr.json")]
    chunks = [p for p in files if "/c/" in p]
    assert len(chunks) == 2 and set(files) <= set(started), set(files) - set(started)
    assert started[-1] == "group document"


def _encode_inputs(tmp_path):
    rng = np.random.default_rng(0)
    negatives = rng.standard_normal((300, 8)).astype(np.float32)
    model = tmp_path / "model.zarr"
    LinearSLEM().fit(negatives).save(model)
    positives = tmp_path / "positives.zarr"
    arr = zarr.create_array(store=str(positives), shape=(64, 8), dtype="f4", chunks=(16, 8))
    arr[...] = rng.standard_normal((64, 8)).astype(np.float32)
    return str(model), str(positives)


def test_an_encode_starts_each_chunks_writeback_and_commits_it_on_stable_storage(
    tmp_path, calls, monkeypatch
):
    model, positives = _encode_inputs(tmp_path)
    started: list[int] = []
    kick = outputs.start_writeback
    monkeypatch.setattr(outputs, "start_writeback", lambda fd: (started.append(fd), kick(fd)))
    out = tmp_path / "codes.zarr"
    encode_job(None, model, positives, str(out), partition_rows=16)
    assert len(started) == 4  # one per partition, as its task wrote it
    _check_synced_before_its_record(out, calls)
    chunks = [p for p in _version_tree(out)[0] if "/c/" in p]
    assert len(chunks) == 4


def test_writeback_starts_on_linux_and_is_skipped_elsewhere(tmp_path, monkeypatch):
    with open(tmp_path / "f", "wb") as f:
        f.write(b"x" * 4096)
        local_durable.start_writeback(f.fileno())  # never fails a write
    local_durable._sync_file_range.cache_clear()
    monkeypatch.setattr(local_durable.sys, "platform", "darwin")
    assert local_durable._sync_file_range() is None
    local_durable._sync_file_range.cache_clear()
    monkeypatch.undo()
    if os.uname().sysname == "Linux":
        assert local_durable._sync_file_range() is not None


def test_a_sync_that_fails_commits_nothing(tmp_path, monkeypatch):
    """fdatasync's EIO: the bytes may not be on the disk, so no record names them;
    readers keep the version they had."""
    path = tmp_path / "model.zarr"
    groups.write_group(path, {"kind": "t"}, ARRAYS, "test")

    def failing(p):
        raise OSError(errno.EIO, "Input/output error", p)

    monkeypatch.setattr(local_durable, "_sync_file", failing)
    with pytest.raises(OSError) as raised:
        groups.write_group(path, {"kind": "t"}, {"w": ARRAYS["w"] + 1}, "test", overwrite=True)
    assert "\n" not in str(raised.value)
    assert versions.VersionedStore(path).head().seq == 1
    assert not os.path.exists(tmp_path / "model.zarr" / "commits" / "00000002.json")


def test_a_sync_that_never_returns_meets_the_deadline_and_commits_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(deadlines.ENV_TIMEOUT, "0.5")
    monkeypatch.setenv(deadlines.ENV_ATTEMPTS, "2")
    answer = threading.Event()
    sync_file = local_durable._sync_file

    def hung(path):
        answer.wait()
        sync_file(path)

    monkeypatch.setattr(local_durable, "_sync_file", hung)
    path = tmp_path / "model.zarr"
    try:
        with pytest.raises(outcomes.OutcomeUnknownError) as raised:
            groups.write_group(path, {"kind": "t"}, ARRAYS, "test")
    finally:
        answer.set()
    line = str(raised.value)
    assert "\n" not in line and "make_durable" in line and "within 1 s" in line, line
    assert versions.VersionedStore(path).head() is None  # nothing was committed


def test_a_draft_condemned_while_it_is_synced_is_fenced_not_a_crash(tmp_path, monkeypatch):
    """Another job that took the store over deletes this draft while the commit syncs
    it: the files that went are not synced, and the claim that follows refuses it
    (seen in the suite: the walk met a deleted zarr.json and failed the job with
    FileNotFoundError)."""
    from slem_dask.storage.versioning import gc

    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    draft = store.begin()
    zarr.open_group(store=draft.location, mode="w").attrs["i"] = 1
    sync_file = local_durable._sync_file

    def condemned_first(path):
        if not condemned_first.done:
            condemned_first.done = True
            gc.collect(store, versions.KEEP_VERSIONS, leased=True)
        sync_file(path)

    condemned_first.done = False
    monkeypatch.setattr(local_durable, "_sync_file", condemned_first)
    with pytest.raises(gc.DraftFencedError):
        store.commit(draft, "model", "stalled job")
    assert condemned_first.done and store.head() is None and not store.exists(draft.version)


def test_an_encodes_printed_total_includes_its_commit(tmp_path, monkeypatch):
    """The report's total was taken before the commit: a commit retried against a slow
    store (24 s) was missing from a 39.6 s run's "total [s] 15.89"."""
    import time

    model, positives = _encode_inputs(tmp_path)
    commit = versions.VersionedStore.commit

    def slow(self, *args, **kwargs):
        time.sleep(1.0)
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(versions.VersionedStore, "commit", slow)
    report = encode_job(None, model, positives, str(tmp_path / "codes.zarr"), partition_rows=16)
    timings = report.timings
    assert list(timings)[-2:] == ["commit", "total"] and timings["commit"] >= 1.0, timings
    assert timings["total"] >= timings["open"] + timings["encode+write"] + timings["commit"]
