#!/usr/bin/env python
"""Per-partition costs inside one worker: where the time of a fit/encode task goes.

Runs in this process with BLAS limited to one thread (as in a slem-dask
worker, see cluster.SingleThreadedBLAS) on one partition of ``--rows`` x
``--d`` float32 rows of the benchmark data stream. Times (best of
``--repeat``):

* the library's ``block_statistics`` and each of its steps (float64 copy,
  row finiteness check, mean, centring, dsyrk + triangle mirror);
* private variants of it (copies inside this file, the library is not
  changed): finiteness taken from the block mean (one full pass less), and a
  float32 ssyrk of the float64-centred block (faster, less accurate: its
  error vs the float64 scatter is printed);
* the library's encode task (``check_finite_rows`` + ``encode_rows``) and its
  steps, and a variant that checks finiteness from the row norms it computes
  anyway;
* writing one encoded partition to zarr with the default codecs (zstd) vs no
  compression, and the compression ratio achieved.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def best(fn, repeat):
    """(best time, result) of ``repeat`` timed calls after one untimed call (every
    measurement is warmed up alike: caches, first-touch pages, lazy imports)."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


# -- private variants (copies of library code with one change each) ---------


def stats_mean_first(block):
    """block_statistics with the row finiteness pass replaced by a check of the mean.

    A NaN or inf anywhere in the block makes its column mean non-finite (float32
    input cannot overflow a float64 sum), so the per-row check is only needed
    when the mean is not finite.
    """
    from scipy.linalg import blas

    from slem_dask.core.statistics import ScatterStats, block_statistics

    values = np.array(block, dtype=np.float64, order="C", copy=True)
    mean = values.mean(axis=0)
    if not np.isfinite(mean).all():
        return block_statistics(block)  # slow path, rows with NaN/inf
    values -= mean
    upper = blas.dsyrk(1.0, values.T, trans=0, lower=0)
    return ScatterStats(values.shape[0], mean, np.triu(upper) + np.triu(upper, 1).T, 0)


def stats_float32_syrk(block):
    """Centre in float64, then ssyrk in float32 (half the bytes, ~2x the flop rate)."""
    from scipy.linalg import blas

    values = np.array(block, dtype=np.float64, order="C", copy=True)
    mean = values.mean(axis=0)
    centred = (values - mean).astype(np.float32)
    upper = blas.ssyrk(1.0, centred.T, trans=0, lower=0).astype(np.float64)
    return mean, np.triu(upper) + np.triu(upper, 1).T


