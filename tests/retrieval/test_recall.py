"""The ANN world's recall figures (1-R@1, R@10, 10-R@10) against brute force (numpy and
FAISS), and the checks of nearest-neighbour ground truth."""

import numpy as np
import pytest

from slem_dask.retrieval import ann_recalls, intersection_recall, recall_at, search
from slem_dask.retrieval.metrics import check_neighbors


def l2_ground_truth(queries, database, k):
    """Brute-force nearest neighbours by squared L2 distance, ties to the lower index."""
    d2 = ((queries[:, None, :] - database[None, :, :]) ** 2).sum(axis=2)
    return np.argsort(d2, axis=1, kind="stable")[:, :k]


def loop_recalls(indices, gt):
    """The definitions, one query at a time."""
    n = len(indices)
    r1 = sum(int(indices[q][0] == gt[q][0]) for q in range(n)) / n
    r10 = sum(int(gt[q][0] in list(indices[q][:10])) for q in range(n)) / n
    i10 = sum(len(set(indices[q][:10]) & set(gt[q][:10])) for q in range(n)) / (10 * n)
    return {"1-R@1": r1, "R@10": r10, "10-R@10": i10}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(4)
    database = rng.standard_normal((400, 16)).astype(np.float32) * rng.uniform(0.5, 3, (400, 1))
    queries = rng.standard_normal((60, 16)).astype(np.float32) * 2
    return queries, database.astype(np.float32)


def test_recalls_by_hand():
    gt = np.array([[3, 1, 2], [0, 4, 5]])
    ranking = np.array([[3, 0, 1, 9, 8, 7, 6, 5, 4, 2], [4, 5, 6, 7, 8, 9, 1, 2, 3, 0]])
    assert recall_at(ranking, gt, 1) == 0.5  # query 0's nearest is first; query 1's is not
    assert recall_at(ranking, gt, 2) == 0.5
    assert recall_at(ranking, gt, 10) == 1.0  # query 1's nearest (0) is 10th
    assert intersection_recall(ranking[:, :3], gt, 3) == (2 + 2) / 6  # {3, 1}; {4, 5}
    assert intersection_recall(ranking[:, :1], gt, 1) == 0.5


def test_search_l2_finds_the_numpy_and_faiss_ground_truth(data):
    faiss = pytest.importorskip("faiss")
    queries, database = data
    gt = l2_ground_truth(queries.astype(np.float64), database.astype(np.float64), 100)
    index = faiss.IndexFlatL2(database.shape[1])
    index.add(database)
    _, faiss_gt = index.search(queries, 100)
    _, indices = search(queries, database, 100, metric="l2")
    np.testing.assert_array_equal(indices, gt)
    assert ann_recalls(indices, gt) == {"1-R@1": 1.0, "R@10": 1.0, "10-R@10": 1.0}
    # FAISS' float32 distances may order near-ties otherwise; its top 10 are the same rows
    assert intersection_recall(indices, faiss_gt, 10) > 0.99
    assert recall_at(indices, faiss_gt, 1) > 0.98


def test_recalls_of_an_inner_product_ranking_equal_the_definitions_and_faiss(data):
    """Cosine ranks some L2 neighbours, not all: every figure is the one-query-at-a-time
    definition's and 10-R@10 is FAISS's knn_intersection_measure."""
    pytest.importorskip("faiss")
    from faiss.contrib.evaluation import knn_intersection_measure

    queries, database = data
    gt = l2_ground_truth(queries.astype(np.float64), database.astype(np.float64), 100)
    _, indices = search(queries, database, 20, metric="cosine")
    got = ann_recalls(indices, gt)
    assert got == pytest.approx(loop_recalls(indices, gt), abs=1e-15)
    assert got["10-R@10"] == pytest.approx(knn_intersection_measure(indices[:, :10], gt[:, :10]))
    assert 0 < got["1-R@1"] < 1 and 0 < got["10-R@10"] < 1  # hits and misses


def test_ann_recalls_reports_what_the_lengths_allow():
    gt = np.array([[0], [1]])
    ranking = np.tile(np.arange(10), (2, 1))
    assert ann_recalls(ranking, gt) == {"1-R@1": 0.5, "R@10": 1.0}  # no 10 true neighbours
    assert ann_recalls(ranking[:, :3], gt) == {"1-R@1": 0.5}


@pytest.mark.parametrize(
    ("gt", "message"),
    [
        (np.arange(5), r"shape \(5,\); expected \(5, k\).*reshape it to \(n_queries, 1\)"),
        (np.zeros((4, 3), int), r"shape \(4, 3\); expected \(5, k\)"),
        (np.zeros((5, 3)), r"holds float64; expected integer database ids.*astype\(np.int64\)"),
        (
            np.array([[0, 12]] * 5),
            r"5 ids outside \[0, 10\) \(query 0, column 1: 12\).*\(0-based\); fix it$",
        ),
        (np.tile(np.arange(1, 11), (5, 1)), r"ids outside \[0, 10\).*look 1-based: subtract 1"),
        (-np.ones((5, 2), int), r"ids outside \[0, 10\) \(query 0, column 0: -1\)"),
    ],
)
def test_check_neighbors_refuses_in_one_line(gt, message):
    with pytest.raises(ValueError, match=message) as caught:
        check_neighbors(gt, 5, 10, name="--ground-truth", fix="fix it")
    said = str(caught.value)
    assert "\n" not in said and said.startswith("--ground-truth")


def test_recall_refuses_short_rankings():
    gt = np.zeros((2, 10), int)
    with pytest.raises(ValueError, match="fewer than the 10 counted; search with k >= 10"):
        recall_at(np.zeros((2, 5), int), gt, 10)
    with pytest.raises(ValueError, match="ground truth holds 3 neighbours.*at least 10"):
        intersection_recall(np.zeros((2, 10), int), gt[:, :3], 10)


def ann_benchmarks_knn(dataset_distances, run_distances, count, epsilon=1e-3):
    """ann-benchmarks' plotting/metrics.py get_recall_values with knn_threshold, as a loop."""
    recalls = np.zeros(len(run_distances))
    for i in range(len(run_distances)):
        t = dataset_distances[i][count - 1] + epsilon
        recalls[i] = sum(1 for d in run_distances[i][:count] if d <= t)
    return np.mean(recalls) / float(count)


def test_distance_recall_is_ann_benchmarks_knn_and_counts_ties(data):
    from slem_dask.retrieval import distance_recall

    queries, database = data
    q, x = queries.astype(np.float64), database.astype(np.float64)
    true = np.sort(np.sqrt(((q[:, None, :] - x[None, :, :]) ** 2).sum(axis=2)), axis=1)[:, :100]
    _, indices = search(queries, database, 20, metric="cosine")
    run = np.sqrt(((q[:, None, :] - x[indices]) ** 2).sum(axis=2))
    for k in (1, 10):
        assert distance_recall(run, true, k) == pytest.approx(ann_benchmarks_knn(true, run, k))
    exact, _ = search(queries, database, 10, metric="l2")
    assert distance_recall(np.sqrt(exact), true, 10) == 1.0
    # a result at a true neighbour's distance with another id counts here, not by ids
    tied = np.array([[1.0, 2.0]])
    assert distance_recall(tied, tied, 2) == 1.0
    with pytest.raises(ValueError, match="needs 10 results and 10 true distances"):
        distance_recall(run[:, :5], true, 10)
