"""The checks of :class:`~.kernel.KernelSLEM`'s parameters, run by each method that
uses them (as scikit-learn estimators do): one line naming the parameter, its value and
what it takes."""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..core.kernels import check_kernel_params
from ..core.validation import check_positive_float
from ..parallel.kernel_stream import check_strategy, choose_strategy
from .kernel_defaults import parse_gamma

__all__ = ["PIVOTING", "check_params"]

PIVOTING = ("greedy", "rpcholesky")


def _check_int_or_none(value, name: str, hint: str = ""):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an integer >= 1 or None, got {value!r} of type "
            f"{type(value).__name__}{hint}"
        )
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}{hint}")
    return int(value)


def check_params(model):
    """(kernel, gamma, degree, lam, rank) of a :class:`~.kernel.KernelSLEM`, checked;
    raises on the first bad parameter, in the order of the constructor's. gamma is None
    when it is relative to the negatives' scale ("<c>x"; the fitted one is ``gamma_``)."""
    relative = isinstance(model.gamma, str)
    if relative:  # "<c>x": resolved against the negatives at fit time (gamma_)
        parse_gamma(model.gamma)
    kernel, gamma, degree = check_kernel_params(
        model.kernel, 1.0 if relative else model.gamma, model.degree
    )
    lam = check_positive_float(
        model.lam, "lam", "; typical values are 1e-4 to 1e-1 for L2-normalized descriptors"
    )
    rank = _check_int_or_none(
        model.rank, "rank", "; the number of pivots of the incomplete Cholesky factor, e.g. 256"
    )
    if model.pivoting not in PIVOTING:
        raise ValueError(
            f"pivoting must be one of {', '.join(map(repr, PIVOTING))}; got {model.pivoting!r}"
        )
    if (
        isinstance(model.tol, bool)
        or not isinstance(model.tol, numbers.Real)
        or not (0 <= float(model.tol) < 1)
        or math.isnan(float(model.tol))
    ):
        raise ValueError(
            f"tol must be a number in [0, 1), the residual trace fraction at "
            f"which the factorization stops, got {model.tol!r}; e.g. 1e-3 "
            f"(0: stop on rank only)"
        )
    seed = model.random_state
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0
    ):
        raise TypeError(f"random_state must be a non-negative integer or None, got {seed!r}")
    if not isinstance(model.exact, (bool, np.bool_)):
        raise TypeError(f"exact must be True or False, got {model.exact!r}")
    check_strategy(model.strategy)
    if model.strategy == "streaming" and model.exact:
        choose_strategy(model.strategy, None, None, True)  # raises, naming the fix
    return kernel, (None if relative else gamma), degree, lam, rank
