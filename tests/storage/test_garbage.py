"""Garbage under a versioned store stays bounded whatever runs were killed (storage.gc);
an up-to-date re-run writes nothing on any backend; a fenced job says so and never grows
its deleted draft again."""

import os
import uuid
from pathlib import Path

import numpy as np
import pytest
import zarr

from slem_dask import pipeline, storage
from slem_dask.storage.versioning import leases
from slem_dask.storage.versioning import markers
from slem_dask.storage.versioning import versions

from helpers import ROOT, TESTS, encode_corpus


def _killed_encode(corpus, out, monkeypatch, positives=None, **kw):
    """An encode killed after its workers wrote, before its commit (its draft stays)."""

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(storage, "mark_complete", killed)
        with pytest.raises(KeyboardInterrupt):
            encode_corpus(corpus, out, positives, **kw)


def _names(listing) -> list[str]:
    """The version folders of a listing of ``versions/`` (not the markers beside them)."""
    return sorted(n for n in listing if not n.endswith(versions.MARKER))


def _folders(out) -> list[str]:
    return _names(os.listdir(Path(out) / "versions"))


class Counting:
    """A backend that counts every call that changes storage."""

    WRITES = ("create", "put", "delete", "remove_tree", "copy_tree", "prune_empty")

    def __init__(self, inner, log):
        self._inner, self._log = inner, log

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name in self.WRITES:

            def counted(*args, **kwargs):
                self._log.append((name, self._inner.root, args[:1]))
                return attr(*args, **kwargs)

            return counted
        return attr


@pytest.fixture
def writes(monkeypatch):
    """Every storage-changing call made through a Backend (commits, leases, drafts)."""
    log = []
    for module in (versions, leases):
        real = module.backend_for
        monkeypatch.setattr(module, "backend_for", lambda url, real=real: Counting(real(url), log))
    return log


