"""Tests for webhook.serving.worker: the real `gpupool serve` over real TLS, with clients that are slow on purpose.

The server runs 1 worker x 2 threads, so a handful of slow connections is already more than its
threads. "Answered" means within kube-apiserver's timeout for the webhook call (10 s).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
import pytest

from tests.conftest import (
    DEMO_INVENTORY,
    SERVICE_DNS,
    ApiServerClient,
    ServerProcess,
    admission_review,
    free_port,
    gpu_pod,
    serve_argv,
    wait_until,
)
from webhook.serving.app import MAX_BODY_BYTES
from webhook.serving.worker import BUFFER_BUDGET, REQUEST_SECONDS
from webhook.testing.slow_clients import KINDS, SlowClients, wait_closed

pytestmark = pytest.mark.slow
THREADS = 2
SLOW = 4 * THREADS  # slow connections per attack: more than the threads, also at 5 s each on gthread
ANSWER_TIMEOUT = 10.0  # kube-apiserver's timeout for a webhook call (the ?timeout=10s it sends)


@dataclass
class Served:
    server: ServerProcess
    port: int
    ca_file: Path

    def client(self) -> ApiServerClient:
        client = ApiServerClient(self.port, self.ca_file)
        client.connection.timeout = ANSWER_TIMEOUT
        return client

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def tls(self) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=ANSWER_TIMEOUT)
        return self.context().wrap_socket(raw, server_hostname=SERVICE_DNS)

    def slow_clients(self) -> SlowClients:
        return SlowClients(self.port, self.context(), SERVICE_DNS)


@pytest.fixture(scope="module")
def served(cert_dir: Path, start_server: Callable[..., ServerProcess]) -> Served:
    port, health_port = free_port(), free_port()
    argv = serve_argv(cert_dir, port, health_port, "--inventory", str(DEMO_INVENTORY), "--threads", str(THREADS))
    return Served(start_server(argv, health_port), port, cert_dir / "ca.crt")


def request_bytes(review: dict[str, Any], headers: bytes = b"") -> bytes:
    body = orjson.dumps(review)
    head = b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: gpupool\r\nContent-Type: application/json\r\n"
    return head + b"Content-Length: %d\r\n" % len(body) + headers + b"\r\n" + body


def read_reply(stream: IO[bytes]) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer from a stream that may hold more after it: status, headers, body."""
    status = int(stream.readline().split()[1])
    headers = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, value = line.decode().split(":", 1)
        headers[name.strip().lower()] = value.strip()
    return status, headers, stream.read(int(headers.get("content-length", "0")))


@pytest.fixture
def tls(served: Served) -> Iterator[ssl.SSLSocket]:
    sock = served.tls()
    yield sock
    sock.close()


@pytest.mark.parametrize("kind", KINDS)
def test_admissions_are_answered_while_slow_clients_hold_connections(served: Served, kind: str) -> None:
    """With more slow connections open than the server has threads, a new client's admissions are
    all answered (on gthread none was: each slow connection held a thread)."""
    with served.slow_clients() as slow:
        slow.open(kind, SLOW)
        assert slow.failed_to_open == 0
        client = served.client()
        try:
            for _ in range(3):
                response = client.review(admission_review(gpu_pod(), dry_run=True))["response"]
                assert response["allowed"] is True
        finally:
            client.close()


def test_a_connection_that_sends_no_whole_request_is_closed(served: Served) -> None:
    """Each kind of slow connection is closed by the server once its time for a request is up."""
    with served.slow_clients() as slow:
        for kind in KINDS:
            slow.open(kind, 1)
        wait_until(lambda: slow.closed_by_server == len(KINDS), 3 * REQUEST_SECONDS, "the server closing them")
        assert slow.open_counts() == dict.fromkeys(KINDS, 0)


def test_a_kept_alive_connection_idle_past_the_request_deadline_is_still_served(served: Served) -> None:
    """Between requests a connection may stay idle much longer than a request may take to arrive."""
    client = served.client()
    try:
        client.review(admission_review(gpu_pod(), dry_run=True))
        sock = client.connection.sock
        time.sleep(REQUEST_SECONDS + 1.5)
        client.review(admission_review(gpu_pod(), dry_run=True))
        assert client.connection.sock is sock
    finally:
        client.close()


def test_pipelined_requests_are_both_answered_in_order(tls: ssl.SSLSocket) -> None:
    """Two requests sent back to back in one write get two answers, in order, on the connection."""
    first, second = (admission_review(gpu_pod(), uid=uid, dry_run=True) for uid in ("pipe-1", "pipe-2"))
    tls.sendall(request_bytes(first) + request_bytes(second))
    stream = tls.makefile("rb")
    replies = [read_reply(stream) for _ in range(2)]
    assert [(status, orjson.loads(body)["response"]["uid"]) for status, _, body in replies] == [
        (200, "pipe-1"),
        (200, "pipe-2"),
    ]


def test_a_declared_body_over_the_limit_is_refused_and_the_connection_closed(tls: ssl.SSLSocket) -> None:
    """A Content-Length over 3 MiB is answered 413 at once, and the rest of the body is not waited for:
    the server closes the connection."""
    tls.sendall(
        b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: gpupool\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n{" % (MAX_BODY_BYTES + 1)
    )
    status, headers, body = read_reply(tls.makefile("rb"))
    assert (status, orjson.loads(body)["code"], headers["connection"]) == (413, 413, "close")
    wait_closed(tls, 3 * REQUEST_SECONDS)


def test_a_client_that_expects_100_continue_gets_it_before_sending_the_body(tls: ssl.SSLSocket) -> None:
    """curl asks for "100 Continue" before sending a body (and waits a second without it): the server
    answers the head alone, then the request once the body is there."""
    review = request_bytes(admission_review(gpu_pod(), dry_run=True), headers=b"Expect: 100-continue\r\n")
    head, body = review.split(b"\r\n\r\n", 1)
    tls.sendall(head + b"\r\n\r\n")
    stream = tls.makefile("rb")
    assert stream.readline() == b"HTTP/1.1 100 Continue\r\n" and stream.readline() == b"\r\n"
    tls.sendall(body)
    status, _, answer = read_reply(stream)
    assert status == 200 and orjson.loads(answer)["response"]["allowed"] is True


def test_incomplete_requests_hold_a_bounded_amount_of_memory(served: Served) -> None:
    """Connections that each send all of a 3 MiB body but its last byte would add up without bound (a
    thousand of them: 3 GiB, past the Pod's memory limit); past 64 MiB the server closes the one holding
    most, and admissions go on."""
    head = b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: gpupool\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\n\r\n" % MAX_BODY_BYTES
    socks = []
    try:
        for _ in range(BUFFER_BUDGET // MAX_BODY_BYTES + 2):
            sock = served.tls()
            socks.append(sock)
            try:
                sock.sendall(head + b" " * (MAX_BODY_BYTES - 1))
            except OSError:  # this one was closed already
                continue
        wait_until(lambda: "bytes of a request" in served.server.log(), 3 * REQUEST_SECONDS, "a connection closed")
        client = served.client()
        try:
            assert client.review(admission_review(gpu_pod(), dry_run=True))["response"]["allowed"] is True
        finally:
            client.close()
    finally:
        for sock in socks:
            sock.close()
