"""The simulator's HTTP plumbing: the threaded server, what its handlers share, and how they answer.

HTTP/1.1 with keep-alive and TCP_NODELAY, like kube-apiserver; JSON only. `ApiState` holds the store and
the fault switches (guarded by the store's lock, so a fault can wake sleeping watch streams);
`BaseHandler` authenticates, parses the path and query, reads a bounded body and writes JSON or a Status.
Routing is webhook.testing.kubeapi's.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from webhook.testing.kubeadmission import ADMIN, UserInfo
from webhook.testing.kubeobjects import StaticObjects
from webhook.testing.kubeproto import ApiError, status_body
from webhook.testing.kubestore import Kind, Store
from webhook.testing.kubewrite import Writer

log = logging.getLogger(__name__)
MAX_BODY = 3 * 1024 * 1024  # kube-apiserver's limit on a request body
VERBS = ("list", "watch", "get", "discovery", "create", "update", "patch", "delete")


class WatchStream:
    """One open watch connection, so that `drop_watches` can cut it."""

    def __init__(self, conn: socket.socket, kind: Kind) -> None:
        self.conn = conn
        self.kind = kind
        self.dropped = False

    def cut(self) -> None:
        self.dropped = True
        shutdown_quietly(self.conn)


def shutdown_quietly(conn: socket.socket) -> None:
    """Close both directions now, whatever thread is using the socket; the peer sees EOF."""
    with contextlib.suppress(OSError):  # already closed by the peer or by the handler
        conn.shutdown(socket.SHUT_RDWR)


class ApiState:
    """Everything the handlers share: the store, the writer, the fault switches and the counters. All
    fields are guarded by `lock` (the store's condition, so that a fault can wake sleeping watch streams)."""

    def __init__(self, store: Store, *, token: str, bookmark_interval: float, watch_timeout: float) -> None:
        self.store = store
        self.writer = Writer(store)
        self.objects = StaticObjects()  # served by GET only (webhook.testing.kubeobjects)
        self.lock = store.changed
        self.token = token
        # Bearer tokens besides `token` (whose user is an admin), each a client of its own (KubeSim.add_client).
        self.users: dict[str, UserInfo] = {token: ADMIN}
        self.held: dict[str, float] = {}  # token -> until when (monotonic) its writes are held back
        self.hold_only: dict[str, tuple[str | None, int]] = {}  # token -> (the resource held, writes let through first)
        self.holding: Counter[str] = Counter()  # writes held back right now, by token
        self.watch_held: dict[str, str | None] = {}  # token -> the resource (None: all) its watches send nothing of
        self.released: Counter[str] = Counter()  # writes held back and let go (answered since), by token
        self.bookmark_interval = bookmark_interval
        self.watch_timeout = watch_timeout
        self.port = 0
        self.closing = False
        self.down = False
        self.stall_until = 0.0
        self.fail_count = 0
        self.fail_status = 500
        self.fail_verb: str | None = None
        self.lists: Counter[str] = Counter()
        self.watches: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()  # "patch pods", "update leases", ...
        self.open_watches: Counter[str] = Counter()
        self.streams: set[WatchStream] = set()
        self.connections: dict[socket.socket, threading.Thread] = {}
        self.errors: list[BaseException] = []

    def take_failure(self, verb: str) -> None:
        """Raise the injected failure if one is due for `verb`."""
        with self.lock:
            if self.fail_count > 0 and self.fail_verb in (None, verb):
                self.fail_count -= 1
                status = self.fail_status
            else:
                return
        raise ApiError(status, f"kubesim: injected failure {status}")

    def wait_out_hold(self, token: str, resource: str) -> bool:
        """Hold a write of the client `token` to `resource` while its writes are held (KubeSim.hold_writes);
        True if it was held. It then goes on, to be judged and committed as the cluster is then."""
        with self.lock:
            if token not in self.held:
                return False
            only, through = self.hold_only.get(token, (None, 0))
            if only not in (None, resource):
                return False
            if through > 0:
                self.hold_only[token] = (only, through - 1)
                return False
            self.holding[token] += 1
            try:
                while not self.closing and time.monotonic() < self.held.get(token, 0.0):
                    self.lock.wait(min(self.held[token] - time.monotonic(), 1.0))
            finally:
                self.holding[token] -= 1
            return True

    def watch_holds(self, token: str, resource: str) -> bool:
        """Are the client `token`'s watches of `resource` held back (KubeSim.hold_watches)? Under `lock`."""
        return token in self.watch_held and self.watch_held[token] in (None, resource)

    def wait_out_stall(self) -> None:
        with self.lock:
            while not self.closing and not self.down and time.monotonic() < self.stall_until:
                self.lock.wait(self.stall_until - time.monotonic())


class Server(ThreadingHTTPServer):
    """A threaded HTTP/1.1 server whose handlers share one ApiState."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: ApiState, handler: type[BaseHandler]) -> None:
        self.state = state
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return  # a client or a fault hung up mid-response: normal here
        if exc is not None:
            self.state.errors.append(exc)
        log.exception("kubesim handler failed")


class BaseHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked watch streams, like kube-apiserver
    server: Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; with Nagle's algorithm the body of a small answer
        # waits for the client's delayed ACK of the headers (40 ms on Linux). kube-apiserver, like
        # every Go server, sets TCP_NODELAY.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.state.lock:
            self.server.state.connections[self.connection] = threading.current_thread()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.state.lock:
                self.server.state.connections.pop(self.connection, None)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests make thousands of requests; the counters say what happened

    # -- requests -------------------------------------------------------------------------------

    def parse_request_line(self, state: ApiState) -> tuple[dict[str, str], list[str]]:
        """(query, path parts) of an authorized request."""
        if self.caller(state) is None:
            raise ApiError(401, "Unauthorized")
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        return query, [p for p in url.path.split("/") if p]

    def bearer(self) -> str:
        auth = self.headers.get("Authorization") or ""
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""

    def caller(self, state: ApiState) -> UserInfo | None:
        """Who the request's bearer token says makes it; None for an unknown token."""
        return state.users.get(self.bearer())

    def read_body(self) -> bytes:
        text = self.headers.get("Content-Length") or "0"
        if not text.isdigit():
            self.close_connection = True
            raise ApiError(400, f"invalid Content-Length: {text!r}")
        if int(text) > MAX_BODY:
            self.close_connection = True  # the body is left unread
            raise ApiError(413, "the request body is too large")
        return self.rfile.read(int(text))

    # -- responses ------------------------------------------------------------------------------

    def send_json(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def send_error_status(self, err: ApiError) -> None:
        # The real API asks clients to come back later on 429 and 503.
        headers = {"Retry-After": "1"} if err.code in (429, 503) else None
        self.send_json(err.code, orjson.dumps(err.status()), headers)

    def send_status(self, code: int, message: str, reason: str | None = None) -> None:
        self.send_error_status(ApiError(code, message, reason))

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))


def error_line(code: int, message: str, reason: str) -> bytes:
    """A watch ERROR event holding a Status."""
    return b'{"type":"ERROR","object":%b}\n' % orjson.dumps(status_body(code, message, reason))
