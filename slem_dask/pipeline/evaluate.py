"""Retrieval evaluation of SLEM against its baselines.

* :data:`METHODS` names the encoders a results table compares (raw features,
  PCA whitening, E-SVM, linear SLEM, kernel SLEM);
* :func:`evaluate_methods` fits each on the negatives, encodes database and
  queries, searches exactly and measures mAP, P@k, encode time per positive
  and total time; :func:`pr_curve` gives each method's precision-recall curve;
* :func:`format_table` and :func:`plot_pr_curves` present them;
* :func:`evaluate_job` is the ``slem-dask evaluate`` command (zarr in, table / PNG
  out); ``slem-dask search`` is :func:`slem_dask.pipeline.search.search_job`,
  importable from here as before.
"""

from __future__ import annotations

import os
import time

import dask
import numpy as np

from .. import storage
from ..parallel.blocks import scatter_large_arrays
from . import JobReport
from .search import check_search_inputs, open_search_result, search_job  # noqa: F401
from ..retrieval.metrics import mean_average_precision, precision_recall_at_k
from ..retrieval.topk import search
from ..core.validation import check_rows, is_dask_array, rows_text

__all__ = [
    "METHODS",
    "parse_methods",
    "make_estimator",
    "relevant_from_labels",
    "pr_curve",
    "evaluate_methods",
    "parameter_grid",
    "grid_search",
    "format_table",
    "plot_pr_curves",
    "search_job",
    "open_search_result",
    "evaluate_job",
    "export_faiss",
]

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
        # The demo's kernel settings: rank-256 rbf by randomly pivoted Cholesky (a few
        # passes over the negatives), gamma ~ 1 / median squared distance of unit rows.
        defaults = {"kernel": "rbf", "gamma": 0.5, "rank": 256, "pivoting": "rpcholesky",
                    "tol": 0.0, "random_state": 0}
        return KernelSLEM(**{**defaults, **params})
    classes = {"raw": RawFeatures, "pca": PCAWhitening, "esvm": ESVM, "slem": LinearSLEM}
    if name not in classes:
        parse_methods([name])
    return classes[name](**params)


def relevant_from_labels(database_labels, query_labels) -> list[np.ndarray]:
    """Database indices sharing each query's label; an error names queries with none."""
    database_labels = np.asarray(database_labels)
    query_labels = np.asarray(query_labels)
    if database_labels.ndim != 1 or query_labels.ndim != 1:
        raise ValueError(
            f"labels must be 1-D, got database_labels shape {database_labels.shape} and "
            f"query_labels shape {query_labels.shape}"
        )
    order = np.argsort(database_labels, kind="stable")
    sorted_labels = database_labels[order]
    starts = np.searchsorted(sorted_labels, query_labels, "left")
    ends = np.searchsorted(sorted_labels, query_labels, "right")
    empty = np.flatnonzero(ends == starts)
    if empty.size:
        shown = rows_text(empty, empty.size)
        raise ValueError(
            f"query_labels: {empty.size} of {len(query_labels)} queries (indices {shown}) "
            f"have a label that no database row has, so their relevant set is empty and "
            f"their AP undefined; drop those queries or add their matches to the database"
        )
    return [np.sort(order[s:e]) for s, e in zip(starts, ends, strict=True)]


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


