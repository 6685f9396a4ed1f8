"""Input checks shared by the estimators, the jobs and the command line.

Every error names the parameter, the value received, what was expected and how
to fix it.
"""

from __future__ import annotations

import math
import warnings
import numbers
from typing import TYPE_CHECKING, TypeAlias, Union

import numpy as np

if TYPE_CHECKING:  # for the type checker only: the numpy paths never import dask
    import dask.array as da
    import numpy.typing as npt
    from typing_extensions import TypeIs  # typing's own from Python 3.13

#: What the public API takes as rows (:func:`check_rows`): a numpy array or anything
#: numpy converts (an xarray DataArray too), or a dask array, kept lazy.
Rows: TypeAlias = Union["npt.ArrayLike", "da.Array"]
#: What it returns for them: numpy for numpy input, a lazy dask array for dask input.
Array: TypeAlias = Union[np.ndarray, "da.Array"]

__all__ = [
    "check_positive_float",
    "check_rows",
    "check_n_features",
    "check_finite_rows",
    "check_array_metadata",
    "output_dtype",
    "is_dask_array",
    "unwrap_xarray",
]


def is_dask_array(x: object) -> TypeIs[da.Array]:
    # Imported lazily: the numpy paths must not pay for importing dask.
    try:
        import dask.array as da
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, da.Array)


