"""An encode's partitions computed on the cluster, and computed again when the cluster
lost the model they were sent with.

A model large enough to be scattered (:func:`~..parallel.blocks.scatter_large_arrays`) is
held by the workers alone: when every worker that held it leaves (the only worker killed,
or restarted by its nanny), distributed cancels the compute ("already forgotten"), though
the scheduler is still there. The job then waits for a worker, checks the workers listed
as it did before the first attempt, sends the model again and encodes the partitions not
yet written (the chunks the cancelled attempt finished are whole, with their trailers),
up to :data:`RESCATTERS` times. A worker restarted for its memory is not retried:
``cluster.workers.explain_failures`` says what helps."""

from __future__ import annotations

import warnings
from concurrent.futures import CancelledError

import numpy as np

from .. import storage
from ..cluster import workers
from ..parallel import replicas
from ..parallel.blocks import scatter_large_arrays
from . import common, encode_write
from .common import JobFailed

#: Times an encode sends its model to the workers again after every worker that held
#: it left.
RESCATTERS = 2
#: Seconds an encode that lost its model waits for a worker to come back (a nanny
#: restarts a killed worker within a few seconds; a worker without one never returns).
WORKER_WAIT = 60.0


def encode_partitions(client, model, plan, target, todo: list[int], progress: bool, check, kept):
    """{partition: crc32c} of the partitions ``todo`` of ``plan``, encoded into the draft
    ``target`` on ``client``'s workers (``check()``: that the workers listed see the
    stores, as before the first attempt; ``kept()``: what a failed job leaves)."""
    written: dict[int, int] = {}
    for attempt in range(RESCATTERS + 1):
        restarts = workers.last_memory_event(client)
        lost = _attempt(client, model, plan, target, todo, progress, written, restarts)
        if lost is None:
            return written
        if attempt == RESCATTERS:
            raise JobFailed(
                f"every worker that held the model left while it encoded, {attempt + 1} "
                f"times (killed, or restarted by their nannies), though the scheduler stayed "
                f"up: the workers' logs say why they died (a kill by the kernel's OOM killer "
                f"leaves no nanny event); {kept()}"
            )
        _add_finished(target, todo, written)
        todo = [i for i in todo if i not in written]
        _before_sending_again(client, lost, restarts, check, kept)
        warnings.warn(
            f"the model was lost with every worker that held it (killed or restarted); "
            f"sent again to the workers now listed, {len(todo)} partition(s) left to encode",
            stacklevel=3,
        )
    raise AssertionError("unreachable")  # pragma: no cover - the last attempt returns or raises


def _attempt(client, model, plan, target, todo, progress, written, restarts):
    """Encode ``todo`` once, recording each partition's crc32c in ``written``: None when
    done, the compute's CancelledError when the cluster lost the model; anything else
    is raised."""
    with scatter_large_arrays(client) as scattered:
        graph = encode_write._write_partitions(
            model, plan.arr, target, todo, plan.rows, plan.out_dtype, plan.precision
        )
        try:
            result = common._compute(client, graph, progress)
        except CancelledError as exc:
            if not _model_lost(client, scattered, restarts):
                raise
            return exc
    for index, crc in np.asarray(result).reshape(-1, 2).tolist():
        written[int(index)] = int(crc)
    return None


def _model_lost(client, scattered: list, restarts_before: float) -> bool:
    """Whether a compute was cancelled because the cluster lost the model it was sent
    (and not for a worker's memory, its connection, an interrupt or the watchdog)."""
    return (
        client is not None
        and client.status == "running"
        and replicas.lost(scattered)
        and not workers.memory_events(client, restarts_before)
    )


def _add_finished(target, todo: list[int], written: dict[int, int]) -> None:
    """Add to ``written`` the partitions of ``todo`` that a cancelled attempt wrote whole:
    their chunks end with the crc32c of their bytes."""
    for i in todo:
        if (crc := storage.self_consistent_crc32c(target, i)) is not None:
            written[i] = crc


def _before_sending_again(client, lost: CancelledError, restarts: float, check, kept) -> None:
    """Wait (up to WORKER_WAIT) for a worker, then check the workers listed. A nanny logs
    a memory restart as it restarts its worker: one seen only now is raised as the
    attempt's own failure, for explain_failures. A refusal of the workers (one that
    cannot see the stores) keeps what was written (``kept()``), as a stop does."""
    try:
        client.wait_for_workers(1, timeout=WORKER_WAIT)
    except TimeoutError:
        raise JobFailed(
            f"every worker that held the model left while it encoded, and no worker came "
            f"back within {WORKER_WAIT:g} s (a worker without a nanny is not restarted: "
            f"start one with `dask worker SCHEDULER`); {kept()}"
        ) from None
    if workers.memory_events(client, restarts):
        raise lost
    try:
        check()
    except storage.StorageViewError as exc:
        raise JobFailed(f"{exc}; {kept()}") from None
