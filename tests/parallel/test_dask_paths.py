"""Dask inputs give the numpy results, stay lazy, and share the model arrays in the graph.

These run on dask's local threaded scheduler (no distributed client); the
multi-process cluster versions are in test_local_cluster.py.
"""

import pickle

import dask
import dask.array as da
import numpy as np
import pytest

from slem_dask import LinearSLEM
from slem_dask.parallel.blocks import scatter_statistics

N, D = 120, 8
CHUNKINGS = {
    "rows-1": 1,
    "rows-7": 7,
    "rows-50": 50,
    "uneven": (3, 40, 1, 29, 47),
    "one-chunk": -1,
}


def computed_scheduler_error(*args, **kwargs):
    raise AssertionError("a dask computation ran while the graph was being built")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(2024)
    X = rng.standard_normal((N, D)) * rng.uniform(0.2, 3, D) + 10.0
    P = rng.standard_normal((N, D)) + 10.0
    return X, P


@pytest.fixture(scope="module")
def numpy_model(data):
    return LinearSLEM(lam=0.05, theta=2.0).fit(data[0])


@pytest.mark.parametrize("chunks", list(CHUNKINGS.values()), ids=list(CHUNKINGS))
def test_fit_on_dask_equals_numpy(data, numpy_model, chunks):
    X, _ = data
    Xd = da.from_array(X, chunks=(chunks, D))
    model = LinearSLEM(lam=0.05, theta=2.0).fit(Xd)
    for name in ("mean_", "covariance_", "precision_"):
        got, want = getattr(model, name), getattr(numpy_model, name)
        assert isinstance(got, np.ndarray)
        assert np.linalg.norm(got - want) <= 1e-12 * np.linalg.norm(want), name
    assert model.n_samples_ == N and model.n_features_in_ == D
    assert model.input_dtype_ == "float64"


@pytest.mark.parametrize("precision", ["float64", "auto"])
def test_fit_on_float32_dask_equals_numpy(data, precision):
    X32 = data[0].astype(np.float32)
    want = LinearSLEM(precision="float64").fit(X32)
    got = LinearSLEM(precision=precision).fit(da.from_array(X32, chunks=(13, D)))
    scale = np.abs(want.covariance_).max()
    tol = 1e-12 if precision == "float64" else 1e-5  # the float32 contract
    assert np.abs(got.covariance_ - want.covariance_).max() <= tol * scale
    assert got.input_dtype_ == "float32"


def test_fit_computes_once():
    """One dask.compute for the whole fit: the statistics graph is reduced in one pass."""
    calls = []

    def counting_get(dsk, keys, **kwargs):
        calls.append(keys)
        return dask.get(dsk, keys, **kwargs)

    X = da.from_array(np.random.default_rng(0).standard_normal((64, 3)), chunks=(8, 3))
    with dask.config.set(scheduler=counting_get):
        LinearSLEM().fit(X)
    assert len(calls) == 1


def test_statistics_tree_is_bounded():
    X = da.from_array(np.zeros((100, 1)), chunks=(1, 1))
    stats = scatter_statistics(X, split_every=4)
    graph = dict(stats.__dask_graph__())
    merges = [k for k in graph if isinstance(k, tuple) and str(k[0]).startswith("slem-merge")]
    # 100 leaves, merged 4 at a time: 25 + 7 + 2 + 1 merge tasks.
    assert len(merges) == 35


def test_block_statistics_are_fused_with_the_read(tmp_path):
    """Each block is reduced in the task that reads it: no separate read tasks whose
    32 MB blocks would travel to another worker."""
    import zarr

    arr = zarr.create_array(
        str(tmp_path / "x.zarr"), shape=(100, 3), dtype="float32", chunks=(10, 3)
    )
    arr[...] = np.random.default_rng(0).random((100, 3))
    stats = scatter_statistics(da.from_zarr(arr, chunks=(20, 3)))
    graph = dict(stats.__dask_graph__())
    names = {str(k[0] if isinstance(k, tuple) else k).split("-")[0] for k in graph}
    assert not any(n.startswith("from") for n in names), names
    (result,) = dask.compute(stats, scheduler="sync")
    np.testing.assert_allclose(result.mean, arr[...].astype(np.float64).mean(axis=0))


