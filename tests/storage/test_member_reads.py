"""storage.nodes.member_reads: a model's array read in blocks of rows, each hashed while
the next is read, gives the bytes and the SHA-256 that reading it whole and hashing it
after (checksums.array_digests) give, for any chunking and block size."""

import numpy as np
import pytest
import zarr

from slem_dask.storage.nodes import member_reads
from slem_dask.storage.nodes.checksums import array_digests, digest_head

PARAMS = {"lam": 0.5, "theta": 2.0}


def _array(tmp_path, values, chunks):
    arr = zarr.create_array(
        store=str(tmp_path / "a.zarr"), shape=values.shape, dtype=values.dtype, chunks=chunks
    )
    arr[...] = values
    return arr


@pytest.mark.parametrize("block_bytes", [1, 700, 1 << 25])
@pytest.mark.parametrize(
    "shape, chunks",
    [((37, 11), (5, 11)), ((37, 11), (37, 11)), ((64, 8), (16, 4)), ((9,), (4,)), ((0, 3), (1, 3))],
)
def test_a_hashed_read_gives_the_bytes_and_digest_of_a_whole_read(
    tmp_path, monkeypatch, shape, chunks, block_bytes
):
    monkeypatch.setattr(member_reads, "_BLOCK_BYTES", block_bytes)
    values = np.random.default_rng(5).standard_normal(shape)
    arr = _array(tmp_path, values, chunks)
    got, digest = member_reads.read_hashed(arr, "precision", digest_head(PARAMS))
    np.testing.assert_array_equal(got, values)
    assert got.dtype == values.dtype and got.flags.c_contiguous
    assert digest == array_digests({"precision": values}, PARAMS)["precision"]
    # any changed bit in the last block, or another name or parameter: another digest
    changed = values.copy()
    if changed.size:
        changed.reshape(-1)[-1] = np.nextafter(changed.reshape(-1)[-1], np.inf)
        arr[...] = changed
        assert member_reads.read_hashed(arr, "precision", digest_head(PARAMS))[1] != digest
    assert member_reads.read_hashed(arr, "mean", digest_head(PARAMS))[1] != digest


@pytest.mark.parametrize("cast", [None, member_reads.MemberCast(np.dtype(np.float32), 0.5)])
def test_a_failed_block_read_raises_after_the_hash_in_flight_is_done(tmp_path, monkeypatch, cast):
    monkeypatch.setattr(member_reads, "_BLOCK_BYTES", 1)
    arr = _array(tmp_path, np.ones((6, 4)), (2, 4))
    calls = []
    read_block = member_reads._read_block

    def failing(arr, lo, hi, block, key, crcs=None):
        calls.append((lo, hi))
        if len(calls) == 2:
            raise OSError("chunk 1 unreadable")
        read_block(arr, lo, hi, block, key, crcs)

    monkeypatch.setattr(member_reads, "_read_block", failing)
    with pytest.raises(OSError, match="chunk 1 unreadable"):
        member_reads.read_hashed(arr, "precision", digest_head(PARAMS), cast)
    assert calls == [(0, 2), (2, 4)]


@pytest.mark.parametrize("block_bytes", [1, 700, 1 << 25])
@pytest.mark.parametrize(
    "shape, chunks",
    [((37, 11), (5, 11)), ((37, 11), (37, 11)), ((64, 8), (16, 4)), ((9,), (4,)), ((0, 3), (1, 3))],
)
@pytest.mark.parametrize("scale", [1.0, 1e-60])
def test_a_cast_read_gives_float32_matrixs_bits_and_the_stored_arrays_digest(
    tmp_path, monkeypatch, shape, chunks, block_bytes, scale
):
    """Read straight into float32 (an encode's A^-1): the bits that casting the whole
    float64 array gives (core.linear.float32_matrix, with its factor), and the digest of
    the float64 bytes stored, for any chunking and block size; A^-1 of entries 1e-60 (of
    negatives of magnitude 1e30), which a plain cast would flush to zeros, included."""
    from slem_dask.core.linear import float32_factor, float32_matrix

    monkeypatch.setattr(member_reads, "_BLOCK_BYTES", block_bytes)
    values = np.random.default_rng(7).standard_normal(shape) * scale
    arr = _array(tmp_path, values, chunks)
    factor = float32_factor(values) if values.size else 1.0
    cast = member_reads.MemberCast(np.dtype(np.float32), factor)
    got, digest = member_reads.read_hashed(arr, "precision", digest_head(PARAMS), cast)
    assert got.dtype == np.float32 and got.shape == values.shape and got.flags.c_contiguous
    np.testing.assert_array_equal(got, float32_matrix(values) if values.size else values)
    assert not values.size or np.abs(got).max() >= 0.5  # not flushed to zeros
    assert digest == array_digests({"precision": values}, PARAMS)["precision"]


