"""PCA whitening learned on the negatives (the 'PCA + whitening' baseline)."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

import dask
import numpy as np

from ..core.statistics import array_statistics, covariance
from ..core.whitening import pca_whitening, whiten_rows
from ..parallel.blocks import locate_nonfinite_rows, map_rows, scatter_statistics, shared
from ..core.validation import (
    Array,
    Rows,
    check_finite_rows,
    check_positive_float,
    check_rows,
    is_dask_array,
    nonfinite_rows_error,
)
from .base import SLEMEstimator

if TYPE_CHECKING:
    from numpy.typing import DTypeLike
    from typing_extensions import Self

__all__ = ["PCAWhitening"]

#: Bytes of float64 rows per block of a numpy fit (core.statistics.array_statistics).
_NUMPY_BLOCK_BYTES = 64 * 2**20


class PCAWhitening(SLEMEstimator):
    """PCA whitening: x -> normalize(diag(s + eps)^-1/2 V^T (x - mu)).

    Parameters
    ----------
    n_components : int or None
        Number of principal directions kept (None: all d).
    eps : float > 0
        Added to each variance before the inverse square root; it bounds the
        gain on directions the negatives barely vary along (for L2-normalized
        descriptors the variances are well below 1).

    Attributes (after ``fit``)
    --------------------------
    mean_ (d,), components_ (d, k), explained_variance_ (k,), projection_ (d, k),
    n_samples_, n_features_in_, n_components_, input_dtype_.
    """

    _param_names = ("n_components", "eps")
    _n_outputs_attribute = "n_components_"  # outputs pcawhitening0 ... (get_feature_names_out)

    def __init__(self, n_components: int | None = None, eps: float = 1e-6):
        self.n_components = n_components
        self.eps = eps

    def _check_params(self, d: int | None = None) -> None:
        check_positive_float(self.eps, "eps", "; e.g. 1e-6 for L2-normalized descriptors")
        k = self.n_components
        if k is None:
            return
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"n_components must be None or an integer >= 1, got {k!r}")
        if d is not None and k > d:
            raise ValueError(
                f"n_components={k} is larger than the number of features d={d}; use "
                f"n_components <= {d}, or None to keep all"
            )

    def fit(self, X: Rows, y: object = None) -> Self:
        """Learn mu and the eigen-decomposition of Sigma from the negatives ``X``.

        Uses the same blockwise statistics as :class:`LinearSLEM` (one
        ``dask.compute`` for a dask ``X``).
        """
        self._check_params()
        X = check_rows(X, "X", min_rows=2)
        self._check_params(X.shape[1])
        if is_dask_array(X):
            (stats,) = dask.compute(scatter_statistics(X))
        else:
            stats = array_statistics(X, block_bytes=_NUMPY_BLOCK_BYTES)
        if stats.nonfinite:
            raise nonfinite_rows_error(
                "X", stats.nonfinite, locate_nonfinite_rows(X)[1], stats.count + stats.nonfinite
            )
        components, variances, projection = pca_whitening(
            covariance(stats), self.n_components, float(self.eps)
        )
        self.mean_ = stats.mean
        self.components_ = components
        self.explained_variance_ = variances
        self.projection_ = projection
        self.n_samples_ = int(stats.count)
        self.n_features_in_ = int(stats.n_features)
        self.n_components_ = int(components.shape[1])
        self.input_dtype_ = np.dtype(X.dtype).name
        return self

    def transform(self, X: Rows, dtype: DTypeLike | None = None) -> Array:
        """Whitened, L2-normalized rows (n_p, n_components_); numpy or lazy dask.

        ``dtype``: of the result (default: float64 for float64 rows, float32 for any other
        dtype, float16 and integers included: :func:`~slem_dask.core.validation.output_dtype`;
        computed in float64).
        """
        X = self._check_positives(X)
        dtype = self._output_dtype(X, dtype)
        if is_dask_array(X):
            return map_rows(
                whiten_rows,
                X,
                (shared(self.mean_), shared(self.projection_)),
                self.n_components_,
                dtype,
                "X",
                "pca-whiten",
            )
        check_finite_rows(X, "X")
        return whiten_rows(X, self.mean_, self.projection_, dtype)

    def _state(self):
        info = {
            "n_samples": self.n_samples_,
            "n_features": self.n_features_in_,
            "input_dtype": self.input_dtype_,
        }
        return info, {
            "mean": self.mean_,
            "components": self.components_,
            "explained_variance": self.explained_variance_,
        }

    def _set_state(self, info, arrays):
        self.mean_ = arrays["mean"]
        self.components_ = arrays["components"]
        self.explained_variance_ = arrays["explained_variance"]
        self.projection_ = self.components_ / np.sqrt(self.explained_variance_ + float(self.eps))
        self.n_samples_ = int(info["n_samples"])
        self.n_features_in_ = int(info["n_features"])
        self.n_components_ = int(self.components_.shape[1])
        self.input_dtype_ = info["input_dtype"]
