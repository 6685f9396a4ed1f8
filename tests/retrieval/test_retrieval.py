"""Retrieval: exact top-k search, average precision, precision/recall@k, and the demo."""

import dask
import dask.array as da
import numpy as np
import pytest

from reference import average_precision_loop, brute_force_topk, oxford_compute_ap
from slem_dask import mean_average_precision, precision_recall_at_k, search
from slem_dask.core.ranking import average_precision


@pytest.fixture(autouse=True)
def keep_database_chunks(monkeypatch):
    """Dask searches here keep the test's row chunks (search merges chunks up to 64 MiB,
    which would make every small database here one block and leave merges untested)."""
    from slem_dask.retrieval import topk as retrieval  # where the search lives

    monkeypatch.setattr(retrieval, "_DATABASE_BLOCK_BYTES", 0)


def integer_rows(rng, n, d):
    """Small integers as floats: every dot product is exact, so ties are exact too."""
    return rng.integers(-2, 3, size=(n, d)).astype(np.float64)


@pytest.fixture(scope="module")
def tied():
    """A database with duplicated rows (exact ties) and queries that hit them."""
    rng = np.random.default_rng(0)
    base = integer_rows(rng, 25, 4)
    database = np.vstack([base, base[:10], base[3:8], base[:1]])  # 41 rows, many duplicates
    queries = np.vstack([integer_rows(rng, 6, 4), database[[0, 30]]])
    return queries, database


def check_search(queries, database, k, q_for_ref=None, db_for_ref=None):
    result = search(queries, database, k)
    if isinstance(result, tuple) and all(isinstance(r, np.ndarray) for r in result):
        scores, indices = result
    else:
        scores, indices = dask.compute(result, scheduler="sync")[0]
    ref_scores, ref_indices = brute_force_topk(
        queries if q_for_ref is None else q_for_ref,
        database if db_for_ref is None else db_for_ref,
        k,
    )
    np.testing.assert_array_equal(indices, ref_indices)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-12, atol=1e-12)
    assert indices.shape == (len(ref_indices), k)


@pytest.mark.parametrize("k", [1, 5, 17, 41])
def test_numpy_search_with_exact_ties(tied, k):
    queries, database = tied
    all_scores, _ = brute_force_topk(queries, database, len(database))
    assert all(len(np.unique(row[: k + 1])) < k + 1 for row in all_scores[-2:])  # ties at k
    check_search(queries, database, k)


@pytest.mark.parametrize("chunks", [1, 7, (10, 1, 20, 10), -1])
@pytest.mark.parametrize("k", [3, 41])
def test_dask_search_with_exact_ties(tied, chunks, k):
    queries, database = tied
    db = da.from_array(database, chunks=(chunks, 4))
    check_search(queries, db, k, db_for_ref=database)
    # dask queries too (rechunked into one block by search)
    q = da.from_array(queries, chunks=(3, 4))
    check_search(q, db, k, q_for_ref=queries, db_for_ref=database)


def test_dask_search_is_lazy(tied):
    queries, database = tied
    db = da.from_array(database, chunks=(5, 4))

    def fail(*args, **kwargs):
        raise AssertionError("search computed while building the graph")

    with dask.config.set(scheduler=fail):
        scores, indices = search(queries, db, 4)  # unpacks without computing
        assert isinstance(scores, da.Array) and isinstance(indices, da.Array)
        assert scores.shape == indices.shape == (len(queries), 4)
        assert scores.dtype == np.float64 and indices.dtype == np.int64
    ref_scores, ref_indices = brute_force_topk(queries, database, 4)
    got_scores, got_indices = dask.compute(scores, indices, scheduler="sync")
    np.testing.assert_array_equal(got_indices, ref_indices)
    np.testing.assert_allclose(got_scores, ref_scores, rtol=1e-12)


@pytest.mark.parametrize("chunks", [13, (50, 1, 149)])
def test_search_random_float_database(chunks):
    rng = np.random.default_rng(5)
    database = rng.standard_normal((200, 16))
    database /= np.linalg.norm(database, axis=1, keepdims=True)
    queries = rng.standard_normal((9, 16))
    check_search(queries, database, 25)
    check_search(queries, da.from_array(database, chunks=(chunks, 16)), 25, db_for_ref=database)
    check_search(queries, database.astype(np.float32), 200, db_for_ref=database.astype(np.float32))


