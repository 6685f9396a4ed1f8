"""Pivoted incomplete Cholesky pieces and the kernel SLEM closed forms (pure numpy).

Notation (docs/math.md#icd and docs/math.md#augmented-factor):

* ``F`` (called B in the papers) is the n x r incomplete Cholesky factor of the
  negatives' kernel matrix K, columns in pivot order, K ~ F F^T;
* ``I`` are the pivots and ``L = F(I, :)`` is lower triangular with
  L L^T = K(I, I); hence F = K(:, I) L^-T: a new point only needs the pivot
  rows and L;
* for a positive x0: v = L^-1 k(X_I, x0), u^2 = k(x0, x0) - |v|^2,
  mu = mean row of F, G = F^T F / n - mu mu^T + lam I.

The dask layer (:mod:`slem_dask.parallel.kernel`) maps the block functions
here over row blocks of the negatives; the client-side functions work on the
r x r (or candidates x candidates) matrices only.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg
from scipy.linalg import blas

from .blas_threads import factorization_threads
from .lapack import cholesky_lower
from .steps import long_step

__all__ = [
    "new_columns",
    "update_residual_diagonal",
    "accept_candidates",
    "g_cholesky",
    "lowrank_parts",
    "exact_parts",
    "similarity_from_parts",
]


def new_columns(
    k_cols: np.ndarray, f_rows: np.ndarray, f_piv: np.ndarray, chol_piv: np.ndarray
) -> np.ndarray:
    """Columns of F for a set T of new pivots, on one block of rows.

    E = K(rows, T) - F(rows, :t) F(T, :t)^T is the residual (Schur complement)
    block, R the lower Cholesky factor of E(T, T); the new columns are
    E R^-T. For one pivot this is the recursion of docs/math.md#icd:
    B(J, t) = (K(J, i_t) - sum_m B(J, m) B(i_t, m)) / B(i_t, t), with
    B(i_t, t) = sqrt(K(i_t, i_t) - sum_m B(i_t, m)^2) (erratum 1 applied).
    """
    resid = np.array(k_cols, dtype=np.float64, copy=True)
    if f_rows.shape[1]:
        resid -= f_rows @ f_piv.T
    if resid.shape[0] == 0:
        return resid
    # One BLAS-3 call (solve_triangular, one right-hand side at a time, costs far more
    # for small R): X R^T = E solved as R X^T = E^T, where E^T is the row-major E seen
    # column-major, so that E is neither transposed nor copied, and X comes back
    # row-major, as the rows of F are stored.
    return blas.dtrsm(1.0, chol_piv, resid.T, side=0, lower=1, trans_a=0, overwrite_b=1).T


def update_residual_diagonal(diag: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """diag(K - F F^T) after appending ``cols`` to F (clipped at 0 against rounding)."""
    out = diag - np.einsum("ij,ij->i", cols, cols)
    np.maximum(out, 0.0, out=out)
    return out


def accept_candidates(
    h: np.ndarray, sampled_diag: np.ndarray, uniforms: np.ndarray, floor: float, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rejection step of accelerated randomly pivoted Cholesky; a partial Cholesky of ``h``.

    ``h`` = K(S, S) - F(S, :) F(S, :)^T is the residual block of the candidates
    S, which were drawn i.i.d. with probability proportional to the residual
    diagonal (``sampled_diag`` holds their residual diagonal at that time).
    Candidate j is accepted with probability h_jj / sampled_diag_j, where h_jj
    is its residual after eliminating the candidates accepted before it
    (Epperly, Tropp and Webber 2024, "Embrace rejection", block RPCholesky
    with rejection sampling; docs/math.md#rpcholesky). Duplicates and candidates in the span of
    earlier ones have h_jj ~ 0 and are rejected. Greedy pivoting is the case
    of one candidate and ``uniforms = 0``.

    Returns (accepted positions in acceptance order, R) with R lower
    triangular and R R^T = h[acc][:, acc]; at most ``limit`` are accepted and
    none whose residual is <= ``floor``.
    """
    work = np.array(h, dtype=np.float64, copy=True)
    accepted: list[int] = []
    columns: list[np.ndarray] = []
    for j in range(work.shape[0]):
        if len(accepted) >= limit:
            break
        pivot = work[j, j]
        if not pivot > floor:
            continue
        if uniforms[j] * sampled_diag[j] >= pivot:
            continue
        col = work[:, j] / np.sqrt(pivot)
        work -= np.outer(col, col)
        accepted.append(j)
        columns.append(col)
    acc = np.asarray(accepted, dtype=np.int64)
    if not accepted:
        return acc, np.zeros((0, 0))
    r = np.stack(columns, axis=1)[acc]
    return acc, np.tril(r)


def g_cholesky(scatter: np.ndarray, count: int, lam: float) -> np.ndarray:
    """Lower Cholesky factor of G = F^T F / n - mu mu^T + lam I.

    ``scatter`` is the centred scatter of the rows of F (Chan statistics), so
    F^T F / n - mu mu^T = scatter / n is never formed by cancellation
    (docs/math.md#icd, docs/math.md#scatter).
    """
    g = scatter / count
    g = (g + g.T) * 0.5
    g[np.diag_indices_from(g)] += lam
    r = len(g)
    with factorization_threads(r), long_step(f"the Cholesky factor of G ({r} x {r})"):
        return cholesky_lower(g)  # the GIL released: workers of this process keep running


