"""LAPACK factorizations that let other threads run while they compute.

scipy's f2py wrappers (``scipy.linalg.lapack.dpotrf``, ``linalg.cholesky``, ``linalg.eigh``)
hold the GIL for the whole call: at d = 8192 a Cholesky inverse takes tens of seconds,
an eigendecomposition minutes, and in a process that also runs dask workers on threads
(``--local-cluster auto`` on a small input) their event loops stop answering the
scheduler, which drops them ("No valid workers found"; issue 39: a 10 ms sleeper thread
ran 3 times of ~139 during scipy's eigh). Here the same LAPACK routines that scipy links
(``scipy.linalg.cython_lapack``'s function pointers, so the results are bitwise those of
``scipy.linalg.lapack``) are called through ctypes, which releases the GIL for the call;
numpy's ``linalg.eigh`` releases it itself. Each call also uses every BLAS thread the
caller allows (:func:`slem_dask.core.blas_threads.factorization_threads`).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

# imported here, not when first called: it loads the LAPACK (scipy's OpenBLAS) whose
# threads core.blas_threads sets, and that scans the loaded libraries once
from scipy.linalg import cython_lapack

__all__ = ["cholesky_lower", "cholesky_inverse_in_place", "symmetric_eigh"]

#: The C signature scipy's cython_lapack gives dpotrf and dpotri (LAPACK's 32-bit int).
_SIGNATURE = b"void (char *, int *, __pyx_t_5scipy_6linalg_13cython_lapack_d *, int *, int *)"


@functools.cache
def _routine(name: str):
    """LAPACK ``name`` (uplo, n, a, lda, info) as a ctypes function (the GIL is released
    while it runs), or None where scipy's capsule has another signature."""
    capsule = cython_lapack.__pyx_capi__.get(name)
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    signature = get_name(capsule) if capsule is not None else None
    if signature != _SIGNATURE:  # pragma: no cover - another scipy build
        return None
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    c_int_p = ctypes.POINTER(ctypes.c_int)
    prototype = ctypes.CFUNCTYPE(None, ctypes.c_char_p, c_int_p, ctypes.c_void_p, c_int_p, c_int_p)
    return prototype(get_pointer(capsule, signature))


def _call(name: str, a: np.ndarray) -> int:
    """LAPACK ``name`` on the lower triangle of the Fortran-ordered square float64 ``a``,
    in place; returns LAPACK's info."""
    routine = _routine(name)
    if routine is None:  # pragma: no cover - holds the GIL, as scipy always did
        from scipy.linalg import lapack

        if name == "dpotrf":
            out, info = lapack.dpotrf(a, lower=True, clean=False, overwrite_a=True)
        else:
            out, info = lapack.dpotri(a, lower=True, overwrite_c=True)
        if not np.shares_memory(out, a):
            a[...] = out
        return int(info)
    order, info = ctypes.c_int(a.shape[0]), ctypes.c_int(0)
    routine(b"L", ctypes.byref(order), a.ctypes.data, ctypes.byref(order), ctypes.byref(info))
    return int(info.value)


def cholesky_inverse_in_place(a: np.ndarray) -> tuple[int, int]:
    """(info of dpotrf, info of dpotri) for a C-ordered symmetric float64 ``a``, which
    becomes A^-1 in its upper triangle (its lower one is left as it was).

    LAPACK sees ``a``'s buffer as a.T, whose lower triangle is a's upper one; no copy
    (at d = 8192 each d x d float64 matrix is 512 MiB). dpotri runs only when dpotrf
    succeeded (info 0)."""
    if not (a.flags.c_contiguous and a.dtype == np.float64):
        raise ValueError("cholesky_inverse_in_place needs a C-ordered float64 matrix")
    work = a.T  # Fortran-ordered view of the same memory
    info = _call("dpotrf", work)
    if info != 0:
        return info, 0
    return 0, _call("dpotri", work)


def cholesky_lower(a: np.ndarray) -> np.ndarray:
    """Lower Cholesky factor of the symmetric positive definite ``a`` (as
    ``scipy.linalg.cholesky(a, lower=True)``), with the GIL released."""
    work = np.array(a, dtype=np.float64, order="F", copy=True)
    info = _call("dpotrf", work)
    if info > 0:
        raise np.linalg.LinAlgError(
            f"{info}-th leading minor of the array is not positive definite"
        )
    if info < 0:  # pragma: no cover
        raise ValueError(f"LAPACK dpotrf: illegal argument {-info}")
    return np.tril(work)


def symmetric_eigh(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eigenvalues ascending, eigenvectors as columns) of the symmetric ``a``: numpy's
    ``linalg.eigh`` (LAPACK syevd, multi-threaded through the BLAS), which releases the
    GIL, unlike ``scipy.linalg.eigh``."""
    return np.linalg.eigh(np.asarray(a, dtype=np.float64))
