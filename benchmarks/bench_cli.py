#!/usr/bin/env python
"""End-to-end time of a small ``slem-dask fit`` from the shell, as a user runs it.

Each run is a fresh process (interpreter start, imports, cluster start-up, the
job, shutdown), timed from outside, on a store of n x d float32 negatives
(default 40,000 x 512: 78 MiB, under issue 9's 100 MB "small job"):

* ``slem-dask fit`` with the default ``--local-cluster auto`` (an in-process
  LocalCluster for inputs under 256 MiB);
* ``slem-dask fit --local-cluster processes`` (worker processes, one per core);
* the reference: the same fit by hand in a fresh ``python -c`` process (read the
  store with zarr, float32 X^T X and float64 mean, Sigma + lam I inverted by
  Cholesky, ``np.save`` of mean and inverse): what the CLI's fixed costs are
  measured against.

Printed: every run with the CLI's own start-up and job times, best/median, and
``RATIO`` of each CLI variant to the reference (goal: the default under 3 s).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

BY_HAND = """
import sys, numpy as np, zarr
from scipy.linalg import cho_factor, cho_solve
x = zarr.open_array(sys.argv[1], mode="r")[...]
mean = x.mean(axis=0, dtype=np.float64)
cov = (x.T @ x).astype(np.float64) / len(x) - np.outer(mean, mean)
cov[np.diag_indices_from(cov)] += 1e-3
np.save(sys.argv[2], np.vstack([mean, cho_solve(cho_factor(cov), np.eye(len(cov)))]))
"""


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    return wall, done.stdout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    C.add_common_args(parser, default_n=40_000)
    C.add_run_args(parser, repeat=5)
    C.add_band_arg(
        parser,
        0.15,
        "each run is a fresh process of 1-3 s, the contenders "
        "alternate, and each had one untimed run to load its files into the cache",
    )
    args = parser.parse_args(argv)
    C.resolve_sizes(args)
    C.header(f"bench_cli: slem-dask fit end to end, n={args.n:,} d={args.d} float32", args)
    path = C.ensure_store(args.workdir, args.n, args.d, args.seed, args.chunk_rows)
    print(f"data: {C.describe_store(path)}")
    exe = os.path.join(os.path.dirname(sys.executable), "slem-dask")
    model = os.path.join(args.workdir, "bench-cli-model.zarr")
    contenders = {
        "slem-dask fit (default)": [
            exe,
            "fit",
            "--negatives",
            path,
            "--model",
            model,
            "--lam",
            "1e-3",
            "--overwrite",
            "--no-progress",
        ],
        "slem-dask fit --local-cluster processes": [
            exe,
            "fit",
            "--negatives",
            path,
            "--model",
            model,
            "--lam",
            "1e-3",
            "--overwrite",
            "--no-progress",
            "--local-cluster",
            "processes",
        ],
        "numpy by hand (python -c)": [
            sys.executable,
            "-c",
            BY_HAND,
            path,
            os.path.join(args.workdir, "bench-cli-by-hand.npy"),
        ],
    }
    runs = {name: [] for name in contenders}
    for name, cmd in contenders.items():  # one untimed run of each: the same warm file cache
        wall, _ = timed(cmd)
        print(f"warm-up: {name:<42} {wall:6.2f} s wall (not counted)")
    for r in range(args.repeat):
        for name, cmd in contenders.items():
            wall, out = timed(cmd)
            runs[name].append(wall)
            startup = re.search(r"start-up ([0-9.]+) s", out)
            job = re.search(r"total \[s\]\s+([0-9.]+)", out)
            parts = (
                f" (cluster start-up {startup.group(1)} s, job {job.group(1)} s)"
                if startup and job
                else ""
            )
            print(f"run {r + 1}: {name:<42} {wall:6.2f} s wall{parts} | {C.load_line()}")
            sys.stdout.flush()
    shutil.rmtree(model, ignore_errors=True)
    print()
    med = C.statistics.median
    ref = runs["numpy by hand (python -c)"]
    result = {"n": args.n, "d": args.d}
    for name, walls in runs.items():
        print(f"{name:<42} {C.spread(walls)}")
        result[name] = walls
    for name, walls in runs.items():
        if name.startswith("slem-dask"):
            print(
                f"RATIO reference_time / ({name}) = {min(ref) / min(walls):.2f} (best), "
                f"{med(ref) / med(walls):.2f} (medians); best {min(walls):.2f} s "
                f"[goal: default under 3 s]"
            )
            C.band(
                f"cli reference / ({name})", ref, walls, args.band, names=("numpy by hand", name)
            )
    C.emit_json("RESULT bench_cli", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
