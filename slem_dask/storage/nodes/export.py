"""``slem-dask export``: one committed version of a versioned store copied out as a plain
zarr v3 node (no versions, no commit records) or, for an output, a ``.npy`` file, for
tools that need a plain path.

Nothing half-written looks valid: a zarr copy writes its chunks first and its root
``zarr.json`` last (a copy without it is no zarr node), behind a marker file that lets a
re-run recognize and replace its own unfinished copy; a ``.npy`` is written to a
``.partial`` file renamed into place. The source is read through
:class:`~slem_dask.storage.nodes.readers.VersionStore`: a version pruned while it is copied
fails the export, never leaves zeros in it.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid

import numpy as np

from ..versioning.ownership import ATTR, check_may_replace, remove
from ..backends.paths import _read_json, canonical, check_outside_inputs, exists
from .readers import MARKER, VersionStore
from ..versioning.rootmarker import EXPORT_ATTR

__all__ = ["export"]

#: Written first into a zarr export, removed last: an unfinished export of slem-dask's.
PARTIAL_MARKER = ".slem-dask-export-unfinished"
_CONCURRENT_COPIES = 4


def export(path, to, version: int | None = None, overwrite: bool = False) -> dict:
    """Copy version ``version`` (None: the current one) of the slem-dask store at
    ``path`` to ``to``: a plain zarr v3 node, or a ``.npy`` file if ``to`` ends with
    ``.npy`` (outputs only). Returns what was exported (version, kind, shape, dtype)."""
    target = canonical(to)
    if not str(target).rstrip("/").endswith((".zarr", ".npy")):
        raise ValueError(
            f"--to {str(to)!r} ends neither in .zarr nor in .npy; give OUT.zarr "
            f"(a plain zarr copy) or OUT.npy (an output's rows)"
        )
    source = VersionStore(path, version, group=False)
    check_outside_inputs(target, "--to", {"store": source.path})
    import zarr

    node = zarr.open(store=source, mode="r", zarr_format=3)
    facts = {
        "path": source.path,
        "version": source.version,
        "folder": source.folder,
        "kind": source.kind,
        "member": source.member,  # a corpus' array (corpus.zarr/negatives), or None
        "to": str(target),
    }
    if isinstance(node, zarr.Array):
        facts.update(shape=tuple(node.shape), dtype=str(node.dtype))
    if str(to).endswith(".npy"):
        _to_npy(node, source, target)
    else:  # an array as the member of a group (xarray opens groups only), as VersionStore shows it
        _to_zarr(VersionStore(path, source.version), target, overwrite, facts)
    return facts


# -- .npy ------------------------------------------------------------------------------------
def _to_npy(node, source, target) -> None:
    import zarr

    if not isinstance(node, zarr.Array):
        raise ValueError(
            f"--to {str(target)!r}: {source.path!r} holds a {source.kind} (a "
            f"zarr group), not an array; export it as zarr: --to OUT.zarr"
        )
    if not target.is_local:
        raise ValueError(
            f"--to {str(target)!r}: a .npy file is written on a local file "
            f"system only; give a local path, or export as zarr (--to OUT.zarr)"
        )
    if exists(target):
        raise FileExistsError(
            f"--to {str(target)!r} exists; slem-dask cannot tell who wrote a .npy file and "
            f"never replaces one: choose another path, or remove it yourself"
        )
    os.makedirs(os.path.dirname(target.location), exist_ok=True)  # as a zarr export does
    tmp = f"{target.location}.{uuid.uuid4().hex[:8]}.partial"
    try:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=node.dtype, shape=node.shape)
        rows = int(node.chunks[0]) if node.ndim else 1
        for lo in range(0, node.shape[0] if node.ndim else 0, rows):  # a chunk at a time
            out[lo : lo + rows] = node[lo : lo + rows]
        if not node.ndim:
            out[...] = node[...]
        out.flush()
        del out
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target.location)  # whole, or not there
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# -- zarr ------------------------------------------------------------------------------------
def _to_zarr(source, target, overwrite: bool, facts: dict) -> None:
    from zarr.core.sync import sync

    from ..versioning.versions import VersionedStore

    # a plain copy, no version: its transaction holds the lease alone (two exports to
    # one path: one at a time)
    with VersionedStore(target).transaction("slem-dask export"):
        _clear_target(target, overwrite, source.kind)
        sync(_copy(source, target, facts))


def _clear_target(target, overwrite: bool, kind: str) -> None:
    """Make room at ``target``: nothing there, an unfinished export of slem-dask's
    (removed), or with ``overwrite`` a finished one of the same kind (removed)."""
    if not exists(target):
        return
    if _own_unfinished(target) and not exists(target.child("zarr.json")):
        _remove_unfinished(target)
        return
    check_may_replace(target, "--to", "--overwrite", kind)  # never what slem-dask did not write
    if not overwrite:
        raise FileExistsError(
            f"--to {str(target)!r} already exists; pass --overwrite to "
            f"replace it, or choose another path"
        )
    remove(target)


def _own_unfinished(target) -> bool:
    """Whether ``target`` holds the marker of an unfinished export to ``target``, by its
    content (the facts an export writes into it, naming this very path), never by its
    name alone: a file of that name that a user made, or copied from elsewhere, proves
    nothing, and the folder is then someone else's (:func:`check_may_replace`)."""
    facts = _read_json(target, PARTIAL_MARKER)
    return (
        isinstance(facts, dict)
        and facts.get("to") == str(target)
        and {"path", "version", "folder", "kind"} <= set(facts)
    )


