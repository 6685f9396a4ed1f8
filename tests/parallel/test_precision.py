"""The precision contract (issue 9, goal 3).

float32 input is computed in float32 inside each block (statistics merged in
float64) and must stay within 1e-5 (max abs error over the largest entry;
encodings are unit rows, so 1e-5 absolute) of float64 arithmetic on the same
float32 values, also for data offset by 1e4 standard deviations.
``precision="float64"`` computes in float64 throughout (exact to ~1e-12).
"""

import json
import os
import threading

import dask
import dask.array as da
import numpy as np
import pytest

from slem_dask import LinearSLEM
from slem_dask.core.blas_threads import CountedLimit
from slem_dask.core.linear import condition_bound, encode_rows, float32_encoding_ok
from slem_dask.core.statistics import block_statistics, covariance, merge_many
from slem_dask.parallel.blocks import merge_fan_in, scatter_statistics, single_threaded_blas

BOUND = 1e-5


def descriptors(n, d, offset_sds=0.0, seed=0):
    """float32 rows with correlated features of unequal scales, offset by
    ``offset_sds`` standard deviations from the origin."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((d, d)) / np.sqrt(d)
    sd = rng.uniform(0.5, 2.0, d)
    x = (rng.standard_normal((n, d)) @ mix) * sd
    return (x + offset_sds * sd * rng.choice([-1, 1], d)).astype(np.float32)


def float64_statistics(x32):
    """Two-pass float64 mean and covariance of the float32 values (the reference)."""
    x = x32.astype(np.float64)
    mean = x.mean(axis=0)
    c = x - mean
    return mean, c.T @ c / len(x)


def max_rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("offset_sds", [0.0, 1e4])
@pytest.mark.parametrize("block_rows", [20_000, 3_000, 7])
def test_float32_block_statistics_within_bound(offset_sds, block_rows):
    x = descriptors(20_000, 48, offset_sds, seed=1)
    mean64, cov64 = float64_statistics(x)
    parts = [block_statistics(x[i : i + block_rows]) for i in range(0, len(x), block_rows)]
    stats = merge_many(parts)
    assert stats.mean.dtype == np.float64 and stats.scatter.dtype == np.float64
    cov = covariance(stats)
    np.testing.assert_array_equal(cov, cov.T)
    assert max_rel(cov, cov64) <= BOUND
    assert np.abs(stats.mean - mean64).max() <= 1e-12 * np.abs(mean64).max() + 1e-12


def test_float32_is_really_computed_in_float32_and_float64_on_request():
    """The float32 path differs from float64 (so the test above can fail), and
    precision="float64" gives the float64 answer to ~1e-12."""
    x = descriptors(5_000, 32, 1e4, seed=2)
    _, cov64 = float64_statistics(x)
    err32 = max_rel(covariance(block_statistics(x)), cov64)
    err64 = max_rel(covariance(block_statistics(x, "float64")), cov64)
    assert err32 > 1e-9  # float32 rounding is visible ...
    assert err64 < 1e-11  # ... and float64 has none of it
    # The naive float32 formula on the same data is far outside the bound.
    mean32 = x.mean(axis=0)
    naive = (x.T @ x) / len(x) - np.outer(mean32, mean32)
    assert max_rel(naive.astype(np.float64), cov64) > 1e3 * BOUND


@pytest.mark.parametrize("offset_sds", [0.0, 1e4])
def test_dask_fit_within_bound(offset_sds):
    x = descriptors(12_000, 40, offset_sds, seed=3)
    _, cov64 = float64_statistics(x)
    auto = LinearSLEM(lam=0.01).fit(da.from_array(x, chunks=(2_500, 40)))
    exact = LinearSLEM(lam=0.01, precision="float64").fit(da.from_array(x, chunks=(2_500, 40)))
    assert max_rel(auto.covariance_, cov64) <= BOUND
    assert max_rel(exact.covariance_, cov64) <= 1e-11
    assert auto.input_dtype_ == "float32"


@pytest.mark.parametrize("offset_sds", [0.0, 1e4])
def test_float32_encoding_within_bound(offset_sds):
    x = descriptors(6_000, 40, offset_sds, seed=4)
    p = descriptors(3_000, 40, offset_sds, seed=5)
    model = LinearSLEM(lam=0.05).fit(x)
    assert model._encoding_matrix(np.float32, "auto").dtype == np.float32  # float32 path used
    z32 = model.transform(p)
    z64 = model.transform(p, dtype=np.float64, precision="float64")
    ref = encode_rows(p.astype(np.float64), model.mean_, model.precision_)
    np.testing.assert_array_equal(z64, ref)
    err = np.abs(z32 - ref).max()
    assert 0 < err <= BOUND
    lazy = model.transform(da.from_array(p, chunks=(700, 40)), dtype=np.float32)
    assert lazy.dtype == np.float32
    assert np.abs(lazy.compute() - ref).max() <= BOUND
    # float64 positives are encoded in float64 whatever the setting
    np.testing.assert_array_equal(model.transform(p.astype(np.float64)), ref)


@pytest.mark.parametrize("offset_sds", [0.0, 1e4])
def test_float32_encoding_within_bound_with_float32_partial_norms(offset_sds):
    """d divisible by 64: the norms come from float32 sums of 64 squares."""
    x = descriptors(4_000, 128, offset_sds, seed=6)
    p = descriptors(2_000, 128, offset_sds, seed=7)
    model = LinearSLEM(lam=0.05).fit(x)
    assert model._encoding_matrix(np.float32, "auto").dtype == np.float32
    ref = encode_rows(p.astype(np.float64), model.mean_, model.precision_)
    err = np.abs(model.transform(p) - ref).max()
    assert 0 < err <= BOUND
    np.testing.assert_allclose(
        np.linalg.norm(model.transform(p).astype(np.float64), axis=1), 1.0, atol=2e-6
    )


@pytest.mark.parametrize("vecdot", [True, False], ids=["np.vecdot", "numpy<2"])
def test_float32_partial_squares_bound_and_their_float64_fallback(monkeypatch, vecdot):
    import slem_dask.core.linear as linear
    from slem_dask.core.linear import _row_squares

    if not vecdot:  # the way numpy < 2 sums them: squares, then a product with ones
        monkeypatch.setattr(linear, "_VECDOT", None)
    elif linear._VECDOT is None:
        pytest.skip("numpy < 2 has no np.vecdot")
    rng = np.random.default_rng(8)
    v = rng.standard_normal((500, 256)).astype(np.float32)
    v[1] *= np.float32(1e25)  # its squares overflow float32
    v[2] *= np.float32(1e-30)  # its squares underflow float32
    v[3, 7] = np.nan
    v[4] = 0.0
    exact = np.einsum("ij,ij->i", v, v, dtype=np.float64)
    got = _row_squares(v)
    fine = np.isfinite(exact) & (exact > 0)
    assert np.abs(got[fine] / exact[fine] - 1).max() <= 64 * 2.0**-24  # the documented bound
    np.testing.assert_array_equal(got[1:3], exact[1:3])  # summed again in float64
    assert np.isnan(got[3]) and got[4] == 0.0
    np.testing.assert_array_equal(
        _row_squares(v[:, :100].copy()),  # width not 64k: float64
        np.einsum("ij,ij->i", v[:, :100], v[:, :100], dtype=np.float64),
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encoding_piece_by_piece_is_the_whole_block_encoding(monkeypatch, dtype):
    """encode_rows works on pieces of rows (in cache); rows whose product leaves the
    safe range, a row equal to the mean and a last short piece land in several pieces:
    the same encoding as in one piece (to the BLAS's rounding, whose order may depend
    on the number of rows), and as a float64 brute force."""
    import slem_dask.core.linear as linear

    rng = np.random.default_rng(9)
    x = rng.standard_normal((1_000, 16)).astype(dtype) + 5
    mean = x.mean(axis=0, dtype=np.float64).astype(dtype).astype(np.float64)
    x[[3, 517]] *= dtype(1e30) if dtype == np.float32 else 1e200  # products overflow
    x[700] = mean  # no direction: 0
    cov = np.cov(x[800:].T.astype(np.float64)) + 0.1 * np.eye(16)
    precision = np.linalg.inv(cov)
    matrix = linear.float32_matrix(precision) if dtype == np.float32 else precision
    whole = encode_rows(x, mean, matrix, dtype=dtype)
    monkeypatch.setattr(linear, "_PIECE_BYTES", 1)
    monkeypatch.setattr(linear, "_PIECE_MIN_ROWS", 97)  # 11 pieces, the last of 30 rows
    pieces = encode_rows(x, mean, matrix, dtype=dtype)
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(pieces, whole, rtol=0, atol=tol)
    delta = x.astype(np.float64) - mean
    scale = np.abs(delta).max(axis=1, keepdims=True)
    direction = (delta / np.where(scale > 0, scale, 1)) @ precision
    norms = np.linalg.norm(direction, axis=1, keepdims=True)
    brute = np.divide(direction, norms, out=np.zeros_like(direction), where=norms > 0)
    np.testing.assert_allclose(pieces, brute, rtol=0, atol=1e-5 if dtype == np.float32 else 1e-12)
    assert not pieces[700].any() and np.abs(pieces[[3, 517]]).max() > 0.1


@pytest.mark.parametrize(
    "rows_dtype,matrix_dtype",
    [(np.float32, np.float32), (np.float64, np.float64), (np.float32, np.float64)],
)
@pytest.mark.parametrize("piece_rows", [None, 300])
def test_centring_in_runs_of_rows_gives_the_same_bits_as_row_by_row(
    monkeypatch, rows_dtype, matrix_dtype, piece_rows
):
    """encode_rows subtracts the mean from runs of whole rows at once (issue 42: numpy's
    broadcast loop restarts every d values): the same bits as row by row, for the rows
    of whole runs, the rows left over, a strided input (row by row) and every precision."""
    import slem_dask.core.linear as linear

    rng = np.random.default_rng(13)
    x = (rng.standard_normal((1_000, 64)) * 3 + 40).astype(rows_dtype)  # far from 0: low counts
    mean = x.mean(axis=0, dtype=np.float64) + 1e-7
    cov = np.cov(x.T.astype(np.float64)) + 0.1 * np.eye(64)
    matrix = np.linalg.inv(cov)
    matrix = linear.float32_matrix(matrix) if matrix_dtype == np.float32 else matrix
    if piece_rows:  # pieces of 300 rows: 256 in runs of 128 rows, 44 left over
        monkeypatch.setattr(linear, "_PIECE_BYTES", 1)
        monkeypatch.setattr(linear, "_PIECE_MIN_ROWS", piece_rows)
    assert linear._CENTRE_RUN // 64 == 128
    runs = linear.encode_rows(x, mean, matrix)
    strided = linear.encode_rows(np.asfortranarray(x), mean, matrix)
    monkeypatch.setattr(linear, "_CENTRE_RUN", 1)  # row by row
    np.testing.assert_array_equal(runs, linear.encode_rows(x, mean, matrix))
    np.testing.assert_array_equal(strided, runs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_row_encodes_alike_whether_or_not_its_piece_needs_the_guarded_path(dtype):
    """A piece whose rows all have norms in the safe range is normalized without the
    guarded division (issue 42: less Python per piece); a piece holding an extreme row or
    a row equal to the mean takes the guarded one. Its other rows: the same bits."""
    import slem_dask.core.linear as linear

    rng = np.random.default_rng(10)
    x = rng.standard_normal((200, 64)).astype(dtype) + 3
    mean = x.mean(axis=0, dtype=np.float64).astype(dtype).astype(np.float64)  # a row can equal it
    cov = np.cov(x.T.astype(np.float64)) + 0.1 * np.eye(64)
    matrix = np.linalg.inv(cov)
    matrix = linear.float32_matrix(matrix) if dtype == np.float32 else matrix
    plain = encode_rows(x, mean, matrix)
    guarded = x.copy()
    guarded[50] *= dtype(1e30) if dtype == np.float32 else 1e200  # its product overflows
    guarded[120] = mean  # no direction: 0
    got = encode_rows(guarded, mean, matrix)
    others = np.setdiff1d(np.arange(200), [50, 120])
    np.testing.assert_array_equal(got[others], plain[others])
    assert not got[120].any() and np.abs(got[50]).max() > 0.1


def test_ill_conditioned_model_encodes_in_float64():
    x = descriptors(2_000, 20, 0.0, seed=6)
    model = LinearSLEM(lam=1e-6).fit(x)  # cond(A) up to ~1e7: float32 would lose the bound
    assert not float32_encoding_ok(condition_bound(model.covariance_, model.lam))
    assert model._encoding_matrix(np.float32, "auto").dtype == np.float64
    ref = encode_rows(x[:50].astype(np.float64), model.mean_, model.precision_)
    np.testing.assert_array_equal(model.transform(x[:50], dtype=np.float64), ref)


def test_precision_parameter_is_checked():
    with pytest.raises(
        ValueError,
        match=r"precision must be one of \('auto', 'float64'\), "
        r"got 'float32'",
    ):
        LinearSLEM(precision="float32").fit(np.ones((4, 2)) + np.eye(4, 2))
    model = LinearSLEM().fit(descriptors(50, 3))
    with pytest.raises(ValueError, match="precision must be"):
        model.transform(np.ones((2, 3), np.float32), precision="half")
    with pytest.raises(ValueError, match="precision must be"):
        scatter_statistics(da.ones((4, 2), chunks=2), precision="single")


# -- wide descriptors: partials bounded whatever the chunking ----------------------
def test_blocks_narrower_than_d_are_joined():
    """d larger than the partition rows: blocks are joined to >= d rows, so there are
    at most n / d partial d x d matrices; the result still equals numpy."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((300, 40)) + 3.0
    stats = scatter_statistics(da.from_array(x, chunks=(8, 40)))
    graph = dict(stats.__dask_graph__())
    leaves = [k for k in graph if isinstance(k, tuple) and str(k[0]).startswith("_block_stat")]
    assert len(leaves) == -(-300 // 40)  # 8 blocks of 40 (5 x 8 rows) rows, not 38
    (got,) = dask.compute(stats)
    ref = np.cov(x, rowvar=False, bias=True)
    assert np.linalg.norm(covariance(got) - ref) <= 1e-12 * np.linalg.norm(ref)


def test_merge_fan_in_shrinks_with_d(monkeypatch):
    assert merge_fan_in(512) == 8  # 2 MiB partials: the default fan-in
    assert merge_fan_in(8192) == 2  # 512 MiB partials: two at a time
    import slem_dask.parallel.blocks as parallel

    monkeypatch.setattr(parallel, "MERGE_BYTES", 3 * 8 * 30 * 30)  # 3 partials of d = 30
    x = np.random.default_rng(8).standard_normal((600, 30)).astype(np.float32)
    stats = scatter_statistics(da.from_array(x, chunks=(30, 30)))
    graph = stats.__dask_graph__()
    merges = [k for k in dict(graph) if isinstance(k, tuple) and str(k[0]).startswith("slem-merge")]
    assert len(merges) == 7 + 3 + 1  # 20 leaves, 3 at a time: 7, then 3, then 1
    (got,) = dask.compute(stats)
    _, cov64 = float64_statistics(x)
    assert max_rel(covariance(got), cov64) <= BOUND


# -- BLAS threads ---------------------------------------------------------------
class FakeController:
    """Records the limits set, as threadpoolctl's controller would apply them.

    (OpenBLAS's reported thread count is unreliable once a pool thread has set
    it, so the test checks the calls, not threadpool_info().)
    """

    def __init__(self):
        self.threads = 2
        self.calls = []

    def limit(self, limits, user_api):
        assert (limits, user_api) == (1, "blas")
        controller, original = self, self.threads
        self.threads = 1
        self.calls.append("limit")

        class Limit:
            def restore_original_limits(self):
                controller.threads = original
                controller.calls.append("restore")

        return Limit()


def test_single_threaded_blas_in_pool_threads_only(monkeypatch):
    import slem_dask.parallel.blocks as parallel

    fake = FakeController()
    monkeypatch.setattr(parallel, "_TASKS_BLAS", CountedLimit(lambda: fake.limit(1, "blas")))
    with single_threaded_blas():  # main thread: the synchronous scheduler, numpy input
        assert fake.threads == 2
    inside = [threading.Event(), threading.Event()]
    leave = [threading.Event(), threading.Event()]

    def task(k):
        with single_threaded_blas():
            inside[k].set()
            leave[k].wait(10)

    threads = [threading.Thread(target=task, args=(k,)) for k in range(2)]
    threads[0].start()
    assert inside[0].wait(10)
    assert fake.threads == 1  # a task in a pool thread: one BLAS thread
    threads[1].start()
    assert inside[1].wait(10)
    leave[0].set()  # the first task leaves while the second still runs ...
    threads[0].join()
    assert fake.threads == 1  # ... and the limit stays
    leave[1].set()
    threads[1].join()
    assert fake.threads == 2 and fake.calls == ["limit", "restore"]  # restored by the last


def test_dask_tasks_run_with_one_blas_thread(monkeypatch):
    import slem_dask.parallel.blocks as parallel

    fake = FakeController()
    monkeypatch.setattr(parallel, "_TASKS_BLAS", CountedLimit(lambda: fake.limit(1, "blas")))
    seen = []
    original = parallel.block_statistics

    def spy(block, precision):
        seen.append(fake.threads)
        return original(block, precision)

    monkeypatch.setattr(parallel, "block_statistics", spy)
    x = descriptors(400, 5)
    dask.compute(scatter_statistics(da.from_array(x, chunks=(50, 5))), scheduler="threads")
    model = LinearSLEM().fit(x)
    z = model.transform(da.from_array(x, chunks=(50, 5)))
    enc = []
    monkeypatch.setattr(
        parallel, "encode_rows", lambda *a, **k: (enc.append(fake.threads), encode_rows(*a, **k))[1]
    )
    parallel.encode_blocks(
        da.from_array(x, chunks=(50, 5)), model.mean_, model.precision_, np.float32
    ).compute(scheduler="threads")
    assert seen == [1] * 8 and enc == [1] * 8 and fake.threads == 2
    assert z.dtype == np.float32  # dtype in = dtype out


def test_a_float32_encode_task_is_never_widened_to_float64(monkeypatch):
    # encode_rows returned float64 by default: a float32 partition was copied to
    # float64 and back (64 MiB and two passes per 16,384 x 512 partition)
    import slem_dask.parallel.blocks as parallel

    x = descriptors(400, 8)
    model = LinearSLEM(lam=0.1).fit(x)
    assert model._encoding_matrix(x.dtype, "auto").dtype == np.float32  # float32 applies
    returned = []
    monkeypatch.setattr(
        parallel,
        "encode_rows",
        lambda *a, **k: (returned.append(encode_rows(*a, **k)), returned[-1])[1],
    )
    z = model.transform(da.from_array(x, chunks=(100, 8))).compute(scheduler="sync")
    assert [r.dtype for r in returned] == [np.float32] * 4
    # each task computes what encode_rows computes on its chunk, bit for bit ...
    with single_threaded_blas():
        chunks = [model.transform(x[i : i + 100]) for i in range(0, 400, 100)]
    np.testing.assert_array_equal(z, np.vstack(chunks))
    # ... while products of other shapes (one 400-row call) round the last bits in
    # an order of the BLAS's own (OPENBLAS_CORETYPE=Haswell: 69 of 3,200 entries
    # by up to 2.2e-7): both stay within the bound of the float64 encoding
    exact = model.transform(x, precision="float64")
    assert np.abs(z - exact).max() <= BOUND
    assert np.abs(model.transform(x) - exact).max() <= BOUND
    assert encode_rows(x, model.mean_, model.precision_).dtype == np.float64  # float64 A^-1


def test_precision_in_job_specs():
    from slem_dask.pipeline.jobspec import SpecError, parse_spec

    spec = parse_spec(
        {
            "model": {"path": "m", "precision": "float64"},
            "encode": [{"positives": "p", "out": "o", "precision": "auto"}],
        }
    )
    assert spec.model.precision == "float64" and spec.encode[0].precision == "auto"
    assert parse_spec({"model": {"path": "m"}, "fit": {"negatives": "n"}}).model.precision == "auto"
    with pytest.raises(SpecError, match="model.precision = 'single': expected one of"):
        parse_spec({"model": {"path": "m", "precision": "single"}})


def test_wide_rows_use_panels_and_stay_exact(monkeypatch):
    """Wide rows: the float32 product in column panels of the upper block triangle,
    mirrored; same bound, exactly symmetric (small panels stand in for d = 8192)."""
    import slem_dask.core.statistics as statistics

    monkeypatch.setattr(statistics, "_PANEL_COLUMNS", 7)
    x = descriptors(3_000, 40, 1e4, seed=9)
    _, cov64 = float64_statistics(x)
    parts = [block_statistics(x[i : i + 500]) for i in range(0, 3_000, 500)]
    cov = covariance(merge_many(parts))
    np.testing.assert_array_equal(cov, cov.T)
    assert max_rel(cov, cov64) <= BOUND


def test_merge_task_reuses_its_first_partial():
    from slem_dask.core.statistics import merge_into, merge_statistics
    from slem_dask.parallel.blocks import _merge_parts

    rng = np.random.default_rng(10)
    blocks = [rng.standard_normal((m, 6)) + 5 for m in (30, 1, 50, 7)]
    want = merge_many([block_statistics(b) for b in blocks])
    parts = [block_statistics(b) for b in blocks] + [block_statistics(np.empty((0, 6)))]
    first = parts[0].scatter
    got = _merge_parts(parts)
    assert got.scatter is first  # no new d x d matrix
    assert got.count == 88
    np.testing.assert_allclose(got.scatter, want.scatter, rtol=1e-12)
    np.testing.assert_allclose(got.mean, want.mean, rtol=1e-14)
    a, b = block_statistics(blocks[0]), block_statistics(blocks[2])
    ref = merge_statistics(a, b)
    np.testing.assert_allclose(merge_into(a, b).scatter, ref.scatter, rtol=1e-14)


_OWNER_SCRIPT = r"""
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from threadpoolctl import ThreadpoolController, threadpool_info
import slem_dask.parallel.blocks as parallel
ThreadpoolController().limit(limits=2, user_api="blas")  # the main thread sets first
barrier = threading.Barrier(2)
def task():
    with parallel.single_threaded_blas():
        barrier.wait(10)
        seen = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
        barrier.wait(10)
        return seen
with ThreadPoolExecutor(2) as pool:
    print(json.dumps([f.result() for f in [pool.submit(task) for _ in range(2)]]))
"""


_OWNER_SCRIPT_LIMITS = r"""
import json
import threading
import scipy.linalg  # numpy's and scipy's BLAS loaded, as in any job
from threadpoolctl import ThreadpoolController, threadpool_info
from slem_dask.core import blas_threads
ThreadpoolController().limit(limits=2, user_api="blas")  # the main thread sets first
seen = []
def body():
    for limit in (blas_threads.one_blas_thread, lambda: blas_threads.factorization_threads(16)):
        with limit():
            seen.append([i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"])
thread = threading.Thread(target=body)
thread.start()
thread.join()
print(json.dumps(seen))
"""


def _blas_counts_in_a_fresh_process(script: str) -> list:
    """The BLAS thread counts ``script`` prints (a fresh process, OpenBLAS on 2 threads,
    so that which thread set the count first is known)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "2"},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_blas_thread_and_small_factorizations_hold_in_other_threads_too():
    # they went through threadpoolctl, which OpenBLAS ignores in those threads
    seen = _blas_counts_in_a_fresh_process(_OWNER_SCRIPT_LIMITS)
    assert len(seen) == 2 and all(count == 1 for limit in seen for count in limit), seen


def test_pool_threads_get_one_blas_thread_when_the_main_thread_set_the_count_first():
    """OpenBLAS 0.3.31 ignores openblas_set_num_threads from threads other than the
    first that called it: with the main thread first, a task thread's limit through
    threadpoolctl left both concurrent tasks on 2 BLAS threads."""
    seen = _blas_counts_in_a_fresh_process(_OWNER_SCRIPT)
    assert seen and all(count == 1 for task in seen for count in task), seen
