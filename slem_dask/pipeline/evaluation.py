"""The retrieval evaluation protocol of SLEM against its baselines (no storage: arrays in,
numbers out; the ``slem-dask evaluate`` job that reads a corpus is :mod:`.evaluate`).

* :data:`METHODS` names the encoders a results table compares (raw features,
  PCA whitening, E-SVM, linear SLEM, kernel SLEM);
* :func:`evaluate_methods` fits each on the negatives, encodes database and
  queries, searches exactly and measures mAP, P@k, encode time per positive
  and total time; :func:`pr_curve` gives each method's precision-recall curve;
  :func:`grid_search` does so for each setting of a parameter grid;
* :func:`format_table` and :func:`plot_pr_curves` present them; :func:`export_faiss`
  hands encodings to FAISS.
"""

from __future__ import annotations

import contextlib
import time

import dask
import numpy as np

from ..retrieval.metrics import (
    ann_recalls,
    check_neighbors,
    mean_average_precision,
    precision_recall_at_k,
)
from ..retrieval.topk import search
from ..core.validation import check_rows, is_dask_array
from .labels import relevant_from_labels  # noqa: F401 - re-exported: its callers import it here


#: Method name -> description, in the order of the paper's tables.
METHODS = {
    "raw": "raw features (L2-normalized)",
    "pca": "PCA + whitening",
    "esvm": "E-SVM (hinge, SGD)",
    "slem": "linear SLEM",
    "kernel": "kernel SLEM",
}

#: Longest full ranking kept for mAP and PR curves when k is not given.
_FULL_RANKING_MAX = 10_000
#: Results the recall figures count (R@10, 10-R@10): the ranking length without labels.
_RECALL_RESULTS = 10


def parse_methods(text) -> list[str]:
    """'raw,pca,slem' (or a list) -> ['raw', 'pca', 'slem'], refusing unknown names."""
    names = [m.strip().lower() for m in (text.split(",") if isinstance(text, str) else text)]
    names = [m for m in names if m]
    if not names:
        raise ValueError(f"methods: no method given; choose from {', '.join(METHODS)}")
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise ValueError(
            f"methods: unknown method(s) {', '.join(map(repr, unknown))}; the allowed "
            f"methods are {', '.join(METHODS)} (comma-separated, e.g. raw,pca,slem,esvm)"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"methods: {text!r} names a method twice")
    return names


def make_estimator(name: str, params: dict | None = None):
    """A fresh, unfitted estimator for method ``name``; ``params`` go to its constructor."""
    from ..models import ESVM, LinearSLEM, PCAWhitening, RawFeatures

    params = dict(params or {})
    if name == "kernel":
        try:
            from ..models import KernelSLEM
        except ImportError:  # pragma: no cover - depends on the installed version
            raise ValueError("methods: this slem-dask has no kernel SLEM model") from None
        # the library's defaults (models.kernel_defaults), as fit --kernel has them
        return KernelSLEM(**params)
    classes = {"raw": RawFeatures, "pca": PCAWhitening, "esvm": ESVM, "slem": LinearSLEM}
    if name not in classes:
        parse_methods([name])
    return classes[name](**params)


def pr_curve(indices, relevant, n_points: int = 101) -> tuple[np.ndarray, np.ndarray]:
    """Mean interpolated precision-recall curve over queries.

    For each query, precision at recall r is the best precision at any rank
    whose recall is >= r (the usual interpolation; 0 for recall levels the
    ranked list never reaches). Returns (recall levels, mean precision).
    """
    from ..retrieval.metrics import _check_per_query

    indices = np.asarray(indices)
    relevant = _check_per_query(relevant, "relevant", len(indices))
    levels = np.linspace(0.0, 1.0, n_points)
    total = np.zeros(n_points)
    for ranking, rel in zip(indices, relevant, strict=True):
        hits = np.isin(ranking, rel)
        cum = np.cumsum(hits)
        precision = cum / np.arange(1, len(ranking) + 1)
        recall = cum / len(rel)
        # best precision at recall >= r: running max from the end
        best = np.maximum.accumulate(precision[::-1])[::-1]
        pos = np.searchsorted(recall, levels, side="left")
        reached = pos < len(ranking)
        total[reached] += best[pos[reached]]
    return levels, total / len(indices)


