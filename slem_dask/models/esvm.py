"""Exemplar SVM encoder (hinge loss, Pegasos), the baseline of docs/math.md#esvm."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

import numpy as np

from ..core.esvm import hinge_objective, optimal_bias, pegasos_exemplars
from ..core.whitening import normalize_rows
from ..parallel.blocks import map_rows, shared
from ..core.validation import (
    Array,
    Rows,
    check_finite_rows,
    check_positive_float,
    check_rows,
    is_dask_array,
)
from .base import SLEMEstimator, fresh_seed

if TYPE_CHECKING:
    from numpy.typing import DTypeLike
    from typing_extensions import Self

__all__ = ["ESVM"]

#: Positives trained together in one (B, d) matrix; bounds the (B, batch_size) scores.
_POSITIVE_BATCH = 256


def _check_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _encode_exemplars(rows, negatives, mean, params: dict) -> np.ndarray:
    """Normalized E-SVM weight vector of every row, trained _POSITIVE_BATCH rows at a time."""
    out = np.empty(rows.shape, dtype=np.float64)
    for i in range(0, len(rows), _POSITIVE_BATCH):
        W, _ = pegasos_exemplars(rows[i : i + _POSITIVE_BATCH], negatives, mean, **params)
        out[i : i + _POSITIVE_BATCH] = normalize_rows(W)
    return out


class ESVM(SLEMEstimator):
    """Hinge-loss exemplar SVM of each positive against the negatives.

    Minimizes J(w, b) = theta hinge(1, w.x0 + b) + (1/n) sum_i hinge(-1, w.x_i + b)
    + lam/2 |w|^2 (docs/math.md#esvm) by mini-batch Pegasos, for many
    positives at once (see :mod:`slem_dask.core.esvm` for the solver).

    Parameters
    ----------
    lam : float > 0
        Ridge parameter lambda. Default 1e-2, where the default ``n_iter``
        brings J within 1% of its optimum on L2-normalized descriptors
        (exact b, benchmarks/bench_retrieval.py; tests/models/test_baselines.py).
        The solver needs of the order of 1/lam steps: at lam = 1e-3 it is
        ~10% above the optimum after 1000 steps and ~1% after 10000.
    theta : float > 0
        Weight of the positive. Unlike SLEM's, it changes the direction of w.
    n_iter : int
        Stochastic sub-gradient steps per positive.
    batch_size : int
        Negatives sampled per step (shared by all positives trained together).
    eta0 : float > 0
        Initial step size; step t is 1 / (lam (t + 1/(lam eta0))).
    bias_step : float > 0
        The bias takes steps ``bias_step`` times the step of w.
    random_state : int or None
        Seed of the mini-batch sampler; the same seed gives the same encodings
        whatever the blocks of positives. None draws a fresh seed per call.

    Attributes (after ``fit``)
    --------------------------
    negatives_ (n, d) float64, mean_ (d,), n_samples_, n_features_in_, input_dtype_.
    """

    _param_names = ("lam", "theta", "n_iter", "batch_size", "eta0", "bias_step", "random_state")

    def __init__(
        self,
        lam: float = 1e-2,
        theta: float = 1.0,
        n_iter: int = 1000,
        batch_size: int = 128,
        eta0: float = 1.0,
        bias_step: float = 0.1,
        random_state: int | None = 0,
    ):
        self.lam = lam
        self.theta = theta
        self.n_iter = n_iter
        self.batch_size = batch_size
        self.eta0 = eta0
        self.bias_step = bias_step
        self.random_state = random_state

    def _check_params(self) -> None:
        check_positive_float(self.lam, "lam", "; e.g. 1e-2 for L2-normalized descriptors")
        check_positive_float(self.theta, "theta")
        check_positive_float(self.eta0, "eta0")
        check_positive_float(self.bias_step, "bias_step")
        _check_int(self.n_iter, "n_iter")
        _check_int(self.batch_size, "batch_size")
        if self.random_state is not None:
            _check_int(self.random_state, "random_state", minimum=0)

    def _solver_params(self) -> dict:
        seed = self.random_state
        if seed is None:
            seed = fresh_seed()
        return {
            "lam": float(self.lam),
            "theta": float(self.theta),
            "n_iter": int(self.n_iter),
            "batch_size": int(self.batch_size),
            "eta0": float(self.eta0),
            "bias_step": float(self.bias_step),
            "random_state": seed,
        }

    # -- fit ----------------------------------------------------------
    def fit(self, X: Rows, y: object = None) -> Self:
        """Keep the negatives ``X`` (n, d) (a dask ``X`` is computed: E-SVM
        training samples all of them for every positive)."""
        self._check_params()
        rows = check_rows(X, "X", min_rows=2)
        dtype = np.dtype(rows.dtype).name
        negatives = np.asarray(rows.compute() if is_dask_array(rows) else rows)
        check_finite_rows(negatives, "X")
        self.negatives_ = np.array(negatives, dtype=np.float64, order="C")
        self.mean_ = self.negatives_.mean(axis=0)
        self.n_samples_ = int(negatives.shape[0])
        self.n_features_in_ = int(negatives.shape[1])
        self.input_dtype_ = dtype
        return self

    # -- encode -------------------------------------------------------
    def transform(self, X: Rows, dtype: DTypeLike | None = None) -> Array:
        """L2-normalized E-SVM weight vector w of each row of ``X``.

        numpy in, numpy out; dask in, lazy dask out (one task per row block,
        the negatives entering the graph once through :func:`parallel.shared`).
        ``dtype``: of the result (default: float64 for float64 rows, float32 for any other
        dtype, float16 and integers included: :func:`~slem_dask.core.validation.output_dtype`;
        computed in float64).
        """
        self._check_params()
        X = self._check_positives(X)
        dtype = self._output_dtype(X, dtype)
        params = self._solver_params()
        if is_dask_array(X):
            return map_rows(
                _encode_exemplars,
                X,
                (shared(self.negatives_), shared(self.mean_), params),
                self.n_features_in_,
                dtype,
                "X",
                "esvm-encode",
            )
        check_finite_rows(X, "X")
        return _encode_exemplars(np.asarray(X), self.negatives_, self.mean_, params).astype(
            dtype, copy=False
        )

    def exemplars(self, P: Rows) -> tuple[np.ndarray, np.ndarray]:
        """Unnormalized (W, b) of the rows of ``P`` (numpy). W from the stochastic
        solver; b is then the exact minimizer of J for that W (one pass over the
        negatives, :func:`slem_dask.core.esvm.optimal_bias`)."""
        self._check_params()
        P = np.asarray(self._check_positives(P, "P"))
        check_finite_rows(P, "P")
        params = self._solver_params()
        W = np.empty(P.shape)
        for i in range(0, len(P), _POSITIVE_BATCH):
            W[i : i + _POSITIVE_BATCH], _ = pegasos_exemplars(
                P[i : i + _POSITIVE_BATCH], self.negatives_, self.mean_, **params
            )
        return W, optimal_bias(W, P, self.negatives_, float(self.theta))

    def exemplar(self, x0) -> tuple[np.ndarray, float]:
        """(w, b) of one positive ``x0`` (d,): see :meth:`exemplars`."""
        x0 = np.asarray(x0)
        if x0.ndim != 1:
            self._check_fitted()
            raise ValueError(
                f"x0 must be one descriptor of shape ({self.n_features_in_},), got shape "
                f"{x0.shape}; use exemplars() or transform() for several rows"
            )
        W, b = self.exemplars(x0[None, :])
        return W[0], float(b[0])

    def objective(self, P, W, b) -> np.ndarray:
        """J(w_j, b_j) (docs/math.md#esvm) for row j of ``P`` (one value per row)."""
        self._check_fitted()
        return hinge_objective(W, b, P, self.negatives_, float(self.lam), float(self.theta))

    # -- persistence --------------------------------------------------
    def _state(self):
        info = {
            "n_samples": self.n_samples_,
            "n_features": self.n_features_in_,
            "input_dtype": self.input_dtype_,
        }
        return info, {"negatives": self.negatives_}

    def _set_state(self, info, arrays):
        self.negatives_ = np.ascontiguousarray(arrays["negatives"], dtype=np.float64)
        self.mean_ = self.negatives_.mean(axis=0)
        self.n_samples_ = int(info["n_samples"])
        self.n_features_in_ = int(info["n_features"])
        self.input_dtype_ = info["input_dtype"]
