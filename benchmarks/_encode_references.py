"""The reference contenders of ``bench_encode.py``: what a user writes by hand with
numpy (a linear or a kernel model, all rows at once) and with plain Dask."""

from __future__ import annotations

import os
import shutil

import numpy as np

import _common as C


def _read_compute_write(path: str, out_path: str, chunk_rows: int, compute) -> dict:
    """Timed: read all rows with zarr, ``z = compute(x)`` (float32), write z to a zarr
    array with the output's chunking and zarr's default codecs."""
    import zarr

    arr = zarr.open_array(store=path, mode="r")
    with C.Timer() as t_read:
        x = arr[...]
    with C.Timer() as t_comp:
        z = compute(x)
    del x
    with C.Timer() as t_write:
        if os.path.exists(out_path):
            shutil.rmtree(out_path)
        out = zarr.create_array(
            store=out_path, shape=z.shape, dtype="float32", chunks=(chunk_rows, z.shape[1])
        )
        out[...] = z
    return {
        "read": t_read.seconds,
        "compute": t_comp.seconds,
        "write": t_write.seconds,
        "total": t_read.seconds + t_comp.seconds + t_write.seconds,
    }


def numpy_reference(
    path: str, out_path: str, mean: np.ndarray, precision: np.ndarray, chunk_rows: int, dtype
) -> dict:
    m = mean.astype(dtype)
    p = precision.astype(dtype)

    def compute(x):
        z = (x.astype(dtype, copy=False) - m) @ p
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        return z.astype(np.float32, copy=False)

    return _read_compute_write(path, out_path, chunk_rows, compute)


def kernel_numpy_reference(path: str, out_path: str, model, chunk_rows: int) -> dict:
    """The kernel model by hand, on all rows at once: the kernel against the pivots,
    a triangular solve, one product (core.cholesky.lowrank_parts), float32 output."""
    from slem_dask.core.cholesky import lowrank_parts
    from slem_dask.core.kernels import kernel_diagonal, kernel_matrix

    kernel, gamma, degree, lam = model.kernel, model.gamma, model.degree, model.lam

    def compute(x):
        k_piv = kernel_matrix(x, model.pivot_rows_, kernel, gamma, degree)
        k_self = kernel_diagonal(x, kernel, gamma, degree)
        return lowrank_parts(
            k_piv, k_self, model.pivot_factor_, model.factor_mean_, model.g_factor_, lam
        )[0].astype(np.float32)

    return _read_compute_write(path, out_path, chunk_rows, compute)


def naive_dask(path: str, out_path: str, mean, precision, rows: int) -> dict:
    import dask.array as da
    import zarr

    with C.Timer() as t:
        a = da.from_zarr(zarr.open_array(store=path, mode="r"), chunks=(rows, None))
        z = (a - mean.astype(np.float32)) @ precision.astype(np.float32)
        z = z / da.linalg.norm(z, axis=1, keepdims=True)
        da.to_zarr(z.astype(np.float32), out_path, overwrite=True)
    return {"total": t.seconds}