def _as_numpy(x):
    if is_dask_array(x):
        (x,) = dask.compute(x)
    return np.asarray(x)


def evaluate_methods(
    negatives,
    database,
    queries,
    relevant,
    methods=("raw", "pca", "esvm", "slem"),
    k: int | None = None,
    p_at: int | None = None,
    params: dict[str, dict] | None = None,
    curves: bool = True,
    min_time: float = 0.0,
    ground_truth=None,
):
    """Fit each method on ``negatives``, encode database and queries, search, score.

    Arrays may be numpy or dask (dask ones are computed where needed, on the
    current scheduler). ``params``: method name -> constructor parameters.
    ``k``: ranking length (default: the whole database up to 10,000 rows).
    ``p_at``: the k of P@k (default: the median size of the relevant sets).

    ``min_time``: encoding is repeated until this many seconds have passed (at
    least 3 and at most 50 runs) and the fastest run is reported: steadier timings
    (benchmarks). Total time counts one run of each step.

    ``ground_truth``: (n_queries, k') ids of each query's true nearest database rows,
    nearest first (e.g. :func:`slem_dask.pipeline.ground_truth.read_ground_truth`):
    the rows then also hold 1-R@1, R@10 and 10-R@10
    (:func:`slem_dask.retrieval.metrics.ann_recalls`), and ``relevant`` may be None
    (no mAP, P@k or curves; the ranking is then 10 long unless ``k`` says otherwise).

    Returns (rows, curves): rows are dicts with method, mAP, P@k, fit time,
    encode time per positive and total time; curves maps method -> (recall,
    precision) from :func:`pr_curve`.
    """
    methods = parse_methods(methods)
    negatives, database, queries, relevant = _checked_arrays(
        negatives, database, queries, relevant, ground_truth is not None
    )
    if ground_truth is not None:
        ground_truth = check_neighbors(ground_truth, queries.shape[0], database.shape[0])
    k = _ranking_length(k, database.shape[0], relevant is None, ground_truth is not None)
    params = params or {}
    rows, pr = [], {}
    scoring = (relevant, _checked_p_at(p_at, relevant), ground_truth)
    for name in methods:
        with _rows_kept_on_failure(rows, name):
            row, indices = _measure(
                name,
                make_estimator(name, params.get(name)),
                negatives,
                database,
                queries,
                scoring,
                k,
                min_time,
            )
        rows.append(row)
        if curves and relevant is not None:
            pr[name] = pr_curve(indices, relevant)
    return rows, pr


@contextlib.contextmanager
def _rows_kept_on_failure(rows: list[dict], method: str):
    """On a failure of ``method``, the rows of the table computed before it travel with
    the exception (``exc.evaluated_rows``, ``exc.failed_method``), so that the caller can
    still show them: an hour of fits is not lost to the last method's error."""
    try:
        yield
    except Exception as exc:
        if len(rows) >= len(getattr(exc, "evaluated_rows", ())):  # a grid's rows too
            exc.evaluated_rows, exc.failed_method = list(rows), method  # type: ignore[attr-defined]
        raise


def _checked_p_at(p_at, relevant) -> int | None:
    """The k of P@k: ``p_at``, checked, or the median size of the relevant sets."""
    if p_at is None and relevant is not None:
        return max(1, int(np.median([len(r) for r in relevant])))
    if p_at is not None and (
        isinstance(p_at, bool) or not isinstance(p_at, (int, np.integer)) or p_at < 1
    ):
        # checked before any method is fitted, and named as the caller spelled it
        raise ValueError(f"p_at (the k of P@k) must be an integer >= 1, got {p_at!r}")
    return p_at


def _ranking_length(k, n_db: int, unlabelled: bool, recalls: bool) -> int:
    """The ranking length: ``k``, checked, or the default (the whole database up to
    10,000 for mAP; 10 for the recall figures alone); at least 10 for R@10."""
    if k is None:
        k = min(n_db, _RECALL_RESULTS if unlabelled else _FULL_RANKING_MAX)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 or k > n_db:
        raise ValueError(f"k must be an integer between 1 and the database size {n_db}, got {k!r}")
    if recalls and k < min(n_db, _RECALL_RESULTS):
        raise ValueError(
            f"k={k} is shorter than the {_RECALL_RESULTS} results that R@10 and 10-R@10 "
            f"count; use k >= {_RECALL_RESULTS} (--k {_RECALL_RESULTS}), or leave k out"
        )
    return int(k)


