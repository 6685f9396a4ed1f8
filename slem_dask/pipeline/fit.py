"""The fit job: a model from zarr negatives (linear statistics streamed blockwise; kernel
fits in :mod:`.kernel_fit`), saved as a new committed version of the model store."""

from __future__ import annotations

import time

from .. import storage
from ..cluster import workers
from ..storage import canonical
from ..models import KernelSLEM, LinearSLEM, load_model
from ..core.statistics import ScatterStats, merge_statistics
from ..parallel.blocks import (_sub_block_rows, locate_nonfinite_rows, merge_fan_in,
                        statistics_partition_rows, store_statistics)
from ..core.validation import (DEFAULT_LAM, DegenerateNegativesWarning, LambdaScaleWarning,
                          parse_lam)

from . import common
from .common import JobReport, _threads
from .fit_steps import (KERNEL_OPTIONS, _fit_errors, _open_negatives,
                        _save_fitted, _warnings_naming, check_same_params, model_bytes,
                        nothing_written)
from .kernel_fit import _fit_kernel_job


def fit_job(client, negatives: str, model_path: str, lam: float | str | None = None,
            theta: float = 1.0,
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

    ``lam``: a number (absolute) or "<c>x" (c times the negatives' tr(Sigma), linear
    only); None: the model's default ("0.01x" linear, 1e-3 kernel).
    """
    negatives, model_path = canonical(negatives), canonical(model_path)
    if lam is None and (update or repivot) and not overwrite:
        lam = _stored_lam(model_path)  # an update keeps the model's lambda, as it was given
    lam = kernel_lam(lam) if kernel is not None else DEFAULT_LAM if lam is None else lam
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
    if update and exists and not overwrite and _up_to_date(model_path, negatives, arr, model):
        # decided from the committed model alone: no lease taken, nothing written
        report = _fit_report(negatives, arr, model, "up to date", 0)
        report.facts["model"] = str(model_path)
        report.timings["total"] = time.perf_counter() - t0
        return report
    with common.full_disk_said(model_path, lambda: model_bytes(model, arr.shape[1]),
                               nothing_written(model_path)), \
            storage.Lease(model_path, "slem-dask fit") as lease:
        update = update and exists and not overwrite  # --overwrite --update: refit
        previous = _previous_statistics(model_path, negatives, arr, model) if update \
            else None
        start = previous.count if previous is not None else 0
        n = int(arr.shape[0])
        report = _fit_report(negatives, arr, model,
                             "update" if previous is not None else "fit", n - start)
        if previous is not None and start == n and \
                load_model(model_path).get_params() == model.get_params():
            report.facts["action"] = "up to date"
            report.facts["model"] = str(model_path)
            report.timings["total"] = time.perf_counter() - t0
            return report
        common.hint_small_chunks(report, arr, "negatives", negatives)
        seen = storage.rows_fingerprint(arr, negatives, "negatives", n)
        storage.check_workers_see(client, {"negatives": negatives})
        rows = storage.row_partition(arr, partition_rows)
        if partition_rows is None:
            rows = statistics_partition_rows(n - start, arr.shape[1], storage.unit_rows(arr),
                                             rows, _threads(client))
        report.facts["partitions"] = f"{-(-(n - start) // rows)} x {rows} rows"
        d = int(arr.shape[1])
        workers.check_memory(client, workers.Plan(
            "fit", "negatives", rows, d, str(arr.dtype), workers.fit_task_bytes(
                d, _sub_block_rows(arr, rows), arr.dtype, precision, merge_fan_in(d)),
            0.0, 0, storage.unit_rows(arr)), -(-(n - start) // rows), common.TASK_MODULES)
        t1 = time.perf_counter()
        with _fit_errors(negatives, model_path):
            stats = (common._compute(client, store_statistics(arr, rows, precision,
                                                              "negatives", start), progress)
                     if start < n else None)
            if previous is not None:
                stats = previous if stats is None else merge_statistics(previous, stats)
            t2 = time.perf_counter()
            with _warnings_naming(negatives, report,
                                  (DegenerateNegativesWarning, LambdaScaleWarning)):
                model._fit_statistics(stats, arr.dtype, lambda: locate_nonfinite_rows(
                    storage.dask_rows(arr, rows, name="negatives")[start:], client, start)[1])
        if parse_lam(lam)[1]:  # relative: the absolute value it meant for these negatives
            report.facts["lam"] = f"{lam} (= {model.lam_:.4g}: {lam[:-1]} x tr(Sigma))"
        fp = _save_fitted(model, arr, negatives, model_path, seen, lease)
    t3 = time.perf_counter()
    report.facts.update({"model": str(model_path), "fingerprint": fp[:16]})
    report.timings.update({"open": t1 - t0, "statistics": t2 - t1, "factor+save": t3 - t2,
                           "total": t3 - t0})
    return report


def _fit_report(negatives, arr, model, action: str, rows_read: int) -> JobReport:
    report = JobReport("fit")
    report.facts.update({
        "negatives": str(negatives), "rows": int(arr.shape[0]), "features": arr.shape[1],
        "dtype": str(arr.dtype), "lam": model.lam, "theta": model.theta,
        "precision": model.precision, "action": action, "rows read": rows_read,
    })
    return report


def _up_to_date(model_path, negatives, arr, model) -> bool:
    """Whether the committed model at ``model_path`` was fitted with ``model``'s
    parameters on exactly these rows of ``arr``, unchanged since: an update then has
    nothing to write. Read-only (a refusal raises as the job would under its lease)."""
    if storage.read_model_meta(model_path).get("n_samples") != int(arr.shape[0]):
        return False
    previous = _previous_statistics(model_path, negatives, arr, model)
    return previous.count == int(arr.shape[0]) and \
        load_model(model_path).get_params() == model.get_params()


#: Kernel SLEM's lambda when none is given (in the kernel's units: k(x, x) = 1 for rbf).
KERNEL_LAM = 1e-3


def kernel_lam(lam):
    """A kernel fit's lambda: a number; "<c>x" is linear SLEM's only."""
    if lam is None:
        return KERNEL_LAM
    c, relative = parse_lam(lam)
    if relative:
        raise ValueError(
            f"lam {lam!r}: a lambda relative to the negatives' total variance applies to "
            f"linear SLEM; kernel SLEM's is in the kernel's units (rbf: k(x, x) = 1): give a "
            f"number, e.g. --lam {KERNEL_LAM:g} (its default)")
    return c


def _stored_lam(model_path):
    """The lam a model at ``model_path`` was fitted with (None: no readable model): a
    model fitted when the default was the absolute 1e-3 keeps it on --update."""
    try:
        return (storage.read_model_meta(model_path).get("params") or {}).get("lam")
    except Exception:  # noqa: BLE001 - no model there: the fit says so itself
        return None


def _previous_statistics(model_path, negatives, arr, model) -> ScatterStats:
    """The statistics stored in a model, checked to be those of the first rows of ``arr``,
    unchanged since they were merged, and fitted with ``model``'s parameters."""
    meta = storage.read_model_meta(model_path)  # the arrays: load_model below
    old = load_model(model_path)
    if not isinstance(old, LinearSLEM):
        kernel_options = ""
        if meta["model"] == "KernelSLEM":
            p = meta.get("params") or {}
            kernel_options = " ".join(f"--{flag} {p[key]}" for key, flag in
                                      KERNEL_OPTIONS.items() if p.get(key) is not None)
        remedy = (f"give its kernel options to update it ({kernel_options} --update); "
                  f"--overwrite would replace it with a linear model" if kernel_options else
                  "pass --overwrite to replace it with a linear model")
        raise ValueError(f"--update without --kernel updates a LinearSLEM model; "
                         f"{str(model_path)!r} holds a {meta['model']}: {remedy}")
    check_same_params(model, meta, model_path, "--update")
    refused = common.update_refusal(model_path, meta, negatives, arr)
    if refused:
        raise ValueError(refused)
    now = storage.rows_fingerprint(arr, negatives, "negatives", old.n_samples_)
    if meta.get("negatives_fingerprint") != now:
        raise ValueError(
            f"--update: the first {old.n_samples_} rows of {str(negatives)!r}, already merged "
            f"into {str(model_path)!r}, changed since (rewritten, truncated or replaced); "
            f"merging would count old and new values: refit with --overwrite")
    return ScatterStats(old.n_samples_, old.mean_, old.covariance_ * old.n_samples_)
