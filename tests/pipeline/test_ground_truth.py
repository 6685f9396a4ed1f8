"""Nearest-neighbour ground truth in `evaluate` (--ground-truth: .ivecs, ann-benchmarks HDF5,
.npy, zarr) and `search --metric` as a job: what they read, report, record and refuse."""

import warnings

import numpy as np
import pytest
import zarr

from slem_dask import storage
from slem_dask.cli.main import main
from slem_dask.pipeline.evaluate import evaluate_job, open_search_result, search_job
from slem_dask.pipeline.ground_truth import read_ground_truth
from slem_dask.retrieval import ann_recalls, search


def write_vecs(path, rows, dtype):
    """TEXMEX: each row is its dimension (int32) then its values (float32 or int32)."""
    rows = np.asarray(rows, dtype=dtype)
    out = np.empty((len(rows), rows.shape[1] + 1), dtype="<i4")
    out[:, 0] = rows.shape[1]
    out[:, 1:] = rows.view("<i4")
    out.tofile(path)
    return str(path)


@pytest.fixture(scope="module")
def sift(tmp_path_factory):
    """A tiny SIFT1M look-alike: learn / base / query .fvecs and an L2 ground truth .ivecs
    (ties to the lower index), plus the arrays."""
    folder = tmp_path_factory.mktemp("sift")
    rng = np.random.default_rng(0)
    centres = rng.integers(0, 120, (20, 16))

    def sift_like(n):
        return np.clip(centres[rng.integers(0, 20, n)] + rng.integers(-12, 13, (n, 16)), 0, 255)

    learn, base, query = sift_like(600), sift_like(300), sift_like(30)
    d2 = ((query[:, None, :] - base[None, :, :]) ** 2).sum(axis=2)
    gt = np.argsort(d2, axis=1, kind="stable")[:, :20]
    paths = {
        name: write_vecs(folder / f"sift_{name}.fvecs", rows, "<f4")
        for name, rows in (("learn", learn), ("base", base), ("query", query))
    }
    paths["groundtruth"] = write_vecs(folder / "sift_groundtruth.ivecs", gt, "<i4")
    return folder, paths, (learn, base, query, gt)


def test_read_ground_truth_in_every_format(sift, tmp_path):
    h5py = pytest.importorskip("h5py")
    _, paths, (_, base, query, gt) = sift
    np.save(tmp_path / "gt.npy", gt)
    zarr.create_array(store=str(tmp_path / "gt.zarr"), data=gt.astype(np.int32))
    with h5py.File(tmp_path / "ann.hdf5", "w") as f:  # ann-benchmarks' layout
        f["train"], f["test"] = base.astype(np.float32), query.astype(np.float32)
        f["neighbors"], f["distances"] = gt.astype(np.int32), np.zeros(gt.shape, np.float32)
    for path in (
        paths["groundtruth"],
        tmp_path / "gt.npy",
        tmp_path / "gt.zarr",
        tmp_path / "ann.hdf5",  # its neighbors, found by name
        f"{tmp_path / 'ann.hdf5'}:/neighbors",
    ):
        got = read_ground_truth(str(path), len(query), len(base))
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, gt)


def test_read_ground_truth_refusals_name_the_option(sift, tmp_path):
    h5py = pytest.importorskip("h5py")
    _, paths, (_, base, query, gt) = sift
    np.save(tmp_path / "one.npy", gt[:, 0])
    np.save(tmp_path / "float.npy", gt.astype(np.float64))
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["a"], f["b"] = gt, gt
    cases = [
        (paths["base"], r"is a \.fvecs file of vectors.*give the \.ivecs ground truth"),
        (tmp_path / "one.npy", r"shape \(30,\); expected \(30, k\).*reshape"),
        (tmp_path / "float.npy", r"holds float64; expected integer database ids"),
        (tmp_path / "plain.h5", r"has no datasets called neighbors \(datasets: /a, /b\)"),
        (f"{tmp_path / 'plain.h5'}:/c", r"has no dataset '/c' \(datasets: /a, /b\)"),
    ]
    for path, message in cases:
        with pytest.raises(ValueError, match=message) as caught:
            read_ground_truth(str(path), len(query), len(base))
        assert str(caught.value).startswith("--ground-truth ") and "\n" not in str(caught.value)
    with pytest.raises(ValueError, match=r"shape \(30, 20\); expected \(29, k\).*\.ivecs"):
        read_ground_truth(paths["groundtruth"], len(query) - 1, len(base))
    with pytest.raises(ValueError, match=r"ids outside \[0, 100\)"):
        read_ground_truth(paths["groundtruth"], len(query), 100)


def test_evaluate_job_with_ground_truth_and_no_labels(sift):
    _, paths, (_, base, query, gt) = sift
    arrays = {"negatives": paths["learn"], "database": paths["base"], "queries": paths["query"]}
    rows, curves, report = evaluate_job(
        None, None, "raw,slem", arrays=arrays, ground_truth=paths["groundtruth"]
    )
    assert [r["method"] for r in rows] == ["raw", "slem"] and curves == {}
    assert all("mAP" not in r and {"1-R@1", "R@10", "10-R@10"} <= set(r) for r in rows)
    # raw: unit rows ranked by inner product (cosine), as search ranks them
    unit = base / np.linalg.norm(base, axis=1, keepdims=True)
    q = query / np.linalg.norm(query, axis=1, keepdims=True)
    want = ann_recalls(search(q, unit, 10)[1], gt)
    assert {key: rows[0][key] for key in want} == pytest.approx(want)
    assert "20 neighbours per query" in report.facts["ground truth"]


