"""Several positives per class: SLEM class-centroid classifiers and a multi-class SVM.

* :class:`CentroidSLEMClassifier`: for each class, the SLEM closed form
  (docs/math.md#closed-form) with x0 the centre of mass of the class's examples
  (docs/math.md#lda): w_c proportional to A^-1 (centroid_c - mu), nu_c its bias; with
  theta = 1 it is LDA's b' = -(x0 + mu)^T w / 2 up to the norm of w.
  Predicts argmax_c w_c.x + nu_c.
* :class:`MulticlassSVM`: Crammer-Singer multi-class linear SVM trained by
  stochastic sub-gradient (docs/math.md#multiclass-svm), used on raw
  features or on SLEM vectors.
* :func:`compare_classifiers`: accuracy of these against raw features.

All in numpy (the training sets of this setting are small); inputs are 2-D
arrays of rows, labels any 1-D array of hashable values.
"""

from __future__ import annotations

import numbers
import time
import warnings

import numpy as np

from . import _estimator, _output
from ._estimator import EstimatorProtocol
from ..core.linear import exemplar_solution
from ..core.multiclass import crammer_singer_sgd, multiclass_hinge_objective
from ..core.whitening import normalize_rows
from .linear import LinearSLEM
from ..core.validation import (
    caller_stacklevel,
    check_finite_rows,
    check_n_features,
    check_positive_float,
    check_rows,
)

__all__ = ["CentroidSLEMClassifier", "MulticlassSVM", "compare_classifiers"]


