"""Checks made before any cluster starts (issue 18): read-only output folders, the
--task-timeout option and its job-spec key. No cluster is started: the commands are
given an unreachable scheduler, so a check made after connecting would fail on that."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from slem_dask import LinearSLEM
from slem_dask.cli.main import main
from slem_dask.pipeline.jobspec import SpecError, parse_spec

from helpers import can_unshare_mounts

UNREACHABLE = "tcp://127.0.0.1:1"


@pytest.fixture(autouse=True)
def no_scheduler_env(monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)


@pytest.fixture
def inputs(tmp_path):
    rng = np.random.default_rng(3)
    arr = zarr.create_array(
        str(tmp_path / "positives.zarr"), shape=(50, 8), dtype="float32", chunks=(10, 8)
    )
    arr[...] = rng.standard_normal((50, 8)).astype("float32")
    LinearSLEM().fit(rng.standard_normal((40, 8))).save(str(tmp_path / "model.zarr"))
    return tmp_path


def _run_with_read_only(folder: Path, args: list) -> subprocess.CompletedProcess:
    """`slem-dask ARGS` with ``folder`` read-only: a read-only bind mount in a private
    mount namespace (root ignores permission bits), else permission bits."""
    cmd = [sys.executable, "-m", "slem_dask", *map(str, args)]  # not a stale entry script
    if os.geteuid() == 0:
        if not can_unshare_mounts():
            pytest.skip("root needs `unshare --mount` to make a folder read-only")
        cmd = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'mount --bind "{folder}" "{folder}" && mount -o remount,ro,bind "{folder}" '
            f'&& exec "$0" "$@"',
            *cmd,
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    folder.chmod(0o555)
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("command", ["encode", "fit", "run", "export"])
def test_a_read_only_output_folder_is_refused_before_any_cluster_starts(inputs, command):
    ro = inputs / "ro"
    ro.mkdir()
    if command == "encode":
        args = [
            "encode",
            "--model",
            inputs / "model.zarr",
            "--positives",
            inputs / "positives.zarr",
            "--out",
            ro / "codes.zarr",
            "--scheduler",
            UNREACHABLE,
        ]
        key = "--out"
    elif command == "fit":  # folders still to be made: the nearest existing one is checked
        args = [
            "fit",
            "--negatives",
            inputs / "positives.zarr",
            "--model",
            ro / "new" / "model.zarr",
            "--scheduler",
            UNREACHABLE,
        ]
        key = "--model"
    elif command == "run":
        spec = inputs / "job.toml"
        spec.write_text(
            f'[cluster]\nscheduler = "{UNREACHABLE}"\n'
            f'[model]\npath = "{inputs / "model.zarr"}"\n'
            f'[[encode]]\npositives = "{inputs / "positives.zarr"}"\n'
            f'out = "{ro / "codes.zarr"}"\n'
        )
        args, key = ["run", spec], "encode[0].out"
    else:  # no cluster at all: the check comes before anything is written
        args, key = ["export", inputs / "model.zarr", "--to", ro / "copy.zarr"], "--to"
    result = _run_with_read_only(ro, args)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""  # no "dask: ..." line: no cluster was started or joined
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"slem-dask {command}: error: {key} ")
    assert f"the folder '{ro}' is " in lines[0]
    assert "choose an output path in a writable folder" in lines[0]
    assert sorted(p.name for p in ro.iterdir()) == []  # the probe file was removed


def test_writable_folders_pass_and_keep_no_probe_file(tmp_path):
    from slem_dask.cluster.preflight import check_writable

    (tmp_path / "store.zarr").mkdir()  # an existing output is probed inside as well
    check_writable(
        {
            "--out": tmp_path / "store.zarr",
            "--model": tmp_path / "a" / "b.zarr",
            "--plot": None,
            "--other": "s3://bucket/x.zarr",
        }
    )  # URLs are skipped
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["store.zarr"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no procfs at /proc")
@pytest.mark.parametrize(
    "out, folder",
    [
        ("/proc/codes.zarr", "/proc"),
        ("/proc/1/x", "/proc/1"),
        ("/proc/self/a/foo.zarr", "/proc/{pid}"),  # this process's: known when it runs
    ],
)
def test_an_output_under_proc_is_said_to_be_no_storage_without_errno(inputs, capsys, out, folder):
    folder = folder.format(pid=os.getpid())
    # /proc refuses new files with ENOENT: "No such file or directory" of a folder that
    # exists would mislead; the file system's type says why, in one line
    code = main(
        [
            "encode",
            "--model",
            str(inputs / "model.zarr"),
            "--positives",
            str(inputs / "positives.zarr"),
            "--out",
            out,
            "--scheduler",
            UNREACHABLE,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 1 and err == (
        f"slem-dask encode: error: --out {out!r}: the folder {folder!r} is on a proc file "
        f"system, the kernel's view of the system, not storage: it cannot hold a zarr store; "
        f"choose an output path in a regular folder"
    ), err


def test_the_file_system_of_a_folder_is_that_of_its_longest_mount_point(tmp_path):
    from slem_dask.cluster.preflight import _file_system

    table = tmp_path / "mounts"
    table.write_text(
        "/dev/vda / ext4 rw 0 0\nproc /proc proc rw 0 0\nsysfs /sys sysfs rw 0 0\n"
        "none /mnt/my\\040disk tmpfs rw 0 0\n"
    )  # a space as the table writes it
    found = [
        _file_system(p, str(table)) for p in ("/proc/1", "/sys/x", "/system", "/", "/mnt/my disk/a")
    ]
    assert found == ["proc", "sysfs", "ext4", "ext4", "tmpfs"]
    assert _file_system("/proc", str(tmp_path / "none")) is None  # no table: not known


def test_verify_of_a_folder_that_is_no_zarr_store_says_so(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("hi")
    assert main(["verify", str(tmp_path / "notes")]) == 1
    out = capsys.readouterr().out
    assert "is not a zarr store (no 'zarr.json' in it)" in out, out
    assert "not written by slem-dask" not in out


@pytest.mark.parametrize("name", ["x.npy", "x.h5", "x.fvecs"])
def test_verify_of_a_descriptor_file_says_it_is_an_input(tmp_path, capsys, name):
    # a user's own descriptors: verify checks what slem-dask wrote, fit and encode check these
    np.save(tmp_path / "x.npy", np.ones((3, 4), dtype=np.float32))
    if name != "x.npy":
        (tmp_path / "x.npy").rename(tmp_path / name)
    assert main(["verify", str(tmp_path / name)]) == 1
    out = capsys.readouterr().out
    fmt = name[2:].replace("h5", "hdf5")
    headline = f"{tmp_path / name}: descriptor file ({fmt}), not a store that slem-dask wrote:"
    assert out.startswith(headline) and "unknown" not in out, out
    assert "fit and encode check descriptors" in out
    assert "zarr.json" not in out


def test_verify_of_a_path_with_nothing_says_missing_and_what_to_check(tmp_path, capsys):
    assert main(["verify", str(tmp_path / "typo.zarr")]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{tmp_path / 'typo.zarr'}: missing: 1 problem(s)\n"), out
    assert "check the path" in out


def test_task_timeout_option_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["encode", "--model", "m", "--positives", "p", "--out", "o", "--task-timeout", "0"])
    assert exc.value.code == 2
    assert "--task-timeout: expected a finite number > 0" in capsys.readouterr().err


def test_task_timeout_in_the_cluster_table_of_a_spec():
    base = {"model": {"path": "m.zarr"}, "fit": {"negatives": "n.zarr"}}
    spec = parse_spec({**base, "cluster": {"task_timeout": 90}})
    assert spec.cluster.task_timeout == 90.0
    assert parse_spec(base).cluster.task_timeout is None
    for bad in (0, -1, "10", True):
        with pytest.raises(SpecError, match=r"cluster\.task_timeout = .*expected a number > 0"):
            parse_spec({**base, "cluster": {"task_timeout": bad}})
