"""Every store slem-dask writes, exported or not, opens in xarray as a Dataset with
named dimensions (storage/nodes/dimensions.py), without a consolidated-metadata warning, and
round-trips to netCDF with the values slem-dask reads (issue 40 item 3)."""

import json
import warnings

import numpy as np
import pytest
import zarr

import slem_dask
from slem_dask import ESVM, KernelSLEM, PCAWhitening, RawFeatures
from slem_dask.cli.main import main
from slem_dask.datasets import make_corpus, write_corpus
from slem_dask.storage import VersionStore, read_model_store, read_search_store

from helpers import encode_command, encode_corpus, head, recommit

xr = pytest.importorskip("xarray")

SEARCH = {"scores": ("query", "rank"), "indices": ("query", "rank")}
LINEAR = {
    "mean": ("feature",),
    "covariance": ("feature", "feature2"),
    "precision": ("feature", "feature2"),
}
KERNEL = {
    "pivots": ("pivot",),
    "pivot_rows": ("pivot", "feature"),
    "pivot_factor": ("pivot", "component"),
    "factor_mean": ("component",),
    "g_factor": ("component", "component2"),
    "factor_scatter": ("component", "component2"),
}
EXACT_KERNEL = {**KERNEL, "negatives": ("negative", "feature"), "factor": ("negative", "component")}
PCA = {
    "mean": ("feature",),
    "components": ("feature", "component"),
    "explained_variance": ("component",),
}
ESVM_DIMS = {"negatives": ("negative", "feature")}
CORPUS = {
    "negatives": ("negative", "feature"),
    "database": ("image", "feature"),
    "queries": ("query", "feature"),
    "database_labels": ("image",),
    "query_labels": ("query",),
}


def _model(corpus, name, model):
    path = str(corpus["dir"] / f"{name}.zarr")
    model.fit(corpus["neg"].astype(np.float64)).save(path)
    return path, (lambda: read_model_store(path)[1])


def _stores(corpus):
    """{kind: (path, expected dimensions, what slem-dask reads)} of every kind of store."""
    codes = corpus["dir"] / "codes.zarr"
    encode_corpus(corpus, codes)
    result = str(corpus["dir"] / "result.zarr")
    search = ["search", "--queries", str(codes), "--database", str(codes), "--k", "4"]
    assert main([*search, "--out", result, "--local-cluster", "threads"]) == 0
    synthetic = str(corpus["dir"] / "corpus.zarr")
    write_corpus(make_corpus(n_negatives=30, n_instances=5, d=4, seed=1), synthetic, chunk_rows=8)
    stores = {
        "output": (
            str(codes),
            {"encodings": ("image", "feature")},
            lambda: {"encodings": slem_dask.open_zarr(codes)[...]},
        ),
        "search": (result, SEARCH, lambda: read_search_store(result)[1]),
        "corpus": (
            synthetic,
            CORPUS,
            lambda: {k: a[...] for k, a in slem_dask.open_zarr(synthetic).arrays()},
        ),
        "linear": (corpus["model"], LINEAR, lambda: read_model_store(corpus["model"])[1]),
    }
    for name, model, dims in [
        ("kernel", KernelSLEM(rank=5, random_state=0), KERNEL),
        ("exact-kernel", KernelSLEM(rank=5, exact=True, random_state=0), EXACT_KERNEL),
        ("pca", PCAWhitening(n_components=3), PCA),
        ("esvm", ESVM(n_iter=5), ESVM_DIMS),
        ("raw", RawFeatures(), {}),
    ]:
        saved, read = _model(corpus, name, model)
        stores[name] = (saved, dims, read)
    return stores


@pytest.fixture
def stores(corpus):
    return _stores(corpus)


