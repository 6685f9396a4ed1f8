"""The transport under the real backends: one request of a client library (one HTTP
attempt) at a time, on the world's server, under the seed's faults.

The real backend classes (:mod:`slem_dask.storage.backends.s3`, ``gcs``, ``azure``) run
unchanged over fake file systems (:mod:`.clients`, :mod:`.buckets`) that stand where
s3fs, gcsfs and adlfs stand. Each fake makes its library's requests through
:func:`attempt`, retries them as that library does (on the simulated clock), and turns
what an attempt met (:class:`Failure`) into that library's own exception types,
``OSError`` or not. An attempt may meet:

* ``lost_request``: nothing reached the store (a refused connection);
* ``unavailable``: a 5xx, nothing applied (also every request during a *burst*);
* ``lost_reply`` / ``twice``: applied, the connection dropped before the reply (the
  library's retry then races what the first attempt did);
* ``late``: the client times out at once; the request is applied a few steps later;
* ``late_5xx``: the client is answered 5xx; the request is applied a few steps later;
* ``hang``: never answered: the client waits for its own read timeout (the request
  may still land much later); a call of the library that waits, retries included,
  longer than :data:`SILENT_BOUND` on a silent store is a violation (no deadline);
* ``delay``: minutes of simulated time.

The coroutines of the backends and fakes run inline in the calling actor
(:func:`run_inline`, put in place of ``fsspec.asyn.sync``), and their ``asyncio.sleep``
sleeps on the world's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import types

#: the longest a library call may wait on a store that never answers (retries
#: included) before it must give up: "minutes, not hours" (issue 38)
SILENT_BOUND = 600.0
#: seconds a request that "never answers" is treated as unanswered when the client
#: set no deadline at all
FOREVER = 10 * SILENT_BOUND


class Failure(Exception):
    """What one attempt met, before a fake client raises its library's exception:
    ``refused`` (nothing sent), ``unavailable`` (a 5xx), ``reply_lost`` (the connection
    dropped after the request was sent) or ``timeout`` (no answer in time)."""

    def __init__(self, kind: str, op: str, path: str):
        super().__init__(f"{op} {path}: {kind}")
        self.kind, self.op, self.path = kind, op, path


def _draw(world, mutates: bool) -> str | None:
    fault = world.draw_fault(mutates)
    faults, chaos = world.faults, world.chaos and world.current is not None
    if chaos and faults.silence and world.rng.random() < faults.silence:
        world.silent_until = world.now + world.rng.uniform(300.0, 1800.0)
        world.note(f"  the store stops answering until t={world.silent_until:.1f}")
    if chaos and world.now < getattr(world, "silent_until", 0.0):
        return "hang"
    if chaos and faults.burst:
        if world.rng.random() < faults.burst:
            world.burst_until = world.now + world.rng.uniform(20.0, 240.0)
            world.note(f"  503 burst until t={world.burst_until:.1f}")
        if world.now < getattr(world, "burst_until", 0.0):
            return "unavailable"
    if fault == "late_5xx" and not mutates:
        fault = "unavailable"
    return fault


def attempt(world, op: str, path: str, apply, mutates: bool, timeout: float | None):
    """One request: yield to the scheduler, then apply ``apply`` under the fault it
    draws; ``timeout``: the client's read timeout for it (None: none)."""
    world.before_call(f"{op} {path}")
    fault = _draw(world, mutates)
    if fault == "delay":
        world.advance(world.rng.uniform(30, 400))
    elif fault == "lost_request":
        raise Failure("refused", op, path)
    elif fault == "unavailable":
        raise Failure("unavailable", op, path)
    elif fault == "late":
        world.in_flight(_later(world, path, apply))
        raise Failure("timeout", op, path)
    elif fault == "late_5xx":  # an overloaded store: it queued the request, and sheds load
        if world.faults.burst and world.rng.random() < 0.5:
            world.burst_until = world.now + world.rng.uniform(30.0, 120.0)
            world.note(f"  503 burst until t={world.burst_until:.1f}")
        world.in_flight(_later(world, path, apply), most=80)
        raise Failure("unavailable", op, path)
    elif fault == "hang":
        _silence(world, op, path, timeout)
        if mutates and world.rng.random() < 0.5:
            world.in_flight(
                _later(world, path, apply)
            )  # the stopped store resumes, some time, and applies it
        raise Failure("timeout", op, path)
    result = apply()
    if fault in ("lost_reply", "twice"):
        raise Failure("reply_lost", op, path)
    return result


