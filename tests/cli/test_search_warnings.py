"""search's warnings on what it is given: encodings against rows whose store says
they are not encodings, and against a file, which cannot say (a new user searched an
export of encodings, `slem-dask export --to codes.npy`, and was told it was raw)."""

import warnings

import numpy as np
import pytest

from helpers import run_cli as run
from slem_dask import LinearSLEM

IN_THREADS = ("--local-cluster", "threads", "--no-progress")


@pytest.fixture
def stores(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "raw.npy", rng.standard_normal((300, 8)).astype("float32"))
    LinearSLEM().fit(rng.standard_normal((400, 8))).save(str(tmp_path / "m.zarr"))
    codes = tmp_path / "codes.zarr"
    encode = ["--model", tmp_path / "m.zarr", "--positives", tmp_path / "raw.npy"]
    assert run(capsys, "encode", *encode, "--out", codes, *IN_THREADS)[0] == 0
    assert run(capsys, "export", codes, "--to", tmp_path / "codes.npy")[0] == 0
    assert run(capsys, "export", codes, "--to", tmp_path / "plain.zarr")[0] == 0
    return tmp_path


def _warnings(capsys, stores, queries, database):
    """The warnings of a search on what its inputs hold (the command line prints each as
    `slem-dask search: warning: ...`)."""
    out = stores / f"s-{queries}-{database}.zarr"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run(
            capsys, "search", "--queries", stores / queries, "--database", stores / database,
            "--k", "3", "--out", out, *IN_THREADS,
        )  # fmt: skip
    assert code == 0, err
    said = [str(w.message) for w in caught]
    return [w for w in said if w.startswith(("the queries are", "the database is"))]


def test_encodings_against_a_file_say_the_file_cannot_tell(stores, capsys):
    for queries, database in (("codes.zarr", "codes.npy"), ("codes.zarr", "raw.npy")):
        (said,) = _warnings(capsys, stores, queries, database)
        assert f"{str(stores / database)!r} (the database) is a .npy file, which records" in said
        assert said.endswith(
            "encodings saved in it (as `slem-dask export --to OUT.npy` writes them) are "
            "searched as such"
        ), said
        assert "raw descriptors?" not in said
    (said,) = _warnings(capsys, stores, "raw.npy", "codes.zarr")
    assert said.startswith("the database is a slem-dask encoding; ")
    assert f"{str(stores / 'raw.npy')!r} (the queries) is a .npy file" in said


def test_encodings_against_a_zarr_array_without_their_record_are_called_raw(stores, capsys):
    import zarr

    zarr.create_array(str(stores / "raw.zarr"), data=np.load(stores / "raw.npy"))
    (said,) = _warnings(capsys, stores, "codes.zarr", "raw.zarr")
    assert said == (
        f"the queries are slem-dask encodings but the database ({str(stores / 'raw.zarr')!r}) "
        f"is not (raw descriptors?): their scores mean little; encode both with the same "
        f"model (`slem-dask encode`)"
    )
    assert _warnings(capsys, stores, "codes.zarr", "plain.zarr") == []  # its record kept


def test_an_hdf5_file_or_shards_are_named_for_what_they_are(stores, capsys):
    import h5py

    with h5py.File(stores / "raw.h5", "w") as f:
        f["rows"] = np.load(stores / "raw.npy")
    (stores / "shards").mkdir()
    np.save(stores / "shards" / "emb_0.npy", np.load(stores / "raw.npy"))
    (said,) = _warnings(capsys, stores, "codes.zarr", "raw.h5")
    assert f"{str(stores / 'raw.h5')!r} (the database) is an HDF5 file, which records" in said
    assert said.endswith("encodings saved in it are searched as such"), said  # no export
    (said,) = _warnings(capsys, stores, "codes.zarr", "shards")
    assert "(the database) is a set of .npy shards, which records nothing" in said, said