def _checked_arrays(negatives, database, queries, relevant, unlabelled_ok: bool = False):
    """The three arrays and the relevant sets, checked (rows, features, one non-empty
    relevant set per query); ``relevant`` None is allowed with ``unlabelled_ok`` (a
    ground truth scores the rankings instead)."""
    negatives = check_rows(negatives, "negatives", min_rows=2)
    database = check_rows(database, "database")
    queries = check_rows(queries, "queries")
    for name, arr in (("database", database), ("queries", queries)):
        if arr.shape[1] != negatives.shape[1]:
            raise ValueError(
                f"{name} has {arr.shape[1]} features but negatives have "
                f"{negatives.shape[1]}; all three must be descriptors of the same dimension"
            )
    from ..retrieval.metrics import _check_per_query

    if relevant is None:
        if not unlabelled_ok:
            raise ValueError(
                "relevant is None: give the relevant database rows of each query "
                "(relevant_from_labels), or a nearest-neighbour ground truth"
            )
        return negatives, database, queries, None
    relevant = _check_per_query(relevant, "relevant", queries.shape[0])
    for i, rel in enumerate(relevant):
        if rel.size == 0:
            raise ValueError(
                f"relevant[{i}] is empty: query {i} has no relevant item; drop that query"
            )
    return negatives, database, queries, relevant


def _measure(name: str, model, negatives, database, queries, scoring, k: int, min_time: float):
    """One method's row of the table (``model`` fitted, its encodings searched and
    scored by ``scoring``: relevant sets, the k of P@k, ground truth) and its ranking."""
    n_positives = database.shape[0] + queries.shape[0]
    t0 = time.perf_counter()
    model.fit(negatives)
    t1 = time.perf_counter()
    db = _as_numpy(model.transform(database))
    q = _as_numpy(model.transform(queries))
    t2 = time.perf_counter()
    best = _fastest_encode(model, database, queries, t2 - t1, min_time)
    t_search = time.perf_counter()
    _, indices = search(q, db, k)
    t3 = time.perf_counter()
    total = (t2 - t0) + (t3 - t_search)  # one fit, one encode, one search
    return {
        "method": name,
        **_ranking_scores(indices, *scoring),
        "fit [s]": t1 - t0,
        "encode/positive [s]": best / n_positives,
        "total [s]": total,
    }, indices


def _ranking_scores(indices, relevant, p_at, ground_truth) -> dict:
    """mAP and P@k where there are relevant sets, and the ANN recall figures where there
    is a ground truth."""
    row = {}
    if relevant is not None:
        row["mAP"] = mean_average_precision(indices, relevant)
        row[f"P@{p_at}"] = precision_recall_at_k(indices, relevant, p_at)[0]
    if ground_truth is not None:
        row.update(ann_recalls(indices, ground_truth))
    return row


def _fastest_encode(model, database, queries, first: float, min_time: float) -> float:
    """The fastest of the encodings repeated until ``min_time`` seconds have passed (at
    most 50 runs, the first of which took ``first`` seconds).

    With ``min_time > 0`` every method gets at least three runs, so a slow encoder's
    best is not one cold run set beside a fast encoder's best of many."""
    min_runs = 3 if min_time > 0 else 1
    encode = best = first
    for runs in range(1, 50):
        if encode >= min_time and runs >= min_runs:
            break
        t = time.perf_counter()
        _as_numpy(model.transform(database))
        _as_numpy(model.transform(queries))
        run = time.perf_counter() - t
        encode, best = encode + run, min(best, run)
    return best


def parameter_grid(grid: dict | None) -> list[dict]:
    """Every combination of a {param: [values]} grid, in order (the last key varies
    fastest); a scalar value counts as a one-value list; {} or None gives [{}]."""
    import itertools

    grid = {
        k: (list(v) if isinstance(v, (list, tuple, np.ndarray)) else [v])
        for k, v in (grid or {}).items()
    }
    for name, values in grid.items():
        if not values:
            raise ValueError(f"grid: parameter {name!r} has no values; give at least one")
    return [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]


def _format_setting(params: dict) -> str:
    return (
        ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
        or "defaults"
    )


