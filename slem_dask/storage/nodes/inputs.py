"""Opening what a job reads: the committed version of a versioned store, a member of
one, a plain zarr array (v3 or v2), or descriptors in a file of another format
(:mod:`.formats`), with one clear error for anything else."""

from __future__ import annotations

import os
from typing import Any, Literal, NoReturn

import numpy as np

import zarr

from ..formats import formats
from ..versioning import gc
from ..versioning import versions
from ...core.validation import check_array_metadata
from .checksums import metadata_checksum
from .chunks import read_rows
from ..versioning.ownership import ATTR, damaged_metadata
from ..backends.paths import canonical, check_outside_inputs, exists, zarr_store


def _exists(path) -> bool:
    """Whether ``path`` holds something to read or to refuse replacing: a committed
    version, or any store that is not slem-dask's drafts alone (a killed first write
    leaves only drafts: the next run reuses or deletes them). An empty folder holds
    neither, as an empty prefix of an object store does not exist (``mkdir out`` before
    a job is no store to replace)."""
    path = canonical(path)
    if not exists(path) or _empty_local_folder(path):
        return False
    store = versions.VersionedStore(path)
    return store.is_versioned() or not store.has_history()


def _empty_local_folder(path) -> bool:
    return path.is_local and os.path.isdir(path.location) and not os.listdir(path.location)


def _demo_member(name: str) -> str:
    """The array of the demo corpus that an input called ``name`` would be."""
    return {"positives": "database", "queries": "queries", "database": "database"}.get(
        name, "negatives"
    )


def _demo_example(name: str) -> str:
    """That array's path from the working directory: the demo's folder, or above it."""
    folder = "" if os.path.isdir("corpus.zarr") else "slem-demo/"
    return f"{folder}corpus.zarr/{_demo_member(name)}"


def open_node(path, mode: Literal["r", "r+", "a", "w", "w-"] = "r"):
    """The zarr v3 node that readers of ``path`` see: the head version of a versioned
    store (its metadata checked against its commit record), a member of one, or a plain
    zarr node. Raises FileNotFoundError when there is nothing to read."""
    location, store, commit = versions.resolve(path)
    if store is not None:
        assert commit is not None  # resolve gives a commit with every store
        store.check(commit)
    return zarr.open(store=zarr_store(location, mode), mode=mode, zarr_format=3)


def _open_zarr_v2(path: str):
    """The zarr v2 node at ``path`` (a plain store: slem-dask writes v3 only), or None."""
    try:
        return zarr.open(store=path, mode="r", zarr_format=2)
    except Exception:  # noqa: BLE001 - not a v2 store either: the caller says what is
        return None


def _open_zarr_input(path: str, name: str):
    """The zarr node (v3, else v2) an input path names, with a clear error otherwise."""
    try:
        return open_node(path)
    except versions.VersionError as exc:
        raise type(exc)(f"{name}: {exc}") from None
    except FileNotFoundError:
        if versions.VersionedStore(path).has_history():
            raise ValueError(
                f"{name}: {path!r} is an unfinished slem-dask output (the run that wrote "
                f"it stopped part-way, and nothing was committed); run the same `slem-dask "
                f"encode` again to finish it (it resumes), or with --overwrite to start "
                f"over"
            ) from None
        node = _open_zarr_v2(path)
        if node is not None:
            return node
        if formats.remote_format(path):  # x.npy, x.h5, x.fvecs: a file was meant
            raise FileNotFoundError(
                f"{name}: no file at {path!r}; check the path (it "
                f"may be relative to another folder)"
            ) from None
        raise FileNotFoundError(
            _folder_without_input(path, name)
            or f"{name}: no zarr array at {path!r} (nor a descriptor file); give "
            f"{formats.SUPPORTED}, e.g. {_demo_example(name)} (written by "
            f"`slem-dask demo`)"
        ) from None
    except Exception as exc:  # zarr raises several types for non-zarr folders
        raise damaged_metadata(name, path, exc) or ValueError(
            f"{name}: {path!r} is not a readable zarr store ({type(exc).__name__}: {exc}); "
            f"give the path of a zarr array (v2 or v3)"
        ) from None


