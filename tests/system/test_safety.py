"""What protects a user's data: outputs never overwrite inputs, unfinished outputs are
never read, an interrupted encode stays resumable, kernel --update never changes
parameters silently; plus the performance report and connection errors."""

import numpy as np
import pytest
import zarr

from slem_dask.storage.versioning import versions

from slem_dask import KernelSLEM, LinearSLEM, load_model, pipeline, storage
from slem_dask.cli.main import main

from helpers import cli


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(11)
    group = zarr.open_group(str(tmp_path / "corpus.zarr"), mode="w")
    for name, n in (("negatives", 400), ("database", 120)):
        arr = group.create_array(name, shape=(n, 10), dtype="float32", chunks=(40, 10))
        arr[...] = rng.random((n, 10)).astype("float32")
    LinearSLEM().fit(group["negatives"][...]).save(str(tmp_path / "model.zarr"))
    return tmp_path


def _cli(capsys, client, *args):
    return cli(capsys, client.scheduler.address, *args)


@pytest.mark.parametrize(
    "out", ["corpus.zarr", "corpus.zarr/database", "corpus.zarr/database/inner"]
)
def test_encode_overwrite_never_destroys_the_input(corpus, client, capsys, out):
    before = storage.open_node(str(corpus / "corpus.zarr/database"))[...]
    code, _, err = _cli(
        capsys,
        client,
        "encode",
        "--model",
        corpus / "model.zarr",
        "--positives",
        corpus / "corpus.zarr/database",
        "--out",
        corpus / out,
        "--overwrite",
    )
    assert code == 1 and "would destroy the input" in err and "positives" in err
    np.testing.assert_array_equal(
        storage.open_node(str(corpus / "corpus.zarr/database"))[...], before
    )
    assert "negatives" in storage.open_node(str(corpus / "corpus.zarr"), mode="r")


def test_fit_overwrite_never_destroys_the_negatives(corpus, client, capsys):
    code, _, err = _cli(
        capsys,
        client,
        "fit",
        "--negatives",
        corpus / "corpus.zarr/negatives",
        "--model",
        corpus / "corpus.zarr/negatives",
        "--overwrite",
    )
    assert code == 1 and "--model" in err and "is the negatives" in err
    assert storage.open_node(str(corpus / "corpus.zarr/negatives")).shape == (400, 10)


