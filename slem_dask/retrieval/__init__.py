"""Downstream retrieval: exact top-k search and the scores of its rankings.

Owns searching encodings (numpy or dask; inner product, cosine or L2: :mod:`.distances`;
tied scores broken by database index: :mod:`.topk`) and scoring rankings (mAP,
precision/recall@k, leave-one-out mAP, the ANN world's recall figures: :mod:`.metrics`). May import :mod:`slem_dask.core`, and :mod:`slem_dask.parallel` for one
BLAS thread per task, only.
"""

from .metrics import (
    ann_recalls,
    distance_recall,
    intersection_recall,
    leave_one_out_map,
    make_map_scorer,
    map_scorer,  # noqa: F401
    mean_average_precision,
    precision_recall_at_k,
    recall_at,
)
from .topk import search  # noqa: F401

__all__ = [
    "search",
    "mean_average_precision",
    "precision_recall_at_k",
    "leave_one_out_map",
    "make_map_scorer",
    "map_scorer",
    "recall_at",
    "intersection_recall",
    "ann_recalls",
    "distance_recall",
]
