"""The commit protocol under ambiguous outcomes (issue 30, items 1, 4, 5, 8): idempotent
commits resolved by reading back, version folder names validated, slem-dask's marker
beside every draft, conditional writes probed. Local disk, and SeaweedFS / moto on
127.0.0.1 (tests/s3server.py) with a test-level fault in the S3 client."""

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import encode_corpus, expected_encoding, small_corpus
from reference import partitionwise

from slem_dask import LinearSLEM, load_model, pipeline, storage
from slem_dask.storage.backends import backend as backends
from slem_dask.storage.backends import local
from slem_dask.storage.versioning import versions
from slem_dask.storage.backends.backend import StorageConfigError
from slem_dask.storage.backends.registry import backend_for
from slem_dask.storage.backends.local import LocalBackend

D = 8
COMMIT_1 = "commits/00000001.json"


@pytest.fixture(autouse=True)
def unprobed(monkeypatch):
    """Every test probes its stores afresh (the probe is cached per process)."""
    monkeypatch.setattr(backends, "_PROBED", set())
    monkeypatch.delenv(backends.ACCEPT_NO_CONDITIONAL_WRITES, raising=False)


@pytest.fixture
def corpus(tmp_path):
    return small_corpus(tmp_path, seed=30)


def _draft_with(store, value):
    draft = store.begin()
    zarr.open_group(store=draft.location, mode="w").attrs["value"] = value
    return draft


# -- item 1: a lost reply never deletes a committed version -----------------------------
def _link_whose_reply_is_lost(monkeypatch, suffix):
    """``link(2)`` over NFS whose reply was lost: the retransmitted request answers
    EEXIST although the first one made the link (for names ending in ``suffix``)."""
    real = os.link

    def link(src, dst, *a, **k):
        real(src, dst, *a, **k)
        if str(dst).endswith(suffix):
            raise FileExistsError(17, "File exists", str(dst))

    monkeypatch.setattr(local.os, "link", link)


def test_local_create_after_a_lost_reply_is_true_and_false_for_other_bytes(tmp_path, monkeypatch):
    b = LocalBackend(str(tmp_path))
    _link_whose_reply_is_lost(monkeypatch, "k")
    assert b.create("k", b"mine") is True and b.read("k") == b"mine"
    assert b.create("k", b"mine") is True  # a retry of that call: the key holds its bytes
    assert b.create("k", b"theirs") is False and b.read("k") == b"mine"


def test_a_local_commit_whose_reply_was_lost_is_committed_and_kept(corpus, monkeypatch):
    out = corpus["dir"] / "out.zarr"
    _link_whose_reply_is_lost(monkeypatch, COMMIT_1)
    report = encode_corpus(corpus, out)
    assert report.facts["version"] == 1
    np.testing.assert_array_equal(storage.read_all(str(out)), expected_encoding(corpus))
    assert storage.verify(str(out))[1] == []


class _Flaky(LocalBackend):
    """A local backend whose create of a commit record is applied, then answers as the
    test says: an error (the reply lost), or False (a backend that does not read back)."""

    answer: object = None

    def create(self, key, data):
        created = super().create(key, data)
        if key.startswith("commits/") and created:
            if isinstance(_Flaky.answer, BaseException):
                raise _Flaky.answer
            return _Flaky.answer
        return created


@pytest.mark.parametrize("answer", [ConnectionResetError(104, "reset"), TimeoutError(), False])
def test_a_commit_whose_outcome_is_unknown_is_read_back(tmp_path, monkeypatch, answer):
    monkeypatch.setattr(_Flaky, "answer", answer)
    monkeypatch.setattr(versions, "backend_for", lambda url: _Flaky(url[len("file://") :]))
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    draft = _draft_with(store, 1.0)
    commit = store.commit(draft, "model", "job one")
    assert commit.seq == 1 and store.head() == commit and commit.token
    assert storage.open_node(store.path).attrs["value"] == 1.0
    # another job's record is not this job's: a conflict, read back the same way
    other = _draft_with(store, 2.0)
    other = versions.Draft(1, other.version, other.location)  # began from a stale head
    with pytest.raises(versions.CommitConflictError, match="version 1 was committed by job one"):
        store.commit(other, "model", "job two")


