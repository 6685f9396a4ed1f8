"""One round's pieces shared by the two backends of the distributed pivoted incomplete
Cholesky: the in-memory ones (:mod:`slem_dask.parallel.kernel`) and the streaming one
(:mod:`slem_dask.parallel.kernel_stream`).

A block's state, its pivot proposals and summary, the tree that merges summaries
``SPLIT_EVERY`` at a time, the split of a numpy input into blocks run on a thread
per core, and the growth of L = F(I, :) by a round's pivots. Both backends import
this module and it imports neither of them (nor anything above ``core``), so the
driver in :mod:`slem_dask.parallel.kernel` can choose a backend without an import
circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.blas_threads import one_blas_thread, usable_cores
from ..core.statistics import ScatterStats, block_statistics, merge_many
from ..core.validation import is_dask_array

#: How many partial summaries one merge task combines (as in :mod:`.blocks`).
SPLIT_EVERY = 8


@dataclass(frozen=True)
class CholeskyConfig:
    kernel: str
    gamma: float
    degree: int
    pivoting: str  # "greedy" | "rpcholesky"
    rank: int  # maximum number of pivots
    tol: float  # stop when residual trace <= tol * trace
    seed: int = 0
    gather: bool = False  # return F and the float64 rows (exact mode)


@dataclass
class _Block:
    x: np.ndarray
    offset: int
    diag: np.ndarray
    buf: np.ndarray
    t: int = 0


@dataclass
class _Accepted:
    """Pivots of one round: data rows, their old rows of F, and R = F(T, new cols)."""

    rows: np.ndarray
    f_rows: np.ndarray
    chol: np.ndarray


@dataclass
class _Summary:
    trace: float = 0.0
    max_diag: float = 0.0
    residual: float = 0.0
    max_residual: float = 0.0
    # greedy: (value, index, row, f_row) or None; rpcholesky: dict of arrays or None
    proposal: object = None
    stats: ScatterStats | None = None
    gathered: list = field(default_factory=list)  # [(offset, F block, x block)]


# -- block tasks ------------------------------------------------------------
def _propose(block: _Block, cfg: CholeskyConfig, count: int, key: tuple):
    m = block.diag.shape[0]
    if m == 0:
        return None
    if cfg.pivoting == "greedy":
        i = int(np.argmax(block.diag))
        return (
            float(block.diag[i]),
            block.offset + i,
            block.x[i].astype(np.float64),
            block.buf[i, : block.t].copy(),
        )
    total = float(block.diag.sum())
    if not total > 0:
        return None
    rng = np.random.default_rng([cfg.seed, *key])
    cum = np.cumsum(block.diag)
    idx = np.searchsorted(cum, rng.random(count) * cum[-1], side="right")
    np.minimum(idx, m - 1, out=idx)
    return {
        "total": total,
        "diag": block.diag[idx].copy(),
        "index": idx + block.offset,
        "rows": block.x[idx].astype(np.float64),
        "f_rows": block.buf[idx, : block.t].copy(),
    }


def _summarize(
    block: _Block,
    cfg: CholeskyConfig,
    count: int,
    key: tuple,
    final: bool,
    trace: float = 0.0,
    max_diag: float = 0.0,
) -> _Summary:
    s = _Summary(
        trace=trace,
        max_diag=max_diag,
        residual=float(block.diag.sum()),
        max_residual=float(block.diag.max(initial=0.0)),
    )
    if final:
        s.stats = block_statistics(block.buf[:, : block.t])
        if cfg.gather:
            s.gathered = [(block.offset, block.buf[:, : block.t].copy(), block.x)]
    else:
        s.proposal = _propose(block, cfg, count, key)
    return s


# -- merging summaries --------------------------------------------------------
def _merge_proposals(parts: list, cfg: CholeskyConfig, count: int, key: tuple):
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    if cfg.pivoting == "greedy":
        # Largest residual; ties go to the smallest index (as numpy's argmax).
        return max(parts, key=lambda p: (p[0], -p[1]))
    if len(parts) == 1:
        return parts[0]
    # Mixture of i.i.d. samples: part j holds `count` draws proportional to the
    # residual diagonal within its rows; a multinomial split by the parts'
    # residual traces, then a random order, gives `count` i.i.d. draws
    # proportional to the residual diagonal over the union.
    rng = np.random.default_rng([cfg.seed, *key])
    totals = np.array([p["total"] for p in parts])
    counts = rng.multinomial(count, totals / totals.sum())
    pick = {
        name: np.concatenate([p[name][:c] for p, c in zip(parts, counts, strict=True)])
        for name in ("diag", "index", "rows", "f_rows")
    }
    order = rng.permutation(count)
    out = {name: value[order] for name, value in pick.items()}
    out["total"] = float(totals.sum())
    return out


def _merge_summaries(parts: list, cfg: CholeskyConfig, count: int, key: tuple) -> _Summary:
    out = _Summary(
        trace=sum(p.trace for p in parts),
        max_diag=max(p.max_diag for p in parts),
        residual=sum(p.residual for p in parts),
        max_residual=max(p.max_residual for p in parts),
    )
    if all(p.stats is not None for p in parts):
        out.stats = merge_many([p.stats for p in parts])
        out.gathered = [g for p in parts for g in p.gathered]
    else:
        out.proposal = _merge_proposals([p.proposal for p in parts], cfg, count, key)
    return out


def _tree(parts: list, merge, cfg, count, round_no: int, delayed=None):
    """Merge ``parts`` SPLIT_EVERY at a time; the node keys seed the random merges."""
    level = 0
    while len(parts) > 1:
        groups = [parts[i : i + SPLIT_EVERY] for i in range(0, len(parts), SPLIT_EVERY)]
        fn = merge if delayed is None else delayed(merge, pure=False)
        parts = [fn(g, cfg, count, (round_no, 1, level, j)) for j, g in enumerate(groups)]
        level += 1
    if len(parts) == 1 and level == 0:  # a single block: still normalize the summary
        fn = merge if delayed is None else delayed(merge, pure=False)
        parts = [fn(parts, cfg, count, (round_no, 1, 0, 0))]
    return parts[0]


# -- numpy blocks and L ------------------------------------------------------------
def row_blocks(x, block_rows: int, row_offset: int = 0) -> list[tuple]:
    """(block, index of its first row) for the rows of ``x``: numpy slices of
    ``block_rows`` rows, or a dask array's row chunks as Delayed (one task each).
    ``row_offset``: the index of ``x``'s first row in its store (errors name rows by it)."""
    if is_dask_array(x):
        offsets = np.concatenate([[0], np.cumsum(x.chunks[0])[:-1]]).astype(int)
        return [
            (b, row_offset + int(o)) for b, o in zip(x.to_delayed().ravel(), offsets, strict=True)
        ]
    return [(x[i : i + block_rows], row_offset + i) for i in range(0, x.shape[0], block_rows)]


def in_threads(fn, calls: list[tuple]) -> list:
    """``[fn(*args) for args in calls]``, on a thread per core, each with one BLAS thread.

    The block tasks of a numpy input are the dask tasks of a dask input, run here
    without dask: their kernel products (BLAS) and elementwise kernels (numpy) release
    the GIL, so a thread per core keeps every core busy, where one block at a time
    left the elementwise work on one core (issue 20). Results come back in order, and
    the first failing call raises its own error, as a loop would."""
    from concurrent.futures import ThreadPoolExecutor

    cores = usable_cores()
    if cores < 2 or len(calls) < 2:
        return [fn(*args) for args in calls]
    with one_blas_thread(), ThreadPoolExecutor(min(cores, len(calls))) as pool:
        return list(pool.map(lambda args: fn(*args), calls))


def _grow_lower(lower: np.ndarray, acc: _Accepted) -> np.ndarray:
    """L = F(I, :) with the round's pivots T appended: [[L, 0], [F(T, :t), R]]."""
    t, s = lower.shape[0], acc.rows.shape[0]
    grown = np.zeros((t + s, t + s))
    grown[:t, :t] = lower
    grown[t:, :t] = acc.f_rows
    grown[t:, t:] = acc.chol
    return grown
