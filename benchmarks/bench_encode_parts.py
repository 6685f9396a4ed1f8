#!/usr/bin/env python
"""Where an encode's time goes beyond the floor's, step by step, on one partition.

bench_encode times whole jobs; this times each step of one partition's task on one
thread (BLAS single-threaded, as in a task), slem-dask's against the floor's
(``_floors.encode_floor``), each called once untimed, then alternating (``_report.alternate``),
best and median of ``--repeat``:

* both: reading the partition (slem-dask's reader: the floor uses it too);
* the floor: one float32 product with A^-1, the rows' squares (np.einsum), the scaling,
  one plain file write;
* slem-dask (``core.linear.encode_rows`` taken apart, then whole as an encode task runs
  it, ``EncodeRefusingDegenerate``: rows without a direction refused from the encoding's
  own norms, where a check of the output took a pass of its own until issue 42's tenth
  pass): the centring (x - mu, with mu in two float32 terms), the product, the squares
  and the scaling, then the chunk's crc32c and its write, and the deletion of one
  partition of the version a job prunes (its pages out of the cache).

The encoding, whole, also allocates its output and runs the three steps piece by piece
(the pieces' Python calls weigh at small partitions). Shown beside, not added: the
encoding without its check and the check's own pass, which a linear encode did before
(their sum less the encoding with its check is what that saves). Each slem-dask step that the floor
does not do is printed with the promise it keeps; the sums of each side's bests, and
of its medians, give the floor / slem-dask of one partition's work. A whole job adds
what is paid once (the model's read, the commit) and overlaps tasks on the cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def _write(folder: str, data: np.ndarray, trailer: bytes = b"") -> None:
    path = os.path.join(folder, "chunk")
    with open(path, "wb") as f:
        f.write(memoryview(data.reshape(-1).view(np.uint8)))
        f.write(trailer)


def _delete_uncached(folder: str, data: np.ndarray) -> float:
    """Seconds to delete one partition's file that is on disk and out of the page cache."""
    path = os.path.join(folder, "old")
    _write(folder, data)
    os.rename(os.path.join(folder, "chunk"), path)
    os.sync()
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    start = time.perf_counter()
    os.unlink(path)
    return time.perf_counter() - start