def evaluate_methods(negatives, database, queries, relevant, methods=("raw", "pca", "esvm", "slem"),
                     k: int | None = None, p_at: int | None = None,
                     params: dict[str, dict] | None = None, curves: bool = True,
                     min_time: float = 0.0):
    """Fit each method on ``negatives``, encode database and queries, search, score.

    Arrays may be numpy or dask (dask ones are computed where needed, on the
    current scheduler). ``params``: method name -> constructor parameters.
    ``k``: ranking length (default: the whole database up to 10,000 rows).
    ``p_at``: the k of P@k (default: the median size of the relevant sets).

    ``min_time``: encoding is repeated until this many seconds have passed (at
    most 50 runs) and the fastest run is reported: steadier timings of fast
    encoders (benchmarks). Total time counts one run of each step.

    Returns (rows, curves): rows are dicts with method, mAP, P@k, fit time,
    encode time per positive and total time; curves maps method -> (recall,
    precision) from :func:`pr_curve`.
    """
    methods = parse_methods(methods)
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

    relevant = _check_per_query(relevant, "relevant", queries.shape[0])
    for i, rel in enumerate(relevant):
        if rel.size == 0:
            raise ValueError(f"relevant[{i}] is empty: query {i} has no relevant item; "
                             f"drop that query")
    n_db = database.shape[0]
    if k is None:
        k = min(n_db, _FULL_RANKING_MAX)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 or k > n_db:
        raise ValueError(f"k must be an integer between 1 and the database size {n_db}, "
                         f"got {k!r}")
    if p_at is None:
        p_at = max(1, int(np.median([len(r) for r in relevant])))
    params = params or {}
    n_positives = database.shape[0] + queries.shape[0]
    rows, pr = [], {}
    for name in methods:
        model = make_estimator(name, params.get(name))
        t0 = time.perf_counter()
        model.fit(negatives)
        t1 = time.perf_counter()
        db = _as_numpy(model.transform(database))
        q = _as_numpy(model.transform(queries))
        t2 = time.perf_counter()
        encode = best = t2 - t1
        for _ in range(49):
            if encode >= min_time:
                break
            t = time.perf_counter()
            _as_numpy(model.transform(database))
            _as_numpy(model.transform(queries))
            run = time.perf_counter() - t
            encode, best = encode + run, min(best, run)
        t_search = time.perf_counter()
        _, indices = search(q, db, k)
        t3 = time.perf_counter()
        t3 = (t2 - t0) + (t3 - t_search)  # total: one fit, one encode, one search
        p, _ = precision_recall_at_k(indices, relevant, p_at)
        rows.append({
            "method": name,
            "mAP": mean_average_precision(indices, relevant),
            f"P@{p_at}": p,
            "fit [s]": t1 - t0,
            "encode/positive [s]": best / n_positives,
            "total [s]": t3,
        })
        if curves:
            pr[name] = pr_curve(indices, relevant)
    return rows, pr


def parameter_grid(grid: dict | None) -> list[dict]:
    """Every combination of a {param: [values]} grid, in order (the last key varies
    fastest); a scalar value counts as a one-value list; {} or None gives [{}]."""
    import itertools

    grid = {k: (list(v) if isinstance(v, (list, tuple, np.ndarray)) else [v])
            for k, v in (grid or {}).items()}
    for name, values in grid.items():
        if not values:
            raise ValueError(f"grid: parameter {name!r} has no values; give at least one")
    return [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]


def _format_setting(params: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in params.items()) or "defaults"


def grid_search(negatives, database, queries, relevant, grids: dict[str, dict],
                k: int | None = None, p_at: int | None = None, curves: bool = False,
                min_time: float = 0.0):
    """Evaluate every setting of each method's parameter grid on a retrieval corpus.

    ``grids``: method name -> {parameter: [values]} (a method with {} runs once
    with its defaults), e.g. ``{"slem": {"lam": [1e-3, 1e-2, 1e-1]}, "kernel":
    {"gamma": [0.25, 0.5, 1.0], "rank": [128, 256]}, "esvm": {"lam": [1e-2, 1e-1],
    "n_iter": [1000, 3000]}}``. Each setting is fitted on ``negatives`` and scored
    as in :func:`evaluate_methods` (same arguments).

    Returns (rows, best, curves): rows as :func:`evaluate_methods`'s plus
    "setting" (the parameters, as text) and "best" ("*" on the setting of highest
    mAP of each method; ties to the first); ``best`` maps method -> its best
    parameters; ``curves`` maps method -> the PR curve of its best setting (empty
    unless ``curves=True``).
    """
    methods = parse_methods(list(grids))
    rows, best, best_curves = [], {}, {}
    for method in methods:
        settings = parameter_grid(grids[method])
        scored = []
        for params in settings:
            (row,), pr = evaluate_methods(negatives, database, queries, relevant, [method],
                                          k=k, p_at=p_at, params={method: params},
                                          curves=curves, min_time=min_time)
            row = {"method": method, "setting": _format_setting(params), **{
                key: value for key, value in row.items() if key != "method"}, "best": ""}
            scored.append((row, params, pr.get(method)))
        top = max(range(len(scored)), key=lambda i: (scored[i][0]["mAP"], -i))
        scored[top][0]["best"] = "*"
        best[method] = scored[top][1]
        if curves:
            best_curves[method] = scored[top][2]
        rows += [r for r, _, _ in scored]
    return rows, best, best_curves


