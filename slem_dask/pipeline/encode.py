"""The encode job: positives encoded in parallel partitions into a draft version of the
output, every partition checked, then committed (resuming what a killed run left).

Its plan (what to write) is :mod:`.encode_plan`'s; how partitions are written, reused and
checked is :mod:`.encode_write`'s."""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass
from typing import Any


from .. import storage
from ..cluster import workers
from .._version import __version__

from . import common
from .common import JobFailed, JobReport, _LOST, _detail, _lost_cluster
from ..core.validation import NonFiniteRowsError, nonfinite_rows_error
from .encode_plan import (
    EncodePlan,
    _output_bytes,
    _scale_mismatch,
    check_encode_inputs,  # noqa: F401 - the pipeline package exports it from here
    load_encoding_model,  # noqa: F401 - the pipeline package exports it from here
    plan_encode,
    recorded_model_is,
    up_to_date_report,
)
from .encode_retry import encode_partitions
from .encode_write import _verify_partitions, reuse_partitions, what_is_kept
from .options import EncodeOptions, options_from


def encode_job(
    client,
    model_path: str,
    positives: str,
    out: str,
    dtype: str | None = None,
    partition_rows: int | None = None,
    overwrite: bool = False,
    progress: bool = False,
    on_model_change: str = "fail",
    precision: str | None = None,
    model=None,
    options: EncodeOptions | None = None,
) -> JobReport:
    """Encode the zarr array ``positives`` with the model at ``model_path`` into ``out``.

    ``options``: an :class:`EncodeOptions` (its fields are the keywords ``dtype`` ...
    ``precision``, which build one when it is not given; give one or the other).
    ``model``: that model, if the caller has already loaded it (it is then not read again:
    one committed version of it, read once: :func:`load_encoding_model`).

    Re-running the same command resumes: an output left unfinished by a killed run gets only
    its missing partitions; partitions whose input rows changed (by the store listing), or
    whose chunk is missing or ends in another crc32c than recorded (one damaged inside is
    for ``verify``), are encoded again; rows appended to ``positives`` get encoded. An
    output of another model is refused (the CLI's ``on_model_change="fail"``) unless
    ``overwrite``; with ``on_model_change="reencode"`` (job specs) it is rebuilt.
    ``complete: true`` is written only after the client has checked that every partition is
    in the store with the checksum its task wrote. ``precision`` (linear models; default:
    the model's): "auto" encodes float32 positives in float32, "float64" in float64; an
    output is continued only in the precision it was started with.
    """
    options = options_from(
        EncodeOptions,
        options,
        dtype=dtype,
        partition_rows=partition_rows,
        overwrite=overwrite,
        progress=progress,
        on_model_change=on_model_change,
        precision=precision,
    )
    t0 = time.perf_counter()
    model_path, positives, out = map(storage.canonical, (model_path, positives, out))
    if model is None:
        model = load_encoding_model(model_path, positives, options.precision)
    storage.check_distinct(out, "--out", {"positives": positives, "model": model_path})
    current = _current_report(model, model_path, positives, out, options, t0)
    if current is not None:  # decided from the committed head: no lease, nothing written
        return current
    head_before = storage.head_seq(out)  # a full disk before the draft is known says it
    with (
        common.full_disk_said(
            out,
            lambda: _output_bytes(model, positives),
            lambda: what_is_kept(out, head_before, advice=False),
        ),
        storage.VersionedStore(out).transaction("slem-dask encode") as tx,
    ):
        return _encode_in(client, model, model_path, positives, out, options, tx, t0)


def _current_report(model, model_path, positives, out, options: EncodeOptions, t0: float):
    """The report of an output already up to date (read from its committed head, before
    any lease), with the job's total time; None when the job has work (or --overwrite)."""
    if options.overwrite:
        return None
    current = up_to_date_report(model, model_path, positives, out, options)
    if current is not None:
        current.timings["total"] = time.perf_counter() - t0
    return current


