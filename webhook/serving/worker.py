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
  (a thousand 19 MiB bodies cut short would not fit in memory);
- a request that is refused (malformed: 400; too large: the app's 413) is answered, then the
  connection is closed by a lingering close: FIN first, then what the client still sends is read and
  dropped for a while, so the client reads the answer instead of a reset.

This module is the worker itself: its loop, accepting connections and stopping, the deadlines, and the
threads with the queue of requests waiting for one. The table of connections and the buffer budget are
in webhook.serving.clients, the main loop's reading and writing on a connection in
webhook.serving.client_io.
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
# importing webhook.serving.app (through client_io) here is safe (see webhook/serving/server.py).
from webhook.serving.client_io import LINGER_SECONDS, REQUEST_SECONDS, ClientIO
from webhook.serving.clients import Clients
from webhook.serving.connection import HANDSHAKE, QUEUED, SERVING, Connection, hung_up
from webhook.serving.http11 import ProtocolError, Request
from webhook.serving.wsgi import base_environ, respond

QUEUE_SECONDS = 2.0  # for a complete request to get a thread; admissions take milliseconds
MAX_QUEUED = 256  # complete requests waiting for a thread (one per connection: the next is not read)
SWEEP_SECONDS = 0.5  # how often deadlines are checked
HANDSHAKES_PER_TURN = 16  # TLS handshakes per turn of the main loop (about 0.3 ms each, ECDSA P-256)
FD_RESERVE = 128  # descriptors kept for everything else (the watches, logs, the thread pool's pipe)


class WebhookWorker(ThreadWorker):  # type: ignore[misc]  # gunicorn is untyped
    alive: bool  # gunicorn's: False once the worker is to stop
    # Made in `run`, on the poller gthread's init_process makes just before it calls `run`.
    clients: Clients
    io: ClientIO

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.running = 0  # requests in the threads
        self.next_sweep = 0.0
        self.worker_connections: int = self.cfg.worker_connections
        self.environ = base_environ(
            url_scheme="https" if self.cfg.is_ssl else "http", multiprocess=self.cfg.workers > 1
        )

    def init_process(self) -> None:
        self.worker_connections = raise_fd_limit(self.worker_connections, self.log)
        super().init_process()

    def run(self) -> None:
        self.clients = Clients(self.poller, self.log)
        self.io = ClientIO(self.clients, self.log, keepalive=self.cfg.keepalive, submit=self.submit)
        self.poller.register(self.method_queue.fileno(), selectors.EVENT_READ, self.method_queue.run_callbacks)
        while self.alive:
            self.notify()
            self.set_accept_enabled(len(self.clients) < self.worker_connections or self.clients.evictable())
            self.wait_for_and_dispatch_events(timeout=SWEEP_SECONDS)
            if not self.is_parent_alive():
                break
            self.sweep()
        # Stopping: no new connections; answer what is in flight and what is already on its way, and
        # give idle kept-alive connections a moment for a request the client may be sending right now.
        self.set_accept_enabled(False)
        linger = time.monotonic() + LINGER_SECONDS
        for conn in self.clients.idle:
            conn.deadline = min(conn.deadline, linger)
        stop_by = time.monotonic() + self.cfg.graceful_timeout
        while self.clients and time.monotonic() < stop_by:
            self.notify()
            self.wait_for_and_dispatch_events(timeout=SWEEP_SECONDS)
            self.sweep()
        for conn in list(self.clients.conns):
            self.clients.close(conn)
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
                self.io.on_ready(key.data)
        for conn in handshakes[:HANDSHAKES_PER_TURN]:
            self.io.on_ready(conn)

    def accept(self, listener: Any) -> None:
        for _ in range(64):  # several per wake-up: a burst of connections is taken in one go
            if len(self.clients) >= self.worker_connections and not self.clients.evict():
                return
            try:
                raw, client = listener.accept()
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self.log.warning("no file descriptors left for a new connection: %s", exc)
                    self.clients.evict()
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
        self.clients.add(conn)

    def sweep(self) -> None:
        """Close the connections past their deadline, and refuse the requests that waited too long for a
        thread (checked every SWEEP_SECONDS)."""
        now = time.monotonic()
        if now < self.next_sweep:
            return
        self.next_sweep = now + SWEEP_SECONDS
        for conn in [c for c in self.clients.conns if c.state != SERVING and c.deadline <= now]:
            if conn.state == QUEUED:
                self.io.refuse(conn, ProtocolError(503, f"no thread free for {QUEUE_SECONDS:g} s: gpupool is busy"))
            else:
                self.log.debug("closing a connection from %s: too slow (state %d)", conn.client, conn.state)
                self.clients.close(conn)

    # --- requests and threads -----------------------------------------------------------------------

    def submit(self, conn: Connection, request: Request) -> None:
        """A complete request: to a thread now, or after the ones waiting already."""
        self.clients.watch(conn, 0)
        self.clients.fresh.pop(conn, None)
        self.clients.idle.pop(conn, None)
        conn.request = request
        if self.running < self.cfg.threads and not self.clients.queued:
            self.run_request(conn)
        elif len(self.clients.queued) >= MAX_QUEUED:
            busy = ProtocolError(503, f"{MAX_QUEUED} requests wait for a thread already: gpupool is busy")
            self.io.refuse(conn, busy)
        else:
            conn.state = QUEUED
            conn.deadline = time.monotonic() + QUEUE_SECONDS
            self.clients.queued[conn] = None
            self.clients.account(conn, conn.http.held + len(request.body))
            self.next_queued()  # a thread may be free: only the order was kept

    def run_request(self, conn: Connection) -> None:
        request = conn.request
        assert request is not None
        conn.state = SERVING
        self.running += 1
        self.clients.account(conn, conn.http.held + len(request.body))
        future = self.tpool.submit(self.serve, conn, request)
        future.add_done_callback(lambda done: self.method_queue.defer(self.served, conn, done))

    def next_queued(self) -> None:
        """Give free threads the requests that waited longest, skipping those whose client hung up."""
        queued = self.clients.queued
        while queued and self.running < self.cfg.threads:
            conn = next(iter(queued))
            del queued[conn]
            if hung_up(conn.sock):
                self.log.debug("dropping a request from %s: the client closed while it waited", conn.client)
                self.clients.close(conn)
            else:
                self.run_request(conn)

    def served(self, conn: Connection, future: Future[bool]) -> None:
        """Back from the thread (on the main loop): send what is left of the answer, then carry on."""
        self.running -= 1
        keep = not future.cancelled() and future.exception() is None and future.result()
        if not future.cancelled() and future.exception() is not None:
            self.log.error("answering %s failed", conn.client, exc_info=future.exception())
        self.next_queued()  # first: a request pipelined on this connection comes after those waiting
        if conn in self.clients:
            conn.request = None
            self.clients.account(conn, 0)
            self.io.answered(conn, keep=keep)

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