def test_search_bad_input():
    db = np.ones((10, 4))
    with pytest.raises(ValueError, match=r"k=11 is larger than the database \(10 rows\)"):
        search(np.ones((2, 4)), db, 11)
    with pytest.raises(ValueError, match="k=11 is larger"):
        search(np.ones((2, 4)), da.from_array(db, chunks=(3, 4)), 11)
    for k in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="k must be an integer >= 1"):
            search(np.ones((2, 4)), db, k)
    with pytest.raises(ValueError, match="queries have 3 features but database rows have 4"):
        search(np.ones((2, 3)), db, 2)
    with pytest.raises(ValueError, match="2-D"):
        search(np.ones(4), db, 2)
    with pytest.raises(ValueError, match="database has 0 rows"):
        search(np.ones((2, 4)), np.ones((0, 4)), 1)


# -- average precision ---------------------------------------------------------
HAND_MADE = [
    # (ranking, relevant, junk, expected non-interpolated AP)
    ([3, 1, 4, 0, 2], [1, 2], [], (1 / 2 + 2 / 5) / 2),
    ([3, 1, 4, 0, 2], [1, 2], [4], (1 / 2 + 2 / 4) / 2),  # junk takes no rank
    ([3, 1, 4, 0, 2], [1, 9], [], (1 / 2) / 2),  # 9 never retrieved
    ([1, 2, 3], [1, 2], [], 1.0),
    ([5, 6, 7], [1], [], 0.0),
    ([0, 4, 1, 4, 2], [1, 2, 1], [0], (1 / 2 + 2 / 4) / 2),  # duplicate relevant ids
    ([7, 8, 9, 1], [1], [7, 8, 9], 1.0),  # all junk before the hit
]


@pytest.mark.parametrize("ranking,relevant,junk,expected", HAND_MADE)
def test_average_precision_hand_made(ranking, relevant, junk, expected):
    assert average_precision_loop(ranking, relevant, junk) == pytest.approx(expected)
    assert average_precision(ranking, relevant, junk) == pytest.approx(expected, abs=1e-15)


def random_cases(seed, n_queries=40, n_db=60, k=25):
    rng = np.random.default_rng(seed)
    rankings = np.array([rng.permutation(n_db)[:k] for _ in range(n_queries)])
    relevant = [rng.choice(n_db, size=rng.integers(1, 8), replace=False) for _ in range(n_queries)]
    junk = [
        np.setdiff1d(rng.choice(n_db, size=rng.integers(0, 6), replace=False), rel)
        for rel in relevant
    ]
    return rankings, relevant, junk


@pytest.mark.parametrize("seed", range(3))
def test_mean_average_precision_equals_loop_reference(seed):
    rankings, relevant, junk = random_cases(seed)
    want = np.mean(
        [
            average_precision_loop(r, rel, j)
            for r, rel, j in zip(rankings, relevant, junk, strict=True)
        ]
    )
    assert mean_average_precision(rankings, relevant, junk) == pytest.approx(want, abs=1e-14)
    want_no_junk = np.mean(
        [average_precision_loop(r, rel) for r, rel in zip(rankings, relevant, strict=True)]
    )
    assert mean_average_precision(rankings, relevant) == pytest.approx(want_no_junk, abs=1e-14)


@pytest.mark.parametrize("seed", range(3))
def test_trapezoid_equals_oxford_compute_ap(seed):
    rankings, relevant, junk = random_cases(seed + 10)
    for r, rel, j in zip(rankings, relevant, junk, strict=True):
        assert average_precision(r, rel, j, mode="trapezoid") == pytest.approx(
            oxford_compute_ap(rel, j, r), abs=1e-14
        )
    want = np.mean(
        [oxford_compute_ap(rel, j, r) for r, rel, j in zip(rankings, relevant, junk, strict=True)]
    )
    got = mean_average_precision(rankings, relevant, junk, mode="trapezoid")
    assert got == pytest.approx(want, abs=1e-14)


def test_trapezoid_hand_made():
    # hits at ranks 1 and 3 of 2 relevant: 1/2 * (1 + 1)/2 + 1/2 * (1/2 + 2/3)/2
    assert average_precision([1, 5, 2], [1, 2], mode="trapezoid") == pytest.approx(
        0.5 + 0.5 * (0.5 + 2 / 3) / 2
    )
    assert oxford_compute_ap([1, 2], [], [1, 5, 2]) == pytest.approx(0.5 + 0.5 * (0.5 + 2 / 3) / 2)


