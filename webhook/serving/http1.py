"""Where an HTTP/1.1 request ends: a connection's bytes in, whole requests out. No sockets here.

gpupool's worker (webhook.serving.worker) reads every connection in its event loop and gives a request to a
thread only once all of it is there, so no thread ever waits for a client. This module decides "all
of it": the head up to its empty line, then a Content-Length body, or a chunked body up to its last
chunk and trailers. Each byte is looked at once (searches resume where the last one stopped).

It frames, it does not validate: gunicorn's parser reads the request again in the thread and answers
anything malformed with 400. Where the framing is ambiguous (Content-Length and Transfer-Encoding
together, two lengths, a coding other than chunked last) only the head is handed over and the
connection is closed after the answer, so no byte after it is ever read as a request.

Sizes are bounded: a head (or trailer section) of at most HEAD_LIMIT bytes, a body of at most
`max_body`. A declared Content-Length over `max_body` is handed over at once with the head alone (the
app answers 413 from the header); a chunked body that grows past it is handed over cut at `max_body`
+ 1 bytes, re-encoded as one chunk, so the app reads past its limit and answers 413. Either way the
connection closes after the answer instead of reading the rest.
"""

from __future__ import annotations

from typing import NamedTuple

HEAD_LIMIT = 64 * 1024  # request line and headers; kube-apiserver sends well under 1 KiB
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _TRAILERS = range(5)


class FramingError(Exception):
    """The bytes cannot be a request within the limits: close the connection without an answer."""


class Framed(NamedTuple):
    data: bytes  # one request, as gunicorn's parser is to read it
    close: bool  # close the connection after the answer: what follows these bytes is not trusted


