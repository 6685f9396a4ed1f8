"""What an encode will write, decided before anything is written: the checks of its
inputs, what to do with what is at the output (create, resume, append, update, refuse),
and the frozen :class:`EncodePlan` the job then executes. Nothing here writes."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import storage
from ..cluster import workers
from ..models import LinearSLEM, load_model
from ..core.validation import check_n_features, output_dtype

from .common import JobReport
from .options import EncodeOptions


@dataclass(frozen=True, eq=False)
class EncodePlan:
    """An encode's plan: computed under the output's lease by :func:`plan_encode` (which
    reads metadata and listings only, no rows, and writes nothing), then executed by the job."""

    arr: Any  # the positives (a zarr array)
    out_dtype: np.dtype
    width: int  # columns of the output (a KernelSLEM writes its rank)
    precision: str | None  # the arithmetic of a linear model's encode
    head: Any  # the committed output this job continues, or None
    action: str  # create, replace, resume, append, update, re-encode ...
    rows: int  # rows per partition (one output chunk each)
    n_rows: int
    n_parts: int
    inputs: list  # the fingerprint of each partition's input rows
    memory: workers.Plan  # what one task needs, for the workers' memory check

    @property
    def meta(self) -> dict:
        """The committed head's metadata ({} for a new output)."""
        return storage.output_meta(self.head) if self.head is not None else {}


