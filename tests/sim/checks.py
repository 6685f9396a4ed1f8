"""The invariants, checked on the server's state (no faults) after every step.

* the head names an existing, complete version whose node matches its record, and
  so does every version the keep rule keeps;
* a delete never touches an object slem-dask did not write, anything outside the
  store but its lease, a commit record, or a version that the keep rule keeps (at the
  moment of the delete);
* a delete under ``versions/`` touches only a folder that slem-dask provably began (its
  marker or fate file was written, or a record names it);
* version folders under the store (``bound``): at most the kept versions, one draft
  per running writer, and what docs/guarantees-garbage.md allows besides (the drafts of
  writers that ended without committing, until the next collection under the lease;
  drafts claimed for a commit by a job killed before its record); after a last writer
  committed alone, the kept versions and nothing more;
* every job ends in success or one line of an expected kind, and that line is true
  (a commit conflict names another job's commit).
"""

from __future__ import annotations

import contextlib
import json

from slem_dask.storage.versioning import gc
from slem_dask.storage.versioning import versions
from slem_dask.storage.backends.backend import StorageConfigError
from slem_dask.storage.versioning.errors import DamagedStoreError
from slem_dask.storage.versioning.leases import LeaseHeldError, LeaseLostError
from slem_dask.storage.versioning.markers import SharedFolderError
from slem_dask.storage.backends.outcomes import StorageError

from . import jobs
from .server import SimFault

KEEP = versions.KEEP_VERSIONS
PREFIX = jobs.STORE[len("sim://") :]  # the store's full key
LEASE = PREFIX.rsplit("/", 1)[0] + "/." + PREFIX.rsplit("/", 1)[1] + ".slem-dask-lease"
COMMITS = f"{PREFIX}/commits/"
VERSIONS = f"{PREFIX}/versions/"
FATES = f"{PREFIX}/fates/"
#: the probe of conditional writes, created and deleted beside the store
PROBE = PREFIX.rsplit("/", 1)[0] + "/.slem-dask-probe-"


#: the kinds of actor that write drafts (Q's writer: into P's versions/, shared)
WRITING = ("writer", "rollback", "other writer")


class Violation(AssertionError):
    """An invariant broke."""


_NODES: dict = {}  # zarr.json bytes -> its content
_PARSED: dict = {}  # record bytes -> Commit (records are immutable: parse each once)


def records(server, commits: str = COMMITS) -> dict:
    """seq -> Commit, from the server's objects (of the store whose records are under
    ``commits``)."""
    cache = server.__dict__.setdefault("_records", {})
    cached = cache.get(commits)
    if cached and cached[0] == server.record_changes:
        return cached[1]
    out = {}
    if len(_PARSED) > 10000 or len(_NODES) > 10000:
        _PARSED.clear()
        _NODES.clear()
    for key in server.under(commits[:-1]):
        name = key[len(commits) :]
        if "/" in name or not name.endswith(".json") or not name[:-5].isdigit():
            continue
        data = server.objects[key]
        if data not in _PARSED:
            try:
                _PARSED[data] = versions.Commit.from_json(data, key)
            except versions.DamagedCommitError as exc:
                raise Violation(f"a commit record cannot be read: {exc}") from None
        out[int(name[:-5])] = _PARSED[data]
    cache[commits] = (server.record_changes, out)
    return out


def other_stores(server) -> list[str]:
    """The commits/ folders of the stores besides P (``shared`` worlds: Q, whose
    versions/ is P's, through a symlink)."""
    return getattr(server, "others", [])


def kept(recs: dict) -> dict:
    """version folder -> seq, of the versions the keep rule keeps now (the last
    ``KEEP - 1``: what a job that begins writing keeps)."""
    if not recs:
        return {}
    last = max(recs)
    return {recs[s].version: s for s in recs if s > last - (KEEP - 1)}


def judge_delete(server, key: str, actor: str) -> None:
    """Called before the server deletes ``key``: a wrong delete is recorded (and raised
    in the actor), and the run stops after this step."""
    problem = _delete_problem(server, key, actor)
    if problem:
        server.violation = server.violation or problem
        raise Violation(problem)


