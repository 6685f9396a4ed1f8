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

from slem_dask import storage

from helpers import cli

pytestmark = pytest.mark.usefixtures("no_scheduler_env")  # conftest.py

D = 16


def write_array(path, data, chunk_rows=500):
    arr = zarr.create_array(
        store=str(path),
        shape=data.shape,
        dtype=data.dtype,
        chunks=(min(chunk_rows, data.shape[0]), data.shape[1]),
    )
    arr[...] = data
    return str(path)


def fit(capsys, scheduler, negatives, model, *extra):
    return cli(capsys, scheduler, "fit", "--negatives", negatives, "--model", model, *extra)


def encode(capsys, scheduler, model, positives, out, *extra):
    return cli(
        capsys,
        scheduler,
        "encode",
        "--model",
        model,
        "--positives",
        positives,
        "--out",
        out,
        *extra,
    )


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
    return {
        "root": root,
        "neg": neg,
        "pos": pos,
        "negatives": write_array(root / "neg.zarr", neg),
        "positives": write_array(root / "pos.zarr", pos, 50),
    }


def edited_copy(stores, tmp_path, **changes):
    path = str(tmp_path / "edited.zarr")
    shutil.copytree(stores["negatives"], path)
    edit_metadata(path, **changes)
    return path


# -- item 3: metadata that cannot be right is refused before any work -------------------
@pytest.mark.parametrize(
    "changes, said",
    [
        ({"chunk_shape": [0, D]}, "declares chunk shape (0, 16) for shape (3000, 16)"),
        ({"chunk_shape": [500, 0]}, "declares chunk shape (500, 0) for shape (3000, 16)"),
        (
            {"shape": [10**30, D]},
            f"declares shape ({10**30}, 16) of float32, 6.4e+31 bytes; at most 2**63 - 1 bytes",
        ),
        ({"shape": [2**62, D]}, f"declares shape ({2**62}, 16) of float32, 2.95e+20 bytes"),
        (
            {"chunk_shape": [10**15, D]},
            f"declares chunks of shape ({10**15}, 16), 6.4e+16 bytes each",
        ),
    ],
)
def test_impossible_metadata_is_refused_before_any_work(
    stores, tmp_path, scheduler, capsys, changes, said
):
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
    for code, _, err in (
        fit(capsys, scheduler, path, tmp_path / "m.zarr"),
        encode(capsys, scheduler, model, path, tmp_path / "o.zarr"),
    ):
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert said in err, err
    assert sorted(os.listdir(tmp_path)) == before  # nothing written


# -- item 4: a declared size far beyond the store is refused fast -----------------------
@pytest.fixture
def key_budget(monkeypatch):
    """Fail (instead of hanging and eating memory) if more chunk keys are generated than
    a store of a few chunks can justify: the old code listed all 2e12 keys first."""
    calls = []
    from slem_dask.storage.nodes import chunks

    original = chunks.chunk_key

    def counted(arr, coords):
        calls.append(1)
        if len(calls) > 100_000:
            raise RuntimeError("enumerated more than 100,000 chunk keys")
        return original(arr, coords)

    monkeypatch.setattr(chunks, "chunk_key", counted)  # where the keys are generated
    return calls


def test_a_declared_size_beyond_the_store_is_refused_fast(stores, tmp_path, key_budget):
    path = edited_copy(stores, tmp_path, shape=[10**15, D])
    arr = storage.open_input(path, "negatives")  # 64 PB of float32 is no metadata error
    for call in (
        lambda: storage.rows_fingerprint(arr, path, "negatives", arr.shape[0]),
        lambda: storage.partition_fingerprints(arr, path, "positives", storage.row_partition(arr)),
    ):
        t0 = time.perf_counter()
        with pytest.raises(storage.MissingChunkError) as info:
            call()
        assert time.perf_counter() - t0 < 0.5
        assert "chunk 'c/6/0' (rows 3000-3499) is missing" in str(info.value)
        assert (
            "declares shape (1000000000000000, 16): 2000000000000 chunk(s) of 500 x 16, "
            "and the store holds 6 object(s)" in str(info.value)
        )
    assert len(key_budget) < 100


def test_fit_and_encode_of_a_declared_size_beyond_the_store_exit_1(
    stores, tmp_path, scheduler, capsys, key_budget
):
    from slem_dask import LinearSLEM

    path = edited_copy(stores, tmp_path, shape=[10**15, D])
    model = str(stores["root"] / "model4.zarr")
    LinearSLEM().fit(stores["neg"]).save(model)
    before = sorted(os.listdir(tmp_path))
    for code, _, err in (
        fit(capsys, scheduler, path, tmp_path / "m.zarr"),
        encode(capsys, scheduler, model, path, tmp_path / "o.zarr"),
    ):
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert "chunk 'c/6/0' (rows 3000-3499) is missing" in err, err
    assert sorted(os.listdir(tmp_path)) == before


