"""An audit log of the simulator's writes: what a benchmark needs to judge a client from the cluster's side.

kube-apiserver's audit log at level RequestResponse records each write with the object and the time it was
stored. This one does the same for the simulator, so that a benchmark measures what the cluster saw (when a
Pod finished and made room, when a gate was removed, what every node held at every moment) rather than
what the client under test says about itself. One JSON line per write, in resourceVersion order:

    {"rv": 1234, "at": 5678.901234, "type": "MODIFIED", "kind": "Pod", "key": "team-a/p", "object": {...}}

`at` is the store's `time.monotonic()` when it made the write (webhook.testing.kubestore.Event.at):
CLOCK_MONOTONIC, which on Linux is one clock for every process of the machine, so a benchmark's own
`time.monotonic()` (when it sent a signal, say) compares with it. `object` is the stored object (for
DELETED, its last state), without `kind` and `apiVersion`, as the store keeps it.

A thread follows the store's history, so a write costs nothing more than reading the clock. Should it fall
further behind than the history holds, the line `{"gap": true, "rv": N}` says that writes up to N are
missing, and the log carries on from there: a reader must not trust what it computes across a gap.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import orjson

from webhook.testing.kubestore import Event, Expired, Kind, Store, kind_of

_BATCH = 10_000


class AuditLog:
    """Writes the store's writes of `kinds` (all kinds when None) from now on to `path`, until `stop()`."""

    def __init__(self, store: Store, path: str | os.PathLike[str], kinds: Iterable[str] | None = None) -> None:
        self._store = store
        self._path = Path(path)
        self._kinds: frozenset[Kind] | None = None if kinds is None else frozenset(kind_of(k) for k in kinds)
        self._position = store.rv
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines = 0
        self.gaps = 0
        self.errors: list[BaseException] = []

    def start(self) -> AuditLog:
        if self._thread is not None:
            raise RuntimeError("the audit log is already running")
        out = open(self._path, "wb")  # noqa: SIM115 (closed by the thread when it ends)
        self._thread = threading.Thread(target=self._loop, args=(out,), name="kubesim-audit", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Write what is left of the history up to now, then close the file."""
        self._stop.set()
        with self._store.changed:
            self._store.changed.notify_all()
        if self._thread is not None:
            self._thread.join()

    def stats(self) -> dict[str, int]:
        return {"lines": self.lines, "gaps": self.gaps}

    def _loop(self, out: BinaryIO) -> None:
        try:
            with out:
                while True:
                    stopping = self._stop.is_set()
                    events = self._next(out)
                    for event in events:
                        if self._kinds is None or event.kind in self._kinds:
                            out.write(_line(event))
                            self.lines += 1
                    if events:
                        out.flush()  # a reader may follow the file while the simulator runs
                    elif stopping:
                        return
        except Exception as exc:  # a broken log must be seen, not pass for a quiet cluster
            self.errors.append(exc)
            raise

    def _next(self, out: BinaryIO) -> list[Event]:
        """The writes after the position, waiting a little for some; on falling behind the history, a gap
        line and none."""
        store = self._store
        with store.changed:
            try:
                events, reached = store.events_after(self._position, _BATCH)
                if not events and not self._stop.is_set():
                    store.changed.wait(0.2)
                    events, reached = store.events_after(self._position, _BATCH)
            except Expired:
                self._position = store.rv
                self.gaps += 1
                out.write(orjson.dumps({"gap": True, "rv": self._position}) + b"\n")
                return []
        self._position = reached
        return events


def _line(event: Event) -> bytes:
    head = orjson.dumps(
        {"rv": event.rv, "at": round(event.at, 6), "type": event.type, "kind": event.kind.kind, "key": event.key}
    )
    return head[:-1] + b',"object":' + event.body + b"}\n"
