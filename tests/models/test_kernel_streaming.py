"""Streaming kernel fit (nothing kept per row between passes) against the in-memory path
and against brute-force dense references (full K, numpy)."""

from __future__ import annotations

import warnings

import dask
import dask.array as da
import numpy as np
import pytest
from scipy import linalg

from helpers import assert_same_kernel_fit
from slem_dask import KernelSLEM, load_model
from slem_dask.parallel import kernel_stream as stream
from slem_dask.core.kernels import KERNELS
from slem_dask.parallel.kernel import CholeskyConfig, incomplete_cholesky
from test_kernel import PARAMS, dense_kernel, dense_pivoted_cholesky, histograms

BLOCKS = [90, 13, 32]
DASK_CHUNKS = [90, 13, (50, 7, 33)]


def _rows(kernel, rng, n=90, d=6):
    return (
        histograms(rng, n, d) if kernel in ("intersection", "chi2") else rng.standard_normal((n, d))
    )


def _cfg(kernel, pivoting, rank=15, seed=11):
    kp = {"gamma": 1.0, "degree": 2, **PARAMS[kernel]}
    return CholeskyConfig(
        kernel, kp["gamma"], kp["degree"], pivoting, rank=rank, tol=0.0, seed=seed
    )


def _same(res, ref, rtol=1e-8):
    np.testing.assert_array_equal(res.pivots, ref.pivots)
    np.testing.assert_array_equal(res.pivot_rows, ref.pivot_rows)
    scale = np.abs(ref.pivot_factor).max()
    np.testing.assert_allclose(res.pivot_factor, ref.pivot_factor, rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(res.stats.mean, ref.stats.mean, rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(
        res.stats.scatter, ref.stats.scatter, rtol=rtol, atol=rtol * np.abs(ref.stats.scatter).max()
    )
    assert res.stats.count == ref.stats.count
    assert res.trace == pytest.approx(ref.trace, rel=1e-12)
    assert res.residual_trace == pytest.approx(ref.residual_trace, rel=rtol, abs=rtol * ref.trace)
    assert res.rounds == ref.rounds


@pytest.mark.parametrize("pivoting", ["greedy", "rpcholesky"])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("block_rows", BLOCKS)
def test_streaming_equals_in_memory_numpy(kernel, pivoting, block_rows, rng):
    X = _rows(kernel, rng)
    cfg = _cfg(kernel, pivoting, rank=6 if kernel == "linear" else 15)
    ref = incomplete_cholesky(X, cfg, block_rows=block_rows)
    res = incomplete_cholesky(X, cfg, block_rows=block_rows, streaming=True)
    _same(res, ref)


@pytest.mark.parametrize("pivoting", ["greedy", "rpcholesky"])
@pytest.mark.parametrize("chunks", DASK_CHUNKS)
def test_streaming_equals_in_memory_dask(pivoting, chunks, rng):
    X = rng.standard_normal((90, 6)).astype(np.float32)
    cfg = _cfg("rbf", pivoting, rank=20)
    with dask.config.set(scheduler="threads"):
        ref = incomplete_cholesky(da.from_array(X, chunks=(chunks, 6)), cfg)
        res = incomplete_cholesky(da.from_array(X, chunks=(chunks, 6)), cfg, streaming=True)
    _same(res, ref)


@pytest.mark.parametrize("kernel", KERNELS)
def test_greedy_streaming_matches_dense_pivoted_cholesky(kernel, rng):
    X = _rows(kernel, rng, n=60, d=5)
    kp = PARAMS[kernel]
    rank = 5 if kernel == "linear" else 12
    K = dense_kernel(X, X, kernel, **kp)
    piv, F = dense_pivoted_cholesky(K, rank)
    res = incomplete_cholesky(X, _cfg(kernel, "greedy", rank=rank), block_rows=17, streaming=True)
    np.testing.assert_array_equal(res.pivots, piv)
    np.testing.assert_allclose(res.pivot_factor, F[piv], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.stats.mean, F.mean(axis=0), atol=1e-12)
    centred = F - F.mean(axis=0)
    np.testing.assert_allclose(res.stats.scatter, centred.T @ centred, atol=1e-10)
    assert res.trace == pytest.approx(np.trace(K), rel=1e-12)
    assert res.residual_trace == pytest.approx(
        np.trace(K) - np.sum(F**2), rel=1e-8, abs=1e-10 * np.trace(K)
    )


@pytest.mark.parametrize("kernel", ["rbf", "poly", "chi2"])
def test_rpcholesky_streaming_factor_is_the_dense_one_of_its_pivots(kernel, rng):
    # Whatever pivots the draws chose: L = chol K(I, I), F = K(:, I) L^-T (docs/math.md#icd).
    X = _rows(kernel, rng, n=80, d=5)
    K = dense_kernel(X, X, kernel, **PARAMS[kernel])
    res = incomplete_cholesky(
        X, _cfg(kernel, "rpcholesky", rank=14, seed=5), block_rows=20, streaming=True
    )
    piv = res.pivots
    assert len(set(piv.tolist())) == len(piv) == 14
    L = linalg.cholesky(K[np.ix_(piv, piv)], lower=True)
    np.testing.assert_allclose(res.pivot_factor, L, rtol=1e-8, atol=1e-10)
    F = linalg.solve_triangular(L, K[:, piv].T, lower=True).T
    np.testing.assert_allclose(res.stats.mean, F.mean(axis=0), atol=1e-10)
    centred = F - F.mean(axis=0)
    np.testing.assert_allclose(res.stats.scatter, centred.T @ centred, atol=1e-8)
    assert res.residual_trace == pytest.approx(np.trace(K) - np.sum(F**2), rel=1e-8)


@pytest.mark.parametrize("pivoting", ["greedy", "rpcholesky"])
def test_streaming_reads_every_block_at_every_pass(pivoting, rng):
    # Nothing is persisted between passes: each pass reads each chunk of X again.
    X = rng.standard_normal((60, 4))
    reads = []

    def source(block, block_info=None):
        reads.append(block_info[0]["chunk-location"][0])
        return block

    x = da.from_array(X, chunks=(20, 4)).map_blocks(source, dtype=X.dtype)
    cfg = _cfg("rbf", pivoting, rank=8)
    with dask.config.set(scheduler="sync"):
        incomplete_cholesky(x, cfg)
        assert sorted(reads) == [0, 1, 2]  # in-memory: read once, held for every pass
        reads.clear()
        res = incomplete_cholesky(x, cfg, streaming=True)
    assert res.rounds > 2
    assert sorted(reads) == sorted([0, 1, 2] * res.rounds)


async def _measure_as_a_fresh_worker(worker, nbytes=100 * 2**20):
    """The workers run in this process, whose memory is the whole suite's: late in a
    run it held more than 80% of 2 GiB, dask paused the workers and the auto strategy
    found no room. What dask's monitor measures (and the scheduler hears, which the
    strategy reads) is this test's to set."""
    worker.monitor.get_process_memory = lambda: nbytes
    worker.monitor.update()
    await worker.heartbeat()


def test_streaming_on_a_distributed_cluster_equals_in_memory(rng):
    from distributed import Client, LocalCluster

    X = rng.standard_normal((120, 6))
    Xd = da.from_array(X, chunks=(25, 6))
    params = dict(kernel="rbf", gamma=0.3, rank=16, tol=0, pivoting="rpcholesky", random_state=2)
    with dask.config.set(scheduler="sync"):
        ref = KernelSLEM(strategy="in-memory", **params).fit(Xd)
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            dashboard_address=":0",
            memory_limit="2GiB",
        ) as cluster,
        Client(cluster),
    ):
        for worker in cluster.workers.values():
            cluster.sync(_measure_as_a_fresh_worker, worker)
        model = KernelSLEM(strategy="streaming", **params).fit(Xd)
        auto = KernelSLEM(**params).fit(Xd)
    assert_same_kernel_fit(model, ref)
    assert model.trace_error_ == pytest.approx(ref.trace_error_, rel=1e-8)
    assert model.strategy_ == "streaming" and ref.strategy_ == "in-memory"
    assert auto.strategy_ == "in-memory" and "2 workers' memory limits" in auto.strategy_reason_