# -- item 5: narrow float input gives float32 output, in the library and the job --------
def test_float16_positives_give_float32_encodings_everywhere(stores, tmp_path, scheduler, capsys):
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
    code, _, err = encode(
        capsys, scheduler, model_path, positives, tmp_path / "o64.zarr", "--dtype", "float64"
    )
    assert code == 0 and storage.open_output(str(tmp_path / "o64.zarr")).dtype == np.float64


# -- item 1: finite inputs of large (or small) magnitude ---------------------------------
def reference_fit(X, lam=1e-3):
    """float64 arithmetic on the same values: what any precision must agree with."""
    from slem_dask import LinearSLEM

    return LinearSLEM(lam=lam, precision="float64").fit(np.asarray(X, dtype=np.float64))


@pytest.mark.parametrize("scale", [1e30, 1e-22])
def test_float32_statistics_of_any_magnitude_match_float64(stores, scale):
    """float32 products of values ~1e30 overflowed (covariance inf, A^-1 all 0); of
    values ~1e-22 they fell into denormals (covariance off by 4e-3 of its largest entry)."""
    import dask.array as da

    from slem_dask import LinearSLEM

    X = (stores["neg"] * np.float32(scale)).astype(np.float32)
    want = reference_fit(X)
    for data in (X, da.from_array(X, chunks=(700, D))):
        got = LinearSLEM().fit(data)
        assert np.isfinite(got.covariance_).all() and np.isfinite(got.precision_).all()
        top = np.abs(want.covariance_).max()
        assert np.abs(got.covariance_ - want.covariance_).max() <= 1e-5 * top


def test_cli_fit_and_encode_of_float32_values_of_1e30(stores, tmp_path, scheduler, capsys):
    from slem_dask import load_model

    negatives = write_array(tmp_path / "neg.zarr", stores["neg"] * np.float32(1e30))
    positives = write_array(tmp_path / "pos.zarr", stores["pos"] * np.float32(1e30), 50)
    model_path, out_path = str(tmp_path / "model.zarr"), str(tmp_path / "codes.zarr")
    code, _, err = fit(capsys, scheduler, negatives, model_path)
    assert code == 0, err
    model = load_model(model_path)
    from slem_dask.core.validation import DEFAULT_LAM

    # the command line's default lambda (relative to tr(Sigma): 1e-3 absolute would be
    # nothing at this scale, and warns)
    want = reference_fit(stores["neg"] * np.float32(1e30), lam=DEFAULT_LAM)
    assert (
        np.abs(model.covariance_ - want.covariance_).max() <= 1e-12 * np.abs(want.covariance_).max()
    )  # was inf
    code, _, err = encode(capsys, scheduler, model_path, positives, out_path)
    assert code == 0, err
    z = storage.open_output(out_path)[...]
    ref = want.transform((stores["pos"] * np.float32(1e30)).astype(np.float64))
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-6)  # were all 0
    assert np.abs(z - ref).max() <= 1e-5


def test_cli_fit_of_float64_values_of_1e200_is_one_line(stores, tmp_path, scheduler, capsys):
    negatives = write_array(tmp_path / "neg.zarr", stores["neg"].astype(np.float64) * 1e200)
    before = sorted(os.listdir(tmp_path))
    code, _, err = fit(capsys, scheduler, negatives, tmp_path / "model.zarr")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"slem-dask fit: error: negatives {negatives!r}: values up to "), err
    assert (
        "e+200 in magnitude, beyond the 1e+100" in err
        and "divide the descriptors by a common factor, e.g. 1e200, or L2-normalize them" in err
    ), err
    assert sorted(os.listdir(tmp_path)) == before  # no model


def test_library_fit_of_values_beyond_1e100_is_refused(stores):
    import dask.array as da

    from slem_dask import LinearSLEM
    from slem_dask.core.validation import LargeValuesError

    X = stores["neg"].astype(np.float64) * 1e200
    for data in (X, da.from_array(X, chunks=(700, D))):
        with pytest.raises(LargeValuesError, match=r"^X has values up to \d\.\d+e\+200 in "):
            LinearSLEM().fit(data)
    LinearSLEM().fit(stores["neg"].astype(np.float64) * 1e99)  # inside the limit: fits


