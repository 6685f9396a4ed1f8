#!/usr/bin/env python
"""Pivoting rules of the kernel SLEM factor: trace error and passes over the data.

Data: clustered rows with outliers (the case that separates the rules): a few
large Gaussian clusters, a few small ones, and a handful of far outliers, in
d dimensions; rbf kernel. For each rank r, printed:

* trace_error = tr(K - F F^T) / tr(K) of
  - greedy pivoting (``KernelSLEM(pivoting="greedy")``, the max residual
    diagonal rule, docs/math.md#icd),
  - randomly pivoted Cholesky (``pivoting="rpcholesky"``, accelerated block
    form), mean and max over ``--seeds`` seeds,
  - uniform Nystrom: r pivots drawn uniformly without replacement,
    tr(K - K(:, I) K(I, I)^+ K(I, :)) (computed here, in blocks), mean over seeds;
* passes over the negatives during the fit (= dask rounds = scheduler round
  trips): greedy needs one per pivot, rpcholesky one per block of accepted
  candidates;
* fit times (numpy path, this process).

Greedy spends its first pivots on the outliers (each has the largest residual
until it is picked) and then on the big clusters; uniform sampling rarely hits
the small clusters. Runs in well under a minute with the defaults.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from slem_dask import KernelSLEM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from slem_dask.core.kernels import kernel_diagonal, kernel_matrix

#: Fits shorter than this (seconds) vary by more than the band from run to run on a
#: quiet machine (rank 25: 1.9 then 2.4), so their times are in the table but get no BAND line.
SHORTEST_BANDED_FIT = 0.05


def clustered_with_outliers(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n_out, big, small, small_size = 40, 5, 40, 20
    sizes = np.r_[np.full(big, (n - n_out - small * small_size) // big), np.full(small, small_size)]
    sizes[0] += n - n_out - sizes.sum()
    centres = rng.standard_normal((big + small, d)) * 4.0
    rows = [c + 0.3 * rng.standard_normal((s, d)) for c, s in zip(centres, sizes, strict=True)]
    rows.append(rng.standard_normal((n_out, d)) * 15.0)
    x = np.vstack(rows)
    return x[rng.permutation(len(x))]


def uniform_nystrom_error(x, rank, gamma, seed, block=4096) -> float:
    rng = np.random.default_rng(seed)
    piv = rng.choice(len(x), size=rank, replace=False)
    k_ii = kernel_matrix(x[piv], x[piv], "rbf", gamma)
    s, u = np.linalg.eigh(k_ii)
    keep = s > 1e-12 * s.max()
    w = u[:, keep] / np.sqrt(s[keep])
    captured = 0.0
    for i in range(0, len(x), block):
        f = kernel_matrix(x[i : i + block], x[piv], "rbf", gamma) @ w
        captured += float(np.sum(f * f))
    trace = float(kernel_diagonal(x, "rbf", gamma).sum())
    return (trace - captured) / trace


def _timed_fit(args, rank: int, rule: str, seed: int):
    """(model, seconds) of one fit."""
    t = time.perf_counter()
    model = KernelSLEM(
        kernel="rbf", gamma=args.gamma, rank=rank, tol=0, pivoting=rule, random_state=seed
    ).fit(args.x)
    return model, time.perf_counter() - t


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--d", type=int, default=5)
    p.add_argument("--gamma", type=float, default=0.2)
    p.add_argument("--ranks", type=int, nargs="+", default=[25, 50, 100, 200])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument(
        "--repeat", type=int, default=5, help="rounds; each fits every seed with each rule"
    )
    C.add_band_arg(
        p,
        0.20,
        "--repeat rounds in this process, each the total time of --seeds fits of "
        "each rule (hundredths to tenths of a second per fit)",
    )
    args = p.parse_args(argv)

    x = args.x = clustered_with_outliers(args.n, args.d, 0)
    print(
        f"data: n={args.n} d={args.d}, 5 big clusters, 40 of 20 rows, 40 outliers; "
        f"rbf gamma={args.gamma}"
    )
    head = (
        f"{'rank':>5} {'greedy':>9} {'rpchol mean':>12} {'rpchol max':>11} "
        f"{'uniform':>9} {'passes greedy':>14} {'passes rpchol':>14} "
        f"{'fit greedy [s]':>15} {'fit rpchol [s]':>15}"
    )
    # one untimed fit of each rule: the first timed fit no longer pays the first calls
    for rule in ("greedy", "rpcholesky"):
        KernelSLEM(
            kernel="rbf",
            gamma=args.gamma,
            rank=min(args.ranks),
            tol=0,
            pivoting=rule,
            random_state=0,
        ).fit(x[:2000])
    print(head)
    print("-" * len(head))
    times = {}
    for r in args.ranks:
        rp, t_rp, t_gs = [], [], []
        # A round fits every seed once with each rule (greedy is deterministic, fitted as
        # often as rpcholesky): rounds repeat the same work, so their spread is noise.
        for _ in range(args.repeat):
            g_round, rp_round, rp = 0.0, 0.0, []
            for s in range(args.seeds):
                g, t = _timed_fit(args, r, "greedy", 0)
                g_round += t
                m, t = _timed_fit(args, r, "rpcholesky", s)
                rp_round += t
                rp.append(m)
            t_gs.append(g_round)
            t_rp.append(rp_round)
        uni = [uniform_nystrom_error(x, r, args.gamma, s) for s in range(args.seeds)]
        errs = [m.trace_error_ for m in rp]
        passes = np.mean([m.n_passes_ for m in rp])
        print(
            f"{r:>5} {g.trace_error_:>9.4f} {np.mean(errs):>12.4f} {np.max(errs):>11.4f} "
            f"{np.mean(uni):>9.4f} {g.n_passes_:>14d} {passes:>14.1f} "
            f"{min(t_gs) / args.seeds:>15.3f} {min(t_rp) / args.seeds:>15.3f}"
        )
        times[r] = (t_gs, t_rp)
    print("(fit times: the best round's mean over the --seeds seeds)")
    for r, (t_gs, t_rp) in times.items():
        C.band(  # per fit: a round's total over the seeds
            f"rank {r}: fit time greedy / rpcholesky",
            [t / args.seeds for t in t_gs],
            [t / args.seeds for t in t_rp],
            args.band,
            names=("greedy", "rpcholesky"),
            shortest=SHORTEST_BANDED_FIT,
        )


if __name__ == "__main__":
    main()
