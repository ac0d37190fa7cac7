"""Watch streams: one chunked response of newline-delimited events, as kube-apiserver's watch cache sends.

Without a resourceVersion the stream starts with the current objects as ADDED; from a resourceVersion it
replays what came after it; a compacted one is an ERROR event holding a 410 Expired Status inside a 200
stream. BOOKMARKs come every `bookmark_interval` when the client allows them; the stream ends at
`timeoutSeconds`, and the injected faults (drop, stall, down) act on it as they would on a real one; a
client's watches held back (KubeSim.hold_watches) send nothing until let go, then what came meanwhile.
"""

from __future__ import annotations

import time

import orjson

from webhook.testing.kubehttp import ApiState, BaseHandler, WatchStream, error_line
from webhook.testing.kubeproto import ApiError, int_param, parse_rv
from webhook.testing.kubereads import begin
from webhook.testing.kuberesources import Resource
from webhook.testing.kubeselect import Selector
from webhook.testing.kubestore import Event, Expired

_WATCH_BATCH = 500  # events per chunk: big replays go out in a few large writes


def serve_watch(
    handler: BaseHandler, state: ApiState, res: Resource, namespace: str | None, query: dict[str, str]
) -> None:
    selector = begin(state, "watch", state.watches, res, query)
    if query.get("sendInitialEvents") in ("1", "true"):
        raise ApiError(400, "kubesim does not support sendInitialEvents")
    rv_text = query.get("resourceVersion", "")
    resume = None if rv_text in ("", "0") else parse_rv(rv_text)
    bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
    timeout = float(int_param(query, "timeoutSeconds") or state.watch_timeout)
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    stream = WatchStream(handler.connection, res.kind)
    with state.lock:
        state.streams.add(stream)
        state.open_watches[res.plural] += 1
        state.lock.notify_all()
    try:
        clean = _stream(
            handler,
            state,
            stream,
            res,
            namespace=namespace,
            resume=resume,
            bookmarks=bookmarks,
            deadline=time.monotonic() + timeout,
            selector=selector,
            token=handler.bearer(),
        )
    except OSError:
        clean = False  # the client went away
    finally:
        with state.lock:
            state.streams.discard(stream)
            state.open_watches[res.plural] -= 1
            state.lock.notify_all()  # for wait_for_watches
    if clean:
        try:
            handler.wfile.write(b"0\r\n\r\n")
            return
        except OSError:
            pass
    handler.close_connection = True


def _stream(  # noqa: PLR0913 (one watch request's parameters, by keyword)
    handler: BaseHandler,
    state: ApiState,
    stream: WatchStream,
    res: Resource,
    *,
    namespace: str | None,
    resume: int | None,
    bookmarks: bool,
    deadline: float,
    selector: Selector | None = None,
    token: str = "",
) -> bool:
    """Send events until the deadline (True: end the stream cleanly) or a fault (False)."""
    kind = res.kind
    if resume is None:
        # No resourceVersion: the current state as synthetic ADDED events, then changes.
        snap = state.store.snapshot(kind)
        lo, hi = snap.bounds(namespace)
        for i in range(lo, hi, _WATCH_BATCH):
            batch = snap.bodies[i : min(hi, i + _WATCH_BATCH)]
            if selector is not None:
                batch = [b for b in batch if selector.matches(orjson.loads(b))]
            lines = [_event_line(b"ADDED", res, b) for b in batch]
            if lines:
                handler.write_chunk(b"".join(lines))
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
                if state.watch_holds(token, res.plural):  # a late watch: nothing, not even bookmarks
                    state.lock.wait(min(deadline - now, 1.0))
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
            handler.write_chunk(error_line(410, str(expired), "Expired"))
            return True  # kube-apiserver ends the stream normally after the error
        ours = [e for e in events if e.kind is kind and (namespace is None or e.namespace == namespace)]
        lines = (
            [_event_line(e.type.encode(), res, e.body) for e in ours]
            if selector is None
            else _selected(ours, res, selector)
        )
        position = reached
        if lines:
            handler.write_chunk(b"".join(lines))
        if bookmarks and now >= next_bookmark and len(events) < _WATCH_BATCH * 4:
            mark = {"kind": kind.kind, "apiVersion": res.api_version, "metadata": {"resourceVersion": str(position)}}
            handler.write_chunk(b'{"type":"BOOKMARK","object":%b}\n' % orjson.dumps(mark))
            next_bookmark = now + state.bookmark_interval


def _selected(events: list[Event], res: Resource, selector: Selector) -> list[bytes]:
    """The watch cache's view of a selection: an object entering it is ADDED, one leaving it DELETED."""
    lines = []
    for event in events:
        now = event.type != "DELETED" and selector.matches(orjson.loads(event.body))
        before = event.prev is not None and selector.matches(orjson.loads(event.prev))
        if event.type == "DELETED":
            kind = b"DELETED" if before else None
        elif now:
            kind = b"MODIFIED" if before else b"ADDED"
        else:
            kind = b"DELETED" if before else None
        if kind is not None:
            lines.append(_event_line(kind, res, event.body))
    return lines


def _event_line(event_type: bytes, res: Resource, body: bytes) -> bytes:
    # Stored bodies are `{"metadata":...}`; the event's object also carries kind and apiVersion.
    return b'{"type":"%b","object":%b}\n' % (event_type, res.render(body))