# -- choosing the path ---------------------------------------------------------------
def test_strategy_is_checked_and_named():
    X = np.random.default_rng(0).standard_normal((20, 3))
    with pytest.raises(
        ValueError,
        match=r"strategy must be one of 'auto', 'in-memory', "
        r"'streaming', got 'disk'",
    ):
        KernelSLEM(strategy="disk").fit(X)
    with pytest.raises(ValueError, match="strategy='streaming' cannot keep .* exact=True"):
        KernelSLEM(strategy="streaming", exact=True).fit(X)
    assert KernelSLEM(exact=True, rank=3).fit(X).strategy_ == "in-memory"


def test_auto_streams_when_the_estimate_exceeds_the_budget(monkeypatch, rng):
    X = rng.standard_normal((100, 6)).astype(np.float32)
    params = dict(kernel="rbf", gamma=0.3, rank=10, tol=0, pivoting="greedy")
    roomy = KernelSLEM(**params).fit(X)
    assert roomy.strategy_ == "in-memory"
    # 100 rows x (6 x 4 + 16 x 10 + 8 + 600) bytes = 79,200 bytes
    assert "about 77.3 KiB (100 rows x 0.8 KB" in roomy.strategy_reason_
    monkeypatch.setattr(stream, "memory_budget", lambda x: (79_199.0, "a tiny budget"))
    tight = KernelSLEM(**params).fit(X)
    assert tight.strategy_ == "streaming"
    assert (
        "more than a tiny budget; greedy pivoting makes one pass per pivot"
        in tight.strategy_reason_
    )
    np.testing.assert_array_equal(tight.pivots_, roomy.pivots_)
    np.testing.assert_allclose(tight.g_factor_, roomy.g_factor_, rtol=1e-8, atol=1e-12)
    monkeypatch.setattr(stream, "memory_budget", lambda x: (79_200.0, "just enough"))
    assert KernelSLEM(**params).fit(X).strategy_ == "in-memory"


