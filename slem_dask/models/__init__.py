"""The estimators: one module per model, sharing :mod:`.base`."""

from .base import MODEL_CLASSES, NotFittedError, SLEMEstimator, load_model
from .kernel import KernelSLEM
from .linear import LinearSLEM

__all__ = ["LinearSLEM", "KernelSLEM", "SLEMEstimator", "NotFittedError", "load_model",
           "MODEL_CLASSES"]
