"""The simulator's HTTP side: routing, list pages, watch streams, writes, and the injected faults.

Speaks just enough of kube-apiserver's core/v1 REST API (JSON only) for a list+watch client, plus
create (POST) and delete (DELETE) of single objects, so that another process can change the cluster
the way kube-apiserver's clients do (a benchmark creating the Pods a webhook admitted, say).
HTTP/1.1 with keep-alive; a watch is one chunked response of newline-delimited events, and a
compacted resourceVersion is an ERROR event inside a 200 stream, as the real watch cache sends it.
The parameter rules and Status bodies live in webhook.testing.kubeproto.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import sys
import threading
import time
from bisect import bisect_left
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from webhook.testing.kubeobjects import StaticObjects
from webhook.testing.kubeproto import (
    CONTINUE_EXPIRED,
    ApiError,
    api_versions_doc,
    int_param,
    list_rv,
    parse_rv,
    reject_selectors,
    resource_list_doc,
    status_body,
    version_doc,
)
from webhook.testing.kubestore import (
    KINDS,
    Expired,
    Kind,
    Store,
    TooLarge,
    decode_continue,
    encode_continue,
    kind_of,
)

log = logging.getLogger(__name__)

_WATCH_BATCH = 500  # events per chunk: big replays go out in a few large writes
MAX_BODY = 3 * 1024 * 1024  # kube-apiserver's limit on a request body
# The alphabet of the suffix kube-apiserver appends to metadata.generateName (no vowels, no 0/1/3).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


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
    """Everything the handlers share: the store, the fault switches and the counters. All fields are
    guarded by `lock` (the store's condition, so that a fault can wake sleeping watch streams)."""

    def __init__(self, store: Store, *, token: str, bookmark_interval: float, watch_timeout: float) -> None:
        self.store = store
        self.lock = store.changed
        self.token = token
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
        self.open_watches: Counter[str] = Counter()
        self.streams: set[WatchStream] = set()
        self.connections: dict[socket.socket, threading.Thread] = {}
        self.errors: list[BaseException] = []
        self.objects = StaticObjects()  # served by GET only (webhook.testing.kubeobjects)

    def take_failure(self, verb: str) -> int | None:
        with self.lock:
            if self.fail_count > 0 and self.fail_verb in (None, verb):
                self.fail_count -= 1
                return self.fail_status
            return None

    def wait_out_stall(self) -> None:
        with self.lock:
            while not self.closing and not self.down and time.monotonic() < self.stall_until:
                self.lock.wait(self.stall_until - time.monotonic())


class Server(ThreadingHTTPServer):
    """A threaded HTTP/1.1 server whose handlers share one ApiState."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: ApiState) -> None:
        self.state = state
        super().__init__(address, Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return  # a client or a fault hung up mid-response: normal here
        if exc is not None:
            self.state.errors.append(exc)
        log.exception("kubesim handler failed")


class Handler(BaseHTTPRequestHandler):
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

    def do_GET(self) -> None:
        self._handle(self._route)

    def do_POST(self) -> None:
        self._handle(self._route_write)

    def do_DELETE(self) -> None:
        self._handle(self._route_write)

    def _handle(self, route: Any) -> None:
        state = self.server.state
        state.wait_out_stall()
        if state.down or state.closing:
            self.close_connection = True  # an unreachable API gives no answer at all
            return
        try:
            route(state)
        except ApiError as err:
            self.send_status(err.code, err.message, err.reason)

    def _other_method(self) -> None:
        self.close_connection = True  # the request body is left unread
        self.send_status(405, f"kubesim serves only GET, POST and DELETE, not {self.command}")

    do_PUT = do_PATCH = _other_method

    # -- responses ------------------------------------------------------------------------------

    def send_json(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def send_status(self, code: int, message: str, reason: str | None = None) -> None:
        # The real API asks clients to come back later on 429 and 503.
        headers = {"Retry-After": "1"} if code in (429, 503) else None
        self.send_json(code, orjson.dumps(status_body(code, message, reason)), headers)

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))

    # -- routing --------------------------------------------------------------------------------

    def _parse_path(self, state: ApiState) -> tuple[dict[str, str], list[str], str | None]:
        """(query, path parts with any namespace taken out, namespace) of an authorized request."""
        if self.headers.get("Authorization") != f"Bearer {state.token}":
            raise ApiError(401, "Unauthorized")
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        parts = [p for p in url.path.split("/") if p]
        namespace: str | None = None
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) in (5, 6):
            namespace, parts = parts[3], ["api", "v1", *parts[4:]]
        return query, parts, namespace

    def _route(self, state: ApiState) -> None:
        query, parts, namespace = self._parse_path(state)
        if parts == ["version"]:
            self._answer(state, "discovery", version_doc())
        elif parts == ["api"]:
            self._answer(state, "discovery", api_versions_doc(state.port))
        elif parts == ["api", "v1"]:
            self._answer(state, "discovery", resource_list_doc())
        elif parts == ["apis"]:
            self._answer(state, "discovery", {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
        elif len(parts) in (3, 4) and parts[:2] == ["api", "v1"] and parts[2] in _PLURALS:
            kind = kind_of(parts[2])
            # Nodes have no namespace; one Pod or quota is only addressed inside its namespace.
            if namespace is not None and not kind.namespaced:
                raise ApiError(404, "the server could not find the requested resource")
            if len(parts) == 4 and kind.namespaced and namespace is None:
                raise ApiError(404, "the server could not find the requested resource")
            if len(parts) == 4:
                self._get(state, kind, namespace or "", parts[3])
            elif query.get("watch") in ("1", "true"):
                self._watch(state, kind, namespace, query)
            else:
                self._list(state, kind, namespace, query)
        elif (body := state.objects.get(urlsplit(self.path).path)) is not None:
            if (failure := state.take_failure("get")) is not None:
                raise ApiError(failure, f"kubesim: injected failure {failure}")
            self.send_json(200, body)
        else:
            raise ApiError(404, "the server could not find the requested resource")

    def _answer(self, state: ApiState, verb: str, body: dict[str, Any]) -> None:
        failure = state.take_failure(verb)
        if failure is not None:
            raise ApiError(failure, f"kubesim: injected failure {failure}")
        self.send_json(200, orjson.dumps(body))

    def _get(self, state: ApiState, kind: Kind, namespace: str, name: str) -> None:
        failure = state.take_failure("get")
        if failure is not None:
            raise ApiError(failure, f"kubesim: injected failure {failure}")
        body = state.store.get(kind, namespace, name)
        if body is None:
            raise ApiError(404, f'{kind.plural} "{name}" not found')
        self.send_json(200, kind.event_prefix + body[1:])

    # -- writes ---------------------------------------------------------------------------------

    def _route_write(self, state: ApiState) -> None:
        """POST creates one object, DELETE removes one, as kube-apiserver does (no PUT or PATCH)."""
        body = self._read_body()
        _, parts, namespace = self._parse_path(state)
        if not (len(parts) in (3, 4) and parts[:2] == ["api", "v1"] and parts[2] in _PLURALS):
            raise ApiError(404, "the server could not find the requested resource")
        kind = kind_of(parts[2])
        named = len(parts) == 4
        if (namespace is not None and not kind.namespaced) or (kind.namespaced and namespace is None):
            raise ApiError(404, "the server could not find the requested resource")
        if named != (self.command == "DELETE"):
            raise ApiError(405, f"the server does not allow this method on the requested resource: {self.command}")
        verb = "delete" if named else "create"
        failure = state.take_failure(verb)
        if failure is not None:
            raise ApiError(failure, f"kubesim: injected failure {failure}")
        if named:
            try:
                event = state.store.remove(kind, namespace or "", parts[3])
            except KeyError:
                raise ApiError(404, f'{kind.plural} "{parts[3]}" not found') from None
            self.send_json(200, kind.event_prefix + event.body[1:])
            return
        obj = _new_object(kind, namespace, body)
        with state.lock:  # the name check and the write, as one step
            if state.store.get(kind, namespace or "", obj["metadata"]["name"]) is not None:
                raise ApiError(409, f'{kind.plural} "{obj["metadata"]["name"]}" already exists', "AlreadyExists")
            _, stored = state.store.put(obj, exists=False)
        self.send_json(201, kind.event_prefix + stored[1:])

    def _read_body(self) -> bytes:
        text = self.headers.get("Content-Length") or "0"
        if not text.isdigit():
            self.close_connection = True
            raise ApiError(400, f"invalid Content-Length: {text!r}")
        if int(text) > MAX_BODY:
            self.close_connection = True  # the body is left unread
            raise ApiError(413, "the request body is too large")
        return self.rfile.read(int(text))

    # -- list -----------------------------------------------------------------------------------

    def _list(self, state: ApiState, kind: Kind, namespace: str | None, query: dict[str, str]) -> None:
        _begin(state, "list", state.lists, kind, query)
        limit = int_param(query, "limit")
        token = query.get("continue", "")
        start = ""
        try:
            if token:
                if query.get("resourceVersion", "") not in ("", "0"):
                    raise ApiError(400, "specifying resource version is not allowed when using continue")
                try:
                    at, start = decode_continue(token)
                except ValueError as exc:
                    raise ApiError(400, str(exc)) from None
                try:
                    snap = state.store.snapshot(kind, at)
                except Expired:
                    raise ApiError(410, CONTINUE_EXPIRED) from None
            else:
                snap = state.store.snapshot(kind, list_rv(state.store, query, limit))
        except Expired as exc:
            raise ApiError(410, str(exc)) from None
        except TooLarge as exc:
            raise ApiError(504, str(exc)) from None
        lo, hi = snap.bounds(namespace)
        first = bisect_left(snap.keys, start, lo, hi) if start else lo
        end = hi if limit <= 0 else min(hi, first + limit)
        meta: dict[str, Any] = {"resourceVersion": str(snap.rv)}
        if end < hi:
            meta["continue"] = encode_continue(snap.rv, snap.keys[end - 1])
            meta["remainingItemCount"] = hi - end
        body = b"".join(
            (
                b'{"kind":"%bList","apiVersion":"v1","metadata":' % kind.kind.encode(),
                orjson.dumps(meta),
                b',"items":[',
                b",".join(snap.bodies[first:end]),
                b"]}",
            )
        )
        self.send_json(200, body)

    # -- watch ----------------------------------------------------------------------------------

    def _watch(self, state: ApiState, kind: Kind, namespace: str | None, query: dict[str, str]) -> None:
        _begin(state, "watch", state.watches, kind, query)
        if query.get("sendInitialEvents") in ("1", "true"):
            raise ApiError(400, "kubesim does not support sendInitialEvents")
        rv_text = query.get("resourceVersion", "")
        resume = None if rv_text in ("", "0") else parse_rv(rv_text)
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
        timeout = float(int_param(query, "timeoutSeconds") or state.watch_timeout)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        stream = WatchStream(self.connection, kind)
        with state.lock:
            state.streams.add(stream)
            state.open_watches[kind.plural] += 1
            state.lock.notify_all()
        try:
            clean = self._stream(
                state,
                stream,
                namespace=namespace,
                resume=resume,
                bookmarks=bookmarks,
                deadline=time.monotonic() + timeout,
            )
        except OSError:
            clean = False  # the client went away
        finally:
            with state.lock:
                state.streams.discard(stream)
                state.open_watches[kind.plural] -= 1
                state.lock.notify_all()  # for wait_for_watches
        if clean:
            try:
                self.wfile.write(b"0\r\n\r\n")
                return
            except OSError:
                pass
        self.close_connection = True

    def _stream(
        self,
        state: ApiState,
        stream: WatchStream,
        *,
        namespace: str | None,
        resume: int | None,
        bookmarks: bool,
        deadline: float,
    ) -> bool:
        """Send events until the deadline (True: end the stream cleanly) or a fault (False)."""
        kind, prefix = stream.kind, stream.kind.event_prefix
        if resume is None:
            # No resourceVersion: the current state as synthetic ADDED events, then changes.
            snap = state.store.snapshot(kind)
            lo, hi = snap.bounds(namespace)
            for i in range(lo, hi, _WATCH_BATCH):
                lines = [_event_line(b"ADDED", prefix, b) for b in snap.bodies[i : min(hi, i + _WATCH_BATCH)]]
                self.write_chunk(b"".join(lines))
            position = snap.rv
        else:
            position = resume
        next_bookmark = time.monotonic() + state.bookmark_interval
        expired: Expired | None = None
        while True:
            with state.lock:
                while True:
                    if stream.dropped or state.closing or state.down:
                        return False
                    now = time.monotonic()
                    if now >= deadline:
                        return True
                    if now < state.stall_until:
                        state.lock.wait(min(deadline, state.stall_until) - now)
                        continue
                    try:
                        events, reached = state.store.events_after(position, _WATCH_BATCH * 4)
                    except Expired as exc:
                        expired = exc
                        break
                    if events or (bookmarks and now >= next_bookmark):
                        break
                    state.lock.wait(min(deadline, next_bookmark if bookmarks else deadline) - now)
            if expired is not None:
                error = status_body(410, str(expired), "Expired")
                self.write_chunk(b'{"type":"ERROR","object":%b}\n' % orjson.dumps(error))
                return True  # kube-apiserver ends the stream normally after the error
            lines = [
                _event_line(e.type.encode(), prefix, e.body)
                for e in events
                if e.kind is kind and (namespace is None or e.namespace == namespace)
            ]
            position = reached
            if lines:
                self.write_chunk(b"".join(lines))
            if bookmarks and now >= next_bookmark and len(events) < _WATCH_BATCH * 4:
                mark = {"kind": kind.kind, "apiVersion": "v1", "metadata": {"resourceVersion": str(position)}}
                self.write_chunk(b'{"type":"BOOKMARK","object":%b}\n' % orjson.dumps(mark))
                next_bookmark = now + state.bookmark_interval


_PLURALS = {k.plural for k in KINDS}


def _new_object(kind: Kind, namespace: str | None, body: bytes) -> dict[str, Any]:
    """The object a create stores, checked as kube-apiserver checks it: the kind and namespace agree
    with the path, no resourceVersion; the server sets uid and creationTimestamp, and fills in the
    name from metadata.generateName."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not JSON: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata", {}), dict):
        raise ApiError(400, "the request body is not an object with metadata")
    if obj.get("kind", kind.kind) != kind.kind:
        raise ApiError(400, f"the kind of the object ({obj.get('kind')}) is not {kind.kind}")
    meta = obj["metadata"] = dict(obj.get("metadata") or {})
    if kind.namespaced:
        if meta.get("namespace", namespace) != namespace:
            raise ApiError(400, "the namespace of the provided object does not match the namespace sent on the request")
        meta["namespace"] = namespace
    if meta.get("resourceVersion"):
        raise ApiError(400, "resourceVersion should not be set on objects to be created")
    if not meta.get("name"):
        if not meta.get("generateName"):
            raise ApiError(422, "metadata.name: Required value: name or generateName is required", "Invalid")
        meta["name"] = str(meta["generateName"]) + "".join(random.choices(_NAME_ALPHABET, k=5))
    for field in ("uid", "creationTimestamp"):
        meta.pop(field, None)
    obj["kind"] = kind.kind
    return dict(obj)


def _event_line(event_type: bytes, prefix: bytes, body: bytes) -> bytes:
    # Stored bodies are `{"metadata":...}`; the event's object also carries kind and apiVersion.
    return b'{"type":"%b","object":%b%b}\n' % (event_type, prefix, body[1:])


def _begin(state: ApiState, verb: str, counter: dict[str, int], kind: Kind, query: dict[str, str]) -> None:
    """What every list and watch does first: count it, answer an injected failure, refuse selectors."""
    with state.lock:
        counter[kind.plural] += 1
    failure = state.take_failure(verb)
    if failure is not None:
        raise ApiError(failure, f"kubesim: injected failure {failure}")
    reject_selectors(query)