def _delete_problem(server, key: str, actor: str) -> str | None:
    if server.writers.get(key) == "user":
        return f"{actor} deleted {key!r}, which slem-dask did not write"
    if key == LEASE or key.startswith(PROBE) or key.startswith(FATES):
        return None
    if key.endswith(".tmp") and server.writers.get(key) == "slem-dask":
        return None  # a local write's private file, before or instead of its link
    for commits in other_stores(server):
        other = commits[: -len("/commits/")]
        if key.startswith(other + "/") and not key.startswith(commits):
            return None  # the other store's own lease, fates, probe (its versions are P's)
        if key == f"{other.rsplit('/', 1)[0]}/.{other.rsplit('/', 1)[1]}.slem-dask-lease":
            return None
    if not key.startswith(PREFIX + "/"):
        return f"{actor} deleted {key!r}, outside the store {PREFIX!r}"
    if key.startswith(COMMITS):
        return f"{actor} deleted the commit record {key!r}"
    if key.startswith(VERSIONS):
        name = key[len(VERSIONS) :].split("/", 1)[0]
        folder = name.removesuffix(versions.MARKER)
        recs = records(server)
        seq = kept(recs).get(folder)
        if seq is not None:
            own = ""
            if recs[seq].job.startswith(f"{actor} "):
                sent = [fault for k, fault in _creates(actor) if k.endswith(f"{seq:08d}.json")]
                own = (
                    f": its own commit (its create of the record met "
                    f"{', '.join(f or 'no fault' for f in sent)})"
                )
            return (
                f"{actor} deleted {key!r} of version {seq} ({folder}), which the keep "
                f"rule keeps (the last {KEEP - 1} versions){own}"
            )
        for commits in other_stores(server):
            theirs = kept(records(server, commits)).get(folder)
            if theirs is not None:
                return (
                    f"{actor} deleted {key!r} of version {theirs} ({folder}) of the store "
                    f"{commits[: -len('/commits/')]!r}, which shares this versions/ folder "
                    f"(a symlink), and whose keep rule keeps it"
                )
        if name == folder and not _slem_dasks(server, folder, recs):
            return (
                f"{actor} deleted {key!r} from a folder without slem-dask's marker, "
                f"fate file or commit record"
            )
    return None


def _slem_dasks(server, folder: str, recs: dict) -> bool:
    """Whether slem-dask provably began ``versions/<folder>``: its marker or its fate
    file was written (``server.writers`` remembers every key ever written: a job that
    saw the proof may delete after another job removed it), or a commit record names
    it (a pruned version)."""
    return (
        f"{VERSIONS}{folder}{versions.MARKER}" in server.writers
        or f"{FATES}{folder}" in server.writers
        or any(c.version == folder for c in recs.values())
    )


def _creates(actor: str) -> list:
    from . import world

    return [c for a in world.WORLD.actors if a.name == actor for c in a.creates]


def node_problem(server, commit) -> str | None:
    """Why the version of ``commit`` is not whole and right on the server, or None."""
    folder = f"{VERSIONS}{commit.version}"
    raw = server.objects.get(f"{folder}/zarr.json")
    if raw is None:
        return f"version {commit.seq} ({commit.version}) has no zarr.json"
    if versions._checksum(raw) != commit.checksum:
        return f"version {commit.seq} ({commit.version}): zarr.json does not match its record"
    meta = _NODES.get(raw)
    if meta is None:
        meta = _NODES[raw] = json.loads(raw)
    if not meta["complete"]:
        return f"version {commit.seq} ({commit.version}) is committed incomplete"
    for i in range(meta["n"]):
        if server.objects.get(f"{folder}/c/{i}") != jobs.chunk(meta["content"], i):
            return f"version {commit.seq} ({commit.version}): chunk {i} missing or wrong"
    return None


def version_folders(server) -> set:
    """The names directly under ``versions/``: folders and markers."""
    return {k[len(VERSIONS) :].split("/", 1)[0] for k in server.under(VERSIONS[:-1])}


def check_state(world, running_writers: int = 0, bound: bool = False) -> None:
    server = world.server
    if server.violation:
        raise Violation(server.violation)
    if getattr(world, "_checked", None) == server.mutations:
        return  # nothing changed since the last check
    world._checked = server.mutations
    for commits in other_stores(server):  # their versions lie in P's versions/ folder
        theirs = records(server, commits)
        for seq in kept(theirs).values():
            problem = node_problem(server, theirs[seq])
            if problem:
                raise Violation(f"{commits[: -len('/commits/')]}: a kept version: {problem}")
    recs = records(server)
    for seq in kept(recs).values():
        problem = node_problem(server, recs[seq])
        if problem:
            which = "the head" if seq == max(recs) else "a kept version"
            raise Violation(f"{which}: {problem}")
    if bound:
        _check_drafts(world, running_writers, recs)


def _check_drafts(world, running_writers: int, recs: dict) -> None:
    """docs/guarantees-garbage.md, "The bound": uncommitted drafts (by folder or marker)
    are at most one per running writer, plus the drafts of writers that ended without
    committing (killed, or failed keeping their draft for a resume) since the last
    collection by a lease holder began (the next job that writes deletes them), plus
    the drafts whose fate file says ``commit`` (a job killed between that claim and its
    record: they wait for the next commit)."""
    server = world.server
    named = {c.version for c in recs.values()}
    drafts = {
        f
        for f in versions.VersionedStore.listed_versions(list(version_folders(server)))
        if f not in named
    }
    since = getattr(world, "collected_from", -1)
    left = sum(
        1
        for a in world.actors
        if getattr(a, "kind", None) in WRITING
        and a.done
        and a.outcome[0] != "ok"
        and getattr(a, "ended_at", -1) >= since
    )
    claimed = {f for f in drafts if server.objects.get(f"{FATES}{f}") == gc.COMMIT.encode()}
    if len(drafts - claimed) > running_writers + left:
        raise Violation(
            f"{len(drafts - claimed)} uncommitted draft(s) under the store, more "
            f"than one per running writer ({running_writers}) and one per writer "
            f"that ended without committing since the last collection under the "
            f"lease began ({left}): {sorted(drafts - claimed)}"
        )


