"""The parking tests' set-up, shared by tests/queue/test_parking.py and test_parked_index.py: a fleet of T4s
and L4s, large distinct waiting Pods, a pass with or without parking and its answers."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import gpu_node, index_of, pod, policy
from tests.queue.helpers import GPU_TOLERATION, enqueue, queued_pod
from webhook.admission import choice as choice_module
from webhook.domain.model import PodKey, PoolKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import pod_from_obj
from webhook.queue import release as release_module
from webhook.queue.parking import Parking
from webhook.queue.release import Plan, decide_batch, read_batch, settle
from webhook.queue.waiting import Waiting

QUEUE = "namespaces:\n  q: {placement: queue}\n  q2: {placement: queue}\n"
T4 = PoolKey("nvidia", "medium", "Tesla-T4")
L4 = PoolKey("nvidia", "medium", "NVIDIA-L4")
PRODUCTS = {"t4": "Tesla-T4", "l4": "NVIDIA-L4"}


def large(obj: dict[str, Any], seed: str) -> dict[str, Any]:
    """The Pod with a required node affinity of 10 x 256 distinct values no node has (so it reaches every
    node): a shape over what a memo entry may weigh (its values kept as one text each), distinct per `seed`."""
    values = [f"{seed}-{k:04d}-".ljust(60, "x") for k in range(10 * 256)]
    expressions = [
        {"key": f"example.com/rack-{e}", "operator": "NotIn", "values": values[e * 256 : (e + 1) * 256]}
        for e in range(10)
    ]
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
        }
    }
    return obj


def running(name: str, node: str, gpus: int, namespace: str = "other") -> dict[str, Any]:
    return pod(name, namespace, gpus=gpus, node=node, phase="Running", tolerations=[GPU_TOLERATION])


def fleet() -> list[dict[str, Any]]:
    """One T4 and one L4 node of 4 GPUs each, both full."""
    return [
        gpu_node("t4-a", "Tesla-T4", 4),
        gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034),
        running("busy-t4", "t4-a", 4),
        running("busy-l4", "l4-a", 4),
    ]


def waiting_pods(pol: Policy, index: PoolIndex, waiting: Waiting, count: int, *, gpus: int = 2) -> list[dict[str, Any]]:
    """`count` large distinct 2-GPU Pods queued in q, alternately for the T4 and the L4 pool, oldest first."""
    objs = []
    for k in range(count):
        product = ("t4", "l4")[k % 2]
        obj = gpu_pod(
            f"p{k:03d}",
            "q",
            pol,
            index,
            annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-product": PRODUCTS[product]},
            created=f"2026-12-01T10:{k // 60:02d}:{k % 60:02d}Z",
            gpus=gpus,
        )
        objs.append(large(obj, f"{product}{k}"))
    enqueue(objs, index, waiting)
    return objs


def queued(count: int) -> tuple[Policy, PoolIndex, Waiting, Parking]:
    """Under QUEUE, on `fleet()`: `count` waiting Pods (`waiting_pods`), and an empty parking."""
    pol = policy(QUEUE)
    index = index_of(fleet(), pol)
    waiting = Waiting(pol)
    waiting_pods(pol, index, waiting, count)
    return pol, index, waiting, Parking()


def gpu_pod(name: str, namespace: str, pol: Policy, index: PoolIndex, **kw: Any) -> dict[str, Any]:
    """A queued GPU Pod that tolerates the GPU nodes' taint."""
    tolerations = [GPU_TOLERATION, *kw.pop("tolerations", [])]
    return queued_pod(name, namespace, pol, index, tolerations=tolerations, **kw)


def show(index: PoolIndex, pol: Policy, obj: dict[str, Any]) -> None:
    """The watch shows a Pod (new, or again)."""
    index.upsert_pod(pod_from_obj(obj, pol.gpu_resources, pol.partition_prefixes))


class Decisions:
    """Counts the one decision's calls made by a pass (each is a ranking of every pool for a request)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pools: list[tuple[PoolKey, ...]] = []
        real = choice_module.choose

        def counting(*args: Any, **kw: Any) -> choice_module.Choice:
            answer = real(*args, **kw)
            self.pools.append(tuple(c.pool for c in answer.decision.candidates))
            return answer

        monkeypatch.setattr(release_module, "choose", counting)

    def take(self) -> list[tuple[PoolKey, ...]]:
        taken, self.pools = self.pools, []
        return taken


START = 1000.0  # the queue's clock when the Pods were first seen waiting


def a_pass(waiting: Waiting, index: PoolIndex, pol: Policy, parking: Parking | None, now: float | None = None) -> Plan:
    return decide_batch(read_batch(waiting.ordered(), pol, parking=parking), index, pol, now=now)


def undone(decided: Plan, index: PoolIndex) -> Plan:
    """The pass's releases taken back from the index, as the runner takes back a release it could not write."""
    for release in reversed(decided.releases):
        settle(index, release, None)
    return decided


def from_scratch(waiting: Waiting, index: PoolIndex, pol: Policy, now: float | None) -> Plan:
    """A pass over the whole queue from scratch (no parking), leaving the index as it found it: its releases
    taken back (`undone`) and the nodes held for Pods (webhook.queue.backfill) held as they were, so the
    pass it is compared with decides on the same index."""
    held = {owner: index.excluded_by(owner) for owner in index.excluders()}
    decided = undone(a_pass(waiting, index, pol, None, now), index)
    for owner in set(index.excluders()) | set(held):
        if index.excluded_by(owner) != held.get(owner, frozenset()):
            index.exclude_nodes(owner, held.get(owner, ()))
    return decided


def answers(decided: Plan) -> tuple[list[tuple[PodKey, PoolKey]], list[tuple[PodKey, str, str]]]:
    """What a pass answered, Pod by Pod: the releases, and each wait with its code and reason."""
    return (
        [(r.queued.key, r.pool) for r in decided.releases],
        [(w.queued.key, w.code, w.reason) for w in decided.waits],
    )
