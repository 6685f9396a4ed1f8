"""What slem-dask wrote, and may therefore replace: stores recognized by their marker
(a versioned store's commit records, or the ``slem_dask`` attribute of a store written
by slem-dask 0.2); nothing else is ever deleted."""

from __future__ import annotations

import os


from .errors import DamagedMetadataError
from .rootmarker import is_root_marker
from ..backends.paths import StorePath, _children, _fs, _read_json, canonical, exists


#: Attribute that marks what slem-dask wrote (kind: model, encoding, search).
ATTR = "slem_dask"


KINDS = ("model", "encoding", "search", "corpus")
#: How messages name a store of each of :data:`KINDS`.
KIND_NAMES = {
    "model": "a model",
    "encoding": "an encoded output",
    "search": "a search result",
    "corpus": "a corpus",
}


def slem_dask_kind(path: StorePath) -> str | None:
    """'model', 'encoding', 'search' or 'corpus' if slem-dask wrote the store at
    ``path`` (its head version's kind for a versioned store), 'draft' for a versioned
    store with no committed version yet (left by a killed first write)."""
    from .versions import VersionedStore, VersionError

    store = VersionedStore(path)
    if store.has_history():
        try:
            head = store.head()
        except VersionError:
            return "draft"  # its history is damaged: still slem-dask's to replace
        return head.kind if head else "draft"
    doc = _read_json(path, "zarr.json")
    if not isinstance(doc, dict):
        return None
    meta = (doc.get("attributes") or {}).get(ATTR)
    return meta.get("kind") if isinstance(meta, dict) and meta.get("kind") in KINDS else None


def unreadable_marker(path: StorePath) -> bool:
    """Whether ``path`` has a zarr.json that is not a JSON document: whether
    slem-dask wrote the store cannot be told (see :func:`slem_dask_kind`)."""
    return not isinstance(_read_json(path, "zarr.json"), dict) and exists(path.child("zarr.json"))


def _is_empty_dir(path: StorePath) -> bool:
    if path.is_local:
        return os.path.isdir(path.location) and not os.listdir(path.location)
    fs, root = _fs(path)
    return fs.isdir(root) and not fs.ls(root)


def check_may_replace(path, what: str, flag: str = "--overwrite", kind: str | None = None) -> None:
    """Refuse to delete anything at ``path`` that slem-dask did not write, or (``kind``)
    a slem-dask store of another kind (an output never replaces a model, say)."""
    path = canonical(path)
    if not exists(path) or _is_empty_dir(path):
        return
    found = slem_dask_kind(path)
    if found == "draft":
        return
    if found is not None and kind is not None and found != kind:
        raise FileExistsError(
            f"{what} {str(path)!r} holds {KIND_NAMES[found]} of slem-dask, not "
            f"{KIND_NAMES[kind]}; {flag} replaces only a store of the same kind: choose another "
            f"path, or delete it yourself if it is really unwanted"
        )
    if found is not None:
        return
    if unreadable_marker(path):
        whose = (
            "slem-dask cannot tell who wrote it: its metadata document zarr.json "
            "cannot be read (damaged, or not zarr v3)"
        )
    else:
        whose = f"was not written by slem-dask (it has no '{ATTR}' marker)"
    raise FileExistsError(
        f"{what} {str(path)!r} exists and {whose}; slem-dask never deletes what it did not "
        f"write, even with {flag}: choose another path, or remove it yourself if it is "
        f"really unwanted"
    )


def remove(path) -> None:
    """Delete a store that :func:`check_may_replace` allowed (checked again here)."""
    path = canonical(path)
    check_may_replace(path, "store")
    if not exists(path):
        return
    if path.is_local:
        import shutil

        if os.path.isdir(path.location) and not os.path.islink(path.location):
            shutil.rmtree(path.location)
        else:
            os.remove(path.location)
    else:  # pragma: no cover - needs a remote store
        fs, root = _fs(path)
        fs.rm(root, recursive=True)


def unreadable_document(path: StorePath) -> str | None:
    """The first metadata document under ``path`` (its own zarr.json, then its
    members') that zarr cannot open, e.g. "precision/zarr.json"; None if all open."""
    import zarr

    for name in ["", *_children(path)]:
        node = path.child(name) if name else path
        if not exists(node.child("zarr.json")):
            continue
        if not name and is_root_marker(_read_json(node, "zarr.json")):
            continue  # a versioned store's root marker: unreadable to zarr on purpose
        try:
            zarr.open(store=node.location, mode="r")
        except Exception:  # noqa: BLE001 - any failure to parse is the answer
            return f"{name}/zarr.json" if name else "zarr.json"
    return None


def damaged_metadata(what: str, path, exc: BaseException) -> DamagedMetadataError | None:
    """The error for a store whose metadata document is there but cannot be read
    (truncated, edited, not zarr v3), naming the document; None when ``path`` has
    no unreadable document (then the failure is something else: no store, say)."""
    from .versions import resolve

    path = canonical(path)
    try:
        where = canonical(resolve(path)[0])  # a versioned store: the version read
    except Exception:  # noqa: BLE001 - its history is damaged too: look at the path itself
        where = path
    document = unreadable_document(where)
    if document is None:
        return None
    return DamagedMetadataError(
        f"{what}: the metadata document {document!r} of {str(path)!r} cannot be read "
        f"({type(exc).__name__}: {exc}); the store is damaged or was not written as "
        f"zarr v3: restore it from a copy, or write it again"
    )
