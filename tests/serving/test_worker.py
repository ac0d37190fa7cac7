"""Tests for webhook.serving.worker: the real `gpupool serve` over real TLS, with clients that are slow on
purpose, hostile, or gone.

The server runs 1 worker x 2 threads, so a handful of slow connections is already more than its
threads. "Answered" means within kube-apiserver's timeout for the webhook call (10 s), or, where a test
says so, within the 5 s the shipped manifests give it. The queue's tests run a server of their own with
one thread and an Admitter that takes as long as each Pod's name says.
"""

from __future__ import annotations

import socket
import ssl
import sys
import textwrap
import threading
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
from tests.serving.running import readyz
from webhook.serving.app import MAX_BODY_BYTES
from webhook.serving.client_io import REQUEST_SECONDS
from webhook.serving.clients import BUFFER_BUDGET
from webhook.serving.worker import QUEUE_SECONDS
from webhook.testing.slow_clients import KINDS, SlowClients, wait_closed

pytestmark = pytest.mark.slow
THREADS = 2
SLOW = 4 * THREADS  # slow connections per attack: more than the threads, also at 5 s each on gthread
ANSWER_TIMEOUT = 10.0  # kube-apiserver's timeout for a webhook call (the ?timeout=10s it sends)
MANIFEST_TIMEOUT = 5.0  # the webhook's timeoutSeconds in the shipped manifests
MIB = 1024 * 1024
HEAD = b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: gpupool\r\nContent-Type: application/json\r\n"
CHUNKED = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"


@dataclass
class Served:
    server: ServerProcess
    port: int
    ca_file: Path
    health_port: int

    def client(self, timeout: float = ANSWER_TIMEOUT) -> ApiServerClient:
        client = ApiServerClient(self.port, self.ca_file)
        client.connection.timeout = timeout
        return client

    def worker_rss(self) -> int:
        """The worker process's resident memory, in bytes."""
        (pid,) = readyz(self.health_port)[1]["workers"]
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

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
    return Served(start_server(argv, health_port), port, cert_dir / "ca.crt", health_port)


