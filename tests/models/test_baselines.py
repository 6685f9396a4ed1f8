"""The baselines SLEM is measured against: E-SVM (Pegasos), PCA whitening, raw features."""

import pickle

import dask.array as da
import numpy as np
import pytest

from slem_dask import ESVM, LinearSLEM, PCAWhitening, RawFeatures, load_model
from slem_dask.core.esvm import hinge_objective, optimal_bias, pegasos_exemplars, reference_exemplar
from slem_dask.datasets import make_corpus


@pytest.fixture(scope="module")
def small():
    """L2-normalized descriptors as the demo makes them: 500 negatives, d = 16."""
    c = make_corpus(n_negatives=500, n_instances=6, group_size=2, d=16, seed=3)
    return c.negatives.astype(np.float64), c.queries.astype(np.float64)


# -- E-SVM: the optimizer ---------------------------------------------------


def test_optimal_bias_is_the_exact_minimizer(rng):
    neg = rng.standard_normal((40, 3))
    w, x0 = rng.standard_normal(3), rng.standard_normal(3)
    for theta in (0.2, 1.0, 3.0):
        b = optimal_bias(w[None], x0[None], neg, theta)[0]
        grid = b + np.linspace(-2, 2, 4001)
        values = hinge_objective(
            np.repeat(w[None], grid.size, 0),
            grid,
            np.repeat(x0[None], grid.size, 0),
            neg,
            0.1,
            theta,
        )
        best = hinge_objective(w[None], [b], x0[None], neg, 0.1, theta)[0]
        assert best <= values.min() + 1e-12


def test_reference_solver_certifies_its_optimum(small):
    neg, pos = small
    w, b, J, dual = reference_exemplar(pos[0], neg, lam=1e-2, theta=1.0)
    assert dual <= J <= dual * (1 + 1e-5)
    # perturbing the optimum never lowers J
    rng = np.random.default_rng(0)
    for _ in range(20):
        dw = rng.standard_normal(w.shape) * 1e-3
        assert hinge_objective((w + dw)[None], [b], pos[:1], neg, 1e-2, 1.0)[0] >= J - 1e-9


@pytest.mark.parametrize("theta", [1.0, 0.3])
def test_pegasos_default_iterations_reach_the_optimum_within_1_percent(small, theta):
    """The documented claim: at the default settings J is within 1% of min J
    (b refitted exactly, as ESVM.exemplar does) and within 3% with the SGD bias."""
    neg, pos = small
    model = ESVM(lam=1e-2, theta=theta).fit(neg)
    W, b = model.exemplars(pos)
    J = model.objective(pos, W, b)
    ref = np.array([reference_exemplar(x, neg, 1e-2, theta)[2] for x in pos])
    assert np.all(J >= ref * (1 - 1e-6))
    assert np.max(J / ref - 1) < 0.01, J / ref - 1
    _, b_sgd = pegasos_exemplars(pos, neg, neg.mean(0), 1e-2, theta)
    assert np.max(model.objective(pos, W, b_sgd) / ref - 1) < 0.03


def test_pegasos_improves_with_iterations(small):
    neg, pos = small
    ref = np.array([reference_exemplar(x, neg, 1e-2, 1.0)[2] for x in pos[:2]])
    errors = []
    for n_iter in (30, 300, 3000):
        W, _ = pegasos_exemplars(pos[:2], neg, neg.mean(0), 1e-2, 1.0, n_iter=n_iter)
        J = hinge_objective(W, optimal_bias(W, pos[:2], neg, 1.0), pos[:2], neg, 1e-2, 1.0)
        errors.append(np.max(J / ref - 1))
    assert errors[0] > errors[1] > errors[2]


def test_rows_are_independent_of_their_batch(small):
    """Vectorized across positives: a row's result does not depend on its neighbours."""
    neg, pos = small
    W_all, b_all = pegasos_exemplars(pos, neg, neg.mean(0), 1e-2, 1.0, n_iter=200)
    W_one, b_one = pegasos_exemplars(pos[3:4], neg, neg.mean(0), 1e-2, 1.0, n_iter=200)
    np.testing.assert_allclose(W_one[0], W_all[3], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b_one[0], b_all[3], rtol=1e-10, atol=1e-12)


# -- E-SVM: the estimator ---------------------------------------------------


def test_esvm_transform_is_normalized_w_and_deterministic(small):
    neg, pos = small
    model = ESVM(n_iter=200).fit(neg)
    z = model.transform(pos)
    W, _ = model.exemplars(pos)
    np.testing.assert_allclose(z, W / np.linalg.norm(W, axis=1, keepdims=True), atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0)
    np.testing.assert_array_equal(z, ESVM(n_iter=200).fit(neg).transform(pos))
    other = ESVM(n_iter=200, random_state=1).fit(neg).transform(pos)
    assert not np.array_equal(z, other)
    assert np.min(np.sum(z * other, axis=1)) > 0.9  # same problem, other samples


