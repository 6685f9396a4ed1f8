"""What an operator is told when a job meets the machine rather than bad input (issue 32):
an interrupt says what exists, a full disk names the path and what to free, paused and
slow workers are told apart, an empty input is not an error, tiny chunks get a hint.
In-process against one in-process scheduler; faults are injected, never provoked."""

import re

import numpy as np
import pytest

from slem_dask import pipeline
from slem_dask.cli.main import main

from helpers import cli, encode_command

pytestmark = pytest.mark.usefixtures("no_scheduler_env")  # conftest.py


def _fit(capsys, scheduler, negatives, model, *extra):
    return cli(capsys, scheduler, "fit", "--negatives", negatives, "--model", model, *extra)


def _encode(capsys, scheduler, corpus, out, *extra):
    return cli(capsys, scheduler, *encode_command(corpus, out, "--partition-rows", "40", *extra))


# -- 2. an interrupt says what exists -------------------------------------------------
def test_ctrl_c_before_any_partition_was_written_says_nothing_was_written(
    capsys, scheduler, corpus, monkeypatch
):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.common, "_compute", interrupted)
    out = corpus["dir"] / "codes.zarr"
    code, _, err = _encode(capsys, scheduler, corpus, out)
    assert code == 130
    assert err == (
        f"slem-dask encode: interrupted; nothing was committed and no partition "
        f"had been written (no output exists at {str(out)!r} for readers): run "
        f"the same command again to encode\n"
    )
    assert "resume" not in err and "kept" not in err


def test_ctrl_c_after_some_partitions_says_how_many_are_kept_and_where(
    capsys, scheduler, corpus, monkeypatch
):
    real = pipeline.common._compute

    def two_then_interrupted(client, written, progress):
        real(client, written[:2], progress)  # partitions 0 and 1 reach the draft
        raise KeyboardInterrupt

    out = corpus["dir"] / "codes.zarr"
    monkeypatch.setattr(pipeline.common, "_compute", two_then_interrupted)
    code, _, err = _encode(capsys, scheduler, corpus, out)
    assert code == 130
    said = re.fullmatch(
        r"slem-dask encode: interrupted; nothing was committed \(no output "
        r"exists at '(.*)' for readers\); 2 of 5 partitions are kept in the "
        r"draft '(.*)': run the same command again to resume\n",
        err,
    )
    assert said and said[1] == str(out), err
    assert said[2].startswith(str(out / "versions" / "00000001-"))
    monkeypatch.undo()
    code, stdout, err = _encode(capsys, scheduler, corpus, out)
    assert code == 0 and re.search(r"partitions +3 encoded of 5", stdout), stdout + err


def test_an_update_interrupted_after_writing_its_changed_partitions_is_committed_on_rerun(
    capsys, scheduler, corpus, monkeypatch
):
    # The re-run finds every changed partition in the interrupted run's draft, so it has
    # nothing to encode: it must commit them, not call the old head "up to date".
    from helpers import zarr_rows
    from reference import partitionwise
    from slem_dask import load_model, storage

    out = corpus["dir"] / "codes.zarr"
    assert _encode(capsys, scheduler, corpus, out)[0] == 0
    corpus["pos"][0] += 1
    zarr_rows(corpus["dir"] / "pos.zarr", corpus["pos"])
    real = pipeline.common._compute

    def written_then_interrupted(client, written, progress):
        real(client, written, progress)
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.common, "_compute", written_then_interrupted)
    code, _, err = _encode(capsys, scheduler, corpus, out)
    assert code == 130 and "readers still see version 1); 5 of 5 partitions" in err, err
    monkeypatch.undo()
    code, stdout, err = _encode(capsys, scheduler, corpus, out)
    assert code == 0 and re.search(r"action +resume", stdout), stdout + err
    model = load_model(corpus["model"])  # the job's products: one per 40-row partition
    want = partitionwise(lambda p: model.transform(p, dtype="float32"), corpus["pos"], 40)
    np.testing.assert_array_equal(storage.open_output(str(out))[...], want)


# -- 1. a full disk names the path, the space needed and what to free -------------------
@pytest.fixture
def full_disk(monkeypatch):
    """Every chunk and metadata write of zarr (and slem-dask's own chunk writes) fails
    as on a full disk: ENOSPC."""
    import errno
    import os

    from zarr.storage import LocalStore

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    async def full_set(self, key, value):
        full()

    monkeypatch.setattr(LocalStore, "set", full_set)
    monkeypatch.setattr(os, "writev", full)
    return monkeypatch


_SIZE = r"[\d.]+ (?:KiB|MiB|GiB)"
_FULL = re.compile(
    rf"no space left on the storage of '(?P<path>[^']+)' \(No space left on "
    rf"device; this job writes about (?P<need>[\d.]+) (?P<unit>KiB|MiB|GiB) "
    rf"there; {_SIZE} free on the file system mounted at "
    rf"(?P<mount>/[^)\s;]*)\); "
    rf"(?P<kept>[^:]+): free (space|at least {_SIZE}) on (?P=mount) "
    r"\(.*`slem-dask versions PATH`.*\), or write to another path, then run "
    r"the same command again"
)


