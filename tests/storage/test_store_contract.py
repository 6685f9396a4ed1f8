"""zarr-python's own store contract (``zarr.testing.store.StoreTests``, issue 40 item 1)
run against VersionStore on every view (a group, an output shown as a group, an output as
its array, a pinned older version, a member of a group) and backend (local disk; S3 with
--slow, as CI runs): every test that applies to a read-only store passes; those that do
not are skipped here saying why, and the read-only halves of some are run instead.

StoreTests' ``set`` / ``get`` helpers must bypass the store: they write into the
version folder itself (tampering with a committed version, as only a test may)."""

import json
import pickle
import re
import shutil
import uuid

import fsspec
import numpy as np
import pytest
import zarr
from zarr.abc.store import RangeByteRequest
from zarr.core.buffer import cpu, default_buffer_prototype
from zarr.testing.store import StoreTests

import slem_dask
from slem_dask import LinearSLEM
from slem_dask.storage import VersionStore, write_group
from slem_dask.storage.nodes import readers
from slem_dask.storage.nodes.recorded import NOT_A_CHUNK

from conftest import use_server
from helpers import encode_corpus, small_corpus

#: view -> (store in the template, VersionStore's keywords beside its path)
VIEWS = {
    "group": ("model.zarr", {}),
    "output-group": ("codes.zarr", {}),
    "array": ("codes.zarr", {"group": False}),
    "pinned": ("model.zarr", {"version": 1}),
    "member": ("corpus.zarr/negatives", {"group": False}),
}

NEVER_EMPTY = "a committed version is never empty (its zarr.json at least): the test starts empty"
WRITES = "it writes through the store: a VersionStore is read only (versions are committed)"


def _template(folder) -> None:
    """The stores the views show: a model of 2 versions, an output, a corpus group."""
    corpus = small_corpus(folder, seed=3)
    LinearSLEM(lam=0.3).fit(corpus["neg"][:100]).save(corpus["model"], overwrite=True)
    encode_corpus(corpus, f"{folder}/codes.zarr")
    write_group(
        f"{folder}/corpus.zarr",
        {"kind": "corpus"},
        {"negatives": corpus["neg"], "labels": np.arange(len(corpus["neg"]))},
        "corpus",
    )


@pytest.fixture(scope="module")
def local_template(tmp_path_factory):
    folder = tmp_path_factory.mktemp("contract")
    _template(folder)
    return str(folder)


