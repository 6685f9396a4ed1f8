"""Linear SLEM on numpy: the closed form against a brute-force minimization of J.

J(w, nu) = theta/2 (w.x0 + nu - 1)^2 + 1/(2n) sum_i (w.x_i + nu + 1)^2 + lam/2 |w|^2
(docs/math.md#linear-objective, square loss).
"""

import os

import dask.array as da
import numpy as np
import pytest

from reference import brute_force_exemplar, slem_gradient, slem_objective
from slem_dask import LinearSLEM, NotFittedError

# (n, d, theta, lam, offset in standard deviations)
CASES = [
    (500, 20, 3.0, 0.1, 0.0),
    (200, 10, 1.0, 1e-3, 0.0),
    (80, 12, 0.05, 1e-2, 0.0),
    (15, 40, 0.5, 1e-2, 0.0),  # n < d
    (300, 8, 10.0, 1e-3, 1000.0),  # far from the origin
    (25, 60, 2.0, 0.05, 1000.0),  # n < d and far from the origin
]


def make_problem(n, d, offset, seed):
    rng = np.random.default_rng(seed)
    sd = rng.uniform(0.5, 2.0, d)
    X = offset * sd + rng.standard_normal((n, d)) * sd
    x0 = offset * sd + rng.standard_normal(d) * sd * 1.5
    return X, x0


def rel(a, b):
    return np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b)


@pytest.mark.parametrize("n,d,theta,lam,offset", CASES)
def test_exemplar_equals_brute_force_minimizer(n, d, theta, lam, offset):
    X, x0 = make_problem(n, d, offset, seed=n + d)
    w, nu = LinearSLEM(lam=lam, theta=theta).fit(X).exemplar(x0)
    w_ref, nu_ref = brute_force_exemplar(X, x0, theta, lam)
    assert rel(w, w_ref) < 1e-8
    assert abs(nu - nu_ref) <= 1e-8 * max(abs(nu_ref), 1.0)
    assert slem_objective(w, nu, x0, X, theta, lam) <= (
        slem_objective(w_ref, nu_ref, x0, X, theta, lam) * (1 + 1e-12)
    )


@pytest.mark.parametrize("n,d,theta,lam,offset", CASES)
def test_gradient_of_J_vanishes_at_the_solution(n, d, theta, lam, offset):
    X, x0 = make_problem(n, d, offset, seed=n + d)
    w, nu = LinearSLEM(lam=lam, theta=theta).fit(X).exemplar(x0)

    def gradient_is_zero(w, nu):
        gw, gnu, sw, snu = slem_gradient(w, nu, x0, X, theta, lam)
        return np.linalg.norm(gw) <= 1e-9 * np.linalg.norm(sw) and abs(gnu) <= 1e-9 * snu

    assert gradient_is_zero(w, nu)
    # The check can fail: a solution off by 1e-6 (relative) is caught.
    assert not gradient_is_zero(w * (1 + 1e-6), nu)
    assert not gradient_is_zero(w, nu + 1e-6 * max(abs(nu), 1.0))


def test_brute_force_reference_is_a_minimizer():
    """The reference itself: J grows in every random direction around it."""
    X, x0 = make_problem(60, 5, 0.0, seed=7)
    w, nu = brute_force_exemplar(X, x0, 2.0, 0.1)
    j0 = slem_objective(w, nu, x0, X, 2.0, 0.1)
    rng = np.random.default_rng(0)
    for _ in range(20):
        dw, dnu = rng.standard_normal(5) * 1e-3, rng.standard_normal() * 1e-3
        assert slem_objective(w + dw, nu + dnu, x0, X, 2.0, 0.1) > j0