def _said_full(err: str, path, command: str) -> re.Match:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"slem-dask {command}: error: "), err
    said = _FULL.search(lines[0])
    assert said and said["path"] == str(path), err
    return said


@pytest.mark.parametrize(
    "kernel", [[], ["--kernel", "rbf", "--rank", "6"]], ids=["linear", "kernel"]
)
def test_a_full_disk_during_a_fit_names_the_model_and_what_to_free(
    capsys, scheduler, corpus, full_disk, kernel
):
    from slem_dask.storage.versioning import versions

    path = corpus["dir"] / "m.zarr"
    code, _, err = _fit(capsys, scheduler, corpus["negatives"], path, *kernel)
    assert code == 1 and "[Errno 28]" not in err
    said = _said_full(err, path, "fit")
    assert said["kept"] == f"no model was written ({str(path)!r} is as before)"
    assert float(said["need"]) > 0
    full_disk.undo()
    assert not versions.VersionedStore(str(path)).is_versioned()
    assert _fit(capsys, scheduler, corpus["negatives"], path, *kernel)[0] == 0


def test_a_full_disk_during_a_search_names_the_output_and_the_space_it_needs(
    capsys, scheduler, corpus, monkeypatch
):
    out = corpus["dir"] / "codes.zarr"
    assert _encode(capsys, scheduler, corpus, out)[0] == 0
    import errno
    import os

    from zarr.storage import LocalStore

    async def full_set(self, key, value):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(LocalStore, "set", full_set)
    hits = corpus["dir"] / "hits.zarr"
    code, _, err = cli(
        capsys, scheduler, "search", "--queries", out, "--database", out, "--out", hits, "--k", "5"
    )
    assert code == 1
    said = _said_full(err, hits, "search")
    assert said["kept"] == f"nothing was written ({str(hits)!r} is as before)"
    assert said["unit"] == "KiB" and float(said["need"]) == round(200 * 5 * 16 / 1024, 1)
    assert not os.path.exists(hits / "commits")


def test_a_full_disk_during_an_encode_says_what_is_kept_and_the_space_still_needed(
    capsys, scheduler, corpus, monkeypatch
):
    import errno
    import os

    real, writes = os.writev, []

    def full_after_two(fd, parts):  # slem-dask writes each local chunk with one writev
        writes.append(fd)
        if len(writes) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, parts)

    monkeypatch.setattr(os, "writev", full_after_two)
    out = corpus["dir"] / "codes.zarr"
    code, _, err = _encode(capsys, scheduler, corpus, out, "--partition-rows", "40")
    assert code == 1
    said = _said_full(err, out, "encode")
    # 5 partitions of 40 rows x 8 float32 to write, 2 of them written before the disk filled
    assert said["unit"] == "KiB" and float(said["need"]) == round(5 * 40 * 8 * 4 / 1024, 1)
    assert re.fullmatch(
        r"nothing was committed \(no output exists at '.*' for readers\); "
        r"2 of 5 partitions are kept in the draft '.*'",
        said["kept"],
    ), err
    monkeypatch.undo()
    code, stdout, err = _encode(capsys, scheduler, corpus, out)
    assert code == 0 and re.search(r"partitions +3 encoded of 5", stdout), stdout + err


# -- 5. empty positives: an empty output, and the rest of a spec runs -------------------
def _empty(path, d=8):
    import zarr

    zarr.create_array(store=str(path), shape=(0, d), dtype="float32", chunks=(40, d))
    return str(path)


def test_empty_positives_encode_to_an_empty_output_with_a_warning(capsys, scheduler, corpus):
    from slem_dask import storage

    empty, out = _empty(corpus["dir"] / "empty.zarr"), corpus["dir"] / "codes.zarr"
    with pytest.warns(UserWarning, match="have no rows") as caught:
        code, stdout, err = cli(
            capsys,
            scheduler,
            "encode",
            "--model",
            corpus["model"],
            "--positives",
            empty,
            "--out",
            out,
        )
    assert code == 0, err
    said = str(caught[0].message)
    assert said == (
        f"positives {empty!r} have no rows (shape (0, 8)): the output is an "
        f"empty (0, 8) array; write rows there and run again to encode them"
    )
    assert re.search(r"warning +positives .* have no rows", stdout)
    assert storage.read_all(out).shape == (0, 8)
    assert main(["verify", str(out)]) == 0
    # rows written there later are encoded into the same output
    from helpers import zarr_rows

    zarr_rows(empty, corpus["pos"])
    code, stdout, err = cli(
        capsys, scheduler, "encode", "--model", corpus["model"], "--positives", empty, "--out", out
    )
    assert code == 0 and re.search(r"action +append", stdout), stdout + err
    assert storage.read_all(out).shape == (200, 8)


def _spec(tmp_path, corpus, positives):
    path = tmp_path / "job.toml"
    path.write_text(f"""
[model]
path = "{tmp_path / "m.zarr"}"
type = "linear"
lam = 0.01
[fit]
negatives = "{corpus["negatives"]}"
[[encode]]
positives = "{positives}"
out = "{tmp_path / "first.zarr"}"
[[encode]]
positives = "{corpus["positives"]}"
out = "{tmp_path / "second.zarr"}"
""")
    return path


