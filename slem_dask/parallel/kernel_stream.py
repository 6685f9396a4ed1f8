"""Streaming backend of the distributed pivoted incomplete Cholesky: memory independent of n.

The in-memory backends of :mod:`slem_dask.parallel.kernel` keep, per block, its
rows of X and of the factor F for the whole fit (about 4.5-6.6 KB per row at
d = 512, r = 256). This backend keeps nothing per row between passes: every pass
reads each block of X again (from the zarr store, for a dask array built on one)
and recomputes its rows of F from the pivots chosen so far. With I the pivots
(in order) and L = F(I, :) the lower Cholesky factor of K(I, I),

    F(x, :) = K(x, I) L^-T                                  (docs/math.md#icd)

so a block's rows of F are one kernel block against the t pivot rows and one
triangular solve (BLAS-3 trsm); its residual diagonal is

    d(x) = k(x, x) - sum_m F(x, m)^2                        (docs/math.md#icd)

subtracted round by round (the columns each round appended, in the order the
in-memory path appends them) and clipped at 0 as
:func:`core.cholesky.update_residual_diagonal` does. A block then proposes
pivot candidates and summarizes itself with the in-memory path's own
functions (``_summarize``: greedy argmax, or rpcholesky draws with the same
random keys), and the summaries are merged by the same tree, so the driver
(:func:`.kernel.incomplete_cholesky`) runs unchanged and chooses the
same pivots. The last pass gives the Chan statistics of the rows of F
(docs/math.md#chan-merge) and the residual trace over all n rows.

Cost of a pass with t pivots: O(b t d + b t^2) per block of b rows (the
in-memory path: O(b s d + b s t) for the s pivots of the round), plus reading
the block. Memory per task: the block (b x d, input dtype), its kernel block
and its rows of F (b x t float64 each): independent of n. The driver holds
the pivot rows, L and the merged summary (O(r d + r^2)).

:func:`factor_statistics` is one such pass with given pivots: the statistics of
F's rows of any rows, e.g. of the rows appended to the negatives since a model
was fitted (``fit --update`` of a kernel model).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy.linalg import blas

from ..core.cholesky import update_residual_diagonal
from ..core.kernels import check_histogram, kernel_diagonal, kernel_matrix
from ..core.statistics import block_statistics, merge_many
from .kernel_checkpoint import write_partition
from .kernel_rounds import (
    SPLIT_EVERY,
    _Block,
    _grow_lower,
    _merge_summaries,
    _summarize,
    _tree,
    in_threads,
    row_blocks,
)
from .task_memory import kernel_fit_bytes
from ..core.validation import check_finite_rows, is_dask_array
from ..storage.nodes.workers import listed_workers

__all__ = [
    "factor_rows",
    "factor_statistics",
    "StreamingRounds",
    "choose_strategy",
    "check_strategy",
    "memory_budget",
    "STRATEGIES",
]


@dataclass(frozen=True)
class _Pivots:
    """What a streaming pass needs of the fit so far (shipped once per pass)."""

    rows: np.ndarray  # (t, d) float64 pivot rows X_I
    lower: np.ndarray  # (t, t) lower triangular L = F(I, :)
    groups: tuple = ()  # pivots appended per round, in order (sum = t)


def _rows(x, offset: int, cfg, name: str, check: bool) -> np.ndarray:
    """A block of rows as the in-memory path holds it: float32 stays float32, anything
    else becomes float64 (the kernel functions compute in float64 either way)."""
    x = np.asarray(x)
    if check:
        check_finite_rows(x, name, row_offset=offset)
        check_histogram(x, cfg.kernel, name, row_offset=offset)
    dtype = np.float32 if x.dtype == np.float32 else np.float64
    return np.ascontiguousarray(x, dtype=dtype)


#: Rows whose kernel block is computed at once inside a block (bounds the kernel
#: functions' float64 temporaries to a few SUB_ROWS x t arrays, 8 MiB each at t = 256).
SUB_ROWS = 4096


def factor_rows(x: np.ndarray, pivots: _Pivots, cfg) -> np.ndarray:
    """F(x, :) = K(x, X_I) L^-T for the rows of ``x`` (docs/math.md#icd): (b, t) float64."""
    t = pivots.lower.shape[0]
    out = np.zeros((x.shape[0], t))
    if t == 0:
        return out
    for i in range(0, x.shape[0], SUB_ROWS):
        k = np.ascontiguousarray(
            kernel_matrix(x[i : i + SUB_ROWS], pivots.rows, cfg.kernel, cfg.gamma, cfg.degree),
            dtype=np.float64,
        )
        # One BLAS-3 call: L F^T = K^T (side left, lower), in place on K^T, the
        # Fortran-ordered view of the C-ordered kernel block (no copy of it).
        ft = blas.dtrsm(1.0, pivots.lower, k.T, side=0, lower=1, trans_a=0, overwrite_b=1)
        out[i : i + SUB_ROWS] = ft.T
    return out


def _residual_diagonal(kdiag: np.ndarray, f: np.ndarray, groups) -> np.ndarray:
    """diag(K - F F^T), the columns subtracted round by round as the in-memory path does
    (each round's update clipped at 0: core.cholesky.update_residual_diagonal)."""
    diag, start = kdiag, 0
    for s in groups:
        diag = update_residual_diagonal(diag, f[:, start : start + s])
        start += s
    return diag


def _stream_block(
    x,
    offset: int,
    pivots: _Pivots,
    cfg,
    count: int,
    key: tuple,
    final: bool,
    first: bool,
    name: str,
    checkpoint: str | None = None,
):
    """One block's summary in one pass: its rows read afresh, nothing kept after.
    ``checkpoint``: a folder where the final pass writes the block's statistics
    (:mod:`slem_dask.parallel.kernel_checkpoint`)."""
    x = _rows(x, offset, cfg, name, check=first)
    kdiag = kernel_diagonal(x, cfg.kernel, cfg.gamma, cfg.degree)
    f = factor_rows(x, pivots, cfg)
    block = _Block(x, offset, _residual_diagonal(kdiag, f, pivots.groups), f, f.shape[1])
    if first:
        return _summarize(
            block,
            cfg,
            count,
            key,
            final,
            trace=float(kdiag.sum()),
            max_diag=float(kdiag.max(initial=0.0)),
        )
    summary = _summarize(block, cfg, count, key, final)
    if final and checkpoint is not None:
        try:
            write_partition(checkpoint, key[-1], summary)
        except Exception:  # noqa: BLE001 - a checkpoint is best effort: the fit goes on,
            pass  # and a resumed run computes this partition again
    return summary


class StreamingRounds:
    """The rounds of :func:`.kernel.incomplete_cholesky`, nothing kept per row.

    ``x``: a numpy array (split in blocks of ``block_rows`` rows, run in-process)
    or a dask array (one task per row chunk per pass, on the current scheduler;
    the chunks are read again at every pass, never persisted).
    """

    def __init__(self, x, name: str, block_rows: int = 4096, checkpoint=None):
        self.x, self.name, self.checkpoint = x, name, checkpoint
        self.blocks = row_blocks(x, block_rows)
        self.sizes = (
            [int(s) for s in x.chunks[0]]
            if is_dask_array(x)
            else [int(b.shape[0]) for b, _ in self.blocks]
        )
        self.pivots = _Pivots(np.empty((0, x.shape[1])), np.zeros((0, 0)), ())

    def _pass(self, cfg, count: int, round_no: int, final: bool, first: bool = False):
        folder, done = None, {}
        if final and self.checkpoint is not None:  # the final pass resumes (kernel_checkpoint)
            tag = self.checkpoint.tag(self.pivots.rows, self.pivots.lower)
            folder = self.checkpoint.folder(tag)
            done = self.checkpoint.finished(tag, self.sizes)
        if not is_dask_array(self.x):
            todo = [j for j in range(len(self.blocks)) if j not in done]
            computed = dict(
                zip(
                    todo,
                    in_threads(
                        _stream_block,
                        [
                            (
                                *self.blocks[j],
                                self.pivots,
                                cfg,
                                count,
                                (round_no, 0, j),
                                final,
                                first,
                                self.name,
                                folder,
                            )
                            for j in todo
                        ],
                    ),
                    strict=True,
                )
            )
            parts = [done[j] if j in done else computed[j] for j in range(len(self.blocks))]
            return _tree(parts, _merge_summaries, cfg, count, round_no)
        import dask

        from .blocks import blas_task

        shared = dask.delayed(self.pivots, traverse=False)
        task = dask.delayed(blas_task, pure=False)
        parts = [
            done[j]
            if j in done
            else task(
                _stream_block,
                b,
                off,
                shared,
                cfg,
                count,
                (round_no, 0, j),
                final,
                first,
                self.name,
                folder,
            )
            for j, (b, off) in enumerate(self.blocks)
        ]
        return _tree(parts, _merge_summaries, cfg, count, round_no, delayed=dask.delayed).compute()

    def start(self, cfg, count):
        return self._pass(cfg, count, 0, False, first=True)

    def step(self, acc, cfg, count, round_no, final):
        if acc is not None and acc.rows.shape[0]:
            p = self.pivots
            self.pivots = _Pivots(
                np.vstack([p.rows, acc.rows]),
                _grow_lower(p.lower, acc),
                p.groups + (int(acc.rows.shape[0]),),
            )
        return self._pass(cfg, count, round_no, final)


# -- statistics of F's rows for given pivots (fit --update) ----------------------------
def _stats_block(x, offset: int, pivots: _Pivots, cfg, name: str) -> tuple:
    x = _rows(x, offset, cfg, name, check=True)
    kdiag = kernel_diagonal(x, cfg.kernel, cfg.gamma, cfg.degree)
    f = factor_rows(x, pivots, cfg)
    residual = _residual_diagonal(kdiag, f, (f.shape[1],))
    return (block_statistics(f), float(kdiag.sum()), float(residual.sum()))


def _merge_stats(parts: list) -> tuple:
    return (merge_many([p[0] for p in parts]), sum(p[1] for p in parts), sum(p[2] for p in parts))


def factor_statistics(
    x,
    pivot_rows: np.ndarray,
    pivot_factor: np.ndarray,
    cfg,
    name: str = "X",
    block_rows: int = 4096,
    row_offset: int = 0,
):
    """(Chan statistics of F's rows, trace, residual trace) of the rows of ``x`` for the
    given pivots, in one streaming pass (F = K(x, X_I) L^-T, docs/math.md#icd).

    ``x`` numpy (blocks of ``block_rows``) or dask (one task per row chunk; returns a
    dask Delayed, computed by the caller). The residual diagonal is clipped at 0 once
    (all columns subtracted together). ``row_offset``: the index of ``x``'s first row in
    its store (errors name rows by it: the rows appended to a model's negatives).
    """
    pivots = _Pivots(
        np.asarray(pivot_rows, dtype=np.float64),
        np.asarray(pivot_factor, dtype=np.float64),
        (len(pivot_factor),),
    )
    blocks = row_blocks(x, block_rows, row_offset)
    if not is_dask_array(x):
        return _tree_merge(
            in_threads(_stats_block, [(b, off, pivots, cfg, name) for b, off in blocks])
        )
    import dask

    from .blocks import blas_task

    shared = dask.delayed(pivots, traverse=False)
    task = dask.delayed(blas_task, pure=True)
    parts = [task(_stats_block, b, off, shared, cfg, name) for b, off in blocks]
    return _tree_merge(parts, dask.delayed(_merge_stats, pure=True))


def _tree_merge(parts: list, merge=_merge_stats):
    while len(parts) > 1:
        parts = [merge(parts[i : i + SPLIT_EVERY]) for i in range(0, len(parts), SPLIT_EVERY)]
    return parts[0]


# -- choosing between the in-memory and the streaming path ----------------------------
STRATEGIES = ("auto", "in-memory", "streaming")
#: Fraction of the memory (workers' limits, else this machine's available memory) the
#: in-memory path may fill: distributed's default spill threshold ("target").
MEMORY_TARGET = 0.6
#: Pivots assumed by the estimate when ``rank`` is None (the fit may take more).
UNBOUNDED_RANK_ESTIMATE = 1024


def check_strategy(strategy) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(
            f"strategy must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}: "
            f"'in-memory' keeps the negatives' rows and factor rows on the workers (fast "
            f"while they fit), 'streaming' reads the negatives again at every pass (memory "
            f"independent of n), 'auto' picks by the workers' memory"
        )
    return strategy


def _gib(b: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= size:
            return f"{b / size:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{b:.0f} B"


def memory_budget(x) -> tuple[float, str]:
    """(bytes, what they are) the in-memory path may fill: MEMORY_TARGET of the memory
    limits of the dask workers, less what they hold, when ``x`` is a dask array that
    runs on a distributed client whose workers all have limits; else MEMORY_TARGET of
    this machine's available memory."""
    if is_dask_array(x):
        import dask.base

        client = getattr(dask.base.get_scheduler(collections=[x]), "__self__", None)
        workers = None
        # a distributed Client: listed_workers asks its scheduler through its loop
        if client is not None and hasattr(client, "scheduler") and hasattr(client, "sync"):
            workers = listed_workers(client)
        if workers and all(w.get("memory_limit") for w in workers.values()):
            limit = sum(w["memory_limit"] for w in workers.values())
            used = sum(w.get("metrics", {}).get("memory", 0) or 0 for w in workers.values())
            whose = (
                "the worker's memory limit"
                if len(workers) == 1
                else f"the {len(workers)} workers' memory limits"
            )
            return (
                MEMORY_TARGET * limit - used,
                f"{MEMORY_TARGET:.0%} of {whose} ({_gib(limit)}) less {_gib(used)} in use",
            )
    import psutil

    avail = psutil.virtual_memory().available
    return MEMORY_TARGET * avail, (
        f"{MEMORY_TARGET:.0%} of this machine's available memory ({_gib(avail)})"
    )


class KernelMemoryWarning(UserWarning):
    """An in-memory kernel fit was asked for whose estimate exceeds the workers' memory."""


def choose_strategy(
    strategy: str, x, rank: int | None, exact: bool, pivoting: str | None = None
) -> tuple[str, str]:
    """("in-memory" | "streaming", why): ``strategy`` itself unless "auto"; "auto" streams
    when :func:`task_memory.kernel_fit_bytes` exceeds :func:`memory_budget`. A streaming
    greedy fit is told that it recomputes F at each of its r + 1 passes."""
    check_strategy(strategy)
    if strategy == "streaming" and exact:
        raise ValueError(
            "strategy='streaming' cannot keep the negatives and the n x r factor "
            "that exact=True stores in the model: use strategy='in-memory' (or "
            "'auto') with exact=True, or exact=False to stream"
        )
    slow = (
        "; greedy pivoting makes one pass per pivot, each recomputing the factor rows "
        "of every row (rpcholesky: a few passes)"
        if pivoting == "greedy"
        else ""
    )
    if strategy == "streaming":
        return strategy, "forced (strategy / --kernel-memory)" + slow
    n, d = int(x.shape[0]), int(x.shape[1])
    r = rank if rank is not None else min(n, UNBOUNDED_RANK_ESTIMATE)
    need = kernel_fit_bytes(n, d, x.dtype, r)
    budget, where = memory_budget(x)
    estimate = f"the in-memory path needs about {_gib(need)} ({n} rows x {need / n / 1e3:.1f} KB"
    estimate += f" at d = {d}, r = {r}{'' if rank is not None else ' assumed'})"
    if strategy == "in-memory" or exact:
        why = (
            "forced (strategy / --kernel-memory)"
            if strategy == "in-memory"
            else "exact=True keeps the negatives and the factor in the model"
        )
        if need > budget:  # run as asked, but say what is likely to happen
            warnings.warn(
                KernelMemoryWarning(
                    f"{estimate}, more than {where}: the workers may run out of memory; "
                    f"{'use exact=False and ' if exact else ''}--kernel-memory auto (or "
                    f"streaming) streams the negatives instead"
                ),
                stacklevel=3,
            )
        return "in-memory", why
    if need <= budget:
        return "in-memory", f"auto: {estimate}, within {where}"
    return "streaming", f"auto: {estimate}, more than {where}{slow}"