def _remove_unfinished(target) -> None:
    from ..backends.registry import backend_for

    backend_for(target.url).remove_tree("")


async def _copy(source, target, facts: dict) -> None:
    """Every key of ``source`` to ``target``, metadata documents after the chunks and the
    root ``zarr.json`` last."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage._common import make_store_path

    dst = await make_store_path(target.location, mode="w")
    proto = default_buffer_prototype()
    await (dst / PARTIAL_MARKER).set(proto.buffer.from_bytes(json.dumps(facts).encode()))
    keys = [key async for key in source.list() if not key.endswith((".partial", ".tmp"))]
    documents = sorted(
        (k for k in keys if k.rsplit("/", 1)[-1] == "zarr.json"), key=lambda k: -k.count("/")
    )  # members before the root
    chunks = [k for k in keys if k not in documents]
    limit = asyncio.Semaphore(_CONCURRENT_COPIES)

    async def copy(key: str) -> None:
        async with limit:
            value = await source.get(key, proto)
            if key == "zarr.json":
                value = proto.buffer.from_bytes(_with_provenance(value.to_bytes(), facts))
            await (dst / key).set(value)

    await asyncio.gather(*(copy(k) for k in chunks))
    for key in documents:
        await copy(key)
    await (dst / PARTIAL_MARKER).delete()


def _with_provenance(data: bytes, facts: dict) -> bytes:
    """The root document, with where the copy came from (the stored metadata kept as it
    is: an exported model or output is read by slem-dask like one it wrote). The root
    group of an exported array (an output's ``encodings``) is marked as slem-dask's of
    that kind, naming the array; its members' documents are inline (consolidated), as
    VersionStore serves them, so xarray opens the copy by its path without a warning."""
    doc = json.loads(data)
    attrs = doc.setdefault("attributes", {})
    attrs.pop(MARKER, None)  # the versioned store's: the export's own says where from
    if ATTR not in attrs:  # a group VersionStore made around an array
        members = sorted((doc.get("consolidated_metadata") or {}).get("metadata") or {})
        attrs[ATTR] = {"kind": facts["kind"], "array": members[0] if members else None}
    attrs[EXPORT_ATTR] = {
        "store": facts["path"],
        "version": facts["version"],
        "folder": facts["folder"],
        "kind": facts["kind"],
    }
    return json.dumps(doc, indent=2).encode()
