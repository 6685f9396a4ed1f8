"""The scikit-learn estimator protocol, tested with scikit-learn itself."""

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from sklearn.base import clone, is_classifier  # noqa: E402
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import Normalizer  # noqa: E402
from sklearn.utils import get_tags  # noqa: E402

from slem_dask import (
    ESVM,
    KernelSLEM,
    LinearSLEM,
    NotFittedError,
    PCAWhitening,  # noqa: E402
    RawFeatures,
    leave_one_out_map,
    make_map_scorer,
    map_scorer,
)
from slem_dask.models.classify import CentroidSLEMClassifier, MulticlassSVM  # noqa: E402
from slem_dask.datasets import make_corpus  # noqa: E402


def transformers():
    return [
        LinearSLEM(lam=1e-2),
        KernelSLEM(gamma=0.5, rank=16, pivoting="rpcholesky", random_state=0),
        ESVM(n_iter=30, random_state=0),
        PCAWhitening(n_components=8),
        RawFeatures(),
    ]


def classifiers():
    return [CentroidSLEMClassifier(lam=1e-2), MulticlassSVM(n_iter=200)]


ALL = transformers() + classifiers()
IDS = [type(e).__name__ for e in ALL]


@pytest.fixture(scope="module")
def labelled():
    """Rows of a synthetic retrieval corpus with their instance labels: 4 + 1 views each."""
    c = make_corpus(n_negatives=10, n_instances=40, d=16, seed=3, dtype=np.float64)
    X = np.vstack([c.database, c.queries])
    y = np.concatenate([c.database_labels, c.query_labels])
    order = np.random.default_rng(0).permutation(len(X))
    return X[order], y[order]


@pytest.mark.parametrize("est", ALL, ids=IDS)
def test_get_set_params_and_clone(est):
    params = est.get_params(deep=True)
    assert params == est.get_params(deep=False)  # no nested estimators
    assert set(params) == set(type(est)._get_param_names())
    copy = clone(est)
    assert copy is not est and type(copy) is type(est)
    assert copy.get_params() == params
    if params:
        name = sorted(params)[0]
        assert est.set_params(**{name: params[name]}) is est
    with pytest.raises(ValueError, match="not a parameter of"):
        est.set_params(no_such_parameter=1)


def test_set_params_changes_the_fit():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 6))
    m = LinearSLEM().set_params(lam=0.5)
    assert m.lam == 0.5 and repr(m) == "LinearSLEM(lam=0.5, theta=1.0, precision='auto')"
    ref = np.linalg.inv(np.cov(X.T, bias=True) + 0.5 * np.eye(6))
    np.testing.assert_allclose(m.fit(X).precision_, ref, rtol=1e-10)


def test_clone_of_fitted_is_unfitted(labelled):
    X, _ = labelled
    fitted = LinearSLEM().fit(X)
    copy = clone(fitted)
    with pytest.raises(NotFittedError):
        copy.transform(X)
    # also an AttributeError and a ValueError, like scikit-learn's NotFittedError
    with pytest.raises(AttributeError):
        copy.transform(X)
    with pytest.raises(ValueError):
        copy.transform(X)


@pytest.mark.parametrize("est", ALL, ids=IDS)
def test_tags(est):
    tags = get_tags(est)
    if is_classifier(est):
        assert tags.estimator_type == "classifier" and tags.target_tags.required
    else:
        assert tags.estimator_type == "transformer" and not tags.target_tags.required
        assert set(tags.transformer_tags.preserves_dtype) == {"float32", "float64"}
    assert not tags.input_tags.allow_nan


