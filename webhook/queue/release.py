"""Which queued Pods go where now: one pass over the queue, exact, against the leader's pool index.

The pass takes the waiting Pods in order (webhook.queue.waiting) and, for each, the decision admission
would take now, by the one decision in RELEASE mode (webhook.admission.choice), with three differences:

- **Only where it fits now.** A Pod goes to the best-ranked pool with room on one node, among the pools
  that offer the device resource fixed at admission; otherwise it waits. Nothing is ever released to
  wait on a node.
- **Every quota, exactly.** Class and GPU-memory quotas and ResourceQuotas in the forms gpupool counts
  itself are checked against what the namespace holds now, released Pods not bound yet included. The
  `requests.` form is not checked again: Kubernetes charged the Pod to it at creation, gated or not.
- **No jumping ahead, backfill with a bounded wait.** A Pod that waits for a quota leaves that quota to
  the Pods before it: a later Pod does not take from it, but may go elsewhere (another pool, another
  namespace). A Pod that waits for room leaves the room it cannot use now to the later Pods (backfill),
  until it has waited long; then it holds the node closest to fitting it (a gang: the pool), which every
  other release leaves out (webhook.queue.backfill).
- **Gangs.** A workload group with `gpupool.io/group-size: N` is a gang: it goes only when N members
  exist and all its waiting members fit at once, then all together; what it holds meanwhile, when it is
  parked and how a partly released one is completed: webhook.queue.gangs.

Each release decided is applied to the index at once, as the Pod will look once released: the release's
patch applied to the Pod as the index counts it (`Release.released`, webhook.admission.pieces
.patched_info), so the next decision of the pass counts what the API will store; the runner then writes it
(webhook.queue.runner) and `settle`s the index with what the API answered. Pure: no I/O, no clock. A
pass is `read_batch` (the requests, from the Pods alone) then `decide_batch` (against the index), which
is what `plan` does; the caller holds the inventory's lock for `decide_batch`, `plan` and `settle`.
The runner's batches are read with its `Parking` (webhook.queue.parking): across passes a shape that
could not go keeps its answer, and is decided again only once something that answer read has changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from webhook.admission.choice import RELEASE, Ahead, choose, release_to
from webhook.admission.decision import Candidate
from webhook.admission.groups import pods_at_once
from webhook.admission.patch import PatchSpec, release_patch
from webhook.admission.pieces import patched_info
from webhook.admission.request import GpuRequest
from webhook.domain.model import PodInfo, PodKey, PoolKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.memo import NO_MEMO, Memo
from webhook.queue import backfill, gangs
from webhook.queue.batch import Batch, read_batch
from webhook.queue.lines import Lines, Turns, Waits
from webhook.queue.outcomes import Carried, Release, Wait
from webhook.queue.parking import GangWait, Parking, WaitAnswer
from webhook.queue.waiting import Queued


class Plan(NamedTuple):
    releases: list[Release]
    waits: Waits
    decisions: int = 0  # shapes, Pods and gangs decided (the rest were parked, or shared a shape's answer)
    # shapes, Pods and gangs the pass looked at in the index: those decided, and the parked shapes whose
    # counters it read (webhook.queue.parking); a parked shape nothing woke is not visited
    visits: int = 0
    # the steps the pass took (webhook.queue.lines): a Pod decided or passed over, a line left to wait, a
    # request refused (webhook.queue.standing: none while nothing changed); never one per Pod behind a line
    walked: int = 0
    end: Carried | None = None  # where it stood after its last Pod, when it went over every one (no `limit`)


__all__ = ["Batch", "Carried", "Plan", "Release", "Wait", "decide_batch", "plan", "read_batch", "release_one", "settle"]

PAUSE_EVERY = 16  # steps between two calls of decide_batch's `pause`
_GROUPED = -1  # the turns' number of the line of workload groups' Pods


def _stay() -> None:
    return None


def plan(
    queued: Sequence[Queued] | Lines,
    index: PoolIndex,
    policy: Policy,
    *,
    shapes: Memo = NO_MEMO,
    limit: int = 1000,
    now: float | None = None,
) -> Plan:
    """Decide the queue in order: at most `limit` releases, each applied to `index` as it is decided."""
    return decide_batch(read_batch(queued, policy, shapes), index, policy, limit=limit, now=now)


def decide_batch(
    batch: Batch,
    index: PoolIndex,
    policy: Policy,
    *,
    limit: int = 1000,
    pause: Callable[[], None] = _stay,
    now: float | None = None,
) -> Plan:
    """`plan` for a batch read already. `pause` is called between steps: the runner lets go of the
        inventory's lock there now and then, so that a long queue holds up neither the watch nor admissions.
        Whatever changed meanwhile, the pass stays exact: each Pod is looked up in the index when its turn
        comes (a Pod released or deleted meanwhile is passed over), every decision reads the index as it is
        then, and what earlier Pods wait for stays theirs for the rest of the pass. `now` is the queue's clock
    (webhook.queue.waiting: `Queued.since`), for how long a Pod or gang has waited (webhook.queue.backfill);
    None (a preview) counts none as having waited long. With the batch's `parking` (the runner's, kept
    across passes), a shape that could not go is not decided again while nothing its answer read has changed
    (webhook.queue.parking): the answer is the one the decision would give. With the batch's `carried`, the
    pass goes on from where an earlier one ended (its Pods all come after that pass's).

    The Pods are taken in release order by merging the batch's lines (webhook.queue.lines): a Pod of no
    workload group that waits makes every later Pod of its shape wait too (within a pass room and quota only
    get taken, and what it waits for stays blocked), and they leave nothing to the Pods behind them, so its
    line is left there as one run of Waits: a pass takes a step per release, per shape and per Pod of a
    workload group, not per waiting Pod. Room that appears on a pool a Pod before waits for, while the
    pass let go of the lock, is kept for the Pods before for the rest of the pass (the later ones wait
    behind them there): the next pass gives it to the first Pod in order that it fits, not to the next one
    this pass would take; the pass still goes on to its end, so a pool whose room keeps moving never keeps
    it from the Pods that want other pools."""
    carried = batch.carried if batch.carried is not None else Carried()
    ahead = carried.ahead  # what the Pods decided before wait for stays theirs
    parking = batch.parking
    look = _stay if parking is None else lambda: parking.look(index, policy)  # wake what changes woke
    look()
    if parking is not None:
        parking.begin(strict=batch.carried is not None)
    this = _Pass(index, policy, ahead, now, parking)
    # The Pods that hold a node (webhook.queue.backfill) since an earlier pass: only they may find it ready.
    holders = [o for o in index.excluders() if o.startswith(backfill.OWNER)] if now is not None else []
    releases: list[Release] = []
    waits = Waits()
    for wait, pods in batch.invalid:
        waits.first(wait, pods)
    waits.hold_back(batch.held_back)
    judged_gangs = carried.judged_gangs
    shape_waits = carried.shape_waits  # by the shape's identity, as in `read_batch`
    firsts = [(line[0].order, n) for n, (_, line) in enumerate(batch.lines)]
    turns = Turns([*firsts, (batch.grouped[0][0].order, _GROUPED)] if batch.grouped else firsts)

    def advance(n: int, at: int) -> None:
        """The line's next Pod takes its turn (none: the line is done)."""
        line: Sequence[Any] = batch.grouped if n == _GROUPED else batch.lines[n][1]
        if at + 1 < len(line):
            nxt = line[at + 1]
            turns.again((nxt[0] if n == _GROUPED else nxt).order, n, at + 1)

    held_back, is_queued = batch.held_back, index.usage.is_queued
    decisions = steps = 0
    while turns and len(releases) < limit:
        if not steps % PAUSE_EVERY:
            pause()
            look()
            this.keep_appeared()
        steps += 1
        n, at = turns.take()
        if n == _GROUPED:
            q, req = batch.grouped[at]
            advance(n, at)
            if not is_queued(q.key):
                continue  # released already (by this leader's last pass, or another): the watch catches up
            if req.group.size:
                gang_key = (q.key[0], q.view.group)
                if gang_key in judged_gangs:
                    continue
                judged_gangs.add(gang_key)  # judged once, for all its members
                decisions += _judge_gang(batch.gangs[gang_key], this, releases, waits)
                this.took_room()
                look()
                continue
        else:
            req, line = batch.lines[n]
            q = line[at]
            if (held_back and q.key in held_back) or not is_queued(q.key):
                advance(n, at)
                continue
            earlier = shape_waits.get(id(q.view.shape))
            if earlier is not None:  # its shape waits since an earlier pass this one goes on from
                waits.run(earlier, line, at)
                continue
        # A Pod whose held node has its room now lets it go and is decided afresh (its parked answer read
        # the node as kept from everyone, itself included).
        lifted = bool(holders) and backfill.ready(index, q.key, _resource(q), req.pod_total)
        parked = parking.parked(q, req, index, policy, ahead, now) if parking is not None and not lifted else None
        one: Release | Wait
        if parked is not None:
            one, theirs = _waits(q, req, parked, this)
        else:
            decisions += 1
            one, theirs = _one(q, req, this)
        if isinstance(one, Release):
            releases.append(one)
            this.took_room()
            look()
            if n != _GROUPED:
                advance(n, at)
            continue
        waits.one(q.order, one)
        if one.code == "capacity":
            this.waited_for_room(one)
        if n != _GROUPED:  # siblings decide by their group's pools: not one shape's answer
            shape_waits[id(q.view.shape)] = theirs or one
            if at + 1 < len(line):
                waits.run(theirs or one, line, at + 1)  # the rest of its line waits with it
    whole = not turns
    # An answer taken, then woken by what the pass released (or the watch meanwhile): the Waits taken from
    # it may not be its answer now, so the next pass decides the whole queue (webhook.queue.standing).
    standing = whole and (parking is None or not parking.stale)
    if now is not None and whole and batch.carried is None:  # the whole queue: the holds of Pods holding none end
        for owner in index.excluders():
            if owner.startswith(backfill.OWNER) and owner not in this.holding:
                index.exclude_nodes(owner, ())
    if parking is not None and whole:  # a whole pass: the gangs not judged are gone
        if batch.carried is None:  # (going on, the gangs of the pass before are judged as they were)
            parking.keep_gangs(judged_gangs)
        parking.passed(now)
    # A parked shape nothing woke costs no visit.
    return Plan(releases, waits, decisions, decisions, steps + len(batch.invalid), carried if standing else None)


def _judge_gang(gang: list[tuple[Queued, GpuRequest]], this: _Pass, releases: list[Release], waits: Waits) -> int:
    """A gang judged whole at its first member's turn: its members released together, or their Waits (a
    parked answer taken when nothing it read changed); the decisions it took (0 or 1)."""
    index, policy, ahead, now, parking = this.index, this.policy, this.ahead, this.now, this.parking
    members = [m for m in gang if index.usage.is_queued(m[0].key)]
    waiting = [m for m, _ in members]
    at = waiting[0].order
    kept = parking.gang(waiting, ahead, now, policy) if parking is not None else None
    if kept is not None:  # parked, and nothing it read changed: what it holds stays its
        if kept.held is not None:
            ahead.take_room((kept.held,))
        for m in waiting:
            waits.one(at, Wait(m, kept.code, kept.reason, kept.pools))
        this.waited_for_room(Wait(waiting[0], kept.code, kept.reason, kept.pools))
        return 0
    before = frozenset(ahead.pools)  # what the Pods ahead held, as its parked answer will be checked
    outcome, pools, held = _gang(members, members[0][1].group.size, index, policy, ahead, now)
    if isinstance(outcome, Wait):
        for m in waiting:
            waits.one(at, outcome._replace(queued=m))
        this.waited_for_room(outcome)
        if parking is not None:
            answer = GangWait(outcome.code, outcome.reason, outcome.pools, held, pools)
            parking.park_gang(waiting, answer, before, now, index, policy)
    else:
        releases.extend(outcome)
    return 1


@dataclass(frozen=True, slots=True)
class _Pass:
    """What every decision of one pass reads: the index, the policy, what the Pods before wait for, the
    queue's clock (None: a preview) and the runner's parked answers (None: none kept)."""

    index: PoolIndex
    policy: Policy
    ahead: Ahead
    now: float | None
    parking: Parking | None
    held_pools: set[PoolKey] = field(default_factory=set)  # pools a node of which a Pod before holds
    holding: set[str] = field(default_factory=set)  # the owners (backfill.owner_of) that hold a node now
    # The room of the pools Pods before wait for, as they read it: once it moves in a pause (room appeared
    # while the lock was let go), it is theirs for the rest of the pass, so no later Pod takes it out of turn.
    room_seen: dict[PoolKey, int] = field(default_factory=dict)

    def waited_for_room(self, wait: Wait) -> None:
        if wait.code == "capacity":
            seen = self.room_seen
            for pool in wait.pools:
                if pool not in seen:  # (a pool's room as the first Pod that waits for it read it)
                    seen[pool] = self.index.capacity.room_changes(pool)

    def took_room(self) -> None:
        """The pass itself took room (a release, a gang tried): only less room for the Pods before."""
        for pool in self.room_seen:
            self.room_seen[pool] = self.index.capacity.room_changes(pool)

    def keep_appeared(self) -> None:
        """After a pause: the pools whose room moved meanwhile are held for the Pods before (Ahead.take_room)."""
        capacity = self.index.capacity
        moved = [pool for pool, seen in self.room_seen.items() if capacity.room_changes(pool) != seen]
        if moved:
            self.ahead.take_room(moved)
            self.took_room()


def _resource(q: Queued) -> str:
    """The device resource a queued Pod requests (fixed at admission)."""
    return next((r for r, n in q.info.gpu_requests.items() if n), "")


def _one(q: Queued, req: GpuRequest, this: _Pass) -> tuple[Release | Wait, Wait | None]:
    """The Pod released, or why it waits; and when it holds a pool, what the later Pods of its shape wait
    with (for room, not holding it: it is held for this one)."""
    choice = choose(req, q.view, this.index, this.policy, this.ahead.mode)
    if choice.chosen is not None:
        return _apply(q, req, choice.chosen, this.index), None
    long = backfill.waited_long(q.since, this.now, this.policy)
    closest = backfill.closest_waited(choice, req.pod_total) if long else None
    answer = WaitAnswer(choice.wait or "capacity", choice.denial, choice.waits_for, long, closest)
    waits = _waits(q, req, answer, this)
    if this.parking is not None:  # after its hold: parked with the index as the hold left it
        this.parking.park(q, req, choice, this.index, this.policy, answer)
    return waits


def _waits(q: Queued, req: GpuRequest, answer: WaitAnswer, this: _Pass) -> tuple[Wait, Wait | None]:
    """What a Pod that waits (decided now, or parked: the same rule for both) leaves to the Pods behind it:
    the quotas it waits for; once it has waited long, the node it holds already, else the node closest to
    fitting it of the pool closest to fitting it, unless a Pod before it holds one of that pool already;
    else nothing (backfill: webhook.queue.backfill). With what the later Pods of its shape wait with when
    it holds a node."""
    this.ahead.leave(req, answer.wait, answer.waits_for, this.index, this.policy)
    one = Wait(q, answer.wait, answer.denial, answer.waits_for)
    if answer.closest is None or this.now is None:
        return one, None  # the room it cannot use now is the later Pods' meanwhile
    resource = _resource(q)
    held = backfill.held_node(this.index, q.key, resource)
    pool = answer.closest if held is None else held[1]
    if held is None and (pool in this.ahead.pools or pool in this.held_pools):
        return one, None  # its turn there comes after the Pod's before it
    node = backfill.closest_node(this.index, pool, resource, held[0] if held else "")
    if node is None:
        return one, None
    owner = backfill.owner_of(q.key)
    this.index.exclude_nodes(owner, (node,))
    this.held_pools.add(pool)
    this.holding.add(owner)
    return one._replace(reason=f"{answer.denial}; node {node} of pool {pool} is held for it"), one


def _gang(
    members: list[tuple[Queued, GpuRequest]],
    size: int,
    index: PoolIndex,
    policy: Policy,
    ahead: Ahead,
    now: float | None,
) -> tuple[list[Release] | Wait, tuple[PoolKey, ...], PoolKey | None]:
    """The gang's waiting members, all to one pool where they fit at once, or why they wait (what it
    holds meanwhile, if anything: webhook.queue.gangs); with the pools whose room it read, and the pool it
    took from the Pods behind it (None: none)."""
    q0, req0 = members[0]
    group = q0.view.group
    placed_pools = index.usage.group_pools(q0.key[0], group)
    placed = sum(placed_pools.values())
    if placed + len(members) < size:
        return Wait(q0, "gang", f"group {group}: {placed + len(members)} of {size} Pods exist"), (), None
    never = gangs.parked(members, index, policy)
    if never:
        return Wait(q0, "parked", never), (), None
    # The pools in the order its first member would try them (its group's pool first); a gang with members
    # released already goes on only where they are.
    at_home = gangs.home(placed_pools)
    ordered = choose(req0, q0.view, index, policy, RELEASE).candidates
    if at_home is not None:
        ordered = [c for c in ordered if c.pool == at_home]
    total = sum(req.pod_total for _, req in members)
    for c in ordered:
        if c.pool in ahead.pools or pods_at_once(c, req0.pod_total) < len(members):
            continue
        done: list[Release] = []
        for q, req in members:
            release = _to_pool(q, req, c.pool, index, policy)
            if release is None:
                break
            done.append(release)
        if len(done) == len(members):
            return done, (), None
        for release in reversed(done):  # not all of them fit together: none goes
            settle(index, release, None)
    held = gangs.room_to_hold(ordered, members, at_home, now, policy)
    if held is not None:
        ahead.take_room((held,))
    read = tuple(c.pool for c in ordered)
    if at_home is not None:
        return (
            Wait(
                q0,
                "repair",
                f"group {group}: {placed} of {size} Pods released already; the other {len(members)} ({total} devices) "
                f"wait for room on pool {at_home}, held for them",
                (at_home,),
            ),
            read,
            held,
        )
    meanwhile = f"pool {held} is held for it" if held is not None else "other Pods may use the room meanwhile"
    room = f"no pool has room for its {len(members)} Pods ({total} devices) at once"
    pools = (held,) if held is not None else tuple(c.pool for c in ordered)
    return Wait(q0, "capacity", f"group {group}: {room}; {meanwhile}", pools), read, held


def release_one(
    q: Queued, index: PoolIndex, policy: Policy, *, pool: PoolKey | None = None, quotas: bool = True
) -> Release | Wait:
    """One Pod released by hand (`kubectl gpupool release`), decided as a pass decides it, with the same
    patch, but alone: not behind the Pods before it, and not with its gang. To `pool` only when given;
    past gpupool's own quotas when not `quotas`. A release is applied to `index`, as in a pass."""
    batch = read_batch([q], policy)
    if batch.invalid:
        return batch.invalid[0][0]
    _, req = batch.pods[0]
    choice = choose(req, q.view, index, policy, release_to(pool, quotas=quotas))
    if choice.chosen is not None:
        return _apply(q, req, choice.chosen, index)
    return Wait(q, choice.wait or "capacity", choice.denial)


def _to_pool(q: Queued, req: GpuRequest, pool: PoolKey, index: PoolIndex, policy: Policy) -> Release | None:
    """The Pod released to `pool` if it fits there now within its quotas, applied to the index; else None."""
    chosen = choose(req, q.view, index, policy, release_to(pool)).chosen
    return _apply(q, req, chosen, index) if chosen is not None else None


def _apply(q: Queued, req: GpuRequest, c: Candidate, index: PoolIndex) -> Release:
    """The release to candidate `c`, applied to the index as the Pod will be once released: the patch sent,
    applied to the Pod as the index counts it."""
    spec = PatchSpec(c.constraint, c.gpu_taints, req.container_index, c.resource, 0, str(c.pool))
    patch = release_patch(q.view.shape, spec, q.resource_version)
    released = patched_info(q.info, patch)
    before = index.usage.pod_info(q.key)
    index.upsert_pod(released, q.key)
    return Release(q, c.pool, list(patch.ops), released, before)


def settle(index: PoolIndex, release: Release, answer: PodInfo | None) -> None:
    """After the write: the index counts the Pod as the API answered (`answer`), or, when the write failed
    (None), as the index counted it when the release was decided (which may be newer than the queue's
    view of it: the watch updates the index first); unless the watch has shown a newer version since."""
    if index.usage.pod_info(release.queued.key) is not release.released:
        return  # the watch was faster: what it showed stands
    before = release.before if release.before is not None else release.queued.info
    index.upsert_pod(answer if answer is not None else before, release.queued.key)


def waiting_reasons(waits: Iterable[Wait]) -> dict[PodKey, Wait]:
    return {w.queued.key: w for w in waits}
