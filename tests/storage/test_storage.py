"""Zarr storage: inputs, model stores (save / load_model, atomic, fingerprinted), outputs."""

import json
import os

import numpy as np
import pytest
import zarr

from slem_dask import LinearSLEM, load_model
from slem_dask import storage

from helpers import head, recommit


@pytest.fixture
def fitted():
    rng = np.random.default_rng(0)
    return LinearSLEM(lam=0.03, theta=4.0).fit(rng.standard_normal((50, 6)).astype(np.float32))


def write_array(path, data, chunks=None):
    arr = zarr.create_array(
        store=str(path), shape=data.shape, dtype=data.dtype, chunks=chunks or data.shape
    )
    arr[...] = data
    return arr


def listing(directory):
    return sorted(os.listdir(directory))


# -- inputs --------------------------------------------------------------------
def test_open_input_reads_a_2d_array(tmp_path):
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    write_array(tmp_path / "x.zarr", data)
    arr = storage.open_input(str(tmp_path / "x.zarr"), "negatives")
    np.testing.assert_array_equal(arr[...], data)


def test_open_input_errors(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "file.txt").write_text("not zarr")
    group = zarr.open_group(store=str(tmp_path / "g.zarr"), mode="w")
    group.create_array("negatives", shape=(3, 2), dtype="f4")
    write_array(tmp_path / "one.zarr", np.ones(3))
    write_array(tmp_path / "three.zarr", np.ones((2, 2, 2)))
    write_array(tmp_path / "text.zarr", np.array([[True], [False]]))
    cases = {
        "missing.zarr": (FileNotFoundError, "no zarr array at"),
        "plain": (FileNotFoundError, "no zarr array at"),
        "file.txt": (ValueError, "no zarr array at .*a format slem-dask does not read"),
        "g.zarr": (
            ValueError,
            r"is a zarr group, not an array \(arrays in it: negatives\).*"
            r"g.zarr/negatives",
        ),
        "one.zarr": (ValueError, r"shape \(3,\) \(1-D\); expected a 2-D array"),
        "three.zarr": (ValueError, r"\(3-D\); expected a 2-D array"),
        "text.zarr": (
            TypeError,
            r"expected real numbers \(integers or floats\): save the descriptors as float32",
        ),
    }
    for name, (error, message) in cases.items():
        with pytest.raises(error, match=message) as info:
            storage.open_input(str(tmp_path / name), "negatives")
        assert str(info.value).startswith("negatives: "), name


def test_row_partition_is_whole_chunks(tmp_path):
    arr = write_array(tmp_path / "x.zarr", np.zeros((100, 4)), chunks=(16, 4))
    assert storage.row_partition(arr, 1) == 16
    assert storage.row_partition(arr, 17) == 32
    assert storage.row_partition(arr, 1000) == 100  # never more than the rows
    x = storage.dask_rows(arr, 20)
    assert x.chunks == ((32, 32, 32, 4), (4,))


def test_an_encodes_wide_rows_are_partitioned_by_bytes_not_by_width(tmp_path):
    """A fit keeps at least d rows per partition (its d x d partial); an encode has no
    partial, and at d = 8192 that rule made 512 MiB tasks and left a core idle (issue 42)."""
    import zarr

    arr = zarr.create_array(  # metadata only: no chunk is written
        store=str(tmp_path / "wide.zarr"), shape=(20_000, 4096), chunks=(512, 4096), dtype="f4"
    )
    by_bytes = storage.DEFAULT_PARTITION_BYTES // (4096 * 8)  # 2,048 rows of float64
    assert storage.row_partition(arr) == 4096  # a fit's: at least d rows
    assert storage.row_partition(arr, at_least_width=False) == by_bytes
    assert storage.row_partition(arr, 700, at_least_width=False) == 1024  # given: whole chunks


