"""Kernel functions of the kernel SLEM (docs/math.md#kernels).

The kernels are those of the authors' MATLAB code:

=============  ==============================================================
linear         k(x, y) = x.y
rbf            k(x, y) = exp(-gamma |x - y|^2)
quad           k(x, y) = x.y + gamma (x.y)^2
poly           k(x, y) = (c + sqrt(gamma) x.y)^degree - c^degree,  c = 1 / (2 sqrt(gamma))
intersection   k(x, y) = sum_i min(x_i, y_i)                  (histograms, x, y >= 0)
chi2           k(x, y) = sum_i 2 x_i y_i / (x_i + y_i)        (histograms, x, y >= 0)
=============  ==============================================================

``chi2`` is the *additive* chi-squared kernel (positive definite on
non-negative vectors), with the convention 0/0 := 0 for coordinates where
x_i = y_i = 0. It is not the exponentiated chi-squared kernel
exp(-gamma sum (x_i - y_i)^2 / (x_i + y_i)). Both histogram kernels are
defined for non-negative inputs only and :func:`check_histogram` rejects
anything else. ``poly`` is positive definite for integer ``degree >= 1``
(binomial expansion: every term is a positive multiple of (x.y)^k, k >= 1).

All functions compute in float64 whatever the input dtype and never form
more than about ``_MAX_TEMP`` temporaries at once.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .validation import check_positive_float, rows_text

__all__ = [
    "KERNELS",
    "HISTOGRAM_KERNELS",
    "check_kernel_params",
    "unused_params",
    "check_histogram",
    "kernel_matrix",
    "kernel_diagonal",
]

KERNELS = ("linear", "rbf", "quad", "poly", "intersection", "chi2")
HISTOGRAM_KERNELS = ("intersection", "chi2")
_USES_GAMMA = ("rbf", "quad", "poly")
_USES_DEGREE = ("poly",)

#: Elements of the (rows, cols, d) temporaries of the histogram kernels.
_MAX_TEMP = 2**22


def check_kernel_params(kernel, gamma, degree) -> tuple[str, float, int]:
    """Validate a kernel name and the parameters it uses; return them normalized.

    ``gamma`` is checked only for the kernels that use it (rbf, quad, poly),
    ``degree`` only for poly.
    """
    if not isinstance(kernel, str) or kernel not in KERNELS:
        raise ValueError(
            f"kernel must be one of {', '.join(repr(k) for k in KERNELS)}; got {kernel!r}"
        )
    if kernel in _USES_GAMMA:
        gamma = check_positive_float(
            gamma,
            "gamma",
            f" (kernel={kernel!r}); for L2-normalized descriptors try gamma between 0.1 and 10",
        )
    else:  # unused by this kernel: not checked, passed through as 1.0
        gamma = 1.0
    if kernel in _USES_DEGREE:
        if isinstance(degree, bool) or not isinstance(degree, numbers.Integral):
            if isinstance(degree, float) and degree.is_integer():
                degree = int(degree)
            else:
                raise TypeError(
                    f"degree must be an integer >= 1 for kernel='poly', got {degree!r} of "
                    f"type {type(degree).__name__} (a non-integer power is not a positive "
                    f"definite kernel)"
                )
        degree = int(degree)
        if degree < 1:
            raise ValueError(f"degree must be an integer >= 1 for kernel='poly', got {degree!r}")
    else:
        degree = 1
    return kernel, gamma, degree


def unused_params(kernel: str) -> tuple[str, ...]:
    """The parameters of :func:`check_kernel_params` that ``kernel`` ignores (gamma
    outside rbf, quad and poly; degree outside poly): reports leave them out, since a
    value printed for them would claim an effect they do not have."""
    return tuple(
        name
        for name, users in (("gamma", _USES_GAMMA), ("degree", _USES_DEGREE))
        if kernel not in users
    )


def check_histogram(x: np.ndarray, kernel: str, name: str, row_offset: int = 0) -> None:
    """Raise if a histogram kernel receives a negative value (rows named, as in validation)."""
    if kernel not in HISTOGRAM_KERNELS:
        return
    negative = (np.asarray(x) < 0).any(axis=1)
    if negative.any():
        bad = np.flatnonzero(negative) + row_offset
        shown = rows_text(bad, bad.size)
        raise ValueError(
            f"{name} has {bad.size} row(s) with negative values (rows {shown}), but "
            f"kernel={kernel!r} is defined for non-negative histograms only; use "
            f"non-negative features (e.g. un-centred bag-of-words counts) or another kernel"
        )


def _as64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _histogram(x: np.ndarray, y: np.ndarray, kernel: str) -> np.ndarray:
    out = np.empty((x.shape[0], y.shape[0]))
    step = max(1, _MAX_TEMP // max(1, y.shape[0] * x.shape[1]))
    for i in range(0, x.shape[0], step):
        a = x[i : i + step, None, :]
        if kernel == "intersection":
            out[i : i + step] = np.minimum(a, y[None, :, :]).sum(axis=2)
        else:
            num = 2.0 * a * y[None, :, :]
            den = a + y[None, :, :]
            out[i : i + step] = np.divide(num, den, out=np.zeros_like(num), where=den > 0).sum(
                axis=2
            )
    return out


def kernel_matrix(x, y, kernel: str, gamma: float = 1.0, degree: int = 2) -> np.ndarray:
    """K(x, y): (len(x), len(y)) float64 matrix of kernel values between rows."""
    x, y = _as64(x), _as64(y)
    if kernel in HISTOGRAM_KERNELS:
        return _histogram(x, y, kernel)
    dot = x @ y.T
    if kernel == "linear":
        return dot
    if kernel == "rbf":
        sq = np.einsum("ij,ij->i", x, x)[:, None] + np.einsum("ij,ij->i", y, y)[None, :]
        sq -= 2.0 * dot
        np.maximum(sq, 0.0, out=sq)  # rounding can make |x - x|^2 slightly negative
        return np.exp(-gamma * sq, out=sq)
    if kernel == "quad":
        return dot + gamma * dot * dot
    if kernel == "poly":
        root = math.sqrt(gamma)
        c = 0.5 / root
        return (c + root * dot) ** degree - c**degree
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def kernel_diagonal(x, kernel: str, gamma: float = 1.0, degree: int = 2) -> np.ndarray:
    """k(x_i, x_i) for every row, in O(n d) (no n x n matrix)."""
    x = _as64(x)
    if kernel == "rbf":
        return np.ones(x.shape[0])
    if kernel in HISTOGRAM_KERNELS:
        # min(a, a) = a and 2 a a / (a + a) = a (0/0 := 0 gives 0 = a too).
        return x.sum(axis=1)
    sq = np.einsum("ij,ij->i", x, x)
    if kernel == "linear":
        return sq
    if kernel == "quad":
        return sq + gamma * sq * sq
    if kernel == "poly":
        root = math.sqrt(gamma)
        c = 0.5 / root
        return (c + root * sq) ** degree - c**degree
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
