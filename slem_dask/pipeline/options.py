"""The options of the batch jobs: one small frozen object per job, checked when it is made.

A job takes what it computes from (an estimator, for the jobs that fit) and how it runs
(these options), in the style of dask-ml and rechunker::

    fit_job(client, "neg.zarr", "model.zarr", estimator=LinearSLEM(lam="0.01x"),
            options=FitOptions(update=True))
    encode_job(client, "model.zarr", "pos.zarr", "codes.zarr",
               options=EncodeOptions(dtype="float32", partition_rows=100_000))

The keyword form (``fit_job(client, neg, model, lam=0.1, overwrite=True)``) builds the
same objects. Each check raises one line naming the option, its value and what it takes.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

import numpy as np

from ..core.statistics import PRECISIONS

__all__ = ["FitOptions", "EncodeOptions", "SearchOptions", "ON_MODEL_CHANGE", "options_from"]

#: What an encode does with an output written with another model: refuse, or rebuild it.
ON_MODEL_CHANGE = ("fail", "reencode")


def _check_flags(options, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(options, name)
        if not isinstance(value, bool):
            raise TypeError(
                f"{type(options).__name__}.{name} must be True or False, got "
                f"{value!r} of type {type(value).__name__}"
            )


def _check_dtype(options) -> None:
    value = options.dtype
    if value is None:
        return
    try:
        floating = np.issubdtype(np.dtype(value), np.floating)
    except TypeError:  # not a dtype at all, e.g. "f8x"
        floating = False
    if not floating:
        raise ValueError(
            f"{type(options).__name__}.dtype must be a float dtype (float32 or float64) or "
            f"None (the positives', or an existing output's), got {value!r}"
        )


def _check_partition_rows(options) -> None:
    value = options.partition_rows
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(
            f"{type(options).__name__}.partition_rows must be an integer >= 1 "
            f"or None (rows per partition chosen from the store), got "
            f"{value!r}"
        )


@dataclass(frozen=True)
class FitOptions:
    """How a fit runs (what it fits is the estimator: ``LinearSLEM`` or ``KernelSLEM``).

    ``partition_rows``: rows per task (None: chosen from the store and the cluster);
    ``overwrite``: replace the model at the path; ``update``: merge the rows appended to
    the negatives since the stored model was fitted (with ``overwrite``: refit);
    ``repivot`` (kernel models; implies ``update``): refit a kernel model on all rows;
    ``progress``: progress bars.
    """

    partition_rows: int | None = None
    overwrite: bool = False
    update: bool = False
    repivot: bool = False
    progress: bool = False

    def __post_init__(self):
        _check_partition_rows(self)
        _check_flags(self, ("overwrite", "update", "repivot", "progress"))

    def replace(self, **changes) -> FitOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class EncodeOptions:
    """How an encode runs (see :func:`slem_dask.pipeline.encode_job`).

    ``dtype``: the output's float dtype (None: the positives', or an existing output's);
    ``partition_rows``: rows per partition and output chunk (None: from the store);
    ``overwrite``: encode again as a new version; ``on_model_change``: "fail" refuses an
    output written with another model, "reencode" rebuilds it; ``precision`` (linear
    models; None: the model's): "auto" or "float64"; ``progress``: progress bars.
    """

    dtype: str | None = None
    partition_rows: int | None = None
    overwrite: bool = False
    progress: bool = False
    on_model_change: str = "fail"
    precision: str | None = None

    def __post_init__(self):
        if self.on_model_change not in ON_MODEL_CHANGE:
            # the message encode_job has always given
            raise ValueError(
                f"on_model_change must be 'fail' or 'reencode', got {self.on_model_change!r}"
            )
        _check_dtype(self)
        _check_partition_rows(self)
        _check_flags(self, ("overwrite", "progress"))
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ValueError(
                f"EncodeOptions.precision must be one of {PRECISIONS} or None "
                f"(the model's), got {self.precision!r}"
            )

    def replace(self, **changes) -> EncodeOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class SearchOptions:
    """How a search runs (see :func:`slem_dask.pipeline.search_job`).

    ``k``: results per query (at most the database's rows); ``partition_rows``: rows
    per partition (None: from the store); ``overwrite``: replace a search result;
    ``force``: search encodings of different models; ``progress``: a progress bar;
    ``metric``: "ip" (inner product), "cosine" or "l2" (squared distance, nearest first).
    """

    k: int = 100
    partition_rows: int | None = None
    overwrite: bool = False
    force: bool = False
    progress: bool = False
    metric: str = "ip"

    def __post_init__(self):
        if isinstance(self.k, bool) or not isinstance(self.k, numbers.Integral) or self.k < 1:
            raise ValueError(
                f"SearchOptions.k must be an integer >= 1 (results per query), got {self.k!r}"
            )
        _check_partition_rows(self)
        _check_flags(self, ("overwrite", "force", "progress"))
        if self.metric not in ("ip", "cosine", "l2"):
            raise ValueError(
                f"SearchOptions.metric must be 'ip', 'cosine' or 'l2' (inner product, cosine "
                f"similarity, squared L2 distance), got {self.metric!r}"
            )

    def replace(self, **changes) -> SearchOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


def options_from(kind, options, **keywords):
    """A job's options: ``options`` when given (a ``kind``; each keyword then at its
    default), else ``kind(**keywords)``: the keyword form of the jobs builds them."""
    if options is None:
        return kind(**keywords)
    if not isinstance(options, kind):
        raise TypeError(
            f"options must be of type {kind.__name__}, got {options!r} of type "
            f"{type(options).__name__}: build one with {kind.__name__}(...)"
        )
    defaults = kind()
    for name, value in keywords.items():
        if value != getattr(defaults, name):
            raise ValueError(
                f"{name}={value!r} was given beside options=: give it in the "
                f"{kind.__name__} (options.replace({name}={value!r})), or give "
                f"keywords without options="
            )
    return options