def test_a_spec_with_empty_positives_runs_every_step(capsys, scheduler, corpus, tmp_path):
    from slem_dask import storage

    spec = _spec(tmp_path, corpus, _empty(tmp_path / "empty.zarr"))
    with pytest.warns(UserWarning, match="have no rows"):
        code, out, err = cli(capsys, scheduler, "run", spec)
    assert code == 0, err
    assert out.count("fit:") == 1 and out.count("encode:") == 2
    assert storage.read_all(tmp_path / "first.zarr").shape == (0, 8)
    assert storage.read_all(tmp_path / "second.zarr").shape == (200, 8)


def test_a_spec_names_a_bad_input_once(capsys, scheduler, corpus, tmp_path):
    import zarr

    one_d = zarr.create_array(store=str(tmp_path / "one.zarr"), shape=(10,), dtype="f4")
    one_d[...] = 1
    code, _, err = cli(capsys, scheduler, "run", _spec(tmp_path, corpus, tmp_path / "one.zarr"))
    assert code == 1
    assert f"encode[0].positives: the zarr array at '{tmp_path / 'one.zarr'}' has shape" in err
    assert err.count("positives:") == 1, err


# -- 8. tiny chunks: a hint naming the chunk size and what to rechunk to ----------------
def test_a_fit_on_one_row_chunks_hints_to_rechunk_and_says_to_what(capsys, scheduler, tmp_path):
    from helpers import zarr_rows
    from slem_dask.storage.nodes.chunks import SmallChunksWarning

    rows = np.random.default_rng(1).standard_normal((1500, 8)).astype("float32")
    tiny = zarr_rows(tmp_path / "tiny.zarr", rows, chunks=1)
    with pytest.warns(SmallChunksWarning) as caught:
        code, out, err = _fit(capsys, scheduler, tiny, tmp_path / "m.zarr")
    assert code == 0, err
    said = str(caught[0].message)
    assert said == (
        f"negatives {tiny!r} are stored in 1,500 chunks of 1 row(s) (32 bytes "
        f"each): reaching each chunk (a file or request, a decode) costs more "
        f"than reading its data; rechunk to 1,500 rows per chunk (46.9 KiB), e.g. "
        f"dask.array.from_zarr(OLD).rechunk((1500, 8)).to_zarr(NEW)"
    )
    assert re.search(r"^  hint +negatives .* 1,500 chunks of 1 row", out, re.M)
    # chunks of 40 rows (1.2 KiB), 38 of them: no hint
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallChunksWarning)
        code, out, err = _fit(
            capsys, scheduler, zarr_rows(tmp_path / "ok.zarr", rows), tmp_path / "m2.zarr"
        )
    assert code == 0 and "hint" not in out, err


def test_the_rechunk_hint_suggests_chunks_of_about_4_mib_in_whole_rows():
    import zarr

    from slem_dask.storage.nodes.chunks import small_chunks_hint

    arr = zarr.create_array(store={}, shape=(2_000_000, 128), dtype="uint8", chunks=(16, 128))
    said = small_chunks_hint(arr, "positives", "/data/p.zarr")
    assert "125,000 chunks of 16 row(s) (2.0 KiB each)" in said
    assert "rechunk to 32,768 rows per chunk (4.0 MiB)" in said
    big = zarr.create_array(store={}, shape=(2_000_000, 128), dtype="uint8", chunks=(512, 128))
    assert small_chunks_hint(big, "positives", "/data/p.zarr") is None  # 64 KiB chunks


# -- 6. workers killed for memory: each named once, with the remedy that helps -----------
def _killed(address="tcp://10.0.0.1:4003"):
    from types import SimpleNamespace

    from distributed.scheduler import KilledWorker

    return KilledWorker("task-1", SimpleNamespace(address=address), 3)


def test_a_worker_restarted_four_times_is_named_once():
    from slem_dask.cluster.workers import explain

    # its nanny restarts it at a new address each time; the events log each address
    events = [(t, {"worker": f"tcp://10.0.0.1:{4000 + t}"}) for t in range(4)]
    limits = {"tcp://10.0.0.1:4000": 2**30, "tcp://10.0.0.2:5000": 2**30}
    names = {"tcp://10.0.0.1:4000": "w0", "tcp://10.0.0.2:5000": "w1"}
    said = explain(_killed(), events, limits, "nothing was marked complete", names)
    assert said.startswith(
        "worker(s) tcp://10.0.0.1:4000 (w0) (memory limit 1024.0 MiB) "
        "were restarted by their nannies 4 time(s) for exceeding their "
        "memory limit; nothing was marked complete: "
    ), said
    assert "4001" not in said and "4002" not in said and "4003" not in said


