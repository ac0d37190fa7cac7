"""The decision: which pool a GpuRequest goes to, or why none can take it.

A pure function of the request, the pool index and the policy. Every pool of the Pod's vendor is
judged; each judgement says why the pool was taken or passed over, so `gpupool explain` and denial
messages can show the user the nearest misses.
"""

from __future__ import annotations

from dataclasses import dataclass
from sys import getsizeof
from typing import NamedTuple

from webhook.admission.quotas import class_quota_problem, memory_quota_problem
from webhook.admission.request import REQUEST_WEIGHT, GpuRequest
from webhook.admission.verdict import Reason
from webhook.domain.affinity import PoolConstraint
from webhook.domain.devices import GPU, KINDS, NOUNS, SHARED
from webhook.domain.model import PREFIX, PoolKey, Taint
from webhook.domain.policy import Policy
from webhook.domain.products import format_version, matches, tokens, version_at_least
from webhook.domain.quantity import format_mib
from webhook.pools.index import Group, Inseparable, Pool, PoolIndex
from webhook.pools.nodes import NodeFacts


class Candidate(NamedTuple):
    """A pool the Pod may go to. (A NamedTuple: one is built per matching pool for every decision, and a
    frozen dataclass costs several times more to build.)"""

    pool: PoolKey
    resource: str
    constraint: PoolConstraint  # what sends the Pod to exactly the pool's nodes
    gpu_taints: tuple[Taint, ...]  # to tolerate on the Pod's behalf
    memory_mib: int
    max_free: int  # most free GPUs on one usable node the Pod tolerates
    free_total: int
    fits: bool
    fallback: bool  # of a class the Pod did not ask for
    kind: str = GPU  # the pool's devices: gpu, mig or shared
    groups: tuple[Group, ...] = ()  # the pool's node groups the Pod can reach and tolerates


@dataclass(frozen=True, slots=True)
class Rejection:
    pool: PoolKey
    reasons: tuple[str, ...]
    other_device: bool = False  # a kind or resource the Pod does not take: never among the nearest misses


def _describe(rejection: Rejection, all_rejections: list[Rejection]) -> str:
    """`NVIDIA-A100-SXM4-40GB: 40Gi < min-memory 80Gi`; the full pool name when the product is ambiguous."""
    same = sum(r.pool.product == rejection.pool.product for r in all_rejections)
    name = rejection.pool.product if same == 1 else str(rejection.pool)
    return f"{name}: {', '.join(rejection.reasons)}"