# -- model stores --------------------------------------------------------------
def test_save_and_load_round_trip(tmp_path, fitted):
    path = str(tmp_path / "model.zarr")
    fp = fitted.save(path, metadata={"source": "test"})
    assert fp == fitted.fingerprint_
    loaded = load_model(path)
    assert type(loaded) is LinearSLEM
    assert loaded.get_params() == fitted.get_params()
    for name in ("mean_", "covariance_", "precision_"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(fitted, name))
        assert getattr(loaded, name).dtype == np.float64
    assert (loaded.n_samples_, loaded.n_features_in_, loaded.input_dtype_) == (50, 6, "float32")
    assert loaded.fingerprint_ == fp
    meta = storage.open_node(path, mode="r").attrs[storage.ATTR]
    assert meta["kind"] == "model" and meta["model"] == "LinearSLEM"
    assert meta["source"] == "test" and meta["fingerprint"] == fp
    P = np.random.default_rng(1).standard_normal((5, 6))
    np.testing.assert_array_equal(loaded.transform(P), fitted.transform(P))
    assert listing(tmp_path) == ["model.zarr"]  # no hidden leftovers


def test_fingerprint_depends_on_params_and_arrays(fitted):
    base = fitted.fingerprint_
    fitted.theta = 5.0
    assert fitted.fingerprint_ != base
    fitted.theta = 4.0
    assert fitted.fingerprint_ == base
    fitted.mean_ = fitted.mean_.copy()
    fitted.mean_[0] = np.nextafter(fitted.mean_[0], np.inf)
    assert fitted.fingerprint_ != base


def test_save_refuses_existing_path_without_overwrite(tmp_path, fitted):
    path = str(tmp_path / "model.zarr")
    fitted.save(path)
    other = LinearSLEM(lam=1.0).fit(np.random.default_rng(9).standard_normal((20, 6)))
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        other.save(path)
    assert load_model(path).fingerprint_ == fitted.fingerprint_
    other.save(path, overwrite=True)
    assert load_model(path).fingerprint_ == other.fingerprint_
    assert listing(tmp_path) == ["model.zarr"]


def _fail_after_first_array(monkeypatch):
    # write_group creates each array at its own key (zarr.create_array), the group's
    # document last
    original = zarr.create_array
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise OSError("disk full (injected)")
        return original(*args, **kwargs)

    monkeypatch.setattr(zarr, "create_array", failing)
    return calls


def test_failed_save_leaves_nothing(tmp_path, fitted, monkeypatch):
    calls = _fail_after_first_array(monkeypatch)
    path = str(tmp_path / "model.zarr")
    with pytest.raises(OSError, match="injected"):
        fitted.save(path)
    assert len(calls) == 2  # the failure really happened mid-write
    assert listing(tmp_path) == []  # no model, no hidden partial folder


def test_failed_overwrite_keeps_the_old_model(tmp_path, fitted, monkeypatch):
    path = str(tmp_path / "model.zarr")
    fitted.save(path)
    _fail_after_first_array(monkeypatch)
    other = LinearSLEM(lam=1.0).fit(np.random.default_rng(9).standard_normal((20, 6)))
    with pytest.raises(OSError, match="injected"):
        other.save(path, overwrite=True)
    monkeypatch.undo()
    assert listing(tmp_path) == ["model.zarr"]
    assert load_model(path).fingerprint_ == fitted.fingerprint_


def test_load_model_errors(tmp_path, fitted):
    with pytest.raises(FileNotFoundError, match="no zarr store at"):
        load_model(str(tmp_path / "missing.zarr"))
    zarr.open_group(store=str(tmp_path / "foreign.zarr"), mode="w").create_array(
        "mean", shape=(6,), dtype="f8"
    )
    with pytest.raises(ValueError, match="not written by slem-dask"):
        load_model(str(tmp_path / "foreign.zarr"))
    write_array(tmp_path / "array.zarr", np.zeros((3, 3)))
    with pytest.raises(ValueError, match="model: .*array.zarr"):
        load_model(str(tmp_path / "array.zarr"))
    (tmp_path / "plain").mkdir()
    with pytest.raises((FileNotFoundError, ValueError), match="model: "):
        load_model(str(tmp_path / "plain"))


def test_load_model_detects_tampered_arrays(tmp_path, fitted):
    path = str(tmp_path / "model.zarr")
    fitted.save(path)
    group = storage.open_node(path, mode="r+")
    precision = group["precision"][...]
    precision[0, 0] *= 1.0 + 1e-12
    group["precision"][...] = precision
    with pytest.raises(ValueError, match="do not match its recorded fingerprint"):
        load_model(path)