def test_a_job_run_without_a_client_leaves_no_plan_for_a_later_failure(corpus):
    """A library job with no client (dask's default scheduler) checks its memory and
    notes its remedy outside any explain_failures block: neither may outlive it in the
    caller's context, where a later job's failure would describe this job's partitions
    (the test above failed after an encode_job(None, ...) of another test)."""
    from slem_dask.cluster import workers
    from slem_dask.pipeline import encode_job

    encode_job(None, corpus["model"], corpus["positives"], corpus["dir"] / "library.zarr")
    workers.note_memory_remedy("pass --kernel-memory streaming")
    assert workers._plan.get() is None and workers._remedy.get() is None
    test_a_worker_restarted_four_times_is_named_once()


def test_a_forced_in_memory_kernel_fit_killed_for_memory_suggests_streaming(
    capsys, scheduler, corpus, monkeypatch
):
    from slem_dask.models import KernelSLEM

    def killed(self, *args, **kwargs):
        raise _killed()

    monkeypatch.setattr(KernelSLEM, "fit", killed)
    code, _, err = _fit(
        capsys,
        scheduler,
        corpus["negatives"],
        corpus["dir"] / "k.zarr",
        "--kernel",
        "rbf",
        "--rank",
        "6",
        "--kernel-memory",
        "in-memory",
    )
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(
        "slem-dask fit: error: 4 workers died running the same task (last: tcp://10.0.0.1:4003; "
    ), err
    from slem_dask.pipeline.common import size_text
    from slem_dask.cluster.workers import kernel_fit_bytes

    need = size_text(kernel_fit_bytes(300, 8, np.float32, 6))
    assert lines[0].endswith(
        f"nothing was marked complete: the in-memory kernel fit holds all 300 rows and their "
        f"factor rows on the workers (about {need} in all, whatever --partition-rows says): "
        "pass --kernel-memory streaming (or auto), which reads the negatives in partitions "
        "at each pass, or give the workers more memory"
    ), err
    assert "--partition-rows N" not in err and "a smaller --partition-rows" not in err


# -- 3, 4. a stalled job: paused workers, long tasks, an object store that does not answer --
@pytest.fixture
def one_worker():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=False,
            memory_limit="1GiB",
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        worker = cluster.workers[0]
        # the worker runs in this process, whose memory is the whole suite's (past 80% of
        # 1 GiB late in a run, where dask paused it and a test waited forever): what dask's
        # monitor measures is this test's to set
        worker.monitor.get_process_memory = lambda: 100 * 2**20
        yield client, worker


def test_a_check_on_a_scheduler_without_workers_waits_in_view_and_gives_up_on_time(tmp_path):
    """The check of every worker waits for one (it checked none before), queued as a
    task: the stall line says what it waits for, and --task-timeout still ends it."""
    import numpy as np
    import zarr
    from distributed import Client, LocalCluster

    from slem_dask import storage
    from slem_dask.cluster.watchdog import TaskTimeout

    path = str(tmp_path / "p.zarr")
    zarr.create_array(store=path, shape=(4, 3), dtype="f4")[...] = np.ones((4, 3))
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        address = cluster.scheduler_address
        with pytest.raises(TaskTimeout) as stop:
            _watched(client, lambda: storage.check_workers_see(client, {"p": path}), task_timeout=2)
    assert "waiting for a worker: the scheduler has none connected" in str(stop.value)
    assert f"`dask worker {address}`" in str(stop.value)


def _watched(client, compute, **options):
    """(result, the watchdog's lines) of ``compute()`` watched with short intervals."""
    import io

    from slem_dask.cluster import watchdog

    out = io.StringIO()
    with watchdog.watch(client, out=out, **{"warn_after": 0.6, "interval": 0.1, **options}):
        result = compute()
    return result, out.getvalue().splitlines()


def _sleep(seconds, x=0):
    import time

    time.sleep(seconds)
    return x


def test_a_worker_paused_for_memory_is_named_with_its_memory_and_the_fix(one_worker):
    import threading
    import time

    from distributed.core import Status

    client, worker = one_worker
    # dask's memory monitor measures 81% of the worker's limit, and pauses it
    real = worker.monitor.get_process_memory
    worker.monitor.get_process_memory = lambda: int(0.81 * 2**30)
    deadline = time.monotonic() + 30
    while worker.status != Status.paused and time.monotonic() < deadline:
        time.sleep(0.01)
    threading.Timer(1.5, setattr, (worker.monitor, "get_process_memory", real)).start()
    result, lines = _watched(client, lambda: client.submit(sum, [1, 2]).result(timeout=30))
    assert result == 3
    stall = [x for x in lines if x.startswith("slem-dask: no task finished for")]
    assert stall, lines
    # the memory as the scheduler last heard it (this test fakes only the monitor's figure)
    assert re.search(
        rf"waiting for workers: {re.escape(worker.address)} \(0\) \(paused by "
        rf"dask for memory: its process holds \d+ MiB, \d+% of its 1024 MiB "
        rf"memory limit; it takes no task until it holds less\), 1 task\(s\) "
        rf"that wait for a worker that is not paused",
        stall[0],
    ), stall[0]
    assert "give the workers more memory (dask worker --memory-limit)" in stall[0]
    assert "tasks queued on the scheduler" not in stall[0] and "check or restart" not in stall[0]