@contextlib.contextmanager
def watching_collections(world):
    """Note when each collection by a lease holder (``make_room``) that succeeds began:
    the drafts left before it must be gone after it."""
    real = gc.collect

    def collect(store, keep, mine=None, leased=False):
        start = world.step_no
        removed = real(store, keep, mine=mine, leased=leased)
        if leased:
            world.collected_from = max(getattr(world, "collected_from", -1), start)
        return removed

    gc.collect = collect
    try:
        yield
    finally:
        gc.collect = real


def check_bound(world) -> None:
    """After a job that committed alone: the kept versions under the store, nothing
    more (no draft of a killed or failed run, whatever its sequence number)."""
    server = world.server
    recs = records(server)
    last = max(recs)
    keep = {recs[s].version for s in recs if s > last - KEEP}
    extra = set(versions.VersionedStore.listed_versions(list(version_folders(server)))) - keep
    if extra:
        raise Violation(
            f"after a job committed alone, the store holds {len(extra)} version "
            f"folder(s) besides its {KEEP} kept versions: {sorted(extra)}"
        )


#: the kinds of line a job may end with (the CLI prints the message)
EXPECTED = (
    SimFault,
    StorageError,  # what a backend raises: the kinds of slem_dask/storage/backends/outcomes.py
    versions.CommitConflictError,
    versions.CommitUnknownError,
    gc.DraftFencedError,
    versions.VersionError,
    LeaseHeldError,
    LeaseLostError,
    DamagedStoreError,
    StorageConfigError,
    SharedFolderError,  # a store whose versions/ is a link: refused, one line (item 5)
)


def note_end(world, actor) -> None:
    """As a job ends: the version it committed, if a record names it as the job. A
    thread of a job (its lease's heartbeat) that dies of an error while its job runs
    is a violation: the job's lease then goes stale, and another host fences a live
    job (issue 38, item 3)."""
    actor.ended_at = world.step_no
    state, value = actor.outcome or (None, None)
    if actor.process != actor.name and state == "error" and not isinstance(value, Violation):
        world.server.violation = world.server.violation or (
            f"{actor.name}, a thread of a running job, died of "
            f"{type(value).__name__}: {str(value)[:200]}"
        )
    job = getattr(actor, "job", None)
    if job:
        actor.committed_at_end = next(
            (s for s, c in records(world.server).items() if c.job == job), None
        )


def check_outcome(world, actor, job: str | None = None) -> None:
    """A job ended in success or one true line of an expected kind."""
    state, value = actor.outcome
    if state == "ok" and getattr(actor, "kind", None) == "reader" and value is not None:
        seq, version, _ = value
        record = records(world.server).get(seq)
        if record is None or record.version != version:
            raise Violation(
                f"{actor.name} read version {seq} as {version}, which no commit record names"
            )
    if state != "error":
        return
    exc = value
    if isinstance(exc, (Violation, jobs.TornRead)):
        raise Violation(f"{actor.name}: {exc}")
    rollback_refused = type(exc) is ValueError and "rollback" in actor.name  # no version N
    # a real backend's failures arrive as the outcome kinds (StorageError): a client
    # library's own errors (botocore's, gcsfs's HttpError, azure-core's) are unexpected
    if not isinstance(exc, EXPECTED) and not rollback_refused:
        import traceback

        tb = "".join(traceback.format_exception(exc))
        raise Violation(f"{actor.name} ended with an unexpected {type(exc).__name__}:\n{tb}")
    if isinstance(exc, LeaseHeldError) and getattr(exc, "lease_was", 0) is None:
        raise Violation(
            f"{actor.name} said the store is being written by another job, but "
            f"the lease was free (released while it watched): {exc}"
        )
    text = str(exc)
    if not text or "\n" in text:
        raise Violation(f"{actor.name} ended with a message that is not one line: {text!r}")
    if (
        job
        and getattr(actor, "committed_at_end", None)
        and not isinstance(exc, versions.CommitUnknownError)
    ):  # true either way
        raise Violation(
            f"{actor.name} ended with {type(exc).__name__} ({text}) though its "
            f"commit of version {actor.committed_at_end} was recorded: its "
            f"version is what readers see"
        )
    if isinstance(exc, versions.CommitConflictError) and job:
        seq = int(text.split("version ", 1)[1].split(" ", 1)[0])
        winner = records(world.server).get(seq)
        if winner is not None and winner.job == job:
            raise Violation(
                f"{actor.name} reported version {seq} as committed by another "
                f"job, but the record is its own ({job}): {text}"
            )
