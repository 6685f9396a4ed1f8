"""The fit's fast path: slem-dask's own chunk reader and the streamed statistics.

* ``storage.read_rows`` decodes chunks of the common codec chains itself
  (``_RowChunkCodecs``); it must give zarr's values for every chain it accepts,
  hand every other layout to zarr, and name a damaged chunk instead of returning
  wrong rows.
* ``core.statistics.ScatterAccumulator`` folds blocks into one scatter; it must
  equal a brute-force float64 computation (1e-10 in float64) and keep the
  precision contract in float32, at narrow and wide d.
* ``parallel.store_statistics`` must equal numpy for several partitionings,
  start rows and schedulers (threads; distributed with 1 and 2 workers).
"""

import os

import dask
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

from slem_dask import storage
from slem_dask.core.statistics import ScatterAccumulator, block_statistics, covariance
from slem_dask.parallel.blocks import statistics_partition_rows, store_statistics

N, D, CHUNK = 1037, 24, 100


def brute_force(x):
    """float64 two-pass mean and population covariance (the reference of every test)."""
    x = np.asarray(x, dtype=np.float64)
    mean = x.sum(axis=0) / len(x)
    c = x - mean
    return mean, c.T @ c / len(x)


def max_rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(11)
    return (rng.standard_normal((N, D)) * rng.uniform(0.5, 2, D) + 5.0).astype(np.float32)


def write(path, x, chunks=CHUNK, **kwargs):
    arr = zarr.create_array(
        str(path), shape=x.shape, chunks=(chunks, x.shape[1]), dtype=x.dtype, **kwargs
    )
    arr[...] = x
    return storage.open_node(str(path), mode="r")


# -- the reader ------------------------------------------------------------------
CHAINS = {
    "zarr default": {},
    "no compressor": {"compressors": None},
    "zstd": {"compressors": [ZstdCodec(level=1)]},
    "crc32c": {"compressors": [Crc32cCodec()]},
    "zstd then crc32c": {"compressors": [ZstdCodec(), Crc32cCodec()]},
    "crc32c then zstd": {"compressors": [Crc32cCodec(), ZstdCodec()]},
}
ZARR_ONLY = {
    "blosc": {"compressors": [BloscCodec()]},
    "gzip": {"compressors": [GzipCodec()]},
    "sharded": {"shards": (200, D)},
    "column chunks": {"chunks_cols": 8},
}
RANGES = [(0, N), (0, CHUNK), (50, 250), (1000, N), (100, 1000), (37, 38), (999, 1001)]


@pytest.mark.parametrize("name", list(CHAINS) + list(ZARR_ONLY))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reader_gives_zarrs_values(tmp_path, rows, name, dtype):
    chain = dict({**CHAINS, **ZARR_ONLY}[name])
    x = rows.astype(dtype)
    if "chunks_cols" in chain:
        arr = zarr.create_array(
            str(tmp_path / "a"),
            shape=x.shape,
            chunks=(CHUNK, chain.pop("chunks_cols")),
            dtype=x.dtype,
        )
        arr[...] = x
        arr = storage.open_node(str(tmp_path / "a"), mode="r")
    else:
        arr = write(tmp_path / "a", x, **chain)
    assert (storage._RowChunkCodecs.of(arr) is not None) == (name in CHAINS)
    for lo, hi in RANGES:
        got = storage.read_rows(arr, lo, hi)
        assert got.dtype == dtype and got.flags.c_contiguous
        np.testing.assert_array_equal(got, x[lo:hi])
    out = np.full((200, D), np.nan, dtype=dtype)
    assert storage.read_rows(arr, 50, 250, out=out) is out
    np.testing.assert_array_equal(out, x[50:250])


def test_whole_crc32c_chunks_on_local_disk_are_read_into_the_result(tmp_path, rows, monkeypatch):
    """Chunks of bytes and a crc32c trailer, whole within the rows asked for, are read
    straight into the result and checked there (no buffer of their own and no copy: a
    model's A^-1 at d = 8192 reads in 0.25 s against 0.45 s); the others as before."""
    from slem_dask.storage.nodes import chunks

    arr = write(tmp_path / "a", rows, **CHAINS["crc32c"])
    fetched = []
    real = chunks.chunks_bytes
    monkeypatch.setattr(
        chunks, "chunks_bytes", lambda a, keys: fetched.extend(keys) or real(a, keys)
    )
    np.testing.assert_array_equal(storage.read_rows(arr, 50, 450), rows[50:450])
    assert fetched == ["c/0/0", "c/4/0"]  # rows 50-99 and 400-449: parts of chunks


