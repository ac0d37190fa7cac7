"""The leader process's supervisor (webhook.serving.leaderproc): a dead leader process is restarted after
a back-off, reported as not running meanwhile; a hung one (its heartbeat too old) is killed and
restarted; `stop` runs its own stop (where the Lease is handed back)
before it exits; a leader process whose master is gone stops by itself."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_until
from webhook.domain.errors import ConfigError
from webhook.serving.leaderproc import DIED, HUNG, HUNG_ENV, LeaderSupervisor, hung_seconds


def marking(directory: Path) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """A leader body that marks its start and its stop with files named by its pid."""

    def start(heartbeat: Callable[[], None]) -> Callable[[], None]:
        (directory / f"started-{os.getpid()}").touch()
        return (directory / f"stopped-{os.getpid()}").touch

    return start


def test_a_dead_leader_process_is_restarted_after_a_back_off_and_not_running_meanwhile(tmp_path: Path) -> None:
    exited: list[int] = []
    supervisor = LeaderSupervisor(marking(tmp_path), exited=exited.append, first_backoff=1.0).start()
    try:
        first = supervisor.status()
        assert first.alive and first.pid != os.getpid() and first.restarts == 0
        wait_until((tmp_path / f"started-{first.pid}").exists, 10, "the body started")
        os.kill(first.pid, signal.SIGKILL)
        wait_until(lambda: not supervisor.status().alive, 5, "seen gone")
        wait_until(lambda: exited == [first.pid], 5, "its live metrics dropped")
        wait_until(lambda: supervisor.status().alive, 10, "restarted")
        second = supervisor.status()
        assert second.pid != first.pid and second.restarts == 1
        wait_until((tmp_path / f"started-{second.pid}").exists, 10, "the new body started")
    finally:
        supervisor.stop(timeout=10)
    assert (tmp_path / f"stopped-{second.pid}").exists()  # SIGTERM ran its stop before it exited
    assert not supervisor.status().alive
    assert exited == [first.pid, second.pid]


def test_a_leader_process_that_keeps_failing_backs_off(tmp_path: Path) -> None:
    def failing(heartbeat: Callable[[], None]) -> Callable[[], None]:
        (tmp_path / f"try-{time.monotonic()}").touch()
        raise RuntimeError("cannot start")

    supervisor = LeaderSupervisor(failing, first_backoff=0.5, max_backoff=4.0).start()
    try:
        time.sleep(3.2)  # tries at 0, ~0.5, ~1.5, ~3.5: not one every poll
        tries = len(list(tmp_path.glob("try-*")))
        assert 2 <= tries <= 4
    finally:
        supervisor.stop(timeout=5)


def test_a_leader_process_whose_master_is_gone_stops(tmp_path: Path) -> None:
    """The master is SIGKILLed: its leader process notices within a second or two and runs its stop."""
    read, write = os.pipe()
    master = os.fork()
    if master == 0:  # the master: starts the leader process, reports its pid, then waits to be killed
        os.close(read)
        try:
            supervisor = LeaderSupervisor(marking(tmp_path)).start()
            os.write(write, str(supervisor.status().pid).encode())
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(write)
    leader = int(os.read(read, 32).decode())
    os.close(read)
    wait_until((tmp_path / f"started-{leader}").exists, 10, "the body started")
    os.kill(master, signal.SIGKILL)
    os.waitpid(master, 0)
    wait_until((tmp_path / f"stopped-{leader}").exists, 10, "the leader process stopping")


def beating(directory: Path) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """A leader body whose loop beats the heartbeat every 0.1 s (as the queue's runner does each round)."""

    def start(heartbeat: Callable[[], None]) -> Callable[[], None]:
        (directory / f"started-{os.getpid()}").touch()
        stopping = threading.Event()

        def loop() -> None:
            while not stopping.wait(0.1):
                heartbeat()

        threading.Thread(target=loop, daemon=True).start()
        return stopping.set

    return start


def test_a_hung_leader_process_is_killed_and_restarted_as_hung(tmp_path: Path) -> None:
    """Stopped (SIGSTOP), the leader process beats no more: after `hung_seconds` it is killed and another
    started; one that keeps beating is left alone."""
    why: list[str] = []
    supervisor = LeaderSupervisor(beating(tmp_path), restarted=why.append, first_backoff=0.2, hung_seconds=2.0)
    supervisor.start()
    try:
        first = supervisor.status()
        wait_until((tmp_path / f"started-{first.pid}").exists, 10, "the body started")
        time.sleep(3.0)  # longer than the bound: a beating process is not hung
        assert supervisor.status().pid == first.pid and why == []
        os.kill(first.pid, signal.SIGSTOP)
        wait_until(lambda: supervisor.status().pid not in (0, first.pid), 10, "a new leader process")
        assert why == [HUNG]
        with pytest.raises(ProcessLookupError):
            os.kill(first.pid, 0)  # killed, and reaped
    finally:
        supervisor.stop(timeout=10)


def test_a_died_leader_process_is_counted_as_died(tmp_path: Path) -> None:
    why: list[str] = []
    supervisor = LeaderSupervisor(beating(tmp_path), restarted=why.append, first_backoff=0.2).start()
    try:
        first = supervisor.status()
        wait_until((tmp_path / f"started-{first.pid}").exists, 10, "the body started")
        os.kill(first.pid, signal.SIGKILL)
        wait_until(lambda: supervisor.status().pid not in (0, first.pid), 10, "a new leader process")
        assert why == [DIED]
    finally:
        supervisor.stop(timeout=10)


@pytest.mark.parametrize("given", ["soon", "1", "-5", "0", "inf", "nan"])
def test_a_bad_hung_bound_is_refused_naming_the_variable(given: str) -> None:
    with pytest.raises(ConfigError, match=f"{HUNG_ENV}=.*at least 2"):
        hung_seconds({HUNG_ENV: given})


def test_the_hung_bound_defaults_to_a_minute_and_can_be_set() -> None:
    assert hung_seconds({}) == 60.0
    assert hung_seconds({HUNG_ENV: "5"}) == 5.0
