"""Tests for webhook.serving.health: the plain-HTTP probe and scrape endpoints, over a real socket."""

from __future__ import annotations

import http.client
import logging
import re
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO, health_get, wait_until
from tests.serving.health_load import Load, probe, probes_apart
from webhook.serving.health import HealthServer, MetricsText, Readiness

# Generous: how long a test waits for the server to act on a deadline it was given in tenths of a second.
PATIENCE = 10.0


@dataclass
class State:
    ready: bool = True
    fail: bool = False


def make_server(state: State, metrics: Callable[[], MetricsText] | None = None, **tuning: float) -> HealthServer:
    def readiness() -> Readiness:
        if state.fail:
            raise RuntimeError("cannot read the metrics directory")
        return Readiness(state.ready, {"workers": {"123": state.ready}})

    text = MetricsText(b"gpupool_up 1\n", "text/plain; version=0.0.4")
    return HealthServer("127.0.0.1", 0, readiness, metrics or (lambda: text), **tuning)  # type: ignore[arg-type]


def exposition() -> MetricsText:
    """A /metrics answer the size of a busy cluster's (about 300 KB), rendered afresh on each call."""
    lines = [f'gpupool_pool_free_gpus{{pool="nvidia/medium/NVIDIA-L4-{i}"}} {i % 8}\n' for i in range(6000)]
    return MetricsText("".join(lines).encode(), "text/plain; version=0.0.4")


@pytest.fixture
def served() -> Iterator[tuple[HealthServer, State]]:
    state = State()
    server = make_server(state)
    server.start()
    yield server, state
    server.stop()


@pytest.fixture
def tuned() -> Iterator[Callable[..., HealthServer]]:
    """A started server with short deadlines, stopped at the end of the test."""
    servers: list[HealthServer] = []

    def start(**tuning: float) -> HealthServer:
        server = make_server(State(), **tuning)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


def closed_by_server(sock: socket.socket) -> bool:
    """Wait for the server to close `sock` (EOF or reset); False if it is still open after PATIENCE."""
    sock.settimeout(PATIENCE)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def read_answers(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """Read `count` answers (status, body) from one socket, framed by their Content-Length."""
    data, answers = b"", []
    while len(answers) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].decode("latin-1").split("\r\n")
            length = next(int(h.split(":")[1]) for h in head if h.lower().startswith("content-length:"))
            end = head_end + 4 + length
            if len(data) >= end:
                answers.append((int(head[0].split()[1]), data[head_end + 4 : end]))
                data = data[end:]
                continue
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection early"
        data += chunk
    return answers


def test_healthz_is_ok(served: tuple[HealthServer, State]) -> None:
    """/healthz answers 200 while the process runs."""
    status, body, ctype = health_get(served[0].port, "/healthz")
    assert (status, orjson.loads(body), ctype) == (200, {"status": "ok"}, "application/json")


def test_readyz_follows_readiness(served: tuple[HealthServer, State]) -> None:
    """/readyz is 200 when ready and 503 when not, with the per-worker detail."""
    server, state = served
    assert health_get(server.port, "/readyz")[0] == 200
    state.ready = False
    status, body, _ = health_get(server.port, "/readyz")
    assert status == 503 and orjson.loads(body) == {"ready": False, "workers": {"123": False}}


def test_metrics_text(served: tuple[HealthServer, State]) -> None:
    """/metrics serves the exposition text with its content type."""
    status, body, ctype = health_get(served[0].port, "/metrics?x=1")
    assert (status, body, ctype) == (200, b"gpupool_up 1\n", "text/plain; version=0.0.4")


def test_unknown_path_is_json_404(served: tuple[HealthServer, State]) -> None:
    """Other paths are 404 with a JSON error."""
    status, body, _ = health_get(served[0].port, "/mutate")
    assert status == 404 and "healthz" in orjson.loads(body)["error"]


