"""dtype in = dtype out in every transform; lazy inputs (dask, dask-backed xarray) stay lazy."""

import dask
import dask.array as da
import numpy as np
import pytest

from slem_dask import ESVM, KernelSLEM, LinearSLEM, PCAWhitening, RawFeatures, search


def estimators():
    return [
        LinearSLEM(lam=1e-2),
        KernelSLEM(gamma=0.5, rank=12, random_state=0),
        ESVM(n_iter=20, random_state=0),
        PCAWhitening(n_components=5),
        RawFeatures(),
    ]


IDS = [type(e).__name__ for e in estimators()]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 8))
    P = rng.standard_normal((30, 8))
    return X / np.linalg.norm(X, axis=1, keepdims=True), P / np.linalg.norm(
        P, axis=1, keepdims=True
    )


def _fail(*args, **kwargs):
    raise AssertionError("computed while building the graph")


@pytest.mark.parametrize("est", estimators(), ids=IDS)
def test_transform_keeps_float_dtype(est, data):
    X, P = data
    est.fit(X)
    ref = est.transform(P, dtype=np.float64)
    for dtype, rtol in ((np.float32, 2e-5), (np.float64, 1e-12)):
        p = P.astype(dtype)
        z = est.transform(p)
        assert z.dtype == dtype, (type(est).__name__, z.dtype)
        np.testing.assert_allclose(z, ref, rtol=rtol, atol=rtol)
        lazy = est.transform(da.from_array(p, chunks=(7, 8)))
        assert lazy.dtype == dtype and lazy._meta.dtype == dtype
        got = lazy.compute(scheduler="sync")
        assert got.dtype == dtype
        np.testing.assert_allclose(
            got,
            z,
            rtol=1e-6 if dtype == np.float32 else 1e-12,
            atol=1e-6 if dtype == np.float32 else 1e-12,
        )
    # integers (uint8 SIFT, int32) encode to float32, not 8x their size; an explicit
    # dtype wins
    for kind in (np.uint8, np.int32):
        ints = np.rint(np.abs(P) * 10).astype(kind)
        assert est.transform(ints).dtype == np.float32
        assert est.transform(ints, dtype=np.float64).dtype == np.float64
        np.testing.assert_allclose(
            est.transform(ints), est.transform(ints, dtype=np.float64), rtol=1e-5, atol=1e-6
        )
    assert est.transform(P.astype(np.float32), dtype=np.float64).dtype == np.float64


@pytest.mark.parametrize("est", estimators(), ids=IDS)
def test_dask_backed_xarray_stays_lazy(est, data):
    xr = pytest.importorskip("xarray")
    X, P = data
    est.fit(xr.DataArray(X, dims=("row", "feature")))
    arr = xr.DataArray(da.from_array(P.astype(np.float32), chunks=(10, 8)), dims=("row", "feature"))
    with dask.config.set(scheduler=_fail):
        z = est.transform(arr)
    assert isinstance(z, da.Array) and z.dtype == np.float32
    np.testing.assert_allclose(
        z.compute(scheduler="sync"), est.transform(P.astype(np.float32)), rtol=1e-6, atol=1e-6
    )
    # numpy-backed xarray: numpy out
    assert isinstance(est.transform(xr.DataArray(P)), np.ndarray)


def test_search_with_xarray_inputs(data):
    xr = pytest.importorskip("xarray")
    X, P = data
    s, i = search(xr.DataArray(P), xr.DataArray(X), 5)
    assert isinstance(i, np.ndarray)
    ref = search(P, X, 5)
    np.testing.assert_array_equal(i, ref[1])
    with dask.config.set(scheduler=_fail):
        s, i = search(xr.DataArray(da.from_array(P, chunks=10)), X, 5)
    assert isinstance(i, da.Array)
    np.testing.assert_array_equal(i.compute(scheduler="sync"), ref[1])
