"""What durable commits cost an encode on local disk (slem_dask/storage/backends/
local_durable.py): ``pipeline.encode_job`` as it is, against the same job with its
syncs (``make_durable`` before the commit record, the record's folder after it) and
its tasks' writeback starts made no-ops, alternating, each from the same start
(``_physical.same_start``), on the threaded scheduler. Also: the time spent in each
part inside the durable jobs.

    python benchmarks/bench_durability.py --n 1e6 --d 128 --repeat 7
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import _common as C
import _physical as P


class Parts:
    """Seconds spent in the durable path's calls during one job (thread time summed)."""

    def __init__(self):
        from slem_dask.storage.backends import local
        from slem_dask.storage.nodes import outputs

        self.real = (local.make_durable, local.sync_folder, outputs.start_writeback)
        self.modules = (local, local, outputs)
        self.names = ("make_durable", "sync_folder", "start_writeback")
        self.seconds = dict.fromkeys(self.names, 0.0)
        self._lock = threading.Lock()

    def _timed(self, name, function):
        def timed(*args):
            start = time.perf_counter()
            try:
                return function(*args)
            finally:
                with self._lock:
                    self.seconds[name] += time.perf_counter() - start

        return timed

    def use(self, durable: bool) -> None:
        self.seconds = dict.fromkeys(self.names, 0.0)
        for module, name, real in zip(self.modules, self.names, self.real, strict=True):
            setattr(module, name, self._timed(name, real) if durable else (lambda *a: None))

    def restore(self) -> None:
        for module, name, real in zip(self.modules, self.names, self.real, strict=True):
            setattr(module, name, real)


def main() -> None:
    from slem_dask.pipeline import encode_job, fit_job

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    C.add_common_args(parser)
    parser.add_argument("--repeat", type=int, default=7, help="rounds (default 7)")
    args = parser.parse_args()
    C.resolve_sizes(args)
    C.header(f"bench_durability: encode n={args.n:,} d={args.d} float32", args)
    path = C.ensure_store(args.workdir, args.n, args.d, args.seed, args.chunk_rows)
    print(f"data: {C.describe_store(path)}")
    model = os.path.join(args.workdir, f"bench-durability-model-n{args.n}-d{args.d}.zarr")
    out = os.path.join(args.workdir, f"bench-durability-out-n{args.n}-d{args.d}.zarr")
    fit_job(None, path, model, lam=1e-3, overwrite=True)
    parts, runs = Parts(), {True: [], False: []}
    encode_job(None, model, path, out, overwrite=True)  # warm-up, not counted
    try:
        for r in range(args.repeat):
            for durable in (True, False) if r % 2 == 0 else (False, True):
                parts.use(durable)
                P.same_start(outputs=[out], inputs=[path])
                start = time.perf_counter()
                encode_job(None, model, path, out, overwrite=True)
                runs[durable].append(time.perf_counter() - start)
                inside = ", ".join(f"{k} {v:.3f}" for k, v in parts.seconds.items())
                what = f"durable ({inside})" if durable else "not durable"
                print(f"run {r + 1}: {runs[durable][-1]:.3f} s {what} | {C.load_line()}")
    finally:
        parts.restore()
    best = {k: min(v) for k, v in runs.items()}
    median = {k: sorted(v)[len(v) // 2] for k, v in runs.items()}
    print(f"durable: best {best[True]:.3f} s, median {median[True]:.3f} s")
    print(f"not durable: best {best[False]:.3f} s, median {median[False]:.3f} s")
    print(
        f"RATIO not durable / durable: best {best[False] / best[True]:.3f}, "
        f"median {median[False] / median[True]:.3f} (1: durability costs nothing)"
    )


if __name__ == "__main__":
    main()
