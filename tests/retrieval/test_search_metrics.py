"""search's metrics (inner product, cosine, L2) against brute force: every chunking, ties to
the lower index, the same float64 scores on any BLAS (run under three OPENBLAS_CORETYPE
values by .ci/run)."""

import dask
import dask.array as da
import numpy as np
import pytest

from reference import brute_force_topk
from slem_dask import search
from slem_dask.pipeline.options import SearchOptions
from slem_dask.retrieval.distances import row_squares, unit_norm_warning


@pytest.fixture(autouse=True)
def keep_database_chunks(monkeypatch):
    """Dask searches keep the test's row chunks (as in test_retrieval.py)."""
    from slem_dask.retrieval import topk

    monkeypatch.setattr(topk, "_DATABASE_BLOCK_BYTES", 0)


def power_of_two_rows(rng, n, d=6, scales=(1, 2, 4)):
    """Rows of four entries +-s (norm 2s, s a power of two) and zeros: dividing by the
    norm is exact, so cosine scores are exact in any summation order, and a positive
    multiple of a row ties with it exactly."""
    rows = np.zeros((n, d))
    for row in rows:
        row[rng.choice(d, 4, replace=False)] = rng.choice([-1.0, 1.0], 4)
    return rows * rng.choice(scales, (n, 1))


@pytest.fixture(scope="module")
def tied():
    """Queries and a database whose scores under every metric are exact, with ties:
    copies, positive multiples (tie under cosine) and rows at equal distance."""
    rng = np.random.default_rng(7)
    base = power_of_two_rows(rng, 20)
    database = np.vstack([base, base[:8], 2 * base[4:12], 4 * base[:3], base[[5]]])  # 40 rows
    queries = np.vstack([power_of_two_rows(rng, 5, scales=(1,)), database[[0, 25]], base[[3]] / 2])
    return queries, database


def brute_force(queries, database, k, metric):
    """Every score by numpy, ranked by (score, index): higher first, or nearest first."""
    q = np.asarray(queries, dtype=np.float64)
    x = np.asarray(database, dtype=np.float64)
    if metric == "l2":
        scores = ((q[:, None, :] - x[None, :, :]) ** 2).sum(axis=2)
        order = np.array([np.lexsort((np.arange(row.size), row))[:k] for row in scores])
        return np.take_along_axis(scores, order, axis=1), order
    if metric == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    return brute_force_topk(q, x, k)


def computed(result):
    if all(isinstance(r, np.ndarray) for r in result):
        return result
    return dask.compute(*result, scheduler="sync")


@pytest.mark.parametrize("metric", ["ip", "cosine", "l2"])
@pytest.mark.parametrize("k", [1, 4, 11, 25, 40])
@pytest.mark.parametrize("chunks", [None, 1, 7, (10, 1, 20, 9), -1])
def test_every_metric_equals_brute_force_with_ties(tied, metric, k, chunks):
    queries, database = tied
    ref_scores, ref_indices = brute_force(queries, database, k, metric)
    ranked, _ = brute_force(queries, database, len(database), metric)
    assert (ranked[:, k - 1] == ranked[:, min(k, len(database) - 1)]).any()  # ties at k
    db = database if chunks is None else da.from_array(database, chunks=(chunks, 6))
    for q in (queries, da.from_array(queries, chunks=(3, 6))):
        if chunks is None and not isinstance(q, np.ndarray):
            continue
        scores, indices = computed(search(q, db, k, metric=metric))
        np.testing.assert_array_equal(indices, ref_indices)
        np.testing.assert_array_equal(scores, ref_scores)  # exact data: exact scores


def test_cosine_ties_positive_multiples_to_the_lower_index(tied):
    queries, database = tied
    _, indices = search(database[[4]], database, 6, metric="cosine")
    # row 4, its copy at 24 (base[:8] from 20) and its double at 28 all score 1: by index
    assert list(indices[0, :3]) == [4, 24, 28]


@pytest.mark.parametrize("metric", ["cosine", "l2"])
@pytest.mark.parametrize("k", [5, 150])
def test_random_rows_every_chunking_same_scores_bit_for_bit(metric, k):
    """Float rows far from unit norm: the ranking is the brute force's and the scores are
    the same bits in every chunking (the top-k path: fixed-order sums)."""
    rng = np.random.default_rng(3)
    database = rng.standard_normal((240, 24)) * rng.uniform(0.1, 50, (240, 1))
    queries = rng.standard_normal((13, 24)) * 7
    ref_scores, ref_indices = brute_force(queries, database, k, metric)
    scores, indices = search(queries, database, k, metric=metric)
    np.testing.assert_array_equal(indices, ref_indices)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-9, atol=1e-9)
    for chunks in (17, (100, 1, 139), -1):
        got = computed(search(queries, da.from_array(database, chunks=(chunks, 24)), k, metric))
        np.testing.assert_array_equal(got[1], indices)
        if k < 120:  # below half the database: every score is the fixed-order one
            np.testing.assert_array_equal(got[0], scores)
        else:
            np.testing.assert_allclose(got[0], scores, rtol=1e-12)


