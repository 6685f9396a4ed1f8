"""Steps every fit job takes, linear (:mod:`.fit`) or kernel (:mod:`.kernel_fit`): the
checks before a fit reads data, its errors and warnings said once naming the negatives,
and the save under the job's lease. Both fit modules import this one, and it imports
neither, so that ``fit_job`` can hand a kernel fit to :mod:`.kernel_fit` at module level.
"""

from __future__ import annotations

import contextlib
import warnings

from .. import storage

from . import common
from .common import JobFailed, JobReport, _LOST, _detail, _lost_cluster

#: KernelSLEM parameters as `slem-dask fit` names them (--seed sets random_state): reports
#: and remedies speak the command line's names, the library keeps its own.
KERNEL_OPTIONS = {
    "kernel": "kernel",
    "gamma": "gamma",
    "degree": "degree",
    "lam": "lam",
    "rank": "rank",
    "pivoting": "pivoting",
    "tol": "tol",
    "random_state": "seed",
}


@contextlib.contextmanager
def _fit_errors(negatives, model_path):
    """A fit's compute errors, said once: bad rows name the negatives, a lost cluster
    says that the model is as before; damaged chunks already name themselves."""
    try:
        yield
    except storage.DamagedStoreError:
        raise
    except ValueError as exc:  # e.g. NaN rows, negative histogram values: say which input
        raise ValueError(f"negatives {str(negatives)!r}: {_detail(exc, negatives)}") from None
    except _LOST as exc:
        raise _lost_cluster(
            exc, f"{nothing_written(model_path)}: run the same command again"
        ) from None


def fit_report(negatives, arr, facts: dict) -> JobReport:
    """A fit job's report (linear or kernel): its negatives, their rows, features and
    dtype first, then ``facts``."""
    report = JobReport("fit")
    report.facts.update(
        {
            "negatives": str(negatives),
            "rows": int(arr.shape[0]),
            "features": arr.shape[1],
            "dtype": str(arr.dtype),
            **facts,
        }
    )
    return report


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
        # at fit_job's caller: this generator, contextlib's __exit__, the step with the
        # block, the linear or kernel fit, fit_model, fit_job
        warnings.warn(warning.message, warning.category, stacklevel=7)


def _save_fitted(model, arr, negatives, model_path, seen: str, tx) -> str:
    """Save a fitted model in the job's transaction ``tx`` (under its lease), unless its negatives changed while
    they were read (``seen``: their fingerprint before); return its fingerprint."""
    if storage.rows_fingerprint(arr, negatives, "negatives", int(arr.shape[0])) != seen:
        raise JobFailed(
            f"the negatives {str(negatives)!r} changed while this fit read them; nothing "
            f"was written: run the fit again once the negatives are no longer being written"
        )
    fp = model.save(
        model_path,
        overwrite=True,
        transaction=tx,
        metadata={
            "source": negatives.url,
            "negatives_fingerprint": seen,
            "source_version": storage.read_version(arr, negatives, seen),
        },
    )
    model._mark_fitted_on(seen)  # its identity: these negatives, not its last bits
    return fp


def _open_negatives(negatives, model_path, overwrite: bool, update: bool, repivot: bool = False):
    """Checks shared by every fit, before any data is read: (zarr array, model exists).
    ``repivot`` (kernel): an update that reads all rows again, whatever the stored ones."""
    negatives, model_path = storage.canonical(negatives), storage.canonical(model_path)
    storage.check_distinct(model_path, "--model", {"negatives": negatives})
    exists = storage._exists(model_path)
    if exists:
        storage.check_may_replace(model_path, "model store", kind="model")
    if exists and not (overwrite or update):
        raise FileExistsError(_exists_message(model_path, negatives))
    arr = storage.open_input(negatives, "negatives")
    if arr.shape[0] < 2:
        raise ValueError(
            f"negatives: {str(negatives)!r} has shape {arr.shape}; at least 2 rows are needed"
        )
    if exists and update and not (overwrite or repivot):  # from metadata: before a cluster
        refused = common.update_refusal(
            model_path, storage.read_model_meta(model_path), negatives, arr
        )
        if refused:
            raise ValueError(refused)
    return arr, exists


def _exists_message(model_path, negatives) -> str:
    """The refusal of a fit into an existing model store, with the flag that fits what
    it holds: --update for a model of these negatives, --overwrite for one of others."""
    said = f"model store {str(model_path)!r} already exists"
    try:
        source = storage.read_model_meta(model_path).get("source")
    except Exception:  # noqa: BLE001 - not a readable model: what is said stands alone
        source = None
    if source is not None and source != negatives.url:
        return (
            f"{said}, fitted on {storage.shown_path(source)!r}, not on {str(negatives)!r}; "
            f"pass --overwrite to replace it with a fit on these negatives"
        )
    if source is not None:
        return (
            f"{said}, fitted on these negatives; pass --update to add the rows appended "
            f"since (it says 'up to date' when there are none), or --overwrite to fit again"
        )
    return (
        f"{said}; pass --overwrite to replace it, or --update to add the negatives "
        f"appended since it was fitted"
    )


def check_same_params(model, meta: dict, model_path, flag: str) -> None:
    """Refuse to update a stored model with other parameters than its own (lam, theta,
    gamma ...; not the execution ones): the merged statistics would be saved under the
    new ones, and every output encoded with the stored model would no longer match it."""
    given = storage.json_params(model.get_params())
    stored = meta.get("params") or {}
    differ = {
        k: v for k, v in given.items() if k not in model._execution_params and stored.get(k) != v
    }
    if differ:
        diff = ", ".join(f"{k}: stored {stored.get(k)!r}, given {v!r}" for k, v in differ.items())
        raise FileExistsError(
            f"model store {str(model_path)!r} holds a {meta['model']} with other parameters "
            f"({diff}); {flag} keeps parameters: give the stored values, or pass --overwrite "
            f"to refit with the new ones"
        )
