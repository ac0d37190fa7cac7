"""The plain-HTTP health port: /healthz, /readyz and /metrics, served by the gunicorn master.

The master outlives its workers and sees all of them, so it answers probes and scrapes; the TLS port
stays for admissions only, and a scrape never competes with an admission for a worker thread. What
"ready" means and what the metrics are come in as callables, so this module knows nothing of gunicorn
or prometheus_client.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

log = logging.getLogger("gpupool.health")


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MetricsText:
    body: bytes
    content_type: str


class HealthServer:
    """Binds at construction (so a busy port fails before gunicorn starts); serves after `start()`."""

    def __init__(
        self,
        host: str,
        port: int,
        readiness: Callable[[], Readiness],
        metrics: Callable[[], MetricsText],
    ) -> None:
        handler = type(
            "HealthHandler", (_Handler,), {"readiness": staticmethod(readiness), "metrics": staticmethod(metrics)}
        )
        server_class = _IPv6Server if ":" in host else ThreadingHTTPServer
        self._server = server_class((host.strip("[]"), port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="gpupool-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    readiness: Callable[[], Readiness]
    metrics: Callable[[], MetricsText]
    protocol_version = "HTTP/1.1"  # keep-alive for Prometheus and the kubelet
    server_version = "gpupool-health"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/healthz":
                self._send(200, orjson.dumps({"status": "ok"}), "application/json")
            elif path == "/readyz":
                state = self.readiness()
                body = orjson.dumps({"ready": state.ready, **state.detail})
                self._send(200 if state.ready else 503, body, "application/json")
            elif path == "/metrics":
                text = self.metrics()
                self._send(200, text.body, text.content_type)
            else:
                message = f"no such path {path}: this port serves /healthz, /readyz and /metrics"
                self._send(404, orjson.dumps({"error": message}), "application/json")
        except Exception:  # a probe must get an answer; the log says what broke
            log.exception("health endpoint %s failed", path)
            self._send(500, orjson.dumps({"error": "internal error, see the log"}), "application/json")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would drown the admission lines: log at debug only."""
        log.debug("%s %s", self.address_string(), format % args)