def test_unfinished_output_is_refused_as_input(corpus, client, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.common, "_compute", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pipeline.encode_job(
            client,
            str(corpus / "model.zarr"),
            str(corpus / "corpus.zarr/database"),
            str(corpus / "half.zarr"),
        )
    # interrupted: what was written is kept (resumable) but nothing is committed ...
    assert not versions.VersionedStore(str(corpus / "half.zarr")).is_versioned()
    assert versions.VersionedStore(str(corpus / "half.zarr")).has_history()
    monkeypatch.undo()
    # ... and no command reads it
    code, _, err = _cli(
        capsys,
        client,
        "encode",
        "--model",
        corpus / "model.zarr",
        "--positives",
        corpus / "half.zarr",
        "--out",
        corpus / "again.zarr",
    )
    assert code == 1 and "unfinished slem-dask output" in err
    assert not (corpus / "again.zarr").exists()
    # the same command finishes it, to the same result as a clean run (interrupted before
    # any partition was written, it has nothing to reuse: it says "create", not "resume")
    report = pipeline.encode_job(
        client,
        str(corpus / "model.zarr"),
        str(corpus / "corpus.zarr/database"),
        str(corpus / "half.zarr"),
    )
    assert report.facts["action"] == "create"
    model = load_model(str(corpus / "model.zarr"))
    np.testing.assert_array_equal(
        storage.open_output(str(corpus / "half.zarr"))[...],
        model.transform(
            storage.open_node(str(corpus / "corpus.zarr/database"))[...], dtype="float32"
        ),
    )


def test_kernel_update_refuses_new_parameters_and_merges_new_rows(corpus, client):
    neg = str(corpus / "corpus.zarr/negatives")
    kpath = str(corpus / "kmodel.zarr")
    args = dict(kernel="rbf", gamma=0.5, rank=8, pivoting="rpcholesky", tol=0.0, seed=0)
    assert pipeline.fit_job(client, neg, kpath, **args).facts["action"] == "fit"
    assert pipeline.fit_job(client, neg, kpath, update=True, **args).facts["action"] == "up to date"
    with pytest.raises(FileExistsError, match="other parameters.*--overwrite"):
        pipeline.fit_job(client, neg, kpath, update=True, **{**args, "gamma": 1.0})
    arr = storage.open_node(neg, mode="r+")
    arr.resize((440, 10))
    arr[400:] = np.random.default_rng(0).random((40, 10)).astype("float32")
    before = load_model(kpath)
    report = pipeline.fit_job(client, neg, kpath, update=True, **args)
    assert report.facts["action"].startswith("update (kept the 8 pivots; merged the 40 rows")
    assert report.facts["rows read"] == 40 and report.facts["kernel memory"] == "streaming"
    after = load_model(kpath)
    assert isinstance(after, KernelSLEM) and after.n_samples_ == 440
    np.testing.assert_array_equal(after.pivots_, before.pivots_)
    report = pipeline.fit_job(client, neg, kpath, repivot=True, **args)
    assert report.facts["action"] == "refit (--repivot)" and report.facts["rows read"] == 440


def test_performance_report_is_written(corpus, client, capsys, tmp_path):
    report = tmp_path / "report.html"
    code, _, err = _cli(
        capsys,
        client,
        "fit",
        "--negatives",
        corpus / "corpus.zarr/negatives",
        "--model",
        tmp_path / "m.zarr",
        "--performance-report",
        report,
    )
    assert code == 0, err
    assert report.stat().st_size > 10_000 and b"<html" in report.read_bytes()[:2000].lower()


def test_bad_scheduler_address_names_the_fix(corpus, capsys, monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    code = main(
        [
            "fit",
            "--negatives",
            str(corpus / "corpus.zarr/negatives"),
            "--model",
            str(corpus / "m.zarr"),
            "--scheduler",
            "127.0.0.1:notaport",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert "could not connect to the dask scheduler at '127.0.0.1:notaport'" in err
    assert "tcp://host:8786" in err
    assert not (corpus / "m.zarr").exists()


def test_output_is_born_unfinished(tmp_path):
    """The completion marker is in the array's first metadata write: a run killed right
    after creating its output still leaves something every reader refuses."""
    import json

    storage.create_output(str(tmp_path / "out.zarr"), (10, 3), 5, "float32", {"n_rows": 10})
    meta = json.loads((tmp_path / "out.zarr" / "zarr.json").read_text())
    assert meta["attributes"]["slem_dask"]["complete"] is False
    with pytest.raises(ValueError, match="unfinished"):
        storage.open_input(str(tmp_path / "out.zarr"), "positives")


def _no_cluster(monkeypatch):
    import slem_dask.cluster.connect

    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was started before the input check")

    monkeypatch.setattr(slem_dask.cluster.connect, "connect", refuse)


def test_existing_model_refused_before_any_cluster(corpus, capsys, monkeypatch):
    _no_cluster(monkeypatch)
    code = main(
        [
            "fit",
            "--negatives",
            str(corpus / "corpus.zarr/negatives"),
            "--model",
            str(corpus / "model.zarr"),
        ]
    )
    assert code == 1 and "already exists" in capsys.readouterr().err


def test_spec_dimension_mismatch_refused_before_any_cluster(corpus, capsys, monkeypatch):
    _no_cluster(monkeypatch)
    wide = zarr.create_array(
        str(corpus / "wide.zarr"), shape=(20, 11), dtype="float32", chunks=(10, 11)
    )
    wide[...] = 1.0
    spec = corpus / "job.toml"
    spec.write_text(f"""
[model]
path = "{corpus}/m2.zarr"
[fit]
negatives = "{corpus}/corpus.zarr/negatives"
[[encode]]
positives = "{corpus}/corpus.zarr/database"
out = "{corpus}/e0.zarr"
[[encode]]
positives = "{corpus}/wide.zarr"
out = "{corpus}/e1.zarr"
""")
    assert main(["run", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "encode[1].positives" in err and "11 features but fit.negatives have 10" in err
    assert not (corpus / "m2.zarr").exists() and not (corpus / "e0.zarr").exists()


def test_kernel_update_names_the_differing_parameters(corpus, client):
    neg = str(corpus / "corpus.zarr/negatives")
    kpath = str(corpus / "k.zarr")
    pipeline.fit_job(client, neg, kpath, kernel="rbf", rank=5, tol=0.0, seed=0)
    with pytest.raises(FileExistsError, match=r"tol: stored 0.0, given 0.001"):
        pipeline.fit_job(client, neg, kpath, kernel="rbf", rank=5, seed=0, update=True)


def test_linear_update_keeps_the_stored_parameters_or_refuses(corpus, client):
    """A linear --update with other lam or theta than the stored model's is refused, as a
    kernel one is: the merged statistics were saved under the new (default) parameters."""
    neg = str(corpus / "corpus.zarr/negatives")
    path = str(corpus / "lin.zarr")
    pipeline.fit_job(client, neg, path, lam=3e-3, theta=2.0)
    with pytest.raises(
        FileExistsError,
        match=r"lam: stored 0.003, given 0.001.*theta: "
        r"stored 2.0, given 1.0.*--update keeps",
    ):
        pipeline.fit_job(client, neg, path, lam=1e-3, update=True)
    # without lam an update takes the stored one (the default changed to "0.01x", issue
    # 32); another theta is still refused
    with pytest.raises(
        FileExistsError,
        match=r"other parameters \(theta: stored 2.0, given "
        r"1.0\); --update keeps",
    ):
        pipeline.fit_job(client, neg, path, update=True)
    assert load_model(path).get_params()["lam"] == 3e-3
    report = pipeline.fit_job(
        client, neg, path, lam=3e-3, theta=2.0, update=True, precision="float64"
    )  # an execution parameter may change
    assert report.facts["action"] in ("update", "up to date")
    assert load_model(path).lam == 3e-3 and load_model(path).theta == 2.0
