"""Zarr v3 storage: input arrays, model stores and encoded outputs.

Layout and contracts (see README, "Zarr layout"):

* inputs are 2-D zarr arrays, addressed by a local path or an fsspec URL;
* a model is a zarr group whose attribute ``slem_dask`` (written last) says
  what it holds; its arrays are float64;
* an output is a 2-D zarr array whose ``slem_dask`` attribute carries
  ``complete: false`` while it is written and ``complete: true`` at the end.

Readers refuse a model or output that is not marked complete, so a run that
dies part-way never leaves something that looks valid.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from typing import Any

import numpy as np
import zarr

from ._version import __version__

__all__ = [
    "ATTR",
    "open_input",
    "dask_rows",
    "row_partition",
    "fingerprint",
    "write_model_store",
    "read_model_store",
    "create_output",
    "mark_complete",
    "open_output",
]

ATTR = "slem_dask"
MODEL_FORMAT_VERSION = 1

#: Bytes of input per dask partition when the caller does not choose.
DEFAULT_PARTITION_BYTES = 64 * 2**20


def _is_local(path: str) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


def _local(path: str) -> str:
    path = str(path)
    return path[len("file://"):] if path.startswith("file://") else path


def _exists(path: str) -> bool:
    if _is_local(path):
        return os.path.exists(_local(path))
    try:
        zarr.open(store=path, mode="r")
        return True
    except (FileNotFoundError, KeyError, ValueError):
        return False


def open_input(path: str, name: str) -> zarr.Array:
    """Open an existing 2-D zarr array for reading, with a clear error otherwise."""
    path = str(path)
    try:
        node = zarr.open(store=path, mode="r")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{name}: no zarr array at {path!r}; give the path of an existing zarr "
            f"array, e.g. corpus.zarr/negatives (`slem-dask demo` writes such a store)"
        ) from None
    except Exception as exc:  # zarr raises several types for non-zarr folders
        raise ValueError(
            f"{name}: {path!r} is not a readable zarr store ({type(exc).__name__}: {exc}); "
            f"give the path of a zarr v3 array"
        ) from None
    if isinstance(node, zarr.Group):
        members = sorted(k for k, v in node.members() if isinstance(v, zarr.Array))
        hint = f" (arrays in it: {', '.join(members)})" if members else ""
        raise ValueError(
            f"{name}: {path!r} is a zarr group, not an array{hint}; give the path of "
            f"an array inside it, e.g. {path.rstrip('/')}/{members[0] if members else 'negatives'}"
        )
    if node.ndim != 2:
        raise ValueError(
            f"{name}: the zarr array at {path!r} has shape {node.shape} ({node.ndim}-D); "
            f"expected a 2-D array (n_rows, n_features)"
        )
    if 0 in node.shape:
        raise ValueError(
            f"{name}: the zarr array at {path!r} has shape {node.shape}: it has no "
            f"{'features (columns)' if node.shape[1] == 0 else 'rows'}"
        )
    if not (np.issubdtype(node.dtype, np.floating) or np.issubdtype(node.dtype, np.integer)):
        raise TypeError(
            f"{name}: the zarr array at {path!r} has dtype {node.dtype}; expected real numbers"
        )
    meta = node.attrs.get(ATTR)
    if isinstance(meta, dict) and meta.get("kind") == "encoding" and not meta.get("complete"):
        raise ValueError(
            f"{name}: {path!r} is an unfinished slem-dask output (the run that wrote it "
            f"stopped part-way); run the same `slem-dask encode` again to finish it "
            f"(it resumes), or with --overwrite to start over"
        )
    return node


def _storage_rows(arr: zarr.Array) -> int:
    """Rows of the smallest unit that can be read or written whole (shard, else chunk)."""
    shards = getattr(arr, "shards", None)
    return int((shards or arr.chunks)[0])


def row_partition(arr: zarr.Array, partition_rows: int | None = None,
                  target_bytes: int = DEFAULT_PARTITION_BYTES) -> int:
    """Rows per dask partition: a whole multiple of the store's shard (or chunk) rows.

    Reading a partition then touches whole storage units only, and writing an
    output chunked the same way can never race on a shared chunk or shard.
    """
    unit = _storage_rows(arr)
    if partition_rows is None:
        row_bytes = max(1, arr.shape[1]) * 8  # the float64 copy a task makes
        # At least d rows: a fit's d x d partial then never outweighs its rows (issue 9).
        partition_rows = max(1, target_bytes // row_bytes, arr.shape[1])
    multiple = max(1, -(-int(partition_rows) // unit))  # round up
    return int(min(max(arr.shape[0], 1), multiple * unit)) if arr.shape[0] else unit


def dask_rows(arr: zarr.Array, partition_rows: int | None = None):
    """A dask array over the rows of ``arr``, whole rows per block."""
    import dask.array as da

    rows = row_partition(arr, partition_rows)
    return da.from_zarr(arr, chunks=(rows, arr.shape[1]))


def json_params(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as plain JSON values (numpy scalars such as np.float32(0.1) become floats)."""
    def native(value):
        if isinstance(value, np.generic):
            return value.item()
        raise TypeError(f"model parameter value {value!r} of type {type(value).__name__} "
                        f"cannot be stored; use a plain number or string")

    return json.loads(json.dumps(params, default=native))


