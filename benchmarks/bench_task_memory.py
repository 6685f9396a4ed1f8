#!/usr/bin/env python
"""Peak memory of one task of each job, per partition: the estimates of slem_dask.cluster.workers.

For each case, a fresh LocalCluster of one worker process (1 thread, no memory
limit, dask's default malloc settings) imports what the tasks import
(slem_dask.pipeline: what ``workers.check_memory`` counts as "in use"), resets
its peak resident set (VmHWM, through /proc/self/clear_refs) to its resident
set, and runs the job on an input of exactly one partition (one task, plus the
job's own overhead: the scattered model, the graph, zarr's buffers). The
growth of the peak is the need. Printed: the need in MiB and as a multiple of
the partition's bytes (rows x d x itemsize of the input). Linux only.

    python benchmarks/bench_task_memory.py --d 512 --rows 2000,20000,100000
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def _reset_peak(dask_worker=None) -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS becomes the current RSS
    return _status("VmRSS")


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _imported(dask_worker=None) -> int:
    # what workers.check_memory measures as "in use": a worker that imported the tasks'
    # modules (slem_dask.pipeline) and ran nothing yet
    import slem_dask.pipeline  # noqa: F401

    return _reset_peak()


def _peak(dask_worker=None) -> int:
    return _status("VmHWM")


def _array(path, rows, d, dtype, chunk, seed=0):
    import zarr

    if os.path.exists(path):
        return path
    arr = zarr.create_array(store=path, shape=(rows, d), dtype=dtype, chunks=(chunk, d))
    rng = np.random.default_rng(seed)
    for lo in range(0, rows, chunk):
        hi = min(rows, lo + chunk)
        arr[lo:hi] = rng.standard_normal((hi - lo, d)).astype(dtype)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--rows", default="20000,50000,100000")
    parser.add_argument("--chunk", type=int, default=10000)
    parser.add_argument("--ranks", default="256", help="pivots of the kernel models")
    C.add_band_arg(
        parser,
        0.10,
        "one fresh worker per measurement, its peak resident set "
        "read by the kernel (VmHWM); one measurement per case and run",
    )
    args = parser.parse_args()
    args.ranks = [int(r) for r in args.ranks.split(",")]
    from distributed import Client, LocalCluster

    from slem_dask import KernelSLEM, LinearSLEM
    from slem_dask.pipeline import encode_job, fit_job

    d, chunk = args.d, args.chunk
    tmp = tempfile.mkdtemp(prefix="bench-task-memory-")
    try:
        rng = np.random.default_rng(1)
        neg = rng.standard_normal((max(4 * max(args.ranks), 4 * d), d)).astype("float32")
        models = {}
        for precision in ("auto", "float64"):
            path = os.path.join(tmp, f"linear-{precision}.zarr")
            LinearSLEM(lam=1.0, precision=precision).fit(neg).save(path)
            models[f"linear {precision}"] = path
        for rank in args.ranks:
            path = os.path.join(tmp, f"kernel-{rank}.zarr")
            KernelSLEM(kernel="rbf", gamma=1 / d, rank=rank, pivoting="rpcholesky").fit(neg).save(
                path
            )
            models[f"kernel r={rank}"] = path
        # (name, model or fit precision, input dtype, output dtype)
        cases = [
            ("encode linear auto", "linear auto", "float32", None),
            ("encode linear float64", "linear float64", "float32", None),
            ("encode linear auto", "linear auto", "float32", "float64"),
            ("encode linear float64", "linear float64", "float64", None),
        ]
        cases += [(f"encode kernel r={r}", f"kernel r={r}", "float32", None) for r in args.ranks]
        cases += [
            (f"encode kernel r={args.ranks[0]}", f"kernel r={args.ranks[0]}", "float64", None)
        ]
        cases += [
            ("fit linear auto", "auto", "float32", None),
            ("fit linear float64", "float64", "float32", None),
            ("fit linear float64", "float64", "float64", None),
        ]
        print(f"d = {d}, chunks of {chunk} rows; a fresh worker per measurement")
        print(
            f"{'case (input->output bits)':<34} {'rows':>8} {'partition MiB':>14} "
            f"{'need MiB':>9} {'factor':>7} {'RSS before':>10}"
        )
        for name, what, dtype, out_dtype in cases:
            for rows in [int(float(r)) for r in args.rows.split(",")]:
                data = _array(
                    os.path.join(tmp, f"x-{rows}-{dtype}.zarr"), rows, d, dtype, min(chunk, rows)
                )
                out = os.path.join(tmp, "out.zarr")
                with (
                    LocalCluster(
                        n_workers=1,
                        threads_per_worker=1,
                        processes=True,
                        memory_limit=0,
                        dashboard_address=":0",
                    ) as cluster,
                    Client(cluster) as client,
                ):
                    before = list(client.run(_imported).values())[0]
                    if name.startswith("fit"):
                        fit_job(
                            client,
                            data,
                            os.path.join(tmp, "fitted.zarr"),
                            partition_rows=rows,
                            overwrite=True,
                            precision=what,
                        )
                    else:
                        encode_job(
                            client,
                            models[what],
                            data,
                            out,
                            partition_rows=rows,
                            overwrite=True,
                            dtype=out_dtype,
                        )
                    need = list(client.run(_peak).values())[0] - before
                part = rows * d * np.dtype(dtype).itemsize
                label = f"{name} {dtype[5:]}->{(out_dtype or dtype)[5:]}"
                print(
                    f"{label:<34} {rows:>8} {part / 2**20:>14.1f} {need / 2**20:>9.1f} "
                    f"{need / part:>7.2f} {before / 2**20:>10.0f}",
                    flush=True,
                )
                if rows == max(int(float(r)) for r in args.rows.split(",")):
                    C.band(
                        f"{label}, {rows} rows: need / partition bytes",
                        [need],
                        [part],
                        args.band,
                        names=("need", "partition bytes"),
                    )
    finally:  # the inputs, models and outputs written here
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
