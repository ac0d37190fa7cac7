"""One HTTP/1.1 connection's requests in and answers out, on h11. No sockets here.

gpupool's worker (webhook.serving.worker) reads every connection in its event loop and feeds what it
reads to this connection's `HttpConnection`; a request comes out once all of it is there, parsed
once: method, target, headers and body. The parsing is h11's (sans-I/O, fuzzed, linear in the bytes it
is given, with O(1) state per chunk of a chunked body); this module adds gpupool's limits and turns
every protocol error into the answer it deserves.

The answer is framed here, not by h11: the app's answer is whole (status, headers, the body in memory),
so framing it is one status line, its header fields checked as h11 checks them, a Content-Length, and
the body. Through h11 (three events through its state machine, its header normalisation) that took
about 25 µs per admission, a tenth of a whole request's CPU in the server (docs/performance.md). h11
still reads every request: after an answer the connection's next request starts on a new h11 state with
the bytes that followed this one.

Refused with an answer, and the connection closed after it (`ProtocolError`):
- what h11 refuses (400): a malformed request line, header or chunk size (`0x2`, `1_0`), HTTP/1.1
  without exactly one Host, conflicting Content-Length values; a transfer coding other than chunked
  (501); a head, chunk-size line or trailer section over HEAD_LIMIT bytes (431);
- and besides: Content-Length together with Transfer-Encoding (400: the framing is ambiguous, the
  classic request smuggling), more than MAX_HEADERS header fields (431), a chunked body in more than
  MAX_CHUNKS chunks (400: tiny chunks cost the main loop far more per byte than anything else).

A body over `max_body`: a declared Content-Length over it is handed over at once with the head alone
(the app answers 413 from the header); a chunked body that grows past it is handed over cut at
`max_body` + 1 bytes (the app reads past its limit and answers 413). Either way the rest is not read as
a request and the connection closes after the answer (`Request.close`).

A port that serves only requests without a body (the health port: GET and HEAD) makes its connections
`head_only`: a head that announces a body (a Content-Length over 0, or a Transfer-Encoding) is handed
over at once, alone, with `Request.close` set, so the port answers it from the head and no byte of the
body is waited for or read.

Both ports frame their answers here: `answer` gives the bytes to send in one piece (the admission port),
`answer_parts` the head and the body apart, for a port that sends one body to many clients without a copy
per client (the health port's /metrics).
"""

from __future__ import annotations

import email.utils
import re
import time
from http import HTTPStatus
from typing import NamedTuple

import h11

from webhook.serving.review import status_body

HEAD_LIMIT = 64 * 1024  # request line and headers (also a chunk-size line, trailers); kube-apiserver sends < 1 KiB
MAX_HEADERS = 100  # header fields of a request (gunicorn's default limit too); kube-apiserver sends about 8
MAX_CHUNKS = 1024  # chunks of one chunked body: a client streaming 19 MiB sends KiBs per chunk, not bytes
JSON = b"application/json"
# What h11 accepts in a header field it sends (RFC 9110's token and field-value): the app's answer cannot
# smuggle a line break into the answer.
_FIELD_NAME = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(rb"(?:[\x21-\x7e\x80-\xff](?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?")
_NO_BODY = (204, 304)  # answers that never carry a body, whatever their headers say


class Request(NamedTuple):
    """One whole request, as the client sent it."""

    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]  # in order, names lower-cased
    body: bytes
    http_version: bytes
    close: bool  # the rest of the request was not read: the connection closes after the answer


class Answer(NamedTuple):
    """What the WSGI app answered."""

    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


