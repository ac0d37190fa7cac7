"""Nodes the queue's leader keeps from new Pods (`PoolIndex.exclude_nodes`): no release counts their room,
and every release into their pool carries `kubernetes.io/hostname NotIn [...]` in every node-affinity
term, so kube-scheduler (the simulator's filters, written from its rules) never binds a released Pod
there; kube-apiserver's patch engine and validation take the release as it is."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.admission.demo import apply, kubectl_patch, validate_pod
from tests.builders import gpu_node
from tests.queue.helpers import GPU_TOLERATION, T4, busy, enqueue, queued_pod, setup
from webhook.queue.release import plan
from webhook.testing.kubefit import why_unfit
from webhook.testing.kubevalidate import validate_pod_update


def _kubelet_node(name: str) -> dict[str, Any]:
    """A 4-GPU T4 node with the Pod capacity the kubelet reports (the scheduler's filters count Pods)."""
    node = gpu_node(name, "Tesla-T4", 4)
    node["status"]["allocatable"]["pods"] = "110"
    return node


NODES = [_kubelet_node("t4-0"), _kubelet_node("t4-1"), _kubelet_node("t4-2")]
ZONE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["t4-0", "t4-1"]}]},
                {"matchExpressions": [{"key": "gpu.accelerator/class", "operator": "Exists"}]},
            ]
        }
    }
}


def released(objects: list[dict[str, Any]], excluded: set[str], **kw: Any) -> tuple[dict[str, Any], list[Any]]:
    """One 1-GPU Pod queued in `q` and a pass with `excluded` kept from new Pods: the stored Pod and the
    pass's releases."""
    index, waiting = setup(objects)
    index.exclude_nodes("test", excluded)
    stored = queued_pod("p", "q", index.policy, index, tolerations=[GPU_TOLERATION], **kw)
    enqueue([stored], index, waiting)
    return stored, plan(waiting.ordered(), index, index.policy).releases


@pytest.mark.parametrize("affinity", [None, ZONE_AFFINITY], ids=["no-affinity", "two-terms"])
def test_the_simulated_scheduler_never_binds_a_released_pod_on_an_excluded_node(
    affinity: dict[str, Any] | None, tmp_path: Path
) -> None:
    """t4-0 is excluded: the Pod is released to the T4 pool, and the patched Pod (by kubectl's patch
    engine, kube-apiserver's) fits on t4-1 (and t4-2 where its own terms allow) but never on t4-0,
    whichever of its own terms reaches the node."""
    stored, releases = released(list(NODES), {"t4-0"}, affinity=affinity)
    assert [r.pool for r in releases] == [T4]
    after = kubectl_patch(stored, releases[0].patch, tmp_path)
    assert after == apply(stored, releases[0].patch)
    assert validate_pod_update(copy.deepcopy(after), stored) == []
    validate_pod(after)
    fits = {node["metadata"]["name"]: why_unfit(after, node) is None for node in NODES}
    assert fits == {"t4-0": False, "t4-1": True, "t4-2": True}


def test_an_excluded_node_with_the_only_room_releases_nothing() -> None:
    """t4-1 and t4-2 are full and t4-0, the only one with room, is excluded: the Pod waits for room rather
    than being released to a pool where no node it may use has any."""
    full = [busy("t4-1", 4), busy("t4-2", 4)]
    _, releases = released([*NODES, *full], {"t4-0"})
    assert releases == []


def test_without_exclusions_a_release_names_no_node() -> None:
    """No exclusion: the release says nothing of hostnames, as before."""
    stored, releases = released(list(NODES), set())
    assert "kubernetes.io/hostname" not in str(apply(stored, releases[0].patch)["spec"])


def test_an_excluded_node_counts_no_free_gpus_but_only_its_pods_as_allocated() -> None:
    """The pool's figures (GPUPool status, `gpupool inventory`) while t4-0 is kept from new Pods: its 3 idle
    GPUs are not free for new Pods, and not counted as allocated either; only its Pod's one is."""
    index, _ = setup([*NODES, busy("t4-0", 1)])
    index.exclude_nodes("test", {"t4-0"})
    (stats,) = [s for s in index.capacity.pool_stats() if s.pool == T4]
    assert (stats.gpus_total, stats.gpus_allocated, stats.gpus_free) == (12, 1, 8)
