"""Retrieval evaluation of SLEM against its baselines: the ``slem-dask evaluate`` job.

* :func:`evaluate_job` is the ``slem-dask evaluate`` command (zarr in, table / PNG
  out), :func:`check_evaluate_inputs` its checks before a cluster starts;
* the protocol it runs (:data:`METHODS`, :func:`evaluate_methods`, :func:`grid_search`,
  :func:`pr_curve`, :func:`format_table`, :func:`plot_pr_curves`, :func:`export_faiss`)
  is :mod:`.evaluation`'s, importable from here as before; ``slem-dask search`` is
  :func:`slem_dask.pipeline.search.search_job`, importable from here as before.
"""

from __future__ import annotations

import os
import time

from .. import storage
from ..parallel.blocks import scatter_large_arrays
from . import JobReport
from .ground_truth import GROUND_TRUTH_OPTION, read_ground_truth
from .search import check_search_inputs, open_search_result, search_job  # noqa: F401
from .evaluation import (
    METHODS,
    _ranking_length,
    evaluate_methods,
    export_faiss,
    format_table,  # noqa: F401
    grid_search,
    make_estimator,
    parameter_grid,
    parse_methods,
    plot_pr_curves,
    pr_curve,
    relevant_from_labels,
)

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


# -- jobs -----------------------------------------------------------------


_CORPUS_FIX = (
    "; give a corpus group, as written by slem_dask.datasets.write_corpus or "
    "`slem-dask demo` (its workdir/corpus.zarr)"
)


def _open_corpus(path: str):
    group = storage.open_written_group(path, "corpus", _CORPUS_FIX, lambda: _array_fix(path))
    missing = [n for n in EVALUATE_INPUTS if n not in group]
    kind = (group.attrs.get(storage.ATTR) or {}).get("kind")
    if missing and kind in ("model", "search"):
        said = storage.KIND_NAMES[kind]
        raise ValueError(f"corpus: {path!r} is {said} of slem-dask, not a corpus{_CORPUS_FIX}")
    if missing:
        raise ValueError(
            f"corpus: {path!r} lacks {', '.join(missing)}; a corpus group holds "
            f"{', '.join(EVALUATE_INPUTS)} (as written by slem_dask.datasets.write_corpus)"
        )
    return group


def _array_fix(path: str) -> str:
    """What to give instead of the array at ``path``: the group around it when that is
    a corpus (``corpus.zarr/negatives``), else any corpus group."""
    import zarr

    parent = os.path.dirname(str(path).rstrip("/"))
    try:
        around = storage.open_node(parent) if parent else None
    except Exception:  # noqa: BLE001 - no group around it: the general advice stands
        around = None
    is_corpus = isinstance(around, zarr.Group) and all(n in around for n in EVALUATE_INPUTS)
    if is_corpus:
        return f"; give the corpus group that holds it, {parent!r}"
    return _CORPUS_FIX


def check_plot_path(plot: str | None) -> None:
    """A PNG path whose folder exists and is writable, checked before any computation."""
    from ..cluster.preflight import check_output_file

    check_output_file("--plot", plot, "pr.png")


#: What ``evaluate`` reads: a corpus group's members, or one's own paths (``arrays``).
EVALUATE_INPUTS = ("negatives", "database", "queries", "database_labels", "query_labels")
#: How messages name one's own files (``arrays``): the `slem-dask evaluate` options that
#: give them; a corpus' members keep their names.
OWN_OPTIONS = {
    "negatives": "--negatives-from",
    "database": "--database",
    "queries": "--queries",
    "database_labels": "--database-labels",
    "query_labels": "--query-labels",
}


def _input_names(corpus) -> dict[str, str]:
    """How each of :data:`EVALUATE_INPUTS` is named in messages."""
    return {n: n for n in EVALUATE_INPUTS} if corpus is not None else OWN_OPTIONS


def _open_evaluate_arrays(corpus, arrays: dict | None, ground_truth: str | None = None):
    """(negatives, database, queries, relevant): from the corpus group, or from
    ``arrays`` (name -> path of descriptors in any input format, and of labels; the
    labels may be left out when a ``ground_truth`` scores the rankings: relevant None)."""
    if arrays is None:
        group = _open_corpus(corpus)
        arrays = {n: f"{str(corpus).rstrip('/')}/{n}" for n in EVALUATE_INPUTS[:3]}
        labels = (group["database_labels"][...], group["query_labels"][...])
    else:
        _check_own_arrays_given(arrays, ground_truth)
    said = _input_names(corpus)
    neg, db, q = (storage.open_input(arrays[n], said[n]) for n in EVALUATE_INPUTS[:3])
    names = (said["database_labels"], said["query_labels"])
    if corpus is None:
        if not arrays.get("database_labels"):  # scored by the ground truth alone
            return neg, db, q, None
        labels = (
            storage.read_labels(arrays["database_labels"], names[0], db.shape[0]),
            storage.read_labels(arrays["query_labels"], names[1], q.shape[0]),
        )
    return neg, db, q, relevant_from_labels(*labels, names=names)


