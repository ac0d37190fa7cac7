"""The decision's two steps: which pools a GpuRequest matches, best first (`rank`), and which of them it
goes to, or why none can take it (`conclude`).

Pure functions of the request, the pool index and the policy. Every pool of the Pod's vendor is
judged; each judgement says why the pool was taken or passed over, so `gpupool explain` and denial
messages can show the user the nearest misses. The one decision (webhook.admission.choice) runs them,
with the quotas that pass pools over between the two and the workload group after: nothing else does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from sys import getsizeof
from typing import NamedTuple

from webhook.admission.misses import (
    MAX_NEAR_PRODUCTS,
    OTHER_PRODUCT,
    PLACE,
    PRODUCT,
    Miss,
    Rejection,
    alike,
    describe,
    fit_misses,
    key_misses,
    least,
    nearest,
    nearness,
    other_device,
    product_nearness,
    rejection,
    with_families,
)
from webhook.admission.request import REQUEST_WEIGHT, GpuRequest
from webhook.admission.verdict import Reason
from webhook.domain.affinity import PoolConstraint
from webhook.domain.devices import GPU, NOUNS
from webhook.domain.memory import describe_memory
from webhook.domain.model import PoolKey, Taint
from webhook.domain.policy import Policy
from webhook.domain.products import tokens
from webhook.pools.index import Group, Inseparable, Pool, PoolIndex


class Candidate(NamedTuple):
    """A pool the Pod may go to. (A NamedTuple: one is built per matching pool for every decision, and a
    frozen dataclass costs several times more to build.)"""

    pool: PoolKey
    resource: str
    constraint: PoolConstraint  # what sends the Pod to exactly the pool's nodes
    gpu_taints: tuple[Taint, ...]  # to tolerate on the Pod's behalf
    memory_mib: int  # per device, as reported (what GPU-memory quotas count)
    max_free: int  # most free GPUs on one usable node the Pod tolerates
    free_total: int
    fits: bool
    fallback: bool  # of a class the Pod did not ask for
    kind: str = GPU  # the pool's devices: gpu, mig or shared
    groups: tuple[Group, ...] = ()  # the pool's node groups the Pod can reach and tolerates
    sold_mib: int = 0  # per device, as sold (webhook.domain.memory); 0 when unknown
    offered_mib: int = 0  # what min-memory is met with: the size it ranks by
    compute: tuple[int, ...] | None = None  # the lowest compute capability of its nodes; None when unknown


class Decision(NamedTuple):
    """Either a chosen candidate (with warnings) or a denial message; plus every judgement made.
    (A NamedTuple, like Candidate: one per admission.)"""

    chosen: Candidate | None
    denial: str
    warnings: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    rejections: tuple[Rejection, ...]
    denial_reason: Reason = ""

    def explain(self, chosen: Candidate | None, stopped: str = "") -> tuple[str, ...]:
        """A line per pool considered: `chosen` for `chosen`, where the Pod goes (None: nowhere), and
        `stopped` (when given) for the decision's own choice that something after it, a quota, stopped."""
        lines = []
        for c in self.candidates:
            if c == chosen:
                verdict = "chosen"
            elif stopped and c == self.chosen:
                verdict = stopped
            else:
                verdict = "fits" if c.fits else "no capacity"
            note = " (fallback)" if c.fallback else ""
            lines.append(
                f"{c.pool}: {verdict}{note}: {describe_memory(c.sold_mib, c.memory_mib)} per {NOUNS[c.kind]}, "
                f"{c.free_total} free, at most {c.max_free} on one node"
            )
        lines.extend(f"{r.pool}: rejected: {'; '.join(r.reasons)}" for r in self.rejections)
        return tuple(lines)


@dataclass(frozen=True, slots=True)
class _Option:
    """A pool the Pod can go to: its constraint, and the node groups the Pod can reach there and tolerates."""

    pool: PoolKey
    resource: str
    constraint: PoolConstraint
    groups: tuple[Group, ...]
    gpu_taints: tuple[Taint, ...]
    memory_mib: int
    fallback: bool
    kind: str
    sold_mib: int
    offered_mib: int
    compute: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class _Plan:
    """What does not change while the index's nodes stay as they are: every matching pool, and every
    rejection with its reasons. Only free GPUs are read per decision."""

    options: tuple[_Option, ...]
    rejections: tuple[Rejection, ...]


