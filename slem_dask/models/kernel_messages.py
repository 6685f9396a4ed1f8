"""What a kernel model says when a fit goes wrong or barely captures the kernel: the
trace-error warning's text and the errors for values too large or not finite, split
from :mod:`slem_dask.models.kernel` (which raises and warns them)."""

from __future__ import annotations

import numpy as np

from ..core.kernels import _USES_GAMMA
from ..core.validation import (
    MAX_ABS_VALUE,
    LargeValuesError,
    NonFiniteRowsError,
    nonfinite_rows_error,
)
from ..parallel.blocks import locate_nonfinite_rows

__all__ = [
    "TRACE_ERROR_WARNING",
    "TraceErrorWarning",
    "large_kernel_values",
    "located_nonfinite_rows_error",
    "normalized_pivots",
    "weak_factor_message",
]

#: A fit (or update) whose factor leaves more than this fraction of the kernel's trace
#: (``trace_error_``) warns: its encodings keep almost nothing of the kernel.
TRACE_ERROR_WARNING = 0.9


class TraceErrorWarning(UserWarning):
    """The incomplete Cholesky factor captures almost none of the kernel (see
    :data:`TRACE_ERROR_WARNING`): gamma too large for the descriptors, or rank too small."""


def normalized_pivots(model) -> bool:
    """Whether the pivots are unit rows (the descriptors are L2-normalized already:
    advice to normalize them would send the user the wrong way)."""
    norms = np.linalg.norm(np.asarray(model.pivot_rows_, dtype=np.float64), axis=1)
    return bool(norms.size) and bool(np.all(np.abs(norms - 1.0) <= 1e-3))


def weak_factor_message(model) -> str | None:
    """The :class:`TraceErrorWarning` text for a fitted :class:`~.kernel.KernelSLEM`
    whose ``trace_error_`` is above :data:`TRACE_ERROR_WARNING`; None if it is not."""
    if not model.trace_error_ > TRACE_ERROR_WARNING:
        return None
    gamma = model.kernel in _USES_GAMMA
    fix = (
        "a larger rank (--rank)"
        if model.rank is not None
        else f"a smaller tol (--tol, now {model.tol})"
    )
    if gamma:
        fix += (
            ", or a smaller gamma (--gamma)"
            if normalized_pivots(model)
            else ", a smaller gamma (--gamma) or L2-normalized descriptors"
        )
    captured = model.trace_ - model.residual_trace_
    if gamma and captured <= 1.05 * model.rank_ * model.trace_ / model.n_samples_:
        # each pivot took little more than its own k(x, x): K is nearly diagonal, and
        # more pivots would only add themselves
        fix = (
            f"a smaller gamma (--gamma): at this gamma the kernel matrix is nearly "
            f"diagonal (the {model.rank_} pivots hold {captured:.4g} of a trace of "
            f"{model.trace_:.4g}, about their own k(x, x)), and a larger rank would "
            f"only add the pivots themselves"
        )
    return (
        f"trace error {model.trace_error_:.4f} (residual trace / trace) is above "
        f"{TRACE_ERROR_WARNING}: the incomplete Cholesky factor of the {model.kernel} kernel"
        f"{f' (gamma {model.gamma_:g})' if gamma else ''} with {model.rank_} pivots (rank "
        f"{model.rank if model.rank is not None else 'unlimited'}) captures almost none of "
        f"it, and the encodings keep little of the kernel; use {fix}"
    )


#: k(x, x) of the kernels whose values grow with gamma, as the messages write it.
_SELF_SIMILARITY = {
    "quad": "|x|^2 + gamma |x|^4",
    "poly": "(c + sqrt(gamma) |x|^2)^degree - c^degree",
}


def large_kernel_values(
    exc: LargeValuesError, kernel: str, gamma: float, degree: int
) -> LargeValuesError:
    """A factor of the quad or poly kernel beyond MAX_ABS_VALUE names gamma, not the
    descriptors: with L2-normalized rows only gamma makes it so large."""
    if kernel not in _SELF_SIMILARITY:
        return exc
    params = f"gamma {gamma:g}" + (f", degree {degree}" if kernel == "poly" else "")
    return LargeValuesError(
        exc.name,
        (
            f"values of the {kernel} kernel ({params}) beyond what slem-dask computes with: the "
            f"entries of its factor exceed {MAX_ABS_VALUE:.0e} (k(x, x) = "
            f"{_SELF_SIMILARITY[kernel]} reaches their square); use a smaller gamma (--gamma), "
            f"and L2-normalize the descriptors if their norms are large"
        ),
    )


def located_nonfinite_rows_error(X, row_offset: int = 0) -> NonFiniteRowsError:
    """NaN or inf rows met by a block task (which saw its block only), counted over all
    of ``X`` (whole rows per block: checked by check_rows) as LinearSLEM counts them: a
    second pass, on this error path only."""
    count, shown = locate_nonfinite_rows(X, row_offset=row_offset)
    return nonfinite_rows_error("X", count, shown, int(X.shape[0]))