def _check_own_arrays_given(arrays: dict, ground_truth: str | None) -> None:
    """Every one of :data:`EVALUATE_INPUTS` is given, or (with a ground truth) the three
    descriptors and both labels or neither."""
    missing = [n for n in EVALUATE_INPUTS if not arrays.get(n)]
    labels = [n for n in EVALUATE_INPUTS[3:] if arrays.get(n)]
    if ground_truth:
        if len(labels) == 1:
            other = next(n for n in EVALUATE_INPUTS[3:] if n != labels[0])
            raise ValueError(
                f"evaluate: {OWN_OPTIONS[labels[0]]} was given without {OWN_OPTIONS[other]}; "
                f"give both labels (mAP beside the recalls) or neither ({GROUND_TRUTH_OPTION} "
                f"alone)"
            )
        missing = [n for n in missing if n in EVALUATE_INPUTS[:3]]
    if missing:
        hint = (
            f"; or give {GROUND_TRUTH_OPTION} (nearest-neighbour ids) instead of the labels"
            if not ground_truth and set(missing) <= set(EVALUATE_INPUTS[3:])
            else ""
        )
        raise ValueError(
            f"evaluate: give {', '.join(OWN_OPTIONS[n] for n in EVALUATE_INPUTS)} (missing: "
            f"{', '.join(OWN_OPTIONS[n] for n in missing)}){hint}"
        )


def check_evaluate_inputs(
    corpus,
    methods,
    n_negatives: int | None,
    k: int | None,
    plot: str | None = None,
    arrays: dict | None = None,
    ground_truth: str | None = None,
):
    """Validate everything the evaluate job can check from metadata, before any compute.
    ``arrays``: one's own labelled descriptors instead of a corpus (``corpus`` None):
    paths by the names of :data:`EVALUATE_INPUTS`. ``ground_truth``: the path of
    nearest-neighbour ids (:func:`.ground_truth.read_ground_truth`), read and checked."""
    check_plot_path(plot)
    methods = parse_methods(methods)
    neg, db, q, relevant = _open_evaluate_arrays(corpus, arrays, ground_truth)
    if ground_truth:
        read_ground_truth(ground_truth, q.shape[0], db.shape[0])
        if k is not None and k < min(10, db.shape[0]):
            raise ValueError(
                f"--k {k} is shorter than the 10 results that R@10 and 10-R@10 count "
                f"({GROUND_TRUTH_OPTION}); use --k 10 or more, or leave --k out"
            )
    if relevant is None and plot:
        raise ValueError(
            f"--plot draws precision-recall curves, which need labels "
            f"(--database-labels and --query-labels); {GROUND_TRUTH_OPTION} alone gives "
            f"recalls, no curves: drop --plot or give the labels"
        )
    where = "corpus" if arrays is None else "evaluate"
    said = _input_names(corpus if arrays is None else None)
    for name, arr in (("database", db), ("queries", q)):
        if arr.shape[1] != neg.shape[1]:
            raise ValueError(
                f"{where}: {said[name]} has {arr.shape[1]} features but "
                f"{said['negatives']} {'have' if arrays is None else 'has'} "
                f"{neg.shape[1]}"
            )
    if n_negatives is not None and n_negatives > neg.shape[0]:
        holder = "the corpus holds" if arrays is None else f"{said['negatives']} holds"
        raise ValueError(
            f"--negatives {n_negatives} is more than {holder} ({neg.shape[0]}); "
            f"use --negatives {neg.shape[0]} or less"
        )
    if n_negatives is not None and n_negatives < 2:
        raise ValueError(f"--negatives must be at least 2, got {n_negatives}")
    if k is not None and k > db.shape[0]:
        raise ValueError(
            f"k={k} is larger than the database ({db.shape[0]} rows); use --k {db.shape[0]} or less"
        )
    return methods, neg, db, q, relevant


