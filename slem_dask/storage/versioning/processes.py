"""Where a pid means something, and what its process is doing: the facts a lease record
carries about its owner, and what an observer on the same host reads in ``/proc``."""

from __future__ import annotations

import os
import socket

__all__ = ["host_identity", "process_start", "process_stopped", "process_group", "where"]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def host_identity() -> dict:
    """Where a pid means something: host name, boot and PID namespace. Two processes
    may compare pids only when all three agree (a container on the same host name, or
    a host rebooted since, has other pids)."""
    ns = None
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pass
    return {
        "host": socket.gethostname(),
        "boot": _read("/proc/sys/kernel/random/boot_id"),
        "pid_ns": ns,
    }


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (state first)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot): a reused pid has another."""
    fields = _stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 else None


def process_stopped(pid: int) -> bool:
    """Whether process ``pid`` of this namespace is stopped (SIGSTOP, a debugger)."""
    fields = _stat_fields(pid)
    return fields is not None and bool(fields) and fields[0] in ("T", "t")


def process_group(pid: int) -> int | None:
    """The process group of ``pid`` (a job's local worker processes share it), or None."""
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def where(record: dict, me: dict) -> str:
    """Where the owner named by a lease ``record`` runs, as words, seen from ``me``
    (:func:`host_identity`): its pid means nothing here unless host, boot and PID
    namespace all agree, so it is never shown bare when they do not (a container's
    pid 1 is not the host's init)."""
    pid, host = record.get("pid"), record.get("host")
    if host != me.get("host"):
        return f"pid {pid} on host {host}"
    if record.get("boot") != me.get("boot"):
        return f"pid {pid} on host {host} before its last reboot"
    if record.get("pid_ns") != me.get("pid_ns"):
        return f"pid {pid} of another PID namespace (a container) on host {host}"
    return f"pid {pid} on host {host}"
