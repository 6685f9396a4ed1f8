"""How an encode writes: the tasks that encode and write each partition, the partitions
a draft reuses (linked from the head or from killed jobs' drafts, never rewritten), the
client's check of every partition before the commit, and what a stopped encode left."""

from __future__ import annotations

import numpy as np
import zarr

from .. import storage
from ..core.kernels import _USES_GAMMA
from ..models import KernelSLEM, LinearSLEM
from ..core.validation import check_encoded_rows, rows_text

from ..storage.backends import LOOK_SECONDS, answer_within
from .common import JobFailed


def what_is_kept(out, head_before: int | None = None, advice: bool = True) -> str:
    """What an encode stopped before its commit left at ``out``, as the storage holds it
    now (said by an interrupt or a lost job, whenever it comes): the version readers
    see, and the partitions kept in drafts of the next version for a re-run to reuse.
    ``head_before``: the head's sequence number when the job began (None: not known);
    ``advice``: end with what to run next. A store that does not answer within
    ``LOOK_SECONDS`` is said not to (it may be the one that stopped answering)."""
    said = answer_within(lambda: _held(out, head_before, advice), LOOK_SECONDS)
    return said if said is not None else _not_known(advice)


def _not_known(advice: bool) -> str:
    """What a stopped encode left, when its store cannot say: its job committed nothing."""
    return "nothing was committed: readers still see the previous version, if any" + (
        "; run the same command again (it reuses the partitions already written)" if advice else ""
    )


def _held(out, head_before: int | None, advice: bool) -> str:
    """:func:`what_is_kept`, read from the store without a bound of its own."""
    try:
        store = storage.VersionedStore(out)
        head = store.head()
        seq = head.seq if head is not None else 0
        if head_before is not None and seq > head_before:
            return f"version {seq} of {str(out)!r} was committed"
        drafts = [
            (store.location(v), _partitions_written(store.location(v)))
            for v in store.drafts(seq + 1)
        ]
    except Exception:  # noqa: BLE001 - unreachable storage: say what is known for sure
        return _not_known(advice)
    readers = (
        f"readers still see version {seq}"
        if seq
        else f"no output exists at {str(out)!r} for readers"
    )
    written = [(where, done, total) for where, (done, total) in drafts if done]
    if not written:
        return f"nothing was committed and no partition had been written ({readers})" + (
            ": run the same command again to encode" if advice else ""
        )
    where, done, total = max(written, key=lambda w: w[1])
    return (
        f"nothing was committed ({readers}); {done} of {total} partitions are kept in "
        f"the draft {storage.shown_path(where)!r}"
        + (": run the same command again to resume" if advice else "")
    )


def _partitions_written(location: str) -> tuple[int, int]:
    """(partitions written, partitions) of the draft output at ``location``; (0, 0) for a
    draft killed before its metadata was whole."""
    try:
        arr = zarr.open(store=location, mode="r", zarr_format=3)
        return int(arr.nchunks_initialized), int(arr.nchunks)
    except Exception:  # noqa: BLE001
        return 0, 0


def _write_partitions(
    model, arr, target, todo: list[int], rows: int, out_dtype, precision: str | None = None
):
    """Lazy (len(todo), 2) array of [partition, crc32c]: each task reads, encodes and
    writes one partition (fused by dask into one task), and returns its checksum."""
    import dask.array as da

    x = storage.dask_rows(arr, rows, name="positives", exact=True)
    reason = _zero_reason(model)
    if isinstance(model, LinearSLEM) and np.dtype(out_dtype).kind == "f":
        # the encoding refuses rows without a direction in its own pass: none is
        # left for the write to look for (its check would be a pass over the output)
        z, reason = model._transform(x, out_dtype, precision or None, reason), None
    else:
        extra = {"precision": precision} if precision else {}
        z = model.transform(x, dtype=out_dtype, **extra)
    # map_blocks over every partition, then select: read, encode and write fuse into
    # one task per partition (a write layer over z.blocks[todo] would not fuse)
    written = da.map_blocks(
        _write_block,
        z,
        target,
        reason,
        dtype=np.int64,
        chunks=((1,) * z.numblocks[0], (2,)),
        meta=np.empty((0, 2), dtype=np.int64),
    )
    return written if len(todo) == z.numblocks[0] else written.blocks[todo]


def _write_block(block, target, zero_reason: str | None, block_info=None):
    # checked in the task that computed the rows, before they are written: an output
    # with an all-zero or NaN encoding row is never marked complete (zero_reason None:
    # the encoding refused such rows itself)
    if zero_reason is not None:
        check_encoded_rows(block, block_info[0]["array-location"][0][0], zero_reason)
    return storage.write_partition(block, target, block_info[0]["chunk-location"][0])


