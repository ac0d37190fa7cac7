"""A gang judged whole: could the N Pods of a workload group with `gpupool.io/group-size: N` ever be
released together?

A gang goes all at once or not at all (webhook.queue.release), so judging its members one by one lets
through gangs that can never go: five 1-GPU members against `classQuota {medium: 4}`, each within the
quota alone, or three 4-GPU members on a fleet whose nodes hold two such Pods in all. `gang_problem` is
the one rule, asked by admission (webhook.admission.queued: the Pod is refused) and by the queue's leader
(webhook.queue.gangs: the gang is parked, holding nothing), against every pool the Pod matches:

- **Quota**: the gang's total, N x the Pod's devices (a gang's members are Pods of one template), against
  every quota's hard limit in that pool (class quota, GPU-memory quota, ResourceQuotas), as one request.
- **Room**: how many Pods of its shape the pool's nodes could hold at once if every one of them were
  empty (per node floor(allocatable / devices per Pod)): total capacity, not what is free now.

A pool passes when the gang is within its hard limits and it could ever hold N members; the gang can
never go when no pool passes, and the problem names what stops it: the quota when every pool is over a
quota, else the room.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, NamedTuple

from webhook.admission.decision import Candidate
from webhook.admission.request import GpuRequest
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.quotas.checks import hard_limit_problem


class GangAsk(NamedTuple):
    """The whole gang as one request, for the quota checks (webhook.pools.quotas.checks.Ask)."""

    namespace: str
    pod_total: int


class GangProblem(NamedTuple):
    """Why a gang can never go: `code` quota | room, and the words."""

    code: Literal["quota", "room"]
    message: str


def pods_ever(candidate: Candidate, devices: int) -> int:
    """How many Pods of `devices` devices the candidate's nodes could hold at once, all of them empty."""
    if devices <= 0:
        return 0
    return sum(nodes * (size // devices) for g in candidate.groups for size, nodes in g.sizes.items())


def gang_problem(
    req: GpuRequest, group: str, candidates: Iterable[Candidate], index: PoolIndex, policy: Policy
) -> GangProblem | None:
    """Why the gang of the Pod whose request is `req` could never be released whole, on any of
    `candidates` (the pools it matches); None when one pool could take it, or it is no gang."""
    size = req.group.size
    candidates = list(candidates)
    if size <= 1 or not group or not candidates:
        return None
    whole = GangAsk(req.namespace, size * req.pod_total)
    over_quota = ""
    room: list[tuple[Candidate, int]] = []
    for c in candidates:
        problem = hard_limit_problem(whole, c.pool, index, policy, resource=c.resource, memory_mib=c.memory_mib)[0]
        if problem:
            over_quota = over_quota or problem
            continue
        ever = pods_ever(c, req.pod_total)
        if ever >= size:
            return None
        room.append((c, ever))
    need = f"its {size} Pods of {req.pod_total} {req.vendor.resource} ({whole.pod_total} in all) at once"
    if not room:
        return GangProblem("quota", f"group {group} can never be released whole: {need} are over the {over_quota}")
    best, ever = max(room, key=lambda cn: cn[1])
    largest = max((size for g in best.groups for size in g.sizes), default=0)
    return GangProblem(
        "room",
        f"group {group} can never be released whole: no pool could ever hold {need}, even empty (at most {ever} "
        f"on {best.pool.product}, whose largest node has {largest})",
    )
