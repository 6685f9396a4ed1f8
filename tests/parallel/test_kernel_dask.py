"""Kernel SLEM: dask paths equal numpy paths, for several chunkings and on a real cluster."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from slem_dask import KernelSLEM
from slem_dask.parallel.kernel import CholeskyConfig, incomplete_cholesky

CHUNKINGS = [90, 13, 32, (50, 7, 33)]


@pytest.fixture
def data(rng):
    return rng.standard_normal((90, 6)), rng.standard_normal((11, 6))


def _same_model(a, b, atol=1e-12):
    np.testing.assert_array_equal(a.pivots_, b.pivots_)
    for name in ("pivot_rows_", "pivot_factor_", "factor_mean_", "g_factor_"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), atol=atol, err_msg=name)
    assert a.trace_error_ == pytest.approx(b.trace_error_, rel=1e-10)
    assert a.n_passes_ == b.n_passes_


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_greedy_dask_fit_equals_numpy(data, chunks):
    X, P = data
    params = dict(kernel="rbf", gamma=0.3, rank=15, tol=0, lam=1e-2, pivoting="greedy")
    ref = KernelSLEM(**params).fit(X)
    with dask.config.set(scheduler="threads"):
        model = KernelSLEM(**params).fit(da.from_array(X, chunks=(chunks, 6)))
    _same_model(model, ref)
    np.testing.assert_allclose(model.similarity(P, P), ref.similarity(P, P), atol=1e-12)


@pytest.mark.parametrize(
    "params",
    [
        dict(rank=15, tol=0),
        dict(rank=80, tol=0.05),
        dict(rank=5, pivoting="rpcholesky", random_state=1),
    ],
)
def test_progress_reports_every_pass(data, params):
    # the command line prints these: its last line must agree with the fit's summary
    X, _ = data
    for x in (X, da.from_array(X, chunks=(32, 6))):
        seen = []
        with dask.config.set(scheduler="threads"):
            model = KernelSLEM(kernel="rbf", gamma=0.3, **params).fit(
                x, progress=lambda *a, seen=seen: seen.append(a)
            )
        assert [p for p, _, _ in seen] == list(range(1, model.n_passes_ + 1))
        assert seen[0][1:] == (0, 1.0)
        assert seen[-1][1] == model.rank_
        assert seen[-1][2] == pytest.approx(model.trace_error_, rel=1e-12)


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_rpcholesky_dask_equals_numpy_with_same_blocks(data, chunks):
    X, _ = data
    cfg = CholeskyConfig("rbf", 0.3, 2, "rpcholesky", rank=20, tol=0.0, seed=11)
    if isinstance(chunks, int):
        ref = incomplete_cholesky(X, cfg, block_rows=chunks)
    else:  # ragged chunks: no numpy equivalent, compare with the synchronous scheduler
        with dask.config.set(scheduler="sync"):
            ref = incomplete_cholesky(da.from_array(X, chunks=(chunks, 6)), cfg)
    with dask.config.set(scheduler="threads"):
        res = incomplete_cholesky(da.from_array(X, chunks=(chunks, 6)), cfg)
    np.testing.assert_array_equal(res.pivots, ref.pivots)
    np.testing.assert_allclose(res.pivot_factor, ref.pivot_factor, atol=1e-12)
    np.testing.assert_allclose(res.stats.scatter, ref.stats.scatter, atol=1e-12)
    assert res.rounds == ref.rounds


@pytest.mark.parametrize("chunks", [11, 4, (5, 1, 5)])
def test_transform_and_similarity_dask_equal_numpy(data, chunks):
    X, P = data
    for exact in (False, True):
        model = KernelSLEM(
            kernel="rbf", gamma=0.3, rank=12, tol=0, exact=exact, pivoting="greedy"
        ).fit(X)
        Pd = da.from_array(P, chunks=(chunks, 6))
        Z = model.transform(Pd, dtype=np.float32)
        assert Z.dtype == np.float32 and Z.chunks[0] == Pd.chunks[0]
        assert Z.shape == (11, 12) and Z._meta.dtype == np.float32
        np.testing.assert_allclose(Z.compute(), model.transform(P), rtol=1e-6, atol=1e-7)
        S = model.similarity(Pd, da.from_array(X[:9], chunks=(4, 6)))
        assert S.chunks == (Pd.chunks[0], (4, 4, 1))
        np.testing.assert_allclose(S.compute(), model.similarity(P, X[:9]), atol=1e-12)


def test_exact_mode_dask_fit_gathers_factor(data):
    X, P = data
    ref = KernelSLEM(kernel="rbf", gamma=0.3, rank=10, tol=0, exact=True, pivoting="greedy").fit(X)
    model = KernelSLEM(kernel="rbf", gamma=0.3, rank=10, tol=0, exact=True, pivoting="greedy").fit(
        da.from_array(X, chunks=(17, 6))
    )
    np.testing.assert_allclose(model.factor_, ref.factor_, atol=1e-12)
    np.testing.assert_array_equal(model.negatives_, X)
    np.testing.assert_allclose(model.similarity(P, P), ref.similarity(P, P), atol=1e-10)


def test_fit_from_float32_dask(data):
    X, P = data
    x32 = X.astype(np.float32)
    ref = KernelSLEM(kernel="rbf", gamma=0.3, rank=10, tol=0, pivoting="greedy").fit(x32)
    model = KernelSLEM(kernel="rbf", gamma=0.3, rank=10, tol=0, pivoting="greedy").fit(
        da.from_array(x32, chunks=20)
    )
    _same_model(model, ref)
    assert model.input_dtype_ == "float32"


@pytest.mark.cluster
@pytest.mark.parametrize("pivoting", ["greedy", "rpcholesky"])
def test_two_process_cluster_equals_local(data, pivoting):
    from distributed import Client, LocalCluster

    X, P = data
    params = dict(kernel="rbf", gamma=0.3, rank=15, tol=0, pivoting=pivoting, random_state=4)
    Xd = da.from_array(X, chunks=(23, 6))
    with dask.config.set(scheduler="sync"):
        ref = KernelSLEM(**params).fit(Xd)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        model = KernelSLEM(**params).fit(Xd)
        S = model.similarity(da.from_array(P, chunks=(4, 6)), P).compute()
        Z = model.transform(da.from_array(P, chunks=(4, 6))).compute()
    _same_model(model, ref)
    np.testing.assert_allclose(S, ref.similarity(P, P), atol=1e-12)
    np.testing.assert_allclose(Z, ref.transform(P), atol=1e-12)


def test_rows_held_by_the_factorization_keep_float32():
    """Worker-held rows stay float32 (half the memory); pivot rows and kernel values
    are float64 (the float32 values are exact in float64)."""
    from slem_dask.parallel.kernel import _init_block

    rng = np.random.default_rng(4)
    x32 = rng.standard_normal((30, 6)).astype(np.float32)
    cfg = CholeskyConfig("rbf", 0.3, 2, "greedy", rank=5, tol=0.0)
    block, _ = _init_block(x32, 0, cfg, 1, (0,), "X")
    assert block.x.dtype == np.float32
    block64, _ = _init_block(x32.astype(np.float64), 0, cfg, 1, (0,), "X")
    np.testing.assert_array_equal(block.diag, block64.diag)
    res32 = incomplete_cholesky(da.from_array(x32, chunks=(7, 6)), cfg)
    res64 = incomplete_cholesky(da.from_array(x32.astype(np.float64), chunks=(7, 6)), cfg)
    assert res32.pivot_rows.dtype == np.float64
    np.testing.assert_array_equal(res32.pivots, res64.pivots)
    np.testing.assert_allclose(res32.pivot_factor, res64.pivot_factor, rtol=1e-12, atol=1e-14)
