"""Clients that hold a server's connections without ever completing a request (tests and benchmarks).

Five kinds, the ones a Pod in the cluster could aim at the webhook:
- `idle-tcp`: connects and sends nothing;
- `idle-tls`: completes the TLS handshake and sends nothing;
- `half-open-tls`: sends the first bytes of a TLS ClientHello, never the rest;
- `header-drip`: after the handshake, sends a request head one byte per `interval`;
- `body-drip`: sends a whole head with `Content-Length: 1000`, then the body one byte per `interval`.

`SlowClients` opens them and, in a background thread, drips a byte on each dripping connection every
`interval` seconds and notices the ones the server closed; with `keep` it opens a new one for each, so
that the count stays up for as long as it runs. Sockets are non-blocking after the handshake, so one
thread drives thousands.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

KINDS = ("idle-tcp", "idle-tls", "half-open-tls", "header-drip", "body-drip")
HEAD = b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: gpupool\r\nContent-Type: application/json\r\n"


@functools.cache  # a new context loads the system's CA certificates: far too slow per connection
def client_hello(server_name: str) -> bytes:
    """The ClientHello a TLS client sends first (made by the ssl module, never sent whole)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    ctx = ssl.create_default_context()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):  # waits for the server's answer: never comes here
        tls.do_handshake()
    return outgoing.read()


@dataclass(eq=False)
class _Held:
    kind: str
    sock: socket.socket
    drip: bytes = b""  # sent one byte per interval, over and over: a head that never ends, a long body
    dripped: int = 0


@dataclass
class SlowClients:
    port: int
    context: ssl.SSLContext  # trusts the server's CA
    server_name: str
    interval: float = 1.0
    keep: bool = False  # replace each connection the server closes
    host: str = "127.0.0.1"
    closed_by_server: int = 0
    failed_to_open: int = 0
    _held: list[_Held] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def open(self, kind: str, count: int) -> None:
        assert kind in KINDS, kind
        for _ in range(count):
            held = self._connect(kind)
            with self._lock:
                if held is None:
                    self.failed_to_open += 1
                else:
                    self._held.append(held)

    def open_counts(self) -> dict[str, int]:
        with self._lock:
            counts = dict.fromkeys(KINDS, 0)
            for held in self._held:
                counts[held.kind] += 1
            return counts

    def _connect(self, kind: str) -> _Held | None:
        try:
            raw = socket.create_connection((self.host, self.port), timeout=30)
            if kind == "idle-tcp":
                sock: socket.socket = raw
            elif kind == "half-open-tls":
                raw.sendall(client_hello(self.server_name)[:20])
                sock = raw
            else:
                sock = self.context.wrap_socket(raw, server_hostname=self.server_name)
        except OSError:  # the server closed it first, or the machine is out of ports: counted by the caller
            return None
        if kind == "body-drip":
            sock.setblocking(True)
            sock.sendall(HEAD + b"Content-Length: 1000\r\n\r\n")
        sock.setblocking(False)
        return _Held(kind, sock, {"header-drip": HEAD, "body-drip": b"x"}.get(kind, b""))

    def __enter__(self) -> SlowClients:
        self._thread = threading.Thread(target=self._run, name="slow-clients", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        with self._lock:
            for held in self._held:
                held.sock.close()
            self._held.clear()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                held = list(self._held)
            gone = [h for h in held if not self._tick(h)]
            with self._lock:
                for h in gone:
                    self._held.remove(h)
                self.closed_by_server += len(gone)
            for h in gone:
                h.sock.close()
            if self.keep:
                for h in gone:
                    self.open(h.kind, 1)

    def _tick(self, held: _Held) -> bool:
        """Drip one byte and look for the server's close; False once it closed the connection."""
        try:
            if held.drip:
                at = held.dripped % len(held.drip)
                held.sock.send(held.drip[at : at + 1])
                held.dripped += 1
            data = held.sock.recv(4096)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return True
        except OSError:  # reset by the server
            return False
        return bool(data)


def wait_closed(sock: socket.socket, timeout: float) -> float:
    """Seconds until the server closes `sock` (EOF or reset); raises TimeoutError after `timeout`."""
    started = time.monotonic()
    sock.settimeout(timeout)
    while True:
        try:
            if not sock.recv(4096):
                break
        except (ConnectionResetError, ssl.SSLEOFError):
            break
    return time.monotonic() - started
