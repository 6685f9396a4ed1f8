"""What every contender of a benchmark starts from, and the physical floor of a job.

* :func:`same_start`: the state each timed contender starts from, whatever ran before
  it (issue 42: bench_encode's floor / slem-dask moved by 0.17 with the set of other
  contenders in the run). Carried over between contenders, and undone here: dirty pages
  of earlier writes (``os.sync``), the page cache the earlier contenders' outputs hold
  (dropped file by file with ``posix_fadvise(DONTNEED)`` once they are on disk: at
  1e6 x 512 the numpy, naive, floor and slem-dask outputs hold 8 GB of a 23 GB
  machine's memory, and the kernel evicts the input's pages, which everyone reads,
  to make room for the next writer), the input's pages themselves (read once more, so
  that every contender reads a cached input), Python garbage (``gc.collect`` here and
  in every worker of a cluster) and spinning OpenBLAS threads (a pause).
* What it cannot undo (:func:`reports_free_pages`): a virtual machine whose kernel hands
  free memory back to its host (virtio-balloon free page reporting; this project's
  2-core Firecracker VM does). The host discards what the guest reported, and the
  guest's next first touch of such a page faults in the host too: a contender's time
  then depends on how much of the memory it touches had been reported, which nothing
  here controls. 1e6 x 128 encodes were bimodal: the floor 1.05-1.2 s or 1.9-2.4 s,
  slem-dask 1.1-1.3 s or 1.8-2.3 s, the slow runs with 1.4-2.1 s more kernel CPU time
  (perf: ``clear_page_erms``, ``copy_folio_from_iter_atomic``) for the same number of
  page faults, and user CPU time unchanged. Touching and freeing memory before each
  contender did not help reliably (3 GiB removed the extra kernel time but took 4-6 s
  each time; 0.7-1 GiB slowed the job's first 0.2 s; 0.4 GiB left it bimodal). Hence
  the benchmarks print, beside wall times, each contender's user CPU seconds, which
  this does not move.
* :func:`physical_floor`: the least any implementation must spend on this machine
  for a job over the rows ``x``: the CPU seconds of decoding every input chunk, of
  the product at the BLAS's measured single-thread peak for that shape (measured here
  on one partition), and of writing the output's bytes (measured here), all divided
  by the cores, as if they overlapped perfectly. CPU time (``time.process_time``) is
  what is measured, so that other processes on a shared machine inflate it little;
  wall times of contenders on a loaded machine are compared with it all the same.
"""

from __future__ import annotations

import gc
import os
import time

import numpy as np


def _files(paths) -> list[str]:
    found = []
    for path in paths:
        if os.path.isfile(path):
            found.append(path)
        for root, _, names in os.walk(path):
            found.extend(os.path.join(root, name) for name in names)
    return found


def drop_cached(paths) -> int:
    """Drop the clean page-cache pages of every file under ``paths`` (call after
    ``os.sync``: dirty pages are not dropped); the bytes of the files."""
    total = 0
    for name in _files(paths):
        try:
            fd = os.open(name, os.O_RDONLY)
        except OSError:  # deleted meanwhile (a version pruned)
            continue
        try:
            total += os.fstat(fd).st_size
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return total


