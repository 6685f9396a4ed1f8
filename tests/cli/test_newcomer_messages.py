"""Messages a newcomer met on a third look (issue 40): each says what is true and the fix."""

import numpy as np
import pytest

import slem_dask
from slem_dask.cli.main import main
from slem_dask.pipeline.evaluation import relevant_from_labels
from slem_dask.storage.versioning import versions

CLUSTER = ["--local-cluster", "threads", "--no-progress"]


def _shards(folder, rng, bad_row: int):
    """Two shards of 30 rows; one NaN at ``bad_row`` of the second."""
    folder.mkdir()
    a = rng.standard_normal((30, 6)).astype("float32")
    b = rng.standard_normal((30, 6)).astype("float32")
    b[bad_row, 2] = np.nan
    np.save(folder / "emb_1.npy", a)
    np.save(folder / "emb_2.npy", b)
    return str(folder)


def test_nan_rows_of_a_shard_folder_are_named_by_shard_and_row(tmp_path, capsys):
    rng = np.random.default_rng(0)
    shards = _shards(tmp_path / "shards", rng, bad_row=7)
    model = str(tmp_path / "m.zarr")
    assert main(["fit", "--negatives", shards, "--model", model, *CLUSTER]) == 1
    err = capsys.readouterr().err
    assert "1 row(s) with NaN or inf (rows 37: emb_2.npy row 7) out of 60" in err, err
    np.save(tmp_path / "neg.npy", rng.standard_normal((100, 6)).astype("float32"))
    assert main(["fit", "--negatives", str(tmp_path / "neg.npy"), "--model", model, *CLUSTER]) == 0
    out = str(tmp_path / "o.zarr")
    assert main(["encode", "--model", model, "--positives", shards, "--out", out, *CLUSTER]) == 1
    err = capsys.readouterr().err
    assert "1 row(s) with NaN or inf (rows 37: emb_2.npy row 7);" in err, err
    assert err.count("\n") == 1


def test_numeric_database_labels_against_text_query_labels_are_named():
    with pytest.raises(
        ValueError,
        match=r"^database_labels are numbers \(int64, e\.g\. 3\) but query_labels are text "
        r"\(<U4, e\.g\. 'cat3'\): labels match by value, so numbers and text never match; "
        r"save both as numbers or both as text",
    ):
        relevant_from_labels(np.array([3, 4]), np.array(["cat3", "cat4"]))
    # the same kind on both sides, of other widths, still matches
    assert [r.tolist() for r in relevant_from_labels([3, 4], np.array([4], "int32"))] == [[1]]


def test_a_store_with_no_commit_yet_says_to_run_again_not_to_open_it_with_zarr(tmp_path):
    path = str(tmp_path / "out.zarr")
    versions.VersionedStore(path).begin()  # what a Ctrl-C before the first commit leaves
    with pytest.raises(versions.VersionError) as info:
        slem_dask.open_zarr(path)
    text = str(info.value)
    assert "has no committed version yet" in text and "run the same command again" in text
    assert "zarr.open" not in text


@pytest.mark.parametrize("command", ["verify", "versions", "rollback", "export"])
def test_every_store_command_says_what_path_is(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "PATH store" in help_text or "PATH the store" in help_text, help_text


def test_evaluate_names_the_option_and_shard_of_nan_rows_before_any_method_runs(tmp_path, capsys):
    """It said "X has 1 row(s) with NaN or inf (rows 203) ... before running SLEM", after
    the methods before the failing one had run (the walkthrough of issue 40's fixes)."""
    rng = np.random.default_rng(1)
    database = _shards(tmp_path / "db", rng, bad_row=3)
    for name, data in {
        "neg.npy": rng.standard_normal((100, 6)).astype("float32"),
        "q.npy": rng.standard_normal((4, 6)).astype("float32"),
        "dbl.npy": np.arange(60) % 4,
        "ql.npy": np.arange(4),
    }.items():
        np.save(tmp_path / name, data)
    args = ["--negatives-from", str(tmp_path / "neg.npy"), "--database", database]
    args += ["--database-labels", str(tmp_path / "dbl.npy"), "--queries", str(tmp_path / "q.npy")]
    args += ["--query-labels", str(tmp_path / "ql.npy"), "--methods", "raw,slem"]
    assert main(["evaluate", *args, *CLUSTER]) == 1
    out, err = capsys.readouterr()
    assert err == (
        f"slem-dask evaluate: error: --database {database!r}: 1 row(s) with NaN or inf "
        f"(rows 33: emb_2.npy row 3); drop or repair those rows\n"
    )
    assert "raw" not in out  # no method ran


@pytest.mark.parametrize("command", [["versions"], ["rollback", "--to", "1"]])
def test_a_store_command_on_a_path_that_does_not_exist_says_so(command, tmp_path, capsys):
    """`versions nope.zarr` said nope.zarr "was not written by this slem-dask (or not at
    all)" and sent the user to `verify`: a typo in the path is said as one."""
    missing = tmp_path / "nope.zarr"
    assert main([command[0], str(missing), *command[1:]]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"slem-dask {command[0]}: error: {str(missing)!r} does not exist: check the path "
        "(a job that has not run yet writes nothing there)"
    ]
    missing.mkdir()
    assert main([command[0], str(missing), *command[1:]]) == 1
    assert "has no versions: it was not written by this slem-dask" in capsys.readouterr().err
