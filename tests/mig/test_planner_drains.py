"""Drain by not filling (the planner's step 4): a node that would be re-cut but for the Pods it runs, or
for not having been idle for idleSeconds, is drained for the Pods no change serves, within maxInFlight;
the leader keeps it from new Pods (webhook.queue.reshape), so it becomes idle and a later plan re-cuts it."""

from __future__ import annotations

from dataclasses import replace

from tests.mig.planning import NOW, SETTINGS, node, pods, run
from webhook.domain.policy import load_policy_text
from webhook.domain.policy_model import MigReshaping
from webhook.mig.planner import MAX_DRAINS


def test_a_busy_node_that_would_serve_the_waiting_pods_is_drained_for_them() -> None:
    """Two 35 GiB Pods wait, and the only opted-in node runs a Pod: it is not re-cut now, but drained
    for a layout that serves them, and the Pods wait for it."""
    result = run(pods(2, 35), [node("a", busy=True)])
    assert result.changes == ()
    assert list(result.draining) == ["a"]
    assert result.waits == {"team-a/p0": "a", "team-a/p1": "a"}
    assert "kept from new Pods until it is idle" in result.skipped["a"]


def test_nodes_not_opted_in_failed_or_changed_recently_are_never_drained() -> None:
    """Only what step 3 would re-cut once idle is drained: not a node that did not opt in, one whose state
    is failed, or one gpupool changed within idleSeconds."""
    fleet = [
        node("not-opted", busy=True, opted_in=False),
        node("failed", busy=True, state="failed"),
        node("recent", busy=True, changed_at=NOW - 10),
    ]
    assert run(pods(2, 35), fleet).draining == {}


def test_idle_nodes_are_re_cut_first_and_drains_fill_only_what_max_in_flight_leaves() -> None:
    """maxInFlight 2: an idle node is re-cut for the first Pods; of three busy ones, one is drained for the
    rest; the others are left to serve."""
    fleet = [node("idle"), node("b1", busy=True), node("b2", busy=True), node("b3", busy=True)]
    result = run(pods(8, 35), fleet, settings=MigReshaping(idle_seconds=60.0, max_in_flight=2, drain=True))
    assert [c.node for c in result.changes] == ["idle"]
    assert list(result.draining) == ["b1"]


def test_a_drain_stays_on_the_node_drained_before() -> None:
    """Of equal busy nodes, the one drained at the last plan is drained again, not another by name."""
    fleet = [node("b1", busy=True), node("b2", busy=True, draining=True)]
    result = run(pods(2, 35), fleet, settings=replace(SETTINGS, max_in_flight=1))
    assert list(result.draining) == ["b2"]


def test_with_drain_off_only_idle_nodes_are_re_cut_and_none_is_drained() -> None:
    """`migReshaping.drain: false`: the busy node that would serve the Pods is left to serve, as before."""
    off = load_policy_text("migReshaping: {drain: false}").mig_reshaping
    assert off is not None
    assert run(pods(2, 35), [node("a", busy=True)], settings=off).draining == {}


def test_no_drain_for_pods_a_change_or_free_instances_serve() -> None:
    """Demand an idle node's re-cut serves whole drains nothing."""
    assert run(pods(2, 35), [node("idle"), node("b1", busy=True)]).draining == {}


def test_of_busy_nodes_alike_the_one_whose_pods_hold_the_fewest_devices_is_drained() -> None:
    """It goes idle soonest: b2, with one device in use, before b1 with five."""
    fleet = [node("b1", busy=True, in_use=5), node("b2", busy=True, in_use=1)]
    result = run(pods(2, 35), fleet, settings=replace(SETTINGS, max_in_flight=1))
    assert list(result.draining) == ["b2"]


def test_drains_are_bounded_whatever_max_in_flight_allows() -> None:
    """maxInFlight 1000 and forty busy nodes for plenty of Pods: at most MAX_DRAINS are drained, so the
    hostnames every release into their pool names stay few."""
    fleet = [node(f"b{i:02d}", busy=True) for i in range(40)]
    result = run(pods(400, 35), fleet, settings=MigReshaping(idle_seconds=60.0, max_in_flight=1000, drain=True))
    assert len(result.draining) == MAX_DRAINS
