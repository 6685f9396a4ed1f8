"""Versioned stores (slem_dask.storage.versioning.versions) and leases judged without clocks:
fencing, snapshot reads, atomic publish, history, checksummed output metadata."""

import json
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from slem_dask import LinearSLEM, load_model, pipeline, storage
from slem_dask.cli.main import main
from slem_dask.pipeline.evaluate import open_search_result, search_job
from slem_dask.retrieval import search
from slem_dask.storage.versioning import leases
from slem_dask.storage.versioning import versions

from helpers import encode_corpus, expected_encoding, foreign_lease, head, small_corpus

D = 8


@pytest.fixture
def corpus(tmp_path):
    return small_corpus(tmp_path, seed=3)


# -- the commit protocol ----------------------------------------------------------------
def test_of_two_jobs_from_one_head_one_commits_and_the_other_is_told_who(tmp_path):
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    first, second = store.begin(), store.begin()
    assert first.seq == second.seq == 1 and first.version != second.version
    for draft, value in ((first, 1.0), (second, 2.0)):
        zarr.open_group(store=draft.location, mode="w").attrs["value"] = value
    store.commit(second, "model", "job two")
    with pytest.raises(
        versions.CommitConflictError,
        match=r"version 1 was committed by job two on host .* before you run this job again",
    ):
        store.commit(first, "model", "job one")
    assert storage.open_node(store.path).attrs["value"] == 2.0
    # the loser's draft is dead (its sequence is taken): the next commit deletes it
    third = store.begin()
    zarr.open_group(store=third.location, mode="w").attrs["value"] = 3.0
    store.commit(third, "model", "job three")
    store.collect_garbage()
    assert not Path(first.location).exists() and Path(third.location).exists()


