#!/usr/bin/env python
"""Kernel fit (rbf, rank r, rpcholesky) against the reference accelerated block RPCholesky.

    python benchmarks/bench_rpcholesky.py                       # 200k x 128 and 400k x 512, 3 rounds
    python benchmarks/bench_rpcholesky.py --sizes 2e5x128 --repeat 5 --contenders reference,numpy
    python benchmarks/bench_rpcholesky.py --quick               # 40k x 128, r = 64

Data: the benchmark store of n x d float32 rows (L2-normalized, ``_common.ensure_store``).
Every run of every contender is a fresh child process; the contenders alternate within
each round (round 1: all of them, round 2: all of them, ...). The parent samples the RSS of
the child's whole process tree (workers included) every 20 ms; a child reports its own
time and the tree's RSS just before the timed part (``base``), so ``peak`` and ``peak -
base`` are printed.

Contenders (rbf kernel k(x, y) = exp(-gamma |x - y|^2), gamma 0.5 by default, rank r = 256,
tol 0: every contender stops at r pivots):

* **reference**: accelerated block RPCholesky with rejection sampling (Epperly, Tropp,
  Webber, "Embrace rejection: kernel matrix approximation by accelerated randomly pivoted
  Cholesky", arXiv:2410.03969), written here after the published algorithm and the
  authors' ``accelerated_rpcholesky`` (github.com/eepperly/Randomly-Pivoted-Cholesky,
  rpcholesky.py), in numpy on X in memory: the residual diagonal; each round draws b
  candidates i.i.d. in proportion to it, forms their residual block H = K(S, S) -
  G(:, S)^T G(:, S), runs the rejection Cholesky of H (accept j with probability h_jj /
  d_j, eliminating accepted ones), evaluates the accepted rows' kernel against all n rows,
  subtracts G(:, S)^T G and solves with the accepted block's Cholesky factor, updates the
  diagonal; b starts at ceil(r / 10) and adapts each round so that the rejection step
  costs a quarter of the rest (the authors' default ``b = "auto"``). The factor G is
  held r x n in float64 ("row ordering", as the authors). Kernel blocks are evaluated as
  the authors' GaussianKernel_mtx: scikit-learn's ``euclidean_distances`` then ``exp``
  (on float32 X, scikit-learn computes in float64 by batches and returns float32; the
  exponential is then float32), on all of numpy's BLAS threads.
  Differences from the authors' code, all in the reference's favour or neutral: a seeded
  generator (theirs is unseeded; their rejection step draws from numpy's global
  generator); the kernel of the accepted rows is evaluated on X directly (their
  ``KernelMatrix.__getitem__`` turns ``A[idx, :]`` into a Python list of n indices and
  copies X with it every round); the r x n array ``rows`` of kernel rows that they keep
  for out-of-sample use is not kept (memory and time not spent); the final residual
  trace is the sum of the tracked residual diagonal, as slem-dask's.
* **numpy**: ``KernelSLEM(...).fit(X)`` on the same X in memory (blocks on a thread per
  core, one BLAS thread each).
* **threads**: ``KernelSLEM(...).fit(storage.dask_rows(open_input(store)))`` on dask's
  threaded scheduler (reads from the zarr store included in the time).
* **cluster**: the same on a LocalCluster from ``slem_dask.cluster.connect.connect()`` (started
  and warmed up with a small fit before the timed fit: start-up not counted).
* **cli**: ``slem-dask fit --negatives STORE --model OUT --kernel rbf --gamma G --rank R
  --pivoting rpcholesky --tol 0 --overwrite`` in a fresh process, timed from outside
  (interpreter start, imports, cluster start-up, reading, fit, writing the model).

For the in-memory contenders (reference, numpy) the time is the factorization only (X
is read before); for the others it includes reading the store. Printed per size: every
run (time, trace error = residual trace / trace, passes or rounds, peak memory) with the
load average, best / median / worst, ``RATIO reference / <contender>`` on best times and
on medians (>= 1: slem-dask at least as fast), the ratio of peaks, and a check that the
trace errors are comparable (same rank; both printed, relative difference).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

CONTENDERS = ("reference", "numpy", "threads", "cluster", "cli")
DEFAULT_SIZES = "2e5x128,4e5x512"
QUICK_SIZES = "4e4x128"


# -- the reference ------------------------------------------------------------
def _rbf_block(xa, xb, gamma):
    """The authors' GaussianKernel_mtx: euclidean_distances, squared, exp (bandwidth
    sqrt(1 / (2 gamma)) gives exp(-gamma |x - y|^2))."""
    import numpy as np
    from sklearn.metrics.pairwise import euclidean_distances

    dist = euclidean_distances(xa, xb)
    return np.exp(-gamma * dist**2)


def _rejection_cholesky(h, rng):
    import numpy as np

    b = h.shape[0]
    sampled = np.diag(h).copy()
    h = h.copy()
    lower = np.zeros((b, b))
    accepted = []
    for j in range(b):
        if rng.random() * sampled[j] < h[j, j]:
            accepted.append(j)
            lower[j:, j] = h[j:, j] / np.sqrt(h[j, j])
            h[j + 1 :, j + 1 :] -= np.outer(lower[j + 1 :, j], lower[j + 1 :, j])
    accepted = np.asarray(accepted, dtype=np.int64)
    return lower[np.ix_(accepted, accepted)], accepted


def reference_rpcholesky(x, gamma: float, k: int, seed: int = 0, stoptol: float = 1e-13):
    """Accelerated block RPCholesky (b = "auto"); returns (pivots, G (k x n), trace,
    residual trace, rounds). See the module docstring for what it follows."""
    import numpy as np

    n = x.shape[0]
    diags = np.ones(n)  # rbf: k(x, x) = 1
    orig_trace = float(diags.sum())
    b, auto_b = int(math.ceil(k / 10)), True
    g = np.zeros((k, n))
    rng = np.random.default_rng(seed)
    pivots = np.zeros(k, dtype=np.int64)
    counter, rounds = 0, 0
    while counter < k:
        rounds += 1
        idx = rng.choice(n, size=b, p=diags / diags.sum(), replace=True)
        start = time.perf_counter()
        h = _rbf_block(x[idx], x[idx], gamma) - g[:counter, idx].T @ g[:counter, idx]
        lower, accepted = _rejection_cholesky(h, rng)
        num = len(accepted)
        if num > k - counter:
            num = k - counter
            accepted, lower = accepted[:num], lower[:num, :num]
        idx = idx[accepted]
        rejection_time = time.perf_counter() - start
        start = time.perf_counter()
        pivots[counter : counter + num] = idx
        block = _rbf_block(x[idx], x, gamma) - g[:counter, idx].T @ g[:counter, :]
        g[counter : counter + num] = np.linalg.solve(lower, block)
        diags -= np.sum(g[counter : counter + num] ** 2, axis=0)
        diags = diags.clip(min=0)
        process_time = time.perf_counter() - start
        if auto_b:
            target = int(math.ceil(b * process_time / (4 * max(rejection_time, 1e-9))))
            b = max(
                min(target, int(math.ceil(1.5 * b)), int(math.ceil(k / 3))),
                int(math.ceil(b / 3)),
                10,
            )
        counter += num
        if stoptol > 0 and diags.sum() <= stoptol * orig_trace:
            g = g[:counter]
            break
    return pivots[:counter], g, orig_trace, float(diags.sum()), rounds


# -- children ------------------------------------------------------------------
def _tree_rss(proc) -> int:
    import psutil

    total = 0
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return total


class _Sampler(threading.Thread):
    def __init__(self, pid: int, interval: float = 0.02):
        super().__init__(daemon=True)
        import psutil

        self.proc, self.interval, self.peak = psutil.Process(pid), interval, 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, _tree_rss(self.proc))
            self.stop.wait(self.interval)


def child_main(args) -> int:
    import numpy as np
    import psutil

    from slem_dask import KernelSLEM, storage

    me = psutil.Process()
    kind = args.child
    arr = storage.open_input(args.store, "negatives")
    model = KernelSLEM(
        kernel="rbf",
        gamma=args.gamma,
        rank=args.rank,
        pivoting="rpcholesky",
        tol=0.0,
        random_state=args.rp_seed,
    )
    out = {"kind": kind}
    if kind in ("reference", "numpy"):
        x = arr[...]
        # the same untimed warm-up for every contender (imports, first calls, BLAS
        # threads): a small factorization of the first rows, rank 16
        if kind == "reference":
            reference_rpcholesky(x[:4096], args.gamma, 16, args.rp_seed)
        else:
            KernelSLEM(
                kernel="rbf",
                gamma=args.gamma,
                rank=16,
                pivoting="rpcholesky",
                tol=0.0,
                random_state=0,
            ).fit(x[:4096])
        C.settle()
        out["base"] = _tree_rss(me)
        t0 = time.perf_counter()
        if kind == "reference":
            piv, _, trace, resid, rounds = reference_rpcholesky(
                x, args.gamma, args.rank, args.rp_seed
            )
            out.update(
                seconds=time.perf_counter() - t0,
                rank=int(len(piv)),
                trace_error=resid / trace,
                passes=rounds,
            )
        else:
            model.fit(x)
            out.update(
                seconds=time.perf_counter() - t0,
                rank=int(model.rank_),
                trace_error=float(model.trace_error_),
                passes=int(model.n_passes_),
            )
    else:
        import contextlib

        import dask

        from slem_dask.cluster.connect import connect

        with contextlib.ExitStack() as stack:
            if kind == "cluster":
                stack.enter_context(connect(quiet=True))
            else:
                stack.enter_context(dask.config.set(scheduler="threads"))
            x = storage.dask_rows(arr, args.partition_rows)
            KernelSLEM(
                kernel="rbf",
                gamma=args.gamma,
                rank=16,
                pivoting="rpcholesky",
                tol=0.0,
                random_state=0,
            ).fit(x[:4096])  # warm-up alike, not timed
            C.settle()
            out["base"] = _tree_rss(me)
            t0 = time.perf_counter()
            model.fit(x)
            out.update(
                seconds=time.perf_counter() - t0,
                rank=int(model.rank_),
                trace_error=float(model.trace_error_),
                passes=int(model.n_passes_),
            )
    out["own_peak"] = me.memory_info().rss
    print("CHILD " + json.dumps(out), flush=True)
    del np
    return 0


def run_child(args, kind: str, path: str, n: int) -> dict:
    if kind == "cli":
        exe = os.path.join(os.path.dirname(sys.executable), "slem-dask")
        out_path = os.path.join(args.workdir, f"rpcholesky-cli-model-n{n}.zarr")
        cmd = [
            exe,
            "fit",
            "--negatives",
            path,
            "--model",
            out_path,
            "--kernel",
            "rbf",
            "--gamma",
            str(args.gamma),
            "--rank",
            str(args.rank),
            "--pivoting",
            "rpcholesky",
            "--tol",
            "0",
            "--seed",
            str(args.rp_seed),
            "--overwrite",
            "--no-progress",
        ]
        if args.partition_rows:
            cmd += ["--partition-rows", str(args.partition_rows)]
    else:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            kind,
            "--store",
            path,
            "--gamma",
            str(args.gamma),
            "--rank",
            str(args.rank),
            "--rp-seed",
            str(args.rp_seed),
        ]
        if args.partition_rows:
            cmd += ["--partition-rows", str(args.partition_rows)]
    C.settle()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = _Sampler(proc.pid)
    sampler.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    if proc.returncode:
        raise RuntimeError(f"{kind} failed ({proc.returncode}):\n{stdout}\n{stderr}")
    if kind == "cli":
        from slem_dask import load_model

        m = load_model(out_path)
        res = {
            "kind": kind,
            "seconds": wall,
            "base": 0,
            "rank": int(m.rank_),
            "trace_error": float(m.trace_error_),
            "passes": int(m.n_passes_),
        }
    else:
        res = json.loads([ln for ln in stdout.splitlines() if ln.startswith("CHILD ")][-1][6:])
    res["peak"] = sampler.peak
    return res


def _mib(b) -> str:
    return f"{b / 2**20:,.0f} MiB"


def bench_size(args, n: int, d: int) -> dict:
    path = C.ensure_store(args.workdir, n, d, args.seed, args.chunk_rows)
    print(
        f"\n--- n = {n:,}, d = {d}, rbf gamma {args.gamma}, rank {args.rank}, store "
        f"{C.describe_store(path)}",
        flush=True,
    )
    runs = {k: [] for k in args.contenders}
    for rnd in range(args.repeat):
        for kind in args.contenders:
            load = C.load_line()
            r = run_child(args, kind, path, n)
            runs[kind].append(r)
            print(
                f"  round {rnd + 1} {kind:>9}: {r['seconds']:7.3f} s  trace error "
                f"{r['trace_error']:.5f}  rank {r['rank']}  passes/rounds {r['passes']:3d}  "
                f"peak {_mib(r['peak'])} ({_mib(r['peak'] - r['base'])} above the "
                f"start of the timed part)  [{load}]",
                flush=True,
            )
    print(f"  summary (n = {n:,}, d = {d}; {C.load_line()}):")
    for kind, rs in runs.items():
        print(
            f"    {kind:>9}: {C.spread([r['seconds'] for r in rs])}; peak "
            f"{_mib(max(r['peak'] for r in rs))}; trace error "
            f"{statistics.median(r['trace_error'] for r in rs):.5f} (median)"
        )
    out = {"n": n, "d": d, "runs": runs}
    if "reference" in runs:
        ref = [r["seconds"] for r in runs["reference"]]
        ref_te = statistics.median(r["trace_error"] for r in runs["reference"])
        ref_peak = max(r["peak"] for r in runs["reference"])
        for kind, rs in runs.items():
            if kind == "reference":
                continue
            t = [r["seconds"] for r in rs]
            te = statistics.median(r["trace_error"] for r in rs)
            peak = max(r["peak"] for r in rs)
            best, med = min(ref) / min(t), statistics.median(ref) / statistics.median(t)
            out[f"ratio_{kind}"] = {"best": best, "median": med}
            print(
                f"  RATIO reference / {kind}: best {best:.2f}, median {med:.2f}  "
                f"(n = {n:,}, d = {d})"
            )
            C.band(
                f"n={n:,} d={d}: reference / {kind}", ref, t, args.band, names=("reference", kind)
            )
            same_rank = {r["rank"] for r in rs} == {r["rank"] for r in runs["reference"]}
            rel = abs(te - ref_te) / ref_te if ref_te else float("nan")
            print(
                f"    trace error {kind} {te:.5f} vs reference {ref_te:.5f} "
                f"(relative difference {rel:.1%}; same rank: {same_rank}); peak "
                f"{_mib(peak)} vs reference {_mib(ref_peak)} (ratio {peak / ref_peak:.2f})"
            )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--store", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--sizes",
        default=None,
        help=f"comma-separated NxD (default {DEFAULT_SIZES}; --quick {QUICK_SIZES})",
    )
    p.add_argument("--rank", type=C.int_size, default=None, help="pivots (default 256; --quick 64)")
    p.add_argument("--gamma", type=float, default=0.5, help="rbf gamma (default 0.5)")
    p.add_argument("--rp-seed", type=int, default=0, help="seed of the factorizations")
    p.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated subset of {','.join(CONTENDERS)}",
    )
    p.add_argument(
        "--partition-rows",
        type=C.int_size,
        default=None,
        help="rows per dask partition (default: the library's)",
    )
    p.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    p.add_argument("--workdir", default=C.DEFAULT_WORKDIR)
    p.add_argument("--chunk-rows", type=C.int_size, default=C.DEFAULT_CHUNK_ROWS)
    p.add_argument("--seed", type=int, default=0, help="seed of the data stream")
    p.add_argument("--quick", action="store_true")
    C.add_band_arg(
        p,
        0.20,
        "every run is a fresh child process, contenders alternating "
        "within each round, each warmed up by a rank-16 fit of 4096 rows",
    )
    args = p.parse_args(argv)
    if args.rank is None:
        args.rank = 64 if args.quick else 256
    if args.child:
        return child_main(args)
    args.contenders = [c for c in args.contenders.split(",") if c]
    bad = set(args.contenders) - set(CONTENDERS)
    if bad:
        p.error(f"unknown contenders {sorted(bad)}")
    sizes = []
    for item in (args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)).split(","):
        n, d = item.lower().split("x")
        sizes.append((C.int_size(n), C.int_size(d)))
    C.header(
        "bench_rpcholesky: kernel fit (rbf, rpcholesky) vs reference accelerated block RPCholesky",
        args,
    )
    results = [bench_size(args, n, d) for n, d in sizes]
    for n, _ in sizes:
        shutil.rmtree(
            os.path.join(args.workdir, f"rpcholesky-cli-model-n{n}.zarr"), ignore_errors=True
        )
    C.emit_json(
        "RESULT bench_rpcholesky",
        {
            "sizes": [{k: v for k, v in r.items() if k != "runs"} for r in results],
            "gamma": args.gamma,
            "rank": args.rank,
            "load": C.load_line(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
