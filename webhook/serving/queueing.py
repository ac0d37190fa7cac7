"""The queue in the leader process (webhook.serving.leaderproc): its waiting Pods follow that process's own
watch, and its leader election runs there, never in an admission worker (webhook.queue). Only a live
inventory has a queue: a snapshot has no API to release through.

`leader_body` is what the leader process runs: the queue, its inventory's watches, its gauges, and the
--policy file followed as a worker follows it. The admission workers keep only what they check of the
queue: the release's fence (`LeaseFence`, read from the API by the validating call).

`LeaderQueue` keeps it right across changes of the policy file (webhook.serving.policyfile):

- each pass decides by the policy admission uses now, so a change of namespace rules (a quota, which
  namespaces queue) applies to the queue as it does to admissions, on the same inventory;
- an inventory read again for a new policy gets a queue of its own before it lists, and once the Admitter
  uses it the runner follows it, still leading (`Runner.rebind`);
- the queue runs on every live inventory, whatever the policy: Pods gated under an earlier policy (one
  that queued, before a change and a restart) are released by the rules of the policy in use rather than
  stranded behind a gate nobody removes. Where nothing is gated it costs the Lease's election (one small
  read or write per replica every 2 s) and nothing else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NamedTuple

from webhook.admission.core import Admitter
from webhook.admission.fence import LeaseTerm, judge
from webhook.domain.policy import Policy
from webhook.pools.inventory import Inventory
from webhook.queue.leader import Elector, LeaseTimes
from webhook.queue.ports import QueueInventory, QueueMetrics, TokenBucket
from webhook.queue.reshape import Reshaper
from webhook.queue.runner import Runner
from webhook.queue.waiting import Waiting
from webhook.serving.leaderproc import Beat, LeaderBody
from webhook.serving.policyfile import PolicyFile, PolicyReloader, PolicyVersion
from webhook.sources.bounded import bounded
from webhook.sources.charge_store import LeaseCharges
from webhook.sources.live import LiveInventory
from webhook.sources.open import reopen_inventory
from webhook.sources.poolstatus import PoolStatusWriter
from webhook.sources.rounds import Rounds
from webhook.sources.writes import ConfigMapText, EventRecorder, LeaseError, LeaseStore, NodeLabeler, PodReleaser

LEASE_NAME = "gpupool"
# The validating call reads the Lease within kube-apiserver's timeoutSeconds (5 s) for the webhook: at
# most 4 s on a bounded client (webhook.sources.bounded.worst_seconds), whose calls are never retried.
FENCE_TIMEOUT = (1.0, 2.0)
# One election attempt (a read and a write) within the default renew deadline (10 s, webhook.queue.leader):
# 5 s each. Under a shorter --lease-duration a slow API can outlast the deadline: the leader then stops
# leading until an attempt succeeds in time, as it must (its leadership is counted from before the read).
ELECTION_TIMEOUT = (1.0, 3.0)


class LeaseFence:
    """The validating call's fence (webhook.admission.fence.Fence): the queue's Lease read from the API at
    each release, never from a cache (a cache can be as stale as the write it would judge)."""

    def __init__(self, leases: LeaseStore, wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._leases, self._wall = leases, wall

    @classmethod
    def of(cls, api_client: Any, settings: QueueSettings) -> LeaseFence:
        """On `api_client`, bounded (webhook.sources.bounded): the read is one attempt, within FENCE_TIMEOUT."""
        return cls(LeaseStore(bounded(api_client), settings.namespace, LEASE_NAME, timeout=FENCE_TIMEOUT))

    def check(self, token: str) -> str | None:
        try:
            record = self._leases.get()
        except LeaseError as exc:
            return f"the queue's Lease could not be read: {exc}"
        lease = None
        if record is not None:
            lease = LeaseTerm(record.holder, record.transitions, record.renew_time, record.duration_seconds)
        return judge(token, lease, self._wall())


class QueueSettings(NamedTuple):
    """Where the Lease lives and who this replica is (`serve` reads them from POD_NAMESPACE and POD_NAME,
    which the Deployment sets through the downward API)."""

    namespace: str
    pod_name: str
    qps: int = 300  # the leader's writes per second (releases and Events), and at once
    burst: int = 500
    lease_seconds: int = 15  # the Lease's duration; its renew deadline and retry scale with it


class LeaderQueue:
    """The queue of the leader process, on whichever live inventory its Admitter uses (an Admitter that
    admits nothing: the one binding of policy and inventory, rebound as the policy file changes)."""

    def __init__(
        self,
        settings: QueueSettings,
        metrics: QueueMetrics,
        admitter: Admitter,
        heartbeat: Beat = lambda at=None: None,
    ) -> None:
        self._settings, self._metrics, self._admitter = settings, metrics, admitter
        self._heartbeat = heartbeat  # the runner's loop beats it (webhook.serving.leaderproc)
        self._lock = threading.Lock()
        self._runner: Runner | None = None
        self._events: EventRecorder | None = None
        self._statuses: PoolStatusWriter | None = None
        self._attached: tuple[LiveInventory, Waiting] | None = None  # a queue that waits for its inventory's use

    @property
    def running(self) -> bool:
        return self._runner is not None

    def attach(self, inventory: LiveInventory, policy: Policy) -> None:
        """Before `inventory.start()`: follow its queued Pods from its first list on."""
        with self._lock:
            waiting = Waiting(policy)
            inventory.observe(waiting)
            self._attached = (inventory, waiting)

    def use(self, inventory: Inventory) -> None:
        """`inventory` (started) is now the Admitter's: run the queue on it, if one was attached to it."""
        with self._lock:
            attached, self._attached = self._attached, None
            if attached is None or attached[0] is not inventory:
                return
            live, waiting = attached
            if self._runner is not None:
                self._runner.rebind(live, waiting)
                return
            # The Pod's identity: its one leader process at a time (webhook.serving.leaderproc).
            identity = self._settings.pod_name
            # The leader's calls on a client of their own whose calls are never retried once sent, so each
            # takes at most its timeout (webhook.sources.bounded); the watches keep the inventory's.
            api = bounded(live.api_client)
            lease = LeaseStore(api, self._settings.namespace, LEASE_NAME, timeout=ELECTION_TIMEOUT)
            times = LeaseTimes.of(self._settings.lease_seconds)
            elector = Elector(lease, identity, times, on_change=self._metrics.queue_leading)
            self._events = EventRecorder(api, identity).start()
            self._statuses = PoolStatusWriter(api).start()  # the pools' GPUPool objects, while leading
            watched = (elector.rounds, self._events.rounds, self._statuses.rounds)
            limiter = TokenBucket(self._settings.qps, self._settings.burst)
            runner = Runner(
                live,
                waiting,
                elector,
                PodReleaser(api),
                events=self._events,
                metrics=self._metrics,
                limiter=limiter,
                policy=self._policy_for,
                # Idle unless the policy has migReshaping (webhook.queue.reshape).
                reshaper=Reshaper(NodeLabeler(api), ConfigMapText(api), self._events, self._metrics),
                # Pods that name their node, charged by the validating calls (webhook.admission.charging).
                charges=LeaseCharges(api, self._settings.namespace),
                status=self._statuses,
                heartbeat=lambda: self._heartbeat(oldest(watched)),
            )
            # Not before its inventory has synced: a restarted worker must not hold the Lease while it lists.
            elector.ready = lambda: runner.inventory.ready
            self._runner = runner.start()

    def reopen(self, inventory: Inventory, policy: Policy) -> Inventory:
        """`reopen_inventory`, with the new live inventory's queue attached before it lists."""
        return reopen_inventory(inventory, policy, prepare=lambda live: self.attach(live, policy))

    def stop(self) -> None:
        """Stop releasing and hand the Lease back (a rolling update's next leader takes over at once)."""
        with self._lock:
            runner, self._runner = self._runner, None
            events, self._events = self._events, None
            statuses, self._statuses = self._statuses, None
        if runner is not None:
            runner.stop()
        for writer in (events, statuses):
            if writer is not None:
                writer.stop()

    def _policy_for(self, inventory: QueueInventory) -> Policy:
        """The policy a pass on `inventory` decides by: the Admitter's while it uses that inventory, else
        the one the inventory was built for (a pass finishing on the inventory just replaced)."""
        bound = self._admitter.bound
        used: object = bound.inventory  # a LiveInventory, which the runner knows by its Protocol
        return bound.policy if used is inventory else inventory.policy