def plan_encode(model, model_path, positives, out, options: EncodeOptions) -> EncodePlan:
    """The plan of an encode of ``positives`` with ``model`` into ``out`` (paths
    canonical), as the storage holds them now; refusals raise as :func:`_plan_output`
    and :func:`check_encode_inputs` say."""
    arr, out_dtype, width = check_encode_inputs(
        model,
        model_path,
        positives,
        out,
        options.dtype,
        options.overwrite,
        options.on_model_change,
        leased=True,
        partition_rows=options.partition_rows,
        precision=options.precision,
    )
    precision = _effective_precision(model, options.precision)
    existing = storage.open_existing_output(out, strict=not options.overwrite)
    head, action = _plan_output(
        out,
        existing,
        arr,
        positives,
        model,
        out_dtype,
        options.overwrite,
        options.on_model_change,
        width,
        precision,
    )
    partition_rows = options.partition_rows
    if head is None and partition_rows is None and existing is not None:
        partition_rows = int(existing.chunks[0])  # a rebuild keeps the chunking
    rows = (
        int(head.chunks[0])
        if head is not None
        else storage.row_partition(arr, partition_rows, at_least_width=False)
    )
    n_rows = int(arr.shape[0])
    memory = _task_memory(model, arr, rows, resumed=head is not None)
    return EncodePlan(
        arr,
        out_dtype,
        width,
        precision,
        head,
        action,
        rows,
        n_rows,
        -(-n_rows // rows),
        storage.partition_fingerprints(arr, positives, "positives", rows),
        memory,
    )


def _task_memory(model, arr, rows: int, resumed: bool) -> workers.Plan:
    """What one encode task of ``rows`` positives needs, for the workers' memory check."""
    per_row, fixed = workers.encode_task_bytes(model, rows, arr.shape[1], arr.dtype)
    return workers.Plan(
        "encode",
        "positives",
        rows,
        int(arr.shape[1]),
        str(arr.dtype),
        int(fixed + per_row * rows),
        per_row,
        fixed,
        storage.unit_rows(arr),
        resumed=resumed,
    )


def up_to_date_report(
    model, model_path, positives, out, options: EncodeOptions
) -> JobReport | None:
    """The report of a re-run with nothing to write, or None: decided by reading one
    committed head (its metadata, the positives' listing and each chunk's crc32c
    trailer), before any lease is taken or draft begun, so that an up-to-date re-run
    writes nothing, on any storage. Anything else (and every refusal) is left to the
    job, which decides again under the lease."""
    existing = storage.open_existing_output(out, strict=False)
    meta = storage.output_meta(existing) if existing is not None else None
    # the model's identity, or (outputs written before it) its arrays' fingerprint
    if (
        not meta
        or not meta.get("complete")
        or not recorded_model_is(model, meta.get("model_fingerprint"))
    ):
        return None
    arr = storage.open_input(positives, "positives", empty_ok=True)  # 0 rows: empty output
    rows, n_rows = int(existing.chunks[0]), int(arr.shape[0])
    width = int(getattr(model, "rank_", arr.shape[1]))
    out_dtype = np.dtype(options.dtype) if options.dtype is not None else existing.dtype
    if (
        arr.shape[1] != model.n_features_in_
        or meta.get("n_rows") != n_rows
        or (
            options.partition_rows is not None
            and storage.row_partition(arr, options.partition_rows) != rows
        )
    ):
        return None
    try:
        head, action = _plan_output(
            out,
            existing,
            arr,
            positives,
            model,
            out_dtype,
            False,
            options.on_model_change,
            width,
            _effective_precision(model, options.precision),
        )
    except FileExistsError:
        return None  # the job says why, under its lease
    n_parts = -(-n_rows // rows)
    if (
        head is None
        or action != "update"
        or not _head_current(
            head, storage.partition_fingerprints(arr, positives, "positives", rows), n_parts
        )
    ):
        return None
    return _up_to_date_facts(model, model_path, positives, out, arr, existing, n_parts)


def _up_to_date_facts(model, model_path, positives, out, arr, existing, n_parts) -> JobReport:
    """The report of an output found up to date (with the positives' scale warning)."""
    report = JobReport("encode")
    scale = _scale_mismatch(model, arr)
    if scale:
        report.facts["warning"] = scale
        # the caller of encode_job (via _current_report and up_to_date_report)
        warnings.warn(scale, stacklevel=5)
    report.facts.update(
        {
            "positives": str(positives),
            "rows": int(arr.shape[0]),
            "features": arr.shape[1],
            "partitions": f"0 encoded of {n_parts}",
            "action": "up to date",
            "model": str(model_path),
            "model identity": model.identity_[:16],  # as encode_job's report says it
            "out": str(out),
            "out dtype": existing.dtype.name,
        }
    )
    return report


def _head_current(head, inputs: list[str], n_parts: int) -> bool:
    """Whether the committed output ``head`` holds every partition of these input rows
    (``inputs``: their fingerprints), each chunk with the crc32c recorded at its commit."""
    meta = storage.output_meta(head) or {}
    crcs = meta.get("partition_crc32c") or []
    return (
        bool(meta.get("complete"))
        and int(head.shape[0]) == meta.get("n_rows")
        and len(crcs) == n_parts
        and (meta.get("input_partitions") or []) == inputs
        and all(
            crc is not None and storage.stored_crc32c(head, i) == crc for i, crc in enumerate(crcs)
        )
    )


def _output_bytes(model, positives) -> int:
    """About the bytes of an encoding of ``positives`` (float32, before the dtype is
    known)."""
    arr = storage.open_input(positives, "positives", empty_ok=True)
    return 4 * int(arr.shape[0]) * int(getattr(model, "rank_", arr.shape[1]))


def _scale_mismatch(model, arr, sample_rows: int = 1000) -> str | None:
    """A warning when the positives' row norms differ from the negatives' by more than
    10x: a kernel model (rbf in particular) then maps them all to nearly one vector."""
    pivots = getattr(model, "pivot_rows_", None)
    if pivots is None or not len(pivots):
        return None
    sample = np.asarray(arr[: min(sample_rows, arr.shape[0])], dtype=np.float64)
    theirs = float(np.median(np.linalg.norm(sample, axis=1)))
    ours = float(np.median(np.linalg.norm(pivots, axis=1)))
    if ours > 0 and theirs > 0 and not 0.1 <= theirs / ours <= 10:
        return (
            f"the positives' rows have median norm {theirs:.3g}, the model's negatives "
            f"{ours:.3g}: normalize both the same way (e.g. L2), or the kernel encodings "
            f"collapse to nearly identical rows"
        )
    return None


def load_encoding_model(model_path, positives, precision: str | None = None):
    """The model at ``model_path``, read for an encode of ``positives``: only the arrays
    that ``transform`` uses, and a LinearSLEM's A^-1 straight into float32 when it will
    encode them in float32 (``load_model``'s ``encode_dtype``). Positives that cannot be
    opened are named by the encode's own checks, after the model's."""
    try:
        encode_dtype = storage.open_input(positives, "positives", empty_ok=True).dtype
    except Exception:  # noqa: BLE001 - check_encode_inputs says what is wrong with them
        encode_dtype = None
    return load_model(
        model_path, transform_only=True, encode_dtype=encode_dtype, precision=precision
    )


def _effective_precision(model, precision: str | None) -> str | None:
    """The arithmetic an encode uses: the given one, else the model's (linear models)."""
    if not isinstance(model, LinearSLEM):
        return None
    return precision or model.precision


def check_encode_inputs(
    model,
    model_path,
    positives,
    out,
    dtype=None,
    overwrite=False,
    on_model_change="fail",
    leased: bool = False,
    partition_rows: int | None = None,
    precision: str | None = None,
):
    """Every check of an encode that needs no data: (positives array, output dtype,
    output width). Run by the command line before a cluster starts, and by the job
    (``leased``: it holds the output's lease)."""
    model_path, positives, out = (
        storage.canonical(model_path),
        storage.canonical(positives),
        storage.canonical(out),
    )
    storage.check_distinct(out, "--out", {"positives": positives, "model": model_path})
    arr = storage.open_input(positives, "positives", empty_ok=True)  # 0 rows: an empty output
    check_n_features(
        arr,
        model.n_features_in_,
        f"positives ({str(positives)!r})",
        fitted_on=f"the model {str(model_path)!r}",
    )
    existing = storage.open_existing_output(out, strict=not overwrite)
    kept = (
        existing
        if existing is not None and not overwrite and storage.output_meta(existing) is not None
        else None
    )
    if dtype is None and kept is not None:
        dtype = existing.dtype  # a re-run continues the output as it was written
    out_dtype = np.dtype(dtype) if dtype is not None else output_dtype(arr.dtype)
    if not np.issubdtype(out_dtype, np.floating):
        raise ValueError(f"dtype must be a float dtype (float32 or float64), got {dtype!r}")
    if partition_rows is not None and kept is not None:
        _check_same_partitions(arr, partition_rows, kept, out)
    width = int(getattr(model, "rank_", arr.shape[1]))  # a KernelSLEM writes r columns
    if not leased:
        storage.VersionedStore(out).transaction("slem-dask encode").check_free()
    _plan_output(
        out,
        existing,
        arr,
        positives,
        model,
        out_dtype,
        overwrite,
        on_model_change,
        width,
        _effective_precision(model, precision),
    )
    return arr, out_dtype, width


def _check_same_partitions(arr, partition_rows: int, kept, out) -> None:
    """Refuse a --partition-rows that differs from the partitions of the output kept."""
    if storage.row_partition(arr, partition_rows) != int(kept.chunks[0]):
        raise ValueError(
            f"--partition-rows {partition_rows}: the output {str(out)!r} is written in "
            f"partitions of {kept.chunks[0]} rows (one chunk each), and a re-run continues "
            f"it that way; omit --partition-rows, or pass --overwrite to rebuild it"
        )


def _exists_error(out) -> FileExistsError:
    """What to say of an existing ``out`` that is no versioned output, without --overwrite."""
    if storage.slem_dask_kind(storage.canonical(out)) == "encoding":
        return FileExistsError(  # a copy `slem-dask export` wrote: a group, not versioned
            f"output {str(out)!r} already exists: a plain copy of an output (`slem-dask "
            f"export`); pass --overwrite to replace it with this encoding, or choose "
            f"another path"
        )
    try:  # not slem-dask's, or another kind of its stores: say so as a fit does
        storage.check_may_replace(out, "output", kind="encoding")
    except FileExistsError as refused:
        return refused
    return FileExistsError(  # what --overwrite may replace: a draft, a group of ours
        f"output {str(out)!r} already exists and holds no committed encoding; pass "
        f"--overwrite to replace it, or choose another path"
    )


def _plan_output(
    out,
    existing,
    arr,
    positives,
    model,
    out_dtype,
    overwrite,
    on_model_change,
    width,
    precision=None,
):
    """Decide what to do with what is at ``out``: (existing output to update, or None
    to create a new one; action). Refuses to replace anything slem-dask did not write."""
    if existing is None:
        if not storage._exists(out):
            return None, "create"
        if not overwrite:
            raise _exists_error(out)
        storage.check_may_replace(out, "output", kind="encoding")
        return None, "replace"
    if storage.is_legacy(out) and not overwrite:
        raise FileExistsError(
            f"output {str(out)!r} was written in place by an earlier slem-dask (no "
            f"versions); pass --overwrite to encode it again as a versioned store"
        )
    meta = storage.output_meta(existing)
    if meta is None:
        raise FileExistsError(
            f"output {str(out)!r} already exists and was not written by slem-dask; "
            f"slem-dask never replaces what it did not write, even with --overwrite: "
            f"choose another path"
        )
    if overwrite:
        return None, "replace"  # a new version; the old one stays in the history
    if not _recorded_encoding_is(model, meta.get("encoding_fingerprint")):
        if on_model_change == "reencode":
            return None, "re-encode (model changed)"
        raise FileExistsError(_another_model_message(out, meta, model))
    problems = _resume_problems(meta, existing, arr, positives, (width, out_dtype, precision))
    if problems and meta.get("complete"):  # a whole output, committed: not this run's draft
        raise FileExistsError(
            f"output {str(out)!r} is complete, and is not what this run writes: "
            f"{'; '.join(problems)}; it is kept: pass --overwrite to replace it with a new "
            f"version (this one stays readable in the store's history until pruned), or "
            f"write to another path"
        )
    if problems:
        raise FileExistsError(
            f"output {str(out)!r} cannot be resumed: {'; '.join(problems)}; pass --overwrite "
            f"to rebuild it"
        )
    if arr.shape[0] > existing.shape[0]:
        return existing, "append"
    return existing, "resume" if not meta.get("complete") else "update"


def recorded_model_is(model, recorded) -> bool:
    """Whether an output's recorded model is ``model``: its identity or (outputs written
    before identities) its arrays' fingerprint, hashed only when the identity differs (a
    SHA-256 over every array: 1 s at d = 8192, paid on every re-run before)."""
    return recorded == model.identity_ or recorded == model.fingerprint_


def _another_model_message(out, meta: dict, model) -> str:
    """The refusal of an output encoded with another model, named as fit and encode
    print a model: its path and ``model identity`` (an output of before the identity
    was recorded: its encoding fingerprint)."""
    recorded = meta.get("model_fingerprint") or meta.get("encoding_fingerprint")
    path = meta.get("model_path")
    of = f"the model at {storage.shown_path(path)!r}, " if path else ""
    return (
        f"output {str(out)!r} was encoded with another model ({of}model identity "
        f"{str(recorded)[:16]}; this one's is {model.identity_[:16]}); pass --overwrite to "
        f"re-encode it with this model"
    )


def _recorded_encoding_is(model, recorded) -> bool:
    """:func:`recorded_model_is` for what ``transform`` depends on (a SHA-256 over A^-1 and
    the mean, 0.7 s at d = 8192, was paid twice per encode before)."""
    return recorded == model.encoding_identity_ or recorded == model.encoding_fingerprint_


def _resume_problems(meta, existing, arr, positives, written) -> list[str]:
    """Why the output ``existing`` (its metadata ``meta``) cannot be continued by a run
    that writes ``written`` (width, dtype, precision) from these positives; [] if it can."""
    width, out_dtype, precision = written
    problems = []
    if meta.get("source") != positives.url:
        problems.append(
            f"it encodes {storage.shown_path(meta.get('source'))!r}, not {str(positives)!r}"
        )
    if existing.shape[1] != width or existing.dtype != out_dtype:
        problems.append(
            f"it holds {existing.shape[1]} columns of {existing.dtype}, this run "
            f"writes {width} of {out_dtype}"
        )
    if arr.shape[0] < existing.shape[0] and meta.get("source") == positives.url:
        problems.append(f"the positives shrank from {existing.shape[0]} to {arr.shape[0]} rows")
    if meta.get("precision") != precision:
        problems.append(
            f"it was encoded with precision {meta.get('precision')!r}, this run "
            f"uses {precision!r} (give --precision {meta.get('precision')})"
        )
    return problems
