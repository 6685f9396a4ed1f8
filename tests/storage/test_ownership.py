"""What slem-dask may delete or take for its own (issue 38 item 5 and 7): only what it
provably wrote, by content, never by a name a user can make; never a folder that two
stores share or that a symbolic link leads to."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from slem_dask import LinearSLEM, storage
from slem_dask.cli.main import main
from slem_dask.storage.nodes.export import PARTIAL_MARKER
from slem_dask.storage.versioning.markers import SharedFolderError


def _model(path, lam: float = 0.1) -> str:
    X = np.random.default_rng(0).standard_normal((40, 4))
    LinearSLEM(lam=lam).fit(X).save(str(path), overwrite=True)
    return str(path)


def _tree(path) -> dict[str, bytes]:
    """Every file under ``path``, with its bytes (what must be left as it is)."""
    root = Path(path)
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# -- export trusts its marker's content, not its name ---------------------------------------
@pytest.mark.parametrize(
    "marker",
    [
        b"",
        b"{}",
        json.dumps(
            {
                "to": "/elsewhere/plain.zarr",
                "path": "x",
                "version": 1,
                "folder": "f",
                "kind": "model",
            }
        ).encode(),
    ],
    ids=["empty", "not-an-export's", "copied-from-another-export"],
)
def test_export_never_deletes_a_users_folder_that_holds_a_file_named_like_its_marker(
    tmp_path, capsys, marker
):
    """A user's folder holding a file named `.slem-dask-export-unfinished` (empty, or one
    copied from another export) was deleted whole by `export`, without --overwrite."""
    model = _model(tmp_path / "m.zarr")
    users = tmp_path / "plain.zarr"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    (users / PARTIAL_MARKER).write_bytes(marker)
    before = _tree(users)
    for extra in ([], ["--overwrite"]):
        assert main(["export", model, "--to", str(users), *extra]) == 1
        err = capsys.readouterr().err
        assert "was not written by slem-dask" in err and len(err.strip().splitlines()) == 1
        assert _tree(users) == before


def test_an_unfinished_export_of_slem_dasks_is_still_replaced(tmp_path, monkeypatch):
    from slem_dask.storage.nodes import export as exporting

    model, out = _model(tmp_path / "m.zarr"), tmp_path / "plain.zarr"

    def fail(data, facts):  # the root document is the last thing written
        raise OSError("No space left on device")

    with monkeypatch.context() as m:
        m.setattr(exporting, "_with_provenance", fail)
        with pytest.raises(OSError, match="No space"):
            exporting.export(model, out)
    assert (out / PARTIAL_MARKER).exists() and not (out / "zarr.json").exists()
    exporting.export(model, out)  # its own marker: replaced without --overwrite
    assert not (out / PARTIAL_MARKER).exists()
    np.testing.assert_array_equal(
        storage.read_model_store(str(out))[1]["precision"],
        storage.read_model_store(model)[1]["precision"],
    )


# -- stores sharing a folder, folders reached through links ---------------------------------
def _versions(path) -> dict[str, bytes]:
    return _tree(Path(path) / "versions")


def test_two_stores_sharing_one_versions_folder_never_delete_each_others_versions(tmp_path, capsys):
    """issue 38 item 5: B's versions/ made a link to A's (a user tidying disks): a job
    on A deleted B's current version (B's folders looked like A's dead drafts)."""
    a, b = _model(tmp_path / "a.zarr"), _model(tmp_path / "b.zarr", lam=0.5)
    _model(b, lam=0.7)  # B: two versions
    for entry in (Path(b) / "versions").iterdir():
        entry.rename(Path(a) / "versions" / entry.name)
    (Path(b) / "versions").rmdir()
    os.symlink(Path(a) / "versions", Path(b) / "versions")
    b_before = storage.read_model_store(b)[1]["precision"]
    for lam in (0.2, 0.3, 0.4):  # jobs on A: each prunes and collects A's garbage
        _model(a, lam)
    assert storage.verify(a)[1] == []
    np.testing.assert_array_equal(storage.read_model_store(b)[1]["precision"], b_before)
    assert storage.verify(b)[1] == []
    # a job on B (whose folder is the link) is refused before it writes or deletes
    shared = _versions(a)
    capsys.readouterr()
    assert main(["rollback", b, "--to", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'versions' is a symbolic link" in err, err
    with pytest.raises(SharedFolderError, match="replace the link by a folder"):
        _model(b, lam=0.9)
    with pytest.raises(SharedFolderError):
        storage.versions.VersionedStore(b).collect_garbage()
    assert _versions(a) == shared


@pytest.mark.parametrize("folder", ["commits", "fates"])
def test_a_store_whose_own_folder_is_a_link_is_refused_before_anything_is_written(tmp_path, folder):
    path = _model(tmp_path / "m.zarr")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("someone's")
    if (Path(path) / folder).exists():
        for entry in (Path(path) / folder).iterdir():
            entry.rename(elsewhere / entry.name)
        (Path(path) / folder).rmdir()
    os.symlink(elsewhere, Path(path) / folder)
    before, linked = _tree(path), _tree(elsewhere)
    with pytest.raises(SharedFolderError, match=f"its folder '{folder}' is a symbolic link"):
        _model(path, lam=0.3)
    assert _tree(path) == before and _tree(elsewhere) == linked


def test_a_version_folder_that_is_a_link_is_never_deleted_nor_anything_through_it(tmp_path):
    path = _model(tmp_path / "m.zarr")
    first = storage.versions.VersionedStore(path).head().version
    moved = tmp_path / "other-disk" / first
    (Path(path) / "versions" / first).rename(moved.parent.mkdir() or moved)
    os.symlink(moved, Path(path) / "versions" / first)  # version 1, kept elsewhere
    linked = _tree(moved)
    for lam in (0.2, 0.3, 0.4, 0.5):  # version 1 falls out of the kept ones
        _model(path, lam)
    assert _tree(moved) == linked and os.path.islink(Path(path) / "versions" / first)
    assert storage.verify(path)[1] == []


# -- a user's folder is never taken for a store by a name it holds ---------------------------
@pytest.mark.parametrize(
    "planted",
    [
        ("versions/00000001-0123456789ab.slem-dask", b""),
        ("versions/00000001-0123456789ab.slem-dask", b"{}"),
        ("commits/00000001.json", b""),
        ("fates/00000001-0123456789ab", b"notes"),
    ],
    ids=["empty-marker", "blank-marker", "empty-record", "fate-named-file"],
)
def test_a_users_folder_holding_names_like_slem_dasks_is_never_taken_for_a_store(
    tmp_path, capsys, planted
):
    """issue 38 item 7: an empty `versions/<seq>-<hex>.slem-dask` made a user's folder a
    store (commits/, fates/, versions/, zarr.json written into it); an unreadable
    commit record made it one that --overwrite deletes whole."""
    users = tmp_path / "mine.zarr"
    (users / "data").mkdir(parents=True)
    (users / "data" / "notes.txt").write_text("mine")
    name, content = planted
    (users / name).parent.mkdir(parents=True, exist_ok=True)
    (users / name).write_bytes(content)
    before = _tree(users)
    assert not storage.versions.VersionedStore(str(users)).has_history()
    with pytest.raises(FileExistsError, match="was not written by slem-dask"):
        _model(users)
    assert _tree(users) == before and sorted(os.listdir(users)) == sorted(
        {"data", name.split("/")[0]}
    )
    capsys.readouterr()
    assert main(["verify", str(users)]) == 1
    out = capsys.readouterr().out
    assert ": unknown: 1 problem(s)" in out and "versioned" not in out, out


@pytest.mark.parametrize("how", ["moved", "copied"])
def test_a_store_moved_or_copied_still_collects_the_drafts_its_markers_name_elsewhere(
    tmp_path, how
):
    """A marker names the store that began the draft; a store moved or copied (its
    folders its own) still proves and deletes its killed jobs' drafts."""
    import shutil

    import zarr

    old = tmp_path / "old.zarr"
    store = storage.versions.VersionedStore(_model(old))
    killed = store.begin()  # a job killed after it began writing
    zarr.open_group(store=killed.location, mode="w")
    new = tmp_path / "new.zarr"
    (shutil.move if how == "moved" else shutil.copytree)(old, new)
    moved = storage.versions.VersionedStore(str(new))
    assert moved.drafts(killed.seq) == [killed.version]
    _model(new, lam=0.3)  # a job on the new path: the killed draft is its garbage
    assert not (new / "versions" / killed.version).exists()
    assert moved.head().seq == 2
