"""Tests for webhook.serving.http1: whole requests out of a connection's bytes, however they arrive.

Each framed request is read back with gunicorn's own parser, the one the worker's thread uses: it
must find exactly one request in it, with the body that was sent, and nothing left over.
"""

from __future__ import annotations

from typing import Any

import pytest
from gunicorn.config import Config
from gunicorn.http.parser import RequestParser
from hypothesis import given
from hypothesis import strategies as st

from webhook.serving.http1 import CONTINUE, HEAD_LIMIT, Framed, FramingError, RequestFramer

LIMIT = 1000  # the body limit in these tests
HEAD = b"POST /mutate HTTP/1.1\r\nHost: gpupool\r\nContent-Type: application/json\r\n"


def with_length(body: bytes, head: bytes = HEAD) -> bytes:
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def chunked(pieces: list[bytes], trailers: bytes = b"") -> bytes:
    chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces if p)
    return HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n" + trailers + b"\r\n"


def frame_all(data: bytes, cuts: list[int] | None = None) -> list[Framed]:
    """Feed `data` in pieces cut at `cuts` (each byte on its own when None) and collect the requests."""
    framer = RequestFramer(LIMIT)
    bounds = sorted(set(cuts)) if cuts is not None else list(range(1, len(data)))
    framed: list[Framed] = []
    for start, end in zip([0, *bounds], [*bounds, len(data)], strict=True):
        framer.feed(data[start:end])
        while (request := framer.next_request()) is not None:
            framed.append(request)
    assert len(framer) == 0, "bytes left after the last request"
    return framed


def gunicorn_reads(data: bytes) -> tuple[Any, bytes]:
    """The request gunicorn's parser reads from `data`, its body, and nothing may be left over."""
    parser = RequestParser(Config(), [data], ("127.0.0.1", 1))
    request = next(parser)
    body = request.body.read()
    assert parser.unreader.take_buffered() == b"" and parser.unreader.chunk() == b""
    return request, body


bodies = st.binary(max_size=300)


@given(
    st.lists(st.tuples(st.booleans(), st.lists(bodies, min_size=1, max_size=4)), min_size=1, max_size=3),
    st.lists(st.integers(min_value=1, max_value=4000), max_size=12),
)
def test_requests_cut_anywhere_are_framed_as_gunicorn_reads_them(
    requests: list[tuple[bool, list[bytes]]], cuts: list[int]
) -> None:
    """Pipelined Content-Length and chunked requests, in pieces of any size: each one comes out whole,
    in order, and gunicorn reads it with the body that was sent."""
    wire = [chunked(pieces) if is_chunked else with_length(b"".join(pieces)) for is_chunked, pieces in requests]
    data = b"".join(wire)
    framed = frame_all(data, [c for c in cuts if c < len(data)])
    assert [f.data for f in framed] == wire and not any(f.close for f in framed)
    for f, (_, pieces) in zip(framed, requests, strict=True):
        assert gunicorn_reads(f.data)[1] == b"".join(pieces)


def test_byte_by_byte_a_request_is_complete_only_with_its_last_byte() -> None:
    data = chunked([b"{}", b"x" * 20], trailers=b"X-Trailer: 1\r\n")
    framer = RequestFramer(LIMIT)
    for byte in data[:-1]:
        framer.feed(bytes([byte]))
        assert framer.next_request() is None
    framer.feed(data[-1:])
    assert framer.next_request() == Framed(data, close=False)


def test_a_request_without_a_body_ends_with_its_head() -> None:
    data = b"GET /healthz HTTP/1.1\r\nHost: gpupool\r\n\r\n"
    assert frame_all(data + data) == [Framed(data, close=False)] * 2


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(HEAD + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", id="length-and-chunked"),
        pytest.param(HEAD + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n", id="two-lengths"),
        pytest.param(HEAD + b"Content-Length: +2\r\n\r\n", id="signed-length"),
        pytest.param(HEAD + b"Transfer-Encoding: chunked, gzip\r\n\r\n", id="chunked-not-last"),
    ],
)
def test_ambiguous_framing_hands_over_the_head_and_closes(head: bytes) -> None:
    """gunicorn refuses these (400); nothing after the head may be taken for a request."""
    framer = RequestFramer(LIMIT)
    framer.feed(head + b"{}GET / HTTP/1.1\r\n\r\n")
    assert framer.next_request() == Framed(head, close=True)


def test_a_declared_length_over_the_limit_is_handed_over_at_once() -> None:
    """The app answers 413 from the header: the body is not waited for, and the connection closes."""
    head = HEAD + b"Content-Length: %d\r\n\r\n" % (LIMIT + 1)
    framer = RequestFramer(LIMIT)
    framer.feed(head + b"{")
    assert framer.next_request() == Framed(head, close=True)


def test_a_chunked_body_over_the_limit_is_cut_just_past_it() -> None:
    """The app reads past its limit and answers 413; the rest of the body is never waited for."""
    framer = RequestFramer(LIMIT)
    framer.feed(chunked([b"a" * 600, b"b" * 600])[:-200])
    framed = framer.next_request()
    assert framed is not None and framed.close
    assert gunicorn_reads(framed.data)[1] == b"a" * 600 + b"b" * (LIMIT + 1 - 600)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(HEAD + b"X: " + b"y" * HEAD_LIMIT, id="head"),
        pytest.param(
            HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"1;e=%s\r\nx\r\n" % (b"a" * 1000) * 200, id="chunk-framing"
        ),
        pytest.param(HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\nX: " + b"y" * HEAD_LIMIT * 2, id="trailers"),
    ],
)
def test_too_many_bytes_for_one_request_cannot_be_framed(data: bytes) -> None:
    framer = RequestFramer(LIMIT)
    framer.feed(data)
    with pytest.raises(FramingError):
        framer.next_request()


def test_continue_is_due_once_when_the_client_waits_for_it() -> None:
    """After a head with "Expect: 100-continue" and a body to come, once; never for a whole request."""
    framer = RequestFramer(LIMIT)
    framer.feed(HEAD + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert framer.next_request() is None and framer.continue_due
    framer.continue_due = False
    framer.feed(b"{")
    assert framer.next_request() is None and not framer.continue_due
    framer.feed(b"}")
    assert framer.next_request() is not None and not framer.continue_due
    assert CONTINUE == b"HTTP/1.1 100 Continue\r\n\r\n"
