"""Outputs read by zarr, xarray, dask and FAISS users (issue 31, "Encodings out to every
reader"; issue 30 item 7): plain zarr on a store writes nothing and names the right
call, a read-only zarr store pinned to one version, pruning said (or NaN, never zeros),
`slem-dask export`, and the documented snippets (docs/reading-outputs.md) run."""

import json
import os
import pickle
import re
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr

import slem_dask
from slem_dask import load_model, storage
from slem_dask.cli.main import main
from slem_dask.storage import VersionStore, verify
from slem_dask.storage.versioning import ownership
from slem_dask.storage.nodes import readers
from slem_dask.storage.versioning import versions
from slem_dask.storage.nodes.export import PARTIAL_MARKER

from helpers import ROOT, encode_corpus, expected_encoding, head, recommit

RIGHT_CALL = "slem_dask.open_zarr"


def _files(path) -> dict[str, bytes]:
    out = {}
    for folder, _, names in os.walk(path):
        for name in names:
            full = os.path.join(folder, name)
            out[os.path.relpath(full, path)] = Path(full).read_bytes()
    return out


@pytest.fixture
def codes(corpus):
    out = corpus["dir"] / "codes.zarr"
    encode_corpus(corpus, out)
    return out


# -- plain zarr on P ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call",
    [
        lambda p: zarr.open(p),
        lambda p: zarr.open(p, mode="r"),
        lambda p: zarr.open_array(p),
        lambda p: da.from_zarr(p),
    ],
)
def test_plain_zarr_on_an_output_writes_nothing_and_names_the_right_call(codes, call):
    before = _files(codes)
    with pytest.raises(Exception, match=re.escape(RIGHT_CALL)):
        call(str(codes))
    assert _files(codes) == before


@pytest.mark.parametrize(
    "call",
    [
        lambda p: zarr.open(p),
        lambda p: zarr.open_group(p),
        lambda p: __import__("xarray").open_zarr(p),
    ],
)
def test_plain_zarr_on_a_model_writes_nothing_and_names_the_right_call(corpus, call):
    before = _files(corpus["model"])
    with pytest.raises(Exception, match=re.escape(RIGHT_CALL)):
        call(corpus["model"])
    assert _files(corpus["model"]) == before


@pytest.mark.parametrize(
    "call", [lambda p: zarr.open_group(p), lambda p: __import__("xarray").open_zarr(p)]
)
def test_other_plain_calls_on_an_output_fail_and_write_nothing(codes, call):
    before = _files(codes)
    with pytest.raises(zarr.errors.ContainsArrayError):
        call(str(codes))
    assert _files(codes) == before


def test_slem_dask_reads_verifies_and_rewrites_a_store_with_its_marker(corpus, codes, capsys):
    assert readers.is_root_marker((codes / "zarr.json").read_bytes())
    assert verify(codes) == ("output, version 1", [])
    assert ownership.slem_dask_kind(ownership.canonical(codes)) == "encoding"
    ownership.check_may_replace(codes, "--out", kind="encoding")  # no refusal
    np.testing.assert_array_equal(
        slem_dask.storage.read_all(codes), expected_encoding(corpus, corpus["pos"])
    )
    encode_corpus(corpus, codes, corpus["others"], overwrite=True)
    np.testing.assert_array_equal(
        slem_dask.storage.read_all(codes), expected_encoding(corpus, corpus["other"])
    )
    assert main(["verify", str(codes), corpus["model"]]) == 0
    capsys.readouterr()
    assert main(["versions", str(codes)]) == 0
    header, legend, *listed = capsys.readouterr().out.splitlines()
    assert header.startswith(f"{storage.canonical(codes)}: 2 version(s) committed"), header
    assert legend.split() == [
        "N",
        "kind",
        "state",
        "committed",
        "(UTC)",
        "by,",
        "then",
        "what",
        "it",
        "holds",
        "and",
        "its",
        "folder",
    ]
    # what each version encodes (stop 52)
    identity = slem_dask.load_model(corpus["model"]).identity_[:16]
    assert [line.split("  encodes ")[1].split("  ")[0] for line in listed] == [
        f"{str(storage.canonical(corpus[k]))!r} with model identity {identity}"
        for k in ("positives", "others")
    ], listed
    assert main(["rollback", str(codes), "--to", "1"]) == 0
    assert verify(codes) == ("output, version 3", [])
    assert ownership.unreadable_document(ownership.canonical(codes)) is None


