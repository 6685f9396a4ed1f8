"""Streaming kernel fits and kernel --update through the jobs, the command line and specs."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from scipy import linalg

from helpers import assert_same_kernel_fit
from slem_dask import KernelSLEM, load_model
from slem_dask.core.kernels import kernel_diagonal, kernel_matrix
from slem_dask.pipeline.jobspec import SpecError, parse_spec
from slem_dask.pipeline import fit_job
from slem_dask.storage import open_node

ARGS = dict(kernel="rbf", gamma=0.2, rank=12, pivoting="rpcholesky", tol=0.0, seed=3, lam=1e-2)


@pytest.fixture
def negatives(tmp_path, rng):
    X = rng.standard_normal((360, 8)).astype(np.float32)
    arr = zarr.create_array(
        store=str(tmp_path / "neg.zarr"), shape=(300, 8), dtype="float32", chunks=(50, 8)
    )
    arr[...] = X[:300]
    return X, str(tmp_path / "neg.zarr")


def _append(path, rows):
    arr = open_node(path, mode="r+")
    n = arr.shape[0]
    arr.resize((n + len(rows), arr.shape[1]))
    arr[n:] = rows


@pytest.mark.parametrize("pivoting", ["greedy", "rpcholesky"])
def test_streaming_fit_job_equals_in_memory_and_says_why(tmp_path, negatives, pivoting):
    X, neg = negatives
    args = {**ARGS, "pivoting": pivoting}
    reports = {}
    for memory in ("in-memory", "streaming", "auto"):
        reports[memory] = fit_job(
            None,
            neg,
            str(tmp_path / f"{memory}.zarr"),
            partition_rows=100,
            kernel_memory=memory,
            **args,
        )
    first = reports["streaming"].lines()[1:8]
    assert any(line.split() == ["kernel", "memory", "streaming"] for line in first), first
    assert any("forced" in line for line in first), first
    auto = reports["auto"].facts
    assert auto["kernel memory"] == "in-memory" and auto["because"].startswith("auto: the in-")
    ref = load_model(str(tmp_path / "in-memory.zarr"))
    got = load_model(str(tmp_path / "streaming.zarr"))
    assert_same_kernel_fit(got, ref)
    assert got.trace_error_ == pytest.approx(ref.trace_error_, rel=1e-8)
    assert got.strategy_ == "streaming" and ref.strategy_ == "in-memory"


def test_update_job_merges_appended_rows_without_repivoting(tmp_path, negatives):
    X, neg = negatives
    path = str(tmp_path / "m.zarr")
    fit_job(None, neg, path, partition_rows=100, **ARGS)
    before = load_model(path)
    _append(neg, X[300:])
    report = fit_job(None, neg, path, update=True, partition_rows=100, **ARGS)
    assert report.facts["action"].startswith("update (kept the 12 pivots; merged the 60 rows")
    assert report.facts["rows read"] == 60 and report.facts["passes"] == 1
    after = load_model(path)
    np.testing.assert_array_equal(after.pivots_, before.pivots_)
    np.testing.assert_array_equal(after.pivot_factor_, before.pivot_factor_)
    # dense reference over all 360 rows with the kept pivots (docs/math.md#icd)
    x = X.astype(np.float64)
    F = linalg.solve_triangular(
        after.pivot_factor_, kernel_matrix(x, after.pivot_rows_, "rbf", 0.2).T, lower=True
    ).T
    G = F.T @ F / 360 - np.outer(F.mean(0), F.mean(0)) + 1e-2 * np.eye(12)
    assert after.n_samples_ == 360
    np.testing.assert_allclose(after.factor_mean_, F.mean(axis=0), atol=1e-12)
    np.testing.assert_allclose(after.g_factor_ @ after.g_factor_.T, G, atol=1e-12)
    trace = kernel_diagonal(x, "rbf", 0.2).sum()
    assert after.trace_ == pytest.approx(trace, rel=1e-12)
    assert after.trace_error_ == pytest.approx((trace - np.sum(F**2)) / trace, rel=1e-8)
    again = fit_job(None, neg, path, update=True, partition_rows=100, **ARGS)
    assert again.facts["action"] == "up to date"
    repivot = fit_job(None, neg, path, repivot=True, partition_rows=100, **ARGS)
    assert repivot.facts["action"] == "refit (--repivot)"
    with dask.config.set(scheduler="sync"):
        ref = KernelSLEM(
            kernel="rbf",
            gamma=0.2,
            rank=12,
            pivoting="rpcholesky",
            tol=0.0,
            random_state=3,
            lam=1e-2,
        ).fit(da.from_array(X, chunks=(100, 8)))
    np.testing.assert_array_equal(load_model(path).pivots_, ref.pivots_)


def test_update_refuses_changed_first_rows(tmp_path, negatives):
    X, neg = negatives
    path = str(tmp_path / "m.zarr")
    fit_job(None, neg, path, partition_rows=100, **ARGS)
    fingerprint = load_model(path).fingerprint_
    arr = open_node(neg, mode="r+")
    arr[5] = X[6]
    _append(neg, X[300:])
    with pytest.raises(ValueError, match=r"first 300 rows .* changed since .* --repivot"):
        fit_job(None, neg, path, update=True, partition_rows=100, **ARGS)
    assert load_model(path).fingerprint_ == fingerprint
    with pytest.raises(FileExistsError, match=r"gamma: stored 0.2, given 0.3"):
        fit_job(None, neg, path, update=True, **{**ARGS, "gamma": 0.3})
    # the path (strategy) is not a parameter of the model: --update accepts another
    report = fit_job(None, neg, path, repivot=True, kernel_memory="streaming", **ARGS)
    assert report.facts["kernel memory"] == "streaming"


def test_update_of_a_model_without_the_scatter_refits(tmp_path, negatives):
    X, neg = negatives
    path = str(tmp_path / "m.zarr")
    fit_job(None, neg, path, partition_rows=100, **ARGS)
    meta_model = load_model(path)
    meta_model.factor_scatter_ = None  # what a store written before factor_scatter holds
    from slem_dask import storage

    arr = open_node(neg)
    meta_model.save(
        path,
        overwrite=True,
        metadata={
            "source": storage.canonical(neg).url,
            "negatives_fingerprint": storage.rows_fingerprint(
                arr, storage.canonical(neg), "negatives", 300
            ),
        },
    )
    assert load_model(path).factor_scatter_ is None
    _append(neg, X[300:])
    report = fit_job(None, neg, path, update=True, partition_rows=100, **ARGS)
    assert report.facts["action"].startswith(
        "refit (negatives now 360 rows, the model had 300; the model was written by a slem-dask"
    )
    assert load_model(path).factor_scatter_ is not None and report.facts["rows read"] == 360


def test_an_update_says_it_ignores_a_forced_kernel_memory(tmp_path, negatives):
    X, neg = negatives
    model = str(tmp_path / "k.zarr")
    fit_job(None, neg, model, partition_rows=100, **ARGS)
    _append(neg, X[300:])
    report = fit_job(
        None, neg, model, partition_rows=100, update=True, kernel_memory="in-memory", **ARGS
    )
    assert report.facts["kernel memory"] == "streaming"
    assert "'in-memory' applies to a fit from scratch: --repivot" in report.facts["because"]


def test_update_errors_name_the_rows_and_the_right_remedy(tmp_path, negatives):
    """A bad appended row is named by its row in the store, not in the appended part; an
    --update that forgot --kernel is told the kernel options, not --overwrite (which
    would replace the kernel model by a linear one); --repivot of a linear store says so."""
    X, neg = negatives
    model = str(tmp_path / "k.zarr")
    fit_job(None, neg, model, partition_rows=100, **ARGS)
    bad = X[300:].copy()
    bad[7, 2] = np.nan
    _append(neg, bad)
    with pytest.raises(ValueError, match=r"rows 307\b"):
        fit_job(None, neg, model, partition_rows=100, update=True, **ARGS)
    with pytest.raises(
        ValueError,
        match="--kernel rbf --gamma 0.2 .*--update.*--overwrite "
        "would replace it with a linear model",
    ):
        fit_job(None, neg, model, partition_rows=100, update=True, lam=1e-2)
    linear = str(tmp_path / "lin.zarr")
    X2 = X[:300]
    clean = str(tmp_path / "clean.zarr")
    zarr.create_array(store=clean, shape=X2.shape, dtype="float32", chunks=(50, 8))[...] = X2
    fit_job(None, clean, linear, lam=1e-2)
    with pytest.raises(
        FileExistsError, match="holds a LinearSLEM, not a kernel model; --repivot keeps"
    ):
        fit_job(None, clean, linear, partition_rows=100, repivot=True, **ARGS)


def test_linear_fit_refuses_kernel_only_options(tmp_path, negatives):
    _, neg = negatives
    with pytest.raises(ValueError, match="repivot applies to kernel models only"):
        fit_job(None, neg, str(tmp_path / "m.zarr"), repivot=True)
    with pytest.raises(ValueError, match="kernel_memory='streaming' applies to kernel models"):
        fit_job(None, neg, str(tmp_path / "m.zarr"), kernel_memory="streaming")


def test_cli_kernel_memory_and_repivot_options(capsys, tmp_path, negatives):
    from slem_dask.cli.main import main

    X, neg = negatives
    model = str(tmp_path / "k.zarr")
    for flags in (["--kernel-memory", "streaming"], ["--repivot"]):
        with pytest.raises(SystemExit) as exc:
            main(["fit", "--negatives", neg, "--model", model, *flags])
        assert exc.value.code == 2
        assert f"{flags[0]} applies only to kernel SLEM models" in capsys.readouterr().err
    common = [
        "fit",
        "--negatives",
        neg,
        "--model",
        model,
        "--kernel",
        "rbf",
        "--gamma",
        "0.2",
        "--rank",
        "8",
        "--pivoting",
        "rpcholesky",
        "--tol",
        "0",
        "--local-cluster",
        "threads",
        "--no-progress",
    ]
    assert main([*common, "--kernel-memory", "streaming"]) == 0
    out = capsys.readouterr().out
    assert "kernel memory      streaming" in out and "forced" in out
    _append(neg, X[300:])
    assert main([*common, "--update"]) == 0
    assert "update (kept the 8 pivots" in capsys.readouterr().out
    assert main([*common, "--repivot"]) == 0
    assert "refit (--repivot)" in capsys.readouterr().out


def test_spec_keys():
    spec = parse_spec(
        {
            "model": {"path": "m", "type": "kernel", "kernel_memory": "streaming"},
            "fit": {"negatives": "n", "repivot": True},
        }
    )
    assert spec.model.kernel_memory == "streaming" and spec.fit.repivot
    with pytest.raises(
        SpecError,
        match=r"model.kernel_memory = 'disk': expected one of 'auto', "
        r"'in-memory', 'streaming'",
    ):
        parse_spec({"model": {"path": "m", "type": "kernel", "kernel_memory": "disk"}})
    with pytest.raises(SpecError, match=r'model.kernel_memory applies to type = "kernel" only'):
        parse_spec({"model": {"path": "m", "kernel_memory": "streaming"}})
    with pytest.raises(SpecError, match=r'fit.repivot applies to type = "kernel" only'):
        parse_spec({"model": {"path": "m"}, "fit": {"negatives": "n", "repivot": True}})


def test_update_refuses_truncated_negatives(tmp_path, negatives):
    X, neg = negatives
    path = str(tmp_path / "m.zarr")
    fit_job(None, neg, path, partition_rows=100, **ARGS)
    open_node(neg, mode="r+").resize((250, 8))
    with pytest.raises(
        ValueError,
        match=r"fitted on 300 rows .* now holds only 250 rows "
        r"\(shape \(250, 8\)\): rows were removed; .* --repivot",
    ):
        fit_job(None, neg, path, update=True, **ARGS)
    assert fit_job(None, neg, path, repivot=True, **ARGS).facts["rows read"] == 250


# -- a streaming fit killed in its final pass resumes -----------------------------------
def _kill_final_pass_at(monkeypatch, call: int):
    """Make the ``call``-th final-pass task fail (the ones before it finish)."""
    from slem_dask.parallel import kernel_stream as stream

    original, finals = stream._stream_block, []

    def task(*args, **kwargs):
        if args[6]:  # final
            finals.append(args[5][-1])
            if len(finals) == call:
                raise RuntimeError("worker killed")
        return original(*args, **kwargs)

    monkeypatch.setattr(stream, "_stream_block", task)
    return original, finals


def test_a_streaming_fit_killed_in_its_final_pass_resumes(tmp_path, negatives, monkeypatch):
    from slem_dask.parallel import kernel_stream as stream

    X, neg = negatives  # 300 rows: 3 partitions of 100
    args = {**ARGS, "kernel_memory": "streaming"}
    clean = fit_job(None, neg, str(tmp_path / "clean.zarr"), partition_rows=100, **args)
    path = tmp_path / "m.zarr"
    original, _ = _kill_final_pass_at(monkeypatch, 3)
    with dask.config.set(scheduler="sync"), pytest.raises(RuntimeError, match="killed"):
        fit_job(None, neg, str(path), partition_rows=100, **args)
    assert not (path / "commits").exists()  # nothing committed: readers see no model
    finals = []

    def counting(*a, **k):
        finals.extend([a[5][-1]] if a[6] else [])
        return original(*a, **k)

    monkeypatch.setattr(stream, "_stream_block", counting)
    report = fit_job(None, neg, str(path), partition_rows=100, **args)
    assert report.facts["final pass"].startswith("resumed: 2 of 3 partitions reused")
    assert len(finals) == 1  # only the partition the killed run had not finished
    assert report.facts["fingerprint"] == clean.facts["fingerprint"]
    # the drafts went with the commit: one folder and its marker left
    left = sorted(p.name for p in (path / "versions").iterdir())
    assert len(left) == 2 and left[1] == left[0] + ".slem-dask", left
    # a fit that ran to the end leaves nothing to resume
    again = fit_job(None, neg, str(path), repivot=True, partition_rows=100, **args)
    assert "final pass" not in again.facts


def test_resume_reuses_only_intact_partitions_of_the_same_fit(tmp_path, negatives, monkeypatch):
    from slem_dask.parallel import kernel_stream as stream

    X, neg = negatives
    args = {**ARGS, "kernel_memory": "streaming"}
    clean = fit_job(None, neg, str(tmp_path / "clean.zarr"), partition_rows=100, **args)
    for name in ("damaged.zarr", "other.zarr"):
        original, _ = _kill_final_pass_at(monkeypatch, 3)
        with dask.config.set(scheduler="sync"), pytest.raises(RuntimeError, match="killed"):
            fit_job(None, neg, str(tmp_path / name), partition_rows=100, **args)
        monkeypatch.setattr(stream, "_stream_block", original)
    chunks = sorted((tmp_path / "damaged.zarr").glob("versions/*/kernel-fit/*/p*/c/0"))
    assert len(chunks) == 2
    data = bytearray(chunks[0].read_bytes())
    data[10] ^= 0xFF  # one partition damaged: its checksum fails, it is computed again
    chunks[0].write_bytes(bytes(data))
    report = fit_job(None, neg, str(tmp_path / "damaged.zarr"), partition_rows=100, **args)
    assert report.facts["final pass"].startswith("resumed: 1 of 3 partitions reused")
    assert report.facts["fingerprint"] == clean.facts["fingerprint"]
    # other parameters (another seed: other pivots) reuse nothing of the killed run
    other = fit_job(
        None, neg, str(tmp_path / "other.zarr"), partition_rows=100, **{**args, "seed": 4}
    )
    assert "final pass" not in other.facts


def test_resume_on_a_distributed_cluster(tmp_path, negatives, monkeypatch):
    from distributed import Client, LocalCluster

    from slem_dask.parallel import kernel_stream as stream

    X, neg = negatives
    args = {**ARGS, "kernel_memory": "streaming"}
    clean = fit_job(None, neg, str(tmp_path / "clean.zarr"), partition_rows=100, **args)
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        original, _ = _kill_final_pass_at(monkeypatch, 3)
        with pytest.raises(RuntimeError, match="killed"):
            fit_job(client, neg, str(tmp_path / "m.zarr"), partition_rows=100, **args)
        monkeypatch.setattr(stream, "_stream_block", original)
        report = fit_job(client, neg, str(tmp_path / "m.zarr"), partition_rows=100, **args)
    assert report.facts["final pass"].startswith("resumed: 2 of 3 partitions reused")
    assert report.facts["fingerprint"] == clean.facts["fingerprint"]
