"""Distributed pivoted incomplete Cholesky of the negatives' kernel matrix.

The n x n kernel matrix is never formed. The negatives stay split in row
blocks; each block keeps, in worker memory, a state: its rows (float32 stays float32, else
float64), its rows of the factor F (n_b x t, in a buffer of r columns allocated at once, or
grown by doubling when r x n_b float64 exceeds 2 GiB) and its
residual diagonal diag(K - F F^T). The fit runs in *rounds*; each round is
one pass over the blocks and one small round trip to the caller:

1. every block task appends the columns of the pivots accepted in the
   previous round (kernel against those pivot rows, one matrix product with
   its old columns, one triangular solve: :func:`core.cholesky.new_columns`)
   and updates its residual diagonal;
2. it proposes pivot candidates from its own rows: the row with the largest
   residual diagonal (``greedy``) or ``b`` rows drawn with probability
   proportional to the residual diagonal (``rpcholesky``), each with its data
   row and its row of F;
3. the proposals, residual traces and maxima are merged by a tree of tasks
   (``SPLIT_EVERY`` wide) into one small summary, which the caller computes;
4. the caller picks the pivots of the round (greedy: the best proposal;
   rpcholesky: the accept/reject pass of :func:`core.cholesky.accept_candidates`
   on the candidates' residual block, docs/math.md#rpcholesky) and extends L = F(I, :).

Per round: one task per block plus the merge tree; one ``dask.persist``
(the new block states and the summary, together) and the compute of the
summary, which is already in memory. Greedy takes one pivot per round (r + 1
rounds: the pivot rule needs the global maximum after every pivot);
rpcholesky takes many (about r / acceptance-per-round rounds). The final
round appends the last pivots and returns, instead of proposals, the Chan
statistics (:mod:`core.statistics`, docs/math.md#chan-merge) of the rows of F: mean row and centred
scatter, merged in float64 by the same tree. F itself never leaves the
workers unless ``gather=True`` (the exact mode, modest n).

A block's factor buffer is written in place, but only in the columns of the
current round, which the block's previous state never reads: re-running a
round task (after a lost worker, or on a copy moved to another worker) gives
the same result, so the in-place write is safe under the distributed
scheduler.

A third backend, :class:`.kernel_stream.StreamingRounds`
(``incomplete_cholesky(..., streaming=True)``), keeps no block state: every
pass reads the rows again and recomputes their rows of F from the pivots so
far (F = K(x, I) L^-T), then proposes and summarizes with the same functions
(:mod:`slem_dask.parallel.kernel_rounds`, the pieces both backends share), so the
driver and the pivots are the same and worker memory does not grow with n.

The same round functions run without dask on a list of numpy blocks
(:func:`incomplete_cholesky` with ``x`` a numpy array), so the numpy and dask
paths compute the same thing; greedy pivots do not depend on the chunking,
rpcholesky pivots depend on ``seed`` and on the chunking (the random streams
are per block and per merge node).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..core.cholesky import accept_candidates, new_columns, update_residual_diagonal
from ..core.kernels import check_histogram, kernel_diagonal, kernel_matrix
from ..core.blas_threads import factorization_threads
from ..core.statistics import ScatterStats
from .kernel_rounds import (
    SPLIT_EVERY,
    CholeskyConfig,
    _Accepted,
    _Block,
    _grow_lower,
    _merge_summaries,
    _summarize,
    _Summary,
    _tree,
    in_threads,
    row_blocks,
)
from .kernel_stream import StreamingRounds
from ..core.validation import RowsError, check_finite_rows, is_dask_array

__all__ = ["CholeskyConfig", "CholeskyResult", "incomplete_cholesky", "SPLIT_EVERY"]

#: Candidates drawn per rpcholesky round (fewer when fewer pivots remain).
RP_CANDIDATES = 128
#: rpcholesky gives up after this many rounds in a row without an accepted candidate.
MAX_EMPTY_ROUNDS = 10
#: A pivot whose residual is <= BREAKDOWN x max_i K(i, i) is not taken: its
#: row is numerically in the span of the pivots already chosen.
BREAKDOWN = 1e-10


@dataclass
class CholeskyResult:
    pivots: np.ndarray  # (r,) int64, indices into the negatives, pivot order
    pivot_rows: np.ndarray  # (r, d) float64
    pivot_factor: np.ndarray  # (r, r) lower triangular L = F(I, :)
    stats: ScatterStats  # of the rows of F: count n, mean mu (r,), centred scatter
    trace: float  # trace of K
    residual_trace: float  # trace of K - F F^T
    rounds: int  # passes over the blocks (initial pass included)
    factor: np.ndarray | None = None  # (n, r), with gather=True
    rows: np.ndarray | None = None  # (n, d) float64, with gather=True


# -- block tasks ------------------------------------------------------------
def _init_block(x, offset: int, cfg: CholeskyConfig, count: int, key: tuple, name: str):
    x = np.asarray(x)
    check_finite_rows(x, name, row_offset=offset)
    check_histogram(x, cfg.kernel, name, row_offset=offset)
    # Rows stay in the input precision for all the rounds (float32: half the memory);
    # the kernel functions compute in float64 (exact for float32 values). Rows already
    # in that form are kept as they are, not copied: no round writes them (a numpy
    # input's blocks are views of the caller's array, which held twice in memory
    # during the fit before).
    x = np.ascontiguousarray(x, dtype=np.float32 if x.dtype == np.float32 else np.float64)
    kdiag = kernel_diagonal(x, cfg.kernel, cfg.gamma, cfg.degree)
    block = _Block(x, offset, kdiag, np.empty((x.shape[0], 0)), 0)
    summary = _summarize(
        block,
        cfg,
        count,
        key,
        False,
        trace=float(kdiag.sum()),
        max_diag=float(kdiag.max(initial=0.0)),
    )
    return block, summary


#: Rows of a block whose new columns are computed at once (kernel, product with the old
#: columns, triangular solve, residual diagonal): their float64 temporaries (a few
#: STEP_ROWS x s arrays, 2 MiB each at s = 128) stay in the CPU caches and in the
#: allocator's heap, where whole-block ones (64 MiB at 65,536 rows) went to memory and
#: came back from the kernel as fresh pages at every pass. Every row's values are
#: computed by the same operations in the same order as on the whole block.
STEP_ROWS = 2048


def _capacity(rows: int, needed: int, have: int, rank: int) -> int:
    """Columns of a block's factor buffer when it must grow to ``needed``: the rank
    at once while rank x rows float64 is modest (no copy of the buffer later, and no
    old and new buffer side by side), else by doubling, never past the rank."""
    if rank and rank * rows * 8 <= 2**31:
        return max(needed, rank)
    cap = max(needed, 2 * have, 16)
    return min(cap, max(rank, needed)) if rank else cap


def _step_block(
    block: _Block, acc: _Accepted | None, cfg: CholeskyConfig, count: int, key: tuple, final: bool
):
    if acc is not None and acc.rows.shape[0]:
        s = acc.rows.shape[0]
        t = block.t
        buf = block.buf
        if buf.shape[1] < t + s:  # grow; the old state keeps the old buffer
            grown = np.empty((buf.shape[0], _capacity(buf.shape[0], t + s, buf.shape[1], cfg.rank)))
            grown[:, :t] = buf[:, :t]
            buf = grown
        diag = np.empty_like(block.diag)
        for i in range(0, block.x.shape[0], STEP_ROWS):
            rows = slice(i, i + STEP_ROWS)
            k_cols = kernel_matrix(block.x[rows], acc.rows, cfg.kernel, cfg.gamma, cfg.degree)
            cols = new_columns(k_cols, buf[rows, :t], acc.f_rows, acc.chol)
            # only the columns of this round: see the module docstring
            buf[rows, t : t + s] = cols
            diag[rows] = update_residual_diagonal(block.diag[rows], cols)
        block = replace(block, diag=diag, buf=buf, t=t + s)
    return block, _summarize(block, cfg, count, key, final)


# -- the two backends ------------------------------------------------------------
class _NumpyRounds:
    def __init__(self, blocks: list[tuple[np.ndarray, int]], name: str):
        self.blocks, self.name = blocks, name

    def start(self, cfg, count):
        outs = in_threads(
            _init_block,
            [(x, off, cfg, count, (0, 0, j), self.name) for j, (x, off) in enumerate(self.blocks)],
        )
        self.states = [o[0] for o in outs]
        return _tree([o[1] for o in outs], _merge_summaries, cfg, count, 0)

    def step(self, acc, cfg, count, round_no, final):
        outs = in_threads(
            _step_block,
            [(s, acc, cfg, count, (round_no, 0, j), final) for j, s in enumerate(self.states)],
        )
        self.states = [o[0] for o in outs]
        return _tree([o[1] for o in outs], _merge_summaries, cfg, count, round_no)


class _DaskRounds:
    def __init__(self, x, name: str):
        self.x, self.name = x, name

    def _run(self, outs, cfg, count, round_no):
        import dask

        states = [o[0] for o in outs]
        summary = _tree(
            [o[1] for o in outs], _merge_summaries, cfg, count, round_no, delayed=dask.delayed
        )
        *states, summary = dask.persist(*states, summary)
        self.states = states
        return summary.compute()

    def start(self, cfg, count):
        import dask

        from .blocks import blas_task

        init = dask.delayed(blas_task, pure=False, nout=2)
        outs = [
            init(_init_block, b, off, cfg, count, (0, 0, j), self.name)
            for j, (b, off) in enumerate(row_blocks(self.x, 0))
        ]
        return self._run(outs, cfg, count, 0)

    def step(self, acc, cfg, count, round_no, final):
        import dask

        from .blocks import blas_task

        shared_acc = dask.delayed(acc, traverse=False)
        step = dask.delayed(blas_task, pure=False, nout=2)
        outs = [
            step(_step_block, s, shared_acc, cfg, count, (round_no, 0, j), final)
            for j, s in enumerate(self.states)
        ]
        return self._run(outs, cfg, count, round_no)


# -- the driver ---------------------------------------------------------------------
def _candidates(cfg: CholeskyConfig, t: int) -> int:
    return 1 if cfg.pivoting == "greedy" else max(1, min(RP_CANDIDATES, cfg.rank - t))


def _zero_kernel_detail(cfg: CholeskyConfig, floor: float) -> str:
    """What a kernel matrix without a single usable pivot says after "X has"."""
    what = f"a zero kernel matrix (every k(x, x) <= {floor:g}), nothing to factor: "
    if cfg.kernel == "poly":  # (c + sqrt(g) x.y)^p - c^p, c = 1 / (2 sqrt(g)): cancels
        return what + (
            f"the poly kernel with gamma {cfg.gamma:g} is zero in float64 "
            f"(its constant 1 / (2 sqrt(gamma)) swamps every x.y); use a larger "
            f"gamma (--gamma), e.g. 1 for L2-normalized descriptors"
        )
    return what + (
        "every negative is the zero vector; check that the negatives store holds the descriptors"
    )


def _choose(summary: _Summary, cfg: CholeskyConfig, t: int, floor: float, round_no: int):
    """The pivots of the next round from the merged proposal (on the caller)."""
    prop = summary.proposal
    if prop is None:
        return None
    if cfg.pivoting == "greedy":
        value, index, row, f_row = prop
        rows, f_rows = row[None, :], f_row[None, :]
        indices, sampled, uniforms = np.array([index]), np.array([value]), np.zeros(1)
    else:
        rows, f_rows = prop["rows"], prop["f_rows"]
        indices, sampled = prop["index"], prop["diag"]
        uniforms = np.random.default_rng([cfg.seed, round_no, 2]).random(len(indices))
    # Residual block of the candidates: K(i, i) - sum_m F(i, m)^2 (docs/math.md#icd).
    # Small products (at most RP_CANDIDATES rows), on one BLAS thread: the caller's
    # idle BLAS threads would otherwise spin on the cores the next pass runs on.
    with factorization_threads(len(rows)):
        h = kernel_matrix(rows, rows, cfg.kernel, cfg.gamma, cfg.degree) - f_rows @ f_rows.T
        acc, chol = accept_candidates(h, sampled, uniforms, floor, cfg.rank - t)
    return indices[acc], _Accepted(rows[acc], f_rows[acc], chol)


def incomplete_cholesky(
    x,
    cfg: CholeskyConfig,
    block_rows: int = 4096,
    name: str = "X",
    on_round=None,
    streaming: bool = False,
    checkpoint=None,
) -> CholeskyResult:
    """Pivoted incomplete Cholesky factor of K(x, x), never forming the n x n matrix.

    ``x``: numpy array (split into blocks of ``block_rows`` rows and run
    in-process) or dask array (one block per row chunk, run on the current
    dask scheduler). Stops when ``cfg.rank`` pivots are taken, when the
    residual trace is <= ``cfg.tol`` times the trace, or when no remaining
    row has a residual above BREAKDOWN x max K(i, i) (rpcholesky: or after
    MAX_EMPTY_ROUNDS rounds in a row in which every candidate was rejected).
    ``on_round(pass_no, n_pivots, residual_trace / trace)``, if given, is called
    after every pass over the data (progress reports), the first one (the
    diagonal) included: the last ``pass_no`` is the result's ``rounds``.
    ``streaming``: keep nothing per row between passes; every pass reads the
    rows again and recomputes their rows of F from the pivots
    (:mod:`slem_dask.parallel.kernel_stream`): same pivots and statistics, worker
    memory independent of n, O(n t d + n t^2) per pass with t pivots.
    ``checkpoint`` (streaming only): a :class:`kernel_checkpoint.FinalPassCheckpoint`;
    the final pass writes each partition's statistics there and reuses those that a
    killed run with the same pivots wrote.
    """
    rounds = _rounds_for(x, cfg, name, block_rows, streaming, checkpoint)
    summary = rounds.start(cfg, _candidates(cfg, 0))
    trace, max_diag = summary.trace, summary.max_diag

    def report(pass_no, n_pivots, summary):
        if on_round is not None:  # a zero trace is refused below, after the last pass
            on_round(pass_no, n_pivots, float(summary.residual) / trace if trace else 0.0)

    report(1, 0, summary)
    floor = BREAKDOWN * max_diag
    factor = _Pivoted(pivot_rows=np.empty((0, x.shape[1])))
    round_no, summary = _pivot_rounds(rounds, cfg, summary, trace, floor, factor, report)
    if factor.t == 0:
        raise RowsError(name, _zero_kernel_detail(cfg, floor))
    result = CholeskyResult(
        pivots=np.concatenate(factor.pivots).astype(np.int64),
        pivot_rows=factor.pivot_rows,
        pivot_factor=factor.lower,
        stats=summary.stats,
        trace=float(trace),
        residual_trace=float(summary.residual),
        rounds=round_no + 1,
    )
    if cfg.gather:
        parts = sorted(summary.gathered, key=lambda g: g[0])
        result.factor = np.concatenate([g[1] for g in parts])
        result.rows = np.concatenate([g[2] for g in parts]).astype(np.float64, copy=False)
    return result


def _rounds_for(x, cfg: CholeskyConfig, name: str, block_rows: int, streaming: bool, checkpoint):
    """The backend that runs the passes: streaming, dask (in memory) or numpy."""
    if streaming:
        if cfg.gather:
            raise ValueError(
                "streaming=True cannot gather F and the rows (gather=True, KernelSLEM's "
                "exact=True keeps all n rows in the model): use the in-memory path"
            )
        return StreamingRounds(x, name, block_rows, checkpoint)
    if is_dask_array(x):
        return _DaskRounds(x, name)
    return _NumpyRounds(row_blocks(x, block_rows), name)


@dataclass
class _Pivoted:
    """The pivots taken so far: their indices (per round), rows, the lower factor of
    their kernel block, and their number ``t``."""

    pivot_rows: np.ndarray
    pivots: list = field(default_factory=list)
    lower: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    t: int = 0


def _pivot_rounds(
    rounds, cfg: CholeskyConfig, summary, trace: float, floor: float, factor: _Pivoted, report
):
    """Pass after pass, pivots chosen from the last pass's summary and added to
    ``factor``, until a stopping rule holds; then the final pass for the statistics of
    F. Returns (the last round's number, the final summary)."""
    round_no, empty = 0, 0
    while True:
        round_no += 1
        t = factor.t
        stop = (
            t >= cfg.rank
            or summary.max_residual <= floor
            or summary.residual <= cfg.tol * trace
            or empty >= MAX_EMPTY_ROUNDS
        )
        chosen = None if stop else _choose(summary, cfg, t, floor, round_no)
        if chosen is None:
            # Nothing left to add: one more pass for the statistics of F.
            summary = rounds.step(None, cfg, 1, round_no, final=True)
            report(round_no + 1, t, summary)
            return round_no, summary
        idx, acc = chosen
        empty = 0 if len(idx) else empty + 1
        if len(idx):
            factor.pivots.append(idx)
            factor.pivot_rows = np.vstack([factor.pivot_rows, acc.rows])
            factor.lower = _grow_lower(factor.lower, acc)
            factor.t += len(idx)
        final = factor.t >= cfg.rank
        summary = rounds.step(
            acc if len(idx) else None, cfg, _candidates(cfg, factor.t), round_no, final
        )
        report(round_no + 1, factor.t, summary)
        if final:
            return round_no, summary
