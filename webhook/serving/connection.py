"""One client connection as gpupool's worker (webhook.serving.worker) keeps it, and the socket as a
thread writes an answer to it."""

from __future__ import annotations

import select
import socket
import ssl
from collections import deque
from typing import Any

from webhook.serving.app import MAX_BODY_BYTES
from webhook.serving.http11 import HttpConnection, Request

HUNG_UP = select.POLLRDHUP | select.POLLHUP | select.POLLERR

# What a connection is doing; the worker's main loop watches every state but QUEUED and SERVING.
HANDSHAKE, READING, IDLE, QUEUED, SERVING, WRITING, LINGERING = range(7)


class Connection:
    """One client connection and everything the main loop knows about it."""

    __slots__ = (
        "client",
        "deadline",
        "drained",
        "held",
        "http",
        "keep",
        "linger_until",
        "mask",
        "request",
        "server",
        "sock",
        "state",
        "writer",
    )

    def __init__(self, sock: socket.socket, client: Any, server: Any) -> None:
        self.sock = sock
        self.client, self.server = client, server
        self.http = HttpConnection(MAX_BODY_BYTES)
        self.writer = Writer(sock)
        self.state = HANDSHAKE if isinstance(sock, ssl.SSLSocket) else READING
        self.deadline = 0.0
        self.mask = 0  # the events registered with the poller (0: not registered)
        self.keep = False  # keep the connection after the answer being written
        self.held = 0  # bytes of this connection counted in the worker's budget
        self.request: Request | None = None  # complete, waiting for a thread or being answered
        self.drained = 0  # bytes read and dropped while lingering
        self.linger_until = 0.0  # the latest a lingering close may wait


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


def hung_up(sock: socket.socket) -> bool:
    """The client closed its side (or the connection broke): nobody would read an answer."""
    poller = select.poll()
    poller.register(sock, HUNG_UP)
    return any(events & HUNG_UP for _, events in poller.poll(0))


def tls_pending(sock: socket.socket) -> int:
    """Bytes TLS has decrypted and holds for the next recv: the poller does not see them."""
    return sock.pending() if isinstance(sock, ssl.SSLSocket) else 0
