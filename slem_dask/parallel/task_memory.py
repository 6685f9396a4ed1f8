"""Bytes one task of a job needs, estimated: pure functions of its shape and dtype.

Used before a job computes by :mod:`slem_dask.cluster.workers` (a worker too small for one
task is refused) and by :mod:`slem_dask.parallel.kernel_stream` (a kernel fit
streams when its in-memory estimate exceeds the workers' memory). This module
imports nothing of slem_dask, so both can import it.

Bytes one task needs, measured with ``benchmarks/bench_task_memory.py``: the
growth of a fresh worker's peak resident set, once it has imported the tasks'
modules (what :func:`slem_dask.cluster.workers.check_memory` counts as in use), while
it runs a job of one partition of rows x d (d = 128, 512, 2048; 2,000 to 100,000 rows):

- linear encode (read, finite check, centred rows, product, zarr's encoded
  chunk): 16 MiB plus 21 bytes per value for float32 input (5.0-5.6 x the
  partition above 20,000 rows), 25 for float64 (3.0-3.1 x), whatever the
  precision and output dtype (measured while a pass over the block looked for NaN
  with a boolean copy of it, 1 byte per value, which encode_rows no longer needs:
  the estimate errs high by that; its centred piece grew from 1 to 4 MiB, inside the
  fixed 16 MiB);
- kernel encode (rbf): 16 MiB plus, per row, 11 d + 30 r bytes for float32
  input, 9 d + 33 r for float64 (r pivots, 128-1024); other kernels are assumed
  alike;
- linear fit: a task reads one sub-block (``parallel._sub_block_rows``: whole
  chunks, at least min(d, 4096) rows) at a time: 4 MiB plus 10 bytes per value
  of it for float32 with precision auto, 21 otherwise, plus its d x d float64
  scatter; a merge task holds ``merge_fan_in`` d x d partials (from the code,
  not measured).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "encode_task_bytes",
    "fit_task_bytes",
    "kernel_fit_bytes",
    "KERNEL_FIT_ROW_OVERHEAD",
    "MiB",
]

MiB = 2**20


def encode_task_bytes(model, rows: int, d: int, dtype) -> tuple[float, int]:
    """(bytes per row, fixed bytes) of one encode task (see the module's measurements)."""
    itemsize = np.dtype(dtype).itemsize
    rank = getattr(model, "rank_", None)
    if rank is not None:  # a KernelSLEM: the kernel rows against r pivots dominate
        per_row = (11 * d + 30 * rank) if itemsize <= 4 else (9 * d + 33 * rank)
    else:
        per_row = (21 if itemsize <= 4 else 25) * d
    return float(per_row), 16 * MiB


def fit_task_bytes(d: int, sub_rows: int, dtype, precision: str, fan_in: int) -> int:
    """Bytes of one linear fit task (a statistics task or a merge, the larger)."""
    per_value = 10 if np.dtype(dtype).itemsize <= 4 and precision == "auto" else 21
    statistics = 4 * MiB + sub_rows * d * per_value + 8 * d * d
    merge = fan_in * 8 * d * d
    return int(max(statistics, merge))


#: Bytes per row of an in-memory kernel fit beyond its row, its factor row twice (the
#: factor buffer grows by doubling: old and new buffers coexist while a round persists)
#: and its residual diagonal: fitted to bench_memory.py's peaks above the idle cluster
#: at r = 256 (6.6 KB per row at d = 512, README; 5.8 KB at d = 256, n = 2e6).
KERNEL_FIT_ROW_OVERHEAD = 600


def kernel_fit_bytes(n: int, d: int, dtype, rank: int) -> int:
    """Bytes the in-memory kernel fit holds on its workers, all of them together:
    n x (d x itemsize + 16 r + 8 + KERNEL_FIT_ROW_OVERHEAD) (float32 rows stay float32,
    any other dtype is held as float64)."""
    itemsize = 4 if np.dtype(dtype) == np.float32 else 8
    return int(n * (d * itemsize + 16 * rank + 8 + KERNEL_FIT_ROW_OVERHEAD))
