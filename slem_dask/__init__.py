"""slem-dask: square-loss exemplar machines for image retrieval, on Dask.

The library never starts a Dask client: it takes numpy or dask arrays, and the
dask paths stay lazy until the caller computes. Jobs and the ``slem-dask``
command line start or connect to a cluster (see :mod:`slem_dask.cluster`).
"""

from ._version import __version__
from .models import (ESVM, KernelSLEM, LinearSLEM, NotFittedError, PCAWhitening,
                     RawFeatures, load_model)
from .retrieval import (leave_one_out_map, make_map_scorer, map_scorer,
                        mean_average_precision, precision_recall_at_k, search)

__all__ = [
    "__version__",
    "LinearSLEM",
    "KernelSLEM",
    "ESVM",
    "PCAWhitening",
    "RawFeatures",
    "NotFittedError",
    "load_model",
    "search",
    "mean_average_precision",
    "precision_recall_at_k",
    "leave_one_out_map",
    "make_map_scorer",
    "map_scorer",
]
