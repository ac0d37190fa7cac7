"""Tests for webhook.serving.http11: whole requests out of a connection's bytes, however they arrive, and
answers that a client reads back.

Each answer is read back with h11 as a client, the way kube-apiserver's HTTP/1.1 client reads it.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import h11
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.serving.http11 import (
    HEAD_LIMIT,
    MAX_CHUNKS,
    MAX_HEADERS,
    Answer,
    HttpConnection,
    ProtocolError,
    Request,
)

LIMIT = 1000  # the body limit in these tests
HEAD = b"POST /mutate HTTP/1.1\r\nHost: gpupool\r\nContent-Type: application/json\r\n"
OK = Answer(200, b"OK", [(b"content-type", b"application/json"), (b"content-length", b"2")], b"{}")


def with_length(body: bytes, head: bytes = HEAD) -> bytes:
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def chunked(pieces: list[bytes], trailers: bytes = b"", head: bytes = HEAD) -> bytes:
    chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces if p)
    return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n" + trailers + b"\r\n"


def serve_all(data: bytes, cuts: list[int] | None = None) -> list[Request]:
    """Feed `data` in pieces cut at `cuts` (each byte on its own when None), answering each request
    as it comes out, as the worker does; the requests in order."""
    conn = HttpConnection(LIMIT)
    bounds = sorted(set(cuts)) if cuts is not None else list(range(1, len(data)))
    requests: list[Request] = []
    for start, end in zip([0, *bounds], [*bounds, len(data)], strict=True):
        conn.feed(data[start:end])
        while (request := conn.next_request()) is not None:
            requests.append(request)
            conn.answer(OK, close=False)
            if not conn.next_cycle():  # HTTP/1.0, Connection: close
                return requests
    assert conn.held == 0, "bytes left after the last request"
    return requests


def refusal_of(data: bytes) -> ProtocolError:
    conn = HttpConnection(LIMIT)
    conn.feed(data)
    with pytest.raises(ProtocolError) as info:
        conn.next_request()
    return info.value


def read_answers(data: bytes, method: bytes = b"POST") -> list[tuple[h11.Response, bytes]]:
    """The answers in `data` as an HTTP/1.1 client reads them: each head and its body."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method=method, target="/mutate", headers=[("Host", "gpupool"), ("Content-Length", "0")]))
    client.send(h11.EndOfMessage())
    client.receive_data(data)
    answers: list[tuple[h11.Response, bytes]] = []
    body = b""
    response = None
    while (event := client.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
        if isinstance(event, h11.Response):
            response, body = event, b""
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert response is not None
            answers.append((response, body))
            if client.our_state is not h11.DONE or client.their_state is not h11.DONE:
                break
            client.start_next_cycle()
            client.send(h11.Request(method=method, target="/", headers=[("Host", "g"), ("Content-Length", "0")]))
            client.send(h11.EndOfMessage())
    return answers


bodies = st.binary(max_size=300)


@given(
    st.lists(st.tuples(st.booleans(), st.lists(bodies, min_size=1, max_size=4)), min_size=1, max_size=3),
    st.lists(st.integers(min_value=1, max_value=4000), max_size=12),
)
def test_requests_cut_anywhere_come_out_whole_and_in_order(
    requests: list[tuple[bool, list[bytes]]], cuts: list[int]
) -> None:
    """Pipelined Content-Length and chunked requests, in pieces of any size: each one comes out once,
    whole, in order, with the body that was sent."""
    wire = [chunked(pieces) if is_chunked else with_length(b"".join(pieces)) for is_chunked, pieces in requests]
    data = b"".join(wire)
    served = serve_all(data, [c for c in cuts if c < len(data)])
    assert [(r.method, r.target, r.body, r.close) for r in served] == [
        (b"POST", b"/mutate", b"".join(pieces), False) for _, pieces in requests
    ]


def test_byte_by_byte_a_request_is_complete_only_with_its_last_byte() -> None:
    data = chunked([b"{}", b"x" * 20], trailers=b"X-Trailer: 1\r\n")
    conn = HttpConnection(LIMIT)
    for byte in data[:-1]:
        conn.feed(bytes([byte]))
        assert conn.next_request() is None
    conn.feed(data[-1:])
    request = conn.next_request()
    assert request is not None and request.body == b"{}" + b"x" * 20


def test_the_head_is_read_into_names_and_values() -> None:
    """Header names come out lower-cased, values as sent, in order; repeated fields stay separate."""
    data = b"GET /healthz?x=1 HTTP/1.1\r\nHost: gpupool\r\nX-A: 1\r\nx-a: 2\r\nAccept:  */* \r\n\r\n"
    (request,) = serve_all(data + data)[:1]
    assert (request.method, request.target, request.http_version) == (b"GET", b"/healthz?x=1", b"1.1")
    assert request.headers == [(b"host", b"gpupool"), (b"x-a", b"1"), (b"x-a", b"2"), (b"accept", b"*/*")]


@pytest.mark.parametrize("size", [b"0x2", b"1_0", b"+2", b"-1", b"2 2", b"", b"g", b"1" * 21])
def test_a_malformed_chunk_size_is_refused_with_400(size: bytes) -> None:
    """Python's int(x, 16) reads `0x2` and `1_0`; HTTP's chunk size is hex digits only."""
    error = refusal_of(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + size + b"\r\nab\r\n0\r\n\r\n")
    assert error.status == 400 and "chunk" in error.message


@pytest.mark.parametrize(
    ("head", "status", "word"),
    [
        pytest.param(
            HEAD + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "ambiguous", id="cl-and-te"
        ),
        pytest.param(HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n", 400, "Content-Length", id="two-lengths"),
        pytest.param(HEAD + b"Content-Length: +2\r\n\r\n", 400, "Content-Length", id="signed-length"),
        pytest.param(HEAD + b"Transfer-Encoding: chunked, gzip\r\n\r\n", 501, "chunked", id="chunked-not-last"),
        pytest.param(HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n", 501, "chunked", id="gzip"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400, "Host", id="no-host"),
        pytest.param(HEAD + b"Host: other\r\nContent-Length: 0\r\n\r\n", 400, "Host", id="two-hosts"),
        pytest.param(b"POST /mutate HTTP/1.1 extra\r\nHost: g\r\n\r\n", 400, "request line", id="request-line"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "request line", id="tls-on-http"),
        pytest.param(HEAD + b"Bad Name: 1\r\n\r\n", 400, "header", id="header-name"),
    ],
)
def test_malformed_or_ambiguous_requests_are_refused(head: bytes, status: int, word: str) -> None:
    """Nothing after such a head may be taken for a request: it is refused and the connection closes."""
    error = refusal_of(head + b"{}GET / HTTP/1.1\r\nHost: g\r\n\r\n")
    assert (error.status, word in error.message) == (status, True), error.message


def test_http10_needs_no_host_and_closes_after_the_answer() -> None:
    (request,) = serve_all(b"GET / HTTP/1.0\r\n\r\nGET / HTTP/1.0\r\n\r\n")
    assert request.http_version == b"1.0"


@pytest.mark.parametrize(
    ("data", "status"),
    [
        pytest.param(HEAD + b"X: " + b"y" * HEAD_LIMIT, 431, id="head"),
        pytest.param(HEAD + b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_HEADERS)) + b"\r\n", 431, id="fields"),
        pytest.param(HEAD + b"Transfer-Encoding: chunked\r\n\r\n1;e=" + b"a" * HEAD_LIMIT, 431, id="chunk-size-line"),
        pytest.param(HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\nX: " + b"y" * HEAD_LIMIT * 2, 431, id="trailers"),
        pytest.param(
            HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"1\r\nx\r\n" * (MAX_CHUNKS + 1) + b"0\r\n\r\n",
            400,
            id="chunks",
        ),
    ],
)
def test_requests_past_the_limits_are_refused(data: bytes, status: int) -> None:
    conn = HttpConnection(100 * MAX_CHUNKS)
    conn.feed(data)
    with pytest.raises(ProtocolError) as info:
        conn.next_request()
    assert info.value.status == status


@pytest.mark.parametrize("head_limit", [HEAD_LIMIT, 16 * 1024], ids=["admission", "health"])
def test_a_head_over_the_limit_is_refused_naming_the_limit(head_limit: int) -> None:
    """The 431 says what was too long and how long it may be, for whichever limit the port set."""
    conn = HttpConnection(LIMIT, head_limit)
    conn.feed(HEAD + b"X: " + b"y" * head_limit)
    with pytest.raises(ProtocolError) as info:
        conn.next_request()
    assert info.value.status == 431 and f"over {head_limit} bytes" in info.value.message, info.value.message


def test_a_chunked_body_of_tiny_chunks_holds_its_bytes_and_no_more() -> None:
    """O(1) state per chunk: what a connection holds is its body so far plus an incomplete chunk line."""
    conn = HttpConnection(10 * MAX_CHUNKS)
    conn.feed(HEAD + b"Transfer-Encoding: chunked\r\n\r\n1")
    for sent in range(1, MAX_CHUNKS):
        conn.feed(b"\r\nx\r\n1")
        assert conn.next_request() is None
        assert conn.held == sent + 1  # the body, and the "1" of the next chunk-size line


def test_a_declared_length_over_the_limit_is_handed_over_at_once() -> None:
    """The app answers 413 from the header: the body is not waited for, and the connection closes."""
    conn = HttpConnection(LIMIT)
    conn.feed(with_length(b"x" * (LIMIT + 1))[:-LIMIT])
    request = conn.next_request()
    assert request is not None and (request.body, request.close) == (b"", True)
    assert dict(request.headers)[b"content-length"] == b"%d" % (LIMIT + 1)


def test_a_chunked_body_over_the_limit_is_cut_just_past_it() -> None:
    """The app reads past its limit and answers 413; the rest of the body is never waited for."""
    conn = HttpConnection(LIMIT)
    conn.feed(chunked([b"a" * 600, b"b" * 600])[:-200])
    request = conn.next_request()
    assert request is not None and request.close
    assert request.body == b"a" * 600 + b"b" * (LIMIT + 1 - 600)


def test_continue_is_due_once_when_the_client_waits_for_it() -> None:
    """After a head with "Expect: 100-continue" and a body to come, once; never for a whole request."""
    conn = HttpConnection(LIMIT)
    conn.feed(HEAD + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert conn.next_request() is None
    assert conn.continue_due() == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert conn.continue_due() == b""
    conn.feed(b"{}")
    assert conn.next_request() is not None and conn.continue_due() == b""
    whole = HttpConnection(LIMIT)
    whole.feed(with_length(b"{}", HEAD + b"Expect: 100-continue\r\n"))
    assert whole.next_request() is not None and whole.continue_due() == b""


def test_an_answer_is_read_back_with_its_body_and_the_connection_kept() -> None:
    conn = HttpConnection(LIMIT)
    conn.feed(with_length(b"{}") * 2)
    assert conn.next_request() is not None
    first = conn.answer(OK, close=False)
    assert conn.next_cycle()
    assert conn.next_request() is not None
    second = conn.answer(OK, close=False)
    answers = read_answers(first + second)
    assert [(r.status_code, body) for r, body in answers] == [(200, b"{}"), (200, b"{}")]
    assert all(dict(r.headers).get(b"date") for r, _ in answers)


def test_an_answer_that_closes_says_so_and_ends_the_connection() -> None:
    conn = HttpConnection(LIMIT)
    conn.feed(with_length(b"x" * (LIMIT + 1)))
    assert conn.next_request() is not None
    data = conn.answer(Answer(413, b"Request Entity Too Large", [(b"content-length", b"0")], b""), close=True)
    ((response, _),) = read_answers(data)
    assert (response.status_code, dict(response.headers)[b"connection"]) == (413, b"close")
    assert not conn.next_cycle()


def test_a_head_request_is_answered_without_the_body() -> None:
    conn = HttpConnection(LIMIT)
    conn.feed(b"HEAD /mutate HTTP/1.1\r\nHost: g\r\n\r\n")
    assert conn.next_request() is not None
    data = conn.answer(OK, close=False)
    assert data.endswith(b"\r\n\r\n") and b"{}" not in data
    assert conn.next_cycle()


GET = b"GET /healthz HTTP/1.1\r\nHost: health\r\n"


@pytest.mark.parametrize(
    "announces",
    [
        pytest.param(b"Content-Length: 5\r\n", id="content-length"),
        pytest.param(b"Transfer-Encoding: chunked\r\n", id="chunked"),
        pytest.param(b"Content-Length: 99999999999999999999\r\n", id="huge-length"),
    ],
)
def test_a_head_only_connection_hands_over_a_request_announcing_a_body_with_its_head_alone(announces: bytes) -> None:
    """A port that takes no bodies answers a request that announces one from its head: nothing of the body
    is waited for, and the connection closes after the answer."""
    conn = HttpConnection(0, head_only=True)
    conn.feed(GET + announces + b"\r\n")
    request = conn.next_request()
    assert request is not None and (request.method, request.body, request.close) == (b"GET", b"", True)
    conn.answer(Answer(413, b"Content Too Large", [], b"{}"), close=True)
    assert not conn.next_cycle()


@pytest.mark.parametrize(
    "head", [pytest.param(GET, id="no-length"), pytest.param(GET + b"Content-Length: 0\r\n", id="length-zero")]
)
def test_a_head_only_connection_keeps_a_request_without_a_body(head: bytes) -> None:
    """Without a body (none announced, or a Content-Length of 0) a head-only connection serves the request
    and the next one on the same connection, as any other."""
    conn = HttpConnection(0, head_only=True)
    conn.feed((head + b"\r\n") * 2)
    for _ in range(2):
        request = conn.next_request()
        assert request is not None and (request.body, request.close) == (b"", False)
        conn.answer(OK, close=False)
        assert conn.next_cycle()


def test_answer_parts_are_the_answer_with_the_body_apart_and_uncopied() -> None:
    """`answer_parts` frames the same bytes as `answer`, with the app's body object itself as the body,
    and no body for HEAD."""
    body = b"x" * 100_000
    big = Answer(200, b"OK", [(b"content-length", b"%d" % len(body))], body)
    for method in (b"GET", b"HEAD"):
        joined, parted = HttpConnection(0, head_only=True), HttpConnection(0, head_only=True)
        for conn in (joined, parted):
            conn.feed(method + b" /metrics HTTP/1.1\r\nHost: h\r\n\r\n")
            assert conn.next_request() is not None
        head, sent = parted.answer_parts(big, close=False)
        undated = re.compile(rb"Date: [^\r]*\r\n")  # formatted once a second: the two may straddle one
        assert undated.sub(b"", head + sent) == undated.sub(b"", joined.answer(big, close=False))
        assert sent is body if method == b"GET" else sent == b""
        ((response, read_body),) = read_answers(head + sent, method)
        assert (response.status_code, len(read_body)) == (200, len(body) if method == b"GET" else 0)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x16\x03\x01\x02\x00", id="unreadable-request-line"),
        pytest.param(HEAD + b"Transfer-Encoding: chunked\r\n\r\n0x2\r\n", id="in-the-body"),
    ],
)
def test_a_refusal_is_a_json_status_the_client_reads(data: bytes) -> None:
    conn = HttpConnection(LIMIT)
    conn.feed(data)
    with pytest.raises(ProtocolError) as info:
        conn.next_request()
    ((response, body),) = read_answers(conn.refusal(info.value))
    status = orjson.loads(body)
    assert (response.status_code, dict(response.headers)[b"connection"]) == (400, b"close")
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 400, "BadRequest")
    assert status["message"].startswith("malformed request")


