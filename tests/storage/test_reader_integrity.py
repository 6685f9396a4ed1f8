"""Readers never see zeros (issue 38 item 6, issue 40 item 4): every reader of every store
kind (a model, an output, a search result, a group of arrays), on local disk and on S3,
checks each chunk against the crc32c its commit recorded and raises naming a chunk that
is missing or not the one written; a pruned version raises VersionError everywhere,
a VersionStore unpickled on a dask worker included; and a plain zarr reader of a pruned
version reads sentinels (NaN, -1), never plausible data."""

import pickle
import re
import uuid

import fsspec
import numpy as np
import pytest
import zarr

import slem_dask
from slem_dask import LinearSLEM
from slem_dask.pipeline.search import search_job
from slem_dask.storage import VersionStore, write_group
from slem_dask.storage.versioning import versions
from slem_dask.storage.versioning.errors import CorruptChunkError, MissingChunkError

from helpers import encode_corpus

KINDS = ["model", "output", "search", "group"]


# on S3 (SeaweedFS), 8 to 13 s a test on a loaded 2-core machine: with --slow (as CI runs)
@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def where(request, tmp_path):
    """A folder for the stores: on local disk, or a fresh prefix of the S3 bucket."""
    if request.param == "local":
        return str(tmp_path / "stores")  # beside the corpus' own model.zarr
    server = request.getfixturevalue("s3_server")
    return f"s3://{server.bucket}/integrity-{uuid.uuid4().hex[:8]}"


def _write(kind: str, corpus: dict, path: str, n: int = 0) -> None:
    """Version ``n + 1`` of a store of ``kind`` at ``path`` (each ``n`` other data)."""
    again = n > 0
    if kind == "model":
        LinearSLEM(lam=0.1 * (n + 1)).fit(corpus["neg"][: 300 - 10 * n]).save(path, overwrite=again)
    elif kind == "output":
        encode_corpus(corpus, path, corpus["others"] if n % 2 else None, overwrite=again)
    elif kind == "search":
        database = corpus["others"] if n % 2 else corpus["negatives"]
        search_job(None, corpus["positives"], database, path, k=3 + n, overwrite=again)
    else:
        write_group(
            path,
            {"kind": "corpus"},
            {"negatives": corpus["neg"] * (n + 1), "labels": np.arange(300) - 7 * n},
            "corpus",
            overwrite=again,
        )


def _folder(path: str, seq: int | None = None) -> str:
    """The location of version ``seq`` (None: the head) of the store at ``path``."""
    store = versions.VersionedStore(path)
    commit = store.head() if seq is None else store.commit_at(seq)
    return store.location(commit.version)


def _chunk_keys(fs, folder: str) -> list[str]:
    """The chunk keys of the version folder (relative), sorted."""
    fs.invalidate_cache()
    keys = [f[len(folder.rstrip("/")) + 1 :] for f in fs.find(folder)]
    return sorted(k for k in keys if "c" in k.split("/") and not k.endswith("zarr.json"))


def _read_everything(node) -> None:
    if isinstance(node, zarr.Array):
        node[...]
        return
    for _, arr in node.arrays():
        arr[...]


def _readers(path: str, kind: str) -> dict:
    """Every way to read the store's current version, each a function that reads it all."""
    pickled_store = pickle.dumps(VersionStore(path))  # what a dask worker gets
    opened = slem_dask.open_zarr(path)
    readers = {
        "open_zarr": lambda: _read_everything(slem_dask.open_zarr(path)),
        "open_dataset": lambda: slem_dask.open_dataset(path).load(),
        "VersionStore": lambda: _read_everything(zarr.open(VersionStore(path), mode="r")),
        "pickled VersionStore": lambda: _read_everything(
            zarr.open(pickle.loads(pickled_store), mode="r")
        ),
        # dask ships the array opened on the client, its store inside, to the worker
        "pickled node": lambda: _read_everything(pickle.loads(pickle.dumps(opened))),
    }
    if kind == "group":
        readers["member"] = lambda: _read_everything(slem_dask.open_zarr(f"{path}/negatives"))
    return readers


