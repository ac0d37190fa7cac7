"""The leader process's supervisor (webhook.serving.leaderproc): a dead leader process is restarted after
a back-off, reported as not running meanwhile; a hung one (its heartbeat too old) is killed and
restarted; `stop` runs its own stop (where the Lease is handed back)
before it exits; a leader process whose master is gone stops by itself; how each one ended is told
(its signal or exit code, who stopped it, whether its supervisor killed it)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.serving.leaders import beating, marking, started, supervised
from webhook.domain.errors import ConfigError
from webhook.serving.leaderending import FAILED, KILLED, SAID_SIGNAL, STOPPED, Ending
from webhook.serving.leaderending import HUNG as HUNG_CAUSE
from webhook.serving.leaderproc import DIED, HUNG, HUNG_ENV, LeaderBody, LeaderSupervisor, hung_seconds


def test_a_dead_leader_process_is_restarted_after_a_back_off_and_not_running_meanwhile(tmp_path: Path) -> None:
    exited: list[int] = []
    with supervised(tmp_path, marking(tmp_path), exited=exited.append, first_backoff=1.0) as (supervisor, first):
        assert first.alive and first.pid != os.getpid() and first.restarts == 0
        os.kill(first.pid, signal.SIGKILL)
        wait_until(lambda: not supervisor.status().alive, 5, "seen gone")
        wait_until(lambda: exited == [first.pid], 5, "its live metrics dropped")
        wait_until(lambda: supervisor.status().alive, 10, "restarted")
        second = supervisor.status()
        assert second.pid != first.pid and second.restarts == 1
        wait_until(started(tmp_path, second.pid).exists, 10, "the new body started")
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
    wait_until(started(tmp_path, leader).exists, 10, "the body started")
    os.kill(master, signal.SIGKILL)
    os.waitpid(master, 0)
    wait_until((tmp_path / f"stopped-{leader}").exists, 10, "the leader process stopping")


def test_a_hung_leader_process_is_killed_and_restarted_as_hung(tmp_path: Path) -> None:
    """Stopped (SIGSTOP), the leader process beats no more: after `hung_seconds` it is killed and another
    started; one that keeps beating is left alone."""
    why: list[str] = []
    options = {"restarted": why.append, "first_backoff": 0.2, "hung_seconds": 2.0}
    with supervised(tmp_path, beating(tmp_path), **options) as (supervisor, first):
        time.sleep(3.0)  # longer than the bound: a beating process is not hung
        assert supervisor.status().pid == first.pid and why == []
        os.kill(first.pid, signal.SIGSTOP)
        wait_until(lambda: supervisor.status().pid not in (0, first.pid), 10, "a new leader process")
        assert why == [HUNG]
        with pytest.raises(ProcessLookupError):
            os.kill(first.pid, 0)  # killed, and reaped


def test_a_died_leader_process_is_counted_as_died(tmp_path: Path) -> None:
    why: list[str] = []
    with supervised(tmp_path, beating(tmp_path), restarted=why.append, first_backoff=0.2) as (supervisor, first):
        os.kill(first.pid, signal.SIGKILL)
        wait_until(lambda: supervisor.status().pid not in (0, first.pid), 10, "a new leader process")
        assert why == [DIED]


@pytest.mark.parametrize("given", ["soon", "1", "-5", "0", "inf", "nan"])
def test_a_bad_hung_bound_is_refused_naming_the_variable(given: str) -> None:
    with pytest.raises(ConfigError, match=f"{HUNG_ENV}=.*at least 2"):
        hung_seconds({HUNG_ENV: given})


def test_the_hung_bound_defaults_to_a_minute_and_can_be_set() -> None:
    assert hung_seconds({}) == 60.0
    assert hung_seconds({HUNG_ENV: "5"}) == 5.0


def ended_by(tmp_path: Path, end: Callable[[int], None], body: LeaderBody) -> Ending:
    """Supervise `body`, end its first leader process with `end(pid)`, and return how that end was told."""
    endings: list[Ending] = []
    with supervised(tmp_path, body, ended=endings.append, first_backoff=0.2) as (_, first):
        end(first.pid)
        wait_until(lambda: len(endings) == 1, 10, "its end told")
    assert endings[0].pid == first.pid
    return endings[0]


def test_a_leader_process_killed_by_a_signal_is_told_with_that_signal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed by another (here SIGKILL, as the kernel's OOM killer sends it), not by its supervisor: the
    master's log names the signal and says the supervisor did not send it; counted as killed."""
    ending = ended_by(tmp_path, lambda pid: os.kill(pid, signal.SIGKILL), beating(tmp_path))
    assert (ending.cause, ending.signum, ending.code) == (KILLED, signal.SIGKILL, None)
    logged = [r.getMessage() for r in caplog.records if r.name == "gpupool.leaderproc" and r.levelname == "ERROR"]
    assert len(logged) == 1
    assert f"the leader process (pid {ending.pid}) was killed by SIGKILL" in logged[0]
    assert "not by its supervisor" in logged[0]


