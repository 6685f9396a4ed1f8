"""The kernel fit job: pivoted incomplete Cholesky on the cluster, in memory or streaming,
``--update`` of a kernel model by the statistics of the appended rows, and the resumable
final pass."""

from __future__ import annotations

import contextlib
import sys
import time
import warnings

from .. import storage
from ..models import load_model
from ..models.kernel import TraceErrorWarning
from ..core.kernels import unused_params
from ..parallel.kernel_stream import UNBOUNDED_RANK_ESTIMATE, KernelMemoryWarning, choose_strategy
from ..cluster.workers import kernel_fit_bytes, note_memory_remedy

from .common import JobReport, full_disk_said, hint_small_chunks, size_text, update_refusal
from .fit_steps import (
    KERNEL_OPTIONS,
    _fit_errors,
    _open_negatives,
    _save_fitted,
    _warnings_naming,
    check_same_params,
    fit_report,
    model_bytes,
    nothing_written,
)


def _print_round(round_no: int, n_pivots: int, trace_error: float) -> None:
    sys.stdout.write(
        f"\rkernel fit: pass {round_no}, {n_pivots} pivots, residual trace "
        f"{trace_error:.3g} of the trace"
    )
    sys.stdout.flush()


#: Without progress bars (a log, a batch job), a kernel fit prints where it stands at most
#: this often: one without --rank can take thousands of passes, and said nothing for minutes.
ROUND_LINE_SECONDS = 60.0


def _round_lines(model):
    """``on_round`` for a fit without progress bars: one full line every
    ROUND_LINE_SECONDS, with the stopping rule and how to bound it."""
    last = time.monotonic()
    until = f"until {model.rank} pivots or" if model.rank else "no --rank: until"

    def on_round(round_no: int, n_pivots: int, trace_error: float) -> None:
        nonlocal last
        if time.monotonic() - last >= ROUND_LINE_SECONDS:
            last = time.monotonic()
            print(
                f"kernel fit: pass {round_no}, {n_pivots} pivots, residual trace "
                f"{trace_error:.3g} of the trace ({until} it is below --tol "
                f"{model.tol:g}{'' if model.rank else '; --rank R bounds the passes'})",
                flush=True,
            )

    return on_round


def _fit_kernel_job(client, negatives, model_path, model, options) -> JobReport:
    """Fit a KernelSLEM on zarr negatives: ``model.fit`` runs its rounds on ``client``.

    With ``options.update``, a model of the same parameters fitted on the first rows of
    these negatives, unchanged since (their fingerprint), keeps its pivots: the
    rows appended since are read once (:meth:`KernelSLEM.update`), their factor
    rows' statistics merged into the stored ones; a model fitted on all current
    rows is kept ("up to date"). ``options.repivot``: refit on all rows instead.
    """
    t0 = time.perf_counter()
    model._check_params()
    overwrite, repivot = options.overwrite, options.repivot
    update = options.update or repivot
    arr, exists = _open_negatives(negatives, model_path, overwrite, update, repivot)
    n = int(arr.shape[0])
    if exists and update and not (overwrite or repivot):  # read-only, before any lease
        if _kernel_up_to_date(model_path, negatives, arr, model):
            return _up_to_date_report(negatives, n, model_path, t0)  # nothing written
    with (
        full_disk_said(
            model_path,
            lambda: _kernel_store_bytes(model, n, arr.shape[1]),
            nothing_written(model_path),
        ),
        storage.VersionedStore(model_path).transaction("slem-dask fit") as tx,
    ):
        seen = storage.rows_fingerprint(arr, negatives, "negatives", n)
        found = (None, "fit")
        if exists and update and not overwrite:
            found = _stored_kernel_model(model_path, model, negatives, arr, seen, repivot)
        if found is None:
            return _up_to_date_report(negatives, n, model_path, t0)
        old, action = found
        storage.check_workers_see(client, {"negatives": negatives})
        x = storage.dask_rows(arr, options.partition_rows, name="negatives")
        start = old.n_samples_ if old is not None else 0
        report, strategy, why = _kernel_plan_report(
            client, negatives, arr, model, x, old, n - start, action
        )
        if options.progress:  # the choice, before the passes start
            print("\n".join(report.lines()), flush=True)
        checkpoint = _streaming_checkpoint(tx, model, seen, x, old, strategy)
        t1 = time.perf_counter()
        model = _run_factor(
            client,
            negatives,
            model_path,
            (model, x, old, start),
            (strategy, why),
            checkpoint,
            report,
            options.progress,
        )
        t2 = time.perf_counter()
        fp = _save_fitted(model, arr, negatives, model_path, seen, tx)
    _kernel_report(report, model, model_path, fp, (x, start, old is None), (t0, t1, t2))
    report.split_lease_wait(tx)
    return report


