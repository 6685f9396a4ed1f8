"""Kernel SLEM against brute-force dense references kept in this file.

References: kernels written element by element; the textbook greedy pivoted
Cholesky on the dense kernel matrix (docs/math.md#icd, erratum 1 applied); and
the kernel exemplar problem (docs/math.md#kernel-primal, square loss), solved
densely through the representer theorem on a set of support points, intercept
included.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import linalg

from slem_dask import KernelSLEM, LinearSLEM, load_model
from slem_dask.core.cholesky import accept_candidates
from slem_dask.core.kernels import KERNELS, kernel_diagonal, kernel_matrix
from slem_dask.parallel.kernel import CholeskyConfig, incomplete_cholesky

PARAMS = {
    "linear": {},
    "rbf": {"gamma": 0.5},
    "quad": {"gamma": 0.3},
    "poly": {"gamma": 0.7, "degree": 3},
    "intersection": {},
    "chi2": {},
}


# -- dense references -----------------------------------------------------------
def dense_kernel(x, y, kernel, gamma=1.0, degree=2):
    """Element by element, straight from the formulas."""
    out = np.empty((len(x), len(y)))
    for i, a in enumerate(np.asarray(x, dtype=np.float64)):
        for j, b in enumerate(np.asarray(y, dtype=np.float64)):
            dot = float(a @ b)
            if kernel == "linear":
                val = dot
            elif kernel == "rbf":
                val = np.exp(-gamma * np.sum((a - b) ** 2))
            elif kernel == "quad":
                val = dot + gamma * dot**2
            elif kernel == "poly":
                c = 1 / (2 * np.sqrt(gamma))
                val = (c + np.sqrt(gamma) * dot) ** degree - c**degree
            elif kernel == "intersection":
                val = np.minimum(a, b).sum()
            elif kernel == "chi2":
                val = sum(2 * p * q / (p + q) for p, q in zip(a, b, strict=True) if p + q > 0)
            out[i, j] = val
    return out


def dense_pivoted_cholesky(K, rank):
    """Greedy pivoted Cholesky: pivot = largest residual diagonal, ties to the lowest index."""
    n = len(K)
    F = np.zeros((n, rank))
    d = np.diag(K).copy()
    pivots = []
    for t in range(rank):
        i = int(np.argmax(d))
        pivots.append(i)
        piv = np.sqrt(K[i, i] - F[i, :t] @ F[i, :t])  # docs/math.md#icd (erratum 1)
        F[:, t] = (K[:, i] - F[:, :t] @ F[i, :t]) / piv
        F[i, t] = piv
        d = d - F[:, t] ** 2
    return np.array(pivots), F


def dense_exemplar(X, x0, support, lam, kernel, **kp):
    """Minimize (1/2n) sum (h(x_i) + b + 1)^2 + 1/2 (h(x0) + b - 1)^2 + lam/2 |h|^2 over
    h = sum_j alpha_j phi(support_j) and b, by the normal equations. Returns alpha."""
    pts = np.vstack([x0[None, :], X])
    n = len(X)
    Phi = dense_kernel(pts, support, kernel, **kp)
    Kss = dense_kernel(support, support, kernel, **kp)
    c = np.r_[1.0, np.full(n, 1.0 / n)]
    y = np.r_[1.0, -np.ones(n)]
    m = Phi.shape[1]
    M = np.zeros((m + 1, m + 1))
    M[:m, :m] = Phi.T @ (c[:, None] * Phi) + lam * Kss
    M[:m, m] = Phi.T @ c
    M[m, :m] = c @ Phi
    M[m, m] = c.sum()
    rhs = np.r_[Phi.T @ (c * y), c @ y]
    return np.linalg.solve(M, rhs)[:m]


def dense_similarity(X, P, lam, kernel, support_of, **kp):
    """Normalized (h|h') of the dense exemplar functions of the rows of P."""
    sol = []
    for x0 in P:
        s = support_of(x0)
        sol.append((s, dense_exemplar(X, x0, s, lam, kernel, **kp)))
    m = len(P)
    H = np.empty((m, m))
    for i in range(m):
        for j in range(m):
            si, ai = sol[i]
            sj, aj = sol[j]
            H[i, j] = ai @ dense_kernel(si, sj, kernel, **kp) @ aj
    nrm = np.sqrt(np.diag(H))
    return H / np.outer(nrm, nrm)


@pytest.fixture
def data():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((40, 5))
    P = rng.standard_normal((4, 5))
    return X, P


def histograms(rng, n, d):
    x = rng.gamma(0.5, size=(n, d))
    x[rng.random((n, d)) < 0.3] = 0.0  # zero bins: the 0/0 := 0 case of chi2
    return x / x.sum(axis=1, keepdims=True)


# -- kernels --------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_matrix_and_diagonal_match_formulas(kernel, rng):
    x, y = histograms(rng, 7, 6), histograms(rng, 5, 6)
    kp = PARAMS[kernel]
    np.testing.assert_allclose(
        kernel_matrix(x, y, kernel, **kp), dense_kernel(x, y, kernel, **kp), rtol=1e-12, atol=1e-14
    )
    np.testing.assert_allclose(
        kernel_diagonal(x, kernel, **kp),
        np.diag(dense_kernel(x, x, kernel, **kp)),
        rtol=1e-12,
        atol=1e-14,
    )


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernels_are_positive_semidefinite(kernel, rng):
    x = histograms(rng, 30, 4)
    K = kernel_matrix(x, x, kernel, **PARAMS[kernel])
    np.testing.assert_allclose(K, K.T, atol=1e-14)
    assert np.linalg.eigvalsh(K).min() > -1e-10 * np.abs(K).max()


def test_chi2_zero_bins():
    x = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    K = kernel_matrix(x, x, "chi2")
    assert np.all(np.isfinite(K))
    np.testing.assert_allclose(K, [[1.0, 0.0], [0.0, 0.0]])


# -- pivoted Cholesky --------------------------------------------------------------------
@pytest.mark.parametrize("kernel", ["rbf", "poly", "chi2"])
def test_greedy_matches_dense_pivoted_cholesky(kernel, rng):
    X = histograms(rng, 60, 5) if kernel == "chi2" else rng.standard_normal((60, 5))
    kp = PARAMS[kernel]
    K = dense_kernel(X, X, kernel, **kp)
    ref_piv, F = dense_pivoted_cholesky(K, 12)
    model = KernelSLEM(kernel=kernel, rank=12, tol=0, lam=1e-2, pivoting="greedy", **kp).fit(X)
    np.testing.assert_array_equal(model.pivots_, ref_piv)
    np.testing.assert_allclose(model.pivot_factor_, F[ref_piv], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.pivot_rows_, X[ref_piv])
    # F = K(X, X_I) L^-T, and its statistics.
    Fm = linalg.solve_triangular(model.pivot_factor_, K[:, ref_piv].T, lower=True).T
    np.testing.assert_allclose(Fm, F, atol=1e-10)
    np.testing.assert_allclose(model.factor_mean_, F.mean(axis=0), atol=1e-12)
    G = F.T @ F / len(F) - np.outer(F.mean(0), F.mean(0)) + 1e-2 * np.eye(12)
    np.testing.assert_allclose(model.g_factor_ @ model.g_factor_.T, G, atol=1e-12)
    trace_err = (np.trace(K) - np.sum(F**2)) / np.trace(K)
    assert model.trace_error_ == pytest.approx(trace_err, rel=1e-9, abs=1e-12)
    assert model.n_passes_ == 12 + 1  # one pass per pivot plus the first


def test_tol_stops_at_first_rank_below_tol(rng):
    X = rng.standard_normal((80, 4))
    K = dense_kernel(X, X, "rbf", gamma=0.2)
    _, F = dense_pivoted_cholesky(K, 80)
    errors = (np.trace(K) - np.cumsum(np.sum(F**2, axis=0))) / np.trace(K)
    model = KernelSLEM(kernel="rbf", gamma=0.2, tol=0.01, rank=None, pivoting="greedy").fit(X)
    r = model.rank_
    assert model.trace_error_ <= 0.01 < errors[r - 2]
    assert model.trace_error_ == pytest.approx(errors[r - 1], rel=1e-8)


def test_linear_kernel_stops_at_numerical_rank(rng):
    X = rng.standard_normal((50, 6))
    model = KernelSLEM(kernel="linear", tol=0).fit(X)
    assert model.rank_ == 6
    assert model.trace_error_ < 1e-10


def test_accept_candidates_partial_cholesky(rng):
    a = rng.standard_normal((6, 3))
    h = a @ a.T  # rank 3: at most 3 accepted
    acc, R = accept_candidates(h, np.diag(h).copy(), np.zeros(6), 1e-12, 10)
    assert len(acc) == 3
    np.testing.assert_allclose(R @ R.T, h[np.ix_(acc, acc)], atol=1e-12)
    np.testing.assert_array_equal(R, np.tril(R))
    # a duplicate candidate is never accepted twice
    acc, _ = accept_candidates(
        h[np.ix_([0, 0, 1], [0, 0, 1])], np.diag(h)[[0, 0, 1]], np.zeros(3), 1e-12, 10
    )
    np.testing.assert_array_equal(acc, [0, 2])


def test_rpcholesky_reaches_rank_in_few_passes(rng):
    X = rng.standard_normal((400, 3))
    greedy = KernelSLEM(kernel="rbf", gamma=1.0, rank=60, tol=0, pivoting="greedy").fit(X)
    rp = KernelSLEM(
        kernel="rbf", gamma=1.0, rank=60, tol=0, pivoting="rpcholesky", random_state=3
    ).fit(X)
    assert rp.rank_ == 60 and len(set(rp.pivots_)) == 60
    assert rp.n_passes_ < greedy.n_passes_ / 5
    # L L^T = K(I, I) in pivot order, and it is lower triangular
    K_II = kernel_matrix(X[rp.pivots_], X[rp.pivots_], "rbf", 1.0)
    np.testing.assert_allclose(rp.pivot_factor_ @ rp.pivot_factor_.T, K_II, atol=1e-10)
    np.testing.assert_array_equal(rp.pivot_factor_, np.tril(rp.pivot_factor_))
    K = kernel_matrix(X, X, "rbf", 1.0)
    F = linalg.solve_triangular(rp.pivot_factor_, K[:, rp.pivots_].T, lower=True).T
    assert rp.trace_error_ == pytest.approx((np.trace(K) - np.sum(F**2)) / np.trace(K), rel=1e-8)
    again = KernelSLEM(
        kernel="rbf", gamma=1.0, rank=60, tol=0, pivoting="rpcholesky", random_state=3
    ).fit(X)
    np.testing.assert_array_equal(again.pivots_, rp.pivots_)


def test_rpcholesky_robust_to_outliers(rng):
    """Greedy pivoting spends its pivots on outliers; rpcholesky does not."""
    centres = rng.standard_normal((5, 4)) * 4
    X = np.vstack(
        [
            centres[rng.integers(0, 5, 600)] + 0.6 * rng.standard_normal((600, 4)),
            rng.standard_normal((20, 4)) * 30,
        ]
    )
    greedy = KernelSLEM(kernel="rbf", gamma=0.5, rank=25, tol=0).fit(X)
    errs = [
        KernelSLEM(kernel="rbf", gamma=0.5, rank=25, tol=0, pivoting="rpcholesky", random_state=s)
        .fit(X)
        .trace_error_
        for s in range(3)
    ]
    assert np.mean(errs) < greedy.trace_error_


# -- the exemplar solutions -------------------------------------------------------------
@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("kernel", ["rbf", "poly", "chi2"])
def test_full_rank_similarity_equals_dense_representer_solution(kernel, exact, rng):
    X = histograms(rng, 25, 5) if kernel == "chi2" else rng.standard_normal((25, 5))
    P = histograms(rng, 4, 5) if kernel == "chi2" else rng.standard_normal((4, 5))
    kp = PARAMS[kernel]
    lam = 1e-2
    model = KernelSLEM(kernel=kernel, rank=25, tol=0, lam=lam, exact=exact, **kp).fit(X)
    assert model.rank_ == 25
    ref = dense_similarity(X, P, lam, kernel, lambda x0: np.vstack([x0[None], X]), **kp)
    np.testing.assert_allclose(model.similarity(P, P), ref, atol=1e-6)


def test_exact_mode_equals_dense_solution_on_pivots_and_positive(data):
    """Low rank, exact=True: the exemplar problem over h in span{phi(X_I), phi(x0)}."""
    X, P = data
    lam = 1e-2
    model = KernelSLEM(kernel="rbf", gamma=0.5, rank=8, tol=0, lam=lam, exact=True).fit(X)
    piv = X[model.pivots_]
    ref = dense_similarity(X, P, lam, "rbf", lambda x0: np.vstack([x0[None], piv]), gamma=0.5)
    np.testing.assert_allclose(model.similarity(P, P), ref, atol=1e-6)


def test_lowrank_similarity_is_the_matlab_formula(data):
    X, P = data
    lam = 1e-3
    m = KernelSLEM(kernel="rbf", gamma=0.5, rank=10, tol=0, lam=lam).fit(X)
    K = dense_kernel(X, X, "rbf", gamma=0.5)
    B = linalg.solve_triangular(m.pivot_factor_, K[:, m.pivots_].T, lower=True).T
    mu = B.mean(0)
    G = B.T @ B / len(B) - np.outer(mu, mu) + lam * np.eye(10)
    kp = dense_kernel(P, X[m.pivots_], "rbf", gamma=0.5)
    V = np.linalg.solve(m.pivot_factor_, kp.T).T
    beta = np.linalg.solve(G, (V - mu).T).T
    kpp = dense_kernel(P, P, "rbf", gamma=0.5)
    N = np.sqrt(np.sum(beta**2, 1) + (np.diag(kpp) - np.sum(V**2, 1)) / lam**2)
    S = (beta @ beta.T + (kpp - V @ V.T) / lam**2) / np.outer(N, N)
    np.testing.assert_allclose(m.similarity(P, P), S, atol=1e-9)
    Z = m.transform(P)
    np.testing.assert_allclose(Z, beta / N[:, None], atol=1e-9)
    # transform rows: z.z' = s minus the cross term; norms <= 1
    np.testing.assert_allclose(Z @ Z.T, S - (kpp - V @ V.T) / lam**2 / np.outer(N, N), atol=1e-9)
    assert np.all(np.linalg.norm(Z, axis=1) <= 1 + 1e-12)
    np.testing.assert_allclose(np.diag(m.similarity(P, P)), 1.0)


def test_exact_and_lowrank_agree_at_full_rank(data):
    X, P = data
    a = KernelSLEM(kernel="rbf", gamma=0.5, rank=40, tol=0, lam=1e-2).fit(X)
    b = KernelSLEM(kernel="rbf", gamma=0.5, rank=40, tol=0, lam=1e-2, exact=True).fit(X)
    np.testing.assert_allclose(a.similarity(P, X[:5]), b.similarity(P, X[:5]), atol=1e-7)
    np.testing.assert_allclose(a.transform(P), b.transform(P), atol=1e-7)


@pytest.mark.parametrize("lam", [1e-2, 1e-1])
def test_linear_kernel_reproduces_linear_slem(lam, rng):
    X = rng.standard_normal((200, 8)) + 2.0
    P = rng.standard_normal((6, 8)) + 2.0
    lin = LinearSLEM(lam=lam).fit(X)
    for pivoting, exact in (("greedy", False), ("rpcholesky", False), ("greedy", True)):
        ker = KernelSLEM(
            kernel="linear", lam=lam, tol=0, rank=20, pivoting=pivoting, random_state=0, exact=exact
        ).fit(X)
        assert ker.rank_ == 8
        np.testing.assert_allclose(ker.similarity(P, P), lin.similarity(P, P), atol=1e-8)
        Z = ker.transform(P)  # u = 0 here: unit rows, same inner products
        np.testing.assert_allclose(Z @ Z.T, lin.similarity(P, P), atol=1e-8)


def test_save_load_roundtrip(tmp_path, data):
    X, P = data
    for exact in (False, True):
        m = KernelSLEM(
            kernel="poly",
            gamma=0.5,
            degree=3,
            rank=7,
            tol=0,
            lam=1e-2,
            exact=exact,
            pivoting="rpcholesky",
            random_state=5,
        ).fit(X)
        path = str(tmp_path / f"m{exact}.zarr")
        fp = m.save(path)
        back = load_model(path)
        assert isinstance(back, KernelSLEM) and back.get_params() == m.get_params()
        assert back.fingerprint_ == fp
        assert back.pivots_.dtype == np.int64
        np.testing.assert_array_equal(back.transform(P), m.transform(P))
        np.testing.assert_array_equal(back.similarity(P, P), m.similarity(P, P))
        assert (back.rank_, back.trace_error_, back.seed_) == (m.rank_, m.trace_error_, m.seed_)


def test_numpy_blocks_do_not_change_greedy(data):
    X, _ = data
    cfg = CholeskyConfig("rbf", 0.5, 2, "greedy", rank=10, tol=0.0)
    ref = incomplete_cholesky(X, cfg, block_rows=len(X))
    for rows in (1, 7, 16):
        res = incomplete_cholesky(X, cfg, block_rows=rows)
        np.testing.assert_array_equal(res.pivots, ref.pivots)
        np.testing.assert_allclose(res.pivot_factor, ref.pivot_factor, atol=1e-13)
        np.testing.assert_allclose(res.stats.mean, ref.stats.mean, atol=1e-13)
        np.testing.assert_allclose(res.stats.scatter, ref.stats.scatter, atol=1e-12)


def test_transform_unit_rows(data):
    import dask.array as da

    X, P = data
    m = KernelSLEM(kernel="rbf", gamma=0.5, rank=6, tol=0).fit(X)
    Z, U = m.transform(P), m.transform(P, normalize="unit")
    np.testing.assert_allclose(np.linalg.norm(U, axis=1), 1.0)
    np.testing.assert_allclose(U, Z / np.linalg.norm(Z, axis=1, keepdims=True))
    assert np.all(np.linalg.norm(Z, axis=1) < 1)  # rank 6: every positive has a residual
    Ud = m.transform(da.from_array(P, chunks=(2, 5)), normalize="unit").compute()
    np.testing.assert_allclose(Ud, U, atol=1e-14)
    with pytest.raises(ValueError, match="normalize must be 'h'"):
        m.transform(P, normalize="l2")
