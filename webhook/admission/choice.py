"""The one decision: rank the pools, pass over those a quota stops, conclude, apply the workload group,
then hold the choice to the namespace's ResourceQuotas. Every caller that decides where a Pod goes asks
`choose`, and says how with one `Mode`:

- **ADMIT** (admission, `gpupool explain`, the hints): placed now. Pools over the class or GPU-memory
  quota the namespace uses now are passed over; the Pod's group keeps it with its siblings, or looks for
  room for all of a new group; the chosen pool's ResourceQuotas must have room now.
- **QUEUE** (admission in a namespace that queues): queued now, placed later. No quota the namespace
  uses now counts (a queued Pod holds nothing); the first pool, best first, whose hard limits the
  request alone is within is the one whose device resource is fixed now.
- **RELEASE** (the queue's leader, and anything that releases as it would): released now, exactly. As
  ADMIT, but only to a pool with room on one node now, not to one the Pods ahead in the queue wait for
  (`Ahead`), and against the ResourceQuotas as charged (the `requests.` form counted the Pod at its
  creation). `release_to` restricts it to one pool (a gang's member goes where its gang goes), and for
  a release by hand may set gpupool's own quotas aside (`--ignore-quota`).

The answer is a `Choice`: the decision with every candidate and rejection (its `explain` lines), where
the Pod goes (`chosen`), else why not (`denial`, `reason`), the group note, and for a release what the
Pod waits for. `quota_stop` reads from an ADMIT choice the pool a quota alone stops the Pod at now (for
the hints). The workload group is read from the ledger at every call, never memoised: it is who the Pod
is, and changes with every admission.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from webhook.admission.decision import Candidate, Decision, PassedOver, Ranked, conclude, rank
from webhook.admission.groups import decide_for_group
from webhook.admission.misses import Rejection
from webhook.admission.pod import PodView
from webhook.admission.request import GpuRequest
from webhook.admission.verdict import GroupNote, Reason
from webhook.domain.devices import device_kind
from webhook.domain.model import PoolKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.quotas.checks import (
    QuotaKey,
    charged_quota_problem,
    hard_limit_problem,
    has_pool_quotas,
    pool_quota_problem,
    quota_keys,
    resource_quota_problem,
)

WaitCode = Literal["capacity", "quota", "behind"]  # what a Pod the queue does not release waits for
QUOTA_DENIALS = ("class-quota", "memory-quota")  # a decision's denials that mean a quota alone


class Ahead:
    """What the Pods before this one in a pass of the queue wait for: their pools (for room) and their
    quotas. A later Pod does not take them, but may go elsewhere. One per pass (webhook.queue.release),
    decided in its `mode`: RELEASE within the pass."""

    def __init__(self) -> None:
        self.pools: set[PoolKey] = set()
        self.quotas: set[QuotaKey] = set()
        self.mode = Mode("release", ahead=self)

    def holds(self, req: GpuRequest, pool: PoolKey, index: PoolIndex, policy: Policy) -> bool:
        """Does a Pod ahead wait for room in `pool`, or for a quota a release there would take from?"""
        if pool in self.pools:
            return True
        return bool(self.quotas) and bool(quota_keys(req.namespace, (pool,), index, policy) & self.quotas)

    def take(self, req: GpuRequest, choice: Choice, index: PoolIndex, policy: Policy) -> None:
        """Leave to the Pod of `choice`, which waits, what it waits for that later Pods must not take."""
        self.leave(req, choice.wait, choice.waits_for, index, policy)

    def leave(
        self, req: GpuRequest, wait: str | None, waits_for: tuple[PoolKey, ...], index: PoolIndex, policy: Policy
    ) -> None:
        """Leave to a Pod that waits for `wait` (a Choice's) what later Pods must not take: for a quota, the
        quotas a release to `waits_for` would take from. The room a Pod waits for is the later Pods' to use
        meanwhile (backfill), unless it holds a pool (`take_room`, webhook.queue.backfill). (`take`, for a
        wait remembered from an earlier pass: webhook.queue.parking.)"""
        if wait == "quota":
            self.quotas |= quota_keys(req.namespace, waits_for, index, policy)

    def take_room(self, pools: Iterable[PoolKey]) -> None:
        """Leave the room in `pools` to a Pod or a gang that waits for it (which room, and when:
        webhook.queue.backfill)."""
        self.pools.update(pools)


@dataclass(frozen=True, slots=True)
class Mode:
    """How a Pod is decided: ADMIT, QUEUE or RELEASE (see the module docstring), and for a release the
    pass it is part of (`ahead`) and the one pool it may go to (`to`, None for any)."""

    kind: Literal["admit", "queue", "release"]
    ahead: Ahead | None = field(default=None, compare=False)
    to: PoolKey | None = None
    # Whether gpupool's own quotas (class, GPU memory, the ResourceQuota forms it counts) hold; False
    # only for a release by hand past them (`kubectl gpupool release --ignore-quota`).
    quotas: bool = True


ADMIT, QUEUE, RELEASE = Mode("admit"), Mode("queue"), Mode("release")


def release_to(pool: PoolKey | None, *, quotas: bool = True) -> Mode:
    """RELEASE to `pool` or not at all (a member of a gang, released with the others to the gang's pool;
    a release by hand with `--pool`), any pool when None; past gpupool's quotas when not `quotas`."""
    return Mode("release", to=pool, quotas=quotas)


class Choice(NamedTuple):
    """The one decision's answer. (A NamedTuple: one is built per admission.)"""

    mode: Mode  # how it was decided
    decision: Decision  # every candidate (best first) and rejection, with the group applied: what explains it
    chosen: Candidate | None  # where the Pod goes (ADMIT: it may wait there under onNoCapacity warn)
    denial: str = ""  # else why not: a denial's words (ADMIT, QUEUE), or what it waits for (RELEASE)
    reason: Reason = ""  # the code of an ADMIT or QUEUE denial
    group: GroupNote | None = None  # the Pod's workload group, and where its siblings are
    wait: WaitCode | None = None  # RELEASE: what it waits for (`denial` says it in words)
    # RELEASE: the pools whose room (capacity, behind: that Pods ahead wait for) or quotas (quota) it waits for
    waits_for: tuple[PoolKey, ...] = ()
    # RELEASE: the candidates with room it looked at, in order, and whether a Pod ahead held each (it went
    # on past those held): all that its answer read of the Pods ahead (webhook.queue.parking).
    held: tuple[tuple[PoolKey, bool], ...] = ()

    def explain(self) -> tuple[str, ...]:
        """A line per pool considered, `chosen` only for where the Pod goes: the pool a ResourceQuota
        denies it on (the decision's own choice) says `denied by quota`."""
        return self.decision.explain(self.chosen, "denied by quota" if self.reason == "quota" else "")

    @property
    def candidates(self) -> list[Candidate]:
        """The candidates in the order to try: the decision's own first (a group's pool), then by rank."""
        candidates = list(self.decision.candidates)
        chosen = self.decision.chosen
        if chosen is not None and chosen in candidates:
            candidates.remove(chosen)
            candidates.insert(0, chosen)
        return candidates


def choose(req: GpuRequest, pod: PodView, index: PoolIndex, policy: Policy, mode: Mode) -> Choice:
    """Where the Pod whose request is `req` goes now, decided as `mode` says (the module docstring)."""
    ranked = rank(req, index, policy)
    if mode.kind == "queue":
        return _queued(req, conclude(req, index, policy, ranked), index, policy)
    passed = (
        _passed_over(req, ranked, index, policy) if mode.quotas and has_pool_quotas(req.namespace, policy) else None
    )
    decision = conclude(req, index, policy, ranked, passed)
    note = None
    # The group is read from the ledger now, after the (memoised) plan: it is identity, not shape. A new
    # group's first Pod looks for room for all at admission; the queue releases a gang whole itself.
    if mode.to is None and (pod.group or (req.group.size and mode.kind == "admit")):
        decision, note = decide_for_group(decision, req, pod.group, index, policy)
    if mode.kind == "admit":
        chosen = decision.chosen
        if chosen is None:
            return Choice(mode, decision, None, decision.denial, decision.denial_reason, note)
        problem = resource_quota_problem(req, index, policy, chosen.resource)
        if problem:
            return Choice(mode, decision, None, problem, "quota", note)
        return Choice(mode, decision, chosen, group=note)
    return _released(req, Choice(mode, decision, None, group=note), index, policy)


def _passed_over(req: GpuRequest, ranked: Ranked, index: PoolIndex, policy: Policy) -> PassedOver:
    """The candidates whose class would exceed the namespace's per-class quota, or whose devices its GPU
    memory quota, now (each a rejection saying so)."""
    kept: list[Candidate] = []
    over: list[Rejection] = []
    first: tuple[str, Reason] = ("", "")
    for c in ranked[0]:
        problem = pool_quota_problem(req, c.pool, index, policy)
        if problem[0]:
            over.append(Rejection(c.pool, (problem[0],)))
            first = first if first[0] else problem
        else:
            kept.append(c)
    return PassedOver(kept, over, *first)


def _queued(req: GpuRequest, decision: Decision, index: PoolIndex, policy: Policy) -> Choice:
    """QUEUE: the best candidate the request alone is within every hard limit of; else the first limit."""
    if not decision.candidates:
        return Choice(QUEUE, decision, None, decision.denial, decision.denial_reason or "no-match")
    first: tuple[str, Reason] | None = None
    for c in decision.candidates:
        problem = hard_limit_problem(req, c.pool, index, policy, resource=c.resource, memory_mib=c.memory_mib)
        if not problem[0]:
            return Choice(QUEUE, decision, c)
        first = first or problem
    assert first is not None
    return Choice(QUEUE, decision, None, *first)


def _released(req: GpuRequest, choice: Choice, index: PoolIndex, policy: Policy) -> Choice:
    """RELEASE: the first candidate with room on one node now that no Pod ahead waits for, within the
    quotas as charged; else what the Pod waits for."""
    decision, mode = choice.decision, choice.mode
    ordered = choice.candidates
    if mode.to is not None:
        ordered = [c for c in ordered if c.pool == mode.to]
    if not ordered:
        if decision.denial_reason in QUOTA_DENIALS:
            return choice._replace(denial=decision.denial, wait="quota", waits_for=_pools_of(decision.rejections))
        return choice._replace(denial=decision.denial or "no pool it may use is left", wait="capacity")
    behind: list[PoolKey] = []
    for c in ordered:
        if not c.fits:
            continue
        if mode.ahead is not None and mode.ahead.holds(req, c.pool, index, policy):
            behind.append(c.pool)
            continue
        held = (*((pool, True) for pool in behind), (c.pool, False))
        over = charged_quota_problem(req, index, policy, c.resource) if mode.quotas else ""
        if over:
            return choice._replace(denial=over, wait="quota", waits_for=(c.pool,), held=held)
        return choice._replace(chosen=c, held=held)
    if behind:
        return choice._replace(
            denial=f"behind Pods of higher priority or older that wait for {products(behind)}",
            wait="behind",
            waits_for=tuple(behind),
            held=tuple((pool, True) for pool in behind),
        )
    pools = tuple(c.pool for c in ordered)
    return choice._replace(
        denial=f"no node of {products(pools)} has {req.pod_total} free now", wait="capacity", waits_for=pools
    )


class QuotaStop(NamedTuple):
    """Where a quota alone stops a Pod now: the pool, its device kind, and the quota's words."""

    pool: PoolKey
    kind: str
    denial: str


def quota_stop(choice: Choice, req: GpuRequest, index: PoolIndex, policy: Policy) -> QuotaStop | None:
    """The pool an ADMIT `choice` would place the Pod in, with room on a node now, but for a quota the
    namespace uses now: a ResourceQuota on the chosen pool, or the class or GPU-memory quota of the first
    pool passed over (the denial's). None when no quota stops it, or when the request alone is over one
    of that pool's hard limits (a class quota of 0): then it is stopped for good, not only now."""
    if choice.reason == "quota":
        c = choice.decision.chosen
        if c is None or not c.fits:
            return None
        stop, resource, memory_mib = QuotaStop(c.pool, c.kind, choice.denial), c.resource, c.memory_mib
    elif choice.reason in QUOTA_DENIALS:
        # Every pool that matched is over the class or GPU-memory quota: the first is the denial's.
        pool = next((r.pool for r in choice.decision.rejections if r.reasons == (choice.denial,)), None)
        if pool is None:
            return None
        stop = QuotaStop(pool, device_kind(pool.product), choice.denial)
        resource, memory_mib = pool.resource or req.vendor.resource, index.capacity.pool_memory_mib(pool)
    else:
        return None
    if hard_limit_problem(req, stop.pool, index, policy, resource=resource, memory_mib=memory_mib)[0]:
        return None
    return stop


def _pools_of(rejections: Iterable[Rejection]) -> tuple[PoolKey, ...]:
    return tuple(r.pool for r in rejections)


def products(pools: Iterable[PoolKey]) -> str:
    """Pools by their products, for a message: `Tesla-T4, NVIDIA-L4 and 2 more`."""
    names = sorted({p.product for p in pools})
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