class RequestFramer:
    """The bytes one connection has sent and not yet handed over, and how far the current request is."""

    def __init__(self, max_body: int) -> None:
        self._max_body = max_body
        self._max_wire = max_body + 2 * HEAD_LIMIT  # a body's bytes on the wire, with its chunk framing
        self.limit = self._max_wire + HEAD_LIMIT  # the most one request may hold here
        self._buf = bytearray()
        self._start_request()

    def __len__(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def _start_request(self) -> None:
        self._phase = _HEAD
        self._scan = 0  # where the search for the current terminator resumes
        self._mark = 0  # where the current chunk-size line or trailer section starts
        self._head_end = 0  # offset just after the head's empty line
        self._end = 0  # _LENGTH: where the body ends
        self._chunks: list[tuple[int, int]] = []  # offsets of each chunk's data
        self._body = 0  # data bytes of the chunks read whole
        self._wants_continue = False
        self.continue_due = False  # set once when the client waits for "100 Continue" to send its body
        self._steps = {  # what to parse in each phase, bound once per connection, not per read
            _HEAD: self._head,
            _LENGTH: self._length,
            _CHUNK_SIZE: self._chunk_size,
            _CHUNK_DATA: self._chunk_data,
            _TRAILERS: self._trailers,
        }

    def next_request(self) -> Framed | None:
        """The next whole request, taken out of the buffer; None while more bytes are needed."""
        steps = self._steps
        while True:
            phase = self._phase
            framed = steps[phase]()
            if framed is not None:
                return framed
            if self._phase == phase:  # no progress: wait for more bytes
                if self._wants_continue and phase != _HEAD:
                    self._wants_continue, self.continue_due = False, True
                return None

    def _enter(self, phase: int, mark: int) -> None:
        self._phase, self._mark, self._scan = phase, mark, mark

    def _take(self, end: int, *, close: bool) -> Framed:
        data = bytes(self._buf[:end])
        del self._buf[:end]
        self._start_request()
        return Framed(data, close)

    def _head(self) -> Framed | None:
        end = self._buf.find(b"\r\n\r\n", self._scan)
        if end < 0 or end + 4 > HEAD_LIMIT:
            if len(self._buf) > HEAD_LIMIT:
                raise FramingError(f"request head over {HEAD_LIMIT} bytes")
            self._scan = max(0, len(self._buf) - 3)
            return None
        self._head_end = end + 4
        lines = bytes(self._buf[:end]).split(b"\r\n")
        if not lines[0]:  # one empty line before the request line is allowed (RFC 9112 section 2.2)
            lines = lines[1:]
        lengths: list[bytes] = []
        codings: list[bytes] = []
        expect = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.lower(), value.strip(b" \t")
            if name == b"content-length":
                lengths.append(value)
            elif name == b"transfer-encoding":
                codings += (c.strip(b" \t").lower() for c in value.split(b","))
            elif name == b"expect":
                expect = value.lower() == b"100-continue"
        self._wants_continue = expect and lines[0].endswith(b" HTTP/1.1")
        if codings:
            if lengths or codings[-1] != b"chunked":
                return self._take(self._head_end, close=True)  # gunicorn refuses it (400)
            self._enter(_CHUNK_SIZE, self._head_end)
            return None
        if not lengths:
            return self._take(self._head_end, close=False)
        if len(lengths) > 1 or not lengths[0].isdigit():
            return self._take(self._head_end, close=True)  # gunicorn refuses it (400)
        if len(lengths[0]) > 12 or int(lengths[0]) > self._max_body:
            return self._take(self._head_end, close=True)  # the app answers 413 from the header
        self._end = self._head_end + int(lengths[0])
        self._enter(_LENGTH, self._end)
        return None

    def _length(self) -> Framed | None:
        return self._take(self._end, close=False) if len(self._buf) >= self._end else None

    def _chunk_size(self) -> Framed | None:
        end = self._buf.find(b"\r\n", self._scan)
        if end < 0:
            self._check_wire()
            self._scan = max(self._mark, len(self._buf) - 1)
            return None
        size_text = bytes(self._buf[self._mark : end]).split(b";", 1)[0].strip(b" \t")
        try:
            size = int(size_text, 16) if 0 < len(size_text) <= 16 else -1
        except ValueError:
            size = -1
        if size < 0:
            return self._take(end + 2, close=True)  # gunicorn refuses it (400)
        if size == 0:
            self._enter(_TRAILERS, end + 2)
            return None
        self._chunks.append((end + 2, end + 2 + size))
        self._enter(_CHUNK_DATA, end + 2)
        return None

    def _chunk_data(self) -> Framed | None:
        start, end = self._chunks[-1]
        if self._body + min(len(self._buf), end) - start > self._max_body:
            return self._cut_over_limit()
        if len(self._buf) < end + 2:
            self._check_wire()
            return None
        if self._buf[end : end + 2] != b"\r\n":
            return self._take(end + 2, close=True)  # gunicorn refuses it (400)
        self._body += end - start
        self._enter(_CHUNK_SIZE, end + 2)
        return None

    def _trailers(self) -> Framed | None:
        start = self._mark
        if self._buf[start : start + 2] == b"\r\n":
            return self._take(start + 2, close=False)
        end = self._buf.find(b"\r\n\r\n", self._scan)
        if end < 0:
            if len(self._buf) - start > HEAD_LIMIT:
                raise FramingError(f"trailer section over {HEAD_LIMIT} bytes")
            self._scan = max(start, len(self._buf) - 3)
            return None
        return self._take(end + 4, close=False)

    def _check_wire(self) -> None:
        if len(self._buf) - self._head_end > self._max_wire:
            raise FramingError(f"chunked body over {self._max_wire} bytes on the wire")

    def _cut_over_limit(self) -> Framed:
        """The head and the first max_body + 1 bytes of the chunked body, as one chunk: enough for the
        app to see the body is too large (413). The connection closes after the answer."""
        wanted = self._max_body + 1
        pieces = []
        for start, end in self._chunks:
            piece = bytes(self._buf[start : min(end, start + wanted)])
            pieces.append(piece)
            wanted -= len(piece)
            if wanted <= 0:
                break
        body = b"".join(pieces)
        data = bytes(self._buf[: self._head_end]) + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
        self._buf.clear()
        self._start_request()
        return Framed(data, close=True)
