"""What an operator is told when a job meets the machine rather than bad input (issue 32):
an interrupt says what exists, a full disk names the path and what to free, paused and
slow workers are told apart, an empty input is not an error, tiny chunks get a hint.
In-process against one in-process scheduler; faults are injected, never provoked."""

import re

import numpy as np
import pytest

from slem_dask import pipeline
from slem_dask.cli import main

from helpers import small_corpus

pytestmark = pytest.mark.usefixtures("no_scheduler_env")  # conftest.py


@pytest.fixture
def corpus(tmp_path):
    return small_corpus(tmp_path, seed=5)


def cli(capsys, scheduler, *args):
    """(exit code, stdout, stderr) of the command line, in-process, on ``scheduler``."""
    code = main([*map(str, args), "--scheduler", scheduler, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def _encode(capsys, scheduler, corpus, out, *extra):
    return cli(capsys, scheduler, "encode", "--model", corpus["model"], "--positives",
               corpus["positives"], "--out", out, "--partition-rows", "40", *extra)


# -- 2. an interrupt says what exists -------------------------------------------------
def test_ctrl_c_before_any_partition_was_written_says_nothing_was_written(
        capsys, scheduler, corpus, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.common, "_compute", interrupted)
    out = corpus["dir"] / "codes.zarr"
    code, _, err = _encode(capsys, scheduler, corpus, out)
    assert code == 130
    assert err == (f"slem-dask encode: interrupted; nothing was committed and no partition "
                   f"had been written (no output exists at {str(out)!r} for readers): run "
                   f"the same command again to encode\n")
    assert "resume" not in err and "kept" not in err


def test_ctrl_c_after_some_partitions_says_how_many_are_kept_and_where(
        capsys, scheduler, corpus, monkeypatch):
    real = pipeline.common._compute

    def two_then_interrupted(client, written, progress):
        real(client, written[:2], progress)  # partitions 0 and 1 reach the draft
        raise KeyboardInterrupt

    out = corpus["dir"] / "codes.zarr"
    monkeypatch.setattr(pipeline.common, "_compute", two_then_interrupted)
    code, _, err = _encode(capsys, scheduler, corpus, out)
    assert code == 130
    said = re.fullmatch(r"slem-dask encode: interrupted; nothing was committed \(no output "
                        r"exists at '(.*)' for readers\); 2 of 5 partitions are kept in the "
                        r"draft '(.*)': run the same command again to resume\n", err)
    assert said and said[1] == str(out), err
    assert said[2].startswith(str(out / "versions" / "00000001-"))
    monkeypatch.undo()
    code, stdout, err = _encode(capsys, scheduler, corpus, out)
    assert code == 0 and re.search(r"partitions +3 encoded of 5", stdout), stdout + err


def test_an_update_interrupted_after_writing_its_changed_partitions_is_committed_on_rerun(
        capsys, scheduler, corpus, monkeypatch):
    # The re-run finds every changed partition in the interrupted run's draft, so it has
    # nothing to encode: it must commit them, not call the old head "up to date".
    from helpers import zarr_rows
    from slem_dask import load_model, storage

    out = corpus["dir"] / "codes.zarr"
    assert _encode(capsys, scheduler, corpus, out)[0] == 0
    corpus["pos"][0] += 1
    zarr_rows(corpus["dir"] / "pos.zarr", corpus["pos"])
    real = pipeline.common._compute

    def written_then_interrupted(client, written, progress):
        real(client, written, progress)
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.common, "_compute", written_then_interrupted)
    code, _, err = _encode(capsys, scheduler, corpus, out)
    assert code == 130 and "readers still see version 1); 5 of 5 partitions" in err, err
    monkeypatch.undo()
    code, stdout, err = _encode(capsys, scheduler, corpus, out)
    assert code == 0 and re.search(r"action +resume", stdout), stdout + err
    want = load_model(corpus["model"]).transform(corpus["pos"], dtype="float32")
    np.testing.assert_array_equal(storage.open_output(str(out))[...], want)
