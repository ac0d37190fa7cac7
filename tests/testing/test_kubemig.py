"""The mig-manager stand-in: a node's `nvidia.com/mig.config` label changes, and it is re-cut as NVIDIA's
mig-manager would: pending, the operator's components paused, GFD's labels rewritten, success."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest

from tests.builders import eventually
from tests.mig.configs import A100_80, OPERATOR_DEFAULT
from webhook.testing import KubeSim
from webhook.testing.kubemig import PAUSED, MigManager

pytestmark = pytest.mark.empty_cluster


def a100(name: str, gpus: int = 2, strategy: str = "mixed") -> dict[str, Any]:
    """An A100-80GB node cut all-1g.10gb, labelled as GFD and the GPU Operator label it."""
    labels = {
        "kubernetes.io/hostname": name,
        "nvidia.com/gpu.product": A100_80,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": strategy,
        "nvidia.com/mig.config": "all-1g.10gb",
        "nvidia.com/mig.config.state": "success",
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
        "nvidia.com/gpu.deploy.dcgm": "false",
    }
    if strategy == "mixed":
        allocatable = {"nvidia.com/mig-1g.10gb": str(7 * gpus), "nvidia.com/gpu": "0"}
        labels.update(
            {
                "nvidia.com/mig-1g.10gb.count": str(7 * gpus),
                "nvidia.com/mig-1g.10gb.memory": "9728",
                "nvidia.com/mig-1g.10gb.product": f"{A100_80}-MIG-1g.10gb",
            }
        )
    else:
        allocatable = {"nvidia.com/gpu": str(7 * gpus)}
        labels.update({"nvidia.com/gpu.product": f"{A100_80}-MIG-1g.10gb", "nvidia.com/gpu.count": str(7 * gpus)})
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", **allocatable},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gpu_pod(name: str, node: str = "", resource: str = "nvidia.com/mig-1g.10gb") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x", "resources": {"limits": {resource: "1"}}}]}
    if node:
        spec["nodeName"] = node
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def relabel(sim: KubeSim, name: str, layout: str) -> None:
    node = sim.get("Node", None, name)
    assert node is not None
    node["metadata"]["labels"]["nvidia.com/mig.config"] = layout
    sim.modify(node)


def labels(sim: KubeSim, name: str) -> dict[str, str]:
    return sim.get("Node", None, name)["metadata"]["labels"]  # type: ignore[index, no-any-return]


def allocatable(sim: KubeSim, name: str) -> dict[str, str]:
    return sim.get("Node", None, name)["status"]["allocatable"]  # type: ignore[index, no-any-return]


def manager(sim: KubeSim, **kw: Any) -> MigManager:
    return MigManager(sim._store, OPERATOR_DEFAULT, **kw)


def test_a_change_goes_pending_pauses_the_operators_components_then_relabels_and_succeeds(sim: KubeSim) -> None:
    sim.add(a100("gpu-1"))
    mig = manager(sim, delay=120.0)
    mig.step(0.0)
    assert labels(sim, "gpu-1")["nvidia.com/mig.config.state"] == "success"  # nothing asked yet
    relabel(sim, "gpu-1", "all-3g.40gb")
    mig.step(1.0)
    now = labels(sim, "gpu-1")
    assert now["nvidia.com/mig.config.state"] == "pending"
    assert now["nvidia.com/gpu.deploy.device-plugin"] == PAUSED
    assert now["nvidia.com/gpu.deploy.gpu-feature-discovery"] == PAUSED
    assert now["nvidia.com/gpu.deploy.dcgm"] == "false"  # an operator component switched off stays off
    assert allocatable(sim, "gpu-1")["nvidia.com/mig-1g.10gb"] == "0"  # the device plugin is gone
    mig.step(100.0)
    assert labels(sim, "gpu-1")["nvidia.com/mig.config.state"] == "pending"
    mig.step(121.0)
    done, free = labels(sim, "gpu-1"), allocatable(sim, "gpu-1")
    assert done["nvidia.com/mig.config.state"] == "success"
    assert done["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert (done["nvidia.com/mig-3g.40gb.count"], done["nvidia.com/mig-3g.40gb.memory"]) == ("4", "40192")
    assert done["nvidia.com/mig-3g.40gb.product"] == f"{A100_80}-MIG-3g.40gb"
    assert not any(k.startswith("nvidia.com/mig-1g.10gb") for k in done)
    assert free["nvidia.com/mig-3g.40gb"] == "4" and "nvidia.com/mig-1g.10gb" not in free
    assert mig.history == [("gpu-1", "all-3g.40gb", "success")] and mig.violations == []


def test_the_single_strategy_is_relabelled_as_gfd_does(sim: KubeSim) -> None:
    sim.add(a100("gpu-1", gpus=8, strategy="single"))
    mig = manager(sim, delay=1.0)
    relabel(sim, "gpu-1", "all-7g.80gb")
    mig.step(0.0)
    mig.step(2.0)
    done = labels(sim, "gpu-1")
    assert (done["nvidia.com/gpu.product"], done["nvidia.com/gpu.count"]) == (f"{A100_80}-MIG-7g.80gb", "8")
    assert done["nvidia.com/gpu.memory"] == "80896" and allocatable(sim, "gpu-1")["nvidia.com/gpu"] == "8"
    relabel(sim, "gpu-1", "all-balanced")  # several profiles: GFD's single strategy calls it invalid
    mig.step(3.0)
    mig.step(5.0)
    assert labels(sim, "gpu-1")["nvidia.com/gpu.product"] == f"{A100_80}-MIG-INVALID"


def test_an_unknown_name_or_a_layout_the_gpus_cannot_take_fails_at_once(sim: KubeSim) -> None:
    sim.add(a100("gpu-1"))
    mig = manager(sim)
    relabel(sim, "gpu-1", "all-3g.20gb")  # an A100-40GB's profile
    mig.step(0.0)
    assert labels(sim, "gpu-1")["nvidia.com/mig.config.state"] == "failed"
    assert allocatable(sim, "gpu-1")["nvidia.com/mig-1g.10gb"] == "14"  # untouched
    relabel(sim, "gpu-1", "no-such-layout")
    mig.step(1.0)
    assert mig.history == [("gpu-1", "all-3g.20gb", "failed"), ("gpu-1", "no-such-layout", "failed")]


def test_a_layout_already_in_place_succeeds_without_pending(sim: KubeSim) -> None:
    node = a100("gpu-1")
    node["metadata"]["labels"]["nvidia.com/mig.config"] = "custom"
    sim.add(node)
    mig = manager(sim)
    relabel(sim, "gpu-1", "all-1g.10gb")
    before = int(sim.resource_version)
    mig.step(0.0)
    assert labels(sim, "gpu-1")["nvidia.com/mig.config.state"] == "success"
    assert int(sim.resource_version) == before + 1  # one write: no pending, no pause


def test_the_knobs_fail_a_change_or_keep_it_pending_forever(sim: KubeSim) -> None:
    sim.add(a100("bad"))
    sim.add(a100("stuck"))
    mig = manager(sim, delay=1.0, fail={"bad"}, stuck={"stuck"})
    relabel(sim, "bad", "all-3g.40gb")
    relabel(sim, "stuck", "all-3g.40gb")
    mig.step(0.0)
    mig.step(10_000.0)
    assert labels(sim, "bad")["nvidia.com/mig.config.state"] == "failed"
    assert labels(sim, "bad")["nvidia.com/gpu.deploy.device-plugin"] == "true"  # restored
    assert allocatable(sim, "bad")["nvidia.com/mig-1g.10gb"] == "14"  # the old layout stays
    assert labels(sim, "stuck")["nvidia.com/mig.config.state"] == "pending"
    assert mig.changing() == {"stuck"}


def test_a_pod_on_the_gpus_while_the_layout_changes_is_a_violation_and_fails_the_change(sim: KubeSim) -> None:
    sim.add(a100("gpu-1"))
    sim.add(a100("gpu-2"))
    sim.add(gpu_pod("elsewhere", "gpu-2"))
    sim.add(gpu_pod("cpu-only", "gpu-1", resource="cpu"))
    mig = manager(sim, delay=5.0)
    relabel(sim, "gpu-1", "all-3g.40gb")
    mig.step(0.0)
    sim.add(gpu_pod("lands", "gpu-1", resource="nvidia.com/mig-3g.40gb"))
    mig.step(1.0)
    mig.step(2.0)  # recorded once
    assert mig.violations == [{"node": "gpu-1", "pod": "team-a/lands", "phase": "Running", "layout": "all-3g.40gb"}]
    mig.step(6.0)
    assert labels(sim, "gpu-1")["nvidia.com/mig.config.state"] == "failed"  # mig-parted fails on GPUs in use


def test_it_runs_against_the_real_client_and_the_scheduler_stand_in(
    sim: KubeSim, api: kubernetes.client.CoreV1Api
) -> None:
    """Through the API, as gpupool's leader will: a strategic-merge PATCH of the label; the scheduler
    binds a Pod asking for the new profile only once the node offers it, so no violation."""
    sim.add(a100("gpu-1"))
    mig = sim.mig_manager(OPERATOR_DEFAULT, delay=0.5)
    scheduler = sim.scheduler()
    api.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/mig.config": "all-3g.40gb"}}})
    sim.add(gpu_pod("wants-3g", resource="nvidia.com/mig-3g.40gb"))
    eventually(lambda: labels(sim, "gpu-1")["nvidia.com/mig.config.state"] == "success", what="re-cut")
    eventually(lambda: sim.get("Pod", "team-a", "wants-3g")["spec"].get("nodeName") == "gpu-1", what="bind")  # type: ignore[index]
    assert mig.violations == [] and mig.errors == [] and scheduler.errors == []
