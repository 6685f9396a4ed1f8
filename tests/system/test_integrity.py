"""Issue 8: an output or model marked complete is always right, and slem-dask never
deletes what it did not write. Each test reproduces one way it used to go wrong
(item numbers of the issue in the test names' docstrings) and checks it now holds.
The multi-process cases (separate workers, a killed scheduler, a worker without the
mount, a full disk) are in test_real_cluster.py."""

import errno
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

from slem_dask import LinearSLEM, KernelSLEM, load_model, pipeline, storage
from slem_dask.cli.main import main
from slem_dask.storage import canonical
from reference import partitionwise
from helpers import cli, encode_command, encode_corpus, head, zarr_rows
from slem_dask.storage.versioning import versions

D = 8


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(5)
    neg = rng.standard_normal((400, D)).astype("float32")
    pos = rng.standard_normal((200, D)).astype("float32")
    zarr_rows(tmp_path / "neg.zarr", neg)
    zarr_rows(tmp_path / "pos.zarr", pos)
    LinearSLEM(lam=0.1).fit(neg).save(str(tmp_path / "model.zarr"))
    return {
        "dir": tmp_path,
        "neg": neg,
        "pos": pos,
        "model": str(tmp_path / "model.zarr"),
        "negatives": str(tmp_path / "neg.zarr"),
        "positives": str(tmp_path / "pos.zarr"),
    }


def _cli(capsys, client, *args):
    return cli(capsys, client.scheduler.address, *args)


def _verify(capsys, *paths):
    code = main(["verify", *map(str, paths)])
    out, err = capsys.readouterr()
    return code, out, err


def _search_args(queries, database, out, k=3):
    return ["search", "--queries", queries, "--database", database, "--k", k, "--out", out]


def _expected(corpus, pos=None, like=None):
    """What encode_job writes: one product per partition (40 rows, or the partitions
    of the output ``like``)."""
    model = load_model(corpus["model"])
    rows = 40 if like is None else storage.open_node(str(like), mode="r").chunks[0]
    return partitionwise(
        lambda p: model.transform(p, dtype="float32"), corpus["pos"] if pos is None else pos, rows
    )


def _chunk(path, i):
    root = head(path) if versions.VersionedStore(str(path)).is_versioned() else Path(path)
    return root / "c" / str(i) / "0"


# -- 1. completion is verified, missing input chunks are refused -------------------------
def test_missing_input_chunk_is_refused_not_read_as_zeros(corpus, client, capsys):
    """Item 1: zarr reads a missing chunk as fill values; fit and encode refuse it."""
    os.remove(_chunk(corpus["positives"], 2))
    with pytest.raises(storage.MissingChunkError, match=r"chunk 'c/2/0' \(rows 80-119\)"):
        encode_corpus(corpus, corpus["dir"] / "out.zarr")
    assert not (corpus["dir"] / "out.zarr").exists()
    os.remove(_chunk(corpus["negatives"], 3))
    code, _, err = _cli(
        capsys,
        client,
        "fit",
        "--negatives",
        corpus["negatives"],
        "--model",
        corpus["dir"] / "m2",
        "--no-progress",
    )
    assert code == 1 and "c/3/0" in err and "missing" in err
    assert not (corpus["dir"] / "m2").exists()


def test_missing_chunk_seen_by_a_worker_only_is_refused_in_the_task(corpus, monkeypatch):
    """Item 1: the client saw the chunk, the task that reads it does not: the task refuses."""
    arr = storage.open_input(corpus["positives"], "positives")
    x = storage.dask_rows(arr, 40, name="positives")
    os.remove(_chunk(corpus["positives"], 1))
    with pytest.raises(storage.MissingChunkError, match="c/1/0"):
        x.compute()


def test_output_not_marked_complete_when_a_written_chunk_is_not_there(corpus, monkeypatch):
    """Item 1: a worker writing somewhere the client does not see leaves chunks missing; the
    client checks each partition's crc32c in its own view before marking complete."""
    real = storage.write_partition

    def lost(block, arr, index, block_info=None):
        record = real(block, arr, index)
        if index == 3:  # as if written to another filesystem
            storage.delete_chunk(arr, index)
        return record

    monkeypatch.setattr(storage, "write_partition", lost)
    out = corpus["dir"] / "out.zarr"
    with pytest.raises(pipeline.JobFailed, match=r"1 partition\(s\) \(3\) are missing"):
        encode_corpus(corpus, out)
    assert not versions.VersionedStore(str(out)).is_versioned()  # nothing visible
    monkeypatch.undo()
    report = encode_corpus(corpus, out)  # the re-run writes what was lost, then completes
    assert report.facts["partitions"] == "1 encoded of 5"
    np.testing.assert_array_equal(storage.read_all(out), _expected(corpus))


