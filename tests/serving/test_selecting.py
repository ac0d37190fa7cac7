"""Tests for webhook.serving.selecting: a connection's registration with its loop's selector."""

from __future__ import annotations

import selectors
import socket
from collections.abc import Iterator

import pytest

from webhook.serving.selecting import rewatch


@pytest.fixture
def pair() -> Iterator[tuple[selectors.BaseSelector, socket.socket, socket.socket]]:
    selector = selectors.DefaultSelector()
    ours, theirs = socket.socketpair()
    yield selector, ours, theirs
    selector.close()
    ours.close()
    theirs.close()


def test_a_socket_is_registered_changed_and_let_go_as_its_events_change(
    pair: tuple[selectors.BaseSelector, socket.socket, socket.socket],
) -> None:
    """The selector reports exactly the events last asked for, with the connection as the key's data, and
    nothing once the connection asks for none."""
    selector, ours, theirs = pair
    theirs.sendall(b"x")  # `ours` is readable and writable from now on
    events = rewatch(selector, ours, "conn", 0, selectors.EVENT_READ)
    assert [(key.data, mask) for key, mask in selector.select(0)] == [("conn", selectors.EVENT_READ)]
    events = rewatch(selector, ours, "conn", events, selectors.EVENT_WRITE)
    assert [(key.data, mask) for key, mask in selector.select(0)] == [("conn", selectors.EVENT_WRITE)]
    assert rewatch(selector, ours, "conn", events, selectors.EVENT_WRITE) == selectors.EVENT_WRITE  # unchanged
    assert rewatch(selector, ours, "conn", events, 0) == 0
    assert selector.select(0) == [] and ours not in {key.fileobj for key in selector.get_map().values()}
