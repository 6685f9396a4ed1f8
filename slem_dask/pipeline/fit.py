"""The fit job: a model from zarr negatives (linear statistics streamed blockwise; kernel
fits in :mod:`.kernel_fit`), saved as a new committed version of the model store."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .. import storage
from ..cluster import workers
from ..models import KernelSLEM, LinearSLEM, load_model
from ..models.kernel_defaults import KERNEL_DEFAULTS
from ..core.kernels import unused_params
from ..core.statistics import ScatterStats, merge_statistics
from ..parallel.blocks import (
    _sub_block_rows,
    locate_nonfinite_rows,
    merge_fan_in,
    statistics_partition_rows,
    store_statistics,
)
from ..core.validation import DEFAULT_LAM, DegenerateNegativesWarning, LambdaScaleWarning, parse_lam

from . import common
from .common import JobReport, _threads
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
from .kernel_fit import _fit_kernel_job
from .options import FitOptions, options_from


#: The model keywords of :func:`fit_job` and their defaults: with ``estimator=`` given,
#: each must stay at its default (the estimator carries them).
MODEL_KEYWORDS = {
    "lam": None,
    "theta": 1.0,
    "kernel": None,
    **{name: KERNEL_DEFAULTS[name] for name in ("gamma", "degree", "rank", "pivoting", "tol")},
    "seed": KERNEL_DEFAULTS["random_state"],
    "precision": "auto",
    "kernel_memory": "auto",
}


def fit_job(
    client,
    negatives: str,
    model_path: str,
    lam: float | str | None = None,
    theta: float = 1.0,
    partition_rows: int | None = None,
    overwrite: bool = False,
    progress: bool = False,
    update: bool = False,
    kernel: str | None = None,
    gamma: float | str = KERNEL_DEFAULTS["gamma"],
    degree: int = KERNEL_DEFAULTS["degree"],
    rank: int | None = KERNEL_DEFAULTS["rank"],
    pivoting: str = KERNEL_DEFAULTS["pivoting"],
    tol: float = KERNEL_DEFAULTS["tol"],
    seed: int | None = KERNEL_DEFAULTS["random_state"],
    precision: str = "auto",
    kernel_memory: str = "auto",
    repivot: bool = False,
    *,
    estimator=None,
    options: FitOptions | None = None,
) -> JobReport:
    """Fit a LinearSLEM on the zarr array ``negatives`` and save it to ``model_path``.

    The library form: ``estimator`` (a :class:`LinearSLEM` or :class:`KernelSLEM`,
    fitted in place and saved) and ``options`` (a :class:`FitOptions`: partition_rows,
    overwrite, update, repivot, progress). The keywords are a convenience that builds
    both (give either the keywords or the objects):

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
    only); None: the model's default ("0.01x" linear, 1e-3 kernel; an update keeps the
    stored model's).
    """
    options = _fit_options(options, partition_rows, overwrite, update, repivot, progress)
    negatives, model_path = storage.canonical(negatives), storage.canonical(model_path)
    keywords = _model_keywords(
        lam, theta, kernel, gamma, degree, rank, pivoting, tol, seed, precision, kernel_memory
    )
    if estimator is None:
        estimator = estimator_from(model_path, options, **keywords)
    else:
        _check_no_model_keywords(estimator, keywords)
    return fit_model(client, negatives, model_path, estimator, options)


def _fit_options(options, partition_rows, overwrite, update, repivot, progress) -> FitOptions:
    """``options``, or the FitOptions that :func:`fit_job`'s keywords build."""
    return options_from(
        FitOptions,
        options,
        partition_rows=partition_rows,
        overwrite=overwrite,
        update=update,
        repivot=repivot,
        progress=progress,
    )


def _model_keywords(
    lam, theta, kernel, gamma, degree, rank, pivoting, tol, seed, precision, kernel_memory
) -> dict:
    """:func:`fit_job`'s keywords that build (or would conflict with) the estimator."""
    return {
        "lam": lam,
        "theta": theta,
        "kernel": kernel,
        "gamma": gamma,
        "degree": degree,
        "rank": rank,
        "pivoting": pivoting,
        "tol": tol,
        "seed": seed,
        "precision": precision,
        "kernel_memory": kernel_memory,
    }


def estimator_from(
    model_path,
    options: FitOptions,
    lam=None,
    kernel=None,
    theta=1.0,
    precision="auto",
    kernel_memory="auto",
    **kernel_params,
):
    """The estimator :func:`fit_job`'s keywords describe: a KernelSLEM with ``kernel``
    (``kernel_params``: gamma, degree, rank, pivoting, tol, seed), else a LinearSLEM.
    ``lam=None``: an update keeps the stored model's lambda, as it was given."""
    if lam is None and (options.update or options.repivot) and not options.overwrite:
        lam = _stored_lam(model_path)
    lam = kernel_lam(lam) if kernel is not None else DEFAULT_LAM if lam is None else lam
    if kernel is not None:
        seed = kernel_params.pop("seed")
        return KernelSLEM(
            kernel=kernel, lam=lam, random_state=seed, strategy=kernel_memory, **kernel_params
        )
    if options.repivot or kernel_memory != "auto":
        raise ValueError(
            f"{'repivot' if options.repivot else f'kernel_memory={kernel_memory!r}'}"
            f" applies to kernel models only (give kernel=...), not to a linear "
            f"SLEM, whose fit always streams its negatives"
        )
    return LinearSLEM(lam=lam, theta=theta, precision=precision)


