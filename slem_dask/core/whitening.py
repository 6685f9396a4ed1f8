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
from scipy import linalg

__all__ = ["normalize_rows", "pca_whitening", "whiten_rows"]


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
    sqrt(variances + eps), the whitening map applied to centred rows.
    """
    d = cov.shape[0]
    k = d if n_components is None else int(n_components)
    values, vectors = linalg.eigh(np.asarray(cov, dtype=np.float64), subset_by_index=[d - k, d - 1])
    order = np.argsort(values)[::-1]
    values = np.maximum(values[order], 0.0)  # rounding can make a null variance -1e-17
    vectors = vectors[:, order]
    signs = np.sign(vectors[np.argmax(np.abs(vectors), axis=0), np.arange(k)])
    vectors *= np.where(signs == 0, 1.0, signs)
    return vectors, values, vectors / np.sqrt(values + eps)


def whiten_rows(rows, mean: np.ndarray, projection: np.ndarray, dtype=np.float64) -> np.ndarray:
    """L2-normalized whitened rows: normalize((rows - mean) @ projection)."""
    centred = np.array(rows, dtype=np.float64, order="C", copy=True)
    centred -= mean
    return normalize_rows(centred @ projection, dtype)
