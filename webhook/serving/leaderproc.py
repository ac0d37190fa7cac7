"""The queue's leader process: one per Pod, beside the admission workers, started and supervised by the
gunicorn master (webhook.serving.server).

Why a process: the leader's passes, releases, Events and Lease renewals are Python, and a thread of a
worker process would hold the GIL an admission of that worker needs (docs/performance.md measured the
leader's replica at several times the follower's latency). In a process of its own the leader shares
no interpreter with any admission; the workers only admit.

`LeaderSupervisor` (in the master) forks the process from the master's copy of what it loaded (as gunicorn
forks its workers: a restarted leader reads no file before it runs), and watches it:

- a leader process that exits or dies is restarted, after a back-off that grows while it keeps dying
  (1 s, doubling to 30 s; reset once one has run a minute); while none runs the Pod reports not ready;
- it is only ever one at a time: the next is forked once the last has exited, which is what lets a
  restarted process take its Pod's Lease over at once with a new term (webhook.queue.leader);
- SIGTERM (or SIGINT, SIGQUIT) to the master reaches the leader at once, before the workers are drained, so
  it stops releasing and hands the Lease back while the workers finish; the master waits for it to exit;
- it dies with the master: it checks every second that its parent is still the master that forked it,
  and stops (handing the Lease back) when not;
- a leader process that is alive but hung (its loop stuck: a deadlock, a call that never returns, SIGSTOP)
  is killed (SIGKILL) and restarted as a dead one is: its loop beats a heartbeat each iteration (at least
  every second, `Heartbeat`, a timestamp in memory the master shares), and one older than `hung_seconds`
  (60 s by default, well above a pass's worst case) is hung. The loop beats with the start of the oldest
  round still under way of the threads it watches (leader election, Events, the pools' status:
  webhook.serving.queueing), so one of them stuck for `hung_seconds` is a hung process too, though the
  loop goes on: their calls are bounded (webhook.sources.bounded) well below it. A killed one hands
  nothing over: its Lease expires, and the fence refuses its late writes (webhook.admission.fence).

Each restart is counted by why (`restarted("died" | "hung")`; gpupool_queue_leader_restarts_total). Each
end is logged and counted by how it came (`ended(Ending)`, webhook.serving.leaderending: its exit code or
signal, how old its heartbeat was, whether the supervisor killed it and why, and the process's own last
word: the stop signal it took and from which pid, its master gone, or a failure). To say it, the leader
process takes its stop signals with `sigtimedwait` (which names the sender) rather than a handler, and
enables faulthandler, so that a crash prints its Python stacks to the log.

Its metrics land in the same prometheus_client multiprocess directory as the workers', under its own pid,
so the master's /metrics shows them (gpupool_queue_leader among them); a dead one's live gauges are
dropped as a dead worker's are.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import mmap
import os
import signal
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn, Protocol

from webhook.domain.errors import ConfigError
from webhook.serving.leaderending import SAID_FAILED, SAID_MASTER_GONE, SAID_SIGNAL, Ending, LastWord, command_of

log = logging.getLogger("gpupool.leaderproc")


class Beat(Protocol):
    """The heartbeat, as the leader process's loop calls it each iteration (`Heartbeat.beat`): `at` is when
    the oldest thing it watches was last seen moving (a round of another thread still under way since
    then: webhook.sources.rounds.Rounds), by the monotonic clock; now when not given."""

    def __call__(self, at: float | None = None) -> None: ...


# What the leader process runs: start everything, return what stops it (called once, on SIGTERM or when
# the master is gone). Its argument is the heartbeat its loop calls each iteration.
LeaderBody = Callable[[Beat], Callable[[], None]]

POLL_SECONDS = 0.2  # how often the master looks whether the leader process is still there
PARENT_SECONDS = 1.0  # how often the leader process looks whether the master is still there
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
HEALTHY_SECONDS = 60.0  # a leader process that ran this long resets the back-off
STOP_SECONDS = 25.0  # SIGTERM to exit: its pass ends, its writes are answered, the Lease is handed back
HUNG_SECONDS = 60.0  # a leader process whose loop has not beaten this long is hung: killed and restarted
HUNG_ENV = "GPUPOOL_LEADER_HUNG_SECONDS"  # sets that bound (tests shorten it)
DIED, HUNG = "died", "hung"  # why a leader process was restarted
# The master's own signals, which the leader process must not handle as the master does.
_RESET = (
    signal.SIGHUP,
    signal.SIGCHLD,
    signal.SIGTTIN,
    signal.SIGTTOU,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


@dataclass(frozen=True, slots=True)
class LeaderStatus:
    """What /readyz shows of the leader process: its pid (0 while none runs), whether it runs, and how many
    times it was started again."""

    pid: int
    alive: bool
    restarts: int


def hung_seconds(environ: Mapping[str, str]) -> float:
    """The bound after which a leader process without a heartbeat is hung: GPUPOOL_LEADER_HUNG_SECONDS, a
    number of seconds of at least 2 (the loop beats every second), else HUNG_SECONDS."""
    given = environ.get(HUNG_ENV, "").strip()
    if not given:
        return HUNG_SECONDS
    try:
        seconds = float(given)
    except ValueError:
        seconds = float("nan")
    if not seconds >= 2.0 or seconds == float("inf"):  # at least twice the loop's beat
        raise ConfigError(f"{HUNG_ENV}={given!r}: give a number of seconds of at least 2 (default {HUNG_SECONDS:.0f})")
    return seconds


class Heartbeat:
    """When the leader process's loop last went round: a monotonic timestamp (CLOCK_MONOTONIC, one clock
    for every process of the machine) in an anonymous shared mapping, made by the master before it forks,
    written by the child, read by the master without a system call. The child's last word
    (webhook.serving.leaderending.LastWord) goes in the same mapping, after the beat."""

    _BEAT = "d"
    _WORD = "iii"

    def __init__(self) -> None:
        size = struct.calcsize(self._BEAT) + struct.calcsize(self._WORD)
        self._map = mmap.mmap(-1, size)  # MAP_SHARED: the child's writes are seen
        self.beat()

    def beat(self, at: float | None = None) -> None:
        """Record a beat now, or at `at` (monotonic; never later than now)."""
        now = time.monotonic()
        struct.pack_into(self._BEAT, self._map, 0, now if at is None else min(at, now))

    def age(self) -> float:
        """Seconds since the last beat."""
        (last,) = struct.unpack_from(self._BEAT, self._map, 0)
        return float(time.monotonic() - last)

    def say(self, word: LastWord) -> None:
        """The leader process's last word, before it exits."""
        struct.pack_into(self._WORD, self._map, struct.calcsize(self._BEAT), word.kind, word.signum, word.sender)

    def said(self) -> LastWord:
        return LastWord(*struct.unpack_from(self._WORD, self._map, struct.calcsize(self._BEAT)))

    def renew(self) -> None:
        """For a new leader process: a beat now, and no word said."""
        self.beat()
        self.say(LastWord())


