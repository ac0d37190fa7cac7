"""What bounds the leader process's threads and the queue's calls from the workers
(webhook.serving.queueing): the release's fence answers within kube-apiserver's timeout on an API that
does not answer, and a thread beside the leader's loop that is stuck (here its election) makes the
process hung, so its supervisor restarts it, though the loop itself goes on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import wait_until
from tests.serving.leaders import beating, supervised
from webhook.queue.leader import Elector, LeaseTimes
from webhook.serving.leaderproc import HUNG
from webhook.serving.queueing import LeaseFence, QueueSettings, oldest
from webhook.sources.live import api_client
from webhook.sources.writes import LeaseRecord
from webhook.testing import KubeSim

WEBHOOK_TIMEOUT = 5.0  # kube-apiserver's timeoutSeconds for the validating webhook (manifests/base)


def test_the_fence_answers_within_the_webhook_timeout_when_the_api_does_not_answer(tmp_path: Path) -> None:
    """The validating call's read of the Lease is one attempt: a stalled API gives a refusal naming the
    Lease before kube-apiserver gives up on the call, not four reads' worth later."""
    with KubeSim() as sim:
        fence = LeaseFence.of(api_client(str(sim.write_kubeconfig(tmp_path / "kubeconfig"))), QueueSettings("q", "a"))
        assert fence.check("a/1") == "the queue's Lease does not exist"  # connected, answered
        sim.stall(30)
        try:
            started = time.monotonic()
            answer = fence.check("a/1")
            took = time.monotonic() - started
        finally:
            sim.stall(0)
    assert answer is not None and "the queue's Lease could not be read" in answer
    assert took < WEBHOOK_TIMEOUT


class StuckLeases:
    """A Lease API that answers the first read (no Lease) and the create, then never answers a read again."""

    def __init__(self) -> None:
        self.reads = 0

    def get(self) -> LeaseRecord | None:
        self.reads += 1
        if self.reads > 1:
            threading.Event().wait()
        return None

    def create(self, record: LeaseRecord) -> LeaseRecord | None:
        return record._replace(resource_version="1")

    def replace(self, record: LeaseRecord) -> LeaseRecord | None:
        return record


def stuck_election() -> Callable[[], float]:
    """Beside a leader body's loop (tests.serving.leaders.beating, which beats with `oldest` of it): an
    election stuck in a read from its second attempt on."""
    elector = Elector(StuckLeases(), "a", LeaseTimes(retry=0.1))
    threading.Thread(target=elector.run, daemon=True).start()
    return lambda: oldest((elector.rounds,))


def test_a_leader_process_whose_election_is_stuck_is_restarted_as_hung(tmp_path: Path) -> None:
    """Its loop goes on beating, but the election has not gone round for the hung bound: the process is
    hung (its Lease would never be renewed, nor handed back), killed and started again."""
    why: list[str] = []
    options = {"restarted": why.append, "first_backoff": 0.2, "hung_seconds": 2.0}
    with supervised(tmp_path, beating(tmp_path, stuck_election), **options) as (supervisor, first):
        wait_until(lambda: supervisor.status().pid not in (0, first.pid), 15, "a new leader process")
        assert why == [HUNG]
