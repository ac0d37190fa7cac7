"""The queue in a worker: its waiting Pods follow the worker's own watch, and its leader election runs beside
the admissions (webhook.queue). Only a live inventory has a queue: a snapshot has no API to release through.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from webhook.domain.policy import Policy
from webhook.queue.leader import Elector
from webhook.queue.runner import QueueMetrics, Runner, TokenBucket
from webhook.queue.waiting import Waiting
from webhook.sources.live import LiveInventory
from webhook.sources.writes import EventRecorder, LeaseStore, PodReleaser

LEASE_NAME = "gpupool"


class QueueSettings(NamedTuple):
    """Where the Lease lives and who this replica is (`serve` reads them from POD_NAMESPACE and POD_NAME,
    which the Deployment sets through the downward API)."""

    namespace: str
    pod_name: str
    qps: int = 300  # the leader's writes per second (releases and Events), and at once
    burst: int = 500


def start_queue(policy: Policy, inventory: LiveInventory, settings: QueueSettings, metrics: QueueMetrics) -> Runner:
    """Follow the inventory's watch for queued Pods and take part in the election, as `POD_NAME-pid`: one
    identity per worker process, so two workers of one Pod never both lead. Call before
    `inventory.start()`, so the first list fills the queue."""
    waiting = Waiting(policy)
    inventory.observe(waiting)
    identity = f"{settings.pod_name}-{os.getpid()}"
    api = inventory.api_client
    elector = Elector(LeaseStore(api, settings.namespace, LEASE_NAME), identity, on_change=metrics.queue_leading)
    events = EventRecorder(api, identity).start()
    limiter = TokenBucket(settings.qps, settings.burst)
    return Runner(inventory, waiting, elector, PodReleaser(api), events=events, metrics=metrics, limiter=limiter)
