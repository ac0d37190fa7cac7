"""Reservations of admissions the watch has not shown yet: found by the Pod they wait for, by a
re-invocation of that Pod, and by age; each one object for the garbage collector."""

from __future__ import annotations

import gc

from tests.builders import fleet, index_of, pod, policy
from tests.pools.probes import POLICY, RES, T4, T4_SELECTOR, free, free_per_node
from webhook.admission.core import Admitter
from webhook.domain.model import PoolKey
from webhook.pools.kubeobj import pod_from_obj
from webhook.pools.reservations import Reservation, Reservations
from webhook.sources.snapshot import SnapshotInventory

# --- through the index ----------------------------------------------------------------------------------


def test_reservation_is_settled_only_by_a_matching_pod() -> None:
    """Another namespace, pool or size does not settle a reservation."""
    index = index_of(fleet())
    index.reserve(Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=2), now=0.0)
    for other in (
        pod("x", namespace="other", annotations={"gpupool.io/pool": str(T4)}, gpus=2),
        pod("y", annotations={"gpupool.io/pool": "nvidia/medium/NVIDIA-L4"}, gpus=2),
        pod("z", annotations={"gpupool.io/pool": str(T4)}, gpus=1),
    ):
        index.upsert_pod(pod_from_obj(other, RES))
    assert index.usage.reservations == 1


def test_a_reservation_is_settled_by_its_pods_name_or_generate_name() -> None:
    """A reservation that knows its Pod is taken over by that Pod when the watch shows it (a Pod made
    from a generateName by any Pod with that generateName, oldest reservation first), whatever the Pod
    carries: a Pod that named its node has no pool annotation at all."""
    index = index_of(fleet())
    index.reserve(Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1, name="infer"), now=0.0)
    index.reserve(Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1, generate_name="train-"), now=0.0)
    index.reserve(
        Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=2, name="bound", node="t4-b"), now=0.0
    )
    assert free_per_node(index, T4)["t4-b"] == 2  # held on the node it names, not in the pool
    index.upsert_pod(pod_from_obj(pod("someone-else", gpus=1, node="t4-a", phase="Running"), RES))
    assert index.usage.reservations == 3
    made = pod("train-x7k2p", gpus=1, node="t4-a", phase="Running")
    made["metadata"]["generateName"] = "train-"
    for shown in (pod("infer", gpus=1, node="t4-a", phase="Running"), made, pod("bound", gpus=2, node="t4-b")):
        before = index.usage.reservations
        index.upsert_pod(pod_from_obj(shown, RES))
        assert index.usage.reservations == before - 1, shown["metadata"]["name"]


def test_a_reinvocation_takes_back_only_its_own_unmatched_reservation() -> None:
    """take_echo finds the reservation of the same Pod, pool (or node) and GPUs, once: a second call, or
    another pool or size, finds none."""
    index = index_of(fleet())
    index.reserve(Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1, name="infer"), now=0.0)
    l4 = PoolKey("nvidia", "medium", "NVIDIA-L4")
    assert not index.take_echo("ml", "infer", "", pool=l4, node="", gpus=1)
    assert not index.take_echo("ml", "infer", "", pool=T4, node="", gpus=2)
    assert not index.take_echo("ml", "other", "", pool=T4, node="", gpus=1)
    assert index.take_echo("ml", "infer", "", pool=T4, node="", gpus=1)
    assert index.usage.reservations == 0
    index.reserve(
        Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1, name="infer", echoed=True), now=0.0
    )
    assert not index.take_echo("ml", "infer", "", pool=T4, node="", gpus=1)


def test_past_the_bound_a_namespaces_oldest_reservation_stops_counting() -> None:
    """maxReservationsPerNamespace 3: a fourth reservation in team-q pushes out team-q's oldest, whose
    GPUs are free again at once (pool and quota); team-a's reservation is not touched."""
    index = index_of(fleet(), policy("defaults: {maxReservationsPerNamespace: 3}"))
    index.reserve(Reservation(namespace="team-a", pool=T4, selector=T4_SELECTOR, gpus=1, name="a-0"), now=0.0)
    for i in range(3):
        index.reserve(
            Reservation(namespace="team-q", pool=T4, selector=T4_SELECTOR, gpus=2, name=f"forged-{i}"), now=1.0 + i
        )
    assert (index.usage.reserved("team-q", "nvidia.com/gpu"), free(index, T4)) == (6, 1)
    index.reserve(Reservation(namespace="team-q", pool=T4, selector=T4_SELECTOR, gpus=1, name="real"), now=5.0)
    assert (index.usage.reserved("team-q", "nvidia.com/gpu"), free(index, T4)) == (5, 2)
    assert index.usage.reserved("team-a", "nvidia.com/gpu") == 1
    assert index.usage.reservations == 4
    shown = pod("forged-0", namespace="team-q", gpus=2, node="t4-a", phase="Running")
    index.upsert_pod(pod_from_obj(shown, RES))  # the pushed-out one is not matched any more
    assert index.usage.reservations == 4