def _kernel_plan_report(client, negatives, arr, model, x, old, appended: int, action: str):
    """(the job's report with its inputs and the memory strategy, strategy, why): chosen
    before any pass; an in-memory fit notes its remedy for workers that die for memory."""
    report = fit_report(negatives, arr, {"action": action})
    # the warning points at fit_job's caller (via fit_model, _fit_kernel_job and this step)
    hint_small_chunks(report, arr, "negatives", negatives, stacklevel=6)
    strategy, why = _kernel_strategy(client, model, x, old, appended)
    report.facts.update({"kernel memory": strategy, "because": why})
    if strategy == "in-memory":  # its partitions do not bound what a worker holds
        note_memory_remedy(_in_memory_remedy(model, arr))
    return report, strategy, why


def _streaming_checkpoint(tx, model, seen: str, x, old, strategy: str):
    """The final pass's checkpoint of a streaming fit from scratch, else None."""
    if old is None and strategy == "streaming":
        return _final_pass_checkpoint(tx, model, seen, x)
    return None


def _run_factor(client, negatives, model_path, fitting, chosen, checkpoint, report, progress):
    """The fitted (or updated) model, with its strategy noted: ``fitting`` is (model, x,
    old, start); a streaming fit from scratch resumes from its ``checkpoint``."""
    model, x, old, start = fitting
    strategy, why = chosen
    with (
        _fit_errors(negatives, model_path),
        _warnings_naming(negatives, report, TraceErrorWarning),
    ):
        model = _factor(client, model, x, old, start, strategy, checkpoint, progress)
    model.strategy_, model.strategy_reason_ = strategy, why
    if checkpoint is not None and checkpoint.reused:
        report.facts["final pass"] = (
            f"resumed: {checkpoint.reused} of "
            f"{x.numblocks[0]} partitions reused from an "
            f"interrupted run's draft"
        )
    return model


def _stored_kernel_model(model_path, model, negatives, arr, seen: str, repivot: bool):
    """What an ``--update`` (``repivot``: ``--repivot``) does with the stored model:
    (the model it updates, or None to refit; action), or None when the stored model is
    up to date. Refuses a model of another kind or other parameters."""
    meta, _ = storage.read_model_store(model_path)
    flag = "--repivot" if repivot else "--update"
    if meta["model"] != "KernelSLEM":
        raise FileExistsError(
            f"model store {str(model_path)!r} holds a {meta['model']}, not a kernel "
            f"model; {flag} keeps the stored model's kind and parameters: pass "
            f"--overwrite to replace it with this kernel model, or drop --kernel to "
            f"update the {meta['model']}"
        )
    check_same_params(model, meta, model_path, flag)
    if (
        not repivot
        and meta.get("source") == negatives.url
        and meta.get("n_samples") == int(arr.shape[0])
        and meta.get("negatives_fingerprint") == seen
    ):
        return None
    if repivot:
        return None, "refit (--repivot)"
    return _previous_kernel_model(model_path, meta, negatives, arr)


def _kernel_strategy(client, model, x, old, appended: int) -> tuple[str, str]:
    """(in-memory or streaming, why): chosen for a fit from scratch on ``client``'s
    workers; an update of ``old`` streams the ``appended`` rows."""
    if old is None:
        # the workers of this client, their memory limits
        with client.as_current() if client is not None else contextlib.nullcontext():
            return choose_strategy(model.strategy, x, model.rank, bool(model.exact), model.pivoting)
    why = f"--update keeps the {old.rank_} pivots and reads only the {appended} appended rows, once"
    if model.strategy != "auto":  # asked for, but an update has one way to run
        why += f" (kernel memory {model.strategy!r} applies to a fit from scratch: --repivot)"
    return "streaming", why


def _factor(client, model, x, old, start: int, strategy: str, checkpoint, progress: bool):
    """The fitted model: ``model`` fitted on ``x`` with ``strategy`` (the choice made
    before, not made again), or ``old`` updated with the rows from ``start``."""
    on_round = _print_round if progress else _round_lines(model)
    with client.as_current() if client is not None else contextlib.nullcontext():
        if old is not None:
            return old.update(x[start:], row_offset=start)
        given = model.strategy
        model.strategy = strategy  # the choice made above, not made again
        try:
            with warnings.catch_warnings():  # the choice above said it once
                warnings.simplefilter("ignore", KernelMemoryWarning)
                model.fit(x, progress=on_round, checkpoint=checkpoint)
        finally:
            model.strategy = given
    if progress:
        sys.stdout.write("\n")
    return model


def _kernel_report(
    report: JobReport,
    model,
    model_path,
    fp: str,
    read,
    times,
) -> None:
    """The facts and timings of a finished kernel fit, added to ``report``: ``read`` is
    (the rows as dask, the first row read, whether fitted from scratch); ``times`` the
    job's start, and the ends of its open and factor steps."""
    x, start, from_scratch = read
    t0, t1, t2 = times
    t3 = time.perf_counter()
    partitions, rows_read = x[start:].numblocks[0], int(x.shape[0]) - start
    params = model.get_params()
    unused = unused_params(model.kernel)
    said = {flag: params[key] for key, flag in KERNEL_OPTIONS.items() if key not in unused}
    if isinstance(said.get("gamma"), str):  # relative: the value it meant for these rows
        said["gamma"] = f"{said['gamma']} (= {model.gamma_:.4g} for these negatives' scale)"
    report.facts.update(
        {
            "partitions": partitions,
            "rows read": rows_read,
            **said,
            "pivots": model.rank_,
            "trace error": f"{model.trace_error_:.4g}",
            "passes": model.n_passes_ if from_scratch else 1,
            "model": str(model_path),
            "fingerprint": fp[:16],
            "model identity": model.identity_[:16],  # what encode's report names it by
        }
    )
    report.timings.update(
        {
            "open": t1 - t0,
            "factor" if from_scratch else "update": t2 - t1,
            "save": t3 - t2,
            "total": t3 - t0,
        }
    )