def format_table(rows: list[dict]) -> str:
    """Aligned text table; floats with 4 significant digits."""
    cols = list(rows[0])

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4f}" if 1e-3 <= abs(v) < 1e4 or v == 0 else f"{v:.3e}"
        return str(v)

    text = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in text)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)) for t in text]
    return "\n".join(lines)


def plot_pr_curves(curves: dict, path: str, title: str = "precision-recall",
                   maps: dict | None = None) -> str:
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


# -- jobs -----------------------------------------------------------------

def _open_corpus(path: str):
    import zarr

    try:
        group = storage.open_node(path)
        if isinstance(group, zarr.Array):
            raise zarr.errors.ContainsArrayError(str(path))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"corpus: no zarr group at {path!r}; write one with "
            f"slem_dask.datasets.write_corpus or `slem-dask demo` (its workdir/corpus.zarr)"
        ) from None
    except zarr.errors.ContainsArrayError:
        parent = os.path.dirname(str(path).rstrip("/")) or "."
        raise ValueError(
            f"corpus: {path!r} is a zarr array, not a corpus group; give the group that "
            f"holds negatives, database, queries and their labels, e.g. {parent!r}"
        ) from None
    except Exception as exc:
        raise ValueError(f"corpus: {path!r} is not a zarr group ({type(exc).__name__}: {exc}); "
                         f"give a corpus group as written by `slem-dask demo` "
                         f"(its workdir/corpus.zarr)") from None
    needed = ("negatives", "database", "queries", "database_labels", "query_labels")
    missing = [n for n in needed if n not in group]
    if missing:
        raise ValueError(
            f"corpus: {path!r} lacks {', '.join(missing)}; a corpus group holds "
            f"{', '.join(needed)} (as written by slem_dask.datasets.write_corpus)"
        )
    return group


def check_plot_path(plot: str | None) -> None:
    """A PNG path whose folder exists and is writable, checked before any computation."""
    if plot is None:
        return
    import os

    folder = os.path.dirname(os.path.abspath(str(plot)))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"--plot: folder {folder!r} does not exist; create it first "
                                f"(mkdir -p {folder}) or give another path for {plot!r}")
    if not os.access(folder, os.W_OK):
        raise PermissionError(f"--plot: folder {folder!r} is not writable; give another "
                              f"path for {plot!r}")
    if os.path.isdir(str(plot)):
        raise IsADirectoryError(f"--plot: {plot!r} is a folder; give a file name such as "
                                f"{os.path.join(str(plot), 'pr.png')}")


#: What ``evaluate`` reads: a corpus group's members, or one's own paths (``arrays``).
EVALUATE_INPUTS = ("negatives", "database", "queries", "database_labels", "query_labels")


def _open_evaluate_arrays(corpus, arrays: dict | None):
    """(negatives, database, queries, relevant): from the corpus group, or from
    ``arrays`` (name -> path of descriptors in any input format, and of labels)."""
    if arrays is None:
        group = _open_corpus(corpus)
        arrays = {n: f"{str(corpus).rstrip('/')}/{n}" for n in EVALUATE_INPUTS[:3]}
        labels = (group["database_labels"][...], group["query_labels"][...])
    elif [n for n in EVALUATE_INPUTS if not arrays.get(n)]:
        raise ValueError(f"evaluate: give {', '.join(EVALUATE_INPUTS)} (missing: "
                         f"{', '.join(n for n in EVALUATE_INPUTS if not arrays.get(n))})")
    neg, db, q = (storage.open_input(arrays[n], n) for n in EVALUATE_INPUTS[:3])
    if corpus is None:
        labels = (storage.read_labels(arrays["database_labels"], "database labels",
                                      db.shape[0]),
                  storage.read_labels(arrays["query_labels"], "query labels", q.shape[0]))
    return neg, db, q, relevant_from_labels(*labels)


