"""One HTTP/1.1 connection's requests in and answers out, on h11. No sockets here.

gpupool's worker (webhook.serving.worker) reads every connection in its event loop and feeds what it
reads to this connection's `HttpConnection`; a request comes out once all of it is there, parsed
once: method, target, headers and body. The parsing is h11's (sans-I/O, fuzzed, linear in the bytes it
is given, with O(1) state per chunk of a chunked body); this module adds gpupool's limits and turns
every protocol error into the answer it deserves. The answer is framed by h11 too.

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
"""

from __future__ import annotations

import email.utils
import time
from http import HTTPStatus
from typing import NamedTuple

import h11

from webhook.serving.review import status_body

HEAD_LIMIT = 64 * 1024  # request line and headers (also a chunk-size line, trailers); kube-apiserver sends < 1 KiB
MAX_HEADERS = 100  # header fields of a request (gunicorn's default limit too); kube-apiserver sends about 8
MAX_CHUNKS = 1024  # chunks of one chunked body: a client streaming 3 MiB sends KiBs per chunk, not bytes
JSON = b"application/json"


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

    def __init__(self, max_body: int) -> None:
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
        self._max_body = max_body
        self._start_request()

    def _start_request(self) -> None:
        self._head: h11.Request | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body = bytearray()
        self._chunks = 0
        self._method = b""  # of the request being answered (a HEAD answer has no body)

    def feed(self, data: bytes) -> None:
        """Bytes the client sent (never empty: the worker closes at EOF, there is nothing to parse then)."""
        self._h11.receive_data(data)

    @property
    def held(self) -> int:
        """Bytes this connection holds of requests not handed over: what h11 has not parsed yet (at most
        HEAD_LIMIT once it asks for more, plus what one read brought) and the body so far."""
        # h11 has no public count of its buffer (`trailing_data` copies it, which on a head sent one
        # byte at a time would cost quadratic time); the buffer's length is O(1).
        return len(self._h11._receive_buffer) + len(self._body)

    @property
    def buffered(self) -> bool:
        """Bytes of a next request have arrived already (pipelined, or sent meanwhile)."""
        return bool(self._h11._receive_buffer)

    def next_request(self) -> Request | None:
        """The next whole request; None while more bytes are needed. Raises ProtocolError."""
        try:
            while True:
                event = self._h11.next_event()
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    return None
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
            raise ProtocolError(exc.error_status_hint, f"malformed request: {exc}") from None

    def _request(self, event: h11.Request) -> Request | None:
        self._head = event
        self._method = event.method
        self._headers = headers = list(event.headers)  # once: h11's Headers yields each item by a call
        if len(headers) > MAX_HEADERS:
            raise ProtocolError(431, f"more than {MAX_HEADERS} header fields; accepted: at most {MAX_HEADERS}")
        length = coding = None
        for name, value in headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                coding = value
        if length is not None and coding is not None:
            raise ProtocolError(400, "Content-Length together with Transfer-Encoding: the body's end is ambiguous")
        if length is not None and int(length) > self._max_body:
            return self._take(close=True)  # the app answers 413 from the header alone
        return None

    def _data(self, event: h11.Data) -> Request | None:
        if event.chunk_start:
            self._chunks += 1
            if self._chunks > MAX_CHUNKS:
                raise ProtocolError(400, f"a chunked body in more than {MAX_CHUNKS} chunks; send larger chunks")
        self._body += event.data
        if len(self._body) > self._max_body:
            del self._body[self._max_body + 1 :]  # enough for the app to see the body is too large (413)
            return self._take(close=True)
        return None

    def _take(self, *, close: bool) -> Request:
        head = self._head
        assert head is not None
        request = Request(head.method, head.target, self._headers, bytes(self._body), head.http_version, close)
        self._body = bytearray()
        return request

    def continue_due(self) -> bytes:
        """The bytes of "100 Continue", once, while the client waits for it to send the body; else nothing."""
        if not self._h11.they_are_waiting_for_100_continue:
            return b""
        return self._h11.send(h11.InformationalResponse(status_code=100, reason=b"Continue", headers=[]))

    def answer(self, answer: Answer, *, close: bool) -> bytes:
        """The bytes of the answer to the request handed over last. Raises h11.LocalProtocolError when the
        app's answer cannot be sent as it is (a header h11 refuses, a body that is not its Content-Length)."""
        headers = [*answer.headers, (b"Date", http_date())]
        if close:
            headers.append((b"Connection", b"close"))
        send = self._h11.send
        data = send(h11.Response(status_code=answer.status, reason=answer.reason, headers=headers))
        if answer.body and self._method != b"HEAD" and answer.status not in (204, 304):  # no body, whatever it says
            data += send(h11.Data(data=answer.body))
        return data + send(h11.EndOfMessage())

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
        if self._h11.our_state is not h11.DONE or self._h11.their_state is not h11.DONE:
            return False
        self._h11.start_next_cycle()
        self._start_request()
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
