"""load_model(path, transform_only=True): what an encode reads of a model (a LinearSLEM's
mean and A^-1, each checked against its own recorded SHA-256; not Sigma, 512 MiB at
d = 8192), and that it encodes and names itself exactly as the whole model does."""

import numpy as np
import pytest

from slem_dask import LinearSLEM, load_model, storage
from slem_dask.models import linear as model_linear
from slem_dask.storage.nodes import model_reads

from helpers import recommit


@pytest.fixture
def saved(tmp_path):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((400, 12)).astype(np.float32)
    path = str(tmp_path / "model.zarr")
    LinearSLEM(lam="0.01x", theta=2.0).fit(X).save(path)
    return path, X


def _tamper(path, member):
    group = storage.open_node(path, mode="r+")
    values = group[member][...]
    values.flat[0] *= 1.0 + 1e-12
    group[member][...] = values


def test_a_transform_only_model_encodes_and_names_itself_as_the_whole_one(saved, monkeypatch):
    path, X = saved
    whole = load_model(path)
    # Sigma is not read, and its condition bound comes from the record, not a new pass
    monkeypatch.setattr(model_linear, "condition_bound", lambda *a: pytest.fail("recomputed"))
    part = load_model(path, transform_only=True)
    assert part.covariance_ is None and whole.covariance_ is not None
    for rows in (X[:50], X[:50].astype(np.float64)):
        np.testing.assert_array_equal(part.transform(rows), whole.transform(rows))
    for name in ("fingerprint_", "encoding_fingerprint_", "identity_", "encoding_identity_"):
        assert getattr(part, name) == getattr(whole, name), name
    w_part, nu_part = part.exemplar(X[0])
    w_whole, nu_whole = whole.exemplar(X[0])
    np.testing.assert_array_equal(w_part, w_whole)
    assert nu_part == nu_whole


def test_a_transform_only_model_cannot_be_saved_or_changed_unnoticed(saved, tmp_path):
    path, X = saved
    part = load_model(path, transform_only=True)
    with pytest.raises(ValueError, match=r"transform_only=True.*load_model\(path\)"):
        part.save(str(tmp_path / "copy.zarr"))
    assert not (tmp_path / "copy.zarr").exists()
    part.set_params(lam=0.5)  # its recorded fingerprints no longer describe it
    with pytest.raises(ValueError, match="parameters changed since"):
        _ = part.fingerprint_
    part.fit(X)  # a new fit owns all its arrays again
    assert part.covariance_ is not None
    assert part.fingerprint_ == LinearSLEM(lam=0.5, theta=2.0).fit(X).fingerprint_
    part.save(str(tmp_path / "copy.zarr"))


def test_a_transform_only_load_checks_what_it_reads(saved):
    path, _ = saved
    _tamper(path, "covariance")  # not read by an encode: the whole load still catches it
    load_model(path, transform_only=True)
    with pytest.raises(ValueError, match="do not match its recorded fingerprint"):
        load_model(path)
    _tamper(path, "precision")
    # a CorruptChunkError (a ValueError) naming the chunk, as a chunk that fails its crc32c
    with pytest.raises(storage.CorruptChunkError, match=r"the crc32c recorded of their ch") as e:
        load_model(path, transform_only=True)
    assert "(chunk 'precision/c/0/0' is not the chunk that was written" in str(e.value)


def test_a_transform_only_load_checks_the_parameters(saved):
    """The per-array digests cover the parameters as the fingerprint does: a forger who
    also recomputes the metadata checksum is caught by either load."""
    path, _ = saved
    group = storage.open_node(path, mode="r+")
    meta = dict(group.attrs[storage.ATTR])
    meta["params"] = {**meta["params"], "lam": 0.5}
    meta["metadata_checksum"] = storage.metadata_checksum(meta)
    group.attrs[storage.ATTR] = meta
    recommit(path)
    with pytest.raises(ValueError, match="recorded SHA-256"):
        load_model(path, transform_only=True)


