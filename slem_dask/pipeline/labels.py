"""Relevant sets from labels: each query's matches are the database rows that share its
label (split from :mod:`.evaluation`, which scores rankings against them)."""

from __future__ import annotations

import numpy as np

from ..core.validation import rows_text


def relevant_from_labels(
    database_labels, query_labels, names=("database_labels", "query_labels")
) -> list[np.ndarray]:
    """Database indices sharing each query's label; an error names queries with none.
    ``names``: the two labels as the caller's user knows them (a corpus' members, or
    the command's options), so that every message spells them one way."""
    database_labels = np.asarray(database_labels)
    query_labels = np.asarray(query_labels)
    if database_labels.ndim != 1 or query_labels.ndim != 1:
        raise ValueError(
            f"labels must be 1-D, got {names[0]} shape {database_labels.shape} and "
            f"{names[1]} shape {query_labels.shape}"
        )
    _check_label_kinds(database_labels, query_labels, names)
    order = np.argsort(database_labels, kind="stable")
    sorted_labels = database_labels[order]
    starts = np.searchsorted(sorted_labels, query_labels, "left")
    ends = np.searchsorted(sorted_labels, query_labels, "right")
    empty = np.flatnonzero(ends == starts)
    if empty.size:
        shown = rows_text(empty, empty.size)
        raise ValueError(
            f"{names[1]}: {empty.size} of {len(query_labels)} queries (indices {shown}) "
            f"have a label that no database row has, so their relevant set is empty and "
            f"their AP undefined; drop those queries or add their matches to the database"
        )
    return [np.sort(order[s:e]) for s, e in zip(starts, ends, strict=True)]


def _check_label_kinds(database_labels, query_labels, names) -> None:
    """Numbers on one side and text on the other never compare equal (or compare by
    numpy's casting): one line naming both dtypes, instead of empty relevant sets."""
    numeric = [labels.dtype.kind in "biuf" for labels in (database_labels, query_labels)]
    if numeric[0] == numeric[1]:
        return
    shown = [
        f"{name} are {'numbers' if kind else 'text'} ({labels.dtype}"
        + (f", e.g. {labels.flat[0].item()!r})" if labels.size else ")")
        for name, labels, kind in zip(names, (database_labels, query_labels), numeric, strict=True)
    ]
    raise ValueError(
        f"{shown[0]} but {shown[1]}: labels match by value, so numbers and text never "
        f"match; save both as numbers or both as text (e.g. np.save(path, labels.astype(str)))"
    )
