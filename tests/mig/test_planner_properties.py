"""The planner's invariants over generated fleets and queues: it re-cuts only nodes it may, within the
bounds, only for Pods nothing else serves, each change really serving them, and not again at once."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.mig.configs import A30, A100_40, A100_80, H100
from tests.mig.planning import GI, LAYOUTS, NOW, applied
from webhook.domain.policy_model import MigReshaping
from webhook.mig.planner import HANDS_OFF_STATES, Candidate, Free, Plan, Waiting, plan

PRODUCTS = [A100_80, A100_40, H100, A30, "Tesla-T4"]
LAYOUT_NAMES = [*LAYOUTS.names, "all-disabled"]


@st.composite
def fleets(draw: st.DrawFn) -> list[Candidate]:
    """Mostly nodes that may be re-cut, each rule broken now and then."""
    count = draw(st.integers(0, 8))
    rarely = st.integers(0, 5).map(lambda i: i == 0)
    nodes = []
    for i in range(count):
        nodes.append(
            Candidate(
                name=f"n{i}",
                product=draw(st.sampled_from([A100_80, A100_80, *PRODUCTS])),
                gpus=draw(st.sampled_from([1, 2, 8, 0])),
                opted_in=not draw(rarely),
                layout=draw(st.sampled_from(LAYOUT_NAMES)),
                state=draw(st.sampled_from(["success", "success", "success", "", *HANDS_OFF_STATES])),
                busy=draw(rarely),
                idle_since=draw(st.one_of(st.none(), st.floats(NOW - 600, NOW))),
                changed_at=draw(st.one_of(st.none(), st.none(), st.floats(NOW - 600, NOW))),
                changing=draw(st.sampled_from(["", "", "", "", *LAYOUTS.names])),
            )
        )
    return nodes


@st.composite
def queues(draw: st.DrawFn, nodes: list[str]) -> list[Waiting]:
    count = draw(st.integers(0, 25))
    models = st.one_of(st.none(), st.frozensets(st.sampled_from(["A100-80GB", "A100-40GB", "H100-80GB", "A30"])))
    where = st.one_of(st.none(), st.frozensets(st.sampled_from(nodes))) if nodes else st.none()
    return [
        Waiting(
            f"ns/p{i}",
            draw(st.sampled_from([0, 4, 8, 16, 19, 30, 35, 39, 40, 60, 78, 79, 90])) * GI,
            draw(st.sampled_from([1, 1, 1, 2])),
            draw(models),
            draw(where),
        )
        for i in range(count)
    ]


@st.composite
def frees(draw: st.DrawFn, nodes: list[Candidate]) -> list[Free]:
    out = []
    for n in nodes:
        model = LAYOUTS.catalog.model_of(n.product)
        if model is None or not draw(st.booleans()):
            continue
        profile = draw(st.sampled_from(sorted(model.profiles)))
        out.append(Free(n.name, model.name, profile, model.profiles[profile].memory_mib, draw(st.integers(0, 7))))
    return out


@st.composite
def situations(draw: st.DrawFn) -> tuple[list[Candidate], list[Waiting], list[Free], MigReshaping]:
    nodes = draw(fleets())
    demand = draw(queues([n.name for n in nodes]))
    free = draw(frees(nodes))
    s = MigReshaping(idle_seconds=draw(st.sampled_from([1.0, 60.0, 300.0])), max_in_flight=draw(st.integers(1, 4)))
    return nodes, demand, free, s


def check(nodes: list[Candidate], demand: list[Waiting], s: MigReshaping, result: Plan) -> None:
    by_name = {n.name: n for n in nodes}
    pods = {p.pod: p for p in demand}
    changed = [c.node for c in result.changes]
    assert len(changed) == len(set(changed)), "one change per node at most"
    in_flight = sum(1 for n in nodes if n.changing)
    assert in_flight + len(changed) <= max(s.max_in_flight, in_flight), "the in-flight bound holds"
    for change in result.changes:
        n = by_name[change.node]
        assert n.opted_in and not n.busy and not n.changing and n.state not in HANDS_OFF_STATES
        assert n.idle_since is None or NOW - n.idle_since >= s.idle_seconds
        assert n.changed_at is None or NOW - n.changed_at >= s.idle_seconds
        assert change.to_layout != n.layout and change.to_layout in LAYOUTS.names
        assert change.pods, "every change serves someone"
        assert not set(change.pods) & result.served_by_free, "never for Pods the free instances serve"
        # The new layout really holds its Pods: each a distinct instance of enough memory on a model
        # and node it may use.
        chosen = LAYOUTS.usable(n.product, n.gpus)[change.to_layout]
        left = Counter({p.name: count for p, count in chosen.instances})
        memory = {p.name: p.memory_mib for p, _ in chosen.instances}
        for pod in sorted((pods[k] for k in change.pods), key=lambda p: -p.memory_mib):
            assert pod.nodes is None or n.name in pod.nodes
            assert pod.models is None or chosen.model.name in pod.models
            fits = [k for k in left if left[k] >= pod.count and memory[k] >= pod.memory_mib]
            assert fits, f"{pod} fits no instance left of {change.to_layout} on {n.name}"
            left[min(fits, key=lambda k: memory[k])] -= pod.count
    for pod, node in result.waits.items():
        assert pod in pods and pod not in result.served_by_free
        assert by_name[node].changing or node in changed
    assert set(result.skipped).isdisjoint(changed)


@settings(max_examples=300)
@given(situations())
def test_every_change_keeps_every_rule(
    situation: tuple[list[Candidate], list[Waiting], list[Free], MigReshaping],
) -> None:
    nodes, demand, free, s = situation
    check(nodes, demand, s, plan(demand, free, nodes, layouts=LAYOUTS, settings=s, now=NOW))


@settings(max_examples=200)
@given(situations())
def test_planning_again_at_once_changes_nothing_for_the_same_pods(
    situation: tuple[list[Candidate], list[Waiting], list[Free], MigReshaping],
) -> None:
    """No flapping: once the leader asked for a plan's changes, the same queue a moment later gets no
    change for a Pod that already waits, and no node is changed twice."""
    nodes, demand, free, s = situation
    first = plan(demand, free, nodes, layouts=LAYOUTS, settings=s, now=NOW)
    after = applied(nodes, first, NOW)
    second = plan(demand, free, after, layouts=LAYOUTS, settings=s, now=NOW + 1)
    assert not {c.node for c in second.changes} & {c.node for c in first.changes}
    waiting = set(first.waits)
    for change in second.changes:
        assert not set(change.pods) & waiting
    assert waiting <= set(second.waits) | second.served_by_free


@given(situations())
def test_demand_the_free_instances_serve_makes_no_change(
    situation: tuple[list[Candidate], list[Waiting], list[Free], MigReshaping],
) -> None:
    nodes, demand, _, s = situation
    # Free instances of every kind, plenty of them, on a node every Pod may use: nothing is re-cut.
    plenty = [Free("pool", "A100-80GB", "7g.80gb", 80896, 100), Free("pool", "A100-80GB", "1g.10gb", 9728, 100)]
    open_demand = [Waiting(p.pod, min(p.memory_mib, 79 * GI), p.count) for p in demand]
    result = plan(open_demand, plenty, nodes, layouts=LAYOUTS, settings=s, now=NOW)
    assert result.changes == () and result.served_by_free == {p.pod for p in open_demand}


BREAKS = {
    "busy": {"busy": True},
    "not opted in": {"opted_in": False},
    "failed": {"state": "failed"},
    "pending": {"state": "pending"},
    "rebooting": {"state": "rebooting"},
    "idle too briefly": {"idle_since": NOW - 1},
    "changed recently": {"changed_at": NOW - 1},
}


@settings(max_examples=200)
@given(situations(), st.data())
def test_a_node_that_breaks_a_rule_is_never_changed(
    situation: tuple[list[Candidate], list[Waiting], list[Free], MigReshaping], data: st.DataObject
) -> None:
    """Whatever else the fleet and the queue are: the nodes made busy, not opted in, failed, pending,
    rebooting, idle too briefly or changed too recently are never among the changes."""
    nodes, demand, free, s = situation
    broken: dict[str, str] = {}
    fleet = []
    for drawn in nodes:
        n = drawn
        why = data.draw(st.sampled_from([None, *BREAKS]), label=n.name)
        if why is not None:  # a node that would be a candidate but for this one rule
            broken[n.name] = why
            fit = {"product": A100_80, "gpus": max(n.gpus, 1), "opted_in": True, "state": "success", "busy": False}
            n = replace(n, **fit, idle_since=None, changed_at=None, changing="")  # type: ignore[arg-type]
            n = replace(n, **BREAKS[why])  # type: ignore[arg-type]
        fleet.append(n)
    result = plan(demand, free, fleet, layouts=LAYOUTS, settings=replace(s, idle_seconds=60.0), now=NOW)
    assert not {c.node for c in result.changes} & set(broken), broken
