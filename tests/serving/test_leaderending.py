"""How a leader process ended, as its master tells it (webhook.serving.leaderending): from its exit status,
its last word and its supervisor's own doing, whichever of them is known."""

from __future__ import annotations

import signal

import pytest

from webhook.serving.leaderending import (
    FAILED,
    HUNG,
    KILLED,
    SAID_FAILED,
    SAID_MASTER_GONE,
    SAID_SIGNAL,
    STOPPED,
    UNKNOWN,
    Ending,
    LastWord,
)

MASTER = 100
SILENT = LastWord()  # nothing said


def ending(status: int | None, said: LastWord = SILENT, killed_at_age: float | None = None) -> Ending:
    return Ending(
        pid=200,
        status=status,
        ran=5.0,
        since_beat=0.5,
        killed_at_age=killed_at_age,
        bound=60.0,
        said=said,
        master=MASTER,
    )


def exited(code: int) -> int:
    return code << 8  # a wait status


@pytest.mark.parametrize(
    ("end", "cause", "told"),
    [
        pytest.param(
            ending(exited(0), LastWord(SAID_SIGNAL, signal.SIGTERM, MASTER)),
            STOPPED,
            "exited with code 0, after 5.0 s, its last heartbeat 0.5 s before: "
            f"it stopped on SIGTERM from its master (pid {MASTER})",
            id="stopped-by-its-master",
        ),
        pytest.param(
            ending(exited(0), LastWord(SAID_MASTER_GONE)), STOPPED, "it stopped: its master was gone", id="master-gone"
        ),
        pytest.param(
            ending(exited(1), LastWord(SAID_FAILED)),
            FAILED,
            "exited with code 1, after 5.0 s, its last heartbeat 0.5 s before: it failed (its traceback is logged",
            id="failed",
        ),
        pytest.param(
            ending(signal.SIGSEGV),
            KILLED,
            "was killed by SIGSEGV, after 5.0 s, its last heartbeat 0.5 s before: not by its supervisor",
            id="crashed",
        ),
        pytest.param(
            ending(signal.SIGKILL, killed_at_age=61.5),
            HUNG,
            "its supervisor killed it (SIGKILL): its heartbeat had stopped for 61.5 s (the bound is 60 s",
            id="killed-as-hung",
        ),
        pytest.param(
            ending(None, LastWord(SAID_SIGNAL, signal.SIGINT, 4242)),
            STOPPED,
            "ended (its exit status was taken by another reaper), after 5.0 s, its last heartbeat 0.5 s before: "
            "it stopped on SIGINT from pid 4242",
            id="reaped-elsewhere-but-it-said-why",
        ),
        pytest.param(ending(None), UNKNOWN, "it said nothing of why", id="nothing-known"),
    ],
)
def test_each_end_is_told_by_what_is_known_of_it(end: Ending, cause: str, told: str) -> None:
    assert end.cause == cause
    assert told in end.describe()
    assert end.describe().startswith("the leader process (pid 200) ")
