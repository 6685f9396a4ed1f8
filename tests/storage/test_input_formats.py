"""Descriptors in every input format (storage/formats/formats.py): each read through open_input
equals numpy at several partitionings, fit/encode/search/evaluate take them from the
command line, their fingerprints see a rewritten file, and a file that cannot be read
gets one line naming its format and the fix."""

import os
import pickle
import re
import sys

import numpy as np
import pytest
import zarr

from slem_dask import LinearSLEM, load_model, search, storage
from slem_dask.datasets import make_corpus, write_corpus
from slem_dask.storage.nodes import fingerprints

from helpers import run_cli as run  # (exit code, stdout, stderr) of the CLI in-process

pytestmark = pytest.mark.usefixtures("no_scheduler_env")  # conftest.py

N, D = 90, 6


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    return (rng.standard_normal((N, D)) * rng.uniform(0.5, 2, D) + 2).astype(np.float32)


def write_texmex(path, rows, kind):
    with open(path, "wb") as f:
        for row in rows:
            f.write(np.int32(len(row)).tobytes())
            f.write(np.asarray(row, dtype=kind).tobytes())
    return str(path)


def write_shards(folder, rows, bounds=(0, 7, 20, 51, N), names=(2, 10, 11, 100)):
    """Shards whose natural order (2, 10, 11, 100) is not their lexicographic one."""
    os.makedirs(folder, exist_ok=True)
    for name, lo, hi in zip(names, bounds[:-1], bounds[1:], strict=True):
        np.save(os.path.join(folder, f"emb_{name}.npy"), rows[lo:hi])
    return str(folder)


def make_inputs(root, x):
    """{kind: (path, the rows it holds)}."""
    h5py = pytest.importorskip("h5py")
    out = {}
    np.save(root / "x.npy", x)
    out["npy"] = (str(root / "x.npy"), x)
    np.save(root / "big-endian.npy", x.astype(">f8"))
    out["npy >f8"] = (str(root / "big-endian.npy"), x.astype(np.float64))
    np.save(root / "fortran.npy", np.asfortranarray(x))
    out["npy fortran"] = (str(root / "fortran.npy"), x)
    out["shards"] = (write_shards(root / "shards", x), x)
    out["glob"] = (str(root / "shards" / "emb_*.npy"), x)
    with h5py.File(root / "one.h5", "w") as f:
        f.create_dataset("emb", data=x, chunks=(8, D))
        f["ids"] = np.arange(N)  # 1-D: not a candidate
    out["hdf5 one"] = (str(root / "one.h5"), x)
    with h5py.File(root / "many.hdf5", "w") as f:
        f["train"] = x[:10]
        f["group/test"] = x
    out["hdf5 named"] = (str(root / "many.hdf5") + ":/group/test", x)
    out["hdf5 no slash"] = (str(root / "many.hdf5") + ":group/test", x)
    out["fvecs"] = (write_texmex(root / "x.fvecs", x, "<f4"), x)
    ints = np.rint(np.abs(x) * 40).astype(np.uint8)
    out["bvecs"] = (write_texmex(root / "x.bvecs", ints, "u1"), ints)
    out["ivecs"] = (
        write_texmex(root / "x.ivecs", ints.astype(np.int32), "<i4"),
        ints.astype(np.int32),
    )
    v2 = zarr.create_array(
        str(root / "v2.zarr"), shape=x.shape, chunks=(16, D), dtype=x.dtype, zarr_format=2
    )
    v2[...] = x
    out["zarr v2"] = (str(root / "v2.zarr"), x)
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, data):
    return make_inputs(tmp_path_factory.mktemp("formats"), data)


KINDS = [
    "npy",
    "npy >f8",
    "npy fortran",
    "shards",
    "glob",
    "hdf5 one",
    "hdf5 named",
    "hdf5 no slash",
    "fvecs",
    "bvecs",
    "ivecs",
    "zarr v2",
]


