"""A seeded scheduler of actors on a simulated clock, and the patches that run the
real protocol code on it.

Each actor is a greenlet; only the one the scheduler resumes runs, until its next
storage call (``before_call``) or sleep: every interleaving is decided by the seed,
so a seed replays exactly. A *process* is one job with the threads it starts (a
lease's heartbeat): a crash kills them together, between two storage calls, with no
clean-up reaching storage (as SIGKILL would).

Lease code reads the clock of this world: ``time.monotonic`` and ``time.sleep`` in
:mod:`slem_dask.storage.versioning.leases`, its threads and events (and ``making_room``'s thread
in :mod:`slem_dask.storage.versioning.versions`), and its host identity (each
process a host of its own, so liveness is judged by watching the lease, as between
hosts). Draft and lease tokens come from the seed.
"""

from __future__ import annotations

import contextlib
import os
import random
import time as _time
import types

from greenlet import getcurrent, greenlet

from slem_dask.storage.backends import backend as backend_module
from slem_dask.storage.versioning import heads
from slem_dask.storage.versioning import leases
from slem_dask.storage.backends import local_deadline
from slem_dask.storage.versioning import versions

from . import backends
from .server import Faults, SimServer


class Crash(BaseException):
    """The calling process was killed (not an error any code should handle)."""


class Livelock(AssertionError):
    pass


class Actor:
    def __init__(self, world, name: str, process: str, fn, crashable: bool):
        self.world, self.name, self.process, self.fn = world, name, process, fn
        self.crashable = crashable
        self.wake = world.now
        self.wake_reason = None  # "call" or "sleep" once it waits: where a crash may hit
        self.paused_until = 0.0  # its process is stopped (SIGSTOP) until then
        self.done = False
        self.dead = False
        self.outcome = None  # ("ok", value) | ("error", exc) | ("crash", None)
        self.creates: list = []  # (key, fault) of each conditional create it sent
        self.glet = greenlet(self._run, parent=world.main)

    def _run(self, _cmd=None):
        try:
            if _cmd == "crash":
                raise Crash()
            self.outcome = ("ok", self.fn())
        except Crash:
            self.outcome = ("crash", None)
        except BaseException as exc:  # noqa: BLE001 - the job's end, judged by checks
            self.outcome = ("error", exc)
        finally:
            self.done = True
            if self.world.on_end:
                self.world.on_end(self.world, self)
            if self.world.tracing:
                state, value = self.outcome or ("?", None)
                self.world.note(f"{self.name} ends: {state} {value!r}"[:300])
            if self.world.process_ends_with(self):
                self.world.kill_process(self.process)


