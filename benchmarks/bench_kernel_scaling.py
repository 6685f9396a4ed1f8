"""Kernel SLEM at scale: fit time against n, passes over the data, encode throughput.

    python benchmarks/bench_kernel_scaling.py                 # n = 1e5 .. 1e6, d = 512, r = 256
    python benchmarks/bench_kernel_scaling.py --quick         # n = 2e4 .. 1e5, d = 128, r = 64

Every size is a prefix of the same data store (see _common.py), fitted on the same
LocalCluster (one single-threaded worker process per core). For each n it prints the
rpcholesky fit time, the time per 1e5 rows (flat = linear growth in n), the passes over
the data and the trace error, with the linear SLEM fit time of the same rows as the
reference measured in the same run; greedy pivoting is timed at the smallest n only (one
pass per pivot). Then encode throughput, positives per second, kernel vs linear SLEM, on
the same positives (the first rows of the store), computed and discarded in memory.
"""

from __future__ import annotations

import argparse
import time

from _common import (
    add_band_arg,
    add_common_args,
    add_run_args,
    band,
    default_chunk_rows,
    emit_json,
    ensure_store,
    header,
    int_size,
    load_line,
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    add_common_args(p, sizes=False)
    add_run_args(p, repeat=3)
    add_band_arg(
        p,
        0.20,
        "fits of one to tens of seconds on the LocalCluster, kernel and "
        "linear alternating, after one untimed fit of each",
    )
    p.add_argument("--sizes", default=None, help="comma-separated n (default 1e5,2.5e5,5e5,1e6)")
    p.add_argument("--rank", type=int_size, default=None, help="pivots r (default 256)")
    p.add_argument("--gamma", type=float, default=0.5)
    p.add_argument(
        "--positives",
        type=int_size,
        default=None,
        help="rows encoded for the throughput (default 1e5)",
    )
    args = p.parse_args(argv)
    quick = args.quick
    sizes = [
        int_size(s)
        for s in (args.sizes or ("2e4,5e4,1e5" if quick else "1e5,2.5e5,5e5,1e6")).split(",")
    ]
    d = args.d or (128 if quick else 512)
    rank = args.rank or (64 if quick else 256)
    n_pos = args.positives or (20_000 if quick else 100_000)
    header("kernel SLEM scaling: fit time vs n, passes, encode throughput", args)

    from slem_dask import KernelSLEM, LinearSLEM, storage
    from slem_dask.cluster.connect import connect

    path = ensure_store(
        args.workdir,
        max(sizes),
        d,
        seed=args.seed,
        chunk_rows=args.chunk_rows or default_chunk_rows(d),
    )
    arr = storage.open_input(path, "negatives")
    rows = []
    with connect(None, args.workers, args.threads):

        def kernel(pivoting):
            return KernelSLEM(
                kernel="rbf",
                gamma=args.gamma,
                rank=rank,
                pivoting=pivoting,
                tol=0.0,
                random_state=0,
            )

        x = storage.dask_rows(arr, args.partition_rows)
        # one untimed fit of each contender: imports, BLAS, first reads in the workers
        kernel("rpcholesky").fit(x[: rank * 8])
        kernel("greedy").fit(x[: rank * 8])
        LinearSLEM().fit(x[: rank * 8])
        runs = {}
        for n in sizes:
            xn = x[:n]
            kernel_runs, linear_runs = [], []
            for _ in range(args.repeat):  # alternating: a change of load hits both
                t = time.perf_counter()
                km = kernel("rpcholesky").fit(xn)
                kernel_runs.append(time.perf_counter() - t)
                t = time.perf_counter()
                LinearSLEM().fit(xn)
                linear_runs.append(time.perf_counter() - t)
            runs[n] = (kernel_runs, linear_runs)
            t_kernel, t_linear = min(kernel_runs), min(linear_runs)
            rows.append(
                {
                    "n": n,
                    "kernel_fit_s": t_kernel,
                    "s_per_1e5_rows": t_kernel / n * 1e5,
                    "passes": km.n_passes_,
                    "trace_error": km.trace_error_,
                    "linear_fit_s": t_linear,
                }
            )
            print(
                f"n={n:>9,}  best of {args.repeat}: rpcholesky fit {t_kernel:7.2f} s  ({t_kernel / n * 1e5:5.2f} s "
                f"per 1e5 rows)  passes {km.n_passes_:3d}  trace error "
                f"{km.trace_error_:.4f}  | linear SLEM fit {t_linear:6.2f} s  ({load_line()})",
                flush=True,
            )
        n0 = sizes[0]
        t = time.perf_counter()
        kg = kernel("greedy").fit(x[:n0])
        t_greedy = time.perf_counter() - t
        print(
            f"n={n0:>9,}  greedy fit {t_greedy:7.2f} s  passes {kg.n_passes_}  trace error "
            f"{kg.trace_error_:.4f}  (rpcholesky: {rows[0]['kernel_fit_s']:.2f} s, "
            f"{rows[0]['passes']} passes)",
            flush=True,
        )

        positives = x[:n_pos]
        lin = LinearSLEM().fit(x[: sizes[0]])
        rates = {}
        for name, model in (("kernel", km), ("linear", lin)):
            model.transform(positives[:1000]).compute()  # warm-up: ship the model
            t = time.perf_counter()
            model.transform(positives).compute()
            rates[name] = n_pos / (time.perf_counter() - t)
        print(
            f"encode throughput on {n_pos:,} positives (d={d}): kernel r={rank} "
            f"{rates['kernel']:,.0f} /s, linear {rates['linear']:,.0f} /s, "
            f"ratio linear/kernel {rates['linear'] / rates['kernel']:.2f}",
            flush=True,
        )

    print()
    for n, (kernel_runs, linear_runs) in runs.items():
        band(
            f"n={n:,}: rpcholesky fit / linear SLEM fit",
            kernel_runs,
            linear_runs,
            args.band,
            names=("rpcholesky", "linear SLEM"),
        )
    print(
        "| n | rpcholesky fit [s] | s per 1e5 rows | passes | trace error | linear SLEM fit [s] |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']:,} | {r['kernel_fit_s']:.2f} | {r['s_per_1e5_rows']:.2f} | "
            f"{r['passes']} | {r['trace_error']:.4f} | {r['linear_fit_s']:.2f} |"
        )
    emit_json(
        "RESULT",
        {
            "sizes": rows,
            "greedy": {"n": n0, "fit_s": t_greedy, "passes": kg.n_passes_},
            "encode_per_s": rates,
            "d": d,
            "rank": rank,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