@pytest.mark.parametrize("kind", KINDS)
def test_a_lost_or_swapped_chunk_is_named_by_every_reader(corpus, where, kind):
    """A chunk deleted from the head version, then one that passes zarr's own crc32c
    check (a whole chunk of version 1, copied over version 2's) but is not what version
    2's commit recorded: every reader raises naming it; the store intact reads."""
    path = f"{where}/{kind}.zarr"
    _write(kind, corpus, path)
    _write(kind, corpus, path, 1)
    readers = _readers(path, kind)
    fs, old = fsspec.core.url_to_fs(_folder(path, 1))
    new = fsspec.core.url_to_fs(_folder(path))[1]
    chunk = next(
        key
        for key in _chunk_keys(fs, new)
        if (kind != "group" or "negatives" in key)  # a chunk that the member view reads
        and fs.exists(f"{old}/{key}")
        and fs.cat(f"{old}/{key}") != fs.cat(f"{new}/{key}")
    )
    written = fs.cat(f"{new}/{chunk}")
    fs.rm(f"{new}/{chunk}")
    for read in readers.values():
        with pytest.raises(MissingChunkError, match=re.escape(repr(chunk)) + ".*is missing"):
            read()
    fs.pipe(f"{new}/{chunk}", written)
    for read in readers.values():
        read()
    fs.pipe(f"{new}/{chunk}", fs.cat(f"{old}/{chunk}"))
    for read in readers.values():
        with pytest.raises(CorruptChunkError, match=re.escape(repr(chunk)) + ".*not the chunk"):
            read()
    # a byte flipped inside, its recorded trailer kept: zarr's own crc32c check refuses it
    # as it decodes (docs/reading-outputs.md: the store reads the trailer alone)
    damaged = bytearray(written)
    damaged[len(damaged) // 2] ^= 0x40
    fs.pipe(f"{new}/{chunk}", bytes(damaged))
    for read in readers.values():
        with pytest.raises(ValueError, match="Stored and computed checksum do not match"):
            read()


def _plain_arrays(folder: str) -> dict:
    """The arrays of a version folder as a plain zarr reader opens them."""
    node = zarr.open(folder, mode="r")
    return {"": node} if isinstance(node, zarr.Array) else dict(node.arrays())


@pytest.mark.parametrize("kind", KINDS)
def test_a_pruned_version_raises_version_error_everywhere_and_plain_zarr_reads_sentinels(
    corpus, where, kind
):
    path = f"{where}/{kind}.zarr"
    _write(kind, corpus, path)
    held = slem_dask.open_zarr(path)  # a reader holds version 1 ...
    pickled = pickle.dumps(VersionStore(path))  # ... and so does a dask worker
    plain = _plain_arrays(_folder(path))  # and a plain zarr reader of its folder
    for n in range(1, versions.KEEP_VERSIONS + 1):  # the third new job prunes version 1
        _write(kind, corpus, path, n)
    store = versions.VersionedStore(path)
    assert not store.exists(store.commit_at(1).version)

    for read in (
        lambda: _read_everything(held),
        lambda: _read_everything(zarr.open(pickle.loads(pickled), mode="r")),
        lambda: VersionStore(path, version=1),
        lambda: slem_dask.open_zarr(path, version=1),
        lambda: slem_dask.open_dataset(path, version=1),
    ):
        with pytest.raises(versions.VersionError, match="version 1 .*was pruned") as info:
            read()
        assert not isinstance(info.value, versions.DamagedCommitError), info.value

    for name, arr in plain.items():
        try:
            values = arr[...]
        except Exception:  # noqa: BLE001 - an error is as good as a sentinel
            continue
        if values.dtype.kind == "f":
            assert np.isnan(values).all(), name
        elif values.dtype.kind == "i":
            assert (values == -1).all(), name


@pytest.mark.parametrize("kind", ["model", "search", "group"])
def test_arrays_of_groups_have_sentinel_fill_values(corpus, tmp_path, kind):
    path = str(tmp_path / f"{kind}-store.zarr")
    _write(kind, corpus, path)
    arrays = _plain_arrays(_folder(path))
    assert arrays
    for name, arr in arrays.items():
        if arr.dtype.kind == "f":
            assert np.isnan(arr.fill_value), name
        elif arr.dtype.kind == "i":
            assert arr.fill_value == -1, name


@pytest.mark.parametrize("kind", KINDS)
def test_a_lost_chunk_of_version_1_is_not_met_with_advice_to_roll_back(corpus, where, kind):
    """Version 1 has no earlier version: a reader's message said "roll back (`slem-dask
    rollback P --to N`)" all the same. It says to write the store again."""
    path = f"{where}/{kind}.zarr"
    _write(kind, corpus, path)
    fs, folder = fsspec.core.url_to_fs(_folder(path))
    chunk = next(key for key in _chunk_keys(fs, folder) if kind != "group" or "negatives" in key)
    fs.rm(f"{folder}/{chunk}")
    for read in _readers(path, kind).values():
        with pytest.raises(MissingChunkError, match=re.escape(repr(chunk))) as info:
            read()
        assert "roll back" not in str(info.value) and "write it again" in str(info.value)
