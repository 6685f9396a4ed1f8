"""A long history in one world: round after round of writers under faults (killed,
failed, fenced), each round closed by a writer alone without faults. Storage beside
the versions must stay bounded (issue 38): ``fates/`` holds no fate file of a draft
more than ``FATE_HORIZON + 1`` numbers below the head once a writer committed alone, and
``commits/`` holds one record per committed number and the head hint, nothing more.

Replay one seed::

    PYTHONPATH=.:tests python -c "from sim import history; history.long_history(3, 'crash')"
"""

from __future__ import annotations

import json

from slem_dask.storage.versioning import gc
from slem_dask.storage.versioning import versions
from slem_dask.storage.versioning.records import private_copy_of

from . import checks, jobs
from .run import MODES, SeedFailed, USER_OBJECTS
from .world import Livelock, World, simulated

#: fate files may stay for drafts this many numbers below the head (the horizon the
#: garbage collector compacts at; gc.FATE_HORIZON where it says)
FATE_HORIZON = getattr(gc, "FATE_HORIZON", 8)


def _lease_copies(server, alone: str) -> list:
    """The private copies of the store's lease beside it (local disk: ``<lease>.<32
    hex>.tmp``) but those of the writer alone, whose heartbeat may be cut as its job
    ends: the next job that takes the lease deletes them."""
    lease = jobs.lease_key(jobs.STORE)
    copies = []
    for key in sorted(k for k in server.objects if private_copy_of(k) == lease):
        try:
            with open(server.path(key), "rb") as f:  # the file as it is now
                record = json.loads(f.read())
        except (OSError, ValueError):
            record = None
        if not (isinstance(record, dict) and record.get("job") == alone):
            copies.append(key)
    return copies


def check_history_bound(world, alone: str = "") -> None:
    """fates/ and commits/ after a writer committed alone (see the module docstring),
    and no private copy of the lease beside the store but the job ``alone``'s."""
    server = world.server
    recs = checks.records(server)
    head = max(recs)
    fates = [k[len(checks.FATES) :] for k in server.under(checks.FATES[:-1])]
    # the last collection ran before the head's commit: through head - 1 - FATE_HORIZON
    stale = sorted(f for f in fates if _fate_seq(f) < head - FATE_HORIZON)
    if stale:
        raise checks.Violation(
            f"fates/ holds {len(fates)} files after {head} commits, {len(stale)} of them "
            f"for drafts more than {FATE_HORIZON + 1} numbers below the head ({stale[0]}...): "
            f"it grows with every draft that never committed, without bound"
        )
    copies = _lease_copies(server, alone)
    if copies:
        raise checks.Violation(
            f"beside the store, {len(copies)} private copies of its lease stay after a "
            f"writer took it alone ({copies[0]}...): one more per job killed while writing it"
        )
    records = {f"{seq:08d}.json" for seq in recs} | {".head"}
    extra = sorted(
        k[len(checks.COMMITS) :]
        for k in server.under(checks.COMMITS[:-1])
        if k[len(checks.COMMITS) :] not in records and server.writers.get(k) != "user"
    )
    if extra or len(recs) != head:
        raise checks.Violation(
            f"commits/ holds more than one record per committed number and the head "
            f"hint after {head} commits: {extra[:3] or sorted(recs)[:3]}"
        )


def _fate_seq(name: str) -> int:
    """The number of the draft whose fate file ``name`` is, or whose fate file's private
    copy (a local write killed before its link: judged by the same bound); 0 for any
    other name (always stale)."""
    target = private_copy_of(name) or name
    return versions.draft_seq(target) or 0


def _round(world, r: int) -> None:
    rng = world.rng
    for i in range(rng.randint(1, 3)):
        writer = rng.choice([jobs.writer_encode, jobs.writer_group])
        job, n = f"round{r} writer{i} run 0", rng.randint(1, 3)
        actor = world.spawn(
            f"round{r} writer{i}", lambda w=writer, j=job, n=n, c=f"R{r}W{i}": w(c, n, j)
        )
        actor.wake = world.now + rng.uniform(0, 30)
        actor.job, actor.kind = job, "writer"
    world.run()
    for actor in world.actors:
        if getattr(actor, "kind", None) and not getattr(actor, "judged", False):
            actor.judged = True
            checks.check_outcome(world, actor, actor.job)
    chaos, world.chaos = world.chaos, False
    try:
        last = world.spawn(f"round{r} alone", lambda: jobs.writer_group(f"L{r}", 1, f"alone {r}"))
        world.run()
    finally:
        world.chaos = chaos
    if last.outcome[0] != "ok":
        raise checks.Violation(f"a writer alone, without faults, failed: {last.outcome[1]!r}")
    checks.check_state(world, 0, False)
    check_history_bound(world, f"alone {r}")


def long_history(seed: int, mode: str, backend: str = "sim", rounds: int = 30) -> World:
    """``rounds`` rounds on one store; raise SeedFailed naming the seed."""
    world = World(seed, MODES[mode], backend)
    try:
        with simulated(world), checks.watching_collections(world):
            for key in USER_OBJECTS:
                world.server.seed_user_object(key)
            world.server.judge = checks.judge_delete
            world.on_end = checks.note_end
            world.after_step = lambda w: checks.check_state(w, 3, False)
            for r in range(rounds):
                _round(world, r)
    except (checks.Violation, Livelock) as exc:
        raise SeedFailed(
            f"seed {seed}, mode {mode}, backend {backend}, a long history: {exc}\n  replay: "
            f'PYTHONPATH=.:tests python -c "from sim import history; '
            f"history.long_history({seed}, '{mode}', '{backend}')\""
        ) from None
    return world
