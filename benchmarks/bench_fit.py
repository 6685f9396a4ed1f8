#!/usr/bin/env python
"""Fit time: slem-dask (``pipeline.fit_job`` on a LocalCluster) vs a numpy reference.

Both read the same zarr store of n x d float32 negatives:

* slem-dask: ``fit_job(client, store, model, lam)`` on a client from
  ``slem_dask.cluster.connect()`` (one single-threaded worker process per
  core). Timed: the whole job (open, distributed statistics, factor + save);
  the statistics part is printed too. The cluster is started once and warmed
  up (one partition) before the timed runs; its start-up is not timed.
  ``--api estimator`` times ``LinearSLEM(lam).fit(storage.dask_rows(arr))``
  on the same client instead.
* numpy: ``X = arr[...]`` (zarr reads the whole store into memory), then
  ``X.T @ X`` in float32 (numpy's multi-threaded BLAS, every core) and
  ``X.mean(axis=0, dtype=float64)``. Timed: read + compute.

The two contenders alternate (slem, numpy, slem, numpy ...) so that a change in
machine load hits both. Printed: every run, best/median/worst, and the ratio
numpy_time / slem_time (>= 1.0: slem-dask is no slower than numpy).

Sanity check (not timed): the covariance of the fitted model and the float32
numpy covariance X^T X / n - mu mu^T are compared with a float64 two-pass
covariance of ALL n rows ((X - mu)^T (X - mu) / n accumulated in float64
blocks), max absolute differences printed.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def numpy_reference(path: str):
    """(timings, mean, float32 X^T X, X) of the numpy contender."""
    import zarr

    arr = zarr.open_array(store=path, mode="r")
    with C.Timer() as t_read:
        x = arr[...]
    with C.Timer() as t_comp:
        gram = x.T @ x                                # float32, (d, d)
        mean = x.mean(axis=0, dtype=np.float64)
    return {"read": t_read.seconds, "compute": t_comp.seconds,
            "total": t_read.seconds + t_comp.seconds}, mean, gram, x


def float64_covariance(x: np.ndarray, block: int = 65536):
    """Two-pass float64 mean and population covariance of the rows of ``x``."""
    mean = np.zeros(x.shape[1])
    for i in range(0, len(x), block):
        mean += x[i:i + block].sum(axis=0, dtype=np.float64)
    mean /= len(x)
    scatter = np.zeros((x.shape[1], x.shape[1]))
    for i in range(0, len(x), block):
        c = x[i:i + block].astype(np.float64) - mean
        scatter += c.T @ c
    return mean, scatter / len(x)


def slem_run(client, args, path: str, model_path: str) -> dict:
    from slem_dask import storage
    from slem_dask.models import LinearSLEM
    from slem_dask.pipeline import fit_job

    if args.api == "job":
        report = fit_job(client, path, model_path, lam=args.lam,
                         partition_rows=args.partition_rows, overwrite=True)
        return dict(report.timings), report.facts
    with C.Timer() as t:
        arr = storage.open_input(path, "negatives")
        x = storage.dask_rows(arr, args.partition_rows)
        model = LinearSLEM(lam=args.lam).fit(x)
        model.save(model_path, overwrite=True)
    return {"total": t.seconds}, {"partitions": x.numblocks[0]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    C.add_common_args(parser)
    C.add_run_args(parser)
    parser.add_argument("--api", choices=("job", "estimator"), default="job",
                        help="time pipeline.fit_job (default) or LinearSLEM().fit on dask_rows")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the float64 covariance check")
    args = parser.parse_args(argv)
    C.resolve_sizes(args)

    from slem_dask import storage
    from slem_dask.cluster import connect
    from slem_dask.models import load_model
    from slem_dask.parallel import scatter_statistics

    C.header(f"bench_fit: n={args.n:,} d={args.d} float32", args)
    path = C.ensure_store(args.workdir, args.n, args.d, args.seed, args.chunk_rows)
    print(f"data: {C.describe_store(path)}")
    model_path = os.path.join(args.workdir, f"bench-fit-model-n{args.n}-d{args.d}.zarr")

    slem, numpy_runs = [], []
    with connect(n_workers=args.workers, threads_per_worker=args.threads, quiet=True) as client:
        nthreads = client.nthreads()
        arr = storage.open_input(path, "negatives")
        x = storage.dask_rows(arr, args.partition_rows)
        print(f"cluster: {len(nthreads)} worker process(es) x "
              f"{sorted(set(nthreads.values()))} thread(s); partitions: {x.numblocks[0]} of "
              f"{x.chunks[0][0]:,} rows ({x.chunks[0][0] * args.d * 4 / 2**20:.0f} MiB float32)")
        with C.Timer() as t:  # imports and first reads in the workers
            client.compute(scatter_statistics(x[: x.chunks[0][0]])).result()
        print(f"warm-up (one partition, not counted): {t.seconds:.3f} s")
        print(f"slem contender: {'pipeline.fit_job' if args.api == 'job' else 'LinearSLEM().fit(dask_rows)'}")
        print("numpy contender: X = zarr_array[...]; X.T @ X (float32); X.mean(axis=0, dtype=float64)")
        print()
        x_last = gram = mean32 = None
        for r in range(args.repeat):
            timings, facts = slem_run(client, args, path, model_path)
            slem.append(timings)
            extra = ", ".join(f"{k} {v:.3f}" for k, v in timings.items() if k != "total")
            print(f"run {r + 1}: slem-dask {timings['total']:.3f} s{f' ({extra})' if extra else ''} | "
                  f"{C.load_line()}")
            x_last = gram = None
            nt, mean32, gram, x_last = numpy_reference(path)
            numpy_runs.append(nt)
            print(f"run {r + 1}: numpy     {nt['total']:.3f} s (read {nt['read']:.3f}, "
                  f"compute {nt['compute']:.3f}) | {C.load_line()}")
            sys.stdout.flush()

    best_slem = min(t["total"] for t in slem)
    best_np = min(t["total"] for t in numpy_runs)
    med = C.statistics.median
    print()
    print(f"slem-dask fit total : {C.spread(t['total'] for t in slem)}  runs {C.runs_line(t['total'] for t in slem)}")
    if "statistics" in slem[0]:
        print(f"  of which statistics: {C.spread(t['statistics'] for t in slem)}")
    print(f"numpy read+compute  : {C.spread(t['total'] for t in numpy_runs)}  runs {C.runs_line(t['total'] for t in numpy_runs)}")
    print(f"  of which read     : {C.spread(t['read'] for t in numpy_runs)}")
    print(f"  of which compute  : {C.spread(t['compute'] for t in numpy_runs)}")
    ratio = best_np / best_slem
    ratio_med = med([t['total'] for t in numpy_runs]) / med([t['total'] for t in slem])
    print(f"RATIO numpy_time / slem_time = {ratio:.3f} (best of {args.repeat}); "
          f"{ratio_med:.3f} (medians)  [>= 1.0: slem-dask no slower]")

    result = {"n": args.n, "d": args.d, "slem_best": best_slem, "numpy_best": best_np,
              "ratio_best": ratio, "ratio_median": ratio_med,
              "slem_runs": [t["total"] for t in slem],
              "numpy_runs": [t["total"] for t in numpy_runs]}
    if not args.no_check:
        with C.Timer() as t:
            mean64, cov64 = float64_covariance(x_last)
        model = load_model(model_path)
        n = len(x_last)
        cov32 = gram.astype(np.float64) / n - np.outer(mean32, mean32)
        scale = np.abs(cov64).max()
        d_slem = np.abs(model.covariance_ - cov64).max()
        d_np = np.abs(cov32 - cov64).max()
        print()
        print(f"check vs float64 two-pass covariance of all {n:,} rows ({t.seconds:.1f} s, "
              f"max |cov| = {scale:.3e}):")
        print(f"  slem-dask covariance_       max abs diff {d_slem:.3e} (relative {d_slem / scale:.1e}); "
              f"mean_ max abs diff {np.abs(model.mean_ - mean64).max():.3e}")
        print(f"  numpy float32 X^T X/n-mu mu^T max abs diff {d_np:.3e} (relative {d_np / scale:.1e})")
        result.update({"cov_maxdiff_slem": float(d_slem), "cov_maxdiff_numpy32": float(d_np)})
    C.emit_json("RESULT bench_fit", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