def fingerprint(arrays: dict[str, np.ndarray], params: dict[str, Any]) -> str:
    """SHA-256 of a model's arrays (name, dtype, shape, bytes) and parameters."""
    h = hashlib.sha256()
    h.update(json.dumps(json_params(params), sort_keys=True).encode())
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(key.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.reshape(-1).view(np.uint8))  # the same bytes as a.tobytes(), without a copy
    return h.hexdigest()


def _check_overwrite(path: str, overwrite: bool, what: str, flag: str) -> None:
    if _exists(path) and not overwrite:
        raise FileExistsError(
            f"{what} {path!r} already exists; pass {flag} to replace it, or choose "
            f"another path"
        )


def _remove(path: str) -> None:
    if _is_local(path):
        local = _local(path)
        if os.path.isdir(local):
            shutil.rmtree(local)
        elif os.path.exists(local):
            os.remove(local)
    else:  # pragma: no cover - needs a remote store
        import fsspec

        fs, root = fsspec.core.url_to_fs(path)
        if fs.exists(root):
            fs.rm(root, recursive=True)


def write_model_store(path: str, model_name: str, params: dict, arrays: dict[str, np.ndarray],
                      info: dict, overwrite: bool = False) -> str:
    """Write a model group; return its fingerprint.

    Local paths are written to a hidden sibling folder and renamed into place,
    so the path holds either the old model, or the whole new one. Remote
    stores are written in place with the ``slem_dask`` attribute last.
    """
    path = str(path)
    _check_overwrite(path, overwrite, "model store", "overwrite=True (CLI: --overwrite)")
    params = json_params(params)
    fp = fingerprint(arrays, params)
    meta = {
        "kind": "model",
        "format_version": MODEL_FORMAT_VERSION,
        "model": model_name,
        "params": params,
        "fingerprint": fp,
        "package_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **info,
    }
    target = path
    if _is_local(path):
        local = os.path.abspath(_local(path))
        parent, base = os.path.split(local.rstrip(os.sep))
        os.makedirs(parent, exist_ok=True)
        target = os.path.join(parent, f".{base}.partial-{uuid.uuid4().hex[:12]}")
    try:
        group = zarr.open_group(store=target, mode="w")
        for key, value in arrays.items():
            value = np.asarray(value)
            arr = group.create_array(key, shape=value.shape, dtype=value.dtype,
                                     chunks=value.shape if value.ndim else None)
            arr[...] = value
        group.attrs[ATTR] = meta
        if target != path:
            if os.path.exists(local):
                trash = target + ".old"
                os.replace(local, trash)
                os.replace(target, local)
                _remove(trash)
            else:
                os.replace(target, local)
    except BaseException:
        if target != path:
            shutil.rmtree(target, ignore_errors=True)
        raise
    return fp


