"""List+watch of one resource through the `kubernetes` client, on raw JSON, forever.

What client-go's reflector does, minus the typed models (20,000 Pods through `ApiClient.deserialize`
cost 6.7 s and 813 MB here): list in pages with limit/continue, then watch from the list's
resourceVersion with bookmarks; resume from the last resourceVersion when a watch ends; re-list on
410 Gone; reconnect with capped exponential backoff and jitter, starting over from the initial delay
once the API has served for a while; a client-side timeout on every call, since a dead connection can
otherwise hang forever.

The reflector knows nothing about GPUs: it hands raw objects to a `Sink`.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import urllib3
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("gpupool.reflector")

Obj = Mapping[str, Any]


class Sink(Protocol):
    """Where a reflector delivers objects. Called from the reflector's thread."""

    def replace(self, kind: str, objects: list[Obj], first: bool, final: bool) -> None:
        """A page of a (re-)list. `first` starts a list; `final` ends it: objects not listed since
        the first page are gone."""

    def apply(self, kind: str, event: str, obj: Obj) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""


@dataclass(frozen=True, slots=True)
class ReflectorConfig:
    page_size: int = 500
    connect_timeout: float = 5.0
    list_timeout: float = 60.0  # read timeout of one list page
    watch_seconds: int = 300  # server-side timeoutSeconds of one watch
    watch_read_timeout: float = 90.0  # no byte (event or bookmark) for this long: the connection is dead
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    # Served this long without a failure, the API is healthy: its next drop is retried at backoff_initial.
    backoff_reset_after: float = 10.0