def oldest(watched: tuple[Rounds, ...]) -> float:
    """What the runner's loop beats the heartbeat with: the start of the oldest round still under way of
    the threads beside it (the election, Events, the pools' status), else now. Their calls are bounded
    (webhook.sources.bounded), so a round older than the hung bound is a thread stuck for good (a deadlock,
    a bug that ended it mid-round): the process is then hung, and restarted, though its loop goes on."""
    return min((r.since for r in watched if r.since is not None), default=time.monotonic())


def leader_body(
    policy: Policy, inventory: LiveInventory, source: PolicyVersion | None, settings: QueueSettings
) -> LeaderBody:
    """What the leader process runs, from the master's copy of what it loaded (nothing read from a file):
    the queue attached before the first list, the watches, the gauges (its inventory's readiness and age,
    as a worker's), and the --policy file followed."""

    def start(heartbeat: Beat) -> Callable[[], None]:
        # prometheus_client after PROMETHEUS_MULTIPROC_DIR is set (webhook.serving.server).
        from webhook.serving.metrics import GaugeRefresher, Metrics  # noqa: PLC0415

        metrics = Metrics.private()
        admitter = Admitter(policy, inventory)
        queue = LeaderQueue(settings, metrics, admitter, heartbeat)
        queue.attach(inventory, policy)
        inventory.start()
        queue.use(inventory)

        def current() -> tuple[Inventory, Policy]:
            bound = admitter.bound
            return bound.inventory, bound.policy

        refresher = GaugeRefresher(metrics, current).start()
        reloader = None
        if source is not None:  # its reloads are the workers' to count: they read the same file alike
            reloader = PolicyReloader(PolicyFile(source), admitter, reopen=queue.reopen, switched=queue.use)
            reloader.start()

        def stop() -> None:
            if reloader is not None:
                reloader.stop()
            queue.stop()  # stops releasing, then hands the Lease back
            refresher.stop()
            admitter.inventory.close()

        return stop

    return start
