#!/usr/bin/env python
"""Encode time: slem-dask (``pipeline.encode_job``) vs a numpy reference.

The positives are the same n x d float32 store as bench_fit (the negatives
store is encoded with a model fitted on itself; the data do not change the
cost). The model is fitted once with ``fit_job`` (not timed).

* slem-dask: ``encode_job(client, model, store, out)``: read the store,
  transform (float64: centre, one product with precision_, L2-normalize, cast
  to float32), write a float32 zarr output (zarr default codecs, one chunk per
  partition). Timed: the whole job (load model, create output, encode+write).
* numpy: ``X = arr[...]``; ``Z = (X - mean) @ precision`` with the model's
  mean_ and precision_ cast to ``--numpy-dtype`` (default float32, numpy's
  multi-threaded BLAS); rows divided by their norms; written with
  ``out[...] = Z`` to a zarr array with the same shape, dtype, chunking and
  (default) codecs as the slem-dask output. Timed: read + compute + write.

Contenders alternate; every run is printed, then best/median/worst and the
ratio numpy_time / slem_time (>= 1.0: slem-dask is no slower). Sanity check
(not timed): max abs difference between the two outputs, and of each vs a
float64 numpy encoding of the first ``--check-rows`` rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def numpy_reference(path: str, out_path: str, mean: np.ndarray, precision: np.ndarray,
                    chunk_rows: int, dtype) -> dict:
    import zarr

    arr = zarr.open_array(store=path, mode="r")
    m = mean.astype(dtype)
    p = precision.astype(dtype)
    with C.Timer() as t_read:
        x = arr[...]
    with C.Timer() as t_comp:
        z = (x.astype(dtype, copy=False) - m) @ p
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        z = z.astype(np.float32, copy=False)
    del x
    with C.Timer() as t_write:
        if os.path.exists(out_path):
            shutil.rmtree(out_path)
        out = zarr.create_array(store=out_path, shape=z.shape, dtype="float32",
                                chunks=(chunk_rows, z.shape[1]))
        out[...] = z
    return {"read": t_read.seconds, "compute": t_comp.seconds, "write": t_write.seconds,
            "total": t_read.seconds + t_comp.seconds + t_write.seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    C.add_common_args(parser)
    C.add_run_args(parser)
    parser.add_argument("--numpy-dtype", choices=("float32", "float64"), default="float32",
                        help="arithmetic of the numpy reference (default float32)")
    parser.add_argument("--check-rows", type=C.int_size, default=20000,
                        help="rows compared with a float64 encoding (default 2e4)")
    args = parser.parse_args(argv)
    C.resolve_sizes(args)

    import zarr

    from slem_dask import storage
    from slem_dask.cluster import connect
    from slem_dask.core.linear import encode_rows
    from slem_dask.models import load_model
    from slem_dask.pipeline import encode_job, fit_job

    C.header(f"bench_encode: n={args.n:,} d={args.d} float32", args)
    path = C.ensure_store(args.workdir, args.n, args.d, args.seed, args.chunk_rows)
    print(f"data: {C.describe_store(path)}")
    tag = f"n{args.n}-d{args.d}"
    model_path = os.path.join(args.workdir, f"bench-encode-model-{tag}.zarr")
    out_slem = os.path.join(args.workdir, f"bench-encode-slem-{tag}.zarr")
    out_np = os.path.join(args.workdir, f"bench-encode-numpy-{tag}.zarr")

    slem, numpy_runs = [], []
    with connect(n_workers=args.workers, threads_per_worker=args.threads, quiet=True) as client:
        nthreads = client.nthreads()
        with C.Timer() as t:
            fit_job(client, path, model_path, lam=args.lam, overwrite=True)
        model = load_model(model_path)
        arr = storage.open_input(path, "positives")
        x = storage.dask_rows(arr, args.partition_rows)
        rows = x.chunks[0][0]
        print(f"cluster: {len(nthreads)} worker process(es) x {sorted(set(nthreads.values()))} "
              f"thread(s); partitions: {x.numblocks[0]} of {rows:,} rows")
        print(f"model: fitted with fit_job in {t.seconds:.2f} s (not counted)")
        with C.Timer() as t:  # warm-up: imports in the workers, one partition
            client.compute(model.transform(x[:rows], dtype=np.float32)).result()
        print(f"warm-up (one partition, not counted): {t.seconds:.3f} s")
        print("slem contender: pipeline.encode_job (float64 arithmetic, float32 output)")
        print(f"numpy contender: X = arr[...]; Z = (X - mean) @ precision in {args.numpy_dtype}; "
              f"Z /= row norms; zarr out[...] = Z (chunks ({rows}, {args.d}), default codecs)")
        print()
        for r in range(args.repeat):
            report = encode_job(client, model_path, path, out_slem,
                                partition_rows=args.partition_rows, overwrite=True)
            tm = dict(report.timings)
            slem.append(tm)
            extra = ", ".join(f"{k} {v:.3f}" for k, v in tm.items() if k != "total")
            print(f"run {r + 1}: slem-dask {tm['total']:.3f} s ({extra}) | {C.load_line()}")
            nt = numpy_reference(path, out_np, model.mean_, model.precision_, rows,
                                 np.dtype(args.numpy_dtype))
            numpy_runs.append(nt)
            print(f"run {r + 1}: numpy     {nt['total']:.3f} s (read {nt['read']:.3f}, compute "
                  f"{nt['compute']:.3f}, write {nt['write']:.3f}) | {C.load_line()}")
            sys.stdout.flush()

    best_slem = min(t["total"] for t in slem)
    best_np = min(t["total"] for t in numpy_runs)
    med = C.statistics.median
    print()
    print(f"slem-dask encode total: {C.spread(t['total'] for t in slem)}  runs {C.runs_line(t['total'] for t in slem)}")
    print(f"  of which encode+write: {C.spread(t['encode+write'] for t in slem)}")
    print(f"numpy total           : {C.spread(t['total'] for t in numpy_runs)}  runs {C.runs_line(t['total'] for t in numpy_runs)}")
    for part in ("read", "compute", "write"):
        print(f"  of which {part:<12}: {C.spread(t[part] for t in numpy_runs)}")
    ratio = best_np / best_slem
    ratio_med = med([t["total"] for t in numpy_runs]) / med([t["total"] for t in slem])
    print(f"RATIO numpy_time / slem_time = {ratio:.3f} (best of {args.repeat}); "
          f"{ratio_med:.3f} (medians)  [>= 1.0: slem-dask no slower]")

    zs = storage.open_output(out_slem)
    zn = zarr.open_array(store=out_np, mode="r")
    diff = 0.0
    for i in range(0, args.n, 65536):
        diff = max(diff, float(np.abs(zs[i:i + 65536] - zn[i:i + 65536]).max()))
    m = min(args.check_rows, args.n)
    ref = encode_rows(zarr.open_array(store=path, mode="r")[:m], model.mean_, model.precision_)
    print()
    print(f"check: max abs diff slem vs numpy outputs (all {args.n:,} rows): {diff:.3e}; vs a float64 "
          f"encoding of the first {m:,} rows: slem {np.abs(zs[:m] - ref).max():.3e}, "
          f"numpy {np.abs(zn[:m] - ref).max():.3e}")
    sizes = {}
    for name, p in (("slem", out_slem), ("numpy", out_np)):
        sizes[name] = sum(os.path.getsize(os.path.join(root, f))
                          for root, _, files in os.walk(p) for f in files)
    print(f"outputs on disk: slem {sizes['slem'] / 2**20:.0f} MiB, numpy {sizes['numpy'] / 2**20:.0f} "
          f"MiB, raw {args.n * args.d * 4 / 2**20:.0f} MiB (codecs {[type(c).__name__ for c in (zs.serializer, *zs.compressors)]})")
    C.emit_json("RESULT bench_encode", {
        "n": args.n, "d": args.d, "slem_best": best_slem, "numpy_best": best_np,
        "ratio_best": ratio, "ratio_median": ratio_med, "output_maxdiff": diff,
        "slem_runs": [t["total"] for t in slem], "numpy_runs": [t["total"] for t in numpy_runs]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
