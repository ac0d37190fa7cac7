"""One connection of the health port: its socket, its HTTP/1.1 state and the answer being written.

h11 reads the requests and frames the answers (keep-alive, pipelining, HEAD, `Connection: close`,
HTTP/1.0, the Host rule, the head size limit): the project reads HTTP with one well-kept, fuzzed parser
rather than its own. This module turns h11's events into the few requests the port serves and answers
into bytes, and never blocks: the socket is non-blocking and webhook.serving.health's loop calls in when
it is ready. What a connection holds is bounded: h11 buffers at most one head (`MAX_HEAD`) plus one read,
because the loop reads only when h11 needs more bytes, and an answer's body is shared, never copied.
"""

from __future__ import annotations

import contextlib
import socket
from collections import deque
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus

import h11
import orjson

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
        self.http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
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
        return bool(self.http.trailing_data[0])

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
        self.http.receive_data(data)
        return True

    def next_request(self) -> Request | Answer | None:
        """The next whole request received; an error answer if it is malformed; None if more bytes are needed."""
        try:
            event = self.http.next_event()
            if event is h11.NEED_DATA:
                return None
            if not isinstance(event, h11.Request):  # h11 gives nothing else before a request when reading
                return error(400, f"not an HTTP/1.1 request; {SERVES}")
            method, target = event.method.decode("latin-1"), event.target.decode("latin-1")
            line = f"{method} {target} HTTP/{event.http_version.decode('latin-1')}"
            # A request without a body ends at once; anything else means a body nobody reads.
            has_body = not isinstance(self.http.next_event(), h11.EndOfMessage)
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:
                return error(431, f"request head over {MAX_HEAD} bytes")
            return error(exc.error_status_hint, f"not a valid HTTP/1.1 request ({str(exc)[:MAX_ECHO]}); {SERVES}")
        return Request(method, target.split("?", 1)[0], line, has_body)

    def answer(self, request: Request, answer: Answer, *, close: bool) -> None:
        """Frame `answer` to `request` for writing; `close` ends the connection once it is written."""
        headers = [
            ("Server", "gpupool-health"),
            ("Date", formatdate(usegmt=True)),
            ("Content-Type", answer.content_type),
            ("Content-Length", str(len(answer.body))),
            *answer.headers,
        ]
        if close or request.has_body or self.http.their_state is h11.ERROR:
            headers.append(("Connection", "close"))
        reason = HTTPStatus(answer.code).phrase.encode("latin-1")
        pieces = self.http.send_with_data_passthrough(
            h11.Response(status_code=answer.code, headers=headers, reason=reason)
        )
        out = deque(memoryview(piece) for piece in pieces or ())
        if request.method != "HEAD" and answer.body:
            out.append(memoryview(answer.body))  # the body itself, shared by every connection it goes to
            self.http.send_with_data_passthrough(h11.Data(data=answer.body))
        self.http.send(h11.EndOfMessage())  # framed by Content-Length: nothing more to write
        self.request = request
        self.out = out

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
        if self.http.our_state is not h11.DONE or self.http.their_state is not h11.DONE:
            return False  # h11 says this connection ends (Connection: close, HTTP/1.0, an error, a body)
        self.http.start_next_cycle()
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
