"""A fault-injecting HTTP proxy on 127.0.0.1, between an object store's client (S3, GCS,
Azure) and a real server or emulator (tests/s3server.py, tests/emulators.py), for the
jobs' fault tests (docs/testing-faults.md).

Each request is read whole and matched against the rules; the first rule that
matches and still fires decides what happens to it:

* ``lost_reply``: forwarded, the server answers, the answer is dropped and the client's
  connection closed (the server applied it; the client cannot know);
* ``lost_request``: dropped unforwarded, the connection closed;
* ``drop``: the connection closed before the request's body is read;
* ``unavailable``: answered ``503 SlowDown`` without forwarding;
* ``delay``: forwarded after ``delay`` seconds;
* ``late``: the client's connection closed at once, the request forwarded ``delay``
  seconds later (it lands after the client gave up on it: a late create);
* ``silent``: a black hole: the request is read and never answered, its connection
  held open (a stopped store, whose kernel still accepts connections) until
  :meth:`FaultProxy.resume` or the proxy's end closes it.

What a rule matches: ``kind`` ``commit`` (keys under ``commits/``), ``lease`` (the
``.slem-dask-lease`` files), ``chunk`` (zarr chunk keys ``…/c/…``) or ``any``, in the
object's name wherever the request carries it (the path; GCS's ``name=`` parameter or
its upload's metadata); the
HTTP ``methods``; ``once_per_key`` (the first such request for each key only, so
that the client's retry gets through); ``limit`` (how many times in all). Every
firing is recorded in :attr:`FaultProxy.fired` (method, path, action).

    with FaultProxy("http://127.0.0.1:8333") as proxy:
        proxy.rules = [Rule("commit", "lost_reply", methods={"PUT"}, once_per_key=True)]
        ... AWS_ENDPOINT_URL=proxy.endpoint ...
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

KINDS = {
    "commit": re.compile(r"/commits/\d+\.json$"),
    "lease": re.compile(r"\.slem-dask-lease$"),
    "chunk": re.compile(r"/c(/\d+)+$"),
    "any": re.compile(r""),
}
ACTIONS = ("lost_reply", "lost_request", "drop", "unavailable", "delay", "late", "silent")
_BEFORE_BODY = ("drop",)  # decided on the head alone
_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class Rule:
    kind: str
    action: str
    methods: set | None = None  # None: every method
    once_per_key: bool = False
    limit: int | None = None
    delay: float = 0.0
    fired: int = 0
    _keys: set = field(default_factory=set)

    def __post_init__(self):
        if self.kind not in KINDS or self.action not in ACTIONS:
            raise ValueError(f"rule: kind in {sorted(KINDS)}, action in {ACTIONS}")

    def take(self, method: str, names: list[str]) -> bool:
        """Whether this rule fires for a request for the objects ``names`` (and count it)."""
        if self.methods and method not in self.methods:
            return False
        path = next((n for n in names if KINDS[self.kind].search(n)), None)
        if path is None:
            return False
        if self.limit is not None and self.fired >= self.limit:
            return False
        if self.once_per_key:
            if (method, path) in self._keys:
                return False
            self._keys.add((method, path))
        self.fired += 1
        return True


class _Closed(Exception):
    pass


def _read_head(stream) -> tuple[bytes, list[tuple[str, str]]] | None:
    line = stream.readline(65537)
    if not line:
        return None
    headers = []
    while True:
        h = stream.readline(65537)
        if not h:
            raise _Closed()
        if h in (b"\r\n", b"\n"):
            break
        name, _, value = h.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    return line, headers


def _header(headers, name: str) -> str | None:
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def _read_body(stream, headers, until_close: bool = False) -> bytes:
    """The body's bytes as sent (chunked encoding kept as it is)."""
    if (_header(headers, "transfer-encoding") or "").lower() == "chunked":
        out = []
        while True:
            size_line = stream.readline(65537)
            if not size_line:
                raise _Closed()
            out.append(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    t = stream.readline(65537)
                    out.append(t)
                    if t in (b"\r\n", b"\n", b""):
                        return b"".join(out)
            out.append(stream.read(size + 2))
    length = _header(headers, "content-length")
    if length is not None:
        return stream.read(int(length))
    return stream.read() if until_close else b""


def _names(target: str, body: bytes = b"") -> list[str]:
    """The object names a request carries: its path, GCS's ``name`` parameter, and the
    ``name`` of a GCS multipart upload's metadata (each decoded, with a leading /)."""
    parts = urlsplit(target)
    names = [unquote(parts.path)]
    names += ["/" + n for n in parse_qs(parts.query).get("name", [])]
    if body.startswith(b"--") and b'"name"' in body[:4096]:  # multipart/related metadata
        for line in body[:4096].split(b"\n"):
            try:
                meta = json.loads(line)
            except ValueError:
                continue
            if isinstance(meta, dict) and isinstance(meta.get("name"), str):
                names.append("/" + meta["name"])
    return names


def _head_bytes(line: bytes, headers) -> bytes:
    return line + b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers) + b"\r\n"


