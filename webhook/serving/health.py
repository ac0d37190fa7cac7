"""The plain-HTTP health port: /healthz, /readyz and /metrics, served by the gunicorn master.

The master outlives its workers and sees all of them, so it answers probes and scrapes; the TLS port
stays for admissions only, and a scrape never competes with an admission for a worker thread. What
"ready" means and what the metrics are come in as callables, so this module knows nothing of gunicorn
or prometheus_client.

The port is open to every Pod, so it is built for the kubelet's probes to get in whatever else its
clients do (pipelining scrapes, many or slow connections, slow readers, floods), on three threads:

- One loop does all the socket work without blocking (webhook.serving.health_http: one connection, read
  and framed by the admission port's webhook.serving.http11, head-only) and
  answers /healthz and every error itself, the moment the request is read, one request per connection
  per turn, so no client's pipeline holds up the others.
- /readyz and /metrics call out (they read the workers' metrics files), each on a thread of its own
  (webhook.serving.health_calls): a scrape never waits for a probe nor a probe for a scrape. Every
  request that arrived before a call started shares its answer, so the work is one call at a time
  however many ask, and never older than the request. Each thread rests as long as its last call took,
  so clients asking as fast as they can get at most half of its time.
- A connection answers one request at a time: a pipelined one is read only once the one before it is
  written. At most `max_scrapes` /metrics answers are being made or written at once (their bodies are
  the memory a scrape holds); past that a scrape gets 503 with `Retry-After` at once.

Every state of a connection has a deadline: a request must arrive whole within `request_timeout` of its
first byte (of the connection, for the first request); /readyz and /metrics must be answered within
`request_timeout` (else 503: not ready, or the scrape is to be retried); an answer must be taken by the
client within `request_timeout`; a kept-alive connection may wait `idle_timeout` for its next request.
Past `max_connections` a new connection always gets in: the loop closes, oldest first, a connection
waiting for its client, else one holding a scrape, else any other, so a probe's is the last to go.

Everything goes to the log as records (JSON lines under webhook.serving.logs); a client that goes away,
at any point, is a debug line.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import math
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.serving.health_calls import Caller
from webhook.serving.health_http import SERVES, UNREADABLE, Answer, Conn, Request, error
from webhook.serving.selecting import rewatch

log = logging.getLogger("gpupool.health")

ACCEPT_BURST = 64  # connections accepted per loop turn, so a flood cannot keep the loop from the others
BACKLOG = 1024  # connections the kernel holds for us during a flood, rather than drop a probe's SYN
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_PAUSE = 0.5  # out of descriptors and nothing to close: stop accepting this long instead of spinning
SCRAPE_RETRY_AFTER = 1  # seconds: a scrape slot frees as soon as one answer in flight is written
CALL_REST = 1.0  # each caller rests as long as its call took: clients asking flat out get half its time


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MetricsText:
    body: bytes
    content_type: str


class HealthServer:
    """Binds at construction (so a busy port fails before gunicorn starts); serves after `start()`."""

    def __init__(  # noqa: PLR0913 (a constructor: the health port's limits, by keyword)
        self,
        host: str,
        port: int,
        readiness: Callable[[], Readiness],
        metrics: Callable[[], MetricsText],
        *,
        request_timeout: float = 5.0,
        idle_timeout: float = 65.0,  # longer than a 60 s scrape interval, so a scraper keeps its connection
        max_connections: int = 64,
        max_scrapes: int = 4,  # Prometheus scrapes one at a time per replica; two replicas and a curl fit
    ) -> None:
        self._readiness = readiness
        self._metrics = metrics
        self._request_timeout = request_timeout
        self._idle_timeout = idle_timeout
        self._max_connections = max(1, max_connections)
        self._max_scrapes = max_scrapes
        self._listener = _listen(host, port)
        self._conns: dict[int, Conn] = {}  # by file descriptor
        self._turn: list[Conn] = []  # connections with a request already received, for the next turn
        self._scrapes: dict[Conn, None] = {}  # connections whose /metrics answer is being made or written
        self._done: queue.SimpleQueue[tuple[Caller[Answer], Answer]] = queue.SimpleQueue()
        self._callers = {
            "/readyz": Caller("gpupool-health-readyz", self._ready_answer, self._finished, rest=CALL_REST),
            "/metrics": Caller("gpupool-health-metrics", self._metrics_answer, self._finished, rest=CALL_REST),
        }
        # For each caller: the connections waiting for its next call, and those its running call answers.
        self._asked: dict[str, dict[Conn, None]] = {path: {} for path in self._callers}
        self._answering: dict[str, dict[Conn, None]] = {path: {} for path in self._callers}
        self._stopping = threading.Event()
        self._accept_paused_until = 0.0
        self._loop: threading.Thread | None = None
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
        self._loop = threading.Thread(target=self._serve, name="gpupool-health", daemon=True)
        self._loop.start()
        for caller in self._callers.values():
            caller.thread.start()

    def close_listener(self) -> None:
        """In a process forked from this one (the leader process): let go of the inherited listening socket,
        which only this process serves."""
        self._listener.close()

    def stop(self) -> None:
        self._stopping.set()
        self._wake()
        for caller in self._callers.values():
            caller.stop()
        # A caller stuck in its callable is a daemon and may be left behind; the loop closes the sockets.
        deadline = time.monotonic() + 5
        for thread in [self._loop, *(c.thread for c in self._callers.values())]:
            if thread is not None and thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        if self._loop is None or not self._loop.is_alive():
            for sock in (self._wake_r, self._wake_w, self._listener):
                if sock is not None:
                    sock.close()

    # --- the loop thread -------------------------------------------------------------------------------

    def _serve(self) -> None:
        selector = self._selector_of()
        try:
            while not self._stopping.is_set():
                events = selector.select(self._timeout())
                ours = {key.fileobj for key, _ in events if key.data is None}  # the listener and the wakes
                # Answers first, then what clients sent, and only then new connections: an accept may close
                # a connection to make room, never before a request it has already received is served.
                if self._wake_r in ours:
                    self._drain_wakes()
                    self._finish_calls()
                for key, mask in events:
                    if key.data is not None:
                        self._guarded(key.data, self._write if mask & selectors.EVENT_WRITE else self._read)
                if self._listener in ours:
                    self._accept()
                self._take_turns()
                self._expire()
        except Exception:  # the loop must never print a traceback: log it as one JSON line
            log.exception("the health port stopped serving")
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            selector.close()

    def _guarded(self, conn: Conn, step: Callable[[Conn], None]) -> None:
        if conn.closed:
            return
        try:
            step(conn)
        except Exception:  # one connection's trouble must not stop the port
            log.exception("health connection from %s failed", conn.peer)
            self._close(conn)

    def _timeout(self) -> float | None:
        if self._turn:
            return 0.0
        first = min((c.deadline for c in self._conns.values()), default=math.inf)
        if self._accept_paused_until:
            first = min(first, self._accept_paused_until)
        if first == math.inf:
            return None  # nothing times out; callers and stop() wake the loop
        return max(0.0, first - time.monotonic())

    def _take_turns(self) -> None:
        """Serve the next request of each connection that already has one (pipelined), one each."""
        turn, self._turn = self._turn, []
        for conn in turn:
            self._guarded(conn, self._next_request)

    def _expire(self) -> None:
        now = time.monotonic()
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._selector_of().register(self._listener, selectors.EVENT_READ, None)
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            if conn.state == "waiting":
                self._respond(conn, self._late_answer(conn))
                continue
            if conn.state == "writing":
                why = f"answer not taken within {self._request_timeout:g} s"
            elif conn.idle:
                why = f"idle for {self._idle_timeout:g} s"
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
            if len(self._conns) >= self._max_connections:
                self._evict("too many connections")
            sock.setblocking(False)
            with contextlib.suppress(OSError):  # an answer goes out whole: Nagle would only hold back its end
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            now = time.monotonic()
            conn = Conn(sock, str(address[0]), now, now + self._request_timeout)
            self._conns[sock.fileno()] = conn
            self._guarded(conn, self._read)  # a probe's request is usually here already: answer it now

    def _evict(self, why: str) -> bool:
        """Close one connection to make room: waiting for its client, else holding a scrape, else any; oldest first."""
        if not self._conns:
            return False
        victim = min(self._conns.values(), key=lambda c: (c.state != "reading", c not in self._scrapes, c.opened))
        log.debug("closed the connection from %s (%s) to make room: %s", victim.peer, victim.phase(), why)
        self._close(victim)
        return True

    def _read(self, conn: Conn) -> None:
        was_idle = conn.idle
        try:
            if not conn.receive():
                self._gone(conn, None)
                return
        except BlockingIOError:
            self._watch(conn, selectors.EVENT_READ)
            return
        except OSError as exc:
            self._gone(conn, exc)
            return
        if was_idle:  # the first byte of the next request starts its deadline
            conn.deadline = time.monotonic() + self._request_timeout
        self._next_request(conn)

    def _next_request(self, conn: Conn) -> None:
        """Answer the next request received on `conn`: here, or by a caller when it calls out."""
        request = conn.next_request()
        if request is None:
            self._watch(conn, selectors.EVENT_READ)
        elif isinstance(request, Answer):  # malformed: answered, then the connection is closed
            self._respond(conn, request, UNREADABLE)
        elif request.method not in ("GET", "HEAD"):
            allow = ("Allow", "GET, HEAD")
            self._respond(conn, error(405, f"method {request.method} not allowed; {SERVES}", allow), request)
        elif request.has_body:  # announced, and never read: the connection closes after this answer
            self._respond(conn, error(413, f"a request with a body; {SERVES}, without a body"), request)
        elif request.path == "/healthz":
            self._respond(conn, Answer(200, orjson.dumps({"status": "ok"})), request)
        elif request.path == "/metrics" and len(self._scrapes) >= self._max_scrapes:
            message = f"{self._max_scrapes} scrapes are in progress, the most this port serves at once"
            self._respond(conn, error(503, message, ("Retry-After", str(SCRAPE_RETRY_AFTER))), request)
        elif request.path in self._callers:
            self._wait_for_call(conn, request)
        else:
            self._respond(conn, error(404, f"no such path {request.path}: {SERVES}"), request)

    def _wait_for_call(self, conn: Conn, request: Request) -> None:
        now = time.monotonic()
        conn.state, conn.request, conn.deadline = "waiting", request, now + self._request_timeout
        self._watch(conn, 0)  # the next pipelined request waits in the socket until this one is answered
        if request.path == "/metrics":
            self._scrapes[conn] = None
        self._asked[request.path][conn] = None
        caller = self._callers[request.path]
        if not caller.busy:
            self._call(request.path)

    def _call(self, path: str) -> None:
        self._answering[path], self._asked[path] = self._asked[path], {}
        self._callers[path].ask()

    def _finished(self, caller: Caller[Answer], answer: Answer) -> None:  # on the caller's thread
        self._done.put((caller, answer))
        self._wake()

    def _finish_calls(self) -> None:
        while True:
            try:
                caller, answer = self._done.get_nowait()
            except queue.Empty:
                return
            path = next(p for p, c in self._callers.items() if c is caller)
            caller.busy = False
            answering, self._answering[path] = self._answering[path], {}
            for conn in answering:
                self._guarded(conn, functools.partial(self._respond, answer=answer))
            if self._asked[path]:
                self._call(path)

    def _late_answer(self, conn: Conn) -> Answer:
        """The answer to a request whose call did not return within the deadline."""
        assert conn.request is not None
        self._leave_calls(conn)
        within = f"within {self._request_timeout:g} s"
        if conn.request.path == "/readyz":
            return Answer(503, orjson.dumps({"ready": False, "error": f"readiness not determined {within}"}))
        retry = ("Retry-After", str(math.ceil(self._request_timeout)))
        return error(503, f"the metrics were not rendered {within}; try again later", retry)

    def _leave_calls(self, conn: Conn) -> None:
        for waiting in (*self._asked.values(), *self._answering.values()):
            waiting.pop(conn, None)

    def _respond(self, conn: Conn, answer: Answer, request: Request | None = None) -> None:
        """Write `answer` to `request` (by default, the request `conn` is waiting to have answered)."""
        request = request or conn.request or UNREADABLE
        if log.isEnabledFor(logging.DEBUG):
            fields = {"client": conn.peer, "request": request.line, "code": answer.code}
            log.debug('%s "%s" %d', conn.peer, request.line, answer.code, extra={"fields": fields})
        conn.answer(request, answer, close=self._stopping.is_set() or request is UNREADABLE)
        conn.state, conn.deadline = "writing", time.monotonic() + self._request_timeout
        self._write(conn)

    def _write(self, conn: Conn) -> None:
        try:
            if not conn.flush():
                self._watch(conn, selectors.EVENT_WRITE)
                return
        except OSError as exc:
            self._gone(conn, exc)
            return
        self._scrapes.pop(conn, None)
        if not conn.next_cycle():
            self._close(conn)
            return
        now = time.monotonic()
        conn.state, conn.deadline = "reading", now + self._idle_timeout
        if conn.buffered:  # pipelined: the next request is here already; its turn comes after the others'
            conn.deadline = now + self._request_timeout
            self._watch(conn, 0)
            self._turn.append(conn)
        else:
            self._watch(conn, selectors.EVENT_READ)

    def _gone(self, conn: Conn, exc: OSError | None) -> None:
        """The client closed or reset the connection: normal for probes and scrapers, so a debug line."""
        when = conn.phase()
        fields = {"client": conn.peer, "disconnected": when}
        log.debug(
            "%s closed the connection %s%s", conn.peer, when, f" ({exc})" if exc else "", extra={"fields": fields}
        )
        self._close(conn)

    def _watch(self, conn: Conn, events: int) -> None:
        conn.events = rewatch(self._selector_of(), conn.sock, conn, conn.events, events)

    def _close(self, conn: Conn) -> None:
        if conn.closed:
            return
        self._watch(conn, 0)
        self._conns.pop(conn.sock.fileno(), None)
        self._scrapes.pop(conn, None)
        self._leave_calls(conn)
        conn.close()

    def _selector_of(self) -> selectors.BaseSelector:
        assert self._selector is not None, "start() first"
        return self._selector

    # --- waking the loop from the callers and from stop() ----------------------------------------------

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

    # --- the calls out, on the callers' threads --------------------------------------------------------

    def _ready_answer(self) -> Answer:
        try:
            state = self._readiness()
        except Exception:  # a probe must get an answer; the log says what broke
            log.exception("health endpoint /readyz failed")
            return error(500, "internal error, see the log")
        return Answer(200 if state.ready else 503, orjson.dumps({"ready": state.ready, **state.detail}))

    def _metrics_answer(self) -> Answer:
        try:
            text = self._metrics()
        except Exception:  # a scraper must get an answer; the log says what broke
            log.exception("health endpoint /metrics failed")
            return error(500, "internal error, see the log")
        return Answer(200, text.body, text.content_type)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
        sock.bind((host.strip("[]"), port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
