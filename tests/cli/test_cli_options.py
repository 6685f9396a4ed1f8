"""Command-line option checks of issue 10: combinations refused before any work,
parameter grids in `evaluate`, kernel progress, `python -m slem_dask`."""

import subprocess
import sys

import numpy as np
import pytest
import zarr

from slem_dask import storage

from slem_dask.datasets import make_corpus, write_corpus

from helpers import run_cli as run  # (exit code, stdout, stderr) of the CLI in-process

UNREACHABLE = "tcp://127.0.0.1:1"  # a check that ran after connecting would fail on this
IN_THREADS = ("--local-cluster", "threads", "--no-progress")  # a cluster in this process


@pytest.fixture(autouse=True)
def no_scheduler_env(monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("corpus") / "corpus.zarr")
    write_corpus(make_corpus(n_negatives=600, n_instances=60, d=16, seed=2), path)
    return path


@pytest.mark.parametrize(
    "flags",
    [
        ["--gamma", "0.5"],
        ["--rank", "8"],
        ["--pivoting", "rpcholesky"],
        ["--tol", "0.01"],
        ["--gamma", "0.5", "--rank", "8"],
    ],
)
def test_kernel_options_without_kernel_refused(capsys, tmp_path, flags):
    model = tmp_path / "m.zarr"
    code, _, err = run(
        capsys,
        "fit",
        "--negatives",
        tmp_path / "none.zarr",
        "--model",
        model,
        "--scheduler",
        UNREACHABLE,
        *flags,
    )
    assert code == 2
    assert "only to kernel SLEM models" in err and "--kernel rbf" in err
    assert flags[0] in err and err.startswith("slem-dask fit: error: ")
    assert len(err.strip().splitlines()) == 1, err  # one line, no usage block
    assert not model.exists()


def test_p_at_larger_than_k_refused(capsys, corpus):
    code, _, err = run(
        capsys,
        "evaluate",
        "--corpus",
        corpus,
        "--k",
        "3",
        "--p-at",
        "4",
        "--scheduler",
        UNREACHABLE,
    )
    assert code == 2 and "--p-at 4 is larger than the ranking length --k 3" in err


def test_plot_in_missing_folder_refused_before_any_work(capsys, corpus, tmp_path):
    plot = tmp_path / "missing" / "pr.png"
    code, out, err = run(
        capsys, "evaluate", "--corpus", corpus, "--plot", plot, "--scheduler", UNREACHABLE
    )
    assert code == 1
    assert "--plot: folder" in err and "does not exist" in err and "mkdir -p" in err
    assert "dask:" not in out  # no cluster was reached


@pytest.mark.parametrize(
    "where, said",
    [
        ("missing/report.html", "--performance-report: folder {folder!r} does not exist; "),
        (".", "--performance-report: {path!r} is a folder; give a file name such as "),
    ],
    ids=["missing folder", "a folder"],
)
def test_a_performance_report_that_could_not_be_written_is_refused_before_any_cluster(
    capsys, corpus, tmp_path, where, said
):
    # distributed writes the report when the job has run: a folder given as the file
    # failed the command after the model was written, a missing folder after connecting
    path = str(tmp_path / where) if where != "." else str(tmp_path)
    model = tmp_path / "m.zarr"
    code, out, err = run(
        capsys,
        "fit",
        "--negatives",
        f"{corpus}/negatives",
        "--model",
        model,
        "--performance-report",
        path,
        "--scheduler",
        UNREACHABLE,
    )
    assert code == 1 and "dask:" not in out  # no cluster was reached
    expected = said.format(folder=str(tmp_path / "missing"), path=path)
    assert err.startswith(f"slem-dask fit: error: {expected}") and err.count("\n") == 1, err
    assert not model.exists()


def test_demo_with_one_negative_refused_before_writing(capsys, tmp_path):
    workdir = tmp_path / "demo"
    code, _, err = run(
        capsys, "demo", "--workdir", workdir, "--negatives", "1", "--scheduler", UNREACHABLE
    )
    assert code == 2 and "expected an integer >= 2" in err
    assert not workdir.exists()


@pytest.mark.parametrize("text", ["1e-3,", "1e-3,abc", "0,1e-2", "1e-2,1e-2"])
def test_bad_grids_refused(capsys, corpus, text):
    code, _, err = run(
        capsys, "evaluate", "--corpus", corpus, "--lam", text, "--scheduler", UNREACHABLE
    )
    assert code == 2 and "--lam" in err