def test_l2_is_nearest_first_on_sift_like_integers():
    """Large non-negative integers (as SIFT's): the float32 candidates' margin stays
    small (the scale c), and the squared distances are exact."""
    rng = np.random.default_rng(11)
    database = rng.integers(0, 200, (500, 32)).astype(np.float32)
    queries = np.vstack([rng.integers(0, 200, (6, 32)), database[[7, 7]]]).astype(np.float32)
    ref_scores, ref_indices = brute_force(queries, database, 10, "l2")
    for db in (database, da.from_array(database, chunks=(64, 32))):
        scores, indices = computed(search(queries, db, 10, metric="l2"))
        np.testing.assert_array_equal(indices, ref_indices)
        np.testing.assert_array_equal(scores, ref_scores)
    assert scores[-1, 0] == 0.0 and indices[-1, 0] == 7


def test_row_squares_is_blocking_independent():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 50))
    whole = row_squares(x)
    parts = np.concatenate([row_squares(x[:1]), row_squares(x[1:117]), row_squares(x[117:])])
    np.testing.assert_array_equal(whole, parts)
    np.testing.assert_allclose(whole, (x**2).sum(axis=1), rtol=1e-13)


def test_metric_refused_in_one_line():
    x = np.eye(3)
    with pytest.raises(ValueError, match=r"metric must be one of ip, cosine, l2.*got 'L2'"):
        search(x, x, 1, metric="L2")
    with pytest.raises(ValueError, match=r"SearchOptions.metric.*got 'euclid'"):
        SearchOptions(metric="euclid")


def test_cosine_names_zero_rows():
    database = np.eye(4)
    database[2] = 0
    with pytest.raises(ValueError, match=r"database rows 2 \(1 in all\) are zero.*cosine"):
        search(np.ones((1, 4)), database, 2, metric="cosine")
    db = da.from_array(np.vstack([np.eye(4), database]), chunks=(3, 4))
    with pytest.raises(ValueError, match=r"database rows 6 \(1 in all\) are zero"):
        dask.compute(*search(np.ones((1, 4)), db, 2, metric="cosine"), scheduler="sync")


def test_unit_norm_warning():
    rng = np.random.default_rng(0)
    unit = rng.standard_normal((50, 8))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    assert unit_norm_warning({"queries": unit, "database": unit}, "ip") is None
    said = unit_norm_warning({"queries": unit, "database": 30 * unit}, "ip")
    assert said is not None and "\n" not in said
    assert "database norms 30 to 30" in said and "--metric l2" in said and "queries" not in said
    assert unit_norm_warning({"database": 30 * unit}, "l2") is None


def test_unit_norm_warning_names_the_finite_rows_only():
    """A NaN row among long rows: the warning gives the finite rows' range, never
    "nan to nan" (search then names the NaN row in its own error); NaN rows alone give
    no warning."""
    rows = np.full((4, 3), 30.0 / np.sqrt(3))
    rows[1] = np.nan
    said = unit_norm_warning({"database": rows}, "ip")
    assert said is not None and "database norms 30 to 30 (median 30)" in said
    assert unit_norm_warning({"database": np.full((2, 3), np.nan)}, "ip") is None


def other_blas(queries, database):
    """Another BLAS: each entry summed forward, backward or pairwise, at random."""
    products = np.asarray(queries, np.float64)[:, None, :] * np.asarray(database, np.float64)
    forward, backward = np.zeros(products.shape[:2]), np.zeros(products.shape[:2])
    for f in range(products.shape[2]):
        forward += products[:, :, f]
        backward += products[:, :, -1 - f]
    pick = np.random.default_rng(len(queries) * 31 + len(database)).integers(0, 3, forward.shape)
    return np.choose(pick, [forward, backward, products.sum(axis=2)])


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_another_blas_changes_no_score_and_copies_tie(metric, monkeypatch):
    """The BLAS only finds candidates: every path returns the same bits under another
    summation order, and copies of a row tie, ranked by index."""
    from slem_dask.core import ranking

    rng = np.random.default_rng(9)
    base = rng.standard_normal((90, 20)) * rng.uniform(0.2, 20, (90, 1))
    database = np.vstack([base, base[rng.integers(0, 90, 40)]])
    queries = np.vstack([base[:3] * 1.5, rng.standard_normal((5, 20)) * 4])
    want = search(queries, database, 12, metric=metric)
    monkeypatch.setattr(ranking, "blas_scores", other_blas)
    tied = 0
    for chunks in (None, 13, 61):
        db = database if chunks is None else da.from_array(database, chunks=(chunks, 20))
        scores, indices = computed(search(queries, db, 12, metric=metric))
        np.testing.assert_array_equal(indices, want[1])
        np.testing.assert_array_equal(scores, want[0])
        for row_s, row_i in zip(scores, indices, strict=True):
            for a in range(len(row_i) - 1):
                if np.array_equal(database[row_i[a]], database[row_i[a + 1]]):
                    assert row_s[a] == row_s[a + 1] and row_i[a] < row_i[a + 1]
                    tied += 1
    assert tied  # copies were ranked next to each other: the check was not vacuous