# Every pool the request matches, best first, with its free devices read now; and the plan's rejections
# (the pools it does not match, and why). (A plain pair: one is made per admission.)
Ranked = tuple[list[Candidate], tuple[Rejection, ...]]


class PassedOver(NamedTuple):
    """What a quota left of the ranking: the candidates kept, a rejection for each one passed over (its
    quota's words), and the first of those words, the denial when none is kept."""

    kept: list[Candidate]
    rejections: list[Rejection]
    denial: str
    reason: Reason


def rank(req: GpuRequest, index: PoolIndex, policy: Policy) -> Ranked:
    """The pools the request matches, best first: the Pod's own class order (or the policy's), its device
    order, the least memory that fits (as sold: webhook.domain.memory), the older architecture (lower
    compute capability, unknown last), the most free devices."""
    requested = req.classes or req.allowed_classes
    # Keyed by the whole request, the plan's only input besides the nodes: nothing it reads is left out.
    plan = index.capacity.memo(req, lambda: _plan(req, index, policy), size=lambda plan: _plan_bytes(req, plan))
    candidates = [_candidate(req, option) for option in plan.options]

    order = {c: i for i, c in enumerate(req.classes)} if req.classes else {c: policy.class_rank(c) for c in requested}
    kinds = {k: i for i, k in enumerate(req.devices)}

    def by_rank(c: Candidate) -> tuple[int, int, int, int, tuple[int, ...], int, str]:
        tier = order.get(c.pool.gpu_class, len(order) + policy.class_rank(c.pool.gpu_class))
        device = kinds.get(c.kind, len(kinds))
        # Within a requested class the device kinds come in the Pod's order; with no class asked for,
        # the device order comes first (`mig,gpu` means a MIG instance of any class before a GPU).
        first, second = (tier, device) if req.classes else (device, tier)
        return (int(c.fallback), first, second, c.offered_mib, c.compute or _UNKNOWN, -c.free_total, c.pool.product)

    candidates.sort(key=by_rank)
    return candidates, plan.rejections


def conclude(
    req: GpuRequest, index: PoolIndex, policy: Policy, ranked: Ranked, passed: PassedOver | None = None
) -> Decision:
    """The decision from the ranking, once `passed` (what a quota left of it, if one was asked:
    webhook.admission.choice) is taken out: the best candidate that fits; else, under onNoCapacity warn,
    the best one to wait on; else why none."""
    candidates, rejections = ranked
    if passed is not None:
        candidates = passed.kept
        rejections = (*rejections, *passed.rejections) if passed.rejections else rejections
    chosen = next((c for c in candidates if c.fits), None)
    if chosen is not None:
        warnings: tuple[str, ...] = ()
        if chosen.fallback:
            requested = req.classes or req.allowed_classes
            warnings = (
                f"gpupool: no free {'/'.join(requested)} GPUs; fell back to class {chosen.pool.gpu_class} "
                f"({chosen.pool.product})",
            )
        return Decision(chosen, "", warnings, tuple(candidates), rejections)
    waiting = next((c for c in candidates if not c.fallback), candidates[0] if candidates else None)
    if waiting is None or policy.defaults.on_no_capacity == "deny":
        return _denied(req, index, policy, waiting, candidates=candidates, passed=passed)
    devices = "GPUs" if waiting.kind == GPU else f"{NOUNS[waiting.kind]}s"
    warning = f"gpupool: no {waiting.pool.product} node has {req.pod_total} free {devices} now; the Pod will wait"
    return Decision(waiting, "", (warning,), tuple(candidates), rejections)


def _denied(
    req: GpuRequest,
    index: PoolIndex,
    policy: Policy,
    waiting: Candidate | None,
    *,
    candidates: list[Candidate],
    passed: PassedOver | None,
) -> Decision:
    """The denial when no candidate fits (and the policy will not let the Pod wait) or none is left: it
    says what the pools lack, each judged on all the Pod asks (worked out only now)."""
    rejections = (*judged(req, index, policy), *(passed.rejections if passed is not None else ()))
    if waiting is None:
        if passed is not None and passed.denial:
            return Decision(None, passed.denial, (), (), rejections, passed.reason)
        near = "; ".join(describe(r, rejections) for r in nearest(rejections))
        near = near or f"the inventory has no {req.vendor.name} GPU pools"
        return Decision(None, f"no GPU pool matches the Pod: {near}", (), (), rejections, "no-match")
    need = f"{req.pod_total} free {waiting.resource} on one node"
    return Decision(
        None,
        f"no capacity: no pool that matches has {need} (best match {waiting.pool}, at most "
        f"{waiting.max_free} free on one node); policy onNoCapacity is deny",
        (),
        tuple(candidates),
        rejections,
        "no-capacity",
    )