def test_an_answer_with_a_body_that_is_not_its_length_is_not_sent() -> None:
    conn = HttpConnection(LIMIT)
    conn.feed(with_length(b"{}"))
    assert conn.next_request() is not None
    with pytest.raises(h11.LocalProtocolError):
        conn.answer(Answer(200, b"OK", [(b"content-length", b"5")], b"{}"), close=False)


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([(b"x-note", b"a\r\nSet-Cookie: s=1")], id="line-break-in-a-value"),
        pytest.param([(b"x note", b"1")], id="space-in-a-name"),
        pytest.param([(b"x-note", b" padded")], id="leading-space"),
        pytest.param([(b"content-length", b"2"), (b"content-length", b"3")], id="two-lengths"),
        pytest.param([(b"content-length", b"+2")], id="signed-length"),
        pytest.param([(b"transfer-encoding", b"chunked")], id="transfer-encoding"),
    ],
)
def test_an_answer_http_cannot_carry_as_it_is_is_not_sent(headers: list[tuple[bytes, bytes]]) -> None:
    """gpupool frames the app's answer itself: a header field h11 would refuse to send is refused too, so
    nothing the app answers can split the answer in two or leave its end ambiguous."""
    conn = HttpConnection(LIMIT)
    conn.feed(with_length(b"{}"))
    assert conn.next_request() is not None
    with pytest.raises(h11.LocalProtocolError):
        conn.answer(Answer(200, b"OK", headers, b"{}"), close=False)