def encode_norm_check(block, mean, precision, out_dtype):
    """encode task with the finiteness check taken from the row norms computed anyway."""
    from slem_dask.core.validation import check_finite_rows

    centred = np.array(block, dtype=np.float64, order="C", copy=True)
    centred -= mean
    vectors = centred @ precision
    norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))
    if not np.isfinite(norms).all():
        check_finite_rows(block, "P")  # raises with the row numbers
    np.divide(vectors, norms[:, None], out=vectors, where=norms[:, None] > 0)
    vectors[norms == 0] = 0.0
    return vectors.astype(out_dtype, copy=False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--rows",
        type=C.int_size,
        default=16384,
        help="rows of the partition (default 16384: the library's default partition at d=512)",
    )
    parser.add_argument("--d", type=C.int_size, default=512)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="rows=8192, d=128")
    C.add_band_arg(
        parser,
        0.20,
        "millisecond timings of one partition, best of --repeat; "
        "a loaded core moves them by 10-20%%",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.d = 8192, 128

    from scipy.linalg import blas
    from threadpoolctl import threadpool_limits

    from slem_dask.core.linear import encode_rows, precision_matrix
    from slem_dask.core.statistics import block_statistics
    from slem_dask.datasets import background_rows
    from slem_dask.parallel.blocks import _apply_rows  # the encode task (blocks.map_rows)
    from slem_dask.core.validation import check_finite_rows

    C.header(
        f"bench_kernels: one partition of {args.rows:,} x {args.d} float32, BLAS 1 thread", args
    )
    x = background_rows(args.rows, args.d)
    r = args.repeat
    with threadpool_limits(limits=1, user_api="blas"):
        lines = []

        def row(name, seconds, note=""):
            lines.append((name, seconds, note))
            print(f"  {name:<52} {seconds * 1e3:8.1f} ms  {note}")

        print("fit task (block_statistics):")
        t_lib, ref = best(lambda: block_statistics(x), r)
        row("library block_statistics", t_lib)
        t_copy, v = best(lambda: np.array(x, dtype=np.float64, order="C", copy=True), r)
        row("  step: float64 copy", t_copy)
        t_fin, _ = best(lambda: np.isfinite(v).all(axis=1), r)
        row("  step: np.isfinite(values).all(axis=1)", t_fin)
        t_mean, mu = best(lambda: v.mean(axis=0), r)
        row("  step: mean(axis=0)", t_mean)
        t_sub, _ = best(lambda: np.subtract(v, mu, out=np.empty_like(v)), r)
        row("  step: values - mean", t_sub)
        c = v - mu
        t_syrk, up = best(lambda: blas.dsyrk(1.0, c.T, trans=0, lower=0), r)
        flops = args.rows * args.d * (args.d + 1)
        row("  step: dsyrk", t_syrk, f"{flops / t_syrk / 1e9:.1f} GFLOP/s")
        t_tri, _ = best(lambda: np.triu(up) + np.triu(up, 1).T, r)
        row("  step: triu mirror", t_tri)
        t_var, s2 = best(lambda: stats_mean_first(x), r)
        row(
            "variant: finiteness from the mean (private copy)",
            t_var,
            f"{t_lib / t_var:.2f}x faster; max diff {np.abs(s2.scatter - ref.scatter).max():.1e}",
        )
        t_32, (m32, s32) = best(lambda: stats_float32_syrk(x), r)
        err = np.abs(s32 - ref.scatter).max() / np.abs(ref.scatter).max()
        row(
            "variant: float32 ssyrk of float64-centred block",
            t_32,
            f"{t_lib / t_32:.2f}x faster; relative error {err:.1e} (float64: ~1e-16)",
        )

        print("encode task (parallel._apply_rows = check_finite_rows + encode_rows):")
        cov = ref.scatter / ref.count
        prec = precision_matrix(cov, 1e-3)
        t_enc, z_ref = best(
            lambda: _apply_rows(x, encode_rows, np.dtype("float32"), "P", ref.mean, prec), r
        )
        row("library encode task (_apply_rows)", t_enc)
        t_chk, _ = best(lambda: check_finite_rows(x, "P"), r)
        row("  step: check_finite_rows", t_chk)
        t_er, _ = best(lambda: encode_rows(x, ref.mean, prec, dtype=np.float32), r)
        row("  step: encode_rows", t_er)
        t_mm, _ = best(lambda: c @ prec, r)
        row(
            "  step: (m,d)@(d,d) float64 dgemm",
            t_mm,
            f"{2 * args.rows * args.d**2 / t_mm / 1e9:.1f} GFLOP/s",
        )
        t_v, z2 = best(lambda: encode_norm_check(x, ref.mean, prec, np.float32), r)
        row(
            "variant: finiteness from the row norms (private copy)",
            t_v,
            f"{t_enc / t_v:.2f}x faster; max diff {np.abs(z2 - z_ref).max():.1e}",
        )
        x32c = x - ref.mean.astype(np.float32)
        p32 = prec.astype(np.float32)
        t_mm32, _ = best(lambda: x32c @ p32, r)
        row(
            "  for comparison: float32 sgemm of the same product",
            t_mm32,
            f"{2 * args.rows * args.d**2 / t_mm32 / 1e9:.1f} GFLOP/s",
        )

        print("write one encoded partition to zarr (local disk):")
        import zarr

        tmp = tempfile.mkdtemp(prefix="slem-bench-kernels-")
        try:
            for label, kw in (
                ("default codecs (zstd level 0)", {}),
                ("compressors=None", {"compressors": None}),
            ):

                def write(kw=kw):
                    p = os.path.join(tmp, "out.zarr")
                    shutil.rmtree(p, ignore_errors=True)
                    a = zarr.create_array(
                        store=p, shape=z_ref.shape, dtype="float32", chunks=z_ref.shape, **kw
                    )
                    a[...] = z_ref
                    return p

                t_w, p = best(write, r)
                size = sum(
                    os.path.getsize(os.path.join(root, f))
                    for root, _, files in os.walk(p)
                    for f in files
                )
                row(f"zarr write, {label}", t_w, f"{size / z_ref.nbytes:.3f} of raw size")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        # the headline ratios again, the two contenders alternating round by round
        print(f"headline pairs, alternating, {4 * r} rounds:")
        stats = C.alternate(
            {"library": lambda: block_statistics(x), "variant": lambda: stats_mean_first(x)}, 4 * r
        )
        enc = C.alternate(
            {
                "library": lambda: _apply_rows(
                    x, encode_rows, np.dtype("float32"), "P", ref.mean, prec
                ),
                "variant": lambda: encode_norm_check(x, ref.mean, prec, np.float32),
            },
            4 * r,
        )
    C.band(
        "block_statistics: library / variant finiteness from the mean",
        stats["library"],
        stats["variant"],
        args.band,
        names=("library", "variant"),
    )
    C.band(
        "encode task: library / variant finiteness from the row norms",
        enc["library"],
        enc["variant"],
        args.band,
        names=("library", "variant"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