def _project(k_piv: np.ndarray, k_self: np.ndarray, pivot_factor: np.ndarray):
    """v = L^-1 k(X_I, x0) and u^2 = k(x0, x0) - |v|^2 >= 0 for each row
    (docs/math.md#augmented-factor)."""
    v = linalg.solve_triangular(pivot_factor, k_piv.T, lower=True, check_finite=False).T
    u2 = k_self - np.einsum("ij,ij->i", v, v)
    np.maximum(u2, 0.0, out=u2)
    return v, u2


def lowrank_parts(
    k_piv: np.ndarray,
    k_self: np.ndarray,
    pivot_factor: np.ndarray,
    mean: np.ndarray,
    g_factor: np.ndarray,
    lam: float,
):
    """(z, v, c) of the positives in the low-rank (MATLAB) model.

    beta = G^-1 (v - mu), N = sqrt(|beta|^2 + u^2 / lam^2) (docs/math.md#lowrank-model);
    z = beta / N and c = 1 / (lam N), so that
    s(x0, x0') = z.z' + c c' (k(x0, x0') - v.v') (docs/math.md#kernel-similarity).
    A positive with N = 0
    (v = mu and u = 0) has no direction and gets z = 0, c = 0.
    """
    v, u2 = _project(k_piv, k_self, pivot_factor)
    beta = linalg.cho_solve((g_factor, True), (v - mean).T, check_finite=False).T
    norm = np.sqrt(np.einsum("ij,ij->i", beta, beta) + u2 / lam**2)
    safe = np.where(norm > 0, norm, 1.0)
    z = beta / safe[:, None]
    c = np.where(norm > 0, 1.0 / (lam * safe), 0.0)
    z[norm == 0] = 0.0
    return z, v, c


def exact_parts(
    k_neg: np.ndarray,
    k_piv: np.ndarray,
    k_self: np.ndarray,
    pivot_factor: np.ndarray,
    factor: np.ndarray,
    pivots: np.ndarray,
    mean: np.ndarray,
    g_factor: np.ndarray,
    lam: float,
    in_span: float = 1e-10,
):
    """(z, v, c) of the positives with the augmented factor's w kept
    (docs/math.md#augmented-factor, docs/math.md#block-inverse).

    For each positive, w(J) = (k0(J) - F_J v) / u, w(I) = 0 is the coordinate of
    every negative along the positive's residual direction e0 = (phi(x0) -
    projection) / u; the negatives' rows [w_i, F_i] and the positive's row
    [u, v] are exact coordinates in span{phi(X_I), phi(x0)}. Then
    A = [[a00, a0^T], [a0, G]] (erratum 2 applied, docs/math.md#errata),
    a00 = |w|^2/n - wbar^2 + lam, a0 = F^T w / n - wbar mu, delta = [u - wbar; v - mu], and
    beta = A^-1 delta by the block inverse with G^-1:
    gamma = 1 / (a00 - a0^T G^-1 a0), beta0 = gamma (delta0 - a0^T G^-1 (v - mu)),
    beta_hat = G^-1 (v - mu) - beta0 G^-1 a0. theta only scales beta
    (docs/math.md#theta). Since (e0 | e0') = (k(x0, x0') - v.v') / (u u'),
    z = beta_hat / |beta| and c = beta0 / (u |beta|) give
    s = z.z' + c c' (k(x0, x0') - v.v') as in :func:`lowrank_parts`.
    A positive with u^2 <= in_span * k(x0, x0) lies in the span of the pivots:
    it has no residual direction, beta0 = 0 and c = 0.

    ``k_neg``: (m, n) kernel of the positives against all negatives; cost
    O(n r) per positive.
    """
    n = factor.shape[0]
    v, u2 = _project(k_piv, k_self, pivot_factor)
    centred = (v - mean).T
    g_d = linalg.cho_solve((g_factor, True), centred, check_finite=False).T
    m = v.shape[0]
    z = np.zeros_like(v)
    c = np.zeros(m)
    for i in range(m):
        u = np.sqrt(u2[i])
        if u2[i] <= in_span * max(k_self[i], 0.0) or u == 0:
            beta0, beta_hat = 0.0, g_d[i]
        else:
            w = (k_neg[i] - factor @ v[i]) / u
            w[pivots] = 0.0
            wbar = w.mean()
            a00 = w @ w / n - wbar * wbar + lam
            a0 = factor.T @ w / n - wbar * mean
            g_a0 = linalg.cho_solve((g_factor, True), a0, check_finite=False)
            gamma = 1.0 / (a00 - a0 @ g_a0)
            beta0 = gamma * ((u - wbar) - a0 @ g_d[i])
            beta_hat = g_d[i] - g_a0 * beta0
        norm = np.sqrt(beta_hat @ beta_hat + beta0 * beta0)
        if norm > 0:
            z[i] = beta_hat / norm
            c[i] = beta0 / (u * norm) if beta0 != 0 else 0.0
    return z, v, c


def similarity_from_parts(zp, vp, cp, zq, vq, cq, k_pq) -> np.ndarray:
    """s(x0, x0') = z.z' + c c' (k(x0, x0') - v.v') for all pairs; (len(p), len(q))."""
    cross = k_pq - vp @ vq.T
    return zp @ zq.T + cp[:, None] * cq[None, :] * cross
