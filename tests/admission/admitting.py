"""Admitters on small fleets with a clock the test moves, and issue 13's fleet and policy, shared by
the reservation tests and the namespace-rule tests of the core.
"""

from __future__ import annotations

from typing import Any

from tests.builders import gpu_node, index_of, pod
from tests.builders import policy as make_policy
from webhook.admission.core import Admitter, evaluate
from webhook.admission.verdict import Verdict
from webhook.pools.index import PoolIndex
from webhook.sources.snapshot import SnapshotInventory


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def running(name: str, node: str, gpus: int, namespace: str = "other") -> dict[str, Any]:
    return pod(name, namespace, gpus=gpus, node=node, phase="Running")


def admitter(objects: list[dict[str, Any]], policy_text: str | None = None) -> tuple[Admitter, FakeClock, PoolIndex]:
    pol = make_policy(policy_text)
    index = index_of(objects, pol)
    clock = FakeClock()
    return Admitter(pol, SnapshotInventory(index, "test"), clock=clock), clock, index


ESCAPE_POLICY = """
namespaces:
  students: {allowedClasses: [low, medium], classQuota: {medium: 2}}
  train: {classQuota: {high: 20}}
  tools: {allowVisibleDevices: true}
"""


def escape_fleet() -> list[dict[str, Any]]:
    return [
        gpu_node("h100-a", "NVIDIA-H100-80GB-HBM3", 8, memory_mib=81559, gpu_class=None),
        gpu_node("t4-a", "Tesla-T4", 4),
        gpu_node("t4-b", "Tesla-T4", 4),
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-a", "labels": {}}, "status": {}},
    ]


def daemonset_pod(node: str, gpus: int = 1, **kw: Any) -> dict[str, Any]:
    obj = pod("agent-x7", gpus=gpus, **kw)
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "controller": True}
    ]
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
            }
        }
    }
    return obj


def escape(
    obj: dict[str, Any], namespace: str, objects: list[dict[str, Any]] | None = None, text: str = ESCAPE_POLICY
) -> Verdict:
    pol = make_policy(text)
    return evaluate(obj, namespace, pol, index_of(objects if objects is not None else escape_fleet(), pol))