def test_a_model_written_before_the_records_is_read_whole(saved):
    """A model saved by slem-dask 0.4 records neither the arrays' own digests nor Sigma's
    condition bound: asked for its transform's arrays only, it is read whole and checked
    against its fingerprint, as before."""
    path, X = saved
    group = storage.open_node(path, mode="r+")
    meta = dict(group.attrs[storage.ATTR])
    for field in (storage.ARRAY_SHA256, model_linear.CONDITION_BOUND, "encoding_fingerprint"):
        del meta[field]
    meta["metadata_checksum"] = storage.metadata_checksum(meta)
    group.attrs[storage.ATTR] = meta
    recommit(path)
    old = load_model(path, transform_only=True)
    assert old.covariance_ is not None
    np.testing.assert_array_equal(old.transform(X[:20]), load_model(path).transform(X[:20]))
    _tamper(path, "covariance")
    with pytest.raises(ValueError, match="do not match its recorded fingerprint"):
        load_model(path, transform_only=True)


def test_a_transform_only_models_lazy_encode_is_named_by_its_record(saved, monkeypatch):
    # dask's key for A^-1 comes from its checked SHA-256, not from hashing it again
    # (0.17 CPU s at d = 8192); one key per dtype, and the same encodings
    import dask.array as da
    import dask.base

    path, X = saved
    rows = da.from_array(X[:60], chunks=20)
    want = load_model(path).transform(rows).compute()
    part = load_model(path, transform_only=True)
    hashed = []
    real = dask.base.tokenize
    monkeypatch.setattr(
        dask.base,
        "tokenize",
        lambda *a, **k: (
            hashed.extend(x.shape for x in a if isinstance(x, np.ndarray)) or real(*a, **k)
        ),
    )
    got = part.transform(rows)
    assert hashed == [], hashed
    np.testing.assert_array_equal(got.compute(), want)
    tokens = {
        part._matrix_token(part._encoding_matrix(t, "auto")) for t in (np.float32, np.float64)
    }
    assert len(tokens) == 2
    part.fit(X)  # arrays of its own again: hashed as any fitted model's
    part.transform(rows)
    assert hashed == [(12, 12)]


def test_a_model_loaded_for_float32_encoding_reads_a_inverse_straight_into_float32(saved):
    """encode_dtype=float32 (an encode of float32 rows): A^-1 is read straight into the
    float32 copy that float32 encoding uses, with no float64 A^-1 held, and the model
    encodes, lazily or not, and names itself bit for bit as the whole one does."""
    import dask.array as da

    path, X = saved
    whole = load_model(path)
    part = load_model(path, transform_only=True, encode_dtype=np.float32)
    assert part.precision_ is None and part.covariance_ is None
    np.testing.assert_array_equal(part.transform(X[:50]), whole.transform(X[:50]))
    rows = da.from_array(X[:60], chunks=20)
    np.testing.assert_array_equal(part.transform(rows).compute(), whole.transform(rows).compute())
    for name in ("fingerprint_", "encoding_fingerprint_", "identity_", "encoding_identity_"):
        assert getattr(part, name) == getattr(whole, name), name
    # what needs the float64 A^-1 says so in one line, naming the remedy
    for use in (lambda: part.transform(X[:5].astype(np.float64)), lambda: part.exemplar(X[0])):
        with pytest.raises(ValueError, match="loaded for float32 encoding alone") as raised:
            use()
        assert "load it without encode_dtype" in str(raised.value)
        assert "\n" not in str(raised.value)
    part.fit(X)  # a new fit owns a float64 A^-1 again
    np.testing.assert_array_equal(
        part.transform(X[:5].astype(np.float64)), whole.transform(X[:5].astype(np.float64))
    )


@pytest.mark.parametrize(
    "encode_dtype, precision", [(np.float64, None), (np.float32, "float64"), (np.int16, None)]
)
def test_a_model_loaded_for_rows_encoded_in_float64_holds_a_inverse_as_stored(
    saved, encode_dtype, precision
):
    path, X = saved
    part = load_model(path, transform_only=True, encode_dtype=encode_dtype, precision=precision)
    assert part.precision_ is not None and part.precision_.dtype == np.float64
    rows = (
        X[:20].astype(encode_dtype) if encode_dtype != np.int16 else (X[:20] * 100).astype(np.int16)
    )
    np.testing.assert_array_equal(
        part.transform(rows, precision=precision),
        load_model(path).transform(rows, precision=precision),
    )