def test_map_of_a_tied_search(tied):
    """AP of a search with ties: the ties go to the lower index, as in the reference."""
    queries, database = tied
    _, indices = search(queries, database, 20)
    _, ref = brute_force_topk(queries, database, 20)
    relevant = [
        np.flatnonzero((database == q).all(axis=1))
        if (database == q).all(axis=1).any()
        else np.array([0, 25])
        for q in queries
    ]
    want = np.mean([average_precision_loop(r, rel) for r, rel in zip(ref, relevant, strict=True)])
    assert mean_average_precision(indices, relevant) == pytest.approx(want, abs=1e-14)


def test_precision_recall_at_k():
    indices = np.array([[1, 2, 3, 4, 5], [9, 8, 7, 6, 5]])
    relevant = [[1, 3, 10], [5]]
    p, r = precision_recall_at_k(indices, relevant, 2)
    assert (p, r) == pytest.approx(((1 / 2 + 0) / 2, (1 / 3 + 0) / 2))
    p, r = precision_recall_at_k(indices, relevant, 5)
    assert (p, r) == pytest.approx(((2 / 5 + 1 / 5) / 2, (2 / 3 + 1) / 2))
    # junk is removed before cutting at k
    p, r = precision_recall_at_k(indices, relevant, 2, junk=[[2], [9, 8, 7, 6]])
    assert (p, r) == pytest.approx(((2 / 2 + 1 / 2) / 2, (2 / 3 + 1) / 2))


def test_precision_recall_at_k_random():
    rankings, relevant, junk = random_cases(99)
    for k in (1, 5, 10):
        ps, rs = [], []
        for r, rel, j in zip(rankings, relevant, junk, strict=True):
            kept = [i for i in r if i not in set(j)][:k]
            hits = len(set(kept) & set(rel))
            ps.append(hits / k)
            rs.append(hits / len(set(rel)))
        assert precision_recall_at_k(rankings, relevant, k, junk) == pytest.approx(
            (np.mean(ps), np.mean(rs))
        )


@pytest.mark.parametrize("k", [0, -1, 2.5, True, "3"])
def test_precision_recall_at_k_refuses_a_bad_k(k):
    """k = 0 divided by zero, a negative k cut the ranking from its end (a negative
    precision), a float or text failed inside numpy: each is one line naming k."""
    indices = np.array([[1, 2, 3], [3, 2, 1]])
    with pytest.raises(ValueError, match=r"^k must be an integer >= 1 \(the rank at which"):
        precision_recall_at_k(indices, [[1], [2]], k)
    assert precision_recall_at_k(indices, [[1], [2]], np.int64(2)) == (0.5, 1.0)


@pytest.mark.parametrize("k", [0, 2.5, True])
def test_leave_one_out_map_refuses_a_bad_k(k):
    """A given k is checked, not truncated (int(2.5) ranked 2 rows, int(True) 1)."""
    from slem_dask import leave_one_out_map

    z = np.eye(4)[[0, 0, 1, 1]] + 0.1
    with pytest.raises(ValueError, match=r"^k must be an integer >= 1 \(the ranking length\)"):
        leave_one_out_map(z, [0, 0, 1, 1], k=k)
    assert leave_one_out_map(z, [0, 0, 1, 1], k=np.int64(1)) == 1.0


