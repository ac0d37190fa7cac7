"""One pool: nodes grouped as the scheduler sees them, and holds packed best fit onto their free GPUs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import GPU_TAINT, fleet, gpu_node, index_of, pod
from tests.pools.probes import RES, T4, T4_SELECTOR, free, free_counts, free_per_node, stats
from webhook.pools.kubeobj import node_from_obj, pod_from_obj
from webhook.pools.nodes import Selector
from webhook.pools.pool import Group, Pool, pack
from webhook.pools.reservations import Reservation

# --- through the index: what decisions see ---------------------------------------------------------------


def test_nodes_are_grouped_by_selector_and_taints() -> None:
    """Nodes the scheduler can tell apart (other labels or taints) are separate groups of one pool."""
    index = index_of(
        [
            gpu_node("a", gpu_class=None),
            gpu_node("b"),
            gpu_node("c", taints=[GPU_TAINT]),
        ]
    )
    pool = next(index.capacity.pools())
    assert len(pool.groups) == 3
    assert len(pool.by_selector()) == 2


def test_pending_pinned_pod_is_placed_virtually_on_best_fit_node() -> None:
    """A Pending Pod pinned by gpupool holds GPUs on the fullest node that still fits it."""
    index = index_of([*fleet(), pod("run", gpus=2, node="t4-a", phase="Running")])
    waiting = pod("w", annotations={"gpupool.io/pool": str(T4)}, gpus=2, node_selector=dict(T4_SELECTOR))
    index.upsert_pod(pod_from_obj(waiting, RES))
    assert free_counts(index, T4) == {0: 1, 4: 1}
    assert stats(index, T4).pending == 2
    assert index.usage.class_used("ml", "medium") == 4  # the running Pod's 2 on a medium node, and these 2
    # Scheduled: the virtual hold is replaced by the real one on the chosen node.
    waiting["spec"]["nodeName"] = "t4-b"
    index.upsert_pod(pod_from_obj(waiting, RES))
    assert free_per_node(index, T4) == {"t4-a": 2, "t4-b": 2}
    assert free_counts(index, T4) == {2: 2}
    assert stats(index, T4).pending == 0
    assert index.usage.class_used("ml", "medium") == 4


@pytest.mark.parametrize("landed_on", ["t4-a", "t4-b"])
def test_pod_landing_where_holds_were_guessed_moves_the_holds(landed_on: str) -> None:
    """Virtual holds are guesses: when a Pod really lands on a node they filled, they move elsewhere,
    so the pool's free count stays exact whichever node the scheduler picked."""
    index = index_of(fleet())
    for _ in range(7):
        index.reserve(Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1), now=0.0)
    seen = pod("p1", annotations={"gpupool.io/pool": str(T4)}, gpus=1, node=landed_on, phase="Running")
    index.upsert_pod(pod_from_obj(seen, RES))
    assert index.usage.reservations == 6
    assert free(index, T4) == 1
    assert stats(index, T4).pending == 6


def test_reservation_on_a_full_pool_holds_gpus_on_a_node_that_joins() -> None:
    """An admission reserved while its pool was full is placed when the pool gains a node (or a node
    frees up): the new capacity is not offered twice."""
    index = index_of([*fleet(), pod("a", gpus=4, node="t4-a", phase="Running"), pod("b", gpus=4, node="t4-b")])
    index.reserve(Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=3), now=0.0)
    assert (stats(index, T4).gpus_free, stats(index, T4).pending) == (0, 3)
    index.upsert_node(node_from_obj(gpu_node("t4-c"), RES))
    assert (stats(index, T4).gpus_free, stats(index, T4).pending) == (1, 3)
    index.remove_node("t4-c")
    index.remove_pod(("ml", "b"))
    assert (stats(index, T4).gpus_free, stats(index, T4).pending) == (1, 3)


# --- the pool alone -------------------------------------------------------------------------------------

ZONE_A: Selector = (*T4_SELECTOR, ("topology.kubernetes.io/zone", "a"))
ZONE_B: Selector = (*T4_SELECTOR, ("topology.kubernetes.io/zone", "b"))


def pool_of(free_by_group: dict[Selector, list[int]]) -> Pool:
    """A T4 pool whose group per selector has usable nodes with these own free GPUs."""
    pool = Pool(T4, "nvidia.com/gpu")
    for selector, frees in free_by_group.items():
        group = Group(selector, (), ())
        pool.add_group((selector, (), ()), group)
        for i, f in enumerate(frees):
            group.set_own_free(f"{selector[-1][1]}-{i}", f, unheld=False)
    return pool