def test_a_clean_up_failing_with_botocores_own_error_does_not_fail_the_commit(tmp_path):
    """The record landed, then deleting the committed draft's fate file failed with an
    error of botocore's own (no OSError: s3fs passes a lost endpoint on as it is):
    readers see the job's version, so the job succeeds, and the next collection settles
    the fate file."""
    from botocore.exceptions import EndpointConnectionError

    from slem_dask.storage.versioning import gc

    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    real = store.backend.delete

    def delete(key):
        if key.startswith(f"{gc.FATES}/"):
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
        return real(key)

    store.backend.delete = delete
    draft = _draft_with(store, 1.0)
    commit = store.commit(draft, "model", "job")
    assert commit.seq == 1 and commit.version == draft.version and store.head() == commit
    assert storage.open_node(store.path).attrs["value"] == 1.0
    assert store.backend.list(gc.FATES) == [draft.version]  # left to the next collection
    store.backend.delete = real
    store.collect_garbage()
    assert store.backend.list(gc.FATES) == [] and store.head() == commit


def test_abandon_never_deletes_a_draft_that_its_commit_names(tmp_path):
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    draft = _draft_with(store, 1.0)
    store.commit(draft, "model", "job one")
    store.abandon(draft)  # e.g. after a commit that raised although it landed
    assert storage.open_node(store.path).attrs["value"] == 1.0
    store.check(store.head())  # the committed folder, whole


class _LostReplyClient:
    """The S3 client with a fault at the test level: a PUT of a key ending in ``suffix``
    is applied by the server, its reply is lost, and then either the resend's answer
    (412: the key exists) or the lost connection reaches the caller."""

    def __init__(self, client, suffix, how):
        self._client, self._suffix, self._how = client, suffix, how
        self.fired = 0

    def __getattr__(self, name):
        return getattr(self._client, name)

    async def put_object(self, **kwargs):
        if not kwargs["Key"].endswith(self._suffix) or self.fired:
            return await self._client.put_object(**kwargs)
        self.fired += 1
        await self._client.put_object(**kwargs)  # applied; the reply never arrives
        if self._how == "resent":
            return await self._client.put_object(**kwargs)  # 412, no RetryAttempts
        from botocore.exceptions import ConnectionClosedError

        raise ConnectionClosedError(endpoint_url="http://s3/lost-reply")


def _lose_replies(monkeypatch, fs, suffix, how):
    real = fs.get_s3
    wrapped = {}

    async def get_s3(*args, **kwargs):
        client = await real(*args, **kwargs)
        if id(client) not in wrapped:
            wrapped[id(client)] = _LostReplyClient(client, suffix, how)
        return wrapped[id(client)]

    monkeypatch.setattr(fs, "get_s3", get_s3)
    return wrapped


@pytest.mark.parametrize("how", ["resent", "dropped"])
@pytest.mark.parametrize("s3_server", ["seaweedfs", "moto"], indirect=True)
def test_s3_create_after_a_lost_reply_is_true_and_false_for_other_bytes(
    s3_server, monkeypatch, how
):
    b = backend_for(f"s3://{s3_server.bucket}/lost-{uuid.uuid4().hex[:8]}")
    wrapped = _lose_replies(monkeypatch, b.fs, "/k", how)
    assert b.create("k", b"mine") is True and b.read("k") == b"mine"
    assert sum(c.fired for c in wrapped.values()) == 1
    assert b.create("k", b"mine") is True  # a retry by a caller: its own bytes
    assert b.create("k", b"theirs") is False
    b.remove_tree("")


