"""The fit job: a model from zarr negatives (linear statistics streamed blockwise; kernel
fits in :mod:`.kernel_fit`), saved as a new committed version of the model store."""

from __future__ import annotations

import contextlib
import time
import warnings

from .. import integrity, storage, workers
from ..integrity import canonical
from ..models import KernelSLEM, LinearSLEM, load_model
from ..core.statistics import ScatterStats, merge_statistics
from ..parallel import (_sub_block_rows, locate_nonfinite_rows, merge_fan_in,
                        statistics_partition_rows, store_statistics)
from ..validation import (DEFAULT_LAM, DegenerateNegativesWarning, LambdaScaleWarning,
                          parse_lam)

from . import common
from .common import JobFailed, JobReport, _LOST, _detail, _lost_cluster, _threads


#: KernelSLEM parameters as `slem-dask fit` names them (--seed sets random_state): reports
#: and remedies speak the command line's names, the library keeps its own.
KERNEL_OPTIONS = {"kernel": "kernel", "gamma": "gamma", "degree": "degree", "lam": "lam",
                  "rank": "rank", "pivoting": "pivoting", "tol": "tol", "random_state": "seed"}


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
        from .kernel_fit import _fit_kernel_job  # it imports this module's helpers
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
            integrity.Lease(model_path, "slem-dask fit") as lease:
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
            0.0, 0, integrity.unit_rows(arr)), -(-(n - start) // rows), common.TASK_MODULES)
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
        raise _lost_cluster(exc, f"{nothing_written(model_path)}: run the same command "
                                 f"again") from None


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


def nothing_written(model_path) -> str:
    return f"no model was written ({str(model_path)!r} is as before)"


def model_bytes(model, d: int) -> int:
    """The bytes a model's store takes (its arrays; an estimate before it is fitted:
    a linear model holds two d x d float64 matrices)."""
    try:
        return int(sum(getattr(a, "nbytes", 0) for a in model._state()[1].values()))
    except Exception:  # noqa: BLE001 - not fitted yet
        return 2 * 8 * d * d + 8 * d


@contextlib.contextmanager
def _warnings_naming(negatives, report, category):
    """Warnings of ``category`` raised in the block, said once naming the negatives' store
    and kept in the report; other warnings pass as they were."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", category)
        yield
    for warning in caught:
        if issubclass(warning.category, category):
            warning.message = f"negatives {str(negatives)!r}: {warning.message}"
            report.facts["warning"] = warning.message
        warnings.warn(warning.message, warning.category, stacklevel=3)


def _save_fitted(model, arr, negatives, model_path, seen: str, lease) -> str:
    """Save a fitted model under the job's lease, unless its negatives changed while
    they were read (``seen``: their fingerprint before); return its fingerprint."""
    if integrity.rows_fingerprint(arr, negatives, "negatives", int(arr.shape[0])) != seen:
        raise JobFailed(
            f"the negatives {str(negatives)!r} changed while this fit read them; nothing "
            f"was written: run the fit again once the negatives are no longer being written")
    fp = model.save(model_path, overwrite=True, lease=lease,
                    metadata={"source": negatives.url, "negatives_fingerprint": seen,
                              "source_version": storage.read_version(arr, negatives, seen)})
    model._mark_fitted_on(seen)  # its identity: these negatives, not its last bits
    return fp


def _open_negatives(negatives, model_path, overwrite: bool, update: bool,
                    repivot: bool = False):
    """Checks shared by every fit, before any data is read: (zarr array, model exists).
    ``repivot`` (kernel): an update that reads all rows again, whatever the stored ones."""
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
    if exists and update and not (overwrite or repivot):  # from metadata: before a cluster
        refused = common.update_refusal(model_path, storage.read_model_meta(model_path),
                                        negatives, arr)
        if refused:
            raise ValueError(refused)
    return arr, exists


def check_same_params(model, meta: dict, model_path, flag: str) -> None:
    """Refuse to update a stored model with other parameters than its own (lam, theta,
    gamma ...; not the execution ones): the merged statistics would be saved under the
    new ones, and every output encoded with the stored model would no longer match it."""
    given = storage.json_params(model.get_params())
    stored = meta.get("params") or {}
    differ = {k: v for k, v in given.items()
              if k not in model._execution_params and stored.get(k) != v}
    if differ:
        diff = ", ".join(f"{k}: stored {stored.get(k)!r}, given {v!r}" for k, v in differ.items())
        raise FileExistsError(
            f"model store {str(model_path)!r} holds a {meta['model']} with other parameters "
            f"({diff}); {flag} keeps parameters: give the stored values, or pass --overwrite "
            f"to refit with the new ones")


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
    now = integrity.rows_fingerprint(arr, negatives, "negatives", old.n_samples_)
    if meta.get("negatives_fingerprint") != now:
        raise ValueError(
            f"--update: the first {old.n_samples_} rows of {str(negatives)!r}, already merged "
            f"into {str(model_path)!r}, changed since (rewritten, truncated or replaced); "
            f"merging would count old and new values: refit with --overwrite")
    return ScatterStats(old.n_samples_, old.mean_, old.covariance_ * old.n_samples_)