class LeaderSupervisor:
    """The leader process, from the master: `start` forks it, a thread restarts it when it dies, `stop`
    ends it. `before_child` runs in the child first (closing what the master's sockets it inherited);
    `exited(pid)` in the master once a leader process is gone (its live metrics dropped); `ended(ending)`
    then, with how it ended, unless the supervisor was stopping it; `restarted(why)` in the master at each
    restart (`DIED` or `HUNG`: killed after `hung_seconds` without a heartbeat)."""

    def __init__(  # noqa: PLR0913 (a constructor: its callbacks and bounds, by keyword)
        self,
        body: LeaderBody,
        *,
        before_child: Callable[[], None] = lambda: None,
        exited: Callable[[int], None] = lambda pid: None,
        restarted: Callable[[str], None] = lambda why: None,
        ended: Callable[[Ending], None] = lambda ending: None,
        first_backoff: float = FIRST_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        hung_seconds: float = HUNG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._body, self._before, self._exited, self._restarted = body, before_child, exited, restarted
        self._ended = ended
        self._hung = hung_seconds
        self._heartbeat = Heartbeat()
        self._killed = 0  # the leader process last killed as hung
        self._killed_at_age = 0.0  # its heartbeat's age then
        self._status: int | None = None  # the wait status of the last leader process reaped here
        self._why = DIED  # why the next one is started
        self._first, self._max, self._clock = first_backoff, max_backoff, clock
        self._master = os.getpid()
        self._lock = threading.Lock()
        self._pid = 0
        self._dead = 0  # the last leader process seen gone
        self._started_at = 0.0
        self._restarts = 0
        self._backoff = first_backoff
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gpupool-leader-supervisor", daemon=True)

    def start(self) -> LeaderSupervisor:
        with self._lock:
            self._spawn()
        self._thread.start()
        return self

    def status(self) -> LeaderStatus:
        with self._lock:
            return LeaderStatus(self._pid, self._alive(), self._restarts)

    def reap(self) -> None:
        """Take the leader process's exit status if it has exited: for a reaper of every child (gunicorn's
        arbiter, on SIGCHLD) to call before it reaps, so that the status is not lost (webhook.serving.server)."""
        with self._lock:
            self._alive()

    def terminate(self) -> None:
        """No more restarts, and SIGTERM to the leader process (safe in a signal handler: no lock, no wait)."""
        self._stopping.set()
        pid = self._pid
        if pid:
            _signal(pid, signal.SIGTERM)

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """`terminate`, then wait for the leader process to exit (SIGKILL after `timeout`)."""
        self.terminate()
        if self._thread.is_alive():
            self._thread.join(POLL_SECONDS * 5)
        pid = self._pid
        if not pid:
            return
        _signal(pid, signal.SIGTERM)  # again: one forked just as `terminate` read no pid
        deadline = self._clock() + timeout
        while _running(pid) and self._clock() < deadline:
            time.sleep(0.05)
        if _running(pid):
            log.warning("the leader process (pid %d) did not stop within %.0f s: killed", pid, timeout)
            _signal(pid, signal.SIGKILL)
            while _running(pid):
                time.sleep(0.05)
        self._gone(pid)

    def _watch(self) -> None:
        restart_at: float | None = None
        while not self._stopping.wait(POLL_SECONDS):
            with self._lock:
                self._kill_if_hung()
                if self._pid and not self._alive():
                    ran = self._clock() - self._started_at
                    self._why = HUNG if self._pid == self._killed else DIED
                    ending = self._ending(ran)
                    log.error("%s; restarting it", ending.describe())
                    self._gone(self._pid)
                    self._ended(ending)
                    self._backoff = self._first if ran >= HEALTHY_SECONDS else self._backoff
                    restart_at = self._clock() + self._backoff
                    self._backoff = min(self._backoff * 2, self._max)
                if not self._pid and restart_at is not None and self._clock() >= restart_at:
                    restart_at = None
                    self._restarts += 1
                    self._restarted(self._why)
                    self._spawn()

    def _ending(self, ran: float) -> Ending:
        """Under the lock: how the current leader process, seen gone, ended."""
        killed = self._pid == self._killed
        return Ending(
            pid=self._pid,
            status=self._status,
            ran=ran,
            since_beat=self._heartbeat.age(),
            killed_at_age=self._killed_at_age if killed else None,
            bound=self._hung,
            said=self._heartbeat.said(),
            master=self._master,
        )

    def _kill_if_hung(self) -> None:
        """Under the lock: SIGKILL the current leader process if its loop has not beaten for `hung_seconds`
        (once; the next poll finds it gone and restarts it as a dead one)."""
        if self._pid in (0, self._killed) or not self._alive():
            return
        age = self._heartbeat.age()
        if age < self._hung:
            return
        log.error(
            "the leader process (pid %d) is hung: its loop, or a thread it watches (leader election, Events, "
            "the pools' status), has not gone round for %.1f s (the bound is %.1f s); killing it (SIGKILL)",
            self._pid,
            age,
            self._hung,
        )
        self._killed, self._killed_at_age = self._pid, age
        _signal(self._pid, signal.SIGKILL)

    def _alive(self) -> bool:
        """Under the lock: whether the current leader process runs. Once seen gone it stays gone (its pid
        may be another child's later)."""
        if self._pid in (0, self._dead):
            return False
        running, status = _wait(self._pid)
        if running:
            return True
        self._dead, self._status = self._pid, status
        return False

    def _gone(self, pid: int) -> None:
        if self._pid == pid:
            self._pid = 0
        self._exited(pid)

    def _spawn(self) -> None:
        """Fork the leader process (under the lock; the stopping flag checked once more)."""
        if self._stopping.is_set():
            return
        self._heartbeat.renew()  # a new process is given its whole bound from its start, and has said nothing
        pid = os.fork()
        if pid == 0:
            _child(self._body, self._before, self._master, self._heartbeat)
        self._pid, self._started_at = pid, self._clock()
        log.info("leader process started (pid %d)", pid)


def _child(body: LeaderBody, before: Callable[[], None], master: int, heartbeat: Heartbeat) -> NoReturn:
    """The leader process's whole life, in the forked child: it never returns into the master's stack."""
    code = 1
    try:
        # The stop signals are taken by `_until_stopped`, which learns who sent them: blocked first, so in
        # every thread the body starts too (threads inherit the mask).
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        faulthandler.enable(all_threads=True)  # a crash prints every thread's Python stack to stderr
        for sig in _RESET:
            signal.signal(sig, signal.SIG_DFL)
        before()
        stop = body(heartbeat.beat)
        try:
            heartbeat.say(_until_stopped(master))
        finally:
            stop()
        code = 0
    except BaseException:  # anything at all: logged, and the supervisor starts another
        log.exception("the leader process failed")
        heartbeat.say(LastWord(SAID_FAILED))
    finally:
        logging.shutdown()
        os._exit(code)


def _until_stopped(master: int) -> LastWord:
    """Wait for a stop signal, or for the master to be gone (looked at every PARENT_SECONDS): which it was."""
    while True:
        info = signal.sigtimedwait(_STOPS, PARENT_SECONDS)
        if info is not None:
            name = signal.Signals(info.si_signo).name
            if info.si_pid == master:
                log.info("the leader process stops: %s from its master", name)
            else:
                sender = f"pid {info.si_pid}{command_of(info.si_pid)}"
                log.warning("the leader process stops: %s from %s, not from its master (pid %d)", name, sender, master)
            return LastWord(SAID_SIGNAL, info.si_signo, info.si_pid)
        if os.getppid() != master:
            log.warning("the master (pid %d) is gone: the leader process stops", master)
            return LastWord(SAID_MASTER_GONE)


def _running(pid: int) -> bool:
    """Whether the child `pid` still runs (reaping it when it has exited)."""
    return _wait(pid)[0]


def _wait(pid: int) -> tuple[bool, int | None]:
    """Whether the child `pid` still runs, and once it has exited its wait status (reaped here). A child
    reaped by someone else (gunicorn's arbiter reaps every child it is signalled about) is gone too, its
    status unknown (None)."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False, None
    return done == 0, (status if done else None)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
