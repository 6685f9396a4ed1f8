"""The estimators: one module per model, sharing :mod:`.base`."""

from .base import MODEL_CLASSES, NotFittedError, SLEMEstimator, load_model
from .kernel import KernelSLEM
from .esvm import ESVM
from .linear import LinearSLEM
from .raw import RawFeatures
from .whitening import PCAWhitening

__all__ = ["LinearSLEM", "KernelSLEM", "ESVM", "PCAWhitening", "RawFeatures",
           "SLEMEstimator", "NotFittedError", "load_model", "MODEL_CLASSES"]