def test_racing_commits_from_many_threads_have_one_winner(tmp_path):
    store = versions.VersionedStore(str(tmp_path / "s.zarr"))
    drafts = [store.begin() for _ in range(8)]
    for d in drafts:
        zarr.open_group(store=d.location, mode="w")
    results = []

    def commit(d):
        try:
            store.commit(d, "model", d.version)
            results.append("won")
        except versions.CommitConflictError:
            results.append("lost")

    threads = [threading.Thread(target=commit, args=(d,)) for d in drafts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["lost"] * 7 + ["won"]
    assert len(store.commits()) == 1


def test_history_keeps_the_last_versions_and_rollback_restores_one(tmp_path, monkeypatch):
    path = str(tmp_path / "m.zarr")
    X = np.random.default_rng(0).standard_normal((60, 4))
    for lam in (0.1, 0.2, 0.3, 0.4, 0.5):
        LinearSLEM(lam=lam).fit(X).save(path, overwrite=True)
    store = versions.VersionedStore(path)
    assert [c.seq for c in store.commits()] == [1, 2, 3, 4, 5]
    kept = [c.seq for c in store.commits() if store.exists(c.version)]
    assert kept == [3, 4, 5]  # KEEP_VERSIONS = 3: older ones pruned, their records kept
    assert main(["rollback", path, "--to", "3"]) == 0
    assert load_model(path).lam == 0.3
    assert main(["versions", path]) == 0
    # an older version is read by its folder; a draft's folder is refused
    old = store.commit_at(4)
    assert load_model(store.location(old.version)).lam == 0.4
    draft = store.begin()
    zarr.open_group(store=draft.location, mode="w")
    with pytest.raises(ValueError, match="never committed"):
        load_model(draft.location)


def test_rollback_to_the_version_already_current_commits_nothing(tmp_path, capsys):
    path = str(tmp_path / "m.zarr")
    X = np.random.default_rng(0).standard_normal((60, 4))
    for lam in (0.1, 0.2):
        LinearSLEM(lam=lam).fit(X).save(path, overwrite=True)
    store = versions.VersionedStore(path)
    assert store.rollback(2) == store.head() and len(store.commits()) == 2  # the head
    assert main(["rollback", path, "--to", "2"]) == 0
    assert capsys.readouterr().out == (
        f"{store.path}: version 2 is already current; nothing to roll back, no version committed\n"
    )
    assert main(["rollback", path, "--to", "1"]) == 0  # a change: a new commit
    assert capsys.readouterr().out == f"{store.path}: version 3 is now current (rollback to 1)\n"
    assert main(["rollback", path, "--to", "1"]) == 0  # version 3 holds version 1 already
    assert capsys.readouterr().out == (
        f"{store.path}: version 1 is already current (as "
        f"version 3, rollback to 1); nothing to roll back, no "
        f"version committed\n"
    )
    assert [c.seq for c in store.commits()] == [1, 2, 3] and load_model(path).lam == 0.1


@pytest.mark.parametrize("damage", ["flipped byte", "chunk of another version"])
def test_a_rollback_to_a_damaged_version_is_refused_and_commits_nothing(tmp_path, capsys, damage):
    """A rollback checks the version it would make current end to end, as `verify`
    does: a damaged one is refused in one line naming it and the chunk, and nothing is
    committed; the current version stays current and readable."""
    path = str(tmp_path / "m.zarr")
    X = np.random.default_rng(0).standard_normal((60, 4))
    for lam in (0.1, 0.2):
        LinearSLEM(lam=lam).fit(X).save(path, overwrite=True)
    store = versions.VersionedStore(path)
    old, head = (Path(store.location(store.commit_at(s).version)) for s in (1, 2))
    chunk = old / "precision" / "c" / "0" / "0"
    if damage == "flipped byte":
        data = bytearray(chunk.read_bytes())
        data[len(data) // 2] ^= 1
        chunk.write_bytes(bytes(data))
    else:  # whole and self-consistent, but not the chunk version 1 recorded
        chunk.write_bytes((head / "precision" / "c" / "0" / "0").read_bytes())
    assert main(["rollback", path, "--to", "1"]) == 1
    err = capsys.readouterr().err
    assert f"{str(store.path)!r}: version 1 is damaged, nothing was rolled back or committed" in err
    assert "'precision/c/0/0'" in err and "slem-dask versions" in err
    assert err.count("\n") == 1, err
    assert [c.seq for c in store.commits()] == [1, 2] and load_model(path).lam == 0.2
    with pytest.raises(storage.DamagedStoreError, match="version 1 is damaged"):
        storage.rollback(path, 1)
    assert [c.seq for c in store.commits()] == [1, 2]


# -- fencing ---------------------------------------------------------------------------
def test_a_job_that_lost_its_output_can_never_change_what_readers_see(corpus, monkeypatch):
    """Job A encodes the positives; while its workers run, its lease is taken over and
    job B encodes other positives to the same output and commits. A's late writes go to
    its own draft, and its commit fails naming B: readers see B's output only."""
    out = corpus["dir"] / "out.zarr"
    real_compute = pipeline.common._compute
    seen = {}

    def stalled(client, obj, progress):
        if "b" not in seen:  # job A, stalled past its lease: job B runs meanwhile
            seen["b"] = "running"
            lease_file = Path(str(out.parent / f".{out.name}.slem-dask-lease"))
            lease_file.unlink()  # as if taken over by a job that thought A dead
            seen["b"] = encode_corpus(corpus, out, corpus["others"])
        return real_compute(client, obj, progress)  # A's workers write late

    monkeypatch.setattr(pipeline.common, "_compute", stalled)
    monkeypatch.setattr(leases.Lease, "check", lambda self: None)  # A does not notice
    with pytest.raises(versions.CommitConflictError, match="slem-dask encode on host"):
        encode_corpus(corpus, out)
    assert seen["b"].facts["version"] == 1
    np.testing.assert_array_equal(storage.read_all(out), expected_encoding(corpus, corpus["other"]))
    assert main(["verify", str(out)]) == 0
    # A's draft gone, with its marker; B's version and its marker stay
    assert sorted(os.listdir(out / "versions")) == [
        head(out).name,
        head(out).name + versions.MARKER,
    ]


def test_a_stalled_job_whose_lease_was_taken_over_says_so_first(corpus, monkeypatch):
    out = corpus["dir"] / "out.zarr"
    real_compute = pipeline.common._compute

    def stolen(client, obj, progress):
        result = real_compute(client, obj, progress)
        lease_file = Path(str(out.parent / f".{out.name}.slem-dask-lease"))
        lease_file.write_text(
            json.dumps(
                {"token": "another", "job": "slem-dask encode", "host": "elsewhere", "pid": 7}
            )
        )
        return result

    monkeypatch.setattr(pipeline.common, "_compute", stolen)
    with pytest.raises(storage.LeaseLostError, match="taken over by slem-dask encode"):
        encode_corpus(corpus, out)
    assert not versions.VersionedStore(str(out)).is_versioned()


# -- snapshot reads ----------------------------------------------------------------------
def test_a_search_during_a_reencode_reads_one_version_and_records_it(corpus, monkeypatch):
    import slem_dask.pipeline.search as evaluation

    db = corpus["dir"] / "db.zarr"
    encode_corpus(corpus, db)
    before = storage.read_all(db)
    real_compute = evaluation._compute

    def reencoded_meanwhile(client, obj, progress):
        encode_corpus(corpus, db, corpus["others"], overwrite=True)  # a new version commits
        return real_compute(client, obj, progress)

    monkeypatch.setattr(evaluation, "_compute", reencoded_meanwhile)
    out = str(corpus["dir"] / "hits.zarr")
    search_job(None, str(db), str(db), out, k=5, partition_rows=40)
    scores, indices = open_search_result(out)
    exp_scores, exp_indices = search(before, before, 5)
    np.testing.assert_array_equal(indices, exp_indices)  # the old version, whole
    meta = storage.open_node(out).attrs[storage.ATTR]
    assert meta["inputs"]["database"]["version"] == 1
    assert versions.VersionedStore(str(db)).head().seq == 2


# -- output metadata and chunks are checked against what was committed -------------------
def test_edited_output_metadata_is_refused_everywhere(corpus, capsys):
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    doc = head(out) / "zarr.json"
    meta = json.loads(doc.read_text())
    meta["attributes"]["slem_dask"]["encoding_fingerprint"] = "0" * 64
    meta["attributes"]["slem_dask"]["partition_crc32c"][0] = 12345
    doc.write_text(json.dumps(meta))
    assert main(["verify", str(out)]) == 1
    assert "does not match its commit record" in capsys.readouterr().out
    with pytest.raises(ValueError, match="commit record"):
        storage.read_all(out)
    with pytest.raises(ValueError, match="commit record"):
        encode_corpus(corpus, out)


def test_a_swapped_chunk_is_not_the_chunk_that_was_written(corpus):
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    chunks = head(out) / "c"
    (chunks / "1" / "0").write_bytes((chunks / "2" / "0").read_bytes())  # valid on its own
    with pytest.raises(storage.CorruptChunkError, match=r"c/1/0.*not the chunk its job wrote"):
        storage.read_all(out)


# -- leases: liveness without comparing clocks ---------------------------------------------
def test_a_silent_lease_from_another_namespace_is_taken_over_after_the_ttl(tmp_path, monkeypatch):
    monkeypatch.setattr(leases, "LEASE_TTL", 1.2)
    target = tmp_path / "out.zarr"
    foreign_lease(target, pid=os.getpid())  # a live pid here means nothing there
    waited = []
    with leases.Lease(target, "me", on_wait=waited.append) as mine:
        assert mine.took_over["host"] == "other-host" and mine.held()
    assert waited and "held by a job elsewhere" in waited[0] and "waiting up to 1 s" in waited[0]


def test_a_beating_lease_from_another_namespace_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(leases, "LEASE_TTL", 1.0)
    target = tmp_path / "out.zarr"
    theirs = foreign_lease(target)
    stop = threading.Event()

    def beat():
        n = 0
        while not stop.wait(0.1):
            n += 1
            record = {**json.loads(theirs._raw()), "beat": n}
            theirs._backend.put(theirs._key, json.dumps(record).encode())

    t = threading.Thread(target=beat)
    t.start()
    try:
        with pytest.raises(leases.LeaseHeldError, match="a job elsewhere .* on host other-host"):
            leases.Lease(target, "me").acquire()
    finally:
        stop.set()
        t.join()


def test_a_watcher_with_a_shorter_ttl_waits_out_the_owners_longer_one(tmp_path, monkeypatch):
    """The owner's record carries its TTL (it beats every quarter of it): a job started
    with a shorter SLEM_DASK_LEASE_TTL watches the owner's, and is refused when the owner
    beats after the watcher's own TTL but within its own. Before, it took the lease of a
    live job over after its own TTL (found by a new user, stop 52)."""
    monkeypatch.setattr(leases, "LEASE_TTL", 0.3)
    monkeypatch.setattr(leases, "LEASE_HEARTBEAT", 0.4)  # the watch looks every 0.1 s
    target = tmp_path / "out.zarr"
    theirs = foreign_lease(target, ttl=60.0)
    beats = []

    def beat_later(message):  # once the watch began: one beat, 1 s later (> 0.3 s)
        def beat():
            record = {**json.loads(theirs._raw()), "beat": 1}
            theirs._backend.put(theirs._key, json.dumps(record).encode())
            beats.append(message)

        threading.Timer(1.0, beat).start()

    with pytest.raises(leases.LeaseHeldError, match=r"after 60 s without a heartbeat when it"):
        leases.Lease(target, "me", on_wait=beat_later).acquire()
    assert beats and "waiting up to 60 s (its TTL; this job's: 0.3 s)" in beats[0], beats


@pytest.mark.parametrize("ttl", [None, "a day", float("nan"), -5.0, 1e12])
def test_the_recorded_ttl_is_used_only_when_it_is_a_sane_longer_one(ttl, monkeypatch):
    monkeypatch.setattr(leases, "LEASE_TTL", 10.0)
    want = leases.MOST_RECORDED_TTL if ttl == 1e12 else 10.0
    assert leases.recorded_ttl({"ttl": ttl}) == want
    assert leases.recorded_ttl({"ttl": 25}) == 25.0 and leases.recorded_ttl(None) == 10.0


def test_the_wait_and_the_takeover_are_said_as_warnings(tmp_path, monkeypatch):
    """Without an on_wait of its own, a job says that it watches a lease and that it took
    one over (the command line prints both as `slem-dask CMD: warning: ...`). Before, no
    job passed on_wait: a job waited 120 s in silence, and said nothing of the takeover."""
    monkeypatch.setattr(leases, "LEASE_TTL", 1.5)
    target = tmp_path / "out.zarr"
    foreign_lease(target)
    with pytest.warns(leases.LeaseWaitWarning) as said:
        with leases.Lease(target, "me"):
            pass
    lines = [str(w.message) for w in said]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"the lease of {str(target)!r} is held by a job elsewhere (pid")
    assert lines[0].endswith("; waiting up to 2 s to see whether that job is alive"), lines
    assert lines[1].startswith(f"took the lease of {str(target)!r} over from a job elsewhere")
    assert lines[1].endswith(
        "on host other-host, started 2031-01-01 00:00:00 UTC by its clock; lease "
        f"{str(target.parent / '.out.zarr.slem-dask-lease')!r}): its record did not change "
        "for 2 s; if that job resumes, it is refused and commits nothing"
    ), lines[1]


def test_a_stopped_owner_in_this_namespace_is_said_to_be_stopped(tmp_path):
    """A job refused by a lease whose owner, on this host, is stopped (SIGSTOP) is told
    so, and how to continue it: it said only that another job was writing the store (a
    new user, stop 52)."""
    import signal
    import subprocess
    import sys
    import time

    owner = subprocess.Popen(  # a job's process and its workers: one process group
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    try:
        os.kill(owner.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 60
        while not leases._process_stopped(owner.pid):  # the stop is delivered, not timed
            assert time.monotonic() < deadline, "the process was never seen stopped"
            time.sleep(0.01)
        target = tmp_path / "out.zarr"
        lease = leases.Lease(target, "a stopped job")
        record = {
            **lease._record(),
            "pid": owner.pid,
            "pid_start": leases._process_start(owner.pid),
        }
        lease._backend.create(lease._key, json.dumps(record).encode())
        with pytest.raises(leases.LeaseHeldError) as info:
            leases.Lease(target, "me").acquire()
        assert (
            f"a stopped job (pid {owner.pid} on host {socket.gethostname()}, started "
            f"{lease.started} by its clock; lease {str(lease.file)!r}); its process is "
            f"stopped (SIGSTOP, a debugger), and keeps the lease while it exists: continue "
            f"it with the worker processes stopped with it (`kill -CONT -- -{owner.pid}`, "
            f"its process group) or end it, then run this command again, or write to "
            f"another path; once stopped for more than "
            f"{leases.TRUSTED_PART * leases.LEASE_TTL:.0f} s it can no longer commit (once "
            f"continued, it ends with an error): end it. A dead job's lease"
        ) in str(info.value)
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()


def test_an_owner_in_another_pid_namespace_of_this_host_is_not_named_by_a_bare_pid():
    """A container's job records its own pid (often 1): shown bare, it read as the host's
    init, which a user told to "stop that job" might kill (a new user, stop 52)."""
    from slem_dask.storage.versioning.processes import where

    me = {"host": "vm", "boot": "b1", "pid_ns": "pid:[4026531836]"}
    ns = {**me, "pid": 1, "pid_ns": "pid:[4026532210]"}
    assert where(ns, me) == "pid 1 of another PID namespace (a container) on host vm"
    assert where({**ns, "boot": "b0"}, me) == "pid 1 on host vm before its last reboot"
    assert where({**me, "pid": 42}, me) == "pid 42 on host vm"
    assert where({**ns, "host": "h2"}, me) == "pid 1 on host h2"


def test_a_lease_record_keeps_the_time_its_job_started(tmp_path, monkeypatch):
    """Every heartbeat wrote the time of that beat as "started": a job watched and then
    refused 30 s later seemed to be another job (a new user, stop 52)."""
    lease = leases.Lease(tmp_path / "out.zarr", "me")
    first = lease._record()["started"]
    monkeypatch.setattr(leases.time, "localtime", lambda *a: time.localtime(time.time() + 3600))
    assert lease._record()["started"] == first == lease.started


def test_a_dead_pid_in_this_namespace_is_stale_at_once(tmp_path):
    target = tmp_path / "out.zarr"
    lease = leases.Lease(target, "dead job")
    record = {**lease._record(), "pid": 2**22 + 1}
    lease._backend.create(lease._key, json.dumps(record).encode())
    with leases.Lease(target, "me") as mine:  # no wait
        assert mine.took_over["job"] == "dead job"


def _three_model_versions(tmp_path):
    """A model store with versions 1-3 (lam 0.1, 0.2, 0.3), and a function listing the
    sequence numbers of its versions still readable."""
    path = str(tmp_path / "m.zarr")
    X = np.random.default_rng(0).standard_normal((60, 4))
    for lam in (0.1, 0.2, 0.3):
        LinearSLEM(lam=lam).fit(X).save(path, overwrite=True)
    store = versions.VersionedStore(path)
    return store, lambda: [c.seq for c in store.commits() if store.exists(c.version)]


def test_a_new_draft_prunes_the_oldest_kept_version_before_it_is_written(tmp_path):
    """Storage never holds more than KEEP_VERSIONS versions, a draft included: the
    oldest goes when the next job begins, so its space is free for the new one."""
    store, kept = _three_model_versions(tmp_path)
    assert kept() == [1, 2, 3]
    draft = store.begin()
    assert kept() == [1, 2, 3]  # a draft alone prunes nothing: a job that writes makes room
    store.make_room(mine=draft.version)  # as a job does: its own draft is not condemned
    assert kept() == [2, 3] and draft.seq == 4
    zarr.open_group(store=draft.location, mode="w")
    store.commit(draft, "model", "job four")
    store.collect_garbage()
    assert kept() == [2, 3, 4]
    # a job that fails after making room leaves the last KEEP_VERSIONS - 1, head included
    store.make_room()
    store.abandon(store.begin())
    assert kept() == [3, 4]
    assert load_model(store.location(store.commit_at(3).version)).lam == 0.3


def test_making_room_prunes_while_the_body_writes_and_reports_a_failed_pruning(tmp_path):
    """The job's thread writes while another deletes the oldest version; a pruning that
    failed is raised once the body is done, unless the body failed first."""
    store, kept = _three_model_versions(tmp_path)
    draft = store.begin()
    with store.making_room(mine=draft.version):
        zarr.open_group(store=draft.location, mode="w")
    assert kept() == [2, 3]
    assert store.exists(draft.version)  # the draft is never pruned
    store.commit(draft, "model", "job four")

    class Denied(store.backend.__class__):  # a store that refuses every delete
        def remove_tree(self, prefix):
            raise PermissionError(f"delete {prefix}: access denied")

        def delete(self, key):  # a version's zarr.json goes first
            raise PermissionError(f"delete {key}: access denied")

    store.backend.__class__ = Denied
    try:
        with pytest.raises(PermissionError, match="access denied"):
            with store.making_room():
                pass
        with pytest.raises(KeyError):  # the body's error wins
            with store.making_room():
                raise KeyError("the write failed")
    finally:
        store.backend.__class__ = Denied.__bases__[0]
    assert kept() == [2, 3, 4]


def test_a_failed_body_does_not_wait_for_a_pruning_stuck_in_a_request(tmp_path, monkeypatch):
    """An encode that lost its lease to a silent store ended 145 s after the silence,
    not within seconds (a fresh-clone CI under load, Azurite, 2026-11-30): its pruning
    was in a request to that store, and the job waited for that request's deadline. A
    body that failed now waits a few seconds at most; the pruning, left to run, ends
    once its store answers, and prunes what it would have."""
    store, kept = _three_model_versions(tmp_path)
    answers = threading.Event()  # the store answers again
    listed = store.backend.list

    def silent_list(prefix):  # the pruning's request to a store that does not answer
        if threading.current_thread().name == "slem-dask-make-room" and not answers.is_set():
            answers.wait(120)  # (its deadline)
            answers.set()
        return listed(prefix)

    monkeypatch.setattr(store.backend, "list", silent_list)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="lease lost"):
        with store.making_room():
            raise RuntimeError("lease lost")
    took = time.monotonic() - start
    assert took < 60, took  # it waited for the pruning before: 120 s here, at least
    pruning = [t for t in threading.enumerate() if t.name == "slem-dask-make-room"]
    assert pruning, "the pruning was not left running"
    answers.set()
    pruning[0].join(60)
    assert kept() == [2, 3]


def test_a_job_with_nothing_to_write_prunes_no_version(corpus):
    out = corpus["dir"] / "out.zarr"
    for i in range(versions.KEEP_VERSIONS):
        encode_corpus(corpus, out, corpus["others"] if i % 2 else None, overwrite=True)
    store = versions.VersionedStore(str(out))

    def kept():
        return [c.seq for c in store.commits() if store.exists(c.version)]

    assert kept() == [1, 2, 3]
    for _ in range(2):  # scheduled re-runs that find the output up to date
        assert encode_corpus(corpus, out).facts["action"] == "up to date"
    assert kept() == [1, 2, 3]


def test_a_version_pruned_while_read_says_so(corpus):
    out = corpus["dir"] / "out.zarr"
    encode_corpus(corpus, out)
    arr = storage.open_output(out)  # a reader holds version 1 ...
    for _ in range(versions.KEEP_VERSIONS - 1):  # ... while 2 newer versions commit
        encode_corpus(corpus, out, corpus["others"] if _ % 2 == 0 else None, overwrite=True)
    assert storage.read_rows(arr, 0, 40, "encodings").shape == (40, arr.shape[1])  # still there
    encode_corpus(corpus, out, overwrite=True)  # ... and a third job begins its draft
    with pytest.raises(versions.VersionError, match="was pruned while it read it"):
        storage.read_rows(arr, 0, 40, "encodings")


def test_loads_while_a_model_is_replaced_read_one_whole_version(tmp_path):
    """Issue 18: about 9% of loads during a replacement said "the store was modified or
    damaged, refit the model" about a healthy model. Loads now read one committed
    version: every load gives one of the models that were saved, whole."""
    path = str(tmp_path / "m.zarr")
    X = np.random.default_rng(1).standard_normal((200, 16))
    lams = [0.1 * (i + 1) for i in range(12)]
    fitted = {lam: LinearSLEM(lam=lam).fit(X) for lam in lams}
    fitted[lams[0]].save(path)
    errors, loaded = [], []
    done = threading.Event()

    def load():
        while not done.is_set():
            try:
                model = load_model(path)
                loaded.append(model.fingerprint_ == fitted[model.lam].fingerprint_)
            except Exception as exc:  # noqa: BLE001 - counted and shown by the assertion
                errors.append(repr(exc))

    readers = [threading.Thread(target=load) for _ in range(2)]
    for t in readers:
        t.start()
    for lam in lams[1:]:
        fitted[lam].save(path, overwrite=True)
    done.set()
    for t in readers:
        t.join()
    assert len(loaded) > 10 and all(loaded), (len(loaded), errors[:3])
    assert not errors, errors[:3]


@pytest.mark.parametrize(
    "path,seq",
    [
        ("s3://bucket/m.zarr/versions/00000002-0123456789ab", 2),
        ("/data/m.zarr/versions/00000003-0123456789ab/", 3),
        ("/data/m.zarr/versions/1-notes", None),  # a user's folder, never a version
        ("/data/m.zarr/other/00000002-0123456789ab", None),
        ("/data/m.zarr", None),
        ("00000002-0123456789ab", None),
    ],
)
def test_a_version_folders_sequence_number_is_read_from_its_path_alone(path, seq):
    from slem_dask.storage.versioning.records import version_folder_seq

    assert version_folder_seq(path) == seq
