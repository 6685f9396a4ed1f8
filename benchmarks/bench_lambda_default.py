#!/usr/bin/env python
"""The default lambda of linear SLEM: mAP of absolute and scale-relative rules per data set.

Rules, for negatives with covariance Sigma (d features):

    absolute   lam = 1e-3, 3e-3, 1e-2
    total      lam = c * tr(Sigma)            c in 3e-3, 1e-2, 3e-2   (slem-dask's "x" lambda)
    mean       lam = c * tr(Sigma) / d        c in 0.3, 1, 3          (the mean variance)

on the data sets of bench_grid.py (the demo generator at d = 128 and 32, scikit-learn digits
L2-normalized and as raw 0-16 integers). linear SLEM only, numpy in this process.

    python benchmarks/bench_lambda_default.py --sets demo-5k,demo-d32,digits,digits-raw
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from bench_grid import load  # noqa: E402
from slem_dask.pipeline.evaluate import evaluate_methods  # noqa: E402

RULES = (
    [("abs", c) for c in (1e-3, 3e-3, 1e-2)]
    + [("total", c) for c in (3e-3, 1e-2, 3e-2)]
    + [("mean", c) for c in (0.3, 1.0, 3.0)]
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default="demo-5k,demo-50k,demo-d32,digits,digits-raw")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    names = [f"{kind} {c:g}" for kind, c in RULES]
    print("data        tr(S)/d    " + "  ".join(f"{n:>11}" for n in names), flush=True)
    for name in args.sets.split(","):
        neg, db, q, rel, p_at = load(name, args.seed)
        x = np.asarray(neg, dtype=np.float64)
        mean_var = float(np.mean(np.var(x, axis=0)))
        total = mean_var * x.shape[1]
        scores = []
        for kind, c in RULES:
            lam = c if kind == "abs" else c * total if kind == "total" else c * mean_var
            (row,), _ = evaluate_methods(
                neg, db, q, rel, ["slem"], p_at=p_at, params={"slem": {"lam": lam}}
            )
            scores.append(row["mAP"])
        print(f"{name:<11} {mean_var:9.3g}  " + "  ".join(f"{s:11.3f}" for s in scores), flush=True)
        # mAP is deterministic (fixed seeds, numpy in this process): the promised band is 0
        C.band(
            f"{name}: mAP(lam=1e-3) / mAP(lam=tr(Sigma)/d)",
            [scores[0]],
            [scores[names.index("mean 1")]],
            0.0,
            names=("absolute 1e-3", "mean 1"),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
