"""Reading a versioned store with the tools of the zarr ecosystem (zarr, xarray, dask).

A versioned store ``P`` (:mod:`.versions`) is not itself a zarr node: its current version
is the folder ``P/versions/<N>-<token>/`` that its newest commit record names. Two things
here make that plain to someone who has never heard of slem-dask:

* :class:`VersionStore`, a read-only zarr store pinned to one committed version, which
  ``zarr.open``, ``xarray.open_zarr`` and ``dask.array.from_zarr`` open directly; a reader
  whose version is pruned under it gets an error that says so, never zeros;
* the *root marker*: ``P/zarr.json``, written at each commit unless it is there, whose
  ``zarr_format`` is a sentence naming the right call. zarr cannot parse it, so
  ``zarr.open(P)`` raises with that sentence instead of creating an empty group in ``P``
  (what it did, in its default mode "a", to a folder without a zarr.json).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.errors import NodeTypeValidationError

if TYPE_CHECKING:
    import xarray
    import zarr

from ..versioning import versions
from .dimensions import DIMENSIONS, dimension_names
from .recorded import NOT_A_CHUNK, CheckedReads, ChunkLookup, _check_byte_range, _ranged
from ..versioning.rootmarker import (  # noqa: F401 - re-exported: where readers of P look
    MARKER,
    _json,
    is_root_marker,
    mark_after_commit,
    mark_store_root,
    root_document,
)

__all__ = [
    "VersionStore",
    "open_zarr",
    "open_dataset",
    "mark_store_root",
    "is_root_marker",
    "ENCODINGS",
    "DIMENSIONS",
]

#: The member under which the group view shows an output's array (xarray needs a group).
ENCODINGS = "encodings"


# -- a zarr store pinned to one version ------------------------------------------------------
def _pinned(path, version: int | None):
    """(versioned store, commit, member, the version's root zarr.json) of ``path`` at
    ``version`` (None: the current one): ``P``, ``P/member`` (a member of a versioned
    group, such as a corpus' ``negatives``) or a listed version folder
    ``P/versions/<N>-<token>``. The version's zarr.json is checked against its commit
    record (the chunks' checksums that it records are then the committed ones)."""
    from ..backends.paths import canonical, exists

    path = canonical(path)
    location, owner, commit = versions.resolve(path)
    if owner is None and not exists(path):
        raise FileNotFoundError(
            f"no store at {str(path)!r}: give the path of a store that "
            f"slem-dask wrote (`slem-dask versions PATH` lists them)"
        )
    if owner is None and versions.VersionedStore(path).has_history():
        raise versions.VersionError(
            f"{str(path)!r} has no committed version yet: the run that writes it stopped "
            f"before its first commit (Ctrl-C, a full disk, a lost worker), and readers "
            f"never see a draft; run the same command again to finish it (it resumes)"
        )
    if owner is None:
        raise versions.VersionError(
            f"{str(path)!r} is not a slem-dask versioned store (it has no commit records); "
            f"open it with zarr itself: zarr.open({str(path)!r}, mode='r')"
        )
    assert commit is not None  # resolve gives a commit with every store
    member = location[len(owner.location(commit.version)) :].strip("/")
    if version is not None:
        commit = owner.commit_at(int(version))
        if commit is None:
            raise versions.VersionError(
                f"{str(owner.path)!r} has no version {version}; list them with "
                f"`slem-dask versions {owner.path}`"
            )
    root = owner.check(commit)  # still there, and the one that was committed
    return owner, commit, member, root


def _with_dimension_names(data: bytes, names) -> bytes:
    """An array's zarr.json with ``dimension_names`` (``names(ndim)``) where it has none,
    so that xarray labels it; anything else unchanged."""
    doc = _json(data)
    if (
        not isinstance(doc, dict)
        or doc.get("node_type") != "array"
        or doc.get("dimension_names")
        or not isinstance(doc.get("shape"), list)
    ):
        return data
    doc["dimension_names"] = list(names(len(doc["shape"])))
    return json.dumps(doc, indent=2).encode()


_ELSEWHERE = "<not in this view>"  # what the group view's keys outside it map to
_V2_DOCUMENTS = (".zarray", ".zattrs", ".zgroup", ".zmetadata")


class VersionStore(CheckedReads, Store):
    """A read-only zarr store holding one committed version of the slem-dask store at
    ``path`` (``version``: its number, see ``slem-dask versions P``; None: the current
    one, resolved once, here). Give it to ``zarr.open``, ``xarray.open_zarr`` or
    ``dask.array.from_zarr``.

    ``group`` (default True): an output (an array) is shown inside a group, as its
    member ``"encodings"`` with dimension names ``("image", "feature")``, which xarray
    needs; ``group=False`` shows the array itself at the root (``zarr.open_array``,
    ``dask.array.from_zarr`` without ``component``). Nothing stored is changed: arrays
    without dimension names are given some in what this store serves.

    A version pruned while it is read (storage keeps the last few) raises
    :class:`~slem_dask.storage.versioning.versions.VersionError` saying so, never zeros; so does
    a store unpickled on a dask worker after the pruning. Every chunk read is checked
    against the crc32c its commit recorded (:mod:`.recorded`): a chunk missing, or ending
    in another checksum, raises :class:`~slem_dask.storage.versioning.errors.MissingChunkError`
    or :class:`~slem_dask.storage.versioning.errors.CorruptChunkError` naming it (one damaged
    inside fails zarr's own crc32c check: its trailer alone is read here, so that each
    chunk's crc32c is computed once); a key that no written chunk could be reads as None,
    like any zarr store's.

    ``read_only``: True only (zarr's ``Store`` argument; versions are written by
    slem-dask's commits, never through a store).
    """

    def __init__(
        self, path, version: int | None = None, *, group: bool = True, read_only: bool = True
    ):
        super().__init__(read_only=True)
        if not read_only:
            raise self._not_writable()
        owner, commit, member, root = _pinned(path, version)
        self._chunks = ChunkLookup(root)
        self.path, self.version, self.folder = str(owner.path), commit.seq, commit.version
        self.kind, self.member, self.group = commit.kind, member, group
        self._location = owner.location(commit.version)
        self._base = f"{member}/" if member else ""  # the node viewed, in the version
        self._name = member.rsplit("/", 1)[-1] if member else ENCODINGS  # in the group view
        self._inner: Store | None = None
        self._bare_array: bool | None = None  # whether the node viewed is an array: on first use

    # pickling (dask workers): the pinned version, not the open store
    def __getstate__(self):
        state = dict(self.__dict__)
        state["_inner"] = None
        return state

    def __eq__(self, other) -> bool:
        return isinstance(other, type(self)) and (self._location, self.member, self.group) == (
            other._location,
            other.member,
            other.group,
        )

    def __hash__(self):
        return hash((self._location, self.member, self.group))

    def __repr__(self) -> str:
        member = f", member={self.member!r}" if self.member else ""
        return f"VersionStore({self.path!r}, version={self.version}{member})"

    def with_read_only(self, read_only: bool = False):
        if not read_only:
            raise self._not_writable()
        return self

    def _not_writable(self) -> NotImplementedError:
        # zarr's own words first: its StoreTests and callers look for them
        return NotImplementedError(
            f"with_read_only is not implemented for the {type(self)} store type. A "
            f"VersionStore is read only: slem-dask writes versions by its own commits "
            f"(`slem-dask export` makes a writable copy)"
        )

    async def set_if_not_exists(self, key, value) -> None:
        self._check_writable()

    async def _store(self):
        """The version folder's own zarr store (read only), opened on first use; a
        folder that is gone (local disk) was pruned."""
        if self._inner is None:
            try:
                self._inner = await _read_only_store(self._location)
            except FileNotFoundError:
                raise self._pruned() from None
        return self._inner

    async def _viewed_document(self) -> bytes:
        value = await (await self._store()).get(
            f"{self._base}zarr.json", prototype=default_buffer_prototype()
        )
        if value is None:
            raise self._pruned()
        return _with_dimension_names(value.to_bytes(), self._names(f"{self._name}/zarr.json"))

    async def _group_view(self) -> bool:
        """Whether this view shows an array inside a group of its own (see the class)."""
        if self._bare_array is None:
            doc = _json(await self._viewed_document()) or {}
            self._bare_array = doc.get("node_type") == "array"
        return self.group and self._bare_array

    async def _key(self, key: str) -> str | None:
        """The version folder's key for ``key`` of this view (None: the view's own
        group document; _ELSEWHERE: nothing)."""
        if await self._group_view():
            if key == "zarr.json":
                return None
            head, _, rest = key.partition("/")
            return self._base + rest if head == self._name and rest else _ELSEWHERE
        return self._base + key

    async def _group_document(self) -> bytes:
        """The view's root group, its member's metadata inline (zarr's consolidated
        metadata: xarray opens it in one read, without a warning)."""
        return json.dumps(
            {
                "zarr_format": 3,
                "node_type": "group",
                "attributes": {
                    MARKER: {
                        "store": self.path,
                        "version": self.version,
                        "folder": self.folder,
                        "kind": self.kind,
                    }
                },
                "consolidated_metadata": {
                    "kind": "inline",
                    "must_understand": False,
                    "metadata": {self._name: _json(await self._viewed_document())},
                },
            }
        ).encode()

    def _names(self, key: str):
        """Dimension names for the array whose document is ``key`` of this view, if
        it has none: an output's ("image", "feature"), else unique ones."""
        if (
            self.kind == "encoding"
            and not self.member
            and key in ("zarr.json", f"{ENCODINGS}/zarr.json")
        ):
            return lambda ndim: DIMENSIONS if ndim == 2 else [f"dim_{i}" for i in range(ndim)]
        name = key[: -len("zarr.json")].strip("/") or self._name
        return lambda ndim: dimension_names(name, ndim)  # by meaning (storage.dimensions)

    def _pruned(self) -> versions.VersionError:
        return versions.VersionError(
            f"{self.path!r}: version {self.version} ({self.folder}) was pruned while "
            f"it was read (storage keeps the last {versions.KEEP_VERSIONS} versions, a "
            f"new job's draft included): open the store again for the current version "
            f"(slem_dask.open_zarr({self.path!r})), or pin one that is kept (`slem-dask "
            f"versions {self.path}`)"
        )

    def _prunable(self) -> bool:
        """Whether enough versions were committed after this one for it to be pruned
        (sequence numbers only: no clock)."""
        head = versions.VersionedStore(self.path).head()
        return head is not None and head.seq - self.version >= versions.KEEP_VERSIONS - 1

    async def get(self, key, prototype=None, byte_range=None):
        prototype = prototype or default_buffer_prototype()
        _check_byte_range(byte_range)
        inner_key = await self._key(key)
        if key == ".zarray" and await self._shows_group():
            # zarr.open_array's probe (zarr.open tries it, then opens the group)
            raise NotAnArrayError(await self._open_array_hint())
        if inner_key is _ELSEWHERE or key.rsplit("/", 1)[-1] in _V2_DOCUMENTS:
            return None  # outside the view, or zarr v2's documents: never written
        if inner_key is None:
            data = await self._group_document()
            return prototype.buffer.from_bytes(_ranged(data, byte_range))
        store = await self._store()
        if key.endswith("zarr.json"):  # served with dimension names: ranges of what is served
            value = await store.get(inner_key, prototype)
            if value is None:
                return await self._absent(inner_key, store, NOT_A_CHUNK)
            self._chunks.remember(inner_key, value.to_bytes())
            data = _with_dimension_names(value.to_bytes(), self._names(key))
            if key == "zarr.json":  # a group's members inline: xarray opens it without a warning
                data = await _consolidated(data, store, self._base, self._names)
            return prototype.buffer.from_bytes(_ranged(data, byte_range))
        value = await store.get(inner_key, prototype, byte_range)
        return await self._checked(inner_key, value, byte_range, store)

    async def _shows_group(self) -> bool:
        """Whether this view's root is a group (see the class)."""
        await self._group_view()
        return self.group or not self._bare_array

    async def _open_array_hint(self) -> str:
        names = []
        if not await self._group_view():
            async for name in (await self._store()).list_dir(self._base.strip("/")):
                if name != "zarr.json":
                    names.append(name)
        else:
            names = [self._name]
        example = f"path={names[0]!r}" if names else "path=NAME"
        alternative = ", or VersionStore(..., group=False)" if self._bare_array else ""
        return (
            f"{self!r} shows a zarr group (arrays in it: {', '.join(sorted(names)) or 'none'}),"
            f" not an array: give zarr.open_array the array's name ({example}){alternative}, "
            f"or open the group with zarr.open_group"
        )

    async def get_partial_values(self, prototype, key_ranges):
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    async def exists(self, key: str) -> bool:
        inner_key = await self._key(key)
        if inner_key is _ELSEWHERE:
            return False
        return inner_key is None or await (await self._store()).exists(inner_key)

    @property
    def supports_writes(self) -> bool:
        return False

    @property
    def supports_deletes(self) -> bool:
        return False

    @property
    def supports_listing(self) -> bool:
        return True

    async def set(self, key, value) -> None:
        self._check_writable()

    async def delete(self, key) -> None:
        self._check_writable()

    async def set_partial_values(self, key_start_values) -> None:
        self._check_writable()

    async def list(self):
        async for key in self.list_prefix(""):
            yield key

    async def list_prefix(self, prefix: str):
        async for key in self._list_prefix(prefix):
            yield key
        await self._still_there()  # else the listing may be a pruned version's remains

    async def list_dir(self, prefix: str):
        async for key in self._list_dir(prefix):
            yield key
        await self._still_there()

    async def _still_there(self) -> None:
        if not await (await self._store()).exists("zarr.json"):
            raise self._pruned()

    async def _list_prefix(self, prefix: str):
        store = await self._store()
        if await self._group_view():
            if "zarr.json".startswith(prefix):
                yield "zarr.json"
            async for key in store.list_prefix(self._base):
                key = f"{self._name}/{key[len(self._base) :]}"
                if key.startswith(prefix):
                    yield key
            return
        async for key in store.list_prefix(self._base + prefix):
            yield key[len(self._base) :]

    async def _list_dir(self, prefix: str):
        store = await self._store()
        prefix = prefix.strip("/")
        if await self._group_view():
            head, _, rest = prefix.partition("/")
            if not prefix:
                for key in ("zarr.json", self._name):
                    yield key
            elif head == self._name:
                async for key in store.list_dir(self._base + rest):
                    yield key
            return
        async for key in store.list_dir((self._base + prefix).strip("/")):
            yield key


async def _consolidated(data: bytes, store, base: str, names) -> bytes:
    """A group's ``zarr.json`` with its members' documents inline (zarr's consolidated
    metadata, as the group view of an output has), dimension names included; unchanged
    if it is no group, already has them, or a member's document cannot be read (zarr
    then reads the members one by one, and says what is wrong)."""
    doc = _json(data)
    if not isinstance(doc, dict) or doc.get("node_type") != "group":
        return data
    if doc.get("consolidated_metadata"):
        return data
    members = {}
    prototype = default_buffer_prototype()
    async for key in store.list_prefix(base):
        inner = key[len(base) :]
        if not inner.endswith("/zarr.json"):
            continue
        value = await store.get(key, prototype)
        member = _json(value.to_bytes()) if value is not None else None
        if not isinstance(member, dict):
            return data
        members[inner[: -len("/zarr.json")]] = _json(
            _with_dimension_names(json.dumps(member).encode(), names(inner))
        )
    doc["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": members}
    return json.dumps(doc, indent=2).encode()


async def _read_only_store(location: str) -> Store:
    """A read-only zarr store of a version folder. An object store's listings are not
    cached: a listing or an ``exists`` answered from a listing cached before a pruning
    (fsspec shares its clients, and their caches, between equal arguments) would show
    a version that is gone."""
    if "://" not in location:
        from zarr.storage._common import make_store_path

        return (await make_store_path(location, mode="r")).store
    from zarr.storage import FsspecStore

    from ..backends.paths import ZARR_S3_OPTIONS

    options = dict(ZARR_S3_OPTIONS) if location.startswith(("s3://", "s3a://")) else {}
    options["use_listings_cache"] = False
    return FsspecStore.from_url(location, storage_options=options, read_only=True)


class NotAnArrayError(NodeTypeValidationError):
    """zarr.open_array given a view whose root is a group (its message says what to pass)."""


# -- one-line opens --------------------------------------------------------------------------
def open_zarr(path: str | os.PathLike[str], version: int | None = None) -> zarr.Array | zarr.Group:
    """The zarr node (read only) of one committed version of the slem-dask store at
    ``path`` (None: the current one): an output is a ``zarr.Array``, a model, search
    result or corpus a ``zarr.Group``. Its arrays carry dimension names."""
    import zarr

    return zarr.open(store=VersionStore(path, version, group=False), mode="r", zarr_format=3)


def open_dataset(
    path: str | os.PathLike[str], version: int | None = None, **kwargs: Any
) -> xarray.Dataset:
    """One committed version of the slem-dask store at ``path`` as a lazy (dask-backed)
    ``xarray.Dataset``: an output is its variable ``encodings`` with dimensions
    ``("image", "feature")``, the other arrays are named by their meaning
    (:mod:`slem_dask.storage.nodes.dimensions`). ``path`` may also be a plain copy that
    ``slem-dask export`` wrote (``version`` None). slem-dask's metadata attributes
    (dicts in zarr) are JSON strings here (``json.loads`` reads them), so that the
    Dataset writes to netCDF as it is. ``kwargs`` go to ``xarray.open_zarr``."""
    try:
        import xarray
    except ImportError:
        raise ImportError(
            "open_dataset needs xarray; install it with pip install xarray, "
            "or read the zarr array: slem_dask.open_zarr(path)"
        ) from None
    from .xarrays import dataset_store, json_attributes

    store = dataset_store(path, version, VersionStore)
    kwargs.setdefault("consolidated", False)
    return json_attributes(xarray.open_zarr(store, **kwargs))


def fill_value(dtype):
    """The fill value of the arrays slem-dask writes: what a chunk that is not there (a
    version pruned under a plain zarr reader) reads as, never plausible data: NaN for
    floats, -1 for signed integers (search indices, labels: no row is -1), the largest
    value for unsigned ones; None (zarr's default) for anything else."""
    kind = np.dtype(dtype).kind
    if kind == "f":
        return np.nan
    if kind == "i":
        return -1
    return np.iinfo(np.dtype(dtype)).max if kind == "u" else None
