"""Pure numpy math of SLEM, and the checks of its inputs: no zarr, no I/O.

Every function of the math works on in-memory arrays and is what the dask layer
(:mod:`slem_dask.parallel`) maps over blocks. Dask appears only in the input checks
(:mod:`.validation` recognizes a dask array and checks its chunks, importing dask only
then). Equations are cited by their label in docs/math.md (errata of the source
documents applied).
"""