# -- 2. one writer per store ----------------------------------------------------------
def test_racing_encodes_to_one_output_leave_one_right_output(corpus):
    """Item 2: 20 concurrent pairs writing different positives to the same --out. Each run
    either finishes or is refused; the complete output always holds exactly the
    encodings of the source it records."""
    other = corpus["pos"][::-1].copy()
    zarr_rows(corpus["dir"] / "other.zarr", other)
    sources = {
        canonical(corpus["positives"]).url: _expected(corpus),
        canonical(corpus["dir"] / "other.zarr").url: _expected(corpus, other),
    }
    for trial in range(20):
        out = corpus["dir"] / f"race{trial}.zarr"
        results = [None, None]

        def run(i, positives, out=out, results=results):
            try:
                pipeline.encode_job(None, corpus["model"], positives, str(out), partition_rows=40)
                results[i] = "ok"
            except FileExistsError as exc:  # lease held, or the other source's output
                results[i] = type(exc).__name__
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion
                results[i] = repr(exc)

        threads = [
            threading.Thread(target=run, args=(0, corpus["positives"])),
            threading.Thread(target=run, args=(1, str(corpus["dir"] / "other.zarr"))),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert "ok" in results, results
        meta = storage.output_meta(storage.open_node(str(out)))
        assert meta["complete"] is True
        np.testing.assert_array_equal(storage.read_all(out), sources[meta["source"]])
        assert not Path(str(out.parent / f".{out.name}.slem-dask-lease")).exists()


def test_a_live_lease_is_refused_naming_its_owner_and_a_dead_one_taken_over(corpus):
    out = corpus["dir"] / "leased.zarr"
    with storage.Lease(out, "another job"):
        with pytest.raises(storage.LeaseHeldError, match=rf"pid {os.getpid()} on host"):
            encode_corpus(corpus, out)
    lease = storage.Lease(out, "dead job")
    assert lease._create()  # a job that died holding it: a pid that no longer runs
    record = lease.read()
    record["pid"] = 2**22 + 1
    Path(lease.file.location).write_text(__import__("json").dumps(record))
    report = encode_corpus(corpus, out)
    assert report.facts["action"] == "create"
    np.testing.assert_array_equal(storage.read_all(out), _expected(corpus))


def test_a_job_whose_lease_was_taken_over_does_not_mark_complete(corpus, monkeypatch):
    out = corpus["dir"] / "stolen.zarr"
    real = storage.mark_complete

    def steal_then_mark(arr, extra=None):
        raise AssertionError("must not be reached")

    original_check = storage.Lease.check

    def stolen(self):
        Path(self.file.location).write_text(
            '{"token": "someone else", "pid": 1, "host": "elsewhere", "heartbeat": 1e12}'
        )
        return original_check(self)

    monkeypatch.setattr(storage.Lease, "check", stolen)
    monkeypatch.setattr(storage, "mark_complete", steal_then_mark)
    with pytest.raises(storage.LeaseLostError, match="taken over"):
        encode_corpus(corpus, out)
    assert not versions.VersionedStore(str(out)).is_versioned()  # nothing visible
    monkeypatch.setattr(storage, "mark_complete", real)


# -- 3, 4. deletion -------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--out", "--model"])
def test_overwrite_never_deletes_what_slem_dask_did_not_write(corpus, client, capsys, flag):
    """Item 3: a folder of documents or an unrelated zarr array given as --out / --model."""
    docs = corpus["dir"] / "documents"
    docs.mkdir()
    (docs / "thesis.txt").write_text("years of work")
    foreign = corpus["dir"] / "foreign.zarr"
    zarr_rows(foreign, np.ones((3, D), dtype="float32"))
    for target in (docs, foreign):
        for extra in ([], ["--overwrite"]):
            if flag == "--out":
                args = encode_command(corpus, target)
            else:
                args = ["fit", "--negatives", corpus["negatives"], "--model", target]
            code, _, err = _cli(capsys, client, *args, *extra)
            assert code == 1, err
            assert "pass --overwrite" not in err  # never suggests deleting it
            assert "not written by slem-dask" in err or "not a zarr array" in err
    assert (docs / "thesis.txt").read_text() == "years of work"
    np.testing.assert_array_equal(storage.open_node(str(foreign))[...], 1)


def test_spec_steps_are_checked_against_each_other_before_anything_runs(corpus, client, capsys):
    """Item 4: an encode output that is another step's input, or a model path that contains
    one, is refused before any step runs, with or without --overwrite."""
    d = corpus["dir"]
    cases = {
        "out_is_negatives": (f"{d}/m.zarr", corpus["negatives"]),
        "model_contains_positives": (f"{d}", f"{d}/enc.zarr"),
    }
    for name, (model, out) in cases.items():
        spec = d / f"{name}.toml"
        spec.write_text(
            f'[model]\npath = "{model}"\n[fit]\nnegatives = "{corpus["negatives"]}"'
            f'\n[[encode]]\npositives = "{corpus["positives"]}"\nout = "{out}"\n'
        )
        for extra in ([], ["--overwrite"]):
            code, out_text, err = _cli(capsys, client, "run", spec, *extra)
            assert code == 1 and "destroy the input" in err, (name, err)
            assert "dask:" not in out_text  # refused before the cluster was used
    assert not (d / "m.zarr").exists()
    np.testing.assert_array_equal(
        zarr.open_array(corpus["negatives"], mode="r+")[...], corpus["neg"]
    )


def test_overlap_refusal_suggests_a_path_outside_every_input(corpus):
    """Item 9: the suggested path must not sit inside the input itself."""
    inner = corpus["dir"] / "pos.zarr" / "inner"
    with pytest.raises(ValueError, match="is inside the positives") as info:
        encode_corpus(corpus, inner)
    suggested = str(info.value).rsplit("e.g. ", 1)[1]
    assert (
        storage.backends.paths._relation(canonical(suggested), canonical(corpus["positives"]))
        is None
    )


# -- 5. --overwrite --update refits ---------------------------------------------------
def test_fit_overwrite_update_refits_from_scratch(corpus):
    """Item 5: with --overwrite, --update must not keep (or merge into) the old model."""
    changed = corpus["neg"] * 2 + 1
    model = str(corpus["dir"] / "m.zarr")
    pipeline.fit_job(None, corpus["negatives"], model, lam=0.1)
    zarr.open_array(corpus["negatives"], mode="r+")[...] = changed
    report = pipeline.fit_job(
        None, corpus["negatives"], model, lam=0.1, overwrite=True, update=True
    )
    assert report.facts["action"] == "fit"
    np.testing.assert_allclose(
        load_model(model).covariance_, LinearSLEM(lam=0.1).fit(changed).covariance_, rtol=1e-5
    )


# -- 7. inputs changed in place --------------------------------------------------------
def test_positives_rewritten_in_place_are_encoded_again(corpus):
    """Item 7: a complete output of positives rewritten since is not "up to date"."""
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    pos = corpus["pos"].copy()
    pos[90:100] += 3  # rows of partition 2
    zarr.open_array(corpus["positives"], mode="r+")[80:120] = pos[80:120]
    report = encode_corpus(corpus, out)
    assert report.facts["action"] == "update"
    assert report.facts["partitions"] == "1 encoded of 5"
    np.testing.assert_array_equal(storage.read_all(out), _expected(corpus, pos))


def test_positives_replaced_by_a_longer_array_are_not_an_append(corpus):
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    longer = np.random.default_rng(9).standard_normal((260, D)).astype("float32")
    zarr_rows(corpus["positives"], longer)
    report = encode_corpus(corpus, out)
    assert report.facts["partitions"] == "7 encoded of 7"
    np.testing.assert_array_equal(storage.read_all(out), _expected(corpus, longer))


@pytest.mark.parametrize("change", ["rewrite", "truncate_and_append"])
def test_fit_update_refuses_when_merged_rows_changed(corpus, change):
    """Item 7: --update must not merge statistics of rows it already merged."""
    model = str(corpus["dir"] / "m.zarr")
    arr = zarr.open_array(corpus["negatives"], mode="r+")
    arr.resize((300, D))  # fit on the first 300 rows ...
    arr[...] = corpus["neg"][:300]
    pipeline.fit_job(None, corpus["negatives"], model, lam=0.1)
    if change == "rewrite":
        arr[0:40] = corpus["neg"][0:40] + 1
        arr.resize((400, D))
        arr[300:] = corpus["neg"][300:]
    else:
        arr.resize((200, D))
        arr.resize((400, D))
        arr[200:] = corpus["neg"][200:] * 3
    with pytest.raises(ValueError, match="changed since .* refit with --overwrite"):
        pipeline.fit_job(None, corpus["negatives"], model, lam=0.1, update=True)
    # appending only (no old row touched) merges, equal to a fit from scratch
    zarr_rows(corpus["negatives"], corpus["neg"][:300])
    pipeline.fit_job(None, corpus["negatives"], model, lam=0.1, overwrite=True)
    arr = zarr.open_array(corpus["negatives"], mode="r+")
    arr.resize((400, D))
    arr[300:] = corpus["neg"][300:]
    assert (
        pipeline.fit_job(None, corpus["negatives"], model, lam=0.1, update=True).facts["action"]
        == "update"
    )
    np.testing.assert_allclose(
        load_model(model).covariance_, LinearSLEM(lam=0.1).fit(corpus["neg"]).covariance_, rtol=1e-5
    )


def test_fit_update_of_a_moved_store_or_other_width_says_which(corpus, tmp_path):
    # a copied store held the same rows: "not a prefix" blamed them, not the path
    import shutil

    model = str(corpus["dir"] / "m.zarr")
    pipeline.fit_job(None, corpus["negatives"], model, lam=0.1)
    moved = str(tmp_path / "moved.zarr")
    shutil.copytree(corpus["negatives"], moved)
    with pytest.raises(
        ValueError,
        match=r"fitted on \d+ rows of '.*neg.zarr', not of "
        r"'.*moved.zarr': an update appends .*moved or copied "
        r"elsewhere counts as another one\); fit from scratch "
        r"with --overwrite",
    ):
        pipeline.fit_job(None, moved, model, lam=0.1, update=True)
    zarr_rows(corpus["negatives"], corpus["neg"][:, : D - 1])
    with pytest.raises(ValueError, match=rf"with {D} features; that store now has {D - 1} "):
        pipeline.fit_job(None, corpus["negatives"], model, lam=0.1, update=True)


def test_fit_update_of_a_model_saved_by_the_library_says_it_read_no_store(corpus):
    # it said "was fitted on 300 rows of None"
    model = str(corpus["dir"] / "m.zarr")
    LinearSLEM(lam=0.1).fit(corpus["neg"][:300]).save(model)
    with pytest.raises(ValueError) as refused:
        pipeline.fit_job(None, corpus["negatives"], model, lam=0.1, update=True)
    assert str(refused.value) == (
        f"--update: the model {model!r} was fitted on 300 rows given in memory (saved by "
        f"the library, e.g. LinearSLEM().fit(X).save(...)), not read from a store: an "
        f"update appends the rows added to the store a fit read; fit from scratch with "
        f"--overwrite"
    )


def test_cli_update_refusals_come_before_any_cluster_starts(corpus, capsys):
    from slem_dask.cli.main import main

    model = str(corpus["dir"] / "m.zarr")
    pipeline.fit_job(None, corpus["negatives"], model, lam=0.1)
    zarr_rows(corpus["negatives"], corpus["neg"][:, : D - 1])
    code = main(
        [
            "fit",
            "--negatives",
            corpus["negatives"],
            "--model",
            model,
            "--lam",
            "0.1",
            "--update",
            "--local-cluster",
            "threads",
            "--no-progress",
        ]
    )
    out, err = capsys.readouterr()
    assert code != 0 and f"that store now has {D - 1}" in err, err
    assert "fit from scratch with --overwrite" in err and "file://" not in err, err
    assert "dask:" not in out, out  # the line a started cluster prints first


def test_fit_update_names_bad_appended_rows_by_their_row_in_the_store(corpus):
    model = str(corpus["dir"] / "m.zarr")
    zarr_rows(corpus["negatives"], corpus["neg"][:300])
    pipeline.fit_job(None, corpus["negatives"], model, lam=0.1)
    arr = zarr.open_array(corpus["negatives"], mode="r+")
    arr.resize((400, D))
    rows = corpus["neg"][300:].copy()
    rows[[17, 60]] = np.nan
    arr[300:] = rows
    with pytest.raises(ValueError, match=r"2 row\(s\) with NaN or inf \(rows 317, 360\)"):
        pipeline.fit_job(None, corpus["negatives"], model, lam=0.1, update=True)


# -- 8. model metadata ------------------------------------------------------------------
def test_model_n_samples_edited_by_hand_is_refused(corpus, client, capsys):
    group = storage.open_node(corpus["model"], mode="r+")
    meta = dict(group.attrs[storage.ATTR])
    group.attrs[storage.ATTR] = {**meta, "n_samples": 10}
    code, _, err = _cli(
        capsys,
        client,
        "fit",
        "--negatives",
        corpus["negatives"],
        "--model",
        corpus["model"],
        "--update",
    )
    assert code == 1 and "does not match its commit record" in err


# -- 9. corruption ----------------------------------------------------------------------
def test_deleted_output_chunk_is_not_up_to_date(corpus, client, capsys):
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    os.remove(_chunk(out, 1))
    code, text, _ = _verify(capsys, out)
    assert code == 1 and "c/1/0" in text and "missing" in text
    assert "  fix: run the same `slem-dask encode` again" in text
    report = encode_corpus(corpus, out)
    assert report.facts["partitions"] == "1 encoded of 5"
    np.testing.assert_array_equal(storage.read_all(out), _expected(corpus))
    assert _verify(capsys, out)[0] == 0


def test_flipped_byte_in_an_output_chunk_fails_every_read_naming_the_chunk(corpus, client, capsys):
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    chunk = _chunk(out, 2)
    data = bytearray(chunk.read_bytes())
    data[17] ^= 0x40
    chunk.write_bytes(bytes(data))
    with pytest.raises(storage.CorruptChunkError, match=r"chunk 'c/2/0' \(rows 80-119\)"):
        storage.read_all(out)
    code, text, _ = _verify(capsys, out)
    assert code == 1 and "c/2/0" in text and "corrupt" in text
    assert "  fix: run the same `slem-dask encode` with --overwrite" in text  # the repair
    # reading it as an input of another job names it too
    code, _, err = _cli(capsys, client, *_search_args(out, out, corpus["dir"] / "s.zarr"))
    assert code == 1 and "c/2/0" in err and "crc32c" in err
    assert not (corpus["dir"] / "s.zarr").exists()
    # and the repair verify names does repair it: a re-run trusts each chunk's trailer
    # (it reads 4 bytes of each, not the whole output), so every partition is encoded again
    assert encode_corpus(corpus, out, overwrite=True).facts["partitions"] == "5 encoded of 5"
    np.testing.assert_array_equal(storage.read_all(out), _expected(corpus))
    assert _verify(capsys, out)[0] == 0


def test_a_damaged_output_written_in_place_by_slem_dask_0_2_is_fixed_with_overwrite(
    corpus, client, capsys
):
    """An output of slem-dask 0.2 (the array at the path, no versions): verify's fix is
    --overwrite, which a re-run needs for it, and names no version to roll back to."""
    import shutil

    out, legacy = corpus["dir"] / "out.zarr", corpus["dir"] / "legacy.zarr"
    encode_corpus(corpus, out)
    shutil.copytree(head(out), legacy)  # the layout 0.2 wrote in place
    os.remove(_chunk(legacy, 1))
    code, text, _ = _verify(capsys, legacy)
    assert code == 1 and "c/1/0" in text and "missing" in text, text
    assert "  fix: run the same `slem-dask encode` with --overwrite: it writes it again" in text
    assert "roll back" not in text
    with pytest.raises(FileExistsError, match="pass --overwrite"):
        encode_corpus(corpus, legacy)
    encode_corpus(corpus, legacy, overwrite=True)
    assert _verify(capsys, legacy)[0] == 0


def test_verify_of_a_damaged_version_folder_says_the_fix_of_its_store(corpus, client, capsys):
    """A version folder given to verify: its current version's fix names the store
    (the encode writes the store, not the folder); an older version is not the one to
    repair: nothing reads it, and a rollback to it is refused."""
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    first = head(out)
    encode_corpus(corpus, out, overwrite=True)  # version 2, a copy of version 1
    current = head(out)
    for folder in (first, current):
        os.remove(folder / "c" / "1" / "0")
    code, text, _ = _verify(capsys, first)
    assert code == 1 and "c/1/0" in text, text
    assert (
        f"  fix: this is version 1 of {str(out)!r}, not its current version 2: readers of "
        f"the store do not read it, and a rollback to it is refused" in text
    ), text
    code, text, _ = _verify(capsys, current)
    assert code == 1 and "c/1/0" in text, text
    assert "  fix: run the same `slem-dask encode` again: it encodes those partitions" in text
    assert f"`slem-dask versions {out}`" in text and str(current) not in text.split("fix:")[1]


def test_truncated_input_chunk_is_named(corpus):
    chunk = _chunk(corpus["positives"], 3)
    chunk.write_bytes(chunk.read_bytes()[:-9])
    with pytest.raises(storage.CorruptChunkError, match=r"c/3/0.*rows 120-159"):
        encode_corpus(corpus, corpus["dir"] / "out.zarr")


def test_corrupt_model_chunk_gives_one_clear_line(corpus, client, capsys):
    chunk = head(corpus["model"]) / "precision" / "c" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[40] ^= 1
    chunk.write_bytes(bytes(data))
    code, _, err = _cli(capsys, client, *encode_command(corpus, corpus["dir"] / "o.zarr"))
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "'precision'" in err and "crc32c" in err
    code, text, _ = _verify(capsys, corpus["model"])
    assert code == 1


def _damage_document(path, how):
    doc = Path(path, "zarr.json")
    text = doc.read_text()
    # truncated JSON, or valid JSON that zarr cannot read
    assert '"zarr_format": 3' in text
    doc.write_text(
        text[: len(text) // 2]
        if how == "truncated"
        else text.replace('"zarr_format": 3', '"zarr_format": 4')
    )


@pytest.mark.parametrize("how", ["truncated", "unknown-format"])
def test_damaged_metadata_documents_are_named_by_every_reader(corpus, client, capsys, how):
    """A zarr.json that zarr cannot read, in a model's member array, in the model
    group itself, or in an output: verify, encode and search name the document and
    say the store is damaged (not a raw zarr error or a crash); --overwrite keeps it."""
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    _damage_document(head(corpus["model"]) / "precision", how)
    code, text, _ = _verify(capsys, corpus["model"])
    assert code == 1 and "'precision/zarr.json'" in text and "damaged" in text, text
    code, _, err = _cli(capsys, client, *encode_command(corpus, corpus["dir"] / "o.zarr"))
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "'precision/zarr.json'" in err and "damaged" in err
    with pytest.raises(storage.DamagedMetadataError, match="precision/zarr.json"):
        load_model(corpus["model"])

    _damage_document(head(out), how)
    code, text, _ = _verify(capsys, out)
    assert code == 1 and "zarr.json" in text and "damaged" in text, text
    code, _, err = _cli(capsys, client, *_search_args(out, out, corpus["dir"] / "s.zarr"))
    assert code == 1 and "queries" in err and "'zarr.json'" in err and "damaged" in err, err

    _damage_document(head(corpus["model"]), how)
    code, text, _ = _verify(capsys, corpus["model"])
    assert code == 1 and "zarr.json" in text, text
    with pytest.raises(versions.DamagedCommitError, match="'zarr.json'.*commit record"):
        load_model(corpus["model"])
    # its commit records say slem-dask wrote it: a new version may replace it
    storage.check_may_replace(corpus["model"], "--model", kind="model")
    LinearSLEM(lam=0.3).fit(corpus["neg"]).save(corpus["model"], overwrite=True)
    assert load_model(corpus["model"]).lam == 0.3


def test_verify_passes_on_good_stores_and_fails_on_foreign_ones(corpus, client, capsys):
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    code, text, _ = _cli(capsys, client, *_search_args(out, out, corpus["dir"] / "s.zarr"))
    assert code == 0, text
    for path in (out, corpus["model"], corpus["dir"] / "s.zarr"):
        code, text, _ = _verify(capsys, path)
        assert code == 0 and text.strip().endswith("ok"), text
    code, text, _ = _verify(capsys, corpus["positives"], corpus["dir"] / "nope")
    assert code == 1 and "not written by slem-dask" in text and "no store" in text


def test_tls_options_with_a_tcp_address_or_without_a_scheduler_are_refused(corpus, capsys):
    pem = corpus["dir"] / "x.pem"
    pem.write_text("")
    tls = ["--tls-ca-file", pem, "--tls-cert", pem, "--tls-key", pem]
    args = encode_command(corpus, corpus["dir"] / "o.zarr", *tls)
    assert main([*map(str, args), "--scheduler", "tcp://127.0.0.1:1"]) == 1
    assert "not a TLS address" in capsys.readouterr().err
    assert main([*map(str, args)]) == 1
    assert "--scheduler tls://" in capsys.readouterr().err


# -- 10. one array, many spellings --------------------------------------------------------
def test_the_same_array_spelled_differently_is_the_same_store(corpus, monkeypatch):
    monkeypatch.chdir(corpus["dir"])
    os.mkdir("sub")
    encode_corpus(corpus, "out.zarr")
    for positives, out in (
        ("./pos.zarr", "out.zarr/"),
        ("sub/../pos.zarr", "./out.zarr"),
        (corpus["positives"], str(corpus["dir"] / "out.zarr")),
        (f"file://{corpus['positives']}", "sub/../out.zarr"),
    ):
        report = pipeline.encode_job(None, corpus["model"], positives, out)
        assert report.facts["action"] == "up to date", (positives, out)
    kernel = KernelSLEM(kernel="rbf", gamma=0.5, rank=20)
    args = dict(kernel="rbf", gamma=0.5, rank=20)
    pipeline.fit_job(None, "pos.zarr", "k.zarr", **args)
    for spelling in ("./pos.zarr", "sub/../pos.zarr/", corpus["positives"]):
        report = pipeline.fit_job(None, spelling, "./k.zarr/", update=True, **args)
        assert report.facts["action"] == "up to date", spelling
    del kernel


def test_canonical_forms():
    here = os.getcwd()
    assert canonical("x").url == f"file://{here}/x"
    assert canonical("a/../x/").url == canonical(f"file://{here}/x").url
    assert canonical("s3://bucket/a/../b/").url == "s3://bucket/b"


# -- disk full ---------------------------------------------------------------------------
def test_disk_full_keeps_finished_partitions_and_resumes(corpus, monkeypatch):
    """A store that fails writes part-way (ENOSPC): one clear error, the finished
    partitions kept (complete: false), and the re-run after freeing space finishes."""
    from zarr.storage import LocalStore

    real = LocalStore.set
    writes = {"n": 0}

    async def full(self, key, value):
        if "/c/" in f"/{key}":
            writes["n"] += 1
            if writes["n"] > 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return await real(self, key, value)

    real_writev = os.writev

    def full_writev(fd, parts):  # whole local chunks are written by slem-dask's writev
        writes["n"] += 1
        if writes["n"] > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_writev(fd, parts)

    monkeypatch.setattr(LocalStore, "set", full)
    monkeypatch.setattr(os, "writev", full_writev)
    out = corpus["dir"] / "out.zarr"
    with pytest.raises(pipeline.JobFailed, match="no space left.*kept"):
        pipeline.encode_job(None, corpus["model"], corpus["positives"], str(out), partition_rows=40)
    monkeypatch.undo()
    assert not versions.VersionedStore(str(out)).is_versioned()  # nothing visible
    kept = len([p for p in Path(out, "versions").rglob("c/*/*") if p.is_file()])
    assert kept >= 2
    report = encode_corpus(corpus, out)
    assert report.facts["action"] == "resume"
    np.testing.assert_array_equal(storage.read_all(out), _expected(corpus))


# -- issue 10 items that touch storage and the jobs ------------------------------------
def test_file_urls_work_for_every_input_and_output(corpus, client, capsys):
    d = corpus["dir"]
    code, _, err = _cli(
        capsys,
        client,
        "encode",
        "--model",
        f"file://{corpus['model']}",
        "--positives",
        f"file://{corpus['positives']}",
        "--out",
        f"file://{d}/url.zarr",
    )
    assert code == 0, err
    np.testing.assert_array_equal(
        storage.read_all(d / "url.zarr"), _expected(corpus, like=d / "url.zarr")
    )
    url = f"file://{d}/url.zarr"
    code, _, err = _cli(
        capsys, client, *_search_args(url, f"{d}/url.zarr", f"file://{d}/search.zarr", k=2)
    )
    assert code == 0, err
    assert _verify(capsys, d / "search.zarr")[0] == 0


def test_memory_urls_are_refused_by_the_command_line_and_separate_workers(corpus, client, capsys):
    code, _, err = _cli(capsys, client, *encode_command(corpus, "memory://x.zarr"))
    assert code == 1 and "memory://" in err and "vanish" in err
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        with pytest.raises(storage.StorageViewError, match="memory:// store"):
            pipeline.encode_job(c, corpus["model"], corpus["positives"], "memory://x.zarr")
    # in one process (the threaded scheduler) it is a fine scratch store
    report = pipeline.encode_job(None, corpus["model"], corpus["positives"], "memory://y.zarr")
    assert report.facts["action"] == "create"
    np.testing.assert_array_equal(
        storage.read_all("memory://y.zarr"), _expected(corpus, like="memory://y.zarr")
    )


def test_search_refuses_encodings_of_different_models_unless_forced(corpus, client, capsys):
    d = corpus["dir"]
    encode_corpus(corpus, d / "q.zarr")
    other = str(d / "other_model.zarr")
    LinearSLEM(lam=1.0).fit(corpus["neg"]).save(other)
    pipeline.encode_job(None, other, corpus["positives"], str(d / "db.zarr"))
    args = _search_args(d / "q.zarr", d / "db.zarr", d / "s.zarr")
    code, _, err = _cli(capsys, client, *args)
    assert code == 1 and "different models" in err and "--force" in err
    assert _cli(capsys, client, *args, "--force")[0] == 0


def test_run_prints_each_step_as_it_finishes_and_update_false_reruns(corpus, client, capsys):
    d = corpus["dir"]
    spec = d / "spec.toml"
    spec.write_text(
        f'[model]\npath = "{d}/m.zarr"\n[fit]\nnegatives = "{corpus["negatives"]}"'
        f'\nupdate = false\n[[encode]]\npositives = "{corpus["positives"]}"\n'
        f'out = "{d}/e.zarr"\n[[encode]]\npositives = "{d}/missing.zarr"\n'
        f'out = "{d}/e2.zarr"\n'
    )
    zarr_rows(d / "missing.zarr", corpus["pos"])
    code, out, err = _cli(capsys, client, "run", spec)
    assert code == 0, err
    os.remove(_chunk(d / "missing.zarr", 1))  # the second encode step now fails
    code, out, err = _cli(capsys, client, "run", spec)
    assert code == 1 and "c/1/0" in err
    assert "fit:" in out and "encode:" in out  # the steps before it were reported
    assert "action             fit" in out  # update = false: refitted, not refused


def test_rerun_keeps_the_outputs_dtype_and_refuses_other_partition_rows(corpus, client, capsys):
    d = corpus["dir"]
    base = encode_command(corpus, d / "o.zarr")
    assert _cli(capsys, client, *base, "--dtype", "float64", "--partition-rows", "40")[0] == 0
    code, out, err = _cli(capsys, client, *base)
    assert code == 0 and "up to date" in out, err
    assert storage.open_node(str(d / "o.zarr")).dtype == np.float64
    code, _, err = _cli(capsys, client, *base, "--partition-rows", "80")
    assert code == 1 and "partitions of 40 rows" in err


def test_a_dead_writers_draft_is_removed_by_the_next_commit(corpus):
    store = versions.VersionedStore(corpus["model"])
    stale = Path(store.location(store.begin().version))  # a draft for the next version
    stale.mkdir(parents=True)
    (stale / "zarr.json").write_text("{}")
    LinearSLEM(lam=0.2).fit(corpus["neg"]).save(corpus["model"], overwrite=True)
    assert not stale.exists()
    assert load_model(corpus["model"]).lam == 0.2


# -- from the fresh-clone review -------------------------------------------------------
def test_a_symlink_to_an_output_shares_its_lease_and_record(corpus):
    out = corpus["dir"] / "real.zarr"
    encode_corpus(corpus, out)
    link = corpus["dir"] / "link.zarr"
    link.symlink_to(out)
    assert canonical(link) == canonical(out)
    with storage.Lease(out, "another job"):
        with pytest.raises(storage.LeaseHeldError, match="another slem-dask job"):
            encode_corpus(corpus, link, overwrite=True)
    assert encode_corpus(corpus, link).facts["action"] == "up to date"
    assert link.is_symlink()


def test_listing_fingerprints_of_url_stores_are_stable_across_processes(tmp_path):
    """fsspec stores (s3://, memory://): the fingerprint of unchanged chunks must not
    depend on the process (no salted hash())."""
    import subprocess
    import sys

    code = (
        "import zarr, numpy as np\n"
        "from slem_dask import storage\n"
        "a = zarr.create_array(store='memory://fp.zarr', shape=(10, 2), dtype='f4',"
        " chunks=(4, 2))\n"
        "a[...] = 1\n"
        "info = storage.nodes.fingerprints._listing(a, storage.canonical('memory://fp.zarr'))\n"
        "print(sorted((k, v[0]) for k, v in info.items()), "
        "type(list(info.values())[0][1]).__name__)\n"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(runs) == 1 and "str" in runs.pop()


def test_overwrite_replaces_only_a_store_of_the_same_kind(corpus, client, capsys):
    out = corpus["dir"] / "enc.zarr"
    encode_corpus(corpus, out)
    other_model = str(corpus["dir"] / "other_model.zarr")
    LinearSLEM().fit(corpus["neg"]).save(other_model)
    code, _, err = _cli(capsys, client, *encode_command(corpus, other_model, "--overwrite"))
    assert code == 1 and "holds a model of slem-dask, not an encoded output" in err
    code, _, err = _cli(
        capsys, client, "fit", "--negatives", corpus["negatives"], "--model", out, "--overwrite"
    )
    assert code == 1 and "holds an encoded output of slem-dask, not a model" in err
    assert load_model(other_model).n_features_in_ == D
    assert storage.output_meta(storage.open_node(str(out)))["complete"] is True


def test_overlap_suggestions_are_next_to_the_input(corpus):
    pos = canonical(corpus["positives"])
    for target in (pos.child("sub"), pos):
        with pytest.raises(ValueError) as info:
            storage.check_outside_inputs(target, "--out", {"positives": pos})
        suggested = str(info.value).rsplit("e.g. ", 1)[1]
        assert suggested == str(corpus["dir"] / "pos-slem.zarr"), suggested
    with pytest.raises(ValueError, match="two steps cannot write one store"):
        storage.check_outside_inputs(
            corpus["dir"] / "a.zarr",
            "encode[0].out",
            {},
            {"encode[1].out": corpus["dir"] / "a.zarr"},
        )


def test_empty_spec_is_refused(tmp_path):
    from slem_dask.pipeline.jobspec import SpecError, parse_spec

    with pytest.raises(SpecError, match="would do nothing"):
        parse_spec({"model": {"path": str(tmp_path / "m")}})


def test_kernel_encode_warns_on_positives_of_another_scale(corpus):
    model = str(corpus["dir"] / "k.zarr")
    pipeline.fit_job(None, corpus["negatives"], model, kernel="rbf", gamma=0.5, rank=20)
    zarr_rows(corpus["dir"] / "big.zarr", corpus["pos"] * 100)
    with pytest.warns(UserWarning, match="normalize both the same way"):
        report = pipeline.encode_job(
            None, model, str(corpus["dir"] / "big.zarr"), str(corpus["dir"] / "kb.zarr")
        )
    assert "median norm" in report.facts["warning"]


def test_an_output_of_other_positives_is_refused_for_that_reason_only(corpus):
    """Another, shorter source: the output encodes other rows; it did not shrink."""
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    zarr_rows(corpus["dir"] / "short.zarr", corpus["pos"][:50])
    with pytest.raises(FileExistsError) as info:
        pipeline.encode_job(None, corpus["model"], str(corpus["dir"] / "short.zarr"), str(out))
    assert "is complete, and is not what this run writes: it encodes" in str(info.value)
    assert f"not {str(corpus['dir'] / 'short.zarr')!r}" in str(info.value)  # as given
    assert "shrank" not in str(info.value) and "file://" not in str(info.value)