def test_a_long_task_on_a_worker_that_answers_is_progress_not_a_worker_to_restart(one_worker):
    client, worker = one_worker
    result, lines = _watched(client, lambda: client.submit(_sleep, 2.0, 7).result(timeout=30))
    assert result == 7
    stall = [x for x in lines if x.startswith("slem-dask: no task finished for")]
    assert stall, lines
    assert "0 of 1 tasks done in" in stall[0] and "none finished yet" in stall[0], stall[0]
    assert (
        f"1 task running (1 on {worker.address} (0); it answers): long tasks, not a stuck "
        f"worker; --task-timeout SECONDS gives up" in stall[0]
    ), stall[0]
    assert all("restart" not in x for x in lines), lines


def test_without_a_terminal_a_job_says_its_progress_at_intervals(one_worker):
    client, _ = one_worker

    def compute():
        from distributed import wait

        futures = client.map(_sleep, [0.1] * 20, range(20))
        wait(futures, timeout=60)  # a test that waits, never one that hangs
        return sum(client.gather(futures))

    result, lines = _watched(client, compute, progress_every=0.5, warn_after=5)
    assert result == sum(range(20))
    said = [
        re.fullmatch(
            r"slem-dask: (\d+) of 20 tasks done in \d+ s \([\d.]+/min; about "
            r"\d+ s left at that rate\)",
            x,
        )
        for x in lines
    ]
    assert lines and all(said), lines
    done = [int(m[1]) for m in said]
    assert done == sorted(done) and 0 < done[0] < 20


def test_a_stall_while_the_object_store_does_not_answer_names_the_store(one_worker, monkeypatch):
    import socket

    with socket.socket() as s:  # a port that nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    client, _ = one_worker
    _, lines = _watched(
        client,
        lambda: client.submit(_sleep, 1.5).result(timeout=30),
        stores=["s3://bucket/codes.zarr", "/tmp/local.zarr"],
    )
    stall = [x for x in lines if x.startswith("slem-dask: no task finished for")]
    assert stall, lines
    assert re.fullmatch(
        rf"slem-dask: no task finished for \d+ s: the object store at "
        rf"http://127\.0\.0\.1:{port} does not answer \(Connection refused\) "
        rf"for s3://bucket/codes\.zarr: start or resume it, or fix AWS_ENDPOINT_URL .*",
        stall[0],
    ), stall[0]
    assert "check or restart" not in stall[0]


def test_a_long_step_of_this_process_is_named_while_no_task_runs(one_worker):
    # a fit's d x d factorization at d = 8192 ran for minutes in the client, no task
    # pending, and nothing was said (issue 39): the watchdog names the step and its time
    import io
    import threading

    from slem_dask.cluster import watchdog
    from slem_dask.core.steps import long_step

    client, _ = one_worker
    out, said = io.StringIO(), threading.Event()

    class Out(io.StringIO):
        def write(self, text):
            out.write(text)
            if "this process computes" in out.getvalue():
                said.set()
            return len(text)

    with watchdog.watch(client, out=Out(), warn_after=0.6, interval=0.1):
        with long_step("the Cholesky inverse of A (8192 x 8192)"):
            assert said.wait(60), out.getvalue()  # a test that waits, never one that hangs
    line = next(x for x in out.getvalue().splitlines() if "this process computes" in x)
    assert re.fullmatch(
        r"slem-dask: this process computes the Cholesky inverse of A \(8192 x 8192\) for "
        r"\d+ s so far \(no dask task runs meanwhile: the workers wait for it, they are "
        r"not stuck\)",
        line,
    ), line
    assert "check or restart" not in out.getvalue()