def test_failing_readiness_is_a_500_not_a_hang(served: tuple[HealthServer, State]) -> None:
    """If readiness cannot be determined, the probe still gets an answer (500)."""
    server, state = served
    state.fail = True
    assert health_get(server.port, "/readyz")[0] == 500


def test_head_has_the_headers_of_get_without_a_body(served: tuple[HealthServer, State]) -> None:
    """HEAD answers with GET's status and Content-Length but sends no body, and the connection stays usable."""
    conn = http.client.HTTPConnection("127.0.0.1", served[0].port, timeout=10)
    try:
        for path in ("/healthz", "/readyz", "/metrics"):
            conn.request("HEAD", path)
            resp = conn.getresponse()
            assert resp.status == 200 and resp.read() == b""
            assert int(resp.getheader("Content-Length") or -1) == len(health_get(served[0].port, path)[1])
        conn.request("GET", "/healthz")
        assert orjson.loads(conn.getresponse().read()) == {"status": "ok"}
    finally:
        conn.close()


def test_keep_alive_answers_many_requests_on_one_connection(served: tuple[HealthServer, State]) -> None:
    """A scraper's kept-alive connection gets every answer on the same socket, even when it pipelines."""
    conn = http.client.HTTPConnection("127.0.0.1", served[0].port, timeout=10)
    try:
        conn.connect()
        sock = conn.sock
        for path in ("/healthz", "/readyz", "/metrics", "/nope", "/healthz"):
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            assert resp.status in (200, 404) and not resp.will_close
        assert conn.sock is sock
    finally:
        conn.close()
    with socket.create_connection(("127.0.0.1", served[0].port), timeout=10) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        (status1, body1), (status2, body2) = read_answers(raw, 2)
        assert (status1, orjson.loads(body1)) == (200, {"status": "ok"})
        assert (status2, orjson.loads(body2)["ready"]) == (200, True)


def test_connection_close_and_http10_are_honoured(served: tuple[HealthServer, State]) -> None:
    """`Connection: close` and a plain HTTP/1.0 request get one answer, then the server closes."""
    for request in (b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b"GET /healthz HTTP/1.0\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", served[0].port), timeout=10) as raw:
            raw.sendall(request)
            data = b""
            while chunk := raw.recv(65536):
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b'{"status":"ok"}')


def test_other_methods_are_refused_with_json(served: tuple[HealthServer, State]) -> None:
    """POST and friends get 405 with a JSON error naming what the port serves."""
    conn = http.client.HTTPConnection("127.0.0.1", served[0].port, timeout=10)
    try:
        conn.request("POST", "/healthz", body=b"{}")
        resp = conn.getresponse()
        assert resp.status == 405 and resp.getheader("Allow") == "GET, HEAD"
        assert "healthz" in orjson.loads(resp.read())["error"]
    finally:
        conn.close()


def test_garbage_is_a_json_400(served: tuple[HealthServer, State]) -> None:
    """A request line that is not HTTP gets 400 with a JSON error, and the connection is closed."""
    with socket.create_connection(("127.0.0.1", served[0].port), timeout=10) as raw:
        raw.sendall(b"hello there\r\n\r\n")
        resp = http.client.HTTPResponse(raw)
        resp.begin()
        assert resp.status == 400 and "error" in orjson.loads(resp.read())
        assert closed_by_server(raw)


@pytest.mark.parametrize(
    "announces",
    [
        pytest.param(b"Content-Length: 5\r\n", id="content-length"),
        pytest.param(b"Transfer-Encoding: chunked\r\n", id="chunked"),
    ],
)
def test_a_request_announcing_a_body_is_answered_413_from_its_head(
    served: tuple[HealthServer, State], announces: bytes
) -> None:
    """No endpoint takes a body: a GET whose head announces one is answered 413 with a JSON error at once,
    before any of the body is sent, and the connection is closed."""
    with socket.create_connection(("127.0.0.1", served[0].port), timeout=PATIENCE) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + announces + b"\r\n")
        resp = http.client.HTTPResponse(raw)
        resp.begin()
        assert (resp.status, resp.getheader("Connection")) == (413, "close")
        assert "without a body" in orjson.loads(resp.read())["error"]
        assert closed_by_server(raw)


