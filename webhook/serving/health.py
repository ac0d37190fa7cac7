"""The plain-HTTP health port: /healthz, /readyz and /metrics, served by the gunicorn master.

The master outlives its workers and sees all of them, so it answers probes and scrapes; the TLS port
stays for admissions only, and a scrape never competes with an admission for a worker thread. What
"ready" means and what the metrics are come in as callables, so this module knows nothing of gunicorn
or prometheus_client.

The number of threads is fixed, whatever the clients do. One thread runs a selector loop that does all
the socket work without blocking: it accepts, reads requests, enforces the deadlines and writes the
answers. /readyz and /metrics call out (they read the workers' metrics files), so they run on a small
pool of threads; /healthz and the errors are answered by the loop itself, so a slow scrape never delays
a liveness probe. An idle or slow connection costs a socket, not a thread, and is bounded:

- a request must arrive whole within `request_timeout` of its first byte (of the connection, for the
  first request), and its answer must be taken by the client within `request_timeout` too;
- a kept-alive connection may wait `idle_timeout` for its next request;
- past `max_connections`, the connection that has waited longest for a request is closed to make room,
  so a new probe is always let in.

Everything goes to the log as records (JSON lines under webhook.serving.logs); a client that goes away, at any
point, is a debug line.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import queue
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

import orjson

log = logging.getLogger("gpupool.health")

JSON = "application/json"
MAX_HEAD = 16 * 1024  # a probe's request is a few hundred bytes
ACCEPT_BURST = 64  # connections accepted per loop turn, so a flood cannot keep the loop from the others
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_PAUSE = 0.5  # out of descriptors and nothing to close: stop accepting this long instead of spinning
SERVES = "this port serves GET and HEAD of /healthz, /readyz and /metrics"
_HEAD_END = re.compile(rb"\r?\n\r?\n")


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MetricsText:
    body: bytes
    content_type: str


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: str
    line: str  # the request line, for the log
    keep_alive: bool
    http10: bool


@dataclass(frozen=True, slots=True)
class _Answer:
    code: int
    body: bytes
    content_type: str = JSON


def _error(code: int, message: str) -> _Answer:
    return _Answer(code, orjson.dumps({"error": message}))


# A request line that cannot be read: answered, then the connection is closed.
_UNREADABLE = _Request("GET", "", "-", keep_alive=False, http10=False)


class _Conn:
    """One client connection: reading a request, waiting for the pool (`busy`) or writing (`out`)."""

    __slots__ = ("busy", "closed", "deadline", "events", "idle", "inbuf", "keep_alive", "out", "peer", "since", "sock")

    def __init__(self, sock: socket.socket, peer: str, now: float, deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.out: memoryview | None = None
        self.busy = False
        self.closed = False
        self.keep_alive = False
        self.idle = False  # between requests on a kept-alive connection (a fresh one is mid-request)
        self.events = 0  # what the selector watches for: 0 (not registered), EVENT_READ or EVENT_WRITE
        self.since = now  # when it last had something done; eviction picks the oldest
        self.deadline = deadline

    @property
    def waiting(self) -> bool:
        """Waiting for the client (nothing of ours in flight), so it may be closed to make room."""
        return not self.busy and self.out is None


class HealthServer:
    """Binds at construction (so a busy port fails before gunicorn starts); serves after `start()`."""

    def __init__(
        self,
        host: str,
        port: int,
        readiness: Callable[[], Readiness],
        metrics: Callable[[], MetricsText],
        *,
        threads: int = 2,
        request_timeout: float = 5.0,
        idle_timeout: float = 65.0,  # longer than a 60 s scrape interval, so a scraper keeps its connection
        max_connections: int = 64,
    ) -> None:
        self._readiness = readiness
        self._metrics = metrics
        self._pool_size = threads
        self._request_timeout = request_timeout
        self._idle_timeout = idle_timeout
        self._max_connections = max_connections
        self._listener = _listen(host, port)
        self._conns: dict[int, _Conn] = {}  # by file descriptor
        self._jobs: queue.SimpleQueue[tuple[_Conn, _Request] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[_Conn, _Request, _Answer]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._accept_paused_until = 0.0
        self._threads: list[threading.Thread] = []
        # Made in start(), not here: nothing to leak if `serve` refuses to start after binding.
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def start(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._threads = [threading.Thread(target=self._serve, name="gpupool-health", daemon=True)]
        self._threads += [
            threading.Thread(target=self._work, name=f"gpupool-health-{i}", daemon=True) for i in range(self._pool_size)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake()
        for _ in self._threads[1:]:
            self._jobs.put(None)
        # A pool thread stuck in a callable is a daemon and may be left behind; the loop closes the sockets.
        deadline = time.monotonic() + 5
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if not self._threads or not self._threads[0].is_alive():
            for sock in (self._wake_r, self._wake_w, self._listener):
                if sock is not None:
                    sock.close()

    # --- the loop thread -------------------------------------------------------------------------------

    def _serve(self) -> None:
        assert self._selector is not None
        try:
            while not self._stopping.is_set():
                for key, mask in self._selector.select(self._timeout()):
                    self._dispatch(key, mask)
                self._expire()
        except Exception:  # the loop must never print a traceback: log it as one JSON line
            log.exception("the health port stopped serving")
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            self._selector.close()

    def _dispatch(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.fileobj is self._listener:
            self._accept()
        elif key.fileobj is self._wake_r:
            self._drain_wakes()
            self._finish_answers()
        else:
            conn: _Conn = key.data
            try:
                if mask & selectors.EVENT_WRITE:
                    self._write(conn)
                else:
                    self._read(conn)
            except Exception:  # one connection's trouble must not stop the port
                log.exception("health connection from %s failed", conn.peer)
                self._close(conn)

    def _timeout(self) -> float | None:
        first = min((c.deadline for c in self._conns.values()), default=math.inf)
        if self._accept_paused_until:
            first = min(first, self._accept_paused_until)
        if first == math.inf:
            return None  # nothing times out (busy connections are woken by the pool); stop() wakes the loop
        return max(0.0, first - time.monotonic())

    def _expire(self) -> None:
        now = time.monotonic()
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._selector_of().register(self._listener, selectors.EVENT_READ, None)
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            if conn.idle:
                why = f"idle for {self._idle_timeout:g} s"
            elif conn.out is not None:
                why = f"answer not taken within {self._request_timeout:g} s"
            else:
                why = f"no whole request within {self._request_timeout:g} s"
            log.debug("closed the connection from %s: %s", conn.peer, why)
            self._close(conn)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                sock, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno not in RESOURCE_ERRNOS:
                    log.debug("accepting a connection failed: %s", exc)  # e.g. the client gave up first
                    continue
                if self._evict("out of file descriptors"):
                    continue
                log.warning("health port: cannot accept connections: %s; pausing %g s", exc, ACCEPT_PAUSE)
                self._selector_of().unregister(self._listener)
                self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE
                return
            if len(self._conns) >= self._max_connections and not self._evict("too many connections"):
                log.debug("refused a connection from %s: %d connections busy", address[0], len(self._conns))
                _close_socket(sock)
                continue
            sock.setblocking(False)
            now = time.monotonic()
            conn = _Conn(sock, str(address[0]), now, now + self._request_timeout)
            self._conns[sock.fileno()] = conn
            self._watch(conn, selectors.EVENT_READ)

    def _evict(self, why: str) -> bool:
        waiting = [c for c in self._conns.values() if c.waiting]
        if not waiting:
            return False
        victim = min(waiting, key=lambda c: c.since)
        log.debug("closed the connection from %s, which waited longest, to make room: %s", victim.peer, why)
        self._close(victim)
        return True

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as exc:
            self._gone(conn, exc)
            return
        if not data:
            self._gone(conn, None)
            return
        if conn.idle:  # the first byte of the next request starts its deadline
            conn.idle = False
            conn.deadline = time.monotonic() + self._request_timeout
        conn.inbuf += data
        self._next_request(conn)

    def _next_request(self, conn: _Conn) -> None:
        """Answer the request in `conn.inbuf` if it is whole: here, or on the pool when it calls out."""
        del conn.inbuf[: len(conn.inbuf) - len(conn.inbuf.lstrip(b"\r\n"))]  # blank lines before a request
        end = _HEAD_END.search(conn.inbuf)
        if end is None:
            if len(conn.inbuf) > MAX_HEAD:
                self._respond(conn, _UNREADABLE, _error(431, f"request head over {MAX_HEAD} bytes"))
            return
        head = bytes(conn.inbuf[: end.start()])
        del conn.inbuf[: end.end()]
        request = _parse(head)
        if request is None:
            self._respond(conn, _UNREADABLE, _error(400, f"not an HTTP/1.x request; {SERVES}"))
        elif request.method not in ("GET", "HEAD"):
            self._respond(conn, request, _error(405, f"method {request.method} not allowed; {SERVES}"))
        elif request.path == "/healthz":
            self._respond(conn, request, _Answer(200, orjson.dumps({"status": "ok"})))
        elif request.path in ("/readyz", "/metrics"):
            conn.busy = True
            conn.deadline = math.inf  # ours to answer, not the client's to be late
            self._watch(conn, 0)
            self._jobs.put((conn, request))
        else:
            self._respond(conn, request, _error(404, f"no such path {request.path}: {SERVES}"))

    def _finish_answers(self) -> None:
        while True:
            try:
                conn, request, answer = self._done.get_nowait()
            except queue.Empty:
                return
            conn.busy = False
            if not conn.closed:
                self._respond(conn, request, answer)

    def _respond(self, conn: _Conn, request: _Request, answer: _Answer) -> None:
        fields = {"client": conn.peer, "request": request.line, "code": answer.code}
        log.debug('%s "%s" %d', conn.peer, request.line, answer.code, extra={"fields": fields})
        conn.keep_alive = request.keep_alive and not self._stopping.is_set()
        conn.out = memoryview(_encode(answer, request, conn.keep_alive))
        conn.deadline = time.monotonic() + self._request_timeout
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        assert conn.out is not None
        try:
            while conn.out:
                conn.out = conn.out[conn.sock.send(conn.out) :]
        except BlockingIOError:
            self._watch(conn, selectors.EVENT_WRITE)
            return
        except OSError as exc:
            self._gone(conn, exc)
            return
        conn.out = None
        if not conn.keep_alive:
            self._close(conn)
            return
        now = time.monotonic()
        conn.since = now
        conn.idle, conn.deadline = True, now + self._idle_timeout
        self._watch(conn, selectors.EVENT_READ)
        if conn.inbuf:  # pipelined: the next request is already here
            conn.idle, conn.deadline = False, now + self._request_timeout
            self._next_request(conn)

    def _gone(self, conn: _Conn, exc: OSError | None) -> None:
        """The client closed or reset the connection: normal for probes and scrapers, so a debug line."""
        if conn.out is not None:
            when = "mid-response"
        elif conn.inbuf or not conn.idle:
            when = "mid-request" if conn.inbuf else "before sending a request"
        else:
            when = "between requests"
        fields = {"client": conn.peer, "disconnected": when}
        log.debug(
            "%s closed the connection %s%s", conn.peer, when, f" ({exc})" if exc else "", extra={"fields": fields}
        )
        self._close(conn)

    def _watch(self, conn: _Conn, events: int) -> None:
        selector = self._selector_of()
        if events == conn.events:
            return
        if not conn.events:
            selector.register(conn.sock, events, conn)
        elif not events:
            selector.unregister(conn.sock)
        else:
            selector.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        self._watch(conn, 0)
        self._conns.pop(conn.sock.fileno(), None)
        conn.closed = True
        _close_socket(conn.sock)

    def _selector_of(self) -> selectors.BaseSelector:
        assert self._selector is not None, "start() first"
        return self._selector

    # --- waking the loop from the pool and from stop() -------------------------------------------------

    def _wake(self) -> None:
        if self._wake_w is None:
            return
        # BlockingIOError: a wake is already pending, which is all the loop needs; OSError: stopped
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _drain_wakes(self) -> None:
        assert self._wake_r is not None
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    # --- the pool threads ------------------------------------------------------------------------------

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            conn, request = job
            self._done.put((conn, request, self._call(request)))
            self._wake()

    def _call(self, request: _Request) -> _Answer:
        try:
            if request.path == "/readyz":
                state = self._readiness()
                return _Answer(200 if state.ready else 503, orjson.dumps({"ready": state.ready, **state.detail}))
            text = self._metrics()
            return _Answer(200, text.body, text.content_type)
        except Exception:  # a probe must get an answer; the log says what broke
            log.exception("health endpoint %s failed", request.path)
            return _error(500, "internal error, see the log")


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _parse(head: bytes) -> _Request | None:
    """The request line and the headers that matter here; None when it is not HTTP/1.x."""
    lines = [line.decode("latin-1") for line in head.splitlines()]  # only CR and LF end a line in HTTP
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            return None
        headers[name.strip().lower()] = value.strip()
    http10 = version == "HTTP/1.0"
    tokens = {token.strip().lower() for token in headers.get("connection", "").split(",")}
    keep_alive = "keep-alive" in tokens if http10 else "close" not in tokens
    if "transfer-encoding" in headers or headers.get("content-length", "0") not in ("", "0"):
        keep_alive = False  # no endpoint takes a body: answer and close rather than read one to skip it
    return _Request(method, target.split("?", 1)[0], lines[0], keep_alive, http10)


def _encode(answer: _Answer, request: _Request, keep_alive: bool) -> bytes:
    lines = [
        f"HTTP/1.1 {answer.code} {HTTPStatus(answer.code).phrase}",
        "Server: gpupool-health",
        f"Date: {formatdate(usegmt=True)}",
        f"Content-Type: {answer.content_type}",
        f"Content-Length: {len(answer.body)}",
    ]
    if not keep_alive:
        lines.append("Connection: close")
    elif request.http10:
        lines.append("Connection: keep-alive")
    if answer.code == 405:
        lines.append("Allow: GET, HEAD")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if request.method == "HEAD" else head + answer.body


def _close_socket(sock: socket.socket) -> None:
    # shutdown first: a gunicorn worker forked while this connection was open holds a copy of the
    # descriptor, and close() alone would leave the client waiting for an end that never comes.
    with contextlib.suppress(OSError):  # the client may have reset it already
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