class _CollectorPause:
    """`with COLLECTOR_PAUSED:` keeps Python's cyclic garbage collector from running, in every thread,
    until the last of the overlapping `with` blocks ends (it runs again only if it ran before the first).

    A list page is a tree of about 35,000 dicts and lists that orjson builds and the sink reads and drops
    within milliseconds. Decoded JSON holds no reference cycles, so reference counting frees all of it and
    the collector can find nothing there; yet allocating it sets the collector off dozens of times per
    page, and the page's objects, alive while it runs, are promoted and walked again by full collections
    of the whole heap. On a cold sync of 150,000 Pods that was as much CPU as the decoding itself. While
    paused, other threads' garbage waits, for one page, until the collector runs next.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._resume = False

    def __enter__(self) -> None:
        with self._lock:
            if not self._depth:
                self._resume = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if not self._depth and self._resume:
                gc.enable()


COLLECTOR_PAUSED = _CollectorPause()


class Gone(Exception):
    """410: the resourceVersion is too old; list again."""


class Reflector:
    """Keeps a Sink in step with one resource. `list_call` is e.g. `CoreV1Api.list_node`."""

    def __init__(
        self,
        kind: str,
        list_call: Callable[..., Any],
        sink: Sink,
        config: ReflectorConfig,
        clock: Callable[[], float] = time.monotonic,
        *,
        wait: Callable[[float], object] | None = None,
    ) -> None:
        """`clock` and `wait` (sleep that `stop()` cuts short) let tests run the backoff on fake time."""
        self.kind = kind
        self._list = list_call
        self._sink = sink
        self._config = config
        self._clock = clock
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait
        self._thread: threading.Thread | None = None
        self._watching: Any = None  # the open watch response, which stop() shuts down
        self._watching_lock = threading.Lock()
        self.resource_version = ""
        self.synced = threading.Event()  # set after the first complete list
        self.connected_since: float | None = None  # since when the API has answered; None while it cannot
        self.down_since: float | None = clock()
        self.relists = 0
        self.errors = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"reflector-{self.kind}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """`halt()`, then wait up to `timeout` for the thread to end."""
        self.halt()
        self.join(timeout)

    def halt(self) -> None:
        """Stop, without waiting: the open watch is shut down, so its thread ends at once rather than
        when the next event or bookmark comes (about a minute on kube-apiserver). A list page being read
        is not cut short; its thread ends when the page is in."""
        self._stop.set()
        with self._watching_lock:
            watching = self._watching
        if watching is not None:
            _shutdown(watching)

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` for the thread `halt()` stopped to end."""
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        """Whether the reflector's thread is alive (started and not yet ended)."""
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        """Keep the sink in step until `stop()`; `start()` runs this in a thread of its own."""
        delay = self._config.backoff_initial
        while not self._stop.is_set():
            try:
                if not self.resource_version:
                    self._list_all()
                self._watch()
                delay = self._config.backoff_initial
            except Gone:
                log.info("%s: resourceVersion %s expired (410); listing again", self.kind, self.resource_version)
                self.resource_version = ""
            except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                if self._stop.is_set():
                    return  # the watch halt() shut down, most likely: nothing went wrong
                self.errors += 1
                if self._served_for() >= self._config.backoff_reset_after:
                    # An ordinary drop (an API server restart, a proxy closing the stream) ending a
                    # healthy stretch: reconnect at once rather than inherit the backoff of failures
                    # long past, which climbs to 15 s after seven drops while the inventory drifts.
                    delay = self._config.backoff_initial
                self._mark_down()
                log.warning("%s: %s; retrying in %.1f s", self.kind, _describe(exc), delay)
                self._wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self._config.backoff_max)

    def _served_for(self) -> float:
        """How long the API has answered without a failure in between (0 while it cannot be reached).

        A watch that connects and breaks at once has served for no time, so a flapping API still backs off.
        A stalled watch counts as served until its read timeout ends it; that timeout, not the backoff,
        then sets the pace of reconnecting.
        """
        return 0.0 if self.connected_since is None else self._clock() - self.connected_since

    def _mark_up(self) -> None:
        if self.down_since is not None:
            self.down_since = None
            self.connected_since = self._clock()

    def _mark_down(self) -> None:
        if self.down_since is None:
            self.down_since = self._clock()
            self.connected_since = None

    def _list_all(self) -> None:
        """List every page. The next page is asked for as soon as this one's continue token is known, and
        read in a thread of its own while this one is delivered: the API server's work on a page (etcd,
        encoding, the wire) overlaps the sink's, so a cold sync takes about the longer of the two rather
        than their sum. At most one page waits, read and undecoded, beside the one being delivered."""
        pending = self._read_page("")
        first = True
        while True:
            body = pending.result()
            with COLLECTOR_PAUSED:
                page = orjson.loads(body)
                del body
                self._mark_up()
                meta = page.get("metadata") or {}
                cont, version = meta.get("continue") or "", str(meta.get("resourceVersion", ""))
                if cont:
                    # If delivering this page fails, the list starts over: that page is dropped when it comes.
                    pending = self._read_page(cont)
                self._sink.replace(self.kind, page.get("items") or [], first=first, final=not cont)
                del page  # the page is gone here: nothing else refers to it
            if first:
                self.relists += 1
                first = False
            if not cont:
                self.resource_version = version
                self.synced.set()
                return

    def _read_page(self, cont: str) -> Future[bytes]:
        """`_page(cont)`, read in a daemon thread of its own (one per page, so that none outlives its call
        by more than the list timeout, and none keeps the process from exiting)."""
        future: Future[bytes] = Future()

        def read() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(self._page(cont))
            except BaseException as exc:  # handed to the reflector's thread, which handles or raises it
                future.set_exception(exc)

        threading.Thread(target=read, name=f"reflector-{self.kind}-page", daemon=True).start()
        return future

    def _page(self, cont: str) -> bytes:
        """One page of the list, undecoded; Gone when its continue token has expired."""
        kwargs: dict[str, Any] = {"limit": self._config.page_size}
        if cont:
            kwargs["_continue"] = cont
        try:
            return bytes(self._call(self._config.list_timeout, **kwargs).data)
        except ApiException as exc:
            if exc.status == 410 and cont:  # the continue token expired mid-list: start over
                raise Gone from None
            raise

    def _watch(self) -> None:
        resp = self._call(
            self._config.watch_read_timeout,
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._config.watch_seconds,
        )
        self._mark_up()
        with self._watching_lock:
            self._watching = resp
        if self._stop.is_set():  # stopped while connecting: halt() did not see this response
            _shutdown(resp)
        try:
            for line in _lines(resp):
                if self._stop.is_set():
                    return
                event = orjson.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message", "watch error"))
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._sink.apply(self.kind, kind, obj)
                if rv:
                    self.resource_version = str(rv)
        finally:
            with self._watching_lock:
                self._watching = None
            resp.release_conn()

    def _call(self, read_timeout: float, **kwargs: Any) -> Any:
        return self._list(
            _preload_content=False, _request_timeout=(self._config.connect_timeout, read_timeout), **kwargs
        )


def _lines(resp: Any) -> Iterator[bytes]:
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        yield from (line for line in lines if line.strip())
    if buffer.strip():
        yield buffer


def _shutdown(resp: Any) -> None:
    """Shut the socket of a streaming urllib3 response down, which ends a read blocked on it in another
    thread (closing it would not)."""
    with contextlib.suppress(OSError):  # already closed by the other side
        resp.shutdown()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"API answered {exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
