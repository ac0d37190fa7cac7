"""The leader's MIG re-cuts (webhook.queue.reshape), through the real API client on the simulator with
its mig-manager stand-in: three A100-80GB nodes cut all-1g.10gb, one busy, one idle, one not opted in,
and four Pods queued for 35 GiB MIG instances. The leader re-cuts only the idle opted-in node, releases
nothing there while its layout changes, and releases the four Pods once the new instances show; a
failed or stuck change is left alone and told; a conflict is planned again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.builders import eventually
from tests.mig.configs import OPERATOR_DEFAULT
from tests.queue.migfleet import small, start, sync, waiting_fleet
from tests.testing.kubeclient import kube_client
from webhook.pools.nodes import NodeFacts
from webhook.queue.waiting import PODS
from webhook.testing import KubeSim

pytestmark = pytest.mark.slow

ASKED = "gpupool.io/mig-reshape-asked"
OUTCOME = "gpupool.io/mig-reshape-outcome"


@pytest.fixture
def sim() -> Iterator[KubeSim]:
    with waiting_fleet(4) as running_sim:
        yield running_sim


def test_the_idle_opted_in_node_is_re_cut_and_the_four_pods_are_released_into_it(sim: KubeSim, tmp_path: Path) -> None:
    """The leader waits idleSeconds, then asks mig-manager for all-3g.40gb on gpu-idle alone (four 3g.40gb
    for four 35 GiB Pods); nothing is released while the layout changes; once GFD shows the new layout
    the outcome is written, the node told, and all four Pods released; gpu-busy and gpu-out untouched."""
    mig = sim.mig_manager(OPERATOR_DEFAULT, delay=0.5)
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client)
        leader.pass_()
        assert leader.labels("gpu-idle")["nvidia.com/mig.config"] == "all-1g.10gb"  # idle for 0 s, not 60
        leader.clock.now += 61
        leader.pass_()
        assert leader.labels("gpu-idle")["nvidia.com/mig.config"] == "all-3g.40gb"
        assert leader.annotations("gpu-idle")[ASKED].startswith("all-3g.40gb@")
        assert leader.reshaper.waits_for == {f"q/big-{k}": "gpu-idle" for k in range(4)}
        assert "WaitsForMigReshape" in leader.reasons("big-0") and "MigReshaping" in leader.reasons("gpu-idle")

        def done() -> bool:
            leader.pass_()
            return all(leader.released(f"big-{k}") for k in range(4))

        eventually(done, what="the four Pods released into the re-cut node")
    assert leader.annotations("gpu-idle")[OUTCOME].startswith("done@")
    assert "MigReshaped" in leader.reasons("gpu-idle")
    assert leader.metrics.outcomes == ["asked", "done"]
    for untouched in ("gpu-busy", "gpu-out"):
        assert leader.labels(untouched)["nvidia.com/mig.config"] == "all-1g.10gb"
        assert ASKED not in leader.annotations(untouched)
    assert mig.violations == [] and mig.history == [("gpu-idle", "all-3g.40gb", "success")]
    pods = {o["metadata"]["name"]: o for o in sim.objects("Pod", "q")}
    assert {p["metadata"]["annotations"]["gpupool.io/pool"] for p in pods.values()} == {
        "nvidia/medium/NVIDIA-A100-SXM4-80GB-MIG-3g.40gb/nvidia.com/mig-3g.40gb"
    } or all("3g.40gb" in p["metadata"]["annotations"]["gpupool.io/pool"] for p in pods.values())


def test_nothing_is_released_to_a_node_while_its_change_is_under_way(sim: KubeSim, tmp_path: Path) -> None:
    """Between the label's write and GFD's new labels, the index counts the re-cut node as not usable:
    its old instances are not counted as room (mig-manager here has not acted on the label yet, so the node
    still offers them: only gpupool's own record of the change keeps Pods off it)."""
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client)
        leader.clock.now += 61
        leader.pass_()
        assert leader.labels("gpu-idle")["nvidia.com/mig.config"] == "all-3g.40gb"
        sim.add(small())
        leader.pass_()
    # gpu-busy and gpu-out have free 1g.10gb: small goes to the pool, but the index counts no room on gpu-idle
    with leader.runner.inventory.read() as index:
        node = index.capacity.node("gpu-idle")
        assert node is not None
        facts = index.capacity.node_facts("gpu-idle", "nvidia.com/mig-1g.10gb")
        assert isinstance(facts, NodeFacts) and facts.allocatable == 14
        assert not facts.usable and index.capacity.node_free(facts) == 0