def check_evaluate_inputs(corpus, methods, n_negatives: int | None, k: int | None,
                          plot: str | None = None, arrays: dict | None = None):
    """Validate everything the evaluate job can check from metadata, before any compute.
    ``arrays``: one's own labelled descriptors instead of a corpus (``corpus`` None):
    paths by the names of :data:`EVALUATE_INPUTS`."""
    check_plot_path(plot)
    methods = parse_methods(methods)
    neg, db, q, relevant = _open_evaluate_arrays(corpus, arrays)
    where = "corpus" if arrays is None else "evaluate"
    for name, arr in (("database", db), ("queries", q)):
        if arr.shape[1] != neg.shape[1]:
            raise ValueError(f"{where}: {name} has {arr.shape[1]} features but negatives "
                             f"have {neg.shape[1]}")
    if n_negatives is not None and n_negatives > neg.shape[0]:
        raise ValueError(
            f"--negatives {n_negatives} is more than the corpus holds ({neg.shape[0]}); "
            f"use --negatives {neg.shape[0]} or less"
        )
    if n_negatives is not None and n_negatives < 2:
        raise ValueError(f"--negatives must be at least 2, got {n_negatives}")
    if k is not None and k > db.shape[0]:
        raise ValueError(f"k={k} is larger than the database ({db.shape[0]} rows); use "
                         f"--k {db.shape[0]} or less")
    return methods, neg, db, q, relevant


def evaluate_job(client, corpus: str, methods="raw,pca,esvm,slem", n_negatives: int | None = None,
                 k: int | None = None, p_at: int | None = None, plot: str | None = None,
                 params: dict[str, dict] | None = None,
                 partition_rows: int | None = None, grids: dict[str, dict] | None = None,
                 arrays: dict | None = None):
    """Results table (and optionally a PR plot) of ``methods`` on a corpus zarr group,
    or on one's own labelled descriptors (``arrays``, ``corpus`` None: see
    :func:`check_evaluate_inputs`).

    Each method is fitted on the first ``n_negatives`` negatives (default all)
    and encodes the database and the queries; relevance comes from the labels.
    Fitting and encoding run on ``client`` (dask arrays read from zarr).
    ``grids``: method -> {parameter: [values]}; a method with a grid of more than
    one setting gets one row per setting (columns "setting" and "best", see
    :func:`grid_search`), and the plot shows its best setting.
    Returns (rows, curves, report).
    """
    t0 = time.perf_counter()
    methods, neg, db, q, relevant = check_evaluate_inputs(corpus, methods, n_negatives, k,
                                                          plot, arrays)
    source = {"corpus": str(corpus)} if arrays is None else {"from": "own descriptors"}
    negatives = storage.dask_rows(neg, partition_rows)
    if n_negatives is not None:
        negatives = negatives[:n_negatives]
    database = storage.dask_rows(db, partition_rows)
    queries = storage.dask_rows(q, partition_rows)
    grids = {m: {**(params or {}).get(m, {}), **(grids or {}).get(m, {})} for m in methods}
    with scatter_large_arrays(client):  # E-SVM's negatives: once to the workers
        if all(len(parameter_grid(g)) == 1 for g in grids.values()):
            rows, curves = evaluate_methods(negatives, database, queries, relevant, methods,
                                            k=k, p_at=p_at, params={m: parameter_grid(g)[0]
                                                                    for m, g in grids.items()})
        else:
            rows, _, curves = grid_search(negatives, database, queries, relevant, grids, k=k,
                                          p_at=p_at, curves=True)
    report = JobReport("evaluate")
    report.facts.update({**source, "negatives": negatives.shape[0],
                         "database": db.shape[0], "queries": q.shape[0],
                         "features": db.shape[1], "methods": ",".join(methods)})
    if plot:
        where = corpus or arrays["database"]
        plot_pr_curves(curves, plot, title=f"{where}: {negatives.shape[0]} negatives",
                       maps={r["method"]: r["mAP"] for r in rows if r.get("best", "*")})
        report.facts["plot"] = str(plot)
    report.timings["total"] = time.perf_counter() - t0
    return rows, curves, report


# -- FAISS ----------------------------------------------------------------

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
