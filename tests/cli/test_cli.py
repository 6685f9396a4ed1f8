"""The ``slem-dask`` command line: round trips equal the library, bad input writes nothing.

Most tests call ``slem_dask.cli.main.main`` in-process against one in-process dask
scheduler (``--scheduler ADDRESS``), so no worker processes start; one test
lets the CLI start its own LocalCluster, and one (slow) runs the installed
``slem-dask`` executable in a subprocess.
"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import zarr

from slem_dask import LinearSLEM, load_model, storage
from slem_dask.cli.main import main
from slem_dask.storage import canonical

from helpers import run_cli as run  # (exit code, stdout, stderr) of the CLI in-process

pytestmark = pytest.mark.usefixtures("no_scheduler_env")  # conftest.py

N, M, D = 300, 70, 12


def write_array(path, data, chunk_rows=32):
    arr = zarr.create_array(
        store=str(path),
        shape=data.shape,
        dtype=data.dtype,
        chunks=(max(1, min(chunk_rows, data.shape[0])),) + data.shape[1:],
    )
    arr[...] = data
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(7)
    X = (rng.standard_normal((N, D)) * rng.uniform(0.5, 2, D) + 3.0).astype(np.float32)
    P = (rng.standard_normal((M, D)) + 3.0).astype(np.float32)
    paths = {
        "X": X,
        "P": P,
        "negatives": write_array(root / "negatives.zarr", X, 64),
        "positives": write_array(root / "positives.zarr", P, 16),
    }
    model = root / "model.zarr"
    LinearSLEM(lam=0.01, theta=2.0).fit(X).save(str(model))
    paths["model"] = str(model)
    return paths


def fit_args(scheduler, negatives, model, *extra):
    """`fit` on ``scheduler`` (None: on the LocalCluster the command starts)."""
    on = ("--scheduler", scheduler) if scheduler else ()
    return ("fit", "--negatives", negatives, "--model", model, *on, "--no-progress", *extra)


def encode_args(scheduler, model, positives, out, *extra):
    """`encode` on ``scheduler`` (None: on the LocalCluster the command starts)."""
    on = ("--scheduler", scheduler) if scheduler else ()
    return (
        "encode",
        "--model",
        model,
        "--positives",
        positives,
        "--out",
        out,
        *on,
        "--no-progress",
        *extra,
    )


# -- round trips ---------------------------------------------------------------
def test_fit_round_trip(scheduler, corpus, tmp_path, capsys):
    model_path = str(tmp_path / "model.zarr")
    code, out, err = run(
        capsys,
        *fit_args(
            scheduler,
            corpus["negatives"],
            model_path,
            "--lam",
            "0.01",
            "--theta",
            "2",
            "--partition-rows",
            "50",
            "--precision",
            "float64",
        ),
    )
    assert code == 0, err
    assert "fit:" in out and "fingerprint" in out
    got = load_model(model_path)
    want = LinearSLEM(lam=0.01, theta=2.0, precision="float64").fit(corpus["X"])
    assert got.get_params() == {"lam": 0.01, "theta": 2.0, "precision": "float64"}
    for name in ("mean_", "covariance_", "precision_"):
        a, b = getattr(got, name), getattr(want, name)
        assert np.linalg.norm(a - b) <= 1e-12 * np.linalg.norm(b), name
    assert (got.n_samples_, got.n_features_in_, got.input_dtype_) == (N, D, "float32")
    meta = storage.open_node(model_path, mode="r").attrs[storage.ATTR]
    assert meta["source"] == canonical(corpus["negatives"]).url
    assert sorted(os.listdir(tmp_path)) == ["model.zarr"]


def test_encode_round_trip_float32(scheduler, corpus, tmp_path, capsys):
    out_path = str(tmp_path / "codes.zarr")
    code, out, err = run(
        capsys,
        *encode_args(
            scheduler, corpus["model"], corpus["positives"], out_path, "--partition-rows", "20"
        ),
    )
    assert code == 0, err
    model = load_model(corpus["model"])
    arr = storage.open_output(out_path)
    assert arr.dtype == np.float32 and arr.shape == (M, D)
    want = model.transform(corpus["P"])
    np.testing.assert_allclose(arr[...], want, rtol=0, atol=1.5e-7)  # float32 rounding
    meta = arr.attrs[storage.ATTR]
    assert meta["complete"] is True
    assert meta["kind"] == "encoding"
    assert meta["model_fingerprint"] == model.fingerprint_
    assert meta["params"] == {"lam": 0.01, "theta": 2.0, "precision": "auto"}
    assert meta["model"] == "LinearSLEM" and meta["n_rows"] == M
    assert meta["source"] == canonical(corpus["positives"]).url


def test_encode_round_trip_float64(scheduler, corpus, tmp_path, capsys):
    out_path = str(tmp_path / "codes.zarr")
    code, _, err = run(
        capsys,
        *encode_args(
            scheduler, corpus["model"], corpus["positives"], out_path, "--dtype", "float64"
        ),
    )
    assert code == 0, err
    arr = storage.open_output(out_path)
    assert arr.dtype == np.float64
    want = load_model(corpus["model"]).transform(corpus["P"], dtype=np.float64)
    np.testing.assert_allclose(arr[...], want, rtol=1e-13, atol=1e-15)


def test_overwrite_replaces(scheduler, corpus, tmp_path, capsys):
    out_path = str(tmp_path / "codes.zarr")
    assert (
        run(capsys, *encode_args(scheduler, corpus["model"], corpus["positives"], out_path))[0] == 0
    )
    code, _, err = run(
        capsys,
        *encode_args(
            scheduler,
            corpus["model"],
            corpus["positives"],
            out_path,
            "--dtype",
            "float64",
            "--overwrite",
        ),
    )
    assert code == 0, err
    assert storage.open_output(out_path).dtype == np.float64
    model_path = str(tmp_path / "model.zarr")
    assert run(capsys, *fit_args(scheduler, corpus["negatives"], model_path))[0] == 0
    code, _, err = run(
        capsys, *fit_args(scheduler, corpus["negatives"], model_path, "--lam", "0.5", "--overwrite")
    )
    assert code == 0, err
    assert load_model(model_path).lam == 0.5
    assert sorted(os.listdir(tmp_path)) == ["codes.zarr", "model.zarr"]


def test_a_scheduler_without_workers_is_said_so_at_the_start(corpus, tmp_path, capsys, monkeypatch):
    """The start line said "with 0 worker(s)" and nothing more, and the job then waited
    without a word for 60 s (the watchdog's stall line); it now says what to start."""
    from distributed import LocalCluster

    from helpers import one_worker_once_none_listed

    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster:
        # the start line asks first; a worker then joins
        listed = one_worker_once_none_listed(cluster, storage.listed_workers)
        monkeypatch.setattr(storage, "listed_workers", listed)
        address = cluster.scheduler_address
        code, out, err = run(
            capsys, *fit_args(address, corpus["negatives"], str(tmp_path / "m.zarr"))
        )
    assert code == 0, err
    start = next(line for line in out.splitlines() if line.startswith("dask: "))
    assert "with 0 worker(s) (none connected yet: nothing runs until one does; start " in start
    assert f"`dask worker {address}`" in start  # to paste as it is


def test_cli_starts_its_own_local_cluster(corpus, tmp_path, capsys):
    model_path = str(tmp_path / "model.zarr")
    code, out, err = run(
        capsys,
        *fit_args(
            None,
            corpus["negatives"],
            model_path,
            "--workers",
            "1",
            "--threads-per-worker",
            "2",
            "--lam",
            "0.01",
        ),
    )
    assert code == 0, err
    assert "with 1 worker(s)" in out
    # float32 negatives, blocks in float32: the precision contract (1e-5, max relative)
    # against float64 arithmetic on the same values
    got = load_model(model_path)
    want = LinearSLEM(lam=0.01, precision="float64").fit(corpus["X"])
    scale = np.abs(want.covariance_).max()
    assert np.abs(got.covariance_ - want.covariance_).max() <= 1e-5 * scale
    np.testing.assert_allclose(got.mean_, want.mean_, rtol=1e-12)


def test_ctrl_c_while_the_cluster_closes_reports_the_finished_job(
    corpus, tmp_path, capsys, monkeypatch
):
    # The job has written its model; a Ctrl-C then, while the cluster shuts down, must
    # not say that nothing was written.
    import contextlib

    from slem_dask.cluster import connect as cluster

    real_connect = cluster.connect

    @contextlib.contextmanager
    def interrupted_on_close(*args, **kwargs):
        with real_connect(*args, **kwargs) as client:
            yield client
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster, "connect", interrupted_on_close)
    model_path = str(tmp_path / "model.zarr")
    code, out, err = run(capsys, *fit_args(None, corpus["negatives"], model_path, "--lam", "0.01"))
    assert code == 130
    assert "after the job had finished" in err and "nothing was marked complete" not in err
    assert "fingerprint" in out  # the fit's report is printed
    assert main(["verify", model_path]) == 0


