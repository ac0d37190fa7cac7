"""Tests for webhook.serving.wsgi: the environ a parsed request becomes (PEP 3333), and the app's answer.

Compliance is checked by the standard library's own WSGI validator (wsgiref.validate), which fails on
any environ key, type or call order PEP 3333 does not allow.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any
from wsgiref.validate import validator

import pytest

from webhook.serving.http11 import Answer, ProtocolError, Request
from webhook.serving.wsgi import base_environ, call_app, environ_for

BASE = base_environ(url_scheme="https", multiprocess=False)
CLIENT, SERVER = ("10.0.0.7", 41234), ("0.0.0.0", 8443)
BODY = b'{"kind": "AdmissionReview"}'


def request(target: bytes = b"/mutate?timeout=10s", headers: list[tuple[bytes, bytes]] | None = None) -> Request:
    if headers is None:
        headers = [
            (b"host", b"gpupool-webhook.gpupool-system.svc:443"),
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(BODY)),
            (b"accept-encoding", b"gzip"),
        ]
    return Request(b"POST", target, headers, BODY, b"1.1", close=False)


def echo(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    """An app that answers with what it was given."""
    body = environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
    start_response("201 Created", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def test_an_admission_call_becomes_the_environ_pep_3333_describes() -> None:
    environ = environ_for(request(), BASE, CLIENT, SERVER)
    assert {k: v for k, v in environ.items() if k.isupper()} == {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": "/mutate",
        "QUERY_STRING": "timeout=10s",
        "RAW_URI": "/mutate?timeout=10s",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "SERVER_NAME": "0.0.0.0",
        "SERVER_PORT": "8443",
        "SERVER_SOFTWARE": "gpupool",
        "REMOTE_ADDR": "10.0.0.7",
        "REMOTE_PORT": "41234",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(BODY)),
        "HTTP_HOST": "gpupool-webhook.gpupool-system.svc:443",
        "HTTP_ACCEPT_ENCODING": "gzip",
    }
    assert (environ["wsgi.url_scheme"], environ["wsgi.input"].read()) == ("https", BODY)


def test_the_standard_validator_accepts_the_environ_and_the_calls() -> None:
    answer = call_app(validator(echo), environ_for(request(), BASE, CLIENT, SERVER))
    assert answer == Answer(201, b"Created", [(b"Content-Type", b"text/plain"), (b"Content-Length", b"27")], BODY)


@pytest.mark.parametrize(
    ("target", "path", "query"),
    [
        pytest.param(b"/a%20b/%C3%A9?x=%20", "/a b/\u00c3\u00a9", "x=%20", id="percent-decoded-as-latin-1"),
        pytest.param(b"/mutate#frag", "/mutate", "", id="fragment"),
        pytest.param(b"/mutate?t=1#frag", "/mutate", "t=1", id="fragment-after-query"),
        pytest.param(b"https://gpupool:443/mutate?t=1", "/mutate", "t=1", id="absolute-form"),
        pytest.param(b"http://gpupool", "/", "", id="absolute-form-no-path"),
    ],
)
def test_the_target_becomes_path_and_query(target: bytes, path: str, query: str) -> None:
    environ = environ_for(request(target), BASE, CLIENT, SERVER)
    assert (environ["PATH_INFO"], environ["QUERY_STRING"]) == (path, query)


@pytest.mark.parametrize("target", [b"*", b"gpupool:443", b"ftp://x/mutate", b"mutate"])
def test_a_target_that_is_no_path_is_refused(target: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        environ_for(request(target), BASE, CLIENT, SERVER)
    assert info.value.status == 400 and "not a path" in info.value.message


def test_repeated_fields_are_joined_and_names_with_underscores_dropped() -> None:
    """X_Forwarded_For would read as X-Forwarded-For (HTTP_X_FORWARDED_FOR): such fields are dropped."""
    headers = [
        (b"host", b"g"),
        (b"x-a", b"1"),
        (b"x-a", b"2"),
        (b"x_forwarded_for", b"evil"),
        (b"x-forwarded-for", b"ok"),
    ]
    environ = environ_for(request(headers=headers), BASE, CLIENT, SERVER)
    assert (environ["HTTP_X_A"], environ["HTTP_X_FORWARDED_FOR"]) == ("1,2", "ok")


def test_an_app_that_starts_its_answer_when_iterated_is_answered_and_closed() -> None:
    closed = []

    class Lazy:
        def __init__(self, start_response: Any) -> None:
            self.start_response = start_response

        def __iter__(self) -> Iterator[bytes]:
            self.start_response("200 OK", [("Content-Length", "2")])
            yield b"{}"

        def close(self) -> None:
            closed.append(True)

    answer = call_app(
        lambda environ, start_response: Lazy(start_response), environ_for(request(), BASE, CLIENT, SERVER)
    )
    assert (answer.status, answer.body, closed) == (200, b"{}", [True])


def test_an_app_that_never_starts_its_answer_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        call_app(lambda environ, start_response: [b"x"], environ_for(request(), BASE, CLIENT, SERVER))
