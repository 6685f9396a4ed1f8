#!/usr/bin/env python
"""Every entry point as fast as the library (issue 20): ``slem-dask fit`` and ``slem-dask
encode`` against the same calls of the library, on the same stores, in the same rounds.

For each size (default 40,000 and 400,000 rows x 512 float32, zstd; 78 MiB and 781 MiB)
and each command, one round runs, one after the other (each starts settled: dirty pages
synced, 0.3 s for idle BLAS threads):

* **CLI**: ``slem-dask fit|encode ... --overwrite --no-progress`` in a fresh process,
  timed from outside (interpreter start, imports, cluster, job, exit), with its own
  printed cluster start-up and job time (``total [s]``) parsed; ``--local-cluster``
  chooses the cluster (default: ``auto``, what a user gets);
* **library** in a fresh ``python -c`` process: imports, then the call twice, timed
  inside: *cold* (the first call in the process) and *warm* (the second); from outside,
  the process's wall time less the warm call is the library's "fresh process" time,
  comparable with the CLI's wall time.

  fit: ``pipeline.fit_job(None, store, model)`` on dask's threaded scheduler (the CLI
  job's own checks, leases and versioned commit; ``--fit-api estimator``:
  ``LinearSLEM(lam).fit(storage.dask_rows(arr))`` + ``save``); encode:
  ``model.transform(da.from_zarr(store))`` + ``da.store`` into a new zarr array of the
  same chunks (no Client; the model is the CLI's, loaded once before the calls).

Printed: every run with the load average, best / median / worst of each, and
``RATIO`` lines library / CLI (best runs and medians): wall (library fresh process /
CLI wall), job (library warm call / CLI job) and cold (library cold call / CLI job).
Goals: library / CLI >= 0.9 at 400,000 x 512 (issue 42), and the 40,000 x 512 CLI
fit under 2 s end to end at the median.

Both contenders import compiled bytecode: slem-dask's modules are compiled once before
the runs. With PYTHONDONTWRITEBYTECODE set (as on this project's machines) every fresh
process compiled them again, and not alike: the CLI's 114 modules took 0.26 CPU s, the
library's 80 took 0.16 s, a cost that an installed package does not pay.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

LIBRARY = r"""
import json, sys, time
t0 = time.perf_counter()
import dask, dask.array as da, zarr
from slem_dask import pipeline, storage
from slem_dask.models import LinearSLEM, load_model
imports = time.perf_counter() - t0
what, api, store, out, model_path, lam = sys.argv[1:7]
lam = float(lam)

def call():
    with dask.config.set(scheduler="threads"):
        if what == "fit" and api == "job":
            pipeline.fit_job(None, store, out, lam=lam, overwrite=True)
        elif what == "fit":
            arr = zarr.open_array(store, mode="r")
            LinearSLEM(lam).fit(storage.dask_rows(arr)).save(out, overwrite=True)
        else:
            y = model.transform(da.from_zarr(store))
            z = zarr.create_array(out, shape=y.shape, dtype=y.dtype,
                                  chunks=zarr.open_array(store, mode="r").chunks,
                                  overwrite=True)
            da.store(y, z, lock=False)

model = load_model(model_path) if what == "encode" else None
times = []
for _ in range(2):
    t = time.perf_counter()
    call()
    times.append(time.perf_counter() - t)
