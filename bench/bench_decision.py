"""One admission decision against a 5,000-node / 150,000-Pod snapshot, side by side with a 50-node one.

The admission path must not grow with the number of Pods: both indexes answer the same Pods, in
interleaved rounds so that noise on this shared machine hits both alike. Half the Pods belong to
workload groups (a Job whose Pods already hold the L4 pool, a Kubeflow job on the A100s with
group-policy strict, a new sweep asking for room for 8 Pods), so every group lookup is on the path;
the synthetic clusters' own GPU Pods are in some 1,500 groups (5,000 nodes) too. Reports medians, p99s
and the large/small ratio; writes bench/results/decision.json (decision-partitioned.json with
--partitioned).

With `--partitioned 0.25` a quarter of both fleets' GPU nodes are MIG instances (single and mixed
strategy) or time-sliced replicas, and the Pods include ones that ask for them.

    .venv/bin/python bench/bench_decision.py [--rounds 20] [--per-round 500] [--partitioned 0.25]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from webhook.admission.core import evaluate
from webhook.domain.policy import load_policy
from webhook.pools.index import PoolIndex
from webhook.sources.snapshot import build_index
from webhook.testing.synthetic import synthetic_cluster

PODS: list[dict[str, Any]] = [
    {"metadata": {"name": f"job-{i}", "annotations": ann}, "spec": {"containers": [{"name": "main", "image": "cuda"}]}}
    for i, ann in enumerate(
        [
            {"gpupool.io/gpu-class": "medium"},
            {"gpupool.io/min-memory": "20Gi", "gpupool.io/gpu-count": "2"},
            {"gpupool.io/gpu-class": "medium,high", "gpupool.io/fallback": "true", "gpupool.io/gpu-count": "4"},
            {"gpupool.io/gpu-product": "A100", "gpupool.io/min-driver": "535"},
            {"gpupool.io/gpu-class": "high", "gpupool.io/gpu-count": "8"},
        ]
    )
]
# Pods that ask for devices: what a partitioned fleet is for (on a whole-GPU fleet they find no device,
# or whole GPUs).
DEVICE_PODS: list[dict[str, Any]] = [
    {"metadata": {"name": f"dev-{i}", "annotations": ann}, "spec": {"containers": [{"name": "main", "image": "cuda"}]}}
    for i, ann in enumerate(
        [
            {"gpupool.io/device": "mig,gpu", "gpupool.io/min-memory": "16Gi"},
            {"gpupool.io/device": "shared,gpu", "gpupool.io/gpu-class": "medium"},
            {"gpupool.io/min-compute-capability": "8.0", "gpupool.io/min-cuda": "12.2"},
        ]
    )
] + [
    {
        "metadata": {"name": "plain-gpu"},
        "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
]


def _member(name: str, pool: str, product: str, gpus: int, owner: str, *, labels: dict[str, str] | None = None) -> Any:
    """A Pod of a workload group, placed by gpupool in `pool` and not on a node yet (or to be admitted)."""
    kind, owner_name = owner.split("/")
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "labels": labels or {},
            "annotations": {"gpupool.io/pool": pool} if pool else {},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": kind, "name": owner_name, "uid": owner, "controller": True}
            ],
        },
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": product} if product else {},
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Pending"},
    }


LLAMA = {"training.kubeflow.org/job-name": "bench-llama"}
# Pods already placed in both clusters: a Job on the L4 pool, a Kubeflow job on the A100 pool.
MEMBERS = [
    *(_member(f"bench-train-{i}", "nvidia/medium/NVIDIA-L4", "NVIDIA-L4", 1, "Job/bench-train") for i in range(3)),
    *(_member(f"bench-llama-{i}", "nvidia/high/NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB", 2,
              "PyTorchJob/bench-llama", labels=LLAMA) for i in range(2)),
]  # fmt: skip
GROUPED: list[dict[str, Any]] = [
    _member(
        "bench-train-new", "", "", 1, "Job/bench-train"
    ),  # joins its siblings on the L4 pool, not the T4s the ranking picks
    {**_member("bench-llama-new", "", "", 2, "PyTorchJob/bench-llama", labels=LLAMA)},  # strict: stays on the A100s
    _member("sweep-0", "", "", 2, "Job/bench-sweep-0"),  # a new group asking for room for 8 Pods
    _member("unrelated", "", "", 1, "Job/some-job"),  # a group with no Pod placed yet
]
GROUPED[1]["metadata"]["annotations"] = {"gpupool.io/group-policy": "strict"}
GROUPED[2]["metadata"]["annotations"] = {"gpupool.io/group": "bench-sweep", "gpupool.io/group-size": "8"}
PODS += [{"metadata": {**p["metadata"], "namespace": None}, "spec": {"containers": p["spec"]["containers"]}}
         for p in GROUPED]  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def build(nodes: int, pods: int, partitioned: float) -> tuple[PoolIndex, float, int]:
    policy = load_policy(None)
    objects = synthetic_cluster(nodes=nodes, pods=pods, seed=1, partitioned=partitioned) + MEMBERS
    start = time.perf_counter()
    index = build_index(objects, policy)
    return index, time.perf_counter() - start, len(objects)


def time_round(index: PoolIndex, per_round: int, out: list[float], pods: list[dict[str, Any]]) -> None:
    policy = index.policy
    for i in range(per_round):
        pod = pods[i % len(pods)]
        start = time.perf_counter_ns()
        # As the server calls it, minus its memo of Pod shapes: each Pod is parsed and patched anew.
        evaluate(pod, "team-a", policy, index, explain=False)
        out.append((time.perf_counter_ns() - start) / 1e6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=500)
    parser.add_argument(
        "--partitioned", type=float, default=0.0, help="share of GPU nodes in MIG or time-sliced (0.25: a quarter)"
    )
    args = parser.parse_args()
    pods = [*PODS, *DEVICE_PODS] if args.partitioned else PODS
    small, small_build, small_n = build(50, 1_500, args.partitioned)
    large, large_build, large_n = build(5_000, 150_000, args.partitioned)
    print(f"indexed {small_n:,} objects in {small_build:.2f} s and {large_n:,} objects in {large_build:.2f} s")
    timings: dict[str, list[float]] = {"50 nodes": [], "5,000 nodes": []}
    for _ in range(3):  # warm up both
        time_round(small, 100, [], pods)
        time_round(large, 100, [], pods)
    for _ in range(args.rounds):
        time_round(small, args.per_round, timings["50 nodes"], pods)
        time_round(large, args.per_round, timings["5,000 nodes"], pods)
    rows = {
        k: {"median_ms": statistics.median(v), "p99_ms": percentile(v, 0.99), "n": len(v)} for k, v in timings.items()
    }
    ratio = {m: rows["5,000 nodes"][m] / rows["50 nodes"][m] for m in ("median_ms", "p99_ms")}
    print(f"{'snapshot':<14}{'median ms':>12}{'p99 ms':>10}{'decisions':>11}")
    for name, r in rows.items():
        print(f"{name:<14}{r['median_ms']:>12.4f}{r['p99_ms']:>10.4f}{r['n']:>11,}")
    print(f"{'ratio':<14}{ratio['median_ms']:>11.2f}x{ratio['p99_ms']:>9.2f}x")
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    name = "decision-partitioned.json" if args.partitioned else "decision.json"
    (out / name).write_text(json.dumps({"partitioned": args.partitioned, "rows": rows, "ratio": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
