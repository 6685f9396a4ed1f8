"""What the command line tells its operator: a reader that closes the output early, the
kernel fit's report and its warning about a weak factor, encode's action, NaN rows in
linear and kernel fits alike. In-process against one in-process scheduler, except the
closed-pipe tests, which need the executable's own standard output."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from slem_dask.cli.main import EXIT_BROKEN_PIPE, main
from slem_dask.models.kernel import TraceErrorWarning
from slem_dask.models.kernel_defaults import GammaScaleWarning

from helpers import cli, encode_command, zarr_rows

pytestmark = pytest.mark.usefixtures("no_scheduler_env")  # conftest.py


def fact(out: str, name: str) -> str:
    """The value of one line of a job report ("  action             create")."""
    found = re.findall(rf"^  {re.escape(name)} +(.*)$", out, re.M)
    assert len(found) == 1, out
    return found[0]


# -- a reader that stops early (`slem-dask ... | head -1`) --------------------------------
def _slem_dask(args, stdout):
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    return subprocess.Popen(
        [sys.executable, "-m", "slem_dask", *map(str, args), "--no-progress"],
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=env,
    )


def test_a_reader_that_stops_after_the_first_line_ends_a_finished_job_quietly(corpus, capsys):
    out = corpus["dir"] / "codes.zarr"
    proc = _slem_dask(encode_command(corpus, out), subprocess.PIPE)
    first = proc.stdout.readline()  # `| head -1`: one line, then the pipe is closed
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == EXIT_BROKEN_PIPE == 141, err
    assert first.startswith(b"dask: ") and err == ""  # no "[Errno 32] Broken pipe"
    assert main(["verify", str(out)]) == 0  # the job finished: its output is complete
    assert capsys.readouterr().out.endswith(": ok\n")


def test_a_pipe_closed_before_the_job_ran_stops_it_and_says_what_is_kept(corpus):
    read, write = os.pipe()
    os.close(read)  # `| true`: nobody reads
    try:
        proc = _slem_dask(encode_command(corpus, corpus["dir"] / "codes.zarr"), write)
        stopped = proc.communicate(timeout=120)[1].decode()
        # a failing job's error still reaches stderr, with its own exit status
        failed = _slem_dask(
            [
                "fit",
                "--negatives",
                corpus["dir"] / "nothing.zarr",
                "--model",
                corpus["dir"] / "m.zarr",
            ],
            write,
        )
        error = failed.communicate(timeout=120)[1].decode()
    finally:
        os.close(write)
    # stopped before its job wrote anything: it says so, and promises nothing to resume
    assert proc.returncode == 141 and stopped.splitlines() == [
        f"slem-dask encode: stopped: the reader of its output closed it before the job "
        f"finished; nothing was committed and no partition had been written (no output "
        f"exists at {str(corpus['dir'] / 'codes.zarr')!r} for readers): run the same "
        f"command again to encode"
    ], stopped
    assert not (corpus["dir"] / "codes.zarr" / "commits").exists()
    assert failed.returncode == 1 and error.startswith(
        "slem-dask fit: error: negatives: no zarr array at "
    ), error


# -- reports and warnings ------------------------------------------------------------------
def _kernel_fit(capsys, scheduler, corpus, *extra):
    return cli(
        capsys,
        scheduler,
        "fit",
        "--negatives",
        corpus["negatives"],
        "--model",
        corpus["dir"] / "kmodel.zarr",
        "--kernel",
        "rbf",
        *extra,
    )


def test_the_kernel_fit_report_names_the_seed_by_its_option(capsys, scheduler, corpus):
    code, out, err = _kernel_fit(
        capsys, scheduler, corpus, "--rank", "6", "--pivoting", "rpcholesky", "--seed", "7"
    )
    assert code == 0, err
    assert fact(out, "seed") == "7" and "random_state" not in out
    assert fact(out, "rank") == "6" and fact(out, "pivoting") == "rpcholesky"


def test_a_kernel_fit_whose_factor_misses_the_kernel_warns_once(capsys, scheduler, corpus):
    # gamma 100 on unit-variance rows: the kernel matrix is nearly the identity, and
    # 8 pivots of 300 leave 97% of its trace
    with pytest.warns(TraceErrorWarning) as caught:
        code, out, err = _kernel_fit(capsys, scheduler, corpus, "--rank", "8", "--gamma", "100")
    assert code == 0, err
    trace = [w for w in caught if w.category is TraceErrorWarning]
    assert len(trace) == 1
    # gamma 100 is far from these rows' scale: that is said first, in its own warning
    assert [w.category for w in caught if w.category is GammaScaleWarning] == [GammaScaleWarning]
    said = fact(out, "warning")
    assert said == str(trace[0].message) and "\n" not in said
    value = fact(out, "trace error")
    assert said.startswith(
        f"negatives {corpus['negatives']!r}: trace error "
        f"{float(value):.4f} (residual trace / trace) is above 0.9"
    ), said
    assert "rbf kernel (gamma 100) with 8 pivots (rank 8)" in said
    assert (
        "use a smaller gamma (--gamma): at this gamma the kernel matrix is nearly "
        "diagonal (the 8 pivots hold" in said
    )
    assert said.endswith("and a larger rank would only add the pivots themselves"), said


def test_encode_overwrite_says_it_replaces_the_output(capsys, scheduler, corpus):
    out = corpus["dir"] / "codes.zarr"
    args = encode_command(corpus, out)
    code, first, err = cli(capsys, scheduler, *args)
    assert code == 0 and fact(first, "action") == "create", err
    code, again, err = cli(capsys, scheduler, *args, "--overwrite")
    assert code == 0 and fact(again, "action") == "replace", err
    assert fact(again, "version") == "2"


@pytest.mark.parametrize(
    "kind",
    [
        [],
        ["--kernel", "rbf", "--rank", "4"],
        ["--kernel", "rbf", "--rank", "4", "--kernel-memory", "streaming"],
    ],
    ids=["linear", "kernel", "kernel streaming"],
)
def test_nan_rows_are_told_in_one_wording_by_linear_and_kernel_fits(
    capsys, scheduler, corpus, kind
):
    neg = corpus["neg"].copy()
    neg[5, 2], neg[77, 0], neg[200, 1] = np.nan, np.inf, np.nan  # in three partitions
    path = zarr_rows(corpus["dir"] / "bad.zarr", neg)
    code, out, err = cli(
        capsys,
        scheduler,
        "fit",
        "--negatives",
        path,
        "--model",
        corpus["dir"] / "bad-model.zarr",
        "--partition-rows",
        "40",
        *kind,
    )
    assert code == 1 and err == (
        f"slem-dask fit: error: negatives {path!r}: 3 row(s) with NaN or inf (rows 5, 77, "
        f"200) out of 300; drop or repair those rows before fitting\n"
    ), err


def test_a_fit_into_an_existing_model_says_which_flag_fits_what_it_holds(
    capsys, scheduler, corpus, tmp_path
):
    """The same fit run again was told "--update to add the negatives appended", and so
    was a fit of other negatives, which --update then refused (a new user's run): a
    model of these negatives is pointed to --update (up to date when nothing was
    appended), a model of others to --overwrite, and each flag then does so."""
    model, negatives = str(tmp_path / "fitted.zarr"), corpus["negatives"]
    fit = ("fit", "--negatives", negatives, "--model", model)
    assert cli(capsys, scheduler, *fit)[0] == 0
    code, _, err = cli(capsys, scheduler, *fit)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "fitted on these negatives; pass --update" in err, err
    code, out, err = cli(capsys, scheduler, *fit, "--update")
    assert code == 0 and fact(out, "action") == "up to date", (out, err)
    others = zarr_rows(tmp_path / "others.zarr", np.random.default_rng(1).standard_normal((50, 8)))
    code, _, err = cli(capsys, scheduler, "fit", "--negatives", others, "--model", model)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"not on '{others}'; pass --overwrite to replace it" in err, err
    code, out, err = cli(
        capsys, scheduler, "fit", "--negatives", others, "--model", model, "--overwrite"
    )
    assert code == 0, err


def test_an_encoded_output_given_as_the_model_is_named_as_one(capsys, scheduler, corpus, tmp_path):
    """It was said to be "a zarr array, not a model", as any array is (a new user's
    run), while `fit --model` of the same path named it slem-dask's encoded output."""
    out = tmp_path / "out.zarr"
    assert cli(capsys, scheduler, *encode_command(corpus, out))[0] == 0
    code, _, err = cli(
        capsys, scheduler, *encode_command({**corpus, "model": out}, tmp_path / "o2")
    )
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "is an encoded output of slem-dask (`slem-dask encode --out`), not a model" in err, err
