"""Shared helpers of the benchmark scripts: arguments, the data store, timing, machine facts.

The data store is a zarr v3 array of ``n`` rows of the deterministic negatives
stream of :func:`slem_dask.datasets.background_rows` (d features, float32),
written block by block so that a store of any size is written without holding
it in memory. It is written with zarr's default codecs (for a float32 array in
zarr-python 3: ``BytesCodec`` + ``ZstdCodec(level=0)``) and reused by every
script while its shape, dtype, chunking and seed match; an attribute written
last marks it complete, so a write that was interrupted is redone.

The report side (spreads, ``RATIO`` summaries, bands) lives in ``_report`` and is
re-exported here, so that a script imports one module.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics  # noqa: F401 - the scripts call C.statistics.median
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _floors import encode_floor, fit_floor  # noqa: E402,F401 - re-exported
from _physical import physical_floor, physical_summary  # noqa: E402,F401 - re-exported
from _report import (  # noqa: E402,F401 - re-exported: the scripts call C.band, C.spread...
    CONTENDER_NAMES,
    add_band_arg,
    alternate,
    band,
    emit_json,
    floor_summary,
    ratio_summary,
    round_ratios,
    runs_line,
    spread,
)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_WORKDIR = os.path.join(HERE, "_data")

DEFAULT_N = 1_000_000
DEFAULT_D = 512
QUICK_N = 100_000
QUICK_D = 128
#: Rows per zarr chunk of the data store. Partitions are whole multiples of it
#: (storage.row_partition), so it must not exceed the smallest partition tried.
DEFAULT_CHUNK_ROWS = 8192
#: The largest float32 chunk of a generated data store (:func:`default_chunk_rows`).
WIDE_CHUNK_BYTES = 32 * 2**20
#: Rows generated and written per step when the store is written.
WRITE_BLOCK_ROWS = 65536

STORE_ATTR = "slem_dask_benchmark"


# -- arguments ------------------------------------------------------------


def int_size(text: str) -> int:
    """Accept 1000000, 1e6, 1_000_000."""
    value = float(text.replace("_", ""))
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(value)


def add_common_args(
    parser: argparse.ArgumentParser, sizes: bool = True, default_n: int = DEFAULT_N
) -> None:
    """``default_n``: the script's own default row count, applied by :func:`resolve_sizes`
    unless --n or --quick is given (so that --help states it)."""
    if sizes:
        parser.add_argument(
            "--n",
            type=int_size,
            default=None,
            help=f"rows of the data store (default {default_n:,}; "
            f"--quick: {min(QUICK_N, default_n):,})",
        )
        parser.set_defaults(default_n=default_n)
    parser.add_argument(
        "--d",
        type=int_size,
        default=None,
        help=f"features (default {DEFAULT_D}; --quick: {QUICK_D})",
    )
    parser.add_argument(
        "--workdir",
        default=DEFAULT_WORKDIR,
        help="folder of the data stores and outputs (default benchmarks/_data)",
    )
    quick = (
        f"n = {min(QUICK_N, default_n):,}, d = {QUICK_D}"
        if sizes
        else f"d = {QUICK_D}, and the script's small sizes"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"small smoke-test size ({quick}) unless {'--n/--d are' if sizes else '--d is'} given",
    )
    parser.add_argument(
        "--chunk-rows",
        type=int_size,
        default=None,
        help=f"rows per zarr chunk of the data store (default {DEFAULT_CHUNK_ROWS}, or "
        f"chunks of {WIDE_CHUNK_BYTES >> 20} MiB where that is fewer rows: 1,024 at d = 8192)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the data stream (default 0)")


def add_run_args(parser: argparse.ArgumentParser, repeat: int = 3, cluster: bool = True) -> None:
    """--repeat, --partition-rows, --lam, --hold-free-pages, and with ``cluster`` the
    LocalCluster's --workers and --threads (a script that starts none takes neither)."""
    parser.add_argument(
        "--repeat",
        type=int,
        default=repeat,
        help=f"timed runs of each contender (default {repeat}; best is reported)",
    )
    parser.add_argument(
        "--partition-rows",
        type=int_size,
        default=None,
        help="rows per dask partition (default: the library's, storage.row_partition)",
    )
    if cluster:
        parser.add_argument(
            "--workers",
            type=int,
            default=None,
            help="LocalCluster worker processes (default: slem_dask.cluster.connect "
            "default, one per core)",
        )
        parser.add_argument(
            "--threads", type=int, default=None, help="threads per worker (default 1)"
        )
    parser.add_argument("--lam", type=float, default=1e-3, help="ridge lambda (default 1e-3)")
    parser.add_argument(
        "--hold-free-pages",
        action="store_true",
        help="root, on a VM whose kernel reports free pages to its host: keep freed memory "
        "backed during the run, put back at exit (_physical.hold_free_pages)",
    )