def test_the_marker_replaces_the_empty_group_plain_zarr_wrote_and_nothing_else(corpus, codes):
    root = codes / "zarr.json"
    root.unlink()  # a store committed by an earlier release ...
    zarr.open(str(codes))  # ... where plain zarr wrote an empty group
    assert json.loads(root.read_bytes())["node_type"] == "group"
    encode_corpus(corpus, codes, corpus["others"], overwrite=True)  # the next commit
    assert readers.is_root_marker(root.read_bytes())
    marker = root.read_bytes()
    readers.mark_store_root(versions.VersionedStore(str(codes)), "encoding")  # idempotent
    assert root.read_bytes() == marker

    foreign = json.dumps(
        {"zarr_format": 3, "node_type": "group", "attributes": {"mine": 1}}
    ).encode()
    root.write_bytes(foreign)  # a document somebody else wrote is never replaced
    encode_corpus(corpus, codes, overwrite=True)
    assert root.read_bytes() == foreign


def test_a_lost_reply_to_the_markers_create_is_resolved_by_reading_it_back(codes):
    store = versions.VersionedStore(str(codes))
    calls = []

    class LostReply(store.backend.__class__):
        def create(self, key, data):
            calls.append(key)
            super().create(key, data)  # applied ...
            return False  # ... but the retry was told it exists

    (codes / "zarr.json").unlink()
    store.backend.__class__ = LostReply
    readers.mark_store_root(store, "encoding")
    assert calls == ["zarr.json"]
    assert (codes / "zarr.json").read_bytes() == readers.root_document("encoding")


# -- a store pinned to one version -------------------------------------------------------------
def test_version_store_opens_in_zarr_xarray_and_dask(corpus, codes):
    import xarray as xr

    expected = expected_encoding(corpus, corpus["pos"])
    group = zarr.open(VersionStore(codes))
    assert isinstance(group, zarr.Group) and list(group.array_keys()) == ["encodings"]
    np.testing.assert_array_equal(group["encodings"][...], expected)

    ds = xr.open_zarr(VersionStore(codes))
    assert ds.encodings.dims == ("image", "feature")
    np.testing.assert_array_equal(ds.encodings.values, expected)
    assert ds.encodings.attrs["slem_dask"]["kind"] == "encoding"
    assert slem_dask.open_dataset(codes).encodings.dims == ("image", "feature")

    x = da.from_zarr(VersionStore(codes), component="encodings")
    y = da.from_zarr(VersionStore(codes, group=False))
    z = da.from_zarr(slem_dask.open_zarr(codes))
    for arr in (x, y, z):
        assert arr.chunks[0] == (40,) * 5
        np.testing.assert_array_equal(arr.compute(), expected)
    restored = pickle.loads(pickle.dumps(VersionStore(codes)))  # as dask workers get it
    np.testing.assert_array_equal(zarr.open(restored)["encodings"][...], expected)


def test_version_store_writes_nothing(codes):
    before = _files(codes)
    store = VersionStore(codes, group=False)
    with pytest.raises(ValueError, match="read-only"):
        zarr.open(store, mode="a")
    with pytest.raises(ValueError, match="read-only"):
        zarr.create_array(store, shape=(2,), dtype="f4", overwrite=True)
    arr = zarr.open(store)
    with pytest.raises(ValueError, match="read-only"):
        arr[0] = 1
    assert _files(codes) == before


def test_new_outputs_carry_dimension_names_and_old_ones_get_them_in_the_view(corpus, codes):
    import xarray as xr

    doc = json.loads((head(codes) / "zarr.json").read_bytes())
    assert doc["dimension_names"] == ["image", "feature"]
    del doc["dimension_names"]  # an output written before they were recorded
    (head(codes) / "zarr.json").write_text(json.dumps(doc))
    recommit(codes)
    assert xr.open_zarr(VersionStore(codes)).encodings.dims == ("image", "feature")
    assert "dimension_names" not in json.loads((head(codes) / "zarr.json").read_bytes())


def test_a_pinned_version_stays_and_the_current_one_moves(corpus, codes):
    encode_corpus(corpus, codes, corpus["others"], overwrite=True)
    np.testing.assert_array_equal(
        slem_dask.open_zarr(codes, version=1)[...], expected_encoding(corpus, corpus["pos"])
    )
    np.testing.assert_array_equal(
        slem_dask.open_zarr(codes)[...], expected_encoding(corpus, corpus["other"])
    )
    with pytest.raises(versions.VersionError, match="has no version 7"):
        VersionStore(codes, version=7)
    with pytest.raises(versions.VersionError, match="not a slem-dask versioned store"):
        slem_dask.open_zarr(corpus["positives"])
    with pytest.raises(FileNotFoundError, match="no store at"):
        slem_dask.open_zarr(corpus["dir"] / "nothing.zarr")


