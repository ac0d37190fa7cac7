"""Workload groups at decision time: siblings stay together, and a group's first Pod looks for room for all.

The decision (webhook.admission.decision) ranks the pools for the Pod's request; this module then
applies the Pod's group (webhook.domain.groups) to it, asked by the one decision
(webhook.admission.choice):

- **Siblings stay together.** When the group's Pods or reservations already hold a pool (the one with
  most of them), the Pod goes there whenever one of its nodes fits the Pod, even if the ranking alone
  would pick another. When none fits, `gpupool.io/group-policy: prefer` (the default) places it by the
  usual rules with the warning `group <name> split across pools A and B` (and waits with the group
  rather than elsewhere when no pool fits at all); `strict` keeps it on the group's pool and follows
  onNoCapacity (warn and wait, or deny).
- **Room for the whole group.** With `gpupool.io/group-size: N`, the group's first Pod only takes a pool
  that can hold N Pods of its shape at once: per node floor(free / GPUs per Pod), with the GPUs held for
  reservations and pinned Pods already taken out. If none can, onNoCapacity applies, and the message says
  how many of the N fit where.

Where the group's Pods are is read from the ledger (`PoolIndex.group_pools`: one lookup, whatever the
number of Pods) at decision time, so none of this is ever memoised: the group is who the Pod is, and
where its siblings are changes with every admission. A Pod that arrives already placed
(`gpupool.io/pool`) keeps its pool; its group is only reported.
"""

from __future__ import annotations

from webhook.admission.decision import Candidate, Decision
from webhook.admission.request import GpuRequest
from webhook.admission.verdict import GroupNote, Reason
from webhook.domain.model import PoolKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.quotas.checks import pool_quota_problem

MAX_WARNING_CHARS = 120  # kubectl shows each warning; kube-apiserver may cut longer ones


def decide_for_group(
    decision: Decision, req: GpuRequest, group: str, index: PoolIndex, policy: Policy
) -> tuple[Decision, GroupNote | None]:
    """The decision once the Pod's group is taken into account, and what to report of the group."""
    if not group and not req.group.size:
        return decision, None
    pools = index.usage.group_pools(req.namespace, group) if group else {}
    if not pools:
        note = GroupNote(group, None, 0) if group else None
        if req.group.size and req.pool_pin is None:
            return _room_for_all(decision, req, group or "(none)", policy), note
        return decision, note
    home = max(sorted(pools), key=lambda pool: pools[pool])  # most members; ties: the first pool by name
    note = GroupNote(group, home, pools[home])
    if req.pool_pin is not None:
        return decision, note
    return _with_siblings(decision, req, group, home, index=index, policy=policy), note


def _with_siblings(
    decision: Decision, req: GpuRequest, group: str, home: PoolKey, *, index: PoolIndex, policy: Policy
) -> Decision:
    ours = next((c for c in decision.candidates if c.pool == home), None)
    if ours is not None and ours.fits:
        if decision.chosen == ours:
            return decision
        return decision._replace(chosen=ours, warnings=(), denial="", denial_reason="")
    if req.group.policy == "strict":
        if ours is None:
            why = _why_not(decision, req, home, index, policy)
            return _deny(
                decision,
                f"group {group} is on pool {home}, which the Pod cannot use: {why}; gpupool.io/group-policy strict "
                "keeps the group on one pool",
                "group",
            )
        if policy.defaults.on_no_capacity == "deny":
            return _deny(
                decision,
                f"no capacity: no node of pool {home}, where group {group} is, has {req.pod_total} free "
                f"{req.vendor.resource} (at most {ours.max_free}); gpupool.io/group-policy is strict and policy "
                "onNoCapacity is deny",
                "no-capacity",
            )
        return decision._replace(chosen=ours, warnings=(_waiting(ours, req, group),), denial="", denial_reason="")
    chosen = decision.chosen
    if chosen is None:
        return decision
    if not chosen.fits and ours is not None:  # nothing fits anywhere: wait with the group, not apart from it
        return decision._replace(chosen=ours, warnings=(_waiting(ours, req, group),))
    if chosen.pool == home:
        return decision
    return decision._replace(warnings=(*decision.warnings, _split(group, home, chosen.pool)))