def _encode_in(
    client, model, model_path, positives, out, options: EncodeOptions, tx, t0: float
) -> JobReport:
    """The job in ``out``'s transaction ``tx`` (under its lease): plan, check memory, begin the draft, then
    keep the head as it is or encode what the plan needs and commit."""
    plan = plan_encode(model, model_path, positives, out, options)
    if plan.head is None:  # a new output: before anything is written
        workers.check_memory(client, plan.memory, plan.n_parts, common.TASK_MODULES)
    storage.replace_legacy(out, "output")  # only reached with --overwrite
    job = _begin_draft(tx, model, model_path, positives, out, plan)
    t1 = time.perf_counter()
    report = _start_report(model, model_path, positives, out, plan, job)
    if _kept_as_it_is(report, model, plan, job):
        tx.discard()  # nothing to write: the head stays as it is
        report.timings["total"] = time.perf_counter() - t0
        return report
    if plan.head is not None and job.todo:  # only what this update computes must fit
        _check_update_memory(client, plan, job)
    with _draft_failures(job, plan, positives, out, client):
        _encode_and_commit(
            client,
            model,
            model_path,
            positives,
            plan,
            job,
            report,
            options.progress,
            (t0, t1),
        )
    return report


@dataclass
class _Draft:
    """The version an encode writes: its transaction (the draft), the output array in
    it, the partitions left to encode and the crc32c of every partition (None: not yet)."""

    tx: storage.Transaction
    target: Any
    todo: list
    crcs: list
    action: str
    out: Any  # the output's path, as the user gave it (canonical)


def _begin_draft(tx, model, model_path, positives, out, plan: EncodePlan) -> _Draft:
    """This job's own version folder (invisible until committed), its output array
    created there, and the partitions it can keep linked into it."""
    draft = tx.begin()
    n_parts = plan.n_parts
    target = storage.create_output(
        draft.location,
        (plan.n_rows, plan.width),
        plan.rows,
        plan.out_dtype,
        {
            "model": type(model).__name__,
            "model_fingerprint": model.identity_,
            "encoding_fingerprint": model.encoding_identity_,
            "model_path": model_path.url,
            "params": storage.json_params(model.get_params()),
            "source": positives.url,
            "source_version": storage.read_version(plan.arr, positives),
            "n_rows": plan.n_rows,
            "input_partitions": plan.inputs,
            "precision": plan.precision,
            "partition_crc32c": [None] * n_parts,
        },
    )
    todo, crcs = reuse_partitions(tx, target, plan.head, plan.inputs, n_parts)
    action = plan.action
    if plan.head is None and len(todo) < n_parts:
        action = "resume"  # partitions of an interrupted run's draft were reused
    return _Draft(tx, target, todo, crcs, action, out)


def _start_report(model, model_path, positives, out, plan: EncodePlan, job: _Draft) -> JobReport:
    """The report of what this job is about to do (warned of scale mismatches)."""
    arr, n_rows = plan.arr, plan.n_rows
    report = JobReport("encode")
    scale = (
        _scale_mismatch(model, arr)
        if n_rows
        else (
            f"positives {str(positives)!r} have no rows (shape {arr.shape}): the output is "
            f"an empty ({0}, {plan.width}) array; write rows there and run again to encode them"
        )
    )
    if scale:
        report.facts["warning"] = scale
        warnings.warn(scale, stacklevel=4)  # where encode_job was called (via _encode_in)
    if job.todo:  # the warning points at encode_job's caller, as the one above
        common.hint_small_chunks(report, arr, "positives", positives, stacklevel=5)
    report.facts.update(
        {
            "positives": str(positives),
            "rows": n_rows,
            "features": arr.shape[1],
            "partitions": f"{len(job.todo)} encoded of {plan.n_parts}",
            "action": job.action,
            "model": str(model_path),
            # the model's identity, as fit reports it: its fingerprint (fit's other line)
            # changes with the last bits of a refit on other partitions or workers
            "model identity": model.identity_[:16],
            "out": str(out),
            "out dtype": plan.out_dtype.name,
        }
    )
    if plan.precision is not None:  # a linear model's arithmetic, as fit reports it
        report.facts["precision"] = plan.precision
    return report