def request_bytes(review: dict[str, Any], headers: bytes = b"", head: bytes = HEAD) -> bytes:
    body = orjson.dumps(review)
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
    """A Content-Length over MAX_BODY_BYTES is answered 413 at once, and the rest of the body is not waited for:
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


FRAMINGS = ["content-length", "chunked"]


def body_without_end(framing: str, body: bytes) -> tuple[bytes, bytes]:
    """A request with `body`, in two parts: all of it but its end (the last byte of a Content-Length body,
    the last chunk of a chunked one, in chunks of 64 KiB), and the end."""
    if framing == "content-length":
        data = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body
        return data[:-1], data[-1:]
    pieces = (body[i : i + 64 * 1024] for i in range(0, len(body), 64 * 1024))
    return CHUNKED + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces), b"0\r\n\r\n"


@pytest.mark.parametrize("framing", FRAMINGS)
def test_incomplete_requests_hold_a_bounded_amount_of_memory(served: Served, framing: str) -> None:
    """Connections that each send all of a body of MAX_BODY_BYTES but its end would add up without bound (a
    thousand of them: 19 GiB, past the Pod's memory limit); past 64 MiB the server closes the one holding
    most, and admissions go on."""
    start, _ = body_without_end(framing, b" " * MAX_BODY_BYTES)
    before = served.server.log().count("bytes of a request")
    socks = []
    try:
        for _ in range(BUFFER_BUDGET // MAX_BODY_BYTES + 2):
            sock = served.tls()
            socks.append(sock)
            try:
                sock.sendall(start)
            except OSError:  # this one was closed already
                continue

        def evicted() -> bool:
            return served.server.log().count("bytes of a request") > before

        wait_until(evicted, 3 * REQUEST_SECONDS, "a connection closed")
        client = served.client()
        try:
            assert client.review(admission_review(gpu_pod(), dry_run=True))["response"]["allowed"] is True
        finally:
            client.close()
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.parametrize("framing", FRAMINGS)
def test_the_bytes_of_closed_connections_are_given_back_to_the_budget(served: Served, framing: str) -> None:
    """Connections holding just under the budget between them, closed before their requests end, then as
    many again that finish theirs: the second round fits as the first did (the first gave its bytes
    back when it closed), so every one of its requests is answered and none is closed for the budget."""
    review = orjson.dumps(admission_review(gpu_pod(), dry_run=True))
    start, end = body_without_end(framing, review + b" " * (MAX_BODY_BYTES - len(review)))
    fits = BUFFER_BUDGET // MAX_BODY_BYTES - 1
    before = served.server.log().count("bytes of a request")
    gone = [served.tls() for _ in range(fits)]
    for sock in gone:
        sock.sendall(start)
    for sock in gone:
        sock.close()
    time.sleep(0.5)  # for the server to see them close
    socks = [served.tls() for _ in range(fits)]
    try:
        for sock in socks:
            sock.sendall(start)
        for sock in socks:
            sock.sendall(end)
        replies = [read_reply(sock.makefile("rb")) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    assert [orjson.loads(body)["response"]["allowed"] for _, _, body in replies] == [True] * fits
    assert served.server.log().count("bytes of a request") == before


# --- hostile framing -------------------------------------------------------------------------------------


def test_bodies_of_tiny_chunks_do_not_hold_up_admissions(served: Served) -> None:
    """Four requests of 100,000 one-byte chunks each, more than the server has threads: each is refused
    (400) after its first MAX_CHUNKS chunks, and admissions sent meanwhile are answered within the
    manifests' 5 s (gunicorn's parser spent tens of seconds of a thread on each such request)."""
    attack = CHUNKED + b"1\r\nx\r\n" * 100_000 + b"0\r\n\r\n"
    statuses: list[int | str] = []

    def send() -> None:
        sock = served.tls()
        try:
            sock.sendall(attack)
            statuses.append(read_reply(sock.makefile("rb"))[0])
        except OSError as exc:
            statuses.append(repr(exc))
        finally:
            sock.close()

    attackers = [threading.Thread(target=send) for _ in range(2 * THREADS)]
    for attacker in attackers:
        attacker.start()
    client = served.client(timeout=MANIFEST_TIMEOUT)
    answered = 0
    try:
        while answered < 5 or any(attacker.is_alive() for attacker in attackers):
            assert client.review(admission_review(gpu_pod(), dry_run=True))["response"]["allowed"] is True
            answered += 1
    finally:
        client.close()
        for attacker in attackers:
            attacker.join(60)
    assert statuses == [400] * len(attackers)


def test_unfinished_bodies_of_tiny_chunks_cost_the_worker_no_lasting_memory(served: Served) -> None:
    """Twelve chunked bodies of one-byte chunks, 34 MB on the wire, never finished: the worker's memory
    grows by less than 32 MiB, and is back within 32 MiB of where it was once they are closed (with a
    tuple kept per chunk, it grew by 240 MiB and kept it)."""
    unfinished = CHUNKED + b"1\r\nx\r\n" * 470_000
    before = served.worker_rss()
    socks = []
    peak = before
    try:
        for _ in range(12):
            sock = served.tls()
            socks.append(sock)
            try:
                sock.sendall(unfinished)
            except OSError:  # closed by the server
                continue
            peak = max(peak, served.worker_rss())
        for _ in range(6):  # while the server reads what was sent
            time.sleep(0.5)
            peak = max(peak, served.worker_rss())
    finally:
        for sock in socks:
            sock.close()
    time.sleep(1)
    after = served.worker_rss()
    assert (peak - before) // MIB < 32 and (after - before) // MIB < 32, (before // MIB, peak // MIB, after // MIB)


def error_lines(served: Served) -> list[dict[str, Any]]:
    return [line for line in served.server.log_lines() if line.get("level") in ("error", "critical")]


@pytest.mark.parametrize("size", [b"0x2", b"1_0", b"+2"])
def test_a_malformed_chunk_size_is_answered_400_without_logging_an_error(
    served: Served, tls: ssl.SSLSocket, size: bytes
) -> None:
    """Python's int() reads `0x2` and `1_0` as numbers; a chunk size is hex digits only. The client is
    told (400, a JSON Status), the connection closes, and the error log stays quiet: bad input is not a
    server error."""
    errors = len(error_lines(served))
    tls.sendall(CHUNKED + size + b"\r\n{}\r\n0\r\n\r\n")
    status, headers, body = read_reply(tls.makefile("rb"))
    answer = orjson.loads(body)
    assert (status, answer["code"], headers["connection"]) == (400, 400, "close")
    assert "chunk" in answer["message"]
    wait_closed(tls, 3 * REQUEST_SECONDS)
    assert len(error_lines(served)) == errors


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_body_just_over_the_limit_gets_its_413(served: Served, framing: str) -> None:
    """A client that sends a body one byte over MAX_BODY_BYTES at the pace of a real network (256 KiB every
    20 ms: 1.5 s of pauses, well inside the worker's REQUEST_SECONDS even on a loaded machine, where 3.8 s
    of them was cut off by the deadline), then reads the answer, reads the 413: the server answers, then
    reads and drops the rest of the body before it closes, instead of a reset while the client is still
    sending."""
    size = MAX_BODY_BYTES + 1

    def paced() -> Iterator[bytes]:
        for start in range(0, size, 256 * 1024):
            yield b" " * min(256 * 1024, size - start)
            time.sleep(0.02)

    client = served.client()
    try:
        if framing == "chunked":
            reply = client.post(paced(), chunked=True)
        else:
            reply = client.post(paced(), headers={"Content-Length": str(size)})
    finally:
        client.close()
    assert (reply.status, reply.json()["code"]) == (413, 413)


def test_http11_without_host_is_refused(tls: ssl.SSLSocket) -> None:
    """RFC 9112: an HTTP/1.1 request without Host is answered 400, whatever its body."""
    head = b"POST /mutate?timeout=10s HTTP/1.1\r\nContent-Type: application/json\r\n"
    tls.sendall(request_bytes(admission_review(gpu_pod(), dry_run=True), head=head))
    status, _, body = read_reply(tls.makefile("rb"))
    assert (status, "Host" in orjson.loads(body)["message"]) == (400, True)


# --- requests waiting for a thread -----------------------------------------------------------------------

QUEUE_SERVER = textwrap.dedent(
    """
    # gpupool's own gunicorn settings and worker, one thread, and an Admitter that marks each Pod it sees
    # and takes as many seconds as the Pod's name ends with ("busy-1.5": 1.5 s).
    import pathlib, sys, time
    from webhook.admission.verdict import allow
    from webhook.serving.gunicorn_app import WorkerApp
    from webhook.serving.server import ServeOptions, serve

    cert, key, port, health_port, marks, max_queued = sys.argv[1:7]

    class SlowAdmitter:
        def admit(self, pod, *, namespace, dry_run=False):
            name = pod["metadata"]["name"]
            (pathlib.Path(marks) / name).touch()
            time.sleep(float(name.rsplit("-", 1)[1]))
            return allow(name)

    def load():  # in the worker, after serve() set up the metrics' directory (see webhook/serving/server.py)
        from webhook.serving import worker
        from webhook.serving.app import AppConfig, create_app
        from webhook.serving.metrics import Metrics
        worker.MAX_QUEUED = int(max_queued)
        metrics = Metrics.private()
        metrics.inventory_ready.set(1)
        return WorkerApp(create_app(AppConfig(admitter=SlowAdmitter(), metrics=metrics)))

    options = ServeOptions(cert=cert, key=key, inventory=None, policy=None, host="127.0.0.1",
                           port=int(port), health_port=int(health_port), workers=1, threads=1)
    sys.exit(serve(options, load))
    """
)


@dataclass
class Queue:
    port: int
    ca_file: Path
    marks: Path

    def send(self, name: str) -> ssl.SSLSocket:
        """A TLS connection with one admission of a Pod named `name` sent on it."""
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=ANSWER_TIMEOUT)
        sock = ssl.create_default_context(cafile=str(self.ca_file)).wrap_socket(raw, server_hostname=SERVICE_DNS)
        sock.sendall(request_bytes(admission_review(gpu_pod(name=name), uid=name)))
        return sock

    def seen(self) -> set[str]:
        return {path.name for path in self.marks.iterdir()}

    def wait_seen(self, name: str) -> None:
        wait_until(lambda: name in self.seen(), ANSWER_TIMEOUT, f"{name} in the Admitter")


def start_queue_server(cert_dir: Path, tmp_path: Path, start: Callable[..., ServerProcess], max_queued: int) -> Queue:
    port, health_port = free_port(), free_port()
    marks = tmp_path / "marks"
    marks.mkdir()
    certs = [str(cert_dir / "tls.crt"), str(cert_dir / "tls.key")]
    start(
        [sys.executable, "-c", QUEUE_SERVER, *certs, str(port), str(health_port), str(marks), str(max_queued)],
        health_port,
    )
    return Queue(port, cert_dir / "ca.crt", marks)


@pytest.fixture
def queue(cert_dir: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]) -> Queue:
    return start_queue_server(cert_dir, tmp_path, start_server, max_queued=256)


def answer_of(sock: ssl.SSLSocket) -> tuple[int, dict[str, str], dict[str, Any]]:
    status, headers, body = read_reply(sock.makefile("rb"))
    sock.close()
    return status, headers, orjson.loads(body)


def test_a_request_that_waits_too_long_for_a_thread_is_answered_503(queue: Queue) -> None:
    """Behind an admission that holds the only thread for 3 s, another waits QUEUE_SECONDS, then is
    answered 503 (a JSON Status) and its connection closed; it never reaches the Admitter."""
    busy = queue.send("busy-3")
    queue.wait_seen("busy-3")
    started = time.monotonic()
    late = queue.send("late-0")
    status, headers, answer = answer_of(late)
    waited = time.monotonic() - started
    assert (status, answer["code"], headers["connection"]) == (503, 503, "close")
    assert QUEUE_SECONDS <= waited < QUEUE_SECONDS + 2, waited
    assert answer_of(busy)[2]["response"]["allowed"] is True
    assert queue.seen() == {"busy-3"}


def test_a_waiting_request_whose_client_hung_up_is_dropped(queue: Queue) -> None:
    """A client that gives up while its request waits for a thread costs no admission: the request is
    skipped, and the one after it is answered."""
    busy = queue.send("busy-1.5")
    queue.wait_seen("busy-1.5")
    queue.send("gone-0").close()
    time.sleep(0.2)
    after = queue.send("after-0")
    assert answer_of(busy)[0] == 200 and answer_of(after)[0] == 200
    assert queue.seen() == {"busy-1.5", "after-0"}


def test_past_the_bound_a_request_is_answered_503_at_once(
    cert_dir: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """With MAX_QUEUED (here 2) requests waiting already, the next one is answered 503 at once, while
    the thread is still busy; those that wait are answered after it."""
    queue = start_queue_server(cert_dir, tmp_path, start_server, max_queued=2)
    busy = queue.send("busy-1.5")
    queue.wait_seen("busy-1.5")
    waiting = [queue.send(name) for name in ("first-0", "second-0")]
    time.sleep(0.3)
    status, _, answer = answer_of(queue.send("third-0"))
    assert (status, answer["code"], queue.seen()) == (503, 503, {"busy-1.5"})
    assert [answer_of(sock)[0] for sock in [busy, *waiting]] == [200, 200, 200]
    assert queue.seen() == {"busy-1.5", "first-0", "second-0"}
