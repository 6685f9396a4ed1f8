"""Canonical store paths: one store, one name (``./x``, ``x/``, ``a/../x``, a symlink to
it and ``/abs/x`` are the same store), and the rule that nothing is written where it
would replace or nest in an input."""

from __future__ import annotations

import json
import os
import posixpath
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class StorePath:
    """A canonical store address. ``url`` has a protocol (``file:///abs/x.zarr``,
    ``s3://bucket/x.zarr``); ``location`` is what zarr opens; ``key`` what is compared."""

    url: str

    @property
    def is_local(self) -> bool:
        return self.url.startswith("file://")

    @property
    def location(self) -> str:
        return self.url[len("file://") :] if self.is_local else self.url

    @property
    def key(self) -> str:
        return self.location if self.is_local else self.url  # local: already resolved

    @property
    def parent(self) -> StorePath:
        if self.is_local:
            return StorePath("file://" + os.path.dirname(self.location.rstrip("/") or "/"))
        protocol, rest = self.url.split("://", 1)
        rest = rest.rstrip("/")
        return StorePath(f"{protocol}://{rest.rsplit('/', 1)[0] if '/' in rest else ''}")

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def child(self, name: str) -> StorePath:
        if self.url.endswith("://"):  # the root of a remote file system
            return StorePath(self.url + name)
        return StorePath(self.url.rstrip("/") + "/" + name)

    def __str__(self) -> str:  # what messages show: a plain path for local stores
        return self.location


def canonical(path) -> StorePath:
    """The canonical form of a local path or fsspec URL (``./x``, ``x/``, ``a/../x``,
    ``file://x``, a symlink to it and the absolute path all give the same: local paths
    are resolved, so that one store has one lease and one record)."""
    if isinstance(path, StorePath):
        return path
    text = os.fspath(path) if not isinstance(path, str) else path
    if not text:
        raise ValueError("a store path is empty; give a local path or an fsspec URL")
    if text.startswith("file://"):
        from urllib.parse import unquote

        text = unquote(text[len("file://") :])
    if "://" not in text:
        return StorePath("file://" + os.path.realpath(os.path.expanduser(text)))
    protocol, rest = text.split("://", 1)
    rest = posixpath.normpath(rest).lstrip("/") if rest.strip("/") else ""
    protocol = _ALIASES.get(protocol.lower(), protocol.lower())
    return StorePath(f"{protocol}://{rest}")


# one name for one store: the schemes of one file system that address the same objects
_ALIASES = {"gcs": "gs", "abfs": "az", "abfss": "az"}


def shown_path(url) -> str | None:
    """A store URL recorded in metadata (or None) as messages show store paths: a plain
    path for a local store."""
    return str(canonical(url)) if url else None


def _relation(target: StorePath, source: StorePath) -> str | None:
    t, s = target.key.rstrip("/"), source.key.rstrip("/")
    if t == s:
        return "is"
    if s.startswith(t + "/"):
        return "contains"
    if t.startswith(s + "/"):
        return "is inside"
    return None


def _suggestion(target: StorePath, inputs: list[StorePath]) -> str:
    """A path near the target, outside every input and containing none."""
    base = target
    while any(_relation(base, s) == "is inside" for s in inputs):
        base = base.parent  # climb out of the input it sits in
    if any(_relation(base, s) == "contains" for s in inputs):
        parent, stem = base, "slem-output"  # a new store inside the folder given
    else:  # base is an input itself: a sibling of it
        parent = base.parent
        stem = base.name[:-5] + "-slem" if base.name.endswith(".zarr") else base.name + "-slem"
    for i in range(100):
        candidate = parent.child(f"{stem}{'' if i == 0 else i}.zarr")
        if all(_relation(candidate, s) is None for s in inputs):
            return str(candidate)
    return str(parent.child(f"slem-output-{uuid.uuid4().hex[:8]}.zarr"))  # pragma: no cover


def check_outside_inputs(
    target,
    flag: str,
    inputs: dict[str, object],
    outputs: dict[str, object] | None = None,
    folders: tuple[str, ...] = (),
) -> None:
    """Refuse a store to be written that is, contains or sits inside an input
    (replacing it, with --overwrite, would destroy the input) or another output.
    An input may be a list of paths (the files a glob matched); ``folders`` names the
    inputs that are folders of files read by name (a target inside one adds to it)."""
    t = canonical(target)
    sources = [(name, canonical(p)) for name, ps in inputs.items() for p in _listed(ps)]
    others = [(name, canonical(p)) for name, ps in (outputs or {}).items() for p in _listed(ps)]
    everything = [s for _, s in sources + others]
    for k, (name, s) in enumerate(sources + others):
        relation = _relation(t, s)
        if relation:
            why = (
                "two steps cannot write one store"
                if k >= len(sources)
                else "writing it would add files to that input"
                if relation == "is inside" and name in folders
                else "writing it would destroy the input"
            )
            raise ValueError(
                f"{flag} {str(t)!r} {relation} the {name} {str(s)!r}; {why}: choose a path "
                f"outside every input and output, e.g. {_suggestion(t, everything)}"
            )


def _listed(paths) -> list:
    return [p for p in (paths if isinstance(paths, (list, tuple)) else [paths]) if p is not None]


def _fs(path: StorePath):
    import fsspec

    return fsspec.core.url_to_fs(path.url)


def exists(path: StorePath) -> bool:
    if path.is_local:
        return os.path.lexists(path.location)
    fs, root = _fs(path)
    return fs.exists(root)


def _read_json(path: StorePath, name: str) -> dict | None:
    try:
        if path.is_local:
            with open(os.path.join(path.location, name), "rb") as f:
                return json.loads(f.read())
        fs, root = _fs(path)
        with fs.open(f"{root}/{name}", "rb") as f:
            return json.loads(f.read())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def _children(path: StorePath) -> list[str]:
    try:
        if path.is_local:
            return sorted(os.listdir(path.location))
        fs, root = _fs(path)
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    except OSError:
        return []


#: s3fs options of the zarr stores slem-dask opens on S3. With ``max_concurrency`` > 1
#: (s3fs's default: 10) every plain read of an object (a zarr.json, a model's chunk)
#: costs a HEAD for its size before the GET, to split objects over 50 MB into parallel
#: ranges; slem-dask's chunks are read from byte 0 on in one request anyway
#: (chunks._remote_chunk_bytes), so the HEAD buys nothing and costs a round trip.
ZARR_S3_OPTIONS = {"max_concurrency": 1}


def zarr_store(location, mode: str = "r"):
    """What to give zarr to open ``location`` in ``mode``: the location itself, or on S3
    a store whose reads are one GET each (:data:`ZARR_S3_OPTIONS`). Its client reads the
    environment as zarr's own would."""
    if not (isinstance(location, str) and location.startswith(("s3://", "s3a://"))):
        return location
    from zarr.storage import FsspecStore

    return FsspecStore.from_url(
        location, storage_options=dict(ZARR_S3_OPTIONS), read_only=mode == "r"
    )