def test_esvm_dask_matches_numpy_and_stays_lazy(small):
    neg, pos = small
    model = ESVM(n_iter=100).fit(da.from_array(neg, chunks=(128, 16)))
    expected = model.transform(pos)
    lazy = model.transform(da.from_array(pos, chunks=(2, 16)), dtype=np.float32)
    assert isinstance(lazy, da.Array) and lazy.dtype == np.float32
    assert lazy.numblocks == (3, 1)
    np.testing.assert_allclose(lazy.compute(), expected, rtol=1e-5, atol=1e-6)
    # the negatives enter the graph once, not once per block
    graph = dict(lazy.__dask_graph__())
    values = [getattr(v, "value", v) for v in graph.values()]  # DataNode or raw value
    held = [v for v in values if isinstance(v, np.ndarray) and v.shape == neg.shape]
    assert len(held) == 1
    tasks = [v for k, v in graph.items() if isinstance(k, tuple) and "esvm-encode" in k[0]]
    assert len(tasks) == 3
    assert all(len(pickle.dumps(t)) < neg.nbytes / 4 for t in tasks)


def test_esvm_exemplar_and_save_load(small, tmp_path):
    neg, pos = small
    model = ESVM(n_iter=100, theta=2.0).fit(neg)
    w, b = model.exemplar(pos[0])
    W, bb = model.exemplars(pos[:1])
    np.testing.assert_allclose(w, W[0])
    assert b == pytest.approx(bb[0])
    model.save(str(tmp_path / "esvm.zarr"))
    loaded = load_model(str(tmp_path / "esvm.zarr"))
    assert isinstance(loaded, ESVM) and loaded.get_params() == model.get_params()
    np.testing.assert_array_equal(loaded.transform(pos), model.transform(pos))


def test_esvm_bad_input(small):
    neg, pos = small
    with pytest.raises(ValueError, match="lam must be a finite number > 0"):
        ESVM(lam=0).fit(neg)
    with pytest.raises(ValueError, match="n_iter must be an integer >= 1"):
        ESVM(n_iter=0).fit(neg)
    with pytest.raises(RuntimeError, match="not fitted"):
        ESVM().transform(pos)
    model = ESVM(n_iter=5).fit(neg)
    with pytest.raises(ValueError, match="X has 15 features"):
        model.transform(pos[:, :15])
    bad = pos.copy()
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        model.transform(bad)
    with pytest.raises(ValueError, match="one descriptor"):
        model.exemplar(pos[:2])


# -- PCA whitening and raw features ----------------------------------------


def test_pca_whitening_whitens_the_negatives(small):
    neg, pos = small
    model = PCAWhitening(eps=1e-12).fit(neg)
    centred = (neg - neg.mean(0)) @ model.projection_
    np.testing.assert_allclose(np.cov(centred.T, bias=True), np.eye(16), atol=1e-6)
    assert np.all(np.diff(model.explained_variance_) <= 0)
    z = model.transform(pos)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0)
    expected = centred[:3] / np.linalg.norm(centred[:3], axis=1, keepdims=True)
    np.testing.assert_allclose(model.transform(neg[:3]), expected, atol=1e-8)


def test_pca_whitening_components_dask_and_persistence(small, tmp_path):
    neg, pos = small
    model = PCAWhitening(n_components=5, eps=1e-6).fit(neg)
    assert model.transform(pos).shape == (len(pos), 5)
    dmodel = PCAWhitening(n_components=5, eps=1e-6).fit(da.from_array(neg, chunks=(100, 16)))
    lazy = dmodel.transform(da.from_array(pos, chunks=(4, 16)))
    assert isinstance(lazy, da.Array) and lazy.shape == (len(pos), 5)
    np.testing.assert_allclose(lazy.compute(), model.transform(pos), atol=1e-8)
    model.save(str(tmp_path / "pca.zarr"))
    np.testing.assert_allclose(
        load_model(str(tmp_path / "pca.zarr")).transform(pos), model.transform(pos), atol=1e-12
    )
    with pytest.raises(ValueError, match="n_components=17 is larger than"):
        PCAWhitening(n_components=17).fit(neg)
    with pytest.raises(ValueError, match="n_components must be None or an integer"):
        PCAWhitening(n_components=0).fit(neg)


def test_pca_whitening_numpy_fit_holds_one_partial_at_a_time(monkeypatch):
    """A numpy fit merges each block's statistics into the total as it comes (as
    LinearSLEM's does): it held every block's d x d scatter until the last was made."""
    import tracemalloc

    from slem_dask.models import whitening

    d = 128
    X = np.random.default_rng(0).standard_normal((100 * d, d))
    one_block = PCAWhitening().fit(X)
    monkeypatch.setattr(whitening, "_NUMPY_BLOCK_BYTES", 8 * d * d)  # 100 blocks of d rows
    tracemalloc.start()
    try:
        model = PCAWhitening().fit(X)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    scatter = 8 * d * d
    assert peak < 20 * scatter, f"peak {peak / scatter:.1f} d x d scatters"
    np.testing.assert_allclose(model.mean_, one_block.mean_, rtol=0, atol=1e-14)
    np.testing.assert_allclose(model.explained_variance_, one_block.explained_variance_, rtol=1e-10)


