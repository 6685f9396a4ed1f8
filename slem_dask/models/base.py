"""What every SLEM estimator shares: parameters, fitted checks, save and load."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple, cast

import numpy as np

from .. import storage
from . import _estimator, _output
from ._estimator import EstimatorProtocol
from ..core.validation import (
    Array,
    Rows,
    check_finite_model,
    check_finite_rows,
    check_n_features,
    check_rows,
    is_dask_array,
    output_dtype,
)

if TYPE_CHECKING:
    from numpy.typing import DTypeLike
    from typing_extensions import Self

__all__ = ["SLEMEstimator", "load_model", "MODEL_CLASSES", "NotFittedError"]


def __getattr__(name: str):
    # NotFittedError is built on first use (see slem_dask.models._estimator)
    if name == "NotFittedError":
        return _estimator.NotFittedError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Model name (as written in a store) -> class; filled by each model module.
MODEL_CLASSES: dict[str, type[SLEMEstimator]] = {}
#: Part of every input-based model identity: raise it when a change of the fit changes
#: what it computes beyond rounding, so outputs of older models are no longer current.
IDENTITY_VERSION = 1
#: The metadata field of a saved model that records its :attr:`encoding_fingerprint_`:
#: a model loaded with ``transform_only`` has not read every array it covers.
ENCODING_FINGERPRINT = "encoding_fingerprint"


class ReadInPart(NamedTuple):
    """What a model loaded with ``transform_only`` knows of itself from its record: its
    unread arrays were never in memory, so its fingerprints cannot be computed."""

    fingerprint: str
    encoding_fingerprint: str
    #: Stored array name -> SHA-256 recorded at save (each read one was checked by it).
    array_sha256: dict[str, str]
    #: The parameters as loaded: their fingerprints describe only those.
    params: dict
    #: (array name, id) of the arrays as loaded: a fit sets new ones.
    array_ids: tuple


class SLEMEstimator(EstimatorProtocol):
    """Base class. Subclasses set ``_param_names`` (their ``__init__`` arguments, in the
    order ``repr`` shows them) and define ``fit``, ``transform``, and ``_state`` /
    ``_set_state`` (what :meth:`save` writes and :func:`load_model` reads back).

    ``__init__`` stores parameters only; everything learned ends in ``_`` and
    is set by ``fit`` or by :func:`load_model`. The scikit-learn protocol
    (``get_params``, ``set_params``, tags) comes from
    :class:`slem_dask.models._estimator.EstimatorProtocol`.
    """

    _param_names: tuple[str, ...] = ()
    #: Parameters that change exemplar() only, never transform() (LinearSLEM's theta).
    _exemplar_only_params: tuple[str, ...] = ()
    #: Parameters that choose the arithmetic, not the model (LinearSLEM's precision):
    #: outputs encoded under either setting agree to the documented bound.
    _execution_params: tuple[str, ...] = ()
    #: Stored arrays that ``transform`` never reads (kept for updates): not part of the
    #: encoding fingerprint, so keeping them does not invalidate existing encodings.
    _bookkeeping_arrays: tuple[str, ...] = ()
    #: Arrays that name the model exactly when its identity comes from its inputs
    #: (KernelSLEM's pivots: other pivots are another model, not other rounding);
    #: None: the identity is always the arrays' fingerprint (baselines: an eigenvector's
    #: sign may flip with the rounding).
    _identity_arrays: tuple[str, ...] | None = None
    #: (negatives' fingerprint, the arrays then) of a model fitted from a store by a fit
    #: job (set by :meth:`_mark_fitted_on` when it is saved, and by load_model).
    _fitted_on: tuple[str, tuple] | None = None
    #: A model loaded with ``transform_only`` whose unread arrays are known by their
    #: record alone (cleared in effect by a fit: see :meth:`_read_in_part_still`).
    _read_in_part: ReadInPart | None = None
    #: Learned by ``fit`` (an annotation only: its absence means "not fitted").
    n_features_in_: int
    #: The fitted attribute that counts the outputs (PCAWhitening: n_components_).
    _n_outputs_attribute = "n_features_in_"
    #: Output j is input j, rescaled (RawFeatures): the outputs keep the inputs' names.
    _outputs_are_inputs = False
    #: scikit-learn's mark of a transformer whose output set_output configures.
    _sklearn_auto_wrap_output_keys = frozenset({"transform"})

    if TYPE_CHECKING:  # every model defines them; declared here for the type checker

        def fit(self, X: Rows, y: object = None) -> Self: ...

        def transform(self, X: Rows, dtype: DTypeLike | None = None) -> Array: ...

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        MODEL_CLASSES[cls.__name__] = cls
        if "transform" in cls.__dict__:  # as scikit-learn's _SetOutputMixin does
            cls.transform = _output.wrapping_output(cls.__dict__["transform"])  # type: ignore[method-assign]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._param_names)
        return f"{type(self).__name__}({args})"

    def fit_transform(self, X: Rows, y: object = None) -> Array:
        """``fit(X).transform(X)``: the encodings of the negatives themselves."""
        return self.fit(X, y).transform(X)

    # -- scikit-learn's output API -----------------------------------
    def get_feature_names_out(self, input_features=None) -> np.ndarray:
        """Names of the outputs of :meth:`transform`, an object array of strings.

        The class name in lower case and the output's index: ``linearslem0``,
        ``linearslem1``, ... (``kernelslem0`` ... ``kernelslem{rank_ - 1}``,
        ``pcawhitening0`` ..., ``esvm0`` ...), as scikit-learn names the outputs of PCA;
        :class:`RawFeatures` keeps the input names (output j is input j, normalized).
        ``input_features``: the names of the inputs, checked against
        ``feature_names_in_`` (default: those, else ``x0``, ``x1``, ...).
        """
        self._check_fitted()
        names = _output.input_feature_names(self, input_features)
        if self._outputs_are_inputs:
            return names
        prefix = type(self).__name__.lower()
        n_out = int(getattr(self, self._n_outputs_attribute))
        return np.asarray([f"{prefix}{i}" for i in range(n_out)], dtype=object)

    def set_output(self, *, transform: str | None = None) -> Self:
        """Choose the container :meth:`transform` returns for numpy or DataFrame input:
        ``"default"`` (numpy), ``"pandas"`` or ``"polars"`` (a DataFrame with the columns
        of :meth:`get_feature_names_out` and, for pandas input, its index); ``None``
        leaves it unchanged. Dask input always gives a lazy dask array. Returns self.

        scikit-learn's ``set_output`` API: a ``Pipeline``'s ``set_output`` and
        ``sklearn.set_config(transform_output=...)`` reach it too.
        """
        if transform is None:
            return self
        _output.check_output_name(transform)
        config = dict(getattr(self, _output.CONFIG_ATTRIBUTE, {}))
        config["transform"] = transform
        setattr(self, _output.CONFIG_ATTRIBUTE, config)
        return self

    def _transform_array(self, X: Rows, **kwargs) -> Array:
        """:meth:`transform`'s array, whatever :meth:`set_output` chose."""
        return type(self).transform.__wrapped__(self, X, **kwargs)  # type: ignore[attr-defined]

    # -- fitted state -------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "n_features_in_"):
            raise _estimator.NotFittedError(
                f"this {type(self).__name__} is not fitted yet; call fit(X) with the "
                f"negatives, or load a fitted model with slem_dask.load_model(path)"
            )

    @staticmethod
    def _output_dtype(p, dtype) -> np.dtype:
        """``dtype``, or by default from the input's: float64 in gives float64 out,
        anything else (float32, float16, integers) float32 (:func:`output_dtype`)."""
        return np.dtype(dtype) if dtype is not None else output_dtype(p.dtype)

    def _check_positives(self, X: Rows, name: str = "X") -> Array:
        """Rows to encode: fitted model, 2-D, as many features as the negatives. The
        message for a wrong count is scikit-learn's ("X has 1 features, but LinearSLEM
        is expecting 4 features as input"), with how to fix it."""
        self._check_fitted()
        X = check_rows(X, name)
        check_n_features(X, self.n_features_in_, name, fitted_on=type(self).__name__)
        return X

    # -- persistence --------------------------------------------------
    def _state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(info, arrays): what :meth:`save` writes besides the parameters."""
        raise NotImplementedError

    def _set_state(self, info: dict, arrays: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def _save_records(self) -> dict:
        """Facts derived from the arrays that :meth:`save` records beside them, so that
        a ``transform_only`` load need not read the arrays they come from."""
        return {}

    @classmethod
    def _transform_members(
        cls, meta: dict, encode_dtype=None, precision: str | None = None
    ) -> tuple[str, ...] | dict[str, storage.MemberCast | None] | None:
        """The stored arrays that ``transform`` needs, given a stored model's metadata
        (:func:`load_model`'s ``transform_only``, ``encode_dtype`` and ``precision``),
        or a mapping of them to the :class:`storage.MemberCast` each is read through;
        None: all of them."""
        return None

    def _array_ids(self) -> tuple:
        """What tells these arrays from any set since (a fit sets new ones)."""
        _, arrays = self._state()
        return tuple((k, id(v)) for k, v in arrays.items())

    def _read_in_part_still(self) -> ReadInPart | None:
        """What a model loaded ``transform_only`` and not fitted since knows from its
        record; None for any other model."""
        read_in_part = self._read_in_part
        if read_in_part is None or read_in_part.array_ids != self._array_ids():
            return None
        return read_in_part

    def _recorded_fingerprints(self) -> tuple[str, str] | None:
        """(fingerprint, encoding fingerprint) recorded in the store of a model read in
        part (their arrays were not all read); None for any other model."""
        read_in_part = self._read_in_part_still()
        if read_in_part is None:
            return None
        if read_in_part.params != self.get_params():
            raise ValueError(
                f"this {type(self).__name__} was loaded with transform_only=True and its "
                f"parameters changed since, so the fingerprints recorded with it no longer "
                f"describe it; load it whole (load_model(path)) before changing them"
            )
        return read_in_part.fingerprint, read_in_part.encoding_fingerprint

    @property
    def fingerprint_(self) -> str:
        self._check_fitted()
        recorded = self._recorded_fingerprints()
        if recorded is not None:
            return recorded[0]
        info, arrays = self._state()
        return storage.fingerprint(arrays, self.get_params())

    @property
    def encoding_fingerprint_(self) -> str:
        """Fingerprint of what ``transform`` depends on: models that share it encode
        identically (a LinearSLEM refitted with another theta keeps it)."""
        self._check_fitted()
        recorded = self._recorded_fingerprints()
        if recorded is not None:
            return recorded[1]
        _, arrays = self._state()
        arrays = {k: v for k, v in arrays.items() if k not in self._bookkeeping_arrays}
        params = {
            k: v
            for k, v in self.get_params().items()
            if k not in self._exemplar_only_params + self._execution_params
        }
        return storage.fingerprint(arrays, params)

    @property
    def identity_(self) -> str:
        """What names the model for its outputs: for a LinearSLEM or KernelSLEM fitted
        by a fit job, a digest of its inputs and parameters (the negatives' fingerprint,
        n_samples, parameters, kernel pivots, :data:`IDENTITY_VERSION`), so a refit of the
        same negatives with another partitioning or worker count (other rounding in the
        last bits) is the same model; otherwise :attr:`fingerprint_` (docs/numerics.md)."""
        return self._identity(self._execution_params) or self.fingerprint_

    @property
    def encoding_identity_(self) -> str:
        """:attr:`identity_` without the parameters that do not change ``transform``."""
        return (
            self._identity(self._exemplar_only_params + self._execution_params)
            or self.encoding_fingerprint_
        )

    def _mark_fitted_on(self, negatives_fingerprint: str) -> None:
        """Record that the arrays as they are now were fitted on those negatives."""
        self._fitted_on = (negatives_fingerprint, self._array_ids())

    def _identity(self, left_out: tuple[str, ...]) -> str | None:
        if self._identity_arrays is None or self._fitted_on is None:
            return None
        negatives, fitted = self._fitted_on
        if self._array_ids() != fitted:
            return None  # refitted or updated since (fit and update set new arrays)
        _, arrays = self._state()
        params = {k: v for k, v in self.get_params().items() if k not in left_out}
        return storage.fingerprint(
            {k: arrays[k] for k in self._identity_arrays},
            {
                "model": type(self).__name__,
                "params": params,
                "negatives": negatives,
                "n_samples": getattr(self, "n_samples_", None),
                "numerics": IDENTITY_VERSION,
            },
        )

    def save(
        self,
        path: str | os.PathLike[str],
        overwrite: bool = False,
        metadata: dict | None = None,
        transaction=None,
    ) -> str:
        """Write the fitted model to a zarr group at ``path``; return its fingerprint.

        ``metadata``: extra JSON-serializable facts to record (e.g. the source).
        The store is replaced whole or not at all, only if slem-dask wrote it, and
        under a lease (one writer at a time; ``transaction``: the caller's write of it,
        :meth:`slem_dask.storage.versioning.versions.VersionedStore.transaction`).
        """
        self._check_fitted()
        if self._read_in_part_still() is not None:
            raise ValueError(
                f"this {type(self).__name__} was loaded with transform_only=True: not all "
                f"of its arrays were read, so it cannot be saved; load it whole "
                f"(load_model(path)) to save it"
            )
        info, arrays = self._state()
        check_finite_model(arrays, f"model: this {type(self).__name__}")  # never saved
        records = {**self._save_records(), ENCODING_FINGERPRINT: self.encoding_fingerprint_}
        return storage.write_model_store(
            path,
            type(self).__name__,
            self.get_params(),
            arrays,
            {**info, **records, **(metadata or {})},
            overwrite=overwrite,
            transaction=transaction,
        )

    def similarity(self, p: Rows, q: Rows) -> Array:
        """Matching scores: cosines of the SLEM vectors of the rows of ``p`` and ``q``.

        Shape (len(p), len(q)), float64; numpy unless either input is a dask array.
        """
        # checked here so that messages name P and Q, not transform's X
        for rows, name in ((p, "P"), (q, "Q")):
            rows = self._check_positives(rows, name)
            if not is_dask_array(rows):
                check_finite_rows(np.asarray(rows), name)
        zp = self._transform_array(p, dtype=np.float64)
        zq = self._transform_array(q, dtype=np.float64)
        if is_dask_array(zp) or is_dask_array(zq):
            import dask.array as da

            zp, zq = da.asarray(zp), da.asarray(zq)
        return zp @ zq.T


def load_model(
    path: str | os.PathLike[str],
    *,
    transform_only: bool = False,
    encode_dtype: DTypeLike | None = None,
    precision: str | None = None,
) -> SLEMEstimator:
    """Load a model written by ``model.save(path)`` or ``slem-dask fit``.

    ``transform_only``: read only the arrays that ``transform`` uses, each checked
    against its own recorded SHA-256 (a LinearSLEM's mean and A^-1, not Sigma: half the
    bytes, 512 MiB fewer at d = 8192). Such a model encodes as the whole one does, bit
    for bit, but cannot be saved and has ``covariance_ = None``; models written before
    slem-dask recorded what this needs are read whole.

    ``encode_dtype`` (with ``transform_only``): the dtype of the rows the model will
    encode, with the ``precision`` they will be encoded with (``transform``'s; default:
    the model's; it decides what is read and does not change the model's parameter). A
    LinearSLEM that will encode them in float32 (float32 rows, precision "auto", A well
    enough conditioned) then reads A^-1 straight into the float32 copy that float32
    encoding uses, the same bits, and holds no float64 A^-1 (``precision_ = None``; 512
    MiB fewer and about 0.4 s less at d = 8192): it encodes only float32 rows then.
    """

    if encode_dtype is not None and not transform_only:
        raise ValueError(
            f"encode_dtype={encode_dtype!r} is given without transform_only=True: a model "
            f"read whole holds A^-1 as stored; pass transform_only=True with it, or drop it"
        )

    def members(meta: dict):
        # called before any array is read: an unknown model is refused without them
        if not transform_only or ENCODING_FINGERPRINT not in meta:
            return None
        return _model_class(meta, path)._transform_members(meta, encode_dtype, precision)

    meta, arrays = storage.read_model_store(path, members)
    cls = _model_class(meta, path)
    check_finite_model(arrays, f"model: {str(path)!r} holds a {meta['model']} that")
    model = cls(**meta["params"])
    model._set_state(meta, arrays)
    if meta.get("negatives_fingerprint"):
        model._mark_fitted_on(meta["negatives_fingerprint"])
    digests = meta.get(storage.ARRAY_SHA256) or {}
    if set(arrays) != set(digests or arrays):  # some left unread
        model._read_in_part = ReadInPart(
            meta["fingerprint"],
            meta[ENCODING_FINGERPRINT],
            dict(digests),
            model.get_params(),
            model._array_ids(),
        )
    return model


def model_width(path: str | os.PathLike[str]) -> int:
    """The number of features the model at ``path`` was fitted on, from its checked
    record alone: no array is read (a LinearSLEM's are 1 GiB at d = 8192), so a model
    of an unknown kind is refused here and damaged arrays only by :func:`load_model`."""
    meta = storage.read_model_meta(os.fspath(path))
    _model_class(meta, path)
    return int(meta["n_features"])


def _model_class(meta: dict, path) -> type[SLEMEstimator]:
    cls = MODEL_CLASSES.get(meta["model"])
    if cls is None:
        raise ValueError(
            f"model: {str(path)!r} holds a {meta['model']!r} model, which this version of "
            f"slem-dask does not know (it knows {sorted(MODEL_CLASSES)}); upgrade slem-dask"
        )
    return cls


def fresh_seed() -> int:
    """A seed from the OS's entropy, below 2**63 (models record it as an int64)."""
    # typed int | Sequence[int] | None, but a SeedSequence made without one draws an int
    entropy = cast(int, np.random.SeedSequence().entropy)
    return int(entropy % 2**63)
