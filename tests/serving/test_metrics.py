"""Tests for webhook.serving.metrics: what is counted, pool gauges from the inventory, the multiprocess readers."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

import webhook
from tests.builders import gpu_node, index_of, mig_single_node, pod, quota, shared_node
from tests.conftest import (
    DEMO_INVENTORY,
    NAMESPACE,
    REPO,
    SERVICE,
    ServerProcess,
    free_port,
    health_get,
    serve_argv,
    wait_until,
)
from webhook.domain.model import PoolKey, QuotaInfo
from webhook.domain.policy import Policy, load_policy, load_policy_text
from webhook.pools.inventory import PoolStats
from webhook.pools.reservations import Reservation
from webhook.serving.certs import CertificateExpiry, ensure_certificates
from webhook.serving.metrics import (
    CERT_EXPIRY_METRIC,
    CertificateExpiryGauge,
    GaugeRefresher,
    Metrics,
    multiprocess_exposition,
    worker_readiness,
)
from webhook.sources.snapshot import SnapshotInventory, build_index

L4 = PoolKey("nvidia", "medium", "NVIDIA-L4")
T4 = PoolKey("nvidia", "medium", "Tesla-T4")
A100 = PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB")
LABELS = ("namespace", "quota", "resource")
STALE_AFTER_10 = load_policy_text("defaults: {staleAfterSeconds: 10}")


def stats(pool: PoolKey, nodes: int, gpus: int, free: int) -> PoolStats:
    return PoolStats(pool, "nvidia.com/gpu", 23034, nodes, nodes, gpus, gpus - free, free, 0)


@dataclass
class FakeView:
    """An index's read views (webhook.pools.views) with set pools, quotas and reservations."""

    stats: list[PoolStats]
    quota_list: list[QuotaInfo] = field(default_factory=list)
    reservations: int = 0
    policy: Policy = field(default_factory=lambda: load_policy(None))

    @property
    def capacity(self) -> FakeView:
        return self

    @property
    def usage(self) -> FakeView:
        return self

    @property
    def quotas(self) -> FakeView:
        return self

    def pool_stats(self) -> list[PoolStats]:
        return list(self.stats)

    def all(self) -> list[QuotaInfo]:
        return list(self.quota_list)

    def reserved(self, namespace: str, resource: str) -> int:
        return 0

    def requested(self, namespace: str, resource: str) -> int:
        return 0


@dataclass
class FakeInventory:
    """An Inventory whose pools, readiness and age a test sets directly."""

    pools: list[PoolStats] = field(default_factory=list)
    is_ready: bool = True
    age: float = 0.0
    reads: int = 0

    quotas: list[QuotaInfo] = field(default_factory=list)
    reservations: int = 0

    @contextmanager
    def read(self) -> Iterator[FakeView]:
        self.reads += 1
        yield FakeView(self.pools, self.quotas, self.reservations)

    @property
    def ready(self) -> bool:
        return self.is_ready

    def age_seconds(self) -> float:
        return self.age

    def close(self) -> None:
        return None


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


