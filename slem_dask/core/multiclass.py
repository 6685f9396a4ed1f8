"""Multi-class linear SVM (Crammer & Singer) trained by stochastic sub-gradient steps.

docs/math.md#multiclass-svm: the structured SVM with phi(x, y) = x placed in the
block of class y and the 0/1 label loss Delta(y, y_i) = [y != y_i]:

    R(W) = lam/2 |W|_F^2 + (1/N) sum_i max_y { Delta(y, y_i) + w_y.x_i - w_{y_i}.x_i }

(the textbook (1/2)|w|^2 + C sum ... with lam = 1/(C N)). Its sub-gradient at
sample i is x_i in row y^_i and -x_i in row y_i, with the loss-augmented
prediction y^_i = argmax_y { Delta(y, y_i) + w_y.x_i }, and 0 if y^_i = y_i.
Steps are Pegasos' with Bottou's offset, eta_t = 1 / (lam (t + t0)), over mini-batches, with suffix
averaging of the iterates, as in :mod:`slem_dask.core.esvm`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["multiclass_hinge_objective", "crammer_singer_sgd"]


def _augmented_scores(W, X, y):
    scores = X @ W.T  # (N, K)
    augmented = scores + 1.0  # Delta = 1 for y != y_i
    augmented[np.arange(len(y)), y] -= 1.0  # Delta = 0 for y = y_i
    return scores, augmented


def multiclass_hinge_objective(W, X, y, lam: float) -> float:
    """R(W) for labels ``y`` in 0 .. K-1 (rows of W are the classes)."""
    W = np.asarray(W, dtype=np.float64)
    X = np.asarray(X, dtype=np.float64)
    scores, augmented = _augmented_scores(W, X, y)
    losses = augmented.max(axis=1) - scores[np.arange(len(y)), y]
    return float(0.5 * lam * np.sum(W * W) + losses.mean())


def crammer_singer_sgd(
    X,
    y,
    n_classes: int,
    lam: float,
    n_iter: int = 2000,
    batch_size: int = 64,
    eta0: float = 1.0,
    average: float = 0.5,
    random_state: int = 0,
) -> np.ndarray:
    """W (n_classes, d) approximately minimizing R(W); deterministic given ``random_state``."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    N, d = X.shape
    W = np.zeros((n_classes, d))
    W_sum = np.zeros_like(W)
    start_avg = n_iter - max(1, int(round(average * n_iter)))
    rng = np.random.default_rng(random_state)
    t0 = 1.0 / (lam * eta0)
    m = min(batch_size, N)
    for t in range(1, n_iter + 1):
        idx = rng.integers(0, N, m)
        Xb, yb = X[idx], y[idx]
        _, augmented = _augmented_scores(W, Xb, yb)
        y_hat = augmented.argmax(axis=1)
        active = y_hat != yb
        coeff = np.zeros((m, n_classes))
        coeff[np.flatnonzero(active), y_hat[active]] += 1.0
        coeff[np.flatnonzero(active), yb[active]] -= 1.0
        grad = coeff.T @ Xb / m
        eta = 1.0 / (lam * (t + t0))
        W *= 1.0 - eta * lam
        W -= eta * grad
        if t > start_avg:
            W_sum += W
    return W_sum / (n_iter - start_avg)