def test_a_real_burst_stays_exact_under_a_stream_of_forged_reviews() -> None:
    """A forger keeps team-q at its bound; a burst of real Pods reserved in between is counted exactly
    as long as the watch shows each Pod before the bound's worth of newer reservations come in (what
    pushes a reservation out is age in its namespace, and the watch takes a real one within a second)."""
    bound = 50
    index = index_of(fleet(), policy(f"defaults: {{maxReservationsPerNamespace: {bound}}}"))
    now = 0.0
    for i in range(bound):
        index.reserve(
            Reservation(namespace="team-q", pool=T4, selector=T4_SELECTOR, gpus=1, name=f"forged-{i}"), now=now
        )
    for i in range(4):  # each real Pod is followed by 10 forged reviews before the watch shows it
        index.reserve(Reservation(namespace="team-q", pool=T4, selector=T4_SELECTOR, gpus=1, name=f"real-{i}"), now=now)
        for j in range(10):
            index.reserve(
                Reservation(namespace="team-q", pool=T4, selector=T4_SELECTOR, gpus=1, name=f"forged-{i}-{j}"), now=now
            )
        before = index.usage.reservations
        index.upsert_pod(pod_from_obj(pod(f"real-{i}", namespace="team-q", gpus=1, node="t4-a"), RES))
        assert index.usage.reservations == before - 1, f"real-{i} was pushed out before the watch showed it"
    assert (index.usage.requested("team-q", "nvidia.com/gpu"), index.usage.reserved("team-q", "nvidia.com/gpu")) == (
        4,
        bound - 1,
    )


# --- the reservations alone -----------------------------------------------------------------------------


def add(
    reservations: Reservations,
    now: float,
    *,
    name: str = "",
    node: str = "",
    gpus: int = 1,
    namespace: str = "ml",
) -> int:
    claim = reservations.make(
        Reservation(
            namespace=namespace,
            pool=T4,
            selector=T4_SELECTOR,
            gpus=gpus,
            name=name,
            generate_name="",
            node=node,
            echoed=False,
        )
    )
    token, crowded = reservations.add(claim, now)
    assert crowded == []
    return token


def test_a_reservation_holds_in_its_pool_or_on_the_node_it_names() -> None:
    """In the pool where its selector reaches, or on its node as the pool's resource; counted against
    the pool's class and its namespace's quota either way."""
    reservations = Reservations(POLICY)
    in_pool = reservations.make(
        Reservation(
            namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=2, name="a", generate_name="", node="", echoed=False
        )
    )
    on_node = reservations.make(
        Reservation(
            namespace="ml",
            pool=T4,
            selector=T4_SELECTOR,
            gpus=2,
            name="b",
            generate_name="b-",
            node="t4-a",
            echoed=True,
        )
    )
    assert (in_pool.node, in_pool.holds, in_pool.pins) == ("", ((T4, 2),), T4_SELECTOR)
    assert (on_node.node, on_node.requests, on_node.holds) == ("t4-a", (("nvidia.com/gpu", 2),), ())
    for claim in (in_pool, on_node):
        assert (claim.classes, claim.reserved) == ((("medium", 2),), ("nvidia.com/gpu", 2))
    assert (in_pool.who, in_pool.echoed, on_node.who, on_node.echoed) == (("ml", "a", ""), False, ("ml", "b", ""), True)


def test_expiry_takes_the_oldest_first_and_skips_those_already_gone() -> None:
    """Reservations expire in the order they were made, after reservationSeconds; one released before
    its time is not returned again."""
    reservations = Reservations(POLICY)
    seconds = POLICY.defaults.reservation_seconds
    first, second, third = add(reservations, 0.0), add(reservations, 1.0), add(reservations, 2.0)
    reservations.pop(second)
    assert reservations.expire(seconds + 0.5, None) == [
        reservations.make(
            Reservation(
                namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1, name="", generate_name="", node="", echoed=False
            )
        )
    ]
    assert (len(reservations), reservations.pop(first), reservations.pop(third) is not None) == (1, None, True)
    assert reservations.expire(seconds + 10, None) == []


