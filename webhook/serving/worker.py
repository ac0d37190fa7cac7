"""gpupool's gunicorn worker: a slow or idle client costs a connection, never a thread.

gunicorn's gthread worker hands each new connection, and each kept-alive one that becomes readable,
to a thread that waits up to 5 s for a first byte, then reads the TLS handshake and the request with
blocking calls and no deadline: four clients that complete a handshake and send nothing (or one byte
a second) hold its four threads, and no other admission is answered while they stay. This worker
keeps gthread's thread pool, main loop and request handling, and moves all waiting for the client
into the main loop (non-blocking, epoll):

- the TLS handshake and the reading of each request happen there, and a request goes to a thread only
  once it is complete (webhook.serving.http1 decides), as bytes the thread's parser reads from memory;
- the thread writes the answer without blocking: what the socket does not take at once is sent by the
  main loop as the client reads it;
- a connection must send a complete request within REQUEST_SECONDS of being accepted, or of the first
  byte of its next request when kept alive; between requests it may stay idle for gunicorn's keepalive
  (120 s); an answer must be taken within REQUEST_SECONDS; otherwise the connection is closed;
- at the connection limit a new connection closes the oldest one that has not completed a request
  yet (or, if there is none, the one idle longest), so a flood of connections cannot lock others out;
- requests waiting to be complete hold at most BUFFER_BUDGET bytes per worker: past that, the
  connection holding the most is closed (a thousand 3 MiB bodies cut short would not fit in memory).
"""

from __future__ import annotations

import errno
import resource
import selectors
import socket
import ssl
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, NamedTuple

from gunicorn import sock as gunicorn_sock
from gunicorn.http.errors import NoMoreData
from gunicorn.http.parser import RequestParser
from gunicorn.workers.gthread import ThreadWorker

# gunicorn imports this module by name in the arbiter, after `serve` set PROMETHEUS_MULTIPROC_DIR, so
# importing webhook.serving.app here is safe (see webhook/serving/server.py).
from webhook.serving.app import MAX_BODY_BYTES
from webhook.serving.http1 import CONTINUE, FramingError, RequestFramer

REQUEST_SECONDS = 5.0  # to send a whole request (kube-apiserver sends one in well under a millisecond)
BUFFER_BUDGET = 64 * 1024 * 1024  # bytes of incomplete requests per worker
LINGER_SECONDS = 2.0  # after the last answer, to read what the client still sends (then FIN, not RST)
LINGER_BYTES = 64 * 1024
SWEEP_SECONDS = 0.5  # how often deadlines are checked
RECV_BYTES = 256 * 1024
HANDSHAKES_PER_TURN = 16  # TLS handshakes per turn of the main loop (about 0.3 ms each, ECDSA P-256)
FD_RESERVE = 128  # descriptors kept for everything else (the watches, logs, the thread pool's pipe)
REFUSED_LOG_SECONDS = 1.0  # at most one warning per second about refused client certificates
# OpenSSL's reasons when --client-ca refuses a client: the admin wants to hear of these (a kube-apiserver
# with the wrong certificate), while every other failed handshake is a client gone or a scanner.
CLIENT_REFUSED = frozenset({"PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_VERIFY_FAILED"})

# What a connection is doing; the main loop watches every state except SERVING.
HANDSHAKE, READING, IDLE, SERVING, WRITING, LINGERING = range(6)


class Connection:
    """One client connection and everything the main loop knows about it."""

    __slots__ = (
        "client",
        "deadline",
        "framer",
        "held",
        "keep",
        "mask",
        "server",
        "sock",
        "state",
        "writer",
    )

    def __init__(self, sock: socket.socket, client: Any, server: Any, framer: RequestFramer) -> None:
        self.sock = sock
        self.client, self.server = client, server
        self.framer = framer
        self.writer = Writer(sock)
        self.state = HANDSHAKE if isinstance(sock, ssl.SSLSocket) else READING
        self.deadline = 0.0
        self.mask = 0  # the events registered with the poller (0: not registered)
        self.keep = False  # keep the connection after the answer being written
        self.held = 0  # bytes of this connection counted in the worker's BUFFER_BUDGET