def test_a_damaged_models_advice_names_a_rollback_only_where_one_can_exist(tmp_path, fitted):
    """Version 1 has no earlier version: its repair advice said `rollback --to N` all the
    same. Version 2 may have one kept: the advice says how to list them."""
    path = str(tmp_path / "model.zarr")

    def tampered_load_says() -> str:
        group = storage.open_node(path, mode="r+")
        precision = group["precision"][...]
        precision[0, 0] *= 1.0 + 1e-12
        group["precision"][...] = precision
        with pytest.raises(ValueError, match="do not match its recorded fingerprint") as info:
            load_model(path)
        return str(info.value)

    fitted.save(path)
    first = tampered_load_says()
    assert "roll" not in first and first.endswith("refit the model"), first
    fitted.save(path, overwrite=True)  # version 2
    second = tampered_load_says()
    assert second.endswith(
        f"refit the model, or roll back to an earlier version if one is kept "
        f"(`slem-dask versions {path}` lists them; `slem-dask rollback {path} --to N`)"
    ), second


def test_load_model_detects_tampered_params(tmp_path, fitted):
    path = str(tmp_path / "model.zarr")
    fitted.save(path)
    group = storage.open_node(path, mode="r+")
    meta = dict(group.attrs[storage.ATTR])
    meta["params"] = {**meta["params"], "lam": 0.5}
    group.attrs[storage.ATTR] = meta
    with pytest.raises(ValueError, match="does not match its commit record"):
        load_model(path)
    recommit(path)  # behind the commit record: the metadata's own checksum
    with pytest.raises(ValueError, match="does not match its checksum"):
        load_model(path)
    # a forger who also recomputes the metadata checksum is caught by the fingerprint
    meta["metadata_checksum"] = storage.metadata_checksum(meta)
    group.attrs[storage.ATTR] = meta
    recommit(path)
    with pytest.raises(ValueError, match="fingerprint"):
        load_model(path)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"format_version": 99}, "format_version 99"),
        ({"model": "NoSuchSLEM"}, "'NoSuchSLEM' model"),
        ({"kind": "encoding"}, "not written by slem-dask"),
    ],
)
def test_load_model_refuses_unknown_metadata(tmp_path, fitted, change, message):
    path = str(tmp_path / "model.zarr")
    fitted.save(path)
    group = storage.open_node(path, mode="r+")
    meta = {**group.attrs[storage.ATTR], **change}  # as a newer version would write it
    group.attrs[storage.ATTR] = {**meta, "metadata_checksum": storage.metadata_checksum(meta)}
    recommit(path)
    with pytest.raises(ValueError, match=message):
        load_model(path)


def test_model_metadata_is_json(tmp_path, fitted):
    path = str(tmp_path / "model.zarr")
    fitted.save(path)
    with open(head(path) / "zarr.json") as f:
        attrs = json.load(f)["attributes"][storage.ATTR]
    assert attrs["params"] == {"lam": 0.03, "theta": 4.0, "precision": "auto"}
    assert attrs["n_samples"] == 50 and attrs["n_features"] == 6


# -- outputs -------------------------------------------------------------------
def test_output_lifecycle(tmp_path):
    path = str(tmp_path / "out.zarr")
    arr = storage.create_output(path, (10, 3), 4, np.float32, {"model_fingerprint": "abc"})
    assert arr.chunks == (4, 3)
    arr[...] = np.ones((10, 3), np.float32)
    with pytest.raises(ValueError, match="unfinished slem-dask output"):
        storage.open_output(path)
    storage.mark_complete(arr, {"rows": 10})
    out = storage.open_output(path)
    meta = out.attrs[storage.ATTR]
    assert meta["complete"] is True and meta["model_fingerprint"] == "abc" and meta["rows"] == 10
    # the recorded fingerprints and checksums are covered by the metadata checksum
    arr.attrs[storage.ATTR] = {**meta, "model_fingerprint": "forged"}
    with pytest.raises(ValueError, match="does not match its checksum"):
        storage.open_output(path)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_write_partition_writes_the_chunk_zarr_writes(tmp_path, dtype):
    """Whole local chunks are written by slem-dask's own gathered write (rows, then
    their crc32c): the file must be byte for byte zarr's, read back by zarr, and leave
    no temporary file; the short last chunk goes through zarr (it pads it)."""
    from slem_dask.storage.nodes.outputs import _write_local_chunk

    rng = np.random.default_rng(1)
    data = rng.standard_normal((10, 3)).astype(dtype)
    ours = storage.create_output(str(tmp_path / "ours.zarr"), (10, 3), 4, dtype, {})
    theirs = storage.create_output(str(tmp_path / "theirs.zarr"), (10, 3), 4, dtype, {})
    for i in range(3):
        got = storage.write_partition(data[4 * i : 4 * i + 4], ours, i)
        assert got.tolist() == [[i, storage.stored_crc32c(ours, i)]]
    theirs[...] = data
    for key in ("c/0/0", "c/1/0", "c/2/0"):
        assert (tmp_path / "ours.zarr" / key).read_bytes() == (
            tmp_path / "theirs.zarr" / key
        ).read_bytes(), key
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "ours.zarr"))[...], data)
    assert _write_local_chunk(ours, 0, data[:4]) and not _write_local_chunk(ours, 2, data[8:])
    assert not [f for _, _, files in os.walk(tmp_path) for f in files if ".partial" in f]


