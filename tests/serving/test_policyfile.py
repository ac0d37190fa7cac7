"""Tests for webhook.serving.policyfile: following the --policy file, validating each version, and rebinding
the Admitter without a restart (same inventory for new namespace rules, a new one for new pools).

The end-to-end tests start a real `gpupool serve`, on a snapshot and on the API simulator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import gpu_node, pod
from tests.conftest import (
    DEMO_INVENTORY,
    ApiServerClient,
    ServerProcess,
    admission_review,
    free_port,
    gpu_pod,
    serve_argv,
    wait_until,
)
from tests.serving.configmaps import ConfigMapVolume
from tests.serving.running import metric, readyz
from webhook.admission.core import Admitter
from webhook.domain.errors import ConfigError
from webhook.domain.policy import Policy
from webhook.pools.inventory import Inventory
from webhook.pools.nodes import NodeFacts
from webhook.serving.policyfile import PolicyFile, PolicyReloader, read_policy_file
from webhook.sources.open import reopen_inventory
from webhook.sources.snapshot import SnapshotInventory
from webhook.testing.kubesim import KubeSim

# `now`: these tests follow admissions that place at once (the queue's reloads: tests/queue).
ONLY_MEDIUM = "defaults: {placement: now}\nnamespaces: {ml: {allowedClasses: [medium]}}\n"
ONLY_HIGH = "defaults: {placement: now}\nnamespaces: {ml: {allowedClasses: [high]}}\n"
# The product table says what a T4 is: the same namespace rule, other pools (T4s become class high).
T4_IS_HIGH = ONLY_HIGH + "products: [{match: T4, class: high, memory: 16Gi}]\n"


def t4_snapshot(path: Path, nodes: int = 2) -> Path:
    """Two T4 nodes that take their class from the product table (no class label)."""
    objects = [gpu_node(f"t4-{i}", "Tesla-T4", 4, gpu_class=None) for i in range(nodes)]
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}), encoding="utf-8")
    return path


def review_pod(name: str, gpu_class: str) -> dict[str, Any]:
    return pod(name, "ml", annotations={"gpupool.io/gpu-class": gpu_class})


class Reopens:
    """`reopen_inventory`, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, inventory: Inventory, policy: Policy) -> Inventory:
        self.calls += 1
        return reopen_inventory(inventory, policy)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Setup:
    """A snapshot inventory, an Admitter on the first version of a ConfigMap-mounted policy, and the
    reloader following it (stepped by the test, not by its thread)."""

    def __init__(self, tmp_path: Path, text: str) -> None:
        self.volume = ConfigMapVolume(tmp_path / "policy", text)
        loaded = read_policy_file(self.volume.path)
        self.inventory = SnapshotInventory.from_file(str(t4_snapshot(tmp_path / "cluster.yaml")), loaded.policy)
        self.clock = Clock()
        self.admitter = Admitter(loaded.policy, self.inventory, clock=self.clock)
        self.reopens = Reopens()
        self.results: list[bool] = []
        self.reloader = PolicyReloader(
            PolicyFile(loaded), self.admitter, self.results.append, reopen=self.reopens, clock=self.clock
        )

    def admit(self, name: str, gpu_class: str, *, dry_run: bool = False) -> str | None:
        """The pool the Pod is placed on, None when refused."""
        placement = self.admitter.admit(review_pod(name, gpu_class), namespace="ml", dry_run=dry_run).placement
        return str(placement.pool) if placement is not None else None

    def reservations(self) -> int:
        with self.admitter.inventory.read() as index:
            return index.usage.reservations

    def pending(self) -> dict[str, int]:
        """GPUs held per pool for Pods the inventory has not seen on a node."""
        with self.admitter.inventory.read() as index:
            return {str(s.pool): s.pending for s in index.capacity.pool_stats()}