@pytest.mark.parametrize("kind", KINDS)
def test_each_format_reads_as_numpy(inputs, kind):
    path, want = inputs[kind]
    arr = storage.open_input(path, "negatives")
    assert arr.shape == want.shape and arr.dtype == want.dtype
    for rows in (1, 7, 32, None):
        x = storage.dask_rows(arr, rows)
        assert all(c % storage.unit_rows(arr) == 0 for c in x.chunks[0][:-1])
        np.testing.assert_array_equal(x.compute(scheduler="sync"), want)
    for lo, hi in ((0, 1), (5, 25), (50, 51), (19, N)):  # across shard boundaries
        np.testing.assert_array_equal(storage.read_rows(arr, lo, hi), want[lo:hi])
    np.testing.assert_array_equal(arr[3:9], want[3:9])
    # what a job records it read: one fingerprint per partition, and of the whole
    parts = fingerprints.partition_fingerprints(arr, path, "negatives", 16)
    assert len(parts) == -(-N // 16) and len(set(parts)) == len(parts)
    assert storage.read_version(arr, path)["fingerprint"] == fingerprints.rows_fingerprint(
        arr, path, "negatives", N
    )
    # what a distributed worker gets: the array pickled, then read there
    again = pickle.loads(pickle.dumps(arr))
    np.testing.assert_array_equal(storage.read_rows(again, 10, 30), want[10:30])


def test_shards_in_natural_order(tmp_path):
    rows = np.arange(40, dtype=np.float32).reshape(20, 2)
    folder = write_shards(tmp_path / "s", rows, bounds=(0, 5, 10, 15, 20))
    assert sorted(os.listdir(folder)) == [
        "emb_10.npy",
        "emb_100.npy",
        "emb_11.npy",
        "emb_2.npy",
    ]  # lexicographic: not row order
    np.testing.assert_array_equal(storage.read_all(folder, "x"), rows)


def test_file_inputs_go_through_statistics_from_the_store(inputs, data):
    from slem_dask.parallel.blocks import scatter_statistics

    for kind in ("shards", "fvecs", "hdf5 one"):
        arr = storage.open_input(inputs[kind][0], "negatives")
        stats = scatter_statistics(storage.dask_rows(arr, 16)).compute(scheduler="sync")
        x = data.astype(np.float64)
        np.testing.assert_allclose(stats.mean, x.mean(0), rtol=1e-6)
        np.testing.assert_allclose(
            stats.scatter / stats.count, np.cov(x.T, bias=True), rtol=1e-5, atol=1e-6
        )


# -- fingerprints -----------------------------------------------------------------


def test_fingerprints_see_a_rewritten_file(tmp_path, data):
    folder = write_shards(tmp_path / "s", data)
    arr = storage.open_input(folder, "negatives")
    parts = fingerprints.partition_fingerprints(arr, folder, "negatives", 20)
    whole = fingerprints.rows_fingerprint(arr, folder, "negatives", N)
    first = fingerprints.rows_fingerprint(arr, folder, "negatives", 7)
    assert storage.read_version(arr, folder)["fingerprint"] == whole
    # the same files opened again: the same fingerprints
    again = storage.open_input(folder, "negatives")
    assert fingerprints.partition_fingerprints(again, folder, "negatives", 20) == parts
    # rewrite the third shard (rows 20-50) with other values of the same size
    shard = os.path.join(folder, "emb_11.npy")
    stat = os.stat(shard)
    np.save(shard, data[20:51] + 1)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    # the array opened before sees it too: a job compares what it read before and after
    assert fingerprints.partition_fingerprints(arr, folder, "negatives", 20)[1] != parts[1]
    now = storage.open_input(folder, "negatives")
    changed = fingerprints.partition_fingerprints(now, folder, "negatives", 20)
    assert [a != b for a, b in zip(parts, changed, strict=True)] == [
        False,
        True,
        True,
        False,
        False,
    ]
    assert fingerprints.rows_fingerprint(now, folder, "negatives", N) != whole
    assert fingerprints.rows_fingerprint(now, folder, "negatives", 7) == first
    os.rename(shard, shard + ".gone")
    with pytest.raises(
        FileNotFoundError,
        match=r"negatives: .*emb_11\.npy' \(rows 20-50 "
        r"of .*\) was removed",
    ):
        fingerprints.partition_fingerprints(now, folder, "negatives", 20)
    os.rename(shard + ".gone", shard)
    # a shard appended: the rows before it keep their fingerprint (fit --update)
    np.save(os.path.join(folder, "emb_200.npy"), data[:5])
    grown = storage.open_input(folder, "negatives")
    assert grown.shape == (N + 5, D)
    assert fingerprints.rows_fingerprint(
        grown, folder, "negatives", N
    ) == fingerprints.rows_fingerprint(now, folder, "negatives", N)
    # encode: only the partition the new rows extend changes (rows 80-89 -> 80-94)
    longer = fingerprints.partition_fingerprints(grown, folder, "negatives", 20)
    assert longer[:4] == changed[:4] and longer[4] != changed[4]


def test_a_file_changed_while_read_is_refused(tmp_path, data):
    path = str(tmp_path / "x.npy")
    np.save(path, data)
    arr = storage.open_input(path, "positives")
    np.save(path, data[:10])
    with pytest.raises(
        ValueError,
        match=r"positives: .*x\.npy' changed size while this "
        r"job read it",
    ):
        storage.read_rows(arr, 0, 5, "positives")


# -- the command line -------------------------------------------------------------


def test_cli_fit_encode_search_on_shards_and_fvecs(scheduler, tmp_path, capsys, data):
    shards = write_shards(tmp_path / "negatives", data)
    rng = np.random.default_rng(5)
    positives = (rng.standard_normal((40, D)) + 2).astype(np.float32)
    fvecs = write_texmex(tmp_path / "positives.fvecs", positives, "<f4")
    model, out = tmp_path / "model.zarr", tmp_path / "codes.zarr"
    common = ("--scheduler", scheduler, "--no-progress")
    code, _, err = run(
        capsys,
        "fit",
        "--negatives",
        f"{shards}/emb_*.npy",
        "--model",
        model,
        "--lam",
        "0.01",
        "--precision",
        "float64",
        *common,
    )
    assert code == 0, err
    want = LinearSLEM(lam=0.01, precision="float64").fit(data)
    got = load_model(str(model))
    np.testing.assert_allclose(got.covariance_, want.covariance_, rtol=1e-9, atol=1e-12)
    code, _, err = run(
        capsys,
        "encode",
        "--model",
        model,
        "--positives",
        fvecs,
        "--out",
        out,
        "--partition-rows",
        "16",
        *common,
    )
    assert code == 0, err
    codes = storage.read_all(str(out))
    assert codes.dtype == np.float32
    np.testing.assert_allclose(codes, want.transform(positives), rtol=1e-5, atol=1e-6)
    # searching the .npy of one's own encodings against the output
    np.save(tmp_path / "q.npy", codes[:5])
    code, _, err = run(
        capsys,
        "search",
        "--queries",
        tmp_path / "q.npy",
        "--database",
        out,
        "--k",
        "3",
        "--out",
        tmp_path / "hits.zarr",
        *common,
    )
    assert code == 0, err
    _, arrays = storage.read_search_store(str(tmp_path / "hits.zarr"))
    np.testing.assert_array_equal(arrays["indices"], search(codes[:5], codes, k=3)[1])


def test_cli_encode_reencodes_a_changed_npy(scheduler, tmp_path, capsys, data):
    model = str(tmp_path / "model.zarr")
    LinearSLEM(lam=0.01).fit(data).save(model)
    path, out = str(tmp_path / "p.npy"), tmp_path / "codes.zarr"
    np.save(path, data[:30])
    args = (
        "encode",
        "--model",
        model,
        "--positives",
        path,
        "--out",
        out,
        "--partition-rows",
        "10",
        "--scheduler",
        scheduler,
        "--no-progress",
    )
    assert run(capsys, *args)[0] == 0
    code, text, err = run(capsys, *args)
    assert code == 0 and "up to date" in text, err
    stat = os.stat(path)
    np.save(path, data[30:60])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    code, text, err = run(capsys, *args)
    assert code == 0 and "up to date" not in text, err
    np.testing.assert_allclose(
        storage.read_all(str(out)), load_model(model).transform(data[30:60]), rtol=1e-5, atol=1e-6
    )


def test_cli_integer_descriptors_encode_to_float32(scheduler, tmp_path, capsys, inputs):
    path, ints = inputs["bvecs"]
    model = str(tmp_path / "model.zarr")
    LinearSLEM(lam=0.01).fit(ints).save(model)
    common = ("--model", model, "--positives", path, "--scheduler", scheduler, "--no-progress")
    assert run(capsys, "encode", "--out", tmp_path / "a.zarr", *common)[0] == 0
    assert (
        run(capsys, "encode", "--out", tmp_path / "b.zarr", "--dtype", "float64", *common)[0] == 0
    )
    a, b = storage.read_all(str(tmp_path / "a.zarr")), storage.read_all(str(tmp_path / "b.zarr"))
    assert a.dtype == np.float32 and b.dtype == np.float64  # an explicit dtype still wins
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _maps(text: str) -> dict[str, str]:
    """method -> mAP column of an evaluate table."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("method"))
    return {
        line.split()[0]: line.split()[1]
        for line in lines[header + 2 :]
        if line.strip() and line.split()[0] in ("raw", "slem")
    }


def test_cli_evaluate_on_own_labelled_descriptors(scheduler, tmp_path, capsys):
    corpus = make_corpus(n_negatives=300, n_instances=12, group_size=3, d=8, seed=4)
    write_corpus(corpus, str(tmp_path / "corpus.zarr"), chunk_rows=64)
    for name in ("negatives", "database", "queries", "database_labels", "query_labels"):
        np.save(tmp_path / f"{name}.npy", getattr(corpus, name))
    common = ("--methods", "raw,slem", "--scheduler", scheduler, "--no-progress")
    code, want, err = run(capsys, "evaluate", "--corpus", tmp_path / "corpus.zarr", *common)
    assert code == 0, err
    own = (
        "--negatives-from",
        tmp_path / "negatives.npy",
        "--database",
        tmp_path / "database.npy",
        "--queries",
        tmp_path / "queries.npy",
        "--database-labels",
        tmp_path / "database_labels.npy",
    )
    code, got, err = run(
        capsys, "evaluate", *own, "--query-labels", tmp_path / "query_labels.npy", *common
    )
    assert code == 0, err
    assert _maps(got) == _maps(want) and len(_maps(got)) == 2
    # labels also come from a zarr array (a corpus' member) or an HDF5 dataset
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "labels.h5", "w") as f:
        f["query"] = corpus.query_labels.astype("S8")
    for path in (f"{tmp_path}/corpus.zarr/query_labels", f"{tmp_path}/query_labels.npy"):
        np.testing.assert_array_equal(
            storage.read_labels(path, "query labels", 12), corpus.query_labels
        )
    np.testing.assert_array_equal(
        storage.read_labels(f"{tmp_path}/labels.h5:/query", "q", 12),
        corpus.query_labels.astype("S8"),
    )
    # neither, both, or a label file of the wrong length: one line each
    code, _, err = run(capsys, "evaluate", *own, *common)
    assert code == 2 and "missing: --query-labels" in err
    code, _, err = run(capsys, "evaluate", "--corpus", tmp_path / "corpus.zarr", *own, *common)
    assert code == 2 and "give one or the other" in err
    np.save(tmp_path / "short.npy", corpus.query_labels[:-1])
    code, _, err = run(capsys, "evaluate", *own, "--query-labels", tmp_path / "short.npy", *common)
    assert code == 1 and re.search(
        r"--query-labels: .*short\.npy' holds 11 labels for 12 "
        r"rows",
        err,
    ), err


# -- what cannot be read: one line, the format and the fix ------------------------


def test_unreadable_inputs_say_what_to_do(tmp_path, data, monkeypatch):
    h5py = pytest.importorskip("h5py")
    (tmp_path / "notes.txt").write_text("not descriptors")
    np.save(tmp_path / "one.npy", data[0])
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "cut.npy", data)
    with open(tmp_path / "cut.npy", "r+b") as f:  # a copy cut off: the header says more rows
        f.truncate(os.path.getsize(tmp_path / "cut.npy") - 8)
    write_shards(tmp_path / "mixed", data)
    np.save(tmp_path / "mixed" / "emb_3.npy", data[:4, :3])
    with h5py.File(tmp_path / "two.h5", "w") as f:
        f["a"], f["b"] = data, data
    (tmp_path / "bad.fvecs").write_bytes(np.int32(D).tobytes() + b"\0" * 10)
    odd = np.concatenate([np.full((3, 1), D, np.int32), data[:3].view(np.int32)], axis=1)
    odd[2, 0] = D + 1
    (tmp_path / "odd.fvecs").write_bytes(odd.tobytes())
    whole = np.concatenate([np.full((5, 1), D, np.int32), data[:5].view(np.int32)], axis=1)
    (tmp_path / "cut.fvecs").write_bytes(whole.tobytes()[:-10])  # a copy cut short
    with h5py.File(tmp_path / "cube.h5", "w") as f:
        f["images"] = np.zeros((4, 5, D), "float32")
    with h5py.File(tmp_path / "grouped.h5", "w") as f:
        f["grp/neg"] = np.zeros((4, D), "float32")
        f["grp/ids"] = np.arange(4)
        f.create_group("nothing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("")
    cases = {
        "notes.txt": r"no zarr array at .*notes\.txt': it is a file of a format slem-dask "
        r"does not read .*np\.save",
        "one.npy": r"the \.npy file .*one\.npy' has shape \(6,\) \(1-D\).*reshape\(1, -1\)",
        "objects.npy": r"objects\.npy' is a \.npy file that cannot be memory-mapped .*"
        r"numeric array",
        "cut.npy": r"the \.npy file .*cut\.npy' is truncated: \d[\d,]* bytes where its header "
        r"\(\(\d+, 6\), float32\) needs [\d,]+; copy or save it again",
        "mixed": r"the shard .*emb_3\.npy' has 3 columns of float32, the first shard "
        r".*emb_2\.npy' 6 of float32",
        "nothing/*.npy": r"no file matches .*nothing/\*\.npy'",
        "nothing.npy": r"no file at .*nothing\.npy'; check the path",
        "two.h5": r"holds 2 2-D datasets \(datasets: /a, /b\); name one as .*two\.h5:/path",
        "two.h5:/c": r"has no dataset '/c' \(datasets: /a, /b\)",
        # a group named where a dataset goes: its dataset of rows is offered
        "grouped.h5:/grp": r"'/grp' in the HDF5 file .*grouped\.h5' is a group, not a "
        r"dataset; name its dataset of rows: .*grouped\.h5:/grp/neg$",
        "grouped.h5:/nothing": r"is a group, not a dataset; it holds no 2-D dataset: name "
        r"one of rows as .*grouped\.h5:/dataset$",
        "bad.fvecs": r"is not a \.fvecs file: its first row declares dimension 6, and its "
        r"size \(14 bytes\)",
        "cut.fvecs": r"the \.fvecs file .*cut\.fvecs' is cut short: its rows are 4 \+ 6 x 4 "
        r"bytes \(dimension 6\), and it holds 4 whole rows and 18 bytes of one more .*"
        r"copy it again, or keep its whole rows \(truncate -s 112 FILE\)",
        "cube.h5": r"cube\.h5' holds no 2-D dataset \(datasets: /images; /images has shape "
        r"\(4, 5, 6\)\); descriptors are one 2-D dataset .*reshape\(-1, 6\)",
        "cube.h5:/images": r"cube\.h5:/images has shape \(4, 5, 6\); expected 2-D rows "
        r"\(n_rows, n_features\): write its rows as one, e\.g\. .*reshape\(-1, 6\)",
        "empty": r"no zarr array at .*empty', and no \.npy shards in that folder \(it is "
        r"empty\); put the shards there",
        "notes": r"no zarr array at .*notes', and no \.npy shards in that folder \(it holds "
        r"1 other entry, e\.g\. 'a\.txt'\)",
    }
    for name, message in cases.items():
        with pytest.raises((ValueError, FileNotFoundError), match=message) as info:
            storage.open_input(str(tmp_path / name), "negatives")
        text = str(info.value)
        assert text.startswith("negatives: ") and "\n" not in text, (name, text)
    with pytest.raises(
        ValueError,
        match=r"row 2 declares dimension 7, the file's first "
        r"row 6",
    ):
        storage.read_all(str(tmp_path / "odd.fvecs"), "negatives")
    with pytest.raises(
        ValueError,
        match=r"negatives: 's3://bucket/x\.npy' \(\.npy file\) is on remote storage; "
        r".*copy it to a local path",
    ):
        storage.open_input("s3://bucket/x.npy", "negatives")
    monkeypatch.setitem(sys.modules, "h5py", None)  # h5py not installed
    with pytest.raises(
        ValueError,
        match=r"negatives: .*two\.h5' is an HDF5 file and h5py "
        r"is not installed: pip install h5py",
    ):
        storage.open_input(str(tmp_path / "two.h5:/a"), "negatives")


def test_job_spec_updates_from_appended_npy_shards(scheduler, tmp_path, capsys, data):
    """`run`: a fit on a folder of shards, updated when a shard is appended (only its rows
    are read), and an encode of a .npy, then both up to date."""
    folder = write_shards(tmp_path / "neg", data[:51], bounds=(0, 7, 20, 51), names=(2, 10, 11))
    np.save(tmp_path / "pos.npy", data[:25])
    spec = tmp_path / "job.toml"
    spec.write_text(
        f'[model]\npath = "{tmp_path}/model.zarr"\nlam = 0.01\n\n'
        f'[fit]\nnegatives = "{folder}"\nupdate = true\n\n'
        f'[[encode]]\npositives = "{tmp_path}/pos.npy"\n'
        f'out = "{tmp_path}/codes.zarr"\npartition_rows = 10\n'
    )
    args = ("run", spec, "--scheduler", scheduler, "--no-progress")
    code, out, err = run(capsys, *args)
    assert code == 0, err
    np.save(os.path.join(folder, "emb_100.npy"), data[51:])
    code, out, err = run(capsys, *args)
    assert code == 0, err
    fit = out.split("\nfit:\n")[1]
    assert re.search(r"action\s+update", fit) and re.search(rf"rows read\s+{N - 51}\b", fit)
    assert re.search(r"re-encode \(model changed\)", out.split("\nencode:\n")[1]), out
    code, out, err = run(capsys, *args)  # nothing changed: nothing read or written
    assert code == 0 and re.search(r"action\s+up to date", out.split("\nfit:\n")[1]), out
    assert re.search(r"partitions\s+0 encoded of 3", out.split("\nencode:\n")[1]), out
    want = LinearSLEM(lam=0.01).fit(data)
    np.testing.assert_allclose(
        load_model(str(tmp_path / "model.zarr")).covariance_, want.covariance_, rtol=1e-5, atol=1e-6
    )


def test_no_output_replaces_or_nests_in_a_file_input(tmp_path, data):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["emb"] = data
    write_shards(tmp_path / "shards", data)
    shard = sorted(os.listdir(tmp_path / "shards"))[0]
    for source, target in (
        (f"{tmp_path}/x.h5:/emb", f"{tmp_path}/x.h5"),
        (f"{tmp_path}/shards/*.npy", f"{tmp_path}/shards/{shard}"),
        (f"{tmp_path}/shards/*.npy", f"{tmp_path}/shards"),
    ):
        with pytest.raises(
            ValueError,
            match=r"--out .* the positives .*writing it would "
            r"destroy the input",
        ):
            storage.check_distinct(target, "--out", {"positives": source})
    storage.check_distinct(
        f"{tmp_path}/codes.zarr", "--out", {"positives": f"{tmp_path}/x.h5:/emb"}
    )


def test_a_glob_input_is_the_files_it_matches(tmp_path, data):
    """An output beside the matched files is allowed; one the glob would match is not
    (a later run would read it); one inside a folder of shards adds files to it."""
    write_shards(tmp_path / "shards", data)
    glob_input = {"positives": f"{tmp_path}/shards/*.npy"}
    storage.check_distinct(f"{tmp_path}/shards/codes.zarr", "--out", glob_input)
    with pytest.raises(
        ValueError,
        match=r"--out .*shards/new\.npy' matches the positives "
        r"glob .*a later run would read it",
    ):
        storage.check_distinct(f"{tmp_path}/shards/new.npy", "--out", glob_input)
    with pytest.raises(
        ValueError,
        match=r"is inside the positives folder of \.npy shards "
        r".*writing it would add files to that input",
    ):
        storage.check_distinct(
            f"{tmp_path}/shards/codes.zarr", "--out", {"positives": f"{tmp_path}/shards"}
        )


def test_a_glob_matching_nothing_says_so_before_any_overlap(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"negatives: no file matches .*nomatch\*"):
        storage.check_distinct(
            f"{tmp_path}/model.zarr", "--model", {"negatives": f"{tmp_path}/nomatch*.npy"}
        )


def test_file_arrays_index_as_numpy(inputs):
    path, want = inputs["shards"]
    arr = storage.open_input(path, "x")
    for key in (
        3,
        -1,
        slice(None),
        slice(5, 40, 3),
        slice(60, 10, -7),
        slice(8, 8),
        Ellipsis,
        (slice(2, 30), 1),
        (4, slice(1, 3)),
        (slice(None), [0, 2]),
    ):
        np.testing.assert_array_equal(arr[key], want[key], err_msg=repr(key))
    with pytest.raises(IndexError):
        arr[N]


def test_cli_encodes_a_zarr_v2_array(scheduler, tmp_path, capsys, inputs, data):
    model = str(tmp_path / "model.zarr")
    LinearSLEM(lam=0.01).fit(data).save(model)
    code, _, err = run(
        capsys,
        "encode",
        "--model",
        model,
        "--positives",
        inputs["zarr v2"][0],
        "--out",
        tmp_path / "codes.zarr",
        "--scheduler",
        scheduler,
        "--no-progress",
    )
    assert code == 0, err
    np.testing.assert_allclose(
        storage.read_all(str(tmp_path / "codes.zarr")),
        load_model(model).transform(data),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize("content", [b"hello", b"hello, not an array at all"])
def test_a_corrupt_npy_file_is_named_as_not_a_valid_npy_file(tmp_path, content):
    (tmp_path / "bad.npy").write_bytes(content)
    with pytest.raises(
        ValueError,
        match=r"^positives: '.*bad\.npy' is not a valid \.npy file "
        r"\(.*magic string.*\): write it with np\.save",
    ) as info:
        storage.open_input(str(tmp_path / "bad.npy"), "positives")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("dtype", ["<f4", ">f8", "<i2"])
@pytest.mark.parametrize("compressors", [None, "auto"])
def test_a_fingerprint_digests_a_partly_filled_chunk_as_zarr_reads_it(tmp_path, dtype, compressors):
    """The rows of a partly filled last chunk are digested as slem-dask's reader gives
    them: the same bytes as zarr's copy of them, so that the fingerprints recorded with
    outputs and models before the reader did it still match."""
    values = (np.arange(23 * 5).reshape(23, 5) * 1.5).astype(dtype)
    path = str(tmp_path / "a.zarr")
    written = zarr.create_array(
        path, shape=values.shape, dtype=values.dtype, chunks=(10, 5), compressors=compressors
    )
    written[...] = values
    arr = storage.open_input(path, "negatives")
    ours = fingerprints.rows_fingerprint(arr, path, "negatives", 23)
    zarrs = fingerprints.read_rows
    try:
        fingerprints.read_rows = lambda a, lo, hi, name: np.ascontiguousarray(a[lo:hi])
        assert fingerprints.rows_fingerprint(arr, path, "negatives", 23) == ours
    finally:
        fingerprints.read_rows = zarrs
    written[22, 4] = (
        values[22, 4] + 1
    )  # a changed row of the partly filled chunk: another fingerprint
    assert fingerprints.rows_fingerprint(arr, path, "negatives", 23) != ours
