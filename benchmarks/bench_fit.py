#!/usr/bin/env python
"""Fit time: slem-dask vs the numpy pipeline and naive Dask, without a Client and on a LocalCluster.

All contenders read the same zarr store of n x d float32 negatives, in the same
run. Each scheduler has its own phase, in which its contenders alternate (a change
in machine load hits them all) and outside of which its cluster does not exist (an
idle LocalCluster uses about a tenth of a core, and runs its scheduler in this very
process, beside a threaded contender); the numpy contender takes its turn in every
phase, so that each phase's numpy / slem-dask ratio pairs runs made side by side:

* slem-dask: ``pipeline.fit_job(client, store, model, lam)`` (open, statistics,
  Cholesky + save of the model); ``client=None`` for the threaded scheduler (what
  a notebook user gets without a Client). ``--api estimator`` times
  ``LinearSLEM(lam).fit(storage.dask_rows(arr))`` (+ save) instead.
* naive Dask: ``A = da.from_zarr(arr, chunks=(partition rows, d))``;
  ``dask.compute(A.mean(axis=0, dtype=float64), A.T @ A)`` on the same scheduler;
  on a cluster, twice: on the LocalCluster a user writes by hand (``LocalCluster(
  n_workers, threads_per_worker)``, distributed's defaults: "naive Dask [cluster]", the
  reference of the goal) and on slem-dask's own cluster, whose workers carry
  slem-dask's settings (allocator thresholds, one BLAS thread): "naive Dask
  [cluster, slem-dask's workers]", which shows how much of the difference those
  settings make.
* floor (``--floor``): the least work any float32 fit of the store must do, on
  the same scheduler: per partition, slem-dask's reader (``storage.read_rows``,
  the fastest here) and one float32 ``X.T @ X``, nothing else (no mean, no
  merge, no partial sent anywhere, no model). ``RATIO naive_time / floor_time``
  is then the most any implementation could gain over naive Dask on this
  machine and BLAS. Beside it, the physical floor (``_physical.physical_floor``):
  the CPU seconds of decoding every chunk and of ``X.T @ X`` at the BLAS's measured
  single-thread rate (one partition), over the cores; ``RATIO physical_floor /
  slem_time`` (above 1.0: the floor is wrong). Every timed contender starts from the
  same state (``_physical.same_start``).
* numpy pipeline: ``X = arr[...]`` then ``X.T @ X`` in float32 (numpy's BLAS on
  every core) and ``X.mean(axis=0, dtype=float64)``.

``--schedulers threads,cluster`` (default both): "threads" runs the dask
contenders on dask's threaded scheduler (no Client), "cluster" on a
LocalCluster from ``slem_dask.cluster.connect.connect()`` (one single-threaded worker
process per core; started and warmed up, by one untimed run of each contender,
before the timed runs; start-up not counted). Printed: every run with the load
average, best/median/worst, and ``RATIO numpy/slem`` and ``RATIO naive/slem`` per
scheduler (>= 1.0: slem-dask is no slower). ``--profile`` first times, in this process with one BLAS thread,
the steps of one partition (zarr read + decode, the float32 statistics, the
float64 statistics, one merge) and multiplies them by the number of partitions.

Sanity check (not timed): the covariance of the fitted model and the float32
numpy covariance X^T X / n - mu mu^T are compared with a float64 two-pass
covariance of ALL n rows, max absolute differences printed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
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
        gram = x.T @ x  # float32, (d, d)
        mean = x.mean(axis=0, dtype=np.float64)
    return (
        {
            "read": t_read.seconds,
            "compute": t_comp.seconds,
            "total": t_read.seconds + t_comp.seconds,
        },
        mean,
        gram,
        x,
    )


def float64_covariance(x: np.ndarray, block: int = 65536):
    """Two-pass float64 mean and population covariance of the rows of ``x``."""
    mean = np.zeros(x.shape[1])
    for i in range(0, len(x), block):
        mean += x[i : i + block].sum(axis=0, dtype=np.float64)
    mean /= len(x)
    scatter = np.zeros((x.shape[1], x.shape[1]))
    for i in range(0, len(x), block):
        c = x[i : i + block].astype(np.float64) - mean
        scatter += c.T @ c
    return mean, scatter / len(x)


def naive_dask(path: str, rows: int) -> dict:
    """What a user writes by hand with dask: mean and X^T X of a from_zarr array."""
    import dask
    import dask.array as da
    import zarr

    with C.Timer() as t:
        a = da.from_zarr(zarr.open_array(store=path, mode="r"), chunks=(rows, None))
        dask.compute(a.mean(axis=0, dtype=np.float64), a.T @ a)
    return {"total": t.seconds}


def profile_partition(path: str, rows: int, n_parts: int, repeat: int = 3) -> None:
    """Per-partition costs in this process with one BLAS thread (like one worker)."""
    import time

    import zarr
    from threadpoolctl import threadpool_limits

    from slem_dask.core.statistics import block_statistics, merge_statistics

    arr = zarr.open_array(store=path, mode="r")

    def best(f):
        out, ts = None, []
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = f()
            ts.append(time.perf_counter() - t0)
        return min(ts), out

    from slem_dask.storage import read_rows

    with threadpool_limits(1, user_api="blas"):
        t_read, block = best(lambda: arr[:rows])
        t_own, _ = best(lambda: read_rows(arr, 0, rows))
        t32, s32 = best(lambda: block_statistics(block))
        t64, s64 = best(lambda: block_statistics(block, "float64"))
        t_merge, _ = best(lambda: merge_statistics(s32, s64))
        t_mm, _ = best(lambda: block.T @ block)
    print(
        f"profile: one partition of {rows:,} rows, one core, best of {repeat}; x {n_parts} "
        f"partitions = core-seconds for the whole fit"
    )
    for name, t in (
        ("zarr read + zstd decode (arr[:rows])", t_read),
        ("slem-dask's reader (storage.read_rows)", t_own),
        ("block statistics, float32 (precision='auto')", t32),
        ("  of which the bare float32 X^T X", t_mm),
        ("block statistics, float64 (precision='float64')", t64),
        ("one Chan merge of two d x d partials", t_merge),
    ):
        print(f"  {name:<50} {t * 1e3:8.1f} ms   x{n_parts}: {t * n_parts:6.2f} core-s")
    print()


def slem_run(client, args, path: str, model_path: str) -> dict:
    from slem_dask import storage
    from slem_dask.models import LinearSLEM
    from slem_dask.pipeline import fit_job

    if args.api == "job":
        report = fit_job(
            client,
            path,
            model_path,
            lam=args.lam,
            partition_rows=args.partition_rows,
            overwrite=True,
            precision=args.precision,
        )
        return dict(report.timings), report.facts
    with C.Timer() as t:
        arr = storage.open_input(path, "negatives")
        x = storage.dask_rows(arr, args.partition_rows)
        model = LinearSLEM(lam=args.lam, precision=args.precision).fit(x)
        model.save(model_path, overwrite=True)
    return {"total": t.seconds}, {"partitions": x.numblocks[0]}


def main(argv=None) -> int:  # noqa: C901 - a driver: options, then each contender in turn
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    C.add_common_args(parser)
    C.add_run_args(parser)
    C.add_band_arg(
        parser,
        0.15,
        "rounds alternate the contenders; at --quick sizes a "
        "contender takes a few tenths of a second, which load moves by 10%%",
    )
    parser.add_argument(
        "--api",
        choices=("job", "estimator"),
        default="job",
        help="time pipeline.fit_job (default) or LinearSLEM().fit on dask_rows",
    )
    C.add_scheduler_args(parser)
    parser.add_argument(
        "--precision",
        choices=("auto", "float64"),
        default="auto",
        help="slem-dask's precision parameter (default auto)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time the floor, a lower bound on any fit's time: per "
        "partition, the read and one float32 X^T X, nothing else; prints "
        "floor/slem and naive/floor (the most any fit could gain over "
        "naive Dask here)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="time the steps of one partition first"
    )
    parser.add_argument("--no-check", action="store_true", help="skip the float64 covariance check")
    args = parser.parse_args(argv)
    C.resolve_sizes(args)
    schedulers = C.chosen_schedulers(parser, args)

    from slem_dask import storage
    from slem_dask.models import load_model

    C.header(f"bench_fit: n={args.n:,} d={args.d} float32", args)
    print("uptime: " + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    path = C.ensure_store(args.workdir, args.n, args.d, args.seed, args.chunk_rows)
    print(f"data: {C.describe_store(path)}")
    model_path = os.path.join(args.workdir, f"bench-fit-model-n{args.n}-d{args.d}.zarr")
    arr = storage.open_input(path, "negatives")
    x = storage.dask_rows(arr, args.partition_rows)
    rows = x.chunks[0][0]
    print(
        f"partitions: {x.numblocks[0]} of {rows:,} rows ({rows * args.d * 4 / 2**20:.0f} MiB "
        f"float32); slem precision={args.precision!r}"
    )
    if args.profile:
        profile_partition(path, rows, x.numblocks[0])

    slem = {s: [] for s in schedulers}
    numpy_runs = {s: [] for s in schedulers}  # numpy runs in every phase: paired ratios
    # where each naive Dask contender runs, by the label its results are printed under
    naive_on = {
        "threads": "threads",
        "cluster": "plain-cluster",
        "cluster, slem-dask's workers": "cluster",
    }
    naive_labels = {
        s: [lb for lb in naive_on if lb == s or lb.startswith(s + ",")] for s in schedulers
    }
    naive = {lb: [] for s in schedulers for lb in naive_labels[s]}
    floor = {s: [] for s in schedulers}
    print(
        f"slem contender: {'pipeline.fit_job' if args.api == 'job' else 'LinearSLEM().fit(dask_rows)'}"
    )
    print(
        "naive Dask contender: dask.compute(A.mean(0, dtype=float64), A.T @ A), "
        "A = da.from_zarr(store, chunks=(partition rows, d))"
    )
    print("numpy contender: X = zarr_array[...]; X.T @ X (float32); X.mean(axis=0, dtype=float64)")
    if args.floor:
        print(
            "floor: per partition, storage.read_rows + one float32 X.T @ X and nothing "
            "else: a lower bound on any float32 fit's time on this scheduler"
        )
    print(
        "one phase per scheduler: its cluster lives only during its own phase (an idle "
        "LocalCluster costs about a tenth of a core and runs its scheduler in this process)"
    )
    x_last = gram = mean32 = None
    # the physical floor: decode of every chunk + X^T X at the measured BLAS rate per core
    phys = (
        C.physical_floor(
            x, lambda b: b.T @ b, 0, args.workdir, flops_per_row=float(args.d) ** 2, arr=arr
        )
        if args.floor
        else None
    )
    for sched in schedulers:
        print()
        with C.scheduler_contexts(args, [sched], plain_cluster=not args.no_naive) as (
            clients,
            contexts,
        ):
            with C.Timer() as t:  # one untimed run of each contender: imports, first reads
                with contexts[sched]():
                    slem_run(clients[sched], args, path, model_path)
                    if args.floor:
                        C.fit_floor(x)
                if not args.no_naive:
                    for label in naive_labels[sched]:
                        with contexts[naive_on[label]]():
                            naive_dask(path, rows)
                numpy_reference(path)  # numpy is warmed up alike
            print(f"warm-up on {sched} (not counted): {t.seconds:.3f} s")
            # every contender starts alike (no dirty pages, the store cached, garbage
            # collected, no spinning BLAS threads): see _physical.same_start
            state = {"outputs": [model_path], "inputs": [path], "client": clients[sched]}
            for r in range(args.repeat):
                C.settle(**state)
                with contexts[sched]():
                    timings, facts = slem_run(clients[sched], args, path, model_path)
                slem[sched].append(timings)
                extra = ", ".join(f"{k} {v:.3f}" for k, v in timings.items() if k != "total")
                print(
                    f"run {r + 1}: slem-dask [{sched}] {timings['total']:.3f} s"
                    f"{f' ({extra})' if extra else ''} | {C.load_line()}"
                )
                if not args.no_naive:
                    for label in naive_labels[sched]:
                        C.settle(**state)
                        with contexts[naive_on[label]]():
                            nv = naive_dask(path, rows)
                        naive[label].append(nv)
                        print(
                            f"run {r + 1}: naive Dask [{label}] {nv['total']:.3f} s | "
                            f"{C.load_line()}"
                        )
                if args.floor:
                    C.settle(**state)
                    with contexts[sched]():
                        fl = C.fit_floor(x)
                    floor[sched].append(fl)
                    print(f"run {r + 1}: floor [{sched}] {fl['total']:.3f} s | {C.load_line()}")
                # numpy takes its turn in every phase's rounds, so that each phase's
                # numpy / slem-dask ratio compares runs made under the same conditions
                x_last = gram = None
                C.settle(**state)
                nt, mean32, gram, x_last = numpy_reference(path)
                numpy_runs[sched].append(nt)
                print(
                    f"run {r + 1}: numpy [{sched}] {nt['total']:.3f} s (read {nt['read']:.3f}, "
                    f"compute {nt['compute']:.3f}) | {C.load_line()}"
                )
                sys.stdout.flush()
        if args.floor:  # measured again after each phase, each part the least of all
            phys = C.physical_floor(
                x,
                lambda b: b.T @ b,
                0,
                args.workdir,
                flops_per_row=float(args.d) ** 2,
                previous=phys,
                arr=arr,
            )

    med = C.statistics.median
    print()
    all_numpy = [t["total"] for sched in schedulers for t in numpy_runs[sched]]
    result = {
        "n": args.n,
        "d": args.d,
        "precision": args.precision,
        "numpy_best": min(all_numpy),
        "numpy_runs": all_numpy,
    }
    for sched in schedulers:
        np_totals = [t["total"] for t in numpy_runs[sched]]
        print(f"[{sched}] numpy read+compute  : {C.spread(np_totals)}: {C.runs_line(np_totals)}")
        print(f"[{sched}]   of which read     : {C.spread(t['read'] for t in numpy_runs[sched])}")
        print(
            f"[{sched}]   of which compute  : {C.spread(t['compute'] for t in numpy_runs[sched])}"
        )
        totals = [t["total"] for t in slem[sched]]
        print(f"[{sched}] slem-dask fit total : {C.spread(totals)}: {C.runs_line(totals)}")
        if "statistics" in slem[sched][0]:
            print(
                f"[{sched}]   of which statistics: {C.spread(t['statistics'] for t in slem[sched])}"
            )
        result[f"{sched}_slem_runs"] = totals
        no_slower = ">= 1.0: slem-dask no slower"
        C.ratio_summary(result, "fit", sched, "numpy", np_totals, totals, args, goal=no_slower)
        for label in naive_labels[sched] if not args.no_naive else ():
            nts = [t["total"] for t in naive[label]]
            goal = "goal >= 1.3" if label == sched else "for comparison"
            print(f"[{label}] naive Dask total    : {C.spread(nts)}: {C.runs_line(nts)}")
            key = label.replace(", slem-dask's workers", "_slem_workers")
            result[f"{key}_naive_runs"] = nts
            C.ratio_summary(result, "fit", label, "naive", nts, totals, args, key=key, goal=goal)
        if args.floor:
            fts = [t["total"] for t in floor[sched]]
            C.floor_summary(result, "fit", sched, "floor (read + X^T X) ", fts, totals, args)
            C.physical_summary(result, "fit", sched, phys, totals, fts)
            if not args.no_naive:
                nts = [t["total"] for t in naive[sched]]
                print(
                    f"[{sched}] RATIO naive_time / floor_time = {min(nts) / min(fts):.3f} "
                    f"(best); {med(nts) / med(fts):.3f} (medians)  [the most any fit could "
                    f"gain over naive Dask here]"
                )
    print("uptime: " + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
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
        print(
            f"check vs float64 two-pass covariance of all {n:,} rows ({t.seconds:.1f} s, "
            f"max |cov| = {scale:.3e}):"
        )
        print(
            f"  slem-dask covariance_       max abs diff {d_slem:.3e} (relative {d_slem / scale:.1e}); "
            f"mean_ max abs diff {np.abs(model.mean_ - mean64).max():.3e}"
        )
        print(
            f"  numpy float32 X^T X/n-mu mu^T max abs diff {d_np:.3e} (relative {d_np / scale:.1e})"
        )
        result.update({"cov_maxdiff_slem": float(d_slem), "cov_maxdiff_numpy32": float(d_np)})
    C.emit_json("RESULT bench_fit", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
