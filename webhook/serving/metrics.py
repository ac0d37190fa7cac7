"""Prometheus metrics: what workers record and what the health port exposes.

Workers record into metrics built on a private registry. Under `gpupool serve` the environment variable
PROMETHEUS_MULTIPROC_DIR is set before prometheus_client is imported, so every value lands in a
per-process file and the gunicorn master, which serves /metrics and /readyz, reads them all
(`multiprocess_exposition`, `worker_readiness`). Without it (tests, `create_app` on its own) the same
metrics simply live in memory.

Gauges that every worker reports alike (pool capacity) use "livemostrecent": dead workers drop out and
the freshest value wins. The inventory age shows the worst live worker; readiness is kept per worker
("liveall", a `pid` label) so /readyz can require every worker.
"""

from __future__ import annotations

import glob
import logging
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

import webhook
from webhook.domain.policy import Policy
from webhook.domain.quantity import MIB
from webhook.mig.follow import FAILED, STUCK
from webhook.pools.inventory import Inventory
from webhook.pools.quotas.report import QuotaRow, quota_rows, unenforced
from webhook.queue.backlog import Backlog
from webhook.serving.certs import CertificateExpiry

# Admission latency as the webhook sees it (decode to encode): sub-millisecond normally. 2.5 s is half
# and 5 s all of the shipped webhook's timeoutSeconds (manifests/base/webhook.yaml), so the alert on
# "near the timeout" counts whole buckets instead of interpolating between 2.5 and 10.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# How long Pods wait in the queue: seconds on an idle cluster, hours on a saturated one.
QUEUE_WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
REFRESH_SECONDS = 5.0
# Until the inventory is ready, how often the refresher looks again: gpupool_inventory_ready is the Pod's
# readiness (/readyz), which must not lag the first full list by a whole REFRESH_SECONDS.
NOT_READY_SECONDS = 0.1
READY_METRIC = "gpupool_inventory_ready"
CONTENT_TYPE = CONTENT_TYPE_LATEST  # of the exposition text
QUOTA_LABELS = ("namespace", "quota", "resource")

# What the gauge refresher reads each time: the inventory admissions use now, and the policy they are
# decided by (None: the inventory's own). Both change together when the policy file is reloaded.
Current = Callable[[], tuple[Inventory, Policy | None]]

log = logging.getLogger("gpupool.metrics")