def test_with_a_current_watch_a_reservation_expires_once_it_is_settle_seconds_old() -> None:
    """Made while the watch has been current, a reservation whose Pod has not shown up is gone after
    reservationSettleSeconds; one made before the watch came back waits its full reservationSeconds."""
    defaults = POLICY.defaults
    reservations = Reservations(POLICY)
    add(reservations, 20.0)
    assert reservations.expire(20.0 + defaults.reservation_settle_seconds - 0.5, current_since=10.0) == []
    assert len(reservations.expire(20.0 + defaults.reservation_settle_seconds, current_since=10.0)) == 1
    add(reservations, 5.0)
    assert reservations.expire(5.0 + defaults.reservation_settle_seconds, current_since=10.0) == []
    assert len(reservations.expire(5.0 + defaults.reservation_seconds, current_since=10.0)) == 1


def test_one_made_before_the_watch_came_back_does_not_hold_up_younger_ones() -> None:
    """A reservation made while the watch was down waits its full reservationSeconds, and one made after
    the watch came back still goes after reservationSettleSeconds, although it is queued behind it."""
    defaults = POLICY.defaults
    reservations = Reservations(POLICY)
    old = add(reservations, 0.0, name="during-outage")
    young = add(reservations, 12.0, name="forged")
    assert reservations.expire(12.0 + defaults.reservation_settle_seconds, current_since=10.0) == [
        reservations.make(
            Reservation(
                namespace="ml",
                pool=T4,
                selector=T4_SELECTOR,
                gpus=1,
                name="forged",
                generate_name="",
                node="",
                echoed=False,
            )
        )
    ]
    assert (reservations.pop(young), len(reservations)) == (None, 1)
    assert len(reservations.expire(defaults.reservation_seconds - 0.5, current_since=10.0)) == 0
    assert len(reservations.expire(defaults.reservation_seconds, current_since=10.0)) == 1
    assert reservations.pop(old) is None


def test_settled_reservations_go_within_five_seconds_by_default() -> None:
    """The default settle time is at most 5 s, so a forged review holds a namespace's quota that long
    once it stops (and a real Pod, shown by a current watch within about a second, is long counted)."""
    reservations = Reservations(POLICY)
    add(reservations, 20.0)
    assert POLICY.defaults.reservation_settle_seconds <= 5
    assert len(reservations.expire(25.0, current_since=10.0)) == 1


def test_the_bound_pushes_out_the_oldest_of_the_namespace_and_returns_it() -> None:
    """Past maxReservationsPerNamespace, `add` drops the namespace's oldest (by when it was made, a
    re-invocation counting as new) and hands it back; other namespaces and their counts are untouched."""
    reservations = Reservations(policy("defaults: {maxReservationsPerNamespace: 2}"))
    first, second = add(reservations, 0.0, name="p-0"), add(reservations, 1.0, name="p-1")
    add(reservations, 2.0, name="other", namespace="team-a")
    claim = reservations.make(
        Reservation(
            namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1, name="p-2", generate_name="", node="", echoed=False
        )
    )
    third, crowded = reservations.add(claim, 3.0)
    assert [c.who for c in crowded] == [("ml", "p-0", "")]
    assert (reservations.pop(first), reservations.in_namespace("ml"), reservations.in_namespace("team-a")) == (
        None,
        2,
        1,
    )
    assert reservations.pop(second) is not None and reservations.pop(third) is not None
    assert (reservations.in_namespace("ml"), len(reservations)) == (0, 1)


def test_a_pod_shown_takes_over_its_own_reservation_else_the_oldest_of_its_pool_and_size() -> None:
    """By name first; a Pod whose admission named nobody takes the oldest reservation of its namespace,
    pool annotation and GPUs."""
    reservations = Reservations(POLICY)
    anonymous_old, anonymous_new = add(reservations, 0.0), add(reservations, 1.0)
    named = add(reservations, 2.0, name="infer")
    annotated = {"gpupool.io/pool": str(T4)}
    assert reservations.shown(pod_from_obj(pod("infer", gpus=1, annotations=annotated), RES)) == named
    assert reservations.shown(pod_from_obj(pod("other", gpus=1, annotations=annotated), RES)) == anonymous_old
    assert reservations.shown(pod_from_obj(pod("other", gpus=2, annotations=annotated), RES)) is None
    assert reservations.shown(pod_from_obj(pod("other", gpus=1), RES)) is None
    reservations.pop(anonymous_old)
    assert reservations.shown(pod_from_obj(pod("other", gpus=1, annotations=annotated), RES)) == anonymous_new


def test_a_reinvocation_matches_the_newest_unmatched_reservation_of_its_pod() -> None:
    """echo finds the Pod's newest reservation of the same node (or pool) and GPUs; never one that names
    no Pod."""
    reservations = Reservations(POLICY)
    add(reservations, 0.0)
    older, newer = add(reservations, 0.0, name="infer"), add(reservations, 1.0, name="infer")
    on_node = add(reservations, 2.0, name="infer", node="t4-a")
    assert reservations.echo("ml", "infer", "", pool=T4, node="", gpus=1) == newer
    reservations.pop(newer)
    assert reservations.echo("ml", "infer", "", pool=T4, node="", gpus=1) == older
    assert reservations.echo("ml", "infer", "", pool=None, node="t4-a", gpus=1) == on_node
    assert reservations.echo("ml", "", "", pool=T4, node="", gpus=1) is None


