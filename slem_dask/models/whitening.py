"""PCA whitening learned on the negatives (the 'PCA + whitening' baseline)."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

import dask
import numpy as np

from ..core.statistics import array_statistics, covariance
from ..core.whitening import (
    complement_projection,
    components_from_gram,
    gram_eigen,
    pca_whitening,
    whiten_rows,
)
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
    from collections.abc import Callable

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
        n, d = X.shape
        self._check_params(d)
        self.complement_scale_ = 0.0
        self._complement_projection = None
        if n < d and (self.n_components is None or self.n_components < n):
            mean, (components, variances, projection) = self._fit_gram(X)
        else:
            mean, (components, variances, projection) = self._fit_covariance(X)
        self.mean_ = mean
        self.components_ = components
        self.explained_variance_ = variances
        self.projection_ = projection
        self.n_samples_ = int(n)
        self.n_features_in_ = int(d)
        self.n_components_ = int(d if self.n_components is None else self.n_components)
        if self.n_components_ > components.shape[1]:  # Sigma's null space: whitened too
            self.complement_scale_ = 1.0 / np.sqrt(float(self.eps))
        self.input_dtype_ = np.dtype(X.dtype).name
        return self

    def _fit_covariance(self, X):
        """(mean, components) from the d x d covariance (Chan statistics)."""
        if is_dask_array(X):
            (stats,) = dask.compute(scatter_statistics(X))
        else:
            stats = array_statistics(X, block_bytes=_NUMPY_BLOCK_BYTES)
        if stats.nonfinite:
            raise nonfinite_rows_error(
                "X", stats.nonfinite, locate_nonfinite_rows(X)[1], stats.count + stats.nonfinite
            )
        return stats.mean, pca_whitening(covariance(stats), self.n_components, float(self.eps))

    def _fit_gram(self, X):
        """(mean, components) from the n x n Gram matrix of the centred negatives, when
        there are fewer of them than features (docs/math.md#whitening): n^2 d to form
        it, an n x n eigendecomposition, n d r for the components, instead of n d^2
        and a d x d one (d = 8192, n = 3,000: minutes to seconds)."""
        n = X.shape[0]
        # n x d <= d x d: the rows in this process take no more memory than the
        # covariance would (a dask graph would ship U, n x n, to every task)
        rows = np.array(_as_numpy(X), dtype=np.float64, copy=True)
        mean = rows.mean(axis=0)
        if not np.all(np.isfinite(mean)):  # a NaN or inf in any row reaches the mean
            count, shown = locate_nonfinite_rows(X)
            if count:
                raise nonfinite_rows_error("X", count, shown, n)
            return self._fit_covariance(X)  # finite rows whose sum overflows
        rows -= mean
        variances, vectors = gram_eigen(rows @ rows.T, n, self.n_components)
        product = rows.T @ vectors
        return mean, components_from_gram(product, variances, n, float(self.eps))

    def transform(self, X: Rows, dtype: DTypeLike | None = None) -> Array:
        """Whitened, L2-normalized rows (n_p, n_components_); numpy or lazy dask.

        ``dtype``: of the result (default: float64 for float64 rows, float32 for any other
        dtype, float16 and integers included: :func:`~slem_dask.core.validation.output_dtype`;
        computed in float64).
        """
        X = self._check_positives(X)
        dtype = self._output_dtype(X, dtype)
        args: tuple = (self.mean_, self._whitening_projection())
        func: Callable[..., np.ndarray] = whiten_rows
        if self.complement_scale_:
            args, func = (*args, self.components_, self.complement_scale_), _whiten_complement
        if is_dask_array(X):
            shipped = tuple(shared(a) if isinstance(a, np.ndarray) else a for a in args)
            return map_rows(func, X, shipped, self.n_components_, dtype, "X", "pca-whiten")
        check_finite_rows(X, "X")
        return np.asarray(func(X, *args), dtype=dtype)

    def _whitening_projection(self) -> np.ndarray:
        """The matrix each centred row is multiplied by: ``projection_``, or with Sigma's
        null space whitened too, V (diag(s + eps)^-1/2 - eps^-1/2) (cached: it depends
        on the model alone)."""
        if not self.complement_scale_:
            return self.projection_
        cached = getattr(self, "_complement_projection", None)
        if cached is None:
            cached = complement_projection(
                self.components_, self.explained_variance_, float(self.eps)
            )
            self._complement_projection = cached
        return cached

    def _state(self):
        info = {
            "n_samples": self.n_samples_,
            "n_features": self.n_features_in_,
            "input_dtype": self.input_dtype_,
            "n_components": self.n_components_,
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
        self.n_components_ = int(info.get("n_components", self.components_.shape[1]))
        self.complement_scale_ = (
            1.0 / np.sqrt(float(self.eps))
            if self.n_components_ > self.components_.shape[1]
            else 0.0
        )
        self._complement_projection = None
        self.input_dtype_ = info["input_dtype"]


def _whiten_complement(rows, mean, projection, components, complement_scale):
    """:func:`whiten_rows` with Sigma's null space whitened too (float64 out)."""
    return whiten_rows(rows, mean, projection, np.float64, components, complement_scale)


def _as_numpy(x) -> np.ndarray:
    if is_dask_array(x):
        (x,) = dask.compute(x)
    return np.asarray(x)
