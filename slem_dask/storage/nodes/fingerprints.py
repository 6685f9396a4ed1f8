"""Fingerprints of inputs: what a job read, so that it can tell whether an input changed
while, or since, it was read. A versioned input is named by its committed version; a
plain zarr array by the listing of its chunks (key, size, mtime); a file input
(:mod:`.formats`) by the name, size and mtime of each of its files."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

import zarr

from ..versioning import versions
from .chunks import _unit_shape, _where, iter_chunk_keys, read_rows, unit_rows
from ..versioning.errors import MissingChunkError, missing_chunk_error
from ..formats.formats import FileArray
from ..backends.paths import StorePath, _fs, canonical

#: Metadata documents of a zarr array (v3, v2): not data, so not in a listing (an
#: attribute written on an output must not make its readers' fingerprints change).
_METADATA_KEYS = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")


def _listing(arr, path: StorePath) -> dict[str, tuple]:
    """{store key: (size, mtime in ns)} for every chunk of ``arr``."""
    from ..versioning.versions import resolve

    path = canonical(resolve(path)[0])  # a versioned store: the version that was opened
    if arr.path and not path.location.rstrip("/").endswith(f"/{arr.path}"):
        path = path.child(arr.path)  # a member of the group at path (an exported output)
    prefix = f"{arr.path}/" if arr.path else ""
    root = path.location
    # ``path`` names the array itself: strip the array's own prefix from the keys
    out: dict[str, tuple[int, int | str]] = {}
    if path.is_local:
        for dirpath, _, files in os.walk(root):
            for name in files:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                if rel in _METADATA_KEYS or name.endswith(".partial"):
                    continue
                st = os.stat(full)
                out[prefix + rel] = (st.st_size, st.st_mtime_ns)
        return out
    fs, froot = _fs(path)  # pragma: no cover - needs a remote store
    for full, info in fs.find(froot, detail=True).items():
        rel = full[len(froot) :].lstrip("/")
        if rel in _METADATA_KEYS:
            continue
        stamp = (
            info.get("mtime")
            or info.get("LastModified")
            or info.get("ETag")
            or info.get("created")
            or ""
        )
        out[prefix + rel] = (int(info.get("size", 0)), str(stamp))  # str: stable across runs
    return out


def _digest(parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode())
    return h.hexdigest()[:32]


def _layout(arr) -> tuple:
    meta = arr.metadata
    codecs: dict | list
    if getattr(meta, "zarr_format", 3) == 2:  # no codecs: its filters and compressor
        codecs = {
            k: v for k, v in meta.to_dict().items() if k in ("filters", "compressor", "order")
        }
    else:
        codecs = [c.to_dict() for c in meta.codecs]
    return (
        str(arr.dtype),
        tuple(arr.chunks),
        getattr(arr, "shards", None),
        json.dumps(codecs, sort_keys=True, default=str),
        repr(meta.fill_value),
    )


def _listed(listing: dict, arr, path: StorePath, name: str, lo: int, hi: int) -> list:
    """(key, listing entry) of every storage unit holding rows [lo, hi); a unit absent
    from the listing is an error.

    Keys are checked as they are generated: each present key is a distinct entry of
    the listing, so a declared size beyond what the store holds meets its first
    missing key within len(listing) + 1 keys, however many rows it declares."""
    out = []
    for key, a, b in iter_chunk_keys(arr, lo, hi):
        if key not in listing:
            exc = missing_chunk_error(name, path, key, a, b)
            rows, cols = _unit_shape(arr)[:2]
            units = -(-int(arr.shape[0]) // rows) * -(-int(arr.shape[1]) // cols)
            if units > len(listing):  # say so when zarr.json declares more than is there
                exc = MissingChunkError(
                    f"{exc} (its zarr.json declares shape {arr.shape}: {units} chunk(s) "
                    f"of {rows} x {cols}, and the store holds {len(listing)} object(s))"
                )
            raise exc
        out.append((key, listing[key]))
    return out


def partition_fingerprints(arr, path, name: str, rows: int) -> list[str]:
    """One fingerprint per row partition of ``rows`` rows, from the store listing.

    A partition's fingerprint changes when any chunk under it is rewritten (its
    size or mtime changes). A chunk absent from the listing is an error.
    """
    if isinstance(arr, FileArray):  # its files' names, sizes and mtimes
        n = int(arr.shape[0])
        return [arr.fingerprint(lo, min(n, lo + rows), name) for lo in range(0, n, rows)]
    path = canonical(path)
    listing = _listing(arr, path)
    layout = _layout(arr)
    n = int(arr.shape[0])
    out = []
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        out.append(_digest([layout, hi - lo, *_listed(listing, arr, path, name, lo, hi)]))
    return out


def rows_fingerprint(arr, path, name: str, n_rows: int) -> str:
    """Fingerprint of the first ``n_rows`` rows: the listing of the storage units they
    fill completely, plus a digest of the content of the rows in a partly filled
    last unit (appending rewrites that unit, so its listing would change)."""
    if isinstance(arr, FileArray):  # the files holding those rows
        return arr.fingerprint(0, n_rows, name)
    path = canonical(path)
    rows = unit_rows(arr)
    full = (n_rows // rows) * rows
    listing = _listing(arr, path)
    parts = [
        _layout(arr),
        int(arr.shape[1]),
        n_rows,
        *(_listed(listing, arr, path, name, 0, full) if full else []),
    ]
    if full < n_rows:
        _listed(listing, arr, path, name, full, n_rows)  # must exist; its rows are digested
        # the reader's rows, hashed where they lie: the bytes of tobytes() on zarr's copy
        # (at 784 x 8192 float32: 0.06 s against 0.12 s, once per encode and twice per fit)
        tail = read_rows(arr, full, n_rows, name)
        parts.append(hashlib.sha256(tail.reshape(-1).view(np.uint8)).hexdigest())  # type: ignore[arg-type]  # a buffer
    return _digest(parts)


def read_version(arr: zarr.Array, path, fingerprint: str | None = None) -> dict:
    """What a job reads through ``arr``, opened from ``path``, for the record: the URL
    and, for a versioned store, the committed version that ``arr`` was opened in (its
    sequence number and folder), else a fingerprint of the plain array's listing
    (``fingerprint``: its :func:`rows_fingerprint` of all rows, if the caller has it)."""
    path = canonical(path)
    if isinstance(arr, FileArray):
        return {
            "url": path.url,
            "fingerprint": fingerprint or arr.fingerprint(0, int(arr.shape[0])),
        }
    parts = _where(arr).rstrip("/").split("/")
    if versions.VERSIONS in parts[:-1]:
        i = len(parts) - 1 - parts[::-1].index(versions.VERSIONS)
        if i + 1 < len(parts):
            owner = versions.VersionedStore("/".join(parts[:i]) or "/")
            commit = owner.commit_at(versions.draft_seq(parts[i + 1]) or 0)
            if commit is not None:
                return {"url": path.url, "version": commit.seq, "version_id": commit.version}
    return {
        "url": path.url,
        "fingerprint": fingerprint or rows_fingerprint(arr, path, "input", int(arr.shape[0])),
    }