class Metrics:
    """Every gpupool metric, registered on `registry` (never the process-global default registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.admissions = Counter(
            "gpupool_admissions",
            "Pod admissions answered (dry runs excluded), by outcome (mutated, unchanged, denied, error; "
            "audited under enforcement: audit) and chosen pool (empty when none)",
            ["outcome", "pool"],
            registry=registry,
        )
        self.quota_denials = Counter(
            "gpupool_quota_denials",
            "Pods denied because a namespace ResourceQuota on GPUs, or a per-class or GPU-memory quota of the "
            "policy, would be exceeded",
            ["namespace"],
            registry=registry,
        )
        self.audit_would_deny = Counter(
            "gpupool_audit_would_deny",
            "Pods of namespaces under enforcement: audit that gpupool allowed but would have denied, by "
            "namespace and reason (the denial's code: quota, no-match, invalid, ...)",
            ["namespace", "reason"],
            registry=registry,
        )
        self.latency = Histogram(
            "gpupool_admission_duration_seconds",
            "Time to answer one AdmissionReview, from decoding the request to encoding the answer",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.validations = Counter(
            "gpupool_validations",
            "Validating calls answered (dry runs excluded): the Pod as it will be stored, by operation (CREATE, "
            "UPDATE, other) and outcome (allowed, denied, error)",
            ["operation", "outcome"],
            registry=registry,
        )
        self.validation_latency = Histogram(
            "gpupool_validation_duration_seconds",
            "Time to answer one validating AdmissionReview, from decoding the request to encoding the answer",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.pool_nodes = self._pool_gauge(registry, "gpupool_pool_nodes", "Nodes in the pool")
        self.pool_nodes_usable = self._pool_gauge(
            registry, "gpupool_pool_nodes_usable", "Nodes in the pool that are Ready and schedulable"
        )
        self.pool_gpus = self._pool_gauge(registry, "gpupool_pool_gpus", "GPUs allocatable on the pool's usable nodes")
        self.pool_gpus_free = self._pool_gauge(
            registry, "gpupool_pool_gpus_free", "GPUs of the pool's usable nodes not held by any Pod"
        )
        self.inventory_age = Gauge(
            "gpupool_inventory_age_seconds",
            "Seconds since the inventory was last known current (worst worker; 0 for a snapshot file)",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.inventory_ready = Gauge(
            READY_METRIC,
            "1 when the worker's inventory is loaded and admissions use it",
            registry=registry,
            multiprocess_mode="liveall",
        )
        self.inventory_stale = Gauge(
            "gpupool_inventory_stale",
            "1 when the worker's watches have been unable to reach the API for longer than the policy's "
            "staleAfterSeconds (admissions are then answered from the last view, or denied per onStale)",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.quotas_unenforced = Gauge(
            "gpupool_quotas_unenforced",
            "ResourceQuotas that limit a GPU resource in a form Kubernetes never enforces for extended "
            "resources (nvidia.com/gpu or limits.nvidia.com/gpu instead of requests.nvidia.com/gpu): enforced "
            "by gpupool only; see gpupool quota",
            registry=registry,
            multiprocess_mode="livemostrecent",
        )
        # One unit per metric (Prometheus' naming rules): GPU counts and GPU memory are separate gauges.
        self.quota_used_gpus = self._quota_gauge(
            registry,
            "gpupool_quota_used_gpus",
            "What counts against each GPU quota gpupool checks (used plus pending admissions), in devices; "
            "quota is the ResourceQuota's name or classQuota, resource its key or the class",
        )
        self.quota_hard_gpus = self._quota_gauge(
            registry, "gpupool_quota_hard_gpus", "The limit of each GPU quota gpupool checks, in devices"
        )
        self.quota_used_bytes = self._quota_gauge(
            registry,
            "gpupool_quota_used_bytes",
            "GPU memory that counts against each memoryQuota (used plus pending admissions), in bytes; "
            "resource is gpu-memory",
        )
        self.quota_hard_bytes = self._quota_gauge(
            registry, "gpupool_quota_hard_bytes", "The limit of each memoryQuota, in bytes of GPU memory"
        )
        self.build_info = Gauge(
            "gpupool_build_info",
            "Always 1; the labels say which gpupool and Python this server runs",
            ["version", "python", "platform"],
            registry=registry,
            multiprocess_mode="max",  # the same in every worker; kept when one exits
        )
        self.build_info.labels(webhook.__version__, platform.python_version(), _platform()).set(1)
        self.policy_reloads = Counter(
            "gpupool_policy_reloads",
            "Changes of the --policy file a worker read, by result: success (in use now) or failure (invalid, "
            "or unreadable: the previous policy stays in use)",
            ["result"],
            registry=registry,
        )
        for result in ("success", "failure"):
            self.policy_reloads.labels(result)  # both series exist from the start, so rate() sees the first
        self.policy_reload_ok = Gauge(
            "gpupool_policy_last_reload_successful",
            "1 when every worker uses what the --policy file holds now, 0 when a worker kept its previous policy "
            "because the file is invalid",
            registry=registry,
            multiprocess_mode="livemin",
        )
        self.policy_reload_ok.set(1)
        self.reservations = Gauge(
            "gpupool_reservations",
            "Admitted Pods not yet seen in the watch, counted against their pool (per worker)",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.queue_pods = Gauge(
            "gpupool_queue_pods",
            "Pods waiting in gpupool's queue (gated by gpupool.io/queue), per namespace, as the worker's watch "
            "sees them",
            ["namespace"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.queue_oldest = Gauge(
            "gpupool_queue_oldest_wait_seconds",
            "Seconds the Pod waiting longest in gpupool's queue has waited since its creation, per namespace",
            ["namespace"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.queue_wait = Histogram(
            "gpupool_queue_wait_seconds",
            "Time from a queued Pod's creation to its release by the leader",
            buckets=QUEUE_WAIT_BUCKETS,
            registry=registry,
        )
        self.queue_releases = Counter(
            "gpupool_queue_releases",
            "Release writes of the queue's leader, by outcome: released; conflict (the Pod changed, decided "
            "again); gone (deleted); error (refused, or no answer)",
            ["outcome"],
            registry=registry,
        )
        self.mig_reshapes = Counter(
            "gpupool_mig_reshapes",
            "MIG re-cuts of the queue's leader (docs/mig.md), by outcome: asked (the node label written); done; "
            "failed (mig-manager reported failed); stuck (not done within timeoutSeconds); superseded (someone "
            "else changed the label); conflict (the node changed before the write: planned again); error",
            ["outcome"],
            registry=registry,
        )
        for outcome in (FAILED, STUCK):
            self.mig_reshapes.labels(outcome)  # from the start, so the alert's increase() sees the first one
        self.queue_leader = Gauge(
            "gpupool_queue_leader",
            "1 while this process (a replica's leader process) leads the queue (holds the Lease), else 0",
            registry=registry,
            multiprocess_mode="liveall",
        )
        self._queue_namespaces: set[str] = set()
        self._known_pools: set[str] = set()
        self._known_quotas: set[tuple[str, str, str, bool]] = set()  # labels, and whether in bytes
        self._lock = threading.Lock()  # refresh() runs on a timer thread and at start
        # `labels()` takes a lock and builds a key on every call; the few (outcome, pool) children are
        # kept here instead. A race only makes two threads ask labels() for the same child.
        self._admission_children: dict[tuple[str, str], Counter] = {}
        self._validation_children: dict[tuple[str, str], Counter] = {}

    # --- the queue (webhook.queue.runner.QueueMetrics) ---------------------------------------------------

    def queue_waiting(self, backlog: dict[str, Backlog]) -> None:
        with self._lock:
            # Set to 0, not removed: prometheus-client cannot remove a series in multiprocess mode (the
            # value stays in the worker's file), so a removed one would keep its last count for good.
            for gone in self._queue_namespaces - set(backlog):
                self.queue_pods.labels(gone).set(0)
                self.queue_oldest.labels(gone).set(0)
            for namespace, waiting in backlog.items():
                self.queue_pods.labels(namespace).set(waiting.pods)
                self.queue_oldest.labels(namespace).set(waiting.oldest_seconds)
            self._queue_namespaces = set(backlog)

    def queue_released(self, outcome: str, wait_seconds: float | None) -> None:
        self.queue_releases.labels(outcome).inc()
        if wait_seconds is not None:
            self.queue_wait.observe(wait_seconds)

    def queue_leading(self, leading: bool) -> None:
        self.queue_leader.set(1 if leading else 0)

    def mig_reshaped(self, outcome: str) -> None:
        self.mig_reshapes.labels(outcome).inc()

    @classmethod
    def private(cls) -> Metrics:
        """Metrics on a registry of their own (the values still go to the multiprocess files)."""
        return cls(CollectorRegistry(auto_describe=False))

    @staticmethod
    def _pool_gauge(registry: CollectorRegistry, name: str, help_text: str) -> Gauge:
        return Gauge(name, help_text, ["pool"], registry=registry, multiprocess_mode="livemostrecent")

    @staticmethod
    def _quota_gauge(registry: CollectorRegistry, name: str, help_text: str) -> Gauge:
        return Gauge(name, help_text, QUOTA_LABELS, registry=registry, multiprocess_mode="livemostrecent")

    def record(
        self,
        *,
        outcome: str,
        pool: str,
        seconds: float,
        dry_run: bool,
        namespace: str = "",
        quota_denial: bool = False,
    ) -> None:
        """Count one answered AdmissionReview. A dry run only shows in the latency histogram."""
        self.latency.observe(seconds)
        if dry_run:
            return
        key = (outcome, pool)
        child = self._admission_children.get(key)
        if child is None:
            child = self._admission_children[key] = self.admissions.labels(outcome, pool)
        child.inc()
        if quota_denial:
            self.quota_denials.labels(namespace).inc()

    def record_would_deny(self, *, namespace: str, reason: str, dry_run: bool) -> None:
        """Count a Pod of an audited namespace that gpupool allowed but would have denied for `reason`."""
        if not dry_run:
            self.audit_would_deny.labels(namespace, reason).inc()

    def record_validation(self, *, operation: str, outcome: str, seconds: float, dry_run: bool) -> None:
        """Count one answered validating AdmissionReview. A dry run only shows in the latency histogram."""
        self.validation_latency.observe(seconds)
        if dry_run:
            return
        key = (operation, outcome)
        child = self._validation_children.get(key)
        if child is None:
            child = self._validation_children[key] = self.validations.labels(operation, outcome)
        child.inc()

    def refresh(self, inventory: Inventory, policy: Policy | None = None) -> None:
        """Copy pool capacity, inventory age, staleness and readiness from the inventory into the gauges;
        quotas and staleness are judged by `policy` (the one admissions use; by default the inventory's)."""
        with self._lock:
            ready = inventory.ready
            age = inventory.age_seconds()
            self.inventory_ready.set(1 if ready else 0)
            self.inventory_age.set(age)
            if not ready:
                if policy is not None:
                    self.inventory_stale.set(1 if age > policy.defaults.stale_after_seconds else 0)
                return
            with inventory.read() as view:
                policy = policy or view.policy
                stats = view.capacity.pool_stats()
                self.reservations.set(view.usage.reservations)
                self.quotas_unenforced.set(sum(1 for q in view.quotas.all() if unenforced(q, policy)))
                rows = quota_rows(view, policy)
            self.inventory_stale.set(1 if age > policy.defaults.stale_after_seconds else 0)
            self._refresh_quotas(rows)
            seen: set[str] = set()
            for s in stats:
                pool = str(s.pool)
                seen.add(pool)
                self.pool_nodes.labels(pool).set(s.nodes)
                self.pool_nodes_usable.labels(pool).set(s.usable_nodes)
                self.pool_gpus.labels(pool).set(s.gpus_total)
                self.pool_gpus_free.labels(pool).set(s.gpus_free)
            # A pool that disappeared reads 0 rather than its last value: removing a label does not
            # reach the other processes' files in multiprocess mode.
            for pool in self._known_pools - seen:
                for gauge in (self.pool_nodes, self.pool_nodes_usable, self.pool_gpus, self.pool_gpus_free):
                    gauge.labels(pool).set(0)
            self._known_pools |= seen

    def policy_reloaded(self, ok: bool) -> None:
        """Count one change of the policy file: in use now (`ok`), or refused and the previous one kept."""
        self.policy_reloads.labels("success" if ok else "failure").inc()
        self.policy_reload_ok.set(1 if ok else 0)

    def _refresh_quotas(self, rows: list[QuotaRow]) -> None:
        """One pair of gauges per quota limit: devices for GPU quotas, bytes (Prometheus' base unit) for
        memory quotas. A quota that is gone reads 0, as a pool does."""
        seen: set[tuple[str, str, str, bool]] = set()
        for row in rows:
            in_bytes = row.unit == "MiB"
            seen.add((row.namespace, row.quota, row.resource, in_bytes))
            used, hard = self._quota_pair(in_bytes)
            scale = MIB if in_bytes else 1
            used.labels(row.namespace, row.quota, row.resource).set((row.used + row.pending) * scale)
            hard.labels(row.namespace, row.quota, row.resource).set(row.hard * scale)
        for namespace, quota, resource, in_bytes in self._known_quotas - seen:
            for gauge in self._quota_pair(in_bytes):
                gauge.labels(namespace, quota, resource).set(0)
        self._known_quotas |= seen

    def _quota_pair(self, in_bytes: bool) -> tuple[Gauge, Gauge]:
        if in_bytes:
            return self.quota_used_bytes, self.quota_hard_bytes
        return self.quota_used_gpus, self.quota_hard_gpus


class GaugeRefresher:
    """Refreshes a worker's gauges every `interval` seconds on a daemon thread, from whatever inventory
    and policy `current` gives at that moment (they change when the policy file is reloaded); every
    NOT_READY_SECONDS while that inventory is not ready, so the readiness gauge follows its first list."""

    def __init__(self, metrics: Metrics, current: Current, interval: float = REFRESH_SECONDS) -> None:
        self._metrics = metrics
        self._current = current
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpupool-gauges", daemon=True)

    def start(self) -> GaugeRefresher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval + 1)

    def _run(self) -> None:
        while True:
            ready = True
            try:
                inventory, policy = self._current()
                self._metrics.refresh(inventory, policy)
                ready = inventory.ready
            except Exception:  # a failing refresh must not end the thread: metrics go stale, not absent
                log.exception("refreshing the inventory gauges failed")
            if self._stop.wait(self._interval if ready else min(self._interval, NOT_READY_SECONDS)):
                return


