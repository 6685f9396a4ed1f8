"""The per-piece work of a float32 encode lets the other tasks of a threaded encode run
(issue 42): its row norms went through np.einsum, which held the GIL for 35 us of every
86 us piece of 512 x 512 (py-spy --gil); they are now squares (a ufunc) summed by a
product with ones (the BLAS), both of which release it. No timing here: the encode is
checked to call no np.einsum for ordinary rows, and to give the same norms within the
documented bound."""

import numpy as np

from slem_dask.core import linear


def _no_einsum(*args, **kwargs):
    raise AssertionError("np.einsum holds the GIL for most of each call on a piece")


def test_a_float32_encode_of_ordinary_rows_calls_no_einsum(monkeypatch):
    rng = np.random.default_rng(0)
    d = 128
    rows = rng.standard_normal((3_000, d)).astype(np.float32)  # several pieces
    cov = np.cov(rows[:1_000].T.astype(np.float64)) + 0.1 * np.eye(d)
    matrix = linear.float32_matrix(np.linalg.inv(cov))
    mean = rows.mean(axis=0, dtype=np.float64)
    expected = linear.encode_rows(rows, mean, matrix)
    monkeypatch.setattr(np, "einsum", _no_einsum)
    got = linear.encode_rows(rows, mean, matrix)
    np.testing.assert_array_equal(got, expected)
    norms = np.linalg.norm(got.astype(np.float64), axis=1)
    assert np.abs(norms - 1).max() <= 4e-6  # 1.9e-6 from the sums, the rest the scaling


def test_row_squares_by_the_blas_within_the_bound_for_any_scale():
    rng = np.random.default_rng(1)
    v = rng.standard_normal((2_000, 512)).astype(np.float32)
    v *= np.float32(10.0) ** rng.integers(-15, 15, size=(2_000, 1)).astype(np.float32)
    exact = np.einsum("ij,ij->i", v, v, dtype=np.float64)
    got = linear._row_squares(v, scratch=np.empty_like(v))
    assert np.abs(got / exact - 1).max() <= 64 * 2.0**-24