#: The steps each side's task does, whole: the parts of encode_rows are shown, not added.
FLOOR_STEPS = ("read (both)", "floor: product", "floor: squares, scale", "floor: write")
SLEM_STEPS = (
    "read (both)",
    "slem: encoding + its check (the three, whole)",
    "slem: crc32c",
    "slem: write (with trailer)",
    "slem: delete a pruned partition",
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    C.add_common_args(parser)
    C.add_run_args(parser, repeat=15, cluster=False)
    args = parser.parse_args(argv)
    C.resolve_sizes(args)

    from slem_dask import storage
    from slem_dask.core import linear
    from slem_dask.core.validation import check_encoded_rows
    from slem_dask.models import load_model
    from slem_dask.parallel.blocks import single_threaded_blas
    from slem_dask.pipeline import fit_job
    from slem_dask.storage.nodes.checksums import crc32c

    C.header(f"bench_encode_parts: n={args.n:,} d={args.d} float32, one partition", args)
    path = C.ensure_store(args.workdir, args.n, args.d, args.seed, args.chunk_rows)
    model_path = os.path.join(args.workdir, f"bench-encode-model-n{args.n}-d{args.d}.zarr")
    if not os.path.exists(model_path):
        fit_job(None, path, model_path, lam=args.lam)
    model = load_model(model_path)
    arr = storage.open_input(path, "positives")
    rows = storage.row_partition(arr, args.partition_rows, at_least_width=False)
    x = storage.dask_rows(arr, rows, exact=True)
    block = x.blocks[min(1, x.numblocks[0] - 1)].compute(scheduler="sync")
    matrix = model._encoding_matrix(arr.dtype, "auto")
    mean = model.mean_
    high = mean.astype(np.float32)
    low = (mean - high).astype(np.float32)
    step = max(linear._PIECE_MIN_ROWS, linear._PIECE_BYTES // (args.d * 4))
    print(f"partition: {block.shape[0]:,} x {args.d} float32 ({block.nbytes / 2**20:.0f} MiB)")
    centred = np.empty_like(block)
    product = np.empty_like(block)
    folder = tempfile.mkdtemp(dir=args.workdir, prefix="bench-encode-parts-")

    def centring():
        centre = linear._Centring(block, high, low)
        for lo in range(0, block.shape[0], step):
            hi = min(block.shape[0], lo + step)
            centre(lo, hi, centred[lo:hi])

    def squares_and_scale(z):
        squares = linear._row_squares(z)
        np.multiply(z, (1.0 / np.sqrt(squares))[:, None].astype(z.dtype), out=z)

    def floor_norm():
        squares = np.einsum("ij,ij->i", product, product)
        product.__imul__((1.0 / np.sqrt(squares))[:, None].astype(product.dtype))

    encoded = linear.encode_rows(block, mean, matrix)
    refusing = linear.EncodeRefusingDegenerate("")
    trailer = np.array([crc32c(encoded.reshape(-1).view(np.uint8))], "<u4").tobytes()
    steps = {
        "read (both)": lambda: x.blocks[min(1, x.numblocks[0] - 1)].compute(scheduler="sync"),
        "floor: product": lambda: np.matmul(block, matrix, out=product),
        "floor: squares, scale": floor_norm,
        "floor: write": lambda: _write(folder, product),
        "slem: centring": centring,
        "slem: product": lambda: np.matmul(centred, matrix, out=product),
        "slem: squares, scale": lambda: squares_and_scale(product),
        "slem: encoding + its check (the three, whole)": lambda: refusing(block, mean, matrix),
        "shown: encode_rows, whole, no check": lambda: linear.encode_rows(block, mean, matrix),
        "shown: check_encoded_rows (a pass)": lambda: check_encoded_rows(encoded),
        "slem: crc32c": lambda: crc32c(encoded.reshape(-1).view(np.uint8)),
        "slem: write (with trailer)": lambda: _write(folder, product, trailer),
    }
    with single_threaded_blas():
        times = C.alternate(steps, args.repeat)  # every step warmed up once first
    times["slem: delete a pruned partition"] = [
        _delete_uncached(folder, encoded) for _ in range(max(3, args.repeat // 3))
    ]
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)
    why = {
        "slem: centring": "x0 - mu (docs/math.md#encoder), exact for data far from 0",
        "slem: encoding + its check (the three, whole)": (
            "no all-zero or NaN row is ever committed"
        ),
        "slem: crc32c": "every chunk's checksum, read back before the commit",
        "slem: delete a pruned partition": "keeps KEEP_VERSIONS versions (in a thread)",
        "shown: check_encoded_rows (a pass)": "the write's check of other models' output",
    }
    for name, t in times.items():
        print(
            f"{name:<44} best {min(t) * 1e3:8.2f} ms  median {statistics.median(t) * 1e3:8.2f} ms"
            + (f"  [{why[name]}]" if name in why else "")
        )
    best = {name: min(t) * 1e3 for name, t in times.items()}
    median = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    result: dict = {"n": args.n, "d": args.d, "rows": int(block.shape[0]), "steps_ms": best}
    for what, of in (("bests", best), ("medians", median)):
        floor, slem = sum(of[k] for k in FLOOR_STEPS), sum(of[k] for k in SLEM_STEPS)
        result[f"ratio_{what}"] = floor / slem
        print(
            f"RATIO floor / slem-dask, one partition's steps ({what}) = {floor / slem:.3f} "
            f"(floor {floor:.1f} ms, slem-dask {slem:.1f} ms: read, the encoding and its check, "
            f"crc32c, write, one pruned partition's deletion)"
        )
    C.emit_json("RESULT bench_encode_parts", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
