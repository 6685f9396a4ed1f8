"""Search scores do not depend on the BLAS, the blocking or a row's place in a call
(docs/numerics.md): every path reports the float64 products summed left to right,
copies of a row tie on every path, and a BLAS that sums in other orders (as other
kernels, shapes and tile positions do) changes no result."""

import dask
import dask.array as da
import numpy as np
import pytest

from slem_dask import search
from slem_dask.core import ranking
from slem_dask.core.candidates import topk_search
from slem_dask.core.ranking import exact_topk_search


def sequential_scores(queries, database):
    """Every pair's float64 products summed feature after feature, left to right
    (an outer product per feature: not the gathered pairs the library uses)."""
    q = np.asarray(queries, dtype=np.float64)
    x = np.asarray(database, dtype=np.float64)
    total = np.zeros((len(q), len(x)))
    for feature in range(q.shape[1]):
        total += np.multiply.outer(q[:, feature], x[:, feature])
    return total


def reference_topk(queries, database, k):
    """Sequential scores ranked by (-score, index)."""
    scores = sequential_scores(queries, database)
    order = np.array([np.lexsort((np.arange(row.size), -row))[:k] for row in scores])
    return np.take_along_axis(scores, order, axis=1), order


def with_copies(d, dtype, seed, n_base=150, n_copies=90):
    """Full-mantissa rows and copies of them at other places (different tiles and
    blocks of any product), and queries that include some of the copies."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n_base, d)).astype(dtype)
    copies = rng.integers(0, n_base, n_copies)
    database = np.vstack([base, base[copies], base[copies[:20]]])
    queries = np.vstack([base[copies[:5]], rng.standard_normal((4, d)).astype(dtype)])
    return queries, database


def other_orders(queries, database):
    """A hostile BLAS: each entry summed in one of three orders (forward, backward,
    numpy's pairwise), chosen at random per entry, as tiles and kernels differ."""
    q = np.asarray(queries, dtype=np.float64)
    x = np.asarray(database, dtype=np.float64)
    products = q[:, None, :] * x[None, :, :]
    forward = sequential_scores(q, x)
    backward = sequential_scores(q[:, ::-1], x[:, ::-1])
    pairwise = products.sum(axis=2)
    pick = np.random.default_rng(len(q) * 7919 + len(x)).integers(0, 3, forward.shape)
    return np.choose(pick, [forward, backward, pairwise])


def assert_copies_tie(scores, indices, database):
    for row_s, row_i in zip(scores, indices, strict=True):
        for a in range(len(row_i) - 1):
            assert row_s[a] > row_s[a + 1] or row_i[a] < row_i[a + 1]
            if np.array_equal(database[row_i[a]], database[row_i[a + 1]]):
                assert row_s[a] == row_s[a + 1]


def top_k_paths(queries, database, k):
    """(name, (scores, indices)) of every path that returns a top k."""
    yield "numpy candidates", search(queries, database, k)
    yield "exact path, blocks of 7", exact_topk_search(queries, database, k, database_rows=7)
    yield "candidates, blocks of 11", topk_search(queries, database, k, database_rows=11)
    for chunks in (37, 100):  # a trailing block of <= 2k rows takes the exact path
        got = search(queries, da.from_array(database, chunks=(chunks, -1)), k)
        yield f"dask chunks {chunks}", dask.compute(*got, scheduler="sync")


@pytest.fixture(autouse=True)
def keep_database_chunks(monkeypatch):
    from slem_dask.retrieval import topk as retrieval  # where the search lives

    monkeypatch.setattr(retrieval, "_DATABASE_BLOCK_BYTES", 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [5, 128, 9000])
def test_every_top_k_path_reports_the_sequential_scores(d, dtype):
    queries, database = with_copies(d, dtype, seed=d)
    want_scores, want = reference_topk(queries, database, 8)
    for name, (scores, indices) in top_k_paths(queries, database, 8):
        np.testing.assert_array_equal(indices, want, err_msg=name)
        np.testing.assert_array_equal(scores, want_scores, err_msg=name)


@pytest.mark.parametrize("d", [5, 128])
def test_another_blas_changes_no_top_k(d, monkeypatch):
    queries, database = with_copies(d, np.float64, seed=40 + d)
    want_scores, want = reference_topk(queries, database, 8)
    monkeypatch.setattr(ranking, "blas_scores", other_orders)
    for name, (scores, indices) in top_k_paths(queries, database, 8):
        np.testing.assert_array_equal(indices, want, err_msg=name)
        np.testing.assert_array_equal(scores, want_scores, err_msg=name)


def whole_rankings(queries, database):
    k = len(database)
    yield "numpy", search(queries, database, k)
    dask_db = da.from_array(database, chunks=(50, -1))
    yield "dask", dask.compute(*search(queries, dask_db, k), scheduler="sync")


@pytest.mark.parametrize("hostile", [False, True])
@pytest.mark.parametrize("d", [5, 128, 9000])
def test_whole_rankings_are_the_sequential_ranking_and_copies_tie(d, hostile, monkeypatch):
    """Whole rankings keep the BLAS's scores except where near-ties are settled:
    the ranking is the sequential one exactly, copies tie, scores within rounding."""
    queries, database = with_copies(d, np.float64, seed=80 + d)
    want_scores, want = reference_topk(queries, database, len(database))
    if hostile:
        monkeypatch.setattr(ranking, "blas_scores", other_orders)
    for name, (scores, indices) in whole_rankings(queries, database):
        np.testing.assert_array_equal(indices, want, err_msg=name)
        assert_copies_tie(scores, indices, database)
        np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-12 * np.sqrt(d))


def test_pair_scores_are_the_same_in_any_batch():
    """numpy's einsum summed long float64 rows (d > 8192) differently with the
    number of pairs: one pair at a time and many at once disagreed in the last bits."""
    from slem_dask.core.dots import pair_scores

    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 10_000))
    q = rng.standard_normal((2, 10_000))
    alone = np.array([pair_scores(q, x, [0], [j])[0] for j in range(40)])
    together = pair_scores(q, x, np.zeros(40, int), np.arange(40))
    np.testing.assert_array_equal(alone, together)
    np.testing.assert_array_equal(together, sequential_scores(q[:1], x)[0])