class TestRecord:
    def test_admission_counted_by_outcome_and_pool_with_latency(self) -> None:
        """Each admission adds one to its (outcome, pool) counter and one latency observation."""
        registry = CollectorRegistry()
        metrics = Metrics(registry)
        metrics.record(outcome="mutated", pool=str(L4), seconds=0.002, dry_run=False)
        metrics.record(outcome="mutated", pool=str(L4), seconds=0.0004, dry_run=False)
        assert value(registry, "gpupool_admissions_total", outcome="mutated", pool=str(L4)) == 2
        assert value(registry, "gpupool_admission_duration_seconds_bucket", le="0.0005") == 1
        assert value(registry, "gpupool_admission_duration_seconds_count") == 2

    def test_dry_run_is_timed_but_not_counted(self) -> None:
        """A dry run leaves no count of placed Pods, only its latency."""
        registry = CollectorRegistry()
        Metrics(registry).record(outcome="mutated", pool=str(L4), seconds=0.001, dry_run=True, quota_denial=True)
        assert value(registry, "gpupool_admissions_total", outcome="mutated", pool=str(L4)) is None
        assert value(registry, "gpupool_quota_denials_total", namespace="") is None
        assert value(registry, "gpupool_admission_duration_seconds_count") == 1

    def test_quota_denial_counted_by_namespace(self) -> None:
        """A quota denial counts both as denied and as a quota denial of its namespace."""
        registry = CollectorRegistry()
        Metrics(registry).record(
            outcome="denied", pool="", seconds=0.001, dry_run=False, namespace="ml", quota_denial=True
        )
        assert value(registry, "gpupool_quota_denials_total", namespace="ml") == 1
        assert value(registry, "gpupool_admissions_total", outcome="denied", pool="") == 1

    def test_policy_reloads_counted_by_result(self) -> None:
        """Both results are exposed from the start (at 0), so an alert on a failure sees the first one;
        the gauge says whether the file's newest version is in use."""
        registry = CollectorRegistry()
        metrics = Metrics(registry)
        assert value(registry, "gpupool_policy_reloads_total", result="failure") == 0
        metrics.policy_reloaded(False)
        assert value(registry, "gpupool_policy_reloads_total", result="failure") == 1
        assert value(registry, "gpupool_policy_last_reload_successful") == 0
        metrics.policy_reloaded(True)
        assert value(registry, "gpupool_policy_reloads_total", result="success") == 1
        assert value(registry, "gpupool_policy_last_reload_successful") == 1


