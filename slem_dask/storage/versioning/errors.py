"""The errors by which storage keeps a guarantee; each message says what is kept and
what to do."""

from __future__ import annotations

import errno


class IntegrityError(RuntimeError):
    """A job stopped to keep a guarantee (its message says what is kept and what to do)."""


class DamagedStoreError(ValueError):
    """A store's chunk is missing, corrupt or truncated (the message names it)."""


class MissingChunkError(DamagedStoreError):
    """An input chunk is absent: zarr would read it as fill values."""


class CorruptChunkError(DamagedStoreError):
    """A chunk fails its checksum or cannot be decoded."""


class ChangedChunkError(CorruptChunkError):
    """A chunk reads, and its bytes match its own crc32c, but that crc32c is not the one
    its commit recorded: another chunk than the one written (swapped in, or rewritten)."""


class DamagedMetadataError(DamagedStoreError):
    """A node's metadata document (zarr.json) is there but zarr cannot read it."""


def rollback_advice(path, seq: int | None = None) -> str:
    """How to get back a version that reads, beside writing the store again: roll back,
    where an earlier version may still be kept. Said without reading the store (the
    message is raised while it fails): version 1 has no earlier one, and of a later
    version's earlier ones, `slem-dask versions` says which are kept."""
    if seq == 1:
        return ""
    return (
        f", or roll back to an earlier version if one is kept (`slem-dask versions {path}` "
        f"lists them; `slem-dask rollback {path} --to N`)"
    )


def lost_lease_advice(target) -> str:
    """What a job that lost its lease before its commit is told to do: a job that took
    the lease over may have committed since (and released the lease, so it cannot always
    be named): look first, then run again."""
    return (
        f"nothing was committed: `slem-dask versions {target}` shows whether another job "
        f"committed meanwhile; if not, run the same command again (once the store answers, "
        f"if it did not)"
    )


def is_out_of_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def missing_chunk_error(name: str, path, key: str, lo: int, hi: int) -> MissingChunkError:
    return MissingChunkError(
        f"{name} {str(path)!r}: chunk {key!r} (rows {lo}-{hi - 1}) is missing from the "
        f"store; zarr would read it as fill values (zeros), so slem-dask refuses it. If the "
        f"store is on storage that this machine or a worker does not mount, mount it "
        f"there; if the chunk was lost, restore or rewrite those rows; if those rows are all "
        f"zeros on purpose, zarr skipped the chunk (its default write_empty_chunks=False): "
        f"rewrite the array with zarr.create_array(..., config={{'write_empty_chunks': True}})"
    )


class StorageViewError(IntegrityError):
    """A worker reads a store differently from the client (or not at all)."""
