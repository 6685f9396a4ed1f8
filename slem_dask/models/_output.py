"""scikit-learn's output API for the estimators, without importing scikit-learn to fit.

* ``feature_names_in_``: the column names of a DataFrame (pandas, polars: anything with
  all-string ``columns``) given to ``fit``; checked against those given to ``transform``
  (or ``predict``) with scikit-learn's messages and warnings, so that its checks and
  ``Pipeline`` / ``ColumnTransformer`` see the behaviour of its own estimators.
* ``get_feature_names_out``: the names of the outputs (see
  :meth:`slem_dask.models.base.SLEMEstimator.get_feature_names_out`).
* ``set_output(transform=...)``: "default", "pandas" or "polars". The containers are
  made by scikit-learn's own adapters (``sklearn.utils._set_output``), which also
  honour ``sklearn.set_config(transform_output=...)``; scikit-learn is imported only
  when an output other than "default" is asked for (or was already imported).
  A dask array in gives a dask array out, lazy, whatever the setting: a DataFrame
  would have to compute it.
"""

from __future__ import annotations

import functools
import importlib
import sys
import warnings

import numpy as np

from ..core.validation import is_dask_array

__all__ = [
    "OUTPUTS",
    "check_output_name",
    "feature_names_of",
    "check_feature_names",
    "input_feature_names",
    "recording_feature_names",
    "wrapping_output",
]

#: What ``set_output(transform=...)`` takes (besides "default", the module each needs).
OUTPUTS = ("default", "pandas", "polars")
#: The attribute scikit-learn's adapters and ``clone`` read (sklearn.utils._set_output).
CONFIG_ATTRIBUTE = "_sklearn_output_config"


def feature_names_of(X) -> np.ndarray | None:
    """The column names of a DataFrame ``X`` as an object array, or None when it has
    none or they are not strings (scikit-learn's ``_get_feature_names``)."""
    if is_dask_array(X) or isinstance(X, np.ndarray) or not hasattr(X, "columns"):
        return None
    names = np.asarray(list(X.columns), dtype=object)
    if len(names) == 0:
        return None
    types = sorted({type(v).__qualname__ for v in names})
    if len(types) > 1 and "str" in types:
        raise TypeError(
            "Feature names are only supported if all input features have string names, "
            f"but your input has {types} as feature name / column name types. "
            "If you want feature names to be stored and validated, you must convert "
            "them all to strings, by using X.columns = X.columns.astype(str) for "
            "example. Otherwise you can remove feature / column names from your input "
            "data, or convert them all to a non-string data type."
        )
    return names if types == ["str"] else None


def _listed(names) -> str:
    shown = [f"- {name}\n" for name in names[:5]]
    return "".join(shown) + ("- ...\n" if len(names) > 5 else "")


def check_feature_names(estimator, X) -> None:
    """Compare the names of ``X`` with ``feature_names_in_`` as scikit-learn does: a
    warning when only one side has names, a ValueError when they differ."""
    fitted = getattr(estimator, "feature_names_in_", None)
    given = feature_names_of(X)
    name = type(estimator).__name__
    if fitted is None and given is None:
        return
    if fitted is None:
        warnings.warn(
            f"X has feature names, but {name} was fitted without feature names", stacklevel=3
        )
        return
    if given is None:
        warnings.warn(
            f"X does not have valid feature names, but {name} was fitted with feature names",
            stacklevel=3,  # the caller of transform
        )
        return
    if len(fitted) == len(given) and np.all(fitted == given):
        return
    message = "The feature names should match those that were passed during fit.\n"
    unseen = sorted(set(given) - set(fitted))
    missing = sorted(set(fitted) - set(given))
    if unseen:
        message += "Feature names unseen at fit time:\n" + _listed(unseen)
    if missing:
        message += "Feature names seen at fit time, yet now missing:\n" + _listed(missing)
    if not unseen and not missing:
        message += "Feature names must be in the same order as they were in fit.\n"
    raise ValueError(message)


def input_feature_names(estimator, input_features) -> np.ndarray:
    """The names of the inputs for ``get_feature_names_out``: ``input_features``
    checked against the fitted model, else ``feature_names_in_``, else x0, x1, ..."""
    fitted = getattr(estimator, "feature_names_in_", None)
    n = estimator.n_features_in_
    if input_features is None:
        return fitted if fitted is not None else np.asarray([f"x{i}" for i in range(n)], object)
    names = np.asarray(input_features, dtype=object)
    if fitted is not None and (len(names) != len(fitted) or np.any(names != fitted)):
        raise ValueError(
            f"input_features is not equal to feature_names_in_: got {list(names)[:5]}, "
            f"fitted on {list(fitted)[:5]} (first 5); pass None to use the fitted names"
        )
    if len(names) != n:
        raise ValueError(
            f"input_features should have length equal to number of features ({n}), got {len(names)}"
        )
    return names


def check_output_name(transform) -> None:
    """One line if ``set_output(transform=...)`` cannot be honoured here."""
    if transform not in OUTPUTS:
        raise ValueError(
            f"set_output: transform={transform!r} is not one of {list(OUTPUTS)}; "
            f"give 'default' (numpy), 'pandas' or 'polars'"
        )
    if transform == "default":
        return
    for module in ("sklearn", transform):  # scikit-learn's adapters make the DataFrames
        try:
            importlib.import_module(module)
        except ImportError:
            package = "scikit-learn" if module == "sklearn" else module
            raise ImportError(
                f"set_output: transform={transform!r} needs {package}, which is not "
                f"installed; pip install {package}, or use transform='default'"
            ) from None


def _wrap(estimator, data, X):
    """``data`` (the output of ``transform(X)``) in the container configured."""
    config = getattr(estimator, CONFIG_ATTRIBUTE, {}).get("transform")
    if is_dask_array(data) or config == "default":
        return data  # lazy stays lazy
    if config is None and "sklearn" not in sys.modules:
        return data  # no set_config can have asked for another container
    from sklearn.utils._set_output import _wrap_data_with_container

    return _wrap_data_with_container("transform", data, X, estimator)


def recording_feature_names(fit):
    """``fit`` that also sets (or, for input without names, deletes) ``feature_names_in_``."""

    @functools.wraps(fit)
    def fit_recording_names(self, X, *args, **kwargs):
        names = feature_names_of(X)
        fitted = fit(self, X, *args, **kwargs)
        if names is not None:
            self.feature_names_in_ = names
        elif "feature_names_in_" in vars(self):
            del self.feature_names_in_  # fitted again on input without names
        return fitted

    return fit_recording_names


def wrapping_output(transform):
    """``transform`` that checks the names of its input (once fitted) and returns its
    output in the container chosen by ``set_output`` (scikit-learn's ``_SetOutputMixin``
    wraps its transformers' methods the same way)."""

    @functools.wraps(transform)
    def transform_in_container(self, X, *args, **kwargs):
        if hasattr(self, "n_features_in_"):
            check_feature_names(self, X)
        return _wrap(self, transform(self, X, *args, **kwargs), X)

    return transform_in_container
