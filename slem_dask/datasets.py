"""Synthetic instance-retrieval corpus for the demo, tests and benchmarks.

Real global descriptors (VLAD, SPoC) share a large common component and vary
most along a few directions that every image shares (lighting, viewpoint,
clutter). The generator mimics that:

* a background distribution with mean ``offset`` and an anisotropic
  covariance whose spectrum decays as a power law (the negatives);
* each instance is a point of the background distribution;
* each view of an instance (the database holds ``group_size`` views, and the
  query one more) adds a *nuisance*: a large move along the top background
  directions, shared by the views of one group, plus small isotropic noise.

Raw cosine is dominated by the offset and the nuisance; SLEM's A^-1 (x0 - mu)
whitens both away, which is what the demo shows. All rows are L2-normalized,
as descriptors usually are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Corpus", "make_corpus", "background_rows", "write_corpus"]


@dataclass(frozen=True)
class Corpus:
    negatives: np.ndarray  # (n_negatives, d)
    database: np.ndarray  # (n_instances * group_size, d)
    queries: np.ndarray  # (n_instances, d)
    database_labels: np.ndarray  # (n_database,) instance id of each database row
    query_labels: np.ndarray  # (n_queries,)

    def relevant(self) -> list[np.ndarray]:
        """Database indices relevant to each query (same instance)."""
        order = np.argsort(self.database_labels, kind="stable")
        starts = np.searchsorted(self.database_labels[order], self.query_labels, "left")
        ends = np.searchsorted(self.database_labels[order], self.query_labels, "right")
        return [order[s:e] for s, e in zip(starts, ends, strict=True)]


class _Background:
    """The shared distribution: mean, a random rotation and a power-law spectrum."""

    def __init__(self, d: int, seed: int, offset: float = 3.0, decay: float = 1.2):
        rng = np.random.default_rng([seed, 0])
        self.d = d
        self.mean = offset * np.abs(rng.standard_normal(d)) / np.sqrt(d)
        self.basis, _ = np.linalg.qr(rng.standard_normal((d, d)))
        self.scales = np.arange(1, d + 1, dtype=np.float64) ** (-decay / 2.0)

    def sample(self, rng, n: int) -> np.ndarray:
        z = rng.standard_normal((n, self.d)) * self.scales
        return self.mean + z @ self.basis.T

    def nuisance(self, rng, n: int, top: int, strength: float) -> np.ndarray:
        z = np.zeros((n, self.d))
        z[:, :top] = rng.standard_normal((n, top)) * strength * self.scales[0]
        return z @ self.basis.T


def _normalize(x: np.ndarray, dtype) -> np.ndarray:
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(dtype)


def background_rows(n: int, d: int, seed: int = 0, start: int = 0, dtype=np.float32) -> np.ndarray:
    """Rows ``start .. start + n`` of the negatives stream for ``(d, seed)``.

    Generated in fixed blocks of 4096 rows, each from its own seeded stream, so
    any slice can be produced independently (the benchmarks write huge stores
    block by block) and always holds the same values.
    """
    bg = _Background(d, seed)
    block = 4096
    out = np.empty((n, d), dtype=dtype)
    first, last = start // block, (start + n - 1) // block if n else start // block - 1
    for b in range(first, last + 1):
        rng = np.random.default_rng([seed, 1, b])
        rows = _normalize(bg.sample(rng, block), dtype)
        lo, hi = max(start, b * block), min(start + n, (b + 1) * block)
        out[lo - start : hi - start] = rows[lo - b * block : hi - b * block]
    return out


def make_corpus(
    n_negatives: int = 20000,
    n_instances: int = 500,
    group_size: int = 4,
    d: int = 128,
    nuisance_dims: int = 8,
    nuisance: float = 0.4,
    noise: float = 0.1,
    seed: int = 0,
    dtype=np.float32,
) -> Corpus:
    """Generate negatives, a database of near-duplicate groups, and queries."""
    sizes = {
        "n_negatives": n_negatives,
        "n_instances": n_instances,
        "group_size": group_size,
        "d": d,
    }
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(
                f"make_corpus: {name}={value!r}; expected an integer >= 1 (a corpus holds "
                f"at least one row of each kind, of at least one feature): give {name}=1 or more"
            )
    bg = _Background(d, seed)
    rng = np.random.default_rng([seed, 2])
    negatives = background_rows(n_negatives, d, seed, dtype=dtype)
    centres = bg.sample(rng, n_instances)
    top = min(nuisance_dims, d)

    def views(count_per_instance: int) -> np.ndarray:
        # One nuisance per (instance, group): all views of a group share it.
        shared = bg.nuisance(rng, n_instances, top, nuisance)
        rows = np.repeat(centres + shared, count_per_instance, axis=0)
        rows += rng.standard_normal(rows.shape) * noise * bg.scales[0]
        return rows

    database = _normalize(views(group_size), dtype)
    queries = _normalize(views(1), dtype)
    database_labels = np.repeat(np.arange(n_instances), group_size)
    query_labels = np.arange(n_instances)
    return Corpus(negatives, database, queries, database_labels, query_labels)


def write_corpus(
    corpus: Corpus, path: str, chunk_rows: int = 4096, attrs: dict | None = None
) -> None:
    """Write a corpus as a zarr group: negatives, database, queries and labels.

    Under a lease, as a new version of a versioned store
    (:mod:`slem_dask.storage.versioning.versions`): readers see the previous corpus or the whole
    new one, and an interrupted write is never taken for a corpus (a later
    ``[generate]`` step would take it for the whole). ``attrs`` are added to the
    group's attributes.
    """
    from . import storage
    from .storage.versioning import versions

    where = storage.canonical(path)
    with versions.VersionedStore(where).transaction("write corpus") as tx:
        tx.make_room()  # always commits: the oldest version goes first
        draft = tx.begin()
        try:
            _write_group(corpus, draft.location, chunk_rows, attrs)
            tx.check_lease()
            tx.commit("corpus", {"n_instances": int(len(corpus.queries))})
        except KeyboardInterrupt:  # within seconds, answered or not
            tx.discard(interrupted=True)
            raise
        except BaseException:
            tx.discard()  # quick to write again: nothing worth resuming
            raise


def _write_group(corpus: Corpus, location: str, chunk_rows: int, attrs: dict | None) -> None:
    from .storage import CHECKSUM, metadata_checksum
    from .storage.nodes.checksums import chunk_trailers, corpus_array_meta
    from .storage.nodes.dimensions import dimension_names
    from .storage.nodes.groups import CHUNK_CRC32C, create_group_last, write_member_documented_last
    from .storage.versioning.ownership import ATTR
    from .storage.nodes.readers import fill_value

    # every chunk's crc32c: in each array's metadata (for its readers) and in the
    # group's checksummed metadata, which its commit record covers (for verify); each
    # document written once, whole, after what it describes (a late write of an
    # earlier one would otherwise undo it: docs/testing-faults.md, late_overtakes)
    crcs = {}
    for name in ("negatives", "database", "queries", "database_labels", "query_labels"):
        data = getattr(corpus, name)
        rows = min(chunk_rows, max(1, len(data))) if data.ndim == 2 else max(1, len(data))

        def documented(arr, name=name) -> dict:
            crcs[name] = chunk_trailers(arr)
            return {ATTR: corpus_array_meta(crcs[name])}

        write_member_documented_last(
            location,
            name,
            data,
            documented,
            chunks=(rows, *data.shape[1:]),
            compressors=CHECKSUM,
            dimension_names=dimension_names(name, data.ndim),
            fill_value=fill_value(data.dtype),  # a chunk not there reads NaN or -1
        )
    meta = {"kind": "corpus", CHUNK_CRC32C: crcs}
    group_attrs = {
        **(attrs or {}),
        "slem_dask_corpus": {
            "kind": "synthetic-instance-corpus",
            "n_instances": int(len(corpus.queries)),
        },
        ATTR: {**meta, "metadata_checksum": metadata_checksum(meta)},
    }
    create_group_last(location, group_attrs)
