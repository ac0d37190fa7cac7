"""The worker's main loop's side of a connection (webhook.serving.worker): everything that waits for the
client, never blocking.

Each time the poller sees the event a connection waits for, `on_ready` carries on from its state: the
TLS handshake; reading, with h11 parsing the request as its bytes arrive (webhook.serving.http11), until
it is complete and goes to `submit` (the worker's, which finds it a thread); the rest of an answer the
thread could not write at once; then the next request of a kept-alive connection, or a lingering close.
A request the main loop refuses (malformed, too large, no thread for it) is answered here too.
"""

from __future__ import annotations

import selectors
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from webhook.serving.app import MAX_BODY_BYTES
from webhook.serving.clients import Clients
from webhook.serving.connection import HANDSHAKE, IDLE, LINGERING, READING, WRITING, Connection, tls_pending
from webhook.serving.http11 import ProtocolError, Request

REQUEST_SECONDS = 5.0  # to send a whole request (kube-apiserver sends one in well under a millisecond)
# After the last answer, what the client still sends is read and dropped (then the close is a FIN, not a
# reset that would lose the answer): until it has been quiet for LINGER_SECONDS, for REQUEST_SECONDS at
# most (the time it had to send a request), and LINGER_BYTES at most (the rest of a body over the limit).
LINGER_SECONDS = 2.0
LINGER_BYTES = MAX_BODY_BYTES + 1024 * 1024
RECV_BYTES = 256 * 1024
TURN_BYTES = 256 * 1024  # read from one connection per turn of the main loop, so that others get theirs
REFUSED_LOG_SECONDS = 1.0  # at most one warning per second about refused client certificates
# OpenSSL's reasons when --client-ca refuses a client: the admin wants to hear of these (a kube-apiserver
# with the wrong certificate), while every other failed handshake is a client gone or a scanner.
CLIENT_REFUSED = frozenset({"PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_VERIFY_FAILED"})


class ClientIO:
    """The main loop's reading and writing on the connections of `clients`; a complete request goes to
    `submit`, and a connection kept alive may wait `keepalive` seconds for its next request."""

    def __init__(
        self, clients: Clients, log: Any, *, keepalive: float, submit: Callable[[Connection, Request], None]
    ) -> None:
        self.clients = clients
        self.log = log
        self.keepalive = keepalive
        self.submit = submit
        self.refused_since_log = 0  # refused client certificates not logged yet (rate limit)
        self.next_refused_log = 0.0

    def on_ready(self, conn: Connection) -> None:
        """The poller saw the event the connection waits for: carry on from its state."""
        if conn not in self.clients:  # closed by an event before it in the same turn
            return
        if conn.state == HANDSHAKE:
            self.handshake(conn)
        elif conn.state in (READING, IDLE):
            self.read(conn)
        elif conn.state == WRITING:
            self.flush(conn)
        elif conn.state == LINGERING:
            self.drain(conn)

    def failed(self, conn: Connection, exc: OSError) -> None:
        """Reading or writing failed (the client went away, or broke TLS): close the connection."""
        self.log.debug("connection from %s failed: %s", conn.client, exc)
        self.clients.close(conn)

    # --- a request coming in ------------------------------------------------------------------------

    def handshake(self, conn: Connection) -> None:
        assert isinstance(conn.sock, ssl.SSLSocket)
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.clients.watch(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self.clients.watch(conn, selectors.EVENT_WRITE)
            return
        except OSError as exc:  # ssl.SSLError included: a client gpupool refuses, or one that went away
            if isinstance(exc, ssl.SSLError) and exc.reason in CLIENT_REFUSED:
                self.refused(conn, exc)
            else:
                self.log.debug("TLS handshake with %s failed: %s", conn.client, exc)
            self.clients.close(conn)
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
                self.clients.watch(conn, selectors.EVENT_WRITE)
                return
            except OSError as exc:
                self.failed(conn, exc)
                return
            if not data:  # the client closed in the middle of a request, or between two
                self.clients.close(conn)
                return
            if conn.state == IDLE:  # the next request has begun
                self.begin_request(conn)
            conn.http.feed(data)
            if self.parse(conn):
                return
            got += len(data)
            if tls_pending(conn.sock):
                continue  # decrypted already, and the poller cannot see it: take it now
            if got >= TURN_BYTES or len(data) < RECV_BYTES:
                break  # all there was, or this connection's share: the poller tells when more is there
        self.clients.watch(conn, selectors.EVENT_READ)

    def begin_request(self, conn: Connection) -> None:
        """The first bytes of the next request on a kept-alive connection: it has REQUEST_SECONDS from now."""
        conn.state = READING
        conn.deadline = time.monotonic() + REQUEST_SECONDS
        self.clients.idle.pop(conn, None)

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
        self.clients.account(conn, conn.http.held)
        if conn not in self.clients:  # it held the most when the budget ran out
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
        self.clients.clear(conn)
        conn.writer.sendall(conn.http.refusal(error))
        self.answered(conn, keep=False)

    # --- an answer going out ------------------------------------------------------------------------

    def answered(self, conn: Connection, *, keep: bool) -> None:
        """The answer is in the connection's writer: send what is left of it, then keep the connection
        (`keep`) or close it."""
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
                self.clients.watch(conn, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self.clients.watch(conn, selectors.EVENT_READ)
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
            self.begin_request(conn)
            if self.parse(conn):
                return
        else:
            conn.state = IDLE
            conn.deadline = time.monotonic() + self.keepalive
            self.clients.idle[conn] = None
        if tls_pending(conn.sock):
            self.read(conn)  # decrypted and held by TLS: the poller cannot see it
        else:
            self.clients.watch(conn, selectors.EVENT_READ)

    def linger(self, conn: Connection) -> None:
        """Close after the last answer: FIN first, then read and drop what the client still sends (the
        rest of a body too large, say) until it closes, so that the kernel does not answer it with a reset
        that loses the answer."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)  # on TLS this drops the TLS layer: the rest is read raw
        except OSError:
            self.clients.close(conn)
            return
        conn.state = LINGERING
        conn.linger_until = time.monotonic() + REQUEST_SECONDS
        conn.deadline = time.monotonic() + LINGER_SECONDS
        self.clients.watch(conn, selectors.EVENT_READ)

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
                self.clients.close(conn)
                return
        conn.deadline = min(time.monotonic() + LINGER_SECONDS, conn.linger_until)
