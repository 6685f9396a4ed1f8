"""Real fit, encode, search and rollback jobs against SeaweedFS through a proxy on
127.0.0.1 that loses replies and requests, drops connections, answers 503 and delays,
on commit, lease and chunk requests (tests/faultproxy.py, docs/testing-faults.md).

Each job ends in success or one line; the same command then succeeds without the
fault; afterwards every store verifies, its head is the version its record names, and
the results are the ones computed without faults.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import zarr
from conftest import _forget_s3_clients
from faultproxy import FaultProxy, Rule

from slem_dask import storage
from slem_dask.cli.main import main
from slem_dask.pipeline.evaluate import open_search_result
from slem_dask.storage import versions

D = 8


@pytest.fixture
def proxy(seaweedfs_server, monkeypatch):
    """SeaweedFS behind a fault proxy: the S3 variables name the proxy."""
    with FaultProxy(seaweedfs_server.endpoint) as proxy:
        for name in (
            "AWS_PROFILE",
            "AWS_DEFAULT_PROFILE",
            "AWS_SESSION_TOKEN",
            "AWS_ENDPOINT_URL_S3",
            "AWS_REGION",
        ):
            monkeypatch.delenv(name, raising=False)
        for name, value in seaweedfs_server.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        _forget_s3_clients()
        proxy.bucket = seaweedfs_server.bucket
        yield proxy
    _forget_s3_clients()


def _inputs(root: str) -> dict:
    rng = np.random.default_rng(5)
    data = {
        name: rng.standard_normal((160, D)).astype("float32") for name in ("neg", "pos", "other")
    }
    for name, rows in data.items():
        arr = zarr.create_array(
            store=f"{root}/{name}.zarr",
            shape=rows.shape,
            dtype=rows.dtype,
            chunks=(40, D),
            config={"write_empty_chunks": True},
        )
        arr[...] = rows
    return data


def _run(command: list, capsys) -> tuple[int, str]:
    code = main(
        [*command, "--local-cluster", "threads", "--no-progress"]
        if command[0] != "rollback"
        else command
    )
    return code, capsys.readouterr().err


def _commands(root: str) -> list:
    model, out, hits = f"{root}/model.zarr", f"{root}/out.zarr", f"{root}/hits.zarr"
    return [
        ["fit", "--negatives", f"{root}/neg.zarr", "--model", model, "--lam", "0.1"],
        [
            "encode",
            "--model",
            model,
            "--positives",
            f"{root}/other.zarr",
            "--out",
            out,
            "--partition-rows",
            "40",
        ],
        ["search", "--queries", out, "--database", out, "--k", "3", "--out", hits],
        [
            "encode",
            "--model",
            model,
            "--positives",
            f"{root}/pos.zarr",
            "--out",
            out,
            "--partition-rows",
            "40",
            "--overwrite",
        ],
        ["rollback", out, "--to", "1"],
    ]


FAULTS = {
    "commit-lost-reply": Rule("commit", "lost_reply", {"PUT"}, once_per_key=True),
    "commit-lost-request": Rule("commit", "lost_request", {"PUT"}, once_per_key=True),
    "commit-503": Rule("commit", "unavailable", {"PUT"}, once_per_key=True),
    "commit-dropped": Rule("commit", "drop", {"PUT"}, once_per_key=True),
    "commit-read-lost-reply": Rule("commit", "lost_reply", {"GET"}, once_per_key=True),
    "lease-lost-reply": Rule("lease", "lost_reply", {"PUT"}, once_per_key=True),
    "lease-503": Rule("lease", "unavailable", None, limit=6),
    "lease-delete-lost": Rule("lease", "lost_request", {"DELETE"}, once_per_key=True),
    "chunk-lost-reply": Rule("chunk", "lost_reply", {"PUT"}, once_per_key=True),
    "chunk-read-dropped": Rule("chunk", "drop", {"GET"}, once_per_key=True),
    "chunk-503": Rule("chunk", "unavailable", None, limit=20),
    "delays": Rule("any", "delay", None, limit=40, delay=0.05),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_jobs_through_the_fault_proxy_keep_every_invariant(proxy, fault, capsys):
    root = f"s3://{proxy.bucket}/fp-{uuid.uuid4().hex[:8]}"
    data = _inputs(root)
    rule = Rule(**{k: v for k, v in vars(FAULTS[fault]).items() if k not in ("fired", "_keys")})
    failures = []
    for command in _commands(root):
        proxy.rules = [rule]
        code, err = _run(command, capsys)
        proxy.rules = []
        if code != 0:  # one line, then the same command succeeds
            assert len(err.strip().splitlines()) == 1, err
            failures.append(err.strip())
            code, err = _run(command, capsys)
            assert code == 0, (
                f"{command[0]} run again without the fault failed: {err} "
                f"(its first run: {failures[-1]}; proxy: {proxy.fired})"
            )
    assert rule.fired > 0, f"the fault {fault} never fired"
    _check_stores(root, data)
    print(f"{fault}: fired {rule.fired} times; jobs that failed first: {failures}")


def _check_stores(root: str, data: dict) -> None:
    from slem_dask import load_model

    for name in ("model.zarr", "out.zarr", "hits.zarr"):
        path = f"{root}/{name}"
        assert storage.verify(path)[1] == [], storage.verify(path)
        store = versions.VersionedStore(path)
        head = store.head()
        store.check(head)  # the head's folder is there and matches its record
        for commit in store.commits()[-(versions.KEEP_VERSIONS - 1) :]:
            store.check(commit)  # kept versions readable
    model = load_model(f"{root}/model.zarr")
    encoded = storage.read_all(f"{root}/out.zarr")  # rolled back to version 1: "other"
    np.testing.assert_allclose(
        encoded, model.transform(data["other"], dtype="float32"), rtol=1e-5, atol=1e-6
    )
    _, indices = open_search_result(f"{root}/hits.zarr")
    assert indices.shape == (len(data["other"]), 3)