def test_an_answer_without_a_length_gets_one_and_a_repeated_one_is_sent_once() -> None:
    conn = HttpConnection(LIMIT)
    conn.feed(with_length(b"{}") * 3)
    answers = []
    for headers in ([], [(b"content-length", b"2"), (b"Content-Length", b"2")], [(b"connection", b"keep-alive")]):
        assert conn.next_request() is not None
        answers.append(conn.answer(Answer(200, b"OK", headers, b"{}"), close=False))
        assert conn.next_cycle()
    read = read_answers(b"".join(answers))
    assert [(r.status_code, body) for r, body in read] == [(200, b"{}")] * 3
    assert [[v for k, v in r.headers if k == b"content-length"] for r, _ in read] == [[b"2"]] * 3


def test_a_client_that_asks_to_close_is_answered_with_close_and_the_connection_ends() -> None:
    conn = HttpConnection(LIMIT)
    conn.feed(with_length(b"{}", HEAD + b"Connection: keep-alive, Close\r\n") + with_length(b"{}"))
    assert conn.next_request() is not None
    ((response, _),) = read_answers(conn.answer(OK, close=False))
    assert dict(response.headers)[b"connection"] == b"close"
    assert not conn.next_cycle()


class _PublicH11(h11.Connection):
    """An h11 connection that refuses every private attribute asked of it from outside h11, as a release
    that renames its internals would."""

    def __getattribute__(self, name: str) -> object:
        if name.startswith("_") and not name.startswith("__"):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not caller.startswith("h11"):
                raise AttributeError(f"{name} is h11's own")
        return super().__getattribute__(name)


def test_the_framer_uses_only_h11s_public_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any h11 release that keeps its public API will do (pyproject.toml takes a range, not one minor):
    pipelined, chunked and split requests come out whole, with what the connection holds counted."""
    monkeypatch.setattr(h11, "Connection", _PublicH11)
    data = with_length(b"{}") + chunked([b"ab", b"cd"]) + with_length(b"x" * 10)
    assert [r.body for r in serve_all(data)] == [b"{}", b"abcd", b"x" * 10]
    assert [r.body for r in serve_all(data, cuts=[5, 70, 200])] == [b"{}", b"abcd", b"x" * 10]
    conn = HttpConnection(LIMIT)
    conn.feed(HEAD + b"Content-Length: 10\r\n\r\nxyz")
    assert conn.next_request() is None
    assert conn.held == 3


def test_each_dependency_is_listed_once_and_h11_by_a_range() -> None:
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~\[ ;]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]]
    assert len(names) == len(set(names)), names
    (h11_dep,) = [dep for dep in project["dependencies"] if dep.startswith("h11")]
    assert "<0.17" not in h11_dep, f"{h11_dep}: h11 pinned to one minor version"
