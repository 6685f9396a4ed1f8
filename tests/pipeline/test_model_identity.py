"""A model's identity is its inputs and parameters, not the last bits of its arrays
(docs/numerics.md, issue 32 item 9): the same negatives fitted in 7 partitions of
8192 rows (the demo) or in one of 50,000 (the command line's default) round
differently, and outputs encoded with either stay up to date."""

import numpy as np
import pytest
import zarr

from slem_dask import load_model, storage
from slem_dask.pipeline import encode_job, fit_job

N, D = 50_000, 32


def write_rows(path, data, chunk_rows):
    arr = zarr.create_array(
        store=str(path), shape=data.shape, dtype=data.dtype, chunks=(chunk_rows, data.shape[1])
    )
    arr[...] = data
    return str(path)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    rng = np.random.default_rng(32)
    negatives = rng.standard_normal((N, D)) @ rng.standard_normal((D, D)) / 6 + 1.0
    positives = rng.standard_normal((300, D)) + 1.0
    return {
        "negatives": write_rows(root / "negatives.zarr", negatives.astype(np.float32), 1024),
        "positives": write_rows(root / "positives.zarr", positives.astype(np.float32), 100),
        "root": root,
    }


def test_a_refit_in_other_partitions_keeps_outputs_up_to_date(stores, tmp_path):
    model, out = str(tmp_path / "model.zarr"), str(tmp_path / "encoded.zarr")
    fit_job(None, stores["negatives"], model, lam=0.01, partition_rows=8192)
    demo = load_model(model)
    assert encode_job(None, model, stores["positives"], out).facts["action"] == "create"
    fit_job(None, stores["negatives"], model, lam=0.01, partition_rows=N, overwrite=True)
    single = load_model(model)
    # the two fits round differently, so the arrays' fingerprints differ ...
    assert not np.array_equal(demo.covariance_, single.covariance_)
    assert demo.fingerprint_ != single.fingerprint_
    np.testing.assert_allclose(single.covariance_, demo.covariance_, rtol=0, atol=1e-5)
    # ... while the model, and so its outputs, are the same
    assert encode_job(None, model, stores["positives"], out).facts["action"] == "up to date"
    assert demo.identity_ == single.identity_
    assert demo.encoding_identity_ == single.encoding_identity_


def test_other_parameters_or_negatives_are_another_model(stores, tmp_path):
    model, out = str(tmp_path / "model.zarr"), str(tmp_path / "encoded.zarr")
    fit_job(None, stores["negatives"], model, lam=0.01, partition_rows=8192)
    first = load_model(model)
    encode_job(None, model, stores["positives"], out)
    fit_job(None, stores["negatives"], model, lam=0.02, overwrite=True)
    assert load_model(model).encoding_identity_ != first.encoding_identity_
    with pytest.raises(FileExistsError, match="encoded with another model") as refused:
        encode_job(None, model, stores["positives"], out)
    # named as fit and encode print a model: its path and `model identity`
    said = f"(the model at {model!r}, model identity {first.identity_[:16]}; this one's is "
    assert said + f"{load_model(model).identity_[:16]})" in str(refused.value), refused.value
    # the same values in another store (its own listing): not assumed the same
    copy = write_rows(tmp_path / "copy.zarr", zarr.open_array(stores["negatives"])[:], 1024)
    fit_job(None, copy, model, lam=0.01, overwrite=True)
    assert load_model(model).identity_ != first.identity_


def test_a_model_refitted_in_the_library_is_named_by_its_arrays(stores, tmp_path):
    """identity_ holds only for the arrays that were fitted on those negatives."""
    model = str(tmp_path / "model.zarr")
    fit_job(None, stores["negatives"], model, lam=0.01)
    loaded = load_model(model)
    assert loaded.identity_ != loaded.fingerprint_
    loaded.fit(zarr.open_array(stores["negatives"])[:1000])
    assert loaded.identity_ == loaded.fingerprint_


def test_a_kernel_model_is_named_by_its_pivots(stores, tmp_path):
    """Greedy pivots do not depend on the partitioning, so the refit is the same model;
    rpcholesky draws its pivots per partition: another partitioning, another model."""
    ids = {}
    for pivoting in ("greedy", "rpcholesky"):
        for rows in (8192, N):
            model = str(tmp_path / f"{pivoting}{rows}.zarr")
            fit_job(
                None,
                stores["negatives"],
                model,
                lam=0.01,
                partition_rows=rows,
                kernel="rbf",
                gamma=0.01,
                rank=12,
                pivoting=pivoting,
                tol=0.0,
                seed=0,
            )
            ids[pivoting, rows] = load_model(model)
    greedy, other = ids["greedy", 8192], ids["greedy", N]
    np.testing.assert_array_equal(greedy.pivots_, other.pivots_)
    assert greedy.fingerprint_ != other.fingerprint_  # the factor rounds differently
    assert greedy.identity_ == other.identity_
    drawn, redrawn = ids["rpcholesky", 8192], ids["rpcholesky", N]
    assert not np.array_equal(drawn.pivots_, redrawn.pivots_)
    assert drawn.identity_ != redrawn.identity_


@pytest.mark.parametrize(
    "dtype, precision, float32_only",
    [(np.float32, None, True), (np.float32, "float64", False), (np.float64, None, False)],
)
def test_an_encode_reads_a_inverse_in_the_dtype_it_encodes_in(
    stores, tmp_path, monkeypatch, dtype, precision, float32_only
):
    """An encode of float32 positives (precision "auto") reads A^-1 straight into
    float32 and holds no float64 A^-1; others read it as stored. Either way the output
    is the model's own transform, bit for bit."""
    from slem_dask.pipeline import encode_plan

    model, out = str(tmp_path / "model.zarr"), str(tmp_path / "encoded.zarr")
    fit_job(None, stores["negatives"], model, lam=0.01)
    positives = zarr.open_array(stores["positives"], mode="r")[...].astype(dtype)
    path = write_rows(tmp_path / "positives.zarr", positives, 100)
    loaded = []
    real = encode_plan.load_model
    monkeypatch.setattr(
        encode_plan, "load_model", lambda *a, **k: loaded.append(real(*a, **k)) or loaded[-1]
    )
    report = encode_job(None, model, path, out, dtype="float64", precision=precision)
    assert (loaded[0].precision_ is None) == float32_only
    assert report.facts["precision"] == (precision or "auto")  # as fit reports it
    want = load_model(model).transform(positives, dtype=np.float64, precision=precision)
    np.testing.assert_array_equal(storage.open_output(out)[...], want)