def test_evaluation_bad_input():
    indices = np.array([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"relevant\[1\] is empty"):
        mean_average_precision(indices, [[0], []])
    with pytest.raises(ValueError, match=r"relevant\[0\] is empty"):
        precision_recall_at_k(indices, [[], [1]], 1)
    with pytest.raises(ValueError, match="at least one relevant"):
        average_precision([0, 1], [])
    with pytest.raises(ValueError, match="relevant has 1 entries but indices has 2 queries"):
        mean_average_precision(indices, [[0]])
    with pytest.raises(ValueError, match="junk has 1 entries"):
        mean_average_precision(indices, [[0], [1]], junk=[[]])
    with pytest.raises(ValueError, match="2-D"):
        mean_average_precision(np.array([0, 1]), [[0]])
    with pytest.raises(ValueError, match="mode must be"):
        mean_average_precision(indices, [[0], [1]], mode="11-point")


# -- the demo ------------------------------------------------------------------
def test_demo_linear_slem_beats_raw_features(tmp_path):
    from distributed import Client, LocalCluster

    from slem_dask.pipeline import demo_job

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        rows, reports = demo_job(
            client, workdir=str(tmp_path / "demo"), n_negatives=3000, n_instances=100, d=32
        )
    by_method = {row["method"]: row for row in rows}
    assert set(by_method) >= {"raw features", "linear SLEM"}
    raw, slem = by_method["raw features"]["mAP"], by_method["linear SLEM"]["mAP"]
    assert 0.0 <= raw <= 1.0 and 0.0 <= slem <= 1.0
    assert slem > raw + 0.05, (raw, slem)
    assert [r.name for r in reports][:2] == ["generate corpus", "fit"]


# -- ground truth as any per-query collection; mappings refused -------------------


@pytest.mark.parametrize("kind", [list, tuple, set, frozenset, np.array, range])
def test_ground_truth_collections(kind):
    indices = np.array([[3, 1, 0, 2], [2, 0, 1, 3]])
    as_lists = [[1, 2], [2]]
    junk_lists = [[3], []]
    if kind is range:
        relevant, junk = [range(1, 3), range(2, 3)], [range(3, 4), range(0)]
    else:
        relevant = [kind(r) for r in as_lists]
        junk = [
            kind(j) if kind is not np.array else np.array(j, dtype=np.int64) for j in junk_lists
        ]
    want = mean_average_precision(indices, as_lists, junk=junk_lists)
    assert want == pytest.approx(np.mean([(1 / 1 + 2 / 3) / 2, 1.0]))
    assert mean_average_precision(indices, relevant, junk=junk) == want
    assert precision_recall_at_k(indices, relevant, 2, junk=junk) == precision_recall_at_k(
        indices, as_lists, 2, junk=junk_lists
    )


def test_ground_truth_mapping_refused():
    indices = np.array([[0, 1], [1, 0]])
    gt = {0: [0], 1: [1]}  # read by keys this would be [0, 1]: a wrong, silent answer
    with pytest.raises(TypeError, match="relevant is a mapping .*query order"):
        mean_average_precision(indices, gt)
    with pytest.raises(TypeError, match="junk is a mapping"):
        mean_average_precision(indices, [[0], [1]], junk={0: [1], 1: [0]})
    with pytest.raises(TypeError, match=r"relevant\[1\] is a mapping"):
        mean_average_precision(indices, [[0], {1: 1}])
    with pytest.raises(TypeError, match="no order"):
        mean_average_precision(indices, {frozenset([0]), frozenset([1])})
    with pytest.raises(TypeError, match=r"relevant\[0\] must hold integer database indices"):
        mean_average_precision(indices, [[0.5], [1]])
    with pytest.raises(TypeError, match="integer database indices"):
        average_precision([0, 1], ["a"])
    # the explicit match of ids to queries works
    assert mean_average_precision(indices, [gt[q] for q in (0, 1)]) == 1.0


# -- search: caller's world, NaN rows, bounded memory ------------------------------


def test_search_nan_rows_named():
    rng = np.random.default_rng(0)
    q, db = rng.standard_normal((6, 5)), rng.standard_normal((40, 5))
    bad_q, bad_db = q.copy(), db.copy()
    bad_q[4, 2] = np.nan
    bad_db[[7, 31], 0] = np.inf
    with pytest.raises(ValueError, match=r"queries has 1 row\(s\) with NaN or inf \(rows 4\)"):
        search(bad_q, db, 3)
    with pytest.raises(ValueError, match=r"database has 2 row\(s\) with NaN or inf \(rows 7, 31\)"):
        search(q, bad_db, 3)
    # the same from dask inputs, with global row numbers, when computed
    s, i = search(da.from_array(bad_q, chunks=(3, 5)), da.from_array(db, chunks=(9, 5)), 3)
    with pytest.raises(ValueError, match=r"queries has 1 row\(s\) .*rows 4\)"):
        dask.compute(s, i, scheduler="sync")
    s, i = search(q, da.from_array(bad_db, chunks=(9, 5)), 3)  # rows 7, 31: two blocks
    with pytest.raises(ValueError, match=r"database has 1 row\(s\) .*rows (7|31)\)"):
        dask.compute(s, i, scheduler="sync")


def test_search_one_dimensional_query_hint():
    db = np.eye(4)
    with pytest.raises(ValueError, match=r"queries.reshape\(1, -1\)"):
        search(np.ones(4), db, 2)


def test_search_numpy_queries_dask_database_are_lazy_and_equal():
    rng = np.random.default_rng(1)
    q, db = rng.standard_normal((30, 6)), rng.standard_normal((100, 6))
    scores, indices = search(q, da.from_array(db, chunks=(17, 6)), 10)
    assert isinstance(scores, da.Array) and isinstance(indices, da.Array)
    ref = brute_force_topk(q, db, 10)
    got = dask.compute(scores, indices, scheduler="sync")
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-12)


