#!/usr/bin/env python
"""Real image descriptors: mAP per method and parameter, encode cost, at 8192-D and 512-D.

The corpus (benchmarks/realdesc_corpus.py; built once, cached under --workdir): VLAD of
RootSIFT, 64 words x 128 = 8192-D, from the photos that scikit-image, scikit-learn and
matplotlib ship (nothing is downloaded; `pip install -e '.[bench]'`): 13 photos as
instances with 20 near-duplicate database variants and 3 query variants each (crop,
scale, rotation, JPEG, noise); the codebook and 3,000 negatives from 17 other photos.
The 512-D version projects every row on the negatives' 512 leading principal directions
(no whitening) and L2-normalizes it again.

For each width, :func:`slem_dask.pipeline.evaluate.grid_search` (numpy, in this process)
scores raw features, PCA whitening, E-SVM, linear SLEM over a lambda grid and kernel SLEM
over a gamma grid (each at its defaults first), then the encode cost: seconds per image
of one LinearSLEM.transform call on one float32 row, against the bare product of that
row with A^-1 in float32 (the same run, best of many).

This corpus is small and easy (13 instances, each a set of near-duplicates of one photo):
it checks the methods on real descriptors at the paper's width; it is not Holidays.

    python benchmarks/bench_realdesc.py                      # both widths (~15-30 min on 2 cores)
    python benchmarks/bench_realdesc.py --dims 512 --no-esvm
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import realdesc_corpus  # noqa: E402

from slem_dask import LinearSLEM, storage  # noqa: E402
from slem_dask.pipeline.evaluate import format_table, grid_search  # noqa: E402

#: linear SLEM's lambdas: relative to tr(Sigma) (the default first), and the paper's 1e-3
SLEM_LAMS = ["0.01x", "0.003x", "0.001x", "0.0003x", "0.0001x", 1e-3]
#: kernel SLEM's gammas, relative to the negatives' median squared distance
KERNEL_GAMMAS = ["0.5x", "0.25x", "0.125x", "0.0625x", "0.03125x"]


def read(path: str):
    group = storage.open_node(path)
    arrays = [np.asarray(group[n][...]) for n in ("negatives", "database", "queries")]
    labels = [np.asarray(group[n][...]) for n in ("database_labels", "query_labels")]
    from slem_dask.pipeline.evaluate import relevant_from_labels

    return (*arrays, relevant_from_labels(*labels))


def project(neg, db, q, k: int):
    """Rows projected on the negatives' k leading principal directions, L2-normalized."""
    mean = neg.mean(0, dtype=np.float64)
    centred = neg.astype(np.float64) - mean
    gram = centred @ centred.T
    values, vectors = np.linalg.eigh(gram)
    top = np.argsort(values)[::-1][:k]
    basis = centred.T @ vectors[:, top] / np.sqrt(values[top])

    def out(x):
        y = (x.astype(np.float64) - mean) @ basis
        return (y / np.linalg.norm(y, axis=1, keepdims=True)).astype(np.float32)

    return out(neg), out(db), out(q)


def encode_cost(neg, rows, repeat: int = 30) -> dict:
    """Seconds per call of LinearSLEM.transform on one float32 row, and of the bare
    float32 product of that row with A^-1 (best of ``repeat`` each, alternated)."""
    model = LinearSLEM().fit(neg)
    matrix = model._encoding_matrix(np.float32, "auto")
    row = rows[:1]
    model.transform(row)  # the first call after a fit computes what is cached
    encode, bare = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        model.transform(row)
        encode.append(time.perf_counter() - t)
        t = time.perf_counter()
        row @ matrix
        bare.append(time.perf_counter() - t)
    return {"encode": min(encode), "bare": min(bare), "dtype": str(matrix.dtype)}


def pca_fit_times(neg) -> dict:
    """Seconds of a PCAWhitening fit on the n x n Gram matrix (n < d: the default path)
    and on the d x d covariance (the path before; its eigendecomposition dominates)."""
    from slem_dask import PCAWhitening

    model = PCAWhitening()
    t = time.perf_counter()
    model.fit(neg)
    gram = time.perf_counter() - t
    t = time.perf_counter()
    model._fit_covariance(neg)
    return {"gram": gram, "covariance": time.perf_counter() - t}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default=C.DEFAULT_WORKDIR)
    p.add_argument("--dims", default="8192,512")
    p.add_argument("--no-esvm", action="store_true", help="leave out E-SVM (the slowest)")
    p.add_argument("--no-kernel", action="store_true")
    p.add_argument("--lams", default=",".join(map(str, SLEM_LAMS)))
    p.add_argument("--gammas", default=",".join(KERNEL_GAMMAS))
    p.add_argument(
        "--pca-fit", action="store_true", help="also time PCA whitening's fit: Gram vs covariance"
    )
    args = p.parse_args(argv)
    print(f"# bench_realdesc; {C.load_line()}", flush=True)
    os.makedirs(args.workdir, exist_ok=True)
    path = realdesc_corpus.build(os.path.join(args.workdir, "realdesc.zarr"))
    neg, db, q, relevant = read(path)
    # the key names the settings and the packages that make the corpus, not every library
    # under them nor the CPU: the bytes tell two runs' corpora apart (2026-11-30: the same
    # key as 11-28's, raw mAP 0.9871 against 0.9878; docs/benchmarks.md)
    content = hashlib.sha256()
    for rows in (neg, db, q):
        content.update(np.ascontiguousarray(rows).view(np.uint8).reshape(-1))
    print(f"corpus content: SHA-256 {content.hexdigest()[:16]} of its negatives, database, queries")
    lams = [float(v) if not v.endswith("x") else v for v in args.lams.split(",")]
    for d in [int(v) for v in args.dims.split(",")]:
        data = (neg, db, q) if d == neg.shape[1] else project(neg, db, q, d)
        print(f"\n## d = {d}: {len(neg)} negatives, {len(db)} database rows, {len(q)} queries")
        grids = {"raw": {}, "pca": {}, "esvm": {}, "slem": {"lam": lams}, "kernel": {}}
        if args.no_esvm:
            del grids["esvm"]
        if args.no_kernel:
            del grids["kernel"]
        else:
            grids["kernel"] = {"gamma": args.gammas.split(",")}
        t = time.perf_counter()
        rows, _, _ = grid_search(*data, relevant, grids)
        print(format_table(rows))
        print(f"(grid: {time.perf_counter() - t:.0f} s; {C.load_line()})", flush=True)
        cost = encode_cost(data[0], data[2])
        print(
            f"encode one row (LinearSLEM.transform, float32 in): {cost['encode'] * 1e3:.3f} ms; "
            f"bare product with A^-1 ({cost['dtype']}): {cost['bare'] * 1e3:.3f} ms; "
            f"ratio {cost['encode'] / cost['bare']:.2f}",
            flush=True,
        )
        if args.pca_fit:
            times = pca_fit_times(data[0])
            print(
                f"PCA whitening fit, n = {len(data[0])}, d = {d}: Gram matrix "
                f"{times['gram']:.2f} s, d x d covariance {times['covariance']:.2f} s "
                f"(ratio {times['covariance'] / times['gram']:.1f}; {C.load_line()})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
