"""storage.nodes.workers.listed_workers: the workers a scheduler lists, asked of the
scheduler itself, never from the client's cache (client.scheduler_info()), which
distributed's periodic refresh overwrites with an identity that lists no worker: under
load, a check of "every worker" then checked none, and a job printed "0 worker(s)"."""

import pytest

from slem_dask.storage.nodes.workers import listed_workers


@pytest.fixture(scope="module")
def seven_workers():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=7, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(7, timeout=60)
        yield client


def test_every_worker_is_listed_whatever_the_clients_cache_holds(seven_workers, monkeypatch):
    client = seven_workers
    # what a refresh landing between scheduler_info()'s fetch and its return leaves
    monkeypatch.setattr(client, "scheduler_info", lambda *a, **k: {"workers": {}})
    listed = listed_workers(client)
    assert len(listed) == 7  # all of them: distributed 2025.4 to 2026.6 cut its list to 5
    assert all(a.startswith("inproc://") and w["nthreads"] == 1 for a, w in listed.items())


def test_a_scheduler_before_distributed_2025_4_lists_them_all():
    calls = []

    class OldScheduler:  # identity() took no arguments, and listed every worker
        @staticmethod
        def identity(**kwargs):
            calls.append(kwargs)
            if kwargs:
                raise TypeError("identity() got an unexpected keyword argument 'n_workers'")
            return {"workers": {"tcp://a:1": {}, "tcp://b:2": {}}}

    class OldClient:
        scheduler = OldScheduler

        def sync(self, function, *args, **kwargs):
            return function(*args, **kwargs)

    assert list(listed_workers(OldClient())) == ["tcp://a:1", "tcp://b:2"]
    assert calls == [{"n_workers": -1}, {}]


def test_the_storage_check_asks_every_worker_whatever_the_cache_holds(
    seven_workers, monkeypatch, tmp_path
):
    import numpy as np
    import zarr

    from slem_dask import storage

    client = seven_workers
    zarr.create_array(store=str(tmp_path / "p.zarr"), shape=(4, 3), dtype="f4")[...] = np.ones(
        (4, 3)
    )
    monkeypatch.setattr(client, "scheduler_info", lambda *a, **k: {"workers": {}})
    run, asked = client.run, []

    def recording_run(function, *args, workers=None, **kwargs):
        asked.extend(workers)
        return run(function, *args, workers=workers, **kwargs)

    monkeypatch.setattr(client, "run", recording_run)
    storage.check_workers_see(client, {"positives": str(tmp_path / "p.zarr")})
    assert sorted(asked) == sorted(listed_workers(client)) and len(asked) == 7


@pytest.mark.parametrize("check", ["stores", "memory"])
def test_the_checks_wait_for_a_worker_on_a_scheduler_that_has_none_yet(
    check, monkeypatch, tmp_path
):
    """A --scheduler started before its workers: the checks of "every worker" checked
    none and passed, and the workers that joined ran the job unchecked."""
    import numpy as np
    import zarr
    from distributed import Client, LocalCluster

    from helpers import one_worker_once_none_listed
    from slem_dask import storage
    from slem_dask.cluster import workers as worker_checks

    path = str(tmp_path / "p.zarr")
    zarr.create_array(store=path, shape=(4, 3), dtype="f4")[...] = np.ones((4, 3))
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        run, asked, listed = client.run, [], listed_workers

        def recording_run(function, *args, workers=None, **kwargs):
            asked.extend(workers or ())
            return run(function, *args, workers=workers, **kwargs)

        monkeypatch.setattr(client, "run", recording_run)
        # the first look finds none; one joins after it
        then_one_worker = one_worker_once_none_listed(cluster, listed)
        monkeypatch.setattr(storage.nodes.workers, "listed_workers", then_one_worker)
        if check == "stores":
            storage.check_workers_see(client, {"positives": path})
        else:
            plan = worker_checks.Plan("encode", "positives", 4, 3, "float32", 1, 0.0, 0, 1)
            worker_checks.check_memory(client, plan, 1)
        assert len(listed(client)) == 1  # returned once the worker had joined
    if check == "stores":
        assert len(set(asked)) == 1  # and that worker was checked
