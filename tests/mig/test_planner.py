"""The planner's rules, one example each: what it re-cuts, for whom, and what it never touches."""

from __future__ import annotations

from dataclasses import replace

from tests.mig.configs import A30, A100_40, H200, H200_NVL, operator_layouts
from tests.mig.planning import GI, NOW, SETTINGS, applied, finished, free_1g, node, pods, run
from webhook.domain.policy_model import MigReshaping
from webhook.mig.planner import Free, Waiting, plan


def test_the_issue_scenario_re_cuts_the_idle_opted_in_node_and_touches_nothing_else() -> None:
    fleet = [node("busy", busy=True), node("idle"), node("not-opted", opted_in=False)]
    free = [free_1g("idle"), free_1g("not-opted"), free_1g("busy", 3)]
    result = run(pods(4, 35), fleet, free)
    assert [(c.node, c.from_layout, c.to_layout, len(c.pods)) for c in result.changes] == [
        ("idle", "all-1g.10gb", "all-3g.40gb", 4)
    ]
    assert set(result.waits.values()) == {"idle"} and len(result.waits) == 4
    assert result.skipped["busy"] == "a Pod uses its GPUs, or was released to it"
    assert result.skipped["not-opted"] == "not opted in (gpupool.io/mig-reshape=true)"


def test_demand_the_free_instances_serve_is_never_planned_for() -> None:
    result = run(pods(6, 8), [node("a"), node("b")], [free_1g("a", 4), free_1g("b", 4)])
    assert result.changes == () and len(result.served_by_free) == 6
    # ... and a node whose free instances a waiting Pod takes is not re-cut for the others.
    result = run(pods(1, 8) + pods(2, 35, prefix="big"), [node("a")], [free_1g("a", 1)])
    assert result.changes == () and result.skipped["a"] == "a waiting Pod takes its free instances"


def test_failed_and_pending_nodes_are_left_alone_until_cleared() -> None:
    fleet = [node("failed", state="failed"), node("pending", state="pending"), node("rebooting", state="rebooting")]
    result = run(pods(2, 35), fleet)
    assert result.changes == ()
    assert result.skipped["failed"] == "nvidia.com/mig.config.state=failed: an admin must clear it"
    assert result.skipped["pending"] == "nvidia.com/mig.config.state=pending"
    cleared = [replace(fleet[0], state="success"), *fleet[1:]]
    assert [c.node for c in run(pods(2, 35), cleared).changes] == ["failed"]


def test_a_node_must_have_been_idle_for_idle_seconds() -> None:
    result = run(pods(2, 35), [node("a", idle_since=NOW - 30)])
    assert result.changes == () and result.skipped["a"].startswith("idle for 30s, less than idleSeconds 60;")
    assert [c.node for c in run(pods(2, 35), [node("a", idle_since=NOW - 60)]).changes] == ["a"]


def test_no_flapping_when_demand_swings() -> None:
    """3g demand re-cuts one node; while that change is under way and for idleSeconds after it, a swing
    to 7g demand does not re-cut it again, and the in-flight bound holds the rest."""
    settings = MigReshaping(idle_seconds=60.0, max_in_flight=1)
    fleet = [node("a"), node("b")]
    first = run(pods(4, 35), fleet, settings=settings)
    assert [(c.node, c.to_layout) for c in first.changes] == [("a", "all-3g.40gb")]
    fleet = applied(fleet, first, NOW)
    swing = pods(2, 70, prefix="big")
    # Under way: the bound of one in flight is taken, nothing else changes, the 3g Pods wait for "a".
    during = run(pods(4, 35) + swing, fleet, now=NOW + 10, settings=settings)
    assert during.changes == () and during.waits == {f"team-a/p{i}": "a" for i in range(4)}
    assert during.skipped["b"] == "1 changes are under way already (maxInFlight)"
    # Done, the 3g Pods gone, only 7g demand: "b" is re-cut, "a" is not (changed 20 s ago).
    fleet = finished(fleet, "a", NOW + 20)
    after = run(swing, fleet, now=NOW + 30, settings=settings)
    assert [(c.node, c.to_layout) for c in after.changes] == [("b", "all-7g.80gb")]
    assert after.skipped["a"].startswith("idle for 10s")
    fleet = finished(applied(fleet, after, NOW + 30), "b", NOW + 40)
    # 3g demand again: "a"'s layout serves it as free instances; nothing is re-cut.
    free = [Free("a", "A100-80GB", "3g.40gb", 40192, 4)]
    later = run(pods(4, 35, prefix="more"), fleet, free, now=NOW + 85, settings=settings)
    assert later.changes == () and len(later.served_by_free) == 4