class World:
    """One seed's run: server, actors, clock, faults."""

    MAX_STEPS = 20000

    def __init__(self, seed: int, faults: Faults, backend: str = "sim"):
        self.seed = seed
        self.backend_kind = backend  # backends.KINDS: what the protocol code writes to
        self.rng = random.Random(seed)
        self.faults = faults
        if backend == "local":
            from .disk import make_server

            self.server = make_server(self)
        else:
            self.server = SimServer()
        self.now = 1000.0
        self.step_no = 0
        self.actors: list[Actor] = []
        self.main = getcurrent()
        self.current: Actor | None = None
        self.chaos = True  # faults and crashes on; off for the re-runs
        self.pending: list = []  # requests in flight: [steps left, apply]
        self.after_step = None
        self.on_end = None  # called with each actor that ends, as it ends
        self.tracing = False
        self.trace: list[str] = []

    # actors ------------------------------------------------------------------------
    def spawn(self, name: str, fn, process: str | None = None, crashable: bool = True):
        actor = Actor(self, name, process or name, fn, crashable)
        self.actors.append(actor)
        return actor

    def actor_name(self) -> str:
        return self.current.name if self.current else "harness"

    def process_ends_with(self, actor: Actor) -> bool:
        return actor.process == actor.name  # a job's end ends its process (its threads)

    def kill_process(self, process: str) -> None:
        for a in self.actors:
            if a.process == process and not a.done:
                a.dead = True
                a.wake = self.now

    def run(self) -> None:
        """Run every actor to its end, one step at a time, checking after each."""
        while True:
            live = [a for a in self.actors if not a.done]
            if not live:
                break
            ready = [a for a in live if a.wake <= self.now]
            if not ready:
                self.now = min(a.wake for a in live)
                continue
            actor = self.rng.choice(ready)
            if self._pauses(actor):
                continue
            crash = actor.dead or (
                self.chaos
                and actor.crashable
                and actor.wake_reason
                and self.rng.random() < self.faults.crash
            )
            if crash:
                self.note(f"{actor.process} killed before {actor.wake_reason}")
                self.kill_process(actor.process)
            self._resume(actor, "crash" if crash else "go")
            self.step_no += 1
            if self.step_no > self.MAX_STEPS:
                raise Livelock(f"no end after {self.MAX_STEPS} steps")
            self._land_in_flight()
            self.now += self.rng.uniform(0.0, 2.0)
            if self.after_step:
                self.after_step(self)
        while self.pending:  # what is still in flight arrives
            self._land_in_flight(force=True)
            if self.after_step:
                self.after_step(self)

    def _pauses(self, actor: Actor) -> bool:
        """Whether the process of ``actor`` stops now, every thread of it, for longer
        than a lease's TTL (a fault of ``Faults.pause``)."""
        if not (self.chaos and self.faults.pause and actor.crashable and actor.wake_reason):
            return False
        if self.rng.random() >= self.faults.pause:
            return False
        until = self.now + self.rng.uniform(150.0, 600.0)
        self.note(f"{actor.process} paused until t={until:.1f}")
        for a in self.actors:
            if a.process == actor.process and not a.done:
                a.paused_until = until
                a.wake = max(a.wake, until)
        return True

    def _resume(self, actor: Actor, cmd: str) -> None:
        self.current = actor
        try:
            actor.glet.switch(cmd)
        finally:
            self.current = None

    def _land_in_flight(self, force: bool = False) -> None:
        for item in list(self.pending):
            item[0] -= 1
            if item[0] <= 0 or force:
                self.pending.remove(item)
                try:
                    item[1]()
                except Exception:  # noqa: BLE001, S110 - a late request that fails is lost
                    pass
                sender = item[2] if len(item) > 2 else None  # a test may queue its own
                if sender is not None and sender.done:  # for storage, its job ran until now:
                    sender.ended_at = self.step_no  # its draft counts as left from here
                if force:
                    return

    # called from actors ----------------------------------------------------------------
    def _yield(self, wake: float, reason: str) -> None:
        actor = self.current
        if actor is None:  # the harness itself (checks, set-up): no scheduling
            return
        if actor.dead:
            raise Crash()
        actor.wake, actor.wake_reason = wake, reason
        cmd = self.main.switch()
        self.current = actor
        if cmd == "crash" or actor.dead:
            actor.dead = True
            raise Crash()

    def note(self, what: str) -> None:
        if self.tracing:
            self.trace.append(f"{self.step_no:5d} t={self.now:8.1f} {what}")

    def before_call(self, what: str) -> None:
        self._yield(self.now, "call")
        if self.tracing:
            self.note(f"{self.current.name}: {what}")

    def draw_fault(self, mutates: bool) -> str | None:
        if not self.chaos or self.current is None:
            return None
        fault = self.faults.pick(self.rng)
        if fault == "late" and not mutates:
            fault = "lost_reply"
        if fault and self.tracing:
            self.note(f"  fault: {fault}")
        return fault

    def in_flight(self, apply, most: int = 12) -> None:
        """``apply`` lands after 1 to ``most`` steps."""
        self.pending.append([self.rng.randint(1, most), apply, self.current])

    def advance(self, seconds: float) -> None:
        """The current call takes ``seconds``: its actor sleeps that long."""
        self._yield(self.now + seconds, "sleep")

    def sleep(self, seconds: float) -> None:
        self._yield(self.now + max(0.0, seconds), "sleep")

    def pid(self) -> int:
        """The calling process's pid: one per process of the world."""
        process = self.current.process if self.current else "harness"
        names = list(dict.fromkeys(a.process for a in self.actors))
        return 1000 + (names.index(process) if process in names else len(names))

    def monotonic(self) -> float:
        return self.now

    def token(self, n: int = 32) -> str:
        return f"{self.rng.getrandbits(4 * n):0{n}x}"


class SimEvent:
    """threading.Event on the world's clock."""

    def __init__(self):
        self._set = False

    def set(self):
        self._set = True
        for a in WORLD.actors:
            if getattr(a, "waiting_on", None) is self:
                a.wake = min(a.wake, max(WORLD.now, a.paused_until))

    def clear(self):
        self._set = False

    def is_set(self):
        return self._set

    def wait(self, timeout=None):
        actor = WORLD.current
        if self._set or actor is None:
            return self._set
        actor.waiting_on = self
        try:
            WORLD.sleep(1e9 if timeout is None else timeout)
        finally:
            actor.waiting_on = None
        return self._set


