"""Issue 18, "Operator-proof: hostile inputs": finite data of any magnitude, zero-variance
negatives, impossible metadata, a declared size far beyond the store, narrow float dtypes.

Each test reproduces one way such an input used to give a wrong result, a traceback or a
hang, and checks it now gives the right answer or one clear line with nothing written.
"""

import json
import os
import shutil
import time

import numpy as np
import pytest
import zarr
from distributed import LocalCluster

from slem_dask import integrity, storage
from slem_dask.cli import main

D = 16


@pytest.fixture(scope="module")
def scheduler():
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


@pytest.fixture(autouse=True)
def no_scheduler_env(monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)


def write_array(path, data, chunk_rows=500):
    arr = zarr.create_array(store=str(path), shape=data.shape, dtype=data.dtype,
                            chunks=(min(chunk_rows, data.shape[0]), data.shape[1]))
    arr[...] = data
    return str(path)


def cli(capsys, scheduler, *args):
    """(exit code, stdout, stderr) of the command line, in-process, on ``scheduler``."""
    code = main([*map(str, args), "--scheduler", scheduler, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def fit(capsys, scheduler, negatives, model, *extra):
    return cli(capsys, scheduler, "fit", "--negatives", negatives, "--model", model, *extra)


def encode(capsys, scheduler, model, positives, out, *extra):
    return cli(capsys, scheduler, "encode", "--model", model, "--positives", positives,
               "--out", out, *extra)


def edit_metadata(path, **changes):
    """Rewrite fields of an array's zarr.json (``chunk_shape`` goes into the chunk grid)."""
    doc_path = os.path.join(path, "zarr.json")
    with open(doc_path) as f:
        doc = json.load(f)
    if "chunk_shape" in changes:
        doc["chunk_grid"]["configuration"]["chunk_shape"] = changes.pop("chunk_shape")
    doc.update(changes)
    with open(doc_path, "w") as f:
        json.dump(doc, f)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    rng = np.random.default_rng(18)
    neg = rng.standard_normal((3000, D)).astype(np.float32)
    pos = rng.standard_normal((100, D)).astype(np.float32)
    return {"root": root, "neg": neg, "pos": pos,
            "negatives": write_array(root / "neg.zarr", neg),
            "positives": write_array(root / "pos.zarr", pos, 50)}


def edited_copy(stores, tmp_path, **changes):
    path = str(tmp_path / "edited.zarr")
    shutil.copytree(stores["negatives"], path)
    edit_metadata(path, **changes)
    return path


# -- item 3: metadata that cannot be right is refused before any work -------------------
@pytest.mark.parametrize("changes, said", [
    ({"chunk_shape": [0, D]}, "declares chunk shape (0, 16) for shape (3000, 16)"),
    ({"chunk_shape": [500, 0]}, "declares chunk shape (500, 0) for shape (3000, 16)"),
    ({"shape": [10**30, D]}, f"declares shape ({10**30}, 16) of float32, 6.4e+31 bytes; "
                             f"at most 2**63 - 1 bytes"),
    ({"shape": [2**62, D]}, f"declares shape ({2**62}, 16) of float32, 2.95e+20 bytes"),
    ({"chunk_shape": [10**15, D]}, f"declares chunks of shape ({10**15}, 16), 6.4e+16 bytes "
                                   f"each"),
])
def test_impossible_metadata_is_refused_before_any_work(stores, tmp_path, scheduler, capsys,
                                                       changes, said):
    from slem_dask import LinearSLEM

    path = edited_copy(stores, tmp_path, **changes)
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as info:
        storage.open_input(path, "negatives")
    assert time.perf_counter() - t0 < 0.5
    assert said in str(info.value), info.value
    assert "its zarr.json is damaged or was edited" in str(info.value)
    model = str(stores["root"] / "model3.zarr")
    if not os.path.exists(model):
        LinearSLEM().fit(stores["neg"]).save(model)
    before = sorted(os.listdir(tmp_path))
    for code, _, err in (fit(capsys, scheduler, path, tmp_path / "m.zarr"),
                         encode(capsys, scheduler, model, path, tmp_path / "o.zarr")):
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert said in err, err
    assert sorted(os.listdir(tmp_path)) == before  # nothing written


# -- item 4: a declared size far beyond the store is refused fast -----------------------
@pytest.fixture
def key_budget(monkeypatch):
    """Fail (instead of hanging and eating memory) if more chunk keys are generated than
    a store of a few chunks can justify: the old code listed all 2e12 keys first."""
    calls = []
    original = integrity._full_key

    def counted(arr, coords):
        calls.append(1)
        if len(calls) > 100_000:
            raise RuntimeError("enumerated more than 100,000 chunk keys")
        return original(arr, coords)

    monkeypatch.setattr(integrity, "_full_key", counted)
    return calls


def test_a_declared_size_beyond_the_store_is_refused_fast(stores, tmp_path, key_budget):
    path = edited_copy(stores, tmp_path, shape=[10**15, D])
    arr = storage.open_input(path, "negatives")  # 64 PB of float32 is no metadata error
    for call in (lambda: integrity.rows_fingerprint(arr, path, "negatives", arr.shape[0]),
                 lambda: integrity.partition_fingerprints(arr, path, "positives",
                                                          storage.row_partition(arr))):
        t0 = time.perf_counter()
        with pytest.raises(integrity.MissingChunkError) as info:
            call()
        assert time.perf_counter() - t0 < 0.5
        assert "chunk 'c/6/0' (rows 3000-3499) is missing" in str(info.value)
        assert "declares shape (1000000000000000, 16): 2000000000000 chunk(s) of 500 x 16, " \
               "and the store holds 6 object(s)" in str(info.value)
    assert len(key_budget) < 100


def test_fit_and_encode_of_a_declared_size_beyond_the_store_exit_1(stores, tmp_path, scheduler,
                                                                  capsys, key_budget):
    from slem_dask import LinearSLEM

    path = edited_copy(stores, tmp_path, shape=[10**15, D])
    model = str(stores["root"] / "model4.zarr")
    LinearSLEM().fit(stores["neg"]).save(model)
    before = sorted(os.listdir(tmp_path))
    for code, _, err in (fit(capsys, scheduler, path, tmp_path / "m.zarr"),
                         encode(capsys, scheduler, model, path, tmp_path / "o.zarr")):
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert "chunk 'c/6/0' (rows 3000-3499) is missing" in err, err
    assert sorted(os.listdir(tmp_path)) == before


# -- item 5: narrow float input gives float32 output, in the library and the job --------
def test_float16_positives_give_float32_encodings_everywhere(stores, tmp_path, scheduler,
                                                            capsys):
    import dask.array as da

    from slem_dask import LinearSLEM, RawFeatures, load_model

    pos16 = stores["pos"].astype(np.float16)
    positives = write_array(tmp_path / "pos16.zarr", pos16, 50)
    model_path = str(tmp_path / "model.zarr")
    LinearSLEM(lam=0.1).fit(stores["neg"]).save(model_path)
    code, out, err = encode(capsys, scheduler, model_path, positives, tmp_path / "o.zarr")
    assert code == 0, err
    assert "out dtype          float32" in out
    written = storage.open_output(str(tmp_path / "o.zarr"))
    assert written.dtype == np.float32  # was float16: encodings rounded to 11 bits
    model = load_model(model_path)
    want = model.transform(pos16)
    assert want.dtype == np.float32
    assert model.transform(da.from_array(pos16, chunks=(30, D))).dtype == np.float32
    assert RawFeatures().fit(pos16).transform(pos16).dtype == np.float32
    np.testing.assert_allclose(written[...], want, rtol=0, atol=2e-7)
    # an explicit --dtype still decides
    code, _, err = encode(capsys, scheduler, model_path, positives, tmp_path / "o64.zarr",
                          "--dtype", "float64")
    assert code == 0 and storage.open_output(str(tmp_path / "o64.zarr")).dtype == np.float64