class Decision(NamedTuple):
    """Either a chosen candidate (with warnings) or a denial message; plus every judgement made.
    (A NamedTuple, like Candidate: one per admission.)"""

    chosen: Candidate | None
    denial: str
    warnings: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    rejections: tuple[Rejection, ...]
    denial_reason: Reason = ""

    def explain(self) -> tuple[str, ...]:
        lines = []
        for c in self.candidates:
            verdict = "chosen" if c == self.chosen else ("fits" if c.fits else "no capacity")
            note = " (fallback)" if c.fallback else ""
            lines.append(
                f"{c.pool}: {verdict}{note}: {format_mib(c.memory_mib)} per {NOUNS[c.kind]}, "
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


@dataclass(frozen=True, slots=True)
class _Plan:
    """What does not change while the index's nodes stay as they are: every matching pool, and every
    rejection with its reasons. Only free GPUs are read per decision."""

    options: tuple[_Option, ...]
    rejections: tuple[Rejection, ...]


def decide(req: GpuRequest, index: PoolIndex, policy: Policy, *, quotas: bool = True) -> Decision:
    """The pool for the request, or why none. Without `quotas`, pools are not passed over for the class
    and GPU-memory quotas the namespace uses now (a Pod queued at admission holds nothing yet)."""
    requested = req.classes or req.allowed_classes
    # Keyed by the whole request, the plan's only input besides the nodes: nothing it reads is left out.
    plan = index.memo(req, lambda: _plan(req, index, policy), size=lambda plan: _plan_bytes(req, plan))
    candidates = [_candidate(req, option) for option in plan.options]
    rejections = list(plan.rejections)

    order = {c: i for i, c in enumerate(req.classes)} if req.classes else {c: policy.class_rank(c) for c in requested}
    kinds = {k: i for i, k in enumerate(req.devices)}

    def rank(c: Candidate) -> tuple[int, int, int, int, int, str]:
        tier = order.get(c.pool.gpu_class, len(order) + policy.class_rank(c.pool.gpu_class))
        device = kinds.get(c.kind, len(kinds))
        # Within a requested class the device kinds come in the Pod's order; with no class asked for,
        # the device order comes first (`mig,gpu` means a MIG instance of any class before a GPU).
        first, second = (tier, device) if req.classes else (device, tier)
        return (int(c.fallback), first, second, c.memory_mib, -c.free_total, c.pool.product)

    candidates.sort(key=rank)
    (quota_note, quota_reason), candidates = (
        _class_quota(req, index, policy, candidates, rejections) if quotas else (("", ""), candidates)
    )
    primary = [c for c in candidates if not c.fallback]
    chosen = next((c for c in candidates if c.fits), None)
    warnings: list[str] = []
    if chosen is not None:
        if chosen.fallback:
            warnings.append(
                f"gpupool: no free {'/'.join(requested)} GPUs; fell back to class {chosen.pool.gpu_class} "
                f"({chosen.pool.product})"
            )
        return Decision(chosen, "", tuple(warnings), tuple(candidates), tuple(rejections))
    waiting = primary[0] if primary else (candidates[0] if candidates else None)
    if waiting is None:
        if quota_note:
            return Decision(None, quota_note, (), (), tuple(rejections), quota_reason)
        nearest = "; ".join(_describe(r, rejections) for r in rejections[:3])
        nearest = nearest or f"the inventory has no {req.vendor.name} GPU pools"
        return Decision(None, f"no GPU pool matches the Pod: {nearest}", (), (), tuple(rejections), "no-match")
    if policy.defaults.on_no_capacity == "deny":
        need = f"{req.pod_total} free {waiting.resource} on one node"
        return Decision(
            None,
            f"no capacity: no pool that matches has {need} (best match {waiting.pool}, at most "
            f"{waiting.max_free} free on one node); policy onNoCapacity is deny",
            (),
            tuple(candidates),
            tuple(rejections),
            "no-capacity",
        )
    devices = "GPUs" if waiting.kind == GPU else f"{NOUNS[waiting.kind]}s"
    warnings.append(
        f"gpupool: no {waiting.pool.product} node has {req.pod_total} free {devices} now; the Pod will wait"
    )
    return Decision(waiting, "", tuple(warnings), tuple(candidates), tuple(rejections))


def _plan(req: GpuRequest, index: PoolIndex, policy: Policy) -> _Plan:
    requested = req.classes or req.allowed_classes
    top = max(policy.class_rank(c) for c in requested)
    fallback_classes = tuple(c for c in req.allowed_classes if policy.class_rank(c) > top) if req.fallback else ()
    options: list[_Option] = []
    rejections: list[Rejection] = []
    for pool in index.pools(req.vendor.name):
        reasons = _pool_reasons(req, pool.key, pool.kind, requested, fallback_classes, devices=req.devices)
        if not reasons and pool.kind == SHARED and req.count > 1:  # in a list of devices: skipped
            reasons = [f"a shared replica is not a GPU: {PREFIX}gpu-count {req.count} needs gpu or mig"]
        if reasons:
            other = pool.kind not in req.devices or bool(req.resource and pool.resource != req.resource)
            rejections.append(Rejection(pool.key, tuple(reasons), other))
            continue
        option = _option(req, pool, pool.key.gpu_class in fallback_classes, index)
        if isinstance(option, _Option):
            options.append(option)
        else:
            rejections.append(Rejection(pool.key, (option,)))
    # PoolKey's own ordering, spelt out: comparing strings is far cheaper than comparing dataclasses
    rejections.sort(
        key=lambda r: (r.other_device, len(r.reasons), r.pool.vendor, r.pool.gpu_class, r.pool.product, r.pool.resource)
    )
    return _Plan(tuple(options), tuple(rejections))


def _plan_bytes(req: GpuRequest, plan: _Plan) -> int:
    """What a plan's memo entry holds: its request (REQUEST_WEIGHT times the shape it is read from, whose
    strings it keeps), each option (its own tuples; its pool, selector and groups are the index's) and
    each rejection's reasons. An estimate at or above what they hold (tests/pools/test_memo.py)."""
    reasons = sum(_REJECTION_BYTES + sum(map(getsizeof, r.reasons)) for r in plan.rejections)
    return REQUEST_WEIGHT * req.shape_bytes + _OPTION_BYTES * len(plan.options) + reasons


_OPTION_BYTES, _REJECTION_BYTES = 512, 256


def _pool_reasons(
    req: GpuRequest,
    key: PoolKey,
    kind: str,
    requested: tuple[str, ...],
    fallback: tuple[str, ...],
    *,
    devices: tuple[str, ...],
) -> list[str]:
    """Why a pool (of devices of `kind`) cannot take the Pod at all (not counting capacity); empty when it can."""
    reasons = []
    if req.pool_pin is not None and req.pool_pin != key:
        reasons.append(f"{PREFIX}pool pins {req.pool_pin}")
    resource = key.resource or req.vendor.resource
    if req.resource and resource != req.resource:
        reasons.append(f"its devices are {resource}, the Pod requests {req.resource}")
    elif kind not in devices:
        reasons.append(f"device {kind} not in {','.join(devices)} ({req.device_source})")
    if key.gpu_class not in req.allowed_classes:
        reasons.append(f"class {key.gpu_class} is not allowed in namespace {req.namespace}")
    elif key.gpu_class not in requested and key.gpu_class not in fallback:
        reasons.append(f"class {key.gpu_class} not in {'/'.join(requested)} ({req.class_source})")
    if req.products:
        product = tokens(key.product, req.vendor.product_prefixes)
        if not any(matches(q, product) for q in req.products):
            reasons.append(f"product {key.product} does not match {PREFIX}gpu-product {req.product_text}")
    return reasons


def _option(req: GpuRequest, pool: Pool, fallback: bool, index: PoolIndex) -> _Option | str:
    """The pool as the Pod can use it (its constraint and the node groups the Pod reaches and tolerates),
    or why it cannot."""
    constraint = index.constraint(pool.key)
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
    tolerated = [g for g in groups if all(req.tolerations.tolerates(t) for t in g.other_taints)]
    if not tolerated:
        taints = {
            f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
            for g in groups
            for t in g.other_taints
        }
        return f"every node has taints the Pod does not tolerate: {', '.join(sorted(taints))}"
    # The scheduler may pick any node the constraint reaches that the Pod tolerates: each must hold.
    problem = _group_problem(req, tolerated)
    if problem:
        return problem
    largest = max(g.largest_node() for g in tolerated)
    if largest < req.pod_total:
        return f"no node has {req.pod_total} GPUs (the largest has {largest})"
    return _Option(
        pool=pool.key,
        resource=pool.resource,
        constraint=constraint,
        groups=tuple(tolerated),
        gpu_taints=tuple(sorted({t for g in tolerated for t in g.gpu_taints}, key=lambda t: (t.key, t.effect))),
        memory_mib=min(g.min_memory_mib() for g in tolerated),
        fallback=fallback,
        kind=pool.kind,
    )


def _pinned(req: GpuRequest, constraint: PoolConstraint) -> list[tuple[str, str]]:
    """The Pod's nodeSelector entries the pool's constraint already says (they narrow nothing)."""
    return [(k, v) for k, v in req.node_selector if (k, v) in constraint.selector]


def _reached(req: GpuRequest, pool: Pool, index: PoolIndex) -> set[Group]:
    """The pool's node groups with a node the Pod's own nodeSelector and node affinity let it run on."""
    requirements = req.requirements
    reached: set[Group] = set()
    for group in pool.ordered():
        for name in group.nodes:
            node = index.node(name)
            if node is not None and requirements.matches(name, node.labels):
                reached.add(group)
                break
    return reached


def _unreached(req: GpuRequest, pool: Pool, index: PoolIndex) -> str:
    """Why the Pod's own constraints reach no node of the pool: the nodeSelector entries no node of it
    has, else its node affinity."""
    labels = [node.labels for g in pool.ordered() for name in g.nodes if (node := index.node(name)) is not None]
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
    )