def evaluate_job(
    client,
    corpus: str,
    methods="raw,pca,esvm,slem",
    n_negatives: int | None = None,
    k: int | None = None,
    p_at: int | None = None,
    plot: str | None = None,
    params: dict[str, dict] | None = None,
    partition_rows: int | None = None,
    grids: dict[str, dict] | None = None,
    arrays: dict | None = None,
    ground_truth: str | None = None,
):
    """Results table (and optionally a PR plot) of ``methods`` on a corpus zarr group,
    or on one's own labelled descriptors (``arrays``, ``corpus`` None: see
    :func:`check_evaluate_inputs`).

    Each method is fitted on the first ``n_negatives`` negatives (default all)
    and encodes the database and the queries; relevance comes from the labels.
    Fitting and encoding run on ``client`` (dask arrays read from zarr).
    ``grids``: method -> {parameter: [values]}; a method with a grid of more than
    one setting gets one row per setting (columns "setting" and "best", see
    :func:`grid_search`), and the plot shows its best setting.
    ``ground_truth``: the path of each query's nearest database rows (:mod:`.ground_truth`):
    the rows also hold 1-R@1, R@10 and 10-R@10; the labels of ``arrays`` may be left out.
    Returns (rows, curves, report).
    """
    t0 = time.perf_counter()
    methods, neg, db, q, relevant = check_evaluate_inputs(
        corpus, methods, n_negatives, k, plot, arrays, ground_truth
    )
    truth = read_ground_truth(ground_truth, q.shape[0], db.shape[0]) if ground_truth else None
    source = {"corpus": str(corpus)} if arrays is None else {"from": "own descriptors"}
    negatives = storage.dask_rows(neg, partition_rows)[:n_negatives]  # None: all
    database = storage.dask_rows(db, partition_rows)
    queries = storage.dask_rows(q, partition_rows)
    _check_finite(client, (negatives, database, queries), corpus, arrays)
    grids = {m: {**(params or {}).get(m, {}), **(grids or {}).get(m, {})} for m in methods}
    rows, curves = _run_methods(
        client, (negatives, database, queries, relevant, truth), methods, grids, k, p_at
    )
    report = _evaluate_report(source, negatives.shape[0], db, q, methods, (k, relevant, truth))
    if ground_truth:  # with how many neighbours: 10-R@10 needs 10
        report.facts["ground truth"] = f"{ground_truth} ({truth.shape[1]} neighbours per query)"
    lams = _lams_used(methods, grids)
    if lams:
        report.facts["lam"] = lams
    if plot:
        where = corpus or arrays["database"]
        plot_pr_curves(
            curves,
            plot,
            title=f"{where}: {negatives.shape[0]} negatives",
            maps={r["method"]: r["mAP"] for r in rows if r.get("best", "*")},
        )
        report.facts["plot"] = str(plot)
    report.timings["total"] = time.perf_counter() - t0
    return rows, curves, report


def _check_finite(client, data, corpus, arrays) -> None:
    """Rows with NaN or inf in any input, named before any method runs, by the option
    (or corpus member) and path that gave them, and by file and row for .npy shards: a
    model's own error would name its parameter X, after the methods before it ran."""
    from ..core.validation import nonfinite_rows_error
    from ..parallel.blocks import locate_nonfinite_rows
    from .common import _detail

    for member, x in zip(("negatives", "database", "queries"), data, strict=True):
        count, shown = locate_nonfinite_rows(x, client)
        if not count:
            continue
        if arrays is None:
            name, path = f"the corpus' {member}", f"{str(corpus).rstrip('/')}/{member}"
        else:
            name = "--negatives-from" if member == "negatives" else f"--{member}"
            path = arrays[member]
        error = nonfinite_rows_error(name, count, shown, remedy="drop or repair those rows")
        raise ValueError(f"{name} {str(path)!r}: {_detail(error, path)}")


def _run_methods(client, data, methods, grids, k, p_at):
    """(rows, curves) of ``methods`` on ``data`` (negatives, database, queries,
    relevant, ground truth): one setting each, or a grid search where a method has
    several."""
    negatives, database, queries, relevant, truth = data
    with scatter_large_arrays(client):  # E-SVM's negatives: once to the workers
        if all(len(parameter_grid(g)) == 1 for g in grids.values()):
            return evaluate_methods(
                negatives,
                database,
                queries,
                relevant,
                methods,
                k=k,
                p_at=p_at,
                params={m: parameter_grid(g)[0] for m, g in grids.items()},
                ground_truth=truth,
            )
        rows, _, curves = grid_search(
            negatives,
            database,
            queries,
            relevant,
            grids,
            k=k,
            p_at=p_at,
            curves=relevant is not None,
            ground_truth=truth,
        )
        return rows, curves


def _evaluate_report(source: dict, n_negatives: int, db, q, methods, ranking) -> JobReport:
    """The report's facts on what was evaluated; ``ranking``: (k, relevant sets, ground
    truth), for the ranking length when it is shorter than the database."""
    report = JobReport("evaluate")
    report.facts.update(
        {
            **source,
            "negatives": n_negatives,
            "database": db.shape[0],
            "queries": q.shape[0],
            "features": db.shape[1],
            "methods": ",".join(methods),
        }
    )
    k, relevant, truth = ranking
    ranked = _ranking_length(k, db.shape[0], relevant is None, truth is not None)
    if relevant is not None and ranked < db.shape[0]:  # mAP counts what is ranked there
        report.facts["ranking"] = (
            f"top {ranked} of {db.shape[0]} database rows (mAP counts the relevant rows "
            f"ranked there; --k {db.shape[0]} ranks them all)"
        )
    return report


def _lams_used(methods, grids: dict[str, dict]) -> str:
    """The ridge lambda(s) each method ran with, e.g. ``slem 0.01x, kernel 0.001``: one
    --lam is not one lambda (kernel SLEM takes no lambda relative to tr(Sigma), and keeps
    its own 1e-3 where --lam gives only those; E-SVM has --esvm-lam), so say which."""
    said = []
    for method in methods:
        values = grids[method].get("lam") or [getattr(make_estimator(method), "lam", None)]
        if values[0] is not None:
            said.append(
                f"{method} "
                + ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)
            )
    relative = any(isinstance(v, str) for v in grids.get("slem", {}).get("lam", []))
    why = (
        " (a lam relative to tr(Sigma), Cx, is linear SLEM's only)"
        if relative and "kernel" in methods
        else ""
    )
    return "; ".join(said) + why
