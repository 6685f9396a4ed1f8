"""PCA whitening and plain L2 normalization of descriptors: the non-SLEM baselines.

PCA whitening (Jegou & Chum, ECCV 2012) learned on the negatives: with
Sigma = V diag(s) V^T, keep the top ``k`` eigenvectors and map
x -> diag(s_k + eps)^(-1/2) V_k^T (x - mu), then L2-normalize. With k = d and
eps = lam its cosine is (x - mu)^T A^-1 (x' - mu) / norms, A = Sigma + lam I;
linear SLEM's is (x - mu)^T A^-2 (x' - mu) / norms: the two differ by one power
of A^-1 (docs/math.md#whitening).
"""

from __future__ import annotations

import numpy as np

from .blas_threads import factorization_threads
from .lapack import symmetric_eigh
from .steps import long_step

__all__ = [
    "normalize_rows",
    "pca_whitening",
    "gram_eigen",
    "components_from_gram",
    "whiten_rows",
    "complement_projection",
]


def normalize_rows(rows, dtype=np.float64) -> np.ndarray:
    """Rows divided by their L2 norm, in float64; an all-zero row stays 0."""
    x = np.array(rows, dtype=np.float64, order="C", copy=True)
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    np.divide(x, norms[:, None], out=x, where=norms[:, None] > 0)
    x[norms == 0] = 0.0
    return x.astype(dtype, copy=False)


def pca_whitening(cov: np.ndarray, n_components: int | None, eps: float):
    """(components (d, k), variances (k,), projection (d, k)) of a covariance matrix.

    Components are sorted by decreasing variance, each with its largest-magnitude
    coordinate made positive (a deterministic sign). projection = components /
    sqrt(variances + eps), the whitening map applied to centred rows. The
    eigendecomposition releases the GIL and uses every BLAS thread
    (:func:`slem_dask.core.lapack.symmetric_eigh`).
    """
    d = cov.shape[0]
    k = d if n_components is None else int(n_components)
    with factorization_threads(d), long_step(f"the eigendecomposition of the {d} x {d} covariance"):
        values, vectors = symmetric_eigh(cov)
    return _sorted_components(values[d - k :], vectors[:, d - k :], eps)


def _sorted_components(values: np.ndarray, vectors: np.ndarray, eps: float):
    order = np.argsort(values)[::-1]
    values = np.maximum(values[order], 0.0)  # rounding can make a null variance -1e-17
    vectors = np.ascontiguousarray(vectors[:, order])
    k = vectors.shape[1]
    signs = np.sign(vectors[np.argmax(np.abs(vectors), axis=0), np.arange(k)])
    vectors *= np.where(signs == 0, 1.0, signs)
    return vectors, values, vectors / np.sqrt(values + eps)


def gram_eigen(gram: np.ndarray, n: int, n_components: int | None):
    """(variances (r,), U (n, r)) from the Gram matrix ``gram`` = X_c X_c^T of the n
    centred negatives, when n < d: Sigma = X_c^T X_c / n and gram / n share their nonzero
    eigenvalues, and Sigma's eigenvectors are X_c^T U / sqrt(n s) (the cost is that of
    the smaller side: an n x n eigendecomposition instead of a d x d one). Keeps the
    ``n_components`` largest (None: all above rounding, at most n - 1)."""
    with (
        factorization_threads(n),
        long_step(f"the eigendecomposition of the negatives' {n} x {n} Gram matrix"),
    ):
        values, vectors = symmetric_eigh(gram / n)
    values, vectors = values[::-1], vectors[:, ::-1]
    floor = max(values[0], 0.0) * n * np.finfo(np.float64).eps
    rank = int(np.count_nonzero(values > floor))
    keep = rank if n_components is None else min(int(n_components), rank)
    return values[:keep], np.ascontiguousarray(vectors[:, :keep])


def components_from_gram(product: np.ndarray, variances: np.ndarray, n: int, eps: float):
    """(components, variances, projection) as :func:`pca_whitening` gives them, from
    ``product`` = X_c^T U (d, r) and the variances of :func:`gram_eigen`."""
    vectors = product / np.sqrt(n * variances)
    return _sorted_components(variances, vectors, eps)


def whiten_rows(
    rows,
    mean: np.ndarray,
    projection: np.ndarray,
    dtype=np.float64,
    components: np.ndarray | None = None,
    complement_scale: float = 0.0,
) -> np.ndarray:
    """L2-normalized whitened rows: normalize((rows - mean) @ projection).

    With ``components`` V (d, r < d) and ``complement_scale`` c = eps^-1/2: all d
    directions are whitened, the d - r of zero variance (Sigma's null space, fitted from
    fewer negatives than features) scaled by c. Their basis is arbitrary, so the rows
    are returned in the original basis, (Sigma + eps I)^-1/2 (x - mu) =
    c (x - mu) + V (diag(s + eps)^-1/2 - c) V^T (x - mu), ``projection`` being
    V (diag(s + eps)^-1/2 - c) (:func:`complement_projection`): the inner products of
    whitening in Sigma's eigenbasis with every component kept, at 2 d r per row."""
    centred = np.array(rows, dtype=np.float64, order="C", copy=True)
    centred -= mean
    if components is None:
        return normalize_rows(centred @ projection, dtype)
    inside = centred @ projection
    centred *= complement_scale
    centred += inside @ components.T
    return normalize_rows(centred, dtype)


def complement_projection(components: np.ndarray, variances: np.ndarray, eps: float):
    """V (diag(s + eps)^-1/2 - eps^-1/2), the ``projection`` of :func:`whiten_rows` when
    Sigma's null space is whitened too."""
    return components * (1.0 / np.sqrt(variances + eps) - 1.0 / np.sqrt(eps))