@pytest.mark.parametrize("option", ["--lam", "--gamma"])
@pytest.mark.parametrize("text", ["0x", "-1x", "0", "infx", "abc"])
def test_a_bad_lambda_or_gamma_is_quoted_as_given(capsys, corpus, tmp_path, option, text):
    # `--lam 0x` was quoted as '0', and `--lam=-1x` as '-1': not what was typed
    kernel = ["--kernel", "rbf"] if option == "--gamma" else []
    given = ["--negatives", f"{corpus}/negatives", "--model", tmp_path / "m.zarr", *kernel]
    code, _, err = run(capsys, "fit", *given, f"{option}={text}", "--scheduler", UNREACHABLE)
    assert code == 2 and f"argument {option}: expected a finite number > 0 or Cx " in err
    assert f"got {text!r} (a number is absolute; Cx is C " in err, err


@pytest.mark.parametrize(
    "given, hint",
    [
        (
            ["--lam", "-1x"],
            "; its value '-1x' starts with '-' and was read as an option, and as a value "
            "it is refused too: expected a finite number > 0 or Cx with C > 0, got '-1x' "
            "(a number is absolute; Cx is C times the negatives' total variance, e.g. 0.01x)",
        ),
        (
            ["--partition-rows", "-m.zarr"],
            "; its value '-m.zarr' starts with '-' and was read as an option, and as a value "
            "it is refused too: expected an integer >= 1, got '-m.zarr'",
        ),
        (["--lam", "--overwrite"], ""),  # a missing value: no hint
        (["--lam", "--partition-rows=10"], ""),
        (["--lam", "--lamda"], ""),  # a missing value and a mistyped option
        (["--lam"], ""),
    ],
)
def test_a_value_that_starts_with_a_dash_is_said_to_need_an_equals_sign(
    capsys, corpus, tmp_path, given, hint
):
    args = ["--negatives", f"{corpus}/negatives", "--model", tmp_path / "m.zarr", *given]
    code, _, err = run(capsys, "fit", *args)
    option = given[0]
    assert code == 2 and err.strip() == (
        f"slem-dask fit: error: argument {option}: expected one argument{hint} "
        f"(`slem-dask fit --help` lists the options)"
    ), err


def test_a_value_of_one_dash_that_the_option_takes_is_given_with_an_equals_sign(
    capsys, corpus, tmp_path
):
    model = tmp_path / "-m.zarr"
    code, _, err = run(capsys, "fit", "--negatives", f"{corpus}/negatives", "--model", model.name)
    assert code == 2 and err.strip() == (
        "slem-dask fit: error: argument --model: expected one argument; its value '-m.zarr' "
        "starts with '-' and was read as an option: write --model=-m.zarr (`slem-dask fit "
        "--help` lists the options)"
    ), err


