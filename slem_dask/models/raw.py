"""Raw features as an estimator: the 'base features' row of the results tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.whitening import normalize_rows
from ..parallel.blocks import map_rows
from ..core.validation import Array, Rows, check_finite_rows, check_rows, is_dask_array
from .base import SLEMEstimator

if TYPE_CHECKING:
    from numpy.typing import DTypeLike
    from typing_extensions import Self

__all__ = ["RawFeatures"]


class RawFeatures(SLEMEstimator):
    """L2-normalized input descriptors, with the interface of the SLEM estimators.

    ``fit`` learns nothing from the negatives but their dimension (so that
    :meth:`transform` can check it, as for the other models).
    """

    _param_names = ()
    _outputs_are_inputs = True  # get_feature_names_out: the input names

    def fit(self, X: Rows, y: object = None) -> Self:
        X = check_rows(X, "X")
        if not is_dask_array(X):
            check_finite_rows(X, "X")
        self.n_samples_ = int(X.shape[0])
        self.n_features_in_ = int(X.shape[1])
        self.input_dtype_ = np.dtype(X.dtype).name
        return self

    def transform(self, X: Rows, dtype: DTypeLike | None = None) -> Array:
        """Each row of ``X`` divided by its L2 norm (numpy in/out, or lazy dask).

        ``dtype``: of the result (default: float64 for float64 rows, float32 for any other
        dtype, float16 and integers included: :func:`~slem_dask.core.validation.output_dtype`;
        computed in float64).
        """
        X = self._check_positives(X)
        dtype = self._output_dtype(X, dtype)
        if is_dask_array(X):
            return map_rows(normalize_rows, X, (), X.shape[1], dtype, "X", "raw-normalize")
        check_finite_rows(X, "X")
        return normalize_rows(X, dtype)

    def _state(self):
        info = {
            "n_samples": self.n_samples_,
            "n_features": self.n_features_in_,
            "input_dtype": self.input_dtype_,
        }
        return info, {}

    def _set_state(self, info, arrays):
        self.n_samples_ = int(info["n_samples"])
        self.n_features_in_ = int(info["n_features"])
        self.input_dtype_ = info["input_dtype"]
