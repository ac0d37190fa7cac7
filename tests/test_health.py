"""Tests for webhook.health: the plain-HTTP probe and scrape endpoints, over a real socket."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest

from tests.conftest import health_get
from webhook.health import HealthServer, MetricsText, Readiness


@dataclass
class State:
    ready: bool = True
    fail: bool = False


@pytest.fixture
def served() -> Iterator[tuple[HealthServer, State]]:
    state = State()

    def readiness() -> Readiness:
        if state.fail:
            raise RuntimeError("cannot read the metrics directory")
        return Readiness(state.ready, {"workers": {"123": state.ready}})

    text = MetricsText(b"gpupool_up 1\n", "text/plain; version=0.0.4")
    server = HealthServer("127.0.0.1", 0, readiness, lambda: text)
    server.start()
    yield server, state
    server.stop()


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


def test_busy_port_fails_at_construction() -> None:
    """Binding happens in the constructor, so `serve` can report a busy port before gunicorn starts."""
    first = HealthServer("127.0.0.1", 0, lambda: Readiness(True), lambda: MetricsText(b"", "text/plain"))
    try:
        with pytest.raises(OSError):
            HealthServer("127.0.0.1", first.port, lambda: Readiness(True), lambda: MetricsText(b"", "text/plain"))
    finally:
        first.stop()