def test_busy_port_fails_at_construction() -> None:
    """Binding happens in the constructor, so `serve` can report a busy port before gunicorn starts."""
    first = HealthServer("127.0.0.1", 0, lambda: Readiness(True), lambda: MetricsText(b"", "text/plain"))
    try:
        with pytest.raises(OSError):
            HealthServer("127.0.0.1", first.port, lambda: Readiness(True), lambda: MetricsText(b"", "text/plain"))
    finally:
        first.stop()


def test_a_thousand_idle_or_slow_connections_neither_starve_probes_nor_add_threads(
    served: tuple[HealthServer, State],
) -> None:
    """With 1,000 connections open that send nothing or half a request, /healthz and /readyz are still
    answered, and the server runs on the same few threads as with none."""
    server, _ = served
    threads_before = threading.active_count()
    with ExitStack() as stack:
        for i in range(1000):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", server.port), timeout=10))
            if i % 2:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: slow")  # never finished
        assert health_get(server.port, "/healthz")[0] == 200
        assert health_get(server.port, "/readyz")[0] == 200
        assert threading.active_count() <= threads_before


def test_a_request_that_never_completes_is_cut_at_the_deadline(tuned: Callable[..., HealthServer]) -> None:
    """A client that sends half a request (or nothing) is disconnected after the request deadline."""
    server = tuned(request_timeout=0.3)
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as silent,
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow,
    ):
        slow.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert closed_by_server(silent) and closed_by_server(slow)


def test_kept_alive_connection_is_closed_when_idle_too_long(tuned: Callable[..., HealthServer]) -> None:
    """Keep-alive is bounded: a connection idle for longer than the idle timeout is closed."""
    server = tuned(idle_timeout=0.3)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        resp = http.client.HTTPResponse(raw)
        resp.begin()
        assert resp.status == 200 and not resp.will_close
        resp.read()
        assert closed_by_server(raw)


def test_connections_over_the_limit_close_the_longest_idle(tuned: Callable[..., HealthServer]) -> None:
    """Past max_connections a new client is still served; the oldest connection waiting for its client makes room."""
    server = tuned(max_connections=4)
    with ExitStack() as stack:
        idle = [stack.enter_context(socket.create_connection(("127.0.0.1", server.port))) for _ in range(4)]
        wait_until(lambda: health_get(server.port, "/healthz")[0] == 200, PATIENCE, "a probe past the limit")
        assert closed_by_server(idle[0])


RST = struct.pack("ii", 1, 0)  # SO_LINGER on with 0 s: close() sends a reset, like a client killed mid-way

SERVE_SCRIPT = """
import logging.config, sys
from webhook.serving.health import HealthServer, MetricsText, Readiness
from webhook.serving.logs import logging_config
logging.config.dictConfig(logging_config("debug"))
big = MetricsText(b"x" * 32_000_000, "text/plain")  # more than the socket buffers hold
server = HealthServer("127.0.0.1", 0, lambda: Readiness(True), lambda: big)
server.start()
print(server.port, flush=True)
sys.stdin.read()
server.stop()
"""


