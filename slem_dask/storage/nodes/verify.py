"""``slem-dask verify``: check a store written by slem-dask end to end."""

from __future__ import annotations

import zarr

from ..versioning import versions
from ..versioning.errors import DamagedStoreError, rollback_advice
from ..formats import formats
from .checksums import chunk_key, self_consistent_crc32c, stored_crc32c
from .groups import open_written_group, read_group_arrays, read_search_store
from .model_reads import read_model_store
from .inputs import _exists, open_node
from .outputs import output_meta
from ..versioning.records import version_folder_seq
from ..versioning.ownership import ATTR, damaged_metadata, slem_dask_kind, unreadable_marker
from ..backends.paths import canonical
from .readers import ENCODINGS


class Problems(list):
    """What :func:`verify` found wrong, one line each, and (``fix``) what repairs them
    when the lines do not say it themselves: '' otherwise."""

    fix: str = ""


def verify(path) -> tuple[str, list[str]]:
    """Check a store written by slem-dask end to end: (what it is, problems found).

    A versioned store: its current version, against its commit record. A model: its
    metadata checksum, every chunk's crc32c, its fingerprint. An output: complete,
    every partition present with the recorded crc32c, and every chunk decodable. A
    search result or a corpus: complete, every chunk decodable.
    """
    path = canonical(path)
    store = versions.VersionedStore(path)
    if not _exists(path):
        if store.has_history():
            return "unfinished", [
                "no version was committed (the job that wrote it stopped "
                "part-way): run the same command again"
            ]
        return "missing", [
            f"no store at {str(path)!r}: check the path (a job that has not "
            f"run yet writes nothing there)"
        ]
    try:  # a damaged record counts only in a store that slem-dask provably wrote
        head = store.head() if store.has_history() else None
    except versions.VersionError as exc:  # a damaged head record: nothing is read through it
        return "versioned store", [str(exc)]
    what, problems = _verify_current(path, head.seq if head else None)
    return (f"{what}, version {head.seq}" if head else what), problems


def rollback(path, seq: int, job: str = "slem-dask rollback") -> versions.Commit:
    """Version ``seq`` of the versioned store at ``path`` made current again by a new
    commit (:meth:`.versions.VersionedStore.rollback`), once :func:`verify` finds it
    whole, under the store's lease: a damaged version is refused, nothing committed."""
    store = versions.VersionedStore(canonical(path))

    def whole(location: str) -> None:
        what, problems = verify(location)
        if problems:
            more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
            kind = what.split(" ")[0]  # "model (LinearSLEM)": the problem may name it
            first = problems[0] if problems[0].startswith(f"{kind}:") else f"{what}: {problems[0]}"
            raise DamagedStoreError(
                f"{str(store.path)!r}: version {seq} is damaged, nothing was rolled back "
                f"or committed: {first}{more}; roll back to another version "
                f"(`slem-dask versions {store.path}` lists them, `slem-dask verify "
                f"{location}` checks one)"
            )

    return store.rollback(seq, job, check=whole)


def _verify_current(path, seq: int | None = None) -> tuple[str, list[str]]:
    kind = slem_dask_kind(path)
    fmt = formats.remote_format(str(path))
    if kind is None and fmt is not None:  # x.npy, x.h5, x.fvecs: an input, nothing to verify
        return f"descriptor file ({fmt}), not a store that slem-dask wrote", [
            "verify checks models, outputs, search results and corpora; fit and encode "
            "check descriptors (shape, dtype, NaN or inf) as they read them"
        ]
    if kind is None:
        return "unknown", [_not_marked(path)]
    if kind in ("model", "search", "corpus"):
        return _verify_group(kind, path)
    return _verify_output(path, seq)


def _not_marked(path) -> str:
    """Why ``path`` holds nothing slem-dask wrote (no marker)."""
    if unreadable_marker(path):
        return (
            "its metadata document 'zarr.json' cannot be read: the store is damaged, "
            "or is not a zarr v3 store"
        )
    if not _exists(path.child("zarr.json")):
        return (
            f"{str(path)!r} is not a zarr store (no 'zarr.json' in it): give the path "
            f"of a model, output, search result or corpus that slem-dask wrote"
        )
    return f"{str(path)!r} was not written by slem-dask (no '{ATTR}' marker)"


def _verify_group(kind: str, path) -> tuple[str, list[str]]:
    """A model, search result or corpus read whole (each array checked as it is read)."""
    if kind == "model":
        try:
            meta, _ = read_model_store(path)
        except ValueError as exc:
            return kind, [str(exc)]
        return f"model ({meta['model']})", []
    if kind == "search":
        try:
            read_search_store(path)
        except ValueError as exc:
            return "search result", [str(exc)]
        return "search result", []
    try:
        group = open_written_group(path, "corpus")
        read_group_arrays(group, path, "corpus")
    except ValueError as exc:
        return "corpus", [str(exc)]
    return "corpus", []


