"""Sufficient statistics: per-block scatter + Chan merge equal numpy's mean / covariance."""

import numpy as np
import pytest

from reference import naive_covariance
from slem_dask.core.statistics import (
    ScatterStats,
    block_statistics,
    column_mean,
    covariance,
    merge_many,
    merge_statistics,
)


def random_split(rng, n, n_blocks, empty=True, singles=True):
    """Cut points for ``n`` rows into blocks, with some empty and some 1-row blocks."""
    cuts = sorted(rng.integers(0, n + 1, size=n_blocks - 1).tolist())
    if singles:
        cuts += [cuts[0] + 1] if cuts and cuts[0] + 1 <= n else []
    if empty:
        cuts += [cuts[-1]] if cuts else [0]  # a repeated cut is an empty block
        cuts = [0] + cuts  # an empty block at the start
    bounds = [0] + sorted(cuts) + [n]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def stats_of_split(X, bounds):
    return merge_many(block_statistics(X[a:b]) for a, b in bounds)


def assert_matches_numpy(stats, X64, rtol=1e-12):
    n = X64.shape[0]
    assert stats.count == n
    assert stats.nonfinite == 0
    assert stats.mean.dtype == np.float64 and stats.scatter.dtype == np.float64
    np.testing.assert_allclose(stats.mean, X64.mean(axis=0), rtol=rtol, atol=1e-14)
    ref = np.cov(X64, rowvar=False, bias=True)
    cov = covariance(stats)
    assert np.linalg.norm(cov - ref) <= rtol * np.linalg.norm(ref)
    np.testing.assert_array_equal(cov, cov.T)


@pytest.mark.parametrize("seed", range(6))
def test_random_splits_match_numpy(seed):
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(2, 300)), int(rng.integers(1, 12))
    X = rng.standard_normal((n, d)) * rng.uniform(0.1, 10, d) + rng.standard_normal(d)
    bounds = random_split(rng, n, int(rng.integers(1, 20)))
    sizes = [b - a for a, b in bounds]
    assert 0 in sizes and 1 in sizes or n < 3  # the split really has the edge cases
    assert_matches_numpy(stats_of_split(X, bounds), X)


def test_one_row_blocks_and_all_in_one_block_agree():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((37, 5)) + 3.0
    singles = stats_of_split(X, [(i, i + 1) for i in range(37)])
    whole = block_statistics(X)
    assert_matches_numpy(singles, X)
    assert_matches_numpy(whole, X)
    np.testing.assert_allclose(singles.scatter, whole.scatter, rtol=1e-12, atol=1e-12)