def test_a_failed_change_is_left_alone_told_and_counted(sim: KubeSim, tmp_path: Path) -> None:
    """mig-manager ends `failed`: the outcome is written, a Warning Event goes to the node and to each
    Pod that waited for it, the metric counts it, and the node is never asked again."""
    sim.mig_manager(OPERATOR_DEFAULT, delay=0.2, fail=["gpu-idle"])
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client)
        leader.clock.now += 61
        leader.pass_()
        eventually(lambda: leader.labels("gpu-idle").get("nvidia.com/mig.config.state") == "failed", what="failed")
        leader.pass_()
        assert leader.annotations("gpu-idle")[OUTCOME].startswith("failed@")
        warnings = [e for e in leader.events.recorded if e.reason == "MigReshapeFailed"]
        assert {e.pod for e in warnings} == {"gpu-idle", "big-0", "big-1", "big-2", "big-3"}
        assert all(e.kind == "Warning" for e in warnings)
        leader.clock.now += 3600
        leader.pass_()
    assert leader.metrics.outcomes == ["asked", "failed"]
    assert leader.labels("gpu-out")["nvidia.com/mig.config"] == "all-1g.10gb"


def test_a_change_still_pending_after_timeout_seconds_is_given_up_on(sim: KubeSim, tmp_path: Path) -> None:
    """`pending` forever (older mig-manager releases): after timeoutSeconds the change is counted stuck,
    told, and the node is not asked again."""
    sim.mig_manager(OPERATOR_DEFAULT, delay=0.2, stuck=["gpu-idle"])
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client)
        leader.clock.now += 61
        leader.pass_()
        eventually(lambda: leader.labels("gpu-idle").get("nvidia.com/mig.config.state") == "pending", what="pending")
        leader.clock.now += 299
        leader.pass_()
        assert OUTCOME not in leader.annotations("gpu-idle")
        leader.clock.now += 2
        leader.pass_()
        assert leader.annotations("gpu-idle")[OUTCOME].startswith("stuck@")
        leader.clock.now += 3600
        leader.pass_()
    assert leader.metrics.outcomes == ["asked", "stuck"]


def test_a_node_changed_before_the_write_is_not_labelled_and_is_planned_again(sim: KubeSim, tmp_path: Path) -> None:
    """The node's label changes between the plan and the write (an admin): the write is not made, the
    fence is undone, the metric counts a conflict."""
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client)
        leader.clock.now += 61
        sync(sim, leader.index, leader.policy)
        node = sim.get("Node", None, "gpu-idle")
        assert node is not None
        node["metadata"]["labels"]["nvidia.com/mig.config"] = "all-7g.80gb"  # not yet shown to the leader
        sim.modify(node)
        for obj in sim.objects("Pod"):
            leader.waiting.apply(PODS, "MODIFIED", obj)
        leader.runner.run_pass()
    assert leader.labels("gpu-idle")["nvidia.com/mig.config"] == "all-7g.80gb"
    assert ASKED not in leader.annotations("gpu-idle")
    assert leader.metrics.outcomes == ["conflict"]
    with leader.runner.inventory.read() as index:
        current = index.capacity.node("gpu-idle")
        assert current is not None and ASKED not in current.annotations


def test_without_mig_reshaping_in_the_policy_no_node_is_touched(sim: KubeSim, tmp_path: Path) -> None:
    """The policy has no `migReshaping`: however long the Pods wait, no node is read or written."""
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client, "namespaces:\n  q: {placement: queue}\n")
        leader.clock.now += 3600
        leader.pass_()
        leader.pass_()
    assert all(ASKED not in leader.annotations(n) for n in ("gpu-busy", "gpu-idle", "gpu-out"))
    assert leader.metrics.outcomes == [] and sim.write_requests("patch", "nodes") == 0


def test_a_change_that_took_longer_than_idle_seconds_is_not_re_cut_again_when_it_ends(
    sim: KubeSim, tmp_path: Path
) -> None:
    """mig-manager takes minutes, more than idleSeconds: the step that sees the change done (its outcome
    not written yet, so its instances not yet counted free) does not re-cut the node for the Pods that
    waited for it; the next pass releases them there."""
    mig = sim.mig_manager(OPERATOR_DEFAULT, delay=0.2)
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client)
        leader.clock.now += 61
        leader.pass_()
        eventually(lambda: mig.history == [("gpu-idle", "all-3g.40gb", "success")], what="the change done")
        eventually(lambda: "nvidia.com/mig-3g.40gb.count" in leader.labels("gpu-idle"), what="GFD's new labels")
        leader.clock.now += 180  # the change took three minutes
        leader.pass_()
        leader.pass_()
        assert leader.labels("gpu-idle")["nvidia.com/mig.config"] == "all-3g.40gb"
        assert all(leader.released(f"big-{k}") for k in range(4))
    assert leader.metrics.outcomes == ["asked", "done"]