@pytest.mark.parametrize("how", ["resent", "dropped"])
def test_an_s3_encode_whose_commit_reply_was_lost_is_committed_and_kept(
    s3_server, tmp_path, monkeypatch, how
):
    """Item 1: the server applies the conditional PUT of commits/00000001.json, the
    reply is lost, the resend gets 412. The job used to call its own commit another
    job's and delete its draft: the committed version."""
    from slem_dask.storage.backends.s3 import S3Backend

    root = f"s3://{s3_server.bucket}/t-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(30)
    neg, pos = rng.standard_normal((300, D)), rng.standard_normal((200, D))
    LinearSLEM(lam=0.1).fit(neg).save(f"{root}/model.zarr")
    arr = zarr.create_array(
        store=f"{root}/pos.zarr", shape=pos.shape, dtype="float32", chunks=(40, D)
    )
    arr[...] = pos
    wrapped = _lose_replies(monkeypatch, S3Backend(f"{root}/out.zarr").fs, COMMIT_1, how)
    report = pipeline.encode_job(
        None, f"{root}/model.zarr", f"{root}/pos.zarr", f"{root}/out.zarr", partition_rows=40
    )
    assert sum(c.fired for c in wrapped.values()) == 1  # the fault happened
    assert report.facts["version"] == 1
    assert storage.verify(f"{root}/out.zarr")[1] == []
    model = load_model(f"{root}/model.zarr")
    np.testing.assert_array_equal(
        storage.read_all(f"{root}/out.zarr"),
        partitionwise(lambda p: model.transform(p, dtype="float32"), pos.astype("float32"), 40),
    )


# -- item 4: a commit record naming a folder outside its store ---------------------------
def _forge_record(store_path, version):
    """Point the head record of ``store_path`` at ``version`` with every checksum
    recomputed (the adversary of item 4)."""
    store = versions.VersionedStore(store_path)
    head = store.head()
    fields = {k: getattr(head, k) for k in head.__dataclass_fields__}
    target = Path(store.path.location) / "versions" / version / "zarr.json"
    fields.update(version=version, checksum=versions._checksum(target.read_bytes()))
    store.backend.put(f"commits/{head.seq:08d}.json", versions.Commit(**fields).to_json())


@pytest.mark.parametrize("name", ["../../B.zarr/versions/{b}", "{abs}", "00000001-notes"])
def test_a_record_naming_a_folder_outside_its_store_is_damaged(tmp_path, name):
    """Item 4: A's head record rewritten to name B's version (its checksums recomputed):
    verify said ok and readers of A got B's model."""
    a, b = str(tmp_path / "A.zarr"), str(tmp_path / "B.zarr")
    LinearSLEM(lam=0.1).fit(np.eye(D) + 1).save(a)
    LinearSLEM(lam=0.7).fit(np.eye(D) + 2).save(b)
    b_version = versions.VersionedStore(b).head().version
    b_doc = (Path(b) / "versions" / b_version / "zarr.json").read_bytes()
    version = name.format(b=b_version, abs=str(Path(b) / "versions" / b_version))
    if name == "00000001-notes":  # a folder inside A, but not a version's name
        (Path(a) / "versions" / version).mkdir()
        (Path(a) / "versions" / version / "zarr.json").write_bytes(b_doc)
    store = versions.VersionedStore(a)
    head = store.head()
    fields = {k: getattr(head, k) for k in head.__dataclass_fields__}
    fields.update(version=version, checksum=versions._checksum(b_doc))
    store.backend.put(f"commits/{head.seq:08d}.json", versions.Commit(**fields).to_json())
    _, problems = storage.verify(a)
    assert len(problems) == 1 and "not a version of this store" in problems[0], problems
    with pytest.raises(versions.DamagedCommitError, match="not a version of this store"):
        load_model(a)
    with pytest.raises(versions.DamagedCommitError):
        storage.open_node(a)
    assert load_model(b).lam == 0.7  # B itself is untouched


# -- item 5: a user's folder is never taken for a store, nor deleted from ----------------
@pytest.mark.parametrize("name", ["1-notes", "00000001-0123456789ab"])
def test_a_users_folder_given_as_out_is_refused_and_kept(corpus, name):
    users = corpus["dir"] / "U"
    (users / "versions" / name).mkdir(parents=True)
    notes = users / "versions" / name / "notes.txt"
    notes.write_text("mine")
    # refused as a fit refuses it: not slem-dask's, so never deleted, even with --overwrite
    with pytest.raises(FileExistsError, match="U' exists and was not written by slem-dask"):
        encode_corpus(corpus, users)
    assert notes.read_text() == "mine"
    assert not versions.VersionedStore(str(users)).has_history()