def test_one_row_block_has_zero_scatter():
    s = block_statistics(np.array([[1.0, 2.0, 3.0]]))
    assert s.count == 1
    np.testing.assert_array_equal(s.mean, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(s.scatter, np.zeros((3, 3)))


def test_empty_blocks_are_neutral():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((10, 4))
    empty = block_statistics(np.empty((0, 4)))
    assert empty.count == 0 and empty.mean.shape == (4,) and empty.scatter.shape == (4, 4)
    full = block_statistics(X)
    for merged in (
        merge_statistics(empty, full),
        merge_statistics(full, empty),
        merge_many([empty, empty, full, empty]),
    ):
        assert merged.count == 10
        np.testing.assert_array_equal(merged.mean, full.mean)
        np.testing.assert_array_equal(merged.scatter, full.scatter)
    nothing = merge_many([empty, empty])
    assert nothing.count == 0
    with pytest.raises(ValueError, match="zero rows"):
        covariance(nothing)


def test_merge_order_does_not_matter():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((50, 6))
    parts = [block_statistics(X[a : a + 10]) for a in range(0, 50, 10)]
    forward = merge_many(parts)
    backward = merge_many(parts[::-1])
    np.testing.assert_allclose(forward.mean, backward.mean, rtol=1e-13)
    np.testing.assert_allclose(forward.scatter, backward.scatter, rtol=1e-12)


def test_float32_input_is_accumulated_in_float64():
    rng = np.random.default_rng(4)
    X32 = (rng.standard_normal((3000, 8)) + 50.0).astype(np.float32)
    X64 = X32.astype(np.float64)  # the exact values the library sees
    bounds = random_split(rng, len(X32), 9)
    stats = merge_many(block_statistics(X32[a:b], "float64") for a, b in bounds)
    assert_matches_numpy(stats, X64, rtol=1e-12)
    # Accumulating in float32 would be far off: a float32 reference is not the answer.
    cov32 = np.cov(X32, rowvar=False, bias=True, dtype=np.float32).astype(np.float64)
    ref = np.cov(X64, rowvar=False, bias=True)
    assert np.linalg.norm(cov32 - ref) > 1e3 * np.linalg.norm(covariance(stats) - ref)


def test_integer_input():
    X = np.arange(24, dtype=np.int32).reshape(8, 3) ** 2
    assert_matches_numpy(stats_of_split(X, [(0, 3), (3, 8)]), X.astype(np.float64))


def test_offset_1e6_keeps_digits_the_naive_formula_loses():
    rng = np.random.default_rng(5)
    n, d, offset = 5000, 6, 1e6
    X = offset + rng.standard_normal((n, d)) * np.linspace(0.5, 2.0, d)
    # X - offset is exact (Sterbenz), so this reference has no cancellation at all.
    ref = np.cov(X - offset, rowvar=False, bias=True)
    ours = covariance(stats_of_split(X, random_split(rng, n, 13)))
    naive = naive_covariance(X)
    err_ours = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    err_naive = np.linalg.norm(naive - ref) / np.linalg.norm(ref)
    assert err_ours < 1e-8
    assert err_naive > 1e-6  # the naive formula loses ~10 of 16 digits here
    assert err_naive > 1e3 * err_ours
    mean_ref = offset + (X - offset).mean(axis=0)
    np.testing.assert_allclose(stats_of_split(X, [(0, n)]).mean, mean_ref, rtol=1e-14)


def test_nonfinite_rows_are_counted_and_left_out():
    X = np.arange(20, dtype=np.float64).reshape(5, 4)
    X[1, 2] = np.nan
    X[3, 0] = -np.inf
    s = block_statistics(X)
    assert s.nonfinite == 2 and s.count == 3
    good = X[[0, 2, 4]]
    np.testing.assert_allclose(s.mean, good.mean(axis=0))
    merged = merge_many([s, block_statistics(X[[0]]), block_statistics(np.full((1, 4), np.nan))])
    assert merged.nonfinite == 3 and merged.count == 4


def test_bad_blocks_raise():
    with pytest.raises(ValueError, match="2-D"):
        block_statistics(np.ones(4))
    with pytest.raises(ValueError, match="2-D"):
        block_statistics(np.ones((2, 2, 2)))
    with pytest.raises(ValueError, match="at least one"):
        merge_many([])


def test_scatter_stats_n_features():
    assert ScatterStats(0, np.zeros(7), np.zeros((7, 7))).n_features == 7


def test_the_workers_size_statistics_without_a_warning(caplog):
    """Workers weigh every task result with dask's sizeof: partial statistics must be
    counted as their arrays, not fall back (with a logged warning per result)."""
    from distributed.sizeof import safe_sizeof

    import slem_dask.parallel.blocks  # noqa: F401 - registers the sizeof of ScatterStats

    stats = ScatterStats(3, np.zeros(4), np.zeros((4, 4)))
    with caplog.at_level("WARNING", logger="distributed.sizeof"):
        assert safe_sizeof(stats) == 4 * 8 + 16 * 8 + 64
    assert not caplog.records


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("piece_elements", [7, 64, 2**18])
def test_column_mean_is_the_float64_mean_piece_by_piece(monkeypatch, dtype, piece_elements):
    """Pieces of 1, 9 and all rows, a short last piece: the float64 mean of the values
    as given, and NaN and inf propagate into their columns as in numpy's mean."""
    import slem_dask.core.statistics as statistics

    monkeypatch.setattr(statistics, "_MEAN_PIECE_ELEMENTS", piece_elements)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((101, 7)) * 1e3 + 1e6).astype(dtype)
    want = x.astype(np.float64).sum(axis=0) / len(x)
    np.testing.assert_allclose(column_mean(x), want, rtol=1e-15, atol=0)
    x[50, 1], x[99, 2], x[0, 3], x[1, 3] = np.nan, np.inf, np.inf, -np.inf
    with np.errstate(invalid="ignore"):  # inf - inf, as in numpy's mean
        got = column_mean(x)
    assert np.isnan(got[1]) and got[2] == np.inf and np.isnan(got[3])
    assert np.isfinite(np.delete(got, [1, 2, 3])).all()