def _edit_meta(path, edit) -> None:
    group = storage.open_node(path, mode="r+")
    meta = dict(group.attrs[storage.ATTR])
    edit(meta)
    meta["metadata_checksum"] = storage.metadata_checksum(meta)
    group.attrs[storage.ATTR] = meta
    recommit(path)


def test_a_float32_load_of_an_older_or_ill_conditioned_model_reads_a_inverse_as_stored(saved):
    """A model saved before slem-dask recorded A^-1's float32 factor, or one whose A is
    too ill-conditioned for float32 encoding, is read as before (float64 A^-1), and
    encodes as the whole model does."""
    path, X = saved
    want = load_model(path).transform(X[:20])
    _edit_meta(path, lambda meta: meta.pop(model_linear.FLOAT32_FACTOR))
    older = load_model(path, transform_only=True, encode_dtype=np.float32)
    assert older.precision_ is not None
    np.testing.assert_array_equal(older.transform(X[:20]), want)
    _edit_meta(
        path,
        lambda meta: meta.update(
            {model_linear.FLOAT32_FACTOR: 0.5, model_linear.CONDITION_BOUND: 1e9}
        ),
    )
    ill = load_model(path, transform_only=True, encode_dtype=np.float32)
    assert ill.precision_ is not None
    assert ill._encoding_matrix(np.float32, "auto").dtype == np.float64


def test_a_float32_load_checks_the_stored_bytes(saved):
    path, _ = saved
    _tamper(path, "precision")
    with pytest.raises(ValueError, match=r"the crc32c recorded of their chunks \(chunk 'prec"):
        load_model(path, transform_only=True, encode_dtype=np.float32)


def test_encode_dtype_without_transform_only_is_refused_in_one_line(saved):
    path, _ = saved
    with pytest.raises(ValueError, match="without transform_only=True") as raised:
        load_model(path, encode_dtype=np.float32)
    assert "pass transform_only=True" in str(raised.value) and "\n" not in str(raised.value)


def _edit_record(path, **fields):
    group = storage.open_node(path, mode="r+")
    meta = {**group.attrs[storage.ATTR], **fields}
    meta = {k: v for k, v in meta.items() if v is not None}
    meta["metadata_checksum"] = storage.metadata_checksum(meta)
    group.attrs[storage.ATTR] = meta
    recommit(path)
    return meta


def test_a_transform_only_load_checks_chunks_against_their_record_not_a_digest(saved, monkeypatch):
    """A model that binds its chunks' recorded crc32c to its parameters has each chunk
    of the arrays an encode reads checked against that record as it is read: no SHA-256
    of them (0.39 s for A^-1 at d = 8192). One written before that record is hashed."""
    path, X = saved
    whole = load_model(path)
    hashed = []
    real = model_reads.read_hashed
    monkeypatch.setattr(model_reads, "read_hashed", lambda *a: hashed.append(a[1]) or real(*a))
    for dtype in (None, np.float32):
        part = load_model(path, transform_only=True, encode_dtype=dtype)
        np.testing.assert_array_equal(part.transform(X[:30]), whole.transform(X[:30]))
    assert hashed == ["mean", "mean"]  # 1-D: read through zarr, so hashed (it is small)
    _edit_record(path, chunk_crc32c_sha256=None)  # as written before the record
    part = load_model(path, transform_only=True, encode_dtype=np.float32)
    np.testing.assert_array_equal(part.transform(X[:30]), whole.transform(X[:30]))
    assert sorted(hashed[2:]) == ["mean", "precision"]


def test_a_changed_chunk_record_is_refused(saved):
    """The record that stands in for the digests is bound to the parameters and to
    itself: a writer that committed another record, or other parameters, is caught."""
    path, _ = saved
    meta = dict(storage.open_node(path).attrs[storage.ATTR])
    crcs = {**meta["chunk_crc32c"], "precision": [c ^ 1 for c in meta["chunk_crc32c"]["precision"]]}
    _edit_record(path, chunk_crc32c=crcs)
    with pytest.raises(
        ValueError, match="chunk checksums of .* do not match their recorded SHA-256"
    ):
        load_model(path, transform_only=True, encode_dtype=np.float32)