def test_evaluate_job_with_labels_and_ground_truth_reports_both(sift):
    _, paths, (_, base, query, gt) = sift
    folder = sift[0]
    np.save(folder / "db_labels.npy", np.arange(len(base)) % 7)
    np.save(folder / "q_labels.npy", np.arange(len(query)) % 7)
    arrays = {
        "negatives": paths["learn"],
        "database": paths["base"],
        "queries": paths["query"],
        "database_labels": str(folder / "db_labels.npy"),
        "query_labels": str(folder / "q_labels.npy"),
    }
    rows, curves, _ = evaluate_job(
        None, None, "raw", arrays=arrays, ground_truth=paths["groundtruth"]
    )
    assert {"mAP", "1-R@1", "R@10", "10-R@10"} <= set(rows[0]) and "raw" in curves


def test_cli_evaluate_sift_flow_and_its_refusals(sift, capsys):
    folder, paths, _ = sift
    own = [
        "evaluate",
        "--negatives-from",
        paths["learn"],
        "--database",
        paths["base"],
        "--queries",
        paths["query"],
        "--methods",
        "raw,pca",
        "--no-progress",
    ]
    assert main([*own, "--ground-truth", paths["groundtruth"]]) == 0
    out = capsys.readouterr().out
    assert "1-R@1" in out and "10-R@10" in out and "mAP" not in out, out
    refusals = [
        (["--ground-truth", paths["groundtruth"], "--k", "5"], "--k 5 is shorter than the 10"),
        (["--ground-truth", paths["groundtruth"], "--plot", str(folder / "pr.png")], "--plot"),
        (["--ground-truth", paths["base"]], "is a .fvecs file of vectors"),
    ]
    for extra, message in refusals:
        assert main([*own, *extra]) != 0
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    # usage errors (exit 2): labels, neither ground truth nor both
    np.save(folder / "labels.npy", np.zeros(len(sift[2][1]), int))
    one_label = ["--ground-truth", paths["groundtruth"], "--database-labels", folder / "labels.npy"]
    for extra, message in (
        ([], "with --ground-truth the labels may be left out"),
        (one_label, "(missing: --query-labels)"),
    ):
        with pytest.raises(SystemExit):
            main([*own, *map(str, extra)])
        assert message in capsys.readouterr().err


def test_search_job_metric_recorded_and_a_rerun_with_another_metric_refused(sift, tmp_path):
    _, paths, (_, base, query, gt) = sift
    out = str(tmp_path / "hits.zarr")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        search_job(None, paths["query"], paths["base"], out, k=10, metric="l2")
    assert not [w for w in said if "unit norm" in str(w.message)]  # l2: norms are fine
    scores, indices = open_search_result(out)
    assert ann_recalls(indices, gt) == {"1-R@1": 1.0, "R@10": 1.0, "10-R@10": 1.0}
    nearest = ((query - base[indices[:, 0]]) ** 2).sum(axis=1)
    np.testing.assert_array_equal(scores[:, 0], nearest)  # squared distances, exact here
    meta = storage.open_node(out).attrs["slem_dask"]
    assert meta["metric"] == "l2" and meta["score"] == "squared L2 distance (lower first)"
    with pytest.raises(FileExistsError, match=r"metric 'l2' \(now 'ip'\)"):
        search_job(None, paths["query"], paths["base"], out, k=10)
    with pytest.warns(UserWarning, match="inner product of rows far from unit norm"):
        search_job(None, paths["query"], paths["base"], out, k=10, overwrite=True)


@pytest.mark.filterwarnings("ignore:inner product of rows far from unit norm")
def test_search_job_warns_raw_queries_against_encodings(tmp_path, rng):
    from slem_dask.pipeline import encode_job, fit_job

    neg = str(tmp_path / "neg.npy")
    np.save(neg, rng.standard_normal((200, 6)).astype(np.float32))
    fit_job(None, neg, str(tmp_path / "m.zarr"), lam=0.1)
    encode_job(None, str(tmp_path / "m.zarr"), neg, str(tmp_path / "codes.zarr"))
    with pytest.warns(
        UserWarning,
        match=r"the database is a slem-dask encoding; '.*neg.npy' \(the queries\) is a \.npy "
        r"file, which records nothing of what it holds: raw descriptors against encodings",
    ):
        search_job(None, neg, str(tmp_path / "codes.zarr"), str(tmp_path / "h.zarr"), k=3)


def test_evaluate_job_on_a_corpus_with_ground_truth(tmp_path):
    from slem_dask.datasets import make_corpus, write_corpus

    path = str(tmp_path / "corpus.zarr")
    write_corpus(make_corpus(n_negatives=300, n_instances=12, group_size=3, d=8, seed=1), path)
    group = storage.open_node(path, mode="r")
    q, db = group["queries"][...], group["database"][...]
    d2 = ((q[:, None, :] - db[None, :, :]) ** 2).sum(axis=2)
    np.save(tmp_path / "gt.npy", np.argsort(d2, axis=1, kind="stable")[:, :10])
    rows, curves, _ = evaluate_job(None, path, "raw", ground_truth=str(tmp_path / "gt.npy"))
    assert {"mAP", "1-R@1", "R@10", "10-R@10"} <= set(rows[0]) and set(curves) == {"raw"}


def test_grid_search_without_labels_marks_the_best_recall(sift):
    from slem_dask.pipeline.evaluation import grid_search

    _, _, (learn, base, query, gt) = sift
    grids = {"slem": {"lam": [1e-4, 1.0, 1e4]}}
    rows, best, curves = grid_search(learn, base, query, None, grids, ground_truth=gt)
    scores = [r["10-R@10"] for r in rows]
    top = scores.index(max(scores))  # ties to the first
    assert [r["best"] for r in rows] == ["*" if i == top else "" for i in range(3)]
    assert best["slem"] == {"lam": grids["slem"]["lam"][top]}
    assert curves == {} and all("mAP" not in r for r in rows)
