"""Kernel SLEM through the zarr jobs and the ``slem-dask`` command line."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from slem_dask import KernelSLEM, load_model
from slem_dask.pipeline import encode_job, fit_job
from slem_dask.storage import open_output


def _write(path, data, chunk):
    arr = zarr.create_array(
        store=str(path), shape=data.shape, dtype=data.dtype, chunks=(chunk, data.shape[1])
    )
    arr[...] = data
    return str(path)


@pytest.fixture
def stores(tmp_path, rng):
    X = rng.standard_normal((300, 8)).astype(np.float32)
    P = rng.standard_normal((45, 8)).astype(np.float32)
    return X, P, _write(tmp_path / "neg.zarr", X, 64), _write(tmp_path / "pos.zarr", P, 16)


@pytest.mark.filterwarnings("ignore::slem_dask.models.kernel.TraceErrorWarning")  # rank 3
def test_a_kernel_fit_without_progress_bars_prints_where_it_stands(
    tmp_path, stores, capsys, monkeypatch
):
    # a fit without --rank ran thousands of silent passes in a log or a batch job
    from slem_dask.pipeline import kernel_fit

    monkeypatch.setattr(kernel_fit, "ROUND_LINE_SECONDS", 0.0)
    X, P, neg, pos = stores
    fit_job(
        None,
        neg,
        str(tmp_path / "m.zarr"),
        kernel="rbf",
        gamma=0.2,
        rank=None,  # the default is 1024 now (issue 39): the case of no rank at all
        tol=0.3,
        progress=False,
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 2 and lines[0].startswith("kernel fit: pass 1, 0 pivots")
    assert all(
        line.endswith("(no --rank: until it is below --tol 0.3; --rank R bounds the passes)")
        for line in lines
    ), lines
    fit_job(
        None,
        neg,
        str(tmp_path / "m.zarr"),
        kernel="rbf",
        gamma=0.2,
        rank=3,
        tol=0.0,
        overwrite=True,
        progress=False,
    )
    assert (
        capsys.readouterr().out.splitlines()[-1].endswith("(until 3 pivots or it is below --tol 0)")
    )


@pytest.mark.parametrize("pivoting", ["greedy", "rpcholesky"])
def test_fit_and_encode_jobs(tmp_path, stores, pivoting):
    X, P, neg, pos = stores
    model_path = str(tmp_path / "model.zarr")
    report = fit_job(
        None,
        neg,
        model_path,
        lam=1e-2,
        kernel="rbf",
        gamma=0.2,
        rank=20,
        pivoting=pivoting,
        tol=0.0,
        seed=3,
        partition_rows=100,
    )
    assert report.facts["pivots"] == 20 and report.facts["partitions"] == 3
    model = load_model(model_path)
    assert isinstance(model, KernelSLEM) and model.rank_ == 20
    ref = KernelSLEM(
        kernel="rbf", gamma=0.2, rank=20, lam=1e-2, tol=0.0, pivoting=pivoting, random_state=3
    ).fit(X)
    if pivoting == "greedy":  # rpcholesky pivots depend on the chunking
        np.testing.assert_array_equal(model.pivots_, ref.pivots_)
    out = str(tmp_path / "codes.zarr")
    encode_job(None, model_path, pos, out, dtype="float64", partition_rows=16)
    codes = open_output(out)
    assert codes.shape == (45, 20)
    np.testing.assert_allclose(codes[...], model.transform(P), atol=1e-12)
    # the same command again finds the output up to date
    again = encode_job(None, model_path, pos, out, dtype="float64", partition_rows=16)
    assert again.facts["action"] == "up to date"
    with pytest.raises(FileExistsError, match="already exists"):
        fit_job(None, neg, model_path, kernel="rbf", rank=5)


def test_fit_job_rejects_bad_kernel_params_before_reading(tmp_path):
    with pytest.raises(ValueError, match="gamma"):
        fit_job(
            None, str(tmp_path / "missing.zarr"), str(tmp_path / "m.zarr"), kernel="rbf", gamma=-1.0
        )
    with pytest.raises(ValueError, match="kernel must be one of"):
        fit_job(None, str(tmp_path / "missing.zarr"), str(tmp_path / "m.zarr"), kernel="nope")


def test_cli_parses_kernel_options():
    from slem_dask.cli.main import build_parser

    args = build_parser().parse_args(
        [
            "fit",
            "--negatives",
            "n.zarr",
            "--model",
            "m.zarr",
            "--kernel",
            "poly",
            "--gamma",
            "0.5",
            "--degree",
            "3",
            "--rank",
            "64",
            "--pivoting",
            "rpcholesky",
            "--tol",
            "0",
            "--seed",
            "7",
        ]
    )
    assert (
        args.kernel,
        args.gamma,
        args.degree,
        args.rank,
        args.pivoting,
        args.tol,
        args.seed,
    ) == ("poly", 0.5, 3, 64, "rpcholesky", 0.0, 7)
    for bad in (["--tol", "1"], ["--rank", "0"], ["--kernel", "gauss"], ["--gamma", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["fit", "--negatives", "n", "--model", "m", *bad])


@pytest.mark.cluster
def test_cli_fit_encode_end_to_end(tmp_path, stores, capsys):
    from slem_dask.cli.main import main

    X, P, neg, pos = stores
    model_path, out = str(tmp_path / "k.zarr"), str(tmp_path / "codes.zarr")
    cluster = ["--workers", "2", "--threads-per-worker", "1", "--no-progress"]
    assert (
        main(
            [
                "fit",
                "--negatives",
                neg,
                "--model",
                model_path,
                "--kernel",
                "rbf",
                "--gamma",
                "0.2",
                "--rank",
                "16",
                "--pivoting",
                "rpcholesky",
                "--seed",
                "1",
                "--tol",
                "0",
                *cluster,
            ]
        )
        == 0
    )
    assert main(["encode", "--model", model_path, "--positives", pos, "--out", out, *cluster]) == 0
    model = load_model(model_path)
    assert model.rank_ == 16 and model.seed_ == 1
    codes = open_output(out)
    assert codes.shape == (45, 16) and codes.dtype == np.float32
    np.testing.assert_allclose(codes[...], model.transform(P), rtol=1e-5, atol=1e-6)
    assert "trace error" in capsys.readouterr().out


def test_demo_has_a_kernel_row(tmp_path):
    from slem_dask.pipeline import demo_job

    rows, reports = demo_job(
        None, workdir=str(tmp_path / "demo"), n_negatives=3000, n_instances=100, d=32
    )
    by_method = {row["method"]: row["mAP"] for row in rows}
    assert by_method["rbf kernel SLEM"] > by_method["raw features"] + 0.05, by_method
    fits = [r for r in reports if r.name == "fit"]
    from slem_dask.models.kernel_defaults import DEFAULT_GAMMA, KERNEL_DEFAULTS

    # the library's defaults (issue 39): gamma relative to the negatives, rank <= 1024
    assert fits[-1].facts["kernel"] == "rbf"
    assert fits[-1].facts["pivots"] <= KERNEL_DEFAULTS["rank"]
    assert fits[-1].facts["gamma"].startswith(f"{DEFAULT_GAMMA} (= ")


def test_a_forced_in_memory_fit_over_budget_warns_once(tmp_path, stores, monkeypatch):
    # the job chooses the path (and warns), then the estimator ran the choice again
    import warnings

    from slem_dask.parallel import kernel_stream as stream

    monkeypatch.setattr(stream, "memory_budget", lambda x: (1000.0, "a 1 KB test budget"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_job(
            None,
            stores[2],
            str(tmp_path / "m.zarr"),
            kernel="rbf",
            gamma=0.5,
            rank=4,
            kernel_memory="in-memory",
        )
    said = [w for w in caught if issubclass(w.category, stream.KernelMemoryWarning)]
    assert len(said) == 1 and "a 1 KB test budget" in str(said[0].message)


@pytest.mark.filterwarnings("ignore::slem_dask.models.kernel.TraceErrorWarning")  # rank 3
@pytest.mark.parametrize(
    "kernel, used",
    [
        ("rbf", {"gamma"}),
        ("quad", {"gamma"}),
        ("poly", {"gamma", "degree"}),
        ("linear", set()),
        ("intersection", set()),
        ("chi2", set()),
    ],
)
def test_a_kernel_fit_report_names_only_the_parameters_its_kernel_uses(
    tmp_path, stores, kernel, used
):
    # the demo's rbf fit printed "degree 2", a parameter rbf ignores
    X, P, neg, pos = stores
    if kernel in ("intersection", "chi2"):  # histogram kernels: non-negative rows
        neg = _write(tmp_path / "hist.zarr", np.abs(X), 64)
    report = fit_job(
        None, neg, str(tmp_path / "m.zarr"), kernel=kernel, rank=3, tol=0.0, progress=False
    )
    assert {"gamma", "degree"} & set(report.facts) == used, report.facts
    assert report.facts["kernel"] == kernel and report.facts["rank"] == 3


@pytest.mark.filterwarnings("ignore::slem_dask.models.kernel.TraceErrorWarning")  # rank 5
def test_update_without_kernel_names_only_the_kernel_options_that_matter(tmp_path, stores):
    X, P, neg, pos = stores
    model_path = str(tmp_path / "m.zarr")
    fit_job(None, neg, model_path, kernel="rbf", gamma=0.2, rank=5, tol=0.0, progress=False)
    with pytest.raises(ValueError, match="--kernel rbf --gamma 0.2 --lam") as err:
        fit_job(None, neg, model_path, update=True)
    assert "--degree" not in str(err.value)
