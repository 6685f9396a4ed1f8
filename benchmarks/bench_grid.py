#!/usr/bin/env python
"""Parameter selection: retrieval mAP over parameter grids, per method and data set.

For each data set, :func:`slem_dask.pipeline.evaluate.grid_search` evaluates

    slem     lam on an absolute grid 1e-5 .. 1e4 (half decades), and lam = c * tr(Sigma)/d
             for c in 0.1 .. 1000, Sigma the negatives' covariance (a scale-relative lambda)
    kernel   rbf gamma x rank (lam 1e-3), rpcholesky, seed 0
    esvm     lam x n_iter
    pca      eps
    raw      (no parameter)

and prints every row, the best setting per method (marked *), and a summary: the mAP of
linear SLEM at the default lam = 1e-3, at its best absolute lam, and at each relative c,
so that one can see whether a lambda relative to tr(Sigma)/d is more robust across data
sets than an absolute one.

Data sets (all numpy, in this process, no Dask cluster):

    demo-5k     make_corpus(n_negatives=5000, n_instances=500, d=128)   (the demo's generator)
    demo-50k    make_corpus(n_negatives=50000, n_instances=1000, d=128) (= `slem-dask demo`)
    demo-d32    make_corpus(n_negatives=20000, n_instances=500, d=32)
    digits      scikit-learn digits, L2-normalized pixels, category retrieval
                (600 negatives, 200 queries, 997 database rows; relevant = same digit)
    digits-raw  the same digits, raw pixel values 0..16 (not normalized)

    python benchmarks/bench_grid.py                    # all data sets (~10-15 min on 2 cores)
    python benchmarks/bench_grid.py --sets demo-5k,digits --no-esvm
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

from slem_dask.datasets import make_corpus  # noqa: E402
from slem_dask.pipeline.evaluate import format_table, grid_search  # noqa: E402

ABS_LAMS = [
    1e-5,
    3e-5,
    1e-4,
    3e-4,
    1e-3,
    3e-3,
    1e-2,
    3e-2,
    1e-1,
    3e-1,
    1.0,
    3.0,
    10.0,
    30.0,
    100.0,
    300.0,
    1e3,
    3e3,
    1e4,
]
REL_CS = [0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0]
SETS = ("demo-5k", "demo-50k", "demo-d32", "digits", "digits-raw")


def load(name: str, seed: int):
    """(negatives, database, queries, relevant, p_at) of one data set."""
    if name.startswith("demo"):
        n, inst, d = {
            "demo-5k": (5000, 500, 128),
            "demo-50k": (50000, 1000, 128),
            "demo-d32": (20000, 500, 32),
        }[name]
        c = make_corpus(n_negatives=n, n_instances=inst, d=d, seed=seed)
        return c.negatives, c.database, c.queries, c.relevant(), 4
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    perm = np.random.default_rng(seed).permutation(len(X))
    X, y = X[perm].astype(np.float64), y[perm]
    if name == "digits":
        X = X / np.linalg.norm(X, axis=1, keepdims=True)
    neg, q, db = X[:600], X[600:800], X[800:]
    y_q, y_db = y[600:800], y[800:]
    relevant = [np.flatnonzero(y_db == label) for label in y_q]
    return neg, db, q, relevant, 10


def scale(negatives) -> float:
    """tr(Sigma) / d of the negatives (population covariance)."""
    x = np.asarray(negatives, dtype=np.float64)
    return float(np.mean(np.var(x, axis=0)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--sets", default=",".join(SETS), help="comma-separated data sets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-esvm", action="store_true", help="skip the E-SVM grid (slowest)")
    p.add_argument("--no-kernel", action="store_true", help="skip the kernel grid")
    args = p.parse_args(argv)
    print(f"load average: {os.getloadavg()}")
    summary = []
    for name in args.sets.split(","):
        t0 = time.perf_counter()
        neg, db, q, rel, p_at = load(name, args.seed)
        s = scale(neg)
        rel_lams = [c * s for c in REL_CS]
        grids = {
            "raw": {},
            "pca": {"eps": [1e-6, 1e-3]},
            "slem": {"lam": sorted(set(ABS_LAMS) | set(rel_lams))},
        }
        unit = name != "digits-raw"
        if not args.no_kernel and unit:
            grids["kernel"] = {"gamma": [0.25, 0.5, 1.0, 2.0], "rank": [64, 256]}
        if not args.no_esvm:
            big = len(db) + len(q) > 3000
            grids["esvm"] = (
                {"lam": [1e-2, 1e-1], "n_iter": [1000]}
                if big
                else {"lam": [1e-3, 1e-2, 1e-1], "n_iter": [1000, 3000]}
            )
        rows, best, _ = grid_search(neg, db, q, rel, grids, p_at=p_at)
        print(
            f"\n== {name}: {len(neg)} negatives, database {len(db)}, queries {len(q)}, "
            f"d={neg.shape[1]}, tr(Sigma)/d = {s:.3e} ({time.perf_counter() - t0:.0f} s) =="
        )
        print(format_table(rows))
        slem = {r["setting"]: r["mAP"] for r in rows if r["method"] == "slem"}
        lam_map = {float(k.split("=")[1]): v for k, v in slem.items()}
        at = {
            lam: lam_map[min(lam_map, key=lambda x: abs(np.log(x / lam)))]
            for lam in ABS_LAMS + rel_lams
        }
        best_all = max(lam_map, key=lam_map.get)
        others = {m: max(r["mAP"] for r in rows if r["method"] == m) for m in grids if m != "slem"}
        summary.append(
            {
                "data": name,
                "tr/d": s,
                "mAP lam=1e-3": at[1e-3],
                "best lam": best_all,
                "mAP best": lam_map[best_all],
                "best c (lam/(tr/d))": best_all / s,
                **{f"c={c:g}": at[c * s] for c in REL_CS},
                **{f"best {m}": v for m, v in others.items()},
                "_abs": {lam: at[lam] for lam in ABS_LAMS},
            }
        )
        print(f"best per method: {best}")
        # mAP is deterministic (fixed seeds, numpy in this process): the promised band is 0
        C.band(
            f"{name}: mAP(lam=1e-3) / mAP(best lam)",
            [at[1e-3]],
            [lam_map[best_all]],
            0.0,
            names=("mAP at lam=1e-3", "mAP at the best lam"),
        )
    print(
        "\n== summary: linear SLEM mAP at the default lam = 1e-3, at the best lam of the "
        "grid, and at lam = c * tr(Sigma)/d; best mAP of the other methods =="
    )
    cols = list(dict.fromkeys(k for r in summary for k in r if not k.startswith("_")))
    print(format_table([{c: r.get(c, "") for c in cols} for r in summary]))
    print(
        "\n== robustness: mAP lost against each data set's best lam (max and mean over "
        "data sets) =="
    )
    robust = []
    for lam in ABS_LAMS:
        loss = [r["mAP best"] - r["_abs"][lam] for r in summary]
        robust.append(
            {"rule": f"lam = {lam:g}", "max loss": max(loss), "mean loss": float(np.mean(loss))}
        )
    for c in REL_CS:
        loss = [r["mAP best"] - r[f"c={c:g}"] for r in summary]
        robust.append(
            {
                "rule": f"lam = {c:g} x tr(Sigma)/d",
                "max loss": max(loss),
                "mean loss": float(np.mean(loss)),
            }
        )
    print(format_table(robust))
    return 0


if __name__ == "__main__":
    sys.exit(main())
