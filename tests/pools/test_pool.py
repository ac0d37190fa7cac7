"""One pool: nodes grouped as the scheduler sees them, and holds packed best fit onto their free GPUs."""

from __future__ import annotations

import pytest

from tests.builders import GPU_TAINT, fleet, gpu_node, index_of, pod
from tests.pools.probes import RES, T4, T4_SELECTOR, free, free_counts, free_per_node, stats
from webhook.pools.kubeobj import node_from_obj, pod_from_obj

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
    pool = next(index.pools())
    assert len(pool.groups) == 3
    assert len(pool.by_selector()) == 2


def test_pending_pinned_pod_is_placed_virtually_on_best_fit_node() -> None:
    """A Pending Pod pinned by gpupool holds GPUs on the fullest node that still fits it."""
    index = index_of([*fleet(), pod("run", gpus=2, node="t4-a", phase="Running")])
    waiting = pod("w", annotations={"gpupool.io/pool": str(T4)}, gpus=2, node_selector=dict(T4_SELECTOR))
    index.upsert_pod(pod_from_obj(waiting, RES))
    assert free_counts(index, T4) == {0: 1, 4: 1}
    assert stats(index, T4).pending == 2
    assert index.class_used("ml", "medium") == 4  # the running Pod's 2 on a medium node, and these 2
    # Scheduled: the virtual hold is replaced by the real one on the chosen node.
    waiting["spec"]["nodeName"] = "t4-b"
    index.upsert_pod(pod_from_obj(waiting, RES))
    assert free_per_node(index, T4) == {"t4-a": 2, "t4-b": 2}
    assert free_counts(index, T4) == {2: 2}
    assert stats(index, T4).pending == 0
    assert index.class_used("ml", "medium") == 4


@pytest.mark.parametrize("landed_on", ["t4-a", "t4-b"])
def test_pod_landing_where_holds_were_guessed_moves_the_holds(landed_on: str) -> None:
    """Virtual holds are guesses: when a Pod really lands on a node they filled, they move elsewhere,
    so the pool's free count stays exact whichever node the scheduler picked."""
    index = index_of(fleet())
    for _ in range(7):
        index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0)
    seen = pod("p1", annotations={"gpupool.io/pool": str(T4)}, gpus=1, node=landed_on, phase="Running")
    index.upsert_pod(pod_from_obj(seen, RES))
    assert index.reservations == 6
    assert free(index, T4) == 1
    assert stats(index, T4).pending == 6


def test_reservation_on_a_full_pool_holds_gpus_on_a_node_that_joins() -> None:
    """An admission reserved while its pool was full is placed when the pool gains a node (or a node
    frees up): the new capacity is not offered twice."""
    index = index_of([*fleet(), pod("a", gpus=4, node="t4-a", phase="Running"), pod("b", gpus=4, node="t4-b")])
    index.reserve("ml", T4, T4_SELECTOR, 3, now=0.0)
    assert (stats(index, T4).gpus_free, stats(index, T4).pending) == (0, 3)
    index.upsert_node(node_from_obj(gpu_node("t4-c"), RES))
    assert (stats(index, T4).gpus_free, stats(index, T4).pending) == (1, 3)
    index.remove_node("t4-c")
    index.remove_pod(("ml", "b"))
    assert (stats(index, T4).gpus_free, stats(index, T4).pending) == (1, 3)
