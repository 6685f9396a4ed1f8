#!/usr/bin/env python
"""Exact top-k search: slem_dask.search against FAISS and numpy by hand, same rows, same run.

The database is a store of n x d float32 rows (the benchmarks' negatives
generator, ``--chunk-rows`` per zarr chunk); the queries are ``--queries`` other
rows of the same distribution, in memory. For each k (default 100 and the whole
ranking, as mAP needs):

* FAISS ``IndexFlatIP`` (faiss-cpu, if installed; else skipped with a note): read the
  store, add the rows, search (float32 scores, FAISS's own heaps);
* numpy by hand: read the store, ``scores = q @ db.T`` (float32), then the top k
  in ranking order (``np.argsort(-scores, kind="stable")`` for the whole ranking,
  ``np.argpartition`` and a sort of the k best otherwise);
* ``slem_dask.search(q, db_numpy, k)`` on the rows read into memory (read included);
* ``slem_dask.search(q, da.from_zarr(store), k)`` computed by dask's threaded
  scheduler (no Client) and, with ``--cluster``, on slem-dask's LocalCluster.

slem-dask ranks by float64 scores with ties to the lower index (float32 candidates,
float64 re-score); FAISS and the numpy reference rank by float32 scores, so near-ties
may differ: the overlap of each contender's top-k sets with the first contender's is
printed. Contenders run in rounds (each once per round) so that load changes on a
shared machine fall on all of them. Printed: best/median of ``--repeat`` runs and
``RATIO`` anchor time / slem-dask time for each anchor (FAISS, numpy by hand; above 1:
slem-dask faster), also as the median of same-round ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def by_hand(path: str, queries, k: int):
    import numpy as np
    import zarr

    db = zarr.open_array(path, mode="r")[...]
    scores = queries @ db.T
    if k >= db.shape[0]:
        return np.argsort(-scores, axis=1, kind="stable")[:, :k]
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def faiss_flat_ip(path: str, queries, k: int):
    import faiss
    import zarr

    db = zarr.open_array(path, mode="r")[...]
    index = faiss.IndexFlatIP(db.shape[1])
    index.add(db)
    return index.search(queries, k)[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    C.add_common_args(parser, default_n=20_000)
    C.add_run_args(parser, repeat=5)
    C.add_band_arg(
        parser,
        0.20,
        "rounds alternate the contenders after one untimed call of "
        "each; a search of 20,000 rows takes tenths of a second",
    )
    parser.add_argument(
        "--queries", type=C.int_size, default=1000, help="number of queries (default 1000)"
    )
    parser.add_argument(
        "--k",
        default="100,all",
        help="comma-separated k values; 'all' = the whole database (default 100,all)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also time slem-dask's LocalCluster (--workers x --threads)",
    )
    args = parser.parse_args(argv)
    C.resolve_sizes(args)

    import dask
    import dask.array as da
    import numpy as np
    import zarr

    from slem_dask import search

    C.header(
        f"bench_search: database {args.n:,} x {args.d} float32, {args.queries:,} queries", args
    )
    path = C.ensure_store(args.workdir, args.n, args.d, args.seed, args.chunk_rows)
    print(f"data: {C.describe_store(path)}")
    rng = np.random.default_rng(args.seed + 1)
    queries = rng.standard_normal((args.queries, args.d)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    ks = [args.n if v == "all" else C.int_size(v) for v in args.k.split(",")]
    schedulers = ["threads"] + (["cluster"] if args.cluster else [])
    results = {}
    with C.scheduler_contexts(args, schedulers) as (_, contexts):
        contenders = {}
        try:
            import faiss  # noqa: F401

            contenders["faiss IndexFlatIP"] = lambda k: faiss_flat_ip(path, queries, k)
        except ImportError:
            print(
                "faiss: not installed (pip install faiss-cpu, or the extra 'faiss'); "
                "its contender is skipped"
            )
        contenders.update(
            {
                "numpy by hand": lambda k: by_hand(path, queries, k),
                "search(numpy)": lambda k: search(queries, zarr.open_array(path, mode="r")[...], k)[
                    1
                ],
            }
        )
        for name in schedulers:

            def lazy(k, name=name):
                with contexts[name]():
                    return dask.compute(search(queries, da.from_zarr(path), k)[1])[0]

            contenders[f"search(dask, {name})"] = lazy
        for k in ks:
            got = {name: run(k) for name, run in contenders.items()}  # warm-up (imports,
            # the cluster's first graph); then rounds, each contender once per round, so
            # that a change of load on a shared machine falls on all of them alike
            for name in contenders:
                results[(k, name)] = []
            for round_ in range(args.repeat):
                for name, run in contenders.items():
                    t0 = time.perf_counter()
                    got[name] = run(k)
                    results[(k, name)].append(time.perf_counter() - t0)
                    print(
                        f"k={k:>6} round {round_ + 1} {name:<26} "
                        f"{results[(k, name)][-1]:.3f} s | {C.load_line()}"
                    )
                    sys.stdout.flush()
            first = next(iter(contenders))
            for name in contenders:
                # float32 and float64 scores may order near-ties differently: compare sets
                agree = float(
                    np.mean(
                        [
                            len(np.intersect1d(a, b)) / k
                            for a, b in zip(got[first], got[name], strict=True)
                        ]
                    )
                )
                print(
                    f"k={k:>6} {name:<26} {C.spread(results[(k, name)])}  overlap with "
                    f"{first} {agree:.4f}"
                )
    print()
    anchors = [name for name in ("faiss IndexFlatIP", "numpy by hand") if name in contenders]
    for k in ks:
        for anchor in anchors:
            ref = results[(k, anchor)]
            for name in contenders:
                if name in anchors:
                    continue
                t = results[(k, name)]
                # same-round ratios: both timed within seconds, under the same load
                paired = statistics.median(a / b for a, b in zip(ref, t, strict=True))
                print(
                    f"RATIO k={k} {anchor} / {name}: {min(ref) / min(t):.2f} (best), "
                    f"{statistics.median(ref) / statistics.median(t):.2f} (medians), "
                    f"{paired:.2f} (median of same-round ratios)"
                )
                C.band(f"k={k} {anchor} / {name}", ref, t, args.band, names=(anchor, name))
    C.emit_json("RESULT bench_search", {f"{k}/{name}": v for (k, name), v in results.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
