"""Dask orchestration: the pure math of :mod:`slem_dask.core` mapped over row blocks.

Nothing here computes but :func:`locate_nonfinite_rows` (a second pass over the rows,
on a fit's error path only): every other function takes dask arrays and returns lazy
dask arrays or Delayed objects. The caller (an estimator's ``fit``, a job) decides
when to compute, and on which client."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
import weakref

import dask
import dask.array as da
import numpy as np
from dask.sizeof import sizeof

from ..core.blas_threads import CountedLimit, task_threads_controller
from ..core.linear import EncodeRefusingDegenerate, encode_rows
from ..core.statistics import (
    ScatterAccumulator,
    ScatterStats,
    block_statistics,
    check_precision,
    merge_into,
    product_rows,
)
from ..storage.nodes.chunks import STORE_ROWS, array_token
from ..core.validation import NonFiniteRowsError, check_finite_rows

__all__ = [
    "scatter_statistics",
    "store_statistics",
    "statistics_partition_rows",
    "encode_blocks",
    "map_rows",
    "shared",
    "scatter_large_arrays",
    "single_threaded_blas",
    "merge_fan_in",
]

#: How many partial results one task of a tree reduction merges (at most).
SPLIT_EVERY = 8

#: Bytes of d x d float64 partial scatters one merge task may take in; at
#: d = 8192 a partial is 512 MiB, so merges there take two at a time.
MERGE_BYTES = 2**30


# -- BLAS threads inside tasks ---------------------------------------------------
#: One BLAS thread while any task of this process runs (:func:`single_threaded_blas`).
_TASKS_BLAS = CountedLimit(lambda: task_threads_controller().limit(limits=1, user_api="blas"))


@contextlib.contextmanager
def single_threaded_blas():
    """One BLAS thread while a task runs in a thread pool (dask's threaded scheduler).

    Dask already runs one task per core; OpenBLAS would start its own threads
    inside every task and oversubscribe the cores (naive Dask: 1.99 s -> 1.53 s
    with one BLAS thread, issue 9). The BLAS thread count is process-wide, so
    concurrent tasks share one limit, counted: the first task in sets it and
    the last one out restores the caller's setting, through
    :class:`core.blas_threads.TaskThreadsController` (OpenBLAS ignores threadpoolctl's
    setting from threads other than the first that made one). In the main thread (the
    synchronous scheduler, numpy input) BLAS keeps all its threads. Worker
    processes are limited once for all by ``slem_dask.cluster.connect.SingleThreadedBLAS``.
    """
    if threading.current_thread() is threading.main_thread():
        yield
        return
    _TASKS_BLAS.enter()
    try:
        yield
    finally:
        _TASKS_BLAS.leave()


def blas_task(func, *args):
    """``func(*args)`` as a dask task: on one BLAS thread while it runs in a thread pool
    (dask's threaded scheduler, the command line's in-process cluster), where OpenBLAS's
    own threads in every concurrent task would oversubscribe the cores."""
    with single_threaded_blas():
        return func(*args)


# -- statistics of the negatives -------------------------------------------------
@sizeof.register(ScatterStats)
def _sizeof_statistics(stats) -> int:
    # What the scheduler counts for memory and transfer decisions (512 MiB at d = 8192).
    return int(stats.mean.nbytes + stats.scatter.nbytes + 64)


def _block_statistics_task(block, precision):
    # The block of the (never computed) dask array of partials is the ScatterStats
    # itself: no packing into one float64 row (a copy of 512 MiB at d = 8192).
    with single_threaded_blas():
        return block_statistics(block, precision)


def _store_rows_statistics(arr, lo: int, hi: int, precision: str, name: str):
    # One task reads its rows sub-block by sub-block into one reused buffer and
    # folds each into one accumulator: whatever the partition's size, it holds
    # one d x d float64 scatter and one sub-block of rows, never the partition.
    from ..storage import read_rows

    # The buffer is this task's own, so each product's rows are shifted in place (no
    # scratch copy); rows whose float32 product would leave float32's range are read
    # again and done in float64.
    step, rows = _sub_block_rows(arr, hi - lo), product_rows(arr.shape[1])
    buffer = np.empty((min(step, hi - lo), arr.shape[1]), dtype=arr.dtype)
    acc = ScatterAccumulator(arr.shape[1], precision)
    with single_threaded_blas():
        for a in range(lo, hi, step):
            b = min(hi, a + step)
            block = read_rows(arr, a, b, name, out=buffer[: b - a])
            for start in range(0, b - a, rows):
                stop = min(b - a, start + rows)
                if not acc.add(block[start:stop], overwrite=True):
                    acc.add(read_rows(arr, a + start, a + stop, name))
    return acc.result()


#: Rows of a sub-block, at least: its two rank-one updates (two passes over the
#: d x d accumulator) stay under 2% of its product (rows x d^2 flops) at every d.
SUB_BLOCK_ROWS = 4096


def _sub_block_rows(arr, rows: int) -> int:
    """Rows read at a time by :func:`_store_rows_statistics`: whole storage units,
    at least min(d, SUB_BLOCK_ROWS) rows (a 4096-row sub-block at d = 16384 is
    256 MiB of float32)."""
    from ..storage import unit_rows

    unit = unit_rows(arr)
    want = max(unit, min(int(arr.shape[1]), SUB_BLOCK_ROWS))
    return int(min(rows, -(-want // unit) * unit))


def _merge_parts(parts):
    # Every partial has this merge task as its only consumer, so the first one's
    # d x d matrix is reused for the total (no third 512 MiB matrix at d = 8192).
    # Merged in order, pairwise-equal sizes as in a balanced tree when fan-in is 2.
    parts = [p for p in parts if p.count or p.nonfinite] or parts[:1]
    total = parts[0]
    for part in parts[1:]:
        total = merge_into(total, part)
    return total


def merge_fan_in(d: int, split_every: int = SPLIT_EVERY) -> int:
    """Partials one merge task takes: ``split_every``, fewer when d x d float64
    matrices are large (at least 2, so the tree still shrinks)."""
    return int(max(2, min(split_every, MERGE_BYTES // max(1, 8 * d * d))))


def _rows_per_block(x: da.Array) -> int:
    """Rows per block for the statistics: at least d, so that the d x d partials
    (8 d^2 bytes each) never outweigh the rows they summarize (4-8 d bytes each)."""
    rows = max(x.chunks[0])
    d = x.shape[1]
    if rows >= d or x.numblocks[0] == 1:
        return rows
    return int(-(-d // rows) * rows)  # a whole number of the current blocks


def scatter_statistics(x: da.Array, split_every: int = SPLIT_EVERY, precision: str = "auto"):
    """Delayed :class:`ScatterStats` of all rows of ``x``.

    One task per row block (one BLAS-3 call each), then a tree of merges at
    most ``split_every`` wide (:func:`merge_fan_in`: 2 at d = 8192), so no
    task ever holds more than a bounded number of d x d scatter matrices and
    the data are never gathered. Blocks of fewer than d rows are joined into
    blocks of at least d rows first: there are then at most n / d partials,
    whatever the input chunking. The block statistics are a ``map_blocks`` of
    ``x``, so dask fuses each with the task that produces its block (a zarr
    read, say): a block is reduced where it was read, and never sent between
    workers (measured on 62 blocks of 16384 x 512 read from zarr: 8.9 s
    unfused, 1 s of it transfers). ``precision``: see
    :func:`slem_dask.core.statistics.block_statistics`.

    An array from :func:`slem_dask.storage.dask_rows` itself (not one derived from it)
    is summarized by :func:`store_statistics` on its store: each task then reads into a
    buffer of its own, which it may shift in place (``LinearSLEM.fit`` of 1M x 512
    float32 rows on 2 threads: 2.96-3.06 -> 2.77-2.80 s).
    """
    check_precision(precision)
    rows = _rows_per_block(x)
    source = getattr(x, STORE_ROWS, None)
    if source is not None and source[2] == x.name and source[0].shape[0] >= source[3]:
        # still the store's first rows, as dask_rows read them
        return store_statistics(
            source[0], rows, precision, name=source[1], split_every=split_every, stop=source[3]
        )
    if rows != max(x.chunks[0]):
        x = x.rechunk({0: rows})
    partials = x.map_blocks(
        _block_statistics_task,
        precision,
        dtype=object,
        chunks=((1,) * x.numblocks[0], (1,)),
        meta=np.empty((0, 0), dtype=object),
    )
    parts = list(partials.to_delayed().ravel())
    return _merge_tree([p.key for p in parts], {}, parts, x.shape[1], split_every)


def store_statistics(
    arr,
    partition_rows: int,
    precision: str = "auto",
    name: str = "negatives",
    start: int = 0,
    split_every: int = SPLIT_EVERY,
    stop: int | None = None,
):
    """Delayed :class:`ScatterStats` of rows ``start:stop`` of the zarr array ``arr``
    (``stop``: default its row count when the graph is built).

    The form of :func:`scatter_statistics` for data in a zarr store: one task per
    partition of ``partition_rows`` rows (whole storage units, see
    :func:`slem_dask.storage.row_partition`) reads its rows with the checked
    reader and folds them sub-block by sub-block into one accumulator, so its
    memory is one d x d scatter and one sub-block whatever the partition's size;
    a caller bounds the number of d x d partials by the number of partitions
    (:func:`statistics_partition_rows`). Then the same merge tree.
    """
    check_precision(precision)
    n, d = (int(v) for v in arr.shape)
    if stop is not None:
        if stop > n:
            raise ValueError(f"{name}: rows up to {stop} asked of {n}")
        n = int(stop)
    if start >= n:
        raise ValueError(f"{name}: no rows to fit from row {start} of {n}")
    array = dask.delayed(arr, pure=True, traverse=False)  # one key: a handle, no data
    token = dask.base.tokenize(array_token(arr), partition_rows, precision, name, start, n)
    # The graph is written out, not built by a delayed call per partition: those
    # tokenized their arguments one by one (16 ms at 61 partitions, on the critical path).
    layer = f"slem-statistics-{token}"
    graph = {
        (layer, i): (
            _store_rows_statistics,
            array.key,
            lo,
            min(n, lo + partition_rows),
            precision,
            name,
        )
        for i, lo in enumerate(range(start, n, partition_rows))
    }
    return _merge_tree(list(graph), graph, [array], d, split_every)


#: Above this size of a d x d float64 partial (d >= 2048), a fit makes one
#: partition per thread of the cluster instead of many: the partials, not the
#: rows, are then what fills the workers' memory (512 MiB each at d = 8192).
WIDE_PARTIAL_BYTES = 32 * 2**20


def statistics_partition_rows(n: int, d: int, unit: int, default: int, threads: int) -> int:
    """Rows per partition of :func:`store_statistics`: ``default`` (whole storage units),
    except for wide rows, where there is one partition per thread (``threads``),
    so that at most one d x d partial per thread waits for its merge (a task holds
    one partial and one sub-block however many rows it reads)."""
    if 8 * d * d < WIDE_PARTIAL_BYTES or n <= 0:
        return default
    per_thread = -(-n // max(1, threads))
    return int(-(-per_thread // unit) * unit)


def _merge_tree(keys: list, graph: dict, dependencies: list, d: int, split_every: int):
    """One Delayed: the partial statistics under ``keys`` (tasks of ``graph``, or of the
    collections ``dependencies``) merged by a tree of :func:`_merge_parts` tasks, at least
    one level (it also unpacks a single partial)."""
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph

    fan_in = merge_fan_in(d, split_every)
    merge = f"slem-merge-{dask.base.tokenize(keys, fan_in)}"
    graph, level = dict(graph), 0
    while len(keys) > 1 or level == 0:
        merged = [(merge, level, j) for j in range(-(-len(keys) // fan_in))]
        for j, key in enumerate(merged):
            graph[key] = (_merge_parts, list(keys[j * fan_in : (j + 1) * fan_in]))
        keys, level = merged, level + 1
    return Delayed(
        keys[0], HighLevelGraph.from_collections(merge, graph, dependencies), layer=merge
    )


#: Arrays of at least this size go to the workers by ``client.scatter`` inside
#: :func:`scatter_large_arrays` (distributed warns about graphs above 10 MB).
SCATTER_BYTES = 2**20

_scatter_client = contextvars.ContextVar("slem_dask_scatter_client", default=None)


def _nonfinite_rows_block(block, block_info=None):
    """[[count, first five rows (-1 padded)]] of a block's rows holding NaN or inf."""
    offset = block_info[0]["array-location"][0][0] if block_info else 0
    bad = np.flatnonzero(~np.isfinite(block).all(axis=1))
    first = (bad[:5] + offset).tolist()
    return np.array([[bad.size] + first + [-1] * (5 - len(first))], dtype=np.int64)


def locate_nonfinite_rows(x, client=None, row_offset: int = 0) -> tuple[int, str]:
    """(how many rows of ``x`` hold NaN or inf, the first five as text), for an error
    message once a fit has counted them: a second pass over ``x`` (numpy, or dask with
    whole rows per block, as fits require), on ``client``'s cluster if given. Row
    numbers start at ``row_offset``."""
    from ..core.validation import nonfinite_rows, rows_text

    if not isinstance(x, da.Array):
        return nonfinite_rows(np.asarray(x), row_offset)
    found = x.map_blocks(
        _nonfinite_rows_block,
        dtype=np.int64,
        chunks=((1,) * x.numblocks[0], (6,)),
        meta=np.empty((0, 6), dtype=np.int64),
    )
    table = client.compute(found).result() if client is not None else found.compute()
    bad = [int(i) + row_offset for row in table for i in row[1 : 1 + min(5, row[0])]]
    count = int(table[:, 0].sum())
    return count, rows_text(bad, count)


@contextlib.contextmanager
def scatter_large_arrays(client):
    """Within this block, :func:`shared` sends arrays (or dataclasses of arrays) of
    SCATTER_BYTES or more to every worker of ``client`` once
    (:func:`.replicas.scatter_everywhere`) instead of embedding them in the task graph.

    An embedded array travels in the graph through the scheduler, which holds it
    (a d = 8192 linear model: 256 MiB; E-SVM's negatives: all of them), and distributed
    warns about it. A scattered one is a future, held until the block ends: a graph
    built here must be computed on ``client`` inside it. Jobs, which build and compute
    at once, use this; library calls outside it stay self-contained graphs that any
    scheduler can compute. ``client=None`` (no cluster) changes nothing. Yields the
    futures scattered so far (:func:`.replicas.lost` says if the cluster lost one).
    """
    # the futures are held here: a graph keeps only their keys, and a future
    # nobody holds is released by the client before its tasks run
    held: list = []
    token = _scatter_client.set((client, held) if client is not None else None)
    try:
        yield held
    finally:
        _scatter_client.reset(token)
        # emptied, not only dropped: asyncio handles that distributed made inside the
        # block (a direct scatter's connections) keep a copy of this context, and so the
        # list, alive long after it; the scattered arrays stayed on the workers
        held.clear()


def _array_bytes(value) -> int:
    """Bytes of an array, or of the arrays of a dataclass (a kernel model's encoder)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(_array_bytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 0


def shared(value, token: str | None = None):
    """Wrap an in-memory array so it enters the graph once.

    Tasks that take it refer to one key: the scheduler ships it to each worker
    once, instead of pickling a copy into every task. Inside
    :func:`scatter_large_arrays`, a large array is scattered to the workers
    instead, and the key is its future. ``token``: ``dask.base.tokenize(value)``
    as the caller kept it (hashing a d = 8192 float32 A^-1 costs 0.17 CPU s a call).
    """
    scatter = _scatter_client.get()
    if scatter is not None and _array_bytes(value) >= SCATTER_BYTES:
        from .replicas import PREFIX, protect, scatter_everywhere

        client, held = scatter
        if not held:  # the scheduler's memory manager must spare the copies (replicas.py)
            protect(client)
        # on every worker: a worker lost mid-job does not take the only copy with it
        # (scattered data, unlike a task, cannot be rerun)
        future = scatter_everywhere(client, PREFIX + (token or dask.base.tokenize(value)), value)
        held.append(future)
        return future
    if token is not None:  # a key named by its content, without hashing it again
        return dask.delayed(value, name=f"{type(value).__name__}-{token}", traverse=False)
    return dask.delayed(value, pure=True, traverse=False)


def _apply_rows(block, func, out_dtype, name, *args, block_info=None):
    offset = block_info[0]["array-location"][0][0] if block_info else 0
    where = _block_text(block_info, offset, len(block))
    checks_itself = getattr(func, "checks_finite_rows", False)
    if not checks_itself:
        check_finite_rows(block, name, row_offset=offset, where=where)
    args = tuple(aligned(a) for a in args)
    at = {"row_offset": offset} if getattr(func, "takes_row_offset", False) else {}
    try:
        with single_threaded_blas():
            return np.asarray(func(block, *args, **at), dtype=out_dtype)
    except NonFiniteRowsError:
        if checks_itself:  # it names them as its own rows: again, as this input's
            check_finite_rows(block, name, row_offset=offset, where=where)
        raise


def _block_text(block_info, offset: int, rows: int) -> str:
    """Which part of the input a block's error counts rows in ("" for a block that is
    all of it): the task that fails first ends the compute, before others have looked."""
    blocks = block_info[0]["num-chunks"][0] if block_info else 1
    if blocks <= 1:
        return ""
    return (
        f" in its rows {offset}-{offset + rows - 1}, one of its {blocks} blocks (the other "
        f"blocks may hold more)"
    )


def aligned(value):
    """``value`` (an array, or a dataclass of arrays), or, once per process, a copy whose
    arrays are aligned for their dtype; anything else as it is.

    distributed hands a task an array in the buffer it was received in, at any byte
    offset: a scattered or graph-embedded float32 A^-1 arrived at offsets 5 and 57 on a
    LocalCluster's two workers. numpy's matmul copies a misaligned operand whole on every
    call: 256 MiB twice per 1,024-row partition at d = 8192, 0.44 s of each 2.4 s task.
    The copy is kept while the original lives (a job's scattered model), so a worker
    holds A^-1 twice, as each of its tasks' products did."""
    if isinstance(value, np.ndarray):
        return value if value.flags.aligned else _aligned_copy(value, np.copy)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if all(a.flags.aligned for a in fields.values() if isinstance(a, np.ndarray)):
            return value
        return _aligned_copy(
            value,
            lambda v: dataclasses.replace(
                v, **{k: aligned(a) for k, a in fields.items() if isinstance(a, np.ndarray)}
            ),
        )
    return value


#: id(original) -> (weak reference to it, its aligned copy), for :func:`aligned`.
_ALIGNED: dict[int, tuple[weakref.ref, object]] = {}
_ALIGNED_LOCK = threading.RLock()  # a dataclass copies its arrays under it


def _aligned_copy(value, copy):
    with _ALIGNED_LOCK:  # the first of a worker's tasks copies; the others wait for it
        entry = _ALIGNED.get(id(value))
        if entry is not None and entry[0]() is value:
            return entry[1]
        key = id(value)

        def forget(ref, key=key):
            if _ALIGNED.get(key, (None,))[0] is ref:
                _ALIGNED.pop(key, None)

        _ALIGNED[key] = (weakref.ref(value, forget), copy(value))
        return _ALIGNED[key][1]


def map_rows(
    func, x: da.Array, args: tuple, out_dim: int, out_dtype, name: str, label: str
) -> da.Array:
    """Lazy ``func(block, *args)`` over the row blocks of ``x``, one task per block.

    ``func`` maps (rows, d) to (rows, out_dim); rows with NaN or inf are rejected
    with their global index (``name`` names the input in the message); one that
    ``takes_row_offset`` is told where its block starts. ``args`` may hold results of
    :func:`shared` (one graph key each, shipped once per worker)."""
    out_dtype = np.dtype(out_dtype)
    return da.map_blocks(
        _apply_rows,
        x,
        func,
        out_dtype,
        name,
        *args,
        dtype=out_dtype,
        chunks=(x.chunks[0], (out_dim,)),
        meta=np.empty((0, out_dim), dtype=out_dtype),
        name=f"{label}-" + dask.base.tokenize(x, func, args, out_dtype),
    )


def encode_blocks(
    p: da.Array, mean, precision, out_dtype, name: str = "positives", zero_reason=None
) -> da.Array:
    """Lazy linear SLEM vectors of the rows of ``p``, with its row chunks; ``mean`` and
    ``precision``: numpy arrays or results of :func:`shared`. ``zero_reason``: rows encoded
    to zeros, NaN or inf refused, saying why (:class:`EncodeRefusingDegenerate`)."""
    func = encode_rows if zero_reason is None else EncodeRefusingDegenerate(zero_reason)
    return map_rows(func, p, (mean, precision), p.shape[1], out_dtype, name, "slem-encode")