def check_positive_float(value, name: str, hint: str = "") -> float:
    """A finite real number > 0 (lam, theta, gamma ...)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a real number > 0, got {value!r} of type {type(value).__name__}{hint}"
        )
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}{hint}")
    return value


#: The default lambda of linear SLEM: 1% of the negatives' total variance tr(Sigma) (docs/
#: troubleshooting.md, "Defaults": measured on the demo corpora and scikit-learn's digits).
DEFAULT_LAM = "0.01x"
#: An absolute lambda this far below or above the negatives' mean variance tr(Sigma)/d
#: says nothing about the data: whitening without regularization, or none at all.
LAM_SCALE_LIMITS = (1e-6, 1e3)


def caller_stacklevel() -> int:
    """The ``stacklevel`` of a warning raised here that points at the first line outside
    slem_dask (the user's call), however many of slem_dask's frames are between (a
    wrapper such as the scikit-learn output API's adds one): called in the argument list
    of ``warnings.warn`` by the function that warns."""
    import os
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


class LambdaScaleWarning(UserWarning):
    """An absolute lambda that the negatives' scale makes meaningless."""


def parse_relative(value, name: str, expected: str) -> float | None:
    """c of a value given relative to the data as a text "<c>x" (checked > 0), or None
    for any other value; ``expected``: what the value may be, for the error."""
    if not (isinstance(value, str) and value.strip().lower().endswith("x")):
        return None
    try:
        number = float(value.strip().lower()[:-1])
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected {expected}") from None
    return check_positive_float(number, name, f" (in {value!r})")


def parse_lam(value, name: str = "lam") -> tuple[float, bool]:
    """(c, relative) of a lambda: a number > 0 is absolute (in the data's squared units);
    a text "<c>x" is c times the negatives' total variance tr(Sigma) (e.g. "0.01x"); any
    other text is a TypeError, as it always was (a number given as text is ambiguous)."""
    relative = parse_relative(
        value,
        name,
        f"a number > 0 (absolute, in the data's squared units) or a number followed by 'x' "
        f"(that many times the negatives' total variance tr(Sigma), e.g. '{DEFAULT_LAM}', "
        f"the default)",
    )
    if relative is not None:
        return relative, True
    return check_positive_float(
        value,
        name,
        f"; or a text 'Cx', C times the negatives' total variance (e.g. '{DEFAULT_LAM}')",
    ), False


def effective_lam(value, cov: np.ndarray, name: str = "lam") -> float:
    """The absolute lambda that ``value`` (see :func:`parse_lam`) means for negatives of
    covariance ``cov``; warns (:class:`LambdaScaleWarning`) when an absolute one is far
    outside their scale. Negatives with no variance take c itself."""
    c, relative = parse_lam(value, name)
    total = float(np.trace(cov))
    if relative:
        return c * total if total > 0 else c
    d = cov.shape[0]
    if total > 0:
        ratio = c / (total / d)
        low, high = LAM_SCALE_LIMITS
        if not low <= ratio <= high:
            effect = (
                "it barely regularizes: A = Sigma + lam I is nearly singular and "
                "encodings follow the noise of the smallest directions"
                if ratio < low
                else "the model barely whitens: A ~ lam I, so it only centres"
            )
            warnings.warn(
                LambdaScaleWarning(
                    f"{name}={c:g} is {ratio:.2g} times the negatives' mean variance "
                    f"(tr(Sigma)/d = {total / d:.3g}): {effect}; give a lambda relative to "
                    f"their scale, e.g. --lam {DEFAULT_LAM} ({DEFAULT_LAM[:-1]} x tr(Sigma) = "
                    f"{float(DEFAULT_LAM[:-1]) * total:.3g})"
                ),
                stacklevel=caller_stacklevel(),
            )
    return c


def output_dtype(dtype) -> np.dtype:
    """The dtype of encodings of rows of ``dtype`` when the caller names none: float64
    for float64 (and longer) rows, float32 for anything else: floats of at most 4
    bytes (float16 included: the float32 a block is computed from, never rounded back
    to 11 bits) and integers (uint8 SIFT rows would otherwise encode to 8x their size;
    their statistics are still merged in float64). The library's transforms and the
    encode job both use it; an explicit dtype always wins."""
    dtype = np.dtype(dtype)
    wide = np.issubdtype(dtype, np.floating) and dtype.itemsize > 4
    return np.dtype(np.float64 if wide else np.float32)


def _reshape_hint(x, name: str) -> str:
    if x.ndim == 1:
        return (
            f"; Reshape your data: {name}.reshape(1, -1) if it is one descriptor "
            f"(one row), {name}.reshape(-1, 1) if it is one feature"
        )
    return f"; reshape it, e.g. {name}.reshape(len({name}), -1)"


def unwrap_xarray(x):
    """The array under an xarray DataArray (lazy dask stays lazy); anything else unchanged."""
    if type(x).__name__ == "DataArray" and type(x).__module__.startswith("xarray"):
        return x.data
    return x


def check_rows(x: Rows, name: str, min_rows: int = 1) -> Array:
    """A 2-D float array (numpy or dask) of rows, with known chunks.

    Returns the array: numpy input (or anything numpy can convert) as a numpy
    array, dask input unchanged, an xarray DataArray as the array it wraps (a
    dask-backed one stays lazy).
    """
    x = unwrap_xarray(x)
    x = _checked_dask_rows(x, name) if is_dask_array(x) else _numpy_rows(x, name)
    _check_real_dtype(x, name)
    if x.shape[1] == 0:
        raise ValueError(
            f"{name} has 0 feature(s) (shape={x.shape}) while a minimum of 1 "
            f"is required: it has no features (columns)"
        )
    if x.shape[0] < min_rows:
        raise ValueError(
            f"{name} has {x.shape[0]} rows, shape {x.shape}: {x.shape[0]} sample(s) while a "
            f"minimum of {min_rows} is required (at least {min_rows} "
            f"{'row is' if min_rows == 1 else 'rows are'} needed)"
        )
    return x


def _check_2d(x, name: str) -> None:
    if x.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array (n_rows, n_features), got {x.ndim}-D "
            f"shape {x.shape}{_reshape_hint(x, name)}"
        )


def _checked_dask_rows(x, name: str):
    """A dask array of whole rows in blocks of known sizes, unchanged."""
    _check_2d(x, name)
    if any(math.isnan(c) for c in x.chunks[0]):
        raise ValueError(
            f"{name} has unknown row chunk sizes {x.chunks[0]!r}; call "
            f"{name}.compute_chunk_sizes() before passing it"
        )
    if len(x.chunks[1]) != 1:
        raise ValueError(
            f"{name} is chunked along columns (chunks {x.chunks[1]!r}); SLEM needs "
            f"whole rows in each block: use {name}.rechunk({{1: -1}})"
        )
    return x


def _numpy_rows(x, name: str) -> np.ndarray:
    """Anything numpy can convert (not a sparse matrix) as a 2-D numpy array; an array
    of Python numbers (dtype object) as float64."""
    from scipy import sparse

    if sparse.issparse(x):
        raise TypeError(
            f"{name} is a scipy sparse matrix of shape {x.shape}; sparse input is not "
            f"supported: densify it with {name}.toarray()"
        )
    x = np.asarray(x)
    if x.dtype == object:
        try:
            x = x.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{name} holds Python objects that are not all numbers (dtype object, "
                f"shape {x.shape}: {exc}); give an array of real numbers"
            ) from None
    _check_2d(x, name)
    return x


def _check_real_dtype(x, name: str) -> None:
    if np.issubdtype(x.dtype, np.complexfloating):
        raise ValueError(
            f"{name} has dtype {x.dtype}: Complex data not supported; give an array of real numbers"
        )
    if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(x.dtype, np.integer):
        raise TypeError(
            f"{name} must hold real numbers, got dtype {x.dtype}; convert it with "
            f".astype('float32')"
        )


def check_n_features(x, expected: int, name: str, fitted_on: str = "the model") -> None:
    if x.shape[1] != expected:
        raise ValueError(
            f"{name} has {x.shape[1]} features, but {fitted_on} is expecting {expected} "
            f"features as input: give descriptors of the dimension of the negatives it "
            f"was fitted on"
        )


def count_nonfinite_rows(x: np.ndarray) -> int:
    return int(x.shape[0] - np.count_nonzero(np.isfinite(x).all(axis=1)))


class RowsError(ValueError):
    """Bad rows of an input. ``str(exc)`` names the parameter ("P has 1 row(s) with
    NaN or inf ..."); ``exc.detail`` is the same without it, for callers that name the
    input themselves (the jobs: "positives 'pos.zarr': 1 row(s) with NaN or inf ...").
    Built from its args only, so it pickles (it travels back from workers)."""

    def __init__(self, name: str, detail: str, rows: tuple[int, ...] = ()):
        super().__init__(name, detail, rows)
        self.name, self.detail = name, detail
        #: the row numbers the message shows (so a job can say which file holds them)
        self.rows = tuple(rows)

    def __str__(self) -> str:
        return f"{self.name} has {self.detail}"


class NonFiniteRowsError(RowsError):
    """Rows with NaN or inf."""


class LargeValuesError(RowsError):
    """Values beyond :data:`MAX_ABS_VALUE`, whose squares float64 cannot hold."""


class DegenerateEncodingsError(RowsError):
    """Rows whose encoding is all zeros or holds NaN or inf (see :func:`check_encoded_rows`)."""


class DegenerateNegativesWarning(UserWarning):
    """Negatives that are all identical: the model only subtracts their mean."""


#: Largest magnitude of a value in float64 negatives: the covariance sums squares
#: (up to n (2 x 1e100)^2 = 4e200 n), and A^-1, the cond(A) bound and the encodings
#: need headroom above that in float64 (largest finite 1.8e308). float32, float16
#: and integer data never come near it.
MAX_ABS_VALUE = 1e100


def large_values_detail(peak: float) -> str:
    """What :class:`LargeValuesError` says after the parameter's name."""
    shown = f"{peak:.3g}" if np.isfinite(peak) else "beyond 1.8e308 in their sums"
    power = int(np.floor(np.log10(peak))) if np.isfinite(peak) and peak > 0 else 300
    return (
        f"values up to {shown} in magnitude, beyond the {MAX_ABS_VALUE:.0e} that slem-dask "
        f"computes with (the covariance sums their squares in float64); divide the "
        f"descriptors by a common factor, e.g. 1e{power}, or L2-normalize them (and "
        f"divide lam by that factor squared to keep the same model)"
    )


def check_encoded_rows(z: np.ndarray, row_offset: int = 0, zero_reason: str = "") -> None:
    """Raise :class:`DegenerateEncodingsError` if any encoding row is all zeros or holds
    NaN or inf: such a row has no direction to rank by, so an output holding one must
    never be marked complete. ``zero_reason``: why this model gives a row 0."""
    # Squares in the rows' own precision (a float32 einsum is 5x faster than a float64
    # one): a sum that is finite and > 0 proves the row finite and not all zeros, since a
    # NaN or inf entry makes it NaN or inf. Only rows that fail (or whose squares over- or
    # underflowed float32) are summed again in float64, a block at a time: a cast of the
    # whole partition would double an encode task's memory (slem_dask/cluster/workers.py).
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        squares = np.einsum("ij,ij->i", z, z)
    suspect = np.flatnonzero(~(np.isfinite(squares) & (squares > 0)))
    if not suspect.size:
        return
    squares = np.asarray(squares, dtype=np.float64)
    for i in range(0, suspect.size, 1024):
        rows = suspect[i : i + 1024]
        squares[rows] = np.einsum("ij,ij->i", z[rows], z[rows], dtype=np.float64)
    if np.all(squares > 0) and np.isfinite(squares).all():
        return
    nonfinite = np.flatnonzero(~np.isfinite(squares))
    # a square sum of 0 can be entries too small to square: only all-zero rows count
    zero = np.array([i for i in np.flatnonzero(squares == 0) if not z[i].any()], dtype=int)
    error = degenerate_encodings_error(zero, nonfinite, row_offset, zero_reason)
    if error is not None:
        raise error


def degenerate_encodings_error(
    zero: np.ndarray, nonfinite: np.ndarray, row_offset: int = 0, zero_reason: str = ""
) -> DegenerateEncodingsError | None:
    """:func:`check_encoded_rows`'s error for the rows ``zero`` (encoded to all zeros) and
    ``nonfinite`` (NaN or inf) of a block from row ``row_offset``; None if both are empty."""
    parts = []
    for rows, what, why in (
        (zero, "all zeros", zero_reason or "such a row has no direction"),
        (
            nonfinite,
            "NaN or inf",
            "their values overflow float64 in the encoding: divide "
            "the descriptors by a common factor or L2-normalize them",
        ),
    ):
        if rows.size:
            shown = rows_text(rows + row_offset, rows.size)
            parts.append(f"{rows.size} row(s) whose encoding is {what} (rows {shown}): {why}")
    return DegenerateEncodingsError("X", "; ".join(parts)) if parts else None


def all_finite(a: np.ndarray, rows: int = 256) -> bool:
    """np.isfinite(a).all(), ``rows`` rows at a time: no boolean copy of a d x d model
    array (64 MiB at d = 8192)."""
    a = np.asarray(a)
    if a.ndim < 2:
        return bool(np.isfinite(a).all())
    return all(np.isfinite(a[i : i + rows]).all() for i in range(0, len(a), rows))


def check_finite_model(arrays: dict, what: str) -> None:
    """Refuse a model whose arrays hold NaN or inf (``what`` names the model): it would
    encode every positive to NaN or 0."""
    for key, value in arrays.items():
        value = np.asarray(value)
        if value.dtype.kind in "fc" and not all_finite(value):
            count = int(value.size - np.count_nonzero(np.isfinite(value)))
            raise ValueError(
                f"{what} has NaN or inf in its array {key!r} ({count} of {value.size} "
                f"entries); such a model encodes positives to NaN or zeros: fit it again "
                f"(this slem-dask refuses to fit one from values beyond {MAX_ABS_VALUE:.0e} "
                f"or with a lam too small to invert Sigma + lam I)"
            )


class RowsText(str):
    """Row numbers as text ("3, 7, ..."), keeping the numbers it shows in ``rows``."""

    rows: tuple[int, ...] = ()


def rows_text(rows, count: int) -> RowsText:
    """The first five of ``rows`` as text, with ", ..." when ``count`` says there are more."""
    shown = tuple(int(i) for i in rows[:5])
    text = RowsText(", ".join(map(str, shown)) + (", ..." if count > 5 else ""))
    text.rows = shown
    return text


def nonfinite_rows(x: np.ndarray, row_offset: int = 0) -> tuple[int, str]:
    """(how many rows of ``x`` hold NaN or inf, the first five of them as text)."""
    bad = np.flatnonzero(~np.isfinite(x).all(axis=1)) + row_offset
    return bad.size, rows_text(bad, bad.size)


def nonfinite_rows_error(
    name: str,
    count: int,
    shown: str | None,
    total: int | None = None,
    remedy: str = "drop or repair those rows before fitting",
    where: str = "",
) -> NonFiniteRowsError:
    """The one wording of rows with NaN or inf, in every fit and encode: how many, the
    first five (``shown``, if known), out of how many rows (``total``, if counted),
    ``where`` they were looked for (text after the rows; "": everywhere), the fix."""
    rows = f" (rows {shown})" if shown is not None else ""
    out_of = f" out of {total}" if total is not None else ""
    return NonFiniteRowsError(
        name,
        f"{count} row(s) with NaN or inf{rows}{out_of}{where}; {remedy}",
        getattr(shown, "rows", ()),
    )


def check_finite_rows(
    x: np.ndarray,
    name: str,
    row_offset: int = 0,
    remedy: str = "drop or repair those rows before running SLEM",
    where: str = "",
) -> None:
    """Raise if any row of a numpy block holds NaN or inf, saying how many, where
    (``where``: which part of the input ``x`` is, "" for all of it), and ``remedy``."""
    if np.isfinite(x).all():
        return
    count, shown = nonfinite_rows(x, row_offset)
    raise nonfinite_rows_error(name, count, shown, remedy=remedy, where=where)


#: Largest declared size of an input array: numpy and dask index with int64, and no
#: store holds 2**63 bytes, so a larger shape in zarr.json is damage, not data.
MAX_ARRAY_BYTES = 2**63 - 1

#: Largest declared chunk: zarr decodes a chunk whole, in memory, on one worker.
MAX_CHUNK_BYTES = 2**40


def _bytes_text(n: int) -> str:
    # JSON integers have no bound: 10**400 is not a float
    return f"{n:.3g}" if n < 1e300 else f"about 10**{len(str(n)) - 1}"


def check_array_metadata(arr, name: str, path) -> None:
    """Refuse a 2-D zarr array whose zarr.json declares a chunk grid or size that no
    real array has (a chunk dimension of 0, more than 2**63 bytes, a chunk over 1 TiB).

    Metadata only, O(1) whatever the declared size: runs when an input is opened,
    before any chunk is listed or read (a zero chunk dimension used to end fit and
    encode with ZeroDivisionError, a shape of 1e30 rows to hang them).
    """
    fix = (
        f"its zarr.json is damaged or was edited: restore it from a copy, or rewrite the "
        f"array (zarr.create_array(..., chunks=(rows, {arr.shape[1]})))"
    )
    where = f"{name}: the zarr array at {str(path)!r}"
    for what, shape in (("chunk", arr.chunks), ("shard", getattr(arr, "shards", None))):
        if shape is not None and (len(shape) != 2 or min(shape) < 1):
            raise ValueError(
                f"{where} declares {what} shape {tuple(shape)} for shape "
                f"{arr.shape}; a {what} dimension below 1 holds no data, so "
                f"{fix}"
            )
    itemsize = np.dtype(arr.dtype).itemsize
    size = int(arr.shape[0]) * int(arr.shape[1]) * itemsize
    if size > MAX_ARRAY_BYTES:
        raise ValueError(
            f"{where} declares shape {arr.shape} of {arr.dtype}, {_bytes_text(size)} "
            f"bytes; at most 2**63 - 1 bytes can be indexed (and no store "
            f"holds that many), so {fix}"
        )
    chunk = int(arr.chunks[0]) * int(arr.chunks[1]) * itemsize
    if chunk > MAX_CHUNK_BYTES:
        raise ValueError(
            f"{where} declares chunks of shape {arr.chunks}, {_bytes_text(chunk)} bytes "
            f"each; zarr decodes a chunk whole in memory and slem-dask reads "
            f"chunks of at most 2**40 bytes (1 TiB), so {fix}"
        )
