"""Search results, corpora and models record every chunk's crc32c at their commit: a chunk
swapped in from another version (valid on its own) fails their readers and verify."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from slem_dask import LinearSLEM, load_model, storage
from slem_dask.cli.main import main
from slem_dask.datasets import make_corpus, write_corpus
from slem_dask.pipeline.evaluate import open_search_result, search_job
from slem_dask.storage.versioning import versions

from helpers import zarr_rows


def _swap(path, member_chunk: str) -> None:
    """Copy one chunk of the store's previous version over the same chunk of its head:
    a chunk that was written by slem-dask, checksum and all, for another version."""
    store = versions.VersionedStore(str(path))
    old, new = (Path(store.location(c.version)) for c in store.commits()[-2:])
    shutil.copyfile(old / member_chunk, new / member_chunk)


def _verify_fails(path, capsys, chunk: str) -> None:
    capsys.readouterr()
    assert main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert chunk in out and "not the chunk" in out, out


def test_a_search_result_chunk_from_another_version_fails_read_and_verify(tmp_path, capsys):
    rng = np.random.default_rng(1)
    db = zarr_rows(tmp_path / "db.zarr", rng.standard_normal((50, 4)).astype("float32"))
    out = tmp_path / "hits.zarr"
    for seed in (2, 3):  # two searches of other queries: two versions of one shape
        queries = zarr_rows(
            tmp_path / f"q{seed}.zarr",
            np.random.default_rng(seed).standard_normal((20, 4)).astype("float32"),
        )
        search_job(None, queries, db, str(out), k=5, overwrite=True)
    assert storage.verify(str(out))[1] == []
    _swap(out, "indices/c/0/0")
    with pytest.raises(storage.CorruptChunkError, match=r"indices/c/0/0.*not the chunk"):
        open_search_result(str(out))
    _verify_fails(out, capsys, "indices/c/0/0")


def test_a_model_chunk_from_another_version_fails_load_and_verify(tmp_path, capsys):
    path = str(tmp_path / "m.zarr")
    X = np.random.default_rng(0).standard_normal((60, 4))
    for lam in (0.1, 0.2):
        LinearSLEM(lam=lam).fit(X).save(path, overwrite=True)
    _swap(path, "precision/c/0/0")
    with pytest.raises(
        ValueError,
        match=r"fingerprint \(chunk 'precision/c/0/0' is not "
        r"the chunk that was written",
    ):
        load_model(path)
    _verify_fails(path, capsys, "precision/c/0/0")


def test_a_corpus_chunk_from_another_version_fails_read_and_verify(tmp_path, capsys):
    path = tmp_path / "corpus.zarr"
    for seed in (1, 2):
        write_corpus(
            make_corpus(n_negatives=80, n_instances=6, group_size=2, d=6, seed=seed),
            str(path),
            chunk_rows=20,
        )
    assert storage.verify(str(path))[1] == []
    _swap(path, "negatives/c/1/0")
    with pytest.raises(storage.CorruptChunkError, match=r"c/1/0.*not the chunk"):
        storage.read_all(str(path / "negatives"), "negatives")
    _verify_fails(path, capsys, "negatives/c/1/0")


@pytest.mark.parametrize("kind", ["model", "search", "corpus"])
def test_a_deleted_chunk_is_reported_missing_not_changed(kind, tmp_path, capsys):
    """issue 38 item 7: a chunk deleted from a model, search result or corpus was reported
    as "not the chunk that was written (its crc32c differs)"; it is missing."""
    rng = np.random.default_rng(1)
    path = tmp_path / f"{kind}.zarr"
    if kind == "model":
        LinearSLEM(lam=0.1).fit(rng.standard_normal((60, 4))).save(str(path))
        chunk = "precision/c/0/0"
    elif kind == "search":
        db = zarr_rows(tmp_path / "db.zarr", rng.standard_normal((50, 4)).astype("float32"))
        queries = zarr_rows(tmp_path / "q.zarr", rng.standard_normal((20, 4)).astype("float32"))
        search_job(None, queries, db, str(path), k=5)
        chunk = "indices/c/0/0"
    else:
        write_corpus(make_corpus(80, 6, 2, d=6, seed=1), str(path), chunk_rows=20)
        chunk = "negatives/c/1/0"
    store = versions.VersionedStore(str(path))
    (Path(store.location(store.head().version)) / chunk).unlink()
    capsys.readouterr()
    assert main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"chunk {chunk!r} is missing" in out and "not the chunk" not in out, out