def test_ctrl_c_after_an_encode_marked_its_output_complete_says_so(
    scheduler, corpus, tmp_path, capsys, monkeypatch
):
    # The interrupt lands after the output is marked complete, before the job returns.
    from slem_dask import pipeline

    real_encode = pipeline.encode_job

    def interrupted_at_return(*args, **kwargs):
        real_encode(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "encode_job", interrupted_at_return)
    out_path = str(tmp_path / "codes.zarr")
    code, _, err = run(
        capsys, *encode_args(scheduler, corpus["model"], corpus["positives"], out_path)
    )
    assert code == 130
    assert err == (
        f"slem-dask encode: interrupted after the output was finished: "
        f"{out_path!r} is complete (`slem-dask verify {out_path}` checks it again)\n"
    )
    assert main(["verify", out_path]) == 0


def _interrupted_after(monkeypatch, module, name):
    """``module.name`` made to run whole, then meet a Ctrl-C before it returns."""
    real = getattr(module, name)

    def interrupted_at_return(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(module, name, interrupted_at_return)


def test_ctrl_c_after_a_fit_search_or_rollback_committed_says_so(
    scheduler, corpus, tmp_path, capsys, monkeypatch
):
    """The interrupt lands after the job's commit, before it returns: its line names
    the version committed (they said "nothing was marked complete (no model or output
    was written)", as encode did before it looked); before the commit it says that."""
    from slem_dask import pipeline
    from slem_dask.storage.versioning import versions

    model = str(tmp_path / "model.zarr")
    with monkeypatch.context() as patch:
        _interrupted_after(patch, pipeline, "fit_job")
        code, _, err = run(capsys, *fit_args(scheduler, corpus["negatives"], model))
    assert code == 130 and err == (
        f"slem-dask fit: interrupted after its commit: {model!r} holds the new version 1 "
        f"(`slem-dask verify {model}` checks it; `slem-dask versions {model}` lists it)\n"
    ), err
    assert main(["verify", model]) == 0
    capsys.readouterr()
    hits = str(tmp_path / "hits.zarr")
    search = ("search", "--queries", corpus["positives"], "--database", corpus["positives"])
    with monkeypatch.context() as patch:
        _interrupted_after(patch, pipeline, "search_job")
        code, _, err = run(capsys, *search, "--k", "5", "--out", hits, "--scheduler", scheduler)
    assert (
        code == 130 and f"interrupted after its commit: {hits!r} holds the new version 1" in err
    ), err
    assert (
        run(
            capsys,
            "fit",
            "--negatives",
            corpus["negatives"],
            "--model",
            model,
            "--overwrite",
            "--lam",
            "0.5",
            "--scheduler",
            scheduler,
        )[0]
        == 0
    )
    with monkeypatch.context() as patch:
        _interrupted_after(patch, versions.VersionedStore, "rollback")
        code, _, err = run(capsys, "rollback", model, "--to", "1")
    assert code == 130 and f"interrupted after its commit: {model!r} holds the new version 3" in err
    with monkeypatch.context() as patch:  # interrupted before its commit: as before
        patch.setattr(pipeline, "fit_job", _raise_interrupt)
        code, _, err = run(capsys, *fit_args(scheduler, corpus["negatives"], model, "--overwrite"))
    assert code == 130 and err.endswith(
        "interrupted; nothing was marked complete (no model or output was written)\n"
    ), err


def _raise_interrupt(*args, **kwargs):
    raise KeyboardInterrupt


_INTERRUPT_IN_IMPORTS = """
import sys

class Interrupt:  # Ctrl-C while that module is first imported
    def find_spec(self, name, path=None, target=None):
        if name == "distributed":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, Interrupt())
from slem_dask.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "module, said",
    [
        ("numpy", "slem-dask: interrupted before any job started\n"),  # building the parser
        (
            "distributed",
            "slem-dask fit: interrupted; nothing was marked complete (no model or "
            "output was written)\n",
        ),
    ],
)
def test_ctrl_c_during_the_first_imports_is_one_line(tmp_path, module, said):
    import subprocess
    import sys

    model_path = str(tmp_path / "model.zarr")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _INTERRUPT_IN_IMPORTS.replace('"distributed"', repr(module)),
            "fit",
            "--negatives",
            str(tmp_path / "x.zarr"),
            "--model",
            model_path,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr == said
    assert not os.path.exists(model_path)


def test_the_package_imports_dask_and_zarr_only_when_used():
    # `slem-dask --help` and `import slem_dask` stay fast; every public name still works
    import subprocess
    import sys

    check = (
        "import sys, slem_dask\n"
        "heavy = sorted(m for m in ('dask.array', 'zarr', 'scipy.linalg', 'distributed') "
        "if m in sys.modules)\n"
        "from slem_dask import LinearSLEM, search\n"
        "assert all(getattr(slem_dask, n) is not None for n in slem_dask.__all__)\n"
        "assert set(slem_dask.__all__) <= set(dir(slem_dask))\n"
        "assert slem_dask.storage.__name__ == 'slem_dask.storage'\n"
        "print(heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_executable_skips_xarray_and_pandas_which_main_keeps(tmp_path):
    # dask.array imports xarray (and pandas) when installed: 0.3 s of every command.
    # The executable's process skips them; main() called from Python does not.
    import subprocess
    import sys

    pytest.importorskip("xarray")
    run = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(m for m in ('xarray', 'pandas', 'dask.array') "
        "if m in sys.modules), flush=True))\n"
        "from slem_dask.cli import main as cli\n"
        "sys.argv = ['slem-dask'] + sys.argv[1:]\n"
        "cli.{}()\n"
    )
    fit = ["fit", "--negatives", str(tmp_path / "absent.zarr"), "--model", str(tmp_path / "m")]
    for entry, args, loaded in (
        ("console_main", fit, "['dask.array']"),
        ("main", fit, "['dask.array', 'pandas', 'xarray']"),
        ("console_main", ["fit", "--help"], "[]"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", run.format(entry), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        said = done.stdout.strip().splitlines()
        assert said[-1] == loaded, (entry, args, done.stderr)
        if args is fit:  # the command ran, and failed on its input
            assert "absent.zarr" in done.stderr


@pytest.mark.cluster
def test_local_worker_processes_do_not_get_ctrl_c(corpus):
    # Ctrl-C reaches the whole process group: workers still importing printed a
    # traceback each. They start with SIGINT blocked; this process gets it back.
    import signal

    from slem_dask.cluster.connect import connect

    def blocked():
        import signal

        return signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())

    with connect(n_workers=2, threads_per_worker=1) as client:
        assert all(client.run(blocked).values())
        assert not blocked()
        client.restart()  # a worker the nanny starts again is covered too
        assert all(client.run(blocked).values())
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_small_inputs_run_on_an_in_process_cluster(corpus, tmp_path, capsys, monkeypatch):
    # worker processes take longer to start than a small job takes to run
    from distributed import LocalCluster

    started = []
    real_init = LocalCluster.__init__

    def spy(self, *args, **kwargs):
        started.append(kwargs.get("processes"))
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(LocalCluster, "__init__", spy)
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    model_path = str(tmp_path / "model.zarr")
    code, out, err = run(capsys, *fit_args(None, corpus["negatives"], model_path, "--lam", "0.01"))
    assert code == 0, err
    assert started == [False]
    assert "in this process" in out and "--local-cluster processes" in out
    want = LinearSLEM(lam=0.01, precision="float64").fit(corpus["X"])
    got = load_model(model_path)
    assert np.abs(got.covariance_ - want.covariance_).max() <= 1e-5 * np.abs(want.covariance_).max()
    # asked for by name: threads even for a large input, processes even for a small one
    codes = str(tmp_path / "codes.zarr")
    code, out, err = run(
        capsys,
        *encode_args(None, model_path, corpus["positives"], codes, "--local-cluster", "threads"),
    )
    assert code == 0, err
    assert started == [False, False] and "--local-cluster threads" in out
    code, out, err = run(
        capsys,
        *encode_args(
            None,
            model_path,
            corpus["positives"],
            codes,
            "--local-cluster",
            "processes",
            "--workers",
            "1",
            "--overwrite",
        ),
    )
    assert code == 0, err
    first = out.splitlines()[0]
    assert started[-1] is True and "(local worker processes: --local-cluster processes)" in first


@pytest.mark.slow
def test_installed_executable_round_trip(corpus, tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "slem-dask")
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    common = ["--workers", "1", "--threads-per-worker", "1"]

    def run_exe(*args):
        return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=300)

    model_path, out_path = str(tmp_path / "model.zarr"), str(tmp_path / "codes.zarr")
    fit = run_exe(
        *fit_args(None, corpus["negatives"], model_path, "--lam", "0.01", "--theta", "2", *common)
    )
    assert fit.returncode == 0, fit.stderr
    enc = run_exe(*encode_args(None, model_path, corpus["positives"], out_path, *common))
    assert enc.returncode == 0, enc.stderr
    model = load_model(model_path)
    want = LinearSLEM(lam=0.01, precision="float64").fit(corpus["X"])  # the 1e-5 contract
    assert (
        np.abs(model.covariance_ - want.covariance_).max() <= 1e-5 * np.abs(want.covariance_).max()
    )
    np.testing.assert_allclose(
        storage.open_output(out_path)[...], model.transform(corpus["P"]), rtol=0, atol=1.5e-7
    )
    bad = run_exe(
        *fit_args(None, str(tmp_path / "missing.zarr"), str(tmp_path / "m2.zarr"), *common)
    )
    assert bad.returncode != 0 and "no zarr array at" in bad.stderr
    assert not os.path.exists(tmp_path / "m2.zarr")


# -- bad input: non-zero exit, a message naming the problem, nothing written ----
@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    rng = np.random.default_rng(3)
    (root / "plain").mkdir()
    (root / "file.txt").write_text("not zarr")
    group = zarr.open_group(store=str(root / "group.zarr"), mode="w")
    group.create_array("negatives", shape=(4, D), dtype="f4")
    nan_rows = rng.standard_normal((40, D)).astype(np.float32)
    nan_rows[[3, 30], 1] = np.nan
    inf_rows = rng.standard_normal((40, D))
    inf_rows[[5, 6, 7], 0] = np.inf
    foreign = zarr.open_group(store=str(root / "foreign.zarr"), mode="w")
    for name in ("mean", "covariance", "precision"):
        foreign.create_array(name, shape=(D,), dtype="f8")
    return {
        "missing": str(root / "missing.zarr"),
        "plain": str(root / "plain"),
        "file": str(root / "file.txt"),
        "group": str(root / "group.zarr"),
        "1-D": write_array(root / "one.zarr", np.ones(10)),
        "3-D": write_array(root / "three.zarr", np.ones((5, D, 2))),
        "one row": write_array(root / "onerow.zarr", np.ones((1, D))),
        "empty": write_array(root / "empty.zarr", np.ones((0, D))),
        "no features": write_array(root / "nofeat.zarr", np.ones((5, 0))),
        "nan": write_array(root / "nan.zarr", nan_rows, 8),
        "inf": write_array(root / "inf.zarr", inf_rows, 8),
        "wrong d": write_array(root / "wrongd.zarr", np.ones((6, D + 1))),
        "foreign model": str(root / "foreign.zarr"),
    }


INPUT_ERRORS = {
    "missing": "no zarr array at",
    "plain": "no zarr array at",
    "file": "no zarr array at",
    "group": "is a zarr group, not an array",
    "1-D": r"\(1-D\); expected a 2-D array .*x\.reshape\(1, -1\)",
    "3-D": r"\(3-D\); expected a 2-D array .*reshape\(len\(x\), -1\)",
}


@pytest.mark.parametrize(
    "kind", list(INPUT_ERRORS) + ["one row", "empty", "no features", "nan", "inf"]
)
def test_fit_bad_negatives(scheduler, bad_inputs, tmp_path, capsys, kind):
    messages = {
        **INPUT_ERRORS,
        "one row": "at least 2 rows",
        "empty": "has no rows",
        "no features": r"has no features \(columns\)",
        "nan": r"2 row\(s\) with NaN or inf \(rows 3, 30\) out of 40",
        "inf": r"3 row\(s\) with NaN or inf \(rows 5, 6, 7\) out of 40",
    }
    model_path = tmp_path / "model.zarr"
    code, _, err = run(capsys, *fit_args(scheduler, bad_inputs[kind], model_path))
    assert code != 0
    assert err.startswith("slem-dask fit: error: negatives"), err
    if kind in ("nan", "inf"):  # the message names the input path, not the estimator's "X"
        assert str(bad_inputs[kind]) in err, err
        assert "X has" not in err, err
    assert re.search(messages[kind], err), err
    assert os.listdir(tmp_path) == []


# 0-row positives are no error: their encoding is an empty output (test_operator_messages.py)
@pytest.mark.parametrize("kind", list(INPUT_ERRORS) + ["no features", "wrong d"])
def test_encode_bad_positives(scheduler, corpus, bad_inputs, tmp_path, capsys, kind):
    messages = {
        **INPUT_ERRORS,
        "no features": r"has no features \(columns\)",
        "wrong d": f"{D + 1} features, but the model .* is expecting {D} features",
    }
    out_path = tmp_path / "codes.zarr"
    code, _, err = run(capsys, *encode_args(scheduler, corpus["model"], bad_inputs[kind], out_path))
    assert code != 0
    assert err.startswith("slem-dask encode: error: positives")
    assert re.search(messages[kind], err), err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind,rows", [("nan", "2"), ("inf", "3")])
def test_encode_nonfinite_rows_found_mid_run_leave_no_output(
    scheduler, bad_inputs, tmp_path, capsys, kind, rows
):
    X = np.random.default_rng(0).standard_normal((50, D))
    model_path = str(tmp_path / "model.zarr")
    LinearSLEM().fit(X).save(model_path)
    out_path = tmp_path / "codes.zarr"
    code, _, err = run(
        capsys,
        *encode_args(scheduler, model_path, bad_inputs[kind], out_path, "--partition-rows", "8"),
    )
    assert code != 0
    # named by the store, not by the estimator's parameter ("X has ..."); every such row
    # counted, in whichever of the 5 partitions it is (nan: rows 3 and 30, in partitions
    # 0 and 3), not only those of the task that failed first (a newcomer fixed one row,
    # then met the next)
    prefix = f"slem-dask encode: error: positives {str(bad_inputs[kind])!r}: "
    assert err.startswith(prefix), err
    found = {
        "nan": r"2 row\(s\) with NaN or inf \(rows 3, 30\);",
        "inf": r"3 row\(s\) with NaN or inf \(rows 5, 6, 7\);",
    }
    assert re.match(found[kind], err[len(prefix) :]), err
    assert "other blocks may hold more" not in err, err
    assert not out_path.exists()
    assert sorted(os.listdir(tmp_path)) == ["model.zarr"]


def test_nonfinite_rows_error_keeps_its_detail_across_processes():
    # raised on a worker, it reaches the job through pickle
    import pickle

    from slem_dask.core.validation import NonFiniteRowsError

    exc = pickle.loads(pickle.dumps(NonFiniteRowsError("P", "1 row(s) with NaN or inf")))
    assert isinstance(exc, ValueError)
    assert (str(exc), exc.detail) == ("P has 1 row(s) with NaN or inf", "1 row(s) with NaN or inf")


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--lam", "abc"),
        ("--lam", "-1"),
        ("--lam", "0"),
        ("--lam", "nan"),
        ("--lam", "inf"),
        ("--theta", "-2"),
        ("--theta", "x"),
        ("--partition-rows", "0"),
        ("--partition-rows", "1.5"),
    ],
)
def test_fit_bad_numbers(scheduler, corpus, tmp_path, capsys, flag, value):
    code, _, err = run(
        capsys, *fit_args(scheduler, corpus["negatives"], tmp_path / "m.zarr", flag, value)
    )
    assert code not in (0, None)
    assert f"argument {flag}" in err and repr(value) in err, err
    assert os.listdir(tmp_path) == []


def test_encode_bad_dtype(scheduler, corpus, tmp_path, capsys):
    code, _, err = run(
        capsys,
        *encode_args(
            scheduler, corpus["model"], corpus["positives"], tmp_path / "o.zarr", "--dtype", "int8"
        ),
    )
    assert code not in (0, None) and "argument --dtype" in err
    assert os.listdir(tmp_path) == []


def test_fit_refuses_existing_model(scheduler, corpus, tmp_path, capsys):
    model_path = str(tmp_path / "model.zarr")
    LinearSLEM(lam=0.7).fit(corpus["X"]).save(model_path)
    before = load_model(model_path).fingerprint_
    code, _, err = run(capsys, *fit_args(scheduler, corpus["negatives"], model_path))
    assert code != 0 and "already exists" in err and "--overwrite" in err
    assert load_model(model_path).fingerprint_ == before
    assert os.listdir(tmp_path) == ["model.zarr"]


def test_encode_refuses_existing_output(scheduler, corpus, tmp_path, capsys):
    out_path = str(tmp_path / "codes.zarr")
    write_array(out_path, np.zeros((3, 3)))
    code, _, err = run(
        capsys, *encode_args(scheduler, corpus["model"], corpus["positives"], out_path)
    )
    assert code != 0 and "already exists" in err and "--overwrite" in err
    np.testing.assert_array_equal(storage.open_node(out_path, mode="r")[...], 0.0)


def test_encode_into_a_folder_slem_dask_did_not_write_says_so_as_fit_does(
    scheduler, corpus, tmp_path, capsys
):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    code, _, err = run(
        capsys, *encode_args(scheduler, corpus["model"], corpus["positives"], str(folder))
    )
    assert code != 0 and "was not written by slem-dask" in err, err
    assert "never deletes what it did not write, even with --overwrite" in err, err
    assert os.listdir(folder) == ["notes.txt"]
    (folder / "notes.txt").unlink()  # an empty folder: no store to replace (`mkdir out`)
    code, _, err = run(
        capsys, *encode_args(scheduler, corpus["model"], corpus["positives"], str(folder))
    )
    assert code == 0, err
    assert storage.verify(str(folder)) == ("output, version 1", [])


def test_an_empty_folder_is_no_store_to_replace_for_fit_encode_and_search(
    scheduler, corpus, tmp_path, capsys
):
    """`mkdir out` before a job: fit, encode and search write into the empty folder
    without --overwrite (an object store's empty prefix does not exist either), and a
    second run finds what the first wrote."""
    model, out, hits = (tmp_path / n for n in ("model.zarr", "out.zarr", "hits.zarr"))
    for folder in (model, out, hits):
        folder.mkdir()
    fit = ["fit", "--negatives", corpus["negatives"], "--model", str(model)]
    fit += ["--scheduler", scheduler]
    assert run(capsys, *fit)[0] == 0
    assert run(capsys, *encode_args(scheduler, str(model), corpus["positives"], str(out)))[0] == 0
    search = ["search", "--queries", str(out), "--database", str(out), "--k", "3"]
    search += ["--out", str(hits), "--scheduler", scheduler]
    assert run(capsys, *search)[0] == 0
    assert [storage.verify(str(p))[1] for p in (model, out, hits)] == [[], [], []]
    code, _, err = run(capsys, *fit)
    assert code == 1 and "already exists, fitted on these negatives" in err, err


def test_encode_bad_models(scheduler, corpus, bad_inputs, tmp_path, capsys):
    tampered = str(tmp_path / "tampered.zarr")
    LinearSLEM().fit(corpus["X"]).save(tampered)
    group = storage.open_node(tampered, mode="r+")
    group["mean"][0] = group["mean"][0] + 1.0
    cases = {
        bad_inputs["missing"]: "no zarr store at",
        bad_inputs["foreign model"]: "not written by slem-dask",
        bad_inputs["1-D"]: "model: ",
        tampered: "do not match their recorded SHA-256",  # an encode reads mean and A^-1 alone
    }
    for model_path, message in cases.items():
        out_path = tmp_path / "codes.zarr"
        code, _, err = run(
            capsys, *encode_args(scheduler, model_path, corpus["positives"], out_path)
        )
        assert code != 0
        assert err.startswith("slem-dask encode: error: model"), err
        assert message in err, err
        assert not out_path.exists()


def test_missing_required_arguments(capsys):
    code, _, err = run(capsys, "fit", "--negatives", "x.zarr")
    assert code == 2 and "--model" in err
    code, _, err = run(capsys)
    assert code == 2


def test_the_first_line_names_where_the_worker_processes_came_from():
    from slem_dask.cli.main import _local_processes, build_parser

    parser = build_parser()
    from_spec = parser.parse_args(["run", "spec.toml"])
    assert _local_processes(from_spec, None, 2, 1) == (
        True,
        "workers/threads_per_worker set in the spec's [cluster]",
    )
    given = parser.parse_args(["run", "spec.toml", "--workers", "2"])
    assert _local_processes(given, None, 2, None) == (True, "--workers/--threads-per-worker given")


def test_fit_and_encode_reports_name_the_model_by_the_same_identity(
    scheduler, corpus, tmp_path, capsys
):
    """encode's report said "fingerprint" for the model's identity, while fit's said it
    for the arrays' fingerprint (two numbers for one model, under one label)."""
    import re

    model_path, out_path = str(tmp_path / "model.zarr"), str(tmp_path / "codes.zarr")
    code, fitted, err = run(capsys, *fit_args(scheduler, corpus["negatives"], model_path))
    assert code == 0, err
    said = [fitted]
    for _ in range(2):  # encoded, then up to date
        code, out, err = run(
            capsys, *encode_args(scheduler, model_path, corpus["positives"], out_path)
        )
        assert code == 0, err
        said.append(out)
    identity = load_model(model_path).identity_[:16]
    for out in said:
        assert re.findall(r"model identity\s+(\S+)", out) == [identity], out
    assert "up to date" in said[2]
    fingerprint = re.findall(r"\bfingerprint\s+(\S+)", fitted)
    assert fingerprint == [load_model(model_path).fingerprint_[:16]] != [identity], fitted
    assert not re.findall(r"\bfingerprint\s", said[1] + said[2])


def test_every_command_commits_under_its_own_name(scheduler, corpus, tmp_path, capsys):
    """`slem-dask versions` (and a lost race's refusal) name the job that committed a
    version: fit and search committed as "write model store" and "write search result",
    where encode's commits read "slem-dask encode" (a new user's finding, stop 54)."""
    model_path, codes = str(tmp_path / "model.zarr"), str(tmp_path / "codes.zarr")
    hits = str(tmp_path / "hits.zarr")
    assert run(capsys, *fit_args(scheduler, corpus["negatives"], model_path))[0] == 0
    assert run(capsys, *encode_args(scheduler, model_path, corpus["positives"], codes))[0] == 0
    search = ["search", "--queries", codes, "--database", codes, "--k", "3", "--out", hits]
    assert run(capsys, *search, "--scheduler", scheduler, "--no-progress")[0] == 0
    for path, command in [(model_path, "fit"), (codes, "encode"), (hits, "search")]:
        assert storage.VersionedStore(path).head().job == f"slem-dask {command}", path