def grid_search(
    negatives,
    database,
    queries,
    relevant,
    grids: dict[str, dict],
    k: int | None = None,
    p_at: int | None = None,
    curves: bool = False,
    min_time: float = 0.0,
    ground_truth=None,
):
    """Evaluate every setting of each method's parameter grid on a retrieval corpus.

    ``grids``: method name -> {parameter: [values]} (a method with {} runs once
    with its defaults), e.g. ``{"slem": {"lam": [1e-3, 1e-2, 1e-1]}, "kernel":
    {"gamma": [0.25, 0.5, 1.0], "rank": [128, 256]}, "esvm": {"lam": [1e-2, 1e-1],
    "n_iter": [1000, 3000]}}``. Each setting is fitted on ``negatives`` and scored
    as in :func:`evaluate_methods` (same arguments).

    Returns (rows, best, curves): rows as :func:`evaluate_methods`'s plus
    "setting" (the parameters, as text) and "best" ("*" on the setting of highest
    mAP of each method, or without relevant sets of highest 10-R@10, else 1-R@1;
    ties to the first); ``best`` maps method -> its best parameters; ``curves`` maps
    method -> the PR curve of its best setting (empty unless ``curves=True``).
    """
    methods = parse_methods(list(grids))
    rows, best, best_curves = [], {}, {}
    for method in methods:
        settings = parameter_grid(grids[method])
        scored = []
        for params in settings:
            with _rows_kept_on_failure(rows + [r for r, _, _ in scored], method):
                (row,), pr = evaluate_methods(
                    negatives,
                    database,
                    queries,
                    relevant,
                    [method],
                    k=k,
                    p_at=p_at,
                    params={method: params},
                    curves=curves,
                    min_time=min_time,
                    ground_truth=ground_truth,
                )
            row = {
                "method": method,
                "setting": _format_setting(params),
                **{key: value for key, value in row.items() if key != "method"},
                "best": "",
            }
            scored.append((row, params, pr.get(method)))
        top = max(range(len(scored)), key=lambda i: (_best_by(scored[i][0]), -i))
        scored[top][0]["best"] = "*"
        best[method] = scored[top][1]
        if curves:
            best_curves[method] = scored[top][2]
        rows += [r for r, _, _ in scored]
    return rows, best, best_curves


def _best_by(row: dict) -> float:
    """What a grid's best setting maximizes: mAP, or else the finest recall figure."""
    return next(row[key] for key in ("mAP", "10-R@10", "R@10", "1-R@1") if key in row)


def format_table(rows: list[dict]) -> str:
    """Aligned text table; floats with 4 decimals, or with 4 significant digits in
    scientific notation below 1e-3 and from 1e4."""
    cols = list(rows[0])

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4f}" if 1e-3 <= abs(v) < 1e4 or v == 0 else f"{v:.3e}"
        return str(v)

    text = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in text)) for i, c in enumerate(cols)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)) for t in text]
    return "\n".join(lines)


def plot_pr_curves(
    curves: dict, path: str, title: str = "precision-recall", maps: dict | None = None
) -> str:
    """Save a PNG of one precision-recall curve per method; return ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=100)
    for name, (recall, precision) in curves.items():
        label = METHODS.get(name, name)
        if maps and name in maps:
            label += f" (mAP {maps[name]:.3f})"
        ax.plot(recall, precision, label=label, linewidth=1.6)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision (interpolated, mean over queries)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="lower left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def export_faiss(encodings, path: str | None = None):
    """An exact inner-product FAISS index (IndexFlatIP) of the rows of ``encodings``.

    Optional: needs ``pip install 'slem-dask[faiss]'`` (faiss-cpu). The rows go
    in as float32, in order, so FAISS ids are row indices; for L2-normalized
    encodings inner product is cosine, the score :func:`slem_dask.search` uses.
    With ``path`` the index is also written with ``faiss.write_index``.
    """
    try:
        import faiss
    except ImportError:
        raise ImportError(
            "export_faiss needs the faiss-cpu package; install it with "
            "pip install 'slem-dask[faiss]'"
        ) from None
    x = np.ascontiguousarray(_as_numpy(check_rows(encodings, "encodings")), dtype=np.float32)
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    if path is not None:
        faiss.write_index(index, str(path))
    return index
