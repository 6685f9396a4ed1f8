"""Hosts made of Linux namespaces, for partition tests (Jepsen-style) on one machine.

Each host is a network namespace (``ip netns``) whose processes also run in their own
mount, UTS and PID namespaces (``unshare``): own ``/tmp`` (a tmpfs), own hostname, own
process ids, and optionally their own clock (libfaketime's ``faketime``). Hosts are
joined by veth pairs to bridges that live in one more namespace, the *switch*, so the
machine's own network is never touched. A partition is a switch port taken down
(``ip link set … down``) and brought back up; this kernel has no netem, so loss and
latency come from tests/faultproxy-style proxies where a test needs them.

Root only (CI runs as root); :func:`unavailable` says why the harness cannot run here.
Every process a :class:`Hosts` starts dies with it (:meth:`Hosts.close`, or the test
process's death: each namespace's first process gets SIGKILL with its parent).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

# what a host's first process runs: own hostname, /tmp and /dev/shm, then the command.
# The paths in $SLEM_KEEP that lie under /tmp (a clone and its venv, say) are bound back
# into the host's own /tmp, through $SLEM_HOST_TMP, a view of the machine's /tmp
_ENTER = (
    'hostname "$SLEM_HOST" && mkdir -p "$SLEM_HOST_TMP" && '
    'mount --bind /tmp "$SLEM_HOST_TMP" && mount -t tmpfs tmpfs /tmp && '
    "mount -t tmpfs tmpfs /dev/shm && "
    'for p in $(echo "$SLEM_KEEP" | tr ":" " "); do case "$p" in /tmp/*) '
    'mkdir -p "$p" && mount --bind "$SLEM_HOST_TMP/${p#/tmp/}" "$p";; esac; done && '
    'exec "$@"'
)
# libfaketime preloaded directly: the `faketime` wrapper names a semaphore after its pid,
# which is 1 in every PID namespace, and one left by a killed host blocks the next
LIBFAKETIME = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
)


def libfaketime() -> str | None:
    return next((path for path in LIBFAKETIME if os.path.exists(path)), None)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns, unshare)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian: iproute2, util-linux)"
    name = f"slemprobe{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns add fails here: {probe.stderr.strip()}"
    try:
        cmd = [
            "ip",
            "netns",
            "exec",
            name,
            "unshare",
            "--mount",
            "--uts",
            "--pid",
            "--fork",
            "--mount-proc",
            "--propagation",
            "private",
            "true",
        ]
        probe = subprocess.run(cmd, capture_output=True, text=True)
        if probe.returncode != 0:
            return f"unshare fails in a network namespace: {probe.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Host:
    name: str
    netns: str
    addresses: dict[str, str]  # network -> this host's address on it
    clock: str | None = None  # a faketime offset such as "+90s", or None
    ports: dict[str, str] = field(default_factory=dict)  # network -> its switch port


class Hosts:
    """A switch with one bridge per network, and hosts plugged into some of them."""

    def __init__(self, networks: dict[str, str]):
        """``networks``: name -> the first three octets of its /24, e.g. {"ctl": "10.213.0"}."""
        self.token = uuid.uuid4().hex[:5]
        self.networks = networks
        self.base = tempfile.mkdtemp(prefix="slem-hosts-", dir="/var/tmp")  # not /tmp:
        # every host mounts its own /tmp over it
        self.switch = f"slem{self.token}sw"
        self.hosts: dict[str, Host] = {}
        self.processes: list[subprocess.Popen] = []
        _ip("netns", "add", self.switch)
        for i in range(len(networks)):
            bridge = f"br{i}"
            _ip("-n", self.switch, "link", "add", bridge, "type", "bridge")
            _ip("-n", self.switch, "link", "set", bridge, "up")

    def add(self, name: str, addresses: dict[str, int], clock: str | None = None) -> Host:
        """A host with address ``<network>.<n>`` on each named network."""
        host = Host(name, f"slem{self.token}{name}", {}, clock)
        _ip("netns", "add", host.netns)
        for net, last in addresses.items():
            i = list(self.networks).index(net)
            port = f"p{len(self.hosts)}n{i}"  # the switch's end
            inner = f"eth{i}"  # the host's end
            _ip(
                "link",
                "add",
                f"{self.token}{port}",
                "netns",
                self.switch,
                "type",
                "veth",
                "peer",
                "name",
                inner,
                "netns",
                host.netns,
            )
            _ip("-n", self.switch, "link", "set", f"{self.token}{port}", "name", port)
            _ip("-n", self.switch, "link", "set", port, "master", f"br{i}", "up")
            address = f"{self.networks[net]}.{last}"
            _ip("-n", host.netns, "addr", "add", f"{address}/24", "dev", inner)
            _ip("-n", host.netns, "link", "set", inner, "up")
            host.addresses[net] = address
            host.ports[net] = port
        _ip("-n", host.netns, "link", "set", "lo", "up")
        self.hosts[name] = host
        return host

    def command(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` as run on host ``name``: its network, its own mount (a tmpfs on /tmp),
        UTS (its hostname) and PID namespaces, its clock."""
        host = self.hosts[name]
        clock = (
            [
                "env",
                f"LD_PRELOAD={libfaketime()}",
                f"FAKETIME={host.clock}",
                "FAKETIME_DONT_RESET=1",
            ]
            if host.clock
            else []
        )
        return [
            "ip",
            "netns",
            "exec",
            host.netns,
            "unshare",
            "--mount",
            "--uts",
            "--pid",
            "--fork",
            "--mount-proc",
            "--propagation",
            "private",
            "sh",
            "-c",
            _ENTER,
            "sh",
            *clock,
            *argv,
        ]

    def start(
        self, name: str, argv: list[str], env: dict | None = None, log: str | None = None, **popen
    ) -> subprocess.Popen:
        """Start ``argv`` on host ``name`` in the background (killed by :meth:`close`)."""
        out = open(log or os.path.join(self.base, f"{name}.log"), "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            self.command(name, argv),
            env=self._env(name, env),
            stdout=popen.pop("stdout", out),
            stderr=popen.pop("stderr", out),
            start_new_session=True,
            preexec_fn=_die_with_parent,
            **popen,
        )
        out.close()
        self.processes.append(proc)
        return proc

    def run(
        self, name: str, argv: list[str], env: dict | None = None, timeout: float = 300, **kw
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` on host ``name`` to its end; stdout and stderr captured as text."""
        return subprocess.run(
            self.command(name, argv),
            env=self._env(name, env),
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=_die_with_parent,
            **kw,
        )

    def _env(self, name: str, env: dict | None) -> dict:
        # what every host must still see: this code, the interpreter's environment
        keep = [
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            sys.prefix,
            sys.base_prefix,
        ]
        return {
            **os.environ,
            **(env or {}),
            "SLEM_HOST": name,
            "SLEM_HOST_TMP": os.path.join(self.base, f"{name}-machine-tmp"),
            "SLEM_KEEP": ":".join(os.path.realpath(p) for p in keep),
        }

    def cut(self, name: str, net: str) -> None:
        """Partition: host ``name`` loses network ``net`` (its switch port goes down)."""
        _ip("-n", self.switch, "link", "set", self.hosts[name].ports[net], "down")

    def heal(self, name: str, net: str) -> None:
        _ip("-n", self.switch, "link", "set", self.hosts[name].ports[net], "up")

    def heal_all(self) -> None:
        for host in self.hosts.values():
            for net in host.ports:
                self.heal(host.name, net)

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.processes:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.switch], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


def _die_with_parent():
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


def python() -> str:
    return sys.executable