class FaultProxy:
    """A proxy on 127.0.0.1 (a free port) to ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port or 80)
        self.rules: list[Rule] = []
        self.fired: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: set = set()
        self._held: set = set()  # connections of black-holed requests

    def __enter__(self) -> FaultProxy:
        thread = threading.Thread(target=self._accept, name="faultproxy", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def resume(self) -> None:
        """End the black hole: the held connections are closed (their clients have given
        up by their deadlines) and rules no longer apply: the store answers again."""
        with self._lock:
            self.rules = []
            held, self._held = list(self._held), set()
        for conn in held:
            _close(conn)

    def close(self) -> None:
        self._stop.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            _close(conn)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(client)
            threading.Thread(
                target=self._serve, args=(client,), daemon=True, name="faultproxy-conn"
            ).start()

    def _rule_for(self, method: str, names: list[str], before_body: bool) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if (rule.action in _BEFORE_BODY) != before_body:
                    continue
                if rule.take(method, names):
                    self.fired.append((method, names[0], rule.action))
                    return rule
        return None

    def _hold(self, client: socket.socket) -> None:
        """Answer nothing: wait until :meth:`resume` or :meth:`close` closes the socket."""
        with self._lock:
            self._held.add(client)
        try:
            while client.recv(65536):
                pass  # a client that sends more is not answered either
        except OSError:
            pass

    def _forward_late(self, head: bytes, body: bytes, delay: float) -> None:
        def later():
            time.sleep(delay)
            try:
                with socket.create_connection(self.upstream) as upstream:
                    upstream.sendall(head + body)
                    upstream.settimeout(30)
                    upstream.recv(65536)  # the server's answer, dropped
            except OSError:
                pass

        threading.Thread(target=later, daemon=True, name="faultproxy-late").start()

    def _without_upstream(self, rule, client, head: bytes, body: bytes, method: str):
        """Apply a rule that does not forward the request now: "close" (the client's
        connection is to be closed), "answered" (503), or None (forward it)."""
        action = rule.action if rule is not None else None
        if action == "lost_request":
            return "close"
        if action == "silent":
            self._hold(client)
            return "close"
        if action == "late":
            self._forward_late(head, body, rule.delay)
            return "close"
        if action == "unavailable":
            client.sendall(
                _head_bytes(
                    b"HTTP/1.1 503 Slow Down\r\n",
                    [
                        ("Content-Type", "application/xml"),
                        ("Content-Length", str(len(_SLOW_DOWN))),
                    ],
                )
                + (b"" if method == "HEAD" else _SLOW_DOWN)  # a HEAD's answer has no body
            )
            return "answered"
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        cin = client.makefile("rb")
        try:
            while not self._stop.is_set():
                head = _read_head(cin)
                if head is None:
                    return
                line, headers = head
                method, target = line.decode("latin-1").split(" ", 2)[:2]
                if self._rule_for(method, _names(target), before_body=True) is not None:
                    return  # drop: closed before the body is read
                if (_header(headers, "expect") or "").lower() == "100-continue":
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    headers = [(k, v) for k, v in headers if k.lower() != "expect"]
                body = _read_body(cin, headers)
                rule = self._rule_for(method, _names(target, body), before_body=False)
                done = self._without_upstream(
                    rule, client, _head_bytes(line, headers), body, method
                )
                if done == "close":
                    return
                if done == "answered":
                    continue
                if rule is not None and rule.action == "delay":
                    time.sleep(rule.delay)
                if upstream is None:
                    upstream = socket.create_connection(self.upstream)
                    uin = upstream.makefile("rb")
                upstream.sendall(_head_bytes(line, headers) + body)
                status_line, rheaders = _read_head(uin) or (None, None)
                if status_line is None:
                    return
                status = int(status_line.split()[1])
                close = (_header(rheaders, "connection") or "").lower() == "close"
                no_body = method == "HEAD" or status in (204, 304) or status < 200
                rbody = b"" if no_body else _read_body(uin, rheaders, until_close=close)
                if rule is not None and rule.action == "lost_reply":
                    return
                client.sendall(_head_bytes(status_line, rheaders) + rbody)
                if close:
                    return
        except (_Closed, OSError, ValueError, IndexError):
            return
        finally:
            _close(client)
            if upstream is not None:
                _close(upstream)
            with self._lock:
                self._conns.discard(client)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
