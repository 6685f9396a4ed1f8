"""The batch jobs: fit a model from zarr negatives, encode zarr positives, the demo.

Each job takes a connected ``distributed.Client`` (see :mod:`slem_dask.cluster.connect`),
validates everything it can from metadata before it reads or writes data, and
never leaves a model or output that looks complete after a failure.

One job a module: :mod:`.fit` (linear), :mod:`.kernel_fit`, :mod:`.encode`,
:mod:`.search`, :mod:`.demo`; :mod:`.common` holds the report, the compute loop and the errors;
:mod:`.options` the jobs' frozen options (:class:`FitOptions`, :class:`EncodeOptions`,
:class:`SearchOptions`).
"""

from .common import JobFailed, JobReport, _compute  # noqa: F401 - evaluate.py uses it
from .demo import demo_job
from .encode import check_encode_inputs, encode_job
from .fit import _open_negatives, fit_job  # noqa: F401 - the CLI checks before a cluster
from .options import EncodeOptions, FitOptions, SearchOptions
from .search import search_job

__all__ = [
    "fit_job",
    "encode_job",
    "search_job",
    "demo_job",
    "check_encode_inputs",
    "FitOptions",
    "EncodeOptions",
    "SearchOptions",
    "JobReport",
    "JobFailed",
]
