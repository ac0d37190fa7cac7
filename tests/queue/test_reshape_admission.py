"""From admission to release, on the API simulator with its mig-manager stand-in: three A100-80GB nodes
cut all-1g.10gb (one busy, one idle, one not opted in), and four Pods that need 35 GiB of MIG memory.
Admission queues the four for a re-cut, with the resource it will offer; the leader re-cuts the idle
opted-in node and releases them into it. A namespace that places at admission is refused, told the layout."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import jsonpatch
import pytest

from tests.builders import eventually, policy
from tests.mig.configs import OPERATOR_DEFAULT
from tests.queue.migfleet import POLICY, big, fleet_sim, start, sync
from tests.testing.kubeclient import kube_client
from webhook.admission.core import evaluate
from webhook.pools.index import PoolIndex
from webhook.testing import KubeSim

pytestmark = pytest.mark.slow

POOL_3G = "nvidia/high/NVIDIA-A100-SXM4-80GB-MIG-3g.40gb/nvidia.com/mig-3g.40gb"


@pytest.fixture
def sim() -> Iterator[KubeSim]:
    with fleet_sim() as running_sim:
        yield running_sim


def admission_index(sim: KubeSim) -> PoolIndex:
    """A replica's view: nodes, Pods and mig-parted's ConfigMap as its watches show them."""
    pol = policy(POLICY)
    index = PoolIndex(pol)
    sync(sim, index, pol)
    index.see_mig_config(sim.get("ConfigMap", "gpu-operator", "default-mig-parted-config"))
    return index


def test_four_35gi_pods_are_queued_at_admission_and_released_into_the_node_the_leader_re_cuts(
    sim: KubeSim, tmp_path: Path
) -> None:
    mig = sim.mig_manager(OPERATOR_DEFAULT, delay=0.5)
    index = admission_index(sim)
    for k in range(4):
        obj = big(f"big-{k}")
        result = evaluate(obj, "q", index.policy, index)
        assert result.allowed and result.queued == "nvidia.com/mig-3g.40gb", result.message
        assert "waits for a MIG re-cut to all-3g.40gb" in result.warnings[0]
        stored = jsonpatch.apply_patch(obj, list(result.patch))
        stored["metadata"].update(uid=f"uid-big-{k}", creationTimestamp=f"2026-12-01T10:00:0{k}Z")
        sim.add(stored)
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client)
        leader.pass_()
        leader.clock.now += 61
        leader.pass_()
        assert leader.reshaper.waits_for == {f"q/big-{k}": "gpu-idle" for k in range(4)}

        def released() -> bool:
            leader.pass_()
            return all(leader.released(f"big-{k}") for k in range(4))

        eventually(released, what="the four Pods released into the re-cut node")
    assert mig.violations == [] and mig.history == [("gpu-idle", "all-3g.40gb", "success")]
    for untouched in ("gpu-busy", "gpu-out"):
        assert leader.labels(untouched)["nvidia.com/mig.config"] == "all-1g.10gb"
    for obj in sim.objects("Pod", "q"):
        assert obj["metadata"]["annotations"]["gpupool.io/pool"] == POOL_3G
        assert obj["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "1"}


def test_a_namespace_that_places_at_admission_is_refused_with_the_layout_named(sim: KubeSim) -> None:
    index = admission_index(sim)
    result = evaluate(big("now-0", "now"), "now", index.policy, index)
    assert not result.allowed
    assert "A MIG re-cut would serve it: node gpu-idle re-cut to all-3g.40gb (a 3g.40gb)" in result.message
