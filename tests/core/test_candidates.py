"""Exact top-k from float32 candidates and a float64 re-score (slem_dask.core.candidates),
against float64 brute force, on data where float32 cannot tell the rows apart."""

import dask
import dask.array as da
import numpy as np
import pytest

from reference import brute_force_topk
from slem_dask import search
from slem_dask.core import candidates
from slem_dask.core.candidates import row_norm_bounds, score_error_factor, topk_search

STEP = 2.0**-20  # grid of the "hard" rows: |x| < 8 on it has at most 23 bits


@pytest.fixture(autouse=True)
def keep_database_chunks(monkeypatch):
    """Dask searches here keep the test's row chunks (search merges chunks up to 64 MiB,
    which would make every small database here one block and leave merges untested)."""
    from slem_dask.retrieval import topk as retrieval  # where the search lives

    monkeypatch.setattr(retrieval, "_DATABASE_BLOCK_BYTES", 0)


def grid_rows(rng, n, d):
    """float32 rows on a 2**-20 grid in (-8, 8): every product is a multiple of 2**-40
    below 64, so any float64 sum of d <= 16 of them is exact whatever its order (the
    reference's float64 scores are the true ones, bit for bit), while float32 keeps
    only 24 bits of sums up to 1024."""
    return (rng.integers(-(2**23) + 1, 2**23, size=(n, d)) * STEP).astype(np.float32)


def hard_database(rng, n_base=30, per=30, d=16):
    """Groups of near-ties: each base row with ``per`` variants whose coordinates moved
    by a few 2**-20 steps (the last bits of a float32, which the float32 product cannot
    resolve; its rounding reorders them), and exact duplicates, shuffled."""
    base = grid_rows(rng, n_base, d)
    near = np.repeat(base, per, axis=0)
    for _ in range(4):
        cols = rng.integers(0, d, len(near))
        near[np.arange(len(near)), cols] += (rng.integers(-3, 4, len(near)) * STEP).astype(
            np.float32
        )
    rows = np.vstack([base, near, base[:10], near[:20]])
    return rows[rng.permutation(len(rows))]


@pytest.fixture(scope="module")
def hard():
    rng = np.random.default_rng(30)
    database = hard_database(rng)
    queries = np.vstack(
        [database[rng.choice(len(database), 60, replace=False)], grid_rows(rng, 20, 16)]
    )
    return queries, database


def assert_exact(got, queries, database, k):
    scores, indices = got
    ref_scores, ref_indices = brute_force_topk(queries, database, k)
    np.testing.assert_array_equal(indices, ref_indices)
    np.testing.assert_array_equal(scores, ref_scores)


def test_hard_data_needs_the_margin(hard, monkeypatch):
    """The data has teeth: candidates cut at the float32 k-th score itself, without
    the rounding margin, miss true top-k rows of some queries."""
    _, database = hard
    queries = database  # every row's near-ties: many chances for float32 to reorder
    monkeypatch.setattr(candidates, "score_error_factor", lambda d: 0.0)
    monkeypatch.setattr(candidates, "_underflow_term", lambda d: 0.0)
    wrong = 0
    for k in (1, 10, 25):
        got = topk_search(queries, database, k)[1]
        wrong += np.count_nonzero((got != brute_force_topk(queries, database, k)[1]).any(1))
    assert wrong > 5


@pytest.mark.parametrize("k", [1, 2, 10, 25, 100, 479, 480, 960, 965])
@pytest.mark.parametrize("database_rows", [7, 64, None])
def test_numpy_kernel_equals_brute_force(hard, k, database_rows):
    queries, database = hard
    k = min(k, len(database))
    stats = {}
    assert_exact(
        topk_search(queries, database, k, database_rows=database_rows, stats=stats),
        queries,
        database,
        k,
    )
    if 2 * k < len(database):  # below a whole ranking, the float32 path serves every row
        assert stats["candidate_rows"] == len(queries) and stats["exact_rows"] == 0


def test_k_beyond_the_database_and_empty_queries(hard):
    queries, database = hard
    scores, indices = topk_search(queries, database, len(database) + 5)
    assert scores.shape == indices.shape == (len(queries), len(database))
    assert_exact((scores, indices), queries, database, len(database))
    scores, indices = topk_search(queries[:0], database, 4)
    assert scores.shape == indices.shape == (0, 4)
    assert scores.dtype == np.float64 and indices.dtype == np.int64


