#!/usr/bin/env python
"""Encode time: slem-dask (``pipeline.encode_job``) vs the numpy pipeline and naive Dask.

The positives are the same n x d float32 store as bench_fit (the negatives
store is encoded with a model fitted on itself; the data do not change the
cost). The model is fitted once with ``fit_job`` (not timed).

* slem-dask: ``encode_job(client, model, store, out)``: read the store,
  transform (float32 inputs in float32 under precision "auto": centre with a
  two-term mean, one product with A^-1 cast to float32, L2-normalize), write a
  float32 zarr output (one chunk per partition); ``client=None`` on the
  threaded scheduler. Timed from outside: the whole job (load model, create
  output, encode+write, commit, pruning of the oldest version).
* naive Dask: ``A = da.from_zarr(store)``; ``Z = (A - mean) @ precision`` in
  float32, divided by its row norms, ``da.to_zarr`` to a new array (default
  codecs), on the same scheduler.
* numpy: ``X = arr[...]``; ``Z = (X - mean) @ precision`` with the model's
  mean_ and precision_ cast to ``--numpy-dtype`` (default float32, numpy's
  multi-threaded BLAS); rows divided by their norms; written with
  ``out[...] = Z`` to a zarr array with the same shape, dtype, chunking and
  (default) codecs as the slem-dask output. Timed: read + compute + write.

``--kernel-rank R``: the model is a KernelSLEM (rbf, ``--gamma``, rank R, rpcholesky)
fitted on the store, and the numpy contender is the kernel model by hand on all
rows at once: the kernel against the pivots, a triangular solve, one product
(float64, as the library), float32 output; no naive Dask contender.

* floor (``--floor``, linear models): the least work any float32 encode must do, on
  the same scheduler: delete the previous output, then per partition slem-dask's
  reader, one float32 product with A^-1, an L2 normalization and one plain file
  write of the rows (no centring, checks, checksums, metadata or commit).
  ``RATIO floor_time / slem_time``: 1.0 would mean slem-dask does nothing beyond it.
  Beside it, ``RATIO floor_user_cpu / slem_user_cpu`` (medians; this process and the
  workers): what slem-dask's own code costs beyond the floor's, which a VM whose host
  takes free memory back does not move (``_physical``'s module doc); wall times there
  can double at random, for either contender.
  Beside it, the physical floor (``_physical.physical_floor``): the CPU seconds of
  decoding every input chunk, of the product at the BLAS's measured single-thread rate
  (one partition @ A^-1) and of writing n x d floats (measured in the same run), over
  the cores; ``RATIO physical_floor / slem_time`` (above 1.0: the floor is wrong).

Every timed contender starts from the same state (``_physical.same_start``: no dirty
pages, the outputs out of the page cache, the input in it, garbage collected, BLAS
threads idle), so that a ratio does not depend on which other contenders ran
(``--no-same-start``: only garbage collection here, sync and pause, as before issue 42).

``--schedulers threads,cluster`` as in bench_fit: one phase per scheduler, its
cluster alive only then; the numpy contender takes its turn in every phase. Contenders alternate; every
run is printed with the load average, then best/median/worst and the ratios
numpy_time / slem_time and naive_time / slem_time (>= 1.0: slem-dask is no
slower). Sanity check (not timed): max abs difference between the slem and
numpy outputs, and of each vs a float64 encoding of the first
``--check-rows`` rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from _encode_references import kernel_numpy_reference, naive_dask, numpy_reference  # noqa: E402


def _cpu_used(before, after) -> dict:
    return {"user cpu": after[0] - before[0], "system cpu": after[1] - before[1]}


def _cpu_summary(result: dict, sched: str, floor_runs: list, slem_runs: list) -> None:
    """The floor's CPU seconds against slem-dask's (this process and the workers, all
    runs): user time is the contenders' own work, which a VM's host backing memory
    again does not inflate (``_physical`` module doc); system time is printed beside."""
    import statistics

    med = statistics.median
    parts = {
        kind: (med(t[f"{kind} cpu"] for t in floor_runs), med(t[f"{kind} cpu"] for t in slem_runs))
        for kind in ("user", "system")
    }
    (fu, su), (fs, ss) = parts["user"], parts["system"]
    print(
        f"[{sched}] RATIO floor_user_cpu / slem_user_cpu = {fu / su:.3f} (medians: floor "
        f"{fu:.3f} s, slem-dask {su:.3f} s; system cpu: floor {fs:.3f} s, slem-dask "
        f"{ss:.3f} s)  [1.0: slem-dask's code does no work beyond the floor's]"
    )
    result[f"{sched}_ratio_floor_user_cpu"] = fu / su
    result[f"{sched}_cpu_medians"] = {"floor": [fu, fs], "slem": [su, ss]}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    C.add_common_args(parser)
    C.add_run_args(parser)
    C.add_band_arg(
        parser,
        0.15,
        "rounds alternate the contenders; every contender writes "
        "n x d floats, whose writeback each settles before its clock starts",
    )
    parser.add_argument(
        "--numpy-dtype",
        choices=("float32", "float64"),
        default="float32",
        help="arithmetic of the numpy reference (default float32)",
    )
    parser.add_argument(
        "--precision",
        choices=("auto", "float64"),
        default="auto",
        help="slem-dask's precision for the encoding (default auto)",
    )
    C.add_scheduler_args(parser)
    _contender_args(parser)
    return parser


def _contender_args(parser: argparse.ArgumentParser) -> None:
    """The options that choose and shape the contenders."""
    parser.add_argument(
        "--no-numpy",
        action="store_true",
        help="skip the numpy contender (its read and write of n x d floats "
        "each round add I/O noise to the others' times; the check then "
        "compares slem-dask with a float64 encoding only)",
    )
    parser.add_argument(
        "--check-rows",
        type=C.int_size,
        default=20000,
        help="rows compared with a float64 encoding (default 2e4)",
    )
    parser.add_argument(
        "--kernel-rank",
        type=int,
        default=None,
        help="encode with a KernelSLEM of this rank (rbf, --gamma, rpcholesky) "
        "fitted on the store; the numpy reference is then the kernel "
        "against the pivots, a triangular solve and one product; no naive "
        "Dask contender",
    )
    parser.add_argument("--gamma", type=float, default=0.5, help="rbf gamma (default 0.5)")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time the floor (linear models): read, one float32 product, "
        "normalize, plain write per partition; prints floor/slem",
    )
    parser.add_argument(
        "--no-same-start",
        action="store_true",
        help="before each contender only collect garbage here, sync and pause, as before "
        "issue 42 (the other contenders' outputs stay in the page cache): shows what "
        "carries over",
    )


@dataclasses.dataclass
class Bench:
    """What every contender shares: the options, the store, the fitted model, the
    partitions, the outputs' paths, and each contender's runs per scheduler."""

    args: argparse.Namespace
    path: str
    model_path: str
    outs: dict  # contender -> its output's path
    model: object
    arr: object  # the store, as slem-dask opens it
    rows: int  # of a partition
    x: object  # the store's rows as dask partitions (the floor reads them)
    runs: dict = dataclasses.field(default_factory=dict)  # contender -> sched -> [runs]

    def encode(self, client):
        from slem_dask.pipeline import encode_job

        return encode_job(
            client,
            self.model_path,
            self.path,
            self.outs["slem"],
            partition_rows=self.args.partition_rows,
            overwrite=True,
            precision=self.args.precision,
        )

    def matrix(self):
        return self.model._encoding_matrix(self.arr.dtype, self.args.precision)

    def numpy(self) -> dict:
        if self.args.kernel_rank:
            return kernel_numpy_reference(self.path, self.outs["numpy"], self.model, self.rows)
        m = self.model
        dtype = np.dtype(self.args.numpy_dtype)
        return numpy_reference(
            self.path, self.outs["numpy"], m.mean_, m.precision_, self.rows, dtype
        )

    def naive(self) -> dict:
        m = self.model
        return naive_dask(self.path, self.outs["naive"], m.mean_, m.precision_, self.rows)


def _prepare(args) -> Bench:
    """The store, the model fitted on it (not timed), and the outputs of earlier runs
    removed."""
    from slem_dask import storage
    from slem_dask.models import load_model
    from slem_dask.pipeline import fit_job

    path = C.ensure_store(args.workdir, args.n, args.d, args.seed, args.chunk_rows)
    print(f"data: {C.describe_store(path)}")
    tag = f"n{args.n}-d{args.d}" + (f"-k{args.kernel_rank}" if args.kernel_rank else "")
    model_path = os.path.join(args.workdir, f"bench-encode-model-{tag}.zarr")
    outs = {
        name: os.path.join(args.workdir, f"bench-encode-{name}-{tag}{suffix}")
        for name, suffix in (
            ("slem", ".zarr"),
            ("numpy", ".zarr"),
            ("naive", ".zarr"),
            ("floor", ""),
        )
    }
    kernel = {"kernel": "rbf", "gamma": args.gamma, "rank": args.kernel_rank}
    kernel.update(pivoting="rpcholesky", tol=0.0, seed=0)
    with C.Timer() as t:
        fit_job(
            None,
            path,
            model_path,
            lam=args.lam,
            overwrite=True,
            **(kernel if args.kernel_rank else {}),
        )
    model = load_model(model_path)
    arr = storage.open_input(path, "positives")
    # the partitions encode_job makes (the floor reads the same ones)
    rows = storage.row_partition(arr, args.partition_rows, at_least_width=False)
    x = storage.dask_rows(arr, rows, exact=True)
    bench = Bench(args, path, model_path, outs, model, arr, rows, x)
    _describe(bench, t.seconds)
    # the outputs of an earlier run go first: an encode with --overwrite keeps the old
    # output's chunking, and slem-dask then encoded 1,024-row chunks' data in that run's
    # 8,192-row partitions while the floor used 1,024 (floor / slem 0.47 at d = 8192)
    for old in outs.values():
        shutil.rmtree(old, ignore_errors=True)
    return bench


def _describe(bench: Bench, fit_seconds: float) -> None:
    args, model = bench.args, bench.model
    if args.kernel_rank:
        print(
            f"model: KernelSLEM rbf gamma={args.gamma} rank {model.rank_} (trace error "
            f"{model.trace_error_:.3f}), fitted with fit_job in {fit_seconds:.2f} s (not counted)"
        )
    else:
        print(
            f"model: fitted with fit_job in {fit_seconds:.2f} s (not counted); encoding in "
            f"{bench.matrix().dtype} (precision={args.precision!r})"
        )
    print(f"partitions: {bench.x.numblocks[0]} of {bench.rows:,} rows")
    print("slem contender: pipeline.encode_job (float32 output)")
    if args.no_naive:
        print("naive Dask contender: skipped (--no-naive)")
    else:
        print("naive Dask contender: ((A - mean) @ precision) / row norms in float32, da.to_zarr")
    if args.no_numpy:
        print("numpy contender: skipped (--no-numpy)")
    elif args.kernel_rank:
        print(
            f"numpy contender: X = arr[...]; kernel against the {model.rank_} pivots, "
            f"triangular solve, one product (float64); zarr out[...] = Z"
        )
    else:
        print(
            f"numpy contender: X = arr[...]; Z = (X - mean) @ precision in "
            f"{args.numpy_dtype}; Z /= row norms; zarr out[...] = Z (chunks ({bench.rows}, "
            f"{args.d}), default codecs)"
        )
    print(
        "one phase per scheduler: its cluster lives only during its own phase (an idle "
        "LocalCluster costs about a tenth of a core and runs its scheduler in this process)"
    )


def _warm_up(bench: Bench, sched: str, client, context) -> None:
    """One untimed run of each contender: imports in the workers, the job's first
    lease, checks and commit (a first timed run paid 0.7 s more for them); numpy is
    warmed up alike, in every phase."""
    args = bench.args
    with context(), C.Timer() as t:
        bench.encode(client)
        if not args.no_naive:
            bench.naive()
        if args.floor:
            C.encode_floor(bench.x, bench.matrix(), bench.outs["floor"], client)
    if not args.no_numpy:
        with C.Timer() as tn:
            bench.numpy()
        t.seconds += tn.seconds
    print(f"warm-up on {sched} (not counted): {t.seconds:.3f} s")


def _round(bench: Bench, r: int, sched: str, client, context, state: dict) -> None:
    """Round ``r`` on ``sched``: each contender in turn, each from the same start."""
    args, runs = bench.args, bench.runs
    with context():
        # every contender writes n x d floats: none pays for another's writeback (or
        # spinning BLAS threads)
        C.settle(**state)
        cpu0 = C.cpu_times(client)
        with C.Timer() as t:  # from outside: its commit and pruning included
            report = bench.encode(client)
        tm = {**report.timings, "total": t.seconds, **_cpu_used(cpu0, C.cpu_times(client))}
        runs["slem"][sched].append(tm)
        extra = ", ".join(f"{k} {v:.3f}" for k, v in tm.items() if k != "total")
        print(f"run {r}: slem-dask [{sched}] {tm['total']:.3f} s ({extra}) | {C.load_line()}")
        if not args.no_naive:
            C.settle(**state)
            nv = bench.naive()
            runs["naive"][sched].append(nv)
            print(f"run {r}: naive Dask [{sched}] {nv['total']:.3f} s | {C.load_line()}")
        if args.floor:
            C.settle(**state)
            cpu0 = C.cpu_times(client)
            fl = C.encode_floor(bench.x, bench.matrix(), bench.outs["floor"], client)
            fl.update(_cpu_used(cpu0, C.cpu_times(client)))
            runs["floor"][sched].append(fl)
            print(
                f"run {r}: floor [{sched}] {fl['total']:.3f} s (user cpu "
                f"{fl['user cpu']:.3f}, system cpu {fl['system cpu']:.3f}) | {C.load_line()}"
            )
    if args.no_numpy:
        return
    # numpy takes its turn in every phase's rounds, so that each phase's numpy /
    # slem-dask ratio compares runs made under the same conditions
    C.settle(**state)
    nt = bench.numpy()
    runs["numpy"][sched].append(nt)
    print(
        f"run {r}: numpy [{sched}] {nt['total']:.3f} s (read {nt['read']:.3f}, "
        f"compute {nt['compute']:.3f}, write {nt['write']:.3f}) | {C.load_line()}"
    )
    sys.stdout.flush()


def _phases(bench: Bench, schedulers: list):
    """Every scheduler's phase (its warm-up, then the rounds); the physical floor,
    measured before and after each phase, each part the least of all."""
    args = bench.args
    bench.runs = {c: {s: [] for s in schedulers} for c in ("slem", "naive", "floor", "numpy")}
    phys = None
    product = bench.matrix() if args.floor else None
    if args.floor:
        phys = C.physical_floor(
            bench.x, lambda b: b @ product, args.n * args.d * 4, args.workdir, arr=bench.arr
        )
    for sched in schedulers:
        print()
        with C.scheduler_contexts(args, [sched]) as (clients, contexts):
            _warm_up(bench, sched, clients[sched], contexts[sched])
            # every contender starts alike: outputs out of the page cache, the input in
            # it, garbage collected (here and in the workers), no dirty pages
            state = (
                {}
                if args.no_same_start
                else {
                    "outputs": list(bench.outs.values()),
                    "inputs": [bench.path],
                    "client": clients[sched],
                }
            )
            for r in range(args.repeat):
                _round(bench, r + 1, sched, clients[sched], contexts[sched], state)
        if args.floor:
            phys = C.physical_floor(
                bench.x,
                lambda b: b @ product,
                args.n * args.d * 4,
                args.workdir,
                previous=phys,
                arr=bench.arr,
            )
    return phys


def _summaries(bench: Bench, schedulers: list, phys) -> dict:
    """Each scheduler's spreads and ratios, printed and returned."""
    args, runs = bench.args, bench.runs
    result = {"n": args.n, "d": args.d, "precision": args.precision}
    all_numpy = [t["total"] for sched in schedulers for t in runs["numpy"][sched]]
    if all_numpy:
        result.update({"numpy_best": min(all_numpy), "numpy_runs": all_numpy})
    for sched in schedulers:
        totals = [t["total"] for t in runs["slem"][sched]]
        print(f"[{sched}] slem-dask encode total: {C.spread(totals)}: {C.runs_line(totals)}")
        result[f"{sched}_slem_runs"] = totals
        if runs["numpy"][sched]:
            np_totals = [t["total"] for t in runs["numpy"][sched]]
            print(
                f"[{sched}] numpy total           : {C.spread(np_totals)}: {C.runs_line(np_totals)}"
            )
            for part in ("read", "compute", "write"):
                print(
                    f"[{sched}]   of which {part:<12}: {C.spread(t[part] for t in runs['numpy'][sched])}"
                )
            no_slower = ">= 1.0: slem-dask no slower"
            C.ratio_summary(
                result, "encode", sched, "numpy", np_totals, totals, args, goal=no_slower
            )
        if runs["naive"][sched]:
            nts = [t["total"] for t in runs["naive"][sched]]
            print(f"[{sched}] naive Dask total      : {C.spread(nts)}: {C.runs_line(nts)}")
            result[f"{sched}_naive_runs"] = nts
            C.ratio_summary(result, "encode", sched, "naive", nts, totals, args)
        if runs["floor"][sched]:
            fts = [t["total"] for t in runs["floor"][sched]]
            what = "floor (read, product, normalize, write)"
            C.floor_summary(result, "encode", sched, what, fts, totals, args)
            C.physical_summary(result, "encode", sched, phys, totals, fts)
            _cpu_summary(result, sched, runs["floor"][sched], runs["slem"][sched])
    return result