#: :func:`fit_job`'s model keywords that the estimators name otherwise.
ESTIMATOR_PARAMS = {"seed": "random_state", "kernel_memory": "strategy"}


def _check_no_model_keywords(estimator, keywords: dict) -> None:
    """With ``estimator`` given, the model keywords must be at their defaults; the fix
    names the estimator's own parameter, or says that it has none of that kind."""
    kind = type(estimator).__name__
    for name, value in keywords.items():
        if value == MODEL_KEYWORDS[name]:
            continue
        param = ESTIMATOR_PARAMS.get(name, name)
        if param not in estimator.get_params():
            raise ValueError(
                f"{name}={value!r} was given beside estimator={kind}(...), which takes no "
                f"{param}: drop it"
            )
        raise ValueError(
            f"{name}={value!r} was given beside estimator={kind}(...): set it on the "
            f"estimator (e.g. {kind}(..., {param}=...)), or give keywords without estimator="
        )


def fit_model(
    client, negatives, model_path, estimator, options: FitOptions | None = None
) -> JobReport:
    """Fit ``estimator`` (a LinearSLEM or KernelSLEM, fitted in place) on the zarr
    negatives and save it as a new version of ``model_path``: :func:`fit_job`'s work,
    its paths canonical."""
    options = options if options is not None else FitOptions()
    negatives, model_path = storage.canonical(negatives), storage.canonical(model_path)
    if isinstance(estimator, KernelSLEM):
        return _fit_kernel_job(client, negatives, model_path, estimator, options)
    if not isinstance(estimator, LinearSLEM):
        raise TypeError(
            f"estimator must be a LinearSLEM or a KernelSLEM, got "
            f"{estimator!r} of type {type(estimator).__name__}"
        )
    if options.repivot:  # the keyword form said so already (estimator_from): an estimator
        raise ValueError(
            "repivot applies to kernel models only (estimator=KernelSLEM(...)), not to "
            "a linear SLEM, whose fit always streams its negatives: drop it from the FitOptions"
        )
    return _fit_linear(client, negatives, model_path, estimator, options)