def _folder_without_input(path: str, name: str) -> str | None:
    """What a local folder that holds neither a zarr array nor .npy shards holds (an
    empty one is a folder of shards not yet written, not a missing path), or None."""
    local = path[len("file://") :] if path.startswith("file://") else path
    if "://" in local or not os.path.isdir(local):
        return None
    names = sorted(os.listdir(local))
    held = (
        "it is empty"
        if not names
        else f"it holds {len(names)} other entr{'y' if len(names) == 1 else 'ies'}, "
        f"e.g. {names[0]!r}"
    )
    return (
        f"{name}: no zarr array at {path!r}, and no .npy shards in that folder ({held}); "
        f"put the shards there (.npy files of one width, read in natural name order), "
        f"or give the folder or quoted glob ('dir/*.npy') that holds them"
    )


def open_input(path: str, name: str, empty_ok: bool = False):
    """Open existing 2-D descriptors for reading: a zarr array (v2 or v3), or a file
    input of :mod:`.formats` (``.npy``, shards, HDF5, TEXMEX), with a clear error
    otherwise. Returns a ``zarr.Array`` or a :class:`.formats.FileArray`.
    ``empty_ok``: an array of 0 rows is valid (positives: their encoding is empty)."""
    where = canonical(path)
    path = str(where)
    node: Any = formats.open_file_input(where, name)
    if node is None:
        node = _open_zarr_input(path, name)
        kind = "zarr array"
    else:
        kind = f"{node.format} input"
    if isinstance(node, zarr.Group):
        node = _exported_output(node) or _refuse_group(node, path, name)
    _check_shape_and_dtype(node, path, name, kind, empty_ok)
    if isinstance(node, formats.FileArray):
        return node  # its shape and dtype are the files' own; it has no metadata
    check_array_metadata(node, name, path)  # before any chunk is listed or read
    _check_slem_dask_output(node, path, name)
    return node


def _exported_output(node) -> zarr.Array | None:
    """The array of an output that ``slem-dask export`` copied out (a group marked as an
    output's, the array its member ``encodings``), else None."""
    from .readers import ENCODINGS

    meta = node.attrs.get("slem_dask")
    if isinstance(meta, dict) and meta.get("kind") == "encoding" and ENCODINGS in node:
        member = node[ENCODINGS]
        return member if isinstance(member, zarr.Array) else None
    return None


def _refuse_group(node, path: str, name: str) -> NoReturn:
    """A zarr group given where rows are expected: name what it is and the array to give."""
    meta = node.attrs.get("slem_dask")
    written = {"model": "model", "search": "search result"}.get(
        str(meta.get("kind")) if isinstance(meta, dict) else ""
    )
    if written:  # its arrays (a covariance, top-k indices) are not descriptors
        raise ValueError(
            f"{name}: {path!r} is a slem-dask {written}, not descriptors; give rows of "
            f"descriptors, or encodings (the --out of `slem-dask encode`)"
        )
    members = sorted(k for k, v in node.members() if isinstance(v, zarr.Array))
    hint = f" (arrays in it: {', '.join(members)})" if members else ""
    example = _demo_member(name)
    if members and example not in members:
        example = members[0]
    raise ValueError(
        f"{name}: {path!r} is a zarr group, not an array{hint}; give the path of "
        f"an array inside it, e.g. {path.rstrip('/')}/{example}"
    )


def _check_shape_and_dtype(node, path: str, name: str, kind: str, empty_ok: bool) -> None:
    """2-D, with columns (and rows unless ``empty_ok``), of real numbers."""
    if node.ndim != 2:
        fix = (
            "; if it is one descriptor, store it as one row: x.reshape(1, -1) "
            "(zarr.create_array(..., shape=(1, len(x)), ...))"
            if node.ndim == 1
            else "; store it as 2-D rows, e.g. x.reshape(len(x), -1)"
        )
        raise ValueError(
            f"{name}: the {kind} at {path!r} has shape {node.shape} ({node.ndim}-D); "
            f"expected a 2-D array (n_rows, n_features){fix}"
        )
    if node.shape[1] == 0 or (node.shape[0] == 0 and not empty_ok):
        raise ValueError(
            f"{name}: the {kind} at {path!r} has shape {node.shape}: it has no "
            f"{'features (columns)' if node.shape[1] == 0 else 'rows'}"
        )
    if not (np.issubdtype(node.dtype, np.floating) or np.issubdtype(node.dtype, np.integer)):
        raise TypeError(
            f"{name}: the {kind} at {path!r} has dtype {node.dtype}; expected real numbers "
            f"(integers or floats): save the descriptors as float32 (x.astype(np.float32), "
            f"or x.real for complex ones)"
        )


