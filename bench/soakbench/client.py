"""kube-apiserver's side of a webhook call: one keep-alive TLS connection, the answer read, the Pod it stores."""

from __future__ import annotations

import base64
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import orjson

SERVICE_DNS = "gpupool-webhook.gpupool-system.svc"  # the name kube-apiserver verifies
DEADLINE_S = 5.0  # the webhook's timeoutSeconds (manifests/base/webhook.yaml)
MUTATE_PATH = f"/mutate?timeout={DEADLINE_S:g}s"
WILL_WAIT = "the Pod will wait"  # gpupool's warning when the chosen pool has no room now


class Connection:
    """One keep-alive TLS connection, speaking just the HTTP/1.1 that kube-apiserver's webhook client
    speaks: POST with Content-Length, answers with Content-Length. Little Python per request, so the
    client's own CPU stays small."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        self._port, self._context = port, context
        self._sock: ssl.SSLSocket | None = None
        self._file: Any = None
        self.opened = 0

    def connect(self, timeout: float = DEADLINE_S) -> ssl.SSLSocket:
        """Open the connection (TCP and the TLS handshake) unless it is open."""
        if self._sock is None:
            raw = socket.create_connection(("127.0.0.1", self._port), timeout=timeout)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = self._context.wrap_socket(raw, server_hostname=SERVICE_DNS)
            self._file = self._sock.makefile("rb")
            self.opened += 1
        return self._sock

    def post(self, body: bytes, timeout: float) -> tuple[int, bytes]:
        self.connect(timeout)
        assert self._sock is not None
        self._sock.settimeout(max(timeout, 0.001))
        head = (
            f"POST {MUTATE_PATH} HTTP/1.1\r\nHost: {SERVICE_DNS}:443\r\nUser-Agent: kube-apiserver-admission\r\n"
            f"Accept: application/json, */*\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        try:
            self._sock.sendall(head.encode() + body)
            status_line = self._file.readline(65537)
            if not status_line:
                raise ConnectionError("the server closed the connection")
            status = int(status_line.split()[1])
            length, close = 0, False
            while (line := self._file.readline(65537)) not in (b"\r\n", b"\n", b""):
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection":
                    close = value.strip().lower() == b"close"
            data = self._file.read(length)
        except (OSError, ValueError):
            self.close()
            raise
        if close:
            self.close()
        return status, data

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._file.close()
                self._sock.close()
            except OSError:
                pass
        self._sock = self._file = None


def tls_context(ca: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


@dataclass(frozen=True)
class Answer:
    outcome: str  # mutated, unchanged, denied-<code>, or what went wrong: http-<status>, malformed, ...
    patch_b64: str | None = None  # as it came: decoded only where the Pod is created
    warnings: tuple[str, ...] = ()

    @property
    def patch(self) -> list[dict[str, Any]]:
        return orjson.loads(base64.b64decode(self.patch_b64 or "W10="))  # type: ignore[no-any-return]

    @property
    def claimed(self) -> bool:
        """Admitted with capacity: placed, and not with the warning that the Pod will wait."""
        return self.outcome == "mutated" and not any(WILL_WAIT in w for w in self.warnings)


def read_answer(status: int, data: bytes, uid: str) -> Answer:
    if status != 200:
        return Answer(f"http-{status}")
    try:
        response = orjson.loads(data)["response"]
        allowed = response["allowed"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return Answer("malformed")
    if response.get("uid") != uid or not isinstance(allowed, bool):
        return Answer("malformed")
    warnings = tuple(response.get("warnings") or ())
    if not allowed:
        return Answer(f"denied-{(response.get('status') or {}).get('code')}", None, warnings)
    if not response.get("patch"):
        return Answer("unchanged", None, warnings)
    if response.get("patchType") != "JSONPatch" or not isinstance(response["patch"], str):
        return Answer("malformed")
    return Answer("mutated", response["patch"], warnings)


def persisted(pod: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """The Pod kube-apiserver stores after the webhook: the patch applied (to `pod` itself), Pending,
    on no node."""
    created: dict[str, Any] = jsonpatch.apply_patch(pod, patch, in_place=True)
    created["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    return created
