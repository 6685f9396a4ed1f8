"""Hinge-loss exemplar SVM (E-SVM), the baseline SLEM replaces (docs/math.md#esvm).

For one positive x0 and negatives x_1 .. x_n the E-SVM minimizes the exemplar
objective (docs/math.md#linear-objective) with the hinge loss l(y, s) = max(0, 1 - y s):

    J(w, b) = theta * max(0, 1 - (w.x0 + b))
              + (1/n) sum_i max(0, 1 + w.x_i + b) + lam/2 |w|^2.

It has no closed form; :func:`pegasos_exemplars` trains it by Pegasos-style
stochastic sub-gradient steps (docs/math.md#esvm), for a whole batch of positives
at once: the rows of W (B, d) are independent problems that share the sampled
negatives, so each step is one matrix product (B, d) x (d, m).

Details that differ from textbook Pegasos, each exact or a pure
step-size choice (none changes the minimizer):

* the data are centred on the negatives' mean mu before training. Because b is
  not regularized, (w, b) on x and (w, b + w.mu) on x - mu have the same J, so
  this is a reparametrization; it keeps the optimal bias O(1) instead of
  O(|w| |mu|), which the descriptors' large common component would cause;
* the positive's term (a single row) is evaluated exactly at every step; only
  the average over the negatives is estimated from a mini-batch;
* step size eta_t = 1 / (lam (t + t0)) with t0 = 1 / (lam eta0) (Bottou's
  offset form of Pegasos' 1/(lam t), which for small lam otherwise starts with
  steps of size 1/lam); the bias takes steps ``bias_step`` times smaller;
* the returned (w, b) is the average of the iterates of the last ``average``
  fraction of the steps (suffix averaging, Rakhlin, Shamir & Sridharan 2012).

:func:`optimal_bias` gives the exact minimizer of J over b for a fixed w (J is
piecewise linear in b), and :func:`reference_exemplar` the exact optimum of J
from the dual QP, for checking the stochastic solver on small problems.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "hinge_objective",
    "optimal_bias",
    "pegasos_exemplars",
    "reference_exemplar",
]

#: Negatives scored at once when a full pass is needed (bounds a (B, rows) block).
_PASS_ROWS = 8192


def _negative_scores(W: np.ndarray, negatives: np.ndarray, rows: int = _PASS_ROWS):
    """Yield (W @ x_i for a block of negatives) blocks of shape (B, rows)."""
    for i in range(0, len(negatives), rows):
        yield W @ np.asarray(negatives[i : i + rows], dtype=np.float64).T


def hinge_objective(W, b, positives, negatives, lam: float, theta: float) -> np.ndarray:
    """J(w_j, b_j) (docs/math.md#esvm) for each row j of ``W`` with ``positives[j]``.

    W: (B, d); b: (B,); positives: (B, d); negatives: (n, d). Returns (B,).
    """
    W = np.atleast_2d(np.asarray(W, dtype=np.float64))
    b = np.atleast_1d(np.asarray(b, dtype=np.float64))
    positives = np.atleast_2d(np.asarray(positives, dtype=np.float64))
    s0 = np.einsum("ij,ij->i", W, positives) + b
    neg = np.zeros(len(W))
    for scores in _negative_scores(W, negatives):
        neg += np.maximum(0.0, 1.0 + scores + b[:, None]).sum(axis=1)
    n = len(negatives)
    return theta * np.maximum(0.0, 1.0 - s0) + neg / n + 0.5 * lam * np.einsum("ij,ij->i", W, W)


def optimal_bias(W, positives, negatives, theta: float) -> np.ndarray:
    """Exact argmin over b of J(w_j, b) for each row w_j of ``W``.

    J(b) is convex piecewise linear. With u = 1 - w.x0 and c_i = -1 - w.x_i
    sorted increasingly, its right derivative is -theta [b < u] + #{c_i <= b}/n,
    so the smallest minimizer is b* = min(u, c_(k)) with k = ceil(theta n) when
    theta <= 1, and b* = u when theta > 1 (the positive outweighs all negatives).
    One pass over the negatives: O(B n d).
    """
    W = np.atleast_2d(np.asarray(W, dtype=np.float64))
    positives = np.atleast_2d(np.asarray(positives, dtype=np.float64))
    u = 1.0 - np.einsum("ij,ij->i", W, positives)
    n = len(negatives)
    k = math.ceil(theta * n - 1e-9)
    if k > n:
        return u
    scores = np.concatenate(list(_negative_scores(W, negatives)), axis=1)
    # c_(k) = -1 - (k-th largest score) = -1 - (n-k+1)-th smallest score.
    kth_largest = np.partition(scores, n - k, axis=1)[:, n - k]
    return np.minimum(u, -1.0 - kth_largest)


def pegasos_exemplars(
    positives,
    negatives,
    mean,
    lam: float,
    theta: float,
    n_iter: int = 1000,
    batch_size: int = 128,
    eta0: float = 1.0,
    bias_step: float = 0.1,
    average: float = 0.5,
    random_state: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Approximate E-SVMs (W, b) of every row of ``positives`` against ``negatives``.

    positives: (B, d); negatives: (n, d); mean: (d,) the negatives' mean (the
    centring point; any fixed point gives the same minimizer). Returns W (B, d)
    and b (B,) in the original coordinates (w.x + b).

    The sequence of sampled mini-batches depends only on ``random_state``,
    ``n_iter``, ``batch_size`` and n: every positive sees the same negatives,
    so a row's result does not depend on which other rows share its batch.
    """
    P = np.array(positives, dtype=np.float64, order="C", copy=True)
    mean = np.asarray(mean, dtype=np.float64)
    P -= mean
    n = len(negatives)
    B, d = P.shape
    W = np.zeros((B, d))
    b = np.zeros(B)
    W_sum = np.zeros((B, d))
    b_sum = np.zeros(B)
    start_avg = n_iter - max(1, int(round(average * n_iter)))
    rng = np.random.default_rng(random_state)
    t0 = 1.0 / (lam * eta0)
    m = batch_size
    for t in range(1, n_iter + 1):
        idx = rng.integers(0, n, m)
        Xb = np.asarray(negatives[idx], dtype=np.float64) - mean  # (m, d)
        s0 = np.einsum("ij,ij->i", W, P) + b
        sn = W @ Xb.T
        sn += b[:, None]
        a0 = np.where(s0 < 1.0, theta, 0.0)  # positive's active weight
        an = (sn > -1.0).astype(np.float64) * (1.0 / m)  # negatives' active weights
        # Sub-gradient of J: lam w - a0 x0 + sum an_i x_i ; db: -a0 + sum an_i.
        grad_w = an @ Xb
        grad_w -= a0[:, None] * P
        grad_b = an.sum(axis=1) - a0
        eta = 1.0 / (lam * (t + t0))
        W *= 1.0 - eta * lam
        W -= eta * grad_w
        b -= (bias_step * eta) * grad_b
        if t > start_avg:
            W_sum += W
            b_sum += b
    count = n_iter - start_avg
    W = W_sum / count
    b = b_sum / count - W @ mean  # back from centred coordinates
    return W, b


def _project_box_budget(a, upper: float, budget: float) -> np.ndarray:
    """Euclidean projection onto {0 <= a_i <= upper, sum a <= budget} (bisection on the shift)."""
    p = np.clip(a, 0.0, upper)
    if p.sum() <= budget:
        return p
    lo, hi = 0.0, float(a.max())
    for _ in range(100):
        tau = 0.5 * (lo + hi)
        if np.clip(a - tau, 0.0, upper).sum() > budget:
            lo = tau
        else:
            hi = tau
    return np.clip(a - hi, 0.0, upper)


def reference_exemplar(
    x0, negatives, lam: float, theta: float, rtol: float = 1e-6, max_iter: int = 200_000
) -> tuple[np.ndarray, float, float, float]:
    """Exact E-SVM of one positive, from its dual, for checking the stochastic solver.

    With a_0 = sum_i a_i (the equality constraint of the bias), the dual of J is

        max_a  2 sum_i a_i - |sum_i a_i (x0 - x_i)|^2 / (2 lam)
        s.t.   0 <= a_i <= 1/n,  sum_i a_i <= theta,

    and w = sum_i a_i (x0 - x_i) / lam. It is solved by accelerated projected
    gradient (FISTA with restarts), O(n d) per iteration, until the duality gap
    J(w, b*(w)) - D(a) is below ``rtol`` J; b comes from :func:`optimal_bias`.
    Returns (w, b, J(w, b), D(a)): D(a) <= min J <= J(w, b) certifies the result.
    """
    x0 = np.asarray(x0, dtype=np.float64)
    negatives = np.asarray(negatives, dtype=np.float64)
    n = len(negatives)
    M = x0 - negatives  # (n, d) rows x0 - x_i
    L = np.linalg.norm(M, 2) ** 2 / lam  # Lipschitz constant of the gradient
    upper, budget = 1.0 / n, float(theta)

    def dual(a):
        v = a @ M
        return 2.0 * a.sum() - v @ v / (2.0 * lam), v

    def primal(a):
        w = (a @ M) / lam
        b = float(optimal_bias(w[None], x0[None], negatives, theta)[0])
        return w, b, float(hinge_objective(w[None], [b], x0[None], negatives, lam, theta)[0])

    a = np.zeros(n)
    z, t_k, prev = a.copy(), 1.0, -np.inf
    for it in range(1, max_iter + 1):
        _, v = dual(z)
        grad = 2.0 - (M @ v) / lam
        a_new = _project_box_budget(z + grad / L, upper, budget)
        value = dual(a_new)[0]
        if value < prev:  # restart the momentum when the dual goes down
            z, t_k = a.copy(), 1.0
            continue
        t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t_k * t_k))
        z = a_new + ((t_k - 1.0) / t_new) * (a_new - a)
        a, t_k, prev = a_new, t_new, value
        if it % 200 == 0:
            w, b, J = primal(a)
            if J - value <= rtol * abs(J):
                return w, b, J, value
    w, b, J = primal(a)
    return w, b, J, dual(a)[0]
