"""Resumable final pass of a streaming kernel fit: per-partition statistics in the job's draft.

The last pass of a streaming kernel fit (:mod:`slem_dask.parallel.kernel_stream`)
computes, for every partition of the negatives, the Chan statistics of its rows
of F (count, mean, scatter) and its residual trace. Each final-pass task writes
them, packed in one small float64 array with a crc32c, into this job's draft of
the model store (``<model>/versions/<draft>/kernel-fit/<tag>/p<j>``; a draft is
never visible to readers, :mod:`slem_dask.storage.versioning.versions`). A fit killed in
its final pass leaves that draft behind; the same command again recomputes the
pivot rounds (the pivots do not depend on the run: same seed, same chunking),
then finds in the drafts left for the same version, under the same tag,
the partitions already done, reads them back through their checksums and
computes only the others. What it reused it first writes into its own draft, then
deletes the other drafts (:mod:`slem_dask.storage.versioning.gc`): one draft holds every
partition done so far, however many runs were killed. The model's save commits
another draft, and the store's garbage collection deletes this job's.

The tag names everything a partition's statistics depend on: the negatives'
fingerprint, the model's parameters, the partition boundaries, and the pivot
rows and factor L (their bytes): anything that differs gives another tag, and
nothing is reused.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from ..core.statistics import ScatterStats
from .kernel_rounds import _Summary

__all__ = ["FinalPassCheckpoint", "pack", "unpack"]

FOLDER = "kernel-fit"


def pack(summary) -> np.ndarray:
    """[count, residual, max_residual, mean (t), scatter (t x t)] of a final-pass summary."""
    s = summary.stats
    return np.concatenate(
        ([s.count, summary.residual, summary.max_residual], s.mean, s.scatter.ravel())
    ).astype(np.float64)


def unpack(packed: np.ndarray):
    packed = np.asarray(packed, dtype=np.float64)
    t = int(round((-1 + np.sqrt(1 + 4 * (packed.size - 3))) / 2))  # size = 3 + t + t^2
    stats = ScatterStats(
        int(packed[0]), packed[3 : 3 + t].copy(), packed[3 + t :].reshape(t, t).copy()
    )
    return _Summary(residual=float(packed[1]), max_residual=float(packed[2]), stats=stats)


def write_partition(location: str, j: int, summary) -> None:
    """Write one partition's packed statistics (run inside the final-pass task)."""
    import zarr

    from ..storage.nodes.checksums import CHECKSUM

    values = pack(summary)
    arr = zarr.create_array(
        store=f"{location}/p{j:06d}",
        shape=values.shape,
        dtype="float64",
        chunks=values.shape,
        compressors=CHECKSUM,
        overwrite=True,
    )
    arr[...] = values


class FinalPassCheckpoint:
    """This job's folder for the final pass's statistics, and what killed runs left.

    ``draft_location``: the folder of this job's draft of the model store;
    ``others``: the folders of the other drafts of the same version (killed or stalled
    jobs); ``key``: fingerprint of the negatives, parameters and partitions.
    """

    def __init__(self, draft_location: str, others: list[str], key: str, release=None):
        self.draft_location, self.others, self.key = draft_location, others, key
        self.release = release  # deletes the other drafts, once what they hold is copied
        self.reused = 0

    @staticmethod
    def key_of(negatives_fingerprint: str, params: dict, chunks) -> str:
        text = json.dumps(
            {
                "negatives": negatives_fingerprint,
                "params": params,
                "chunks": [int(c) for c in chunks],
            },
            sort_keys=True,
        )
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def tag(self, pivot_rows: np.ndarray, pivot_factor: np.ndarray) -> str:
        h = hashlib.sha256(self.key.encode())
        for a in (pivot_rows, pivot_factor):
            a = np.ascontiguousarray(a, dtype=np.float64)
            h.update(repr(a.shape).encode())
            h.update(a.tobytes())
        return h.hexdigest()[:32]

    def folder(self, tag: str) -> str:
        return f"{self.draft_location}/{FOLDER}/{tag}"

    def finished(self, tag: str, rows: list[int]) -> dict:
        """{partition: summary} that killed runs wrote under ``tag``, read back through
        their checksums, of the partitions of ``rows`` rows (a missing chunk reads as
        zeros: its count is checked). Anything else is computed again."""
        import zarr

        done = {}
        for other in self.others:
            for j, n_rows in enumerate(rows):
                if j in done:
                    continue
                try:
                    values = zarr.open_array(store=f"{other}/{FOLDER}/{tag}/p{j:06d}", mode="r")[
                        ...
                    ]
                    summary = unpack(values)
                except Exception:  # noqa: BLE001 - absent, half-written or damaged: redo
                    continue
                if summary.stats.count == n_rows and np.isfinite(values).all():
                    done[j] = summary
        self.reused = len(done)
        for j, summary in done.items():  # into this job's draft: a later run reuses them
            write_partition(self.folder(tag), j, summary)  # from there, once the others
        if self.release is not None:  # are deleted (storage keeps one draft, not one a run)
            self.release()
        return done
