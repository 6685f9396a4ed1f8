"""Kernel SLEM's defaults: plain values, importable without numpy (the command line's
parser reads them for its help texts before anything heavy is imported).

:mod:`slem_dask.models.kernel_defaults` explains them and resolves a relative gamma.
"""

from __future__ import annotations

__all__ = ["DEFAULT_GAMMA", "KERNEL_DEFAULTS"]

#: gamma relative to the negatives' scale: 1/16 of 1 / (median squared distance).
#: Measured in docs/troubleshooting.md ("Defaults: kernel SLEM").
DEFAULT_GAMMA = "0.0625x"

#: The one set of kernel SLEM's defaults (library, CLI, job specs, evaluate, demo).
#: rank: at most 1024 pivots, fewer once the factor keeps 1 - tol (99.9%) of the kernel
#: matrix's trace; rpcholesky (many pivots per pass) with a fixed seed: reruns give the
#: same model.
KERNEL_DEFAULTS: dict = {
    "kernel": "rbf",
    "gamma": DEFAULT_GAMMA,
    "degree": 2,
    "lam": 1e-3,
    "rank": 1024,
    "pivoting": "rpcholesky",
    "tol": 1e-3,
    "random_state": 0,
}