class TestPolicyFile:
    def test_a_swapped_configmap_volume_is_a_new_version(self, tmp_path: Path) -> None:
        """The kubelet's `..data` swap is noticed, and the new version read whole, with its hash."""
        volume = ConfigMapVolume(tmp_path, ONLY_MEDIUM)
        file = PolicyFile(read_policy_file(volume.path))
        assert file.check() is None
        volume.update(ONLY_HIGH)
        new = file.check()
        assert not isinstance(new, ConfigError) and new is not None
        assert new.policy.namespace("ml").allowed_classes == ("high",)
        assert new.sha256 == hashlib.sha256(ONLY_HIGH.encode()).hexdigest() == file.status()["sha256"]
        assert file.check() is None

    def test_the_same_bytes_again_change_nothing(self, tmp_path: Path) -> None:
        """A re-projected ConfigMap with the same content (a new directory, a new inode) is no change."""
        volume = ConfigMapVolume(tmp_path, ONLY_MEDIUM)
        file = PolicyFile(read_policy_file(volume.path))
        volume.update(ONLY_MEDIUM)
        assert file.check() is None

    def test_an_invalid_version_is_refused_naming_the_field_and_the_last_valid_stays(self, tmp_path: Path) -> None:
        """The error names the file and the field; `current` is still the last valid version; the same
        broken file is reported once, and a fixed one clears the error."""
        volume = ConfigMapVolume(tmp_path, ONLY_MEDIUM)
        file = PolicyFile(read_policy_file(volume.path))
        valid = file.current
        volume.update("namespaces: {ml: {allowedClasses: [huge]}}\n")
        error = file.check()
        assert isinstance(error, ConfigError)
        assert "namespaces.ml.allowedClasses" in str(error) and volume.path in str(error)
        assert file.current == valid
        assert file.status() == {"file": volume.path, "sha256": valid.sha256, "error": str(error)}
        assert file.check() is None  # not reported again while the file stays as it is
        volume.update(ONLY_HIGH)
        assert file.check() is not None
        assert file.status()["error"] is None

    def test_a_file_that_disappears_is_refused(self, tmp_path: Path) -> None:
        """A ConfigMap whose key was removed: the policy in use stays, and the status says why."""
        volume = ConfigMapVolume(tmp_path, ONLY_MEDIUM)
        file = PolicyFile(read_policy_file(volume.path))
        (tmp_path / "..data").unlink()
        error = file.check()
        assert isinstance(error, ConfigError) and "cannot read policy file" in str(error)