def _later(world, path: str, apply):
    """``apply`` as a request sent now that lands later: unless the store lets a late
    request overtake (``Faults.late_overtakes``), one that finds ``path`` written or
    deleted since it was sent is dropped (the newer request, begun later, stays)."""
    sent = world.server.stamp(path)

    def land():
        if world.faults.late_overtakes or world.server.stamp(path) == sent:
            apply()

    return land


def _silence(world, op: str, path: str, timeout: float | None) -> None:
    """Wait for an answer that never comes: until the client's read timeout, or the
    deadline of the ``sync`` call around it (then fsspec's FSTimeoutError)."""
    wait = FOREVER if timeout is None else timeout
    actor = world.current
    deadline = getattr(actor, "deadline", None) if actor is not None else None
    cut = deadline is not None and world.now + wait > deadline
    if cut:
        wait = max(0.0, deadline - world.now)
    if actor is not None and getattr(actor, "span", None) is not None:
        actor.span[1] += wait
    world.advance(wait)
    if cut:
        from fsspec.exceptions import FSTimeoutError

        raise FSTimeoutError(f"{op} {path}: no answer before the deadline")


@contextlib.contextmanager
def span(world, what: str):
    """One call of a client library, its retries included: if it waited on a store that
    never answered, it must have ended within :data:`SILENT_BOUND`."""
    actor = world.current
    if actor is None or getattr(actor, "span", None) is not None:
        yield
        return
    actor.span = [world.now, 0.0]
    try:
        yield
    finally:
        start, silent = actor.span
        actor.span = None
        took = world.now - start
        if silent and took > SILENT_BOUND:
            world.server.violation = world.server.violation or (
                f"{actor.name}: {what} waited {took:.0f} s on a store that never "
                f"answered ({silent:.0f} s without an answer): no deadline ended it "
                f"within {SILENT_BOUND:.0f} s"
            )


def retrying(world, attempts: int, retryable, backoff, call):
    """``call()`` up to ``attempts`` times, as a client library retries: again after an
    error that ``retryable`` accepts, sleeping ``backoff(i)`` simulated seconds."""
    for i in range(attempts):
        try:
            return call()
        except Exception as exc:
            if i == attempts - 1 or not retryable(exc):
                raise
        world.sleep(backoff(i))
    raise AssertionError("unreachable")  # pragma: no cover


def run_inline(coro):
    """Run a coroutine to its end in the calling actor (every await of the fakes
    completes at once or sleeps on the world's clock)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("a coroutine under the simulation awaited something outside it")


def sync(loop, func, *args, timeout=None, **kwargs):
    """``fsspec.asyn.sync`` under the simulation: inline, in the calling actor; a
    ``timeout`` ends a request that is never answered at that deadline."""
    from . import world as world_module

    actor = world_module.WORLD.current if world_module.WORLD else None
    if timeout is None or actor is None:
        return run_inline(func(*args, **kwargs))
    saved = getattr(actor, "deadline", None)
    actor.deadline = world_module.WORLD.now + timeout
    if saved is not None:
        actor.deadline = min(actor.deadline, saved)
    try:
        return run_inline(func(*args, **kwargs))
    finally:
        actor.deadline = saved


def fake_asyncio(world):
    """The ``asyncio`` module as the backends and client libraries see it: sleeps on
    the world's clock, gathers one awaitable after the other."""

    async def sleep(delay, result=None):
        world.sleep(delay)
        return result

    async def gather(*aws, return_exceptions=False):
        out, aws = [], list(aws)
        for i, aw in enumerate(aws):
            try:
                out.append(await aw)
            except BaseException as exc:  # a Crash too: the others are never sent
                if not return_exceptions or not isinstance(exc, Exception):
                    for rest in aws[i + 1 :]:
                        getattr(rest, "close", lambda: None)()
                    raise
                out.append(exc)
        return out

    module = types.ModuleType("asyncio")
    module.__dict__.update(vars(asyncio))
    module.sleep, module.gather = sleep, gather
    return module