def test_an_unmarked_folder_inside_a_store_is_never_deleted(tmp_path):
    """A folder with a version's name but no marker of slem-dask, inside a real store:
    neither the commit of its sequence number nor garbage collection deletes it, nor is
    it offered as a draft to reuse."""
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    store.commit(_draft_with(store, 1.0), "model", "one")
    folders = tmp_path / "s.zarr" / "versions"
    theirs = {seq: folders / f"{seq:08d}-0123456789ab" for seq in (1, 2)}
    for folder in theirs.values():
        folder.mkdir()
        (folder / "notes.txt").write_text("mine")
    draft = _draft_with(store, 2.0)
    assert store.drafts(2) == [draft.version]
    store.commit(draft, "model", "two")
    for _ in range(versions.KEEP_VERSIONS + 1):
        store.commit(_draft_with(store, 3.0), "model", "more")
    store.collect_garbage(keep=1)
    assert all((f / "notes.txt").read_text() == "mine" for f in theirs.values())
    assert storage.open_node(store.path).attrs["value"] == 3.0


def test_a_marked_dead_draft_is_still_deleted(tmp_path):
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    loser, winner = _draft_with(store, 1.0), _draft_with(store, 2.0)
    store.commit(winner, "model", "winner")
    assert not Path(loser.location).exists()
    assert not Path(loser.location + versions.MARKER).exists()
    assert Path(winner.location + versions.MARKER).exists()


def test_the_marker_is_written_before_anything_of_the_draft(tmp_path):
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    draft = store.begin()
    marker = json.loads(Path(draft.location + versions.MARKER).read_text())
    assert marker["version"] == draft.version and not Path(draft.location).exists()
    assert store.has_history() and store.drafts(1) == [draft.version]


# -- item 8: a store that ignores If-None-Match is refused -------------------------------
class _Unconditional(LocalBackend):
    """A store that ignores conditional writes: every create overwrites."""

    creates = 0

    def create(self, key, data):
        _Unconditional.creates += 1
        self.put(key, data)
        return True


def test_a_store_without_conditional_writes_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(versions, "backend_for", lambda url: _Unconditional(url[len("file://") :]))
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    with pytest.raises(StorageConfigError) as info:
        store.begin()
    line = str(info.value)
    assert "\n" not in line and str(store.path) in line
    assert "ignores conditional writes" in line
    assert f"{backends.ACCEPT_NO_CONDITIONAL_WRITES}=1" in line
    assert os.listdir(tmp_path) == []  # refused before any draft; the probe key is gone
    monkeypatch.setenv(backends.ACCEPT_NO_CONDITIONAL_WRITES, "1")
    draft = _draft_with(store, 1.0)
    assert store.commit(draft, "model", "accepted").seq == 1


def test_conditional_writes_are_probed_once_per_store(tmp_path, monkeypatch):
    calls = []
    real = LocalBackend.create
    monkeypatch.setattr(
        LocalBackend, "create", lambda self, key, data: calls.append(key) or real(self, key, data)
    )
    for name in ("a.zarr", "b.zarr"):
        store = versions.VersionedStore(str(tmp_path / name))
        store.commit(_draft_with(store, 1.0), "model", "one")
    probes = [k for k in calls if k.startswith(".slem-dask-probe-")]
    assert len(probes) == 2 and len(set(probes)) == 1  # one key, created twice, once


