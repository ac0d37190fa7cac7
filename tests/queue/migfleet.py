"""A MIG fleet on the API simulator for the leader's re-cut tests: A100-80GB nodes as GFD and the GPU
Operator label them, mig-parted's config in its ConfigMap, and the leader's view kept in step by hand."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.builders import policy
from tests.mig.configs import A100_80, OPERATOR_DEFAULT
from tests.queue.fakes import Events, Inventory, Leading
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import node_from_obj, pod_from_obj
from webhook.queue.reshape import Reshaper
from webhook.queue.runner import Runner
from webhook.queue.waiting import PODS, Waiting
from webhook.sources.writes import ConfigMapText, NodeLabeler, PodReleaser
from webhook.testing import KubeSim
from webhook.testing.kubefit import why_unfit

GATE = "gpupool.io/queue"
POLICY = """
namespaces:
  q: {placement: queue}
migReshaping:
  idleSeconds: 60
  timeoutSeconds: 300
"""


def a100(name: str, *, opted_in: bool = True, gpus: int = 2, layout: str = "all-1g.10gb") -> dict[str, Any]:
    """An A100-80GB node (mixed strategy) cut all-1g.10gb, opted in to re-cuts or not."""
    labels = {
        "kubernetes.io/hostname": name,
        "nvidia.com/gpu.product": A100_80,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": layout,
        "nvidia.com/mig.config.state": "success",
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
        "nvidia.com/mig-1g.10gb.count": str(7 * gpus),
        "nvidia.com/mig-1g.10gb.memory": "9728",
        "nvidia.com/mig-1g.10gb.product": f"{A100_80}-MIG-1g.10gb",
        "nvidia.com/mig-1g.10gb.replicas": "1",
    }
    if opted_in:
        labels["gpupool.io/mig-reshape"] = "true"
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/mig-1g.10gb": str(7 * gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def three_a100s() -> list[dict[str, Any]]:
    """The fleet of the re-cut tests: gpu-busy (a trainer runs there), gpu-idle, and gpu-out (not opted in)."""
    return [a100("gpu-busy"), a100("gpu-idle"), a100("gpu-out", opted_in=False)]


def trainer() -> dict[str, Any]:
    """The Pod that keeps gpu-busy busy: one 1g.10gb instance."""
    return running("trainer", "gpu-busy")


@contextmanager
def fleet_sim(*pods: dict[str, Any]) -> Iterator[KubeSim]:
    """A running simulator holding mig-parted's ConfigMap, the three A100s, the trainer and `pods`."""
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.add(config_map())
        for obj in (*three_a100s(), trainer(), *pods):
            sim.add(obj)
        yield sim


@contextmanager
def waiting_fleet(count: int) -> Iterator[KubeSim]:
    """`fleet_sim` with `count` Pods queued for 35 GiB MIG instances (big-0, big-1, ...): more than gpu-idle
    offers once re-cut when `count` passes 4."""
    with fleet_sim(*(waiting_pod(f"big-{k}") for k in range(count))) as sim:
        yield sim


def big(name: str, namespace: str = "q") -> dict[str, Any]:
    """A Pod as its author writes it: 35 GiB of MIG memory, no device resource."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {"gpupool.io/device": "mig", "gpupool.io/min-memory": "35Gi"},
        },
        "spec": {"containers": [{"name": "c", "image": "cuda"}]},
    }


def config_map(text: str = OPERATOR_DEFAULT) -> dict[str, Any]:
    return {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": "default-mig-parted-config", "namespace": "gpu-operator"},
        "data": {"config.yaml": text},
    }


def running(name: str, node: str, resource: str = "nvidia.com/mig-1g.10gb") -> dict[str, Any]:
    """A Pod that uses one MIG instance on `node`."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "other", "uid": f"uid-{name}"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {resource: "1"}}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "status": {"phase": "Running"},
    }


def waiting_pod(name: str, memory: str = "35Gi", resource: str = "nvidia.com/mig-3g.40gb") -> dict[str, Any]:
    """A Pod as admission queues it for a MIG instance of `memory`: its device resource fixed, gated."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "q",
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "annotations": {"gpupool.io/device": "mig", "gpupool.io/min-memory": memory},
        },
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {resource: "1"}}}],
        },
        "status": {"phase": "Pending"},
    }


def small(name: str = "small") -> dict[str, Any]:
    """A Pod queued for one 1g.10gb instance (8 GiB): room the fleet has without any re-cut."""
    return waiting_pod(name, memory="8Gi", resource="nvidia.com/mig-1g.10gb")


def sync(sim: KubeSim, index: PoolIndex, policy: Policy) -> None:
    """The leader's watch, caught up by hand: every node and Pod as the simulator holds it now."""
    index.upsert_nodes(node_from_obj(n, policy.gpu_resources, policy.partition_prefixes) for n in sim.objects("Node"))
    for obj in sim.objects("Pod"):
        index.upsert_pod(pod_from_obj(obj, policy.gpu_resources, policy.partition_prefixes))


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Counted:
    def __init__(self) -> None:
        self.outcomes: list[str] = []

    def mig_reshaped(self, outcome: str) -> None:
        self.outcomes.append(outcome)


@dataclass
class Leader:
    sim: KubeSim
    policy: Policy
    index: PoolIndex
    waiting: Waiting
    runner: Runner
    reshaper: Reshaper
    events: Events
    metrics: Counted
    clock: Clock

    def pass_(self) -> None:
        """One pass of the leader, its watch caught up first."""
        sync(self.sim, self.index, self.policy)
        for obj in self.sim.objects("Pod"):
            self.waiting.apply(PODS, "MODIFIED", obj)
        self.runner.run_pass()

    def labels(self, node: str) -> dict[str, str]:
        obj = self.sim.get("Node", None, node)
        assert obj is not None
        return dict(obj["metadata"].get("labels", {}))

    def annotations(self, node: str) -> dict[str, str]:
        obj = self.sim.get("Node", None, node)
        assert obj is not None
        return dict(obj["metadata"].get("annotations") or {})

    def released(self, name: str) -> bool:
        obj = self.sim.get("Pod", "q", name)
        return obj is not None and not obj["spec"].get("schedulingGates")

    def fits(self, name: str) -> dict[str, bool]:
        """Where the simulator's scheduler could bind Pod q/`name` as it stands: each node, and whether it fits."""
        obj = self.sim.get("Pod", "q", name)
        assert obj is not None
        return {n["metadata"]["name"]: why_unfit(obj, n) is None for n in self.sim.objects("Node")}

    def reasons(self, name: str) -> list[str]:
        return [e.reason for e in self.events.recorded if e.pod == name]


def start(sim: KubeSim, tmp_path: Path, client: object, text: str = POLICY, *, plan_seconds: float = 0.0) -> Leader:
    pol = policy(text)
    index = PoolIndex(pol)
    waiting = Waiting(pol)
    clock = Clock()
    events, metrics = Events(), Counted()
    reshaper = Reshaper(
        NodeLabeler(client), ConfigMapText(client), events, metrics, wall=clock, plan_seconds=plan_seconds
    )
    runner = Runner(Inventory(index), waiting, Leading(), PodReleaser(client), events=events, reshaper=reshaper)  # type: ignore[arg-type]
    return Leader(sim, pol, index, waiting, runner, reshaper, events, metrics, clock)