@pytest.mark.parametrize("url", ["s3://bucket/codes.zarr", "gs://bucket/codes.zarr"])
def test_a_stall_while_the_object_store_is_silent_names_the_store(one_worker, monkeypatch, url):
    """A stopped store's kernel still accepts connections: the watchdog said "long tasks,
    not a stuck worker" while every task waited on it (issue 38, 4). It now asks the
    store for an answer, within the connect deadline."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))  # accepts (its backlog), never answers
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    monkeypatch.setenv("SLEM_DASK_STORAGE_TIMEOUT", "1")
    client, _ = one_worker
    with listener:
        _, lines = _watched(
            client, lambda: client.submit(_sleep, 4).result(timeout=60), stores=[url]
        )
    stall = [x for x in lines if x.startswith("slem-dask: no task finished for")]
    assert stall, lines
    assert re.fullmatch(
        rf"slem-dask: no task finished for \d+ s: the object store at {re.escape(endpoint)} "
        rf"does not answer \(accepted a connection but sent nothing for 1 s\) for "
        rf"{re.escape(url)}: start or resume it, .*no worker needs a restart",
        stall[0],
    ), stall[0]
    assert "long tasks" not in " ".join(lines)


def test_search_shows_its_progress_when_asked(capsys, scheduler, corpus):
    out = corpus["dir"] / "codes.zarr"
    assert _encode(capsys, scheduler, corpus, out)[0] == 0
    code = main(
        [
            "search",
            "--queries",
            str(out),
            "--database",
            str(out),
            "--out",
            str(corpus["dir"] / "hits.zarr"),
            "--k",
            "5",
            "--scheduler",
            scheduler,
            "--progress",
        ]
    )
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "100% Completed" in stdout, stdout


# -- 7. lambda relative to the negatives' scale ------------------------------------------
def _unit_rows(n, d=16, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_the_default_lambda_follows_the_scale_of_the_data():
    from slem_dask import LinearSLEM

    neg, pos = _unit_rows(400), _unit_rows(20, seed=1)
    unit = LinearSLEM().fit(neg)
    assert unit.lam == "0.01x"
    assert unit.lam_ == pytest.approx(0.01 * np.trace(unit.covariance_), rel=1e-12)
    # the same descriptors as integers 0..255 (uint8-like): the same model, to rounding
    raw = LinearSLEM().fit(np.round(neg * 127 + 128))
    np.testing.assert_allclose(
        raw.transform(np.round(pos * 127 + 128)),
        LinearSLEM()
        .fit(np.round(neg * 127 + 128) / 255)
        .transform(np.round(pos * 127 + 128) / 255),
        atol=1e-9,
    )
    assert raw.lam_ == pytest.approx(0.01 * np.trace(raw.covariance_), rel=1e-12)
    # a number stays absolute, as it always was
    assert LinearSLEM(lam=3e-3).fit(neg).lam_ == 3e-3
    assert LinearSLEM(lam="0.03x").fit(neg).lam_ == pytest.approx(3 * unit.lam_, rel=1e-12)


def test_an_absolute_lambda_far_from_the_datas_scale_warns():
    import warnings

    from slem_dask import LinearSLEM
    from slem_dask.core.validation import LambdaScaleWarning

    neg = _unit_rows(400)
    with pytest.warns(
        LambdaScaleWarning,
        match=r"lam=0\.001 is [\d.e-]+ times the "
        r"negatives' mean variance \(tr\(Sigma\)/d = [\d.e+]+\): it barely "
        r"regularizes.*e\.g\. --lam 0\.01x",
    ):
        LinearSLEM(lam=1e-3).fit(neg * 255 * 40)
    with pytest.warns(LambdaScaleWarning, match="the model barely whitens"):
        LinearSLEM(lam=100.0).fit(neg)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LambdaScaleWarning)
        LinearSLEM(lam=3e-3).fit(neg)  # L2-normalized: a usual value
        LinearSLEM().fit(neg * 1e6)  # a relative lambda never warns


def test_a_model_saved_before_relative_lambdas_keeps_its_absolute_lambda():
    from slem_dask import LinearSLEM

    fitted = LinearSLEM(lam=0.1).fit(_unit_rows(100))
    info, arrays = fitted._state()
    info.pop("lam_")  # what an earlier slem-dask wrote
    old = LinearSLEM(lam=0.1)
    old._set_state(info, arrays)
    assert old._lam() == 0.1 and old.fingerprint_ == fitted.fingerprint_


def test_an_update_with_a_relative_lambda_equals_a_refit_on_all_rows(tmp_path):
    from helpers import zarr_rows
    from slem_dask import LinearSLEM, load_model

    rows = _unit_rows(600).astype("float32")
    neg = zarr_rows(tmp_path / "neg.zarr", rows[:400])
    model = str(tmp_path / "m.zarr")
    pipeline.fit_job(None, neg, model)
    import zarr

    arr = zarr.open_array(neg, mode="r+")
    arr.resize((600, 16))
    arr[400:] = rows[400:]
    report = pipeline.fit_job(None, neg, model, update=True)
    assert report.facts["action"] == "update"
    updated, refit = load_model(model), LinearSLEM().fit(rows)
    assert updated.lam_ == pytest.approx(refit.lam_, rel=1e-6)  # float32 blocks
    np.testing.assert_allclose(
        updated.precision_, refit.precision_, rtol=0, atol=1e-5 * np.abs(refit.precision_).max()
    )  # float32 blocks
    first = LinearSLEM().fit(rows[:400])
    assert abs(first.lam_ - refit.lam_) > 1e-4 * refit.lam_  # the update did recompute it


def test_the_command_line_takes_relative_and_absolute_lambdas(capsys, scheduler, corpus):
    code, out, err = _fit(capsys, scheduler, corpus["negatives"], corpus["dir"] / "a.zarr")
    assert code == 0, err
    assert re.search(r"^  lam +0\.01x \(= [\d.e-]+: 0\.01 x tr\(Sigma\)\)$", out, re.M), out
    code, out, err = _fit(
        capsys, scheduler, corpus["negatives"], corpus["dir"] / "b.zarr", "--lam", "0.5"
    )
    assert code == 0 and re.search(r"^  lam +0\.5$", out, re.M), out
    code, _, err = _fit(
        capsys,
        scheduler,
        corpus["negatives"],
        corpus["dir"] / "k.zarr",
        "--kernel",
        "rbf",
        "--lam",
        "0.01x",
    )
    assert code == 1 and err.startswith(
        "slem-dask fit: error: lam '0.01x': a lambda "
        "relative to the negatives' total variance applies "
        "to linear SLEM"
    ), err
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "fit",
                "--negatives",
                corpus["negatives"],
                "--model",
                str(corpus["dir"] / "c.zarr"),
                "--lam",
                "big",
            ]
        )
    code, err = exited.value.code, capsys.readouterr().err
    assert (
        code == 2
        and "argument --lam: expected a finite number > 0 or Cx with C > 0, got 'big' (a "
        "number is absolute; Cx is C times the negatives' total variance, e.g. 0.01x)"
        in err
    ), err


def test_a_spec_takes_a_relative_lambda_for_linear_models_only():
    from slem_dask.pipeline.jobspec import SpecError, parse_spec

    spec = parse_spec({"model": {"path": "m", "lam": "0.02x"}, "fit": {"negatives": "n"}})
    assert spec.model.lam == "0.02x"
    assert parse_spec({"model": {"path": "m"}, "fit": {"negatives": "n"}}).model.lam is None
    with pytest.raises(
        SpecError,
        match=r"model.lam = '0.02x': a lambda relative to the "
        r"negatives' total variance applies to type = "
        r"\"linear\"",
    ):
        parse_spec(
            {"model": {"path": "m", "type": "kernel", "lam": "0.02x"}, "fit": {"negatives": "n"}}
        )
    with pytest.raises(
        SpecError,
        match=r"model.lam = 'tiny': expected a number > 0 "
        r"\(absolute\) or a string \"<c>x\"",
    ):
        parse_spec({"model": {"path": "m", "lam": "tiny"}, "fit": {"negatives": "n"}})


def test_an_update_without_lam_keeps_the_models_lambda(capsys, scheduler, tmp_path):
    # a model fitted when the default was the absolute 1e-3 is updated, not refused for
    # "other parameters", by the same command without --lam
    from helpers import zarr_rows
    from slem_dask import load_model

    rows = _unit_rows(600).astype("float32")
    neg = zarr_rows(tmp_path / "neg.zarr", rows[:400])
    model = tmp_path / "m.zarr"
    assert _fit(capsys, scheduler, neg, model, "--lam", "1e-3")[0] == 0
    import zarr

    arr = zarr.open_array(neg, mode="r+")
    arr.resize((600, 16))
    arr[400:] = rows[400:]
    code, out, err = _fit(capsys, scheduler, neg, model, "--update")
    assert code == 0 and re.search(r"^  action +update$", out, re.M), out + err
    assert load_model(str(model)).lam == 1e-3 and load_model(str(model)).n_samples_ == 600


def test_a_full_disk_in_any_other_command_is_one_line_naming_what_it_writes(
    capsys, scheduler, tmp_path, full_disk
):
    workdir = tmp_path / "demo"
    code, _, err = cli(
        capsys,
        scheduler,
        "demo",
        "--workdir",
        workdir,
        "--negatives",
        "60",
        "--instances",
        "5",
        "--dim",
        "4",
    )
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"slem-dask demo: error: no space left on the storage of {str(workdir)!r} (No space "
        f"left on device; "
    ), err
    assert "[Errno 28]" not in err and "or write to another path" in err


# -- walkthrough defects: file inputs, an early Ctrl-C, a re-run on empty positives -------
def test_inputs_read_by_row_ranges_get_no_rechunk_hint_and_chunked_hdf5_does(tmp_path):
    h5py = pytest.importorskip("h5py")
    from slem_dask import storage
    from slem_dask.storage.nodes.chunks import small_chunks_hint

    rows = np.random.default_rng(2).standard_normal((1500, 8)).astype("float32")
    np.save(tmp_path / "neg.npy", rows)
    with open(tmp_path / "neg.fvecs", "wb") as f:
        np.hstack([np.full((1500, 1), 8, "int32").view("float32"), rows]).tofile(f)
    with h5py.File(tmp_path / "neg.h5", "w") as f:
        f.create_dataset("contiguous", data=rows)
        f.create_dataset("tiny", data=rows, chunks=(1, 8))
    for name in ("neg.npy", "neg.fvecs", "neg.h5:/contiguous"):
        arr = storage.open_input(str(tmp_path / name), "negatives")
        assert small_chunks_hint(arr, "negatives", tmp_path / name) is None, name
    tiny = storage.open_input(str(tmp_path / "neg.h5:/tiny"), "negatives")
    assert "1,500 chunks of 1 row(s)" in small_chunks_hint(tiny, "negatives", "neg.h5")


def test_a_fit_on_an_npy_file_gives_no_rechunk_hint(capsys, scheduler, tmp_path):
    import warnings

    from slem_dask.storage.nodes.chunks import SmallChunksWarning

    np.save(
        tmp_path / "neg.npy", np.random.default_rng(3).standard_normal((1500, 8)).astype("float32")
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallChunksWarning)
        code, out, err = _fit(capsys, scheduler, tmp_path / "neg.npy", tmp_path / "m.zarr")
    assert code == 0 and "hint" not in out and "rechunk" not in err, out + err


def test_ctrl_c_before_the_job_began_does_not_call_the_old_output_complete(
    capsys, scheduler, corpus, monkeypatch
):
    out = corpus["dir"] / "codes.zarr"
    assert _encode(capsys, scheduler, corpus, out)[0] == 0  # version 1, complete

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "check_encode_inputs", interrupted)
    code, _, err = _encode(capsys, scheduler, corpus, out)
    assert code == 130
    assert "is complete" not in err, err
    assert err == (
        "slem-dask encode: interrupted; nothing was committed and no partition "
        "had been written (readers still see version 1): run the same command "
        "again to encode\n"
    )


@pytest.mark.parametrize("fmt", ["npy", "zarr"])
def test_a_rerun_on_empty_positives_is_up_to_date(capsys, scheduler, corpus, fmt):
    from slem_dask import storage

    if fmt == "npy":
        empty = str(corpus["dir"] / "empty.npy")
        np.save(empty, np.zeros((0, 8), "float32"))
    else:
        empty = _empty(corpus["dir"] / "empty.zarr")
    out = corpus["dir"] / "codes.zarr"
    args = ("encode", "--model", corpus["model"], "--positives", empty, "--out", out)
    with pytest.warns(UserWarning, match="have no rows"):
        assert cli(capsys, scheduler, *args)[0] == 0
        code, stdout, err = cli(capsys, scheduler, *args)
    assert code == 0, err
    assert re.search(r"action +up to date", stdout), stdout + err
    assert storage.read_all(out).shape == (0, 8)


def test_a_stall_on_a_scheduler_without_workers_says_to_start_some():
    """A --scheduler whose workers never started: no worker to name or restart (it said
    "waiting for tasks queued on the scheduler: check or restart those workers")."""
    import threading

    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        address = cluster.scheduler_address
        threading.Timer(1.5, cluster.scale, (1,)).start()  # then the job goes on
        result, lines = _watched(client, lambda: client.submit(sum, [1, 2]).result(timeout=30))
    assert result == 3
    stall = [x for x in lines if x.startswith("slem-dask: no task finished for")]
    assert stall, lines
    assert (
        "waiting for a worker: the scheduler has none connected: start workers for this "
        in (stall[0])
    )
    assert f"`dask worker {address}`" in stall[0] and "restart" not in stall[0]


# -- a store held by a job elsewhere -----------------------------------------------------
def test_the_command_line_says_it_watches_a_lease_and_takes_it_over(corpus, tmp_path):
    """A lease left by a job in another PID namespace (another host or container): the
    command says at once that it watches it, then that it took it over, each as one
    warning line, and writes the output. Before, it waited SLEM_DASK_LEASE_TTL (120 s by
    default) in silence, and said nothing of the takeover (a new user, stop 52)."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "codes.zarr"
    lease = tmp_path / ".codes.zarr.slem-dask-lease"
    record = {"token": "f" * 32, "job": "slem-dask encode", "host": "elsewhere", "pid": 7}
    record.update(pid_ns="pid:[1]", boot="b", beat=3, started="2026-11-29 10:00:00 UTC")
    lease.write_text(json.dumps(record))
    exe = os.path.join(os.path.dirname(sys.executable), "slem-dask")
    done = subprocess.run(
        [exe, *encode_command(corpus, out), "--local-cluster", "threads", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SLEM_DASK_LEASE_TTL": "2"},
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "lease" in line]
    assert said == [
        f"slem-dask encode: warning: the lease of {str(out)!r} is held by slem-dask encode "
        f"(pid 7 on host elsewhere, started 2026-11-29 10:00:00 UTC by its clock; lease {str(lease)!r}); "
        f"waiting up to 2 s to see whether that job is alive",
        f"slem-dask encode: warning: took the lease of {str(out)!r} over from slem-dask "
        f"encode (pid 7 on host elsewhere, started 2026-11-29 10:00:00 UTC by its clock; lease {str(lease)!r}): "
        f"its record did not change for 2 s; if that job resumes, it is refused and commits nothing",
    ], done.stderr
    assert main(["verify", str(out)]) == 0


def test_a_stall_line_names_the_store_the_command_writes_first():
    """An encode's stall on a silent object store named its model (read at its start,
    from the same store) while its writes to --out waited (a helper's run)."""
    from types import SimpleNamespace

    from slem_dask.cli.main import _watched_stores

    encode = SimpleNamespace(
        command="encode", model="gs://b/m.zarr", positives="gs://b/p.zarr", out="gs://b/o.zarr"
    )
    assert _watched_stores(encode, None) == ["gs://b/o.zarr", "gs://b/m.zarr", "gs://b/p.zarr"]
    fit = SimpleNamespace(command="fit", negatives="gs://b/n.zarr", model="gs://b/m.zarr")
    assert _watched_stores(fit, None)[0] == "gs://b/m.zarr"
    verify = SimpleNamespace(command="evaluate", database="gs://b/d.zarr")
    assert _watched_stores(verify, None) == ["gs://b/d.zarr"]