def test_groups_open_too(corpus):
    import xarray as xr

    model = slem_dask.open_zarr(corpus["model"])
    assert isinstance(model, zarr.Group) and "precision" in model
    ds = xr.open_zarr(VersionStore(corpus["model"]))
    np.testing.assert_array_equal(ds["precision"].values, model["precision"][...])


def test_a_member_of_a_versioned_group_opens_as_its_array(corpus):
    import xarray as xr

    from slem_dask.storage import write_group

    path = str(corpus["dir"] / "corpus.zarr")
    write_group(
        path, {"kind": "corpus"}, {"negatives": corpus["neg"], "database": corpus["pos"]}, "corpus"
    )
    arr = slem_dask.open_zarr(f"{path}/negatives")
    assert isinstance(arr, zarr.Array)
    np.testing.assert_array_equal(arr[...], corpus["neg"])
    ds = xr.open_zarr(VersionStore(f"{path}/negatives"))
    assert list(ds.data_vars) == ["negatives"]
    np.testing.assert_array_equal(ds.negatives.values, corpus["neg"])
    both = slem_dask.open_dataset(path)
    np.testing.assert_array_equal(both.database.values, corpus["pos"])


# -- pruning -----------------------------------------------------------------------------------
def _prune_version_1(corpus, codes):
    for i in range(versions.KEEP_VERSIONS):  # the third new job prunes version 1
        encode_corpus(corpus, codes, corpus["others"] if i % 2 == 0 else None, overwrite=True)
    store = versions.VersionedStore(str(codes))
    assert not store.exists(store.commit_at(1).version)


def test_a_reader_pinned_to_a_pruned_version_is_told_so(corpus, codes):
    arr = slem_dask.open_zarr(codes)  # a reader holds version 1 ...
    lazy = da.from_zarr(VersionStore(codes), component="encodings")
    _prune_version_1(corpus, codes)  # ... that gets pruned
    with pytest.raises(versions.VersionError, match="version 1 .* was pruned"):
        arr[0:40]
    with pytest.raises(versions.VersionError, match="was pruned"):
        lazy.compute()
    with pytest.raises(versions.VersionError, match="pruned"):
        VersionStore(codes, version=1)


def test_a_model_being_pruned_under_a_reader_is_said_not_read_as_zeros(corpus):
    """S3 deletes a folder's keys in name order: the chunks ("c/...") go before the
    zarr.json. A reader of a model (a group, whose all-zero chunks zarr may skip) that
    meets a missing chunk of a version that newer commits made prunable is told so."""
    model = Path(corpus["model"])
    precision = slem_dask.open_zarr(model)["precision"]  # version 1
    document = (head(model) / "zarr.json").read_bytes()
    folder = head(model)
    for lam in (0.2, 0.3, 0.4):
        slem_dask.LinearSLEM(lam=lam).fit(corpus["neg"]).save(str(model), overwrite=True)
    assert not folder.exists()  # version 1 pruned ...
    folder.mkdir()
    (folder / "zarr.json").write_bytes(document)  # ... all but its zarr.json, so far
    with pytest.raises(versions.VersionError, match="version 1 .* was pruned"):
        precision[...]


def test_a_plain_reader_of_a_pruned_version_reads_nan_never_zeros(corpus, codes):
    folder = head(codes)  # the way a plain reader finds it (`slem-dask versions P`)
    plain = zarr.open(str(folder), mode="r")
    assert np.isfinite(plain[...]).all()
    _prune_version_1(corpus, codes)
    try:
        rows = plain[...]
    except Exception:  # noqa: BLE001 - an error is as good as NaN
        return
    assert not np.isfinite(rows).any()