def add_scheduler_args(parser: argparse.ArgumentParser) -> None:
    """--schedulers and --no-naive, of the scripts that time slem-dask against numpy and
    naive Dask on each scheduler (bench_fit, bench_encode): see :func:`chosen_schedulers`."""
    parser.add_argument(
        "--schedulers",
        default="threads,cluster",
        help="comma-separated: threads (no Client), cluster (LocalCluster); default both",
    )
    parser.add_argument("--no-naive", action="store_true", help="skip the naive Dask contender")


def chosen_schedulers(parser: argparse.ArgumentParser, args) -> list[str]:
    """The schedulers --schedulers names, in its order; any other name is a usage error."""
    schedulers = [s for s in args.schedulers.split(",") if s]
    if not set(schedulers) <= {"threads", "cluster"}:
        parser.error(f"--schedulers: expected threads and/or cluster, got {args.schedulers!r}")
    return schedulers


def resolve_sizes(args) -> None:
    if getattr(args, "n", "absent") is None:
        args.n = min(QUICK_N, args.default_n) if args.quick else args.default_n
    if args.d is None:
        args.d = QUICK_D if args.quick else DEFAULT_D
    if getattr(args, "chunk_rows", "absent") is None:
        args.chunk_rows = default_chunk_rows(args.d)


