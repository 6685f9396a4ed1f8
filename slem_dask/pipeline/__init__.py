"""The batch jobs: fit a model from zarr negatives, encode zarr positives, search and
evaluate encodings, run a job spec, the demo.

Each job takes a connected ``distributed.Client`` (see :mod:`slem_dask.cluster.connect`;
None: dask's local scheduler), validates everything it can from metadata before it reads
or writes data, and never leaves a model or output that looks complete after a failure.

One job a module: :mod:`.fit` (linear; its shared steps in :mod:`.fit_steps`),
:mod:`.kernel_fit`, :mod:`.encode` (its plan in :mod:`.encode_plan`, its writes in
:mod:`.encode_write`), :mod:`.search`, :mod:`.evaluate` (the protocol it runs in
:mod:`.evaluation`), :mod:`.jobspec` (``slem-dask run``), :mod:`.demo`; :mod:`.common`
holds the report, the compute loop and the errors; :mod:`.options` the jobs' frozen
options (:class:`FitOptions`, :class:`EncodeOptions`, :class:`SearchOptions`).
"""

from .common import JobFailed, JobReport
from .demo import demo_job
from .encode import check_encode_inputs, encode_job, load_encoding_model
from .fit import _open_negatives, fit_job  # noqa: F401 - the CLI checks before a cluster
from .options import EncodeOptions, FitOptions, SearchOptions
from .search import search_job

__all__ = [
    "fit_job",
    "encode_job",
    "search_job",
    "demo_job",
    "check_encode_inputs",
    "load_encoding_model",
    "FitOptions",
    "EncodeOptions",
    "SearchOptions",
    "JobReport",
    "JobFailed",
]
