"""Scattered model arrays stay on every worker while a job runs.

A job scatters its large model arrays to every worker (``broadcast=True``) so
that a worker lost mid-job does not take the only copy with it: scattered
data, unlike a task's result, cannot be computed again. Distributed's Active
Memory Manager undoes that: its ReduceReplicas policy (on by default, every
2 s) drops every replica of a key but those that waiting tasks need, and
distributed documents ``broadcast=True`` as incompatible with it. A worker
killed after such a cycle held the one copy: the job failed with "lost
scattered data" (tests/cluster/test_local_cluster.py, under load).

:func:`protect` replaces the scheduler's ReduceReplicas policy by one that
makes the same suggestions except for keys named ``slem-dask-shared-...``
(what :func:`slem_dask.parallel.blocks.shared` scatters): other data keep
distributed's behaviour. The policy is defined on the scheduler by the
function sent there, so the scheduler needs no slem-dask installed.

:func:`scatter_everywhere` sends an array straight to a worker when this process can
reach the workers, instead of through the scheduler: one hop fewer for 256 MiB at
d = 8192.
"""

from __future__ import annotations

import ipaddress

__all__ = ["PREFIX", "lost", "protect", "scatter_everywhere", "workers_are_local"]

#: Keys of the arrays slem-dask scatters; the policy spares exactly these.
PREFIX = "slem-dask-shared-"


def _installer():
    prefix = PREFIX

    def install(dask_scheduler) -> str:
        amm = dask_scheduler.extensions.get("amm")
        if amm is None:
            return "no active memory manager"
        from distributed.active_memory_manager import ReduceReplicas

        if any(type(p).__name__ == "SpareSlemDaskReplicas" for p in amm.policies):
            return "installed before"

        class SpareSlemDaskReplicas(ReduceReplicas):
            """ReduceReplicas, except for slem-dask's scattered arrays."""

            def run(self):
                suggestions = super().run()
                answer = None
                while True:
                    try:
                        suggestion = suggestions.send(answer)
                    except StopIteration:
                        return
                    key = suggestion.ts.key
                    if isinstance(key, str) and key.startswith(prefix):
                        answer = None  # never enacted: the key keeps its replicas
                        continue
                    answer = yield suggestion

        replaced = [p for p in amm.policies if type(p) is ReduceReplicas]
        for policy in replaced:
            amm.policies.discard(policy)
            amm.add_policy(SpareSlemDaskReplicas())
        return f"replaced {len(replaced)} ReduceReplicas policy"

    return install


def protect(client) -> None:
    """Make the scheduler of ``client`` keep every replica of slem-dask's scattered
    arrays (idempotent; best effort: a scheduler that refuses leaves distributed's
    behaviour, and a worker lost mid-job may then take a model's last copy)."""
    try:
        client.run_on_scheduler(_installer())
    except Exception:  # noqa: BLE001 - e.g. a scheduler that forbids run_on_scheduler
        pass


def scatter_everywhere(client, key: str, value):
    """Scatter ``value`` under ``key`` to every worker of ``client``; return its future.

    Directly (to one worker, then worker to worker) when the client may reach the
    workers: as it was told (``Client(direct_to_workers=...)``), else when every worker
    is local (:func:`workers_are_local`, a LocalCluster). Otherwise through the
    scheduler, which receives the whole array once more before the first worker does:
    on a LocalCluster at d = 8192 (256 MiB) that made the scatter 3.2-4.0 s, against
    1.2-2.7 s directly (docs/benchmarks.md, issue 42's fifth pass). A remote client may not reach
    workers behind a gateway or another network, so it goes through the scheduler."""
    direct = client.direct_to_workers
    if direct is None:
        direct = workers_are_local(client.nthreads())
    return client.scatter({key: value}, broadcast=True, direct=bool(direct))[key]


def lost(futures) -> bool:
    """Whether one of these scattered arrays is gone from the cluster: every worker that
    held it left (the only worker killed, or restarted by its nanny), and distributed
    cancelled it and every task that needs it (it cannot compute scattered data again)."""
    return any(f.status in ("cancelled", "lost", "error") for f in futures)


def workers_are_local(addresses) -> bool:
    """Whether every one of these worker addresses is in this process (``inproc://``)
    or on this machine's loopback interface; False for none."""
    from distributed.comm.addressing import get_address_host, parse_address

    def local(address: str) -> bool:
        scheme, _ = parse_address(address)
        if scheme == "inproc":
            return True
        try:
            host = get_address_host(address)
            return host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:  # a host name, or an address this process cannot parse
            return False

    addresses = list(addresses)
    return bool(addresses) and all(local(a) for a in addresses)
