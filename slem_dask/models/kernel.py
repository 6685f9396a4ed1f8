"""The kernel square-loss exemplar machine (docs/math.md#kernel-primal and what follows it)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..core.cholesky import g_cholesky
from ..core.kernels import _USES_GAMMA as USES_GAMMA
from ..core.statistics import ScatterStats, merge_statistics
from ..parallel.kernel import CholeskyConfig, incomplete_cholesky
from ..parallel.kernel_stream import choose_strategy, factor_statistics
from ..core.validation import (
    caller_stacklevel,
    Array,
    LargeValuesError,
    NonFiniteRowsError,
    Rows,
    check_rows,
    is_dask_array,
)
from .base import SLEMEstimator, fresh_seed
from .kernel_blocks import _encode_block, _Encoder, _packed_block, _similarity_block
from .kernel_lazy import lazy_encode, lazy_similarity
from .kernel_defaults import KERNEL_DEFAULTS, fitted_gamma
from .kernel_params import PIVOTING, check_params
from .kernel_messages import (
    TRACE_ERROR_WARNING,
    TraceErrorWarning,
    large_kernel_values as _large_kernel_values,
    located_nonfinite_rows_error,
    normalized_pivots,
    weak_factor_message,
)

if TYPE_CHECKING:
    from numpy.typing import DTypeLike
    from typing_extensions import Self

    from ..parallel.kernel_checkpoint import FinalPassCheckpoint

__all__ = ["KernelSLEM", "PIVOTING", "TRACE_ERROR_WARNING", "TraceErrorWarning"]

#: Bytes of float64 rows per block when fitting on an in-memory numpy array (at most).
_NUMPY_BLOCK_BYTES = 64 * 2**20
#: A numpy input of more than one block is split into a multiple of this many blocks of
#: equal size (to a row): its blocks run on a thread per core, and 3 full blocks and a
#: small one (200,000 rows at d = 128) kept one of 2 cores idle for a third of each pass.
#: A constant, not the core count: the blocks, hence the rpcholesky pivots, do not
#: depend on the machine.
_NUMPY_BLOCK_MULTIPLE = 4


def _numpy_block_rows(n: int, d: int) -> int:
    """Rows per block of an in-memory fit: at most _NUMPY_BLOCK_BYTES of float64 rows,
    and a multiple of _NUMPY_BLOCK_MULTIPLE blocks of equal size when more than one."""
    rows = max(1, _NUMPY_BLOCK_BYTES // (8 * max(d, 1)))
    blocks = -(-n // rows)
    if blocks <= 1:
        return rows
    blocks = -(-blocks // _NUMPY_BLOCK_MULTIPLE) * _NUMPY_BLOCK_MULTIPLE
    return -(-n // blocks)


class KernelSLEM(SLEMEstimator):
    """Kernel square-loss exemplar machine with a pivoted incomplete Cholesky factor.

    Parameters
    ----------
    kernel : "linear", "rbf", "quad", "poly", "intersection" or "chi2"
        See :mod:`slem_dask.core.kernels` (chi2 is the additive chi-squared
        kernel sum 2 x y / (x + y) with 0/0 := 0; both histogram kernels need
        non-negative features).
    gamma : float > 0, or str "<c>x"
        Kernel parameter of rbf, quad and poly; ignored by the other kernels. A number
        is absolute; "<c>x" is c over the negatives' median squared distance (rbf) or
        median squared norm (quad, poly), measured at fit time (``gamma_``). Default
        "0.0625x" (was 0.1 absolute; :mod:`.kernel_defaults`, measured in
        docs/benchmarks.md). An absolute gamma far from that scale warns
        (:class:`~.kernel_defaults.GammaScaleWarning`).
    degree : int >= 1
        Degree of the poly kernel; ignored by the others.
    lam : float > 0
        Ridge parameter lambda.
    rank : int >= 1 or None
        Maximum number of pivots r (default 1024). None: stop on ``tol`` only (which
        may take up to n pivots, i.e. O(n^3) time: give a rank for large n).
    pivoting : "rpcholesky" (default) or "greedy"
        greedy: the largest residual diagonal at every step (the rule of
        docs/math.md#icd); one pass over the negatives per pivot.
        rpcholesky: accelerated randomly pivoted Cholesky (Chen, Epperly, Tropp
        and Webber 2025; Epperly, Tropp and Webber 2024; docs/math.md#rpcholesky):
        blocks of candidates drawn in proportion to the residual diagonal,
        accepted or rejected with a small Cholesky of their residual block, so
        one pass takes many pivots. It is robust to outliers, which greedy pivoting picks first.
    tol : float in [0, 1)
        Stop when the residual trace tr(K - F F^T) <= tol tr(K) (default 1e-3: the
        factor keeps 99.9% of the trace, within ``rank``).
    random_state : int or None
        Seed of rpcholesky (default 0; None: a fresh seed, recorded in ``seed_``). The
        pivots depend on the seed and on the row chunking of the negatives.
    exact : bool
        False (default): the low-rank model of the authors' code, per-positive
        cost O(r d + r^2), independent of n (docs/math.md#lowrank-model). True: the
        augmented factor with its column w (docs/math.md#augmented-factor,
        docs/math.md#block-inverse), which keeps the negatives' coordinates w
        along each positive's own residual direction instead of dropping them.
        It keeps the negatives and the n x r factor in the model and costs
        O(n (d + r)) per positive: worth it only for modest n (say n r below
        10^8) when the rank is well below the numerical rank of K, so that
        the positives have large residuals u. At full rank, or when
        ``trace_error_`` is tiny, both modes agree.
    strategy : "auto", "in-memory" or "streaming"
        How ``fit`` holds the negatives. "in-memory": each block's rows of X and
        of F stay on the workers for the whole fit (about 4.5-6.6 KB per row at
        d = 512, r = 256). "streaming": nothing per row is kept between passes;
        every pass reads X again (from its zarr store for a dask array on one)
        and recomputes F = K(X, X_I) L^-T (:mod:`slem_dask.parallel.kernel_stream`):
        memory independent of n, more compute per pass. Both give the same
        pivots and model (to rounding). "auto" (default): in-memory while
        :func:`slem_dask.parallel.task_memory.kernel_fit_bytes` fits in 60% of the workers'
        memory limits (else of this machine's available memory), streaming
        otherwise; ``strategy_`` and ``strategy_reason_`` say what was chosen
        and why. It does not change the model (not part of its encoding
        fingerprint).

    Attributes (after ``fit``)
    --------------------------
    pivots_ : (r,) int64, indices into the negatives, in pivot order.
    pivot_rows_ : (r, d) float64, the pivot rows X_I.
    pivot_factor_ : (r, r) float64, lower triangular L = F(I, :), L L^T = K(X_I, X_I).
    factor_mean_ : (r,) float64, mean row mu of F = K(X, X_I) L^-T.
    g_factor_ : (r, r) float64, lower Cholesky factor of G = F^T F / n - mu mu^T + lam I.
    factor_scatter_ : (r, r) float64, centred scatter of the rows of F (for ``update``).
    rank_ : r.  trace_ : tr K.  trace_error_ : tr(K - F F^T) / tr K.
    strategy_, strategy_reason_ : the path ``fit`` took ("in-memory" or "streaming"), why.
    n_passes_ : passes over the negatives during fit (one dask round each).
    seed_ : the seed used (rpcholesky).
    n_samples_, n_features_in_, input_dtype_ : as LinearSLEM.
    negatives_ (n, d), factor_ (n, r) : only with ``exact=True``.
    """

    _n_outputs_attribute = "rank_"  # outputs kernelslem0 ... (get_feature_names_out)
    _param_names = (
        "kernel",
        "gamma",
        "degree",
        "lam",
        "rank",
        "pivoting",
        "tol",
        "random_state",
        "exact",
        "strategy",
    )
    _execution_params = ("strategy",)
    _bookkeeping_arrays = ("factor_scatter",)  # read by update(), never by transform()
    _identity_arrays = ("pivots",)  # other pivots: another basis, not other rounding
    #: None for a model loaded from a store (the reason is not saved)
    strategy_reason_: str | None

    def __init__(
        self,
        kernel: str = KERNEL_DEFAULTS["kernel"],
        gamma: float | str = KERNEL_DEFAULTS["gamma"],
        degree: int = KERNEL_DEFAULTS["degree"],
        lam: float = KERNEL_DEFAULTS["lam"],
        rank: int | None = KERNEL_DEFAULTS["rank"],
        pivoting: str = KERNEL_DEFAULTS["pivoting"],
        tol: float = KERNEL_DEFAULTS["tol"],
        random_state: int | None = KERNEL_DEFAULTS["random_state"],
        exact: bool = False,
        strategy: str = "auto",
    ):
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.lam = lam
        self.rank = rank
        self.pivoting = pivoting
        self.tol = tol
        self.random_state = random_state
        self.exact = exact
        self.strategy = strategy

    def _check_params(self):
        return check_params(self)

    # -- fit ----------------------------------------------------------
    def fit(
        self,
        X: Rows,
        y: object = None,
        progress: Callable[[int, int, float], object] | None = None,
        checkpoint: FinalPassCheckpoint | None = None,
    ) -> Self:
        """Factor the negatives' kernel matrix and learn G; ``X`` (n, d) numpy or dask.

        ``progress``: None, or a callable ``progress(round_no, n_pivots, trace_error)``
        called after each pass over the negatives. ``checkpoint``: None, or (streaming
        only) a :class:`slem_dask.parallel.kernel_checkpoint.FinalPassCheckpoint` that makes the
        final pass resumable (``slem-dask fit`` passes one).

        A dask array is processed block by block on the current scheduler, in
        ``n_passes_`` rounds (see :mod:`slem_dask.parallel.kernel`); the n x n
        kernel matrix is never formed.
        """
        kernel, gamma, degree, lam, rank = self._check_params()
        X = check_rows(X, "X", min_rows=2)
        n, d = X.shape
        gamma = self.gamma_ = fitted_gamma(self.gamma, X, kernel, kernel in USES_GAMMA)
        seed = int(self.random_state) if self.random_state is not None else fresh_seed()
        cfg = CholeskyConfig(
            kernel=kernel,
            gamma=gamma,
            degree=degree,
            pivoting=self.pivoting,
            rank=min(rank or n, n),
            tol=float(self.tol),
            seed=seed,
            gather=bool(self.exact),
        )
        block_rows = _numpy_block_rows(n, d)
        strategy, reason = choose_strategy(self.strategy, X, rank, bool(self.exact), self.pivoting)
        streaming = strategy == "streaming"
        try:
            res = incomplete_cholesky(
                X,
                cfg,
                block_rows=block_rows,
                name="X",
                on_round=progress,
                streaming=streaming,
                checkpoint=checkpoint if streaming else None,
            )
        except NonFiniteRowsError:
            raise located_nonfinite_rows_error(X) from None
        except LargeValuesError as exc:
            raise _large_kernel_values(exc, kernel, gamma, degree) from None
        self._keep_factor(res, X, lam, seed)
        self.strategy_, self.strategy_reason_ = strategy, reason
        self._warn_if_weak()
        return self

    def _keep_factor(self, res, X, lam: float, seed: int) -> None:
        """The fitted attributes of a factorization ``res`` of the negatives ``X``."""
        n, d = X.shape
        r = len(res.pivots)
        self.pivots_ = res.pivots
        self.pivot_rows_ = res.pivot_rows
        self.pivot_factor_ = res.pivot_factor
        self.factor_mean_ = res.stats.mean
        self.factor_scatter_ = res.stats.scatter
        self.g_factor_ = g_cholesky(res.stats.scatter, res.stats.count, lam)
        self.rank_ = r
        self.trace_ = res.trace
        self.residual_trace_ = res.residual_trace
        self.trace_error_ = res.residual_trace / res.trace
        self.n_passes_ = res.rounds
        self.seed_ = seed
        self.n_samples_ = int(n)
        self.n_features_in_ = int(d)
        self.input_dtype_ = np.dtype(X.dtype).name
        if self.exact:
            self.negatives_ = res.rows
            self.factor_ = res.factor

    def update(self, X: Rows, row_offset: int = 0) -> Self:
        """Add the negatives ``X`` (n_new, d) to a fitted model without re-pivoting.

        One streaming pass over ``X`` only: the rows of F = K(X, X_I) L^-T of the new
        negatives (docs/math.md#icd), their Chan statistics merged in float64 into the
        stored mean and scatter of F's rows (docs/math.md#chan-merge), G refactored,
        ``n_samples_``, ``trace_`` and ``trace_error_`` (now over all rows) updated.
        The pivots, L and ``n_passes_`` stay. ``X`` numpy or dask (computed on the
        current scheduler). The old negatives are not read: the caller vouches that
        they are unchanged (``slem-dask fit --update`` checks their fingerprint).
        A model loaded from a store written before ``factor_scatter`` was kept cannot
        be updated: refit it. ``row_offset``: the index of ``X``'s first row among all the
        negatives (messages about bad rows name rows by it).
        """
        self._check_updatable()
        kernel, _, degree, lam, _ = self._check_params()
        gamma = self.gamma_
        X = check_rows(X, "X", min_rows=1)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"update: X has {X.shape[1]} features but the model is fitted on "
                f"{self.n_features_in_}; give rows of the same negatives"
            )
        cfg = CholeskyConfig(
            kernel=kernel,
            gamma=gamma,
            degree=degree,
            pivoting=self.pivoting,
            rank=self.rank_,
            tol=float(self.tol),
            seed=self.seed_,
        )
        block_rows = max(1, _NUMPY_BLOCK_BYTES // (8 * max(X.shape[1], 1)))
        try:
            out = factor_statistics(
                X, self.pivot_rows_, self.pivot_factor_, cfg, "X", block_rows, int(row_offset)
            )
            out = out.compute() if is_dask_array(X) else out
        except NonFiniteRowsError:
            raise located_nonfinite_rows_error(X, int(row_offset)) from None
        except LargeValuesError as exc:
            raise _large_kernel_values(exc, kernel, gamma, degree) from None
        new, trace, residual = out
        total = merge_statistics(
            ScatterStats(self.n_samples_, self.factor_mean_, self.factor_scatter_), new
        )
        self.factor_mean_, self.factor_scatter_ = total.mean, total.scatter
        self.g_factor_ = g_cholesky(total.scatter, total.count, lam)
        self.trace_ = float(self.trace_ + trace)
        self.residual_trace_ = float(self.residual_trace_ + residual)
        self.trace_error_ = self.residual_trace_ / self.trace_
        self.n_samples_ = int(total.count)
        self._warn_if_weak()
        return self

    def _check_updatable(self) -> None:
        """Refuse :meth:`update` of a model it cannot extend (not fitted, exact, or saved
        without the scatter of F's rows)."""
        self._check_fitted()
        if self.exact:
            raise ValueError(
                "update: an exact=True model keeps all negatives and the n x r "
                "factor; refit it on all rows (fit) instead"
            )
        if getattr(self, "factor_scatter_", None) is None:
            raise ValueError(
                "update: this model was saved by a slem-dask that did not keep "
                "the scatter of F's rows (factor_scatter); refit it on all rows "
                "(slem-dask fit --update --repivot, or fit())"
            )

    def _normalized_pivots(self) -> bool:
        """Whether the pivots are unit rows (:func:`.kernel_messages.normalized_pivots`)."""
        return normalized_pivots(self)

    def _warn_if_weak(self) -> None:
        """One :class:`TraceErrorWarning` if ``trace_error_`` > :data:`TRACE_ERROR_WARNING`."""
        message = weak_factor_message(self)
        if message is not None:
            warnings.warn(TraceErrorWarning(message), stacklevel=caller_stacklevel())

    # -- encode -------------------------------------------------------
    def _encoder(self) -> _Encoder:
        self._check_fitted()
        kernel, _, degree, lam, _ = self._check_params()
        return _Encoder(
            kernel,
            self.gamma_,
            degree,
            lam,
            bool(self.exact),
            self.pivot_rows_,
            self.pivot_factor_,
            self.factor_mean_,
            self.g_factor_,
            self.pivots_,
            getattr(self, "negatives_", None),
            getattr(self, "factor_", None),
        )

    def transform(self, X: Rows, dtype: DTypeLike | None = None, normalize: str = "h") -> Array:
        """Explicit SLEM vectors z (n_p, r_), one row per positive.

        z = beta / N with beta = G^-1 (v - mu) and N = sqrt(|beta|^2 + u^2 / lam^2)
        the norm of the exemplar function h (docs/math.md#lowrank-model). The rows are
        normalized by |h|, *not* to unit length: |z|^2 = 1 - u^2 / (lam N)^2 <= 1,
        with equality only when the positive lies in the span of the pivots
        (u = 0). Their inner products are the matching scores with the
        cross-residual term left out:

            z.z' = s(x0, x0') - (k(x0, x0') - v.v') / (lam^2 N N'),

        which is what an explicit r-dimensional vector can give (the residual
        directions of two positives are not in any fixed r-dimensional
        space). Appending u / (lam N) as an extra coordinate would make every
        row a unit vector but replace k(x0, x0') - v.v' by u u', its
        Cauchy-Schwarz upper bound, giving large spurious scores to pairs of
        unrelated positives with large residuals; :meth:`similarity` gives
        the exact s. With ``exact=True`` the same holds with the block-inverse beta
        (z = beta_hat / |beta|; docs/math.md#kernel-similarity).

        Consequence: the explicit vectors rank well only when the residuals
        are small (small ``trace_error_``). On the synthetic demo corpus
        (n = 3000, d = 128, rbf gamma 0.5, lam 1e-3) retrieval mAP with z.z'
        was 0.63 at rank 32 (trace error 0.13) and 0.97 at rank 128 (0.06),
        against 0.96 and 0.99 with :meth:`similarity`: near-duplicates share
        residual directions, which only the cross term sees. Use a rank that
        brings ``trace_error_`` down, or re-rank a shortlist with
        :meth:`similarity`.

        ``normalize="unit"`` returns beta / |beta| instead: rows of unit length
        whose inner products are the cosines of the r-dimensional parts only
        (no exact relation to s; slightly better rankings than "h" in the
        experiment above, 0.72 and 0.98).

        numpy in, numpy out; dask in, lazy dask out with the row chunks of ``X``.
        ``dtype``: of the result (default: float64 for float64 rows, float32 for any other
        dtype, float16 and integers included: :func:`~slem_dask.core.validation.output_dtype`;
        computed in float64).
        """
        if normalize not in ("h", "unit"):
            raise ValueError(
                f"normalize must be 'h' (rows beta / |h|) or 'unit' (rows "
                f"beta / |beta|), got {normalize!r}"
            )
        X = self._check_positives(X)
        dtype = self._output_dtype(X, dtype)
        enc = self._encoder()
        unit = normalize == "unit"
        if is_dask_array(X):
            return lazy_encode(X, enc, self.rank_, self.fingerprint_, dtype, unit)
        return _encode_block(X, enc, "X", dtype, unit)

    def similarity(self, P: Rows, Q: Rows) -> Array:
        """Exact matching scores s(x0, x0') with the residual cross term, (len(P), len(Q)).

        s = [beta.beta' + (k(x0, x0') - v.v') / lam^2] / (N N') (docs/math.md#kernel-similarity,
        as in the authors' MATLAB code); with ``exact=True`` the block-inverse solution
        (docs/math.md#block-inverse). numpy unless
        either input is a dask array (then lazy, chunked like P x Q).
        """
        P = self._check_positives(P, "P")
        Q = self._check_positives(Q, "Q")
        enc = self._encoder()
        if not (is_dask_array(P) or is_dask_array(Q)):
            return _similarity_block(
                _packed_block(P, enc, "P"), P, _packed_block(Q, enc, "Q"), Q, enc
            )
        return lazy_similarity(P, Q, enc, self.rank_, self.fingerprint_)

    # -- persistence --------------------------------------------------
    _ARRAYS = ("pivots", "pivot_rows", "pivot_factor", "factor_mean", "g_factor")

    def _state(self):
        info = {
            "n_samples": self.n_samples_,
            "n_features": self.n_features_in_,
            "input_dtype": self.input_dtype_,
            "rank": self.rank_,
            "trace": self.trace_,
            "trace_error": self.trace_error_,
            "residual_trace": self.residual_trace_,
            "n_passes": self.n_passes_,
            "seed": self.seed_,
            "strategy": getattr(self, "strategy_", None),
            "gamma_": self.gamma_,
        }
        arrays = {name: getattr(self, name + "_") for name in self._ARRAYS}
        if getattr(self, "factor_scatter_", None) is not None:
            arrays["factor_scatter"] = self.factor_scatter_
        if self.exact:
            arrays["negatives"] = self.negatives_
            arrays["factor"] = self.factor_
        return info, arrays

    def _set_state(self, info, arrays):
        for name in self._ARRAYS:
            setattr(self, name + "_", arrays[name])
        self.pivots_ = self.pivots_.astype(np.int64)
        if self.exact:
            self.negatives_ = arrays["negatives"]
            self.factor_ = arrays["factor"]
        self.rank_ = int(info["rank"])
        # a store written before gamma could be relative: its gamma was absolute
        self.gamma_ = float(info["gamma_"] if "gamma_" in info else self.gamma)
        self.trace_ = float(info["trace"])
        self.trace_error_ = float(info["trace_error"])
        # Stores written before these were kept: no factor_scatter (update refuses),
        # the residual trace from the trace error.
        self.factor_scatter_ = arrays.get("factor_scatter")
        self.residual_trace_ = float(info.get("residual_trace", self.trace_error_ * self.trace_))
        self.strategy_ = info.get("strategy")
        self.strategy_reason_ = None
        self.n_passes_ = int(info["n_passes"])
        self.seed_ = int(info["seed"])
        self.n_samples_ = int(info["n_samples"])
        self.n_features_in_ = int(info["n_features"])
        self.input_dtype_ = info["input_dtype"]
