"""Whose a version folder is (:mod:`.versions`, :mod:`.gc`): the marker
``versions/<folder>.slem-dask`` that a job writes before anything of its draft, naming the
folder *and its store*, trusted by its content alone; and the rule that a versioned
store's own folders are its own.

A user's folder is never taken for a store, nor a folder of one store for another's:

* a marker proves a draft slem-dask's only by what it holds (the document written by
  :func:`marker_document`: the folder's name, its sequence number and its store), never
  by its name: an empty or edited file of that name proves nothing;
* a marker naming another store proves the folder that store's where both reach the very
  same file (a ``versions/`` folder that two stores share through a symbolic link or a
  bind mount): it is skipped, never deleted. A store moved or copied, which has folders
  of its own, keeps its drafts (the old path holds no such file, or another file);
* a store whose ``commits/``, ``versions/`` or ``fates/`` is a symbolic link is refused
  before anything is written or deleted (:func:`check_own_folders`): through a link, its
  garbage collection would delete in a folder that may be another store's. A link to
  the store's whole folder is fine (paths are resolved: one store, one name), as is a
  version folder that is a link: it is never deleted, nor anything through it.
"""

from __future__ import annotations

import json
import os
import socket

from .errors import IntegrityError
from ..backends.paths import canonical
from .records import VERSIONS, draft_seq

__all__ = [
    "MARKER",
    "OWN_FOLDERS",
    "SharedFolderError",
    "marker_document",
    "proves",
    "listed",
    "marked",
    "trusted",
    "is_link",
    "check_own_folders",
]

#: suffix of the marker beside each version folder (``versions/<name>.slem-dask``)
MARKER = ".slem-dask"
#: the folders of a versioned store that its garbage collection deletes in
OWN_FOLDERS = ("commits", VERSIONS, "fates")
_WHAT = "version folder"


class SharedFolderError(IntegrityError):
    """A folder of a versioned store is a symbolic link: it may be another store's."""


def marker_document(store, version: str) -> bytes:
    """The marker of draft ``version`` of ``store``: what proves the folder slem-dask's,
    and whose."""
    return json.dumps(
        {
            "slem_dask": _WHAT,
            "version": version,
            "seq": draft_seq(version),
            "store": store.path.url,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
    ).encode()


def proves(store, version: str) -> bool:
    """Whether the marker beside ``versions/<version>`` of ``store`` is one that
    slem-dask wrote for that folder of this store (see the module docstring). A marker
    of a release before markers named their store is trusted by its other fields."""
    try:
        doc = json.loads(store.backend.read(f"{VERSIONS}/{version}{MARKER}") or b"")
    except (ValueError, UnicodeDecodeError):
        return False
    if not (
        isinstance(doc, dict)
        and doc.get("slem_dask") == _WHAT
        and doc.get("version") == version
        and doc.get("seq") == draft_seq(version)
    ):
        return False
    named = doc.get("store")
    if named is None or named == store.path.url:
        return True
    return isinstance(named, str) and not _shared(store, named, version)


def _shared(store, named: str, version: str) -> bool:
    """Whether the store ``named`` reaches ``store``'s marker of ``version`` as the very
    same file (a folder the two share). Object stores share no objects between paths:
    a marker naming another path there was copied or moved with its store."""
    from ..backends.registry import backend_for

    other = canonical(named)
    if other.url.split("://")[0] != store.path.url.split("://")[0]:
        return False  # another kind of storage: nothing shared
    key = f"{VERSIONS}/{version}{MARKER}"
    return store.backend.same_file(key, backend_for(other.url))


def listed(names: list[str]) -> list[str]:
    """The version folders that a listing of ``versions/`` shows, by their folder or
    their marker (valid names only)."""
    found = {n.removesuffix(MARKER) for n in names}
    return sorted(v for v in found if draft_seq(v) is not None)


def marked(names: list[str]) -> list[str]:
    """The version folders that a listing shows with a file named as their marker
    (whose content is yet to be trusted: :func:`trusted`)."""
    return [v for v in listed(names) if v + MARKER in names]


def trusted(store, names: list[str], seq: int | None = None) -> list[str]:
    """The version folders (of sequence ``seq``, or all) that slem-dask began in
    ``store``, proved by their marker's content; one read per marker of that seq."""
    return [
        v
        for v in marked(names)
        if (seq is None or draft_seq(v) == seq) and not is_link(store, v) and proves(store, v)
    ]


def is_link(store, version: str) -> bool:
    """Whether ``versions/<version>`` is a symbolic link (never deleted, nor anything
    through it: what it leads to is not the store's)."""
    return store.backend.link_target(f"{VERSIONS}/{version}") is not None


def check_own_folders(store) -> None:
    """Refuse a store whose ``commits/``, ``versions/`` or ``fates/`` is a symbolic link,
    before anything is written or deleted in it, in one line naming the link and the
    fix. (Object stores have no links; their paths share nothing.)"""
    for name in OWN_FOLDERS:
        target = store.backend.link_target(name)
        if target is not None:
            raise SharedFolderError(
                f"{str(store.path)!r}: its folder {name!r} is a symbolic link (to "
                f"{target!r}), and a versioned store's {', '.join(OWN_FOLDERS)} must be "
                f"its own: through a link, this store would delete what another store "
                f"sharing that folder wrote. Nothing was written: replace the link by a "
                f"folder of this store's own (a copy of what it leads to), or link the "
                f"store's whole folder instead (a link to a store is fine)"
            )
