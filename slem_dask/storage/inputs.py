"""Opening what a job reads: the committed version of a versioned store, a member of
one, or a plain zarr v3 array, with one clear error for anything else."""

from __future__ import annotations

import os

import numpy as np

import zarr

from . import versions
from ..validation import check_array_metadata
from .checksums import metadata_checksum
from .chunks import read_rows
from .ownership import ATTR, damaged_metadata
from .paths import canonical, check_outside_inputs, exists


def _exists(path) -> bool:
    """Whether ``path`` holds something to read or to refuse replacing: a committed
    version, or any store that is not slem-dask's drafts alone (a killed first write
    leaves only drafts: the next run reuses or deletes them)."""
    path = canonical(path)
    if not exists(path):
        return False
    store = versions.VersionedStore(path)
    return store.is_versioned() or not store.has_history()


def _demo_member(name: str) -> str:
    """The array of the demo corpus that an input called ``name`` would be."""
    return {"positives": "database", "queries": "queries", "database": "database"}.get(
        name, "negatives")


def _demo_example(name: str) -> str:
    """That array's path from the working directory: the demo's folder, or above it."""
    folder = "" if os.path.isdir("corpus.zarr") else "slem-demo/"
    return f"{folder}corpus.zarr/{_demo_member(name)}"


def open_node(path, mode: str = "r"):
    """The zarr v3 node that readers of ``path`` see: the head version of a versioned
    store (its metadata checked against its commit record), a member of one, or a plain
    zarr node. Raises FileNotFoundError when there is nothing to read."""
    location, store, commit = versions.resolve(path)
    if store is not None:
        store.check(commit)
    return zarr.open(store=location, mode=mode, zarr_format=3)


def open_input(path: str, name: str, empty_ok: bool = False) -> zarr.Array:
    """Open an existing 2-D zarr array for reading, with a clear error otherwise.
    ``empty_ok``: an array of 0 rows is valid (positives: their encoding is empty)."""
    path = str(canonical(path))
    try:
        node = open_node(path)
    except versions.VersionError as exc:
        raise type(exc)(f"{name}: {exc}") from None
    except FileNotFoundError:
        if versions.VersionedStore(path).has_history():
            raise ValueError(
                f"{name}: {path!r} is an unfinished slem-dask output (the run that wrote "
                f"it stopped part-way, and nothing was committed); run the same `slem-dask "
                f"encode` again to finish it (it resumes), or with --overwrite to start "
                f"over") from None
        raise FileNotFoundError(
            f"{name}: no zarr array at {path!r}; give the path of an existing zarr "
            f"array, e.g. {_demo_example(name)} (written by "
            f"`slem-dask demo`)"
        ) from None
    except Exception as exc:  # zarr raises several types for non-zarr folders
        raise damaged_metadata(name, path, exc) or ValueError(
            f"{name}: {path!r} is not a readable zarr store ({type(exc).__name__}: {exc}); "
            f"give the path of a zarr v3 array"
        ) from None
    if isinstance(node, zarr.Group):
        members = sorted(k for k, v in node.members() if isinstance(v, zarr.Array))
        hint = f" (arrays in it: {', '.join(members)})" if members else ""
        example = _demo_member(name)
        if members and example not in members:
            example = members[0]
        raise ValueError(
            f"{name}: {path!r} is a zarr group, not an array{hint}; give the path of "
            f"an array inside it, e.g. {path.rstrip('/')}/{example}"
        )
    if node.ndim != 2:
        fix = ("; if it is one descriptor, store it as one row: x.reshape(1, -1) "
               "(zarr.create_array(..., shape=(1, len(x)), ...))" if node.ndim == 1 else
               "; store it as 2-D rows, e.g. x.reshape(len(x), -1)")
        raise ValueError(
            f"{name}: the zarr array at {path!r} has shape {node.shape} ({node.ndim}-D); "
            f"expected a 2-D array (n_rows, n_features){fix}"
        )
    if node.shape[1] == 0 or (node.shape[0] == 0 and not empty_ok):
        raise ValueError(
            f"{name}: the zarr array at {path!r} has shape {node.shape}: it has no "
            f"{'features (columns)' if node.shape[1] == 0 else 'rows'}"
        )
    if not (np.issubdtype(node.dtype, np.floating) or np.issubdtype(node.dtype, np.integer)):
        raise TypeError(
            f"{name}: the zarr array at {path!r} has dtype {node.dtype}; expected real numbers"
        )
    check_array_metadata(node, name, path)  # before any chunk is listed or read
    meta = node.attrs.get(ATTR)
    if isinstance(meta, dict) and meta.get("kind") == "encoding" and meta.get("complete") \
            and "metadata_checksum" in meta \
            and meta["metadata_checksum"] != metadata_checksum(meta):
        raise ValueError(
            f"{name}: the metadata of the slem-dask output {path!r} does not match its "
            f"checksum (a fingerprint or recorded checksum was edited); run its "
            f"`slem-dask encode` again with --overwrite")
    if isinstance(meta, dict) and meta.get("kind") == "encoding" and not meta.get("complete"):
        raise ValueError(
            f"{name}: {path!r} is an unfinished slem-dask output (the run that wrote it "
            f"stopped part-way); run the same `slem-dask encode` again to finish it "
            f"(it resumes), or with --overwrite to start over"
        )
    return node


def read_all(path, name: str = "encodings") -> np.ndarray:
    """A whole (small) array, with missing or corrupt chunks named."""
    arr = open_input(path, name, empty_ok=True)  # an encoding of no positives is empty
    return read_rows(arr, 0, arr.shape[0], name)


def _key(path) -> str:
    return canonical(path).key


def check_distinct(target, flag: str, inputs: dict[str, object]) -> None:
    """Refuse to write ``target`` where it would replace or nest in an input, where it
    would shadow a member of a versioned store (``corpus.zarr/queries``), or inside a
    store's version folders or commit records."""
    target = canonical(target)
    parts = target.url.rstrip("/").split("/")
    for i, part in enumerate(parts[:-1]):
        if part in (versions.VERSIONS, versions.COMMITS) and i > 0 and \
                versions.VersionedStore("/".join(parts[:i])).has_history():
            raise ValueError(
                f"{flag} {str(target)!r} is inside the {part} of the slem-dask store "
                f"{'/'.join(parts[:i]).replace('file://', '')!r}, which nobody writes but "
                f"slem-dask's commits: choose a path outside it")
    location, owner, commit = versions.resolve(target)
    if owner is not None and owner.path.url != target.url \
            and exists(canonical(location)):
        raise ValueError(
            f"{flag} {str(target)!r} is the member {target.name!r} of version {commit.seq} "
            f"of the slem-dask store {str(owner.path)!r}: writing there would hide it from "
            f"every reader; choose another name")
    check_outside_inputs(target, flag, inputs)


def open_output(path, name: str = "encodings") -> zarr.Array:
    """Open an output written by slem-dask (refused, like any input, if unfinished;
    an encoding of 0 positives is empty)."""
    return open_input(path, name, empty_ok=True)