def _platform() -> str:
    """`linux/x86_64`, as the image was built for."""
    return f"{platform.system().lower()}/{platform.machine()}"


CERT_EXPIRY_METRIC = "gpupool_serving_certificate_expiry_seconds"


class CertificateExpiryGauge:
    """gpupool_serving_certificate_expiry_seconds: the seconds until the serving certificate's notAfter,
    worked out at every scrape (a value that counts down by itself cannot be stored in a gauge), from the
    `--cert` file as the master reads it again after each rotation. Absent until a certificate was read."""

    def __init__(self, expiry: CertificateExpiry, clock: Callable[[], float] = time.time) -> None:
        self._expiry = expiry
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        not_after = self._expiry.not_after()
        if not_after is None:
            return
        family = GaugeMetricFamily(
            CERT_EXPIRY_METRIC,
            "Seconds until the serving certificate (the --cert file) expires; negative once it has. Renewal is "
            "due 30 days before: make deploy (self-signed) or cert-manager renews it",
        )
        family.add_metric([], not_after.timestamp() - self._clock())
        yield family


def multiprocess_exposition(path: str, certificate: CertificateExpiryGauge | None = None) -> bytes:
    """The Prometheus text of every worker's metrics in the multiprocess directory `path`, and of the
    master's own certificate gauge when there is one."""
    registry = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    if certificate is not None:
        registry.register(certificate)
    return generate_latest(registry)


def worker_readiness(path: str) -> dict[int, bool]:
    """Each worker's `gpupool_inventory_ready`, by pid, from the multiprocess directory `path`."""
    files = glob.glob(os.path.join(path, "gauge_liveall_*.db"))
    ready: dict[int, bool] = {}
    for metric in MultiProcessCollector.merge(files, accumulate=False):  # type: ignore[no-untyped-call]
        if metric.name != READY_METRIC:
            continue
        for sample in metric.samples:
            pid = sample.labels.get("pid", "")
            if pid.isdigit():
                ready[int(pid)] = sample.value >= 1
    return ready


def forget_process(pid: int, path: str) -> None:
    """Drop a dead worker's live gauges (its counters stay: totals must not go backwards)."""
    mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