def exiting(directory: Path) -> LeaderBody:
    """A leader body whose process exits with code 3 once the file `exit` appears (as a library's own exit
    call, or a fatal error in C, would end it: no stop, no traceback)."""

    def start(heartbeat: Callable[..., None]) -> Callable[[], None]:
        started(directory, os.getpid()).touch()

        def watch() -> None:
            while not (directory / "exit").exists():
                time.sleep(0.05)
            os._exit(3)

        threading.Thread(target=watch, daemon=True).start()
        return lambda: None

    return start


def test_a_leader_process_that_exits_with_a_code_is_told_with_that_code(tmp_path: Path) -> None:
    ending = ended_by(tmp_path, lambda pid: (tmp_path / "exit").touch(), exiting(tmp_path))
    assert (ending.cause, ending.code, ending.signum) == (FAILED, 3, None)
    assert f"the leader process (pid {ending.pid}) exited with code 3" in ending.describe()


def test_a_leader_process_stopped_by_another_process_says_which(tmp_path: Path) -> None:
    """SIGTERM from a process other than its master (a `kill` by hand, a tool): it stops as on its master's
    SIGTERM, and its end names the signal and the pid that sent it, not the master."""
    senders: list[int] = []

    def kill(pid: int) -> None:
        sender = subprocess.Popen(["kill", "-TERM", str(pid)])
        senders.append(sender.pid)
        assert sender.wait(10) == 0

    ending = ended_by(tmp_path, kill, marking(tmp_path))
    assert (ending.cause, ending.code) == (STOPPED, 0)
    assert (ending.said.kind, ending.said.signum, ending.said.sender) == (SAID_SIGNAL, signal.SIGTERM, senders[0])
    assert f"it stopped on SIGTERM from pid {senders[0]}" in ending.describe()
    assert "not its master" in ending.describe()
    assert (tmp_path / f"stopped-{ending.pid}").exists()  # its own stop ran (the Lease handed back)


def test_a_leader_process_killed_as_hung_is_told_so(tmp_path: Path) -> None:
    """Its supervisor killed it: the end says so, with how old its heartbeat was and the bound."""
    endings: list[Ending] = []
    options = {"ended": endings.append, "first_backoff": 0.2, "hung_seconds": 2.0}
    with supervised(tmp_path, beating(tmp_path), **options) as (_, first):
        os.kill(first.pid, signal.SIGSTOP)
        wait_until(lambda: len(endings) == 1, 15, "its end told")
    (ending,) = endings
    assert (ending.cause, ending.signum) == (HUNG_CAUSE, signal.SIGKILL)
    assert ending.killed_at_age is not None and ending.killed_at_age >= 2.0
    assert "its supervisor killed it (SIGKILL): its heartbeat had stopped for" in ending.describe()
    assert "(the bound is 2 s" in ending.describe()