def default_chunk_rows(d: int) -> int:
    """8,192 rows per chunk, or fewer where those would pass :data:`WIDE_CHUNK_BYTES` of
    float32: at d = 8192 the store held 256 MiB chunks, and 10,000 rows made two
    partitions (8,192 and 1,808 rows) for two cores, an imbalance no user's store has."""
    return int(max(1, min(DEFAULT_CHUNK_ROWS, WIDE_CHUNK_BYTES // (4 * d))))


# -- the data store -------------------------------------------------------


def store_path(
    workdir: str, n: int, d: int, seed: int = 0, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> str:
    return os.path.join(workdir, f"negatives-n{n}-d{d}-s{seed}-c{chunk_rows}-float32.zarr")


def _store_params(n, d, seed, chunk_rows) -> dict:
    return {
        "n": int(n),
        "d": int(d),
        "seed": int(seed),
        "chunk_rows": int(chunk_rows),
        "dtype": "float32",
        "generator": "slem_dask.datasets.background_rows",
        "complete": True,
    }


def ensure_store(
    workdir: str, n: int, d: int, seed: int = 0, chunk_rows: int = DEFAULT_CHUNK_ROWS, log=print
) -> str:
    """Path of a complete data store of shape (n, d); written (block by block) if absent."""
    import zarr

    from slem_dask.datasets import background_rows

    path = store_path(workdir, n, d, seed, chunk_rows)
    params = _store_params(n, d, seed, chunk_rows)
    try:
        arr = zarr.open_array(store=path, mode="r")
        if (
            arr.shape == (n, d)
            and arr.dtype == np.float32
            and arr.chunks[0] == chunk_rows
            and dict(arr.attrs).get(STORE_ATTR) == params
        ):
            log(f"data: reusing {path} (shape {arr.shape}, {arr.dtype}, chunks {arr.chunks})")
            return path
        log(
            f"data: {path} does not match (shape {arr.shape}, attrs "
            f"{dict(arr.attrs).get(STORE_ATTR)}); rewriting it"
        )
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        pass
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(workdir, exist_ok=True)
    t0 = time.perf_counter()
    arr = zarr.create_array(
        store=path, shape=(n, d), dtype="float32", chunks=(min(chunk_rows, n), d)
    )
    step = max(chunk_rows, (WRITE_BLOCK_ROWS // chunk_rows) * chunk_rows)
    for start in range(0, n, step):
        stop = min(n, start + step)
        arr[start:stop] = background_rows(stop - start, d, seed=seed, start=start)
        if stop == n or (start // step) % 16 == 15:
            log(f"data: wrote rows {stop:,}/{n:,} of {path} ({time.perf_counter() - t0:.1f} s)")
    arr.attrs[STORE_ATTR] = params  # written last: marks the store complete
    log(
        f"data: wrote {path} in {time.perf_counter() - t0:.1f} s; codecs: "
        f"serializer={arr.serializer}, compressors={arr.compressors}, filters={arr.filters}"
    )
    return path


def describe_store(path: str) -> str:
    import zarr

    arr = zarr.open_array(store=path, mode="r")
    raw = arr.nbytes
    disk = sum(
        os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files
    )
    return (
        f"{arr.shape} {arr.dtype}, chunks {arr.chunks}, codecs "
        f"{[type(c).__name__ for c in (arr.serializer, *arr.compressors)]}, "
        f"{raw / 2**30:.2f} GiB raw, {disk / 2**30:.2f} GiB on disk"
    )


# -- timing and reporting -------------------------------------------------


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0


def _blas_owner(path: str) -> str:
    """The Python package that ships a BLAS library file (numpy.libs/... -> numpy)."""
    parts = os.path.normpath(path).split(os.sep)
    for part in reversed(parts[:-1]):
        if part.endswith(".libs"):
            return part[: -len(".libs")]
        if part in ("numpy", "scipy"):
            return part
    return os.path.basename(path) or "?"


def load_line() -> str:
    la = os.getloadavg()
    return f"load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} on {os.cpu_count()} cores"


def machine_lines() -> list[str]:
    import dask
    import distributed
    import psutil
    import zarr
    from threadpoolctl import threadpool_info

    # the kernel set OpenBLAS picked (or was told to pick: OPENBLAS_CORETYPE) sets the
    # speed of every product: on this repository's AVX-512 machine, Haswell's kernels
    # run a float32 X^T X at about 0.6x the speed of SkylakeX's
    blas = [
        f"{_blas_owner(i.get('filepath', ''))}: {i.get('internal_api')} {i.get('version')} "
        f"x{i.get('num_threads')} threads, {i.get('architecture', '?')} kernels"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    pins = " ".join(
        f"{k}={v}"
        for k, v in sorted(os.environ.items())
        if k.startswith(("OPENBLAS_", "OMP_", "MKL_"))
    )
    vm = psutil.virtual_memory()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        [
            f"machine: {platform.node()} {platform.machine()}, {cores} usable cores, "
            f"{vm.total / 2**30:.1f} GiB RAM ({vm.available / 2**30:.1f} GiB available), "
            f"{load_line()}",
            f"versions: python {platform.python_version()}, numpy {np.__version__}, "
            f"dask {dask.__version__}, distributed {distributed.__version__}, zarr {zarr.__version__}",
            f"BLAS libraries in this process: {'; '.join(blas) or 'unknown'}"
            f"{f' (environment: {pins})' if pins else ''}",
        ]
        + (
            [
                "note: OPENBLAS_CORETYPE forces OpenBLAS's kernel set whatever the CPU (on an AVX-512 "
                "CPU, Haswell's kernels run a float32 X^T X at about 0.6x the speed of SkylakeX's: "
                "README, Benchmarks)"
            ]
            if os.environ.get("OPENBLAS_CORETYPE")
            else []
        )
        + [
            f"time: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        ]
    )


def header(title: str, args) -> None:
    print("=" * 78)
    print(title)
    print("  command: " + " ".join([os.path.basename(sys.executable)] + sys.argv))
    for line in machine_lines():
        print("  " + line)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if os.getloadavg()[0] > 0.5 * cores:
        print(
            f"  WARNING: the machine is busy ({load_line()}): timings are not reliable; "
            f"a multi-threaded BLAS in particular slows down a lot when the cores are shared"
        )
    from _physical import hold_free_pages, reports_free_pages

    if getattr(args, "hold_free_pages", False):
        print("  " + hold_free_pages())
    elif reports_free_pages():
        print(
            "  WARNING: this VM may hand its free memory back to its host (a virtio balloon "
            "with free page reporting): a run that touches memory freed before it can take "
            "up to twice as long, in kernel time; compare user CPU seconds where they are "
            "printed"
            + (
                ", or run as root with --hold-free-pages"
                if hasattr(args, "hold_free_pages")
                else ""
            )
            + " (benchmarks/_physical.py)"
        )
    print("=" * 78)
    sys.stdout.flush()


@contextlib.contextmanager
def scheduler_contexts(args, schedulers, plain_cluster: bool = False):
    """Yield (clients, contexts) keyed by scheduler: "threads" (dask's threaded scheduler,
    no Client) and "cluster" (slem-dask's LocalCluster, ``slem_dask.cluster.connect.connect``, of
    --workers x --threads, started only if asked for). ``contexts[name]()`` makes that
    scheduler the one dask.compute uses. ``plain_cluster``: also "plain-cluster", the
    LocalCluster a user writes by hand (``LocalCluster(n_workers, threads_per_worker)``,
    distributed's defaults otherwise: no slem-dask worker settings), of the same size."""
    import logging

    import dask
    from distributed import Client, LocalCluster

    from slem_dask.cluster.connect import connect, default_local_cluster_kwargs

    with contextlib.ExitStack() as stack:
        clients = {"threads": None}
        contexts = {"threads": lambda: dask.config.set(scheduler="threads")}
        if "cluster" in schedulers:
            client = stack.enter_context(
                connect(n_workers=args.workers, threads_per_worker=args.threads, quiet=True)
            )
            nthreads = client.nthreads()
            print(
                f"cluster: {len(nthreads)} worker process(es) x "
                f"{sorted(set(nthreads.values()))} thread(s) (slem_dask.cluster.connect.connect)"
            )
            clients["cluster"], contexts["cluster"] = client, client.as_current
            if plain_cluster:
                kw = default_local_cluster_kwargs(args.workers, args.threads)
                cluster = stack.enter_context(
                    LocalCluster(
                        n_workers=kw["n_workers"],
                        threads_per_worker=kw["threads_per_worker"],
                        dashboard_address=":0",
                        silence_logs=logging.CRITICAL,
                    )
                )
                plain = stack.enter_context(Client(cluster, set_as_default=False))
                print(
                    f"plain-cluster: LocalCluster(n_workers={kw['n_workers']}, "
                    f"threads_per_worker={kw['threads_per_worker']}), distributed's defaults"
                )
                clients["plain-cluster"], contexts["plain-cluster"] = plain, plain.as_current
        yield clients, contexts


def cpu_times(client=None) -> tuple[float, float]:
    """(user, system) CPU seconds used so far by this process and every worker of
    ``client``. User time is what a contender's own code costs: a host that must back
    memory again (``_physical.reports_free_pages``) adds system time, not user time."""

    def own() -> tuple[float, float]:
        import psutil as p

        t = p.Process().cpu_times()
        return t.user, t.system

    times = [own(), *(client.run(own).values() if client is not None else ())]
    return sum(t[0] for t in times), sum(t[1] for t in times)


def cluster_cpu_seconds(client) -> float:
    """CPU seconds (user + system) used so far by this process and every worker of
    ``client``: a cost that the load of other processes on the machine barely changes,
    unlike wall time (compare contenders by differences of it)."""
    return sum(cpu_times(client))


def settle(seconds: float = 0.3, outputs=(), inputs=(), client=None) -> None:
    """Before a timed contender: flush the dirty pages earlier contenders wrote (an
    encode writes n x d floats; their writeback would be paid by whoever runs next)
    and wait for idle OpenBLAS threads to stop spinning (they spin for about 100 ms
    of a core after a multi-threaded call, such as the numpy contender's product).
    With ``outputs``, ``inputs`` or ``client``: also the rest of
    :func:`_physical.same_start` (the outputs' pages dropped, the inputs cached, garbage
    collected), so that no contender's time depends on which ran before it."""
    from _physical import same_start

    same_start(outputs, inputs, client, pause=seconds)


# -- bands: how far a repeated run's ratio may move ----------------------
#
# A benchmark promises a *band* for its headline ratio: a second run of the same
# command on the same machine gives a ratio within +-band of the first. The band is
# checked inside one run from its repeats: the contenders alternate round by round, so
# the ratio of each round's pair is a sample of what a whole run could report; the run
# is "inside" its band when the headline lies within +-band of the rounds' median ratio
# and so do all rounds but one in five (a round stalled by another process on the
# shared machine is forgiven, and counted in the line).
# benchmarks/compare_bands.py compares two runs' BAND lines.