@dataclass(frozen=True)
class StatisticsPlan:
    """The partitions a linear fit reads: rows ``start`` to ``n`` of the negatives in
    partitions of ``rows``, and what one task needs (for the workers' memory check)."""

    start: int
    n: int
    rows: int
    memory: workers.Plan

    @property
    def n_parts(self) -> int:
        return -(-(self.n - self.start) // self.rows)


def plan_statistics(
    arr, start: int, partition_rows: int | None, threads, precision: str
) -> StatisticsPlan:
    """The plan of a linear fit's statistics pass from the negatives' metadata (pure:
    reads no rows). ``threads``: the cluster's threads, asked only when the store's
    partitioning is chosen here (a callable)."""
    n, d = int(arr.shape[0]), int(arr.shape[1])
    rows = storage.row_partition(arr, partition_rows)
    if partition_rows is None:
        rows = statistics_partition_rows(n - start, d, storage.unit_rows(arr), rows, threads())
    memory = workers.Plan(
        "fit",
        "negatives",
        rows,
        d,
        str(arr.dtype),
        workers.fit_task_bytes(
            d, _sub_block_rows(arr, rows), arr.dtype, precision, merge_fan_in(d)
        ),
        0.0,
        0,
        storage.unit_rows(arr),
    )
    return StatisticsPlan(start, n, rows, memory)


def _fit_linear(client, negatives, model_path, model: LinearSLEM, options: FitOptions) -> JobReport:
    """A LinearSLEM fitted (or updated) on the zarr negatives, saved under the lease."""
    t0 = time.perf_counter()
    model._check_params()
    arr, exists = _open_negatives(negatives, model_path, options.overwrite, options.update)
    if (
        options.update
        and exists
        and not options.overwrite
        and _up_to_date(model_path, negatives, arr, model)
    ):
        # decided from the committed model alone: no lease taken, nothing written
        return _linear_up_to_date(negatives, arr, model, model_path, t0)
    with (
        common.full_disk_said(
            model_path, lambda: model_bytes(model, arr.shape[1]), nothing_written(model_path)
        ),
        storage.VersionedStore(model_path).transaction("slem-dask fit") as tx,
    ):
        update = options.update and exists and not options.overwrite  # both: refit
        previous = _previous_statistics(model_path, negatives, arr, model) if update else None
        start = previous.count if previous is not None else 0
        n = int(arr.shape[0])
        if (
            previous is not None
            and start == n
            and load_model(model_path).get_params() == model.get_params()
        ):
            return _linear_up_to_date(negatives, arr, model, model_path, t0)
        report = _fit_report(
            negatives, arr, model, "update" if previous is not None else "fit", n - start
        )
        # the warning points at fit_job's caller (via fit_model and _fit_linear)
        common.hint_small_chunks(report, arr, "negatives", negatives, stacklevel=5)
        seen = storage.rows_fingerprint(arr, negatives, "negatives", n)
        storage.check_workers_see(client, {"negatives": negatives})
        plan = plan_statistics(
            arr, start, options.partition_rows, lambda: _threads(client), model.precision
        )
        report.facts["partitions"] = f"{plan.n_parts} x {plan.rows} rows"
        workers.check_memory(client, plan.memory, plan.n_parts, common.TASK_MODULES)
        t1 = time.perf_counter()
        t2 = _fit_from_statistics(
            client, model, arr, negatives, model_path, plan, previous, report, options.progress
        )
        fp = _save_fitted(model, arr, negatives, model_path, seen, tx)
    t3 = time.perf_counter()
    report.facts.update(
        {"model": str(model_path), "fingerprint": fp[:16], "model identity": model.identity_[:16]}
    )
    report.timings.update(
        {"open": t1 - t0, "statistics": t2 - t1, "factor+save": t3 - t2, "total": t3 - t0}
    )
    report.split_lease_wait(tx)
    return report


def _fit_from_statistics(
    client,
    model,
    arr,
    negatives,
    model_path,
    plan: StatisticsPlan,
    previous,
    report: JobReport,
    progress: bool,
) -> float:
    """The statistics of the rows the plan reads (merged into ``previous``, if any),
    and ``model`` fitted on them; returns when the statistics were done."""
    start, n, rows = plan.start, plan.n, plan.rows
    with _fit_errors(negatives, model_path):
        stats = (
            common._compute(
                client, store_statistics(arr, rows, model.precision, "negatives", start), progress
            )
            if start < n
            else None
        )
        if previous is not None:
            stats = previous if stats is None else merge_statistics(previous, stats)
        t2 = time.perf_counter()
        with _warnings_naming(negatives, report, (DegenerateNegativesWarning, LambdaScaleWarning)):
            model._fit_statistics(
                stats,
                arr.dtype,
                lambda: locate_nonfinite_rows(
                    storage.dask_rows(arr, rows, name="negatives")[start:], client, start
                )[1],
            )
    lam = model.lam
    if parse_lam(lam)[1]:  # relative: the absolute value it meant for these negatives
        report.facts["lam"] = f"{lam} (= {model.lam_:.4g}: {lam[:-1]} x tr(Sigma))"
    return t2


def _linear_up_to_date(negatives, arr, model, model_path, t0: float) -> JobReport:
    """The report of an update with nothing to write."""
    report = _fit_report(negatives, arr, model, "up to date", 0)
    report.facts["model"] = str(model_path)
    report.timings["total"] = time.perf_counter() - t0
    return report


def _fit_report(negatives, arr, model, action: str, rows_read: int) -> JobReport:
    return fit_report(
        negatives,
        arr,
        {
            "lam": model.lam,
            "theta": model.theta,
            "precision": model.precision,
            "action": action,
            "rows read": rows_read,
        },
    )


def _up_to_date(model_path, negatives, arr, model) -> bool:
    """Whether the committed model at ``model_path`` was fitted with ``model``'s
    parameters on exactly these rows of ``arr``, unchanged since: an update then has
    nothing to write. Read-only (a refusal raises as the job would under its lease)."""
    if storage.read_model_meta(model_path).get("n_samples") != int(arr.shape[0]):
        return False
    previous = _previous_statistics(model_path, negatives, arr, model)
    return (
        previous.count == int(arr.shape[0])
        and load_model(model_path).get_params() == model.get_params()
    )


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
            f"number, e.g. --lam {KERNEL_LAM:g} (its default)"
        )
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
            # a parameter the kernel ignores is named only where it is not the default
            # (the update must give the stored value, but it changes nothing)
            unused = [k for k in unused_params(p.get("kernel")) if p.get(k) == MODEL_KEYWORDS[k]]
            kernel_options = " ".join(
                f"--{flag} {p[key]}"
                for key, flag in KERNEL_OPTIONS.items()
                if p.get(key) is not None and key not in unused
            )
        remedy = (
            f"give its kernel options to update it ({kernel_options} --update); "
            f"--overwrite would replace it with a linear model"
            if kernel_options
            else "pass --overwrite to replace it with a linear model"
        )
        raise ValueError(
            f"--update without --kernel updates a LinearSLEM model; "
            f"{str(model_path)!r} holds a {meta['model']}: {remedy}"
        )
    check_same_params(model, meta, model_path, "--update")
    refused = common.update_refusal(model_path, meta, negatives, arr)
    if refused:
        raise ValueError(refused)
    now = storage.rows_fingerprint(arr, negatives, "negatives", old.n_samples_)
    if meta.get("negatives_fingerprint") != now:
        raise ValueError(
            f"--update: the first {old.n_samples_} rows of {str(negatives)!r}, already merged "
            f"into {str(model_path)!r}, changed since (rewritten, truncated or replaced); "
            f"merging would count old and new values: refit with --overwrite"
        )
    return ScatterStats(old.n_samples_, old.mean_, old.covariance_ * old.n_samples_)
