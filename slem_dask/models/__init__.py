"""The estimators: one module per model, sharing :mod:`.base` (and its scikit-learn
protocol, :mod:`._estimator`); the kernel model's block tasks, dask graphs, parameter
checks and messages in its ``kernel_*`` sibling modules; classifiers in :mod:`.classify`."""

from typing import TYPE_CHECKING

from .base import MODEL_CLASSES, SLEMEstimator, load_model, model_width
from .kernel import KernelSLEM
from .esvm import ESVM
from .linear import LinearSLEM
from .raw import RawFeatures
from .whitening import PCAWhitening

if TYPE_CHECKING:  # NotFittedError is built on first use (__getattr__ below)
    from ._estimator import NotFittedError

__all__ = [
    "LinearSLEM",
    "KernelSLEM",
    "ESVM",
    "PCAWhitening",
    "RawFeatures",
    "SLEMEstimator",
    "NotFittedError",
    "load_model",
    "model_width",
    "MODEL_CLASSES",
]


def __getattr__(name: str):
    # NotFittedError is built on first use (see slem_dask.models._estimator)
    if name == "NotFittedError":
        from . import _estimator

        return _estimator.NotFittedError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
