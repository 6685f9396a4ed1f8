"""What slem-dask may delete or take for its own (issue 38 item 5 and 7): only what it
provably wrote, by content, never by a name a user can make; never a folder that two
stores share or that a symbolic link leads to."""

import json
from pathlib import Path

import numpy as np
import pytest

from slem_dask import LinearSLEM, storage
from slem_dask.cli.main import main
from slem_dask.storage.export import PARTIAL_MARKER


def _model(path, lam: float = 0.1) -> str:
    X = np.random.default_rng(0).standard_normal((40, 4))
    LinearSLEM(lam=lam).fit(X).save(str(path), overwrite=True)
    return str(path)


def _tree(path) -> dict[str, bytes]:
    """Every file under ``path``, with its bytes (what must be left as it is)."""
    root = Path(path)
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# -- export trusts its marker's content, not its name ---------------------------------------
@pytest.mark.parametrize(
    "marker",
    [
        b"",
        b"{}",
        json.dumps(
            {
                "to": "/elsewhere/plain.zarr",
                "path": "x",
                "version": 1,
                "folder": "f",
                "kind": "model",
            }
        ).encode(),
    ],
    ids=["empty", "not-an-export's", "copied-from-another-export"],
)
def test_export_never_deletes_a_users_folder_that_holds_a_file_named_like_its_marker(
    tmp_path, capsys, marker
):
    """A user's folder holding a file named `.slem-dask-export-unfinished` (empty, or one
    copied from another export) was deleted whole by `export`, without --overwrite."""
    model = _model(tmp_path / "m.zarr")
    users = tmp_path / "plain.zarr"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    (users / PARTIAL_MARKER).write_bytes(marker)
    before = _tree(users)
    for extra in ([], ["--overwrite"]):
        assert main(["export", model, "--to", str(users), *extra]) == 1
        err = capsys.readouterr().err
        assert "was not written by slem-dask" in err and len(err.strip().splitlines()) == 1
        assert _tree(users) == before


def test_an_unfinished_export_of_slem_dasks_is_still_replaced(tmp_path, monkeypatch):
    from slem_dask.storage import export as exporting

    model, out = _model(tmp_path / "m.zarr"), tmp_path / "plain.zarr"

    def fail(data, facts):  # the root document is the last thing written
        raise OSError("No space left on device")

    with monkeypatch.context() as m:
        m.setattr(exporting, "_with_provenance", fail)
        with pytest.raises(OSError, match="No space"):
            exporting.export(model, out)
    assert (out / PARTIAL_MARKER).exists() and not (out / "zarr.json").exists()
    exporting.export(model, out)  # its own marker: replaced without --overwrite
    assert not (out / PARTIAL_MARKER).exists()
    np.testing.assert_array_equal(
        storage.read_model_store(str(out))[1]["precision"],
        storage.read_model_store(model)[1]["precision"],
    )