@pytest.mark.parametrize("n,d,theta,lam,offset", CASES)
def test_transform_is_normalized_exemplar_direction(n, d, theta, lam, offset):
    X, x0 = make_problem(n, d, offset, seed=n + d + 1)
    rng = np.random.default_rng(3)
    P = np.vstack([x0, x0 + rng.standard_normal((4, d)) * 0.3 * X.std(axis=0)])
    base = LinearSLEM(lam=lam, theta=1.0).fit(X).transform(P)
    np.testing.assert_allclose(np.linalg.norm(base, axis=1), 1.0, rtol=1e-14)
    norms = []
    for th in sorted({0.01, 1.0, theta, 100.0}):
        model = LinearSLEM(lam=lam, theta=th).fit(X)
        Z = model.transform(P)
        np.testing.assert_array_equal(Z, base)  # theta never changes the encoding
        for row, p in zip(Z, P, strict=True):
            w, _ = model.exemplar(p)
            np.testing.assert_allclose(row, w / np.linalg.norm(w), rtol=1e-10, atol=1e-13)
        w_ref, _ = brute_force_exemplar(X, P[0], th, lam)
        assert rel(Z[0], w_ref / np.linalg.norm(w_ref)) < 1e-8
        norms.append(np.linalg.norm(model.exemplar(P[0])[0]))
    assert len(set(np.round(norms, 12))) == len(norms)  # ... but it does change the norm


