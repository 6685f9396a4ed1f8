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
from .models import LinearSLEM, load_model
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
    future = client.compute(obj)
    if progress:
        from distributed import progress as show_progress

        show_progress(future)
        sys.stdout.write("\n")
    return future.result()


def fit_job(client, negatives: str, model_path: str, lam: float = 1e-3, theta: float = 1.0,
            partition_rows: int | None = None, overwrite: bool = False,
            progress: bool = False) -> JobReport:
    """Fit a LinearSLEM on the zarr array ``negatives`` and save it to ``model_path``."""
    t0 = time.perf_counter()
    model = LinearSLEM(lam=lam, theta=theta)
    model._check_params()
    if not overwrite and storage._exists(model_path):
        raise FileExistsError(
            f"model store {model_path!r} already exists; pass --overwrite to replace it"
        )
    arr = storage.open_input(negatives, "negatives")
    if arr.shape[0] < 2:
        raise ValueError(
            f"negatives: {negatives!r} has shape {arr.shape}; at least 2 rows are needed"
        )
    x = storage.dask_rows(arr, partition_rows)
    t1 = time.perf_counter()
    stats = _compute(client, scatter_statistics(x), progress)
    t2 = time.perf_counter()
    model._fit_statistics(stats, arr.dtype)
    report = JobReport("fit")
    report.facts.update({
        "negatives": str(negatives), "rows": arr.shape[0], "features": arr.shape[1],
        "dtype": str(arr.dtype), "partitions": x.numblocks[0], "lam": lam, "theta": theta,
    })
    fp = model.save(model_path, overwrite=overwrite, metadata={"source": str(negatives)})
    t3 = time.perf_counter()
    report.facts.update({"model": str(model_path), "fingerprint": fp[:16]})
    report.timings.update({"open": t1 - t0, "statistics": t2 - t1, "factor+save": t3 - t2,
                           "total": t3 - t0})
    return report


def encode_job(client, model_path: str, positives: str, out: str, dtype: str | None = None,
               partition_rows: int | None = None, overwrite: bool = False,
               progress: bool = False) -> JobReport:
    """Encode the zarr array ``positives`` with the model at ``model_path`` into ``out``."""
    t0 = time.perf_counter()
    model = load_model(model_path)
    arr = storage.open_input(positives, "positives")
    check_n_features(arr, model.n_features_in_, f"positives ({positives!r})",
                     fitted_on=f"the model {model_path!r}")
    out_dtype = np.dtype(dtype or (arr.dtype if np.issubdtype(arr.dtype, np.floating) else "float64"))
    if not np.issubdtype(out_dtype, np.floating):
        raise ValueError(f"dtype must be a float dtype (float32 or float64), got {dtype!r}")
    if not overwrite and storage._exists(out):
        raise FileExistsError(f"output {out!r} already exists; pass --overwrite to replace it")
    x = storage.dask_rows(arr, partition_rows)
    z = model.transform(x, dtype=out_dtype)
    fingerprint = model.fingerprint_
    target = storage.create_output(out, arr.shape, x.chunks[0][0], out_dtype, {
        "model": type(model).__name__, "model_fingerprint": fingerprint,
        "model_path": str(model_path), "params": model.get_params(),
        "source": str(positives), "n_rows": int(arr.shape[0]),
    }, overwrite=overwrite)
    t1 = time.perf_counter()
    try:
        import dask.array as da

        _compute(client, da.store(z, target, lock=False, compute=False), progress)
        t2 = time.perf_counter()
        report = JobReport("encode")
        report.facts.update({
            "positives": str(positives), "rows": arr.shape[0], "features": arr.shape[1],
            "partitions": x.numblocks[0], "model": str(model_path),
            "fingerprint": fingerprint[:16], "out": str(out), "out dtype": out_dtype.name,
        })
        report.timings.update({"open": t1 - t0, "encode+write": t2 - t1, "total": t2 - t0})
        storage.mark_complete(target, {"timings": report.timings})
    except BaseException:
        storage._remove(out)
        raise
    return report


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
        write_corpus(corpus, corpus_path)
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

    group = zarr.open_group(store=corpus_path, mode="r")
    db_labels = np.asarray(group["database_labels"][...])
    q_labels = np.asarray(group["query_labels"][...])
    relevant = [np.flatnonzero(db_labels == label) for label in q_labels]
    k = min(100, len(db_labels))
    rows = []
    for method, db_name, q_name in (("raw features", "database", "queries"),
                                    ("linear SLEM", "slem_database", "slem_queries")):
        t = time.perf_counter()
        db = storage.dask_rows(storage.open_output(f"{corpus_path}/{db_name}"))
        q = storage.open_output(f"{corpus_path}/{q_name}")[...]
        if method == "raw features":  # cosine: the raw rows are L2-normalized
            q = q / np.linalg.norm(q, axis=1, keepdims=True)
            db = db / da_norm(db)
        _, indices = _ranked(q, db, k)
        p_at, r_at = precision_recall_at_k(indices, relevant, group_size)
        rows.append({"method": method, "mAP": mean_average_precision(indices, relevant),
                     f"P@{group_size}": p_at, "search [s]": time.perf_counter() - t})
    return rows, reports


def da_norm(x):
    """Row norms of a dask array, as a column (lazy)."""
    import dask.array as da

    return da.sqrt((x.astype("float64") ** 2).sum(axis=1, keepdims=True))
