"""The leases this process holds, as objects: whether a job lost its own is known
without a request (:meth:`.leases.Lease.lost`), and the command line's watchdog ends
such a job at once (its pending tasks cancelled): its commit would be refused however
long it ran on. :class:`.leases.Lease` adds itself once it holds the lease, and leaves
as it releases it."""

from __future__ import annotations

import weakref
from typing import Protocol


class Lease(Protocol):
    """What this module asks of a :class:`.leases.Lease` (which imports this module)."""

    def lost(self) -> bool: ...


__all__ = ["OPEN", "open_leases", "lost_lease"]

#: The leases this process holds now (taken, not yet released).
OPEN: weakref.WeakSet[Lease] = weakref.WeakSet()


def open_leases() -> frozenset[Lease]:
    """The leases this process holds now."""
    return frozenset(OPEN)


def lost_lease(besides: frozenset[Lease] = frozenset()) -> Lease | None:
    """A lease this process holds, not one of ``besides`` (those held before a watch
    began: another caller's), for a job that can no longer commit under it; None when
    there is none."""
    return next((lease for lease in list(OPEN - besides) if lease.lost()), None)