def test_fitted_attributes_equal_numpy():
    X, _ = make_problem(300, 9, 5.0, seed=11)
    X32 = X.astype(np.float32)
    lam = 0.02
    model = LinearSLEM(lam=lam, precision="float64").fit(X32)
    X64 = X32.astype(np.float64)
    cov = np.cov(X64, rowvar=False, bias=True)
    np.testing.assert_allclose(model.mean_, X64.mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(model.covariance_, cov, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(
        model.precision_, np.linalg.inv(cov + lam * np.eye(9)), rtol=1e-10, atol=1e-12
    )
    np.testing.assert_array_equal(model.precision_, model.precision_.T)
    np.testing.assert_array_equal(model.covariance_, model.covariance_.T)
    assert model.n_samples_ == 300 and model.n_features_in_ == 9
    assert model.input_dtype_ == "float32"
    assert model.get_params() == {"lam": lam, "theta": 1.0, "precision": "float64"}


def test_transform_dtype_and_row_at_the_mean():
    X, _ = make_problem(50, 4, 0.0, seed=2)
    model = LinearSLEM().fit(X)
    P = np.vstack([model.mean_, X[:3]])
    Z = model.transform(P)
    assert Z.dtype == np.float64
    np.testing.assert_array_equal(Z[0], 0.0)  # no direction: 0, not NaN
    Z32 = model.transform(P, dtype=np.float32)
    assert Z32.dtype == np.float32
    np.testing.assert_array_equal(Z32, Z.astype(np.float32))


def test_similarity_is_cosine_of_encodings():
    X, _ = make_problem(100, 6, 0.0, seed=3)
    model = LinearSLEM(lam=0.1).fit(X)
    P, Q = X[:5] + 0.1, X[5:12] - 0.2
    S = model.similarity(P, Q)
    assert S.shape == (5, 7)
    np.testing.assert_allclose(S, model.transform(P) @ model.transform(Q).T, rtol=1e-14)


def test_lda_direction_at_small_lambda():
    """docs/math.md#lda: as lam -> 0 the SLEM is LDA's Sigma^-1 (x0 - mu)."""
    X, x0 = make_problem(400, 5, 0.0, seed=4)
    z = LinearSLEM(lam=1e-12).fit(X).transform(x0[None])[0]
    lda = np.linalg.solve(np.cov(X, rowvar=False, bias=True), x0 - X.mean(axis=0))
    np.testing.assert_allclose(z, lda / np.linalg.norm(lda), rtol=1e-8, atol=1e-10)


# -- bad input -----------------------------------------------------------------
@pytest.mark.parametrize(
    "value,error",
    [
        (0, ValueError),
        (0.0, ValueError),
        (-1, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        ("abc", TypeError),
        ("0.1", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
@pytest.mark.parametrize("name", ["lam", "theta"])
def test_bad_parameters_raise(name, value, error):
    X = np.random.default_rng(0).standard_normal((10, 3))
    model = LinearSLEM(**{name: value})
    with pytest.raises(error, match=name):
        model.fit(X)
    assert not hasattr(model, "n_features_in_")


def test_bad_parameter_set_after_fit_is_caught_by_exemplar():
    X = np.random.default_rng(0).standard_normal((10, 3))
    model = LinearSLEM().fit(X)
    model.theta = -1.0
    with pytest.raises(ValueError, match="theta"):
        model.exemplar(X[0])


@pytest.mark.parametrize(
    "X,message",
    [
        (np.ones(5), "2-D"),
        (np.ones((4, 3, 2)), "2-D"),
        (np.ones((1, 3)), "at least 2"),
        (np.ones((0, 3)), "0 rows"),
        (np.ones((5, 0)), "no features"),
        (np.array([["a", "b"], ["c", "d"]]), "real numbers"),
        (np.ones((3, 2), dtype=complex), "real numbers"),
    ],
)
def test_bad_negatives_raise(X, message):
    with pytest.raises((ValueError, TypeError), match=message):
        LinearSLEM().fit(X)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_negatives_raise_with_row_count(bad):
    X = np.random.default_rng(0).standard_normal((20, 3))
    X[[2, 7], 1] = bad
    X[7, 0] = bad
    with pytest.raises(ValueError, match=r"2 row\(s\) with NaN or inf \(rows 2, 7\) out of 20"):
        LinearSLEM().fit(X)
    X = np.vstack([X] * 4)  # 8 bad rows over blocks of 30: counted, the first five named
    with pytest.raises(
        ValueError,
        match=r"8 row\(s\) with NaN or inf \(rows 2, 7, 22, 27, "
        r"42, \.\.\.\) out of 80",
    ):
        LinearSLEM().fit(da.from_array(X, chunks=(30, 3)))


def test_nonfinite_positives_raise_with_row_count():
    rng = np.random.default_rng(0)
    model = LinearSLEM().fit(rng.standard_normal((20, 3)))
    P = rng.standard_normal((9, 3))
    P[[1, 4, 8], 2] = [np.nan, np.inf, np.nan]
    with pytest.raises(ValueError, match=r"X has 3 row\(s\) with NaN or inf \(rows 1, 4, 8\)"):
        model.transform(P)
    with pytest.raises(ValueError, match=r"x0 has 1 row\(s\) with NaN or inf"):
        model.exemplar(P[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_encode_rows_refuses_nonfinite_rows_wherever_they_are(monkeypatch, dtype, bad):
    """encode_rows finds NaN and inf through its pieces' norms, without a pass of its own
    (issue 42): a bad value makes the row's product, and so its sum of squares, NaN or
    inf on every BLAS (this test runs under several OPENBLAS_CORETYPE in CI). A bad value
    in the first, a middle and the last column, of a row in the first, a middle and the
    last piece; a huge finite row still encodes; every bad row is counted."""
    import slem_dask.core.linear as linear
    from slem_dask.core.validation import NonFiniteRowsError

    rng = np.random.default_rng(11)
    x = rng.standard_normal((1_000, 64)).astype(dtype) + 2
    model = LinearSLEM(precision="auto").fit(x.astype(np.float64))
    matrix = model._encoding_matrix(np.dtype(dtype), "auto")
    assert matrix.dtype == dtype
    monkeypatch.setattr(linear, "_PIECE_BYTES", 1)
    monkeypatch.setattr(linear, "_PIECE_MIN_ROWS", 97)  # 11 pieces, the last of 30 rows
    for row in (0, 500, 999):
        for col in (0, 31, 63):
            y = x.copy()
            y[row, col] = bad
            with pytest.raises(
                NonFiniteRowsError, match=rf"rows has 1 row\(s\) with NaN or inf \(rows {row}\)"
            ):
                linear.encode_rows(y, model.mean_, matrix)
    y = x.copy()
    y[[3, 400, 998], [5, 0, 63]] = bad
    y[100] = dtype(1e30)  # finite, its product overflows: encoded (scaled), not refused
    with pytest.raises(
        NonFiniteRowsError, match=r"3 row\(s\) with NaN or inf \(rows 3, 400, 998\)"
    ):
        linear.encode_rows(y, model.mean_, matrix)
    assert np.isfinite(linear.encode_rows(y[[100]], model.mean_, matrix)).all()


def test_dask_encode_checks_finite_rows_only_inside_encode_rows(monkeypatch, tmp_path):
    """The dask encode does not pass over each block to look for NaN first (issue 42:
    3 ms and a boolean copy per 32 MB partition): encode_rows finds them, and the error
    names the input and its global rows as before."""
    import slem_dask.parallel.blocks as blocks

    rng = np.random.default_rng(12)
    model = LinearSLEM().fit(rng.standard_normal((200, 8)))
    P = rng.standard_normal((60, 8))
    calls = []
    original = blocks.check_finite_rows
    monkeypatch.setattr(
        blocks, "check_finite_rows", lambda *a, **k: (calls.append(1), original(*a, **k))[1]
    )
    Z = model.transform(da.from_array(P, chunks=(20, 8))).compute(scheduler="sync")
    np.testing.assert_array_equal(Z, model.transform(P))
    assert calls == []
    P[[21, 35], [0, 7]] = [np.nan, -np.inf]
    with pytest.raises(
        ValueError,
        match=r"X has 2 row\(s\) with NaN or inf \(rows 21, 35\) in its rows 20-39, one of "
        r"its 3 blocks \(the other blocks may hold more\); drop or repair",
    ):
        model.transform(da.from_array(P, chunks=(20, 8))).compute(scheduler="sync")
    assert len(calls) == 1  # in the block that held them, to name them as rows of X
    with pytest.raises(ValueError, match=r"\(rows 21, 35\); drop or repair") as one_block:
        model.transform(da.from_array(P, chunks=(60, 8))).compute(scheduler="sync")
    assert "blocks" not in str(one_block.value)  # the whole input: nothing to add


@pytest.mark.parametrize(
    "P,message",
    [
        (
            np.ones((4, 5)),
            # once each: the width found, the one expected, and what to give instead
            r"^X has 5 features, but LinearSLEM is expecting 3 features as input: give "
            r"descriptors of the dimension of the negatives it was fitted on$",
        ),
        (np.ones(3), "2-D"),
        (np.ones((2, 3, 1)), "2-D"),
        (np.ones((0, 3)), "0 rows"),
    ],
)
def test_bad_positives_raise(P, message):
    model = LinearSLEM().fit(np.random.default_rng(0).standard_normal((20, 3)))
    with pytest.raises(ValueError, match=message):
        model.transform(P)


def test_bad_exemplar_input_raises():
    model = LinearSLEM().fit(np.random.default_rng(0).standard_normal((20, 3)))
    with pytest.raises(ValueError, match="one descriptor of shape"):
        model.exemplar(np.ones((2, 3)))
    with pytest.raises(ValueError, match="4 features"):
        model.exemplar(np.ones(4))


def test_not_fitted_raises():
    model = LinearSLEM()
    for call in (
        lambda: model.transform(np.ones((2, 3))),
        lambda: model.exemplar(np.ones(3)),
        lambda: model.fingerprint_,
    ):
        with pytest.raises(NotFittedError, match="not fitted"):
            call()


def test_repr_and_params():
    assert repr(LinearSLEM(lam=0.5, theta=2)) == "LinearSLEM(lam=0.5, theta=2, precision='auto')"
    # the default is relative to the negatives' scale (was the absolute 1e-3; issue 32)
    assert LinearSLEM().lam == "0.01x"


_THREAD_CHECK = """
import json
import numpy as np
from threadpoolctl import threadpool_info
from slem_dask.core import blas_threads, linear

def openblas_threads():
    return sorted(i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas")

seen = []
real = linear._cholesky_inverse

def spy(a, lam):
    seen.append(openblas_threads())
    return real(a, lam)

linear._cholesky_inverse = spy
blas_threads.THREADED_POTRF_MIN = 3
blas_threads.OPENBLAS_THREADED_POTRF_MAX = 4
rng = np.random.default_rng(0)
cov = np.cov(rng.standard_normal((50, 8)).T, bias=True)
for d in (8, 4, 2):
    np.testing.assert_allclose(linear.precision_matrix(cov[:d, :d], 0.1),
                               np.linalg.inv(cov[:d, :d] + 0.1 * np.eye(d)), rtol=1e-10)
print(json.dumps({"before": openblas_threads(), "seen": seen, "after": openblas_threads()}))
"""


def test_factorizations_run_openblas_on_one_thread_when_small_or_large():
    # OpenBLAS's threaded dpotrf crashed (SIGSEGV) at d = 16384 on 2 threads: above
    # OPENBLAS_THREADED_POTRF_MAX the factorization runs on one BLAS thread; below
    # THREADED_POTRF_MIN too (its idle threads would spin after the call). The BLAS
    # thread count is process-wide, so this runs in a fresh process: threads left over
    # from earlier tests' in-process clusters could change it under the test.
    import json
    import subprocess
    import sys

    env = {
        k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    }
    env["OPENBLAS_NUM_THREADS"] = "2"
    done = subprocess.run(
        [sys.executable, "-c", _THREAD_CHECK], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["before"]:
        pytest.skip("numpy and scipy do not use OpenBLAS here")
    one = [1] * len(result["before"])
    assert result["before"] == [2] * len(result["before"])
    assert result["seen"] == [one, result["before"], one]  # d = 8 > 4; 3 <= 4 <= 4; 2 < 3
    assert result["after"] == result["before"]  # the caller's setting is restored


def test_transform_computes_what_depends_on_the_model_once(monkeypatch, tmp_path):
    # every transform recomputed the condition bound of A (0.33 s at d = 8192) and the
    # float32 copy of A^-1 (0.44 s): 0.5 s for one image (issue 39)
    from slem_dask import load_model
    from slem_dask.models import linear as model_linear

    calls = []
    for name in ("float32_encoding_ok", "float32_matrix"):
        real = getattr(model_linear, name)
        monkeypatch.setattr(
            model_linear, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a)
        )
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 16)).astype(np.float32)
    model = LinearSLEM().fit(X)
    first = model.transform(X[:1])
    for row in X[1:6]:
        model.transform(row[None])
    model.transform(X[:3].astype(np.float64))  # float64 needs neither
    assert calls == ["float32_encoding_ok", "float32_matrix"]
    np.testing.assert_array_equal(model.transform(X[:1]), first)
    model.fit(X[:200])  # a new fit: computed again, for the new model
    model.transform(X[:1])
    assert len(calls) == 4
    model.save(str(tmp_path / "m.zarr"))
    loaded = load_model(str(tmp_path / "m.zarr"))
    for row in X[:3]:
        loaded.transform(row[None])
    assert len(calls) == 6
    np.testing.assert_array_equal(loaded.transform(X[:4]), model.transform(X[:4]))


def test_a_lazy_transform_hashes_the_encoding_matrix_once_per_model(monkeypatch):
    """dask's token of A^-1 is kept with the model: every lazy transform hashed the whole
    matrix again (0.17 CPU s a call at d = 8192). Fails on that: two calls, two hashes.
    The graph is the same on both calls, and computes the same rows as numpy does."""
    import dask.array as da
    import dask.tokenize

    rng = np.random.default_rng(3)
    x = rng.standard_normal((400, 32)).astype(np.float32)
    model = LinearSLEM(lam=1e-1).fit(x)
    matrix = model._encoding_matrix(np.float32, "auto")
    hashed = []
    real = dask.tokenize.hash_buffer_hex

    def counting(buf, *args, **kwargs):
        hashed.append(memoryview(buf).nbytes)
        return real(buf, *args, **kwargs)

    monkeypatch.setattr(dask.tokenize, "hash_buffer_hex", counting)
    lazy = da.from_array(x, chunks=(100, 32))
    first, second = model.transform(lazy), model.transform(lazy)
    assert hashed.count(matrix.nbytes) == 1, hashed
    assert first.name == second.name
    np.testing.assert_array_equal(
        second.compute(scheduler="sync"),
        np.concatenate([model.transform(x[i : i + 100]) for i in range(0, 400, 100)]),
    )