def _check_target(y, n_rows: int, name: str = "X") -> np.ndarray:
    """y as a 1-D array of n_rows labels; a column vector (n, 1) is raveled with a
    DataConversionWarning, as scikit-learn's estimators do."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        # no quotes in the message: scikit-learn's check matches the warning's repr
        warnings.warn(
            _estimator.DataConversionWarning(
                f"A column-vector y was passed when a 1d array was expected: y has shape "
                f"{y.shape}, read as one label per row of {name}; pass y.ravel() to silence "
                f"this warning"
            ),
            stacklevel=caller_stacklevel(),
        )
        y = y.ravel()
    if y.ndim != 1 or len(y) != n_rows:
        raise ValueError(
            f"y must be 1-D with one label per row of {name} ({n_rows} rows), got shape {y.shape}"
        )
    return y


def _check_labelled(X, y, name="X"):
    X = np.asarray(check_rows(X, name))
    check_finite_rows(X, name)
    if y is None:
        raise ValueError(
            "this classifier requires y to be passed, but the target y is None; "
            "give one class label per row of X"
        )
    y = _check_target(y, len(X), name)  # warns at the caller of fit
    if (
        y.dtype.kind == "f"
        and not np.all(np.mod(y[np.isfinite(y)], 1) == 0)
        or y.dtype.kind == "f"
        and not np.all(np.isfinite(y))
    ):
        raise ValueError(
            "Unknown label type: y holds continuous values (floats that are not "
            "whole numbers, or NaN); a classifier needs class labels"
        )
    classes, codes = np.unique(y, return_inverse=True)
    if len(classes) < 2:
        raise ValueError(f"y has {len(classes)} class(es); at least 2 are needed to classify")
    return X, classes, codes


class _Classifier(EstimatorProtocol):
    """Shared by the classifiers: the scikit-learn protocol, decision and accuracy."""

    _estimator_type = "classifier"
    # set by each classifier's fit (annotations only: without coef_ it is not fitted)
    classes_: np.ndarray
    coef_: np.ndarray
    intercept_: np.ndarray

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params(deep=False).items())
        return f"{type(self).__name__}({args})"

    def _check_fitted(self):
        if not hasattr(self, "coef_"):
            raise _estimator.NotFittedError(
                f"this {type(self).__name__} is not fitted yet; call fit(X, y)"
            )

    def _scores(self, X) -> np.ndarray:
        self._check_fitted()
        _output.check_feature_names(self, X)
        X = np.asarray(check_rows(X, "X"))
        check_n_features(X, self.coef_.shape[1], "X", fitted_on=type(self).__name__)
        check_finite_rows(X, "X")
        return self._prepare(X) @ self.coef_.T + self.intercept_

    def decision_function(self, X) -> np.ndarray:
        """Scores w_c.x + b_c, (n, n_classes); with two classes, as in scikit-learn,
        the (n,) difference of the second class's score and the first's (> 0: classes_[1])."""
        scores = self._scores(X)
        return scores[:, 1] - scores[:, 0] if scores.shape[1] == 2 else scores

    def _prepare(self, X):
        return np.asarray(X, dtype=np.float64)

    def predict(self, X) -> np.ndarray:
        scores = self._scores(X)
        return self.classes_[np.argmax(scores, axis=1)]

    def score(self, X, y) -> float:
        """Accuracy on (X, y)."""
        predicted = self.predict(X)
        return float(np.mean(predicted == _check_target(y, len(predicted))))


class CentroidSLEMClassifier(_Classifier):
    """One linear SLEM classifier per class, from the class centroid.

    Parameters: lam, theta as in :class:`LinearSLEM` (theta scales each w_c and
    shifts nu_c, so it does change argmax decisions; theta = 1 is LDA's rule).
    ``fit(X, y, negatives=None)``: the negatives define mu and A; by default the
    training rows of all classes pooled (the LDA setting: one shared covariance).

    Attributes: classes_, centroids_ (K, d), coef_ (K, d), intercept_ (K,), slem_.
    """

    def __init__(self, lam: float = 1e-3, theta: float = 1.0):
        self.lam = lam
        self.theta = theta

    def fit(self, X, y, negatives=None):
        X, classes, codes = _check_labelled(X, y)
        check_positive_float(self.theta, "theta")
        negatives = X if negatives is None else negatives
        self.slem_ = LinearSLEM(lam=self.lam, theta=self.theta).fit(negatives)
        check_n_features(X, self.slem_.n_features_in_, "X", fitted_on="the negatives")
        K, d = len(classes), X.shape[1]
        self.classes_ = classes
        self.n_features_in_ = int(d)
        self.centroids_ = np.zeros((K, d))
        np.add.at(self.centroids_, codes, X.astype(np.float64))
        self.centroids_ /= np.bincount(codes, minlength=K)[:, None]
        self.coef_ = np.empty((K, d))
        self.intercept_ = np.empty(K)
        for c in range(K):
            self.coef_[c], self.intercept_[c] = exemplar_solution(
                self.centroids_[c],
                self.slem_.mean_,
                self.slem_._float64_precision(),
                float(self.theta),
            )
        return self


class MulticlassSVM(_Classifier):
    """Crammer-Singer multi-class linear SVM, by stochastic sub-gradient steps.

    Parameters
    ----------
    lam : float > 0, the ridge weight of R(W) (lam = 1 / (C N)).
    n_iter, batch_size, eta0, random_state : solver settings (deterministic per seed).
    fit_intercept : append a constant feature 1 (its weight, the class bias, is
        regularized like the others, as in liblinear).
    normalize : L2-normalize rows before training and predicting.

    Attributes: classes_, coef_ (K, d), intercept_ (K,).
    """

    def __init__(
        self,
        lam: float = 1e-4,
        n_iter: int = 3000,
        batch_size: int = 64,
        eta0: float = 1.0,
        fit_intercept: bool = True,
        normalize: bool = True,
        random_state: int = 0,
    ):
        self.lam = lam
        self.n_iter = n_iter
        self.batch_size = batch_size
        self.eta0 = eta0
        self.fit_intercept = fit_intercept
        self.normalize = normalize
        self.random_state = random_state

    def _prepare(self, X):
        return normalize_rows(X) if self.normalize else np.asarray(X, dtype=np.float64)

    def _augment(self, X):
        X = self._prepare(X)
        return np.hstack([X, np.ones((len(X), 1))]) if self.fit_intercept else X

    def fit(self, X, y):
        X, classes, codes = _check_labelled(X, y)
        check_positive_float(self.lam, "lam")
        check_positive_float(self.eta0, "eta0")
        for name in ("n_iter", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        W = crammer_singer_sgd(
            self._augment(X),
            codes,
            len(classes),
            float(self.lam),
            int(self.n_iter),
            int(self.batch_size),
            float(self.eta0),
            random_state=self.random_state,
        )
        self.classes_ = classes
        self.n_features_in_ = int(X.shape[1])
        self.coef_ = W[:, :-1] if self.fit_intercept else W
        self.intercept_ = W[:, -1] if self.fit_intercept else np.zeros(len(classes))
        return self

    def objective(self, X, y) -> float:
        """R(W) of the fitted model on (X, y) (with the intercept as a feature)."""
        self._check_fitted()
        X = np.asarray(check_rows(X, "X"))
        check_n_features(X, self.coef_.shape[1], "X", fitted_on=type(self).__name__)
        check_finite_rows(X, "X")
        y = _check_target(y, len(X), "X")
        # searchsorted maps a label the model never saw to a neighbour's code: refuse it
        unseen = np.setdiff1d(y, self.classes_)
        if unseen.size:
            raise ValueError(
                f"y holds {unseen.size} label(s) this model was not fitted on "
                f"(first: {unseen[0]!r}; its classes: {list(self.classes_)}); give labels of "
                f"the fitted classes"
            )
        codes = np.searchsorted(self.classes_, y)
        W = np.hstack([self.coef_, self.intercept_[:, None]]) if self.fit_intercept else self.coef_
        return multiclass_hinge_objective(W, self._augment(np.asarray(X)), codes, float(self.lam))


def compare_classifiers(
    X_train,
    y_train,
    X_test,
    y_test,
    negatives=None,
    lam: float = 1e-3,
    svm_lam: float = 1e-4,
    svm_iter: int = 3000,
    random_state: int = 0,
) -> list[dict]:
    """Accuracy of class-level classifiers on raw features and on SLEM.

    Rows: nearest class mean by cosine on raw features; multi-class SVM on raw
    features; SLEM centroid classifiers; multi-class SVM on linear SLEM vectors
    (the SLEM model fitted on ``negatives``, default the training rows).
    """
    X_train = np.asarray(X_train, dtype=np.float64)
    X_test = np.asarray(X_test, dtype=np.float64)
    rows = []

    def timed(name, fit_predict):
        t = time.perf_counter()
        predicted = fit_predict()
        rows.append(
            {
                "method": name,
                "accuracy": float(np.mean(predicted == np.asarray(y_test))),
                "time [s]": time.perf_counter() - t,
            }
        )

    def nearest_mean():
        classes, codes = np.unique(y_train, return_inverse=True)
        centres = normalize_rows(
            np.stack(
                [normalize_rows(X_train)[codes == c].mean(axis=0) for c in range(len(classes))]
            )
        )
        return classes[np.argmax(normalize_rows(X_test) @ centres.T, axis=1)]

    def svm(train, test):
        model = MulticlassSVM(lam=svm_lam, n_iter=svm_iter, random_state=random_state)
        return model.fit(train, y_train).predict(test)

    def slem_svm():
        slem = LinearSLEM(lam=lam).fit(X_train if negatives is None else negatives)
        return svm(slem.transform(X_train), slem.transform(X_test))

    timed("raw: nearest class mean (cosine)", nearest_mean)
    timed("raw: multi-class SVM", lambda: svm(X_train, X_test))
    timed(
        "SLEM: class-centroid classifiers",
        lambda: CentroidSLEMClassifier(lam=lam).fit(X_train, y_train, negatives).predict(X_test),
    )
    timed("SLEM vectors: multi-class SVM", slem_svm)
    return rows
