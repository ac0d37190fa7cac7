"""A Pod's long node-affinity lists cut to the values the known nodes carry (webhook.domain.cut) match
exactly the known nodes the full lists match, and say when a node's new value may have made them wrong."""

from __future__ import annotations

import random

from webhook.domain.affinity import IN, NOT_IN, NodeRequirements, Requirement, Term
from webhook.domain.cut import CUT_AT, CutValues, FleetLabels, cut_requirements

KEYS = ("rack", "zone", "kubernetes.io/hostname")


def fleet_of(nodes: list[dict[str, str]]) -> FleetLabels:
    fleet = FleetLabels()
    for labels in nodes:
        fleet.change(None, labels)
    return fleet


def long_values(rng: random.Random, carried: list[str]) -> tuple[str, ...]:
    return tuple(rng.sample(carried, k=rng.randint(0, 2)) + [f"v-{rng.random():.12f}" for _ in range(300)])


def test_the_cut_matches_every_known_node_as_the_full_lists_do() -> None:
    rng = random.Random(26)
    for _ in range(200):
        nodes = [{k: f"{k}-{rng.randint(0, 5)}" for k in KEYS if rng.random() < 0.8} for _ in range(8)]
        carried = sorted({v for n in nodes for v in n.values()})
        terms = tuple(
            Term(tuple(
                Requirement(rng.choice(KEYS), rng.choice((IN, NOT_IN)), long_values(rng, carried))
                for _ in range(rng.randint(1, 3))
            ))
            for _ in range(rng.randint(1, 3))
        )  # fmt: skip
        full = NodeRequirements((), terms)
        cut, how = cut_requirements(full, fleet_of(nodes))
        assert how is not None and len(repr(cut)) < len(repr(full)) / 4
        for i, labels in enumerate(nodes):
            assert cut.matches(f"n{i}", labels) == full.matches(f"n{i}", labels), (labels, terms)


def test_an_ordinary_pod_is_left_as_it_is() -> None:
    needs = NodeRequirements((), (Term((Requirement("zone", IN, ("a", "b")),)),))
    assert cut_requirements(needs, fleet_of([{"zone": "a"}])) == (needs, None)


def test_a_value_a_node_gains_for_a_cut_key_makes_the_cut_stale() -> None:
    values = tuple(f"rack-{i:04d}-{'x' * 40}" for i in range(100))
    assert sum(map(len, values)) > CUT_AT
    fleet = fleet_of([{"rack": values[0], "zone": "a"}])
    cut, how = cut_requirements(NodeRequirements((), (Term((Requirement("rack", IN, values),)),)), fleet)
    assert how is not None and not fleet.stale(how)
    (term,) = cut.terms or ()
    assert term.expressions == (Requirement("rack", IN, CutValues((values[0],))),)
    assert term.expressions != (Requirement("rack", IN, (values[0],)),)  # never a pool's requirement
    fleet.change(None, {"rack": values[0], "zone": "b"})  # nothing new for rack: still exact
    assert not fleet.stale(how)
    fleet.change(None, {"rack": values[5]})
    assert fleet.stale(how)