def test_python_dash_m():
    result = subprocess.run(
        [sys.executable, "-m", "slem_dask", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.startswith("slem-dask ")


def test_evaluate_grid_marks_the_best(capsys, corpus, tmp_path):
    plot = tmp_path / "pr.png"
    code, out, err = run(
        capsys,
        "evaluate",
        "--corpus",
        corpus,
        "--methods",
        "raw,slem,kernel",
        "--lam",
        "1e-4,1e-1",
        "--gamma",
        "0.5",
        "--rank",
        "8,16",
        "--workers",
        "1",
        "--no-progress",
        "--plot",
        plot,
    )
    assert code == 0, err
    table = out[out.index("method  setting") :].splitlines()
    rows = [line.split() for line in table[2:] if line.strip()]
    by_method = {}
    for r in rows:
        by_method.setdefault(r[0], []).append(r)
    assert len(by_method["raw"]) == 1
    assert len(by_method["slem"]) == 2 and len(by_method["kernel"]) == 4
    for method, method_rows in by_method.items():
        maps = [
            float(next(v for v in r if v.replace(".", "").isdigit() and "." in v))
            for r in method_rows
        ]
        starred = [r[-1] == "*" for r in method_rows]
        assert sum(starred) == 1, method
        assert maps[starred.index(True)] == max(maps)
    assert plot.exists()


def test_grid_search_library_matches_evaluate_methods():
    from slem_dask.pipeline.evaluate import evaluate_methods, grid_search, parameter_grid

    c = make_corpus(n_negatives=400, n_instances=40, d=12, seed=5)
    rel = c.relevant()
    rows, best, _ = grid_search(
        c.negatives, c.database, c.queries, rel, {"slem": {"lam": [1e-4, 1e-2, 1.0]}, "raw": {}}
    )
    assert [r["setting"] for r in rows] == ["lam=0.0001", "lam=0.01", "lam=1", "defaults"]
    for r, lam in zip(rows[:3], [1e-4, 1e-2, 1.0], strict=True):
        (ref,), _ = evaluate_methods(
            c.negatives,
            c.database,
            c.queries,
            rel,
            ["slem"],
            params={"slem": {"lam": lam}},
            curves=False,
        )
        assert r["mAP"] == ref["mAP"]
    maps = [r["mAP"] for r in rows[:3]]
    assert best["slem"] == {"lam": [1e-4, 1e-2, 1.0][int(np.argmax(maps))]}
    assert [r["best"] for r in rows].count("*") == 2
    assert parameter_grid({"a": [1, 2], "b": 3}) == [{"a": 1, "b": 3}, {"a": 2, "b": 3}]
    assert parameter_grid(None) == [{}]
    with pytest.raises(ValueError, match="no values"):
        parameter_grid({"a": []})


def _negatives_store(tmp_path, n: int, seed: int) -> None:
    X = np.random.default_rng(seed).standard_normal((n, 6)).astype(np.float32)
    neg = zarr.create_array(
        store=str(tmp_path / "neg.zarr"), shape=X.shape, dtype=X.dtype, chunks=(64, 6)
    )
    neg[...] = X


def _kernel_fit(capsys, tmp_path, model: str, rank: int, *extra):
    """`fit --kernel rbf --rank RANK` of the _negatives_store into tmp_path/MODEL."""
    return run(
        capsys,
        "fit",
        "--negatives",
        tmp_path / "neg.zarr",
        "--model",
        tmp_path / model,
        "--kernel",
        "rbf",
        "--rank",
        rank,
        *extra,
    )


def test_kernel_fit_progress(capsys, tmp_path):
    _negatives_store(tmp_path, 300, seed=0)
    code, out, err = _kernel_fit(
        capsys,
        tmp_path,
        "k.zarr",
        20,
        "--pivoting",
        "rpcholesky",
        "--seed",
        "0",
        "--workers",
        "1",
        "--progress",
    )
    assert code == 0, err
    assert "kernel fit: pass 1," in out and "20 pivots" in out
    code, out, err = _kernel_fit(capsys, tmp_path, "k2.zarr", 20, "--workers", "1", "--no-progress")
    assert code == 0, err
    assert "kernel fit: pass" not in out


def test_rpcholesky_fits_without_seed_are_reproducible(capsys, tmp_path):
    """--seed defaults to 0 (as in job specs): two runs give the same model."""
    _negatives_store(tmp_path, 400, seed=1)
    prints = []
    for name in ("a.zarr", "b.zarr"):
        code, out, err = _kernel_fit(
            capsys, tmp_path, name, 24, "--pivoting", "rpcholesky", *IN_THREADS
        )
        assert code == 0, err
        prints.append(storage.open_node(str(tmp_path / name), mode="r").attrs["slem_dask"])
    assert prints[0]["seed"] == 0
    assert prints[0]["fingerprint"] == prints[1]["fingerprint"]


def test_an_array_where_a_group_is_expected_and_back_names_the_fix(
    capsys, corpus, tmp_path, monkeypatch
):
    """A corpus array given as the corpus or the model, the corpus group given as the
    negatives, a missing path: one line each that says what to give instead."""
    code, _, err = run(
        capsys,
        "evaluate",
        "--corpus",
        f"{corpus}/negatives",
        "--k",
        "3",
        *IN_THREADS,
    )
    said = "is a zarr array, not a corpus (a corpus is a zarr group); give the corpus group"
    assert code == 1 and f"{said} that holds it, {str(corpus)!r}" in err, err
    assert "ContainsArrayError" not in err
    code, _, err = run(
        capsys,
        "encode",
        "--model",
        f"{corpus}/negatives",
        "--positives",
        f"{corpus}/database",
        "--out",
        tmp_path / "o.zarr",
        *IN_THREADS,
    )
    assert code == 1 and "is a zarr array, not a model" in err, err
    assert "ContainsArrayError" not in err
    code, _, err = run(
        capsys,
        "fit",
        "--negatives",
        corpus,
        "--model",
        tmp_path / "m.zarr",
        *IN_THREADS,
    )
    assert code == 1 and f"e.g. {corpus}/negatives" in err, err
    code, _, err = run(
        capsys,
        "search",
        "--queries",
        tmp_path / "nope.zarr",
        "--database",
        f"{corpus}/database",
        "--k",
        "3",
        "--out",
        tmp_path / "s.zarr",
        *IN_THREADS,
    )
    assert code == 1 and "e.g. slem-demo/corpus.zarr/queries" in err, err
    (tmp_path / "demo" / "corpus.zarr").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "demo")  # in the demo's folder the example is relative to it
    code, _, err = run(
        capsys,
        "fit",
        "--negatives",
        "corpus.zarr/negative",
        "--model",
        tmp_path / "m.zarr",
        *IN_THREADS,
    )
    assert code == 1 and "e.g. corpus.zarr/negatives (written" in err, err


@pytest.mark.parametrize(
    "option,value", [("--lam", "-1e-3"), ("--theta", "-2"), ("--lam", "1e-3,-1e-2")]
)
def test_negative_numbers_reach_the_options_own_check(capsys, tmp_path, option, value):
    """argparse reads '-1e-3' as an option ("expected one argument"); the value's own
    check says what is allowed."""
    command = "evaluate" if "," in value else "fit"
    args = (
        ["--corpus", tmp_path / "c.zarr"]
        if command == "evaluate"
        else ["--negatives", tmp_path / "n.zarr", "--model", tmp_path / "m.zarr"]
    )
    code, _, err = run(capsys, command, *args, option, value)
    assert code == 2 and f"argument {option}: expected a finite number > 0" in err, err
    assert "expected one argument" not in err


def test_a_mistyped_option_is_reported_by_its_command_with_the_closest_one(capsys, tmp_path):
    code, _, err = run(
        capsys,
        "fit",
        "--negatives",
        tmp_path / "n.zarr",
        "--model",
        tmp_path / "m.zarr",
        "--lambda",
        "1e-3",
    )
    assert code == 2
    assert err == (
        "slem-dask fit: error: unrecognized arguments: --lambda 1e-3; did you mean --lam? "
        "(`slem-dask fit --help` lists the options)\n"
    ), err


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["search", "--queries", "q", "--database", "d", "--out", "o", "--metric", "dot"],
            "slem-dask search: error: argument --metric: invalid choice: 'dot' (choose from "
            "'ip', 'cosine', 'l2') (`slem-dask search --help` lists the options)",
        ),
        (
            ["encode", "--out", "o.zarr"],
            "slem-dask encode: error: the following arguments are required: --model, "
            "--positives (`slem-dask encode --help` lists the options)",
        ),
        (["frob"], "slem-dask: error: argument COMMAND: invalid choice: 'frob' (choose from "),
    ],
)
def test_a_malformed_command_line_is_one_line(capsys, argv, said):
    """argparse's usage block (8-13 lines) came first; now one line, like every error,
    naming the option, the value, what it takes, and where the options are listed."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(said), err


def test_kernel_defaults_have_one_source():
    # the library (gamma 0.1, random seed), fit --kernel (seed 0), job specs and evaluate
    # (gamma 0.5, rank 256, rpcholesky) each had their own kernel defaults (issue 39)
    from slem_dask import KernelSLEM
    from slem_dask.cli.parser import KERNEL_DEFAULTS as CLI
    from slem_dask.models.kernel_defaults import KERNEL_DEFAULTS
    from slem_dask.pipeline.evaluation import make_estimator
    from slem_dask.pipeline.fit import MODEL_KEYWORDS
    from slem_dask.pipeline.jobspec import ModelSpec

    library = KernelSLEM().get_params()
    assert {name: library[name] for name in KERNEL_DEFAULTS} == KERNEL_DEFAULTS
    assert make_estimator("kernel").get_params() == library
    names = ("gamma", "degree", "rank", "pivoting", "tol")
    expected = [library[n] for n in names] + [library["random_state"]]
    spec = ModelSpec(path="m.zarr", type="kernel")
    assert [getattr(spec, n) for n in names] + [spec.seed] == expected
    assert [CLI[n] for n in names] + [CLI["seed"]] == expected
    assert [MODEL_KEYWORDS[n] for n in names] + [MODEL_KEYWORDS["seed"]] == expected


@pytest.mark.parametrize("report", [False, True], ids=["no report", "a performance report"])
def test_the_workers_profile_tasks_only_for_a_performance_report(
    capsys, monkeypatch, corpus, tmp_path, report
):
    # the report's "Worker Profile" tab needs dask's task profile; without a report the
    # workers keep none (slem_dask.cluster.connect.NO_TASK_PROFILE)
    from slem_dask.cluster import connect as cluster_connect

    given, real = [], cluster_connect.connect

    def recording(*args, **kwargs):
        given.append(kwargs.get("task_profile", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(cluster_connect, "connect", recording)
    flags = ["--performance-report", str(tmp_path / "report.html")] if report else []
    code, _, err = run(
        capsys,
        "fit",
        "--negatives",
        f"{corpus}/negatives",
        "--model",
        tmp_path / "m.zarr",
        *IN_THREADS,
        *flags,
    )
    assert code == 0, err
    assert given == [report]
    assert (tmp_path / "report.html").exists() is report


@pytest.mark.parametrize("command", ["demo", "fit", "encode", "run", "search", "evaluate"])
def test_the_help_of_every_command_that_writes_a_store_names_its_lease_ttl(capsys, command):
    from slem_dask.storage.versioning.leases import DEFAULT_LEASE_TTL

    code, out, _ = run(capsys, command, "--help")
    out = " ".join(out.split())
    writes = command != "evaluate"  # evaluate reads, and writes no store
    assert code == 0
    assert ("renewed every quarter of $SLEM_DASK_LEASE_TTL" in out) == writes, out
    assert (f"(seconds, default {DEFAULT_LEASE_TTL:g})" in out) == writes, out