def test_holds_go_to_the_fullest_node_that_fits_largest_first() -> None:
    """Best fit, largest first: a 2-GPU hold takes the 2-free node rather than a whole 4-free one, and the
    1-GPU holds fill the 1-free node and then the 3-free one; what fits nowhere stays pending."""
    pool = pool_of({ZONE_A: [4, 2, 1, 3]})
    for gpus in (1, 2, 1, 1, 8):
        pool.hold(T4_SELECTOR, gpus, +1)
    pack(pool)
    (group,) = pool.groups.values()
    assert group.buckets == {4: 1, 0: 2, 1: 1}
    assert (group.free_total, group.own_total, pool.pending) == (5, 10, 13)


def test_a_hold_goes_only_where_its_node_selector_reaches() -> None:
    """A hold pinned to zone b leaves zone a's nodes free, even when a node there fits it better."""
    pool = pool_of({ZONE_A: [1], ZONE_B: [4]})
    pool.hold(ZONE_B, 1, +1)
    pack(pool)
    assert [(dict(g.selector)["topology.kubernetes.io/zone"], g.buckets) for g in pool.ordered()] == [
        ("a", {1: 1}),
        ("b", {3: 1}),
    ]


def test_nodes_of_an_unheld_pool_keep_their_free_counts_in_step_without_packing() -> None:
    """With nothing held, a node's own free GPUs are what is left: set_own_free keeps the counts the
    decisions read right without packing the pool again."""
    group = Group(T4_SELECTOR, (), ())
    group.set_own_free("a", 4, unheld=True)
    group.set_own_free("b", 4, unheld=True)
    group.set_own_free("a", 1, unheld=True)
    assert (group.buckets, group.free_total, group.max_free()) == ({4: 1, 1: 1}, 5, 4)
    group.set_own_free("b", None, unheld=True)
    assert (group.buckets, group.free_total, group.own_free) == ({1: 1}, 1, {"a": 1})


def test_taking_back_every_hold_of_a_kind_forgets_the_kind() -> None:
    """Holds are counted per kind (pins, GPUs): the last one taken back leaves nothing to pack."""
    pool = pool_of({ZONE_A: [4]})
    pool.hold(ZONE_A, 2, +1)
    pool.hold(ZONE_A, 2, +1)
    assert pool.packing_order() == [(ZONE_A, 2)]
    pool.hold(ZONE_A, 2, -1)
    pool.hold(ZONE_A, 2, -1)
    assert (pool.holds, pool.pending, pool.packing_order()) == ({}, 0, [])


def one_by_one(pool: Pool) -> list[dict[int, int]]:
    """What placing each hold alone would leave: per hold, largest first, the node with the fewest free
    GPUs that fits it among the groups its pins reach (ties: the group first in `ordered()`)."""
    counts = [dict(g.own_counts) for g in pool.ordered()]
    for pins, gpus in pool.packing_order():
        reach = pool.reach(pins)
        for _ in range(pool.holds[(pins, gpus)]):
            fitting = [(f, g) for g in reach for f, n in counts[g].items() if n and f >= gpus]
            if not fitting:
                break
            f, g = min(fitting)
            counts[g][f] -= 1
            counts[g][f - gpus] = counts[g].get(f - gpus, 0) + 1
    return [{f: n for f, n in c.items() if n} for c in counts]


frees_st = st.lists(st.sampled_from([0, 1, 2, 3, 4, 8]), max_size=6)
holds_st = st.lists(st.tuples(st.sampled_from([T4_SELECTOR, ZONE_A, ZONE_B]), st.integers(1, 4)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(frees_st, frees_st, holds_st)
def test_packing_in_batches_places_holds_as_one_at_a_time_would(
    zone_a: list[int], zone_b: list[int], holds: list[tuple[Selector, int]]
) -> None:
    """Packing all holds of one size and reach in one step leaves each group the same free counts as
    placing the holds one by one, best fit, would."""
    pool = pool_of({ZONE_A: zone_a, ZONE_B: zone_b})
    for pins, gpus in holds:
        pool.hold(pins, gpus, +1)
    pack(pool)
    expected = one_by_one(pool)
    assert [g.buckets for g in pool.ordered()] == expected
    assert [g.free_total for g in pool.ordered()] == [sum(f * n for f, n in c.items()) for c in expected]
