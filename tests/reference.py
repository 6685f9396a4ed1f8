"""Brute-force reference implementations the tests compare the library against.

Nothing here imports slem_dask: each function is a direct, slow transcription
of a definition (the objective J of docs/math.md#linear-objective; the textbook
covariance; a full sort; the loop form of average precision; Oxford's
compute_ap), so an error in the library's closed forms or fast paths cannot
hide in the reference too.
"""

from __future__ import annotations

import numpy as np


# -- linear SLEM ---------------------------------------------------------------
def slem_objective(w, nu, x0, X, theta, lam):
    """J(w, nu) = theta/2 (w.x0 + nu - 1)^2 + 1/(2n) sum_i (w.x_i + nu + 1)^2 + lam/2 |w|^2."""
    r0 = w @ x0 + nu - 1.0
    r = X @ w + nu + 1.0
    return 0.5 * theta * r0**2 + 0.5 * np.mean(r**2) + 0.5 * lam * (w @ w)


def slem_gradient(w, nu, x0, X, theta, lam):
    """(dJ/dw, dJ/dnu), and a scale: the sum of the magnitudes of the terms.

    The scale is what the gradient has to be small relative to: with data far
    from the origin each term is large and they cancel at the optimum.
    """
    r0 = w @ x0 + nu - 1.0
    r = X @ w + nu + 1.0
    n = X.shape[0]
    grad_w = theta * r0 * x0 + (X.T @ r) / n + lam * w
    grad_nu = theta * r0 + np.mean(r)
    scale_w = np.abs(theta * r0 * x0) + (np.abs(X).T @ np.abs(r)) / n + np.abs(lam * w)
    scale_nu = abs(theta * r0) + np.mean(np.abs(r))
    return grad_w, grad_nu, scale_w, scale_nu


def brute_force_exemplar(X, x0, theta, lam):
    """Minimize J by linear least squares on the stacked weighted system.

    J(w, nu) = 1/2 |M [w; nu] - t|^2 with
        M = [sqrt(theta) [x0, 1]; sqrt(1/n) [x_i, 1] (n rows); sqrt(lam) [I, 0]],
        t = [sqrt(theta); -sqrt(1/n) (n times); 0 (d times)],
    solved with np.linalg.lstsq (SVD): no mean, no covariance, no Woodbury.
    """
    X = np.asarray(X, dtype=np.float64)
    x0 = np.asarray(x0, dtype=np.float64)
    n, d = X.shape
    M = np.vstack(
        [
            np.sqrt(theta) * np.append(x0, 1.0)[None, :],
            np.sqrt(1.0 / n) * np.hstack([X, np.ones((n, 1))]),
            np.sqrt(lam) * np.hstack([np.eye(d), np.zeros((d, 1))]),
        ]
    )
    t = np.concatenate([[np.sqrt(theta)], -np.sqrt(1.0 / n) * np.ones(n), np.zeros(d)])
    solution = np.linalg.lstsq(M, t, rcond=None)[0]
    return solution[:d], float(solution[d])


def naive_covariance(X):
    """X^T X / n - mu mu^T in float64: the cancellation-prone textbook formula."""
    X = np.asarray(X, dtype=np.float64)
    mu = X.mean(axis=0)
    return X.T @ X / X.shape[0] - np.outer(mu, mu)


# -- retrieval -----------------------------------------------------------------
def brute_force_topk(queries, database, k):
    """Full sort of every query's scores by (-score, database index)."""
    scores = np.asarray(queries, dtype=np.float64) @ np.asarray(database, dtype=np.float64).T
    out_scores, out_indices = [], []
    for row in scores:
        order = np.lexsort((np.arange(row.size), -row))[:k]
        out_scores.append(row[order])
        out_indices.append(order)
    return np.array(out_scores), np.array(out_indices)


def average_precision_loop(ranking, relevant, junk=()):
    """Non-interpolated AP, one item at a time.

    Junk items are skipped (they take no rank); AP is the sum, over the
    relevant items found, of the precision at their rank, divided by the
    number of relevant items (those never found contribute 0).
    """
    relevant = set(int(i) for i in relevant)
    junk = set(int(i) for i in junk)
    found = 0
    rank = 0
    total = 0.0
    for item in ranking:
        item = int(item)
        if item in junk:
            continue
        rank += 1
        if item in relevant:
            found += 1
            total += found / rank
    return total / len(relevant)


def oxford_compute_ap(pos, amb, ranked_list):
    """Transcription of compute_ap.cpp from the Oxford Buildings benchmark.

    pos: relevant ("good" + "ok") items; amb: junk items; ranked_list: the ranking.
    """
    pos = set(int(i) for i in pos)
    amb = set(int(i) for i in amb)
    old_recall = 0.0
    old_precision = 1.0
    ap = 0.0
    intersect_size = 0
    j = 0
    for item in ranked_list:
        item = int(item)
        if item in amb:
            continue
        if item in pos:
            intersect_size += 1
        recall = intersect_size / float(len(pos))
        precision = intersect_size / (j + 1.0)
        ap += (recall - old_recall) * ((old_precision + precision) / 2.0)
        old_recall = recall
        old_precision = precision
        j += 1
    return ap


# -- what a job's tasks compute ----------------------------------------------------
def partitionwise(transform, rows, partition_rows):
    """``transform`` of ``rows``, one call per partition, on one BLAS thread: the calls
    an encode job's tasks make. The last bit of a float32 product depends on its
    shape (OpenBLAS edge kernels), so one call on all rows can differ from a job's
    output in a few entries."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return np.concatenate(
            [transform(rows[i : i + partition_rows]) for i in range(0, len(rows), partition_rows)]
        )