class SimThread:
    """threading.Thread as an actor of the calling process (it dies with it)."""

    def __init__(self, target=None, daemon=None, name=None, args=(), kwargs=None):
        self.target, self.args, self.kwargs = target, args, kwargs or {}
        self.name = name or "thread"
        self.actor = None

    def start(self):
        owner = WORLD.current
        process = owner.process if owner else "harness"
        self.actor = WORLD.spawn(
            f"{process}/{self.name}", lambda: self.target(*self.args, **self.kwargs), process
        )

    def join(self, timeout=None):
        end = WORLD.now + (1e9 if timeout is None else timeout)
        while self.actor and not self.actor.done and WORLD.now < end:
            WORLD.sleep(0.5)

    def is_alive(self):
        return bool(self.actor and not self.actor.done)


WORLD: World | None = None


def _uuid4():
    return types.SimpleNamespace(hex=WORLD.token())


def _answer_inline(look, seconds: float, failed=None):
    """``deadlines.answer_within`` in this thread, on the world's clock."""
    try:
        return look()
    except Exception:  # noqa: BLE001 - as answer_within: the store could not say
        return failed


def _patches(world: World) -> dict:
    """What :func:`simulated` puts in place: (module, name) -> the world's."""

    def backend_for(url):
        return backends.backend_for(world, url)

    def clock(*_):  # records show the simulated time: a seed's run is the same bytes
        return _time.gmtime(world.now)

    fake_time = types.SimpleNamespace(
        monotonic=world.monotonic,
        sleep=world.sleep,
        time=world.monotonic,
        strftime=_time.strftime,
        localtime=clock,
        gmtime=clock,
    )
    fake_os = types.SimpleNamespace(
        getpid=world.pid, kill=os.kill, readlink=os.readlink, environ=os.environ
    )
    patches = {
        (versions, "backend_for"): backend_for,
        (leases, "backend_for"): backend_for,
        (leases, "time"): fake_time,
        (versions, "time"): fake_time,
        (leases, "os"): fake_os,
        (leases, "threading"): types.SimpleNamespace(Thread=SimThread, Event=SimEvent),
        (versions, "threading"): types.SimpleNamespace(Thread=SimThread),
        (leases, "host_identity"): lambda: {
            "host": WORLD.current.process if WORLD.current else "harness",
            "boot": "sim",
            "pid_ns": "sim",
        },
        (leases, "_process_start"): lambda pid: "sim",
        (leases, "_process_stopped"): lambda pid: False,  # not this machine's processes
        (leases, "uuid"): types.SimpleNamespace(uuid4=_uuid4),
        (versions, "uuid"): types.SimpleNamespace(uuid4=_uuid4),
        (leases, "LEASE_TTL"): 120.0,
        (leases, "LEASE_HEARTBEAT"): 30.0,
        # each seed probes the bucket's conditional writes afresh (once per world)
        (backend_module, "_PROBED"): set(),
        # the leases each simulated process holds, per world (none left by a killed one)
        (leases, "_HELD_HERE"): set(),
        # one OS thread: a greenlet that waits on a held threading.Lock deadlocks
        (backend_module, "_PROBE_LOCK"): contextlib.nullcontext(),
        (backend_module, "uuid"): types.SimpleNamespace(uuid4=_uuid4),
        # local disk's calls in this thread, on the world's clock (greenlets: one OS
        # thread); a deadline's own test blocks a real call (tests/storage/test_interrupts)
        (local_deadline, "call_within"): lambda function, seconds, what: function(),
        # likewise a failed job's last look at its store (its requests have their own,
        # simulated, deadlines)
        (leases, "answer_within"): _answer_inline,
        # the heads this process saw (a listing's starting point): none, per world,
        # else a seed's calls depend on the seeds run before it
        (heads, "_HEAD_SEEN"): {},
    }
    return patches


@contextlib.contextmanager
def simulated(world: World):
    """Run the protocol code on ``world``: its storage, clock, threads and tokens."""
    global WORLD
    WORLD = world

    patches = _patches(world)
    saved = {target: getattr(*target) for target in patches}
    for (module, name), value in patches.items():
        setattr(module, name, value)
    try:
        with backends.clients(world):
            yield world
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)
        WORLD = None
        if getattr(world, "tmp", None) is not None:
            world.tmp.cleanup()