print("LIBRARY " + json.dumps({"imports": imports, "cold": times[0], "warm": times[1]}))
sys.stdout.flush()
"""


def compile_package() -> None:
    """slem-dask's bytecode written next to its sources (``__pycache__``, ignored by git),
    so that no timed process compiles them, whatever PYTHONDONTWRITEBYTECODE says."""
    import compileall

    import slem_dask

    compileall.compile_dir(os.path.dirname(slem_dask.__file__), quiet=1)


def run_cli(cmd: list[str]) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    startup = re.search(r"start-up ([0-9.]+) s", done.stdout)
    job = re.search(r"total \[s\]\s+([0-9.]+)", done.stdout)
    where = re.search(r"with \d+ worker\(s\).*?(?=, start-up)", done.stdout)
    return {
        "wall": wall,
        "startup": float(startup.group(1)) if startup else float("nan"),
        "job": float(job.group(1)) if job else float("nan"),
        "where": where.group(0) if where else "?",
    }


def run_library(args_list: list[str]) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", LIBRARY, *args_list], capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"library call failed:\n{done.stdout}\n{done.stderr}")
    line = [s for s in done.stdout.splitlines() if s.startswith("LIBRARY ")][-1]
    result = json.loads(line[len("LIBRARY ") :])
    result["fresh"] = wall - result["warm"]  # interpreter, imports, first call, exit
    return result


def ratio(lib: list[float], cli: list[float]) -> str:
    med = C.statistics.median
    return f"{min(lib) / min(cli):.2f} (best), {med(lib) / med(cli):.2f} (medians)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    C.add_common_args(parser, sizes=False)
    C.add_run_args(parser, repeat=3)
    C.add_band_arg(
        parser,
        0.15,
        "fresh processes of 1-10 s alternating CLI and library, after one untimed round of each",
    )
    parser.add_argument(
        "--sizes", default=None, help="row counts of the stores (default 4e4,4e5; --quick: 1e4,4e4)"
    )
    parser.add_argument(
        "--commands", default="fit,encode", help="fit, encode or both (default fit,encode)"
    )
    parser.add_argument(
        "--local-cluster",
        default="auto",
        choices=["auto", "processes", "threads"],
        help="the CLI's --local-cluster (default auto)",
    )
    parser.add_argument(
        "--fit-api",
        default="job",
        choices=["job", "estimator"],
        help="library fit: pipeline.fit_job(None, ...) or LinearSLEM.fit",
    )
    args = parser.parse_args(argv)
    C.resolve_sizes(args)
    if args.sizes is None:
        args.sizes = "1e4,4e4" if args.quick else "4e4,4e5"
    sizes = [C.int_size(s) for s in args.sizes.split(",")]
    commands = args.commands.split(",")
    C.header(f"bench_entry_points: CLI vs library, sizes {sizes} x d={args.d} float32", args)
    exe = os.path.join(os.path.dirname(sys.executable), "slem-dask")
    compile_package()
    results = {}
    for n in sizes:
        path = C.ensure_store(args.workdir, n, args.d, args.seed, args.chunk_rows)
        print(f"data: {C.describe_store(path)}")
        w = lambda name: os.path.join(args.workdir, f"bench-entry-{name}-n{n}-d{args.d}")  # noqa
        model = w("model.zarr")
        # the model the encodes use (not timed)
        subprocess.run(
            [
                exe,
                "fit",
                "--negatives",
                path,
                "--model",
                model,
                "--lam",
                str(args.lam),
                "--overwrite",
                "--no-progress",
            ],
            check=True,
            capture_output=True,
        )
        runs = {}
        # round 0 is untimed, the same for every contender: a first CLI fit (the model
        # above) had warmed the CLI's files in the page cache but not the library's
        for r in range(-1, args.repeat):
            label = f"run {r + 1}" if r >= 0 else "warm-up (not counted)"
            kept = runs if r >= 0 else {}
            for what in commands:
                cli = [
                    exe,
                    what,
                    "--overwrite",
                    "--no-progress",
                    "--local-cluster",
                    args.local_cluster,
                ]
                cli += (
                    ["--negatives", path, "--model", w("cli-model.zarr"), "--lam", str(args.lam)]
                    if what == "fit"
                    else ["--model", model, "--positives", path, "--out", w("cli-codes.zarr")]
                )
                if args.partition_rows:
                    cli += ["--partition-rows", str(args.partition_rows)]
                C.settle()
                load = C.load_line()
                c = run_cli(cli)
                kept.setdefault((what, "cli"), []).append(c)
                print(
                    f"n={n:,} {label}: {what:<6} CLI     {c['wall']:6.2f} s wall "
                    f"(start-up {c['startup']:.2f} s, job {c['job']:.2f} s; {c['where']}) "
                    f"| {load}",
                    flush=True,
                )
                out = w("lib-model.zarr" if what == "fit" else "lib-codes.zarr")
                C.settle()
                load = C.load_line()
                lib = run_library([what, args.fit_api, path, out, model, str(args.lam)])
                kept.setdefault((what, "lib"), []).append(lib)
                print(
                    f"n={n:,} {label}: {what:<6} library {lib['fresh']:6.2f} s fresh "
                    f"process (imports {lib['imports']:.2f} s, cold call {lib['cold']:.2f} "
                    f"s), warm call {lib['warm']:.2f} s | {load}",
                    flush=True,
                )
        print()
        for what in commands:
            cli, lib = runs[(what, "cli")], runs[(what, "lib")]
            series = {
                "CLI wall": [c["wall"] for c in cli],
                "CLI start-up": [c["startup"] for c in cli],
                "CLI job": [c["job"] for c in cli],
                "library fresh process": [x["fresh"] for x in lib],
                "library cold call": [x["cold"] for x in lib],
                "library warm call": [x["warm"] for x in lib],
            }
            for name, values in series.items():
                print(f"n={n:,} {what:<6} {name:<22} {C.spread(values)}")
            print(
                f"RATIO n={n:,} {what} wall: library fresh process / CLI wall = "
                f"{ratio(series['library fresh process'], series['CLI wall'])} "
                f"[goal: >= 0.9 at 400,000 x 512]"
            )
            print(
                f"RATIO n={n:,} {what} job: library warm call / CLI job = "
                f"{ratio(series['library warm call'], series['CLI job'])}"
            )
            print(
                f"RATIO n={n:,} {what} cold: library cold call / CLI job = "
                f"{ratio(series['library cold call'], series['CLI job'])}"
            )
            C.band(
                f"n={n:,} {what} wall: library fresh process / CLI wall",
                series["library fresh process"],
                series["CLI wall"],
                args.band,
                names=("library", "CLI"),
            )
            C.band(
                f"n={n:,} {what} job: library warm call / CLI job",
                series["library warm call"],
                series["CLI job"],
                args.band,
                names=("library", "CLI"),
            )
            if what == "fit" and n <= 100_000:
                print(
                    f"GOAL n={n:,} fit end to end under 2 s at the median: "
                    f"{C.statistics.median(series['CLI wall']):.2f} s"
                )
            results[f"{what}-n{n}"] = series
        print(C.load_line())
        for name in ("cli-model.zarr", "cli-codes.zarr", "lib-model.zarr", "lib-codes.zarr"):
            shutil.rmtree(w(name), ignore_errors=True)
    C.emit_json(
        "RESULT bench_entry_points",
        {"d": args.d, "runs": results, "local_cluster": args.local_cluster},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