def read_through(paths, block: int = 1 << 24) -> int:
    """Read every file under ``paths`` once (into the page cache); the bytes read."""
    buf = bytearray(block)
    total = 0
    for name in _files(paths):
        with open(name, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


def reports_free_pages() -> bool:
    """Whether this kernel may hand free memory back to its host: free page reporting is
    built in and a virtio balloon device is bound (the driver registers for reporting
    where the host offers it). Memory freed here may then be unbacked when it is next
    touched (module doc)."""
    balloon = "/sys/bus/virtio/drivers/virtio_balloon"
    try:
        bound = any(name.startswith("virtio") for name in os.listdir(balloon))
    except OSError:
        return False
    return bound and os.path.exists("/sys/module/page_reporting/parameters")


#: How long (ms) a page must have been free before the guest kernel reports it to the
#: host: a parameter of the Firecracker guest kernel of this project's machines (upstream
#: Linux has only ``page_reporting_order``); 0 there, so a page was reported at once.
MIN_FREE_MS = "/sys/module/page_reporting/parameters/min_free_ms"
#: What :func:`hold_free_pages` sets: five minutes, the largest round value that kernel
#: took (600000 was refused: EINVAL). A contender reuses within seconds what the one
#: before it freed, so none of it is reported during a run.
HELD_MIN_FREE_MS = 300_000


def hold_free_pages() -> str:
    """For the rest of this process, keep memory that a contender frees backed by the
    host (``--hold-free-pages``): :data:`MIN_FREE_MS` is set to :data:`HELD_MIN_FREE_MS`
    and put back at exit, if it still holds that value (two runs that overlap: the one
    that saw it held does not hold it again); a killed run leaves it set, and the line
    returned says how to put it back. Root only. Returns the line to print; raises
    ``SystemExit`` with one line where it cannot (no such parameter, or not allowed to
    write it).

    Why (issue 42, ninth pass): at 1e6 x 128 on a LocalCluster, with reporting as it is
    (0 ms), a contender's system CPU was 0.21-0.30 s in one round and 0.63-0.87 s in
    another, whichever contender it was (floor / slem-dask 0.72 in one run, the floor
    slower than slem-dask in the next); held, 0.21-0.39 s in every round of three runs
    (``benchmarks/results/q42s9_128*.txt``)."""
    import atexit

    try:
        with open(MIN_FREE_MS) as f:
            before = f.read().strip()
        with open(MIN_FREE_MS, "w") as f:
            f.write(str(HELD_MIN_FREE_MS))
    except OSError as exc:
        raise SystemExit(
            f"--hold-free-pages: cannot set {MIN_FREE_MS} ({exc.strerror or exc}): it needs "
            f"root and a guest kernel that has this parameter; run as root, or omit "
            f"--hold-free-pages (then compare the user CPU lines)"
        ) from None

    def put_back() -> None:  # unless another run put it back first (runs that overlapped)
        with open(MIN_FREE_MS) as f:
            if f.read().strip() != str(HELD_MIN_FREE_MS):
                return
        with open(MIN_FREE_MS, "w") as f:
            f.write(before)

    atexit.register(put_back)
    return (
        f"free page reporting held: {MIN_FREE_MS} = {HELD_MIN_FREE_MS} for this run "
        f"(was {before}; put back at exit; after a killed run: echo {before} > {MIN_FREE_MS})"
    )


def same_start(outputs=(), inputs=(), client=None, pause: float = 0.3) -> None:
    """Bring the machine to the state every timed contender starts from (module doc):
    ``outputs``: folders the contenders write (their pages are dropped from the cache),
    ``inputs``: folders they read (read once, so they are cached for all), ``client``:
    a cluster whose workers collect their garbage too."""
    gc.collect()
    if client is not None:
        client.run(gc.collect)
    os.sync()
    drop_cached(outputs)
    read_through(inputs)
    time.sleep(pause)


def _cpu(func) -> float:
    t0 = time.process_time()
    func()
    return time.process_time() - t0


def _best_cpu(func, repeat: int) -> float:
    return min(_cpu(func) for _ in range(repeat))


def physical_floor(
    x,
    product,
    out_bytes: int,
    scratch: str,
    repeat: int = 3,
    flops_per_row: float | None = None,
    previous: dict | None = None,
    arr=None,
) -> dict:
    """The physical floor of a job over the dask rows ``x`` (module doc): ``product``
    maps one partition (numpy) to its product (one BLAS thread: the rate per core);
    ``out_bytes``: the bytes the job writes (0: none), through plain writes of a file in
    the folder ``scratch`` (as the contenders write: into the page cache, not waiting
    for the disk; the disk's own bandwidth, with fsync, is printed beside it).
    ``flops_per_row``: of the product, for its GFLOP/s (default 2 d^2: a product with
    a d x d matrix; X^T X, a symmetric rank-k update, is d^2). ``previous``: an earlier
    measurement of the same job: each part is the least of the two (:func:`least_floor`).
    ``arr``: the zarr array behind ``x``, read block by block with slem-dask's reader and
    no dask (:func:`_read_every_block`)."""
    from threadpoolctl import threadpool_limits

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    # decode: every chunk read and decoded in this process (zarr's I/O and codec
    # threads included in the process's CPU time), without dask: a compute per block
    # paid dask's graph work each time, and the physical floor of a 2e5 x 256 fit came
    # out above the floor contender it bounds (7 blocks: 0.42-0.84 CPU s; one compute
    # 0.40-0.47; slem-dask's reader alone 0.35)
    decode = _cpu(lambda: _read_every_block(x, arr))
    sizes = x.chunks[0]
    block = x.blocks[int(np.argmax(sizes))].compute(scheduler="sync")
    with threadpool_limits(limits=1, user_api="blas"):
        product(block)  # the BLAS's buffers and kernels warmed up
        per_block = _best_cpu(lambda: product(block), repeat)
    product_cpu = per_block * x.shape[0] / block.shape[0]
    flops = flops_per_row if flops_per_row is not None else 2.0 * block.shape[1] ** 2
    write_cpu = disk_bw = 0.0
    if out_bytes:
        write_cpu, disk_bw = _write_costs(out_bytes, scratch, repeat)
    total = (decode + product_cpu + write_cpu) / cores
    measured = {
        "total": total,
        "decode_cpu": decode,
        "product_cpu": product_cpu,
        "gflops_per_core": block.shape[0] * flops / per_block / 1e9,
        "write_cpu": write_cpu,
        "write_gbps": out_bytes / write_cpu / 1e9 if write_cpu else 0.0,
        "disk_gbps": disk_bw,
        "cores": cores,
        "measurements": 1,
    }
    return measured if previous is None else least_floor(previous, measured)


def least_floor(a: dict, b: dict) -> dict:
    """Two measurements of one job's physical floor as one: each CPU cost the least of
    the two, the rates and the total from those. A floor is a lower bound, and a shared
    VM's speed moves by a third within minutes (2026-11-29: one 16,384 x 512 float32
    product took 67 ms, then 90 ms, on the same core): a probe taken once, at a slow
    moment, put the physical floor above the floor contender it bounds (5.32 s against
    4.74 s). The benchmarks measure it again after each scheduler's phase."""
    merged = dict(a)
    for key in ("decode_cpu", "product_cpu", "write_cpu"):
        merged[key] = min(a[key], b[key])
    if merged["product_cpu"] == b["product_cpu"]:
        merged["gflops_per_core"] = b["gflops_per_core"]
    if merged["write_cpu"] == b["write_cpu"]:
        merged["write_gbps"] = b["write_gbps"]
    merged["disk_gbps"] = max(a["disk_gbps"], b["disk_gbps"])
    merged["measurements"] = a.get("measurements", 1) + b.get("measurements", 1)
    merged["total"] = (merged["decode_cpu"] + merged["product_cpu"] + merged["write_cpu"]) / (
        merged["cores"]
    )
    return merged


def _read_every_block(x, arr=None) -> None:
    """Read every block of ``x``, keeping none of them: from ``arr`` with slem-dask's
    reader (``storage.read_rows``, what each task of ``x`` calls) if given, else in one
    compute of ``x`` on the synchronous scheduler."""
    if arr is not None:
        from slem_dask import storage

        lo = 0
        for rows in x.chunks[0]:
            storage.read_rows(arr, lo, lo + rows)
            lo += rows
        return
    x.map_blocks(_nothing, chunks=((1,) * x.numblocks[0],), drop_axis=1, dtype=np.int8).compute(
        scheduler="sync"
    )


def _nothing(block: np.ndarray) -> np.ndarray:
    return np.zeros(1, dtype=np.int8)


def _write_costs(out_bytes: int, scratch: str, repeat: int) -> tuple[float, float]:
    """(CPU s of plain writes of ``out_bytes``, the disk's GB/s with fsync) measured with
    a file of at most 256 MiB in ``scratch``, scaled to ``out_bytes``."""
    size = min(out_bytes, 1 << 28)
    data = np.ones(size // 4, dtype=np.float32)
    path = os.path.join(scratch, "physical-floor-write-probe")

    def write(sync: bool) -> None:
        with open(path, "wb", buffering=0) as f:
            f.write(memoryview(data.view(np.uint8)))
            if sync:
                os.fsync(f.fileno())

    try:
        best = 1e9
        for _ in range(repeat):
            os.sync()
            if os.path.exists(path):
                os.remove(path)
            os.sync()
            best = min(best, _cpu(lambda: write(False)))
        os.remove(path)
        os.sync()
        t0 = time.perf_counter()
        write(True)
        disk = data.nbytes / (time.perf_counter() - t0) / 1e9
    finally:
        if os.path.exists(path):
            os.remove(path)
    return best * out_bytes / data.nbytes, disk


def physical_summary(
    result: dict, bench: str, sched: str, phys: dict, totals, floor_totals=()
) -> None:
    """Print the physical floor beside slem-dask's best on ``sched`` and their ratio; a
    physical floor slower than slem-dask, or than the floor contender's best
    (``floor_totals``), is wrong, and is said to be."""
    best = min(totals)
    ratio = phys["total"] / best
    write = (
        f", write {phys['write_cpu']:.2f} CPU s ({phys['write_gbps']:.2f} GB/s into the page "
        f"cache; the disk with fsync: {phys['disk_gbps']:.2f} GB/s)"
        if phys["write_cpu"]
        else ""
    )
    print(
        f"[{sched}] physical floor: {phys['total']:.3f} s = (decode {phys['decode_cpu']:.2f} "
        f"CPU s, product {phys['product_cpu']:.2f} CPU s at {phys['gflops_per_core']:.1f} "
        f"GFLOP/s per core{write}) / {phys['cores']} cores; each part the least of "
        f"{phys.get('measurements', 1)} measurement(s)"
    )
    if floor_totals and phys["total"] > min(floor_totals):
        print(
            f"[{sched}] WRONG FLOOR: the physical floor ({phys['total']:.3f} s) is slower "
            f"than the floor contender's best run ({min(floor_totals):.3f} s), which it bounds"
        )
    print(
        f"[{sched}] RATIO physical_floor / slem_time = {ratio:.3f} (best {best:.3f} s)"
        + (
            "  WRONG FLOOR: slower than the slem-dask run it bounds"
            if ratio > 1.0
            else "  [1.0: slem-dask at this machine's physical limit]"
        )
    )
    result[f"{sched}_physical_floor"] = phys
    result[f"{sched}_ratio_physical_best"] = ratio