def test_each_reservation_is_one_object_for_the_garbage_collector() -> None:
    """A burst of reservations of one pool and size adds one tracked object each (its Claim): what they
    share is built once, so a full collection under 60,000 waiting reservations walks 60,000 objects."""
    reservations = Reservations(policy("defaults: {maxReservationsPerNamespace: 10000}"))
    add(reservations, 0.0)  # builds what reservations of this pool and size share
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(2000):
        add(reservations, 0.0)
    gc.collect()
    assert len(gc.get_objects()) - before < 2000 * 1.05


def test_a_validating_call_finds_its_pods_reservation_by_name_then_generate_name() -> None:
    """By the time of the validating call the Pod has its generated name: its reservation is found under
    that name, else under its generateName (oldest first), in its pool or on its node; one of another
    pool (the Pod changed since) only when none of its own is there; never one of another Pod."""
    reservations = Reservations(POLICY)
    l4 = PoolKey("nvidia", "medium", "NVIDIA-L4")

    def make(pool: PoolKey, *, name: str = "", generate_name: str = "", node: str = "") -> int:
        claim = reservations.make(
            Reservation(
                namespace="ml", pool=pool, selector=(), gpus=1, name=name, generate_name=generate_name, node=node
            )
        )
        return reservations.add(claim, 0.0)[0]

    named = make(T4, name="infer")
    older, newer = make(T4, generate_name="train-"), make(T4, generate_name="train-")
    on_l4 = make(l4, generate_name="train-")
    on_node = make(T4, name="bound", node="t4-a")
    assert reservations.admitted("ml", "infer", "", pool=T4, node="") == named
    assert reservations.admitted("ml", "train-x7k2p", "train-", pool=T4, node="") == older
    assert reservations.admitted("ml", "train-x7k2p", "train-", pool=l4, node="") == on_l4
    assert reservations.admitted("ml", "train-x7k2p", "train-", pool=None, node="") == older
    assert reservations.admitted("ml", "bound", "", pool=None, node="t4-a") == on_node
    assert reservations.admitted("ml", "bound", "", pool=T4, node="") == on_node  # a later webhook unbound it
    assert reservations.admitted("ml", "web-1", "web-", pool=T4, node="") is None
    assert reservations.admitted("other", "infer", "", pool=T4, node="") is None
    reservations.pop(older)
    assert reservations.admitted("ml", "train-x7k2p", "train-", pool=T4, node="") == newer


def test_a_confirmed_reservation_is_found_by_the_watch_but_no_longer_by_a_validating_call() -> None:
    """Confirmed (made by the validating call, under the Pod's name): the watch takes it over as any
    other; no second validating call or re-invocation takes it back."""
    reservations = Reservations(POLICY)
    claim = reservations.make(
        Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1, name="train-x7k2p", generate_name="train-",
                    node="", echoed=True, confirmed=True)
    )  # fmt: skip
    token, _ = reservations.add(claim, 0.0)
    assert claim.confirmed and claim.who == ("ml", "train-x7k2p", "")
    assert reservations.admitted("ml", "train-x7k2p", "train-", pool=T4, node="") is None
    assert reservations.echo("ml", "train-x7k2p", "train-", pool=T4, node="", gpus=1) is None
    made = pod("train-x7k2p", gpus=1, annotations={"gpupool.io/pool": str(T4)})
    assert reservations.shown(pod_from_obj(made, RES)) == token


def test_a_queued_pods_admission_reserves_nothing() -> None:
    """A review for a namespace whose Pods queue (forged or real) is answered with the queue's gate and
    holds nothing until the queue releases the Pod: no reservation, no GPU of a pool, no quota."""
    pol = policy("namespaces:\n  q: {placement: queue, classQuota: {medium: 2, low: 2}}\n")
    index = index_of(fleet(), pol)

    def held() -> tuple[int, int, int]:
        stats = index.capacity.pool_stats()
        used = sum(index.usage.class_used("q", c) for c in pol.classes)
        return index.usage.reservations, sum(s.gpus_free for s in stats), used

    before = held()
    admitter = Admitter(pol, SnapshotInventory(index, "test"))
    for i in range(5):
        verdict = admitter.admit(pod(f"forged-{i}", "q", gpus=2), namespace="q")
        assert verdict.allowed and verdict.placement is None, verdict.message
        assert any(op.get("path") == "/spec/schedulingGates" for op in verdict.patch), verdict.patch
    assert held() == before
    assert before[0] == before[2] == 0