@pytest.mark.parametrize("est", transformers(), ids=[type(e).__name__ for e in transformers()])
def test_pipeline_with_normalizer(est, labelled):
    X, _ = labelled
    pipe = make_pipeline(Normalizer(), est)
    Z = pipe.fit(X).transform(X)
    ref = clone(est).fit(Normalizer().fit_transform(X)).transform(Normalizer().transform(X))
    np.testing.assert_allclose(Z, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(pipe.fit_transform(X), ref, rtol=1e-12, atol=1e-12)


GRIDS = {
    "LinearSLEM": {"lam": [1e-4, 1e-2, 1.0]},
    "KernelSLEM": {"gamma": [0.1, 1.0], "rank": [8, 16]},
    "ESVM": {"lam": [1e-2, 1e-1]},
    "PCAWhitening": {"eps": [1e-6, 1e-2]},
    "RawFeatures": {},
}


@pytest.mark.parametrize("est", transformers(), ids=[type(e).__name__ for e in transformers()])
def test_grid_search_with_map_scorer(est, labelled):
    X, y = labelled
    name = type(est).__name__
    grid = {f"{name.lower()}__{k}": v for k, v in GRIDS[name].items()}
    pipe = make_pipeline(Normalizer(), est)
    search = GridSearchCV(
        pipe,
        grid or {"normalizer__norm": ["l2"]},
        scoring=map_scorer,
        cv=KFold(2, shuffle=True, random_state=0),
        error_score="raise",
    )
    search.fit(X, y)
    n = int(np.prod([len(v) for v in grid.values()])) if grid else 1
    assert len(search.cv_results_["mean_test_score"]) == n
    assert 0 < search.best_score_ <= 1
    # the reported score is the scorer's, recomputed by hand for the best setting
    best = clone(pipe).set_params(**search.best_params_)
    folds = list(KFold(2, shuffle=True, random_state=0).split(X))
    by_hand = np.mean(
        [leave_one_out_map(clone(best).fit(X[tr]).transform(X[te]), y[te]) for tr, te in folds]
    )
    assert search.best_score_ == pytest.approx(by_hand, rel=1e-12)


def test_grid_search_picks_a_better_lambda(labelled):
    """On this corpus a tiny lambda hurts (it whitens noise): the search must see it."""
    X, y = labelled
    search = GridSearchCV(
        LinearSLEM(),
        {"lam": [1e-8, 1e-2]},
        scoring=make_map_scorer(k=20),
        cv=KFold(2, shuffle=True, random_state=0),
        error_score="raise",
    )
    search.fit(X, y)
    scores = search.cv_results_["mean_test_score"]
    assert scores[0] != scores[1]
    assert search.best_params_["lam"] == [1e-8, 1e-2][int(np.argmax(scores))]


@pytest.mark.parametrize("est", classifiers(), ids=[type(e).__name__ for e in classifiers()])
def test_classifiers_cross_val_and_grid_search(est):
    datasets = pytest.importorskip("sklearn.datasets")
    X, y = datasets.load_digits(return_X_y=True)
    X, y = X[:600], y[:600]
    scores = cross_val_score(make_pipeline(Normalizer(), est), X, y, cv=3)
    assert scores.shape == (3,) and np.all(scores > 0.5)
    grid = GridSearchCV(est, {"lam": [est.lam, est.lam * 10]}, cv=3).fit(X, y)
    assert grid.best_params_["lam"] in (est.lam, est.lam * 10)
    assert grid.best_estimator_.score(X, y) > 0.5


def test_binary_decision_function_is_one_dimensional():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(-1, 1, (30, 4)), rng.normal(1, 1, (30, 4))])
    y = np.repeat(["a", "b"], 30)
    for est in classifiers():
        est.fit(X, y)
        d = est.decision_function(X)
        assert d.shape == (60,)
        np.testing.assert_array_equal(est.predict(X), np.where(d > 0, "b", "a"))


def test_leave_one_out_map_by_hand():
    Z = np.array([[1, 0], [1, 0.1], [0, 1], [0.1, 1]])
    # rankings without self: 0 -> [1, 3, 2], 1 -> [0, 3, 2], 2 -> [3, 1, 0], 3 -> [2, 1, 0]
    assert leave_one_out_map(Z, [0, 0, 1, 1]) == pytest.approx(1.0)
    assert leave_one_out_map(Z, [0, 1, 0, 1]) == pytest.approx((1 / 3 + 1 / 2) / 2)
    # rows 1 and 3 have a label no other row has: left out
    assert leave_one_out_map(Z, [0, 1, 0, 2]) == pytest.approx(1 / 3)
    assert leave_one_out_map(Z, [0, 1, 0, 1], k=1) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="no label occurs twice"):
        leave_one_out_map(Z, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="needs labels"):
        map_scorer(RawFeatures().fit(Z), Z, None)


# scikit-learn's own estimator checks: all must pass. The only one allowed not to run is
# the array-API check, which scikit-learn skips unless SCIPY_ARRAY_API is set.
_MAY_SKIP = {"check_array_api_input"}

CHECKED = [
    LinearSLEM(),
    KernelSLEM(rank=8, random_state=0),
    ESVM(n_iter=50),
    PCAWhitening(),
    RawFeatures(),
    CentroidSLEMClassifier(),
    MulticlassSVM(n_iter=300),
]


@pytest.mark.parametrize("est", CHECKED, ids=[type(e).__name__ for e in CHECKED])
def test_sklearn_estimator_checks_all_pass(est):
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        # "does not inherit from BaseEstimator": by design (no scikit-learn dependency)
        warnings.simplefilter("ignore", UserWarning)
        results = check_estimator(est, on_fail=None)
    failed = {r["check_name"]: r["exception"] for r in results if r["status"] == "failed"}
    assert not failed, failed
    not_run = {r["check_name"] for r in results if r["status"] != "passed"}
    assert not_run <= _MAY_SKIP, not_run
    assert len(results) > 40


@pytest.mark.parametrize("est", CHECKED, ids=[type(e).__name__ for e in CHECKED])
def test_feature_count_message_is_sklearns_and_says_how_to_fix(est, labelled):
    X, y = labelled
    fitted = clone(est).fit(X, y)
    method = fitted.predict if is_classifier(est) else fitted.transform
    # the pattern of scikit-learn's check_n_features_in_after_fitting, then our remedy
    with pytest.raises(
        ValueError,
        match=r"X has 3 features, but \w+ is expecting 16 features "
        r"as input.*the dimension of the negatives",
    ):
        method(X[:, :3])


