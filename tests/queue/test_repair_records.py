"""The room a gang left half released waits for is in the release record while it waits
(webhook.queue.records): recorded again by whichever leader repairs it, so an admission through any
replica counts it, not only for the `reservationSeconds` of the record the killed leader made."""

from __future__ import annotations

from tests.builders import gpu_node, index_of, policy
from tests.queue.fakes import Events, Inventory, Leading, SlowApi
from tests.queue.gangcases import QUEUE, START, members
from tests.queue.helpers import busy, enqueue
from webhook.pools.charges import Charge, pending
from webhook.pools.kubeobj import pod_from_obj
from webhook.queue.release import plan, settle
from webhook.queue.runner import Runner
from webhook.queue.waiting import Waiting

WALL = 1_000_000.0


class Store:
    """The charges as the API holds them, written only at the version they were read at."""

    def __init__(self) -> None:
        self.charges: list[Charge] = []
        self.version = 1

    def read(self) -> tuple[list[Charge], str]:
        return list(self.charges), str(self.version)

    def write(self, charges: list[Charge], version: str) -> bool:
        if version != str(self.version):
            return False
        self.charges, self.version = list(charges), self.version + 1
        return True


def test_a_new_leader_records_the_room_a_half_released_gang_waits_for_until_it_is_repaired() -> None:
    """Four 2-GPU members on one 8-GPU T4; the killed leader's record of them has expired, g-0 and g-1 are
    released, a `now` Pod holds 4 GPUs. The new leader's pass records the 4 GPUs g-2 and g-3 wait for: a
    replica whose watch shows the gang's released members and the `now` Pod gone counts them, and keeps
    counting them as passes go on past `reservationSeconds`; once the room is back the gang completes and
    the record counts its members until every watch shows them (before: nothing was recorded while it
    waited, and the room was any `now` Pod's)."""
    pol = policy(QUEUE)
    nodes = [gpu_node("t4-0", "Tesla-T4", 8)]
    index, waiting = index_of(nodes, pol), Waiting(pol, clock=lambda: START)
    gang = members(4, 4, 2, pol, index)
    enqueue(gang, index, waiting)
    first = plan(waiting.ordered(), index, pol, now=START)
    for release in first.releases[2:]:  # two of four PATCHes reached the API, then the leader was killed
        settle(index, release, None)
    index.upsert_pod(pod_from_obj(busy("t4-0", 4, name="now"), pol.gpu_resources, pol.partition_prefixes))
    other = index_of([*nodes], pol)  # another replica: it shows the gang's two released members
    for release in first.releases[:2]:
        other.upsert_pod(release.released, release.queued.key)
    store, clock = Store(), [WALL]
    api = SlowApi({(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in gang}, together=1)
    runner = Runner(Inventory(index), waiting, Leading(), api, events=Events(), charges=store, wall=lambda: clock[0])  # type: ignore[arg-type]
    for _ in range(4):  # passes over two `reservationSeconds`
        runner.run_pass()
        with pending(other, store.charges, clock[0], 0.0):
            assert other.usage.class_used("q", "medium") == 8, store.charges  # 2 x 2 released, 2 x 2 waiting
        clock[0] += pol.defaults.reservation_seconds / 2
    index.remove_pod(("other", "now-t4-0"))
    runner.run_pass()
    assert all(not index.usage.is_queued(("q", f"g-{k}")) for k in range(4))
    with pending(other, store.charges, clock[0], 0.0):
        assert other.usage.class_used("q", "medium") == 8