class _IgnoresCondition:
    """The S3 client of a store that ignores If-None-Match (a test-level fault)."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        return getattr(self._client, name)

    async def put_object(self, **kwargs):
        kwargs.pop("IfNoneMatch", None)
        return await self._client.put_object(**kwargs)


def _ignore_conditions(monkeypatch, path):
    from slem_dask.storage.backends.s3 import S3Backend

    fs = S3Backend(path).fs
    real = fs.get_s3

    async def get_s3(*args, **kwargs):
        return _IgnoresCondition(await real(*args, **kwargs))

    monkeypatch.setattr(fs, "get_s3", get_s3)


@pytest.mark.parametrize("s3_server", ["seaweedfs", "moto"], indirect=True)
def test_an_s3_store_that_ignores_if_none_match_is_refused(s3_server, monkeypatch):
    path = f"s3://{s3_server.bucket}/nocond-{uuid.uuid4().hex[:8]}/s.zarr"
    _ignore_conditions(monkeypatch, path)
    store = versions.VersionedStore(path)
    with pytest.raises(
        StorageConfigError,
        match=rf"^'{path}': bucket s3://{s3_server.bucket} at "
        rf"{s3_server.endpoint} does not refuse .*"
        rf"{backends.ACCEPT_NO_CONDITIONAL_WRITES}=1$",
    ):
        store.begin()
    # the probe key is gone, nothing else written
    assert store.backend.list("") == [] and backend_for(path.rsplit("/", 1)[0]).list("") == []


def test_racing_commits_on_an_accepted_unconditional_store_leave_one_whole_version(
    tmp_path, monkeypatch
):
    """Item 8 with the risk accepted: job B commits between job A's create of the
    record and A's read-back. A learns it lost (it used to report success); neither
    deletes the folder that the record names."""
    monkeypatch.setenv(backends.ACCEPT_NO_CONDITIONAL_WRITES, "1")
    monkeypatch.setattr(versions, "backend_for", lambda url: _Unconditional(url[len("file://") :]))
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    a, b = _draft_with(store, 1.0), _draft_with(store, 2.0)
    real = _Unconditional.create

    def create(self, key, data):
        created = real(self, key, data)
        if key == COMMIT_1 and b"job A" in data:
            store.commit(b, "model", "job B")  # B overwrites A's record, reads it back
        return created

    monkeypatch.setattr(_Unconditional, "create", create)
    with pytest.raises(versions.CommitConflictError, match="committed by job B"):
        store.commit(a, "model", "job A")
    assert store.head().job == "job B"
    assert storage.open_node(store.path).attrs["value"] == 2.0
    assert not Path(a.location).exists()


def test_a_fit_to_an_s3_store_without_conditional_writes_is_one_line(
    s3_server, corpus, monkeypatch, capsys
):
    from slem_dask.cli.main import main

    model = f"s3://{s3_server.bucket}/nocond-{uuid.uuid4().hex[:8]}/m.zarr"
    _ignore_conditions(monkeypatch, model)
    args = [
        "fit",
        "--negatives",
        corpus["negatives"],
        "--model",
        model,
        "--local-cluster",
        "threads",
        "--no-progress",
    ]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"bucket s3://{s3_server.bucket} at {s3_server.endpoint}" in err
    assert f"{backends.ACCEPT_NO_CONDITIONAL_WRITES}=1" in err
    assert not versions.VersionedStore(model).has_history()  # nothing was written
    monkeypatch.setenv(backends.ACCEPT_NO_CONDITIONAL_WRITES, "1")
    assert main(args) == 0, capsys.readouterr().err
    assert storage.verify(model)[1] == [] and versions.VersionedStore(model).head().seq == 1


class _Unreachable(LocalBackend):
    """Every create of a commit record fails before it reaches the storage."""

    def create(self, key, data):
        if key.startswith("commits/"):
            raise ConnectionResetError(104, "Connection reset by peer")
        return super().create(key, data)


def test_a_commit_whose_outcome_stays_unknown_says_so_and_keeps_the_draft(tmp_path, monkeypatch):
    monkeypatch.setattr(versions, "backend_for", lambda url: _Unreachable(url[len("file://") :]))
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    draft = _draft_with(store, 1.0)
    with pytest.raises(versions.CommitUnknownError) as info:
        store.commit(draft, "model", "job one")
    line = str(info.value)
    assert "\n" not in line and "cannot learn whether version 1 was committed" in line
    assert "Connection reset by peer" in line and "slem-dask versions" in line
    assert Path(draft.location).exists()  # kept: nothing is deleted on an unknown outcome
    store.abandon(draft)  # its record may still land late (issue 38): never deleted
    assert Path(draft.location).exists() and store.head() is None
    monkeypatch.setattr(versions, "backend_for", lambda url: LocalBackend(url[len("file://") :]))
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    store.commit(_draft_with(store, 2.0), "model", "job two")  # takes number 1: then
    assert not Path(draft.location).exists()  # the kept draft is dead, and deleted
