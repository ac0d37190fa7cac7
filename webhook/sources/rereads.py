"""Pods whose cut node affinity may no longer be exact, read again in full from the API.

The live inventory keeps a Pod's long node-affinity lists cut to the values its nodes carry
(webhook.domain.cut). When a node gains a value, for a key a cut Pod names, that no node carried when it
was cut, the cut may be missing it: such a Pod is decided by nothing (webhook.queue.waiting) until it is
read again. `Rereads` does that off the admission path and the inventory's lock: one thread, one GET at
a time, each Pod once however often it is asked for, and the answer applied as a watch event would be
(it is cut again, against the nodes as they are now). A Pod the API no longer has is left to its watch's
DELETED event; a GET that fails is tried again after `retry` seconds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger("gpupool.inventory")

Key = tuple[str, str]
Get = Callable[[str, str], Mapping[str, Any] | None]  # (namespace, name) -> the Pod, None when gone


class Rereads:
    """The Pods to read again, and the thread that reads them (started with the first)."""

    def __init__(self, get: Get, apply: Callable[[Key, Mapping[str, Any]], None], retry: float = 1.0) -> None:
        self._get, self._apply, self._retry = get, apply, retry
        self._lock = threading.Condition()
        self._pending: dict[Key, None] = {}  # in the order asked
        self._thread: threading.Thread | None = None
        self._closed = False
        self.done = 0  # Pods read again and applied

    def want(self, keys: Iterable[Key]) -> None:
        """Read these Pods again (each once, however often asked before it is read)."""
        with self._lock:
            before = len(self._pending)
            self._pending.update(dict.fromkeys(keys))
            if len(self._pending) == before or self._closed:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gpupool-rereads", daemon=True)
                self._thread.start()
            self._lock.notify()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                key = next(iter(self._pending))
            try:
                obj = self._get(*key)
            except Exception as exc:  # the API is down or slow: the Pod stays asked for
                log.warning("reading Pod %s/%s again failed: %s", key[0], key[1], exc)
                with self._lock:
                    if self._pending.pop(key, 0) is None:
                        self._pending[key] = None  # behind the others
                    self._lock.wait(self._retry)
                continue
            with self._lock:
                self._pending.pop(key, None)
            if obj is not None:
                self._apply(key, obj)
                self.done += 1