def test_clients_that_vanish_leave_only_json_debug_lines(tmp_path: Path) -> None:
    """A client that disconnects mid-request or mid-response is a JSON debug line, never a traceback:
    every line the server writes to stderr is one JSON object."""
    stderr_path = tmp_path / "stderr"
    with (
        open(stderr_path, "wb") as stderr,
        subprocess.Popen(
            [sys.executable, "-c", SERVE_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=REPO
        ) as proc,
    ):
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        for request, read_first in (
            (b"GET /metrics HTTP/1.1\r\nHost: x\r\n", False),
            (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", True),
        ):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RST)
            sock.sendall(request)
            if read_first:
                assert sock.recv(1024).startswith(b"HTTP/1.1 200")
            sock.close()

        def lines() -> list[dict[str, object]]:
            return [orjson.loads(line) for line in stderr_path.read_bytes().splitlines() if line.strip()]

        def disconnects() -> list[dict[str, object]]:
            return [e for e in lines() if e["logger"] == "gpupool.health" and "disconnected" in e]

        wait_until(lambda: len(disconnects()) >= 2, PATIENCE, "both disconnects in the log")
        assert any(e["disconnected"] == "mid-response" for e in disconnects())
        assert health_get(port, "/healthz")[0] == 200
        proc.stdin.close()
        assert proc.wait(PATIENCE) == 0
        assert {e["level"] for e in disconnects()} == {"debug"}
        assert all(isinstance(e, dict) for e in lines())  # every line parsed as a JSON object


@pytest.fixture
def busy() -> Iterator[HealthServer]:
    """A started server with the shipped limits and a /metrics answer the size of a busy cluster's."""
    server = make_server(State(), exposition)
    server.start()
    yield server
    server.stop()


def test_probes_get_in_while_64_clients_pipeline_scrapes(busy: HealthServer) -> None:
    """With 64 clients pipelining GET /metrics (as many connections as the port holds), every liveness
    and readiness probe is answered within the kubelet's timeoutSeconds."""
    with Load(busy.port).add("pipeline", 64) as load:
        wait_until(lambda: load.answered_bytes > 10_000_000, 60, "the clients to get their scrapes")
        assert probes_apart(busy.port, 10) == []


@pytest.mark.parametrize(
    "clients",
    [
        pytest.param({"no-read": 64}, id="slow-readers-of-scrapes"),
        pytest.param({"drip": 64}, id="slow-senders"),
        pytest.param({"flood": 256}, id="connection-flood"),
        pytest.param({"pipeline": 32, "no-read": 32, "drip": 32, "flood": 128}, id="all-at-once"),
    ],
)
def test_probes_get_in_under_every_load(busy: HealthServer, clients: dict[str, int]) -> None:
    """Whatever mix of clients holds the port (readers that never read a scrape's answer, heads sent a byte
    at a time, more connections than it holds, reopened as soon as they are closed), every probe is answered
    within the kubelet's timeoutSeconds."""
    load = Load(busy.port)
    for kind, count in clients.items():
        load.add(kind, count)
    with load:
        load.settle()
        assert probes_apart(busy.port, 5) == []


def test_a_scrape_that_hangs_never_holds_up_readiness() -> None:
    """/readyz is answered while /metrics renderings hang, however many scrapes wait for them."""
    release = threading.Event()

    def stuck() -> MetricsText:
        release.wait(PATIENCE)
        return MetricsText(b"late 1\n", "text/plain")

    server = make_server(State(), stuck)
    server.start()
    try:
        with ExitStack() as stack:
            for _ in range(8):
                sock = stack.enter_context(socket.create_connection(("127.0.0.1", server.port), timeout=10))
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert probes_apart(server.port, 3) == []
    finally:
        release.set()
        server.stop()


def test_room_is_made_from_scrapes_before_probes() -> None:
    """When every connection waits for an answer, a new one closes the oldest holding a scrape, not an older
    one waiting for readiness: the probe's connection is the last to go."""
    release = threading.Event()

    def hang_readiness() -> Readiness:
        release.wait(PATIENCE)
        return Readiness(True)

    def hang_metrics() -> MetricsText:
        release.wait(PATIENCE)
        return MetricsText(b"", "text/plain")

    server = HealthServer("127.0.0.1", 0, hang_readiness, hang_metrics, max_connections=3)
    server.start()
    try:
        with ExitStack() as stack:
            socks = [
                stack.enter_context(socket.create_connection(("127.0.0.1", server.port), timeout=10)) for _ in range(3)
            ]
            for sock, path in zip(socks, ("/readyz", "/metrics", "/metrics"), strict=True):
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert probe(server.port, "/healthz") == 200
            assert closed_by_server(socks[1])
            release.set()
            assert [read_answers(sock, 1)[0][0] for sock in (socks[0], socks[2])] == [200, 200]
    finally:
        release.set()
        server.stop()


def get(sock: socket.socket, path: str, count: int = 1) -> list[tuple[int, bytes]]:
    """Send `count` pipelined GETs of `path` on `sock` and read their answers."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * count)
    return read_answers(sock, count)


def test_scrapes_past_the_limit_get_503_with_retry_after() -> None:
    """Past `max_scrapes` scrapes in progress, a scrape is answered 503 at once, with Retry-After and a JSON
    error naming the limit; the scrapes in progress still get their answer, and the connection stays usable."""
    release = threading.Event()

    def slow() -> MetricsText:
        release.wait(PATIENCE)
        return MetricsText(b"gpupool_up 1\n", "text/plain")

    server = make_server(State(), slow, max_scrapes=2)
    server.start()
    try:
        with ExitStack() as stack:
            first, second, third = (
                stack.enter_context(socket.create_connection(("127.0.0.1", server.port), timeout=10)) for _ in range(3)
            )
            for sock in (first, second):
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert health_get(server.port, "/healthz")[0] == 200  # both scrapes have been read by now
            third.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            resp = http.client.HTTPResponse(third)
            resp.begin()
            assert (resp.status, resp.getheader("Retry-After")) == (503, "1")
            assert "2 scrapes are in progress" in orjson.loads(resp.read())["error"]
            release.set()
            assert [status for sock in (first, second) for status, _ in read_answers(sock, 1)] == [200, 200]
            assert get(third, "/metrics") == [(200, b"gpupool_up 1\n")]
    finally:
        release.set()
        server.stop()


def test_scrapes_waiting_together_share_one_rendering() -> None:
    """Scrapes that arrive while a rendering runs are all answered by the next one: one rendering at a time,
    however many scrape, and each answer rendered after its request arrived."""
    release, lock = threading.Event(), threading.Lock()
    calls, running, most = [0], [0], [0]

    def counted() -> MetricsText:
        with lock:
            calls[0] += 1
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(PATIENCE)
        with lock:
            running[0] -= 1
            return MetricsText(f"rendering {calls[0]}\n".encode(), "text/plain")

    server = make_server(State(), counted, max_scrapes=64)
    server.start()
    try:
        with ExitStack() as stack:
            socks = [
                stack.enter_context(socket.create_connection(("127.0.0.1", server.port), timeout=10)) for _ in range(20)
            ]
            socks[0].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_until(lambda: calls[0] == 1, PATIENCE, "the first rendering to start")
            for sock in socks[1:]:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert health_get(server.port, "/healthz")[0] == 200  # every scrape has been read by now
            release.set()
            bodies = [read_answers(sock, 1)[0] for sock in socks]
        assert bodies == [(200, b"rendering 1\n")] + [(200, b"rendering 2\n")] * 19
        assert (calls[0], most[0]) == (2, 1)
    finally:
        release.set()
        server.stop()


def test_calls_that_never_return_are_answered_503_at_the_deadline() -> None:
    """A readiness or metrics call that hangs does not hold its connection: at the request deadline the probe
    is told not ready (503) and the scrape to retry (503 with Retry-After)."""
    release = threading.Event()

    def hang() -> Readiness:
        release.wait(PATIENCE)
        return Readiness(True)

    def hang_metrics() -> MetricsText:
        release.wait(PATIENCE)
        return MetricsText(b"", "text/plain")

    server = HealthServer("127.0.0.1", 0, hang, hang_metrics, request_timeout=0.3)
    server.start()
    try:
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=PATIENCE) as probe_sock,
            socket.create_connection(("127.0.0.1", server.port), timeout=PATIENCE) as scrape_sock,
        ):
            scrape_sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            ((status, body),) = get(probe_sock, "/readyz")
            assert (status, orjson.loads(body)["ready"]) == (503, False)
            resp = http.client.HTTPResponse(scrape_sock)
            resp.begin()
            assert (resp.status, resp.getheader("Retry-After")) == (503, "1")
            assert "not rendered within 0.3 s" in orjson.loads(resp.read())["error"]
    finally:
        release.set()
        server.stop()


def test_a_deep_pipeline_is_answered_in_order(served: tuple[HealthServer, State]) -> None:
    """Thousands of requests pipelined in one write are all answered, in order, on the same connection."""
    with socket.create_connection(("127.0.0.1", served[0].port), timeout=PATIENCE) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n" * 2000)
        answers = read_answers(raw, 4000)
    assert [status for status, _ in answers] == [200, 404] * 2000


@pytest.mark.parametrize(
    ("request_bytes", "code"),
    [
        pytest.param(b"GET /healthz HTTP/1.1\r\n\r\n", 400, id="http11-without-host"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: " + b"y" * 100_000, 431, id="head-unfinished-past-16k"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n", 400, id="header-without-colon"),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, id="two-lengths"
        ),
    ],
)
def test_malformed_requests_get_a_json_error_and_the_connection_closes(
    served: tuple[HealthServer, State], request_bytes: bytes, code: int
) -> None:
    """A request HTTP/1.1 does not allow is answered with its 4xx and a JSON error, then the connection closes."""
    with socket.create_connection(("127.0.0.1", served[0].port), timeout=PATIENCE) as raw:
        raw.sendall(request_bytes)
        resp = http.client.HTTPResponse(raw)
        resp.begin()
        assert resp.status == code and "error" in orjson.loads(resp.read())
        assert closed_by_server(raw)


# Pieces a hostile client strings together: request lines, headers that change framing, stray line ends.
PIECES = [
    *(
        f"{m} {p} HTTP/{v}\r\n".encode()
        for m in ("GET", "HEAD", "POST", "CONNECT", "OPTIONS")
        for p in ("/healthz", "/readyz", "/metrics", "*", "http://h/healthz")
        for v in ("1.1", "1.0", "2", "1.1x")
    ),
    b"Host: x\r\n",
    b"Host: a\r\nHost: b\r\n",
    b"Content-Length: 0\r\n",
    b"Content-Length: 5\r\n",
    b"Content-Length: -1\r\n",
    b"Content-Length: 9999999999999999999999\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip\r\n",
    b"Expect: 100-continue\r\n",
    b"Connection: close\r\n",
    b"Connection: keep-alive, upgrade\r\nUpgrade: h2c\r\n",
    b" folded\r\n",
    b"\r\n",
    b"\n",
    b"\r",
    b"\x00",
    b"\xff\xfe",
    b"5\r\nhello\r\n0\r\n\r\n",
    b"zz\r\n",
]
STATUS = re.compile(rb"HTTP/1\.1 (\d{3}) ")


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(PIECES) | st.binary(max_size=24), max_size=14).map(b"".join))
def test_any_bytes_get_http_answers_or_a_close_never_a_500(
    served: tuple[HealthServer, State], caplog: pytest.LogCaptureFixture, data: bytes
) -> None:
    """Whatever bytes a client sends, it gets well-formed answers (no 500) and the connection ends once the
    client's side has; nothing is logged at error, and the port still answers probes."""
    server, _ = served
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="gpupool.health"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=PATIENCE) as raw:
            raw.sendall(data)
            raw.shutdown(socket.SHUT_WR)
            reply = b""
            try:
                while chunk := raw.recv(65536):
                    reply += chunk
            except ConnectionResetError:
                pass
        assert reply == b"" or STATUS.match(reply), reply[:100]
        assert b"HTTP/1.1 500 " not in reply
        assert health_get(server.port, "/healthz")[0] == 200
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