def test_similarity_names_its_own_inputs(labelled):
    X, _ = labelled
    model = LinearSLEM().fit(X)
    with pytest.raises(ValueError, match="Q has 3 features, but LinearSLEM is expecting 16"):
        model.similarity(X, X[:, :3])
    bad = X.copy()
    bad[2, 0] = np.nan
    with pytest.raises(ValueError, match=r"P has 1 row\(s\) with NaN or inf \(rows 2\)"):
        model.similarity(bad, X)


@pytest.mark.parametrize("est", ALL, ids=IDS)
def test_not_fitted_error_is_sklearns(est, labelled):
    from sklearn.exceptions import NotFittedError as SklearnNotFittedError

    assert issubclass(NotFittedError, SklearnNotFittedError)
    assert issubclass(NotFittedError, RuntimeError)  # as in earlier versions
    X, _ = labelled
    method = clone(est).predict if is_classifier(est) else clone(est).transform
    with pytest.raises(SklearnNotFittedError, match=f"this {type(est).__name__} is not fitted"):
        method(X)


@pytest.mark.parametrize("est", classifiers(), ids=[type(e).__name__ for e in classifiers()])
def test_column_vector_y_is_raveled_with_a_warning(est, labelled):
    from sklearn.exceptions import DataConversionWarning

    X, y = labelled
    flat = clone(est).fit(X, y)
    with pytest.warns(
        DataConversionWarning, match=rf"column-vector y.*shape \({len(X)}, 1\).*ravel"
    ):
        column = clone(est).fit(X, y[:, None])
    np.testing.assert_array_equal(column.predict(X), flat.predict(X))
    with pytest.warns(DataConversionWarning):
        assert column.score(X, y[:, None]) == flat.score(X, y)  # not a (n, n) comparison
    with pytest.raises(ValueError, match=rf"y must be 1-D .* got shape \({len(X)}, 2\)"):
        clone(est).fit(X, np.column_stack([y, y]))


def _python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_slem_dask_does_not_import_sklearn_until_needed():
    out = _python("""
        import sys
        import numpy as np
        import slem_dask
        from slem_dask.models.classify import CentroidSLEMClassifier
        X = np.random.default_rng(0).standard_normal((30, 4))
        slem_dask.LinearSLEM().fit(X).transform(X)
        CentroidSLEMClassifier().fit(X, np.arange(30) % 3).predict(X)
        before = "sklearn" in sys.modules
        try:
            slem_dask.LinearSLEM().transform(X)
        except slem_dask.NotFittedError:
            pass
        print(before, "sklearn" in sys.modules)
    """)
    assert out == "False True"


def test_without_sklearn_the_classes_are_slem_dasks_own():
    out = _python("""
        import sys, pickle, warnings
        sys.modules["sklearn"] = None  # import sklearn now fails
        import numpy as np
        from slem_dask import LinearSLEM, NotFittedError
        from slem_dask.models.classify import MulticlassSVM
        from slem_dask.models._estimator import DataConversionWarning
        print([c.__name__ for c in NotFittedError.__mro__[1:4]])
        try:
            LinearSLEM().transform(np.ones((2, 2)))
        except ValueError as exc:  # also caught as AttributeError, RuntimeError
            print(type(pickle.loads(pickle.dumps(exc))) is NotFittedError)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            MulticlassSVM(n_iter=5).fit(np.eye(4), np.array([[0], [1], [0], [1]]))
        print([(x.category is DataConversionWarning, issubclass(x.category, UserWarning))
               for x in w])
    """)
    assert out.splitlines() == [
        "['ValueError', 'AttributeError', 'RuntimeError']",
        "True",
        "[(True, True)]",
    ]


# scikit-learn's checks of the output API (feature names, set_output): its own test suite
# runs them on its transformers, but check_estimator and parametrize_with_checks do not
# yield them, so they are named here. The polars ones skip (SkipTest) without polars.
_OUTPUT_API_CHECKS = [
    "check_dataframe_column_names_consistency",
    "check_transformer_get_feature_names_out",
    "check_transformer_get_feature_names_out_pandas",
    "check_get_feature_names_out_error",
    "check_set_output_transform",
    "check_set_output_transform_pandas",
    "check_global_output_transform_pandas",
    "check_set_output_transform_polars",
    "check_global_set_output_transform_polars",
]
_OUTPUT_CASES = [
    (est, check)
    for est in CHECKED
    for check in _OUTPUT_API_CHECKS
    if not is_classifier(est) or check == "check_dataframe_column_names_consistency"
]


@pytest.mark.parametrize(
    "est, check", _OUTPUT_CASES, ids=[f"{type(e).__name__}-{c}" for e, c in _OUTPUT_CASES]
)
def test_sklearn_output_api_checks_pass(est, check):
    from sklearn.utils import estimator_checks

    if check.endswith("polars"):
        pytest.importorskip("polars")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # as in the checks above
        getattr(estimator_checks, check)(type(est).__name__, clone(est))