def _kept_as_it_is(report: JobReport, model, plan: EncodePlan, job: _Draft) -> bool:
    """Whether the head already holds this encoding of these rows (the report then says
    "up to date"); else says in the report what a head with nothing to encode gets."""
    meta = plan.meta
    # the head's partitions are those of these rows: else the changed ones were all
    # found in an interrupted run's draft, and must still be committed
    same_rows = meta.get("input_partitions") == plan.inputs
    if (
        plan.head is not None
        and not job.todo
        and same_rows
        and meta.get("n_rows") == plan.n_rows
        and recorded_model_is(model, meta.get("model_fingerprint"))
    ):
        report.facts["action"] = "up to date"
        return True
    if plan.head is not None and not job.todo:
        # a model that encodes identically (theta changed): a new version records it
        report.facts["action"] = (
            "resume"
            if not same_rows
            else "up to date (model metadata updated)"
            if meta.get("n_rows") == plan.n_rows
            else "verified"
        )
    return False


def _check_update_memory(client, plan: EncodePlan, job: _Draft) -> None:
    """The workers' memory checked for the partitions an update encodes; its draft is
    abandoned when they do not fit."""
    try:
        workers.check_memory(client, plan.memory, len(job.todo), common.TASK_MODULES)
    except workers.WorkerMemoryError:
        job.tx.discard()
        raise


def _encode_and_commit(
    client,
    model,
    model_path,
    positives,
    plan: EncodePlan,
    job: _Draft,
    report: JobReport,
    progress: bool,
    times,
) -> None:
    """Encode the partitions left, check every partition as this client reads the
    store, mark the draft complete and commit it (recorded in ``report``)."""
    t0, t1 = times
    tx = job.tx
    stores = {"positives": positives, "output": tx.draft.location}
    if job.todo:  # nothing computes otherwise: no worker is needed, nor waited for
        storage.check_workers_see(client, stores)
    # this job writes and commits: the oldest kept version goes while it writes
    with tx.making_room():
        if job.todo:
            written = encode_partitions(
                client,
                model,
                plan,
                job.target,
                job.todo,
                progress,
                check=lambda: storage.check_workers_see(client, stores),
                kept=lambda: what_is_kept(job.out, tx.draft.seq - 1),
            )
            for index, crc in written.items():
                job.crcs[index] = crc
    t2 = time.perf_counter()
    tx.check_lease()  # first: a job that lost its lease must not blame the storage
    try:
        _verify_partitions(job.target, job.out, job.crcs)
    except JobFailed:
        tx.raise_if_fenced()  # its draft deleted by another job
        raise
    if storage.partition_fingerprints(plan.arr, positives, "positives", plan.rows) != plan.inputs:
        raise JobFailed(
            f"the positives {str(positives)!r} changed while they were encoded; "
            f"nothing was committed: run the same command again (it resumes)"
        )
    report.timings.update(
        {"open": t1 - t0, "encode+write": t2 - t1, "total": time.perf_counter() - t0}
    )
    report.split_lease_wait(tx)
    _commit(model, model_path, positives, plan, job, report, t0)


def _commit(model, model_path, positives, plan: EncodePlan, job: _Draft, report, t0) -> None:
    """Mark the draft complete (with the timings so far) and commit it; the printed
    report then adds the commit's time to the whole job's (a commit retried against a
    slow store took 24 s of a 39.6 s run whose report said "total [s] 15.89")."""
    t3 = time.perf_counter()
    _mark_complete(model, model_path, plan, job, report)  # records the timings above
    summary = {"rows": plan.n_rows, "model_fingerprint": model.identity_[:16]}
    # what `slem-dask versions` shows of it: two jobs' outputs looked alike there
    commit = job.tx.commit("encoding", {**summary, "positives": positives.url})
    report.facts["version"] = commit.seq
    del report.timings["total"]
    end = time.perf_counter()
    report.timings.update({"commit": end - t3, "total": end - t0})


