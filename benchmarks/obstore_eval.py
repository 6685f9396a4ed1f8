"""obstore against the fsspec clients slem-dask uses (s3fs, gcsfs, adlfs), on the test
servers (SeaweedFS, fake-gcs-server, Azurite on 127.0.0.1): whether a create-only put
refuses an existing key, and the time of a small put+get loop.

    PYTHONPATH=.:tests python benchmarks/obstore_eval.py [N]

Prints one line per store and client; docs/object-stores.md records a run.
"""

from __future__ import annotations

import os
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import emulators  # noqa: E402
import s3server  # noqa: E402

PAYLOAD = os.urandom(64 * 1024)


def _obstore(kind, srv):
    from obstore.store import AzureStore, GCSStore, S3Store

    if kind == "s3":
        return S3Store(
            srv.bucket,
            endpoint=srv.endpoint,
            access_key_id=srv.key,
            secret_access_key=srv.secret,
            region="us-east-1",
            client_options={"allow_http": True},
        )
    if kind == "gcs":
        # skip_signature still asks the metadata server for a token: give one
        return GCSStore(
            srv.bucket,
            base_url=srv.endpoint,
            bearer_token="emulator",
            client_options={"allow_http": True},
        )
    return AzureStore(
        srv.bucket,
        account_name=emulators.AZURE_ACCOUNT,
        account_key=emulators.AZURE_KEY,
        endpoint=f"{srv.endpoint}/{emulators.AZURE_ACCOUNT}",
        client_options={"allow_http": True},
    )


def _fsspec(kind, srv):
    import fsspec

    if kind == "s3":
        return fsspec.filesystem(
            "s3",
            endpoint_url=srv.endpoint,
            key=srv.key,
            secret=srv.secret,
            skip_instance_cache=True,
        )
    if kind == "gcs":
        import gcsfs.core

        return gcsfs.core.GCSFileSystem(
            endpoint_url=srv.endpoint, token="anon", skip_instance_cache=True
        )
    return fsspec.filesystem(
        "az", connection_string=srv.connection_string(), skip_instance_cache=True
    )


def obstore_row(kind, srv, n):
    import obstore

    store = _obstore(kind, srv)
    key = f"eval/{uuid.uuid4().hex}"
    obstore.put(store, key, b"first", mode="create")
    try:
        obstore.put(store, key, b"second", mode="create")
        refused = "NO (overwrote)"
    except Exception as exc:  # AlreadyExistsError / PreconditionError
        refused = f"yes ({type(exc).__name__})"
    refused += f", holds {bytes(obstore.get(store, key).bytes())!r}"
    t0 = time.perf_counter()
    for i in range(n):
        obstore.put(store, f"eval/loop/{i}", PAYLOAD)
        assert bytes(obstore.get(store, f"eval/loop/{i}").bytes()) == PAYLOAD
    return refused, time.perf_counter() - t0


def fsspec_row(kind, srv, n):
    fs = _fsspec(kind, srv)
    base = f"{srv.bucket}/eval"
    key = f"{base}/{uuid.uuid4().hex}"
    if kind == "s3":  # s3fs has no create-only put: slem-dask calls aiobotocore itself
        refused = "(slem-dask's own If-None-Match put)"
    else:
        fs.pipe_file(key, b"first", mode="create")
        try:
            fs.pipe_file(key, b"second", mode="create")
            refused = "NO (overwrote)"
        except Exception as exc:
            refused = f"yes ({type(exc).__name__})"
        refused += f", holds {fs.cat_file(key)!r}"
    t0 = time.perf_counter()
    for i in range(n):
        fs.pipe_file(f"{base}/loop/{i}", PAYLOAD)
        assert fs.cat_file(f"{base}/loop/{i}") == PAYLOAD
    return refused, time.perf_counter() - t0


def main(n=200):
    servers = {
        "s3": s3server.start_seaweedfs,
        "gcs": emulators.start_gcs,
        "azure": emulators.start_azurite,
    }
    for kind, start in servers.items():
        srv = start()
        try:
            for name, row in (("obstore", obstore_row), ("fsspec", fsspec_row)):
                try:
                    refused, took = row(kind, srv, n)
                    print(
                        f"{kind:6} {srv.name:16} {name:8} create-only refused: {refused}; "
                        f"{n} put+get of 64 KiB: {took:.2f} s "
                        f"({1000 * took / n:.1f} ms each)",
                        flush=True,
                    )
                except Exception as exc:  # noqa: BLE001 - the evaluation reports it
                    print(
                        f"{kind:6} {srv.name:16} {name:8} FAILED: "
                        f"{type(exc).__name__}: {str(exc)[:300]}",
                        flush=True,
                    )
        finally:
            srv.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
