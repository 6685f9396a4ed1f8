"""The linear square-loss exemplar machine (docs/math.md#linear-objective)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import dask
import numpy as np

from ..core.linear import (
    condition_bound,
    encode_rows,
    exemplar_solution,
    float32_encoding_ok,
    float32_factor,
    float32_matrix,
    precision_matrix,
)
from ..core.statistics import (
    ScatterStats,
    array_statistics,
    check_precision,
    compute_dtype,
    covariance,
)
from ..parallel.blocks import encode_blocks, locate_nonfinite_rows, scatter_statistics, shared
from ..core.validation import (
    caller_stacklevel,
    DEFAULT_LAM,
    Array,
    DegenerateNegativesWarning,
    Rows,
    all_finite,
    NonFiniteRowsError,
    check_finite_rows,
    check_positive_float,
    check_rows,
    effective_lam,
    is_dask_array,
    nonfinite_rows_error,
    parse_lam,
)
from ..storage import MemberCast
from .base import SLEMEstimator

if TYPE_CHECKING:
    from numpy.typing import DTypeLike
    from typing_extensions import Self

__all__ = ["LinearSLEM"]

#: Bytes of float64 rows per block when fitting on an in-memory numpy array (bounds the
#: float64 copy; at least d rows: core.statistics.array_statistics).
_NUMPY_BLOCK_BYTES = 64 * 2**20
#: The metadata field of a saved LinearSLEM that records :func:`condition_bound` of its
#: Sigma and lambda (what decides float32 encoding), so that an encode need not read Sigma.
CONDITION_BOUND = "condition_bound"
#: The metadata field that records :func:`float32_factor` of its A^-1, so that an encode
#: in float32 can read A^-1 straight into the float32 copy it encodes with.
FLOAT32_FACTOR = "float32_factor"


class LinearSLEM(SLEMEstimator):
    """Linear square-loss exemplar machine.

    Parameters
    ----------
    lam : float > 0, or str "<c>x"
        Ridge parameter lambda of J(w, nu) (docs/math.md#linear-objective). A number is
        absolute, in the data's squared units (as it always was); "<c>x" is c times the
        negatives' total variance tr(Sigma), the same for any scale of the data. Default
        "0.01x" (was 1e-3: on L2-normalized descriptors, tr(Sigma) ~ 0.3, it is about
        3e-3; measured in docs/troubleshooting.md, "Defaults"). An absolute lambda below
        1e-6 or above 1e3 times the negatives' mean variance warns
        (:class:`~slem_dask.core.validation.LambdaScaleWarning`).
    theta : float > 0
        Weight of the positive exemplar. It scales w* but not its direction
        (docs/math.md#theta), so it changes :meth:`exemplar` only, never
        :meth:`transform` or :meth:`similarity`.
    precision : "auto" or "float64"
        Arithmetic inside a block. "auto" (default): float32 input is computed
        in float32 inside each block (statistics always merged in float64), with
        covariance and encodings within 1e-5 (max abs error relative to the
        largest entry; encodings are unit rows) of float64 arithmetic on the
        same values, also for data offset by 1e4 standard deviations; encoding
        falls back to float64 when A is too ill-conditioned for that bound
        (:func:`slem_dask.core.linear.float32_encoding_ok`). "float64": float64
        throughout. float64 input is always computed in float64.

    Attributes (after ``fit``)
    --------------------------
    mean_ : (d,) float64, mean mu of the negatives.
    covariance_ : (d, d) float64, population covariance Sigma of the negatives.
    precision_ : (d, d) float64, A^-1 = (Sigma + lam_ I)^-1 (None in a model loaded
        for float32 encoding alone: ``load_model(..., encode_dtype="float32")``).
    lam_ : float, the absolute lambda used (``lam`` itself, or c x tr(Sigma)).
    n_samples_ : number of negatives.
    n_features_in_ : d.
    input_dtype_ : dtype name of the negatives.
    """

    precision_: np.ndarray | None  # None: loaded for float32 encoding alone
    _float32_cache: tuple[np.ndarray | None, np.ndarray | None]

    _param_names = ("lam", "theta", "precision")
    _exemplar_only_params = ("theta",)
    _execution_params = ("precision",)
    _identity_arrays = ()  # the statistics of the negatives: any rounding, one model
    #: None when loaded from a store older than its record (see :meth:`_lam`)
    lam_: float | None

    def __init__(self, lam: float | str = DEFAULT_LAM, theta: float = 1.0, precision: str = "auto"):
        self.lam = lam
        self.theta = theta
        self.precision = precision

    def _check_params(self) -> None:
        parse_lam(self.lam)
        check_positive_float(self.theta, "theta")
        check_precision(self.precision)

    # -- fit ----------------------------------------------------------
    def fit(self, X: Rows, y: object = None) -> Self:
        """Learn mean_, covariance_ and precision_ from the negatives ``X`` (n, d).

        ``X`` may be numpy or dask; a dask array is reduced blockwise (one task
        per row block, then a tree of merges) in a single ``dask.compute``.
        """
        self._check_params()
        X = check_rows(X, "X", min_rows=2)
        if is_dask_array(X):
            (stats,) = dask.compute(scatter_statistics(X, precision=self.precision))
        else:
            stats = array_statistics(X, self.precision, _NUMPY_BLOCK_BYTES)
        return self._fit_statistics(stats, X.dtype, lambda: locate_nonfinite_rows(X)[1])

    def _fit_statistics(self, stats: ScatterStats, dtype, bad_rows=None) -> Self:
        """Finish a fit from merged statistics (also used by jobs that stream them).

        Takes ``stats`` over: its scatter becomes ``covariance_``, in place.
        ``bad_rows``: called when rows with NaN or inf were counted, it names them
        (a second pass over the data, on that error path only).
        """
        self._check_params()
        if stats.nonfinite:
            shown = bad_rows() if bad_rows is not None else None
            raise nonfinite_rows_error("X", stats.nonfinite, shown, stats.count + stats.nonfinite)
        if stats.count < 2:
            raise ValueError(f"X has {stats.count} row(s); at least 2 negatives are needed")
        mean, cov = stats.mean, covariance(stats, in_place=True)
        lam = effective_lam(self.lam, cov)
        precision = precision_matrix(cov, lam)
        if not all_finite(precision):  # mean and cov are finite: lam is the cause
            raise ValueError(
                f"lam={self.lam!r} is too small for these negatives (largest covariance "
                f"entry {np.abs(cov).max():.3g}): A = Sigma + lam I has no finite inverse "
                f"in float64; increase lam, or give it relative to their scale (e.g. "
                f"'{DEFAULT_LAM}', the default)"
            )
        if np.all(cov.diagonal() <= (2.0**-40 * np.abs(mean)) ** 2):
            warnings.warn(
                DegenerateNegativesWarning(
                    f"all {stats.count} rows are identical (every feature has zero variance in "
                    f"float64: the rows are equal, or differ by less than ~1e-154, whose squares "
                    f"underflow), so A = lam I and the model only subtracts their mean: a positive "
                    f"is encoded as the direction of x0 - mean, and one equal to the negatives "
                    f"has no encoding (all zeros); fit on negatives that vary (descriptors of "
                    f"other images)"
                ),
                stacklevel=caller_stacklevel(),
            )
        self.mean_, self.covariance_, self.precision_ = mean, cov, precision
        self.lam_ = lam
        self.n_samples_ = int(stats.count)
        self.n_features_in_ = int(stats.n_features)
        self.input_dtype_ = np.dtype(dtype).name
        return self

    # -- encode -------------------------------------------------------
    def transform(
        self, X: Rows, dtype: DTypeLike | None = None, precision: str | None = None
    ) -> Array:
        """L2-normalized SLEM vector of every row of ``X`` (n_p, d), the positives.

        numpy in, numpy out; dask in, lazy dask out with the row chunks of ``X``.
        ``dtype`` is the dtype of the result (default: float64 for float64 in, float32
        for anything else, integers included). A row equal to ``mean_`` has no
        direction and is returned as zeros (``slem-dask encode`` refuses such rows). ``precision`` (default: the model's):
        float32 ``X`` is encoded in float32 under "auto" while A is well enough
        conditioned (see the class docstring), else in float64.
        """
        return self._transform(X, dtype, precision)

    def _transform(
        self, X: Rows, dtype: DTypeLike | None, precision: str | None, zero_reason=None
    ) -> Array:
        """:meth:`transform`; dask ``X`` with a ``zero_reason``: rows encoded to zeros,
        NaN or inf refused in the encoding's own pass (an encode job's check)."""
        X = self._check_positives(X)
        dtype = self._output_dtype(X, dtype)
        matrix = self._encoding_matrix(
            X.dtype, self.precision if precision is None else check_precision(precision)
        )
        if is_dask_array(X):
            shipped = shared(matrix, self._matrix_token(matrix))
            return encode_blocks(X, shared(self.mean_), shipped, dtype, "X", zero_reason)
        try:  # encode_rows refuses NaN and inf at no cost for finite rows
            return encode_rows(X, self.mean_, matrix, dtype=dtype)
        except NonFiniteRowsError:
            check_finite_rows(X, "X")  # the same rows, named as rows of X
            raise

    def _encoding_matrix(self, dtype, precision: str) -> np.ndarray:
        """A^-1 in the dtype the encoding is computed in (the stored one stays float64).

        What depends on the model alone is computed once per fit or load and kept:
        whether float32 encoding is accurate enough (a pass over Sigma, 0.3 s at
        d = 8192) and A^-1's float32 copy (0.4 s), so that encoding one row costs about
        one matrix-vector product."""
        if compute_dtype(dtype, precision) != np.float32:
            return self._float64_precision()
        cache = getattr(self, "_float32_cache", None)
        if cache is None or cache[0] is not self.precision_:  # fitted or loaded since
            ok = float32_encoding_ok(self._condition_bound())
            matrix = self._float64_precision()
            cache = (matrix, float32_matrix(matrix) if ok else None)
            self._float32_cache = cache
        return self._float64_precision() if cache[1] is None else cache[1]

    def _float64_precision(self) -> np.ndarray:
        """A^-1 itself, refused in a model loaded for float32 encoding alone."""
        if self.precision_ is None:
            raise ValueError(
                "this LinearSLEM was loaded for float32 encoding alone (load_model with "
                "encode_dtype='float32') and holds no float64 A^-1, which encoding in "
                "float64 and exemplar() use; load it without encode_dtype for those"
            )
        return self.precision_

    def _condition_bound(self) -> float:
        """:func:`condition_bound` of these Sigma and lambda, computed once per fit and
        recorded with the model: an encode that loads it ``transform_only`` decides on
        float32 from the record, exactly as from Sigma, without reading Sigma."""
        cache = getattr(self, "_bound_cache", None)
        if cache is None or cache[0] is not self.precision_:  # fitted since
            cache = (self.precision_, condition_bound(self.covariance_, self._lam()))
            self._bound_cache = cache
        return cache[1]

    def _matrix_token(self, matrix: np.ndarray) -> str:
        """dask's token of the encoding matrix, kept with it: a lazy ``transform`` hashed
        A^-1 on every call (0.17 CPU s at d = 8192). Recomputed when the matrix is
        another object (fitted, loaded or the precision changed since). A model loaded
        ``transform_only`` names it by A^-1's recorded SHA-256, which its load checked:
        the matrix is A^-1 or its float32 copy, which depends on A^-1's bits alone."""
        from dask.base import tokenize

        cache = getattr(self, "_token_cache", None)
        if cache is None or cache[0] is not matrix:
            record = self._read_in_part_still()
            digest = record.array_sha256.get("precision") if record is not None else None
            if digest is None:
                cache = (matrix, tokenize(matrix))
            else:
                cache = (matrix, tokenize("A^-1", digest, matrix.dtype.str, matrix.shape))
            self._token_cache = cache
        return cache[1]

    def exemplar(self, x0):
        """Exact unnormalized minimizer (w*, nu*) of J(w, nu) for one positive ``x0`` (d,)."""
        self._check_params()
        self._check_fitted()
        x0 = np.asarray(x0)
        if x0.ndim != 1:
            raise ValueError(
                f"x0 must be one descriptor of shape ({self.n_features_in_},), got shape "
                f"{x0.shape}; use transform() for several rows"
            )
        self._check_positives(x0[None, :], "x0")
        check_finite_rows(x0[None, :], "x0")
        return exemplar_solution(x0, self.mean_, self._float64_precision(), float(self.theta))

    # -- persistence --------------------------------------------------
    def _state(self):
        info = {
            "n_samples": self.n_samples_,
            "n_features": self.n_features_in_,
            "input_dtype": self.input_dtype_,
            "lam_": self._lam(),
        }
        arrays = {"mean": self.mean_, "covariance": self.covariance_, "precision": self.precision_}
        return info, arrays

    def _save_records(self) -> dict:
        # computed here, not in _state (which every fingerprint and identity calls): a
        # model fitted and hashed but never saved or encoded in float32 never pays it
        return {
            CONDITION_BOUND: self._condition_bound(),
            FLOAT32_FACTOR: float32_factor(self._float64_precision()),
        }

    @classmethod
    def _transform_members(
        cls, meta: dict, encode_dtype=None, precision: str | None = None
    ) -> tuple[str, ...] | dict[str, MemberCast | None] | None:
        # Sigma serves transform only through its condition bound, when that is recorded
        bound = meta.get(CONDITION_BOUND)
        if bound is None:
            return None
        factor = meta.get(FLOAT32_FACTOR)
        precision = precision if precision is not None else meta["params"]["precision"]
        if (
            encode_dtype is None
            or factor is None
            or compute_dtype(encode_dtype, precision) != np.float32
            or not float32_encoding_ok(float(bound))
        ):
            return ("mean", "precision")
        # A^-1 read straight into float32_matrix's copy: no float64 A^-1 is ever held
        return {"mean": None, "precision": MemberCast(np.dtype(np.float32), float(factor))}

    def _set_state(self, info, arrays):
        self.mean_ = arrays["mean"]
        self.covariance_ = arrays.get("covariance")  # None: loaded transform_only
        self.precision_ = arrays["precision"]
        if self.precision_.dtype == np.float32:  # read as the float32 copy alone (above)
            self._float32_cache = (None, self.precision_)
            self.precision_ = None
        if info.get(CONDITION_BOUND) is not None:
            self._bound_cache = (self.precision_, float(info[CONDITION_BOUND]))
        self.n_samples_ = int(info["n_samples"])
        self.n_features_in_ = int(info["n_features"])
        self.input_dtype_ = info["input_dtype"]
        self.lam_ = float(info["lam_"]) if info.get("lam_") is not None else None

    def _lam(self) -> float:
        """The absolute lambda of the fit (a model saved by an earlier slem-dask records
        only ``lam``, which was always absolute then)."""
        lam = getattr(self, "lam_", None)
        return lam if lam is not None else parse_lam(self.lam)[0]
