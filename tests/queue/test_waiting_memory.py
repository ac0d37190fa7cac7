"""What a replica keeps of each Pod it follows is bounded by what gpupool needs of it, not by what the Pod
sent: large Pods within gpupool's input limits, through the real path (the live inventory's sink, the
queue observing it, a pass reading the waiting Pods' requests with parking), measured with tracemalloc
once the raw objects are gone (docs/queue.md, "What the queue keeps of a Pod")."""

from __future__ import annotations

import gc
import json
import tracemalloc
from typing import Any

import pytest

from tests.builders import gpu_node, policy
from webhook.domain.model import POOL_ANNOTATION, QUEUE_GATE
from webhook.queue.parking import Parking
from webhook.queue.release import read_batch
from webhook.queue.waiting import Waiting
from webhook.sources.live import LiveInventory

KIB = 1024
POD_BOUND = 64 * KIB  # beside one copy of its long value lists (docs/queue.md)
DISTINCT_BOUND = 16 * KIB  # a Pod whose long lists are all its own: cut to the values nodes carry
REQUIREMENTS, VALUES = 64, 256  # one term at gpupool's limits of requirements and values
POLICY = policy("namespaces:\n  q: {placement: queue}\n")


class _UnusedApi:
    """A CoreV1Api stand-in: the reflectors are never started, the sink is fed by hand."""

    def _never(self, **kwargs: Any) -> Any:
        raise AssertionError("the reflectors of this inventory are not started")

    list_node = list_pod_for_all_namespaces = list_resource_quota_for_all_namespaces = _never


def large_pod(n: int, *, queued: bool, distinct: bool) -> str:
    """A one-GPU Pod with one required term of 64 requirements of 256 values (about 309 KiB of JSON),
    as the watch sends it; with `distinct`, every value holds the Pod's number."""
    tag = f"{n:05d}" if distinct else "00000"
    expressions = [
        {"key": f"topology.example.com/rack-{i:02d}", "operator": "In",
         "values": [f"r{tag}-{i:02d}-{j:03d}-zz" for j in range(VALUES)]}
        for i in range(REQUIREMENTS)
    ]  # fmt: skip
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": expressions}]}}},
    }  # fmt: skip
    annotations = {"gpupool.io/gpu-class": "medium"}
    if queued:
        spec["schedulingGates"] = [{"name": QUEUE_GATE}]
    else:
        annotations[POOL_ANNOTATION] = "medium"
    meta = {
        "name": f"p-{n:05d}",
        "namespace": "q" if queued else "ml",
        "uid": f"uid-{n}",
        "resourceVersion": str(100 + n),
        "creationTimestamp": "2026-12-01T10:00:00Z",
        "annotations": annotations,
    }
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {}})


def kept_per_pod(texts: list[str], nodes: tuple[dict[str, Any], ...] = ()) -> tuple[float, LiveInventory, Waiting]:
    """The bytes still held per Pod once every Pod went through the watch (each decoded apart, as the watch
    decodes it) and a pass read the waiting ones' requests with parking; `nodes` are known before."""
    live, waiting, parking = LiveInventory(POLICY, _UnusedApi()), Waiting(POLICY), Parking()
    live.observe(waiting)
    for node in nodes:
        live.apply("nodes", "ADDED", node)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for text in texts:
            live.apply("pods", "ADDED", json.loads(text))
        batch = read_batch(waiting.ordered(), POLICY, parking=parking)
        assert len(batch.pods) == len(waiting)
        del batch
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / len(texts), live, waiting


@pytest.mark.parametrize("queued", [pytest.param(True, id="queued"), pytest.param(False, id="now-on-no-node")])
def test_pods_of_one_large_shape_keep_a_small_constant_each(queued: bool) -> None:
    """50 Pods of one workload, each with the 309 KiB affinity decoded apart: each keeps at most 64 KiB
    (before: 1.3 MiB queued, 1.2 MiB placed on no node yet), queued or placed and on no node yet."""
    texts = [large_pod(n, queued=queued, distinct=False) for n in range(50)]
    per_pod, live, waiting = kept_per_pod(texts)
    with live.read() as index:
        assert len(index.usage.pod_keys()) == 50  # every one followed
    assert len(waiting) == (50 if queued else 0)
    assert per_pod <= POD_BOUND, f"{per_pod / KIB:.1f} KiB kept per Pod"


@pytest.mark.parametrize("queued", [pytest.param(True, id="queued"), pytest.param(False, id="now-on-no-node")])
def test_distinct_large_pods_keep_what_gpupool_needs_of_them(queued: bool) -> None:
    """20 Pods whose every value differs, beside nodes that carry a few of them: each keeps at most
    16 KiB, not the values it sent (before: 318 KiB queued, 303 KiB placed on no node yet: its values
    once), since what gpupool needs of them is which nodes they match (webhook.domain.cut)."""
    texts = [large_pod(n, queued=queued, distinct=True) for n in range(20)]
    nodes = tuple(
        gpu_node(f"t4-{n}", labels={f"topology.example.com/rack-{i:02d}": f"r{n:05d}-{i:02d}-007-zz" for i in range(4)})
        for n in range(4)
    )
    per_pod, live, waiting = kept_per_pod(texts, nodes)
    assert len(waiting) == (20 if queued else 0)
    with live.read() as index:
        assert len(index.usage.pod_keys()) == 20
    assert per_pod <= DISTINCT_BOUND, f"{per_pod / KIB:.1f} KiB kept per Pod"


SMALL_BOUND = 2560  # bytes a small queued Pod keeps: 2.0 KiB (before: 3.5 KiB, 5.7 KiB with the two defaults)
DEFAULT_TOLERATIONS = [  # what kube-apiserver's DefaultTolerationSeconds adds to every Pod
    {"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    for taint in ("not-ready", "unreachable")
]


def small_pod(n: int, tolerations: list[dict[str, Any]]) -> str:
    """A one-GPU queued Pod of one workload as gpupool's patch leaves it (bench_queue's backlog Pod)."""
    meta = {
        "name": f"backlog-{n:06d}",
        "namespace": "q",
        "uid": f"0f1e2d3c-4b5a-6978-8796-{n:012d}",
        "resourceVersion": str(100 + n),
        "creationTimestamp": f"2026-12-04T19:{n // 600 % 60:02d}:{n // 10 % 60:02d}Z",
        "annotations": {"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": "1"},
        "labels": {"app": "backlog"},
    }
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        "priority": 100 if n % 10 == 0 else 0,
        "schedulingGates": [{"name": QUEUE_GATE}],
        "tolerations": tolerations,
    }
    status = {"phase": "Pending", "qosClass": "Burstable"}
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status})


@pytest.mark.parametrize(
    "tolerations", [pytest.param([], id="no-tolerations"), pytest.param(DEFAULT_TOLERATIONS, id="default-tolerations")]
)
def test_a_long_queue_of_small_pods_keeps_little_per_pod(tolerations: list[dict[str, Any]]) -> None:
    """A queue of 100,000 small Pods (issue 27) must fit a leader in 600 MB: 2,000 of one workload keep at
    most 2.5 KiB each; the tolerations, node requirements and the strings every Pod repeats (namespace,
    phase, resource, gate, creation second) are shared, not kept per Pod."""
    per_pod, _, waiting = kept_per_pod([small_pod(n, tolerations) for n in range(2000)])
    assert len(waiting) == 2000
    assert per_pod <= SMALL_BOUND, f"{per_pod:.0f} bytes kept per Pod"