def read_model_store(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a model group written by :func:`write_model_store`: (metadata, arrays)."""
    path = str(path)
    try:
        group = zarr.open_group(store=path, mode="r")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"model: no zarr store at {path!r}; give the path written by "
            f"`slem-dask fit --model PATH` or model.save(PATH)"
        ) from None
    except Exception as exc:
        raise ValueError(
            f"model: {path!r} is not a zarr group ({type(exc).__name__}: {exc}); give "
            f"the path written by `slem-dask fit --model PATH` or model.save(PATH)"
        ) from None
    meta = group.attrs.get(ATTR)
    if not isinstance(meta, dict) or meta.get("kind") != "model":
        raise ValueError(
            f"model: the zarr store at {path!r} was not written by slem-dask (no "
            f"'{ATTR}' model attribute; a run that stopped part-way leaves none); "
            f"fit a model with `slem-dask fit` or model.save(PATH)"
        )
    if meta.get("format_version") != MODEL_FORMAT_VERSION:
        raise ValueError(
            f"model: {path!r} has format_version {meta.get('format_version')!r}, this "
            f"slem-dask {__version__} reads {MODEL_FORMAT_VERSION}; refit the model"
        )
    arrays = {key: np.asarray(arr[...]) for key, arr in group.arrays()}
    if fingerprint(arrays, meta["params"]) != meta.get("fingerprint"):
        raise ValueError(
            f"model: the arrays in {path!r} do not match its recorded fingerprint; the "
            f"store was modified or damaged, refit the model"
        )
    return meta, arrays


def create_output(path: str, shape: tuple[int, int], partition_rows: int, dtype,
                  meta: dict, overwrite: bool = False) -> zarr.Array:
    """Create the output array up front, one zarr chunk per dask partition.

    Chunks equal to the partitions mean every task writes whole chunks of its
    own (no read-modify-write on a chunk that another task also writes: the
    data-loss trap of dask#12583 and zarr-python#3682). It is marked
    ``complete: false`` until :func:`mark_complete`.
    """
    path = str(path)
    _check_overwrite(path, overwrite, "output", "--overwrite")
    if _exists(path):
        _remove(path)
    # write_empty_chunks: a partition whose encodings are all 0 must still leave
    # a chunk behind, since a resumed run takes a present chunk as done.
    # No compressor: encodings are dense floats that zstd shrinks by ~7% while
    # tripling the time to write a chunk (benchmarks/, bench_encode.py).
    # The marker goes into the array's own metadata document, written in one piece
    # with it: there is no moment when the array exists without "complete: false".
    return zarr.create_array(store=path, shape=shape, dtype=dtype,
                             chunks=(max(1, partition_rows), shape[1]), overwrite=True,
                             compressors=None, config={"write_empty_chunks": True},
                             attributes={ATTR: {"kind": "encoding", "complete": False,
                                                "package_version": __version__, **meta}})


def output_meta(arr: zarr.Array) -> dict | None:
    """The ``slem_dask`` attribute of an output written by slem-dask, else None."""
    meta = arr.attrs.get(ATTR)
    return dict(meta) if isinstance(meta, dict) and meta.get("kind") == "encoding" else None


def update_meta(arr: zarr.Array, **fields) -> dict:
    meta = dict(arr.attrs[ATTR])
    meta.update(fields)
    arr.attrs[ATTR] = meta
    return meta


def open_existing_output(path: str) -> zarr.Array | None:
    """The output array at ``path`` opened for writing, or None if nothing is there."""
    if not _exists(path):
        return None
    try:
        node = zarr.open(store=str(path), mode="r+")
    except Exception:
        return None
    return node if isinstance(node, zarr.Array) else None


def partition_written(arr: zarr.Array, index: int) -> bool:
    """Whether the chunk of row partition ``index`` is in the store.

    Zarr stores write a chunk whole or not at all (the local store writes a
    temporary file and renames it; object stores PUT atomically), and an
    output has one chunk per partition: a present chunk is a finished one.
    """
    from zarr.core.sync import sync

    key = arr.metadata.encode_chunk_key((index, 0))
    if arr.path:
        key = f"{arr.path}/{key}"
    return bool(sync(arr.store_path.store.exists(key)))


def remove_stray_partials(path: str) -> int:
    """Delete the temporary ``*.partial`` files that a killed writer leaves in a local
    zarr store (zarr writes a chunk to such a file, then renames it). Returns how many."""
    if not _is_local(path):
        return 0
    removed = 0
    for root, _, files in os.walk(_local(path)):
        for name in files:
            if name.endswith(".partial"):
                os.remove(os.path.join(root, name))
                removed += 1
    return removed


def mark_complete(arr: zarr.Array, extra: dict | None = None) -> None:
    update_meta(arr, **(extra or {}), complete=True,
                completed=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def open_output(path: str, name: str = "encodings") -> zarr.Array:
    """Open an output written by slem-dask (refused, like any input, if unfinished)."""
    return open_input(path, name)


def _key(path: str) -> str:
    path = str(path)
    if _is_local(path):
        return os.path.realpath(os.path.abspath(_local(path)))
    return path.rstrip("/")


def check_distinct(target: str, flag: str, inputs: dict[str, str]) -> None:
    """Refuse to write ``target`` where it would replace or nest in an input.

    With --overwrite, writing a model or output over (or inside, or around)
    the arrays being read would delete the user's data.
    """
    t = _key(target)
    for name, source in inputs.items():
        s = _key(source)
        if t == s or s.startswith(t + "/") or t.startswith(s + "/"):
            relation = ("is" if t == s else "contains" if s.startswith(t + "/")
                        else "is inside")
            raise ValueError(
                f"{flag} {str(target)!r} {relation} the {name} {str(source)!r}; writing it "
                f"would destroy the input: choose another path, e.g. a sibling such as "
                f"{str(source).rstrip('/').rsplit('/', 1)[0]}/slem_output")
