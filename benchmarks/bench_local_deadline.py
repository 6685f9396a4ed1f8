"""Per-call cost of the deadline on local disk's protocol calls (slem_dask/storage/
local_deadline.py): LocalBackend's read, put, create and list with it (a worker thread
per call at a time) against the same methods without it, in the same run, on a
temporary folder (page cache: the cost of the handoff, not of the disk).

    python benchmarks/bench_local_deadline.py --calls 2000 --repeat 5
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from slem_dask.storage.nodes import groups
from slem_dask.storage.backends import local_deadline
from slem_dask.storage.backends.local import LocalBackend


def _per_call(function, calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        function(i)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        backend = LocalBackend(root)
        backend.put("k", b"x" * 200)
        cases = {
            "read": lambda m: lambda i: m(backend, "k"),
            "put": lambda m: lambda i: m(backend, "k", b"y" * 200),
            "create": lambda m: (
                lambda i: m(backend, f"c/{args.repeat}-{time.perf_counter_ns()}", b"z")
            ),
            "list": lambda m: lambda i: m(backend, ""),
        }
        print(f"{'call':8} {'bounded us':>11} {'raw us':>8} {'extra us':>9} {'ratio':>6}")
        for name, make in cases.items():
            bounded = getattr(LocalBackend, name)
            raw = bounded.__wrapped__  # the method inside the deadline (boundary kept)
            best = {"bounded": float("inf"), "raw": float("inf")}
            for _ in range(args.repeat):  # interleaved, best of each: the least noise
                best["raw"] = min(best["raw"], _per_call(make(raw), args.calls))
                best["bounded"] = min(best["bounded"], _per_call(make(bounded), args.calls))
            extra = best["bounded"] - best["raw"]
            print(
                f"{name:8} {best['bounded']:11.1f} {best['raw']:8.1f} {extra:9.1f} "
                f"{best['bounded'] / best['raw']:6.2f}"
            )
    job_cost(args.repeat)


def _write_groups(root: str, count: int) -> float:
    """Seconds per write_group of a small model (lease, draft, commit: every call)."""
    arrays = {"w": np.zeros((64, 64))}
    start = time.perf_counter()
    for _ in range(count):
        groups.write_group(f"{root}/m.zarr", {"kind": "t"}, arrays, "bench", overwrite=True)
    return (time.perf_counter() - start) / count


def job_cost(repeat: int, count: int = 10) -> None:
    """A whole small write_group, with and without the deadline (the calls in place)."""
    bounded = local_deadline.call_within
    best = {"bounded": float("inf"), "raw": float("inf")}
    try:
        for _ in range(repeat):
            for case in ("raw", "bounded"):
                local_deadline.call_within = (
                    bounded if case == "bounded" else (lambda function, seconds, what: function())
                )
                with tempfile.TemporaryDirectory() as root:
                    best[case] = min(best[case], _write_groups(root, count))
    finally:
        local_deadline.call_within = bounded
    print(
        f"write_group of a 64 x 64 model: {best['bounded'] * 1e3:.1f} ms with the deadline, "
        f"{best['raw'] * 1e3:.1f} ms without (ratio {best['bounded'] / best['raw']:.3f})"
    )


if __name__ == "__main__":
    main()
