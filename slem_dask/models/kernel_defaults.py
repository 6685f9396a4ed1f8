"""Kernel SLEM's defaults, in one place, and its gamma relative to the negatives' scale.

The library (:class:`~.kernel.KernelSLEM`), ``slem-dask fit --kernel``, job specs,
``slem-dask evaluate`` and the demo all take their defaults from :data:`KERNEL_DEFAULTS`
(they were four sets: the library's gamma 0.1 and random seed, the CLI's seed 0,
evaluate's gamma 0.5 and rank 256; issue 39).

An rbf kernel exp(-gamma |x - y|^2) only means something relative to the squared
distances between the rows: gamma 0.5 suits rows at squared distance ~2 and makes every
pair of rows at distance 100 orthogonal. ``gamma="<c>x"`` is c divided by the median
squared distance between the negatives (quad and poly, whose gamma multiplies x.y: by
the median squared norm), measured on a fixed sample of them at fit time and kept as
``gamma_``. An absolute gamma far from that scale warns once
(:class:`GammaScaleWarning`), naming the relative value.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..core.kernel_defaults import DEFAULT_GAMMA, KERNEL_DEFAULTS
from ..core.validation import (
    caller_stacklevel,
    check_positive_float,
    is_dask_array,
    parse_relative,
)

__all__ = [
    "KERNEL_DEFAULTS",
    "DEFAULT_GAMMA",
    "GammaScaleWarning",
    "parse_gamma",
    "data_scale",
    "fitted_gamma",
]

#: Rows of the negatives whose pairwise squared distances give the scale (the first ones:
#: one block of a dask array, read once).
SCALE_ROWS = 1000
#: An absolute gamma times the scale outside this range warns.
GAMMA_SCALE_RANGE = (1e-2, 4.0)


class GammaScaleWarning(UserWarning):
    """An absolute gamma far from the negatives' scale."""


def parse_gamma(value) -> tuple[float, bool]:
    """(c, relative) of a gamma: a number > 0 is absolute; a text "<c>x" is c over the
    negatives' scale (:func:`data_scale`), e.g. "0.0625x"."""
    relative = parse_relative(
        value,
        "gamma",
        f"a number > 0 or a number followed by 'x' (that many times 1 / the negatives' "
        f"median squared distance, e.g. '{DEFAULT_GAMMA}', the default)",
    )
    if relative is not None:
        return relative, True
    hint = (
        f"; or a text 'Cx', C over the negatives' median squared distance (e.g. '{DEFAULT_GAMMA}')"
    )
    return check_positive_float(value, "gamma", hint), False


def data_scale(X, kernel: str) -> float:
    """The median squared distance between the first :data:`SCALE_ROWS` negatives (rbf),
    or their median squared norm (quad, poly: their gamma multiplies x.y); 1.0 when it is
    0 (identical rows)."""
    sample = X[:SCALE_ROWS]
    if is_dask_array(sample):
        sample = sample.compute()
    rows = np.asarray(sample, dtype=np.float64)
    # non-finite rows are the fit's own error, named by row; here they only make the
    # scale non-finite (then 1.0), without numpy's RuntimeWarning of inf - inf
    with np.errstate(invalid="ignore", over="ignore"):
        squares = np.einsum("ij,ij->i", rows, rows)
        if kernel == "rbf":
            upper = np.triu_indices(len(rows), k=1)
            values = (squares[:, None] + squares[None, :] - 2.0 * rows @ rows.T)[upper]
            values = np.maximum(values, 0.0)
        else:
            values = squares
        scale = float(np.median(values)) if values.size else 0.0
    return scale if scale > 0 and np.isfinite(scale) else 1.0


def fitted_gamma(gamma, X, kernel: str, uses_gamma: bool) -> float:
    """The absolute gamma a fit on the negatives ``X`` uses; warns once when an absolute
    one is far from their scale."""
    if not uses_gamma:
        return 1.0
    c, relative = parse_gamma(gamma)
    scale = data_scale(X, kernel)
    if relative:
        return c / scale
    low, high = GAMMA_SCALE_RANGE
    if not low <= c * scale <= high:
        what = "median squared distance" if kernel == "rbf" else "median squared norm"
        effect = (
            "every pair of negatives is nearly orthogonal in the kernel's space (k ~ "
            f"exp(-{c * scale:.3g}))"
            if c * scale > high
            else "the kernel is nearly flat over the negatives"
        )
        warnings.warn(
            GammaScaleWarning(
                f"gamma={c:g} is {c * scale:.3g} times 1 / the negatives' {what} "
                f"({scale:.3g}): {effect}; give it relative to their scale, e.g. "
                f"--gamma {DEFAULT_GAMMA} (= {parse_gamma(DEFAULT_GAMMA)[0] / scale:.3g} here)"
            ),
            stacklevel=caller_stacklevel(),
        )
    return c