def _check_slem_dask_output(node, path: str, name: str) -> None:
    """A slem-dask output read as input: refused when edited or unfinished."""
    meta = node.attrs.get(ATTR)
    if (
        isinstance(meta, dict)
        and meta.get("kind") == "encoding"
        and meta.get("complete")
        and "metadata_checksum" in meta
        and meta["metadata_checksum"] != metadata_checksum(meta)
    ):
        raise ValueError(
            f"{name}: the metadata of the slem-dask output {path!r} does not match its "
            f"checksum (a fingerprint or recorded checksum was edited); run its "
            f"`slem-dask encode` again with --overwrite"
        )
    if isinstance(meta, dict) and meta.get("kind") == "encoding" and not meta.get("complete"):
        raise ValueError(
            f"{name}: {path!r} is an unfinished slem-dask output (the run that wrote it "
            f"stopped part-way); run the same `slem-dask encode` again to finish it "
            f"(it resumes), or with --overwrite to start over"
        )


def read_all(path, name: str = "encodings") -> np.ndarray:
    """A whole (small) array, with missing or corrupt chunks named."""
    arr = open_input(path, name, empty_ok=True)  # an encoding of no positives is empty
    return read_rows(arr, 0, arr.shape[0], name)


def read_labels(path, name: str, n_rows: int) -> np.ndarray:
    """The labels of ``n_rows`` rows, one per row: a 1-D (or one-column) zarr array,
    .npy file or HDF5 dataset (``FILE.h5:/labels``) of integers or strings."""
    where = canonical(path)
    location, dataset = (
        formats.split_hdf5(where.location) if where.is_local else (where.location, None)
    )
    fmt = formats.file_format(where.location) if where.is_local else None
    if fmt == "npy":
        try:
            labels = np.load(location, allow_pickle=False)
        except ValueError as exc:
            raise ValueError(
                f"{name}: {str(where)!r} cannot be read as a .npy array "
                f"({exc}); save the labels with np.save(path, labels)"
            ) from None
    elif fmt == "hdf5":
        h5py = formats._h5py(location, name)
        with h5py.File(location, "r") as f:
            if dataset is None or not isinstance(f.get(dataset), h5py.Dataset):
                raise ValueError(_no_labels_dataset(f, location, dataset, name, n_rows))
            labels = f[dataset][...]
    elif fmt not in (None, "unknown"):
        raise ValueError(
            f"{name}: {str(where)!r} is a {fmt} input; labels are a 1-D .npy "
            f"file, zarr array or HDF5 dataset (one label per row)"
        )
    else:
        node = _open_zarr_input(str(where), name)
        if isinstance(node, zarr.Group):
            raise ValueError(
                f"{name}: {str(where)!r} is a zarr group; give the 1-D array of labels inside it"
            )
        labels = read_rows(node, 0, node.shape[0], name) if node.ndim == 2 else node[...]
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1 or labels.dtype.kind not in "iubUS":  # not _is_labels: any length
        raise ValueError(
            f"{name}: {str(where)!r} holds {labels.dtype} of shape "
            f"{labels.shape}; expected one integer or string label per row, "
            f"shape ({n_rows},): save them as such (labels.astype(np.int64) for whole "
            f"numbers held as floats)"
        )
    if len(labels) != n_rows:
        raise ValueError(
            f"{name}: {str(where)!r} holds {len(labels)} labels for {n_rows} "
            f"rows; give one label per row, in row order"
        )
    return labels


def _is_labels(shape, dtype, n_rows: int) -> bool:
    """Whether an array of ``shape`` and ``dtype`` can be the labels of ``n_rows`` rows."""
    return shape in ((n_rows,), (n_rows, 1)) and dtype.kind in "iubUS"


