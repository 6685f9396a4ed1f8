"""Dask orchestration: the pure math of :mod:`slem_dask.core` mapped over row blocks.

Owns how work is split into tasks and merged: per-block statistics and their Chan merge
tree (:mod:`.blocks`), the distributed pivoted incomplete Cholesky in memory
(:mod:`.kernel`) and streamed (:mod:`.kernel_stream`, :mod:`.kernel_checkpoint`), what
both share per round (:mod:`.kernel_rounds`), the bytes a task needs
(:mod:`.task_memory`) and scattered arrays kept on every worker (:mod:`.replicas`).
Nothing here starts a client. Statistics and encodings are returned lazy (dask arrays,
Delayed) for the caller to compute; two functions compute themselves: the kernel
factorization (:func:`.kernel.incomplete_cholesky`: each pass needs the merged summary of
the one before) and :func:`.blocks.locate_nonfinite_rows` (a second pass, on a
fit's error path only). May import :mod:`slem_dask.core` and :mod:`slem_dask.storage` only.
"""