@pytest.mark.parametrize("transform_only", [True, False])
def test_a_damaged_model_chunk_is_named_with_how_to_get_the_model_back(tmp_path, transform_only):
    from slem_dask import LinearSLEM, load_model, storage

    path = str(tmp_path / "m.zarr")
    X = np.random.default_rng(0).standard_normal((300, 6)).astype(np.float32)
    for lam in (0.1, 0.2):  # version 1 is kept: a rollback can bring it back
        LinearSLEM(lam=lam).fit(X).save(path, overwrite=True)
    chunk = next((tmp_path / "m.zarr" / "versions").glob("00000002-*/precision/c/0/0"))
    data = bytearray(chunk.read_bytes())
    data[40] ^= 1
    chunk.write_bytes(bytes(data))
    with pytest.raises(storage.CorruptChunkError) as raised:
        load_model(path, transform_only=transform_only)
    message = str(raised.value)
    assert "chunk 'precision/c/0/0' (rows 0-5) of array 'precision'" in message, message
    assert "crc32c checksum does not match" in message and "--overwrite" in message
    assert f"slem-dask rollback {path} --to N" in message and "\n" not in message


def _checked_array(tmp_path, values, chunk_rows):
    from slem_dask.storage.nodes.checksums import CHECKSUM

    arr = zarr.create_array(
        store=str(tmp_path / "c.zarr"),
        shape=values.shape,
        dtype=values.dtype,
        chunks=(chunk_rows, values.shape[1]),
        compressors=CHECKSUM,
    )
    arr[...] = values
    return arr


@pytest.mark.parametrize("block_bytes", [1, 700, 1 << 25])
@pytest.mark.parametrize("rows, chunk_rows", [(37, 5), (37, 37), (64, 16), (0, 1)])
@pytest.mark.parametrize("scale", [1.0, 1e-60])
def test_a_read_checked_against_the_record_gives_the_bits_of_a_whole_read(
    tmp_path, monkeypatch, rows, chunk_rows, block_bytes, scale
):
    """read_recorded (no digest): the stored array, or float32_matrix's bits of it with
    the cast, for any chunking and block size; a chunk whose trailer is not the recorded
    one is refused by name, however valid its own bytes are."""
    from slem_dask.core.linear import float32_factor, float32_matrix
    from slem_dask.storage.nodes.checksums import chunk_trailers
    from slem_dask.storage.nodes.chunks import trailers_checked_by_rows
    from slem_dask.storage.versioning.errors import ChangedChunkError

    monkeypatch.setattr(member_reads, "_BLOCK_BYTES", block_bytes)
    values = np.random.default_rng(8).standard_normal((rows, 11)) * scale
    arr = _checked_array(tmp_path, values, chunk_rows)
    assert trailers_checked_by_rows(arr) and not trailers_checked_by_rows(
        _array(tmp_path, values, (max(1, chunk_rows), 11))  # zstd, no crc32c: hashed instead
    )
    crcs = chunk_trailers(arr)
    got = member_reads.read_recorded(arr, "precision", crcs)
    np.testing.assert_array_equal(got, values)
    assert got.dtype == values.dtype and got.flags.c_contiguous
    factor = float32_factor(values) if values.size else 1.0
    cast = member_reads.MemberCast(np.dtype(np.float32), factor)
    got = member_reads.read_recorded(arr, "precision", crcs, cast)
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, float32_matrix(values) if values.size else values)
    if not values.size:
        return
    last = len(crcs) - 1
    changed = values.copy()
    changed[-1, -1] += 1.0
    arr[...] = changed  # valid chunks, each with its own crc32c: not the recorded ones
    with pytest.raises(ChangedChunkError, match=rf"chunk 'c/{last}/0' \(rows .*not the chunk"):
        member_reads.read_recorded(arr, "precision", crcs, cast)


def test_a_failed_read_raises_after_the_casts_in_flight_are_done(tmp_path, monkeypatch):
    monkeypatch.setattr(member_reads, "_BLOCK_BYTES", 1)
    arr = _checked_array(tmp_path, np.ones((8, 4)), 2)
    calls, casts = [], []
    read_block, store = member_reads._read_block, member_reads._store

    def failing(arr, lo, hi, block, key, crcs):
        calls.append((lo, hi))
        if len(calls) == 3:
            raise OSError("chunk 2 unreadable")
        read_block(arr, lo, hi, block, key, crcs)

    def slow_store(out, stored, cast):
        import time

        time.sleep(0.05)
        store(out, stored, cast)
        casts.append(out.shape)

    monkeypatch.setattr(member_reads, "_read_block", failing)
    monkeypatch.setattr(member_reads, "_store", slow_store)
    from slem_dask.storage.nodes.checksums import chunk_trailers

    crcs = chunk_trailers(arr)
    with pytest.raises(OSError, match="chunk 2 unreadable"):
        member_reads.read_recorded(
            arr, "precision", crcs, member_reads.MemberCast(np.dtype(np.float32), 1.0)
        )
    assert calls == [(0, 2), (2, 4), (4, 6)] and len(casts) == 2
