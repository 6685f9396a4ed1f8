"""The dimension names of every array slem-dask writes, by what the array means.

zarr v3 records them in each array's ``dimension_names``; xarray reads them as the
dimensions of the Dataset's variables. An axis of one size has one name across a store
(the ``feature`` axis of a model's mean and of its precision), so xarray aligns them;
a square matrix names its second axis with a 2 (``precision(feature, feature2)``: a
variable cannot have one dimension twice). The table (docs/reading-outputs.md):

================================  ===================================================
array                             dimensions
================================  ===================================================
an output (encodings)             image, feature
search result: scores, indices    query, rank (rank 0 is the best match)
corpus: negatives                 negative, feature
corpus: database, queries         image, feature; query, feature
corpus: database_labels           image
corpus: query_labels              query
linear model: mean                feature
linear model: covariance          feature, feature2
linear model: precision           feature, feature2
PCA: components                   feature, component
PCA: explained_variance           component
E-SVM, exact kernel: negatives    negative, feature
kernel: pivots                    pivot
kernel: pivot_rows                pivot, feature
kernel: pivot_factor              pivot, component (a column of the factor F)
kernel: factor_mean               component
kernel: g_factor, factor_scatter  component, component2
exact kernel: factor              negative, component
================================  ===================================================

Any other array ``name`` gets ``name_dim_0``, ``name_dim_1``, ... (xarray's own).
"""

from __future__ import annotations

__all__ = ["DIMENSIONS", "ARRAY_DIMENSIONS", "dimension_names"]

#: Dimension names of an output's rows and columns.
DIMENSIONS = ("image", "feature")

#: Dimension names of the arrays of models, search results and corpora, by array name.
ARRAY_DIMENSIONS: dict[str, tuple[str, ...]] = {
    "encodings": DIMENSIONS,
    # search results
    "scores": ("query", "rank"),
    "indices": ("query", "rank"),
    # corpora (and the negatives an E-SVM or an exact kernel model keeps)
    "negatives": ("negative", "feature"),
    "database": DIMENSIONS,
    "queries": ("query", "feature"),
    "database_labels": ("image",),
    "query_labels": ("query",),
    # linear models, PCA whitening
    "mean": ("feature",),
    "covariance": ("feature", "feature2"),
    "precision": ("feature", "feature2"),
    "components": ("feature", "component"),
    "explained_variance": ("component",),
    # kernel models
    "pivots": ("pivot",),
    "pivot_rows": ("pivot", "feature"),
    "pivot_factor": ("pivot", "component"),
    "factor_mean": ("component",),
    "g_factor": ("component", "component2"),
    "factor_scatter": ("component", "component2"),
    "factor": ("negative", "component"),
}


def dimension_names(name: str, ndim: int) -> tuple[str, ...]:
    """The dimension names of the array ``name`` (its key in its group, the last part
    of its path) of ``ndim`` dimensions: by its meaning, else ``name_dim_<i>``."""
    known = ARRAY_DIMENSIONS.get(name.rsplit("/", 1)[-1])
    if known is not None and len(known) == ndim:
        return known
    prefix = name.strip("/").replace("/", "_")
    return tuple(f"{prefix}_dim_{i}" for i in range(ndim))
