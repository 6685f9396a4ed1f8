"""The scikit-learn estimator protocol, without importing scikit-learn.

Every estimator and classifier of slem-dask inherits :class:`EstimatorProtocol`:
``get_params(deep=True)``, ``set_params(**params)``, ``__sklearn_tags__`` (scikit-learn
>= 1.6) and ``_more_tags`` (older versions), which is what ``sklearn.base.clone``,
``Pipeline``, ``GridSearchCV`` and ``cross_val_score`` call. scikit-learn is imported
only inside ``__sklearn_tags__``, which only scikit-learn itself calls, and when
:class:`NotFittedError` or :class:`DataConversionWarning` is first used.
"""

from __future__ import annotations

import inspect
import threading
from typing import TYPE_CHECKING

from . import _output

__all__ = ["EstimatorProtocol", "NotFittedError", "DataConversionWarning"]

if TYPE_CHECKING:  # built on first use by __getattr__ below; declared for type checkers

    class NotFittedError(ValueError, AttributeError, RuntimeError): ...

    class DataConversionWarning(UserWarning): ...


_NOT_FITTED_DOC = """Raised when a model is used before ``fit`` (or ``load_model``).

Where scikit-learn is importable it subclasses ``sklearn.exceptions.NotFittedError``
(so ``check_estimator`` and code written for scikit-learn estimators catch it);
otherwise it is, like that class, a ValueError and an AttributeError. Either way
also a RuntimeError, as in earlier versions of slem-dask.
"""

_CONVERSION_DOC = """Warned when an input is converted to the form expected (a column-vector y
raveled): ``sklearn.exceptions.DataConversionWarning`` where scikit-learn is
importable, else a UserWarning of the same name.
"""


def _sklearn_twin(name: str, fallback: tuple[type, ...], extra: tuple[type, ...], doc: str):
    """A class named ``name`` deriving from scikit-learn's class of that name if it
    imports, else from ``fallback``; ``extra`` bases in both cases."""
    try:
        import sklearn.exceptions
    except ImportError:
        bases = fallback
    else:
        bases = (getattr(sklearn.exceptions, name),)
    return type(name, bases + extra, {"__doc__": doc, "__module__": __name__})


_TWINS = {
    "NotFittedError": lambda: _sklearn_twin(
        "NotFittedError", (ValueError, AttributeError), (RuntimeError,), _NOT_FITTED_DOC
    ),
    "DataConversionWarning": lambda: _sklearn_twin(
        "DataConversionWarning", (UserWarning,), (), _CONVERSION_DOC
    ),
}
_TWINS_LOCK = threading.Lock()


def __getattr__(name: str):
    # Built on first use (PEP 562): importing scikit-learn takes most of a second, which
    # importing slem-dask (and every Dask worker that unpickles a model) need not pay.
    # Under a lock so that every thread sees the one class (an except clause compares
    # classes, not names).
    if name not in _TWINS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _TWINS_LOCK:
        if name not in globals():
            globals()[name] = _TWINS[name]()
    return globals()[name]


class EstimatorProtocol:
    """get_params / set_params / tags in the scikit-learn convention.

    The parameters are the arguments of ``__init__``, each stored unchanged
    under its own name (``__init__`` does nothing else).
    """

    #: "transformer" or "classifier": the scikit-learn estimator type.
    _estimator_type = "transformer"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "fit" in cls.__dict__:  # feature_names_in_ from a DataFrame's columns
            cls.fit = _output.recording_feature_names(cls.__dict__["fit"])  # type: ignore[attr-defined]

    @classmethod
    def _get_param_names(cls) -> list[str]:
        init = cls.__init__
        if init is object.__init__:
            return []
        params = [
            p
            for p in inspect.signature(init).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        return sorted(p.name for p in params)

    def get_params(self, deep: bool = True) -> dict:
        """Constructor parameters of this estimator, by name.

        ``deep=True`` also lists the parameters of parameters that are themselves
        estimators, as ``name__param`` (the scikit-learn convention).
        """
        out: dict[str, object] = {}
        for name in self._get_param_names():
            value = getattr(self, name)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                out.update((f"{name}__{k}", v) for k, v in value.get_params().items())
            out[name] = value
        return out

    def set_params(self, **params):
        """Set constructor parameters (``name__param`` for nested ones); returns self.

        Values are checked when the estimator is next fitted or used, as in
        scikit-learn.
        """
        if not params:
            return self
        valid = self.get_params(deep=True)
        nested: dict[str, dict] = {}
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in valid:
                raise ValueError(
                    f"set_params: {key!r} is not a parameter of {type(self).__name__}; "
                    f"its parameters are {', '.join(self._get_param_names()) or '(none)'}"
                )
            if sub:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
                valid[name] = value
        for name, sub_params in nested.items():
            valid[name].set_params(**sub_params)
        return self

    # -- tags ---------------------------------------------------------
    def _preserved_dtypes(self) -> list[str]:
        return ["float64", "float32"]

    def __sklearn_tags__(self):
        from sklearn.utils import ClassifierTags, InputTags, Tags, TargetTags, TransformerTags

        classifier = self._estimator_type == "classifier"
        return Tags(
            estimator_type=self._estimator_type,
            target_tags=TargetTags(required=classifier),
            transformer_tags=(
                None if classifier else TransformerTags(preserves_dtype=self._preserved_dtypes())
            ),
            classifier_tags=ClassifierTags(multi_class=True) if classifier else None,
            input_tags=InputTags(two_d_array=True, allow_nan=False),
        )

    def _more_tags(self) -> dict:  # scikit-learn < 1.6
        return {
            "requires_y": self._estimator_type == "classifier",
            "allow_nan": False,
            "X_types": ["2darray"],
            "preserves_dtype": self._preserved_dtypes(),
        }
