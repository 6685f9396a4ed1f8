"""Finding the head of a versioned store (:mod:`.versions`) in a few requests, whatever
the length of its history.

Commit records are ``commits/<seq:08d>.json``, each created create-only at one more
than the head its job found, and never deleted: the committed numbers form one
unbroken run ``1 .. head``. The head is the last record of that run. Listing
``commits/`` whole finds it too, but costs a request per 1,000 records and moves every
name: a cost that grows with the history, paid by every fresh process (every command,
every worker).

So the committer leaves a *hint*, ``commits/.head`` (a plain overwrite after each
commit, outside the records' name pattern: never read as a record), holding the number
it committed. The hint is only a starting point, never trusted as the head: a slow
committer may overwrite it with an older number, a crash may skip it, a user may damage
it. A reader starts from the hint (or from the head this process last saw) and looks
forward:

* where the storage lists from a name on (S3's ``StartAfter``:
  :attr:`~.backend.Backend.lists_from_a_name`), one listing from the hint's record: the last
  name listed is the head, gaps or not;
* elsewhere (local disk, GCS, Azure, fsspec), by reading records: hint+1, +2, +4 ...
  until one is absent, then halving the interval between the last found and the first
  absent; as many reads as twice the log2 of the records committed since the hint (two
  when it is up to date).

A hint whose record is absent (a missing or unreadable hint, a store deleted and
written again with a shorter history) falls back to the whole listing, as a store
written before hints existed does: a wrong hint costs requests, never a wrong head.
"""

from __future__ import annotations

import json

from ..backends.backend import Backend

__all__ = [
    "COMMITS",
    "HINT",
    "commit_name",
    "commit_names",
    "last_commit_name",
    "write_hint",
    "read_hint",
]

COMMITS = "commits"
#: the head hint's key: under commits/ (with the history it speeds up, deleted with it),
#: sorting before every record and matching no record's name
HINT = f"{COMMITS}/.head"

#: The newest commit's sequence number this process saw, per store (0: none): where the
#: next search starts without reading the hint (:func:`last_commit_name`).
_HEAD_SEEN: dict = {}


def commit_name(seq: int) -> str:
    return f"{seq:08d}.json"


def commit_names(backend: Backend, after: str | None = None) -> list[str]:
    """The commit records' names under ``commits/`` (all, or those after ``after``)."""
    names = backend.list(COMMITS) if after is None else backend.list_after(COMMITS, after)
    return [n for n in names if _is_record(n)]


def _is_record(name: str) -> bool:
    return name.endswith(".json") and name[:-5].isdigit()


def last_commit_name(backend: Backend, key) -> tuple[str | None, list[str] | None]:
    """The newest commit record's name (None if the store has none), and the whole
    listing of ``commits/`` when one was needed (None when the search from the hint
    found the head). ``key`` names the store in this process's memory of heads seen."""
    seen = _HEAD_SEEN.get(key)
    start = read_hint(backend) if seen is None else seen
    name = _forward(backend, start) if start else None
    listing = None
    if name is None:  # no hint, or a hint past the head: what is there says
        listing = backend.list(COMMITS)
        names = [n for n in listing if _is_record(n)]
        name = names[-1] if names else None
    # 0: no record then; the next look lists (one short request for the input stores
    # and new paths that most such looks are) without asking for a hint again
    _HEAD_SEEN[key] = int(name[:-5]) if name else 0
    return name, listing


def read_hint(backend: Backend) -> int | None:
    """The number the hint holds, or None (absent, or not a hint slem-dask wrote)."""
    data = backend.read(HINT)
    try:
        seq = json.loads(data)["head"] if data is not None else None
    except (ValueError, TypeError, KeyError):
        return None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else None


def write_hint(backend: Backend, seq: int) -> None:
    """Leave ``seq`` (just committed) as the hint. Best effort: a hint that is not
    written, or is overwritten later by an older number, only costs requests."""
    try:
        backend.put(
            HINT,
            json.dumps(
                {"head": seq, "slem_dask": "head hint, a lower bound of the last commit record"}
            ).encode(),
        )
    except Exception:  # noqa: BLE001 - the commit stands, and its job must say so
        pass


def _forward(backend: Backend, start: int) -> str | None:
    """The last record at or after ``start``; None when record ``start`` is absent
    (then where the head is cannot be told from here)."""
    if getattr(backend, "lists_from_a_name", False):  # one short listing
        names = commit_names(backend, after=commit_name(start - 1))
        return names[-1] if names else None
    if not _present(backend, start):
        return None
    found, step = start, 1  # found: present; found + step: to look at
    while _present(backend, found + step):
        found, step = found + step, step * 2
    absent = found + step
    while absent - found > 1:  # the run is unbroken: halve [found, absent)
        middle = (found + absent) // 2
        if _present(backend, middle):
            found = middle
        else:
            absent = middle
    return commit_name(found)


def _present(backend: Backend, seq: int) -> bool:
    # a read, not exists(): a record is small, and a missing key is one request
    # everywhere (S3's exists() lists after a 404)
    return backend.read(f"{COMMITS}/{commit_name(seq)}") is not None