def test_full_mantissa_near_ties_and_duplicates():
    """Random float32 rows with variants one ulp away on several coordinates and
    exact copies, in one kernel call: the float64 ranking, ties to the lower index."""
    rng = np.random.default_rng(21)
    base = rng.standard_normal((300, 32)).astype(np.float32)
    near = np.repeat(base[:100], 4, axis=0)
    for _ in range(3):
        cols = rng.integers(0, 32, len(near))
        near[np.arange(len(near)), cols] = np.nextafter(
            near[np.arange(len(near)), cols], np.float32(np.inf)
        )
    database = np.vstack([base, near, base[:50]])[rng.permutation(750)]
    queries = np.vstack([rng.standard_normal((20, 32)).astype(np.float32), base[:5]])
    stats = {}
    scores, indices = topk_search(queries, database, 20, stats=stats)
    ref_scores, ref_indices = brute_force_topk(queries, database, 20)
    np.testing.assert_array_equal(indices, ref_indices)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-14, atol=0)
    assert stats["exact_rows"] == 0


@pytest.mark.parametrize("chunks", [31, 97, (400, 1, 530, 29), -1])
def test_dask_search_equals_brute_force(hard, chunks):
    queries, database = hard
    db = da.from_array(database, chunks=(chunks, 16))
    for q in (queries, da.from_array(queries, chunks=(4, 16))):
        for k in (1, 9, 60):
            got = dask.compute(search(q, db, k), scheduler="threads")[0]
            assert_exact(got, queries, database, k)


def test_numpy_search_in_parts_equals_brute_force(monkeypatch):
    """Above _PARALLEL_MIN_ROWS the numpy search runs parts of the database in
    threads; duplicates straddle the parts' boundary."""
    from slem_dask.retrieval import topk as retrieval  # where the search lives

    monkeypatch.setattr(retrieval, "_PARALLEL_MIN_ROWS", 100)
    monkeypatch.setattr(retrieval, "usable_cores", lambda: 3)
    rng = np.random.default_rng(22)
    database = hard_database(rng, n_base=12)
    queries = np.vstack([grid_rows(rng, 10, 16), database[[0, 200, 310]]])
    for k in (1, 25):
        assert_exact(search(queries, database, k), queries, database, k)
    bad = database.copy()
    bad[300, 3] = np.nan  # in the third part: named by its global row number
    with pytest.raises(ValueError, match=r"database has 1 row\(s\) with NaN or inf \(rows 300\)"):
        search(queries, bad, 5)


def test_search_on_a_local_cluster(hard):
    from distributed import Client, LocalCluster

    queries, database = hard
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster),
    ):
        db = da.from_array(database, chunks=(200, 16))
        got = dask.compute(*search(queries, db, 12))
    assert_exact(got, queries, database, 12)


def test_float32_path_is_taken(monkeypatch):
    """Random rows: no query falls back to the exact path (it is made to fail), on
    numpy and dask inputs, and few more candidates than k are re-scored."""

    def refuse(*args, **kwargs):
        raise AssertionError("the exact path ran")

    monkeypatch.setattr(candidates, "exact_topk_search", refuse)
    rng = np.random.default_rng(23)
    database = rng.standard_normal((5000, 24)).astype(np.float32)
    queries = rng.standard_normal((40, 24)).astype(np.float32)
    want = brute_force_topk(queries, database, 50)
    stats = {}
    got = topk_search(queries, database, 50, database_rows=700, stats=stats)
    np.testing.assert_array_equal(got[1], want[1])
    assert stats == {"candidate_rows": 40, "exact_rows": 0, "candidates": stats["candidates"]}
    assert stats["candidates"] < 40 * 50 * 1.1
    got = dask.compute(
        search(queries, da.from_array(database, chunks=(1000, 24)), 50), scheduler="sync"
    )[0]
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(search(queries, database, 50)[1], want[1])


def test_thousands_of_ties_take_the_exact_path():
    """3,000 identical rows: every row is a candidate, more than the cap, so those
    queries go to the exact path, with ties to the lower index."""
    rng = np.random.default_rng(24)
    row = grid_rows(rng, 1, 8)
    database = np.vstack([grid_rows(rng, 50, 8) * 0.01, np.repeat(row, 3000, axis=0)])
    queries = np.vstack([row, grid_rows(rng, 3, 8) * 0.01])
    stats = {}
    got = topk_search(queries, database, 5, stats=stats)
    assert stats["exact_rows"] >= 1
    assert_exact(got, queries, database, 5)
    np.testing.assert_array_equal(got[1][0], np.arange(50, 55))