def _mark_complete(model, model_path, plan: EncodePlan, job: _Draft, report: JobReport) -> None:
    """The draft's metadata made whole: ``complete: true``, every partition's crc32c,
    and this run appended to the last 19 the head recorded."""
    fingerprint = model.identity_
    runs = (plan.meta.get("runs") or [])[-19:] + [
        {
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "action": report.facts["action"],
            "rows": plan.n_rows,
            "partitions_encoded": len(job.todo),
            "model_fingerprint": fingerprint,
            "package_version": __version__,
            "timings": report.timings,
        }
    ]
    storage.remove_stray_partials(job.tx.draft.location)  # left by writers killed mid-chunk
    storage.mark_complete(
        job.target,
        {
            "n_rows": plan.n_rows,
            "model_fingerprint": fingerprint,
            "model_path": model_path.url,
            "params": storage.json_params(model.get_params()),
            "partition_crc32c": job.crcs,
            "timings": report.timings,
            "runs": runs,
        },
    )


@contextlib.contextmanager
def _draft_failures(job: _Draft, plan: EncodePlan, positives, out, client=None):
    """What becomes of the draft when writing or committing it fails, and the one line
    that says so: kept for a re-run to reuse, abandoned, or left to the job that
    fenced it. Rows with NaN or inf: all of them, counted on ``client``'s cluster."""
    tx, seq = job.tx, job.tx.draft.seq
    try:
        yield
    except KeyboardInterrupt:
        raise  # the draft stays: a re-run reuses its finished partitions
    except storage.CommitConflictError:
        tx.discard()
        raise
    except storage.DraftFencedError:  # its draft is another job's to delete: left alone
        tx.fenced()  # (a conflict if that job committed its number)
    except storage.DamagedStoreError:
        raise
    except storage.StorageViewError:  # refused before any task ran: nothing to resume
        tx.discard()  # a first write leaves no store, a later one its head
        raise
    except NonFiniteRowsError as exc:  # found by the task that failed first, in its rows
        tx.discard()  # once no task writes any more
        exc = _every_nonfinite_row(client, positives, exc)
        raise ValueError(f"positives {str(positives)!r}: {_detail(exc, positives)}") from None
    except ValueError as exc:  # e.g. rows whose encoding is 0, found by a worker: say where
        tx.discard()
        raise ValueError(f"positives {str(positives)!r}: {_detail(exc, positives)}") from None
    except _LOST as exc:
        if tx.lease.lost():  # cancelled by the watchdog, whose line says it (cli.watchdog):
            raise  # asking its store, maybe the one that went silent, would only delay it
        raise _lost_cluster(exc, what_is_kept(out, seq - 1)) from None
    except OSError as exc:
        if storage.is_out_of_space(exc):  # what is still to write, and what is kept
            needed = len(job.todo) * plan.rows * plan.width * plan.out_dtype.itemsize
            raise JobFailed(
                common.out_of_space_line(exc, out, needed, what_is_kept(out, seq - 1, advice=False))
            ) from None
        raise


def _every_nonfinite_row(client, positives, found: NonFiniteRowsError) -> NonFiniteRowsError:
    """Every row of ``positives`` with NaN or inf, counted by a second pass over them
    (as a fit counts its negatives') once a task found some in its own partition: a user
    who repaired only those would meet the next partition's in the next run. ``found``
    where the second pass cannot run."""
    from ..parallel.blocks import locate_nonfinite_rows

    try:
        arr = storage.open_input(str(positives), "positives")
        count, shown = locate_nonfinite_rows(storage.dask_rows(arr, name="positives"), client)
    except Exception:  # noqa: BLE001 - the task's own count stands
        return found
    if not count:  # pragma: no cover - the input changed since the task read it
        return found
    return nonfinite_rows_error(
        "X", count, shown, remedy="drop or repair those rows before running SLEM"
    )