def _kernel_up_to_date(model_path, negatives, arr, model) -> bool:
    """Whether the committed model is a KernelSLEM of ``model``'s parameters fitted on
    exactly these rows, unchanged since: read-only, before any lease (a refusal raises
    as the job would under its lease)."""
    meta, _ = storage.read_model_store(model_path)
    n = int(arr.shape[0])
    if (
        meta["model"] != "KernelSLEM"
        or meta.get("source") != negatives.url
        or meta.get("n_samples") != n
    ):
        return False
    check_same_params(model, meta, model_path, "--update")
    return meta.get("negatives_fingerprint") == storage.rows_fingerprint(
        arr, negatives, "negatives", n
    )


def _up_to_date_report(negatives, n: int, model_path, t0: float) -> JobReport:
    report = JobReport("fit")
    report.facts.update(
        {"negatives": str(negatives), "rows": n, "action": "up to date", "model": str(model_path)}
    )
    report.timings["total"] = time.perf_counter() - t0
    return report


def _in_memory_remedy(model, arr) -> str:
    """What helps an in-memory kernel fit whose workers die for memory."""
    n, d = int(arr.shape[0]), int(arr.shape[1])
    need = kernel_fit_bytes(n, d, arr.dtype, model.rank or min(n, UNBOUNDED_RANK_ESTIMATE))
    return (
        f"the in-memory kernel fit holds all {n} rows and their factor rows on the "
        f"workers (about {size_text(need)} in all, whatever --partition-rows says): "
        f"pass --kernel-memory streaming (or auto), which reads the negatives in "
        f"partitions at each pass, or give the workers more memory"
    )


def _kernel_store_bytes(model, n: int, d: int) -> int:
    """What a kernel fit writes to its model store: the model, and before it the
    streaming final pass's per-partition statistics (an estimate before the fit: rank
    (else 1000) pivots of d values, an r x r scatter per partition of 10,000 rows)."""
    if getattr(model, "rank_", None) is not None:
        return model_bytes(model, d)
    r = min(model.rank or 1000, n)
    return 8 * (r * d + 2 * r * r + r * r * max(1, n // 10_000))


def _final_pass_checkpoint(tx, model, seen: str, x):
    """This job's draft of the model store as the place where the final pass of a
    streaming fit leaves its per-partition statistics, with the drafts that killed runs
    left for the same version (:mod:`slem_dask.parallel.kernel_checkpoint`), which it deletes once
    it copied what it reuses of them (the job holds the lease: :meth:`make_room`)."""
    from ..parallel.kernel_checkpoint import FinalPassCheckpoint

    draft = tx.begin_scratch()  # the model itself is committed from a draft of its own
    others = [tx.store.location(v) for v in tx.others(draft)]
    params = {k: v for k, v in model.get_params().items() if k not in model._execution_params}
    key = FinalPassCheckpoint.key_of(seen, storage.json_params(params), x.chunks[0])
    return FinalPassCheckpoint(
        draft.location, others, key, release=lambda: tx.make_room(mine=draft)
    )


def _previous_kernel_model(model_path, meta, negatives, arr):
    """(the stored KernelSLEM, action) when its negatives are the first rows of ``arr``,
    unchanged since; (None, why a refit) for a model stored without the scatter of F's
    rows; a ValueError naming the fix when the rows are not a prefix or changed."""
    old_n = int(meta.get("n_samples", -1))
    refused = update_refusal(model_path, meta, negatives, arr)
    if refused:
        raise ValueError(refused)
    if meta.get("negatives_fingerprint") != storage.rows_fingerprint(
        arr, negatives, "negatives", old_n
    ):
        raise ValueError(
            f"--update: the first {old_n} rows of {str(negatives)!r}, already in "
            f"{str(model_path)!r}, changed since (rewritten, truncated or replaced); merging "
            f"would count old and new values: refit on all rows with --repivot"
        )
    old = load_model(model_path)
    if old.factor_scatter_ is None or old.exact:
        why = (
            "an exact=True model keeps all negatives"
            if old.exact
            else "the model was written by a slem-dask that did not keep the scatter of F's rows"
        )
        return None, f"refit (negatives now {arr.shape[0]} rows, the model had {old_n}; {why})"
    return old, (
        f"update (kept the {old.rank_} pivots; merged the {arr.shape[0] - old_n} "
        f"rows appended since; --repivot refits)"
    )
