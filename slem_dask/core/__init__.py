"""Pure numpy math of SLEM: no dask, no zarr, no I/O.

Every function here works on in-memory arrays and is what the dask layer
(:mod:`slem_dask.parallel.blocks`) maps over blocks. Equations are cited by their label
in docs/math.md (errata of the source documents applied).
"""