def test_float32_encoding_of_a_model_of_1e30_values_is_not_flushed_to_zero(stores):
    """With lam scaled like the data (1e60), A is well conditioned, so float32 positives
    are encoded in float32: A^-1 (entries ~1e-60) used to be cast to float32 zeros."""
    from slem_dask import LinearSLEM

    X = (stores["neg"] * np.float32(1e30)).astype(np.float32)
    P = (stores["pos"] * np.float32(1e30)).astype(np.float32)
    model = LinearSLEM(lam=1e60).fit(X)
    assert model._encoding_matrix(np.float32, "auto").dtype == np.float32
    ref = reference_fit(X, lam=1e60).transform(P.astype(np.float64))
    z = model.transform(P)
    assert z.dtype == np.float32 and np.abs(z - ref).max() <= 1e-5


def test_encodings_whose_norm_underflows_are_still_unit_rows(stores):
    """Negatives of scale 2^300 (~2e90, inside the limit) around 0 and positives of
    scale 2^20: A^-1 (x0 - mu) ~ 1e-175, whose square underflowed, so the rows came out 0.
    The right answer is the model of the same data divided by 2^300 (exact)."""
    import dask.array as da

    from slem_dask import LinearSLEM

    K = np.random.default_rng(3).integers(-5, 6, (1500, D)).astype(np.float64)
    Y = np.vstack([K, -K])  # integers: every sum exact, the mean exactly 0
    X = np.ldexp(Y, 300)
    model = LinearSLEM(lam=1e-3).fit(X)
    assert not model.mean_.any()
    P = np.ldexp(stores["pos"].astype(np.float64), 20)
    small = LinearSLEM(lam=1e-3 * 2.0**-600).fit(Y)
    ref = small.transform(np.ldexp(P, -300))
    for z in (model.transform(P), model.transform(da.from_array(P, chunks=(30, D))).compute()):
        np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-12)
        assert np.abs(z - ref).max() <= 1e-9


def test_a_model_with_nonfinite_arrays_is_never_fitted_saved_or_loaded(
    stores, tmp_path, scheduler, capsys
):
    from slem_dask import LinearSLEM, load_model

    with pytest.raises(ValueError, match=r"lam=1e-320 is too small .* increase lam"):
        LinearSLEM(lam=1e-320).fit(np.full((10, 3), 0.5))  # A = 1e-320 I: A^-1 is inf
    model = LinearSLEM().fit(stores["neg"])
    model.precision_ = model.precision_.copy()
    model.precision_[0, 0] = np.inf
    with pytest.raises(
        ValueError,
        match=r"has NaN or inf in its array 'precision' "
        r"\(1 of 256 entries\)",
    ):
        model.save(str(tmp_path / "saved.zarr"))
    assert not os.path.exists(tmp_path / "saved.zarr")
    # a store written with such arrays (an older slem-dask did): refused by every reader
    path = str(tmp_path / "bad.zarr")
    info, arrays = model._state()
    storage.write_model_store(path, "LinearSLEM", model.get_params(), arrays, info)
    with pytest.raises(
        ValueError,
        match=r"bad.zarr' holds a LinearSLEM that has NaN or inf "
        r"in its array 'precision'",
    ):
        load_model(path)
    code, _, err = encode(capsys, scheduler, path, stores["positives"], tmp_path / "o.zarr")
    assert code == 1 and "has NaN or inf in its array 'precision'" in err, err
    assert not os.path.exists(tmp_path / "o.zarr")


def test_an_all_zero_encoding_row_is_never_marked_complete(stores, tmp_path, scheduler, capsys):
    from slem_dask import LinearSLEM

    model = LinearSLEM(lam=0.1).fit(stores["neg"])
    model_path = str(tmp_path / "model.zarr")
    model.save(model_path)
    P = stores["pos"].astype(np.float64)
    P[[7, 61]] = model.mean_  # no direction: w* = A^-1 (x0 - mu) = 0
    z = model.transform(P)  # the library returns them (documented)
    assert not z[7].any() and not z[61].any()
    positives = write_array(tmp_path / "pos.zarr", P, 50)
    before = sorted(os.listdir(tmp_path))
    code, _, err = encode(capsys, scheduler, model_path, positives, tmp_path / "codes.zarr")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"positives {positives!r}: 2 row(s) whose encoding is all zeros (rows 7, 61): " in err, (
        err
    )
    assert "equal to the mean of the negatives the model was fitted on" in err
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, nothing committed


def test_check_encoded_rows_names_zero_and_nonfinite_rows():
    from slem_dask.core.validation import DegenerateEncodingsError, check_encoded_rows

    z = np.array([[0.6, 0.8], [0.0, 0.0], [np.nan, 0.0], [1e-200, 0.0], [np.inf, 1.0]])
    with pytest.raises(DegenerateEncodingsError) as info:
        check_encoded_rows(z, row_offset=100, zero_reason="why")
    assert info.value.detail == (
        "1 row(s) whose encoding is all zeros (rows 101): why; 2 row(s) whose encoding is "
        "NaN or inf (rows 102, 104): their values overflow float64 in the encoding: divide "
        "the descriptors by a common factor or L2-normalize them"
    )
    check_encoded_rows(z[[0, 3]])  # a tiny but nonzero row has a direction


