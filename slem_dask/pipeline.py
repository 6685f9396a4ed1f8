"""The batch jobs: fit a model from zarr negatives, encode zarr positives, the demo.

Each job takes a connected ``distributed.Client`` (see :mod:`slem_dask.cluster`),
validates everything it can from metadata before it reads or writes data, and
never leaves a model or output that looks complete after a failure.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import dask
import numpy as np
import zarr

from concurrent.futures import CancelledError

from distributed.comm.core import CommClosedError

from . import integrity, storage, workers
from .storage import versions
from ._version import __version__
from .integrity import canonical
from .models import KernelSLEM, LinearSLEM, RawFeatures, load_model
from .core.statistics import ScatterStats, merge_statistics
from .parallel_kernel_stream import choose_strategy
from .parallel import (_sub_block_rows, merge_fan_in, scatter_large_arrays,
                       statistics_partition_rows, store_statistics)
from .validation import (DegenerateNegativesWarning, RowsError,
                         check_encoded_rows, check_n_features, output_dtype)

__all__ = ["fit_job", "encode_job", "JobReport"]


@dataclass
class JobReport:
    """What a job did, for printing and for the attributes of what it wrote."""

    name: str
    facts: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [f"{self.name}:"]
        out += [f"  {k:<18} {v}" for k, v in self.facts.items()]
        out += [f"  {k + ' [s]':<18} {v:.2f}" for k, v in self.timings.items()]
        return out


def _detail(exc: ValueError) -> str:
    """An input's error without the library's parameter name (the job names the store)."""
    return exc.detail if isinstance(exc, RowsError) else str(exc)


def _compute(client, obj, progress: bool):
    """Compute one collection or Delayed on ``client``, with a progress bar if asked."""
    if client is None:
        return dask.compute(obj)[0]
    future = client.compute(obj)  # a list of futures for a list of collections
    if progress:
        from distributed import progress as show_progress

        show_progress(future)
        sys.stdout.write("\n")
    try:
        return client.gather(future)
    except BaseException:
        _settle(client, future)
        raise


def _threads(client) -> int:
    """Threads that run tasks: the cluster's, or those of dask's local scheduler."""
    if client is None:
        return int(dask.config.get("num_workers", None) or os.cpu_count() or 1)
    return max(1, sum(client.nthreads().values()))


def _settle(client, future, timeout: float = 60.0) -> None:
    """After a failed compute, cancel the rest and wait (up to ``timeout``) until no task
    runs on the workers: tasks already running when one failed keep going, and the
    caller must not remove an output while they still write chunks into it."""
    try:
        client.cancel(future)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            busy = _run_within(client, lambda dask_worker: len(dask_worker.state.executing)
                               + len(dask_worker.state.long_running),
                               min(5.0, deadline - time.monotonic()))
            if not busy or not any(busy.values()):
                return  # idle, or a worker does not answer (stopped: it writes nothing)
            time.sleep(0.05)
    except Exception:  # cleanup is best effort: the original error is what matters
        pass


def _run_within(client, function, seconds: float):
    """``client.run(function)``, or None if a worker has not answered within ``seconds``:
    a stopped worker would hold the call as long as it is stopped."""
    import threading

    answer = {}

    def ask():
        try:
            answer["busy"] = client.run(function)
        except Exception:  # noqa: BLE001 - e.g. the client closed while the worker slept
            pass

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(seconds)
    return answer.get("busy")


class JobFailed(integrity.IntegrityError):
    """A job stopped for a reason outside its inputs (lost scheduler, workers that do
    not see the same storage, a store taken over); the message says what is kept."""


#: Errors that mean the connection to the cluster is gone, not that the data is bad.
_LOST = (CancelledError, CommClosedError, ConnectionError, TimeoutError)


def _lost_cluster(exc: BaseException, what_is_kept: str) -> JobFailed:
    text = str(exc)
    why = ("the connection to the scheduler was lost" if "connection" in text.lower()
           or isinstance(exc, (CommClosedError, ConnectionError))
           else f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else 'cancelled'}")
    return JobFailed(f"lost the dask cluster while computing ({why}); {what_is_kept}")


def fit_job(client, negatives: str, model_path: str, lam: float = 1e-3, theta: float = 1.0,
            partition_rows: int | None = None, overwrite: bool = False,
            progress: bool = False, update: bool = False, kernel: str | None = None,
            gamma: float = 0.1, degree: int = 2, rank: int | None = None,
            pivoting: str = "greedy", tol: float = 1e-3, seed: int | None = None,
            precision: str = "auto", kernel_memory: str = "auto",
            repivot: bool = False) -> JobReport:
    """Fit a LinearSLEM on the zarr array ``negatives`` and save it to ``model_path``.

    With ``kernel`` set, fit a KernelSLEM instead (``gamma``, ``degree``,
    ``rank``, ``pivoting``, ``tol``, ``seed``; ``kernel_memory`` is its
    ``strategy``: see :class:`KernelSLEM`). ``update`` of a kernel model keeps
    its pivots and merges the statistics of the appended rows' factor rows;
    ``repivot`` (implies ``update``) refits it from scratch on all rows.

    ``update``: if ``model_path`` holds a model fitted on the first rows of this
    same ``negatives`` array, and those rows are unchanged (their fingerprint),
    merge the statistics of the rows appended since into the stored ones
    (Chan et al.), without reading the old rows again. With ``overwrite`` as
    well, the model is refitted from scratch.

    ``precision`` (linear only): "auto" computes float32 negatives in float32
    inside each block, "float64" in float64 (see :class:`LinearSLEM`).
    """
    negatives, model_path = canonical(negatives), canonical(model_path)
    if kernel is not None:
        return _fit_kernel_job(client, negatives, model_path, KernelSLEM(
            kernel=kernel, gamma=gamma, degree=degree, lam=lam, rank=rank, pivoting=pivoting,
            tol=tol, random_state=seed, strategy=kernel_memory), partition_rows, overwrite,
            update or repivot, progress, repivot)
    if repivot or kernel_memory != "auto":
        raise ValueError(f"{'repivot' if repivot else f'kernel_memory={kernel_memory!r}'} "
                         f"applies to kernel models only (give kernel=...), not to a linear "
                         f"SLEM, whose fit always streams its negatives")
    t0 = time.perf_counter()
    model = LinearSLEM(lam=lam, theta=theta, precision=precision)
    model._check_params()
    arr, exists = _open_negatives(negatives, model_path, overwrite, update)
    with integrity.Lease(model_path, "slem-dask fit") as lease:
        update = update and exists and not overwrite  # --overwrite --update: refit
        previous = _previous_statistics(model_path, negatives, arr) if update else None
        start = previous.count if previous is not None else 0
        n = int(arr.shape[0])
        report = JobReport("fit")
        report.facts.update({
            "negatives": str(negatives), "rows": n, "features": arr.shape[1],
            "dtype": str(arr.dtype), "lam": lam, "theta": theta, "precision": precision,
            "action": "update" if previous is not None else "fit", "rows read": n - start,
        })
        if previous is not None and start == n and \
                load_model(model_path).get_params() == model.get_params():
            report.facts["action"] = "up to date"
            report.facts["model"] = str(model_path)
            report.timings["total"] = time.perf_counter() - t0
            return report
        seen = integrity.rows_fingerprint(arr, negatives, "negatives", n)
        integrity.check_workers_see(client, {"negatives": negatives})
        rows = storage.row_partition(arr, partition_rows)
        if partition_rows is None:
            rows = statistics_partition_rows(n - start, arr.shape[1], integrity.unit_rows(arr),
                                             rows, _threads(client))
        report.facts["partitions"] = f"{-(-(n - start) // rows)} x {rows} rows"
        d = int(arr.shape[1])
        workers.check_memory(client, workers.Plan(
            "fit", "negatives", rows, d, str(arr.dtype), workers.fit_task_bytes(
                d, _sub_block_rows(arr, rows), arr.dtype, precision, merge_fan_in(d)),
            0.0, 0, integrity.unit_rows(arr)), -(-(n - start) // rows))
        t1 = time.perf_counter()
        with _fit_errors(negatives, model_path):
            stats = (_compute(client, store_statistics(arr, rows, precision, "negatives", start),
                              progress)
                     if start < n else None)
            if previous is not None:
                stats = previous if stats is None else merge_statistics(previous, stats)
            t2 = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", DegenerateNegativesWarning)
                model._fit_statistics(stats, arr.dtype)
        for warning in caught:  # said once, naming the store, and kept in the report
            if issubclass(warning.category, DegenerateNegativesWarning):
                warning.message = f"negatives {str(negatives)!r}: {warning.message}"
                report.facts["warning"] = warning.message
            warnings.warn(warning.message, warning.category, stacklevel=2)
        fp = _save_fitted(model, arr, negatives, model_path, seen, lease)
    t3 = time.perf_counter()
    report.facts.update({"model": str(model_path), "fingerprint": fp[:16]})
    report.timings.update({"open": t1 - t0, "statistics": t2 - t1, "factor+save": t3 - t2,
                           "total": t3 - t0})
    return report


@contextlib.contextmanager
def _fit_errors(negatives, model_path):
    """A fit's compute errors, said once: bad rows name the negatives, a lost cluster
    says that the model is as before; damaged chunks already name themselves."""
    try:
        yield
    except integrity.DamagedStoreError:
        raise
    except ValueError as exc:  # e.g. NaN rows, negative histogram values: say which input
        raise ValueError(f"negatives {str(negatives)!r}: {_detail(exc)}") from None
    except _LOST as exc:
        raise _lost_cluster(exc, f"no model was written ({str(model_path)!r} is as "
                                 f"before): run the same command again") from None


def _save_fitted(model, arr, negatives, model_path, seen: str, lease) -> str:
    """Save a fitted model under the job's lease, unless its negatives changed while
    they were read (``seen``: their fingerprint before); return its fingerprint."""
    if integrity.rows_fingerprint(arr, negatives, "negatives", int(arr.shape[0])) != seen:
        raise JobFailed(
            f"the negatives {str(negatives)!r} changed while this fit read them; nothing "
            f"was written: run the fit again once the negatives are no longer being written")
    return model.save(model_path, overwrite=True, lease=lease,
                      metadata={"source": negatives.url, "negatives_fingerprint": seen,
                                "source_version": storage.read_version(arr, negatives)})


def _print_round(round_no: int, n_pivots: int, trace_error: float) -> None:
    sys.stdout.write(f"\rkernel fit: pass {round_no}, {n_pivots} pivots, residual trace "
                     f"{trace_error:.3g} of the trace")
    sys.stdout.flush()


def _fit_kernel_job(client, negatives, model_path, model, partition_rows,
                    overwrite: bool, update: bool = False, progress: bool = False,
                    repivot: bool = False) -> JobReport:
    """Fit a KernelSLEM on zarr negatives: ``model.fit`` runs its rounds on ``client``.

    With ``update``, a model of the same parameters fitted on the first rows of
    these negatives, unchanged since (their fingerprint), keeps its pivots: the
    rows appended since are read once (:meth:`KernelSLEM.update`), their factor
    rows' statistics merged into the stored ones; a model fitted on all current
    rows is kept ("up to date"). ``repivot``: refit on all rows instead.
    """
    t0 = time.perf_counter()
    model._check_params()
    arr, exists = _open_negatives(negatives, model_path, overwrite, update)
    n = int(arr.shape[0])
    with integrity.Lease(model_path, "slem-dask fit") as lease:
        action, old = "fit", None
        seen = integrity.rows_fingerprint(arr, negatives, "negatives", n)
        if exists and update and not overwrite:
            meta, _ = storage.read_model_store(model_path)
            given = storage.json_params(model.get_params())
            stored = meta["params"]
            differ = {k: v for k, v in given.items()
                      if k not in model._execution_params and stored.get(k) != v}
            if meta["model"] != "KernelSLEM" or differ:
                diff = ", ".join(f"{k}: stored {stored.get(k)!r}, given {v!r}"
                                 for k, v in differ.items()) or f"a {meta['model']}"
                raise FileExistsError(
                    f"model store {str(model_path)!r} holds a {meta['model']} with other "
                    f"parameters ({diff}); --update keeps parameters: give the stored "
                    f"values, or pass --overwrite to refit with the new ones")
            if not repivot and meta.get("source") == negatives.url \
                    and meta.get("n_samples") == n and meta.get("negatives_fingerprint") == seen:
                report = JobReport("fit")
                report.facts.update({"negatives": str(negatives), "rows": n,
                                     "action": "up to date", "model": str(model_path)})
                report.timings["total"] = time.perf_counter() - t0
                return report
            if repivot:
                action = "refit (--repivot)"
            else:
                old, action = _previous_kernel_model(model_path, meta, negatives, arr)
        integrity.check_workers_see(client, {"negatives": negatives})
        x = storage.dask_rows(arr, partition_rows, name="negatives")
        start = old.n_samples_ if old is not None else 0
        report = JobReport("fit")
        report.facts.update({"negatives": str(negatives), "rows": n, "features": arr.shape[1],
                             "dtype": str(arr.dtype), "action": action})
        if old is None:
            # the workers of this client, their memory limits
            with (client.as_current() if client is not None else contextlib.nullcontext()):
                strategy, why = choose_strategy(model.strategy, x, model.rank,
                                                bool(model.exact), model.pivoting)
        else:
            strategy, why = "streaming", (f"--update keeps the {old.rank_} pivots and reads "
                                          f"only the {n - start} appended rows, once")
        report.facts.update({"kernel memory": strategy, "because": why})
        if progress:  # the choice, before the passes start
            print("\n".join(report.lines()), flush=True)
        checkpoint = (_final_pass_checkpoint(model_path, model, seen, x)
                      if old is None and strategy == "streaming" else None)
        t1 = time.perf_counter()
        with _fit_errors(negatives, model_path):
            on_round = _print_round if progress else None
            with (client.as_current() if client is not None else contextlib.nullcontext()):
                if old is None:
                    given = model.strategy
                    model.strategy = strategy  # the choice made above, not made again
                    try:
                        model.fit(x, progress=on_round, checkpoint=checkpoint)
                    finally:
                        model.strategy = given
                else:
                    model = old.update(x[start:])
            if progress and old is None:
                sys.stdout.write("\n")
        t2 = time.perf_counter()
        model.strategy_, model.strategy_reason_ = strategy, why
        if checkpoint is not None and checkpoint.reused:
            report.facts["final pass"] = (f"resumed: {checkpoint.reused} of "
                                          f"{x.numblocks[0]} partitions reused from an "
                                          f"interrupted run's draft")
        fp = _save_fitted(model, arr, negatives, model_path, seen, lease)
    t3 = time.perf_counter()
    report.facts.update({
        "partitions": x[start:].numblocks[0], "rows read": n - start,
        **{k: v for k, v in model.get_params().items() if k not in ("exact", "strategy")},
        "pivots": model.rank_, "trace error": f"{model.trace_error_:.4g}",
        "passes": model.n_passes_ if old is None else 1, "model": str(model_path),
        "fingerprint": fp[:16],
    })
    report.timings.update({"open": t1 - t0, "factor" if old is None else "update": t2 - t1,
                           "save": t3 - t2, "total": t3 - t0})
    return report


def _final_pass_checkpoint(model_path, model, seen: str, x):
    """This job's draft of the model store as the place where the final pass of a
    streaming fit leaves its per-partition statistics, with the drafts that killed runs
    left for the same version (:mod:`slem_dask.kernel_checkpoint`). The model's commit
    deletes them all (the store's garbage collection)."""
    from .kernel_checkpoint import FinalPassCheckpoint

    store = versions.VersionedStore(model_path)
    draft = store.begin()
    others = [store.location(v) for v in store.drafts(draft.seq) if v != draft.version]
    params = {k: v for k, v in model.get_params().items() if k not in model._execution_params}
    key = FinalPassCheckpoint.key_of(seen, storage.json_params(params), x.chunks[0])
    return FinalPassCheckpoint(draft.location, others, key)


def _previous_kernel_model(model_path, meta, negatives, arr):
    """(the stored KernelSLEM, action) when its negatives are the first rows of ``arr``,
    unchanged since; (None, why a refit) for a model stored without the scatter of F's
    rows; a ValueError naming the fix when the rows are not a prefix or changed."""
    old_n = int(meta.get("n_samples", -1))
    if meta.get("source") != negatives.url or meta.get("n_features") != arr.shape[1] \
            or old_n > arr.shape[0]:
        raise ValueError(
            f"--update: the model {str(model_path)!r} was fitted on {old_n} rows of "
            f"{meta.get('source')!r} with {meta.get('n_features')} features, which is not a "
            f"prefix of {negatives.url!r} (shape {arr.shape}); refit on all rows with "
            f"--repivot (same parameters) or --overwrite")
    if meta.get("negatives_fingerprint") != integrity.rows_fingerprint(
            arr, negatives, "negatives", old_n):
        raise ValueError(
            f"--update: the first {old_n} rows of {str(negatives)!r}, already in "
            f"{str(model_path)!r}, changed since (rewritten, truncated or replaced); merging "
            f"would count old and new values: refit on all rows with --repivot")
    old = load_model(model_path)
    if old.factor_scatter_ is None or old.exact:
        why = ("an exact=True model keeps all negatives" if old.exact else
               "the model was written by a slem-dask that did not keep the scatter of F's "
               "rows")
        return None, f"refit (negatives now {arr.shape[0]} rows, the model had {old_n}; {why})"
    return old, (f"update (kept the {old.rank_} pivots; merged the {arr.shape[0] - old_n} "
                 f"rows appended since; --repivot refits)")


def _open_negatives(negatives, model_path, overwrite: bool, update: bool):
    """Checks shared by every fit, before any data is read: (zarr array, model exists)."""
    negatives, model_path = canonical(negatives), canonical(model_path)
    storage.check_distinct(model_path, "--model", {"negatives": negatives})
    exists = storage._exists(model_path)
    if exists:
        integrity.check_may_replace(model_path, "model store", kind="model")
    if exists and not (overwrite or update):
        raise FileExistsError(
            f"model store {str(model_path)!r} already exists; pass --overwrite to replace "
            f"it, or --update to add the negatives appended since it was fitted")
    arr = storage.open_input(negatives, "negatives")
    if arr.shape[0] < 2:
        raise ValueError(
            f"negatives: {str(negatives)!r} has shape {arr.shape}; at least 2 rows are needed")
    return arr, exists


def _previous_statistics(model_path, negatives, arr) -> ScatterStats:
    """The statistics stored in a model, checked to be those of the first rows of ``arr``,
    unchanged since they were merged."""
    meta, _ = storage.read_model_store(model_path)
    old = load_model(model_path)
    if not isinstance(old, LinearSLEM):
        raise ValueError(f"--update needs a LinearSLEM model; {str(model_path)!r} holds "
                         f"{meta['model']}: pass --overwrite to refit")
    if meta.get("source") != negatives.url or old.n_features_in_ != arr.shape[1] \
            or old.n_samples_ > arr.shape[0]:
        raise ValueError(
            f"--update: the model {str(model_path)!r} was fitted on {old.n_samples_} rows of "
            f"{meta.get('source')!r} with {old.n_features_in_} features, which is not a prefix "
            f"of {negatives.url!r} (shape {arr.shape}); fit from scratch with --overwrite")
    now = integrity.rows_fingerprint(arr, negatives, "negatives", old.n_samples_)
    if meta.get("negatives_fingerprint") != now:
        raise ValueError(
            f"--update: the first {old.n_samples_} rows of {str(negatives)!r}, already merged "
            f"into {str(model_path)!r}, changed since (rewritten, truncated or replaced); "
            f"merging would count old and new values: refit with --overwrite")
    return ScatterStats(old.n_samples_, old.mean_, old.covariance_ * old.n_samples_)


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
    with integrity.Lease(out, "slem-dask encode") as lease:
        arr, out_dtype, width = check_encode_inputs(model, model_path, positives, out, dtype,
                                                    overwrite, on_model_change, leased=True,
                                                    partition_rows=partition_rows,
                                                    precision=precision)
        precision = _effective_precision(model, precision)
        fingerprint = model.fingerprint_
        encoding = model.encoding_fingerprint_  # what decides whether an output can be kept
        n_rows = int(arr.shape[0])
        existing = storage.open_existing_output(out, strict=not overwrite)
        head, action = _plan_output(out, existing, arr, positives, encoding, out_dtype,
                                    overwrite, on_model_change, width, precision)
        if head is None and partition_rows is None and existing is not None:
            partition_rows = int(existing.chunks[0])  # a rebuild keeps the chunking
        rows = int(head.chunks[0]) if head is not None else \
            storage.row_partition(arr, partition_rows)
        n_parts = -(-n_rows // rows)
        per_row, fixed = workers.encode_task_bytes(model, rows, arr.shape[1], arr.dtype)
        plan = workers.Plan("encode", "positives", rows, int(arr.shape[1]), str(arr.dtype),
                            int(fixed + per_row * rows), per_row, fixed,
                            integrity.unit_rows(arr), resumed=head is not None)
        inputs = integrity.partition_fingerprints(arr, positives, "positives", rows)
        if head is None:  # a new output: before anything is written
            workers.check_memory(client, plan, n_parts)
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
        scale = _scale_mismatch(model, arr)
        if scale:
            report.facts["warning"] = scale
            warnings.warn(scale, stacklevel=2)
        report.facts.update({
            "positives": str(positives), "rows": n_rows, "features": arr.shape[1],
            "partitions": f"{len(todo)} encoded of {n_parts}", "action": action,
            "model": str(model_path), "fingerprint": fingerprint[:16], "out": str(out),
            "out dtype": out_dtype.name,
        })
        meta = storage.output_meta(head) if head is not None else {}
        if head is not None and not todo and meta.get("n_rows") == n_rows \
                and meta.get("model_fingerprint") == fingerprint:
            store.abandon(draft)  # nothing to write: the head stays as it is
            report.facts["action"] = "up to date"
            report.timings["total"] = time.perf_counter() - t0
            return report
        if head is not None and not todo:
            # a model that encodes identically (theta changed): a new version records it
            report.facts["action"] = "up to date (model metadata updated)" \
                if meta.get("n_rows") == n_rows else "verified"
        if head is not None and todo:  # only what this update computes must fit
            try:
                workers.check_memory(client, plan, len(todo))
            except workers.WorkerMemoryError:
                store.abandon(draft)
                raise
        try:
            integrity.check_workers_see(client, {"positives": positives,
                                                 "output": draft.location})
            if todo:
                with scatter_large_arrays(client):  # the model: once to the workers
                    written = _compute(client, _write_partitions(model, arr, target, todo,
                                                                 rows, out_dtype, precision),
                                       progress)
                for index, crc in np.asarray(written).reshape(-1, 2).tolist():
                    crcs[int(index)] = int(crc)
            t2 = time.perf_counter()
            lease.check()  # first: a job that lost its lease must not blame the storage
            _verify_partitions(target, out, crcs)
            if integrity.partition_fingerprints(arr, positives, "positives", rows) != inputs:
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
            store.collect_garbage()
        except KeyboardInterrupt:
            raise  # the draft stays: a re-run reuses its finished partitions
        except versions.CommitConflictError:
            store.abandon(draft)
            raise
        except integrity.DamagedStoreError:
            raise
        except ValueError as exc:  # e.g. NaN rows found by a worker: say where
            store.abandon(draft)  # once no task writes any more
            raise ValueError(f"positives {str(positives)!r}: {_detail(exc)}") from None
        except _LOST as exc:
            raise _lost_cluster(exc, f"the partitions already written for {str(out)!r} are "
                                     f"kept (not visible to readers): run the same command "
                                     f"again to resume") from None
        except OSError as exc:
            if integrity.is_out_of_space(exc):
                raise JobFailed(
                    f"no space left on the storage of {str(out)!r} ({exc}); the partitions "
                    f"already written are kept (not visible to readers): free space, then "
                    f"run the same command again to resume") from None
            raise
    return report


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
    arr = storage.open_input(positives, "positives")
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
        integrity.Lease(out, "slem-dask encode").check_free()
    _plan_output(out, existing, arr, positives, model.encoding_fingerprint_, out_dtype,
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
    if isinstance(model, KernelSLEM):
        return ("their kernel values against every pivot of the model are 0 (they are far "
                "from all the negatives): normalize positives and negatives the same way "
                "(e.g. L2), or fit with a smaller gamma")
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
                integrity.stored_crc32c(old, i) == recorded else \
                integrity.self_consistent_crc32c(old, i)
            if crc is not None:
                crcs[i] = crc
                names.append(integrity._full_key(old, (i, 0)))
        if names:
            store.backend.copy_tree(_relative(store, old), _relative(store, target), names)
    return [i for i, crc in enumerate(crcs) if crc is None], crcs


def _relative(store, arr) -> str:
    """The folder of ``arr`` (a version of ``store``) relative to the store's root."""
    location = storage._where(arr)
    root = store.path.location.rstrip("/")
    return location[len(root):].strip("/")


def _verify_partitions(target, out, crcs: list) -> None:
    """Every partition present, as this client reads the store, with the crc32c its
    task's worker read back after writing it."""
    bad = [i for i, crc in enumerate(crcs)
           if crc is None or integrity.stored_crc32c(target, i) != crc]
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
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
    if existing is None and storage._exists(out):
        if not overwrite:
            raise FileExistsError(
                f"output {str(out)!r} already exists and is not a zarr array; choose "
                f"another path")
        integrity.check_may_replace(out, "output", kind="encoding")
    if existing is None:
        return None, "create"
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
        return None, "create"
    if meta.get("encoding_fingerprint") != encoding:
        if on_model_change == "reencode":
            return None, "re-encode (model changed)"
        raise FileExistsError(
            f"output {str(out)!r} was encoded with another model (encoding fingerprint "
            f"{str(meta.get('encoding_fingerprint'))[:16]}, now {encoding[:16]}); pass "
            f"--overwrite to re-encode it with the current model")
    problems = []
    if meta.get("source") != positives.url:
        problems.append(f"it encodes {meta.get('source')!r}, not {positives.url!r}")
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



def _ranked(queries, database, k: int):
    from .retrieval import search

    return dask.compute(search(queries, database, k))[0]


def demo_job(client, workdir: str = "slem-demo", n_negatives: int = 50_000,
             n_instances: int = 1_000, group_size: int = 4, d: int = 128, lam: float = 1e-3,
             seed: int = 0, progress: bool = False) -> tuple[list[dict], list[JobReport]]:
    """Generate (once) a synthetic corpus in ``workdir``, fit, encode, evaluate.

    Returns the results table (one row per method) and the job reports.
    """
    from .datasets import make_corpus, write_corpus
    from .retrieval import mean_average_precision, precision_recall_at_k

    os.makedirs(workdir, exist_ok=True)
    corpus_path = os.path.join(workdir, "corpus.zarr")
    params = {"n_negatives": n_negatives, "n_instances": n_instances,
              "group_size": group_size, "d": d, "seed": seed}
    t0 = time.perf_counter()
    try:
        import zarr

        existing = dict(storage.open_node(corpus_path).attrs)
    except Exception:  # noqa: BLE001 - no usable corpus there: write one
        existing = {}
    if existing.get("slem_dask_demo") != params:
        corpus = make_corpus(n_negatives=n_negatives, n_instances=n_instances,
                             group_size=group_size, d=d, seed=seed)
        write_corpus(corpus, corpus_path, chunk_rows=1024, attrs={"slem_dask_demo": params})
    generate = JobReport("generate corpus")
    generate.facts.update({"corpus": corpus_path, **params})
    generate.timings["total"] = time.perf_counter() - t0

    model_path = os.path.join(workdir, "model.zarr")
    reports = [generate]
    # Small partitions, so that even the demo runs as many parallel tasks.
    reports.append(fit_job(client, f"{corpus_path}/negatives", model_path, lam=lam,
                           partition_rows=8192, overwrite=True, progress=progress))
    for name in ("database", "queries"):
        reports.append(encode_job(client, model_path, f"{corpus_path}/{name}",
                                  f"{corpus_path}/slem_{name}", partition_rows=1024,
                                  overwrite=True, progress=progress))
    # rbf kernel SLEM: gamma 0.5 suits these L2-normalized rows (median squared
    # distance between negatives ~0.5); 256 rpcholesky pivots take a few passes.
    kernel_path = os.path.join(workdir, "kernel_model.zarr")
    reports.append(fit_job(client, f"{corpus_path}/negatives", kernel_path, lam=lam,
                           partition_rows=8192, overwrite=True, progress=progress,
                           kernel="rbf", gamma=0.5, rank=min(256, n_negatives),
                           pivoting="rpcholesky", tol=0.0, seed=seed))
    for name in ("database", "queries"):
        reports.append(encode_job(client, kernel_path, f"{corpus_path}/{name}",
                                  f"{corpus_path}/kslem_{name}", partition_rows=1024,
                                  overwrite=True, progress=progress))

    group = storage.open_node(corpus_path)
    db_labels = np.asarray(group["database_labels"][...])
    q_labels = np.asarray(group["query_labels"][...])
    relevant = [np.flatnonzero(db_labels == label) for label in q_labels]
    k = min(len(db_labels), 10_000)  # the whole ranking, as `slem-dask evaluate`
    rows = []
    for method, db_name, q_name in (("raw features", "database", "queries"),
                                    ("linear SLEM", "slem_database", "slem_queries"),
                                    ("rbf kernel SLEM", "kslem_database", "kslem_queries")):
        t = time.perf_counter()
        db = storage.dask_rows(storage.open_output(f"{corpus_path}/{db_name}"),
                               name="database")
        q = storage.read_all(f"{corpus_path}/{q_name}", "queries")
        if method == "raw features":  # cosine: the raw rows, L2-normalized
            raw = RawFeatures().fit(q)
            q, db = raw.transform(q), raw.transform(db)
        _, indices = _ranked(q, db, k)
        p_at, r_at = precision_recall_at_k(indices, relevant, group_size)
        rows.append({"method": method, "mAP": mean_average_precision(indices, relevant),
                     f"P@{group_size}": p_at, "search [s]": time.perf_counter() - t})
    return rows, reports

