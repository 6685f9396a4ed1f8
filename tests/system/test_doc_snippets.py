"""The Python blocks of the README and of the docs run as they are written, in a folder
that holds what they name (the demo's corpus, a model, outputs): a new user ran each and
found names they never define (`queries`, `x0`, `client`, a `queries.zarr` never made)
and blocks that used slem_dask without importing it."""

import re
from pathlib import Path

import numpy as np
import pytest

from slem_dask.cli.main import main
from slem_dask.datasets import make_corpus, write_corpus

ROOT = Path(__file__).resolve().parents[2]
IN_THREADS = ["--local-cluster", "threads", "--no-progress"]


def python_blocks(doc: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S)


def demo_folder(folder):
    """corpus.zarr as the demo writes it (smaller) and model.zarr fitted on it by
    `slem-dask fit`, as the demo's folder holds them; returns the corpus."""
    corpus = make_corpus(n_negatives=3000, n_instances=40, group_size=4, d=32, seed=3)
    write_corpus(corpus, str(folder / "corpus.zarr"), chunk_rows=512)
    fit = ["fit", "--negatives", folder / "corpus.zarr/negatives", "--model", folder / "model.zarr"]
    assert main([*map(str, fit), *IN_THREADS]) == 0
    return corpus


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The demo's folder and the outputs the snippets read: codes.zarr (of pos.zarr) and
    database.zarr."""
    import zarr

    folder = tmp_path_factory.mktemp("snippets")
    corpus = demo_folder(folder)
    zarr.create_array(str(folder / "pos.zarr"), data=corpus.database, chunks=(64, 32))
    for positives, out in (("pos.zarr", "codes.zarr"), ("corpus.zarr/database", "database.zarr")):
        args = ["encode", "--model", folder / "model.zarr", "--positives", folder / positives]
        assert main([*map(str, args), "--out", str(folder / out), *IN_THREADS]) == 0
    return folder


def _run(blocks: list[str], folder, monkeypatch, namespace=None) -> dict:
    monkeypatch.chdir(folder)
    namespace = {} if namespace is None else namespace
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"block {i}", "exec"), namespace)
        except Exception as exc:  # noqa: BLE001 - the block that failed, and why
            pytest.fail(f"block {i} failed ({type(exc).__name__}: {exc}):\n{block}")
    return namespace


def test_the_readme_blocks_run_as_written(folder, monkeypatch):
    blocks = python_blocks("README.md")
    assert len(blocks) == 2  # reading the outputs; the library
    done = _run(blocks, folder, monkeypatch)
    assert done["scores"].shape == (done["Q"].shape[0], 100)
    assert done["index"].ntotal == done["codes"].shape[0]


def test_the_reading_outputs_blocks_run_as_written(folder, monkeypatch):
    blocks = python_blocks("docs/reading-outputs.md")
    assert len(blocks) == 5  # zarr, xarray, netCDF, dask, FAISS: each on its own
    for block in blocks:
        done = _run([block], folder, monkeypatch)
    assert done["ids"][:, 0].tolist() == [0, 1, 2]  # FAISS, last: each code finds itself


@pytest.mark.slow
def test_the_user_guide_blocks_run_as_written(monkeypatch, tmp_path):
    """In order, in one namespace, as a reader of the guide would, in a folder that holds
    what the demo's does (its corpus and model): the kernel block reuses the first
    block's X and P; the scatter block takes the client that 'Jobs from Python' makes, so
    it runs last."""
    demo_folder(tmp_path)
    blocks = python_blocks("docs/user-guide.md")
    assert len(blocks) == 6
    scatter = next(i for i, b in enumerate(blocks) if "scatter_large_arrays(client)" in b)
    in_order = [b for i, b in enumerate(blocks) if i != scatter] + [blocks[scatter]]
    done: dict = {}
    try:
        _run(in_order, tmp_path, monkeypatch, done)
        assert done["S"].shape == (5, 3) and 0 < done["search"].best_score_ <= 1
        assert np.asarray(done["Z"]).shape[0] == done["P"].shape[0]
    finally:
        if "client" in done:  # its LocalCluster, however far the blocks got
            done["client"].close()