def test_demand_that_arrives_between_two_plans_keeps_the_leader_passing_until_it_is_planned(
    sim: KubeSim, tmp_path: Path
) -> None:
    """The planner runs at most every PLAN_SECONDS; Pods that come to wait in a pass it skips keep the
    passes going (the runner's loop stops passing over an unchanged index once nothing is active)."""
    waiting = [sim.delete("Pod", "q", f"big-{k}") for k in range(4)]
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client, plan_seconds=2.0)
        leader.pass_()
        assert not leader.reshaper.active  # nothing waits
        for obj in waiting:
            sim.add(obj)
        leader.clock.now += 1  # within PLAN_SECONDS of the last plan
        leader.pass_()
        assert leader.reshaper.active


def test_a_change_stuck_while_the_state_says_success_is_not_asked_again_until_an_admin_relabels(
    sim: KubeSim, tmp_path: Path
) -> None:
    """mig-manager never acts on the label (not running on the node): the state stays `success`, the
    change is written stuck after timeoutSeconds. Asking again would time out again (mig-manager acts only
    on a change of the value), so the node is left alone however long the Pods wait; once an admin labels
    another layout, it is a candidate again and the leader re-cuts it."""
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client)
        leader.clock.now += 61
        leader.pass_()
        asked = leader.annotations("gpu-idle")[ASKED]
        leader.clock.now += 301
        leader.pass_()
        assert leader.annotations("gpu-idle")[OUTCOME].startswith("stuck@")
        for _ in range(3):
            leader.clock.now += 3600
            leader.pass_()
        assert leader.metrics.outcomes == ["asked", "stuck"]
        assert leader.annotations("gpu-idle")[ASKED] == asked
        assert "gpu-idle" not in leader.reshaper.waits_for.values()
        node = sim.get("Node", None, "gpu-idle")
        assert node is not None
        node["metadata"]["labels"]["nvidia.com/mig.config"] = "all-1g.10gb"  # the admin, after fixing the cause
        sim.modify(node)
        leader.clock.now += 61
        leader.pass_()
    assert leader.metrics.outcomes == ["asked", "stuck", "asked"]
    assert leader.labels("gpu-idle")["nvidia.com/mig.config"] == "all-3g.40gb"
    assert OUTCOME not in leader.annotations("gpu-idle")


def test_a_change_written_stuck_that_the_node_shows_done_later_is_done(sim: KubeSim, tmp_path: Path) -> None:
    """mig-manager and GFD finish after timeoutSeconds: the change was written stuck, and once the node
    shows the layout asked with `success` it is written done, told (MigReshaped) and counted done; the
    Pods are released into it and the node is not asked again."""
    mig = sim.mig_manager(OPERATOR_DEFAULT, delay=0.5)
    with kube_client(sim, tmp_path) as client:
        leader = start(sim, tmp_path, client)
        leader.clock.now += 61
        leader.pass_()
        leader.clock.now += 301  # before mig-manager acted: the leader's clock is not the stand-in's
        leader.pass_()
        assert leader.annotations("gpu-idle")[OUTCOME].startswith("stuck@")
        eventually(lambda: mig.history == [("gpu-idle", "all-3g.40gb", "success")], what="the change done")
        eventually(lambda: "nvidia.com/mig-3g.40gb.count" in leader.labels("gpu-idle"), what="GFD's new labels")
        leader.pass_()
        assert leader.annotations("gpu-idle")[OUTCOME].startswith("done@")
        assert "MigReshaped" in leader.reasons("gpu-idle")

        def released() -> bool:
            leader.pass_()
            return all(leader.released(f"big-{k}") for k in range(4))

        eventually(released, what="the four Pods released into the re-cut node")
        leader.clock.now += 3600
        leader.pass_()
    assert leader.metrics.outcomes == ["asked", "stuck", "done"]
    assert mig.history == [("gpu-idle", "all-3g.40gb", "success")] and mig.violations == []
