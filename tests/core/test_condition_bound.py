"""core.linear.condition_bound, which decides float32 encoding under precision "auto":
one pass over Sigma without a d x d temporary (issue 42)."""

import tracemalloc

import numpy as np

from slem_dask.core.linear import condition_bound


def _plain(cov, lam):
    return float((np.abs(cov).sum(axis=1).max() + lam) / lam)


def test_the_bound_is_the_plain_formula_bit_for_bit():
    rng = np.random.default_rng(0)
    for d in (1, 3, 64, 700, 1100):  # one block, several, a last partial block
        cov = rng.standard_normal((d, d))
        cov = cov @ cov.T / d
        assert condition_bound(cov, 1e-3) == _plain(cov, 1e-3)


def test_a_nan_in_sigma_gives_no_bound():
    cov = np.eye(600)
    cov[599, 3] = np.nan  # in the last block: a NaN must not be lost between blocks
    assert np.isnan(condition_bound(cov, 1e-3))  # then float32 encoding is refused


def test_no_temporary_of_the_size_of_sigma():
    """np.abs(cov) whole was a d x d temporary: 512 MiB at d = 8192, 1.9 CPU s of page
    faults in a fresh process (the first transform of every encode job). Fails on it."""
    cov = np.eye(2048)  # 32 MiB
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        condition_bound(cov, 1e-3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < cov.nbytes / 4, f"peak {peak} bytes for a {cov.nbytes}-byte Sigma"
