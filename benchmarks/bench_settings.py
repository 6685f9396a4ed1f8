#!/usr/bin/env python
"""Dask settings vs speed: partition size x LocalCluster layout, for fit_job and encode_job.

One LocalCluster per layout (default: 2 processes x 1 thread, and 1 process x
2 threads) is started (``slem_dask.cluster.connect.connect``) and warmed up; all stay
up (idle) while ``--repeat`` rounds run; each round times fit_job and
encode_job once for every layout and partition size (default 8192, 32768,
131072 rows), so that a change of machine load spreads over all settings. Printed: every run, and
best / median / worst per setting. ``--floor`` also times, per layout and partition
size, the least work any fit must do (each partition's read and one float32
``X.T @ X``, nothing else: ``_floors.fit_floor``), whose 1-worker / 2-worker ratio
is the most a fit can scale on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def main(argv=None) -> int:  # noqa: C901 - a driver: options, then each layout in turn
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    C.add_common_args(parser, default_n=200_000)
    C.add_run_args(parser)
    C.add_band_arg(
        parser,
        0.20,
        "every setting's jobs run in each round, after one untimed "
        "fit and encode on every layout; jobs of tenths of a second to seconds",
    )
    parser.add_argument(
        "--partitions",
        default="8192,32768,131072",
        help="comma-separated partition_rows values (default 8192,32768,131072)",
    )
    parser.add_argument(
        "--layouts",
        default="2x1,1x2",
        help="comma-separated PROCESSESxTHREADS LocalCluster layouts (default 2x1,1x2)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time the floor, a lower bound on any fit's time: per "
        "partition, the read and one float32 X^T X, nothing else; its "
        "1-worker / 2-worker ratio is the most a fit can scale here",
    )
    args = parser.parse_args(argv)
    C.resolve_sizes(args)
    parts = [C.int_size(p) for p in args.partitions.split(",")]
    layouts = [tuple(int(v) for v in s.split("x")) for s in args.layouts.split(",")]

    import numpy as np

    from slem_dask import storage
    from slem_dask.cluster.connect import connect
    from slem_dask.pipeline import encode_job, fit_job

    C.header(f"bench_settings: n={args.n:,} d={args.d} float32", args)
    path = C.ensure_store(args.workdir, args.n, args.d, args.seed, args.chunk_rows)
    print(f"data: {C.describe_store(path)}")
    arr = storage.open_input(path, "negatives")
    model = os.path.join(args.workdir, f"bench-settings-model-n{args.n}-d{args.d}.zarr")
    out = os.path.join(args.workdir, f"bench-settings-out-n{args.n}-d{args.d}.zarr")
    results = {}
    # the rows of each partition size, for the floor
    floor_rows = {pr: storage.dask_rows(arr, storage.row_partition(arr, pr)) for pr in parts}
    with contextlib.ExitStack() as stack:
        clients = {}
        for procs, threads in layouts:  # all clusters up at once, idle ones cost no CPU
            client = stack.enter_context(
                connect(n_workers=procs, threads_per_worker=threads, quiet=True)
            )
            clients[(procs, threads)] = client
            print(f"cluster {procs} process(es) x {threads} thread(s): {client.nthreads()}")
            # warm-up: imports in every worker, not counted
            fit_job(client, path, model, lam=args.lam, partition_rows=parts[0], overwrite=True)
            encode_job(client, model, path, out, partition_rows=parts[0], overwrite=True)
            if args.floor:
                C.fit_floor(floor_rows[parts[0]], client)
        print()
        for r in range(args.repeat):
            for (procs, threads), client in clients.items():
                for pr in parts:
                    nparts = -(-args.n // storage.row_partition(arr, pr))
                    # no job pays for another's writeback or spinning BLAS threads
                    # (which cost the 2-worker layout most: it has no idle core)
                    C.settle()
                    f = fit_job(
                        client, path, model, lam=args.lam, partition_rows=pr, overwrite=True
                    ).timings["total"]
                    C.settle()
                    e = encode_job(
                        client, model, path, out, partition_rows=pr, overwrite=True
                    ).timings["total"]
                    C.settle()
                    key = (f"{procs}x{threads}", pr, nparts)
                    results.setdefault(key, {"fit": [], "encode": [], "floor": []})
                    results[key]["fit"].append(f)
                    results[key]["encode"].append(e)
                    floor = ""
                    if args.floor:
                        fl = C.fit_floor(floor_rows[pr], client)["total"]
                        results[key]["floor"].append(fl)
                        floor = f", floor {fl:.3f} s"
                    print(
                        f"round {r + 1} {procs}x{threads} partition_rows={pr:>6} "
                        f"({nparts:>3} partitions): fit {f:.3f} s, encode {e:.3f} s{floor} | "
                        f"{C.load_line()}"
                    )
                    sys.stdout.flush()
    print()
    jobs = ("fit", "encode") + (("floor",) if args.floor else ())
    print(
        f"{'layout':<7} {'rows/part':>9} {'parts':>5}  "
        + "".join(f"{job + ' best/median/worst [s]':<31}" for job in jobs)
    )
    for (layout, pr, nparts), v in results.items():
        print(
            f"{layout:<7} {pr:>9} {nparts:>5}  "
            + "".join(
                f"{min(v[job]):6.3f} {float(np.median(v[job])):6.3f} {max(v[job]):6.3f}           "
                for job in jobs
            )
        )
    # scaling: one worker process against two, same partitions, best of the rounds
    by = {(layout, pr): v for (layout, pr, _), v in results.items()}
    counts = {pr: nparts for (_, pr, nparts) in results}
    for pr in parts:
        one, two = by.get(("1x1", pr)), by.get(("2x1", pr))
        if one and two:
            if counts[pr] < 2:
                print(f"partition_rows={pr}: one partition, nothing for a second worker to do")
                continue
            for job in jobs:
                print(
                    f"RATIO {job} time 1 worker / 2 workers, partition_rows={pr}: "
                    f"{min(one[job]) / min(two[job]):.2f} (best), "
                    f"{float(np.median(one[job])) / float(np.median(two[job])):.2f} "
                    f"(medians)  [{'the most a fit can scale here' if job == 'floor' else 'goal >= 1.7'}]"
                )
    names = [f"{p}x{t}" for p, t in layouts]
    for pr in parts:
        for other in names[1:]:  # each layout against the first, same partitions
            a, b = by.get((other, pr)), by.get((names[0], pr))
            for job in ("fit", "encode") if a and b else ():
                C.band(
                    f"{job} time {other} / {names[0]}, partition_rows={pr}",
                    a[job],
                    b[job],
                    args.band,
                    names=(other, names[0]),
                )
        for name in names if args.floor else ():  # the floor bounds the fit on each layout
            C.band(
                f"floor / fit, {name}, partition_rows={pr}",
                by[(name, pr)]["floor"],
                by[(name, pr)]["fit"],
                args.band,
                names=("floor", "fit_job"),
                floor=True,
            )
    C.emit_json("RESULT bench_settings", {f"{k[0]}/{k[1]}": v for k, v in results.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
