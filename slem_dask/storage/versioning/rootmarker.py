"""The root marker of a versioned store: ``P/zarr.json``, written after every commit, a
document that zarr cannot parse and whose text names the calls that read ``P``, so that
``zarr.open(P)`` writes nothing into a store and tells its user what to call. Below
:mod:`.versions` (which calls :func:`mark_after_commit`) and :mod:`.readers`; it needs
only the store's backend."""

from __future__ import annotations

import json

__all__ = ["MARKER", "root_document", "is_root_marker", "mark_store_root", "mark_after_commit"]

#: Key of the root marker's own document (what slem-dask recognizes as its marker).
MARKER = "slem_dask_versioned_store"
#: The root attribute of a plain copy that ``slem-dask export`` wrote: where it came from
#: (:mod:`.export` writes it; :mod:`.xarrays` opens such a copy by path).
EXPORT_ATTR = "slem_dask_export"

_HOW = (
    "this folder is a slem-dask versioned store, not a zarr node: read its current "
    "version with slem_dask.open_zarr(PATH), zarr.open(slem_dask.storage.VersionStore("
    "PATH)) or xarray.open_zarr(slem_dask.storage.VersionStore(PATH)), or copy it out "
    "as plain zarr with `slem-dask export PATH --to OUT.zarr`"
)


def root_document(kind: str) -> bytes:
    """``P/zarr.json`` of a versioned store holding ``kind``. zarr reads ``node_type``
    before ``zarr_format``: "array" for outputs (``zarr.open_array`` and
    ``dask.array.from_zarr`` then show the sentence), "group" for the rest. (No
    ``.zgroup`` for zarr 2's API: zarr 3 warns about every group that has both.)"""
    doc = {
        "zarr_format": _HOW,
        "node_type": "array" if kind == "encoding" else "group",
        "attributes": {
            MARKER: {
                "kind": kind,
                "read_with": "slem_dask.open_zarr(PATH)",
                "versions": "slem-dask versions PATH",
                "export": "slem-dask export PATH --to OUT.zarr",
            }
        },
    }
    return json.dumps(doc, indent=1).encode()


def is_root_marker(data: bytes | dict | None) -> bool:
    """Whether ``data`` (a document, or its parsed JSON) is a root marker written by
    slem-dask (any release's wording)."""
    doc = data if isinstance(data, dict) else _json(data)
    return isinstance(doc, dict) and "slem-dask versioned store" in str(doc.get("zarr_format"))


def _replaceable(data: bytes | None) -> bool:
    """A root document slem-dask may replace: its own marker, or the empty group that
    ``zarr.open(P)`` wrote before there was a marker (no attributes: nothing is lost)."""
    doc = _json(data)
    if not isinstance(doc, dict):
        return False
    if is_root_marker(doc):
        return True
    empty = {"zarr_format", "node_type", "attributes", "consolidated_metadata"}
    return (
        set(doc) <= empty
        and doc.get("zarr_format") in (2, 3)
        and doc.get("node_type", "group") == "group"
        and not doc.get("attributes")
        and not doc.get("consolidated_metadata")
    )


def _json(data: bytes | None):
    try:
        return json.loads(data) if data is not None else None
    except (ValueError, UnicodeDecodeError):
        return None


def mark_store_root(store, kind: str) -> None:
    """Write the root marker of ``store`` unless it is there (one read when it is). It
    is created only if absent (atomic); a failed create is read back: equal bytes are
    done (a retried create whose first reply was lost), a replaceable document is
    replaced whole, anything else is left as it is. No clock, no comparison of times."""
    data = root_document(kind)
    current = store.backend.read("zarr.json")
    if current == data or current is not None and not _replaceable(current):
        return
    if current is None and store.backend.create("zarr.json", data):
        return
    existing = store.backend.read("zarr.json")
    if existing != data and _replaceable(existing):
        store.backend.put("zarr.json", data)


def mark_after_commit(store, kind: str) -> None:
    """:func:`mark_store_root`, called by every commit. The commit stands whatever
    happens here: a marker not written (storage failure) is written by the next commit."""
    try:
        mark_store_root(store, kind)
    except Exception:  # noqa: BLE001 - a convenience for plain readers, never a job's failure
        pass
