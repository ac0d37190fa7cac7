"""gpupool's gunicorn worker: a slow or idle client costs a connection, never a thread.

gunicorn's gthread worker hands each new connection, and each kept-alive one that becomes readable,
to a thread that waits up to 5 s for a first byte, then reads the TLS handshake and the request with
blocking calls and no deadline: four clients that complete a handshake and send nothing (or one byte
a second) hold its four threads, and no other admission is answered while they stay. This worker
keeps gunicorn's master, settings, TLS context and gthread's thread pool, and moves all waiting for the
client into the main loop (non-blocking, epoll):

- the TLS handshake and the reading of each request happen there; h11 parses each request once, as
  its bytes arrive (webhook.serving.http11), and a thread gets it only once it is complete: method,
  target, headers and body, from which it builds the WSGI environ (webhook.serving.wsgi) and calls
  the app;
- the thread frames the answer (webhook.serving.http11) and writes it without blocking: what the
  socket does not take at once is sent by the main loop as the client reads it;
- a connection must send a complete request within REQUEST_SECONDS of being accepted, or of the first
  byte of its next request when kept alive; between requests it may stay idle for gunicorn's keepalive
  (120 s); an answer must be taken within REQUEST_SECONDS; otherwise the connection is closed;
- a complete request waits for a thread at most QUEUE_SECONDS, and at most MAX_QUEUED wait at once;
  past either it is answered 503 and the connection closed; one whose client has closed its side
  while it waited is dropped unanswered;
- at the connection limit a new connection closes the oldest one that has not completed a request
  yet (or, if there is none, the one idle longest), so a flood of connections cannot lock others out;
- requests not yet answered hold at most BUFFER_BUDGET bytes per worker (bytes not parsed yet, bodies
  being read and bodies waiting for a thread): past that, the connection holding the most is closed
  (a thousand 3 MiB bodies cut short would not fit in memory);
- a request that is refused (malformed: 400; too large: the app's 413) is answered, then the
  connection is closed by a lingering close: FIN first, then what the client still sends is read and
  dropped for a while, so the client reads the answer instead of a reset.
"""

from __future__ import annotations

import errno
import resource
import selectors
import socket
import ssl
import time
from concurrent.futures import Future
from typing import Any

from gunicorn import sock as gunicorn_sock
from gunicorn.workers.gthread import ThreadWorker

# gunicorn imports this module by name in the arbiter, after `serve` set PROMETHEUS_MULTIPROC_DIR, so
# importing webhook.serving.app here is safe (see webhook/serving/server.py).
from webhook.serving.app import MAX_BODY_BYTES
from webhook.serving.connection import (
    HANDSHAKE,
    IDLE,
    LINGERING,
    QUEUED,
    READING,
    SERVING,
    WRITING,
    Connection,
    hung_up,
    tls_pending,
)
from webhook.serving.http11 import ProtocolError, Request
from webhook.serving.wsgi import base_environ, respond

REQUEST_SECONDS = 5.0  # to send a whole request (kube-apiserver sends one in well under a millisecond)
QUEUE_SECONDS = 2.0  # for a complete request to get a thread; admissions take milliseconds
MAX_QUEUED = 256  # complete requests waiting for a thread (one per connection: the next is not read)
BUFFER_BUDGET = 64 * 1024 * 1024  # bytes of requests not yet answered, per worker
# After the last answer, what the client still sends is read and dropped (then the close is a FIN, not a
# reset that would lose the answer): until it has been quiet for LINGER_SECONDS, for REQUEST_SECONDS at
# most (the time it had to send a request), and LINGER_BYTES at most (the rest of a body over the limit).
LINGER_SECONDS = 2.0
LINGER_BYTES = MAX_BODY_BYTES + 1024 * 1024
SWEEP_SECONDS = 0.5  # how often deadlines are checked
RECV_BYTES = 256 * 1024
TURN_BYTES = 256 * 1024  # read from one connection per turn of the main loop, so that others get theirs
HANDSHAKES_PER_TURN = 16  # TLS handshakes per turn of the main loop (about 0.3 ms each, ECDSA P-256)
FD_RESERVE = 128  # descriptors kept for everything else (the watches, logs, the thread pool's pipe)
REFUSED_LOG_SECONDS = 1.0  # at most one warning per second about refused client certificates
# OpenSSL's reasons when --client-ca refuses a client: the admin wants to hear of these (a kube-apiserver
# with the wrong certificate), while every other failed handshake is a client gone or a scanner.
CLIENT_REFUSED = frozenset({"PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_VERIFY_FAILED"})


