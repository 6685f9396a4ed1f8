"""An in-memory object store, and a Backend on it that injects faults at every call.

:class:`SimServer` holds the objects (full key -> bytes) and remembers who wrote each
(slem-dask's actors, or the seeded "user" objects that slem-dask must never delete);
every delete is judged when it happens (:func:`checks.judge_delete`).

:class:`SimBackend` is what the protocol code gets from ``backend_for`` during a
simulation. Before every storage call the calling actor yields to the scheduler
(other actors run, time passes, or the actor's process crashes), then the call meets
at most one fault of the run's :class:`Faults`:

* ``lost_request``: not applied; the client sees a connection error;
* ``unavailable``: not applied; the client sees 503 SlowDown;
* ``lost_reply``: applied; the client sees a connection error;
* ``twice``: applied, and applied again by a retry; the client sees the retry's
  answer (a conditional create: False, "it exists");
* ``late``: the client times out, the request stays in flight and is applied a few
  steps later, after calls that the client made since (reordering);
* ``delay``: the call takes minutes of simulated time (leases go stale meanwhile).

``Faults.ignore_conditional`` makes the server ignore ``If-None-Match``: a create
always writes and answers True (issue 30, item 8).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slem_dask.storage.backends.backend import Backend

FAULTS = (
    "lost_request",
    "unavailable",
    "lost_reply",
    "twice",
    "late",
    "delay",
    # appended (a seed of the modes above draws as before): the real clients' transport
    "late_5xx",
    "hang",
)


class SimFault(OSError):
    """An injected failure of a storage call, as the client sees it."""


@dataclass
class Faults:
    """Probability of each fault at one storage call, and of a crash of the calling
    process before it."""

    lost_request: float = 0.0
    unavailable: float = 0.0
    lost_reply: float = 0.0
    twice: float = 0.0
    late: float = 0.0
    delay: float = 0.0
    crash: float = 0.0
    #: the request reaches the server later while the client is answered 503 now
    late_5xx: float = 0.0
    #: the request is never answered: the client waits until its own deadline
    hang: float = 0.0
    #: per call: the store answers every request with 503 for a while (a burst)
    burst: float = 0.0
    #: per call: the store stops answering (SIGSTOP) for 5-30 minutes
    silence: float = 0.0
    #: a request that lands late overwrites what a newer request wrote meanwhile (else,
    #: as a store that orders writes by when they began, the newer one stays)
    late_overtakes: bool = False
    #: local disk: the faults of NFS too (replies lost, requests retransmitted)
    nfs: bool = False
    #: per step: the whole process (its heartbeat thread too) stops for longer than the
    #: lease's TTL (SIGSTOP, a VM paused, a laptop's lid shut)
    pause: float = 0.0
    #: a server that ignores If-None-Match: every create overwrites (issue 30, item 8)
    ignore_conditional: bool = False

    def pick(self, rng) -> str | None:
        x = rng.random()
        for name in FAULTS:
            p = getattr(self, name)
            if x < p:
                return name
            x -= p
        return None


@dataclass
class Deletion:
    key: str
    actor: str
    step: int


@dataclass
class SimServer:
    objects: dict = field(default_factory=dict)  # full key -> bytes
    writers: dict = field(default_factory=dict)  # full key -> "slem-dask" or "user"
    stamps: dict = field(default_factory=dict)  # full key -> writes and deletes of it
    mutations: int = 0
    record_changes: int = 0  # changes under a commits/ folder (for the checks' cache)
    judge: object = None  # called as judge(server, full_key, actor) before a delete
    violation: str | None = None  # the first wrong delete

    def seed_user_object(self, key: str, data: bytes = b"user data") -> None:
        self.objects[key] = data
        self.writers[key] = "user"

    def stamp(self, key: str) -> int:
        """How many times ``key`` was written or deleted (a late request's landing
        compares it with the count when it was sent)."""
        return self.stamps.get(key, 0)

    def write(self, key: str, data: bytes) -> None:
        self.stamps[key] = self.stamps.get(key, 0) + 1
        self.objects[key] = bytes(data)
        self.writers.setdefault(key, "slem-dask")
        self.mutations += 1
        self.record_changes += "/commits/" in key

    def remove(self, key: str, actor: str) -> None:
        if key in self.objects:
            self.stamps[key] = self.stamps.get(key, 0) + 1
            if self.judge is not None:
                self.judge(self, key, actor)
            del self.objects[key]
            self.mutations += 1
            self.record_changes += "/commits/" in key

    def under(self, folder: str) -> list[str]:
        folder = folder.rstrip("/") + "/" if folder else ""
        return sorted(k for k in self.objects if k.startswith(folder))


class SimBackend(Backend):
    """The Backend of one root (``sim://bucket/prefix``) on the world's server."""

    def __init__(self, world, url: str):
        self.world = world
        self.root = url.rstrip("/")
        self._prefix = url[len("sim://") :].strip("/")

    def __repr__(self):
        return f"SimBackend({self.root!r})"

    def _full(self, key: str) -> str:
        return "/".join(p for p in [self._prefix, *key.split("/")] if p)

    @property
    def server(self) -> SimServer:
        return self.world.server

    def _call(self, op: str, key: str, apply, mutates: bool, twice_result=None):
        """One storage request: yield to the scheduler, then apply ``apply`` under the
        fault this call draws."""
        world = self.world
        world.before_call(f"{op} {key}")
        fault = world.draw_fault(mutates)
        if op == "create" and world.current is not None:
            world.current.creates.append((key, fault))  # for the checks' explanations
        if fault == "delay":
            world.advance(world.rng.uniform(30, 400))
        elif fault in ("lost_request", "unavailable"):
            raise SimFault(
                f"{self.root}/{key}: "
                + ("503 SlowDown" if fault == "unavailable" else "connection lost (request)")
            )
        elif fault == "late":
            world.in_flight(apply)
            raise SimFault(f"{self.root}/{key}: read timeout (the request may still arrive)")
        result = apply()
        if fault == "lost_reply":
            raise SimFault(f"{self.root}/{key}: connection lost (reply)")
        if fault == "twice":
            again = apply()
            return twice_result if twice_result is not None else again
        return result

    # -- Backend ----------------------------------------------------------------------

    def read(self, key: str) -> bytes | None:
        full = self._full(key)
        return self._call("read", key, lambda: self.server.objects.get(full), False)

    def create(self, key: str, data: bytes) -> bool:
        """A conditional PUT, resolved as :meth:`S3Backend.create` resolves it: a 412, a
        lost reply, a timeout or a 5xx reads the key back (a call of its own, with its
        own faults): True if it holds exactly ``data``, False if other bytes, and the
        error if it is absent."""
        full = self._full(key)

        def apply():
            if full in self.server.objects and not self.world.faults.ignore_conditional:
                return False
            self.server.write(full, data)
            return True

        try:
            if self._call("create", key, apply, True, twice_result=False):
                return True
        except SimFault:
            held = self.read(key)
            if held is None:
                raise
            return held == data
        held = self.read(key)  # 412: this call's retry, or an earlier call, may have made it
        return held is not None and held == data

    def probe_scope(self) -> str:
        """Conditional writes are a property of the (simulated) bucket."""
        return "bucket sim://" + self._prefix.split("/", 1)[0]

    def put(self, key: str, data: bytes) -> None:
        full = self._full(key)
        self._call("put", key, lambda: self.server.write(full, data), True)

    def _names(self, prefix: str) -> list[str]:
        folder = self._full(prefix)
        folder = folder + "/" if folder else ""
        return sorted(
            {k[len(folder) :].split("/", 1)[0] for k in self.server.objects if k.startswith(folder)}
        )

    def list(self, prefix: str) -> list[str]:
        return self._call("list", prefix, lambda: self._names(prefix), False)

    def exists(self, key: str) -> bool:
        full = self._full(key)
        return self._call(
            "exists",
            key,
            lambda: full in self.server.objects or bool(self.server.under(full)),
            False,
        )

    def delete(self, key: str) -> None:
        full, actor = self._full(key), self.world.actor_name()
        self._call("delete", key, lambda: self.server.remove(full, actor), True)

    def remove_tree(self, prefix: str) -> None:
        """A listing, then one request per object (a crash may stop it part-way)."""
        full = self._full(prefix)
        keys = self._call(
            "list",
            prefix,
            lambda: self.server.under(full) + ([full] if full in self.server.objects else []),
            False,
        )
        self.world.rng.shuffle(keys)
        actor = self.world.actor_name()
        for k in keys:
            shown = k[len(self._prefix) :].strip("/")
            self._call("delete", shown, lambda k=k: self.server.remove(k, actor), True)

    def copy_tree(self, src: str, dst: str, names: list[str] | None = None) -> None:
        src_full, dst_full = self._full(src), self._full(dst)
        if names is None:
            names = self._call(
                "list",
                src,
                lambda: [k[len(src_full) + 1 :] for k in self.server.under(src_full)],
                False,
            )
        for name in names:

            def apply(name=name):
                data = self.server.objects.get(f"{src_full}/{name}")
                if data is None:
                    raise FileNotFoundError(f"{self.root}/{src}/{name}")
                self.server.write(f"{dst_full}/{name}", data)

            self._call("copy", f"{dst}/{name}", apply, True)


class SimListingBackend(SimBackend):
    """A SimBackend whose store lists from a name on (S3's ``StartAfter``): the head is
    then found by one listing from the hint, not by reading records one by one."""

    lists_from_a_name = True

    def list_after(self, prefix: str, start_after: str) -> list[str]:
        return self._call(
            "list_after", prefix, lambda: [n for n in self._names(prefix) if n > start_after], False
        )
