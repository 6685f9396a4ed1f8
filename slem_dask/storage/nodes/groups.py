"""Stores of small arrays (models, search results) written as one version of a
versioned store, read back before they are committed, and read with every check."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

import zarr

from ..._version import __version__
from ..versioning import versions
from .checksums import (
    CHECKSUM,
    chunk_change,
    chunk_record_digest,
    array_digests,
    chunk_trailers,
    fingerprint,
    json_params,
    metadata_checksum,
)
from ..backends.local_durable import start_writeback_tree
from .chunks import _reason
from .member_reads import read_member, read_whole
from .dimensions import dimension_names
from ..versioning.errors import (
    CorruptChunkError,
    DamagedStoreError,
    IntegrityError,
    rollback_advice,
)
from .inputs import _exists, open_node
from ..versioning.records import version_folder_seq
from ..versioning.transaction import Transaction
from .outputs import is_legacy
from ..versioning.ownership import ATTR, check_may_replace, damaged_metadata, remove
from ..backends.paths import canonical, zarr_store
from ..backends.registry import is_storage_failure
from .readers import fill_value
from .recorded import CHUNK_CRC32C

if TYPE_CHECKING:
    from zarr.core.metadata import ArrayV3Metadata


MODEL_FORMAT_VERSION = 2
#: The metadata field of a model that records each array's own SHA-256
#: (:func:`.checksums.array_digests`), beside the fingerprint of them all.
ARRAY_SHA256 = "array_sha256"
#: The metadata field of a model that records :func:`.checksums.chunk_record_digest` of
#: its parameters and ``chunk_crc32c``: a reader that has it checks each chunk of an
#: array it reads against the record (:mod:`.model_reads`), with no SHA-256 of the array.
CHUNK_CRC32C_SHA256 = "chunk_crc32c_sha256"
# CHUNK_CRC32C: the metadata field of a group written by :func:`write_group` (and of a
# corpus) that records each array's chunk checksums (:func:`.checksums.chunk_trailers`);
# its readers check every chunk against it (:mod:`.recorded`)


def _check_overwrite(path, overwrite: bool, what: str, flag: str, kind: str | None = None) -> None:
    check_may_replace(path, what, flag, kind)  # first: never suggest replacing
    if _exists(path) and not overwrite:
        raise FileExistsError(
            f"{what} {str(canonical(path))!r} already exists; pass {flag} to replace it, or "
            f"choose another path"
        )


def replace_legacy(path, what: str) -> None:
    """Remove a store that slem-dask 0.2 wrote in place at ``path`` (no versions), so
    that a versioned store can take its place (only with --overwrite or --update)."""
    if is_legacy(path):
        remove(path)


def write_group(
    path,
    meta: dict,
    arrays: dict[str, np.ndarray],
    what: str,
    overwrite: bool = False,
    transaction: Transaction | None = None,
    job: str | None = None,
) -> versions.Commit:
    """Write a zarr group of small arrays (a model, a search result, a corpus) as a new
    version of the versioned store at ``path`` (:mod:`.versions`), and commit it.

    Readers see the previous version until the commit, then the whole new one. Every
    chunk carries a crc32c, and the group is read back before it is committed. Written
    in ``transaction`` (the job's, which holds the lease; one of its own if not given).
    """
    path = canonical(path)
    if transaction is None:
        with versions.VersionedStore(path).transaction(f"write {what}") as tx:
            return _write_group_in(tx, path, meta, arrays, what, overwrite, job)
    return _write_group_in(transaction, path, meta, arrays, what, overwrite, job)


def _write_group_in(
    tx: Transaction, path, meta: dict, arrays, what: str, overwrite: bool, job: str | None
) -> versions.Commit:
    # under the lease: what is at the path stays as checked until it is replaced
    _check_overwrite(path, overwrite, what, "overwrite=True (CLI: --overwrite)", meta.get("kind"))
    replace_legacy(path, what)
    tx.make_room()  # always commits: the oldest version goes first
    draft = tx.begin()
    with tx.discarded_on_failure():  # small: nothing worth resuming
        written = _write_arrays(draft.location, arrays)
        # every chunk's crc32c, in the checksummed metadata: a chunk swapped in from
        # another version (itself self-consistent) is told from the one written here
        crcs = {key: chunk_trailers(arr) for key, arr in written.items()}
        meta = {**meta, CHUNK_CRC32C: crcs}
        if meta.get("kind") == "model":  # the record, bound to the parameters it is read with
            meta[CHUNK_CRC32C_SHA256] = chunk_record_digest(meta["params"], crcs)
        create_group_last(
            draft.location, {ATTR: {**meta, "metadata_checksum": metadata_checksum(meta)}}
        )
        _check_written(draft.location, arrays, what)
        tx.check_lease()  # no other job took the store over meanwhile
        return tx.commit(
            meta.get("kind", "group"),
            {k: meta[k] for k in ("model", "k") if k in meta},
            job=job or tx.job,  # the command's name (slem-dask fit), as encode's commits
        )


def create_group_last(location: str, attributes: dict) -> zarr.Group:
    """The group document at the root of the draft ``location``, with its final
    ``attributes``, written once, after its arrays: a key of a draft is never written
    again with other bytes, since a store may let a timed-out request, retried by its
    client, land after a newer write of the same key (the committed version would then
    no longer match its record). Never ``overwrite``: that would empty the draft."""
    return zarr.create_group(store=zarr_store(location, "w"), attributes=attributes, zarr_format=3)


def _write_arrays(location: str, arrays: dict[str, np.ndarray]) -> dict[str, zarr.Array]:
    """Each array into the draft ``location`` as a member of the group to be written
    there, in chunks of :func:`_group_chunk_rows` rows, every chunk with its crc32c.
    Each opened at its own key, not through the group: zarr would write the group's
    document first, empty, to be rewritten with the attributes (:func:`create_group_last`)."""
    written = {}
    for key, value in arrays.items():
        value = np.asarray(value)
        rows = _group_chunk_rows(value)
        # zarr takes chunks=None (a 0-d array: one chunk); its annotation does not
        written[key] = arr = zarr.create_array(
            store=zarr_store(_member(location, key), "w"),
            shape=value.shape,
            dtype=value.dtype,
            chunks=(rows, *value.shape[1:]) if value.ndim else None,  # type: ignore[arg-type]
            compressors=CHECKSUM,
            dimension_names=dimension_names(key, value.ndim),  # by meaning, for xarray
            # a chunk that is not there (a version pruned under a plain zarr reader) reads
            # as NaN or -1, never as plausible zeros
            fill_value=fill_value(value.dtype),
        )
        if not value.ndim:
            arr[...] = value
        for start in range(0, len(value) if value.ndim else 0, rows):
            arr[start : start + rows] = value[start : start + rows]
        if "://" not in location:  # on the disk by the commit, which waits for it
            start_writeback_tree(_member(location, key))
    return written


def _member(location: str, key: str) -> str:
    """The location of member ``key`` of the group at ``location`` (a path or a URL)."""
    return f"{location.rstrip('/')}/{key}"


def write_member_documented_last(
    location: str, key: str, value: np.ndarray, attributes, **create
) -> zarr.Array:
    """Member ``key`` of the group to be written at the draft ``location`` (then
    :func:`create_group_last`): its chunks first, then its zarr.json, once, with the
    attributes that ``attributes(arr)`` makes from what was written (a corpus records
    each chunk's crc32c there). ``create``: :func:`zarr.create_array`'s layout
    arguments. Written once for the reason :func:`create_group_last` says."""
    from zarr.core.array import AsyncArray
    from zarr.core.sync import sync
    from zarr.storage._common import make_store_path

    layout = zarr.create_array(store={}, shape=value.shape, dtype=value.dtype, **create)
    # mode "a": a new member of a new draft (zarr's "w" would first delete under it)
    where = sync(make_store_path(zarr_store(_member(location, key), "w"), mode="a"))
    metadata = cast("ArrayV3Metadata", layout.metadata)  # zarr v3, as create_array makes
    arr = zarr.Array(AsyncArray(metadata=metadata, store_path=where))
    arr[...] = value  # its chunks alone: zarr writes no document for them
    arr.update_attributes(attributes(arr))  # the document, whole
    return arr


#: Bytes per chunk of the arrays of a model or search result: writing and checking a
#: chunk copies it once or twice, so a d x d array at d = 8192 (512 MiB) is written
#: in 16 chunks rather than as one.
GROUP_CHUNK_BYTES = 32 * 2**20


def _group_chunk_rows(value: np.ndarray) -> int:
    if not value.ndim or not value.size:
        return max(1, len(value) if value.ndim else 1)
    row_bytes = value[0].nbytes or 1
    return int(max(1, min(len(value), GROUP_CHUNK_BYTES // row_bytes)))


def _check_written(location: str, arrays: dict[str, np.ndarray], what: str) -> None:
    """Read a group back (through its checksums), chunk by chunk, before it is put in
    place: what is marked complete is what was computed."""
    # zarr_format: it was just written as v3; else zarr asks for v2's three names first
    group = zarr.open_group(store=zarr_store(location), mode="r", zarr_format=3)
    stored = dict(group.arrays())
    for key, value in arrays.items():
        value = np.asarray(value)
        same = key in stored and stored[key].shape == value.shape
        try:
            if same and not value.ndim:
                same = np.array_equal(stored[key][...], value, equal_nan=True)
            rows = stored[key].chunks[0] if same and value.ndim else 1
            for start in range(0, len(value) if same and value.ndim else 0, rows):
                if not np.array_equal(
                    stored[key][start : start + rows], value[start : start + rows], equal_nan=True
                ):
                    same = False
                    break
        except Exception as exc:  # noqa: BLE001 - a chunk that cannot be read back
            raise CorruptChunkError(
                f"{what}: array {key!r} of {location!r} cannot be read back "
                f"({_reason(exc)}); nothing was replaced: check the storage and write it "
                f"again"
            ) from None
        if not same:
            raise IntegrityError(
                f"{what}: array {key!r} read back from {location!r} differs from what was "
                f"written; nothing was replaced: check the storage and write it again"
            )


def write_model_store(
    path,
    model_name: str,
    params: dict,
    arrays: dict[str, np.ndarray],
    info: dict,
    overwrite: bool = False,
    transaction: Transaction | None = None,
) -> str:
    """Write a model group; return its fingerprint (see :func:`write_group`)."""
    params = json_params(params)
    fp = fingerprint(arrays, params)
    meta = json_params(
        {
            "kind": "model",
            "format_version": MODEL_FORMAT_VERSION,
            "model": model_name,
            "params": params,
            "fingerprint": fp,
            ARRAY_SHA256: array_digests(arrays, params),
            "package_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **info,
        }
    )
    write_group(path, meta, arrays, "model store", overwrite=overwrite, transaction=transaction)
    return fp


def _changed_member_chunk(group, key: str, arr) -> str | None:
    """What is wrong with the first chunk of member ``key`` that is not the one
    recorded at the group's commit, as a sentence naming it (None: all match, or the
    group records none: written before)."""
    recorded = (group.attrs.get(ATTR) or {}).get(CHUNK_CRC32C)
    if not isinstance(recorded, dict):
        return None
    change = chunk_change(arr, recorded.get(key) or [])
    if change is None:
        return None
    chunk, what = change
    if what == "missing":
        return f"chunk {chunk!r} is missing (deleted, or lost by the storage)"
    if what == "truncated":
        return f"chunk {chunk!r} is truncated (too short to end in its crc32c)"
    return (
        f"chunk {chunk!r} is not the chunk that was written (its crc32c differs from "
        f"the one recorded at its commit: swapped in from another version, or damaged)"
    )


def read_group_arrays(
    group,
    path,
    what: str,
    recorded: bool = True,
    read: bool = True,
    only: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Every array of a group written by :func:`write_group` (``only``: those of them),
    corrupt chunks named, and (``recorded``) each chunk checked against the crc32c
    recorded at its commit; with ``read`` False, only checked (a re-run deciding that it
    is up to date): {}."""
    arrays = {}
    for key, arr in _group_members(group, path, what, only):
        changed = _changed_member_chunk(group, key, arr) if recorded else None
        if changed is not None:
            raise CorruptChunkError(
                f"{what} {str(path)!r}: {changed}; the store was modified: write it "
                f"again{rollback_advice(path, _version_seq(group))}"
            )
        if read:
            arrays[key] = read_member(path, what, key, _version_seq(group), read_whole, arr)
    return arrays


def _group_members(group, path, what: str, only: Sequence[str] | None) -> list:
    """(name, zarr array) of each array of ``group`` (``only``: those of them)."""
    try:
        return [(k, a) for k, a in group.arrays() if only is None or k in only]
    except Exception as exc:  # noqa: BLE001 - a member's zarr.json that cannot be parsed
        raise damaged_metadata(what, path, exc) or DamagedStoreError(
            f"{what}: the arrays of {str(path)!r} cannot be listed ({_reason(exc)}); the "
            f"store is damaged: write it again"
        ) from None


def _version_seq(group) -> int | None:
    """The sequence number of the version folder a group was read in; None for a plain
    store."""
    return version_folder_seq(group.store_path)


def open_written_group(
    path: str, what: str, fix: str = "", array_fix: Callable[[], str] | None = None
) -> zarr.Group:
    """The zarr group at ``path``, to be read as the ``what`` slem-dask wrote there; a
    path that holds none is refused in one line, ending with ``fix`` (how to name the
    right one; ``array_fix()`` instead when the path holds an array: called only then).
    A store that does not answer raises as it does: no word on what it holds."""
    try:
        node = open_node(path)
    except versions.VersionError as exc:
        raise type(exc)(f"{what}: {exc}") from None
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: no zarr store at {path!r}{fix}") from None
    except Exception as exc:  # noqa: BLE001
        if is_storage_failure(exc):
            raise
        raise damaged_metadata(what, path, exc) or ValueError(
            f"{what}: {path!r} is not a zarr group ({type(exc).__name__}: {exc}){fix}"
        ) from None
    if isinstance(node, zarr.Array):
        said = _array_said(node, what)
        raise ValueError(f"{what}: {path!r} is {said}{fix if array_fix is None else array_fix()}")
    return node


def _array_said(array: zarr.Array, what: str) -> str:
    """What ``array`` is, said against the ``what`` it is not."""
    meta = array.attrs.get(ATTR)
    if isinstance(meta, dict) and meta.get("kind") == "encoding":
        return f"an encoded output of slem-dask (`slem-dask encode --out`), not a {what}"
    return f"a zarr array, not a {what} (a {what} is a zarr group)"


def read_search_store(path, arrays: bool = True) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a search result written by ``slem-dask search``: (metadata, arrays), refusing
    one that is unfinished, edited or damaged (``arrays`` False: its chunks are checked
    against their recorded crc32c, not read, and the arrays are {})."""
    path = str(canonical(path))
    group = open_written_group(path, "search result", "; give the --out of `slem-dask search`")
    meta = group.attrs.get(ATTR)
    if not isinstance(meta, dict) or meta.get("kind") != "search":
        raise ValueError(f"search result: {path!r} was not written by `slem-dask search`")
    if not meta.get("complete"):
        raise ValueError(
            f"search result: {path!r} is unfinished (the run that wrote it stopped "
            f"part-way); run `slem-dask search` again with --overwrite"
        )
    if meta.get("metadata_checksum") != metadata_checksum(meta):
        raise ValueError(
            f"search result: the metadata of {path!r} does not match its "
            f"checksum; run `slem-dask search` again with --overwrite"
        )
    return meta, read_group_arrays(group, path, "search result", read=arrays)
