"""Pure numpy math of SLEM: no dask, no zarr, no I/O.

Every function here works on in-memory arrays and is what the dask layer
(:mod:`slem_dask.parallel`) maps over blocks. Equations refer to the documents
in ``shared/papers`` (see the README there for errata).
"""
