"""parallel.blocks.aligned: the arrays a task receives from distributed (at any byte
offset in the buffer they arrived in) are copied aligned once per process, so numpy's
matmul does not copy a misaligned A^-1 whole on every call."""

import gc
from dataclasses import dataclass

import numpy as np

from slem_dask.parallel import blocks


def misaligned(values: np.ndarray) -> np.ndarray:
    raw = bytearray(values.nbytes + 1)
    out = np.frombuffer(raw, dtype=values.dtype, offset=1, count=values.size).reshape(values.shape)
    out[...] = values  # a frombuffer array of a bytearray is writable
    assert not out.flags.aligned
    return out


def test_a_misaligned_array_is_copied_aligned_once_while_it_lives():
    values = np.arange(48, dtype=np.float32).reshape(6, 8)
    original = misaligned(values)
    copy = blocks.aligned(original)
    assert copy.flags.aligned and copy is not original
    np.testing.assert_array_equal(copy, values)
    assert blocks.aligned(original) is copy  # the next task of the process reuses it
    key = id(original)
    del original
    gc.collect()
    assert key not in blocks._ALIGNED  # the copy goes with the scattered original


def test_aligned_arrays_and_other_values_pass_through():
    values = np.ones((4, 4))
    assert blocks.aligned(values) is values
    for other in ("X", 3, None, (1, 2)):
        assert blocks.aligned(other) is other


@dataclass(frozen=True, eq=False)
class Encoder:
    name: str
    factor: np.ndarray
    mean: np.ndarray


def test_a_dataclass_of_arrays_gets_its_arrays_aligned():
    mean = np.zeros(8)
    enc = Encoder("rbf", misaligned(np.eye(8)), mean)
    got = blocks.aligned(enc)
    assert got is not enc and got.name == "rbf" and got.mean is mean
    assert got.factor.flags.aligned
    np.testing.assert_array_equal(got.factor, np.eye(8))
    assert blocks.aligned(enc) is got
    whole = Encoder("rbf", np.eye(8), mean)
    assert blocks.aligned(whole) is whole


def test_an_encode_of_misaligned_model_arrays_equals_the_aligned_one():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((300, 8)).astype(np.float32)
    mean = rng.standard_normal(8)
    matrix = np.linalg.inv(np.cov(rows.T) + np.eye(8)).astype(np.float32)
    want = blocks._apply_rows(rows, blocks.encode_rows, np.float32, "X", mean, matrix)
    got = blocks._apply_rows(
        rows, blocks.encode_rows, np.float32, "X", misaligned(mean), misaligned(matrix)
    )
    np.testing.assert_array_equal(got, want)