def _room_for_all(decision: Decision, req: GpuRequest, group: str, policy: Policy) -> Decision:
    """The group's first Pod: the best-ranked pool that holds `size` Pods of its shape at once."""
    size = req.group.size
    room = [(c, pods_at_once(c, req.pod_total)) for c in decision.candidates]
    chosen = next((c for c, n in room if n >= size), None)
    if chosen is not None:
        if chosen == decision.chosen:
            return decision
        warnings: tuple[str, ...] = ()
        if chosen.fallback:
            warnings = (_cut(f"gpupool: fell back to class {chosen.pool.gpu_class} ({chosen.pool.product}) for room "
                             f"for the {size} Pods of group {{group}}", group),)  # fmt: skip
        return decision._replace(chosen=chosen, warnings=warnings, denial="", denial_reason="")
    if decision.chosen is None:
        return decision
    where = ", ".join(f"{n} on {c.pool.product}" for c, n in sorted(room, key=lambda cn: -cn[1])[:3])
    if policy.defaults.on_no_capacity == "deny":
        return _deny(
            decision,
            f"no capacity: group {group} needs room for {size} Pods of {req.pod_total} {req.vendor.resource} at "
            f"once, and no pool has it ({where}); policy onNoCapacity is deny",
            "no-capacity",
        )
    best = next(n for c, n in room if c == decision.chosen)
    note = _cut(f"gpupool: {best} of the {size} Pods of group {{group}} fit on {decision.chosen.pool.product} now; "
                "the rest will wait", group)  # fmt: skip
    return decision._replace(warnings=(*decision.warnings, note))


def pods_at_once(candidate: Candidate, gpus: int) -> int:
    """How many Pods of `gpus` GPUs the candidate's nodes hold at once: per node floor(free / gpus),
    free once the pool's holds (reservations, pinned Pods not on a node yet) are placed."""
    return sum(nodes * (free // gpus) for g in candidate.groups for free, nodes in g.buckets.items()) if gpus else 0


def _why_not(decision: Decision, req: GpuRequest, home: PoolKey, index: PoolIndex, policy: Policy) -> str:
    """Why the group's pool is not a candidate for this Pod."""
    rejected = next((r for r in decision.rejections if r.pool == home), None)
    if rejected is not None:
        return "; ".join(rejected.reasons)
    if home.vendor != req.vendor.name:
        return f"it is not a {req.vendor.name} pool"
    return pool_quota_problem(req, home, index, policy)[0] or "it is not in the inventory now"


def _deny(decision: Decision, message: str, reason: Reason) -> Decision:
    return decision._replace(chosen=None, denial=message, warnings=(), denial_reason=reason)


def _waiting(c: Candidate, req: GpuRequest, group: str) -> str:
    return _cut(f"gpupool: no {c.pool.product} node has {req.pod_total} free GPUs now; the Pod will wait with group "
                "{group}", group)  # fmt: skip


def _split(group: str, home: PoolKey, other: PoolKey) -> str:
    a, b = (home.product, other.product) if home.product != other.product else (str(home), str(other))
    return _cut(f"gpupool: group {{group}} split across pools {a} and {b}", group)


def _cut(template: str, group: str) -> str:
    """`template` with `{group}` filled in, the group's name shortened so the warning stays within
    MAX_WARNING_CHARS (a group named after a long owner can take 300 characters)."""
    room = MAX_WARNING_CHARS - len(template) + len("{group}")
    name = group if len(group) <= room else group[: max(room - 3, 8)] + "..."
    return template.replace("{group}", name)