def test_full_pca_whitening_is_one_power_of_A_from_slem(small):
    """Cosine after full whitening with eps = lam uses A^-1; SLEM's uses A^-2."""
    neg, pos = small
    lam = 1e-3
    pca = PCAWhitening(eps=lam).fit(neg)
    slem = LinearSLEM(lam=lam).fit(neg)
    d = pos - slem.mean_
    a_inv = slem.precision_
    g = d @ a_inv @ d.T
    expected = g / np.sqrt(np.outer(np.diag(g), np.diag(g)))
    np.testing.assert_allclose(pca.similarity(pos, pos), expected, atol=1e-8)


def _cosines(z):
    return z @ z.T


@pytest.mark.parametrize("dask_input", [False, True])
def test_pca_whitening_with_fewer_negatives_than_features_works_on_their_gram_matrix(
    dask_input, monkeypatch, tmp_path
):
    # d > n: the d x d eigendecomposition (minutes at d = 8192, issue 39) is replaced by
    # an n x n one of the Gram matrix; the cosines are those of whitening every
    # direction of Sigma's eigenbasis, its null space included (scaled by eps^-1/2)
    from slem_dask.core import whitening as core_whitening

    rng = np.random.default_rng(3)
    n, d, eps = 40, 120, 1e-4
    neg = rng.standard_normal((n, d)) + 2.0
    pos = rng.standard_normal((9, d)) + 2.0
    sizes = []
    real = core_whitening.symmetric_eigh
    monkeypatch.setattr(core_whitening, "symmetric_eigh", lambda a: sizes.append(len(a)) or real(a))
    X = da.from_array(neg, chunks=(15, d)) if dask_input else neg
    model = PCAWhitening(eps=eps).fit(X)
    assert sizes == [n]  # never d x d
    assert model.n_components_ == d and model.components_.shape == (d, n - 1)
    mu = neg.mean(0)
    values, vectors = np.linalg.eigh(np.cov(neg.T, bias=True))
    full = ((pos - mu) @ vectors) / np.sqrt(np.maximum(values, 0) + eps)
    full /= np.linalg.norm(full, axis=1, keepdims=True)
    z = model.transform(pos)
    assert z.shape == (9, d)
    np.testing.assert_allclose(_cosines(z), _cosines(full), atol=1e-9)
    lazy = model.transform(da.from_array(pos, chunks=(4, d)))
    np.testing.assert_allclose(lazy.compute(), z, atol=1e-12)
    model.save(str(tmp_path / "pca.zarr"))
    np.testing.assert_allclose(load_model(str(tmp_path / "pca.zarr")).transform(pos), z, atol=1e-12)
    # a few components: the leading eigenvectors, as the covariance path gives them
    top = PCAWhitening(n_components=5, eps=eps).fit(X)
    assert sizes == [n, n]
    np.testing.assert_allclose(top.explained_variance_, values[::-1][:5], rtol=1e-9)
    np.testing.assert_allclose(
        np.abs(top.components_.T @ vectors[:, ::-1][:, :5]), np.eye(5), atol=1e-8
    )


def test_raw_features(small, tmp_path):
    neg, pos = small
    model = RawFeatures().fit(neg)
    x = pos * 3.0
    np.testing.assert_allclose(model.transform(x), pos / np.linalg.norm(pos, axis=1)[:, None])
    lazy = model.transform(da.from_array(x, chunks=(4, 16)))
    np.testing.assert_allclose(lazy.compute(), model.transform(x))
    assert model.transform(np.zeros((1, 16)))[0].tolist() == [0.0] * 16
    with pytest.raises(ValueError, match="X has 3 features"):
        model.transform(pos[:, :3])
    model.save(str(tmp_path / "raw.zarr"))
    assert isinstance(load_model(str(tmp_path / "raw.zarr")), RawFeatures)


def test_slem_beats_raw_and_esvm_is_comparable_on_the_synthetic_corpus():
    """The demo's claim at small size: SLEM >> raw, and E-SVM close to SLEM."""
    from slem_dask.pipeline.evaluate import evaluate_methods

    c = make_corpus(n_negatives=2000, n_instances=60, d=32, seed=1)
    rows, _ = evaluate_methods(
        c.negatives,
        c.database,
        c.queries,
        c.relevant(),
        ["raw", "esvm", "slem"],
        curves=False,
        params={"esvm": {"n_iter": 300}},
    )
    m = {r["method"]: r["mAP"] for r in rows}
    assert m["slem"] > m["raw"] + 0.1
    assert m["esvm"] > m["raw"] + 0.05
