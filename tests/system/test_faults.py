"""Faults as an operator meets them, with real processes: a job stalled (SIGSTOP) in
another PID namespace while another job takes its output over, a host whose clock is a
day ahead, SIGKILL during a fit's save and during an encode. What readers see is always
one committed version, and the same command succeeds afterwards with no manual step."""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from slem_dask import load_model, storage
from slem_dask.cli.main import main
from slem_dask.storage.versioning import versions

from helpers import TESTS, encode_command, expected_encoding, script_pythonpath, small_corpus

pytestmark = pytest.mark.slow

D = 8


@pytest.fixture
def corpus(tmp_path):
    return small_corpus(tmp_path, seed=11)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    env.update({"SLEM_DASK_LEASE_TTL": "2", "PYTHONPATH": script_pythonpath(), **extra})
    return env


def _start(args, prefix=(), **env):
    """A slowed job (tests/_slow_job.py) in a session of its own; returns once it has
    started writing its draft."""
    proc = subprocess.Popen(
        [*prefix, sys.executable, str(TESTS / "_slow_job.py"), *args],
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    started = threading.Event()
    lines = []

    def read():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("started"):
                started.set()

    threading.Thread(target=read, daemon=True).start()
    assert started.wait(60), proc.stderr.read() if proc.poll() is not None else "no start"
    proc.lines = lines
    return proc


def _wait_for_a_draft_chunk(out: Path, proc, timeout: float = 120) -> None:
    """Until the job's draft holds a chunk (not a time guessed for it: under load the
    job's first write may come late)."""
    deadline = time.monotonic() + timeout
    while not any(
        p.is_file() and not p.name.endswith((".partial", ".tmp"))
        for p in out.glob("versions/*/c/**/*")
    ):
        assert proc.poll() is None, f"the job ended first: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "no chunk was written to the draft"
        time.sleep(0.02)


def _cli(*args, prefix=(), **env):
    return subprocess.run(
        [
            *prefix,
            sys.executable,
            "-m",
            "slem_dask",
            *map(str, args),
            "--local-cluster",
            "threads",
            "--no-progress",
        ],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _other_pid_namespace():
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare(1) and root for a PID namespace")
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True
    )
    if probe.returncode:
        pytest.skip(f"unshare --pid fails here: {probe.stderr.decode().strip()}")
    return ("unshare", "--pid", "--fork", "--mount-proc")


def _clock_a_day_ahead():
    if shutil.which("faketime") is None:
        pytest.skip("needs faketime (Debian package faketime; .ci/run installs it)")
    return ("faketime", "-f", "+1d")


def test_a_stalled_job_in_another_pid_namespace_is_fenced(corpus):
    """The issue's case (b)+(c): job A, in another PID namespace, is stopped mid-encode;
    job B, on a clock a day ahead, waits out A's silent lease, takes the output over and
    commits other positives. A resumes: its late writes stay in its own draft and it
    fails naming what happened. Readers see B's output, whole."""
    pidns, skew = _other_pid_namespace(), _clock_a_day_ahead()
    out = corpus["dir"] / "out.zarr"
    a = _start(
        ["encode", corpus["model"], corpus["positives"], str(out)],
        prefix=pidns,
        SLOW_JOB_DELAY="0.4",
    )
    os.killpg(a.pid, signal.SIGSTOP)
    try:
        b = _cli(
            "encode",
            "--model",
            corpus["model"],
            "--positives",
            corpus["others"],
            "--out",
            out,
            "--partition-rows",
            "40",
            prefix=skew,
        )
        assert b.returncode == 0, b.stderr
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    a.wait(120)
    err = a.stderr.read()
    assert a.returncode == 1 and ("taken over" in err or "was committed by" in err), err
    np.testing.assert_array_equal(storage.read_all(out), expected_encoding(corpus, corpus["other"]))
    assert main(["verify", str(out)]) == 0
    assert versions.VersionedStore(str(out)).head().seq == 1


def test_a_clock_a_day_ahead_does_not_take_a_live_lease(corpus):
    """Case (a): a second job whose clock is ahead sees a live job (in another PID
    namespace: no pid to check) as alive, because its lease keeps changing."""
    pidns, skew = _other_pid_namespace(), _clock_a_day_ahead()
    out = corpus["dir"] / "out.zarr"
    a = _start(
        ["encode", corpus["model"], corpus["positives"], str(out)], prefix=pidns, SLOW_JOB_DELAY="4"
    )
    b = _cli(
        "encode",
        "--model",
        corpus["model"],
        "--positives",
        corpus["others"],
        "--out",
        out,
        "--partition-rows",
        "40",
        prefix=skew,
    )
    a.wait(120)
    assert b.returncode == 1 and "being written by another slem-dask job" in b.stderr, b.stderr
    assert a.returncode == 0, a.stderr.read()
    np.testing.assert_array_equal(storage.read_all(out), expected_encoding(corpus, corpus["pos"]))


def test_a_fit_killed_during_its_save_leaves_the_old_model_and_the_rerun_succeeds(corpus):
    model = corpus["model"]
    before = load_model(model).fingerprint_
    a = _start(["fit", corpus["negatives"], model], SLOW_JOB_DELAY="30")
    assert load_model(model).fingerprint_ == before  # readers: the old model, meanwhile
    os.killpg(a.pid, signal.SIGKILL)
    a.wait(30)
    assert load_model(model).fingerprint_ == before
    assert versions.VersionedStore(model).has_history()
    done = _cli("fit", "--negatives", corpus["negatives"], "--model", model, "--overwrite")
    assert done.returncode == 0, done.stderr
    assert main(["verify", model]) == 0
    assert load_model(model).n_samples_ == 300
    # the killed draft is gone, with its marker: two versions and their markers are left
    left = sorted(os.listdir(Path(model, "versions")))
    assert len(left) == 4 and all(
        m == v + ".slem-dask" for v, m in zip(left[::2], left[1::2], strict=True)
    )


def test_a_first_fit_killed_during_its_save_is_written_by_the_same_command(corpus):
    model = str(corpus["dir"] / "new.zarr")
    a = _start(["fit", corpus["negatives"], model], SLOW_JOB_DELAY="30")
    os.killpg(a.pid, signal.SIGKILL)
    a.wait(30)
    with pytest.raises((FileNotFoundError, ValueError)):
        load_model(model)  # nothing committed: nothing to read
    done = _cli("fit", "--negatives", corpus["negatives"], "--model", model)  # no --overwrite
    assert done.returncode == 0, done.stderr
    assert main(["verify", model]) == 0


def test_an_encode_killed_mid_way_resumes_from_its_draft(corpus):
    out = corpus["dir"] / "out.zarr"
    a = _start(["encode", corpus["model"], corpus["positives"], str(out)], SLOW_JOB_DELAY="1.0")
    _wait_for_a_draft_chunk(out, a)  # the first partitions written, not all
    os.killpg(a.pid, signal.SIGKILL)
    a.wait(30)
    assert not versions.VersionedStore(str(out)).is_versioned()
    done = _cli(*encode_command(corpus, out, "--partition-rows", 40))
    assert done.returncode == 0, done.stderr
    assert "resume" in done.stdout
    encoded = int(done.stdout.split("partitions")[1].split()[0])
    assert encoded < 5, done.stdout  # partitions of the killed run were reused
    np.testing.assert_array_equal(storage.read_all(out), expected_encoding(corpus, corpus["pos"]))
