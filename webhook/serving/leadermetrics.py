"""The master's counts of its queue leader process (webhook.serving.leaderproc): its restarts and its ends.

Like webhook.serving.metrics, imported once PROMETHEUS_MULTIPROC_DIR is set (webhook.serving.server), so
the master's counts land in the multiprocess directory its /metrics reads.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from webhook.serving.leaderending import CAUSES


def leader_restarts() -> Callable[[str], None]:
    """The master's count of the leader process's restarts, by why (webhook.serving.leaderproc: "died" or
    "hung"), both from the start so that the first one is an increase."""
    counter = Counter(
        "gpupool_queue_leader_restarts",
        "Restarts of the replica's queue leader process, by reason: died (it exited or was killed); hung (its "
        "loop stopped going round for GPUPOOL_LEADER_HUNG_SECONDS, so the master killed it)",
        ["reason"],
        registry=CollectorRegistry(auto_describe=False),
    )
    for reason in ("died", "hung"):
        counter.labels(reason)
    return lambda reason: counter.labels(reason).inc()


def leader_exits() -> Callable[[str], None]:
    """The master's count of the leader process's ends, by cause (webhook.serving.leaderending.CAUSES), every
    cause from the start so that the first one is an increase."""
    counter = Counter(
        "gpupool_queue_leader_exits",
        "Ends of the replica's queue leader process, other than the Pod's own stop, by cause: stopped (exit 0: "
        "a stop signal from another process, or its master gone), failed (another exit code), hung (its master "
        "killed it: its heartbeat had stopped), killed (a signal its master did not send), unknown (its exit "
        "status was lost); the master's log says which signal, from which pid",
        ["cause"],
        registry=CollectorRegistry(auto_describe=False),
    )
    for cause in CAUSES:
        counter.labels(cause)
    return lambda cause: counter.labels(cause).inc()