class Writer:
    """The socket as a thread writes the answer to it: never blocking; what the socket does not take
    at once is kept in `pending`, in order, for the main loop to send."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending: deque[bytes] = deque()

    def sendall(self, data: bytes) -> None:
        if not self.pending:
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                sent = 0  # TLS: the retry must send the very same bytes, as it will from `pending`
            data = data[sent:]
        if data:
            self.pending.append(bytes(data))

    def send(self, data: bytes) -> int:
        # gunicorn sends "100 Continue" before the app reads the body; the body is here already (and
        # the main loop sent one when the client asked for it), so that one is left out.
        if data != CONTINUE:
            self.sendall(data)
        return len(data)

    def gettimeout(self) -> float:
        return 0.0  # so gunicorn's write_nonblock leaves the socket's mode alone

    def shutdown(self, how: int) -> None:
        # gunicorn half-closes after an error mid-answer; the main loop closes the connection instead.
        raise OSError(errno.ENOTCONN, "closed by the main loop")


class Exchange(NamedTuple):
    """What gunicorn's handle_request reads from a connection: the answer goes to the Writer."""

    sock: Writer
    client: Any
    server: Any


class WebhookWorker(ThreadWorker):  # type: ignore[misc]  # gunicorn is untyped
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conns: set[Connection] = set()
        self.fresh: dict[Connection, None] = {}  # no request completed yet, oldest first
        self.idle: dict[Connection, None] = {}  # kept alive between requests, longest idle first
        self.held = 0  # bytes in the framers of connections not being served
        self.next_sweep = 0.0
        self.worker_connections: int = self.cfg.worker_connections
        self.refused_since_log = 0  # refused client certificates not logged yet (rate limit)
        self.next_refused_log = 0.0

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
        conn = Connection(sock, client, server, RequestFramer(MAX_BODY_BYTES))
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
        self.account(conn, 0)
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
        """Close the connections past their deadline (checked every SWEEP_SECONDS)."""
        now = time.monotonic()
        if now < self.next_sweep:
            return
        self.next_sweep = now + SWEEP_SECONDS
        for conn in [c for c in self.conns if c.state != SERVING and c.deadline <= now]:
            self.log.debug("closing a connection from %s: too slow (state %d)", conn.client, conn.state)
            self.close(conn)

    def failed(self, conn: Connection, exc: OSError) -> None:
        """Reading or writing failed (the client went away, or broke TLS): close the connection."""
        self.log.debug("connection from %s failed: %s", conn.client, exc)
        self.close(conn)

    def account(self, conn: Connection, held: int) -> None:
        """Count the bytes incomplete requests hold; past the budget, close the connection holding most."""
        self.held += held - conn.held
        conn.held = held
        while self.held > BUFFER_BUDGET:
            biggest = max(self.conns, key=lambda c: c.held)
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
        """Read what the client sent; hand a complete request to a thread, else wait for more."""
        framer = conn.framer
        eof = False
        while len(framer) <= framer.limit:
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
            if not data:
                eof = True
                break
            if conn.state == IDLE:  # the next request has begun: it has REQUEST_SECONDS from now
                conn.state = READING
                conn.deadline = time.monotonic() + REQUEST_SECONDS
                self.idle.pop(conn, None)
            framer.feed(data)
            if len(data) < RECV_BYTES and not tls_pending(conn.sock):
                break  # all there was: the poller tells when more comes (saves a failing recv per request)
        try:
            framed = framer.next_request()
        except FramingError as exc:
            self.log.debug("closing a connection from %s: %s", conn.client, exc)
            self.close(conn)
            return
        if framed is not None:
            self.submit(conn, framed.data, close=framed.close or eof)
        elif eof or len(framer) > framer.limit:
            self.close(conn)
        else:
            self.account(conn, len(framer))
            if conn not in self.conns:  # it held the most when the budget ran out
                return
            if framer.continue_due:
                framer.continue_due = False
                self.send_continue(conn)
            self.watch(conn, selectors.EVENT_READ)

    def send_continue(self, conn: Connection) -> None:
        """The client waits for "100 Continue" before it sends the body; a few bytes on a connection that
        has sent nothing back yet always fit. If not, the client sends the body after its own wait."""
        try:
            conn.sock.send(CONTINUE)
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            self.log.debug("could not send 100 Continue to %s at once", conn.client)
        except OSError as exc:
            self.log.debug("connection from %s failed: %s", conn.client, exc)

    def submit(self, conn: Connection, data: bytes, *, close: bool) -> None:
        conn.state = SERVING
        conn.keep = not close
        self.watch(conn, 0)
        self.fresh.pop(conn, None)
        self.idle.pop(conn, None)
        self.account(conn, 0)
        future = self.tpool.submit(self.serve, conn, data)
        future.add_done_callback(lambda done: self.method_queue.defer(self.served, conn, done))

    def served(self, conn: Connection, future: Future[bool]) -> None:
        """Back from the thread (on the main loop): send what is left of the answer, then carry on."""
        conn.keep = conn.keep and not future.cancelled() and future.result()
        if conn not in self.conns:
            return
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
        if len(conn.framer):
            conn.state = READING  # it has begun: pipelined behind the last one, or sent meanwhile
            conn.deadline = time.monotonic() + REQUEST_SECONDS
        else:
            conn.state = IDLE
            conn.deadline = time.monotonic() + self.cfg.keepalive
            self.idle[conn] = None
        if len(conn.framer) or tls_pending(conn.sock):
            self.read(conn)  # bytes the poller cannot see: already read, or decrypted and held by TLS
        else:
            self.watch(conn, selectors.EVENT_READ)

    def linger(self, conn: Connection) -> None:
        """Close after the last answer: FIN first, then read and drop what the client still sends
        until it closes, so that the kernel does not answer it with a reset that loses the answer."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self.close(conn)
            return
        conn.state = LINGERING
        conn.deadline = time.monotonic() + LINGER_SECONDS
        self.account(conn, 0)
        self.watch(conn, selectors.EVENT_READ)

    def drain(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(LINGER_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data or len(data) == LINGER_BYTES:  # closed by the client, or it still sends a lot: done
            self.close(conn)

    # --- a thread's side ----------------------------------------------------------------------------

    def serve(self, conn: Connection, data: bytes) -> bool:
        """Answer one complete request (in a thread); True when the connection may be kept."""
        parser = RequestParser(self.cfg, [data], conn.client)  # reads from memory, never the socket
        exchange = Exchange(conn.writer, conn.client, conn.server)
        req = None
        try:
            req = next(parser)
            if not conn.keep:  # the answer says so: the connection closes after it (webhook.serving.http1)
                req.force_close()
            keep = bool(self.handle_request(req, exchange))
            # Whatever the app left of the body is dropped; bytes gunicorn did not read as this request
            # mean it framed it differently than webhook.serving.http1 did: the connection is not trusted.
            drained = parser.finish_body()
            leftover = parser.unreader.take_buffered() or parser.unreader.chunk()
            return keep and drained and not leftover
        except (StopIteration, NoMoreData):
            return False
        except OSError as exc:  # writing the answer failed: the client went away
            self.log.debug("connection from %s failed: %s", conn.client, exc)
            return False
        except Exception as exc:  # gunicorn's own handling: a 400 for a malformed request, else a 500, logged
            self.handle_error(req, conn.writer, conn.client, exc)
            return False


def tls_pending(sock: socket.socket) -> int:
    """Bytes TLS has decrypted and holds for the next recv: the poller does not see them."""
    return sock.pending() if isinstance(sock, ssl.SSLSocket) else 0


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