def test_reader_refuses_a_wrong_out_buffer(tmp_path, rows):
    arr = write(tmp_path / "a", rows)
    with pytest.raises(ValueError, match=r"out: expected a C-ordered float32 array of shape"):
        storage.read_rows(arr, 0, 10, out=np.empty((9, D), np.float32))


def chunk_file(arr_path, i):
    return os.path.join(str(arr_path), "c", str(i), "0")


@pytest.mark.parametrize("chain", ["zarr default", "crc32c", "zstd then crc32c", "no compressor"])
def test_reader_names_damaged_chunks(tmp_path, rows, chain):
    path = tmp_path / "a"
    arr = write(path, rows, **CHAINS[chain])
    victim = chunk_file(path, 3)
    data = bytearray(open(victim, "rb").read())
    # a flipped byte: caught by crc32c where there is one, else by zstd or not at all
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    open(victim, "wb").write(bytes(flipped))
    if chain in ("crc32c", "zstd then crc32c"):
        with pytest.raises(storage.CorruptChunkError, match=r"chunk 'c/3/0' \(rows 300-399\)"):
            storage.read_rows(arr, 250, 450)
    # truncated: refused whatever the chain (a zstd frame or the raw size says so)
    open(victim, "wb").write(bytes(data[: len(data) // 2]))
    with pytest.raises(storage.CorruptChunkError, match=r"c/3/0.*cannot be read"):
        storage.read_rows(arr, 250, 450)
    # missing: refused, never read as fill values
    os.remove(victim)
    with pytest.raises(storage.MissingChunkError, match=r"c/3/0"):
        storage.read_rows(arr, 250, 450)
    np.testing.assert_array_equal(storage.read_rows(arr, 0, 300), rows[:300])


def test_reader_refuses_a_zstd_frame_of_another_size(tmp_path, rows):
    # a valid zstd frame that declares fewer bytes than the chunk holds: decoding it into
    # the result would leave rows unwritten (numcodecs does not check), so it is refused
    import numcodecs

    path = tmp_path / "a"
    arr = write(path, rows, compressors=[ZstdCodec()])
    short = numcodecs.Zstd().encode(rows[300:399].tobytes())
    open(chunk_file(path, 3), "wb").write(short)
    with pytest.raises(storage.CorruptChunkError, match=r"c/3/0.*size"):
        storage.read_rows(arr, 0, N)


def test_zstd_content_size_reads_every_header_form():
    import numcodecs

    for size in (0, 1, 255, 256, 300, 65791, 65792, 70000, 2**20 + 3):
        frame = numcodecs.Zstd().encode(np.zeros(size, np.uint8).tobytes())
        assert storage._zstd_content_size(np.frombuffer(frame, np.uint8)) == size
    assert storage._zstd_content_size(np.frombuffer(b"not zstd", np.uint8)) is None


# -- the accumulator -------------------------------------------------------------
@pytest.mark.parametrize("steps", [[N], [1, 9, 1027], [CHUNK] * 10 + [37], [500, 0, 537]])
def test_accumulator_equals_brute_force_in_float64(rows, steps):
    x = rows.astype(np.float64) * 3 + 1e3
    acc = ScatterAccumulator(D)
    start = 0
    for step in steps:
        acc.add(x[start : start + step])
        start += step
    stats = acc.result()
    mean, cov = brute_force(x)
    assert stats.count == N and stats.nonfinite == 0
    assert max_rel(stats.mean, mean) <= 1e-13
    assert max_rel(covariance(stats), cov) <= 1e-10


# 1e6: the block's mean rounded to float32 (its shift) is 0.06 sd off, and the
# rank-one term -m r r^T that corrects for it is 4e-3 of the scatter
@pytest.mark.parametrize("offset_sds", [0.0, 1e4, 1e6])
@pytest.mark.parametrize("d", [24, 2200])  # 2200 > 2 panels: the wide (upper triangle) path
def test_accumulator_float32_within_the_contract(offset_sds, d):
    rng = np.random.default_rng(5)
    n = 3000 if d < 100 else 600
    x = (rng.standard_normal((n, d)) + offset_sds).astype(np.float32)
    acc = ScatterAccumulator(d)
    for a in range(0, n, 256):
        acc.add(x[a : a + 256])
    stats = acc.result()
    mean, cov = brute_force(x)
    assert max_rel(covariance(stats), cov) <= 1e-5
    assert np.abs(stats.mean - mean).max() <= 1e-6 * np.abs(x - mean).max()
    np.testing.assert_array_equal(stats.scatter, stats.scatter.T)


@pytest.mark.parametrize("scale", [1e-30, 1e-40])  # 1e-40: float32 subnormals
def test_float32_values_whose_squares_all_underflow(tmp_path, scale):
    """Every square of values ~1e-30 is 0 in float32: a float32 product of zeros passed
    for a constant block, and the covariance came out 1000x too small (found by a
    reviewer). Such rows are done in float64."""
    x = (np.random.default_rng(3).standard_normal((3000, 3)) * scale).astype(np.float32)
    mean, cov = brute_force(x)
    acc = ScatterAccumulator(3)
    for a in range(0, len(x), 1000):
        acc.add(x[a : a + 1000])
    assert max_rel(covariance(acc.result()), cov) <= 1e-5
    stats = dask.compute(
        store_statistics(write(tmp_path / "tiny", x, 1000), 1000), scheduler="threads"
    )[0]
    assert max_rel(covariance(stats), cov) <= 1e-5 and max_rel(stats.mean, mean) <= 1e-12


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_column_constant_at_1e30_adds_nothing_to_the_covariance(tmp_path, dtype):
    """A float64 column constant at 1e30 was shifted by its rounded mean: it centred to
    values of 1e14, and its products with the other columns filled the covariance (a
    fit then failed as not positive definite; found by a reviewer)."""
    from slem_dask import LinearSLEM

    x = np.random.default_rng(4).normal(8000, 80, (9193, 3)).astype(dtype)
    x[:, 1] = dtype(1e30)
    cov = brute_force(x[:, [0, 2]])[1]  # (the two-pass brute force rounds 1e30 too)
    for stats in (
        block_statistics(x),
        dask.compute(
            store_statistics(write(tmp_path / "c", x, 2641), 1075 if dtype == np.float64 else 2641),
            scheduler="threads",
        )[0],
    ):
        got = covariance(stats)
        assert stats.mean[1] == np.float64(dtype(1e30))
        assert not got[1].any() and not got[:, 1].any()
        assert max_rel(got[np.ix_([0, 2], [0, 2])], cov) <= (1e-10 if dtype == np.float64 else 1e-5)
    model = LinearSLEM(precision="float64").fit(x)
    assert np.isfinite(model.precision_).all()


def test_accumulator_counts_and_skips_nonfinite_rows(rows):
    x = rows.astype(np.float64)
    bad = x.copy()
    bad[[3, 500]] = np.nan
    bad[700, 2] = np.inf
    acc = ScatterAccumulator(D)
    acc.add(bad[:600])
    acc.add(bad[600:])
    stats = acc.result()
    keep = np.ones(N, bool)
    keep[[3, 500, 700]] = False
    assert stats.nonfinite == 3 and stats.count == N - 3
    assert max_rel(covariance(stats), brute_force(x[keep])[1]) <= 1e-10
    only_bad = ScatterAccumulator(D)
    only_bad.add(np.full((2, D), np.nan))
    assert only_bad.result().nonfinite == 2


def test_overwrite_shifts_in_place_with_the_same_result(rows):
    """A read buffer given with overwrite=True is shifted in place instead of into the
    scratch copy: the same arithmetic, so the same bits; longer blocks and float64
    input take the copying path and leave the block as it was."""
    x = rows + np.float32(300)
    x[:, 3] = np.float32(0.3)  # constant: its mean must be 0.3 exactly, also in place
    plain, in_place = ScatterAccumulator(D), ScatterAccumulator(D)
    for a in range(0, N, 256):
        assert plain.add(x[a : a + 256])
        buffer = x[a : a + 256].copy()
        assert in_place.add(buffer, overwrite=True)
        assert not np.array_equal(buffer, x[a : a + 256])  # shifted in place
    want, got = plain.result(), in_place.result()
    np.testing.assert_array_equal(got.scatter, want.scatter)
    np.testing.assert_array_equal(got.mean, want.mean)
    assert got.mean[3] == np.float64(np.float32(0.3))
    long_block = np.repeat(x, 9, axis=0)  # more rows than one float32 product
    for block in (long_block, x.astype(np.float64)):
        kept = block.copy()
        assert ScatterAccumulator(D).add(block, overwrite=True)
        np.testing.assert_array_equal(block, kept)


def test_overwrite_hands_back_rows_beyond_float32(rows):
    """Rows whose float32 product would overflow cannot be done in float64 once shifted
    in place: add() folds nothing in and says so, and the caller's second pass of the
    rows as read (without overwrite) is done in float64, as the copying path does."""
    huge = rows * np.float32(1e30)
    acc = ScatterAccumulator(D)
    assert acc.add(rows[:300])
    buffer = huge[300:600].copy()
    assert not acc.add(buffer, overwrite=True)
    assert acc.count == 300 and acc.nonfinite == 0
    assert acc.add(huge[300:600])
    want = ScatterAccumulator(D)
    want.add(rows[:300])
    want.add(huge[300:600])
    got, want = acc.result(), want.result()
    np.testing.assert_array_equal(got.scatter, want.scatter)
    assert np.isfinite(got.scatter).all()


def test_accumulator_refuses_a_wrong_block():
    with pytest.raises(ValueError, match=r"2-D block of rows with 4 columns, got shape \(3, 5\)"):
        ScatterAccumulator(4).add(np.zeros((3, 5)))


def test_block_statistics_is_one_accumulated_block(rows):
    one = block_statistics(rows, "float64")
    mean, cov = brute_force(rows)
    assert max_rel(covariance(one), cov) <= 1e-12


# -- the streamed statistics -----------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory, rows):
    return write(tmp_path_factory.mktemp("neg") / "neg.zarr", rows.astype(np.float64) * 2 - 7)


@pytest.mark.parametrize("partition_rows", [CHUNK, 3 * CHUNK, N])
@pytest.mark.parametrize("start", [0, 1, 450])
def test_store_statistics_equal_numpy(store, partition_rows, start):
    x = store[...][start:]
    stats = dask.compute(
        store_statistics(store, partition_rows, "auto", start=start), scheduler="threads"
    )[0]
    mean, cov = brute_force(x)
    assert stats.count == len(x)
    assert max_rel(stats.mean, mean) <= 1e-13
    assert max_rel(covariance(stats), cov) <= 1e-10


def test_store_statistics_float32_store_keeps_the_contract(tmp_path, rows):
    arr = write(tmp_path / "f32", rows + np.float32(1e3))
    stats = dask.compute(store_statistics(arr, 2 * CHUNK), scheduler="threads")[0]
    stats64 = dask.compute(store_statistics(arr, 2 * CHUNK, "float64"), scheduler="threads")[0]
    _, cov = brute_force(rows + np.float32(1e3))
    assert max_rel(covariance(stats), cov) <= 1e-5
    assert max_rel(covariance(stats64), cov) <= 1e-10


def test_store_statistics_read_rows_beyond_float32_again(tmp_path, rows):
    """A chunk whose float32 product would overflow is shifted in place, handed back
    and read again for float64 products: no row lost, the float64 answer."""
    x = rows.copy()
    x[200:300] *= np.float32(1e30)
    arr = write(tmp_path / "huge", x)
    stats = dask.compute(store_statistics(arr, 3 * CHUNK), scheduler="threads")[0]
    mean, cov = brute_force(x)
    assert stats.count == N and np.isfinite(stats.scatter).all()
    assert max_rel(covariance(stats), cov) <= 1e-12
    assert max_rel(stats.mean, mean) <= 1e-13


def test_store_statistics_name_a_missing_chunk(tmp_path, rows):
    arr = write(tmp_path / "m", rows)
    os.remove(chunk_file(tmp_path / "m", 4))
    with pytest.raises(storage.MissingChunkError, match=r"negatives .*c/4/0"):
        dask.compute(store_statistics(arr, 3 * CHUNK), scheduler="threads")


def test_store_statistics_stay_lazy_and_name_their_tasks(store):
    stats = store_statistics(store, 2 * CHUNK)
    keys = [k for k in dict(stats.__dask_graph__()) if isinstance(k, tuple)]
    assert len([k for k in keys if k[0].startswith("slem-statistics-")]) == -(-N // (2 * CHUNK))
    with pytest.raises(ValueError, match=r"no rows to fit from row 1037 of 1037"):
        store_statistics(store, CHUNK, start=N)


def test_statistics_of_dask_rows_stream_the_store_and_derived_arrays_do_not(store):
    """An array from storage.dask_rows is summarized by store_statistics (its tasks read
    into their own buffers); a slice, rechunk or persist of it is another array, whose
    statistics must be its own rows' (a slice fitted as the whole store would be wrong)."""
    from slem_dask.parallel.blocks import scatter_statistics

    x = storage.dask_rows(store, 2 * CHUNK)
    stats = scatter_statistics(x)
    names = {k[0] for k in dict(stats.__dask_graph__()) if isinstance(k, tuple)}
    assert any(n.startswith("slem-statistics-") for n in names)
    assert not any(n.startswith("slem-read-") for n in names)
    for data, rows in (
        (x, store[...]),
        (x[:450], store[:450]),
        (x.rechunk({0: 300}), store[...]),
        (x[100:].persist(scheduler="threads"), store[100:]),
    ):
        got = dask.compute(scatter_statistics(data), scheduler="threads")[0]
        mean, cov = brute_force(rows)
        assert got.count == len(rows)
        assert max_rel(got.mean, mean) <= 1e-13 and max_rel(covariance(got), cov) <= 1e-10


def test_statistics_of_dask_rows_are_its_rows_after_setitem_or_an_append(tmp_path, rows):
    """The store path serves a dask_rows array only while it is still the rows dask_rows
    read: ``x[...] = v`` changes the array in place (same object, another graph), and rows
    appended to the store afterwards are not the array's (found by a reviewer: both were
    fitted from the store as it stood)."""
    from slem_dask.parallel.blocks import scatter_statistics

    arr = zarr.create_array(
        str(tmp_path / "grow"), shape=rows.shape, chunks=(CHUNK, D), dtype=rows.dtype
    )
    arr[...] = rows
    x = storage.dask_rows(arr, 2 * CHUNK)
    x[x > 1] = 0
    got = dask.compute(scatter_statistics(x), scheduler="threads")[0]
    want = np.where(rows > 1, np.float32(0), rows)
    assert max_rel(got.mean, brute_force(want)[0]) <= 1e-6
    y = storage.dask_rows(arr, 2 * CHUNK)
    arr.append(np.full((300, D), 50, np.float32))
    got = dask.compute(scatter_statistics(y), scheduler="threads")[0]
    mean, cov = brute_force(rows)
    assert got.count == N and max_rel(got.mean, mean) <= 1e-6
    assert max_rel(covariance(got), cov) <= 1e-5


@pytest.mark.cluster
@pytest.mark.parametrize("workers", [1, 2])
def test_store_statistics_on_worker_processes_equal_numpy(store, workers):
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        stats = client.compute(store_statistics(store, 2 * CHUNK)).result()
    mean, cov = brute_force(store[...])
    assert max_rel(covariance(stats), cov) <= 1e-10 and max_rel(stats.mean, mean) <= 1e-13


def test_wide_rows_get_one_partition_per_thread():
    # narrow rows: the caller's (default) partitions, whatever the threads
    assert statistics_partition_rows(400_000, 512, 20_000, 20_000, threads=2) == 20_000
    # d = 8192: a d x d float64 partial is 512 MiB; one partition per thread
    assert statistics_partition_rows(100_000, 8192, 1024, 8192, threads=2) == 50_176
    assert statistics_partition_rows(100_000, 8192, 1024, 8192, threads=3) == 33_792
    # also below d rows (a task streams its rows; the partials number the threads), in
    # whole storage units: 20,000 rows at d = 16384 on 2 threads are 2 x 10,240 rows
    assert statistics_partition_rows(20_000, 16384, 512, 16384, threads=2) == 10_240
    assert statistics_partition_rows(20_000, 8192, 1024, 8192, threads=16) == 2048
    assert statistics_partition_rows(10**6, 4096, 1000, 4000, threads=100) == 10_000
