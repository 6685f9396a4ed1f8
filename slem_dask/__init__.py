"""slem-dask: square-loss exemplar machines for image retrieval, on Dask.

The library never starts a Dask client: it takes numpy or dask arrays, and the
dask paths stay lazy until the caller computes. Jobs and the ``slem-dask``
command line start or connect to a cluster (see :mod:`slem_dask.cluster.connect`).
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

from ._version import __version__

if _TYPE_CHECKING:  # what the lazy names below are, for type checkers (py.typed)
    from .models import (
        ESVM,
        KernelSLEM,
        LinearSLEM,
        NotFittedError,
        PCAWhitening,
        RawFeatures,
        load_model,
    )
    from .retrieval import (
        leave_one_out_map,
        make_map_scorer,
        map_scorer,
        mean_average_precision,
        precision_recall_at_k,
        search,
    )
    from .storage.nodes.readers import open_dataset, open_zarr

# The names below are imported on first use (PEP 562), not with the package: dask,
# zarr and scipy take most of a second to import, which `slem-dask --help` need not
# pay, and an interrupt during those imports then falls inside the command line's
# own handling (a one-line message, not a traceback).
_LAZY = {
    **dict.fromkeys(
        (
            "ESVM",
            "KernelSLEM",
            "LinearSLEM",
            "NotFittedError",
            "PCAWhitening",
            "RawFeatures",
            "load_model",
        ),
        ".models",
    ),
    **dict.fromkeys(
        (
            "leave_one_out_map",
            "make_map_scorer",
            "map_scorer",
            "mean_average_precision",
            "precision_recall_at_k",
            "search",
        ),
        ".retrieval",
    ),
    **dict.fromkeys(("open_zarr", "open_dataset"), ".storage.nodes.readers"),
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    try:  # a submodule (slem_dask.storage, ...), as an eager import would have bound it
        return _importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():  # the public names, loaded or not, and the module's dunders
    return sorted(
        n
        for n in set(globals()) | set(_LAZY)
        if not n.startswith("_") or n.startswith("__") and n.endswith("__")
    )


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
    "open_zarr",
    "open_dataset",
]