def test_a_forced_in_memory_fit_over_the_budget_runs_and_warns(monkeypatch, rng):
    X = rng.standard_normal((100, 6)).astype(np.float32)
    params = dict(kernel="rbf", gamma=0.3, rank=10, tol=0)
    monkeypatch.setattr(stream, "memory_budget", lambda x: (79_199.0, "a tiny budget"))
    with pytest.warns(
        stream.KernelMemoryWarning,
        match=r"needs about 77.3 KiB .* more than a tiny budget: the workers "
        r"may run out of memory; --kernel-memory auto",
    ):
        forced = KernelSLEM(strategy="in-memory", **params).fit(X)
    assert forced.strategy_ == "in-memory" and forced.strategy_reason_.startswith("forced")
    with pytest.warns(stream.KernelMemoryWarning, match="use exact=False and"):
        KernelSLEM(exact=True, **params).fit(X)
    monkeypatch.setattr(stream, "memory_budget", lambda x: (79_200.0, "just enough"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KernelSLEM(strategy="in-memory", **params).fit(X)


def test_strategy_is_not_part_of_the_encoding(tmp_path, rng):
    X = rng.standard_normal((50, 4))
    a = KernelSLEM(rank=6, tol=0, strategy="in-memory").fit(X)
    b = KernelSLEM(rank=6, tol=0, strategy="streaming").fit(X)
    np.testing.assert_allclose(a.transform(X[:5]), b.transform(X[:5]), rtol=1e-8, atol=1e-12)
    b.save(str(tmp_path / "b.zarr"))
    loaded = load_model(str(tmp_path / "b.zarr"))
    assert loaded.strategy == "streaming" and loaded.strategy_ == "streaming"


def test_the_stored_scatter_of_f_is_not_part_of_the_encoding(rng):
    """factor_scatter is kept for update() only: a model with it encodes as one
    without it (stores written before it was kept), so outputs stay up to date."""
    model = KernelSLEM(rank=6, tol=0).fit(rng.standard_normal((50, 4)))
    with_scatter = (model.fingerprint_, model.encoding_fingerprint_)
    model.factor_scatter_ = None
    assert model.encoding_fingerprint_ == with_scatter[1]
    assert model.fingerprint_ != with_scatter[0]


# -- adding negatives without re-pivoting ---------------------------------------------
@pytest.mark.parametrize("pivoting", ["greedy", "rpcholesky"])
def test_update_merges_the_new_rows_statistics(pivoting, tmp_path, rng):
    X = rng.standard_normal((300, 6))
    params = dict(
        kernel="rbf", gamma=0.3, rank=20, tol=0, lam=1e-2, pivoting=pivoting, random_state=1
    )
    model = KernelSLEM(**params).fit(X[:200])
    model.save(str(tmp_path / "m.zarr"))
    loaded = load_model(str(tmp_path / "m.zarr"))
    with dask.config.set(scheduler="threads"):
        loaded.update(da.from_array(X[200:], chunks=(37, 6)))
    model.update(X[200:250]).update(X[250:])
    # dense reference with the same pivots: F = K(X, X_I) L^-T over all 300 rows
    K = dense_kernel(X, model.pivot_rows_, "rbf", gamma=0.3)
    F = linalg.solve_triangular(model.pivot_factor_, K.T, lower=True).T
    G = F.T @ F / 300 - np.outer(F.mean(0), F.mean(0)) + 1e-2 * np.eye(20)
    trace = len(X)  # rbf: k(x, x) = 1
    for m in (model, loaded):
        assert m.n_samples_ == 300
        np.testing.assert_allclose(m.factor_mean_, F.mean(axis=0), atol=1e-12)
        np.testing.assert_allclose(m.g_factor_ @ m.g_factor_.T, G, atol=1e-12)
        assert m.trace_ == pytest.approx(trace, rel=1e-12)
        assert m.trace_error_ == pytest.approx((trace - np.sum(F**2)) / trace, rel=1e-8)
        np.testing.assert_array_equal(m.pivots_, model.pivots_)


def test_update_refuses_models_without_the_scatter(rng):
    X = rng.standard_normal((40, 3))
    model = KernelSLEM(rank=4, tol=0).fit(X)
    model.factor_scatter_ = None  # as loaded from a store written before it was kept
    with pytest.raises(ValueError, match="factor_scatter.*--repivot"):
        model.update(X)
    with pytest.raises(ValueError, match="X has 2 features but the model is fitted on 3"):
        KernelSLEM(rank=4, tol=0).fit(X).update(X[:, :2])


@pytest.mark.parametrize("pivoting", ["greedy", "rpcholesky"])
def test_sub_blocks_of_a_block_give_the_same_fit(pivoting, monkeypatch, rng):
    X = rng.standard_normal((90, 6))
    cfg = _cfg("rbf", pivoting, rank=15)
    ref = incomplete_cholesky(X, cfg, block_rows=32)
    monkeypatch.setattr(stream, "SUB_ROWS", 7)  # kernel blocks of 7 rows inside each block
    _same(incomplete_cholesky(X, cfg, block_rows=32, streaming=True), ref)


@pytest.mark.cluster
@pytest.mark.parametrize("pivoting", ["greedy", "rpcholesky"])
def test_streaming_on_a_two_process_cluster_equals_local(pivoting, rng):
    from distributed import Client, LocalCluster

    X = rng.standard_normal((90, 6)).astype(np.float32)
    Xd = da.from_array(X, chunks=(23, 6))
    params = dict(kernel="rbf", gamma=0.3, rank=15, tol=0, pivoting=pivoting, random_state=4)
    with dask.config.set(scheduler="sync"):
        ref = KernelSLEM(strategy="in-memory", **params).fit(Xd)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        model = KernelSLEM(strategy="streaming", **params).fit(Xd)
        model.update(Xd[:30])
        ref.update(X[:30])
    assert_same_kernel_fit(model, ref)
    assert model.n_samples_ == ref.n_samples_ == 120