def _open_quietly(opener, *args, **kwargs):
    """``opener(*args, **kwargs)`` with every warning an error (xarray's "Failed to open
    Zarr store with consolidated metadata" among them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return opener(*args, **kwargs)


def _check(ds, dims, expected):
    assert {k: v.dims for k, v in ds.data_vars.items()} == dims
    for name, value in expected.items():
        np.testing.assert_array_equal(ds[name].values, value, err_msg=name)


def _netcdf_round_trip(ds, path, expected):
    ds.to_netcdf(path, engine="h5netcdf")
    with xr.open_dataset(path, engine="h5netcdf") as back:
        _check(back, {k: v.dims for k, v in ds.data_vars.items()}, expected)
        meta = json.loads(back.attrs["slem_dask"]) if "slem_dask" in back.attrs else None
    return meta


def test_every_store_opens_named_and_round_trips_to_netcdf(stores, tmp_path):
    pytest.importorskip("h5netcdf")
    for kind, (path, dims, read) in stores.items():
        expected = read()
        _check(_open_quietly(xr.open_zarr, VersionStore(path)), dims, expected)
        _check(
            _open_quietly(xr.open_dataset, VersionStore(path), engine="zarr"),
            dims,
            expected,
        )
        ds = _open_quietly(slem_dask.open_dataset, path)
        meta = _netcdf_round_trip(ds, tmp_path / f"{kind}.nc", expected)
        group = zarr.open(VersionStore(path))
        if kind != "output":  # slem-dask's metadata, as JSON text
            assert meta == dict(group.attrs["slem_dask"]), kind


def test_every_export_opens_by_its_path_and_round_trips(stores, tmp_path):
    pytest.importorskip("h5netcdf")
    for kind, (path, dims, read) in stores.items():
        plain = str(tmp_path / f"{kind}-plain.zarr")
        assert main(["export", path, "--to", plain]) == 0, kind
        expected = read()
        _check(_open_quietly(xr.open_zarr, plain), dims, expected)
        _check(_open_quietly(xr.open_dataset, plain, engine="zarr"), dims, expected)
        ds = _open_quietly(slem_dask.open_dataset, plain)
        assert json.loads(ds.attrs["slem_dask_export"])["version"] == 1
        _netcdf_round_trip(ds, tmp_path / f"{kind}-plain.nc", expected)


def test_an_exported_output_is_a_group_slem_dask_still_reads(corpus, stores, tmp_path, capsys):
    path, _, read = stores["output"]
    plain = str(tmp_path / "plain.zarr")
    assert main(["export", path, "--to", plain]) == 0
    group = zarr.open_group(plain, mode="r")
    assert list(group.array_keys()) == ["encodings"]
    np.testing.assert_array_equal(group["encodings"][...], read()["encodings"])
    assert slem_dask.storage.verify(plain) == ("output", [])
    out = str(tmp_path / "again.zarr")  # an input, as the output it was copied from
    assert main(["search", "--queries", plain, "--database", path, "--k", "4", "--out", out]) == 0
    np.testing.assert_array_equal(
        read_search_store(out)[1]["indices"], read_search_store(stores["search"][0])[1]["indices"]
    )
    assert main(["export", path, "--to", plain, "--overwrite"]) == 0  # it is slem-dask's
    capsys.readouterr()
    assert main(encode_command(corpus, plain)) == 1  # an encode's --out: said, not "no array"
    assert capsys.readouterr().err.strip() == (
        f"slem-dask encode: error: output {plain!r} already exists: a plain copy of an output "
        f"(`slem-dask export`); pass --overwrite to replace it with this encoding, or choose "
        f"another path"
    )
    assert main(encode_command(corpus, plain, "--overwrite", "--partition-rows", "40")) == 0
    np.testing.assert_array_equal(slem_dask.open_zarr(plain)[...], read()["encodings"])


def test_stores_written_before_dimension_names_get_them_by_meaning(stores):
    path, dims, read = stores["linear"]
    for name in LINEAR:  # what an earlier release wrote: no dimension names
        doc = json.loads((head(path) / name / "zarr.json").read_bytes())
        del doc["dimension_names"]
        (head(path) / name / "zarr.json").write_text(json.dumps(doc))
    recommit(path)
    _check(_open_quietly(xr.open_zarr, VersionStore(path)), dims, read())
    assert "dimension_names" not in json.loads((head(path) / "mean" / "zarr.json").read_bytes())