def _group_problem(req: GpuRequest, groups: list[Group]) -> str:
    """Memory, driver, compute capability and CUDA must hold on every node the selector can reach, since
    the scheduler may pick any."""
    memory = min(g.min_memory_mib() for g in groups)
    if req.min_memory_mib and memory < req.min_memory_mib:
        have = format_mib(memory) if memory else "unknown memory"
        return f"{have} < min-memory {format_mib(req.min_memory_mib)}"
    for need, name, what, unknown, versions in (
        (req.min_driver, "min-driver", "driver", "driver version", [g.min_driver() for g in groups]),
        (req.min_compute, "min-compute-capability", "compute capability", "compute capability",
         [g.min_compute() for g in groups]),
        (req.min_cuda, "min-cuda", "CUDA", "CUDA version", [g.min_cuda() for g in groups]),
    ):  # fmt: skip
        if need is None:
            continue
        if any(v is None for v in versions):
            return f"{unknown} unknown on some nodes ({name} {format_version(need)})"
        oldest = min(v for v in versions if v is not None)
        if not version_at_least(oldest, need):
            return f"{what} {format_version(oldest)} < {name} {format_version(need)}"
    return ""


def _class_quota(
    req: GpuRequest, index: PoolIndex, policy: Policy, candidates: list[Candidate], rejections: list[Rejection]
) -> tuple[tuple[str, Reason], list[Candidate]]:
    """Drop candidates whose class would exceed the namespace's per-class quota, or whose GPUs its GPU
    memory quota (each one is added to `rejections`, saying so); the first note, and why, is the denial
    when none is left."""
    rule = policy.namespace(req.namespace)
    if not rule.class_quota and rule.memory_quota_mib is None:
        return ("", ""), candidates
    kept, notes = [], []
    for c in candidates:
        note = pool_quota_problem(req, c.pool, index, policy)
        if note[0]:
            notes.append(note)
            rejections.append(Rejection(c.pool, (note[0],)))
        else:
            kept.append(c)
    return (notes[0] if notes else ("", "")), kept


