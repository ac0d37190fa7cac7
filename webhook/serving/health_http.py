"""One connection of the health port: its socket, its HTTP/1.1 state and the answer being written.

The requests are read and the answers framed by the admission port's own connection class
(webhook.serving.http11.HttpConnection, on h11): one reader of HTTP/1.1 with one set of rules (keep-alive,
pipelining, HEAD, `Connection: close`, HTTP/1.0, the Host rule, the limits on the head and its header
fields, Content-Length with Transfer-Encoding). The connection is `head_only`: none of the endpoints
takes a body, so a request that announces one is handed over with its head alone, answered, and the
connection closed, without a byte of the body read. This module turns those requests into the few the
port serves and its answers into bytes, and never blocks: the socket is non-blocking and
webhook.serving.health's loop calls in when it is ready. What a connection holds is bounded: h11 buffers
at most one head (`MAX_HEAD`) plus one read, because the loop reads only when a request is needed, and
an answer's body is shared, never copied.
"""

from __future__ import annotations

import contextlib
import socket
from collections import deque
from dataclasses import dataclass

import orjson

from webhook.serving import http11

JSON = "application/json"
MAX_HEAD = 16 * 1024  # a probe's request is a few hundred bytes
RECV_SIZE = 65536
SERVES = "this port serves GET and HEAD of /healthz, /readyz and /metrics"
MAX_ECHO = 200  # characters of a malformed request quoted back in the error


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    line: str  # the request line, for the log
    has_body: bool  # none of the endpoints takes one: answered, then the connection is closed


@dataclass(frozen=True, slots=True)
class Answer:
    code: int
    body: bytes
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()


def error(code: int, message: str, *headers: tuple[str, str]) -> Answer:
    return Answer(code, orjson.dumps({"error": message}), JSON, headers)


# What a malformed request is logged as: there is no request line to show.
UNREADABLE = Request("-", "", "-", has_body=True)


class Conn:
    """A client connection: `reading` a request, `waiting` for a call to answer it, or `writing` the answer.

    `opened` is when it was accepted (eviction picks the oldest); `deadline` is when the loop gives up on the
    current state (closes, or answers 503 if still waiting); `served` counts the answers written."""

    __slots__ = ("closed", "deadline", "events", "http", "opened", "out", "peer", "request", "served", "sock", "state")

    def __init__(self, sock: socket.socket, peer: str, now: float, deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.http = http11.HttpConnection(0, MAX_HEAD, head_only=True)
        self.state = "reading"
        self.request: Request | None = None  # the request being answered
        self.out: deque[memoryview] = deque()
        self.closed = False
        self.events = 0  # what the selector watches for: 0 (not registered), EVENT_READ or EVENT_WRITE
        self.opened = now
        self.deadline = deadline
        self.served = 0

    @property
    def buffered(self) -> bool:
        """Bytes of a next request (pipelined, or its start) are already received."""
        return self.http.buffered

    @property
    def idle(self) -> bool:
        """Kept alive between requests, with nothing of the next one yet (a fresh connection is mid-request)."""
        return self.state == "reading" and self.served > 0 and not self.buffered

    def phase(self) -> str:
        """Where the exchange was, for the log line of a client that went away."""
        if self.state == "writing":
            return "mid-response"
        if self.buffered or self.state == "waiting":
            return "mid-request"
        return "between requests" if self.served else "before sending a request"

    def receive(self) -> bool:
        """Read what the client sent; False when it closed the connection. Raises BlockingIOError, OSError."""
        data = self.sock.recv(RECV_SIZE)
        if not data:
            return False
        self.http.feed(data)
        return True

    def next_request(self) -> Request | Answer | None:
        """The next whole request received; an error answer if it is malformed; None if more bytes are needed."""
        try:
            request = self.http.next_request()
        except http11.ProtocolError as exc:  # what is wrong, and the limit when one was passed
            return error(exc.status, f"{exc.message[:MAX_ECHO]}; {SERVES}")
        if request is None:
            return None
        method, target = request.method.decode("latin-1"), request.target.decode("latin-1")
        line = f"{method} {target} HTTP/{request.http_version.decode('latin-1')}"
        # Handed over with `close` only when the head announced a body (the connection is head-only).
        return Request(method, target.split("?", 1)[0], line, has_body=request.close)

    def answer(self, request: Request, answer: Answer, *, close: bool) -> None:
        """Frame `answer` to `request` for writing; `close` ends the connection once it is written."""
        headers = [
            (b"Server", b"gpupool-health"),
            (b"Content-Type", answer.content_type.encode("latin-1")),
            (b"Content-Length", b"%d" % len(answer.body)),  # HEAD too: the length GET's body would have
            *((name.encode("latin-1"), value.encode("latin-1")) for name, value in answer.headers),
        ]
        reason = http11.status_reason(answer.code).encode("latin-1")
        framed = http11.Answer(answer.code, reason, headers, answer.body)
        head, body = self.http.answer_parts(framed, close=close or request.has_body)
        self.out = deque(memoryview(piece) for piece in (head, body) if piece)  # the body shared, not copied
        self.request = request

    def flush(self) -> bool:
        """Write what the socket takes: True once the whole answer is written. Raises OSError."""
        try:
            while self.out:
                sent = self.sock.sendmsg(self.out)
                while sent:
                    first = self.out[0]
                    if sent < len(first):
                        self.out[0] = first[sent:]
                        break
                    sent -= len(first)
                    self.out.popleft()
        except BlockingIOError:
            return False
        self.served += 1
        return True

    def next_cycle(self) -> bool:
        """After an answer is written: ready for the next request on this connection, or False to close it."""
        if not self.http.next_cycle():
            return False  # this connection ends (Connection: close, HTTP/1.0, an error, a body not read)
        self.request = None
        return True

    def close(self) -> None:
        self.closed = True
        self.out.clear()
        # shutdown first: a gunicorn worker forked while this connection was open holds a copy of the
        # descriptor, and close() alone would leave the client waiting for an end that never comes.
        with contextlib.suppress(OSError):  # the client may have reset it already
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