def test_a_change_gpupool_made_recently_is_not_made_again() -> None:
    result = run(pods(4, 35), [node("a", changed_at=NOW - 30)])
    assert result.changes == () and result.skipped["a"] == "gpupool changed it 30s ago, less than idleSeconds 60"


def test_a_change_under_way_serves_the_burst_it_was_made_for() -> None:
    fleet = applied([node("a"), node("b")], run(pods(4, 35), [node("a"), node("b")]), NOW)
    again = run(pods(4, 35), fleet, now=NOW + 5)  # the 2 x 2 x 3g.40gb of "a" take all four
    assert again.changes == () and set(again.waits.values()) == {"a"}
    more = run(pods(6, 35), fleet, now=NOW + 5)
    assert [(c.node, c.pods) for c in more.changes] == [("b", ("team-a/p4", "team-a/p5"))]
    assert more.waits["team-a/p0"] == "a" and more.waits["team-a/p5"] == "b"


def test_at_most_max_in_flight_changes_at_once() -> None:
    result = run(pods(10, 70), [node(n) for n in "abcde"])
    assert [c.node for c in result.changes] == ["a", "b"]  # 2 nodes x 2 x 7g: 4 of the 10 Pods
    assert len(result.waits) == 4
    assert result.skipped["c"] == "2 changes are under way already (maxInFlight)"


def test_the_fewest_nodes_that_serve_the_most_memory() -> None:
    # One 8-GPU node cut all-3g.40gb holds all twelve; smaller nodes would need three changes.
    fleet = [node("small-1", gpus=2), node("small-2", gpus=2), node("big", gpus=8)]
    result = run(pods(12, 35), fleet, settings=MigReshaping(max_in_flight=3))
    assert [(c.node, c.to_layout, len(c.pods)) for c in result.changes] == [("big", "all-3g.40gb", 12)]
    # Mixed demand: all-balanced serves a 1g, a 2g and a 3g Pod per GPU on one node.
    mixed = [Waiting("t/one", 8 * GI), Waiting("t/two", 18 * GI), Waiting("t/three", 35 * GI)]
    result = run(mixed, [node("a", gpus=1, layout="all-7g.80gb")])
    assert [(c.to_layout, c.yields) for c in result.changes] == [
        ("all-balanced", "2 x 1g.10gb, 1 x 2g.20gb, 1 x 3g.40gb")
    ]


def test_several_gpu_models_each_get_their_own_layout() -> None:
    fleet = [node("a100-40", A100_40, 1, layout="all-1g.5gb"), node("a30", A30, 1, layout="all-1g.6gb")]
    result = run(
        [Waiting("t/a", 30 * GI, models=frozenset({"A100-40GB"})), Waiting("t/b", 20 * GI, models=frozenset({"A30"}))],
        fleet,
    )
    chosen = {c.node: (c.to_layout, c.pods) for c in result.changes}
    assert chosen["a100-40"] == ("all-7g.40gb", ("t/a",))  # 3g.20gb is 19.5 GiB: too small for 30Gi
    assert chosen["a30"] == ("all-4g.24gb", ("t/b",))


def test_device_filters_decide_what_a_name_yields_per_model() -> None:
    # all-1g.35gb's filter names the H200 (0x2335) but not the H200 NVL (0x233B).
    fleet = [node("nvl", H200_NVL, 1, layout="all-7g.141gb"), node("h200", H200, 1, layout="all-7g.141gb")]
    result = plan(pods(4, 30), [], fleet, layouts=operator_layouts("all-1g.35gb"), settings=SETTINGS, now=NOW)
    assert [(c.node, c.to_layout, c.yields) for c in result.changes] == [("h200", "all-1g.35gb", "4 x 1g.35gb")]
    assert result.skipped["nvl"] == "no layout gpupool may choose applies to its GPUs"


def test_a_pods_own_constraints_decide_which_nodes_serve_it() -> None:
    fleet = [node("a"), node("b")]
    result = run([Waiting("t/only-b", 35 * GI, nodes=frozenset({"b"}))], fleet)
    assert [(c.node, c.pods) for c in result.changes] == [("b", ("t/only-b",))]


def test_a_node_gpupool_knows_no_geometry_of_is_skipped() -> None:
    result = run(pods(1, 35), [node("t4", "Tesla-T4", 1)])
    assert result.changes == () and result.skipped["t4"] == "gpupool knows no MIG geometry of its GPU model"