def _tree(root) -> dict:
    """Every file under ``root``: (size, mtime, inode)."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            st = os.stat(os.path.join(folder, name))
            found[os.path.join(folder, name)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return found


# -- item 2: garbage is bounded ----------------------------------------------------------
def test_killed_runs_leave_at_most_one_draft_and_the_next_job_removes_it(corpus, monkeypatch):
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    committed = _folders(out)
    # the winner of seq 1 was killed between its commit and its clean-up: a dead draft
    dead = Path(out) / "versions" / f"00000001-{uuid.uuid4().hex[:12]}"
    dead.mkdir()
    (dead / "zarr.json").write_text("{}")
    marker = markers.marker_document(versions.VersionedStore(str(out)), dead.name)
    dead.with_name(dead.name + versions.MARKER).write_bytes(marker)  # begun by slem-dask
    for _ in range(4):  # four killed re-encodes (with other positives: they must write)
        _killed_encode(corpus, out, monkeypatch, corpus["others"], overwrite=True)
        left = [v for v in _folders(out) if v not in committed]
        assert len(left) == 1 and left[0].startswith("00000002-"), left
    report = encode_corpus(corpus, out, corpus["others"], overwrite=True)
    assert report.facts["action"] == "resume" and report.facts["version"] == 2
    assert _folders(out) == sorted(committed + [versions.VersionedStore(str(out)).head().version])
    # the drafts never committed (the dead one, four killed runs') keep their fate file,
    # "dead" and a few bytes, as proof against a late write regrowing their folder
    fates = Path(out) / "fates"
    assert len(os.listdir(fates)) == 5
    assert dead.name in os.listdir(fates) and not dead.exists()
    assert {(fates / f).read_text() for f in os.listdir(fates)} == {"dead"}
    assert storage.verify(str(out))[1] == []


def test_a_condemned_draft_is_never_committed_and_a_claimed_one_never_deleted(tmp_path):
    from slem_dask.storage.versioning import gc  # new in this change

    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    stalled, committing = store.begin(), store.begin()
    for draft in (stalled, committing):
        zarr.open_group(store=draft.location, mode="w").attrs["who"] = draft.version
    assert gc.claim(store.backend, committing.version, gc.COMMIT) == gc.COMMIT
    assert gc.claim(store.backend, committing.version, gc.COMMIT) == gc.COMMIT  # a retry
    removed = gc.collect(store, versions.KEEP_VERSIONS, leased=True)  # a job with the lease
    assert removed == [stalled.version] and not Path(stalled.location).exists()
    with pytest.raises(gc.DraftFencedError, match="this job was fenced"):
        store.commit(stalled, "model", "stalled job")
    zarr.open_group(store=stalled.location, mode="w")  # its late writes: still refused
    with pytest.raises(gc.DraftFencedError, match="this job was fenced"):
        store.commit(stalled, "model", "stalled job")
    store.commit(committing, "model", "committing job")
    assert storage.open_node(store.path).attrs["who"] == committing.version


def test_without_the_lease_only_drafts_of_committed_numbers_are_dead(tmp_path):
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    first, loser = store.begin(), store.begin()
    for draft in (first, loser):
        zarr.open_group(store=draft.location, mode="w")
    store.commit(first, "model", "one")
    running = store.begin()  # seq 2: may still commit
    zarr.open_group(store=running.location, mode="w")
    os.makedirs(Path(store.path.location) / "versions" / "notes")  # not slem-dask's
    assert not Path(loser.location).exists()  # dead once its number was taken
    Path(loser.location).mkdir(exist_ok=True)  # a late write of its fenced job's worker
    users = Path(store.path.location) / "versions" / f"00000001-{uuid.uuid4().hex[:12]}"
    users.mkdir()  # named like a draft, with neither marker nor fate file: not slem-dask's
    store.collect_garbage()  # rollback's: holds no lease
    # the late folder lost its marker with the draft, but the loser's fate file ("dead",
    # kept for good) proves it slem-dask's: deleted. A folder with neither is never
    # deleted (issue 30, item 5: it is not taken for a draft)
    assert (Path(store.path.location) / "fates" / loser.version).read_text() == "dead"
    assert _folders(store.path.location) == sorted(
        [first.version, running.version, users.name, "notes"]
    )
    assert store.commit(running, "model", "two").seq == 2


# -- item 3: an up-to-date re-run writes nothing --------------------------------------------
def test_an_up_to_date_encode_writes_nothing(corpus, writes):
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    before, writes[:] = _tree(corpus["dir"]), []
    report = encode_corpus(corpus, out)
    assert report.facts["action"] == "up to date"
    assert writes == [] and _tree(corpus["dir"]) == before


@pytest.mark.parametrize(
    "kernel", [{}, {"kernel": "rbf", "gamma": 0.2, "rank": 6}], ids=["linear", "kernel"]
)
def test_an_up_to_date_fit_update_writes_nothing(corpus, writes, kernel):
    model = str(corpus["dir"] / "fitted.zarr")
    pipeline.fit_job(None, corpus["negatives"], model, lam=0.1, **kernel)
    before, writes[:] = _tree(corpus["dir"]), []
    report = pipeline.fit_job(None, corpus["negatives"], model, lam=0.1, update=True, **kernel)
    assert report.facts["action"] == "up to date"
    assert writes == [] and _tree(corpus["dir"]) == before


def test_an_encode_whose_head_lost_a_chunk_is_not_up_to_date(corpus):
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    store = versions.VersionedStore(str(out))
    os.remove(Path(store.location(store.head().version)) / "c" / "1" / "0")
    report = encode_corpus(corpus, out)
    assert report.facts["partitions"] == "1 encoded of 5" and report.facts["version"] == 2
    assert storage.verify(str(out))[1] == []


# -- item 9: a fenced job --------------------------------------------------------------------
def _fenced_midway(corpus, out, monkeypatch, take_over):
    """Encode ``out`` with job A, whose lease was taken over (it does not notice: a
    stalled client); ``take_over`` (the job that took the store over) runs after A's
    workers wrote two partitions, and A's workers go on writing. Returns A's error."""
    import dask

    real_write, written = storage.write_partition, []

    def write(block, arr, index, block_info=None):
        if len(written) == 2:
            take_over(versions.VersionedStore(str(out)))
        written.append(index)
        return real_write(block, arr, index, block_info)

    monkeypatch.setattr(storage, "write_partition", write)
    monkeypatch.setattr(leases.Lease, "check", lambda self: None)  # A does not notice
    with dask.config.set(scheduler="synchronous"), pytest.raises(Exception) as err:
        encode_corpus(corpus, out)
    monkeypatch.undo()
    return err.value


def test_a_job_whose_draft_a_winner_deleted_says_who_and_never_regrows_it(corpus, monkeypatch):
    out = corpus["dir"] / "out.zarr"

    def commit_other(store):  # job B committed version 1, deleting A's dead draft
        draft = store.begin()
        zarr.open_group(store=draft.location, mode="w").attrs["who"] = "B"
        store.commit(draft, "encoding", "job B")

    error = _fenced_midway(corpus, out, monkeypatch, commit_other)
    assert "version 1 was committed by job B" in str(error), error
    assert _folders(out) == [versions.VersionedStore(str(out)).head().version]  # no regrowth


def test_a_job_whose_draft_was_condemned_says_it_was_fenced(corpus, monkeypatch):
    from slem_dask.storage.versioning import gc  # new in this change

    out = corpus["dir"] / "out.zarr"
    error = _fenced_midway(
        corpus,
        out,
        monkeypatch,
        lambda store: gc.collect(store, versions.KEEP_VERSIONS, leased=True),
    )  # by a job that then died
    assert isinstance(error, gc.DraftFencedError) and "this job was fenced" in str(error)
    assert "storage" not in str(error)
    assert _folders(out) == []  # nothing grew back
    assert encode_corpus(corpus, out).facts["version"] == 1  # the same command then completes


# -- the same on a real S3 server (SeaweedFS, tests/conftest.py) -------------------------
@pytest.fixture
def s3(s3_server):
    root = f"s3://{s3_server.bucket}/g-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(8)
    rows = {
        "neg": rng.standard_normal((300, 8)),
        "pos": rng.standard_normal((120, 8)),
        "other": rng.standard_normal((120, 8)),
    }
    for name, values in rows.items():
        arr = zarr.create_array(
            store=f"{root}/{name}.zarr",
            shape=values.shape,
            dtype="float32",
            chunks=(40, 8),
            config={"write_empty_chunks": True},
        )
        arr[...] = values.astype("float32")
    return root


@pytest.fixture
def s3_model(s3):
    pipeline.fit_job(None, f"{s3}/neg.zarr", f"{s3}/model.zarr", lam=0.1)
    return s3


def _objects(root) -> dict:
    """Every object under ``root``: its ETag and time of last change."""
    import s3fs

    fs = s3fs.S3FileSystem()
    return {
        key: (info.get("ETag"), str(info.get("LastModified")))
        for key, info in fs.find(root, detail=True).items()
    }


def test_an_up_to_date_encode_and_fit_write_nothing_on_s3(s3_model, writes):
    s3 = s3_model
    out = f"{s3}/out.zarr"
    pipeline.encode_job(None, f"{s3}/model.zarr", f"{s3}/pos.zarr", out, partition_rows=40)
    before, writes[:] = _objects(s3), []
    again = pipeline.encode_job(None, f"{s3}/model.zarr", f"{s3}/pos.zarr", out, partition_rows=40)
    fit = pipeline.fit_job(None, f"{s3}/neg.zarr", f"{s3}/model.zarr", lam=0.1, update=True)
    assert again.facts["action"] == fit.facts["action"] == "up to date"
    assert writes == [] and _objects(s3) == before


def test_killed_runs_on_s3_leave_at_most_one_draft(s3_model, monkeypatch):
    s3 = s3_model
    out = f"{s3}/out.zarr"
    store = versions.VersionedStore(out)

    def encode(positives, **kw):
        return pipeline.encode_job(
            None, f"{s3}/model.zarr", f"{s3}/{positives}.zarr", out, partition_rows=40, **kw
        )

    encode("pos")
    committed = _names(store.backend.list("versions"))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    left = set()
    for _ in range(3):
        with monkeypatch.context() as m:
            m.setattr(storage, "mark_complete", killed)
            with pytest.raises(KeyboardInterrupt):
                encode("other", overwrite=True)
        draft = set(_names(store.backend.list("versions"))) - set(committed)
        assert len(draft) == 1
        left |= draft
    assert encode("other", overwrite=True).facts["action"] == "resume"
    assert _names(store.backend.list("versions")) == sorted(committed + [store.head().version])
    # each killed run's draft keeps its fate file "dead" (a few bytes, proof against a
    # late write regrowing it); nothing else is left
    assert set(store.backend.list("fates")) == left
    assert {store.backend.read(f"fates/{v}") for v in left} == {b"dead"}
    assert storage.verify(out)[1] == []


# -- item 9: one line naming the store and the fix ---------------------------------------------
def _two_model_versions(path) -> None:
    from slem_dask import LinearSLEM

    X = np.random.default_rng(0).standard_normal((40, 4))
    for lam in (0.1, 0.2):
        LinearSLEM(lam=lam).fit(X).save(path, overwrite=True)


def _one_error_line(capsys, argv) -> str:
    from slem_dask.cli.main import main

    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_rollback_of_a_read_only_store_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    import errno

    from slem_dask.storage.backends.local import LocalBackend

    path = str(tmp_path / "m.zarr")
    _two_model_versions(path)

    def read_only(self, key, data):
        raise OSError(
            errno.EROFS, "Read-only file system", f"{self._path(key)}.{uuid.uuid4().hex}.tmp"
        )

    monkeypatch.setattr(LocalBackend, "_private_copy", read_only)
    err = _one_error_line(capsys, ["rollback", path, "--to", "1"])
    assert path in err and "read-only" in err and "nothing was changed" in err, err
    assert ".tmp" not in err and "Errno" not in err
    assert versions.VersionedStore(path).head().seq == 2


def _s3_error(code: str, status: int):
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    cause = ClientError(
        {
            "Error": {"Code": code, "Message": f"the server's words ({code})"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "PutObject",
    )
    try:
        raise translate_boto_error(cause) from cause
    except Exception as exc:  # noqa: BLE001 - as s3fs raises it
        return exc


@pytest.mark.parametrize(
    "code,status,advice",
    [
        ("RequestTimeTooSkewed", 403, "set the clock right"),
        ("SlowDown", 503, "run the same command again"),
        ("ServiceUnavailable", 503, "run the same command again"),
    ],
)
def test_a_skewed_clock_or_a_503_on_every_commit_is_one_line(
    s3, capsys, monkeypatch, code, status, advice
):
    from slem_dask.storage.backends.s3 import S3Backend

    path = f"{s3}/m.zarr"
    _two_model_versions(path)

    def refused(self, key, data):
        raise _s3_error(code, status)

    monkeypatch.setattr(S3Backend, "create", refused)
    err = _one_error_line(capsys, ["rollback", path, "--to", "1"])
    assert path in err and code in err and advice in err, err


def test_killed_streaming_kernel_fits_leave_one_draft(tmp_path, monkeypatch):
    import dask

    from slem_dask.parallel import kernel_stream as stream
    from slem_dask.pipeline import fit_job

    from helpers import zarr_rows

    X = np.random.default_rng(0).standard_normal((400, 8)).astype("float32")
    neg, path = zarr_rows(tmp_path / "neg.zarr", X, chunks=100), tmp_path / "m.zarr"
    args = {
        "kernel": "rbf",
        "gamma": 0.2,
        "rank": 12,
        "pivoting": "rpcholesky",
        "tol": 0.0,
        "seed": 3,
        "lam": 1e-2,
        "kernel_memory": "streaming",
        "partition_rows": 100,
    }
    original = stream._stream_block
    left: set = set()
    for kill_at in (3, 2):  # each run finishes 2 of the 4 final partitions left to it
        finals = []

        def task(*a, finals=finals, kill_at=kill_at, **k):
            if a[6]:  # final
                finals.append(a[5][-1])
                if len(finals) == kill_at:
                    raise RuntimeError("worker killed")
            return original(*a, **k)

        monkeypatch.setattr(stream, "_stream_block", task)
        with dask.config.set(scheduler="sync"), pytest.raises(RuntimeError, match="killed"):
            fit_job(None, neg, str(path), **args)
        assert len(_folders(path)) == 1  # the last killed run's draft
        left.update(_folders(path))
    monkeypatch.setattr(stream, "_stream_block", original)
    report = fit_job(None, neg, str(path), **args)
    assert report.facts["final pass"].startswith("resumed: 3 of 4 partitions reused")
    assert len(_folders(path)) == 1
    # the drafts never committed keep their fate file "dead" (proof against a late write
    # regrowing them), the killed runs' among them; none of their folders is left
    fates = os.listdir(path / "fates")
    assert left <= set(fates) and not set(fates) & set(_folders(path))
    assert {(path / "fates" / f).read_text() for f in fates} == {"dead"}


def _race_commit_and_condemnation(root: str, rounds: int) -> None:
    """The fate file decides: whichever of the two wins, the head never names a folder
    that was deleted, and a deleted draft is never committed."""
    import threading

    from slem_dask.storage.versioning import gc  # new in this change

    outcomes = set()
    for i in range(rounds):
        store = versions.VersionedStore(f"{root}/s{i}.zarr")
        draft = store.begin()
        zarr.open_group(store=draft.location, mode="w").attrs["i"] = i
        go, result = threading.Barrier(2), {}

        def commit(go=go, result=result, store=store, draft=draft):
            go.wait()
            try:
                result["commit"] = store.commit(draft, "model", "stalled job").seq
            except gc.DraftFencedError:
                result["commit"] = "fenced"

        def condemn(go=go, store=store):
            go.wait()
            gc.collect(store, versions.KEEP_VERSIONS, leased=True)

        threads = [threading.Thread(target=commit), threading.Thread(target=condemn)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        head = store.head()
        if result["commit"] == 1:
            assert head.version == draft.version and storage.open_node(store.path).attrs["i"] == i
        else:
            assert head is None and not store.exists(draft.version)
        outcomes.add(result["commit"])
    assert outcomes <= {1, "fenced"}


def test_a_commit_racing_a_condemnation_either_commits_whole_or_not_at_all(tmp_path):
    _race_commit_and_condemnation(str(tmp_path), 40)


def test_a_commit_racing_a_condemnation_on_s3(s3):
    _race_commit_and_condemnation(s3, 8)


@pytest.mark.slow
def test_sigkilled_encodes_on_s3_leave_one_draft(s3_model):
    """The issue's ten SIGKILLs (here three): each killed run's draft is deleted by the
    next run once it reused its partitions; the run that finishes leaves the kept versions
    alone, and readers saw the committed version throughout."""
    import signal
    import subprocess
    import sys

    s3 = s3_model
    out, model = f"{s3}/out.zarr", f"{s3}/model.zarr"
    store = versions.VersionedStore(out)
    pipeline.encode_job(None, model, f"{s3}/pos.zarr", out, partition_rows=40)
    committed = _names(store.backend.list("versions"))
    code = os.environ.get("PYTHONPATH") or str(ROOT)  # the slem_dask under test
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), code]),
        "SLOW_JOB_DELAY": "30",  # each partition: the run is killed long before its end
        "SLOW_JOB_OVERWRITE": "1",
        "SLOW_JOB_SAY_PRUNED": "1",
    }
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, str(TESTS / "_slow_job.py"), "encode", model, f"{s3}/other.zarr", out],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        said = set()
        for line in proc.stdout:  # killed once it writes its draft and has cleaned up
            said.add(line.strip())  # (not a time guessed for them: load delays both)
            if {"started", "pruned"} <= said:
                break
        assert {"started", "pruned"} <= said, (sorted(said), proc.stderr.read())
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert storage.head_seq(out) == 1
        assert len(set(_names(store.backend.list("versions"))) - set(committed)) <= 1
    report = pipeline.encode_job(
        None, model, f"{s3}/other.zarr", out, partition_rows=40, overwrite=True
    )
    assert report.facts["version"] == 2
    assert _names(store.backend.list("versions")) == sorted(committed + [store.head().version])
    assert storage.verify(out)[1] == []


# -- issue 38 item 7: fates/ and commits/ stay bounded over a long history -------------------
def test_fates_and_commits_stay_bounded_over_a_long_history_of_failed_drafts(tmp_path):
    """Each failed draft left a fate file for good: fates/ grew by one per draft that
    never committed, forever. Now a fate file goes once FATE_HORIZON newer numbers are
    committed, and commits/ holds one record per commit (and the head hint) whatever
    failed: both bounded however long the history."""
    from slem_dask.storage.versioning import gc

    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    root = Path(store.path.location)
    per_commit, rounds = 3, gc.FATE_HORIZON + 12
    bound = (gc.FATE_HORIZON + 1) * per_commit
    regrown = None
    for n in range(1, rounds + 1):
        for i in range(per_commit):  # failed drafts: one abandoned, the others killed
            draft = store.begin()
            zarr.open_group(store=draft.location, mode="w").attrs["try"] = i
            if i == 0:
                store.abandon(draft)
        draft = store.begin()  # a job that commits: condemns the killed ones first
        store.make_room(mine=draft.version)
        if regrown is not None:  # a late write regrew a condemned draft: still deleted
            assert not regrown.exists()
        zarr.open_group(store=draft.location, mode="w").attrs["n"] = n
        assert store.commit(draft, "model", f"job {n}").seq == n
        fates = os.listdir(root / gc.FATES)
        assert len(fates) <= bound, (n, len(fates))
        dead = [f for f in fates if (root / gc.FATES / f).read_text() == gc.DEAD]
        regrown = root / "versions" / dead[-1]
        (regrown / "c").mkdir(parents=True)  # a fenced job's chunk, landing late
        (regrown / "c" / "0").write_bytes(b"late")
        assert sorted(os.listdir(root / "commits")) == [
            ".head",
            *(f"{s:08d}.json" for s in range(1, n + 1)),
        ]
    assert rounds * per_commit > 2 * bound  # the history is longer than the bound
    assert len(os.listdir(root / gc.FATES)) <= bound
    assert store.head().seq == rounds
    kept = [c.version for c in store.commits()[-versions.KEEP_VERSIONS :]]
    assert _folders(root) == sorted(kept + [regrown.name])  # the last late write: next job's


def test_an_encode_refused_because_a_worker_cannot_see_a_store_leaves_no_draft(corpus, monkeypatch):
    """issue 40 item 4: an encode refused by the check that every worker sees its stores
    left its draft, and `verify` said "no version was committed (the job that wrote it
    stopped part-way): run the same command again"; a refusal leaves nothing that looks
    like an unfinished job."""

    def refused(client, stores):
        raise storage.StorageViewError(
            "worker tcp://10.0.0.9:40000 does not see the output as this client does"
        )

    out = corpus["dir"] / "out.zarr"
    with monkeypatch.context() as m:
        m.setattr(storage, "check_workers_see", refused)
        with pytest.raises(storage.StorageViewError, match="does not see"):
            encode_corpus(corpus, out)
    assert not out.exists()
    assert storage.verify(str(out))[0] == "missing"
    encode_corpus(corpus, out)  # an output that exists: its head is left as it is
    committed = _folders(out)
    with monkeypatch.context() as m:
        m.setattr(storage, "check_workers_see", refused)
        with pytest.raises(storage.StorageViewError, match="does not see"):
            encode_corpus(corpus, out, corpus["others"], overwrite=True)
    assert _folders(out) == committed
    assert storage.verify(str(out))[1] == []