def _verify_output(path, seq: int | None = None) -> tuple[str, list[str]]:
    """An encoder's output (version ``seq`` of its store, if versioned): complete, every
    chunk present, whole and the one recorded."""
    try:
        arr = open_node(path)
    except versions.VersionError as exc:
        return "output", [str(exc)]
    except Exception as exc:  # noqa: BLE001 - its marker was read, zarr cannot read the rest
        location = versions.resolve(path)[0]
        return "output", [str(damaged_metadata("output", location, exc) or exc)]
    if isinstance(arr, zarr.Group) and ENCODINGS in arr:  # `slem-dask export` of an output
        arr = arr[ENCODINGS]
    meta = output_meta(arr) or {}
    problems = (
        []
        if meta.get("complete")
        else ["unfinished (complete: false): re-run the encode to finish it"]
    )
    crcs = meta.get("partition_crc32c") or []
    n_parts = -(-arr.shape[0] // int(arr.chunks[0]))
    if meta.get("complete") and len(crcs) != n_parts:
        problems.append(f"records {len(crcs)} partition checksums for {n_parts} partitions")
    chunk_problems, trusted = _chunk_problems(arr, crcs, n_parts)
    problems += chunk_problems
    if len(problems) > 12:  # an interrupted output can miss thousands of chunks
        problems = problems[:10] + [f"... and {len(problems) - 10} more"]
    found = Problems(problems)
    if meta.get("complete") and found:
        found.fix = _output_fix(path, seq, trusted)
    return "output", found


def _chunk_problems(arr, crcs: list, n_parts: int) -> tuple[list[str], bool]:
    """(each chunk of the output ``arr`` that is missing, damaged or not the one
    recorded, whether one of them is damaged behind the trailer recorded for it)."""
    problems, trusted = [], False
    for i in range(n_parts):
        key = chunk_key(arr, (i, 0))
        lo, hi = i * arr.chunks[0], min(arr.shape[0], (i + 1) * arr.chunks[0])
        crc = self_consistent_crc32c(arr, i)
        if crc is None:
            trailer = stored_crc32c(arr, i)
            trusted |= trailer is not None and i < len(crcs) and trailer == crcs[i]
            problems.append(
                f"chunk {key!r} (rows {lo}-{hi - 1}) is "
                f"{'missing' if trailer is None else 'corrupt or truncated'}"
            )
        elif i < len(crcs) and crcs[i] is not None and crcs[i] != crc:
            problems.append(
                f"chunk {key!r} (rows {lo}-{hi - 1}) is not the chunk that was "
                f"written (crc32c {crc:08x}, recorded {crcs[i]:08x})"
            )
    return problems, trusted


def _output_fix(path, seq: int | None, trusted: bool) -> str:
    """How to repair a damaged committed output at ``path`` (:func:`_store_fix`); given
    by a version folder, said of its store: only the current version is repaired."""
    folder = version_folder_seq(path)
    if folder is None:
        return _store_fix(path, seq, trusted)
    try:
        owner = versions.resolve(path)[1]
        current = owner.head() if owner is not None else None
    except Exception:  # noqa: BLE001 - the store around it fails: nothing sure to say
        return ""
    if owner is None or current is None:
        return ""
    if current.seq == folder:
        return _store_fix(owner.path, folder, trusted)
    return (
        f"this is version {folder} of {str(owner.path)!r}, not its current version "
        f"{current.seq}: readers of the store do not read it, and a rollback to it is "
        f"refused; `slem-dask verify {owner.path}` checks the current one"
    )


def _store_fix(path, seq: int | None, trusted: bool) -> str:
    """How to repair a committed output's chunks. A re-run of its encode reads each
    chunk's 4-byte trailer, not the whole output: it encodes again a partition whose
    chunk is missing or whose trailer is not the one recorded, not one damaged behind a
    trailer it trusts (``trusted``); --overwrite encodes every partition. An output
    written in place by slem-dask 0.2 (``seq`` None) is written again only with it."""
    if seq is None:
        return "run the same `slem-dask encode` with --overwrite: it writes it again, versioned"
    if trusted:
        return (
            f"run the same `slem-dask encode` with --overwrite: it encodes every partition "
            f"again and commits a new version (without it, a re-run checks each chunk's "
            f"recorded checksum, which a chunk damaged inside still ends with)"
            f"{rollback_advice(path, seq)}"
        )
    return (
        f"run the same `slem-dask encode` again: it encodes those partitions again and "
        f"commits a new version{rollback_advice(path, seq)}"
    )
