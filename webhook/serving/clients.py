"""The worker's table of its client connections (webhook.serving.worker): each one's registration with
the poller, the orders in which connections are given up when something runs out, and the bytes their
requests hold.

Three indexes, each oldest first, say what a connection waits for: `fresh` (no request completed yet),
`idle` (kept alive between two requests) and `queued` (a complete request waiting for a thread). At the
connection limit the first of `fresh`, else of `idle`, is closed for a new one; past BUFFER_BUDGET the
connection holding the most bytes is closed.
"""

from __future__ import annotations

import selectors
from typing import Any

from webhook.serving.connection import SERVING, Connection
from webhook.serving.selecting import rewatch

BUFFER_BUDGET = 64 * 1024 * 1024  # bytes of requests not yet answered, per worker


class Clients:
    """Every open connection of the worker, indexed by what it waits for."""

    def __init__(self, poller: selectors.BaseSelector, log: Any) -> None:
        self.poller = poller
        self.log = log
        self.conns: set[Connection] = set()
        self.fresh: dict[Connection, None] = {}  # no request completed yet, oldest first
        self.idle: dict[Connection, None] = {}  # kept alive between requests, longest idle first
        self.queued: dict[Connection, None] = {}  # complete requests waiting for a thread, oldest first
        self.held = 0  # bytes counted in BUFFER_BUDGET

    def __len__(self) -> int:
        return len(self.conns)

    def __contains__(self, conn: Connection) -> bool:
        return conn in self.conns

    def add(self, conn: Connection) -> None:
        """A new connection: it has completed no request yet, and waits for its first bytes."""
        self.conns.add(conn)
        self.fresh[conn] = None
        self.watch(conn, selectors.EVENT_READ)

    def watch(self, conn: Connection, mask: int) -> None:
        """Wait for the events in `mask` on the connection (0: for none)."""
        conn.mask = rewatch(self.poller, conn.sock, conn, conn.mask, mask)

    def evictable(self) -> bool:
        """A connection could be closed to make room for a new one."""
        return bool(self.fresh or self.idle)

    def evict(self) -> bool:
        """Close the connection that has waited longest without completing a request, else the one idle
        the longest; False when every connection is busy with a request."""
        for waiting in (self.fresh, self.idle):
            if waiting:
                self.close(next(iter(waiting)))
                return True
        return False

    def close(self, conn: Connection) -> None:
        if conn not in self.conns:
            return
        self.watch(conn, 0)
        self.conns.discard(conn)
        self.clear(conn)
        conn.sock.close()

    def clear(self, conn: Connection) -> None:
        """The connection waits for nothing any more: out of every index, its request and the bytes it held
        given up (it is being closed, or refused and answered)."""
        self.fresh.pop(conn, None)
        self.idle.pop(conn, None)
        self.queued.pop(conn, None)
        self.account(conn, 0)
        conn.request = None

    def account(self, conn: Connection, held: int) -> None:
        """Count the bytes requests not yet answered hold; past the budget, close the connection holding
        the most (requests in a thread are counted but not closed: there are at most `threads` of them)."""
        self.held += held - conn.held
        conn.held = held
        while self.held > BUFFER_BUDGET:
            biggest = max((c for c in self.conns if c.state != SERVING), key=lambda c: c.held, default=None)
            if biggest is None:
                return
            self.log.warning("closing a connection from %s holding %d bytes of a request", biggest.client, biggest.held)
            self.close(biggest)