def _classes(req: GpuRequest, policy: Policy) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The classes the Pod asks for, and those it may fall back to."""
    requested = req.classes or req.allowed_classes
    top = max(policy.class_rank(c) for c in requested)
    fallback = tuple(c for c in req.allowed_classes if policy.class_rank(c) > top) if req.fallback else ()
    return requested, fallback


def _plan(req: GpuRequest, index: PoolIndex, policy: Policy) -> _Plan:
    requested, fallback_classes = _classes(req, policy)
    options: list[_Option] = []
    rejections: list[Rejection] = []
    for pool in index.capacity.pools(req.vendor.name):
        misses = key_misses(req, pool, requested, fallback_classes)
        if misses:
            rejections.append(rejection(pool.key, misses, other_device(req, pool), complete=False))
            continue
        option = _option(req, pool, pool.key.gpu_class in fallback_classes, index)
        if isinstance(option, _Option):
            options.append(option)
        else:
            rejections.append(rejection(pool.key, option))
    rejections.sort(key=nearness)
    return _Plan(tuple(options), tuple(rejections))


def _plan_bytes(req: GpuRequest, plan: _Plan) -> int:
    """What a plan's memo entry holds: its request (REQUEST_WEIGHT times the shape it is read from, whose
    strings it keeps), each option (its own tuples; its pool, selector and groups are the index's) and
    each rejection's reasons. An estimate at or above what they hold (tests/pools/test_memo.py)."""
    return REQUEST_WEIGHT * req.shape_bytes + _OPTION_BYTES * len(plan.options) + _rejections_bytes(plan.rejections)


def _rejections_bytes(rejections: Sequence[Rejection]) -> int:
    """What rejections hold: each its tuples (itself, its reasons, what they are about) and its reasons'
    strings; its pool is the index's."""
    return sum(_REJECTION_BYTES + sum(map(getsizeof, r.reasons)) for r in rejections)


# A rejection's own tuples: 7 fields, and two of up to 7 reasons and kinds (96 + 2 x 96 bytes).
_OPTION_BYTES, _REJECTION_BYTES = 512, 320


def judged(req: GpuRequest, index: PoolIndex, policy: Policy) -> tuple[Rejection, ...]:
    """Every pool that cannot take the Pod, nearest first, each with all it lacks: for a pool its key
    rules out (class, device, product), also what its nodes have alike (memory, driver, compute
    capability, CUDA, taints, size; no node is walked, no constraint worked out), and how near its product
    is to the one asked for. What a denial shows and a hint (webhook.admission.hints) starts from; worked
    out only for denials, since placing a Pod needs none of it, and remembered per request until a node
    changes."""
    return index.capacity.memo(
        ("judged", req),
        lambda: _judged(req, index, policy),
        size=lambda judged: REQUEST_WEIGHT * req.shape_bytes + _rejections_bytes(judged),
    )


def _judged(req: GpuRequest, index: PoolIndex, policy: Policy) -> tuple[Rejection, ...]:
    plan: _Plan = index.capacity.memo(req, lambda: _plan(req, index, policy), size=lambda plan: _plan_bytes(req, plan))
    pools = {pool.key: pool for pool in index.capacity.pools(req.vendor.name)}
    queries = with_families(req.products) if len(req.products) <= MAX_NEAR_PRODUCTS else ()  # once per request
    rejections = []
    for r in plan.rejections:
        if r.complete or r.pool not in pools:
            rejections.append(r)
            continue
        pool = pools[r.pool]
        misses = [Miss(kind, text) for kind, text in zip(r.kinds, r.reasons, strict=True)]
        for i, miss in enumerate(misses):
            if miss.kind == PRODUCT and queries:
                distance, related = product_nearness(queries, tokens(pool.key.product, req.vendor.product_prefixes))
                misses[i] = Miss(PRODUCT if related else OTHER_PRODUCT, miss.text, distance)
        misses += fit_misses(req, index.capacity.memo(("alike", pool.key), partial(alike, pool)))[1]
        rejections.append(rejection(pool.key, misses, r.other_device))
    rejections.sort(key=nearness)
    return tuple(rejections)


def _option(req: GpuRequest, pool: Pool, fallback: bool, index: PoolIndex) -> _Option | list[Miss]:
    """The pool as the Pod can use it (its constraint and the node groups the Pod reaches and tolerates),
    or why it cannot."""
    place = _place(req, pool, index)
    if not isinstance(place, tuple):
        return [Miss(PLACE, place)]
    constraint, groups = place
    tolerated, misses = fit_misses(req, groups)
    if misses:
        return misses
    return _Option(
        pool=pool.key,
        resource=pool.resource,
        constraint=constraint,
        groups=tuple(tolerated),
        gpu_taints=tuple(sorted({t for g in tolerated for t in g.gpu_taints}, key=lambda t: (t.key, t.effect))),
        memory_mib=min(g.min_memory_mib() for g in tolerated),
        fallback=fallback,
        kind=pool.kind,
        sold_mib=min(g.min_sold_mib() for g in tolerated),
        offered_mib=min(g.min_offered_mib() for g in tolerated),
        compute=least([g.min_compute() for g in tolerated]),
    )


def _place(req: GpuRequest, pool: Pool, index: PoolIndex) -> tuple[PoolConstraint, tuple[Group, ...]] | str:
    """The pool's constraint and its node groups the Pod's own nodeSelector and node affinity reach, or
    why the Pod cannot get there at all."""
    constraint = index.capacity.constraint(pool.key)
    if isinstance(constraint, Inseparable):
        return constraint.reason
    # The Pod's own nodeSelector pins those labels on every node it reaches: they must satisfy the pool's.
    pinned = dict(req.node_selector)
    clash = [f"nodeSelector {k}={pinned[k]}" for k, v in constraint.selector if k in pinned and pinned[k] != v]
    clash += [
        f"nodeSelector {r.key}={pinned[r.key]}"
        for r in constraint.expressions
        if r.key in pinned and not r.matches(pinned)
    ]
    if clash:
        return f"{', '.join(clash)} excludes it"
    groups = pool.ordered()
    if req.requirements.terms is not None or len(req.requirements.selector) > len(_pinned(req, constraint)):
        reached = _reached(req, pool, index)
        if not reached:
            return _unreached(req, pool, index)
        groups = tuple(g for g in groups if g in reached)
    if not groups:
        return "no nodes"
    return constraint, groups


def _pinned(req: GpuRequest, constraint: PoolConstraint) -> list[tuple[str, str]]:
    """The Pod's nodeSelector entries the pool's constraint already says (they narrow nothing)."""
    return [(k, v) for k, v in req.node_selector if (k, v) in constraint.selector]


def _reached(req: GpuRequest, pool: Pool, index: PoolIndex) -> set[Group]:
    """The pool's node groups with a node the Pod's own nodeSelector and node affinity let it run on."""
    requirements = req.requirements
    reached: set[Group] = set()
    for group in pool.ordered():
        for name in group.nodes:
            node = index.capacity.node(name)
            if node is not None and requirements.matches(name, node.labels):
                reached.add(group)
                break
    return reached


def _unreached(req: GpuRequest, pool: Pool, index: PoolIndex) -> str:
    """Why the Pod's own constraints reach no node of the pool: the nodeSelector entries no node of it
    has, else its node affinity."""
    labels = [
        node.labels for g in pool.ordered() for name in g.nodes if (node := index.capacity.node(name)) is not None
    ]
    missing = [f"nodeSelector {k}={v}" for k, v in req.node_selector if all(n.get(k) != v for n in labels)]
    if missing:
        return f"{', '.join(missing)} excludes it"
    if not any(all(n.get(k) == v for k, v in req.node_selector) for n in labels):
        return "the Pod's nodeSelector excludes every node of the pool"
    return "the Pod's required node affinity excludes every node of the pool"


def _candidate(req: GpuRequest, o: _Option) -> Candidate:
    """The pool's candidacy with its free GPUs read now."""
    max_free = max(g.max_free() for g in o.groups)
    return Candidate(
        o.pool,
        o.resource,
        o.constraint,
        o.gpu_taints,
        o.memory_mib,
        max_free,
        sum(g.free_total for g in o.groups),
        max_free >= req.pod_total,
        o.fallback,
        o.kind,
        o.groups,
        o.sold_mib,
        o.offered_mib,
        o.compute,
    )


_UNKNOWN = (1 << 30,)  # an unknown compute capability ranks after every known one
