"""Leader bodies and a supervised leader process, for the tests of the supervisor (webhook.serving.leaderproc)
and of what makes the leader process hung (webhook.serving.queueing).

Each body marks its start with a file `started-<pid>` in the test's directory, so a test knows its leader
process runs its body before it acts on it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import wait_until
from webhook.serving.leaderproc import LeaderBody, LeaderStatus, LeaderSupervisor

Beside = Callable[[], Callable[[], float | None]]  # started in the leader process: what its loop beats with


def started(directory: Path, pid: int) -> Path:
    return directory / f"started-{pid}"


def marking(directory: Path) -> LeaderBody:
    """A leader body that marks its start and its stop with files named by its pid."""

    def start(heartbeat: Callable[..., None]) -> Callable[[], None]:
        started(directory, os.getpid()).touch()
        return (directory / f"stopped-{os.getpid()}").touch

    return start


def beating(directory: Path, beside: Beside = lambda: lambda: None) -> LeaderBody:
    """A leader body whose loop beats the heartbeat every 0.1 s, as the queue's runner does each round; with
    what `beside()` returns once it has started the threads beside the loop (the start of their oldest
    round, webhook.serving.queueing.oldest), else now."""

    def start(heartbeat: Callable[..., None]) -> Callable[[], None]:
        started(directory, os.getpid()).touch()
        at = beside()
        stopping = threading.Event()

        def loop() -> None:
            while not stopping.wait(0.1):
                heartbeat(at())

        threading.Thread(target=loop, daemon=True).start()
        return stopping.set

    return start


@contextmanager
def supervised(directory: Path, body: LeaderBody, **options: Any) -> Iterator[tuple[LeaderSupervisor, LeaderStatus]]:
    """A supervisor of `body` (LeaderSupervisor's `options`), started, with its first leader process once it
    runs its body; stopped at the end."""
    supervisor = LeaderSupervisor(body, **options).start()
    try:
        first = supervisor.status()
        wait_until(started(directory, first.pid).exists, 10, "the body started")
        yield supervisor, first
    finally:
        supervisor.stop(timeout=10)
