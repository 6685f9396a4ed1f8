"""Helpers for tests that reach inside versioned stores (slem_dask.storage.versioning.versions)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import zarr

from slem_dask.storage.versioning import leases, versions

# tests/, where the support modules and scripts live (the test files sit in sub-folders
# mirroring the package), and the repository's root
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def script_pythonpath() -> str:
    """PYTHONPATH for a support script run by path (_slow_job.py...): tests/, then the
    slem_dask this process tests (not whichever one the interpreter has installed)."""
    import slem_dask

    return os.pathsep.join([str(TESTS), str(Path(slem_dask.__file__).resolve().parents[1])])


def head(path) -> Path:
    """The folder of the head version of the versioned store at ``path``."""
    store = versions.VersionedStore(str(path))
    return Path(store.location(store.head().version))


def recommit(path) -> None:
    """Re-record the head version's metadata checksum after a test edited it: what a
    writer that committed bad metadata would have left (to test the checks behind the
    commit record's)."""
    store = versions.VersionedStore(str(path))
    commit = store.head()
    data = (head(path) / "zarr.json").read_bytes()
    fields = {k: getattr(commit, k) for k in commit.__dataclass_fields__}
    fields["checksum"] = versions._checksum(data)
    store.backend.put(f"commits/{commit.seq:08d}.json", versions.Commit(**fields).to_json())


def zarr_rows(path, data, chunks: int = 40) -> str:
    """``data`` as a plain zarr array of ``chunks``-row chunks at ``path``; its path."""
    arr = zarr.create_array(
        store=str(path),
        shape=data.shape,
        dtype=data.dtype,
        chunks=(chunks, data.shape[1]),
        overwrite=True,
    )
    arr[...] = data
    return str(path)


def small_corpus(tmp_path, seed: int, d: int = 8) -> dict:
    """Negatives (300 rows), two sets of positives (200 rows each) as plain zarr arrays,
    and a linear model fitted on the negatives, in ``tmp_path``."""
    from slem_dask import LinearSLEM

    rng = np.random.default_rng(seed)
    neg, pos, other = (rng.standard_normal((n, d)).astype("float32") for n in (300, 200, 200))
    LinearSLEM(lam=0.1).fit(neg).save(str(tmp_path / "model.zarr"))
    return {
        "dir": tmp_path,
        "model": str(tmp_path / "model.zarr"),
        "neg": neg,
        "pos": pos,
        "other": other,
        "negatives": zarr_rows(tmp_path / "neg.zarr", neg),
        "positives": zarr_rows(tmp_path / "pos.zarr", pos),
        "others": zarr_rows(tmp_path / "other.zarr", other),
    }


def can_unshare_mounts() -> bool:
    """Whether this process may make a mount namespace of its own (root, unshare(1))."""
    import subprocess

    try:
        return (
            subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "true"],
                capture_output=True,
                timeout=10,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_cli(capsys, *args):
    """Run the command line in-process, as given: (exit code, stdout, stderr); an
    argparse error's SystemExit is its exit code."""
    from slem_dask.cli.main import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def cli(capsys, scheduler: str, *args):
    """(exit code, stdout, stderr) of the command line, in-process, on ``scheduler``."""
    from slem_dask.cli.main import main

    code = main([*map(str, args), "--scheduler", scheduler, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def encode_corpus(corpus: dict, out, positives=None, **kw):
    """Encode ``positives`` (the corpus's own by default) with the corpus's model into
    ``out``, 40 rows a partition; the job's report."""
    from slem_dask import pipeline

    return pipeline.encode_job(
        None, corpus["model"], positives or corpus["positives"], str(out), partition_rows=40, **kw
    )


def encode_command(corpus: dict, out, *extra) -> list:
    """The arguments of `slem-dask encode` of the corpus's positives with its model into
    ``out``, then ``extra`` (encode_corpus's 40-row partitions: "--partition-rows", 40)."""
    return [
        "encode",
        "--model",
        corpus["model"],
        "--positives",
        corpus["positives"],
        "--out",
        out,
        *extra,
    ]


def expected_encoding(corpus: dict, rows=None) -> np.ndarray:
    """What encode_corpus writes for ``rows`` (the corpus's positives by default): the
    model's float32 transform, one product per partition of 40 rows."""
    from reference import partitionwise
    from slem_dask import load_model

    model = load_model(corpus["model"])
    return partitionwise(
        lambda p: model.transform(p, dtype="float32"), corpus["pos"] if rows is None else rows, 40
    )


def assert_same_kernel_fit(got, ref) -> None:
    """Two fitted KernelSLEMs from the same pivoting (streaming against in-memory, say):
    the same pivots, every factor statistic equal to rounding."""
    np.testing.assert_array_equal(got.pivots_, ref.pivots_)
    for name in ("pivot_factor_", "factor_mean_", "factor_scatter_", "g_factor_"):
        np.testing.assert_allclose(
            getattr(got, name), getattr(ref, name), rtol=1e-8, atol=1e-12, err_msg=name
        )


def scheduler_address(sched_file: Path, timeout: float = 60.0) -> str:
    """The address a ``dask scheduler --scheduler-file`` wrote, once the file is whole:
    dask writes it in place, so under load a reader can find it existing but empty or
    half written (a JSONDecodeError in one of 20 runs with both cores busy)."""
    import json
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            return json.loads(Path(sched_file).read_text())["address"]
        except (FileNotFoundError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no scheduler address in {sched_file} after {timeout:.0f} s"
                ) from None
            time.sleep(0.1)


# -- `dask scheduler` and `dask worker` processes on 127.0.0.1, for the cluster tests


def start_dask(args, prefix=(), **popen):
    """`dask ARGS` of this interpreter's environment, started in a session of its own
    (a signal to the test's group does not reach it) with its output discarded;
    ``prefix``: a command that runs it (in another mount namespace, say)."""
    import subprocess
    import sys

    return subprocess.Popen(
        [*prefix, str(Path(sys.executable).parent / "dask"), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        **popen,
    )


def start_local_scheduler(sched_file: Path, *extra, **popen):
    """A `dask scheduler` on 127.0.0.1 (a free port, no dashboard; ``extra`` arguments)
    that writes its address to ``sched_file`` (an earlier scheduler's file is removed
    first): (process, address); stopped again if its address does not come."""
    Path(sched_file).unlink(missing_ok=True)
    scheduler = start_dask(
        [
            "scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--no-dashboard",
            "--scheduler-file",
            str(sched_file),
            *extra,
        ],
        **popen,
    )
    try:
        return scheduler, scheduler_address(sched_file)
    except BaseException:
        scheduler.kill()
        scheduler.wait()
        raise


def local_worker_args(address: str, name: str, *extra) -> list:
    """The arguments of `dask` for a single-threaded worker ``name`` on 127.0.0.1 that
    joins the scheduler at ``address`` (no dashboard), then ``extra``."""
    return [
        "worker",
        address,
        "--nthreads",
        "1",
        "--no-dashboard",
        "--host",
        "127.0.0.1",
        "--name",
        name,
        *extra,
    ]


def wait_for_workers(address: str, n: int) -> dict:
    """{name: address} of the workers of the scheduler at ``address``, once ``n`` joined."""
    from distributed import Client

    from slem_dask.storage.nodes.workers import listed_workers

    with Client(address) as client:
        client.wait_for_workers(n, timeout=60)
        return {w["name"]: a for a, w in listed_workers(client).items()}


def one_worker_once_none_listed(cluster, listed):
    """``listed`` (``storage.listed_workers``) that, whenever it finds no worker, has the
    in-process ``cluster`` start one: whatever looks first (a start line, a check) sees
    none, and a worker joins after it, with no timer to race."""

    def listed_then_one(client):
        found = listed(client)
        if not found:
            cluster.scale(1)
        return found

    return listed_then_one


def foreign_lease(target, **fields):
    """A lease on ``target`` as a job of another host holds it (``fields``: what its
    record says besides): this host can only watch it, and takes it over after a TTL
    of silence."""
    lease = leases.Lease(target, "a job elsewhere")
    record = {
        **lease._record(),
        "pid_ns": "pid:[1]",
        "host": "other-host",
        "started": "2031-01-01 00:00:00 UTC",
        **fields,
    }
    lease._backend.create(lease._key, json.dumps(record).encode())
    return lease
