"""Hostile load on the health port, and probes that time themselves like the kubelet's (tests only).

`Load` drives many connections from one thread, each of one kind, the shapes a Pod on the network could
aim at the port (the shipped NetworkPolicy lets every Pod in):
- `pipeline`: sends `GET /metrics` over and over without waiting for answers, and reads them all;
- `no-read`: sends pipelined `GET /metrics` and never reads an answer (a slow reader of a large one);
- `drip`: sends a request head one byte per turn, never finishing it (a slow sender);
- `flood`: connects and sends nothing.
Each connection the server closes is opened again, so the count stays up while the load runs.

`probes_apart` runs the kubelet's probes from a process of their own (`python -m
tests.serving.health_load PORT ROUNDS`), as the kubelet's are.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import selectors
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("pipeline", "no-read", "drip", "flood")
SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: health\r\n\r\n"
DRIP = b"GET /metrics HTTP/1.1\r\nHost: health\r\nX-Padding: " + b"x" * 200
KUBELET_TIMEOUT = 3.0  # timeoutSeconds of the Deployment's liveness and readiness probes
REPO = Path(__file__).resolve().parents[2]


# A probe whose request went out more than this after its connect began was held up between the two by a
# loaded machine (unloaded, both take some 0.1 ms).
LATE_REQUEST = 0.002


class _Probe(http.client.HTTPConnection):
    """An HTTP connection that notes when its connect began and when its request was sent."""

    connecting_at = sent_at = 0.0

    def connect(self) -> None:
        self.connecting_at = time.monotonic()
        super().connect()

    def send(self, data: Any) -> None:
        try:
            super().send(data)
        finally:
            self.sent_at = time.monotonic()


def probe(port: int, path: str, timeout: float = KUBELET_TIMEOUT) -> int:
    """A kubelet HTTP probe: a new connection, one GET, the whole answer within `timeout` seconds.

    The status code, or 0 if the probe failed (refused, reset, or not answered in time).

    A kubelet sends its request as it connects; a process on a loaded machine may be held up between its
    connect and its request, for longer than a flood takes to make its connection the oldest that has sent
    nothing, which the port closes first to make room (a flood's connections send nothing either). Such a
    probe, closed unanswered, is made again, within the same `timeout` from the first connect: a probe
    whose request went out with its connect is never made again, so a port that drops probes still fails."""
    deadline = time.monotonic() + timeout
    while True:
        conn = _Probe("127.0.0.1", port, timeout=max(deadline - time.monotonic(), 0.001))
        try:
            conn.request("GET", path, headers={"User-Agent": "kube-probe/1.30", "Connection": "close"})
            resp = conn.getresponse()
            resp.read()
        except (ConnectionError, http.client.BadStatusLine):  # closed unanswered: reset, or no status line
            if conn.sent_at - conn.connecting_at > LATE_REQUEST and time.monotonic() < deadline:
                continue
            return 0
        except OSError:
            return 0
        finally:
            conn.close()
        return resp.status if time.monotonic() <= deadline else 0


def probes_answered(port: int, rounds: int) -> list[tuple[str, int]]:
    """`rounds` liveness and readiness probes, one after the other: (path, status) of each that failed."""
    failed = []
    for _ in range(rounds):
        for path in ("/healthz", "/readyz"):
            if (status := probe(port, path)) != 200:
                failed.append((path, status))
    return failed


def probes_apart(port: int, rounds: int) -> list[tuple[str, int]]:
    """`probes_answered`, from a process of its own, as the kubelet's probes come: what failed.

    In the test's process a probe shares the GIL with the server's loop and the load's thread, and waits
    for it between its connect and its request (milliseconds, tens of them on a busy machine): under a
    flood that is long enough for its connection to be closed as the oldest one still waiting for its
    client, which a kubelet, sending its request as it connects, never is."""
    argv = [sys.executable, "-m", "tests.serving.health_load", str(port), str(rounds)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, check=True, timeout=rounds * 2 * KUBELET_TIMEOUT + 30)
    return [(path, status) for path, status in json.loads(done.stdout)]


@dataclass(eq=False)
class _Client:
    kind: str
    sock: socket.socket
    sent: int = 0


@dataclass
class Load:
    port: int
    opened: int = 0
    answered_bytes: int = 0
    turns: int = 0  # turns of the load's loop
    _clients: list[_Client] = field(default_factory=list)
    _wanted: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def add(self, kind: str, count: int) -> Load:
        assert kind in KINDS, kind
        self._wanted[kind] = self._wanted.get(kind, 0) + count
        return self

    def __enter__(self) -> Load:
        self._thread = threading.Thread(target=self._run, name="health-load", daemon=True)
        self._thread.start()
        return self

    def settle(self, turns: int = 20, timeout: float = 60.0) -> Load:
        """Wait until every connection has been opened and the load has run `turns` turns."""
        deadline = time.monotonic() + timeout
        while self.turns < turns or self.opened < sum(self._wanted.values()):
            assert time.monotonic() < deadline, f"the load did not settle: {self.opened} connections opened"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _open(self, kind: str, selector: selectors.BaseSelector) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError:
            return
        sock.setblocking(False)
        client = _Client(kind, sock)
        self._clients.append(client)
        self.opened += 1
        events = {"pipeline": selectors.EVENT_READ | selectors.EVENT_WRITE, "no-read": selectors.EVENT_WRITE}
        selector.register(sock, events.get(kind, selectors.EVENT_READ), client)

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            try:
                while not self._stop.is_set():
                    self.turns += 1
                    for kind, count in self._wanted.items():
                        for _ in range(count - sum(c.kind == kind for c in self._clients)):
                            self._open(kind, selector)
                    for key, mask in selector.select(0.02):
                        if not self._step(key.data, mask):
                            selector.unregister(key.fileobj)
                            self._clients.remove(key.data)
                            key.data.sock.close()
                    for client in self._clients:
                        if client.kind == "drip":
                            with contextlib.suppress(OSError):
                                client.sock.send(DRIP[client.sent % len(DRIP) : client.sent % len(DRIP) + 1])
                                client.sent += 1
            finally:
                for client in self._clients:
                    client.sock.close()

    def _step(self, client: _Client, mask: int) -> bool:
        """One turn of one client; False once the server has closed it."""
        try:
            if mask & selectors.EVENT_WRITE:
                client.sent += client.sock.send(SCRAPE * 16)
            if mask & selectors.EVENT_READ:
                data = client.sock.recv(1 << 20)
                if not data:
                    return False
                self.answered_bytes += len(data)
        except BlockingIOError:
            pass
        except OSError:
            return False
        return True


if __name__ == "__main__":  # probes_apart's process: PORT ROUNDS in, the failed probes out as JSON
    print(json.dumps(probes_answered(int(sys.argv[1]), int(sys.argv[2]))))
