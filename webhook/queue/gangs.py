"""A gang in the queue: judged whole, never blocking others for nothing, never starved, and repaired.

A workload group with `gpupool.io/group-size: N` goes only when N members exist and all its waiting
members fit at once on one pool, then all together (webhook.queue.release). What this module decides of
a gang that cannot go now (one function per rule):

- **Parked** (`parked`): a gang that could never go whole, by the one rule admission refuses such a gang
  with (webhook.admission.gang: its total over a quota's hard limit, or more members than the fleet could
  hold at once), e.g. once a quota was lowered or nodes went away after it was admitted. It waits with
  code `parked` and the reason naming the quota or the room, and holds nothing: no pool, no quota.
- **Waiting for room** (`room_to_hold`): a gang that could go but not now leaves the room it cannot use
  yet to the Pods behind it; they are released into it. That could starve the gang for ever behind a
  stream of small Pods, so once its oldest member has waited `defaults.queueHoldAfterSeconds` in this
  leader's queue, the gang holds the pool closest to fitting it (most members fit there now): no later Pod
  is released into that pool until the gang goes, and as Pods there finish the room adds up. The same rule
  as a single Pod's (webhook.queue.backfill).
- **Repaired** (`home`): a gang with members released already (a leader stopped part way through its
  releases, e.g. SIGKILLed after two of four PATCHes) goes on where it is: its other members go only to
  the pool of their siblings, and that pool is held for them at once, whatever their wait, so the gang
  completes as soon as the room frees. Kubernetes allows no scheduling gate to be added back on update
  (kube-apiserver's pod validation: only removing gates is allowed), so released members cannot be
  re-gated; they stay released, and the rest follow them.
"""

from __future__ import annotations

from webhook.admission.choice import QUEUE, choose
from webhook.admission.decision import Candidate
from webhook.admission.gang import gang_problem
from webhook.admission.request import GpuRequest
from webhook.domain.model import PoolKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.queue.backfill import closest, waited_long
from webhook.queue.waiting import Queued


def parked(members: list[tuple[Queued, GpuRequest]], index: PoolIndex, policy: Policy) -> str:
    """Why the gang of `members` (its waiting members, in order) could never go whole; "" when it could."""
    q0, req0 = members[0]
    choice = choose(req0, q0.view, index, policy, QUEUE)
    if not choice.decision.candidates:
        why = choice.denial or "no pool it may use is left"
        return f"group {q0.view.group} can never be released whole: {why}; parked, holding nothing"
    problem = gang_problem(req0, q0.view.group, choice.decision.candidates, index, policy)
    return f"{problem.message}; parked, holding nothing" if problem is not None else ""


def home(pools: dict[PoolKey, int]) -> PoolKey | None:
    """The pool of the gang's members released already (most of them; ties: first by name), None if none."""
    return max(sorted(pools), key=lambda pool: pools[pool]) if pools else None


def room_to_hold(
    ordered: list[Candidate],
    members: list[tuple[Queued, GpuRequest]],
    at_home: PoolKey | None,
    now: float | None,
    policy: Policy,
) -> PoolKey | None:
    """The pool the gang, which cannot go now, holds against the Pods behind it: its released siblings'
    pool, else once its oldest member has waited long (at `now`, the queue's clock; None: never) the pool
    closest to fitting it (webhook.queue.backfill); None when it holds nothing yet."""
    if at_home is not None:
        return at_home
    if not waited_long(min(q.since for q, _ in members), now, policy):
        return None
    return closest(ordered, members[0][1].pod_total)