class TestReloader:
    def test_new_namespace_rules_apply_at_the_next_admission_on_the_same_inventory(self, tmp_path: Path) -> None:
        """A change of namespace rules only: the next admission is decided by the new rules, and the
        inventory (with its reservations) is the same object: nothing is read again."""
        s = Setup(tmp_path, ONLY_MEDIUM)
        assert s.admit("a", "medium") == "nvidia/medium/Tesla-T4"
        assert s.admit("b", "high") is None
        s.volume.update("namespaces: {ml: {allowedClasses: [medium, high]}}\n")
        s.reloader.step()
        assert s.admitter.inventory is s.inventory
        assert s.reopens.calls == 0
        assert s.reservations() == 1  # the admission before the change still counts
        assert s.results == [True]
        assert s.admitter.policy.namespace("ml").allowed_classes == ("medium", "high")

    def test_a_policy_taken_into_use_logs_what_now_cannot_keep_exact(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """With two processes admitting, a new version that gives a `now` namespace a classQuota is taken
        into use with a warning naming the namespace and the fix; one that queues it, without."""
        s = Setup(tmp_path, ONLY_MEDIUM)
        reloader = PolicyReloader(PolicyFile(read_policy_file(s.volume.path)), s.admitter, admitters=2)
        s.volume.update("defaults: {placement: now, enforceAllGpuQuotaForms: false}\n"
                        "namespaces: {ml: {classQuota: {medium: 2}}}\n")  # fmt: skip
        with caplog.at_level("WARNING", logger="gpupool.policy"):
            reloader.step()
        assert s.admitter.policy.namespace("ml").class_quota == {"medium": 2}
        assert caplog.messages == [
            "policy: namespaces.ml: placement now with classQuota: with 2 admitting processes (replicas x workers) "
            "each checks it alone against what it has seen, so a burst can exceed it; set placement: queue there "
            "for exact quotas (docs/queue.md)"
        ]
        caplog.clear()
        s.volume.update("namespaces: {ml: {placement: queue, classQuota: {medium: 2}}}\n")
        with caplog.at_level("WARNING", logger="gpupool.policy"):
            reloader.step()
        assert s.admitter.policy.placement("ml") == "queue"
        assert caplog.messages == []

    def test_an_invalid_file_keeps_the_policy_in_use(self, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
        """An invalid version is logged (naming the field) and counted as a failure; admissions go on
        by the policy in use."""
        s = Setup(tmp_path, ONLY_MEDIUM)
        before = s.admitter.policy
        s.volume.update("namespaces: {ml: {defaultClass: 7}}\n")
        s.reloader.step()
        assert s.admitter.policy is before
        assert s.results == [False]
        assert "namespaces.ml.defaultClass" in caplog.text
        assert s.admit("a", "medium") == "nvidia/medium/Tesla-T4"

    def test_new_pools_switch_once_the_new_inventory_holds_every_reservation(self, tmp_path: Path) -> None:
        """A product-table change re-pools the nodes: the snapshot is read again for the new policy while
        the old one answers. Reservations made meanwhile are made in both; the switch waits until the
        reservations made before are gone (here: until reservationSeconds passed), so that the new
        inventory counts every admission the watch has not shown."""
        s = Setup(tmp_path, ONLY_MEDIUM)
        assert s.admit("before", "medium") == "nvidia/medium/Tesla-T4"
        s.volume.update(T4_IS_HIGH)
        s.reloader.step()
        assert s.reopens.calls == 1
        assert s.admitter.inventory is s.inventory  # still the old policy, on the old inventory
        lifetime = s.admitter.policy.defaults.reservation_seconds
        s.clock.now += lifetime / 2
        assert s.admit("during", "medium") == "nvidia/medium/Tesla-T4"
        s.reloader.step()
        assert s.admitter.inventory is s.inventory  # "before" may not be in the new inventory yet
        s.clock.now += lifetime / 2
        s.reloader.step()
        assert s.admitter.inventory is not s.inventory
        assert s.results == [True]
        assert s.admit("after", "high") == "nvidia/high/Tesla-T4"
        # The new inventory held "during" (reserved in both, in the pool the new policy puts the T4s in)
        # and now "after": 2 of the 8 T4s.
        assert s.reservations() == 2
        assert s.pending() == {"nvidia/high/Tesla-T4": 2}

    @pytest.mark.parametrize("how", ["nodeName", "daemonset"])
    def test_a_pod_that_bypasses_placement_is_held_on_its_node_in_the_new_inventory(
        self, tmp_path: Path, how: str
    ) -> None:
        """A Pod placed by someone else (its nodeName, or a DaemonSet's Pod whose nodeSelector reaches one
        node), admitted while the new inventory is built, holds its GPUs on that very node in both
        inventories, as the watch will count it: after the switch the node has as few free GPUs as before."""
        s = Setup(tmp_path, ONLY_MEDIUM)
        assert s.admit("before", "medium") == "nvidia/medium/Tesla-T4"  # holds the switch back
        s.volume.update(T4_IS_HIGH)
        s.reloader.step()
        if how == "nodeName":
            bound = pod("bound", "ml", gpus=4, node="t4-0")
        else:
            bound = pod("bound", "ml", gpus=4, node_selector={"kubernetes.io/hostname": "t4-0"})
            owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dcgm", "uid": "u-1", "controller": True}
            bound["metadata"]["ownerReferences"] = [owner]
        verdict = s.admitter.admit(bound, namespace="ml")
        assert verdict.placement is not None and verdict.placement.node == "t4-0", verdict.message

        def free() -> dict[str, int]:
            with s.admitter.inventory.read() as index:
                facts = {n: index.capacity.node_facts(n, "nvidia.com/gpu") for n in ("t4-0", "t4-1")}
                return {n: index.capacity.node_free(f) for n, f in facts.items() if isinstance(f, NodeFacts)}

        assert free() == {"t4-0": 0, "t4-1": 4}
        assert s.pending() == {"nvidia/medium/Tesla-T4": 1}  # "before", held in the pool
        s.clock.now += s.admitter.policy.defaults.reservation_seconds
        s.reloader.step()
        assert s.admitter.inventory is not s.inventory and s.results == [True]
        assert free() == {"t4-0": 0, "t4-1": 4}
        assert s.pending() == {"nvidia/high/Tesla-T4": 0}  # "before" was never in the new one, and expired

    def test_with_no_reservations_left_the_switch_is_immediate(self, tmp_path: Path) -> None:
        """Nothing admitted before the change is outstanding: the new inventory is used as soon as it is
        ready, without waiting out reservationSeconds."""
        s = Setup(tmp_path, ONLY_MEDIUM)
        s.volume.update(T4_IS_HIGH)
        s.reloader.step()
        assert s.admit("now", "high") == "nvidia/high/Tesla-T4"

    def test_a_newer_file_wins_over_a_change_waiting_for_its_inventory(self, tmp_path: Path) -> None:
        """While the new inventory is pending, the file changes again (back to the old pools): the pending
        inventory is dropped and the newest policy applies on the inventory in use."""
        s = Setup(tmp_path, ONLY_MEDIUM)
        s.admit("before", "medium")
        s.volume.update(T4_IS_HIGH)
        s.reloader.step()
        s.volume.update("namespaces: {ml: {allowedClasses: [low, medium]}}\n")
        s.reloader.step()
        assert s.admitter.inventory is s.inventory
        assert s.admitter.policy.namespace("ml").allowed_classes == ("low", "medium")
        s.clock.now += 3600
        s.reloader.step()
        assert s.admitter.inventory is s.inventory

    def test_a_snapshot_that_no_longer_reads_keeps_the_policy(self, tmp_path: Path) -> None:
        """New pools need the snapshot read again; when it is broken the change is refused, not half-made."""
        s = Setup(tmp_path, ONLY_MEDIUM)
        (tmp_path / "cluster.yaml").write_text("kind: List\nitems: [{kind: Node}]\n", encoding="utf-8")
        before = s.admitter.policy
        s.volume.update(T4_IS_HIGH)
        s.reloader.step()
        assert s.admitter.policy is before
        assert s.results == [False]


# --- end to end: a real `gpupool serve` --------------------------------------------------------------


def placed_pool(client: ApiServerClient, gpu_class: str, namespace: str = "ml") -> str | None:
    """The pool a dry-run admission of a Pod asking for `gpu_class` gets; None when refused."""
    review = admission_review(gpu_pod(namespace=namespace, annotations={"gpupool.io/gpu-class": gpu_class}),
                              namespace=namespace, dry_run=True)  # fmt: skip
    response = client.review(review)["response"]
    return response["auditAnnotations"]["pool"] if response["allowed"] else None


@pytest.mark.slow
class TestServe:
    """`gpupool serve` follows its --policy file, mounted the way the kubelet mounts a ConfigMap."""

    def test_snapshot_new_rules_apply_and_an_invalid_file_is_shown_not_fatal(
        self, cert_dir: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]
    ) -> None:
        """On the demo snapshot: a namespace rule changed in the file applies to the next admissions of
        both workers, without a restart; then an invalid file keeps that policy, is logged naming the
        field, counted, and shown in /readyz, which stays 200."""
        volume = ConfigMapVolume(tmp_path / "policy", ONLY_MEDIUM)
        port, health_port = free_port(), free_port()
        argv = serve_argv(cert_dir, port, health_port, "--inventory", str(DEMO_INVENTORY), "--policy", volume.path)
        server = start_server([*argv, "--workers", "2"], health_port)
        client = ApiServerClient(port, cert_dir / "ca.crt")
        try:
            assert placed_pool(client, "high") is None
            volume.update(ONLY_HIGH)
            wait_until(lambda: metric(health_port, 'gpupool_policy_reloads_total{result="success"}') == 2, 30,
                       "both workers taking the new file")  # fmt: skip
            # Each new connection may land on either worker: every answer follows the new file.
            for _ in range(6):
                fresh = ApiServerClient(port, cert_dir / "ca.crt")
                try:
                    assert placed_pool(fresh, "high") is not None and placed_pool(fresh, "medium") is None
                finally:
                    fresh.close()
            status, body = readyz(health_port)
            warnings = body["policy"].pop("warnings")
            assert status == 200 and body["policy"] == {
                "file": volume.path,
                "sha256": hashlib.sha256(ONLY_HIGH.encode()).hexdigest(),
                "error": None,
            }
            # Two workers admit under `now`: the ResourceQuota forms only gpupool enforces are not exact.
            assert len(warnings) == 1 and warnings[0].startswith("placement now in defaults")

            volume.update("namespaces: {ml: {allowedClasses: [huge]}}\n")
            wait_until(lambda: readyz(health_port)[1]["policy"]["error"] is not None, 30, "the refusal in /readyz")
            status, body = readyz(health_port)
            assert status == 200 and body["ready"]
            assert "namespaces.ml.allowedClasses" in body["policy"]["error"]
            assert body["policy"]["sha256"] == hashlib.sha256(ONLY_HIGH.encode()).hexdigest()
            wait_until(lambda: metric(health_port, 'gpupool_policy_reloads_total{result="failure"}') == 2, 30,
                       "both workers counting the refusal")  # fmt: skip
            assert metric(health_port, "gpupool_policy_last_reload_successful") == 0
            assert placed_pool(client, "high") is not None  # still the last valid policy
            refusals = [
                line for line in server.log_lines() if line.get("message", "").startswith("policy file refused")
            ]
            assert refusals and all("namespaces.ml.allowedClasses" in line["message"] for line in refusals)
        finally:
            client.close()
            server.stop()

    def test_live_new_rules_cost_no_list_and_new_pools_are_listed_once(
        self, cert_dir: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]
    ) -> None:
        """On the API simulator: a namespace-only change lists nothing again; a product-table change
        lists the cluster once more (the new pools are built from it) and then places on them."""
        volume = ConfigMapVolume(tmp_path / "policy", ONLY_MEDIUM)
        with KubeSim(bookmark_interval=0.5) as sim:
            sim.load([gpu_node(f"l4-{i}", "NVIDIA-L4", 4, gpu_class=None, memory_mib=23034) for i in range(2)])
            kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
            port, health_port = free_port(), free_port()
            argv = serve_argv(cert_dir, port, health_port, "--kubeconfig", str(kubeconfig), "--policy", volume.path)
            server = start_server(argv, health_port)
            client = ApiServerClient(port, cert_dir / "ca.crt")
            try:
                lists = sim.list_requests("nodes")
                volume.update("defaults: {placement: now}\nnamespaces: {ml: {allowedClasses: [medium, high]}}\n")
                wait_until(lambda: metric(health_port, 'gpupool_policy_reloads_total{result="success"}') == 1, 30,
                           "the reload")  # fmt: skip
                assert placed_pool(client, "medium") == "nvidia/medium/NVIDIA-L4"
                assert sim.list_requests("nodes") == lists

                volume.update(ONLY_HIGH + "products: [{match: L4, class: high, memory: 24Gi}]\n")
                wait_until(lambda: placed_pool(client, "high") == "nvidia/high/NVIDIA-L4", 60, "the L4s as class high")
                assert sim.list_requests("nodes") == lists + 2  # the worker and the leader process, once each
                sim.wait_for_watches(
                    6, timeout=30
                )  # the old inventories' watches are closed (3 each: worker, leader process)
                assert placed_pool(client, "medium") is None
                assert "changes the pools" in server.log()
            finally:
                client.close()
                server.stop()
