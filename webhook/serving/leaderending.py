"""How a leader process ended (webhook.serving.leaderproc), told so that nobody has to guess.

Three witnesses, put together by the supervisor in the master:

- the exit status the master reaped: an exit code, or the signal that killed it. gunicorn's arbiter reaps
  every child it is told of by SIGCHLD (`waitpid(-1)`), and drops the status of one not its worker, so the
  master takes its leader process's status first (webhook.serving.server); when another reaper took it
  all the same, the status is unknown and the other two witnesses still speak;
- the leader process's last word, written in the memory it shares with the master just before it exits:
  the stop signal it took and who sent it (a pid; the master's own SIGTERM when the Pod stops), that its
  master was gone, or that it failed (its traceback is in the log);
- the supervisor's own doing: whether it killed the process itself because its heartbeat had stopped,
  and how old the heartbeat was then and when the process was seen gone.

`Ending.cause` is the bounded code counted in gpupool_queue_leader_exits_total; `Ending.describe` the
sentence the master logs.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

# The causes counted (gpupool_queue_leader_exits_total{cause}).
STOPPED = "stopped"  # exited 0: it took a stop signal (from whichever process) or its master was gone
FAILED = "failed"  # exited with another code: an exception (logged with its traceback), or a crash
HUNG = "hung"  # SIGKILL from its supervisor: its heartbeat had stopped for the bound
KILLED = "killed"  # killed by a signal its supervisor did not send: another process, the kernel (OOM), a crash
UNKNOWN = "unknown"  # its exit status was taken by another reaper, and it said nothing
CAUSES = (STOPPED, FAILED, HUNG, KILLED, UNKNOWN)

# What a leader process says of its own end (`LastWord.kind`).
SAID_NOTHING, SAID_SIGNAL, SAID_MASTER_GONE, SAID_FAILED = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class LastWord:
    """The leader process's account of its end: `kind` (SAID_*), and for SAID_SIGNAL the signal's number
    and the pid that sent it (0 when the kernel did not say)."""

    kind: int = SAID_NOTHING
    signum: int = 0
    sender: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Ending:
    """A leader process gone: `status` the wait status reaped (None when another reaper took it), `ran` the
    seconds it ran, `since_beat` how old its heartbeat was when it was seen gone, `killed_at_age` the
    heartbeat's age when its supervisor killed it as hung (None when it did not), `bound` the hung bound,
    `said` its last word, `master` the supervisor's pid."""

    pid: int
    status: int | None
    ran: float
    since_beat: float
    killed_at_age: float | None
    bound: float
    said: LastWord
    master: int

    @property
    def code(self) -> int | None:
        """The exit code, if it exited rather than was killed by a signal."""
        return os.WEXITSTATUS(self.status) if self.status is not None and os.WIFEXITED(self.status) else None

    @property
    def signum(self) -> int | None:
        """The signal that killed it, if one did."""
        return os.WTERMSIG(self.status) if self.status is not None and os.WIFSIGNALED(self.status) else None

    @property
    def cause(self) -> str:
        if self.killed_at_age is not None and self.signum in (None, signal.SIGKILL):
            return HUNG
        if self.signum is not None:
            return KILLED
        code = self.code
        if code is None:  # reaped by another: its last word, if any
            code = {SAID_SIGNAL: 0, SAID_MASTER_GONE: 0, SAID_FAILED: 1}.get(self.said.kind)
        if code is None:
            return UNKNOWN
        return STOPPED if code == 0 else FAILED

    def describe(self) -> str:
        """`the leader process (pid N) <how>, after R s, its last heartbeat H s before: <why>`."""
        return (
            f"the leader process (pid {self.pid}) {self._how()}, after {self.ran:.1f} s, its last heartbeat "
            f"{self.since_beat:.1f} s before: {self._why()}"
        )

    def _how(self) -> str:
        if self.signum is not None:
            return f"was killed by {_name(self.signum)}"
        if self.code is not None:
            return f"exited with code {self.code}"
        return "ended (its exit status was taken by another reaper)"

    def _why(self) -> str:
        if self.killed_at_age is not None:
            return (
                f"its supervisor killed it (SIGKILL): its heartbeat had stopped for {self.killed_at_age:.1f} s "
                f"(the bound is {self.bound:g} s: its loop, or a thread it watches, went round no more)"
            )
        said = self.said
        if said.kind == SAID_SIGNAL:
            return f"it stopped on {_name(said.signum)} from {_sender(said.sender, self.master)}"
        if said.kind == SAID_MASTER_GONE:
            return "it stopped: its master was gone"
        if said.kind == SAID_FAILED:
            return "it failed (its traceback is logged before this line)"
        if self.signum is not None:
            return (
                f"not by its supervisor, and it said nothing: {_name(self.signum)} from another process, the "
                "kernel (out of memory), or a crash (a fatal error prints the Python stacks before this line)"
            )
        return "it said nothing of why (a crash prints the Python stacks before this line)"


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _sender(pid: int, master: int) -> str:
    if pid == master:
        return f"its master (pid {pid})"
    if pid == 0:
        return "the kernel or an unknown sender"
    return f"pid {pid}{command_of(pid)}, not its master"


def command_of(pid: int) -> str:
    """` (<its command name>)` while process `pid` runs, else nothing."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f" ({f.read().strip()})"
    except OSError:
        return ""