def _no_labels_dataset(f, location: str, dataset: str | None, name: str, n_rows: int) -> str:
    """Why an HDF5 path names no labels, suggesting only the datasets that can be them
    (a 2-D dataset of descriptors cannot), or saying that none can."""
    found = formats._datasets(f)
    fits = [k for k in found if _is_labels(f[k].shape, f[k].dtype, n_rows)]
    which = (
        f"{location!r} has no dataset {dataset!r}" if dataset else f"{location!r} is an HDF5 file"
    )
    if fits:
        shown = " or ".join(f"{location}:{k}" for k in fits[:6])
        return f"{name}: {which}; give the dataset of its {n_rows} labels: {shown}"
    shown = ", ".join(f"{k} {f[k].dtype} {f[k].shape}" for k in found[:6]) or "none"
    return (
        f"{name}: {which}, and none of its datasets can be the labels ({n_rows} integers "
        f"or strings, shape ({n_rows},); its datasets: {shown}): give the labels' "
        f"file (.npy, zarr or FILE.h5:/dataset)"
    )


def _key(path) -> str:
    return canonical(path).key


def check_distinct(
    target, flag: str, inputs: dict[str, object], outputs: dict[str, object] | None = None
) -> None:
    """Refuse to write ``target`` where it would replace or nest in an input (or in
    another of ``outputs``), where it would shadow a member of a versioned store
    (``corpus.zarr/queries``), or inside a store's version folders or commit records.
    Inputs are compared by what they occupy on disk (a glob's files, an HDF5 file)."""
    target = canonical(target)
    parts = target.url.rstrip("/").split("/")
    for i, part in enumerate(parts[:-1]):
        if (
            part in (versions.VERSIONS, versions.COMMITS, gc.FATES)
            and i > 0
            and versions.VersionedStore("/".join(parts[:i])).has_history()
        ):
            raise ValueError(
                f"{flag} {str(target)!r} is inside the {part} of the slem-dask store "
                f"{'/'.join(parts[:i]).replace('file://', '')!r}, which nobody writes but "
                f"slem-dask's commits: choose a path outside it"
            )
    location, owner, commit = versions.resolve(target)
    if owner is not None and owner.path.url != target.url and exists(canonical(location)):
        assert commit is not None  # resolve gives a commit with every store
        raise ValueError(
            f"{flag} {str(target)!r} is the member {target.name!r} of version {commit.seq} "
            f"of the slem-dask store {str(owner.path)!r}: writing there would hide it from "
            f"every reader; choose another name"
        )
    roots, globs = {}, []
    for name, path in inputs.items():
        kind, root = _input_root(path, name)
        roots[f"{name} {kind}".rstrip()] = root
        if kind == "shard":
            globs.append((name, canonical(path).location, root))
    check_outside_inputs(
        target,
        flag,
        roots,
        outputs,
        folders=tuple(k for k in roots if k.endswith("folder of .npy shards")),
    )
    for name, pattern, files in globs:
        _check_not_matched(target, flag, name, pattern, files)


def _input_root(path, name: str):
    """(kind, what an input occupies on disk): the file of ``FILE.h5:/dataset``, the
    files a glob of shards matches (kind "shard"), a folder of shards (an output inside
    it adds files to the input)."""
    if path is None or not canonical(path).is_local:
        return "", path
    location = formats.split_hdf5(canonical(path).location)[0]
    fmt = formats.file_format(location)
    if fmt == "npy shards" and not os.path.isdir(location):  # a glob
        return "shard", formats._shard_files(location, name)
    if fmt == "npy shards":
        return "folder of .npy shards", location
    return "", location


def _check_not_matched(target, flag: str, name: str, pattern: str, files: list) -> None:
    """Refuse a target a glob input would match: the next run would read it as a shard."""
    import fnmatch

    t = canonical(target)
    parts, wanted = t.location.split("/"), pattern.split("/")
    if (
        t.is_local
        and len(parts) == len(wanted)
        and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, wanted, strict=True))
    ):
        from ..backends.paths import _suggestion

        raise ValueError(
            f"{flag} {str(t)!r} matches the {name} glob {pattern!r}; a later run would "
            f"read it as one of its shards: choose a path the glob does not match, e.g. "
            f"{_suggestion(t, [canonical(f) for f in files])}"
        )


def open_output(path, name: str = "encodings") -> zarr.Array:
    """Open an output written by slem-dask (refused, like any input, if unfinished;
    an encoding of 0 positives is empty)."""
    return open_input(path, name, empty_ok=True)