def test_values_beyond_float32_take_the_exact_path():
    """Finite float64 values whose squares (or themselves) overflow float32 are not an
    error; the bound cannot cover them, so the exact path ranks them."""
    rng = np.random.default_rng(25)
    database = rng.standard_normal((300, 6))
    queries = rng.standard_normal((4, 6))
    for scale in (1e25, 1e40):
        db = database.copy()
        db[17] *= scale
        stats = {}
        got = topk_search(queries, db, 7, stats=stats)
        assert stats["exact_rows"] == 4
        want = brute_force_topk(queries, db, 7)
        np.testing.assert_array_equal(got[1], want[1])


def test_nonfinite_rows_named_by_the_norm_pass():
    rng = np.random.default_rng(26)
    q = rng.standard_normal((5, 4)).astype(np.float32)
    db = rng.standard_normal((30_000, 4)).astype(np.float32)
    db[[12, 29_990], 1] = [np.nan, -np.inf]
    with pytest.raises(
        ValueError,
        match=r"database has 2 row\(s\) with NaN or inf "
        r"\(rows 12, 29990\)",
    ):
        search(q, db, 3)
    s, i = search(q, da.from_array(db, chunks=(20_000, 4)), 3)
    with pytest.raises(ValueError, match=r"database has 1 row\(s\) .*\(rows 29990\)"):
        dask.compute(s, i, scheduler="sync")


def test_rounding_bound_holds_under_cancellation():
    """|fl32(q . x) - q . x| <= G ||q|| ||x|| + eta on sums that cancel (large terms, small
    result), the worst case for the float32 product."""
    rng = np.random.default_rng(27)
    d = 64
    x = rng.standard_normal((2000, d)).astype(np.float32) * np.float32(1e3)
    x[:, d // 2 :] = -x[:, : d // 2] * (1 + rng.standard_normal((2000, d // 2)) * 1e-4)
    q = np.ones((3, d), dtype=np.float32)
    s32 = (q @ x.T).astype(np.float64)
    s64 = q.astype(np.float64) @ x.astype(np.float64).T
    bound = score_error_factor(d) * np.outer(row_norm_bounds(q), row_norm_bounds(x))
    assert np.all(np.abs(s32 - s64) <= bound)
    assert np.max(np.abs(s32 - s64) / bound) > 1e-3  # the bound is not vacuous here


def test_small_chunks_are_merged_into_larger_tasks(hard, monkeypatch):
    from slem_dask.retrieval import topk as retrieval  # where the search lives

    monkeypatch.setattr(retrieval, "_DATABASE_BLOCK_BYTES", 4 * 16 * 300)  # 300 rows
    queries, database = hard
    db = da.from_array(database, chunks=(64, 16))
    scores, indices = search(queries, db, 9)
    topk_layers = [name for name in scores.dask.layers if name.startswith("search-topk")]
    assert len(topk_layers) == 1
    assert (
        len(
            [
                key
                for key in scores.dask.to_dict()
                if isinstance(key, tuple) and key[0] == topk_layers[0]
            ]
        )
        == 4
    )  # 256 rows
    assert_exact(dask.compute(scores, indices, scheduler="sync"), queries, database, 9)


@pytest.mark.parametrize("d", [5, 128, 512])
def test_duplicates_score_equal_in_any_block(d):
    """Copies of a full-mantissa row in different dask blocks get the same float64
    score (one dot product per pair, the same for every pair), so they rank by index
    whatever the chunking; float64 scores agree with brute force to rounding."""
    rng = np.random.default_rng(28 + d)
    base = rng.standard_normal((400, d)).astype(np.float32)
    copies = rng.integers(0, 400, 200)
    database = np.vstack([base, base[copies]])
    queries = np.vstack([base[copies[:6]], rng.standard_normal((4, d)).astype(np.float32)])
    want_scores, want = brute_force_topk(queries, database, 8)
    for chunks in (37, 150, 600):
        scores, indices = dask.compute(
            search(queries, da.from_array(database, chunks=(chunks, d)), 8), scheduler="sync"
        )[0]
        for row_s, row_i in zip(scores, indices, strict=True):
            for a in range(7):  # equal scores: increasing indices, and copies score equal
                assert row_s[a] > row_s[a + 1] or row_i[a] < row_i[a + 1]
                if np.array_equal(database[row_i[a]], database[row_i[a + 1]]):
                    assert row_s[a] == row_s[a + 1]
        np.testing.assert_allclose(scores, want_scores, rtol=1e-13)
        # brute force's own float64 product may break a copy's tie by its last bit:
        # compare the rows, not their indices
        np.testing.assert_array_equal(database[indices], database[want])
