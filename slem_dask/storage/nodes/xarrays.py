"""What :func:`slem_dask.open_dataset` adds to ``xarray.open_zarr``: a plain copy that
``slem-dask export`` wrote opens too, and slem-dask's metadata attributes become JSON
strings, which netCDF can hold (it cannot hold a dict: ``to_netcdf`` refused them)."""

from __future__ import annotations

import json

__all__ = ["dataset_store", "json_attributes"]


def dataset_store(path, version, version_store):
    """What xarray opens for ``path``: ``version_store(path, version)`` for a versioned
    store, the path itself for a plain zarr group that ``slem-dask export`` wrote."""
    from ..versioning import versions
    from ..versioning.rootmarker import EXPORT_ATTR
    from ..backends.paths import _read_json, canonical

    where = canonical(path)
    if version is not None or versions.resolve(where)[1] is not None:
        return version_store(path, version)
    doc = _read_json(where, "zarr.json")
    if isinstance(doc, dict) and EXPORT_ATTR in (doc.get("attributes") or {}):
        return where.location  # what zarr opens (a local path, or the URL)
    return version_store(path, version)  # its error says what is there


def _plain(value):
    """``value`` as netCDF holds it: a string or number as it is, anything else
    (a dict, a list, None) as its JSON text."""
    if isinstance(value, (str, int, float)):
        return value
    return json.dumps(value, sort_keys=True)


def json_attributes(ds):
    """``ds`` with every attribute (of the Dataset and of each variable) that is not a
    string or a number replaced by its JSON text; in place, returned."""
    for attrs in [ds.attrs] + [ds[name].attrs for name in ds.variables]:
        for key, value in list(attrs.items()):
            attrs[key] = _plain(value)
    return ds