def test_open_output_accepts_plain_arrays(tmp_path):
    """Arrays not written by slem-dask (raw descriptors) are read as they are."""
    write_array(tmp_path / "raw.zarr", np.ones((3, 2)))
    assert storage.open_output(str(tmp_path / "raw.zarr")).shape == (3, 2)


def test_large_model_arrays_are_written_and_checked_in_chunks(tmp_path, fitted, monkeypatch):
    # a d x d array at d = 8192 is 512 MiB: written and read back in row chunks of at
    # most GROUP_CHUNK_BYTES, so that saving copies one chunk at a time, never the array
    monkeypatch.setattr(storage.nodes.groups, "GROUP_CHUNK_BYTES", 100)  # 6 float64 columns: 2 rows
    path = tmp_path / "model.zarr"
    fitted.save(str(path))
    group = storage.open_node(str(path), mode="r")
    assert group["precision"].chunks == (2, 6) and group["mean"].chunks == (6,)
    loaded = load_model(str(path))
    np.testing.assert_array_equal(loaded.precision_, fitted.precision_)
    np.testing.assert_array_equal(loaded.covariance_, fitted.covariance_)
    # a damaged chunk in the middle is named when the model is read
    chunk = head(path) / "precision" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[3] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(storage.CorruptChunkError, match="precision"):
        load_model(str(path))


def test_save_refuses_a_model_that_reads_back_wrong(tmp_path, fitted, monkeypatch):
    # a chunk that the storage changes between write and read-back: nothing is put in place
    monkeypatch.setattr(storage.nodes.groups, "GROUP_CHUNK_BYTES", 100)
    real = zarr.Array.__setitem__

    def lossy(self, key, value):
        value = np.array(value, copy=True)
        # each array of a group is written at its own key (its name there is "/")
        if str(self.store_path).endswith("covariance") and key == slice(2, 4):
            value.reshape(-1)[0] += 1.0
        return real(self, key, value)

    monkeypatch.setattr(zarr.Array, "__setitem__", lossy)
    path = tmp_path / "model.zarr"
    with pytest.raises(storage.IntegrityError, match="'covariance' read back .* differs"):
        fitted.save(str(path))
    assert not path.exists() and [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize("size", [0, 3, 2**16 - 1, 2**16, 3 * 2**20 + 5])
def test_crc32c_matches_google_crc32c_on_every_buffer_kind(size):
    import google_crc32c

    from slem_dask.storage.nodes.checksums import crc32c

    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    want = google_crc32c.value(data)
    array = np.frombuffer(data, np.uint8)
    for kind in (data, memoryview(data), bytearray(data), array, array.copy()):
        assert crc32c(kind) == want
    assert crc32c(array.copy()[::2]) == google_crc32c.value(array[::2].tobytes())


def test_large_checksums_run_without_the_gil():
    # google_crc32c.value holds the GIL (1.5 ms per 16 MiB chunk, during which no
    # other thread of a threaded fit can run Python); ctypes releases it for a
    # function of a CDLL, i.e. unless the function is flagged as using Python's API.
    import ctypes

    from slem_dask.storage.nodes.checksums import _unlocked_crc32c

    function = _unlocked_crc32c()
    assert function is not None, "google_crc32c's C library was not found next to it"
    assert not function._flags_ & ctypes._FUNCFLAG_PYTHONAPI