@pytest.mark.parametrize("chunks", list(CHUNKINGS.values()), ids=list(CHUNKINGS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transform_on_dask_equals_numpy(data, numpy_model, chunks, dtype):
    _, P = data
    Pd = da.from_array(P, chunks=(chunks, D))
    with dask.config.set(scheduler=computed_scheduler_error):
        Z = numpy_model.transform(Pd, dtype=dtype)  # building it computes nothing
    assert isinstance(Z, da.Array)
    assert Z.chunks == Pd.chunks
    assert Z.dtype == dtype
    want = numpy_model.transform(P, dtype=dtype)
    got = Z.compute(scheduler="sync")
    assert got.dtype == dtype
    tol = 1e-12 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_transform_does_not_call_the_block_function(monkeypatch, data, numpy_model):
    import slem_dask.parallel.blocks as parallel

    calls = []
    original = parallel.encode_rows

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(parallel, "encode_rows", counting)
    Pd = da.from_array(data[1], chunks=(10, D))
    Z = numpy_model.transform(Pd)
    assert calls == []
    Z.compute(scheduler="sync")
    assert len(calls) == Pd.numblocks[0]


def test_model_arrays_enter_the_graph_once(numpy_model):
    d = 64
    rng = np.random.default_rng(0)
    model = LinearSLEM().fit(rng.standard_normal((200, d)))
    n_blocks = 12
    Pd = da.from_array(rng.standard_normal((n_blocks * 2, d)), chunks=(2, d))
    Z = model.transform(Pd)
    graph = dict(Z.__dask_graph__())
    input_keys = set(dict(Pd.__dask_graph__()))
    encode_keys = [
        k for k in graph if k not in input_keys and isinstance(k, tuple) and k[0] == Z.name
    ]
    shared_keys = set(graph) - input_keys - set(encode_keys)
    assert len(encode_keys) == n_blocks
    assert len(shared_keys) == 2  # one key for mean_, one for precision_
    for key in encode_keys:
        assert shared_keys <= set(graph[key].dependencies)
    # And they are not pickled into every task: the graph holds ~one copy of A^-1.
    size = len(pickle.dumps(graph))
    assert size < Pd.nbytes + 2 * model.precision_.nbytes + 50_000
    assert model.precision_.nbytes * n_blocks > 2 * size  # copies would be detected


def test_similarity_on_dask(data, numpy_model):
    _, P = data
    S = numpy_model.similarity(da.from_array(P, chunks=(7, D)), P[:5])
    assert isinstance(S, da.Array)
    np.testing.assert_allclose(S.compute(), numpy_model.similarity(P, P[:5]), rtol=1e-12)


# -- errors --------------------------------------------------------------------
def test_column_chunked_input_says_how_to_rechunk(data, numpy_model):
    X, P = data
    with pytest.raises(ValueError, match=r"chunked along columns.*X\.rechunk\(\{1: -1\}\)"):
        LinearSLEM().fit(da.from_array(X, chunks=(40, 3)))
    with pytest.raises(ValueError, match=r"chunked along columns.*X\.rechunk\(\{1: -1\}\)"):
        numpy_model.transform(da.from_array(P, chunks=(40, 3)))
    # ... and the advice works
    fixed = LinearSLEM(lam=0.05, theta=2.0).fit(da.from_array(X, chunks=(40, 3)).rechunk({1: -1}))
    np.testing.assert_allclose(fixed.precision_, numpy_model.precision_, rtol=1e-12)


def test_unknown_chunks_say_compute_chunk_sizes(data, numpy_model):
    X, P = data
    Xd = da.from_array(X, chunks=(30, D))
    unknown = Xd[Xd[:, 0] > -np.inf]
    assert np.isnan(unknown.shape[0])
    with pytest.raises(ValueError, match=r"unknown row chunk sizes.*X\.compute_chunk_sizes\(\)"):
        LinearSLEM().fit(unknown)
    Pd = da.from_array(P, chunks=(30, D))
    with pytest.raises(ValueError, match=r"X\.compute_chunk_sizes\(\)"):
        numpy_model.transform(Pd[Pd[:, 0] > -np.inf])
    fixed = LinearSLEM(lam=0.05, theta=2.0).fit(unknown.compute_chunk_sizes())
    np.testing.assert_allclose(fixed.precision_, numpy_model.precision_, rtol=1e-12)


def test_bad_dask_shapes_raise(numpy_model):
    with pytest.raises(ValueError, match="2-D"):
        LinearSLEM().fit(da.ones(10, chunks=5))
    with pytest.raises(ValueError, match="2-D"):
        numpy_model.transform(da.ones((4, D, 2), chunks=2))
    with pytest.raises(ValueError, match="at least 2"):
        LinearSLEM().fit(da.ones((1, D)))
    with pytest.raises(ValueError, match="0 rows"):
        numpy_model.transform(da.ones((0, D)))
    with pytest.raises(ValueError, match=f"7 features, but LinearSLEM is expecting {D} features"):
        numpy_model.transform(da.ones((4, 7)))


def test_nonfinite_dask_negatives_raise_with_row_count(data):
    X = data[0].copy()
    X[[0, 50, 51, 119], 3] = np.nan
    X[60, 0] = np.inf
    with pytest.raises(
        ValueError,
        match=r"5 row\(s\) with NaN or inf \(rows 0, 50, 51, 60, 119\) "
        r"out of 120",
    ):
        LinearSLEM().fit(da.from_array(X, chunks=(25, D)))


def test_nonfinite_dask_positives_raise_on_compute(data, numpy_model):
    P = data[1].copy()
    P[[21, 22], 0] = np.nan
    Z = numpy_model.transform(da.from_array(P, chunks=(20, D)))  # lazy: no error yet
    with pytest.raises(ValueError, match=r"X has 2 row\(s\) with NaN or inf \(rows 21, 22\)"):
        Z.compute(scheduler="sync")
