"""Several positives per class: SLEM class-centroid classifiers and the multi-class SVM."""

import numpy as np
import pytest

from slem_dask import LinearSLEM
from slem_dask.models.classify import CentroidSLEMClassifier, MulticlassSVM, compare_classifiers
from slem_dask.core.multiclass import crammer_singer_sgd, multiclass_hinge_objective


def _classes(rng, n_per_class=60, k=4, d=12, spread=0.6):
    """Gaussian classes sharing one anisotropic covariance (the LDA assumption)."""
    basis, _ = np.linalg.qr(rng.standard_normal((d, d)))
    scales = np.linspace(2.0, 0.2, d)
    centres = rng.standard_normal((k, d)) * spread
    X = np.concatenate(
        [c + (rng.standard_normal((n_per_class, d)) * scales) @ basis.T for c in centres]
    )
    y = np.repeat(np.array(["a", "b", "c", "d"][:k]), n_per_class)
    perm = rng.permutation(len(X))
    return X[perm], y[perm]


def test_centroid_classifier_is_the_slem_of_the_class_mean(rng):
    X, y = _classes(rng)
    clf = CentroidSLEMClassifier(lam=1e-3).fit(X, y)
    slem = LinearSLEM(lam=1e-3).fit(X)
    for c, label in enumerate(clf.classes_):
        centroid = X[y == label].mean(axis=0)
        np.testing.assert_allclose(clf.centroids_[c], centroid, atol=1e-12)
        w, nu = slem.exemplar(centroid)
        np.testing.assert_allclose(clf.coef_[c], w, atol=1e-10)
        assert clf.intercept_[c] == pytest.approx(nu)
        # direction A^-1 (centroid - mu); theta = 1 gives LDA's bias -(x0 + mu).w / 2
        direction = slem.precision_ @ (centroid - slem.mean_)
        cos = w @ direction / np.linalg.norm(w) / np.linalg.norm(direction)
        assert cos == pytest.approx(1.0, abs=1e-12)
        assert nu == pytest.approx(-0.5 * (centroid + slem.mean_) @ w)


def test_centroid_classifier_beats_nearest_mean_under_shared_covariance(rng):
    X_all, y_all = _classes(np.random.default_rng(7), n_per_class=300)
    X, y, Xt, yt = X_all[:600], y_all[:600], X_all[600:], y_all[600:]
    rows = {r["method"]: r["accuracy"] for r in compare_classifiers(X, y, Xt, yt)}
    assert rows["SLEM: class-centroid classifiers"] > rows["raw: nearest class mean (cosine)"]
    assert rows["SLEM: class-centroid classifiers"] > 0.8
    assert set(rows) == {
        "raw: nearest class mean (cosine)",
        "raw: multi-class SVM",
        "SLEM: class-centroid classifiers",
        "SLEM vectors: multi-class SVM",
    }


def test_multiclass_svm_separates_and_approaches_the_optimum(rng):
    X_all, y_all = _classes(np.random.default_rng(11), n_per_class=200, spread=0.8)
    X, y, Xt, yt = X_all[:500], y_all[:500], X_all[500:], y_all[500:]
    svm = MulticlassSVM(lam=1e-3, normalize=False).fit(X, y)
    assert svm.score(Xt, yt) > 0.9
    assert set(svm.predict(Xt)) <= set(svm.classes_)
    # R(W) decreases with the number of steps, towards a long run's value
    codes = np.searchsorted(svm.classes_, y)
    Xa = np.hstack([X, np.ones((len(X), 1))])
    values = [
        multiclass_hinge_objective(
            crammer_singer_sgd(Xa, codes, 4, 1e-3, n_iter=n), Xa, codes, 1e-3
        )
        for n in (30, 300, 3000, 30000)
    ]
    assert values[0] > values[1] > values[2] >= values[3] * 0.999
    assert svm.objective(X, y) <= values[3] * 1.03  # default steps: within 3%
    # a label the model never saw would be scored as a neighbouring class: refused
    unseen = y.astype(object)
    unseen[0] = "a label it never saw"
    with pytest.raises(ValueError, match=r"y holds 1 label\(s\) this model was not fitted on"):
        svm.objective(X, unseen)
    with pytest.raises(ValueError, match=r"has 3 features"):
        svm.objective(X[:, :3], y)


def test_multiclass_svm_is_deterministic_and_validates(rng):
    X, y = _classes(rng)
    a = MulticlassSVM(n_iter=100).fit(X, y).coef_
    np.testing.assert_array_equal(a, MulticlassSVM(n_iter=100).fit(X, y).coef_)
    with pytest.raises(ValueError, match="at least 2 are needed"):
        MulticlassSVM().fit(X, np.zeros(len(X)))
    with pytest.raises(ValueError, match="one label per row"):
        MulticlassSVM().fit(X, y[:-1])
    with pytest.raises(ValueError, match="n_iter must be an integer >= 1"):
        MulticlassSVM(n_iter=0).fit(X, y)
    with pytest.raises(RuntimeError, match="not fitted"):
        MulticlassSVM().predict(X)
    clf = CentroidSLEMClassifier().fit(X, y)
    with pytest.raises(ValueError, match="X has 5 features"):
        clf.predict(X[:, :5])