@pytest.fixture(scope="module")
def s3_template(seaweedfs_server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("contract-s3")
    _template(folder)
    url = f"s3://{seaweedfs_server.bucket}/contract-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as patch:
        use_server(seaweedfs_server, patch)
        fs = fsspec.filesystem("s3")
        for name in ("model.zarr", "codes.zarr", "corpus.zarr"):
            fs.put(f"{folder}/{name}", f"{url}/{name}", recursive=True)
    return url


class _VersionStoreContract(StoreTests[VersionStore, cpu.Buffer]):
    store_cls = VersionStore
    buffer_cls = cpu.Buffer
    view = "group"
    backend = "local"

    @pytest.fixture(scope="class")
    @classmethod
    def copied(cls, request, tmp_path_factory):
        """A copy of the template's stores for this class (its tests tamper with it, and
        :meth:`undo` puts back what each wrote)."""
        name = VIEWS[cls.view][0].split("/")[0]
        if cls.backend == "local":
            root = tmp_path_factory.mktemp(cls.view)
            shutil.copytree(f"{request.getfixturevalue('local_template')}/{name}", root / name)
            return str(root)
        template = request.getfixturevalue("s3_template")
        root = f"{template}/copy-{uuid.uuid4().hex[:8]}"
        with pytest.MonkeyPatch.context() as patch:
            use_server(request.getfixturevalue("seaweedfs_server"), patch)
            fsspec.filesystem("s3").copy(f"{template}/{name}", f"{root}/{name}", recursive=True)
        return root

    @pytest.fixture
    def store_kwargs(self, copied, undo):
        name, kwargs = VIEWS[self.view]
        return {"path": f"{copied}/{name}", **kwargs}

    @pytest.fixture
    async def undo(self, request):
        """After each test, every key its ``set`` wrote gets its bytes back (or goes)."""
        if self.backend == "s3":  # its variables, for this test and until this undo ends
            request.getfixturevalue("s3_server")
        self._written: dict = {}
        yield
        for (location, key), before in self._written.items():
            folder = self._folder_store(location)
            if before is None:
                await folder.delete(key)
            else:
                await folder.set(key, before)

    async def _version_key(self, store: VersionStore, key: str) -> str:
        inner = await store._key(key)
        if inner is None or inner is readers._ELSEWHERE:
            pytest.skip(
                f"key {key!r} is not in this view: an output shown as a group holds only "
                f"its zarr.json and the array under {readers.ENCODINGS}/"
            )
        if await store._chunks.expected(inner, store._document) != NOT_A_CHUNK:
            pytest.skip(
                f"key {key!r} is a chunk that this version's commit recorded: a "
                f"VersionStore refuses any other bytes there (test_reader_integrity.py)"
            )
        return inner

    @staticmethod
    def _folder_store(location: str):
        """A version folder's own store, writable (what StoreTests' helpers bypass to): a
        client of its own, as the helpers run in zarr's event loop or in the test's."""
        if "://" not in location:
            return zarr.storage.LocalStore(location)
        options = {"skip_instance_cache": True, "use_listings_cache": False}
        return zarr.storage.FsspecStore.from_url(location, storage_options=options)

    async def set(self, store, key, value) -> None:
        inner = await self._version_key(store, key)
        folder = self._folder_store(store._location)
        if (store._location, inner) not in self._written:
            before = await folder.get(inner, default_buffer_prototype())
            self._written[(store._location, inner)] = before
        try:
            await folder.set(inner, value)
        except (IsADirectoryError, NotADirectoryError):
            pytest.skip(
                f"key {key!r} is a folder of this version's chunks on local disk (or "
                f"inside a chunk's file): a file system cannot hold both"
            )

    async def get(self, store, key):
        inner = await self._version_key(store, key)
        return await self._folder_store(store._location).get(inner, default_buffer_prototype())

    def test_store_repr(self, store) -> None:
        assert repr(store).startswith(f"VersionStore({store.path!r}, version=")

    def test_store_supports_writes(self, store) -> None:
        assert not store.supports_writes

    def test_store_supports_listing(self, store) -> None:
        assert store.supports_listing

    # -- the read-only halves of tests that write ---------------------------------------------
    async def test_serializable_store(self, store) -> None:
        """StoreTests' version writes through the store; its read-only half is here."""
        new_store = pickle.loads(pickle.dumps(store))
        assert new_store == store and new_store.read_only == store.read_only
        await self.set(store, "foo", self.buffer_cls.from_bytes(b"\x01\x02\x03\x04"))
        observed = await new_store.get("foo", prototype=default_buffer_prototype())
        assert observed.to_bytes() == b"\x01\x02\x03\x04"

    def test_store_read_only(self, store) -> None:
        """StoreTests' version asserts a writable store."""
        assert store.read_only
        with pytest.raises(AttributeError):
            store.read_only = False

    @pytest.mark.parametrize("read_only", [True, False])
    async def test_store_open_read_only(self, open_kwargs, read_only) -> None:
        """read_only=False is refused in zarr's words (versions are committed, never
        written through a store)."""
        if read_only:
            await super().test_store_open_read_only(open_kwargs, read_only)
            return
        with pytest.raises(NotImplementedError, match="with_read_only is not implemented"):
            await self.store_cls.open(**{**open_kwargs, "read_only": False})

    async def test_set_if_not_exists(self, store) -> None:
        """StoreTests' version asserts that it writes; a read-only store raises."""
        await self.set(store, "k", self.buffer_cls.from_bytes(b"0000"))
        for key in ("k", "k2"):
            with pytest.raises(ValueError, match="read-only mode"):
                await store.set_if_not_exists(key, self.buffer_cls.from_bytes(b"1111"))
        assert (await store.get("k", default_buffer_prototype())).to_bytes() == b"0000"
        assert await store.get("k2", default_buffer_prototype()) is None

    async def test_exists(self, store) -> None:
        """StoreTests' version writes through the store; here the helper writes. (A key
        of its own: SeaweedFS keeps listing "foo/" as a folder after the other tests'
        "foo/..." keys were deleted, and an object store's exists() sees folders.)"""
        folder = f"exists-{uuid.uuid4().hex[:8]}"
        assert not await store.exists(folder)
        await self.set(store, f"{folder}/zarr.json", self.buffer_cls.from_bytes(b"bar"))
        assert await store.exists(f"{folder}/zarr.json")

    # -- what does not apply to a read-only store, and why ----------------------------------
    @pytest.mark.skip(reason=WRITES)
    async def test_set(self) -> None: ...

    @pytest.mark.skip(reason=WRITES)
    async def test_set_not_open(self) -> None: ...

    @pytest.mark.skip(reason=WRITES)
    async def test_set_many(self) -> None: ...

    @pytest.mark.skip(reason=WRITES)
    async def test_clear(self) -> None: ...

    @pytest.mark.skip(reason=WRITES + " (its _set_many)")
    async def test_getsize_prefix(self) -> None: ...

    @pytest.mark.skip(reason=NEVER_EMPTY)
    async def test_is_empty(self) -> None: ...

    @pytest.mark.skip(reason=NEVER_EMPTY + "; " + WRITES)
    async def test_list(self) -> None: ...

    @pytest.mark.skip(reason=NEVER_EMPTY + "; " + WRITES)
    async def test_list_prefix(self) -> None: ...

    @pytest.mark.skip(reason=NEVER_EMPTY + "; " + WRITES)
    async def test_list_empty_path(self) -> None: ...

    @pytest.mark.skip(reason=NEVER_EMPTY + "; " + WRITES)
    async def test_list_dir(self) -> None: ...


# one class per view and backend (pytest collects them by name). On S3 (with --slow, as CI
# runs: some 2 s a test on a loaded 2-core machine) the views issue 40 names: the rest
# differ from them in the key mapping only, which local disk covers
S3_VIEWS = ("group", "array", "pinned")
for _view in VIEWS:
    for _backend in ("local", "s3") if _view in S3_VIEWS else ("local",):
        _name = f"TestVersionStore_{_view.replace('-', '_')}_{_backend}"
        _class = type(_name, (_VersionStoreContract,), {"view": _view, "backend": _backend})
        if _backend == "s3":
            _class = pytest.mark.slow(_class)
        globals()[_name] = _class


# -- the contract's gaps of issue 40, each failing on the code before it -------------------------
@pytest.fixture(scope="module")
def stores(local_template):
    return {name: f"{local_template}/{name}" for name in ("model.zarr", "codes.zarr")}


async def test_an_absent_key_reads_none_on_every_view_of_an_output(stores):
    for group in (True, False):
        store = VersionStore(stores["codes.zarr"], group=group)
        for key in ("nothing", "c/1000", "encodings/c/99/0", "c/99/0", "x/zarr.json"):
            assert await store.get(key, default_buffer_prototype()) is None, (group, key)
        with pytest.raises(FileNotFoundError):
            await store.getsize("c/1000")


async def test_ranged_reads_of_a_metadata_document_are_ranges_of_what_get_serves(stores):
    """An array's zarr.json is served with dimension names added (an output's own has
    them; a model's arrays get them in the view): its ranges, its size and its whole
    agree; and the group view's own document honours a range too."""
    prototype = default_buffer_prototype()
    for path, group, key in (
        (stores["model.zarr"], True, "precision/zarr.json"),
        (stores["codes.zarr"], False, "zarr.json"),
        (stores["codes.zarr"], True, "encodings/zarr.json"),
        (stores["codes.zarr"], True, "zarr.json"),
    ):
        store = VersionStore(path, group=group)
        whole = (await store.get(key, prototype)).to_bytes()
        assert "dimension_names" in json.loads(whole) or key == "zarr.json"
        assert await store.getsize(key) == len(whole)
        ranged = await store.get(key, prototype, RangeByteRequest(0, 2))
        assert ranged.to_bytes() == whole[:2], (path, group, key)
        middle = await store.get(key, prototype, RangeByteRequest(5, len(whole) - 3))
        assert middle.to_bytes() == whole[5:-3]
        with pytest.raises(TypeError, match=re.escape("Unexpected byte_range, got (0, 2)")):
            await store.get(key, prototype, byte_range=(0, 2))


def test_read_only_surface_speaks_zarrs_words(stores):
    store = VersionStore(stores["codes.zarr"], read_only=True)
    assert store.read_only
    with pytest.raises(NotImplementedError, match="with_read_only is not implemented"):
        store.with_read_only(False)
    with pytest.raises(NotImplementedError, match="with_read_only is not implemented"):
        VersionStore(stores["codes.zarr"], read_only=False)
    assert store.with_read_only(True).read_only


@pytest.mark.parametrize(
    ("name", "kwargs", "advice"),
    [
        ("codes.zarr", {}, "path='encodings'), or VersionStore(..., group=False)"),
        ("model.zarr", {}, "path='"),
        ("model.zarr", {"group": False}, "path='"),
    ],
)
def test_open_array_on_a_group_view_says_what_to_pass_in_one_line(stores, name, kwargs, advice):
    import dask.array as da

    for call in (
        lambda: zarr.open_array(store=VersionStore(stores[name], **kwargs)),
        lambda: da.from_zarr(VersionStore(stores[name], **kwargs)),
    ):
        with pytest.raises(zarr.errors.NodeTypeValidationError) as info:
            call()
        message = str(info.value)
        assert "not an array" in message and advice in message, message
        assert len(message.splitlines()) == 1
    # zarr.open and xarray still open the group (zarr.open tries the array first)
    assert isinstance(zarr.open(VersionStore(stores[name], **kwargs), mode="r"), zarr.Group)
    path = stores[name]
    assert isinstance(slem_dask.open_zarr(path), zarr.Array if name == "codes.zarr" else zarr.Group)