# -- export ------------------------------------------------------------------------------------
def test_export_to_zarr_and_npy_round_trips(corpus, codes, capsys):
    encode_corpus(corpus, codes, corpus["others"], overwrite=True)
    out, npy = corpus["dir"] / "plain.zarr", corpus["dir"] / "plain.npy"
    assert main(["export", str(codes), "--to", str(out), "--version", "1"]) == 0
    assert main(["export", str(codes), "--to", str(npy)]) == 0
    assert "version 1 (encoding (200, 8) float32) exported" in capsys.readouterr().out
    group = zarr.open(str(out), mode="r")  # a plain zarr group: no versions
    plain = group["encodings"]  # the array, as VersionStore shows it (xarray opens groups)
    assert isinstance(plain, zarr.Array) and plain.metadata.dimension_names == ("image", "feature")
    assert sorted(os.listdir(out)) == ["encodings", "zarr.json"]
    np.testing.assert_array_equal(plain[...], expected_encoding(corpus, corpus["pos"]))
    np.testing.assert_array_equal(np.load(npy), expected_encoding(corpus, corpus["other"]))
    assert group.attrs["slem_dask_export"]["version"] == 1
    assert verify(out) == ("output", [])  # slem-dask reads it like one it wrote

    assert main(["export", str(codes), "--to", str(out)]) == 1  # exists: --overwrite
    assert "pass --overwrite" in capsys.readouterr().err
    assert main(["export", str(codes), "--to", str(out), "--overwrite"]) == 0
    np.testing.assert_array_equal(
        zarr.open(str(out), mode="r")["encodings"][...], expected_encoding(corpus, corpus["other"])
    )
    assert main(["export", str(codes), "--to", str(npy)]) == 1  # a .npy is never replaced
    assert "never replaces" in capsys.readouterr().err


def test_export_creates_the_folders_of_a_npy_as_of_a_zarr(corpus, codes, capsys):
    for name in ("sub/dir/x.npy", "sub2/dir/x.zarr"):
        assert main(["export", str(codes), "--to", str(corpus["dir"] / name)]) == 0, (
            capsys.readouterr().err
        )
    np.testing.assert_array_equal(
        np.load(corpus["dir"] / "sub/dir/x.npy"),
        zarr.open(str(corpus["dir"] / "sub2/dir/x.zarr"), mode="r")["encodings"][...],
    )
    assert [f for f in os.listdir(corpus["dir"] / "sub/dir")] == ["x.npy"]  # no .partial


def test_export_refuses_a_target_neither_zarr_nor_npy(corpus, codes, capsys):
    assert main(["export", str(codes), "--to", str(corpus["dir"] / "x.txt")]) == 1
    err = capsys.readouterr().err
    assert "x.txt' ends neither in .zarr nor in .npy" in err and len(err.splitlines()) == 1
    assert not (corpus["dir"] / "x.txt").exists()


@pytest.mark.parametrize("name", ["x.npy", "x.zarr", "sub/x.npy"])
def test_export_under_a_file_says_so_in_one_line_naming_to(corpus, codes, capsys, name):
    (corpus["dir"] / "afile").write_text("not a folder")
    to = str(corpus["dir"] / "afile" / name)
    assert main(["export", str(codes), "--to", to]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"slem-dask export: error: --to {to!r}: {str(corpus['dir'] / 'afile')!r} is "
        f"a file, not a folder; give an output path whose parent is a folder"
    ), err
    assert (corpus["dir"] / "afile").read_text() == "not a folder"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no procfs at /proc")
def test_export_to_a_kernel_file_system_says_so_without_errno(codes, capsys):
    assert main(["export", str(codes), "--to", "/proc/x.npy"]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith(
            "slem-dask export: error: --to '/proc/x.npy': the folder '/proc' is "
            "on a proc file system"
        )
        and "Errno" not in err
    ), err


def test_export_of_a_model_loads_and_nothing_foreign_is_replaced(corpus, capsys):
    out = corpus["dir"] / "model-plain.zarr"
    assert main(["export", corpus["model"], "--to", str(out)]) == 0
    np.testing.assert_array_equal(
        load_model(str(out)).precision_, load_model(corpus["model"]).precision_
    )
    assert main(["export", corpus["model"], "--to", str(corpus["dir"] / "m.npy")]) == 1
    assert "not an array" in capsys.readouterr().err
    assert main(["export", corpus["model"], "--to", corpus["positives"], "--overwrite"]) == 1
    assert "was not written by slem-dask" in capsys.readouterr().err