def test_check_encoded_rows_float32_squares_that_leave_float32_are_not_errors():
    """The float32 fast path sums squares in float32: rows whose squares over- or
    underflow there (finite, nonzero) must pass, and bad rows among them still be named."""
    from slem_dask.core.validation import DegenerateEncodingsError, check_encoded_rows

    z = np.array(
        [[3e30, 4e30], [1e-30, 0.0], [0.6, 0.8], [0.0, 0.0], [np.nan, 1e30]], dtype=np.float32
    )
    check_encoded_rows(z[:3])
    with pytest.raises(DegenerateEncodingsError) as info:
        check_encoded_rows(z)
    assert "all zeros (rows 3)" in info.value.detail
    assert "NaN or inf (rows 4)" in info.value.detail


# -- item 2: zero-variance negatives ----------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_identical_negatives_warn_and_give_exact_statistics(dtype):
    """Summing 3000 copies of 0.3 in float64 rounds: the mean was off by an ulp, the
    covariance 2e-28 instead of 0, and a positive equal to the negatives got a direction
    made of rounding errors (entries +-0.25) instead of none."""
    import dask.array as da

    from slem_dask import LinearSLEM
    from slem_dask.core.validation import DegenerateNegativesWarning

    X = np.full((3000, D), 0.3, dtype=dtype)
    c = X[0, 0].astype(np.float64)
    P = np.random.default_rng(2).standard_normal((5, D))
    for data in (X, da.from_array(X, chunks=(700, D))):
        with pytest.warns(DegenerateNegativesWarning, match=r"all 3000 rows are identical"):
            model = LinearSLEM(lam=0.01).fit(data)
        assert (model.mean_ == c).all() and not model.covariance_.any()
        assert not model.transform(X[:3]).any()  # no direction: 0 (the job refuses them)
        want = (P - c) / np.linalg.norm(P - c, axis=1)[:, None]  # A = lam I
        np.testing.assert_allclose(model.transform(P), want, rtol=0, atol=1e-12)


def test_cli_warnings_are_one_line_like_its_errors(tmp_path):
    import subprocess
    import sys

    negatives = write_array(tmp_path / "neg.zarr", np.full((300, D), 0.3, dtype=np.float32))
    exe = os.path.join(os.path.dirname(sys.executable), "slem-dask")
    done = subprocess.run(
        [
            exe,
            "fit",
            "--negatives",
            negatives,
            "--model",
            str(tmp_path / "m.zarr"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"slem-dask fit: warning: negatives {negatives!r}: all 300 rows are identical "
        + done.stderr.split("all 300 rows are identical ", 1)[1].rstrip("\n")
    ], done.stderr
    assert "DegenerateNegativesWarning" not in done.stderr


def test_cli_identical_negatives_warn_and_their_encoding_is_refused(tmp_path, scheduler, capsys):
    negatives = write_array(tmp_path / "neg.zarr", np.full((3000, D), 0.3, dtype=np.float32))
    model_path = str(tmp_path / "model.zarr")
    with pytest.warns(UserWarning, match="all 3000 rows are identical"):
        code, out, err = fit(capsys, scheduler, negatives, model_path)
    assert code == 0, err
    assert f"warning            negatives {negatives!r}: all 3000 rows are identical" in out
    code, _, err = encode(capsys, scheduler, model_path, negatives, tmp_path / "codes.zarr")
    assert (
        code == 1 and "3000 row(s) whose encoding is all zeros (rows 0, 1, 2, 3, 4, ...)" in err
    ), err
    assert not os.path.exists(tmp_path / "codes.zarr")


def test_cli_kernel_encodings_lost_in_the_residual_name_rank_and_gamma(tmp_path, scheduler, capsys):
    rows = np.random.default_rng(5).standard_normal((1000, D)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    negatives = write_array(tmp_path / "neg.zarr", rows)
    model_path = str(tmp_path / "model.zarr")
    with pytest.warns(UserWarning, match="trace error"):  # gamma 1e60 dwarfs lam
        code, _, err = fit(
            capsys,
            scheduler,
            negatives,
            model_path,
            "--kernel",
            "quad",
            "--gamma",
            "1e60",
            "--rank",
            "8",
        )
    assert code == 0, err
    code, _, err = encode(capsys, scheduler, model_path, negatives, tmp_path / "codes.zarr")
    assert code == 1 and "whose encoding is all zeros" in err, err
    assert "outside the span of the model's 8 pivots" in err and "gamma (now 1e+60)" in err
    assert "far from all the negatives" not in err
    assert "normalize" not in err  # the rows are L2-normalized already