class TestRefresh:
    def test_pool_gauges_follow_the_inventory(self) -> None:
        """Nodes, GPUs and free GPUs per pool, inventory age and readiness come from the inventory."""
        registry = CollectorRegistry()
        inventory = FakeInventory([stats(L4, 2, 8, 3)], age=4.5)
        Metrics(registry).refresh(inventory)
        assert value(registry, "gpupool_pool_nodes", pool=str(L4)) == 2
        assert value(registry, "gpupool_pool_gpus", pool=str(L4)) == 8
        assert value(registry, "gpupool_pool_gpus_free", pool=str(L4)) == 3
        assert value(registry, "gpupool_inventory_age_seconds") == 4.5
        assert value(registry, "gpupool_inventory_ready") == 1

    def test_staleness_reservations_and_unenforced_quotas(self) -> None:
        """The admin sees a stale inventory, pending reservations and quotas Kubernetes does not enforce."""
        registry = CollectorRegistry()
        wrong = QuotaInfo("team-b", "gpu", {"nvidia.com/gpu": 4})
        right = QuotaInfo("team-a", "gpu", {"requests.nvidia.com/gpu": 4})
        inventory = FakeInventory([stats(L4, 2, 8, 3)], age=30.0, quotas=[wrong, right], reservations=3)
        Metrics(registry).refresh(inventory, STALE_AFTER_10)
        assert value(registry, "gpupool_inventory_stale") == 1
        assert value(registry, "gpupool_quotas_unenforced") == 1
        assert value(registry, "gpupool_reservations") == 3
        inventory.age = 0.0
        Metrics(registry2 := CollectorRegistry()).refresh(inventory, STALE_AFTER_10)
        assert value(registry2, "gpupool_inventory_stale") == 0

    def test_every_quota_gpupool_checks_has_used_and_hard_gauges_in_one_unit_each(self) -> None:
        """One pair of gauges per quota limit, labelled namespace, quota, resource: ResourceQuotas in both
        forms (used: status.used, or gpupool's own count; plus pending admissions) and the policy's class
        quotas in devices (`_gpus`), its memory quota in bytes (`_bytes`): one unit per metric, so "a
        namespace at 90% of its H100s" is one alert and no query mixes GPUs with bytes. A quota that is
        gone reads 0."""
        pol = load_policy_text("namespaces: {team-a: {classQuota: {high: 4}, memoryQuota: 100Gi}}")
        objects = [
            gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 8, memory_mib=40960, gpu_class="high"),
            pod("p", "team-a", gpus=2, node="a100-a", phase="Running"),
            pod("q", "team-b", gpus=1, node="a100-a", phase="Running"),
            quota("gpu-quota", "team-a", {"requests.nvidia.com/gpu": "4"}, {"requests.nvidia.com/gpu": "2"}),
            quota("tutorial", "team-b", {"nvidia.com/gpu": "4"}),
        ]
        index = build_index(objects, pol)
        index.reserve(Reservation(namespace="team-a", pool=A100, selector=(), gpus=1, name="next"), now=0.0)
        registry = CollectorRegistry()
        metrics = Metrics(registry)
        metrics.refresh(SnapshotInventory(index, "test"))

        def gauges(unit: str) -> dict[tuple[str, ...], tuple[float, float]]:
            used, hard = f"gpupool_quota_used_{unit}", f"gpupool_quota_hard_{unit}"
            return {
                tuple(s.labels[k] for k in LABELS): (s.value, value(registry, hard, **s.labels) or 0.0)
                for m in registry.collect()
                for s in m.samples
                if s.name == used
            }

        assert gauges("gpus") == {
            ("team-a", "gpu-quota", "requests.nvidia.com/gpu"): (3, 4),
            ("team-a", "classQuota", "high"): (3, 4),
            ("team-b", "tutorial", "nvidia.com/gpu"): (1, 4),
        }
        assert gauges("bytes") == {("team-a", "memoryQuota", "gpu-memory"): (3 * 40 * 2**30, 100 * 2**30)}
        index.remove_quota("team-b", "tutorial")
        metrics.refresh(SnapshotInventory(index, "test"))
        assert gauges("gpus")[("team-b", "tutorial", "nvidia.com/gpu")] == (0, 0)

    def test_quotas_follow_the_policy_admissions_use(self) -> None:
        """After a policy reload that keeps the inventory (new namespace rules only), the class quotas
        shown are the new policy's, not those of the policy the index was built with."""
        objects = [gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 8, gpu_class="high")]
        inventory = SnapshotInventory(build_index(objects, load_policy_text(None)), "test")
        registry = CollectorRegistry()
        Metrics(registry).refresh(inventory, load_policy_text("namespaces: {team-a: {classQuota: {high: 6}}}"))
        labels = {"namespace": "team-a", "quota": "classQuota", "resource": "high"}
        assert value(registry, "gpupool_quota_hard_gpus", **labels) == 6

    def test_build_info_names_the_version(self) -> None:
        """`gpupool_build_info` is 1, labelled with gpupool's version and Python's, for "which version
        runs where" queries and joins."""
        registry = CollectorRegistry()
        Metrics(registry)
        (sample,) = [s for m in registry.collect() for s in m.samples if s.name == "gpupool_build_info"]
        assert sample.value == 1
        assert sample.labels["version"] == webhook.__version__
        assert sample.labels["python"] == platform.python_version()

    def test_vanished_pool_reads_zero(self) -> None:
        """A pool that is gone from the inventory shows 0, not its last capacity."""
        registry = CollectorRegistry()
        metrics = Metrics(registry)
        inventory = FakeInventory([stats(L4, 2, 8, 3), stats(T4, 1, 4, 4)])
        metrics.refresh(inventory)
        inventory.pools = [stats(L4, 2, 8, 1)]
        metrics.refresh(inventory)
        assert value(registry, "gpupool_pool_gpus_free", pool=str(T4)) == 0
        assert value(registry, "gpupool_pool_gpus_free", pool=str(L4)) == 1

    def test_pools_are_labelled_by_their_device_product(self) -> None:
        """The issue's fleet: MIG instances and time-sliced replicas are gauged as pools of their own device
        product, and the whole A100 and T4 pools count whole GPUs only (not 68 "A100s")."""
        objects = [
            mig_single_node("mig-a"),
            gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 12, gpu_class="high"),
            gpu_node("t4-a", "Tesla-T4", 4),
            shared_node("ts-a"),
        ]
        registry = CollectorRegistry()
        Metrics(registry).refresh(SnapshotInventory(index_of(objects), "test"))
        gpus = {
            sample.labels["pool"]: sample.value
            for metric in registry.collect()
            if metric.name == "gpupool_pool_gpus"
            for sample in metric.samples
        }
        assert gpus == {
            "nvidia/high/NVIDIA-A100-SXM4-40GB": 12,
            "nvidia/high/NVIDIA-A100-SXM4-40GB-MIG-1g.5gb": 56,
            "nvidia/medium/Tesla-T4": 4,
            "nvidia/medium/Tesla-T4-SHARED": 4,
        }

    def test_not_ready_inventory_is_not_read(self) -> None:
        """Before the inventory is loaded, readiness is 0 and no pool is reported."""
        registry = CollectorRegistry()
        inventory = FakeInventory([stats(L4, 2, 8, 3)], is_ready=False)
        Metrics(registry).refresh(inventory)
        assert value(registry, "gpupool_inventory_ready") == 0
        assert inventory.reads == 0

    def test_refresher_keeps_refreshing_until_stopped(self) -> None:
        """The background refresher picks up inventory changes on its own."""
        registry = CollectorRegistry()
        inventory = FakeInventory([stats(L4, 2, 8, 3)])
        refresher = GaugeRefresher(Metrics(registry), lambda: (inventory, None), interval=0.05).start()
        try:
            inventory.pools = [stats(L4, 2, 8, 0)]
            wait_until(lambda: value(registry, "gpupool_pool_gpus_free", pool=str(L4)) == 0, 30, "a refresh")
        finally:
            refresher.stop()

    def test_readiness_shows_as_soon_as_the_inventory_is_loaded(self) -> None:
        """A worker's first list may end just after a refresh: its readiness (what /readyz reads) is not
        held back until the next one, however far apart refreshes are."""
        registry = CollectorRegistry()
        inventory = FakeInventory([stats(L4, 2, 8, 3)], is_ready=False)
        refresher = GaugeRefresher(Metrics(registry), lambda: (inventory, None), interval=3600).start()
        try:
            wait_until(lambda: value(registry, "gpupool_inventory_ready") == 0, 30, "the first refresh")
            inventory.is_ready = True
            wait_until(lambda: value(registry, "gpupool_inventory_ready") == 1, 30, "readiness once loaded")
            assert value(registry, "gpupool_pool_gpus_free", pool=str(L4)) == 3
        finally:
            refresher.stop()