def pool_quota_problem(req: GpuRequest, pool: PoolKey, index: PoolIndex, policy: Policy) -> tuple[str, Reason]:
    """Why placing the request in `pool` would exceed the namespace's per-class or GPU-memory quota, and
    which one; ("", "") when it would not."""
    note = class_quota_problem(req.namespace, pool.gpu_class, req.pod_total, index, policy)
    if note:
        return note, "class-quota"
    note = memory_quota_problem(
        req.namespace, req.pod_total, index.pool_memory_mib(pool), index, policy, where=str(pool)
    )
    return (note, "memory-quota") if note else ("", "")


def bound_problem(req: GpuRequest, facts: NodeFacts) -> str:
    """Why a Pod that names its node breaks its namespace's rules or its own annotations there ("" when
    it does not). A namespace's default class is only a default: any allowed class may be named."""
    requested = req.classes if req.class_source == "annotation" else req.allowed_classes
    # Likewise the namespace's device default: a Pod on a node may use what the node offers.
    devices = req.devices if req.device_source == "annotation" else KINDS
    reasons = _pool_reasons(req, facts.pool, facts.kind, requested, (), devices=devices)
    if req.min_memory_mib and facts.memory_mib < req.min_memory_mib:
        have = format_mib(facts.memory_mib) if facts.memory_mib else "unknown memory"
        reasons.append(f"{have} < min-memory {format_mib(req.min_memory_mib)}")
    for need, name, what, have_version in (
        (req.min_driver, "min-driver", "driver", facts.driver),
        (req.min_compute, "min-compute-capability", "compute capability", facts.compute),
        (req.min_cuda, "min-cuda", "CUDA", facts.cuda),
    ):
        if need is not None and (have_version is None or not version_at_least(have_version, need)):
            have = format_version(have_version) if have_version else "unknown"
            reasons.append(f"{what} {have} < {name} {format_version(need)}")
    return f"node {facts.node} is in pool {facts.pool}: {'; '.join(reasons)}" if reasons else ""
