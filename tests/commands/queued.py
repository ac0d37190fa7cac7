"""A cluster with Pods waiting in gpupool's queue, for the commands that show it (`queue`, `explain`): as a
snapshot file and as objects to load into the API simulator."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from tests.builders import gpu_node, index_of, pod, policy
from tests.queue.helpers import GPU_TOLERATION, queued_pod

POLICY = """\
defaults: {placement: now}
namespaces:
  q: {placement: queue}
  q2: {placement: queue}
  q3: {placement: queue, classQuota: {high: 1}}
  now: {placement: now}
"""
T4 = "nvidia/medium/Tesla-T4"
L4 = "nvidia/medium/NVIDIA-L4"
A100 = "nvidia/high/NVIDIA-A100-SXM4-40GB"
# How long ago each queued Pod was created, and the age kubectl writes for it (robust to a test that
# takes under a minute).
AGES = {
    "big": (timedelta(hours=3, minutes=10, seconds=20), "3h10m"),
    "over": (timedelta(days=8, hours=2), "8d"),
    "hi": (timedelta(hours=49, seconds=20), "2d1h"),
    "fits": (timedelta(minutes=70, seconds=20), "70m"),
    "behind": (timedelta(minutes=10, seconds=20), "10m"),
}


def cluster(now: datetime | None = None) -> list[dict[str, Any]]:
    """Every T4 busy, one L4 free, the A100s free; namespace q3 holds the one high GPU its classQuota
    allows. Queued, in release order: `big` (q, priority 10, 4 medium GPUs: no node has them),
    `over` (q3, high: over its class quota), `hi` (q2, high: fits now on the A100s), `fits` and `behind`
    (q, 1 medium GPU each: `fits` takes the free L4, which `big` cannot use now; `behind` finds none left)."""
    now = now or datetime.now(UTC)
    pol = policy(POLICY)
    nodes = [
        gpu_node("t4-a", "Tesla-T4", 4),
        gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034),
        gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 4, memory_mib=40960, gpu_class="high"),
    ]
    running = [
        pod("busy-t4", "other", gpus=4, node="t4-a", phase="Running", tolerations=[GPU_TOLERATION]),
        pod("busy-l4", "other", gpus=3, node="l4-a", phase="Running", tolerations=[GPU_TOLERATION]),
        pod("held", "q3", gpus=1, node="a100-a", phase="Running", tolerations=[GPU_TOLERATION]),
    ]
    index = index_of(nodes + running, pol)

    def created(name: str) -> str:
        return (now - AGES[name][0]).strftime("%Y-%m-%dT%H:%M:%SZ")

    medium, high = {"gpupool.io/gpu-class": "medium"}, {"gpupool.io/gpu-class": "high"}
    queued = [
        queued_pod("big", "q", pol, index, annotations={**medium, "gpupool.io/gpu-count": "4"}, priority=10,
                   created=created("big")),
        queued_pod("over", "q3", pol, index, annotations=high, created=created("over")),
        queued_pod("hi", "q2", pol, index, annotations=high, created=created("hi")),
        queued_pod("fits", "q", pol, index, annotations=medium, created=created("fits")),
        queued_pod("behind", "q", pol, index, annotations=medium, created=created("behind")),
    ]  # fmt: skip
    return nodes + running + queued


def write_snapshot(directory: Path, objects: list[dict[str, Any]] | None = None) -> tuple[str, str]:
    """The snapshot (as `kubectl get nodes,pods,resourcequotas -A -o yaml` writes one) and the policy
    file, in `directory`."""
    snapshot, policy_file = directory / "cluster.yaml", directory / "policy.yaml"
    items = cluster() if objects is None else objects
    snapshot.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    policy_file.write_text(POLICY)
    return str(snapshot), str(policy_file)