def test_search_memory_is_bounded_over_queries():
    """40,000 queries x 2,000 rows would be 640 MB of float64 scores at once; blocks
    keep the peak to the result plus a few 16 MiB blocks."""
    import tracemalloc

    rng = np.random.default_rng(2)
    q = rng.standard_normal((40_000, 4)).astype(np.float32)
    db = rng.standard_normal((2_000, 4)).astype(np.float32)
    tracemalloc.start()
    try:
        scores, indices = search(q, db, 5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    sample = np.arange(0, 40_000, 997)
    ref = brute_force_topk(q[sample].astype(np.float64), db.astype(np.float64), 5)
    np.testing.assert_array_equal(indices[sample], ref[1])


def test_topk_search_blocks_equal_one_block():
    from slem_dask.core.candidates import topk_search

    rng = np.random.default_rng(3)
    q, db = integer_rows(rng, 70, 3), integer_rows(rng, 500, 3)  # many exact ties
    one = topk_search(q, db, 25, block_bytes=2**40)
    tiny = topk_search(q, db, 25, block_bytes=8, database_rows=30)  # 1 query x 30 rows
    ref = brute_force_topk(q, db, 25)
    for got in (one, tiny):
        np.testing.assert_array_equal(got[1], ref[1])
        np.testing.assert_array_equal(got[0], ref[0])


def test_merge_topk_drops_and_restores_padding(tied):
    """Blocks shorter than k arrive padded (score -inf, index -1); the merge ranks only
    the real entries, ties to the lower index, and pads the result back to k."""
    from slem_dask.core.ranking import block_topk, merge_topk

    queries, database = tied
    k = 30
    parts = []
    for lo in range(0, len(database), 7):  # 7-row blocks: each padded to k
        s, i = block_topk(queries @ database[lo : lo + 7].T, lo, k)
        pad = k - s.shape[1]
        parts.append(
            (
                np.hstack([s, np.full((len(s), pad), -np.inf)]),
                np.hstack([i, np.full((len(i), pad), -1)]),
            )
        )
    ref_scores, ref_indices = brute_force_topk(queries, database, k)
    scores, indices = merge_topk(parts, k)
    np.testing.assert_array_equal(indices, ref_indices)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-12)
    short_scores, short_indices = merge_topk(parts[:2], k)  # 14 real rows, k = 30
    assert short_scores.shape == short_indices.shape == (len(queries), k)
    np.testing.assert_array_equal(short_indices[:, 14:], -1)
    assert np.isneginf(short_scores[:, 14:]).all()
    np.testing.assert_array_equal(
        short_indices[:, :14], brute_force_topk(queries, database[:14], 14)[1]
    )


def test_merge_topk_orders_ties_across_lists_by_index():
    # each list is ranked and their concatenation has non-increasing scores, but the tie
    # between them is out of index order: the merge must still sort it
    from slem_dask.core.ranking import merge_topk

    parts = [
        (np.array([[5.0, 4.0]]), np.array([[10, 11]])),
        (np.array([[4.0, 1.0]]), np.array([[3, 4]])),
    ]
    scores, indices = merge_topk(parts, 3)
    np.testing.assert_array_equal(indices, [[10, 3, 11]])
    np.testing.assert_array_equal(scores, [[5.0, 4.0, 4.0]])
    scores, indices = merge_topk(parts[:1], 1)  # one ranked list: its head
    np.testing.assert_array_equal(indices, [[10]])
