"""A model's warnings point at the line that called it (issue 40's output API wraps fit
and transform, a frame more between the warning and the caller): found by CI's log."""

import warnings

import numpy as np
import pytest

from slem_dask import KernelSLEM, LinearSLEM
from slem_dask.core.validation import LambdaScaleWarning
from slem_dask.models.classify import MulticlassSVM
from slem_dask.models.kernel_defaults import GammaScaleWarning


def _caught(call, category):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        call()
    found = [w for w in seen if issubclass(w.category, category)]
    assert found, [str(w.message) for w in seen]
    return found[0]


@pytest.fixture
def X():
    return np.random.default_rng(0).standard_normal((200, 8))


def test_a_fit_warns_at_the_callers_line(X):
    w = _caught(lambda: LinearSLEM(lam=1e-12).fit(X), LambdaScaleWarning)
    assert w.filename == __file__, w.filename
    w = _caught(lambda: KernelSLEM(gamma=1e6, rank=8).fit(X), GammaScaleWarning)
    assert w.filename == __file__, w.filename


def test_a_classifier_warns_at_the_callers_line(X):
    y = (np.arange(len(X)) % 3).reshape(-1, 1)  # a column vector: raveled, with a warning
    w = _caught(lambda: MulticlassSVM().fit(X, y), UserWarning)
    assert w.filename == __file__, w.filename