class WebhookWorker(ThreadWorker):  # type: ignore[misc]  # gunicorn is untyped
    alive: bool  # gunicorn's: False once the worker is to stop

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conns: set[Connection] = set()
        self.fresh: dict[Connection, None] = {}  # no request completed yet, oldest first
        self.idle: dict[Connection, None] = {}  # kept alive between requests, longest idle first
        self.queued: dict[Connection, None] = {}  # complete requests waiting for a thread, oldest first
        self.running = 0  # requests in the threads
        self.held = 0  # bytes counted in BUFFER_BUDGET
        self.next_sweep = 0.0
        self.worker_connections: int = self.cfg.worker_connections
        self.refused_since_log = 0  # refused client certificates not logged yet (rate limit)
        self.next_refused_log = 0.0
        self.environ = base_environ(
            url_scheme="https" if self.cfg.is_ssl else "http", multiprocess=self.cfg.workers > 1
        )

    def init_process(self) -> None:
        self.worker_connections = raise_fd_limit(self.worker_connections, self.log)
        super().init_process()

    def run(self) -> None:
        self.poller.register(self.method_queue.fileno(), selectors.EVENT_READ, self.method_queue.run_callbacks)
        while self.alive:
            self.notify()
            self.set_accept_enabled(self.nr_conns < self.worker_connections or bool(self.fresh or self.idle))
            self.wait_for_and_dispatch_events(timeout=SWEEP_SECONDS)
            if not self.is_parent_alive():
                break
            self.sweep()
        # Stopping: no new connections; answer what is in flight and what is already on its way, and
        # give idle kept-alive connections a moment for a request the client may be sending right now.
        self.set_accept_enabled(False)
        linger = time.monotonic() + LINGER_SECONDS
        for conn in self.idle:
            conn.deadline = min(conn.deadline, linger)
        stop_by = time.monotonic() + self.cfg.graceful_timeout
        while self.conns and time.monotonic() < stop_by:
            self.notify()
            self.wait_for_and_dispatch_events(timeout=SWEEP_SECONDS)
            self.sweep()
        for conn in list(self.conns):
            self.close(conn)
        self.tpool.shutdown(wait=False)
        self.poller.close()
        self.method_queue.close()
        for listener in self.sockets:
            listener.close()

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        """Serve the connections that speak HTTP first, then new connections' handshakes, at most
        HANDSHAKES_PER_TURN of them: a flood of new connections delays an admission by a few
        handshakes, not by all of them (the poller reports the others again at once)."""
        handshakes = []
        for key, _ in self.poller.select(timeout):
            if not isinstance(key.data, Connection):
                key.data(key.fileobj)  # a listener, or the queue of what the threads finished
            elif key.data.state == HANDSHAKE:
                handshakes.append(key.data)
            else:
                self.on_ready(key.data)
        for conn in handshakes[:HANDSHAKES_PER_TURN]:
            self.on_ready(conn)

    # --- connections coming and going ---------------------------------------------------------------

    def accept(self, listener: Any) -> None:
        for _ in range(64):  # several per wake-up: a burst of connections is taken in one go
            if self.nr_conns >= self.worker_connections and not self.evict():
                return
            try:
                raw, client = listener.accept()
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self.log.warning("no file descriptors left for a new connection: %s", exc)
                    self.evict()
                elif exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ECONNABORTED):
                    raise
                return
            self.start(raw, client, listener.getsockname())

    def start(self, raw: socket.socket, client: Any, server: Any) -> None:
        raw.setblocking(False)
        sock = raw
        if self.cfg.is_ssl:
            try:
                context = gunicorn_sock.ssl_context(self.cfg)
                sock = context.wrap_socket(
                    raw,
                    server_side=True,
                    do_handshake_on_connect=False,  # done in the main loop, without blocking
                    suppress_ragged_eofs=self.cfg.suppress_ragged_eofs,
                )
            except (ssl.SSLError, OSError) as exc:
                self.log.warning("dropped a new connection: no TLS context: %s", exc)
                raw.close()
                return
        conn = Connection(sock, client, server)
        conn.deadline = time.monotonic() + REQUEST_SECONDS
        self.conns.add(conn)
        self.fresh[conn] = None
        self.nr_conns += 1
        self.watch(conn, selectors.EVENT_READ)

    def evict(self) -> bool:
        """Close the connection that has waited longest without completing a request, else the one idle
        the longest; False when every connection is busy with a request."""
        for waiting in (self.fresh, self.idle):
            if waiting:
                self.close(next(iter(waiting)))
                return True
        return False

    def close(self, conn: Connection) -> None:
        if conn not in self.conns:
            return
        self.watch(conn, 0)
        self.conns.discard(conn)
        self.fresh.pop(conn, None)
        self.idle.pop(conn, None)
        self.queued.pop(conn, None)
        self.account(conn, 0)
        conn.request = None
        self.nr_conns -= 1
        conn.sock.close()

    def watch(self, conn: Connection, mask: int) -> None:
        if mask == conn.mask:
            return
        if not conn.mask:
            self.poller.register(conn.sock, mask, conn)
        elif not mask:
            self.poller.unregister(conn.sock)
        else:
            self.poller.modify(conn.sock, mask, conn)
        conn.mask = mask

    def sweep(self) -> None:
        """Close the connections past their deadline, and refuse the requests that waited too long for a
        thread (checked every SWEEP_SECONDS)."""
        now = time.monotonic()
        if now < self.next_sweep:
            return
        self.next_sweep = now + SWEEP_SECONDS
        for conn in [c for c in self.conns if c.state != SERVING and c.deadline <= now]:
            if conn.state == QUEUED:
                self.refuse(conn, ProtocolError(503, f"no thread free for {QUEUE_SECONDS:g} s: gpupool is busy"))
            else:
                self.log.debug("closing a connection from %s: too slow (state %d)", conn.client, conn.state)
                self.close(conn)

    def failed(self, conn: Connection, exc: OSError) -> None:
        """Reading or writing failed (the client went away, or broke TLS): close the connection."""
        self.log.debug("connection from %s failed: %s", conn.client, exc)
        self.close(conn)

    def account(self, conn: Connection, held: int) -> None:
        """Count the bytes requests not yet answered hold; past the budget, close the connection holding
        the most (requests in a thread are counted but not closed: there are at most `threads` of them)."""
        self.held += held - conn.held
        conn.held = held
        while self.held > BUFFER_BUDGET:
            biggest = max((c for c in self.conns if c.state != SERVING), key=lambda c: c.held, default=None)
            if biggest is None:
                return
            self.log.warning("closing a connection from %s holding %d bytes of a request", biggest.client, biggest.held)
            self.close(biggest)

    # --- the main loop's side of a connection -------------------------------------------------------

    def on_ready(self, conn: Connection) -> None:
        """The poller saw the event the connection waits for: carry on from its state."""
        if conn not in self.conns:  # closed by an event before it in the same turn
            return
        if conn.state == HANDSHAKE:
            self.handshake(conn)
        elif conn.state in (READING, IDLE):
            self.read(conn)
        elif conn.state == WRITING:
            self.flush(conn)
        elif conn.state == LINGERING:
            self.drain(conn)

    def handshake(self, conn: Connection) -> None:
        assert isinstance(conn.sock, ssl.SSLSocket)
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.watch(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self.watch(conn, selectors.EVENT_WRITE)
            return
        except OSError as exc:  # ssl.SSLError included: a client gpupool refuses, or one that went away
            if isinstance(exc, ssl.SSLError) and exc.reason in CLIENT_REFUSED:
                self.refused(conn, exc)
            else:
                self.log.debug("TLS handshake with %s failed: %s", conn.client, exc)
            self.close(conn)
            return
        conn.state = READING
        self.read(conn)  # the request may have come with the handshake's last flight

    def refused(self, conn: Connection, exc: ssl.SSLError) -> None:
        """A warning naming the client and OpenSSL's reason, at most one a second (with how many more were
        refused meanwhile): enough to spot a kube-apiserver with the wrong certificate, not a log flood."""
        self.refused_since_log += 1
        now = time.monotonic()
        if now < self.next_refused_log:
            return
        more = f" ({self.refused_since_log - 1} more since the last such warning)" if self.refused_since_log > 1 else ""
        self.log.warning("refused the client certificate of %s: %s%s", conn.client, exc, more)
        self.refused_since_log, self.next_refused_log = 0, now + REFUSED_LOG_SECONDS

    def read(self, conn: Connection) -> None:
        """Read what the client sent, up to TURN_BYTES; a complete request goes to a thread."""
        got = 0
        while True:
            try:
                data = conn.sock.recv(RECV_BYTES)
            except (BlockingIOError, ssl.SSLWantReadError):
                break
            except ssl.SSLWantWriteError:
                self.watch(conn, selectors.EVENT_WRITE)
                return
            except OSError as exc:
                self.failed(conn, exc)
                return
            if not data:  # the client closed in the middle of a request, or between two
                self.close(conn)
                return
            if conn.state == IDLE:  # the next request has begun: it has REQUEST_SECONDS from now
                conn.state = READING
                conn.deadline = time.monotonic() + REQUEST_SECONDS
                self.idle.pop(conn, None)
            conn.http.feed(data)
            if self.parse(conn):
                return
            got += len(data)
            if tls_pending(conn.sock):
                continue  # decrypted already, and the poller cannot see it: take it now
            if got >= TURN_BYTES or len(data) < RECV_BYTES:
                break  # all there was, or this connection's share: the poller tells when more is there
        self.watch(conn, selectors.EVENT_READ)

    def parse(self, conn: Connection) -> bool:
        """Parse what the connection holds; True when it is done with reading (a complete request went to
        a thread, or the request was refused, or the connection closed)."""
        try:
            request = conn.http.next_request()
        except ProtocolError as exc:
            self.refuse(conn, exc)
            return True
        if request is not None:
            self.submit(conn, request)
            return True
        self.account(conn, conn.http.held)
        if conn not in self.conns:  # it held the most when the budget ran out
            return True
        if continuing := conn.http.continue_due():
            self.send_continue(conn, continuing)
        return False

    def send_continue(self, conn: Connection, data: bytes) -> None:
        """The client waits for "100 Continue" before it sends the body; a few bytes on a connection that
        has sent nothing back yet always fit. If not, the client sends the body after its own wait."""
        try:
            conn.sock.send(data)
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            self.log.debug("could not send 100 Continue to %s at once", conn.client)
        except OSError as exc:
            self.log.debug("connection from %s failed: %s", conn.client, exc)

    def refuse(self, conn: Connection, error: ProtocolError) -> None:
        """Answer `error` from the main loop (it is not the app's business), then close."""
        self.log.debug("refusing a request from %s: %d %s", conn.client, error.status, error.message)
        self.fresh.pop(conn, None)
        self.idle.pop(conn, None)
        self.queued.pop(conn, None)
        self.account(conn, 0)
        conn.request = None
        conn.writer.sendall(conn.http.refusal(error))
        self.answered(conn, keep=False)

    # --- requests and threads -----------------------------------------------------------------------

    def submit(self, conn: Connection, request: Request) -> None:
        """A complete request: to a thread now, or after the ones waiting already."""
        self.watch(conn, 0)
        self.fresh.pop(conn, None)
        self.idle.pop(conn, None)
        conn.request = request
        if self.running < self.cfg.threads and not self.queued:
            self.run_request(conn)
        elif len(self.queued) >= MAX_QUEUED:
            self.refuse(conn, ProtocolError(503, f"{MAX_QUEUED} requests wait for a thread already: gpupool is busy"))
        else:
            conn.state = QUEUED
            conn.deadline = time.monotonic() + QUEUE_SECONDS
            self.queued[conn] = None
            self.account(conn, conn.http.held + len(request.body))
            self.next_queued()  # a thread may be free: only the order was kept

    def run_request(self, conn: Connection) -> None:
        request = conn.request
        assert request is not None
        conn.state = SERVING
        self.running += 1
        self.account(conn, conn.http.held + len(request.body))
        future = self.tpool.submit(self.serve, conn, request)
        future.add_done_callback(lambda done: self.method_queue.defer(self.served, conn, done))

    def next_queued(self) -> None:
        """Give free threads the requests that waited longest, skipping those whose client hung up."""
        while self.queued and self.running < self.cfg.threads:
            conn = next(iter(self.queued))
            del self.queued[conn]
            if hung_up(conn.sock):
                self.log.debug("dropping a request from %s: the client closed while it waited", conn.client)
                self.close(conn)
            else:
                self.run_request(conn)

    def served(self, conn: Connection, future: Future[bool]) -> None:
        """Back from the thread (on the main loop): send what is left of the answer, then carry on."""
        self.running -= 1
        keep = not future.cancelled() and future.exception() is None and future.result()
        if not future.cancelled() and future.exception() is not None:
            self.log.error("answering %s failed", conn.client, exc_info=future.exception())
        self.next_queued()  # first: a request pipelined on this connection comes after those waiting
        if conn in self.conns:
            conn.request = None
            self.account(conn, 0)
            self.answered(conn, keep=keep)

    def answered(self, conn: Connection, *, keep: bool) -> None:
        conn.keep = keep
        conn.state = WRITING
        conn.deadline = time.monotonic() + REQUEST_SECONDS
        self.flush(conn)

    def flush(self, conn: Connection) -> None:
        pending = conn.writer.pending
        while pending:
            try:
                sent = conn.sock.send(pending[0])
            except (BlockingIOError, ssl.SSLWantWriteError):
                self.watch(conn, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self.watch(conn, selectors.EVENT_READ)
                return
            except OSError as exc:
                self.failed(conn, exc)
                return
            if sent < len(pending[0]):
                pending[0] = pending[0][sent:]
            else:
                pending.popleft()
        if conn.keep:
            self.keep_alive(conn)
        else:
            self.linger(conn)

    def keep_alive(self, conn: Connection) -> None:
        """After an answer on a kept-alive connection: the next request, or idle until one comes."""
        if conn.http.buffered:  # it has begun: pipelined behind the last one, or sent meanwhile
            conn.state = READING
            conn.deadline = time.monotonic() + REQUEST_SECONDS
            if self.parse(conn):
                return
        else:
            conn.state = IDLE
            conn.deadline = time.monotonic() + self.cfg.keepalive
            self.idle[conn] = None
        if tls_pending(conn.sock):
            self.read(conn)  # decrypted and held by TLS: the poller cannot see it
        else:
            self.watch(conn, selectors.EVENT_READ)

    def linger(self, conn: Connection) -> None:
        """Close after the last answer: FIN first, then read and drop what the client still sends (the
        rest of a body too large, say) until it closes, so that the kernel does not answer it with a reset
        that loses the answer."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)  # on TLS this drops the TLS layer: the rest is read raw
        except OSError:
            self.close(conn)
            return
        conn.state = LINGERING
        conn.linger_until = time.monotonic() + REQUEST_SECONDS
        conn.deadline = time.monotonic() + LINGER_SECONDS
        self.watch(conn, selectors.EVENT_READ)

    def drain(self, conn: Connection) -> None:
        got = 0
        while got < TURN_BYTES:
            try:
                data = conn.sock.recv(RECV_BYTES)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            conn.drained += len(data)
            got += len(data)
            if not data or conn.drained > LINGER_BYTES:  # closed by the client, or it still sends a lot: done
                self.close(conn)
                return
        conn.deadline = min(time.monotonic() + LINGER_SECONDS, conn.linger_until)

    # --- a thread's side ----------------------------------------------------------------------------

    def serve(self, conn: Connection, request: Request) -> bool:
        """Answer one complete request (in a thread); True when the connection may be kept."""
        self.nr += 1
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            self.alive = False
        reply = respond(
            conn.http,
            request,
            app=self.wsgi,
            base=self.environ,
            client=conn.client,
            server=conn.server,
            close=not self.alive,
        )
        try:
            conn.writer.sendall(reply.data)
        except OSError as exc:  # the client went away
            self.log.debug("connection from %s failed: %s", conn.client, exc)
            return False
        return not reply.close and conn.http.next_cycle()


def raise_fd_limit(connections: int, log: Any) -> int:
    """Raise the soft limit on open files toward the hard one so that `connections` fit; the number of
    connections that do fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return connections
    log.warning("open files limited to %d: at most %d connections per worker", soft, soft - FD_RESERVE)
    return max(soft - FD_RESERVE, 1)