def _zero_reason(model) -> str:
    """Why ``model`` encodes a row to all zeros, and what to do about it."""
    if isinstance(model, LinearSLEM):
        return (
            "a row equal to the mean of the negatives the model was fitted on has no "
            "direction (w* = A^-1 (x0 - mu) = 0; with identical negatives, every row "
            "equal to them): drop those rows, or fit on negatives that vary"
        )
    if isinstance(model, KernelSLEM):  # z = beta / sqrt(|beta|^2 + u^2 / lam^2) -> 0
        gamma = f" or a smaller gamma (now {model.gamma_:g})" if model.kernel in _USES_GAMMA else ""
        normalize = (
            ""
            if model._normalized_pivots()
            else (", and normalize positives and negatives the same way (e.g. L2)")
        )
        return (
            f"they lie almost wholly outside the span of the model's {model.rank_} "
            f"pivots: their residual (k(x, x) - |v|^2, over lam^2) outweighs the part "
            f"the {model.kernel} factor holds (the fit's trace error was "
            f"{model.trace_error_:.4f}), so their encoding points along the residual, "
            f"which the output does not store: fit with a larger rank (--rank){gamma}"
            f"{normalize}"
        )
    return "such a row has no direction (an all-zero descriptor?): drop those rows"


def reuse_partitions(tx, target, head, inputs: list[str], n_parts: int):
    """Which partitions this job must encode, and the crc32c of each partition it can
    keep, linked (never rewritten) into the draft of its transaction ``tx`` from the head version (chunks it
    recorded, from the same input rows) or from drafts of killed or stalled jobs that
    meant to commit the same version (chunks whose bytes match their own crc32c,
    written from the same input rows and for the same encoding)."""
    crcs: list = [None] * n_parts
    mine = storage.output_meta(target)
    sources = []
    if head is not None:
        sources.append((head, True))
    for version in tx.others():
        try:  # a draft is never committed: opened as it is, never through the commits
            old = zarr.open(store=tx.store.location(version), mode="r", zarr_format=3)
        except Exception:  # noqa: BLE001 - killed before its metadata was whole
            continue
        meta = storage.output_meta(old) if hasattr(old, "chunks") else None
        if (
            meta
            and all(
                meta.get(k) == mine.get(k) for k in ("encoding_fingerprint", "precision", "source")
            )
            and old.dtype == target.dtype
            and old.chunks == target.chunks
        ):
            sources.append((old, False))
    for old, committed in sources:
        meta = storage.output_meta(old) or {}
        old_inputs = meta.get("input_partitions") or []
        old_crcs = meta.get("partition_crc32c") or [] if committed else []
        names = []
        for i in range(min(n_parts, len(old_inputs))):
            if (
                crcs[i] is not None
                or old_inputs[i] != inputs[i]
                or old.chunks != target.chunks
                or old.dtype != target.dtype
            ):
                continue
            recorded = old_crcs[i] if i < len(old_crcs) else None
            crc = (
                recorded
                if recorded is not None and storage.stored_crc32c(old, i) == recorded
                else storage.self_consistent_crc32c(old, i)
            )
            if crc is not None:
                crcs[i] = crc
                names.append(storage.chunk_key(old, (i, 0)))
        if names:
            tx.store.backend.copy_tree(_relative(tx.store, old), _relative(tx.store, target), names)
    return [i for i, crc in enumerate(crcs) if crc is None], crcs


def _relative(store, arr) -> str:
    """The folder of ``arr`` (a version of ``store``) relative to the store's root."""
    # without the scheme: fsspec names a store by its file system's first protocol
    # (adlfs: abfs://), which need not be the one the store's URL has (az://)
    location = storage._where(arr).split("://", 1)[-1]
    root = store.path.location.split("://", 1)[-1].rstrip("/")
    if not location.startswith(root + "/"):
        raise ValueError(f"{location!r} is not inside the store {root!r}")
    return location[len(root) :].strip("/")


def _verify_partitions(target, out, crcs: list) -> None:
    """Every partition present, as this client reads the store, with the crc32c its
    task's worker read back after writing it."""
    bad = [
        i for i, crc in enumerate(crcs) if crc is None or storage.stored_crc32c(target, i) != crc
    ]
    if bad:
        shown = rows_text(bad, len(bad))
        raise JobFailed(
            f"output {str(out)!r}: {len(bad)} partition(s) ({shown}) are missing or differ "
            f"from what the workers wrote, as this client reads the store: the workers do "
            f"not write to the storage this client sees; nothing was marked complete. Make "
            f"every worker mount the same storage at the same path, then run again"
        )