def _check(bench: Bench, result: dict) -> None:
    """Not timed: slem-dask's output against numpy's and a float64 encoding."""
    import zarr

    from slem_dask import storage
    from slem_dask.core.linear import encode_rows

    args, model = bench.args, bench.model
    zs = storage.open_output(bench.outs["slem"])
    m = min(args.check_rows, args.n)
    rows64 = zarr.open_array(store=bench.path, mode="r")[:m].astype(np.float64)
    ref = (
        model.transform(rows64)
        if args.kernel_rank
        else encode_rows(rows64, model.mean_, model.precision_)
    )
    print()
    if "numpy_runs" not in result:
        print(
            f"check: max abs diff slem vs a float64 encoding of the first {m:,} rows: "
            f"{np.abs(zs[:m] - ref).max():.3e}"
        )
        return
    zn = zarr.open_array(store=bench.outs["numpy"], mode="r")
    diff = 0.0
    for i in range(0, args.n, 65536):
        diff = max(diff, float(np.abs(zs[i : i + 65536] - zn[i : i + 65536]).max()))
    print(
        f"check: max abs diff slem vs numpy outputs (all {args.n:,} rows): {diff:.3e}; vs "
        f"a float64 encoding of the first {m:,} rows: slem "
        f"{np.abs(zs[:m] - ref).max():.3e}, numpy {np.abs(zn[:m] - ref).max():.3e}"
    )
    result["output_maxdiff"] = diff


def _uptime() -> str:
    import subprocess

    return "uptime: " + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.floor and args.kernel_rank:
        parser.error("--floor: the floor is defined for linear models; omit --kernel-rank")
    if args.kernel_rank:
        args.no_naive = True
    C.resolve_sizes(args)
    schedulers = C.chosen_schedulers(parser, args)
    C.header(
        f"bench_encode: n={args.n:,} d={args.d} float32"
        f"{f', kernel rank {args.kernel_rank}' if args.kernel_rank else ''}",
        args,
    )
    print(_uptime())
    bench = _prepare(args)
    phys = _phases(bench, schedulers)
    print()
    result = _summaries(bench, schedulers, phys)
    print(_uptime())
    _check(bench, result)
    C.emit_json("RESULT bench_encode", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
