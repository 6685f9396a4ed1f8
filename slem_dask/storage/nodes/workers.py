"""What the workers see: before computing, every worker must read the same metadata and
first chunk of each store as the client (a worker without the mount, or started in
another directory with a relative path, would read nothing or something else)."""

from __future__ import annotations

import hashlib


from .checksums import chunk_key, _store_get
from ..versioning.errors import IntegrityError, StorageViewError
from ..backends.paths import canonical


def store_signature(location: str) -> dict:
    """Digest of a store's metadata document and of its first chunk, as seen here."""
    import zarr

    try:
        files = _file_input(location)
        if files is not None:
            return {"files": files.signature()}
        node = zarr.open(store=location, mode="r")
    except Exception as exc:  # noqa: BLE001 - any failure is reported to the client
        return {"error": f"{type(exc).__name__}: {exc}"}
    doc = _store_get(node, f"{node.path}/zarr.json" if node.path else "zarr.json")
    sig: dict[str, str | None] = {"metadata": hashlib.sha256(doc or b"").hexdigest()}
    if isinstance(node, zarr.Array) and node.shape[0]:
        # the first chunk's size and its first and last 64 KiB: enough to tell a missing
        # mount or another file, without reading a whole chunk (37 MB at 20,000 x 512)
        # in the client and every worker before each job
        key = chunk_key(node, (0,) * node.ndim)
        head = _store_get(node, key, head=_SIGNATURE_BYTES)
        tail = _store_get(node, key, suffix=_SIGNATURE_BYTES)
        sig["first_chunk"] = (
            None
            if head is None or tail is None
            else (f"{_store_size(node, key)}:{hashlib.sha256(head + tail).hexdigest()}")
        )
    return sig


_SIGNATURE_BYTES = 2**16


def _file_input(location: str):
    """The file input (.npy, HDF5, TEXMEX) at a local ``location``, else None."""
    from ..formats.formats import file_format, open_file_input

    path = canonical(location)
    if not path.is_local or file_format(path.location) in (None, "unknown"):
        return None
    return open_file_input(path, "input")


def _store_size(arr, key: str) -> int:
    from zarr.core.sync import sync

    return int(sync(arr.store_path.store.getsize(key)))


def _worker_signatures(locations: list[str]) -> list[dict]:
    return [store_signature(loc) for loc in locations]


class WorkerLeftError(IntegrityError):
    """A worker kept failing to answer the checks made before a job (it was leaving)."""


#: Rounds of asking: a worker that leaves while asked is dropped and the others asked again.
_ASK_ROUNDS = 3


def ask_workers(
    client, function, *args, workers: list | None = None, what: str = "the checks before the job"
) -> dict:
    """``client.run(function, *args)`` on ``workers`` (None: every worker, also one that
    joins while they are asked, but during the last round: as one joining after them):
    {address: answer} of the workers that answered. A worker that leaves the cluster
    meanwhile (distributed's "Address removed.", a connection timed out) is dropped; one
    that fails to answer but is still listed is asked again, and after a few rounds the
    job fails in one line. An error raised by ``function`` itself on a worker that is
    still there is raised as it is."""
    from distributed.comm.core import CommClosedError

    answers: dict = {}
    failed: dict = {}
    asked = list(workers) if workers is not None else list(listed_workers(client))
    for _ in range(_ASK_ROUNDS):
        if not asked:
            return answers
        got = client.run(function, *args, workers=asked, on_error="return")
        present = listed_workers(client)
        failed = {}
        for address, value in got.items():
            if not isinstance(value, BaseException):
                answers[address] = value
            elif address in present:  # a worker that left is dropped, whatever its error
                if not isinstance(value, (CommClosedError, OSError, TimeoutError)):
                    raise value
                failed[address] = value
        asked = (
            list(failed) if workers is not None else [a for a in present if a not in answers]
        )  # the failed, and any that joined
    if not failed:  # the last round's all answered (one joining during it: as after it)
        return answers
    address, exc = next(iter(failed.items()))
    raise WorkerLeftError(
        f"worker {address} stopped answering during {what} ({type(exc).__name__}: "
        f"{str(exc).splitlines()[0][:200] if str(exc) else 'no reply'}) while still listed "
        f"by the scheduler, so it is leaving or stuck; the job stopped before its tasks "
        f"ran: run the same command again (it checks the workers that are there then)"
    )


def wait_for_a_worker(client) -> None:
    """Return once the scheduler of ``client`` lists a worker. A check of "every worker"
    on a scheduler whose workers have not connected yet (``--scheduler`` started before
    them) would check none, and the workers that join later would run the job unchecked.
    A job in the command line's watchdog is told, after its stall time, that it waits for
    a worker and how to start one (cluster/stall_text.py)."""
    if not listed_workers(client):
        # a task, not client.wait_for_workers: the watchdog sees it queued and says why it
        # waits, and its --task-timeout cancels it (the wait would not end)
        client.submit(int, pure=False).result()


def listed_workers(client) -> dict[str, dict]:
    """{address: info} of every worker the scheduler of ``client`` lists now, asked of
    the scheduler itself. ``client.scheduler_info()`` returns the client's cache, which
    its periodic refresh (every 2 s, with the details of no worker) can overwrite
    between the call's own fetch and its return: under load it listed 0 of 2 workers
    (distributed 2026.8); and distributed 2025.4 to 2026.6 cut its list to 5 workers."""
    try:
        info = client.sync(client.scheduler.identity, n_workers=-1)
    except TypeError:  # a scheduler before distributed 2025.4: it lists them all
        info = client.sync(client.scheduler.identity)
    return dict(info.get("workers") or {})


def check_workers_see(client, stores: dict[str, object]) -> None:
    """Refuse to compute unless every worker reads the same metadata and first chunk
    as the client for each store (a worker without the mount, or started in
    another directory with a relative path, would read nothing or something else)."""
    if client is None or not stores:
        return
    wait_for_a_worker(client)
    names = list(stores)
    paths = [canonical(stores[n]) for n in names]
    local = [p for p in paths if p.url.startswith("memory://")]
    if local:
        apart = [w for w in listed_workers(client) if not w.startswith("inproc://")]
        if apart:
            raise StorageViewError(
                f"{str(local[0])!r} is a memory:// store: it lives in this process only, "
                f"and worker {apart[0]} is another process; use a path or URL every worker "
                f"can reach (a shared file system, s3://...), or an in-process cluster"
            )
    from ..versioning.versions import resolve

    def read_at(p):  # what is read: a versioned store's head; a draft as it is
        try:
            return resolve(p)[0]
        except ValueError:
            return p.location

    locations = [read_at(p) for p in paths]
    here = _worker_signatures(locations)
    seen = ask_workers(
        client, _worker_signatures, locations, what="the check that every worker sees the stores"
    )
    for worker, sigs in seen.items():
        for name, path, mine, theirs in zip(names, paths, here, sigs, strict=True):
            if theirs != mine:
                what = theirs.get("error") or (
                    "another metadata document"
                    if theirs.get("metadata") != mine.get("metadata")
                    else "another first chunk"
                )
                # a URL reads the same everywhere: what differs is the worker's variables
                fix = (
                    "mount it on that worker, or use a URL (s3://...) all can read"
                    if path.is_local
                    else "the client and every dask worker need the same "
                    "variables (credentials, endpoint): set them where that worker starts"
                )
                raise StorageViewError(
                    f"worker {worker} does not see the {name} {str(path)!r} as this client "
                    f"does ({what}); every worker must reach the same storage at the same "
                    f"path: {fix}"
                )
