"""The linear encoding finds its own rows without a direction (issue 42): the rows that
``encode_rows_and_degenerate`` reports, found from the encoding's norms with no pass of
their own, are exactly the rows that ``check_encoded_rows`` (the write's check for every
other model) finds in its output, and ``EncodeRefusingDegenerate`` refuses them with the
same words."""

from __future__ import annotations

import numpy as np
import pytest

from slem_dask.core import linear
from slem_dask.core.validation import DegenerateEncodingsError, check_encoded_rows


def _model(d: int, rng, scale: float = 1.0):
    """(mean, A^-1): the mean at the origin, so that rows within 1e-150 of it are
    exactly what they are (near a mean of magnitude 0.1 they would round to it)."""
    x = rng.standard_normal((4 * d, d))
    cov = np.cov(x, rowvar=False, bias=True)
    return np.zeros(d), linear.precision_matrix(cov, 0.1) * scale


def _hostile_rows(mean, rng, n: int = 700) -> tuple[np.ndarray, list[int]]:
    """Ordinary rows, with rows equal to the mean (no direction: encoded to 0), rows
    within 1e-150 of it and rows of 1e150 (encoded again, scaled: they have one)."""
    d = mean.size
    rows = rng.standard_normal((n, d)) + mean
    zero = [3, 250, 251, 699]
    rows[zero] = mean
    rows[[10, 400]] = mean + 1e-150 * rng.standard_normal((2, d))
    assert (rows[[10, 400]] != mean).all()
    rows[[20, 520]] = 1e150 * rng.standard_normal((2, d))
    return rows, zero


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("piece_bytes", [1 << 12, 1 << 22])
def test_the_rows_it_reports_are_those_the_check_finds(dtype, piece_bytes, monkeypatch):
    monkeypatch.setattr(linear, "_PIECE_BYTES", piece_bytes)  # rows over many pieces, or one
    monkeypatch.setattr(linear, "_PIECE_MIN_ROWS", 16)
    rng = np.random.default_rng(1)
    mean, precision = _model(64, rng)
    rows, zero = _hostile_rows(mean, rng)
    if dtype is np.float32:  # the float32 path; 1e150 and 1e-150 leave float32
        rows[[20, 520, 10, 400]] = rows[0]
        rows, precision = rows.astype(np.float32), linear.float32_matrix(precision)
    vectors, zeros, nonfinite = linear.encode_rows_and_degenerate(rows, mean, precision)
    assert np.array_equal(vectors, linear.encode_rows(rows, mean, precision))
    assert zeros.tolist() == zero and nonfinite.size == 0
    with pytest.raises(DegenerateEncodingsError) as by_check:
        check_encoded_rows(vectors, 1000, "why")
    with pytest.raises(DegenerateEncodingsError) as by_encoding:
        linear.EncodeRefusingDegenerate("why")(rows, mean, precision, row_offset=1000)
    assert str(by_encoding.value) == str(by_check.value)
    assert "4 row(s) whose encoding is all zeros (rows 1003, 1250, 1251, 1699): why" in str(
        by_check.value
    )


def test_rows_whose_encoding_overflows_are_reported_as_the_check_finds_them():
    rng = np.random.default_rng(2)
    mean, precision = _model(16, rng)
    precision *= 1.7e308 / np.abs(precision).max()  # A^-1 at float64's largest numbers
    rows = rng.standard_normal((40, 16)) + mean
    # rows along the signs of a column of A^-1: that entry of the product sums the
    # column's magnitudes, past float64's largest number however the row is scaled
    rows[[7, 21]] = mean + 0.99 * np.sign(precision[:, [2, 9]]).T
    rows[3] = mean  # stays 0: reported as all zeros, not as overflowing
    with np.errstate(over="ignore", invalid="ignore"):
        vectors, zeros, nonfinite = linear.encode_rows_and_degenerate(rows, mean, precision)
    overflowed = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
    assert {7, 21} <= set(overflowed) and overflowed.size < 39
    assert zeros.tolist() == [3] and nonfinite.tolist() == overflowed.tolist()
    with pytest.raises(DegenerateEncodingsError) as by_check:
        check_encoded_rows(vectors, 0, "why")
    with (
        pytest.raises(DegenerateEncodingsError) as by_encoding,
        np.errstate(over="ignore", invalid="ignore"),
    ):
        linear.EncodeRefusingDegenerate("why")(rows, mean, precision)
    assert str(by_encoding.value) == str(by_check.value)
    assert f"{overflowed.size} row(s) whose encoding is NaN or inf" in str(by_check.value)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ordinary_rows_pass_and_are_encode_rows_bit_for_bit(dtype):
    rng = np.random.default_rng(3)
    mean, precision = _model(32, rng)
    rows = rng.standard_normal((500, 32)) + mean + 1e3  # far from the origin
    if dtype is np.float32:
        rows, precision = rows.astype(np.float32), linear.float32_matrix(precision)
    got = linear.EncodeRefusingDegenerate("why")(rows, mean, precision, row_offset=7)
    assert got.dtype == precision.dtype
    assert np.array_equal(got, linear.encode_rows(rows, mean, precision))
    check_encoded_rows(got)
