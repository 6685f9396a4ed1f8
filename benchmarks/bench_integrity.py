#!/usr/bin/env python
"""What the integrity guarantees cost an encode (issue 8: at most 5% at 1e6 x 512).

Same LocalCluster, same model, same float32 store (the bench_fit store), alternating:

* guarded: ``pipeline.encode_job(client, model, store, out, overwrite=True)``: canonical
  paths, a lease on the output, listing fingerprints of the input (before and after),
  the workers' view of input and output checked, every input chunk's presence checked
  in the task that reads it, a crc32c on every output chunk, and every partition's
  stored crc32c compared with the one its task computed before ``complete: true``.
* unguarded: what slem-dask 0.1.0 did: ``da.from_zarr`` (no chunk checks), the same
  ``model.transform``, ``da.store`` into an uncompressed zarr array without checksums,
  no lease, no listing, no verification; the same output chunking.
* unguarded + crc32c: the same, with zarr's crc32c codec on the output: what the
  checksums alone cost, the rest being the other guarantees.

The contenders' order rotates from round to round. Prints every run, best/median,
the ratio unguarded/guarded and the overhead in percent.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def unguarded(client, model, path: str, out: str, rows: int, crc: bool = False) -> float:
    import dask.array as da
    import zarr

    t0 = time.perf_counter()
    arr = zarr.open_array(store=path, mode="r")
    if os.path.exists(out):
        shutil.rmtree(out)
    target = zarr.create_array(
        store=out,
        shape=arr.shape,
        dtype="float32",
        chunks=(rows, arr.shape[1]),
        compressors=[zarr.codecs.Crc32cCodec()] if crc else None,
        config={"write_empty_chunks": True},
    )
    z = model.transform(da.from_zarr(arr, chunks=(rows, arr.shape[1])), dtype=np.float32)
    client.compute(da.store(z, target, lock=False, compute=False)).result()
    return time.perf_counter() - t0


def guarded_run(client, model_path: str, path: str, out: str, rows: int) -> float:
    """``encode_job`` timed from outside: its commit and garbage collection included."""
    from slem_dask.pipeline import encode_job

    t0 = time.perf_counter()
    encode_job(client, model_path, path, out, partition_rows=rows, overwrite=True)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    C.add_common_args(parser)
    C.add_run_args(parser)
    C.add_band_arg(
        parser, 0.15, "the contenders' order rotates each round, after one untimed run of each"
    )
    args = parser.parse_args(argv)
    C.resolve_sizes(args)

    from slem_dask import storage
    from slem_dask.cluster.connect import connect
    from slem_dask.models import load_model
    from slem_dask.pipeline import fit_job

    C.header(f"bench_integrity: n={args.n:,} d={args.d} float32", args)
    path = C.ensure_store(args.workdir, args.n, args.d, args.seed, args.chunk_rows)
    print(f"data: {C.describe_store(path)}")
    tag = f"n{args.n}-d{args.d}"
    model_path = os.path.join(args.workdir, f"bench-integrity-model-{tag}.zarr")
    out_g = os.path.join(args.workdir, f"bench-integrity-guarded-{tag}.zarr")
    out_u = os.path.join(args.workdir, f"bench-integrity-unguarded-{tag}.zarr")
    cpu = {"guarded": [], "unguarded": [], "unguarded + crc32c": []}
    with connect(n_workers=args.workers, threads_per_worker=args.threads, quiet=True) as client:
        fit_job(client, path, model_path, lam=args.lam, overwrite=True)
        model = load_model(model_path)
        arr = storage.open_input(path, "positives")
        rows = storage.row_partition(arr, args.partition_rows, at_least_width=False)  # encode's
        print(
            f"cluster: {len(client.nthreads())} worker process(es); partitions of {rows:,} "
            f"rows ({-(-args.n // rows)} partitions)"
        )
        with C.Timer() as t:
            storage.partition_fingerprints(arr, path, "positives", rows)
        print(f"listing fingerprint of the input alone: {t.seconds * 1e3:.1f} ms")
        contenders = {
            "guarded": lambda: guarded_run(client, model_path, path, out_g, rows),
            "unguarded": lambda: unguarded(client, model, path, out_u, rows),
            "unguarded + crc32c": lambda: unguarded(client, model, path, out_u, rows, crc=True),
        }
        # one untimed run of EACH contender: warming only the unguarded one left the
        # guarded one's first lease, checks and commit inside its first timed run, and two
        # back-to-back runs gave +28.5% and -16.2%
        for name, run in contenders.items():
            with C.Timer() as t:
                run()
            print(f"warm-up {name} (not counted): {t.seconds:.3f} s")
        wall = {name: [] for name in contenders}
        names = list(contenders)
        for r in range(args.repeat):
            # the order rotates each round: none always runs first (or after a 2 GB delete)
            for name in names[r % 3 :] + names[: r % 3]:
                C.settle()  # each contender writes 2 GB: none pays another's writeback
                c0 = C.cluster_cpu_seconds(client)
                wall[name].append(contenders[name]())
                cpu[name].append(C.cluster_cpu_seconds(client) - c0)
            print(
                f"run {r + 1}: "
                + " | ".join(f"{name} {wall[name][-1]:.3f} s" for name in names)
                + f" | {C.load_line()}"
            )
            sys.stdout.flush()
        guarded, plain, crc_only = wall["guarded"], wall["unguarded"], wall["unguarded + crc32c"]
        with C.Timer() as t:
            what, problems = storage.verify(out_g)
        print(
            f"`slem-dask verify` of the guarded output (reads it all): {t.seconds:.2f} s, "
            f"{len(problems)} problem(s)"
        )
    med = C.statistics.median
    ratio = min(plain) / min(guarded)
    ratio_med = med(plain) / med(guarded)
    print()
    print(f"guarded   : {C.spread(guarded)}: {C.runs_line(guarded)}")
    print(f"unguarded : {C.spread(plain)}: {C.runs_line(plain)}")
    print(
        f"unguarded + crc32c codec: {C.spread(crc_only)}: {C.runs_line(crc_only)}; "
        f"the codec alone: {100 * (med(crc_only) / med(plain) - 1):+.1f}% (medians)"
    )
    print(
        f"RATIO unguarded_time / guarded_time = {ratio:.3f} (best of {args.repeat}); "
        f"{ratio_med:.3f} (medians); overhead {100 * (1 / ratio - 1):+.1f}% (best), "
        f"{100 * (1 / ratio_med - 1):+.1f}% (medians)  [goal: overhead <= 5%]"
    )
    C.band("encode: unguarded / guarded", plain, guarded, args.band, names=("unguarded", "guarded"))
    paired = [g / u for g, u in zip(guarded, plain, strict=True)]
    print(
        f"guarded / unguarded of the same round: median {med(paired):.3f} "
        f"(runs {C.runs_line(paired)})"
    )
    for name, values in cpu.items():
        print(
            f"CPU seconds, client + workers, {name}: median {med(values):.2f} s "
            f"(runs {C.runs_line(values)})"
        )
    cpu_overhead = 100 * (med(cpu["guarded"]) / med(cpu["unguarded"]) - 1)
    print(
        f"CPU overhead of the guarantees: {cpu_overhead:+.1f}% (medians; barely moved by "
        f"other processes' load, unlike wall time)"
    )
    out_a = storage.read_rows(storage.open_output(out_g), 0, min(args.n, 50_000))
    import zarr

    out_b = zarr.open_array(store=out_u, mode="r")[: min(args.n, 50_000)]
    print(f"check: first {len(out_a):,} rows identical: {bool(np.array_equal(out_a, out_b))}")
    C.emit_json(
        "RESULT bench_integrity",
        {
            "n": args.n,
            "d": args.d,
            "guarded": guarded,
            "unguarded": plain,
            "unguarded_crc32c": crc_only,
            "cpu_seconds": cpu,
            "cpu_overhead_pct": cpu_overhead,
            "ratio_best": ratio,
            "ratio_median": ratio_med,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
