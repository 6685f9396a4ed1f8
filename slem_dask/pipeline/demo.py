"""The demo job: generate a corpus, fit, encode and evaluate every method."""

from __future__ import annotations

import os
import time

import dask
import numpy as np

from .. import storage
from ..models import KernelSLEM, LinearSLEM, RawFeatures
from ..models.kernel_defaults import KERNEL_DEFAULTS
from ..core.validation import DEFAULT_LAM

from .common import JobReport
from .fit import KERNEL_LAM, fit_job
from .encode import encode_job
from .options import EncodeOptions, FitOptions


def _ranked(queries, database, k: int):
    from ..retrieval.topk import search

    return dask.compute(search(queries, database, k))[0]


def demo_job(
    client,
    workdir: str = "slem-demo",
    n_negatives: int = 50_000,
    n_instances: int = 1_000,
    group_size: int = 4,
    d: int = 128,
    lam: float | str | None = None,
    seed: int = 0,
    progress: bool = False,
) -> tuple[list[dict], list[JobReport]]:
    """Generate (once) a synthetic corpus in ``workdir``, fit, encode, evaluate.

    Returns the results table (one row per method) and the job reports. ``lam``: linear
    SLEM's (default "0.01x"); the kernel model takes it when it is a number, else 1e-3.
    """
    os.makedirs(workdir, exist_ok=True)
    corpus_path = os.path.join(workdir, "corpus.zarr")
    params = {
        "n_negatives": n_negatives,
        "n_instances": n_instances,
        "group_size": group_size,
        "d": d,
        "seed": seed,
    }
    reports = [_generate_corpus(corpus_path, params)]
    # kernel SLEM at the library's defaults (models.kernel_defaults: gamma relative to
    # the negatives' median squared distance, rpcholesky), seeded by --seed. It takes
    # --lam when that is a number: a relative one ("0.01x") is linear SLEM's only.
    kernel = KernelSLEM(
        rank=min(KERNEL_DEFAULTS["rank"], n_negatives),
        lam=lam if isinstance(lam, (int, float)) else KERNEL_LAM,
        random_state=seed,
    )
    for estimator, name, prefix in (
        (LinearSLEM(lam=DEFAULT_LAM if lam is None else lam), "model.zarr", "slem"),
        (kernel, "kernel_model.zarr", "kslem"),
    ):
        reports += _fit_and_encode(
            client, corpus_path, os.path.join(workdir, name), estimator, prefix, progress
        )
    return _score_methods(corpus_path, group_size), reports


def _generate_corpus(corpus_path: str, params: dict) -> JobReport:
    """The demo's corpus at ``corpus_path``, written unless one of ``params`` is there."""
    from ..datasets import make_corpus, write_corpus

    t0 = time.perf_counter()
    try:
        existing = dict(storage.open_node(corpus_path).attrs)
    except Exception:  # noqa: BLE001 - no usable corpus there: write one
        existing = {}
    if existing.get("slem_dask_demo") != params:
        corpus = make_corpus(**params)
        write_corpus(corpus, corpus_path, chunk_rows=1024, attrs={"slem_dask_demo": params})
    generate = JobReport("generate corpus")
    generate.facts.update({"corpus": os.path.abspath(corpus_path), **params})
    generate.timings["total"] = time.perf_counter() - t0
    return generate


def _fit_and_encode(
    client, corpus_path: str, model_path: str, estimator, prefix: str, progress: bool
) -> list[JobReport]:
    """``estimator`` fitted on the corpus' negatives, then database and queries encoded
    into ``{prefix}_database`` and ``{prefix}_queries`` of the corpus."""
    # Small partitions, so that even the demo runs as many parallel tasks.
    reports = [
        fit_job(
            client,
            f"{corpus_path}/negatives",
            model_path,
            estimator=estimator,
            options=FitOptions(partition_rows=8192, overwrite=True, progress=progress),
        )
    ]
    for name in ("database", "queries"):
        reports.append(
            encode_job(
                client,
                model_path,
                f"{corpus_path}/{name}",
                f"{corpus_path}/{prefix}_{name}",
                options=EncodeOptions(partition_rows=1024, overwrite=True, progress=progress),
            )
        )
    return reports


def _score_methods(corpus_path: str, group_size: int) -> list[dict]:
    """The results table: mAP and P@group_size of raw features, linear and kernel SLEM."""
    from ..retrieval.metrics import mean_average_precision, precision_recall_at_k

    group = storage.open_node(corpus_path)
    db_labels = np.asarray(group["database_labels"][...])
    q_labels = np.asarray(group["query_labels"][...])
    relevant = [np.flatnonzero(db_labels == label) for label in q_labels]
    k = min(len(db_labels), 10_000)  # the whole ranking, as `slem-dask evaluate`
    rows = []
    for method, db_name, q_name in (
        ("raw features", "database", "queries"),
        ("linear SLEM", "slem_database", "slem_queries"),
        ("rbf kernel SLEM", "kslem_database", "kslem_queries"),
    ):
        t = time.perf_counter()
        db = storage.dask_rows(storage.open_output(f"{corpus_path}/{db_name}"), name="database")
        q = storage.read_all(f"{corpus_path}/{q_name}", "queries")
        if method == "raw features":  # cosine: the raw rows, L2-normalized
            raw = RawFeatures().fit(q)
            q, db = raw.transform(q), raw.transform(db)
        _, indices = _ranked(q, db, k)
        p_at, r_at = precision_recall_at_k(indices, relevant, group_size)
        rows.append(
            {
                "method": method,
                "mAP": mean_average_precision(indices, relevant),
                f"P@{group_size}": p_at,
                "search [s]": time.perf_counter() - t,
            }
        )
    return rows
