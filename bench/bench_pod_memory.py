"""Benchmark: what a replica keeps of each Pod it follows, in bytes, large Pods against small ones.

Every replica follows every GPU Pod through its live inventory's watch (webhook.sources.live): the pool
index keeps each one's projection (for a Pod on no node yet, what it requires of a node), and the queue
(webhook.queue.waiting) keeps each waiting Pod's view, and the leader's parking (webhook.queue.parking)
each waiting shape's request. A Pod within gpupool's input limits may carry a required node affinity of
one term of 64 requirements of 256 values each (about 325 KiB of JSON): what gpupool keeps of it must be
bounded by what gpupool needs of it, not by what the Pod sent.

Each kind of Pod is fed, decoded from JSON as the watch decodes it (every Pod its own strings), through
the real path: `LiveInventory.apply` (the index, then the queue observing it), then a pass's
`read_batch` with parking (the leader reading the waiting Pods' requests). tracemalloc counts the bytes
still held after the raw objects are gone, divided by the Pods:

- `small`: a one-GPU Pod with a nodeSelector and one toleration;
- `large-same`: the large affinity, the same in every Pod (one workload's replicas);
- `large-distinct`: the large affinity, every value different in every Pod (the worst case);

each `queued` (gated by `gpupool.io/queue`, in the queue and the index) and `now` (placed but on no node
yet: only in the index, with what it requires of a node).

    .venv/bin/python bench/bench_pod_memory.py [--pods 100] [--kinds small,large-same,large-distinct]

Results are printed and written to bench/results/pod-memory-<time>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from webhook.domain.model import POOL_ANNOTATION, QUEUE_GATE  # noqa: E402
from webhook.domain.policy import Policy  # noqa: E402
from webhook.domain.policy_build import load_policy_text  # noqa: E402
from webhook.queue.parking import Parking  # noqa: E402
from webhook.queue.release import read_batch  # noqa: E402
from webhook.queue.waiting import Waiting  # noqa: E402
from webhook.sources.live import LiveInventory  # noqa: E402

RESULTS = REPO / "bench" / "results"
KINDS = ("small", "large-same", "large-distinct")
MODES = ("queued", "now")
REQUIREMENTS, VALUES = 64, 256  # of the one term: gpupool's limits are 64 requirements of 256 values
POLICY = "defaults: {placement: now}\nnamespaces:\n  q: {placement: queue}\n"


class UnusedApi:
    """A CoreV1Api stand-in: the inventory's reflectors are never started, its sink is fed by hand."""

    def _never(self, **kwargs: Any) -> Any:
        raise AssertionError("the reflectors are not started")

    list_node = list_pod_for_all_namespaces = list_resource_quota_for_all_namespaces = _never


def affinity(distinct: str) -> dict[str, Any]:
    """One required term of REQUIREMENTS requirements of VALUES values (each about 17 characters);
    `distinct` is written into every value."""
    expressions = [
        {
            "key": f"topology.example.com/rack-{i:02d}",
            "operator": "In",
            "values": [f"r{distinct}-{i:02d}-{j:03d}-zz" for j in range(VALUES)],
        }
        for i in range(REQUIREMENTS)
    ]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": expressions}
    ]}}}  # fmt: skip


def pod(kind: str, mode: str, n: int) -> bytes:
    """The n-th Pod of a kind, as the watch sends it (JSON)."""
    namespace = "q" if mode == "queued" else "ml"
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.example/train:1.0",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        "nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }  # fmt: skip
    if kind != "small":
        spec["affinity"] = affinity(f"{n:05d}" if kind == "large-distinct" else "00000")
    if mode == "queued":
        spec["schedulingGates"] = [{"name": QUEUE_GATE}]
    annotations = {"gpupool.io/gpu-class": "medium"} | ({} if mode == "queued" else {POOL_ANNOTATION: "medium"})
    meta = {
        "name": f"p-{n:05d}",
        "namespace": namespace,
        "uid": f"uid-{n:05d}",
        "resourceVersion": str(100 + n),
        "creationTimestamp": "2026-12-01T10:00:00Z",
        "annotations": annotations,
    }
    return orjson.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {}})


def retained(policy: Policy, kind: str, mode: str, pods: int) -> dict[str, Any]:
    """The bytes a replica still holds per Pod once `pods` of them went through the watch and a pass read
    the waiting ones' requests (the raw objects dropped)."""
    texts = [pod(kind, mode, n) for n in range(pods)]
    sent = sum(map(len, texts)) / pods
    live = LiveInventory(policy, UnusedApi())
    waiting = Waiting(policy)
    live.observe(waiting)
    parking = Parking()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for text in texts:
        live.apply("pods", "ADDED", orjson.loads(text))
    batch = read_batch(waiting.ordered(), policy, parking=parking)
    del batch
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    top = tracemalloc.take_snapshot().statistics("filename")[:4]
    tracemalloc.stop()
    assert len(live._index.usage.pod_keys()) == pods, "every Pod is in the index"
    assert len(waiting) == (pods if mode == "queued" else 0)
    return {
        "kind": kind,
        "mode": mode,
        "pods": pods,
        "sent_bytes_per_pod": round(sent),
        "retained_bytes_per_pod": round((after - before) / pods),
        "where": [f"{s.traceback[0].filename.removeprefix(str(REPO) + '/')}: {s.size // pods} B/Pod" for s in top],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    policy = load_policy_text(POLICY)
    rows = []
    for kind in args.kinds.split(","):
        for mode in MODES:
            row = retained(policy, kind, mode, args.pods)
            rows.append(row)
            print(
                f"{kind:15} {mode:6} sent {row['sent_bytes_per_pod'] / 1024:8.1f} KiB/Pod"
                f"  retained {row['retained_bytes_per_pod'] / 1024:8.1f} KiB/Pod   {'; '.join(row['where'][:3])}",
                flush=True,
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"pod-memory-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"python": platform.python_version(), "rows": rows}, indent=2))
    print(f"written to {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