class ProtocolError(Exception):
    """Not a request gpupool answers: answer `status` with a JSON Status naming the problem, then close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class HttpConnection:
    """The HTTP/1.1 state of one connection: bytes in, whole requests out, answers framed."""

    def __init__(self, max_body: int, head_limit: int = HEAD_LIMIT, *, head_only: bool = False) -> None:
        self._max_body = max_body
        self._head_limit = head_limit
        self._head_only = head_only  # a request announcing a body is handed over with its head alone
        self._start_request(b"")

    def _start_request(self, data: bytes) -> None:
        """A new request on this connection, beginning with `data` (bytes that followed the last one)."""
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=self._head_limit)
        if data:
            self._h11.receive_data(data)
        # The bytes h11 holds unparsed, counted here (h11 has no public count of them): what was fed since
        # the count was last known; `_recount` once h11 has parsed some of them (an event came out).
        self._unparsed = len(data)
        self._recount = False
        self._head: h11.Request | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []  # the body's pieces as h11 gives them, joined once
        self._size = 0  # their bytes
        self._chunks = 0
        self._method = b""  # of the request being answered (a HEAD answer has no body)
        self._client_keeps = False  # the client keeps the connection after the answer (HTTP/1.1, no close)
        self._reusable = False  # answered, and the connection may carry a next request

    def feed(self, data: bytes) -> None:
        """Bytes the client sent (never empty: the worker closes at EOF, there is nothing to parse then)."""
        self._h11.receive_data(data)
        self._unparsed += len(data)

    @property
    def held(self) -> int:
        """Bytes this connection holds of requests not handed over: what h11 has not parsed yet (at most
        HEAD_LIMIT once it asks for more, plus what one read brought) and the body so far."""
        return self._unparsed_bytes() + self._size

    @property
    def buffered(self) -> bool:
        """Bytes of a next request have arrived already (pipelined, or sent meanwhile)."""
        return self._unparsed_bytes() > 0

    def _unparsed_bytes(self) -> int:
        """What h11 holds unparsed. Counted as it is fed; measured (`trailing_data`, a copy) only after h11
        parsed something, when what is left is what followed the event's end: at most what the last feeds
        brought, never a head fed one byte at a time (no event comes out of that until its end), so the
        copies add up to no more than the bytes received."""
        if self._recount:
            self._unparsed = len(self._h11.trailing_data[0])
            self._recount = False
        return self._unparsed

    def next_request(self) -> Request | None:
        """The next whole request; None while more bytes are needed. Raises ProtocolError."""
        try:
            while True:
                event = self._h11.next_event()
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    return None
                self._recount = True  # h11 parsed some of what it held
                if isinstance(event, h11.Data):
                    if request := self._data(event):
                        return request
                elif isinstance(event, h11.Request):
                    if request := self._request(event):
                        return request
                elif isinstance(event, h11.EndOfMessage):
                    return self._take(close=False)
                else:  # ConnectionClosed: the worker never feeds EOF, so this is h11 being careful
                    raise ProtocolError(400, "the connection was closed in the middle of a request")
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:  # h11's incomplete-event limit, the only 431 it gives
                limit = self._head_limit
                message = f"a request head, chunk-size line or trailer section over {limit} bytes; accepted: {limit}"
                raise ProtocolError(431, message) from None
            raise ProtocolError(exc.error_status_hint, f"malformed request: {exc}") from None

    def _request(self, event: h11.Request) -> Request | None:
        self._head = event
        self._method = event.method
        self._headers = headers = list(event.headers)  # once: h11's Headers yields each item by a call
        if len(headers) > MAX_HEADERS:
            raise ProtocolError(431, f"more than {MAX_HEADERS} header fields; accepted: at most {MAX_HEADERS}")
        length = coding = None
        keeps = event.http_version >= b"1.1"  # h11's rule: HTTP/1.0 closes, and so does Connection: close
        for name, value in headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                coding = value
            elif name == b"connection" and b"close" in (token.strip().lower() for token in value.split(b",")):
                keeps = False
        self._client_keeps = keeps
        if length is not None and coding is not None:
            raise ProtocolError(400, "Content-Length together with Transfer-Encoding: the body's end is ambiguous")
        if length is not None and int(length) > self._max_body:
            return self._take(close=True)  # the app answers 413 from the header alone
        if self._head_only and (coding is not None or (length is not None and int(length) > 0)):
            return self._take(close=True)  # the port answers from the head; the body is never read
        return None

    def _data(self, event: h11.Data) -> Request | None:
        if event.chunk_start:
            self._chunks += 1
            if self._chunks > MAX_CHUNKS:
                raise ProtocolError(400, f"a chunked body in more than {MAX_CHUNKS} chunks; send larger chunks")
        self._body.append(event.data)
        self._size += len(event.data)
        if self._size > self._max_body:
            # Enough for the app to see the body is too large (413).
            self._body = [b"".join(self._body)[: self._max_body + 1]]
            self._size = len(self._body[0])
            return self._take(close=True)
        return None

    def _take(self, *, close: bool) -> Request:
        head = self._head
        assert head is not None
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)  # one piece: no copy
        request = Request(head.method, head.target, self._headers, body, head.http_version, close)
        self._body, self._size = [], 0
        return request

    def continue_due(self) -> bytes:
        """The bytes of "100 Continue", once, while the client waits for it to send the body; else nothing."""
        if not self._h11.they_are_waiting_for_100_continue:
            return b""
        return self._h11.send(h11.InformationalResponse(status_code=100, reason=b"Continue", headers=[]))

    def answer(self, answer: Answer, *, close: bool) -> bytes:
        """The bytes of the answer to the request handed over last. Raises h11.LocalProtocolError when the
        app's answer cannot be sent as it is (a header field h11 would refuse, a body that is not its
        Content-Length, a Transfer-Encoding on a body that is whole)."""
        head, body = self._frame(answer, close=close)
        if body:
            head.append(body)
        return b"".join(head)

    def answer_parts(self, answer: Answer, *, close: bool) -> tuple[bytes, bytes]:
        """`answer`'s bytes as the head and the body to send after it (empty when none is sent: HEAD, 204,
        304), the body being `answer.body` itself, never a copy. Raises h11.LocalProtocolError as `answer`."""
        head, body = self._frame(answer, close=close)
        return b"".join(head), body

    def _frame(self, answer: Answer, *, close: bool) -> tuple[list[bytes], bytes]:
        """The pieces of the answer's head, and the body to send after it."""
        status = answer.status
        sends_body = self._method != b"HEAD" and status not in _NO_BODY
        head = [b"HTTP/1.1 %d %s\r\n" % (status, answer.reason)]
        length = None
        for name, value in answer.headers:
            if _FIELD_NAME.fullmatch(name) is None or _FIELD_VALUE.fullmatch(value) is None:
                raise h11.LocalProtocolError(f"illegal header field {name[:64]!r}: {value[:64]!r}")
            lower = name.lower()
            if lower == b"content-length":
                if not value.isdigit() or (length is not None and value != length):
                    raise h11.LocalProtocolError(f"bad Content-Length {value[:64]!r}")
                if length is not None:
                    continue  # the same value again: sent once
                length = value
            elif lower == b"transfer-encoding":
                raise h11.LocalProtocolError("Transfer-Encoding on an answer whose body is whole")
            elif lower == b"connection":
                continue  # hop-by-hop: the server's to say (PEP 3333), below
            head.append(b"%s: %s\r\n" % (name, value))
        if sends_body:
            if length is None:
                head.append(b"Content-Length: %d\r\n" % len(answer.body))
            elif int(length) != len(answer.body):
                raise h11.LocalProtocolError(f"a body of {len(answer.body)} bytes with Content-Length {length!r}")
        head.append(b"Date: %s\r\n" % http_date())
        keep = not close and self._client_keeps
        if not keep:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        # Only a request read to its end leaves the connection at the next one's first byte.
        self._reusable = keep and self._h11.their_state is h11.DONE
        return head, answer.body if sends_body else b""

    def refusal(self, error: ProtocolError) -> bytes:
        """The bytes of the answer to a request refused for `error` (the connection closes after it)."""
        reason = status_reason(error.status)
        body = status_body(error.status, error.message, reason.replace(" ", ""))
        answer = Answer(
            error.status, reason.encode(), [(b"Content-Type", JSON), (b"Content-Length", b"%d" % len(body))], body
        )
        return self.answer(answer, close=True)  # h11 lets a server answer whatever the client did

    def next_cycle(self) -> bool:
        """After an answer: ready for the connection's next request (False: it must close)."""
        if not self._reusable:
            return False
        rest, _ = self._h11.trailing_data  # a pipelined request, or the start of one: usually nothing
        self._start_request(rest)
        return True


def status_reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class _DateCache:
    """The Date header's value (RFC 9110 asks an origin server for one), formatted once a second. Threads
    share it: two of them racing only format the same second twice."""

    def __init__(self) -> None:
        self._second = 0
        self._value = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._value = email.utils.formatdate(now, usegmt=True).encode()
            self._second = now
        return self._value


http_date = _DateCache()
