"""The encode job: positives encoded in parallel partitions into a draft version of the
output, every partition checked, then committed (resuming what a killed run left)."""

from __future__ import annotations

import time
import warnings

import numpy as np
import zarr

from .. import storage
from ..cluster import workers
from ..storage import gc, versions
from ..storage.paths import shown_path
from .._version import __version__
from ..core.kernels import _USES_GAMMA
from ..storage import canonical
from ..models import KernelSLEM, LinearSLEM, load_model
from ..parallel.blocks import scatter_large_arrays
from ..core.validation import check_encoded_rows, check_n_features, output_dtype, rows_text

from . import common
from .common import JobFailed, JobReport, _LOST, _detail, _lost_cluster


def encode_job(client, model_path: str, positives: str, out: str, dtype: str | None = None,
               partition_rows: int | None = None, overwrite: bool = False,
               progress: bool = False, on_model_change: str = "fail",
               precision: str | None = None, model=None) -> JobReport:
    """Encode the zarr array ``positives`` with the model at ``model_path`` into ``out``.

    ``model``: that model, if the caller has already loaded it (it is then not read
    again: one committed version of it, read once).

    Re-running the same command resumes: an output left unfinished by a killed
    run gets only its missing partitions; partitions whose input rows changed
    (by the store listing) or whose chunk is missing or damaged are encoded
    again; rows appended to ``positives`` get encoded. An output written with
    another model is refused (``on_model_change="fail"``, the CLI default)
    unless ``overwrite``; with ``on_model_change="reencode"`` (job specs) it is
    rebuilt. ``complete: true`` is written only after the client has checked
    that every partition is in the store with the checksum its task wrote.
    ``precision`` (linear models; default: the model's): "auto" encodes float32
    positives in float32, "float64" in float64; an output is continued only in the
    precision it was started with.
    """
    if on_model_change not in ("fail", "reencode"):
        raise ValueError(f"on_model_change must be 'fail' or 'reencode', got {on_model_change!r}")
    t0 = time.perf_counter()
    model_path, positives, out = canonical(model_path), canonical(positives), canonical(out)
    model = model if model is not None else load_model(model_path)
    storage.check_distinct(out, "--out", {"positives": positives, "model": model_path})
    current = None if overwrite else _up_to_date(
        model, model_path, positives, out, dtype, partition_rows, on_model_change, precision)
    if current is not None:  # decided from the committed head: no lease, nothing written
        current.timings["total"] = time.perf_counter() - t0
        return current
    head_before = storage.head_seq(out)  # a full disk before the draft is known says it
    with common.full_disk_said(out, lambda: _output_bytes(model, positives),
                               lambda: what_is_kept(out, head_before, advice=False)), \
            storage.Lease(out, "slem-dask encode") as lease:
        arr, out_dtype, width = check_encode_inputs(model, model_path, positives, out, dtype,
                                                    overwrite, on_model_change, leased=True,
                                                    partition_rows=partition_rows,
                                                    precision=precision)
        precision = _effective_precision(model, precision)
        # the model's identity (its inputs and parameters, docs/numerics.md); outputs
        # written before it record the arrays' fingerprints, which still count
        fingerprint = model.identity_
        encoding = model.encoding_identity_  # what decides whether an output can be kept
        n_rows = int(arr.shape[0])
        existing = storage.open_existing_output(out, strict=not overwrite)
        head, action = _plan_output(out, existing, arr, positives,
                                    (encoding, model.encoding_fingerprint_), out_dtype,
                                    overwrite, on_model_change, width, precision)
        if head is None and partition_rows is None and existing is not None:
            partition_rows = int(existing.chunks[0])  # a rebuild keeps the chunking
        rows = int(head.chunks[0]) if head is not None else \
            storage.row_partition(arr, partition_rows)
        n_parts = -(-n_rows // rows)
        per_row, fixed = workers.encode_task_bytes(model, rows, arr.shape[1], arr.dtype)
        plan = workers.Plan("encode", "positives", rows, int(arr.shape[1]), str(arr.dtype),
                            int(fixed + per_row * rows), per_row, fixed,
                            storage.unit_rows(arr), resumed=head is not None)
        inputs = storage.partition_fingerprints(arr, positives, "positives", rows)
        if head is None:  # a new output: before anything is written
            workers.check_memory(client, plan, n_parts, common.TASK_MODULES)
        storage.replace_legacy(out, "output")  # only reached with --overwrite
        store = versions.VersionedStore(out)
        draft = store.begin()  # this job's own version folder, invisible until committed
        target = storage.create_output(draft.location, (n_rows, width), rows, out_dtype, {
            "model": type(model).__name__, "model_fingerprint": fingerprint,
            "encoding_fingerprint": encoding, "model_path": model_path.url,
            "params": storage.json_params(model.get_params()),
            "source": positives.url, "source_version": storage.read_version(arr, positives),
            "n_rows": n_rows, "input_partitions": inputs, "precision": precision,
            "partition_crc32c": [None] * n_parts})
        todo, crcs = reuse_partitions(store, draft, target, head, inputs, n_parts)
        if head is None and len(todo) < n_parts:
            action = "resume"  # partitions of an interrupted run's draft were reused
        t1 = time.perf_counter()
        report = JobReport("encode")
        scale = _scale_mismatch(model, arr) if n_rows else (
            f"positives {str(positives)!r} have no rows (shape {arr.shape}): the output is "
            f"an empty ({0}, {width}) array; write rows there and run again to encode them")
        if scale:
            report.facts["warning"] = scale
            warnings.warn(scale, stacklevel=2)
        if todo:
            common.hint_small_chunks(report, arr, "positives", positives)
        report.facts.update({
            "positives": str(positives), "rows": n_rows, "features": arr.shape[1],
            "partitions": f"{len(todo)} encoded of {n_parts}", "action": action,
            "model": str(model_path), "fingerprint": fingerprint[:16], "out": str(out),
            "out dtype": out_dtype.name,
        })
        meta = storage.output_meta(head) if head is not None else {}
        # the head's partitions are those of these rows: else the changed ones were all
        # found in an interrupted run's draft, and must still be committed
        same_rows = meta.get("input_partitions") == inputs
        if head is not None and not todo and same_rows and meta.get("n_rows") == n_rows \
                and meta.get("model_fingerprint") in (fingerprint, model.fingerprint_):
            store.abandon(draft)  # nothing to write: the head stays as it is
            report.facts["action"] = "up to date"
            report.timings["total"] = time.perf_counter() - t0
            return report
        if head is not None and not todo:
            # a model that encodes identically (theta changed): a new version records it
            report.facts["action"] = "resume" if not same_rows else \
                "up to date (model metadata updated)" if meta.get("n_rows") == n_rows \
                else "verified"
        if head is not None and todo:  # only what this update computes must fit
            try:
                workers.check_memory(client, plan, len(todo), common.TASK_MODULES)
            except workers.WorkerMemoryError:
                store.abandon(draft)
                raise
        try:
            storage.check_workers_see(client, {"positives": positives,
                                                 "output": draft.location})
            # this job writes and commits: the oldest kept version goes while it writes
            with store.making_room(mine=draft.version):
                if todo:
                    with scatter_large_arrays(client):  # the model: once to the workers
                        written = common._compute(
                            client, _write_partitions(model, arr, target, todo, rows,
                                                      out_dtype, precision), progress)
                    for index, crc in np.asarray(written).reshape(-1, 2).tolist():
                        crcs[int(index)] = int(crc)
            t2 = time.perf_counter()
            lease.check()  # first: a job that lost its lease must not blame the storage
            try:
                _verify_partitions(target, out, crcs)
            except JobFailed:
                if gc.was_fenced(store, draft.version):  # its draft deleted by another job
                    raise gc.DraftFencedError(gc.fenced_message(store, draft.version)) \
                        from None
                raise
            if storage.partition_fingerprints(arr, positives, "positives", rows) != inputs:
                raise JobFailed(
                    f"the positives {str(positives)!r} changed while they were encoded; "
                    f"nothing was committed: run the same command again (it resumes)")
            report.timings.update({"open": t1 - t0, "encode+write": t2 - t1,
                                   "total": time.perf_counter() - t0})
            runs = (meta.get("runs") or [])[-19:] + [{
                "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "action": report.facts["action"], "rows": n_rows,
                "partitions_encoded": len(todo), "model_fingerprint": fingerprint,
                "package_version": __version__, "timings": report.timings}]
            storage.remove_stray_partials(draft.location)  # left by writers killed mid-chunk
            storage.mark_complete(target, {"n_rows": n_rows, "model_fingerprint": fingerprint,
                                           "model_path": model_path.url,
                                           "params": storage.json_params(model.get_params()),
                                           "partition_crc32c": crcs, "timings": report.timings,
                                           "runs": runs})
            commit = store.commit(draft, "encoding", "slem-dask encode",
                                  {"rows": n_rows, "model_fingerprint": fingerprint[:16]})
            report.facts["version"] = commit.seq
        except KeyboardInterrupt:
            raise  # the draft stays: a re-run reuses its finished partitions
        except versions.CommitConflictError:
            store.abandon(draft)
            raise
        except gc.DraftFencedError:  # its draft is another job's to delete: left alone
            record = store.commit_at(draft.seq)
            if record is not None and record.version != draft.version:
                # the job that fenced it committed: the draft is dead by its number, and
                # only this job can tell a chunk that its tasks wrote after the draft's
                # marker went (no collection deletes a folder without it): delete it
                store.abandon(draft)
                store._raise_conflict(draft.seq)
            raise gc.DraftFencedError(gc.fenced_message(store, draft.version)) from None
        except storage.DamagedStoreError:
            raise
        except ValueError as exc:  # e.g. NaN rows found by a worker: say where
            store.abandon(draft)  # once no task writes any more
            raise ValueError(f"positives {str(positives)!r}: {_detail(exc)}") from None
        except _LOST as exc:
            raise _lost_cluster(exc, what_is_kept(out, draft.seq - 1)) from None
        except OSError as exc:
            if storage.is_out_of_space(exc):  # what is still to write, and what is kept
                needed = len(todo) * rows * width * out_dtype.itemsize
                raise JobFailed(common.out_of_space_line(
                    exc, out, needed, what_is_kept(out, draft.seq - 1, advice=False))) from None
            raise
    return report


def _up_to_date(model, model_path, positives, out, dtype, partition_rows, on_model_change,
                precision) -> JobReport | None:
    """The report of a re-run with nothing to write, or None: decided by reading one
    committed head (its metadata, the positives' listing and each chunk's crc32c
    trailer), before any lease is taken or draft begun, so that an up-to-date re-run
    writes nothing, on any storage. Anything else (and every refusal) is left to the
    job, which decides again under the lease."""
    existing = storage.open_existing_output(out, strict=False)
    meta = storage.output_meta(existing) if existing is not None else None
    # the model's identity, or (outputs written before it) its arrays' fingerprint
    if not meta or not meta.get("complete") \
            or meta.get("model_fingerprint") not in (model.identity_, model.fingerprint_):
        return None
    arr = storage.open_input(positives, "positives", empty_ok=True)  # 0 rows: empty output
    rows, n_rows = int(existing.chunks[0]), int(arr.shape[0])
    width = int(getattr(model, "rank_", arr.shape[1]))
    out_dtype = np.dtype(dtype) if dtype is not None else existing.dtype
    if arr.shape[1] != model.n_features_in_ or meta.get("n_rows") != n_rows \
            or (partition_rows is not None
                and storage.row_partition(arr, partition_rows) != rows):
        return None
    try:
        head, action = _plan_output(out, existing, arr, positives,
                                    (model.encoding_identity_, model.encoding_fingerprint_),
                                    out_dtype, False, on_model_change, width,
                                    _effective_precision(model, precision))
    except FileExistsError:
        return None  # the job says why, under its lease
    n_parts = -(-n_rows // rows)
    if head is None or action != "update" or not _head_current(
            head, storage.partition_fingerprints(arr, positives, "positives", rows),
            n_parts):
        return None
    report = JobReport("encode")
    scale = _scale_mismatch(model, arr)
    if scale:
        report.facts["warning"] = scale
        warnings.warn(scale, stacklevel=3)
    report.facts.update({
        "positives": str(positives), "rows": n_rows, "features": arr.shape[1],
        "partitions": f"0 encoded of {n_parts}", "action": "up to date",
        "model": str(model_path), "fingerprint": model.identity_[:16], "out": str(out),
        "out dtype": existing.dtype.name})
    return report


def _head_current(head, inputs: list[str], n_parts: int) -> bool:
    """Whether the committed output ``head`` holds every partition of these input rows
    (``inputs``: their fingerprints), each chunk with the crc32c recorded at its commit."""
    meta = storage.output_meta(head) or {}
    crcs = meta.get("partition_crc32c") or []
    return (bool(meta.get("complete")) and int(head.shape[0]) == meta.get("n_rows")
            and len(crcs) == n_parts and (meta.get("input_partitions") or []) == inputs
            and all(crc is not None and storage.stored_crc32c(head, i) == crc
                    for i, crc in enumerate(crcs)))


def _output_bytes(model, positives) -> int:
    """About the bytes of an encoding of ``positives`` (float32, before the dtype is
    known)."""
    arr = storage.open_input(positives, "positives", empty_ok=True)
    return 4 * int(arr.shape[0]) * int(getattr(model, "rank_", arr.shape[1]))


def what_is_kept(out, head_before: int | None = None, advice: bool = True) -> str:
    """What an encode stopped before its commit left at ``out``, as the storage holds it
    now (said by an interrupt or a lost job, whenever it comes): the version readers
    see, and the partitions kept in drafts of the next version for a re-run to reuse.
    ``head_before``: the head's sequence number when the job began (None: not known);
    ``advice``: end with what to run next."""
    try:
        store = versions.VersionedStore(out)
        head = store.head()
        seq = head.seq if head is not None else 0
        if head_before is not None and seq > head_before:
            return f"version {seq} of {str(out)!r} was committed"
        drafts = [(store.location(v), _partitions_written(store.location(v)))
                  for v in store.drafts(seq + 1)]
    except Exception:  # noqa: BLE001 - unreachable storage: say what is known for sure
        return "nothing was committed: readers still see the previous version, if any" + (
            "; run the same command again (it reuses the partitions already written)"
            if advice else "")
    readers = f"readers still see version {seq}" if seq else \
        f"no output exists at {str(out)!r} for readers"
    written = [(where, done, total) for where, (done, total) in drafts if done]
    if not written:
        return (f"nothing was committed and no partition had been written ({readers})"
                + (": run the same command again to encode" if advice else ""))
    where, done, total = max(written, key=lambda w: w[1])
    return (f"nothing was committed ({readers}); {done} of {total} partitions are kept in "
            f"the draft {shown_path(where)!r}"
            + (": run the same command again to resume" if advice else ""))


def _partitions_written(location: str) -> tuple[int, int]:
    """(partitions written, partitions) of the draft output at ``location``; (0, 0) for a
    draft killed before its metadata was whole."""
    try:
        arr = zarr.open(store=location, mode="r", zarr_format=3)
        return int(arr.nchunks_initialized), int(arr.nchunks)
    except Exception:  # noqa: BLE001
        return 0, 0


def _scale_mismatch(model, arr, sample_rows: int = 1000) -> str | None:
    """A warning when the positives' row norms differ from the negatives' by more than
    10x: a kernel model (rbf in particular) then maps them all to nearly one vector."""
    pivots = getattr(model, "pivot_rows_", None)
    if pivots is None or not len(pivots):
        return None
    sample = np.asarray(arr[:min(sample_rows, arr.shape[0])], dtype=np.float64)
    theirs = float(np.median(np.linalg.norm(sample, axis=1)))
    ours = float(np.median(np.linalg.norm(pivots, axis=1)))
    if ours > 0 and theirs > 0 and not 0.1 <= theirs / ours <= 10:
        return (f"the positives' rows have median norm {theirs:.3g}, the model's negatives "
                f"{ours:.3g}: normalize both the same way (e.g. L2), or the kernel encodings "
                f"collapse to nearly identical rows")
    return None


def _effective_precision(model, precision: str | None) -> str | None:
    """The arithmetic an encode uses: the given one, else the model's (linear models)."""
    if not isinstance(model, LinearSLEM):
        return None
    return precision or model.precision


def check_encode_inputs(model, model_path, positives, out, dtype=None, overwrite=False,
                        on_model_change="fail", leased: bool = False,
                        partition_rows: int | None = None, precision: str | None = None):
    """Every check of an encode that needs no data: (positives array, output dtype,
    output width). Run by the command line before a cluster starts, and by the job
    (``leased``: it holds the output's lease)."""
    model_path, positives, out = canonical(model_path), canonical(positives), canonical(out)
    storage.check_distinct(out, "--out", {"positives": positives, "model": model_path})
    arr = storage.open_input(positives, "positives", empty_ok=True)  # 0 rows: an empty output
    check_n_features(arr, model.n_features_in_, f"positives ({str(positives)!r})",
                     fitted_on=f"the model {str(model_path)!r}")
    existing = storage.open_existing_output(out, strict=not overwrite)
    kept = existing if existing is not None and not overwrite \
        and storage.output_meta(existing) is not None else None
    if dtype is None and kept is not None:
        dtype = existing.dtype  # a re-run continues the output as it was written
    out_dtype = np.dtype(dtype) if dtype is not None else output_dtype(arr.dtype)
    if not np.issubdtype(out_dtype, np.floating):
        raise ValueError(f"dtype must be a float dtype (float32 or float64), got {dtype!r}")
    if partition_rows is not None and kept is not None \
            and storage.row_partition(arr, partition_rows) != int(kept.chunks[0]):
        raise ValueError(
            f"--partition-rows {partition_rows}: the output {str(out)!r} is written in "
            f"partitions of {kept.chunks[0]} rows (one chunk each), and a re-run continues "
            f"it that way; omit --partition-rows, or pass --overwrite to rebuild it")
    width = int(getattr(model, "rank_", arr.shape[1]))  # a KernelSLEM writes r columns
    if not leased:
        storage.Lease(out, "slem-dask encode").check_free()
    _plan_output(out, existing, arr, positives,
                 (model.encoding_identity_, model.encoding_fingerprint_), out_dtype,
                 overwrite, on_model_change, width, _effective_precision(model, precision))
    return arr, out_dtype, width


def _write_partitions(model, arr, target, todo: list[int], rows: int, out_dtype,
                      precision: str | None = None):
    """Lazy (len(todo), 2) array of [partition, crc32c]: each task reads, encodes and
    writes one partition (fused by dask into one task), and returns its checksum."""
    import dask.array as da

    extra = {"precision": precision} if precision else {}
    z = model.transform(storage.dask_rows(arr, rows, name="positives", exact=True),
                        dtype=out_dtype, **extra)
    # map_blocks over every partition, then select: read, encode and write fuse into
    # one task per partition (a write layer over z.blocks[todo] would not fuse)
    written = da.map_blocks(_write_block, z, target, _zero_reason(model), dtype=np.int64,
                            chunks=((1,) * z.numblocks[0], (2,)),
                            meta=np.empty((0, 2), dtype=np.int64))
    return written if len(todo) == z.numblocks[0] else written.blocks[todo]


def _write_block(block, target, zero_reason: str, block_info=None):
    # checked in the task that computed the rows, before they are written: an output
    # with an all-zero or NaN encoding row is never marked complete
    check_encoded_rows(block, block_info[0]["array-location"][0][0], zero_reason)
    return storage.write_partition(block, target, block_info[0]["chunk-location"][0])


def _zero_reason(model) -> str:
    """Why ``model`` encodes a row to all zeros, and what to do about it."""
    if isinstance(model, LinearSLEM):
        return ("a row equal to the mean of the negatives the model was fitted on has no "
                "direction (w* = A^-1 (x0 - mu) = 0; with identical negatives, every row "
                "equal to them): drop those rows, or fit on negatives that vary")
    if isinstance(model, KernelSLEM):  # z = beta / sqrt(|beta|^2 + u^2 / lam^2) -> 0
        gamma = f" or a smaller gamma (now {model.gamma:g})" if model.kernel in _USES_GAMMA \
            else ""
        normalize = "" if model._normalized_pivots() else (
            ", and normalize positives and negatives the same way (e.g. L2)")
        return (f"they lie almost wholly outside the span of the model's {model.rank_} "
                f"pivots: their residual (k(x, x) - |v|^2, over lam^2) outweighs the part "
                f"the {model.kernel} factor holds (the fit's trace error was "
                f"{model.trace_error_:.4f}), so their encoding points along the residual, "
                f"which the output does not store: fit with a larger rank (--rank){gamma}"
                f"{normalize}")
    return "such a row has no direction (an all-zero descriptor?): drop those rows"


def reuse_partitions(store, draft, target, head, inputs: list[str], n_parts: int):
    """Which partitions this job must encode, and the crc32c of each partition it can
    keep, linked (never rewritten) into its draft from the head version (chunks it
    recorded, from the same input rows) or from drafts of killed or stalled jobs that
    meant to commit the same version (chunks whose bytes match their own crc32c,
    written from the same input rows and for the same encoding)."""
    crcs: list = [None] * n_parts
    mine = storage.output_meta(target)
    sources = []
    if head is not None:
        sources.append((head, True))
    for version in store.drafts(draft.seq):
        if version == draft.version:
            continue
        try:  # a draft is never committed: opened as it is, never through the commits
            old = zarr.open(store=store.location(version), mode="r", zarr_format=3)
        except Exception:  # noqa: BLE001 - killed before its metadata was whole
            continue
        meta = storage.output_meta(old) if hasattr(old, "chunks") else None
        if meta and all(meta.get(k) == mine.get(k) for k in
                        ("encoding_fingerprint", "precision", "source")) \
                and old.dtype == target.dtype and old.chunks == target.chunks:
            sources.append((old, False))
    for old, committed in sources:
        meta = storage.output_meta(old) or {}
        old_inputs = meta.get("input_partitions") or []
        old_crcs = meta.get("partition_crc32c") or [] if committed else []
        names = []
        for i in range(min(n_parts, len(old_inputs))):
            if crcs[i] is not None or old_inputs[i] != inputs[i] \
                    or old.chunks != target.chunks or old.dtype != target.dtype:
                continue
            recorded = old_crcs[i] if i < len(old_crcs) else None
            crc = recorded if recorded is not None and \
                storage.stored_crc32c(old, i) == recorded else \
                storage.self_consistent_crc32c(old, i)
            if crc is not None:
                crcs[i] = crc
                names.append(storage.checksums._full_key(old, (i, 0)))
        if names:
            store.backend.copy_tree(_relative(store, old), _relative(store, target), names)
    return [i for i, crc in enumerate(crcs) if crc is None], crcs


def _relative(store, arr) -> str:
    """The folder of ``arr`` (a version of ``store``) relative to the store's root."""
    # without the scheme: fsspec names a store by its file system's first protocol
    # (adlfs: abfs://), which need not be the one the store's URL has (az://)
    location = storage._where(arr).split("://", 1)[-1]
    root = store.path.location.split("://", 1)[-1].rstrip("/")
    if not location.startswith(root + "/"):
        raise ValueError(f"{location!r} is not inside the store {root!r}")
    return location[len(root):].strip("/")


def _verify_partitions(target, out, crcs: list) -> None:
    """Every partition present, as this client reads the store, with the crc32c its
    task's worker read back after writing it."""
    bad = [i for i, crc in enumerate(crcs)
           if crc is None or storage.stored_crc32c(target, i) != crc]
    if bad:
        shown = rows_text(bad, len(bad))
        raise JobFailed(
            f"output {str(out)!r}: {len(bad)} partition(s) ({shown}) are missing or differ "
            f"from what the workers wrote, as this client reads the store: the workers do "
            f"not write to the storage this client sees; nothing was marked complete. Make "
            f"every worker mount the same storage at the same path, then run again")


def _runs(indices):
    """Sorted indices as (first, last) runs of consecutive values: [0,1,2,5,6] -> (0,2),(5,6)."""
    runs = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return [tuple(r) for r in runs]


def _plan_output(out, existing, arr, positives, encoding, out_dtype, overwrite,
                 on_model_change, width, precision=None):
    """Decide what to do with what is at ``out``: (existing output to update, or None
    to create a new one; action). Refuses to replace anything slem-dask did not write."""
    if existing is None:
        if not storage._exists(out):
            return None, "create"
        if not overwrite:
            raise FileExistsError(
                f"output {str(out)!r} already exists and is not a zarr array; choose "
                f"another path")
        storage.check_may_replace(out, "output", kind="encoding")
        return None, "replace"
    if storage.is_legacy(out) and not overwrite:
        raise FileExistsError(
            f"output {str(out)!r} was written in place by an earlier slem-dask (no "
            f"versions); pass --overwrite to encode it again as a versioned store")
    meta = storage.output_meta(existing)
    if meta is None:
        raise FileExistsError(
            f"output {str(out)!r} already exists and was not written by slem-dask; "
            f"slem-dask never replaces what it did not write, even with --overwrite: "
            f"choose another path")
    if overwrite:
        return None, "replace"  # a new version; the old one stays in the history
    encoding, *earlier = encoding  # (identity, the arrays' fingerprint)
    if meta.get("encoding_fingerprint") not in (encoding, *earlier):
        if on_model_change == "reencode":
            return None, "re-encode (model changed)"
        raise FileExistsError(
            f"output {str(out)!r} was encoded with another model (encoding fingerprint "
            f"{str(meta.get('encoding_fingerprint'))[:16]}, now {encoding[:16]}); pass "
            f"--overwrite to re-encode it with the current model")
    problems = []
    if meta.get("source") != positives.url:
        problems.append(f"it encodes {shown_path(meta.get('source'))!r}, not "
                        f"{str(positives)!r}")
    if existing.shape[1] != width or existing.dtype != out_dtype:
        problems.append(f"it holds {existing.shape[1]} columns of {existing.dtype}, this run "
                        f"writes {width} of {out_dtype}")
    if arr.shape[0] < existing.shape[0] and meta.get("source") == positives.url:
        problems.append(f"the positives shrank from {existing.shape[0]} to {arr.shape[0]} rows")
    if meta.get("precision") != precision:
        problems.append(f"it was encoded with precision {meta.get('precision')!r}, this run "
                        f"uses {precision!r} (give --precision {meta.get('precision')})")
    if problems:
        raise FileExistsError(
            f"output {str(out)!r} cannot be resumed: {'; '.join(problems)}; pass --overwrite "
            f"to rebuild it")
    if arr.shape[0] > existing.shape[0]:
        return existing, "append"
    return existing, "resume" if not meta.get("complete") else "update"
