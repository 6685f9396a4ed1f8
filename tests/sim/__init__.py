"""Deterministic simulation of slem-dask's storage protocol (docs/testing-faults.md).

``world``: a seeded scheduler of actors (greenlets) on a simulated clock, with the
patches that put the real protocol code (:mod:`slem_dask.storage.versioning.versions`,
:mod:`slem_dask.storage.versioning.leases`) on it. ``server``: the in-memory object store and
the :class:`~slem_dask.storage.backends.backend.Backend` that injects faults at every call.
``jobs``: the commands that actors run. ``checks``: the invariants. ``run``: one seed.
"""