WORKER = textwrap.dedent(
    """
    import sys
    from webhook.serving.metrics import Metrics
    m = Metrics.private()
    m.inventory_ready.set(int(sys.argv[1]))
    m.record(outcome="mutated", pool="nvidia/medium/NVIDIA-L4", seconds=0.001, dry_run=False)
    print(__import__("os").getpid())
    """
)


def run_worker(directory: Path, ready: int) -> int:
    """A separate process that records into the multiprocess directory, as a gunicorn worker does."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    out = subprocess.run(
        [sys.executable, "-c", WORKER, str(ready)],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return int(out.stdout.strip())


class TestMultiprocess:
    def test_readiness_per_worker_and_summed_counters(self, tmp_path: Path) -> None:
        """Readiness is read per worker pid; counters of all workers add up in the exposition."""
        ready_pid = run_worker(tmp_path, 1)
        loading_pid = run_worker(tmp_path, 0)
        assert worker_readiness(str(tmp_path)) == {ready_pid: True, loading_pid: False}
        text = multiprocess_exposition(str(tmp_path)).decode()
        assert 'gpupool_admissions_total{outcome="mutated",pool="nvidia/medium/NVIDIA-L4"} 2.0' in text

    def test_a_namespace_whose_queue_emptied_reads_zero(self, tmp_path: Path) -> None:
        """Under multiprocess mode a series cannot be removed (prometheus-client keeps it in the worker's
        file): the queue's gauges of a namespace that no longer waits must read 0, not its last count, or
        GpupoolQueueNoLeader and GpupoolQueueWaitLong would fire on Pods long released."""
        script = textwrap.dedent(
            """
            from webhook.queue.waiting import Backlog
            from webhook.serving.metrics import Metrics
            m = Metrics.private()
            m.queue_waiting({"team-a": Backlog(2, 7200.0), "team-b": Backlog(1, 60.0)})
            m.queue_waiting({"team-b": Backlog(1, 61.0)})
            """
        )
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
        subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, check=True, timeout=60)
        text = multiprocess_exposition(str(tmp_path)).decode()
        assert 'gpupool_queue_pods{namespace="team-a"} 0.0' in text
        assert 'gpupool_queue_oldest_wait_seconds{namespace="team-a"} 0.0' in text
        assert 'gpupool_queue_pods{namespace="team-b"} 1.0' in text
        assert 'gpupool_queue_oldest_wait_seconds{namespace="team-b"} 61.0' in text

    def test_empty_directory_has_no_ready_worker(self, tmp_path: Path) -> None:
        """Before any worker writes, no worker is ready."""
        assert worker_readiness(str(tmp_path)) == {}


class TestCertificateExpiry:
    def test_seconds_until_not_after_at_each_scrape(self, cert_dir: Path) -> None:
        """The gauge is notAfter minus the time of the scrape, so it counts down between rotations."""
        expiry = CertificateExpiry(str(cert_dir / "tls.crt"))
        not_after = expiry.not_after()
        assert not_after is not None
        now = [not_after.timestamp() - 86400 * 20]
        registry = CollectorRegistry(auto_describe=False)
        registry.register(CertificateExpiryGauge(expiry, clock=lambda: now[0]))
        assert registry.get_sample_value(CERT_EXPIRY_METRIC) == 86400 * 20
        now[0] += 86400 * 21
        assert registry.get_sample_value(CERT_EXPIRY_METRIC) == -86400

    def test_absent_until_a_certificate_was_read(self, tmp_path: Path) -> None:
        """No file, no sample (rather than a made-up number an alert would take for the truth)."""
        gauge = CertificateExpiryGauge(CertificateExpiry(str(tmp_path / "tls.crt")))
        text = multiprocess_exposition(str(tmp_path), gauge).decode()
        assert CERT_EXPIRY_METRIC not in text

    @pytest.mark.slow
    def test_the_server_exports_it_and_follows_a_rotation(
        self, tmp_path: Path, start_server: Callable[..., ServerProcess]
    ) -> None:
        """`gpupool serve`'s /metrics carries the seconds until its certificate expires; once the file is
        renewed in place (as a rotated Secret or `make deploy` does), the next scrape shows the new one."""
        certs = tmp_path / "certs"
        ensure_certificates(certs, SERVICE, NAMESPACE, ["127.0.0.1"], 365)
        port, health_port = free_port(), free_port()
        argv = serve_argv(certs, port, health_port, "--inventory", str(DEMO_INVENTORY), "--workers", "1")
        server = start_server(argv, health_port)
        try:
            left = scraped(health_port)
            assert 364 * 86400 < left <= 365 * 86400
            later = datetime.now(UTC) + timedelta(days=340)  # renewal due: 25 days left then
            renewed = ensure_certificates(certs, SERVICE, NAMESPACE, ["127.0.0.1"], 90, now=later)
            wait_until(
                lambda: abs(scraped(health_port) - (renewed.not_after.timestamp() - time.time())) < 60,
                20,
                "the renewed certificate's expiry on /metrics",
            )
        finally:
            server.stop()


def scraped(health_port: int) -> float:
    """gpupool_serving_certificate_expiry_seconds as /metrics shows it."""
    status, body, _ = health_get(health_port, "/metrics")
    assert status == 200
    (line,) = [ln for ln in body.decode().splitlines() if ln.startswith(CERT_EXPIRY_METRIC + " ")]
    return float(line.split()[1])