def test_an_unfinished_export_never_looks_valid_and_is_replaced(corpus, codes, monkeypatch):
    from slem_dask.storage.nodes import export as exporting

    out = corpus["dir"] / "plain.zarr"

    def fail(data, facts):  # the root document is the last thing written
        raise OSError("No space left on device")

    monkeypatch.setattr(exporting, "_with_provenance", fail)
    with pytest.raises(OSError, match="No space"):
        exporting.export(codes, out)
    assert (out / PARTIAL_MARKER).exists() and not (out / "zarr.json").exists()
    with pytest.raises(FileNotFoundError):
        zarr.open(str(out), mode="r")
    monkeypatch.undo()
    exporting.export(codes, out)  # the same command finishes it
    np.testing.assert_array_equal(
        zarr.open(str(out), mode="r")["encodings"][...], expected_encoding(corpus, corpus["pos"])
    )
    assert not (out / PARTIAL_MARKER).exists()


# -- the documentation runs ------------------------------------------------------------------
def test_the_python_examples_of_reading_outputs_md_run(corpus, codes, monkeypatch):
    """Every python block of docs/reading-outputs.md, in order, in a folder holding the
    `codes.zarr` it reads (zarr, xarray, dask and the FAISS index)."""
    text = (ROOT / "docs" / "reading-outputs.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) >= 4
    monkeypatch.chdir(corpus["dir"])
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/reading-outputs.md", "exec"), namespace)
    expected = expected_encoding(corpus, corpus["pos"])
    index, ids = namespace["index"], namespace["ids"]
    assert index.ntotal == len(expected)
    brute = np.argsort(-(expected[:3] @ expected.T), axis=1, kind="stable")[:, :5]
    scores = expected[:3] @ expected.T
    np.testing.assert_allclose(
        np.take_along_axis(scores, ids, 1), np.take_along_axis(scores, brute, 1), rtol=1e-5
    )


# -- on S3 (SeaweedFS on 127.0.0.1) ----------------------------------------------------------
def test_marker_version_store_and_export_on_s3(s3_server, tmp_path, corpus):
    import uuid

    import fsspec

    root = f"s3://{s3_server.bucket}/readers-{uuid.uuid4().hex[:8]}"
    out = f"{root}/codes.zarr"
    encode_corpus(corpus, out)
    fs = fsspec.filesystem("s3")
    before = sorted(fs.find(out))
    with pytest.raises(Exception, match=re.escape(RIGHT_CALL)):
        zarr.open(out)
    fs.invalidate_cache()
    assert sorted(fs.find(out)) == before  # nothing written
    expected = expected_encoding(corpus, corpus["pos"])
    np.testing.assert_array_equal(slem_dask.open_zarr(out)[...], expected)
    np.testing.assert_array_equal(
        da.from_zarr(VersionStore(out), component="encodings").compute(), expected
    )
    assert main(["export", out, "--to", f"{root}/plain.zarr"]) == 0
    np.testing.assert_array_equal(
        zarr.open(f"{root}/plain.zarr", mode="r")["encodings"][...], expected
    )
    assert main(["export", out, "--to", str(tmp_path / "plain.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "plain.npy"), expected)


# -- the flat module paths of before storage/ was split (issue 41) ---------------------------
def test_a_version_store_pickled_under_its_old_module_path_still_reads(codes):
    """A client of the flat layout pickled ``slem_dask.storage.readers.VersionStore``;
    a worker of this one unpickles it (pickle protocol 0 names the class as text)."""
    store = VersionStore(codes)
    pickled = pickle.dumps(store, protocol=0)
    assert b"slem_dask.storage.nodes.readers" in pickled
    old = pickled.replace(b"slem_dask.storage.nodes.readers", b"slem_dask.storage.readers")
    again = pickle.loads(old)
    assert type(again) is VersionStore
    read = zarr.open_group(again, mode="r")["encodings"][:]
    assert read.shape[0] > 0 and np.array_equal(
        read, zarr.open_group(store, mode="r")["encodings"][:]
    )


def test_the_old_module_paths_import_as_the_new_modules():
    import importlib

    from slem_dask.storage.moved import MOVED

    for name, subpackage in MOVED.items():
        old = importlib.import_module(f"slem_dask.storage.{name}")
        assert old is importlib.import_module(f"slem_dask.storage.{subpackage}.{name}"), name
        # still its own module: its spec (relative imports, pickles) names its new path
        assert old.__spec__.name == f"slem_dask.storage.{subpackage}.{name}", name
    from slem_dask.storage.formats import FileArray, file_format  # the module's names
    from slem_dask.storage.versions import VersionedStore  # as docs/operations.md had it

    assert FileArray.__module__ == "slem_dask.storage.formats.formats" and file_format
    assert VersionedStore is versions.VersionedStore
    assert callable(slem_dask.storage.verify)  # the function, not the module
    assert callable(slem_dask.storage.rollback)
