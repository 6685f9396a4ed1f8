"""The batch jobs: fit a model from zarr negatives, encode zarr positives, the demo.

Each job takes a connected ``distributed.Client`` (see :mod:`slem_dask.cluster`),
validates everything it can from metadata before it reads or writes data, and
never leaves a model or output that looks complete after a failure.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

import dask
import numpy as np

from . import storage
from ._version import __version__
from .models import KernelSLEM, LinearSLEM, RawFeatures, load_model
from .core.statistics import ScatterStats, merge_statistics
from .parallel import scatter_statistics
from .validation import check_n_features

__all__ = ["fit_job", "encode_job", "JobReport"]


@dataclass
class JobReport:
    """What a job did, for printing and for the attributes of what it wrote."""

    name: str
    facts: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [f"{self.name}:"]
        out += [f"  {k:<18} {v}" for k, v in self.facts.items()]
        out += [f"  {k + ' [s]':<18} {v:.2f}" for k, v in self.timings.items()]
        return out


def _compute(client, obj, progress: bool):
    """Compute one collection or Delayed on ``client``, with a progress bar if asked."""
    if client is None:
        return dask.compute(obj)[0]
    future = client.compute(obj)  # a list of futures for a list of collections
    if progress:
        from distributed import progress as show_progress

        show_progress(future)
        sys.stdout.write("\n")
    try:
        return client.gather(future)
    except BaseException:
        _settle(client, future)
        raise


def _settle(client, future, timeout: float = 60.0) -> None:
    """After a failed compute, cancel the rest and wait (up to ``timeout``) until no task
    runs on the workers: tasks already running when one failed keep going, and the
    caller must not remove an output while they still write chunks into it."""
    try:
        client.cancel(future)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            busy = client.run(lambda dask_worker: len(dask_worker.state.executing)
                              + len(dask_worker.state.long_running))
            if not any(busy.values()):
                return
            time.sleep(0.05)
    except Exception:  # cleanup is best effort: the original error is what matters
        pass


def fit_job(client, negatives: str, model_path: str, lam: float = 1e-3, theta: float = 1.0,
            partition_rows: int | None = None, overwrite: bool = False,
            progress: bool = False, update: bool = False, kernel: str | None = None,
            gamma: float = 0.1, degree: int = 2, rank: int | None = None,
            pivoting: str = "greedy", tol: float = 1e-3, seed: int | None = None,
            precision: str = "auto") -> JobReport:
    """Fit a LinearSLEM on the zarr array ``negatives`` and save it to ``model_path``.

    With ``kernel`` set, fit a KernelSLEM instead (``gamma``, ``degree``,
    ``rank``, ``pivoting``, ``tol``, ``seed``: see :class:`KernelSLEM`).

    ``update``: if ``model_path`` holds a model fitted on the first rows of this
    same ``negatives`` array, merge the statistics of the rows appended since
    into the stored ones (Chan et al.), without reading the old rows again.

    ``precision`` (linear only): "auto" computes float32 negatives in float32
    inside each block, "float64" in float64 (see :class:`LinearSLEM`).
    """
    if kernel is not None:
        return _fit_kernel_job(client, negatives, model_path, KernelSLEM(
            kernel=kernel, gamma=gamma, degree=degree, lam=lam, rank=rank, pivoting=pivoting,
            tol=tol, random_state=seed), partition_rows, overwrite, update)
    t0 = time.perf_counter()
    model = LinearSLEM(lam=lam, theta=theta, precision=precision)
    model._check_params()
    arr, exists = _open_negatives(negatives, model_path, overwrite, update)
    previous = _previous_statistics(model_path, negatives, arr) if exists and update else None
    start = previous.count if previous is not None else 0
    x = storage.dask_rows(arr, partition_rows)[start:]
    report = JobReport("fit")
    report.facts.update({
        "negatives": str(negatives), "rows": arr.shape[0], "features": arr.shape[1],
        "dtype": str(arr.dtype), "lam": lam, "theta": theta, "precision": precision,
        "action": "update" if previous is not None else "fit",
        "rows read": arr.shape[0] - start,
    })
    t1 = time.perf_counter()
    if previous is not None and start == arr.shape[0] and load_model(model_path).get_params() \
            == model.get_params():
        report.facts["action"] = "up to date"
        report.facts["model"] = str(model_path)
        report.timings["total"] = time.perf_counter() - t0
        return report
    try:
        stats = (_compute(client, scatter_statistics(x, precision=precision), progress)
                 if start < arr.shape[0] else None)
        if previous is not None:
            stats = previous if stats is None else merge_statistics(previous, stats)
        t2 = time.perf_counter()
        model._fit_statistics(stats, arr.dtype)
    except ValueError as exc:  # e.g. NaN rows: say which input
        raise ValueError(f"negatives {str(negatives)!r}: {exc}") from None
    fp = model.save(model_path, overwrite=overwrite or update,
                    metadata={"source": str(negatives)})
    t3 = time.perf_counter()
    report.facts.update({"model": str(model_path), "fingerprint": fp[:16]})
    report.timings.update({"open": t1 - t0, "statistics": t2 - t1, "factor+save": t3 - t2,
                           "total": t3 - t0})
    return report


def _fit_kernel_job(client, negatives: str, model_path: str, model, partition_rows,
                    overwrite: bool, update: bool = False) -> JobReport:
    """Fit a KernelSLEM on zarr negatives: ``model.fit`` runs its rounds on ``client``.

    A pivoted Cholesky factor cannot absorb appended rows the way linear
    statistics can: with ``update``, a model of the same parameters fitted on
    all current rows is kept ("up to date"), anything else is refitted.
    """
    t0 = time.perf_counter()
    model._check_params()
    arr, exists = _open_negatives(negatives, model_path, overwrite, update)
    action = "fit"
    if exists and update and not overwrite:
        meta, _ = storage.read_model_store(model_path)
        given = storage.json_params(model.get_params())
        if meta["params"] != given:
            diff = ", ".join(f"{k}: stored {meta['params'].get(k)!r}, given {v!r}"
                             for k, v in given.items() if meta["params"].get(k) != v)
            raise FileExistsError(
                f"model store {model_path!r} holds a {meta['model']} with other parameters "
                f"({diff}); --update keeps parameters: give the stored values, or pass "
                f"--overwrite to refit with the new ones")
        if meta.get("source") == str(negatives) and meta.get("n_samples") == arr.shape[0]:
            report = JobReport("fit")
            report.facts.update({"negatives": str(negatives), "rows": arr.shape[0],
                                 "action": "up to date", "model": str(model_path)})
            report.timings["total"] = time.perf_counter() - t0
            return report
        action = (f"refit (negatives now {arr.shape[0]} rows, the model had "
                  f"{meta.get('n_samples')}; a kernel factor cannot be updated)")
    x = storage.dask_rows(arr, partition_rows)
    t1 = time.perf_counter()
    try:
        if client is None:
            model.fit(x)
        else:
            with client.as_current():
                model.fit(x)
    except ValueError as exc:  # e.g. NaN rows, negative histogram values: say which input
        raise ValueError(f"negatives {str(negatives)!r}: {exc}") from None
    t2 = time.perf_counter()
    fp = model.save(model_path, overwrite=overwrite or update,
                    metadata={"source": str(negatives)})
    t3 = time.perf_counter()
    report = JobReport("fit")
    report.facts.update({
        "negatives": str(negatives), "rows": arr.shape[0], "features": arr.shape[1],
        "dtype": str(arr.dtype), "partitions": x.numblocks[0], "action": action,
        **{k: v for k, v in model.get_params().items() if k != "exact"},
        "pivots": model.rank_, "trace error": f"{model.trace_error_:.4g}",
        "passes": model.n_passes_, "model": str(model_path), "fingerprint": fp[:16],
    })
    report.timings.update({"open": t1 - t0, "factor": t2 - t1, "save": t3 - t2,
                           "total": t3 - t0})
    return report


def _open_negatives(negatives: str, model_path: str, overwrite: bool, update: bool):
    """Checks shared by every fit, before any data is read: (zarr array, model exists)."""
    storage.check_distinct(model_path, "--model", {"negatives": negatives})
    exists = storage._exists(model_path)
    if exists and not (overwrite or update):
        raise FileExistsError(
            f"model store {model_path!r} already exists; pass --overwrite to replace it, "
            f"or --update to add the negatives appended since it was fitted")
    arr = storage.open_input(negatives, "negatives")
    if arr.shape[0] < 2:
        raise ValueError(
            f"negatives: {negatives!r} has shape {arr.shape}; at least 2 rows are needed")
    return arr, exists


def _previous_statistics(model_path: str, negatives: str, arr) -> ScatterStats:
    """The statistics stored in a model, checked to be those of the first rows of ``arr``."""
    meta, _ = storage.read_model_store(model_path)
    old = load_model(model_path)
    if not isinstance(old, LinearSLEM):
        raise ValueError(f"--update needs a LinearSLEM model; {model_path!r} holds {meta['model']}")
    if meta.get("source") != str(negatives) or old.n_features_in_ != arr.shape[1] \
            or old.n_samples_ > arr.shape[0]:
        raise ValueError(
            f"--update: the model {model_path!r} was fitted on {old.n_samples_} rows of "
            f"{meta.get('source')!r} with {old.n_features_in_} features, which is not a prefix "
            f"of {str(negatives)!r} (shape {arr.shape}); fit from scratch with --overwrite")
    # Row counts identify the old rows: --update assumes rows are only ever appended.
    return ScatterStats(old.n_samples_, old.mean_, old.covariance_ * old.n_samples_)


def encode_job(client, model_path: str, positives: str, out: str, dtype: str | None = None,
               partition_rows: int | None = None, overwrite: bool = False,
               progress: bool = False, on_model_change: str = "fail",
               precision: str | None = None) -> JobReport:
    """Encode the zarr array ``positives`` with the model at ``model_path`` into ``out``.

    Re-running the same command resumes: an output left unfinished by a killed
    run gets only its missing partitions; rows appended to ``positives`` since
    the last complete run get encoded (and the one partition they extend), the
    rest is kept. An output written with another model is refused
    (``on_model_change="fail"``, the CLI default) unless ``overwrite``; with
    ``on_model_change="reencode"`` (job specs) it is rebuilt. ``precision``
    (linear models; default: the model's): "auto" encodes float32 positives in
    float32, "float64" in float64.
    """
    if on_model_change not in ("fail", "reencode"):
        raise ValueError(f"on_model_change must be 'fail' or 'reencode', got {on_model_change!r}")
    t0 = time.perf_counter()
    storage.check_distinct(out, "--out", {"positives": positives, "model": model_path})
    model = load_model(model_path)
    arr = storage.open_input(positives, "positives")
    check_n_features(arr, model.n_features_in_, f"positives ({positives!r})",
                     fitted_on=f"the model {model_path!r}")
    out_dtype = np.dtype(dtype or (arr.dtype if np.issubdtype(arr.dtype, np.floating) else "float64"))
    if not np.issubdtype(out_dtype, np.floating):
        raise ValueError(f"dtype must be a float dtype (float32 or float64), got {dtype!r}")
    fingerprint = model.fingerprint_
    encoding = model.encoding_fingerprint_  # what decides whether an output can be kept
    n_rows = int(arr.shape[0])
    existing = storage.open_existing_output(out)
    if partition_rows is None and existing is not None:
        partition_rows = int(existing.chunks[0])  # a rebuild keeps the output's chunking
    width = int(getattr(model, "rank_", arr.shape[1]))  # a KernelSLEM writes r columns
    target, todo, action = _plan_output(out, existing, arr, positives, encoding, out_dtype,
                                        overwrite, on_model_change, width)
    if target is None:
        rows = storage.row_partition(arr, partition_rows)
        target = storage.create_output(out, (arr.shape[0], width), rows, out_dtype, {
            "model": type(model).__name__, "model_fingerprint": fingerprint,
            "encoding_fingerprint": encoding,
            "model_path": str(model_path), "params": storage.json_params(model.get_params()),
            "source": str(positives), "n_rows": n_rows, "stale_partition": None,
        }, overwrite=True)
        created = True
    else:
        created = False
    rows = int(target.chunks[0])
    n_parts = -(-n_rows // rows)
    if created:
        todo = list(range(n_parts))
    t1 = time.perf_counter()
    report = JobReport("encode")
    report.facts.update({
        "positives": str(positives), "rows": n_rows, "features": arr.shape[1],
        "partitions": f"{len(todo)} encoded of {n_parts}", "action": action,
        "model": str(model_path), "fingerprint": fingerprint[:16], "out": str(out),
        "out dtype": out_dtype.name,
    })
    try:
        if todo:
            import dask.array as da

            extra = {"precision": precision} if isinstance(model, LinearSLEM) and precision else {}
            z = model.transform(da.from_zarr(arr, chunks=(rows, arr.shape[1])), dtype=out_dtype,
                                **extra)
            # One store per run of consecutive partitions: a store per partition makes
            # graph construction grow faster than linearly (4000 partitions: 14 s vs 1 s).
            spans = [(a * rows, min(n_rows, (b + 1) * rows)) for a, b in _runs(todo)]
            _compute(client, da.store([z[lo:hi] for lo, hi in spans], [target] * len(spans),
                                      regions=[(slice(lo, hi), slice(None)) for lo, hi in spans],
                                      lock=False, compute=False), progress)
        t2 = time.perf_counter()
        report.timings.update({"open": t1 - t0, "encode+write": t2 - t1, "total": t2 - t0})
        meta = storage.output_meta(target) or {}
        runs = (meta.get("runs") or [])[-19:] + [{
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "action": action, "rows": n_rows, "partitions_encoded": len(todo),
            "model_fingerprint": fingerprint, "package_version": __version__,
            "timings": report.timings}]
        storage.remove_stray_partials(out)  # left by writers killed mid-chunk
        storage.mark_complete(target, {"n_rows": n_rows, "stale_partition": None,
                                       "model_fingerprint": fingerprint,
                                       "model_path": str(model_path),
                                       "params": storage.json_params(model.get_params()),
                                       "timings": report.timings, "runs": runs})
    except KeyboardInterrupt:
        raise  # finished partitions stay (complete: false): a re-run resumes
    except BaseException as exc:
        # A new output that failed on its data is removed; a resumed one keeps its
        # finished partitions (complete stays false) so that the next run picks up there.
        if created:
            storage._remove(out)
        if isinstance(exc, ValueError):  # e.g. NaN rows found by a worker: say where
            raise ValueError(f"positives {str(positives)!r}: {exc}") from None
        raise
    return report


def _runs(indices):
    """Sorted indices as (first, last) runs of consecutive values: [0,1,2,5,6] -> (0,2),(5,6)."""
    runs = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return [tuple(r) for r in runs]


def _plan_output(out, existing, arr, positives, encoding, out_dtype, overwrite,
                 on_model_change, width):
    """Decide what to do with an existing output: (target or None, partitions or None, action).

    None as target: create a new output. None as partitions: write every
    partition whose chunk is missing. ``existing``: the array at ``out``, or None.
    """
    if existing is None and storage._exists(out) and not overwrite:
        raise FileExistsError(
            f"output {out!r} already exists and is not a zarr array; pass --overwrite to "
            f"replace it, or choose another path")
    if existing is None or overwrite:
        return None, None, "create"
    meta = storage.output_meta(existing)
    if meta is None:
        raise FileExistsError(
            f"output {out!r} already exists and was not written by slem-dask; pass "
            f"--overwrite to replace it, or choose another path")
    if meta.get("encoding_fingerprint") != encoding:
        if on_model_change == "reencode":
            return None, None, "re-encode (model changed)"
        raise FileExistsError(
            f"output {out!r} was encoded with another model (encoding fingerprint "
            f"{str(meta.get('encoding_fingerprint'))[:16]}, now {encoding[:16]}); pass "
            f"--overwrite to re-encode it with the current model")
    problems = []
    if meta.get("source") != str(positives):
        problems.append(f"it encodes {meta.get('source')!r}, not {str(positives)!r}")
    if existing.shape[1] != width or existing.dtype != out_dtype:
        problems.append(f"it holds {existing.shape[1]} columns of {existing.dtype}, this run "
                        f"writes {width} of {out_dtype}")
    if arr.shape[0] < existing.shape[0]:
        problems.append(f"the positives shrank from {existing.shape[0]} to {arr.shape[0]} rows")
    if problems:
        raise FileExistsError(
            f"output {out!r} cannot be resumed: {'; '.join(problems)}; pass --overwrite to "
            f"rebuild it")
    rows = int(existing.chunks[0])
    n_new = int(arr.shape[0])
    n_old = int(existing.shape[0])
    stale = meta.get("stale_partition")
    if meta.get("complete") and n_new == n_old:
        return existing, [], "up to date"
    if n_new > n_old:
        if n_old % rows:
            stale = n_old // rows  # its chunk holds only the old rows
        storage.update_meta(existing, complete=False, stale_partition=stale)
        existing.resize((n_new, existing.shape[1]))
    todo = [i for i in range(-(-n_new // rows))
            if i == stale or not storage.partition_written(existing, i)]
    return existing, todo, "append" if n_new > n_old else "resume"



def _ranked(queries, database, k: int):
    from .retrieval import search

    return dask.compute(search(queries, database, k))[0]


def demo_job(client, workdir: str = "slem-demo", n_negatives: int = 50_000,
             n_instances: int = 1_000, group_size: int = 4, d: int = 128, lam: float = 1e-3,
             seed: int = 0, progress: bool = False) -> tuple[list[dict], list[JobReport]]:
    """Generate (once) a synthetic corpus in ``workdir``, fit, encode, evaluate.

    Returns the results table (one row per method) and the job reports.
    """
    from .datasets import make_corpus, write_corpus
    from .retrieval import mean_average_precision, precision_recall_at_k

    os.makedirs(workdir, exist_ok=True)
    corpus_path = os.path.join(workdir, "corpus.zarr")
    params = {"n_negatives": n_negatives, "n_instances": n_instances,
              "group_size": group_size, "d": d, "seed": seed}
    t0 = time.perf_counter()
    try:
        import zarr

        existing = dict(zarr.open_group(store=corpus_path, mode="r").attrs)
    except (FileNotFoundError, ValueError, KeyError):
        existing = {}
    if existing.get("slem_dask_demo") != params:
        corpus = make_corpus(n_negatives=n_negatives, n_instances=n_instances,
                             group_size=group_size, d=d, seed=seed)
        write_corpus(corpus, corpus_path, chunk_rows=1024)
        zarr.open_group(store=corpus_path, mode="r+").attrs["slem_dask_demo"] = params
    generate = JobReport("generate corpus")
    generate.facts.update({"corpus": corpus_path, **params})
    generate.timings["total"] = time.perf_counter() - t0

    model_path = os.path.join(workdir, "model.zarr")
    reports = [generate]
    # Small partitions, so that even the demo runs as many parallel tasks.
    reports.append(fit_job(client, f"{corpus_path}/negatives", model_path, lam=lam,
                           partition_rows=8192, overwrite=True, progress=progress))
    for name in ("database", "queries"):
        reports.append(encode_job(client, model_path, f"{corpus_path}/{name}",
                                  f"{corpus_path}/slem_{name}", partition_rows=1024,
                                  overwrite=True, progress=progress))
    # rbf kernel SLEM: gamma 0.5 suits these L2-normalized rows (median squared
    # distance between negatives ~0.5); 256 rpcholesky pivots take a few passes.
    kernel_path = os.path.join(workdir, "kernel_model.zarr")
    reports.append(fit_job(client, f"{corpus_path}/negatives", kernel_path, lam=lam,
                           partition_rows=8192, overwrite=True, progress=progress,
                           kernel="rbf", gamma=0.5, rank=min(256, n_negatives),
                           pivoting="rpcholesky", tol=0.0, seed=seed))
    for name in ("database", "queries"):
        reports.append(encode_job(client, kernel_path, f"{corpus_path}/{name}",
                                  f"{corpus_path}/kslem_{name}", partition_rows=1024,
                                  overwrite=True, progress=progress))

    group = zarr.open_group(store=corpus_path, mode="r")
    db_labels = np.asarray(group["database_labels"][...])
    q_labels = np.asarray(group["query_labels"][...])
    relevant = [np.flatnonzero(db_labels == label) for label in q_labels]
    k = min(len(db_labels), 10_000)  # the whole ranking, as `slem-dask evaluate`
    rows = []
    for method, db_name, q_name in (("raw features", "database", "queries"),
                                    ("linear SLEM", "slem_database", "slem_queries"),
                                    ("rbf kernel SLEM", "kslem_database", "kslem_queries")):
        t = time.perf_counter()
        db = storage.dask_rows(storage.open_output(f"{corpus_path}/{db_name}"))
        q = storage.open_output(f"{corpus_path}/{q_name}")[...]
        if method == "raw features":  # cosine: the raw rows, L2-normalized
            raw = RawFeatures().fit(q)
            q, db = raw.transform(q), raw.transform(db)
        _, indices = _ranked(q, db, k)
        p_at, r_at = precision_recall_at_k(indices, relevant, group_size)
        rows.append({"method": method, "mAP": mean_average_precision(indices, relevant),
                     f"P@{group_size}": p_at, "search [s]": time.perf_counter() - t})
    return rows, reports

