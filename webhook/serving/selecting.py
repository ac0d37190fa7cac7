"""What a connection's socket waits for in its event loop's selector, by one rule for both ports' loops:
the admission worker's (webhook.serving.clients) and the health port's (webhook.serving.health).

Each connection keeps the events it is registered for (0: not registered), so that a change is one
register, modify or unregister call and asking again for the same events costs no system call.
"""

from __future__ import annotations

import selectors
import socket
from typing import Any


def rewatch(selector: selectors.BaseSelector, sock: socket.socket, data: Any, was: int, events: int) -> int:
    """Make `selector` wait for `events` on `sock` (0: for none), with `data` as the key's data, where it
    waited for `was` so far; returns `events`, for the connection to keep."""
    if events != was:
        if not was:
            selector.register(sock, events, data)
        elif not events:
            selector.unregister(sock)
        else:
            selector.modify(sock, events, data)
    return events
