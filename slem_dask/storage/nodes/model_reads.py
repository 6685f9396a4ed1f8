"""A model group read back (:func:`read_model_store`): its metadata checked first, then
the arrays a caller needs, each checked as it is read, against the crc32c its commit
recorded of each of its chunks (bound to the model's parameters by a recorded SHA-256 of
both) or against its own recorded SHA-256; a model written before those records is read
whole and checked against its fingerprint. :mod:`.groups` writes it."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import zarr

from ..._version import __version__
from ..backends.paths import canonical
from ..versioning.errors import (
    ChangedChunkError,
    CorruptChunkError,
    DamagedStoreError,
    rollback_advice,
)
from ..versioning.ownership import ATTR
from .checksums import chunk_record_digest, digest_head, fingerprint, metadata_checksum
from .chunks import trailers_checked_by_rows
from .groups import (
    ARRAY_SHA256,
    CHUNK_CRC32C_SHA256,
    MODEL_FORMAT_VERSION,
    _changed_member_chunk,
    _group_members,
    open_written_group,
    _version_seq,
    read_group_arrays,
)
from .member_reads import MemberCast, read_hashed, read_member, read_recorded
from .recorded import CHUNK_CRC32C


def read_model_store(
    path: str | os.PathLike[str],
    members: Callable[[dict], Sequence[str] | Mapping[str, MemberCast | None] | None] | None = None,
) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a model group written by :func:`write_model_store`: (metadata, arrays).

    ``members(metadata)``: the arrays the caller needs (None: all), chosen once the
    metadata of the version being read is known, or a mapping of them to the
    :class:`MemberCast` each is read through (None: as stored). They alone are read, each
    checked as it is read: chunk by chunk against the crc32c recorded of it, where the
    model binds that record to its parameters (:data:`.groups.CHUNK_CRC32C_SHA256`), else
    against its own recorded SHA-256 (:data:`ARRAY_SHA256`); a model written before
    those records is read whole, as stored, and checked against its fingerprint."""
    path = str(canonical(path))
    meta, group = _read_model_meta(path)
    asked = members(meta) if members is not None else None
    wanted = asked if asked is None or isinstance(asked, Mapping) else dict.fromkeys(asked)
    digests = meta.get(ARRAY_SHA256)
    if wanted is not None and isinstance(digests, dict) and set(wanted) <= set(digests):
        arrays, read = _read_checked_members(group, path, wanted, meta)
        if any(k not in arrays for k in wanted) or read != {k: digests[k] for k in read}:
            raise _model_arrays_changed(path, group, list(wanted))
        return meta, arrays
    arrays = read_group_arrays(group, path, "model", recorded=False)  # its fingerprint says
    if fingerprint(arrays, meta["params"]) != meta.get("fingerprint"):
        raise _model_arrays_changed(path, group, None)
    return meta, arrays


def _model_arrays_changed(
    path: str, group, members: Sequence[str] | None, record: str | None = None
) -> DamagedStoreError:
    """The error for arrays that do not match their record (``record``: which, in words;
    default: the fingerprint, or their SHA-256 for ``members``), naming a changed chunk."""
    changed = [
        c
        for c in (
            _changed_member_chunk(group, k, a)
            for k, a in group.arrays()
            if members is None or k in members
        )
        if c is not None
    ]
    which = f" ({changed[0]})" if changed else ""
    if record is None:
        record = "its recorded fingerprint" if members is None else "their recorded SHA-256"
    # a ValueError, as before: a chunk named as changed is damage of that chunk
    error = CorruptChunkError if changed else DamagedStoreError
    return error(
        f"model: the arrays in {path!r} do not match {record}{which}; "
        f"the store was modified or damaged: refit the model"
        f"{rollback_advice(path, _version_seq(group))}"
    )


def read_model_meta(path: str) -> dict:
    """The checked metadata of a model group, without reading its arrays (512 MiB for a
    linear model at d = 8192): for checks that must not wait for them."""
    return _read_model_meta(str(canonical(path)))[0]


def _read_model_meta(path: str) -> tuple[dict, zarr.Group]:
    group = open_written_group(
        path, "model", "; give the path written by `slem-dask fit --model PATH` or model.save(PATH)"
    )
    meta = group.attrs.get(ATTR)
    if not isinstance(meta, dict) or meta.get("kind") != "model":
        raise ValueError(
            f"model: the zarr store at {path!r} was not written by slem-dask (no "
            f"'{ATTR}' model attribute; a run that stopped part-way leaves none); "
            f"fit a model with `slem-dask fit` or model.save(PATH)"
        )
    if meta.get("format_version") != MODEL_FORMAT_VERSION:
        raise ValueError(
            f"model: {path!r} has format_version {meta.get('format_version')!r}, this "
            f"slem-dask {__version__} reads {MODEL_FORMAT_VERSION}; refit the model"
        )
    if meta.get("metadata_checksum") != metadata_checksum(meta):
        raise ValueError(
            f"model: the metadata of {path!r} does not match its checksum (a field such as "
            f"n_samples, source or params was edited); the store was modified or damaged, "
            f"refit the model"
        )
    return meta, group


def _read_checked_members(
    group, path, wanted: Mapping[str, MemberCast | None], meta: dict
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The members ``wanted`` of a model group (each in the dtype of its :class:`MemberCast`,
    None: as stored), each checked as it is read: chunk by chunk against the crc32c
    recorded of it (:func:`.member_reads.read_recorded`), or, where that record does not
    pin every chunk, hashed (the SHA-256 of each such member as
    :func:`.checksums.array_digests` computes it, returned for the caller to compare)."""
    head = digest_head(meta["params"])
    recorded = _chunk_record(meta, path, group)
    arrays, digests = {}, {}
    seq = _version_seq(group)
    for key, arr in _group_members(group, path, "model", list(wanted)):
        crcs = recorded.get(key)
        if _pins_every_chunk(arr, crcs):
            try:
                arrays[key] = read_member(
                    path, "model", key, seq, read_recorded, arr, key, crcs, wanted[key]
                )
            except ChangedChunkError:
                raise _model_arrays_changed(
                    path, group, [key], "the crc32c recorded of their chunks"
                ) from None
        else:
            arrays[key], digests[key] = read_member(
                path, "model", key, seq, read_hashed, arr, key, head, wanted[key]
            )
    return arrays, digests


def _pins_every_chunk(arr, crcs) -> bool:
    """Whether ``crcs`` records a crc32c for every chunk of ``arr``, and its reads check
    each chunk against one (:func:`.chunks.trailers_checked_by_rows`)."""
    return (
        isinstance(crcs, list)
        and len(crcs) == int(np.prod(arr.cdata_shape))
        and all(isinstance(c, int) for c in crcs)
        and trailers_checked_by_rows(arr)
    )


def _chunk_record(meta: dict, path: str, group) -> dict:
    """The crc32c recorded of each chunk of each array, where the model binds that record
    to its parameters (:data:`.groups.CHUNK_CRC32C_SHA256`); {} for a model written
    before it, whose arrays are hashed instead."""
    recorded, bound = meta.get(CHUNK_CRC32C), meta.get(CHUNK_CRC32C_SHA256)
    if not isinstance(recorded, dict) or not isinstance(bound, str):
        return {}
    if chunk_record_digest(meta["params"], recorded) != bound:
        raise ValueError(
            f"model: the parameters and chunk checksums of {path!r} do not match their "
            f"recorded SHA-256 (changed after the model was written); the store was "
            f"modified or damaged: refit the model{rollback_advice(path, _version_seq(group))}"
        )
    return recorded
